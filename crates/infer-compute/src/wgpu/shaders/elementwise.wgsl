// Element-wise kernels over n values (one invocation each; the grid's
// second dimension extends the first past 65 535 workgroups):
// - `glu`: a = act(gate) · up (GEGLU / SwiGLU, Shazeer 2020);
// - `act`: a = act(a) in place (a plain FFN);
// - `gather`: dst row r = src row idx[r] (rows of `row` values), the wanted
//   rows before the vocabulary product.
// act: SiLU x / (1 + e^−x), or GELU's tanh approximation evaluated as ggml
// through 0.5 · (1 + tanh z) = 1 / (1 + e^−2z), z = √(2/π)·(x + 0.044715·x³).

// Invocations per workgroup (the reductions' size too).
const WG: u32 = 64u;

struct Params {
    n: u32,
    gelu: u32,
    row: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

fn act(x: f32) -> f32 {
    if p.gelu == 1u {
        let z = 0.7978846 * x * (1.0 + 0.044715 * x * x);
        return x / (1.0 + exp(-2.0 * z));
    }
    return x / (1.0 + exp(-x));
}

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// Each entry point binds only the buffers it uses.
// glu: src holds gate, dst holds up on entry and the product on exit.
@compute @workgroup_size(WG)
fn glu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if i < p.n {
        dst[i] = act(src[i]) * dst[i];
    }
}

@compute @workgroup_size(WG)
fn act_inplace(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if i < p.n {
        dst[i] = act(dst[i]);
    }
}

@compute @workgroup_size(WG)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if i < p.n {
        let r = i / p.row;
        let c = i % p.row;
        dst[i] = src[idx[r] * p.row + c];
    }
}
