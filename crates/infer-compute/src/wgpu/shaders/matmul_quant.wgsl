// Prefill product `y[t, r] = Σ_i W[r, i] · x[t, i]` for many tokens, as a
// register-tiled GEMM: a workgroup of 256 invocations takes 64 rows × 64
// tokens, each invocation a 4 × 4 block of them (16 accumulators). The k
// dimension goes in steps of one 32-value chunk: half the invocations
// dequantize the step's 64 × 32 weights (the weight type's `load4`,
// composed in front of this file with `product.wgsl`) and the other half
// load its 64 × 32 activations, both into workgroup memory transposed to vec4 of four rows
// (four tokens) per k, so that each k costs an invocation two vec4 reads
// for 16 multiply-adds. A weight is dequantized once per 64 tokens, an
// activation read once per 64 rows. 16 KiB of workgroup memory (WebGPU's
// guaranteed minimum). The classic shared-memory GEMM tiling (as in
// CUTLASS's SIMT kernels), on quantized rows.
//
// Workgroups: wid.x + wid.y · nwg.x numbers the 64-row blocks (a grid of
// more than 65 535 spans two dimensions), wid.z the 64-token tiles. The
// result of token t and row r goes to y[y_off + t · y_stride + r],
// soft-capped (c · tanh(y / c)) when `cap` > 0.

// Invocations per workgroup (the reductions' size too; this kernel has no
// reduction).
const WG: u32 = 256u;
const BM: u32 = 64u;
const BN: u32 = 64u;

// ws[k · 16 + j]: rows 4j .. 4j + 3 of the block at value k of the step;
// xs[k · 16 + j]: tokens 4j .. 4j + 3 of the tile at value k.
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row0 = (wid.x + wid.y * nwg.x) * BM;
    let t0 = wid.z * BN;
    // Staging task of this invocation: (group of four rows or tokens j,
    // quarter q of the chunk).
    let sj = (lid & 127u) >> 3u;
    let sq = lid & 7u;
    // Output block: rows row0 + 4·oi .., tokens t0 + 4·oj ...
    let oi = lid >> 4u;
    let oj = lid & 15u;
    var acc: array<vec4<f32>, 4>;
    let n_chunks = (p.cols + 31u) / 32u;
    for (var c = 0u; c < n_chunks; c++) {
        if lid < 128u {
            // Rows past the matrix repeat its last row (never written).
            var v: array<vec4<f32>, 4>;
            for (var r = 0u; r < 4u; r++) {
                let row = min(row0 + 4u * sj + r, p.rows - 1u);
                v[r] = load4(row_base(row), c, sq, p.cols);
            }
            for (var e = 0u; e < 4u; e++) {
                ws[(4u * sq + e) * 16u + sj] = vec4<f32>(v[0][e], v[1][e], v[2][e], v[3][e]);
            }
        } else {
            // Tokens past n_tok stage zeros.
            var v: array<vec4<f32>, 4>;
            for (var t = 0u; t < 4u; t++) {
                let tok = t0 + 4u * sj + t;
                v[t] = vec4<f32>(0.0);
                if tok < p.n_tok {
                    v[t] = x4(p.x_off + tok * p.x_stride, c * 32u + 4u * sq);
                }
            }
            for (var e = 0u; e < 4u; e++) {
                xs[(4u * sq + e) * 16u + sj] = vec4<f32>(v[0][e], v[1][e], v[2][e], v[3][e]);
            }
        }
        workgroupBarrier();
        for (var k = 0u; k < 32u; k++) {
            let a = ws[k * 16u + oi];
            let b = xs[k * 16u + oj];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        let row = row0 + 4u * oi + r;
        for (var t = 0u; t < 4u; t++) {
            let tok = t0 + 4u * oj + t;
            if row < p.rows && tok < p.n_tok {
                y[p.y_off + tok * p.y_stride + row] = capped(acc[r][t]);
            }
        }
    }
}
