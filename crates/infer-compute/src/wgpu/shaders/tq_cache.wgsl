// The kernels over one TurboQuant cache (a layer's K or V; `kv/tq.wgsl`
// composed for the role `c_`), recorded around `rope` and `attention` in
// the step's one command buffer, one workgroup per token (and head):
// - `centre` (after `rope`): a token at position n_exact − 1 sets its
//   slot's centre, the mean of the exact rows centre_from .. n_exact
//   (summed in position order, then scaled, as the CPU);
// - `encode` (after `centre`): each head of a token at n_exact or later is
//   coded less the centre as the CPU's `encode_rotated_norm_kept` codes it
//   (nearest centroids, then the sweeps that raise the cosine, scale
//   ‖y‖ / ‖c[idx]‖), in f32 where the CPU sums in f64; then every token's
//   row in c_rows is rounded to f16, as attention and the ring read it;
// - `keep` (after `attention`): the ring takes each token's row, but for a
//   token whose entry a later token of its span takes too;
// - `ring_copy`: the ring entries of slot `src_slot` holding positions below
//   `n` copied to slot `dst_slot`, the others emptied (a copy of positions).
// The f32 division and f16 rounding are `kv/quantize.wgsl`'s.

// Invocations per workgroup (the reductions' size too).
const WG: u32 = 64u;

struct Params {
    // Tokens of the pass.
    n_tok: u32,
    // ring_copy: the slots, and the positions copied.
    src_slot: u32,
    dst_slot: u32,
    n: u32,
}

@group(0) @binding(0) var<storage, read_write> c_cache: array<u32>;
// The pass's rows of this cache, f32, token t's at t · kv_dim.
@group(0) @binding(1) var<storage, read_write> c_rows: array<f32>;
@group(0) @binding(2) var<storage, read> tok_pos: array<u32>;
@group(0) @binding(3) var<storage, read> tok_slot: array<u32>;
// Per token, the pass index of its span's first token.
@group(0) @binding(4) var<storage, read> tok_span: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn centre(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if t >= p.n_tok {
        return;
    }
    let pos = tok_pos[t];
    let slot = tok_slot[t];
    let n_exact = c_hdr(c_F_N_EXACT);
    if c_hdr(c_F_HAS_CENTRE) == 0u || pos + 1u != n_exact {
        return;
    }
    let kv_dim = c_hdr(c_F_N_KV) * c_hdr(c_F_HD);
    let half = kv_dim / 2u;
    let ex = c_hdr(c_F_EXACT) + slot * n_exact * half;
    let inv = c_hdrf(c_F_CENTRE_INV);
    for (var i = lid; i < kv_dim; i += WG) {
        var s = 0.0;
        for (var r = c_hdr(c_F_CENTRE_FROM); r < n_exact; r++) {
            s += unpack2x16float(c_cache[ex + r * half + i / 2u])[i % 2u];
        }
        c_cache[c_hdr(c_F_CENTRE) + slot * kv_dim + i] = bitcast<u32>(s * inv);
    }
}

// The head being coded (less the centre) and its indices.
var<workgroup> y: array<f32, MAX_HD>;
var<workgroup> idx: array<u32, MAX_HD>;
var<workgroup> scale_bits: u32;

fn centroid(k: u32) -> f32 {
    return c_hdrf(c_F_CENTROIDS + k);
}

// The sweeps of `encode_rotated_norm_kept` over idx[0..hd] (one
// invocation: each move depends on the ones before it), from ⟨y, c[idx]⟩
// `dot0` and ‖c[idx]‖² `nn0`; returns the final ‖c[idx]‖².
fn refine(hd: u32, dot0: f32, nn0: f32) -> f32 {
    var dc = dot0;
    var nn = nn0;
    let last = (1u << c_BITS) - 1u;
    for (var sweep = 0u; sweep < c_hdr(c_F_PASSES); sweep++) {
        var moved = false;
        for (var i = 0u; i < hd; i++) {
            let a = idx[i];
            let v = y[i];
            let ca = centroid(a);
            for (var s = 0u; s < 2u; s++) {
                if (s == 0u && a == 0u) || (s == 1u && a == last) {
                    continue;
                }
                let b = select(a - 1u, a + 1u, s == 1u);
                let cb = centroid(b);
                let d2 = dc + v * (cb - ca);
                let n2 = nn + cb * cb - ca * ca;
                // cos² up, with the dot product positive.
                if d2 > 0.0 && d2 * d2 * nn > dc * dc * n2 {
                    idx[i] = b;
                    dc = d2;
                    nn = n2;
                    moved = true;
                    break;
                }
            }
        }
        if !moved {
            break;
        }
    }
    return nn;
}

