// Quantized matrix products `y[t, r] = Σ_i W[r, i] · x[t, i]`, in f32 from
// quarters of 32-value chunks (four consecutive weights) dequantized by the
// weight type's `load4` (composed in front of this file, as is
// `product.wgsl`). Two shapes of
// work, one entry point each, chosen by the number of tokens
// (`weights.rs`), and `main_glu`, `main` for a gated FFN's stacked gate
// and up matrices with the activation applied (decode):
//
// - `main` (GEMV and small batches): a workgroup per row and tile of TT
//   tokens; invocation i takes quarters s ≡ i (mod WG) of the row, so a
//   subgroup reads consecutive words of the blocks and consecutive vec4 of
//   the activations, and each quarter serves the TT tokens; one workgroup
//   reduction gives the TT sums. (A whole chunk per invocation, in an
//   array indexed at run time, ran at 30–100 GB/s on the H200: drivers keep
//   such arrays in local memory. Two or four rows per workgroup ran
//   10-30% slower than one.)
// - `main_tiled` (prefill): a workgroup per TM rows and TN tokens, SK
//   invocations per row, each taking every SK-th chunk of it; per step
//   the SK chunks' TN × 32 activations are staged in workgroup memory and
//   each invocation dots its chunk with them, so a weight is dequantized
//   once per TN tokens and an activation read once per TM rows; the SK
//   partial sums are added at the end. (One invocation per row, TM = 64,
//   left most SMs of the H200 idle on 2048-row matrices.)
//
// Rows are numbered from wid.x + wid.y · nwg.x (a grid of more than 65 535
// workgroups spans two dimensions); wid.z is the token (tile). The result
// of token t and row r is written at y[y_off + t · y_stride + r],
// soft-capped (c · tanh(y / c)) when `cap` > 0.

// Invocations per workgroup (the reductions' size too).
const WG: u32 = 64u;

const TT: u32 = 4u;
const TM: u32 = 16u;
const TN: u32 = 16u;
const SK: u32 = 4u;

// The dot products of the weight quarter `wv` (values i .. i + 3 of the
// row) with each token of the tile whose activation rows start at xb (the
// first only unless `multi`).
fn tile_dots(wv: vec4<f32>, i: u32, xb: vec4<u32>, multi: bool) -> vec4<f32> {
    var d = vec4<f32>(dot(wv, x4(xb.x, i)), 0.0, 0.0, 0.0);
    if multi {
        d.y = dot(wv, x4(xb.y, i));
        d.z = dot(wv, x4(xb.z, i));
        d.w = dot(wv, x4(xb.w, i));
    }
    return d;
}

// Where the activation rows of the TT-token tile from t0 start (`main`,
// `main_glu`). Tile tokens past n_tok read token t0's activations (always
// present) and are not written.
fn tile_rows(t0: u32) -> vec4<u32> {
    let xb0 = p.x_off + t0 * p.x_stride;
    return vec4<u32>(
        xb0,
        select(xb0, xb0 + p.x_stride, t0 + 1u < p.n_tok),
        select(xb0, xb0 + 2u * p.x_stride, t0 + 2u < p.n_tok),
        select(xb0, xb0 + 3u * p.x_stride, t0 + 3u < p.n_tok),
    );
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.x + wid.y * nwg.x;
    let t0 = wid.z * TT;
    if row >= p.rows {
        return;
    }
    let xb = tile_rows(t0);
    let multi = t0 + 1u < p.n_tok;
    let rbase = row_base(row);
    let n_quarters = (p.cols + 3u) / 4u;
    var acc = vec4<f32>(0.0);
    var s = lanes.lid;
    // Four quarters a step, all four loaded before any is used, so that an
    // invocation has four weight loads in flight (one at a time left the
    // H200 at 120-270 GB/s).
    for (; s + 3u * WG < n_quarters; s += 4u * WG) {
        let s1 = s + WG;
        let s2 = s + 2u * WG;
        let s3 = s + 3u * WG;
        let w0 = load4(rbase, s >> 3u, s & 7u, p.cols);
        let w1 = load4(rbase, s1 >> 3u, s1 & 7u, p.cols);
        let w2 = load4(rbase, s2 >> 3u, s2 & 7u, p.cols);
        let w3 = load4(rbase, s3 >> 3u, s3 & 7u, p.cols);
        acc += tile_dots(w0, 4u * s, xb, multi) + tile_dots(w1, 4u * s1, xb, multi);
        acc += tile_dots(w2, 4u * s2, xb, multi) + tile_dots(w3, 4u * s3, xb, multi);
    }
    for (; s < n_quarters; s += WG) {
        acc += tile_dots(load4(rbase, s >> 3u, s & 7u, p.cols), 4u * s, xb, multi);
    }
    let totals = wg_sum4(acc, lanes);
    if lanes.lid == 0u {
        for (var t = 0u; t < TT; t++) {
            if t0 + t < p.n_tok {
                y[p.y_off + (t0 + t) * p.y_stride + row] = capped(totals[t]);
            }
        }
    }
}

// The gated activation of `main_glu`, as `elementwise.wgsl`'s `act`: GELU's
// tanh approximation through 0.5 · (1 + tanh z) = 1 / (1 + e^−2z), or SiLU.
fn glu_act(v: f32) -> f32 {
    if p.gelu == 1u {
        let z = 0.7978846 * v * (1.0 + 0.044715 * v * v);
        return v / (1.0 + exp(-2.0 * z));
    }
    return v / (1.0 + exp(-v));
}

