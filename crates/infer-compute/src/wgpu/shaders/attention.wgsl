// GQA attention over the KV cache, one workgroup per (query head, token):
// query head h reads kv head h / (n_head / n_head_kv) of the token's slot,
// positions lo..=pos (lo = pos + 1 − window with a sliding window, else 0):
//   s_p = scale · q·k_p, soft-capped c · tanh(s_p / c) when c > 0 (Gemma 2),
//   out = Σ_p softmax(s)_p · v_p.
// Three phases: scores into `scores` (this workgroup's row of n_ctx) with
// the running maximum, exponentials and their sum, then each invocation
// sums its pairs of dimensions of out over the positions. The cache's
// element type comes from the `kv/` file composed in front (`KvPair`: two
// values); arithmetic in f32.

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
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<KvPair>;
@group(0) @binding(2) var<storage, read> vc: array<KvPair>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> tok_pos: array<u32>;
@group(0) @binding(6) var<storage, read> tok_slot: array<u32>;
@group(0) @binding(7) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let h = wid.x;
    let t = wid.y;
    let lid = lanes.lid;
    let hd = p.hd;
    let kv_dim = p.n_kv * hd;
    let kvh = h / (p.n_head / p.n_kv);
    let pos = tok_pos[t];
    let slot = tok_slot[t];
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let qb = (t * p.n_head + h) * hd;
    let cache0 = slot * p.n_ctx * kv_dim + kvh * hd;
    let srow = (t * p.n_head + h) * p.n_ctx;
    var m = -3.0e38;
    for (var j = lo + lid; j <= pos; j += WG) {
        let kb = (cache0 + j * kv_dim) / 2u;
        var s = 0.0;
        for (var d = 0u; d < hd / 2u; d++) {
            let kk = kv_unpack(kc[kb + d]);
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
            acc += scores[srow + j] * kv_unpack(vc[(cache0 + j * kv_dim) / 2u + d]);
        }
        out[qb + 2u * d] = acc.x * inv;
        out[qb + 2u * d + 1u] = acc.y * inv;
    }
}
