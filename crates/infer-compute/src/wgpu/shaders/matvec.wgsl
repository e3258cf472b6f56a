// Quantized matrix products `y[t, r] = Σ_i W[r, i] · x[t, i]` (GEMV for
// one token, the prefill product for several): one workgroup per row and
// tile of TT tokens; each invocation dequantizes chunks of 32 weights
// (`load_chunk` of the weight type, composed in front of this file) and
// dots each with the tile's activations, in f32; the workgroup then sums
// (`wg_sum4`, the tile's four sums in one reduction). Each dequantized
// chunk is reused for TT tokens.
//
// Rows are numbered wid.x + wid.y · nwg.x (a grid of more than 65 535 rows
// spans two dimensions); wid.z is the token tile. The result row of token t
// is written at y[y_off + t · y_stride + r], soft-capped (c · tanh(y / c))
// when `cap` > 0.

const TT: u32 = 4u;

struct Params {
    rows: u32,
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    cap: f32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.x + wid.y * nwg.x;
    let t0 = wid.z * TT;
    if row >= p.rows {
        return;
    }
    var acc = vec4<f32>(0.0);
    let n_chunks = (p.cols + 31u) / 32u;
    let rbase = row * p.row_bytes;
    for (var c = lanes.lid; c < n_chunks; c += WG) {
        let v = load_chunk(rbase, c, p.cols);
        let n = min(32u, p.cols - c * 32u);
        for (var t = 0u; t < TT; t++) {
            if t0 + t < p.n_tok {
                let xb = p.x_off + (t0 + t) * p.x_stride + c * 32u;
                var s = 0.0;
                for (var j = 0u; j < n; j++) {
                    s += v[j] * x[xb + j];
                }
                acc[t] += s;
            }
        }
    }
    let totals = wg_sum4(acc, lanes);
    for (var t = 0u; t < TT; t++) {
        if lanes.lid == 0u && t0 + t < p.n_tok {
            var r = totals[t];
            if p.cap > 0.0 {
                r = p.cap * tanh(r / p.cap);
            }
            y[p.y_off + (t0 + t) * p.y_stride + row] = r;
        }
    }
}
