// Workgroup sums and maxima through subgroup reductions: each subgroup
// reduces in registers, its first lane writes one partial to workgroup
// memory (at its own invocation index, so no subgroup numbering is
// assumed), and every invocation sums the partials. Needs the `subgroups`
// feature of the device.

const WG: u32 = 64u;

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sgi: u32,
}

var<workgroup> red_part: array<f32, WG>;

fn wg_sum(v: f32, lanes: Lanes) -> f32 {
    red_part[lanes.lid] = 0.0;
    workgroupBarrier();
    let s = subgroupAdd(v);
    if lanes.sgi == 0u {
        red_part[lanes.lid] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG; i++) {
        total += red_part[i];
    }
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, lanes: Lanes) -> f32 {
    red_part[lanes.lid] = -3.0e38;
    workgroupBarrier();
    let s = subgroupMax(v);
    if lanes.sgi == 0u {
        red_part[lanes.lid] = s;
    }
    workgroupBarrier();
    var m = -3.0e38;
    for (var i = 0u; i < WG; i++) {
        m = max(m, red_part[i]);
    }
    workgroupBarrier();
    return m;
}

var<workgroup> red_part4: array<vec4<f32>, WG>;

// Four sums at once (one per token of a product's tile), valid in
// invocation 0 only: the products need no broadcast, and one invocation
// reading the WG partials costs a workgroup far less than all of them
// reading them.
fn wg_sum4(v: vec4<f32>, lanes: Lanes) -> vec4<f32> {
    let s = subgroupAdd(v);
    red_part4[lanes.lid] = select(vec4<f32>(0.0), s, lanes.sgi == 0u);
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    if lanes.lid == 0u {
        for (var i = 0u; i < WG; i++) {
            total += red_part4[i];
        }
    }
    workgroupBarrier();
    return total;
}
