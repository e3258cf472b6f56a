// KV cache of TurboQuant codes (tq3, tq4: KV_BITS-bit indices, the
// constant composed in front), laid out as `wgpu::kv_tq` writes it: one
// buffer per layer of a header (its fields at the word indices below, the
// codebook, the rotation's per-channel factors), then the areas of codes,
// exact rows, centres, recent rows (a ring per slot) and their tags.
//
// A query at position pos (token t of the pass) reads row j of its slot:
// - j < n_exact: the exact row (f16; the slot's first positions);
// - pos − j < window: the pass's own row when j lies in the query's span
//   (`tok_span`, t − (pos − j) in `KV_rows`, f32 already rounded to f16 by
//   `tq_cache.wgsl`'s `encode`), else the ring's entry j % window when its
//   tag says it holds j (rows enter the ring after the pass's attention:
//   `keep`), else the code;
// - older rows: the code, n · c[idx] plus the slot's centre.
// The same choice per (query, row) as the CPU's two parts merged by their
// log-sum-exps (`cpu::tq_window`). Values are in the rotated basis: the
// head times KV_mul's factors (random signs, the keys' channel scale), then
// H/√hd (`kv/rotation.wgsl`). Composed per role as `kv/f32.wgsl` says;
// needs the kernel's `KV_rows` (array<f32>) and `tok_span` bindings.

// Header fields (word indices; `wgpu::kv_tq::Field`).
const KV_F_N_CTX: u32 = 0u;
const KV_F_N_KV: u32 = 1u;
const KV_F_HD: u32 = 2u;
const KV_F_N_EXACT: u32 = 3u;
const KV_F_WINDOW: u32 = 4u;
const KV_F_HEAD_WORDS: u32 = 5u;
const KV_F_ROW_WORDS: u32 = 6u;
const KV_F_CODES: u32 = 7u;
const KV_F_EXACT: u32 = 8u;
const KV_F_CENTRE: u32 = 9u;
const KV_F_RING: u32 = 10u;
const KV_F_TAGS: u32 = 11u;
const KV_F_CENTRE_INV: u32 = 12u;
const KV_F_HAS_CENTRE: u32 = 13u;
const KV_F_CENTRE_FROM: u32 = 14u;
const KV_F_PASSES: u32 = 15u;
// The 2^bits centroids (f32), then the 2^bits − 1 boundaries.
const KV_F_CENTROIDS: u32 = 16u;
const KV_F_BOUNDS: u32 = 32u;
// hd factors for keys (or values), then hd for the queries.
const KV_F_MUL: u32 = 48u;

fn KV_hdr(f: u32) -> u32 {
    return KV_cache[f];
}

fn KV_hdrf(f: u32) -> f32 {
    return bitcast<f32>(KV_cache[f]);
}

// Head g of position pos of a slot, as token t of the pass writes it
// (`kv/tq_store.wgsl`).
fn KV_at(slot: u32, pos: u32, t: u32, g: u32) -> vec4<u32> {
    return vec4<u32>(slot, pos, t, g);
}

// Where the query of token t at position pos reads head g of row j (see
// the top): (0, f16 words) for an exact or ring row, (1, f32 offset in
// KV_rows) for a row of the pass, (2, code word, centre offset or
// 0xffffffff) for a code.
fn KV_read(slot: u32, j: u32, pos: u32, t: u32, g: u32) -> vec4<u32> {
    let hd = KV_hdr(KV_F_HD);
    let half = KV_hdr(KV_F_N_KV) * hd / 2u;
    let n_exact = KV_hdr(KV_F_N_EXACT);
    if j < n_exact {
        return vec4<u32>(0u, KV_hdr(KV_F_EXACT) + (slot * n_exact + j) * half + g * hd / 2u, 0u, 0u);
    }
    let w = KV_hdr(KV_F_WINDOW);
    let d = pos - j;
    if d < w {
        if d <= t - tok_span[t] {
            return vec4<u32>(1u, (t - d) * 2u * half + g * hd, 0u, 0u);
        }
        let e = slot * w + j % w;
        if KV_cache[KV_hdr(KV_F_TAGS) + e] == j + 1u {
            return vec4<u32>(0u, KV_hdr(KV_F_RING) + e * half + g * hd / 2u, 0u, 0u);
        }
    }
    let code = KV_hdr(KV_F_CODES) + (slot * KV_hdr(KV_F_N_CTX) + j) * KV_hdr(KV_F_ROW_WORDS) + g * KV_hdr(KV_F_HEAD_WORDS);
    var c = 0xffffffffu;
    if KV_hdr(KV_F_HAS_CENTRE) != 0u {
        c = KV_hdr(KV_F_CENTRE) + slot * 2u * half + g * hd;
    }
    return vec4<u32>(2u, code, c, 0u);
}

// Values 2i and 2i + 1 of the head at `h` (KV_read), in the rotated basis.
fn KV_load2(h: vec4<u32>, i: u32) -> vec2<f32> {
    if h.x == 0u {
        return unpack2x16float(KV_cache[h.y + i]);
    }
    if h.x == 1u {
        return vec2<f32>(KV_rows[h.y + 2u * i], KV_rows[h.y + 2u * i + 1u]);
    }
    // A code: its f16 scale n, then the indices as a little-endian bit
    // stream of KV_BITS bits each (`wgpu::kv_tq`).
    let n = unpack2x16float(KV_cache[h.y]).x;
    let bit = 2u * i * KV_BITS;
    let wi = h.y + 1u + bit / 32u;
    let sh = bit % 32u;
    var b = KV_cache[wi] >> sh;
    if sh + 2u * KV_BITS > 32u {
        b |= KV_cache[wi + 1u] << (32u - sh);
    }
    let m = (1u << KV_BITS) - 1u;
    var v = n * vec2<f32>(KV_hdrf(KV_F_CENTROIDS + (b & m)), KV_hdrf(KV_F_CENTROIDS + ((b >> KV_BITS) & m)));
    if h.z != 0xffffffffu {
        v += vec2<f32>(bitcast<f32>(KV_cache[h.z + 2u * i]), bitcast<f32>(KV_cache[h.z + 2u * i + 1u]));
    }
    return v;
}

// The factor of value i of a head before its rotation into the cache's
// basis (query: of a query meeting these keys): the rotation's random sign
// times the keys' channel scale (or the queries' inverse one); for the
// output of values after the rotation back, the sign.
fn KV_mul(i: u32, query: bool) -> f32 {
    return KV_hdrf(KV_F_MUL + select(0u, KV_hdr(KV_F_HD), query) + i);
}
