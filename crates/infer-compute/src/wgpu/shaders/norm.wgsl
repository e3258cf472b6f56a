// The residual add fused with the next normalization, one workgroup per
// token row of n values:
//   a = add_norm ? rms_norm(add) · add_w : add   (a post-norm, Gemma)
//   x += a                                      (when has_add)
//   out = norm(x) · w (+ b)
// norm: RMSNorm x / sqrt(mean(x²) + eps) (Zhang & Sennrich 2019) or
// LayerNorm (x − mean) / sqrt(var + eps) (Ba et al. 2016). Sums in f32.
// Unused operands are bound to a dummy buffer and never read.

// Invocations per workgroup (the reductions' size too): 256, so a row of
// a few thousand values takes each invocation a few steps per pass.
const WG: u32 = 256u;

struct Params {
    n: u32,
    has_add: u32,
    add_norm: u32,
    layer_norm: u32,
    has_bias: u32,
    eps: f32,
    add_eps: f32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> add: array<f32>;
@group(0) @binding(2) var<storage, read> add_w: array<f32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read> nb: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

// Values per invocation held in registers: a row of up to WG · NREG =
// 4096 values is read once, each pass issuing all its loads at once (a
// loop of dependent steps per pass cost 15-30 us a call on the H200).
const NREG: u32 = 16u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    if p.n <= WG * NREG {
        norm_regs(wid.x, lanes);
    } else {
        norm_loop(wid.x, lanes);
    }
}

// Rows of at most WG · NREG values: value lid + k · WG in register k.
fn norm_regs(row: u32, lanes: Lanes) {
    let base = row * p.n;
    let lid = lanes.lid;
    var xv: array<f32, NREG>;
    for (var k = 0u; k < NREG; k++) {
        let i = lid + k * WG;
        xv[k] = select(0.0, x[base + min(i, p.n - 1u)], i < p.n);
    }
    if p.has_add == 1u {
        var av: array<f32, NREG>;
        for (var k = 0u; k < NREG; k++) {
            let i = lid + k * WG;
            av[k] = select(0.0, add[base + min(i, p.n - 1u)], i < p.n);
        }
        if p.add_norm == 1u {
            var ss = 0.0;
            for (var k = 0u; k < NREG; k++) {
                ss += av[k] * av[k];
            }
            let add_scale = 1.0 / sqrt(wg_sum(ss, lanes) / f32(p.n) + p.add_eps);
            for (var k = 0u; k < NREG; k++) {
                let i = lid + k * WG;
                av[k] = av[k] * add_scale * add_w[min(i, p.n - 1u)];
            }
        }
        for (var k = 0u; k < NREG; k++) {
            let i = lid + k * WG;
            xv[k] += av[k];
            if i < p.n {
                x[base + i] = xv[k];
            }
        }
    }
    var mean = 0.0;
    if p.layer_norm == 1u {
        var s = 0.0;
        for (var k = 0u; k < NREG; k++) {
            s += xv[k];
        }
        mean = wg_sum(s, lanes) / f32(p.n);
    }
    var ss = 0.0;
    for (var k = 0u; k < NREG; k++) {
        let d = select(0.0, xv[k] - mean, lid + k * WG < p.n);
        ss += d * d;
    }
    let inv = 1.0 / sqrt(wg_sum(ss, lanes) / f32(p.n) + p.eps);
    for (var k = 0u; k < NREG; k++) {
        let i = lid + k * WG;
        if i < p.n {
            var v = (xv[k] - mean) * inv * nw[i];
            if p.has_bias == 1u {
                v += nb[i];
            }
            out[base + i] = v;
        }
    }
}

// Rows longer than WG · NREG: every pass loops over the row.
fn norm_loop(row: u32, lanes: Lanes) {
    let base = row * p.n;
    let lid = lanes.lid;
    if p.has_add == 1u {
        var add_scale = 1.0;
        if p.add_norm == 1u {
            var ss = 0.0;
            for (var i = lid; i < p.n; i += WG) {
                let a = add[base + i];
                ss += a * a;
            }
            add_scale = 1.0 / sqrt(wg_sum(ss, lanes) / f32(p.n) + p.add_eps);
        }
        for (var i = lid; i < p.n; i += WG) {
            var a = add[base + i];
            if p.add_norm == 1u {
                a = a * add_scale * add_w[i];
            }
            x[base + i] = x[base + i] + a;
        }
    }
    var mean = 0.0;
    if p.layer_norm == 1u {
        var s = 0.0;
        for (var i = lid; i < p.n; i += WG) {
            s += x[base + i];
        }
        mean = wg_sum(s, lanes) / f32(p.n);
    }
    var ss = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x[base + i] - mean;
        ss += v * v;
    }
    let inv = 1.0 / sqrt(wg_sum(ss, lanes) / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WG) {
        var v = (x[base + i] - mean) * inv * nw[i];
        if p.has_bias == 1u {
            v += nb[i];
        }
        out[base + i] = v;
    }
}
