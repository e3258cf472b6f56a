// Workgroup sums and maxima through subgroup reductions: each subgroup
// reduces in registers, its first lane writes one partial to workgroup
// memory (at its own invocation index, so no subgroup numbering is
// assumed), and every invocation sums the partials, four at a time. Needs
// the `subgroups` feature of the device. WG, the workgroup size (a
// multiple of 4), is the kernel file's.

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sgi: u32,
}

var<workgroup> red_part: array<f32, WG>;

fn wg_sum(v: f32, lanes: Lanes) -> f32 {
    let s = subgroupAdd(v);
    red_part[lanes.lid] = select(0.0, s, lanes.sgi == 0u);
    workgroupBarrier();
    var t = vec4<f32>(0.0);
    for (var i = 0u; i < WG; i += 4u) {
        t += vec4<f32>(red_part[i], red_part[i + 1u], red_part[i + 2u], red_part[i + 3u]);
    }
    workgroupBarrier();
    return (t.x + t.y) + (t.z + t.w);
}

fn wg_max(v: f32, lanes: Lanes) -> f32 {
    let s = subgroupMax(v);
    red_part[lanes.lid] = select(-3.0e38, s, lanes.sgi == 0u);
    workgroupBarrier();
    var m = vec4<f32>(-3.0e38);
    for (var i = 0u; i < WG; i += 4u) {
        m = max(m, vec4<f32>(red_part[i], red_part[i + 1u], red_part[i + 2u], red_part[i + 3u]));
    }
    workgroupBarrier();
    return max(max(m.x, m.y), max(m.z, m.w));
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