// `main` for a gated FFN's gate and up products at once, over a stacked
// matrix (its p.rows gate rows, then as many up rows): the workgroup of
// row r dots gate row r and up row p.rows + r with the same activation
// quarters, and writes act(gate) · up, so that the gate/up products and
// the `glu` dispatch after them are one dispatch (two rows per workgroup,
// half the workgroups).
@compute @workgroup_size(WG)
fn main_glu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, lanes: Lanes) {
    let row = wid.x + wid.y * nwg.x;
    let t0 = wid.z * TT;
    if row >= p.rows {
        return;
    }
    let xb = tile_rows(t0);
    let multi = t0 + 1u < p.n_tok;
    let gbase = row_base(row);
    let ubase = row_base(p.rows + row);
    let n_quarters = (p.cols + 3u) / 4u;
    var acc_g = vec4<f32>(0.0);
    var acc_u = vec4<f32>(0.0);
    var s = lanes.lid;
    // Two quarters of each row a step, all four loads issued first.
    for (; s + WG < n_quarters; s += 2u * WG) {
        let s1 = s + WG;
        let g0 = load4(gbase, s >> 3u, s & 7u, p.cols);
        let g1 = load4(gbase, s1 >> 3u, s1 & 7u, p.cols);
        let u0 = load4(ubase, s >> 3u, s & 7u, p.cols);
        let u1 = load4(ubase, s1 >> 3u, s1 & 7u, p.cols);
        acc_g += tile_dots(g0, 4u * s, xb, multi) + tile_dots(g1, 4u * s1, xb, multi);
        acc_u += tile_dots(u0, 4u * s, xb, multi) + tile_dots(u1, 4u * s1, xb, multi);
    }
    for (; s < n_quarters; s += WG) {
        acc_g += tile_dots(load4(gbase, s >> 3u, s & 7u, p.cols), 4u * s, xb, multi);
        acc_u += tile_dots(load4(ubase, s >> 3u, s & 7u, p.cols), 4u * s, xb, multi);
    }
    let g = wg_sum4(acc_g, lanes);
    let u = wg_sum4(acc_u, lanes);
    if lanes.lid == 0u {
        for (var t = 0u; t < TT; t++) {
            if t0 + t < p.n_tok {
                y[p.y_off + (t0 + t) * p.y_stride + row] = glu_act(g[t]) * u[t];
            }
        }
    }
}

// The activations of one step of `main_tiled`: SK chunks of 32 values for
// each of TN tokens, as 8 vec4 per (chunk, token).
var<workgroup> xs: array<vec4<f32>, 512>;
// The SK partial sums of each (row, token), reduced at the end.
var<workgroup> part_acc: array<f32, 1024>;

@compute @workgroup_size(WG)
fn main_tiled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Invocation lid takes row lid / SK of the tile and, of each group of
    // SK consecutive chunks, chunk lid % SK.
    let rr = lid / SK;
    let part = lid % SK;
    let row = (wid.x + wid.y * nwg.x) * TM + rr;
    let t0 = wid.z * TN;
    let n_chunks = (p.cols + 31u) / 32u;
    var acc: array<f32, 16>;
    for (var g = 0u; g < n_chunks; g += SK) {
        // Stage chunks g .. g + SK of the tile's tokens (zero past the
        // tokens and the row).
        for (var i = lid; i < SK * TN * 8u; i += 64u) {
            let ck = i / (TN * 8u);
            let t = (i / 8u) % TN;
            let j = (i % 8u) * 4u;
            let c = g + ck;
            var q = vec4<f32>(0.0);
            if t0 + t < p.n_tok && c < n_chunks {
                q = x4(p.x_off + (t0 + t) * p.x_stride, c * 32u + j);
            }
            xs[i] = q;
        }
        workgroupBarrier();
        let c = g + part;
        if row < p.rows && c < n_chunks {
            // Values past `cols` (a partial last chunk) are zero.
            var w4: array<vec4<f32>, 8>;
            for (var k = 0u; k < 8u; k++) {
                w4[k] = load4(row_base(row), c, k, p.cols);
            }
            let xb = part * TN * 8u;
            for (var t = 0u; t < TN; t++) {
                var s = 0.0;
                for (var k = 0u; k < 8u; k++) {
                    s += dot(w4[k], xs[xb + t * 8u + k]);
                }
                acc[t] += s;
            }
        }
        workgroupBarrier();
    }
    for (var t = 0u; t < TN; t++) {
        part_acc[lid * TN + t] = acc[t];
    }
    workgroupBarrier();
    // Invocation lid sums (row lid / TN, token lid % TN) for each of the
    // TM · TN / 64 outputs it owns.
    for (var o = lid; o < TM * TN; o += 64u) {
        let r = o / TN;
        let t = o % TN;
        var total = 0.0;
        for (var k = 0u; k < SK; k++) {
            total += part_acc[(r * SK + k) * TN + t];
        }
        let out_row = (wid.x + wid.y * nwg.x) * TM + r;
        if out_row < p.rows && t0 + t < p.n_tok {
            y[p.y_off + (t0 + t) * p.y_stride + out_row] = capped(total);
        }
    }
}