// Word w of a code's index stream (bits 32w .. 32w + 31; index i at bits
// i · c_BITS, least significant first).
fn index_word(w: u32, hd: u32) -> u32 {
    var word = 0u;
    let end = min(hd, (32u * w + 32u + c_BITS - 1u) / c_BITS);
    for (var i = 32u * w / c_BITS; i < end; i++) {
        let bit = i * c_BITS;
        if bit >= 32u * w {
            word |= idx[i] << (bit - 32u * w);
        } else {
            word |= idx[i] >> (32u * w - bit);
        }
    }
    return word;
}

// Barriers and reductions run in uniform control flow: whether the token
// is coded (read from the cache: not uniform to WGSL) only masks the work.
@compute @workgroup_size(WG)
fn encode(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let g = wid.x;
    let t = wid.y;
    let lid = lanes.lid;
    if t >= p.n_tok {
        return;
    }
    let pos = tok_pos[t];
    let slot = tok_slot[t];
    let hd = c_hdr(c_F_HD);
    let kv_dim = c_hdr(c_F_N_KV) * hd;
    let at = t * kv_dim + g * hd;
    let coded = pos >= c_hdr(c_F_N_EXACT);
    let has_c = c_hdr(c_F_HAS_CENTRE) != 0u;
    let c0 = c_hdr(c_F_CENTRE) + slot * kv_dim + g * hd;
    var ss = 0.0;
    if coded {
        for (var i = lid; i < hd; i += WG) {
            var v = c_rows[at + i];
            if has_c {
                v -= bitcast<f32>(c_cache[c0 + i]);
            }
            y[i] = v;
            ss += v * v;
        }
    }
    let norm = sqrt(wg_sum(ss, lanes));
    let inv = select(0.0, div_rn(1.0, norm), norm > 0.0);
    // The nearest centroids: the boundaries below each value.
    var dc = 0.0;
    var nn = 0.0;
    if coded {
        let nb = (1u << c_BITS) - 1u;
        for (var i = lid; i < hd; i += WG) {
            let u = y[i] * inv;
            var k = 0u;
            for (var b = 0u; b < nb; b++) {
                k += select(0u, 1u, c_hdrf(c_F_BOUNDS + b) < u);
            }
            idx[i] = k;
            let c = centroid(k);
            dc += y[i] * c;
            nn += c * c;
        }
    }
    dc = wg_sum(dc, lanes);
    nn = wg_sum(nn, lanes);
    workgroupBarrier();
    if coded && lid == 0u {
        let n2 = refine(hd, dc, nn);
        let sc = select(norm, div_rn(norm, sqrt(n2)), n2 > 0.0 && norm > 0.0);
        scale_bits = f16_rn(min(sc, 65504.0));
    }
    workgroupBarrier();
    if coded {
        let hw = c_hdr(c_F_HEAD_WORDS);
        let code = c_hdr(c_F_CODES) + (slot * c_hdr(c_F_N_CTX) + pos) * c_hdr(c_F_ROW_WORDS) + g * hw;
        if lid == 0u {
            c_cache[code] = scale_bits;
        }
        for (var w = lid; w + 1u < hw; w += WG) {
            c_cache[code + 1u + w] = index_word(w, hd);
        }
    }
    for (var i = lid; i < hd; i += WG) {
        c_rows[at + i] = unpack2x16float(f16_sat(c_rows[at + i])).x;
    }
}

@compute @workgroup_size(WG)
fn keep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let t = wid.y;
    let w = c_hdr(c_F_WINDOW);
    if t + w < p.n_tok && tok_span[t + w] == tok_span[t] {
        return;
    }
    let pos = tok_pos[t];
    let hd = c_hdr(c_F_HD);
    let kv_dim = c_hdr(c_F_N_KV) * hd;
    let e = tok_slot[t] * w + pos % w;
    let ring = c_hdr(c_F_RING) + e * kv_dim / 2u + g * hd / 2u;
    let at = t * kv_dim + g * hd;
    // The rows are f16 values already (`encode`): exact.
    for (var i = lid; i < hd / 2u; i += WG) {
        c_cache[ring + i] = f16_sat(c_rows[at + 2u * i]) | (f16_sat(c_rows[at + 2u * i + 1u]) << 16u);
    }
    if g == 0u && lid == 0u {
        c_cache[c_hdr(c_F_TAGS) + e] = pos + 1u;
    }
}

@compute @workgroup_size(WG)
fn ring_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wid.x;
    let w = c_hdr(c_F_WINDOW);
    let half = c_hdr(c_F_N_KV) * c_hdr(c_F_HD) / 2u;
    let tags = c_hdr(c_F_TAGS);
    let ring = c_hdr(c_F_RING);
    let tag = c_cache[tags + p.src_slot * w + i];
    let kept = tag != 0u && tag - 1u < p.n;
    if kept {
        for (var k = lid; k < half; k += WG) {
            c_cache[ring + (p.dst_slot * w + i) * half + k] = c_cache[ring + (p.src_slot * w + i) * half + k];
        }
    }
    if lid == 0u {
        c_cache[tags + p.dst_slot * w + i] = select(0u, tag, kept);
    }
}
