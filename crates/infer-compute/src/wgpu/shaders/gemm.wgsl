// Dense f32 GEMM `c = a · b` (a: m×k, b: k×n, row-major) or `c = a · bᵀ`
// (b: n×k) when `transb` is 1: 16×16 output tiles, one invocation per
// output, the k dimension in steps of 16 through workgroup tiles of a and
// b, f32 accumulation.

// Invocations per workgroup (the reductions' size too; 16 × 16).
const WG: u32 = 256u;

const TILE: u32 = 16u;

struct Params {
    m: u32,
    k: u32,
    n: u32,
    transb: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> ta: array<array<f32, TILE>, TILE>;
var<workgroup> tb: array<array<f32, TILE>, TILE>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let i = wid.y * TILE + l.y;
    let j = wid.x * TILE + l.x;
    var acc = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += TILE) {
        let ka = k0 + l.x;
        ta[l.y][l.x] = select(0.0, a[i * p.k + ka], i < p.m && ka < p.k);
        let kb = k0 + l.y;
        var bv = 0.0;
        if kb < p.k && j < p.n {
            if p.transb == 1u {
                bv = b[j * p.k + kb];
            } else {
                bv = b[kb * p.n + j];
            }
        }
        tb[l.y][l.x] = bv;
        workgroupBarrier();
        for (var t = 0u; t < TILE; t++) {
            acc += ta[l.y][t] * tb[t][l.x];
        }
        workgroupBarrier();
    }
    if i < p.m && j < p.n {
        c[i * p.n + j] = acc;
    }
}
