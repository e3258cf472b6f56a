// What every quantized product kernel (`matvec.wgsl`, `matmul_quant.wgsl`,
// composed after this file) shares: its parameters (the host's
// `ProductIo` and the matrix shape, `weights.rs`), activations `x` and
// results `y`, the soft cap of the results and the activation reads.
// Token t's activations start at x[x_off + t · x_stride]; its result for
// row r goes to y[y_off + t · y_stride + r]. Row r is row w_row0 + r of
// the bound weights (a range of a stacked matrix, `weights.rs`).

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
    w_row0: u32,
    // `main_glu`: 1 GELU (tanh), else SiLU.
    gelu: u32,
}

// Byte offset of row r of the product (see `w_row0`).
fn row_base(r: u32) -> u32 {
    return (p.w_row0 + r) * p.row_bytes;
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// The result v, soft-capped (c · tanh(v / c)) when `cap` > 0.
fn capped(v: f32) -> f32 {
    if p.cap > 0.0 {
        return p.cap * tanh(v / p.cap);
    }
    return v;
}

// Activations i .. i + 3 of the token whose row starts at x[b], zero past
// `cols` (where the weights are zero too, but an activation there may be
// another token's, or past the buffer).
fn x4(b: u32, i: u32) -> vec4<f32> {
    let v = vec4<f32>(x[b + i], x[b + i + 1u], x[b + i + 2u], x[b + i + 3u]);
    if i + 4u <= p.cols {
        return v;
    }
    return select(vec4<f32>(0.0), v, vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.cols));
}
