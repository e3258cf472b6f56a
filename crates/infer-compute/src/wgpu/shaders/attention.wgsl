// GQA attention over the KV cache, one workgroup per (query head, token):
// query head h reads kv head h / (n_head / n_head_kv) of the token's slot,
// positions lo..=pos (lo = pos + 1 − window with a sliding window, else 0):
//   s_p = scale · q·k_p, soft-capped c · tanh(s_p / c) when c > 0 (Gemma 2),
//   out = Σ_p softmax(s)_p · v_p.
// Three phases: scores into `scores` (this workgroup's row of n_ctx) with
// the running maximum, exponentials and their sum, then each invocation
// sums its pairs of dimensions of out over the positions. The caches'
// types come from the `kv/` files composed in front (`k_read`, `k_load2`;
// `v_read`, `v_load2`: where the query reads a row, and its values);
// arithmetic in f32.
// The rows of a quantized cache are read as stored, rotated (the queries
// were rotated alike by `rope`); values rotated by V's Hadamard block
// v_rot sum to a rotated output, which is rotated back at the end
// (`kv/rotation.wgsl`; H/√n is its own inverse), then multiplied by
// `v_mul(_, true)` (TurboQuant's signs over the values' channel scale).

// Invocations per workgroup (the reductions' size too).
const WG: u32 = 64u;

struct Params {
    n_head: u32,
    n_kv: u32,
    hd: u32,
    n_ctx: u32,
    window: u32,
    scale: f32,
    softcap: f32,
    // Words of a K (V) cache row.
    k_row: u32,
    v_row: u32,
    // V's Hadamard block (0: none) and its scale 1/√n.
    v_rot: u32,
    v_rs: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k_cache: array<u32>;
@group(0) @binding(2) var<storage, read> v_cache: array<u32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> tok_pos: array<u32>;
@group(0) @binding(6) var<storage, read> tok_slot: array<u32>;
@group(0) @binding(7) var<uniform> p: Params;
// For a TurboQuant K (V) cache only (`kv/tq.wgsl`): the pass's rows of K
// and V in the cache's basis, and per token the pass index of its span's
// first token.
@group(0) @binding(8) var<storage, read> k_rows: array<f32>;
@group(0) @binding(9) var<storage, read> v_rows: array<f32>;
@group(0) @binding(10) var<storage, read> tok_span: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let h = wid.x;
    let t = wid.y;
    let lid = lanes.lid;
    let hd = p.hd;
    let kvh = h / (p.n_head / p.n_kv);
    let pos = tok_pos[t];
    let slot = tok_slot[t];
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let qb = (t * p.n_head + h) * hd;
    let srow = (t * p.n_head + h) * p.n_ctx;
    var m = -3.0e38;
    for (var j = lo + lid; j <= pos; j += WG) {
        let kh = k_read(slot, j, pos, t, kvh);
        var s = 0.0;
        for (var d = 0u; d < hd / 2u; d++) {
            let kk = k_load2(kh, d);
            s += q[qb + 2u * d] * kk.x + q[qb + 2u * d + 1u] * kk.y;
        }
        s *= p.scale;
        if p.softcap > 0.0 {
            s = p.softcap * tanh(s / p.softcap);
        }
        scores[srow + j] = s;
        m = max(m, s);
    }
    m = wg_max(m, lanes);
    var l = 0.0;
    for (var j = lo + lid; j <= pos; j += WG) {
        let e = exp(scores[srow + j] - m);
        scores[srow + j] = e;
        l += e;
    }
    l = wg_sum(l, lanes);
    storageBarrier();
    let inv = 1.0 / l;
    for (var d = lid; d < hd / 2u; d += WG) {
        var acc = vec2<f32>(0.0);
        for (var j = lo; j <= pos; j++) {
            acc += scores[srow + j] * v_load2(v_read(slot, j, pos, t, kvh), d);
        }
        acc *= inv;
        if p.v_rot == 0u {
            out[qb + 2u * d] = acc.x;
            out[qb + 2u * d + 1u] = acc.y;
        } else {
            head_buf[2u * d] = acc.x;
            head_buf[2u * d + 1u] = acc.y;
        }
    }
    if p.v_rot > 0u {
        workgroupBarrier();
        hadamard(p.v_rot, p.v_rs, hd, lid);
        for (var i = lid; i < hd; i += WG) {
            out[qb + i] = head_buf[i] * v_mul(i, true);
        }
    }
}
