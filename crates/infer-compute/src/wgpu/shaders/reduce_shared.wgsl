// Workgroup sums and maxima through workgroup memory: a tree of halving
// steps with a barrier each (the fallback where the adapter lacks
// subgroups). Every invocation gets the result. WG, the workgroup size (a
// power of two), is the kernel file's.

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
}

var<workgroup> red_part: array<f32, WG>;

fn wg_sum(v: f32, lanes: Lanes) -> f32 {
    red_part[lanes.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lanes.lid < s {
            red_part[lanes.lid] += red_part[lanes.lid + s];
        }
        workgroupBarrier();
    }
    let total = red_part[0];
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, lanes: Lanes) -> f32 {
    red_part[lanes.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lanes.lid < s {
            red_part[lanes.lid] = max(red_part[lanes.lid], red_part[lanes.lid + s]);
        }
        workgroupBarrier();
    }
    let m = red_part[0];
    workgroupBarrier();
    return m;
}

var<workgroup> red_part4: array<vec4<f32>, WG>;

// Four sums at once (one per token of a product's tile); every
// invocation gets them (the subgroup version promises invocation 0 only).
fn wg_sum4(v: vec4<f32>, lanes: Lanes) -> vec4<f32> {
    red_part4[lanes.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lanes.lid < s {
            red_part4[lanes.lid] += red_part4[lanes.lid + s];
        }
        workgroupBarrier();
    }
    let total = red_part4[0];
    workgroupBarrier();
    return total;
}
