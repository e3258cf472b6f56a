// Embedding lookup: out[t, :] = scale · dequantize(W[ids[t], :]), one
// workgroup per token, four values at a time through the weight type's
// `load4` (composed in front of this file). The matrix may be split
// in row blocks (one binding each): this dispatch holds rows
// row0..row0 + rows and skips tokens of other blocks.

// Invocations per workgroup (the reductions' size too).
const WG: u32 = 64u;

struct Params {
    n_embd: u32,
    row_bytes: u32,
    scale: f32,
    row0: u32,
    rows: u32,
}

@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let t = wid.x;
    let id = ids[t];
    if id < p.row0 || id >= p.row0 + p.rows {
        return;
    }
    let rbase = (id - p.row0) * p.row_bytes;
    let n_quarters = (p.n_embd + 3u) / 4u;
    for (var s = lanes.lid; s < n_quarters; s += WG) {
        let v = p.scale * load4(rbase, s >> 3u, s & 7u, p.n_embd);
        let i = 4u * s;
        for (var e = 0u; e < 4u; e++) {
            if i + e < p.n_embd {
                out[t * p.n_embd + i + e] = v[e];
            }
        }
    }
}
