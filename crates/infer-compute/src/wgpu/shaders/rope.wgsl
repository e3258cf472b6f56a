// The per-head step between the q/k/v products and attention, one
// workgroup per (head, token): heads 0..n_head are q, then n_head_kv k
// heads, then n_head_kv v heads. Bias add (Qwen2), per-head RMSNorm of q
// and k (Gemma 3, Qwen3), RoPE of q and k (Su et al. 2021, as ggml:
// θ_i = freq_scale · pos · base^(−2i/n_rot), pairs (2i, 2i+1) or NeoX
// (i, i + n_rot/2), dimensions past n_rot unrotated), then q in place and
// k, v into the token's slot of the KV cache at its position. A quantized
// cache is stored rotated (`kv/rotation.wgsl`: H/√n on blocks of n
// values): its k heads and the q heads that meet them by K's block, its v
// heads by V's; a block of 0 leaves the head as computed.
//
// Cache layout: that of the types' `kv/` files composed in front (`k_at`,
// `k_store`; `v_at`, `v_store`): [n_slots][n_ctx] rows of k_row (v_row)
// words, a row holding a position's n_head_kv heads, and for TurboQuant
// the areas of `kv/tq.wgsl`. A TurboQuant cache's rotation is its random
// signs (and the keys' channel scale, the queries' inverse one: `k_mul`)
// and H/√hd.

// Invocations per workgroup (the reductions' size too).
const WG: u32 = 64u;

struct Params {
    n_head: u32,
    n_kv: u32,
    hd: u32,
    n_rot: u32,
    neox: u32,
    n_ctx: u32,
    flags: u32,
    theta_scale: f32,
    freq_scale: f32,
    qn_eps: f32,
    kn_eps: f32,
    // Words of a K (V) cache row.
    k_row: u32,
    v_row: u32,
    // The Hadamard blocks of K (and q) and of V (0: none), and their
    // scales 1/√n.
    k_rot: u32,
    v_rot: u32,
    k_rs: f32,
    v_rs: f32,
}

// flags: 1 bias, 2 q norm, 4 k norm
@group(0) @binding(0) var<storage, read_write> q: array<f32>;
// The k and v heads of the pass; a TurboQuant cache's store writes them
// back in its basis (`kv/tq_store.wgsl`).
@group(0) @binding(1) var<storage, read_write> k_rows: array<f32>;
@group(0) @binding(2) var<storage, read_write> v_rows: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> qn_w: array<f32>;
@group(0) @binding(5) var<storage, read> kn_w: array<f32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(8) var<storage, read> tok_pos: array<u32>;
@group(0) @binding(9) var<storage, read> tok_slot: array<u32>;
@group(0) @binding(10) var<uniform> p: Params;
// Unused here: named by the TurboQuant cache's reads (`kv/tq.wgsl`).
@group(0) @binding(11) var<storage, read> tok_span: array<u32>;

// The head's values before RoPE (its final ones go to head_buf).
var<workgroup> hv: array<f32, MAX_HD>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, lanes: Lanes) {
    let head = wid.x;
    let t = wid.y;
    let lid = lanes.lid;
    let hd = p.hd;
    let q_dim = p.n_head * hd;
    let kv_dim = p.n_kv * hd;
    let is_q = head < p.n_head;
    let is_k = !is_q && head < p.n_head + p.n_kv;
    // The head's values and its bias offset (biases are [q | k | v]).
    var src = 0u;
    var boff = 0u;
    if is_q {
        src = t * q_dim + head * hd;
        boff = head * hd;
    } else if is_k {
        src = t * kv_dim + (head - p.n_head) * hd;
        boff = q_dim + (head - p.n_head) * hd;
    } else {
        src = t * kv_dim + (head - p.n_head - p.n_kv) * hd;
        boff = q_dim + kv_dim + (head - p.n_head - p.n_kv) * hd;
    }
    for (var i = lid; i < hd; i += WG) {
        var val = 0.0;
        if is_q {
            val = q[src + i];
        } else if is_k {
            val = k_rows[src + i];
        } else {
            val = v_rows[src + i];
        }
        if (p.flags & 1u) != 0u {
            val += bias[boff + i];
        }
        hv[i] = val;
    }
    workgroupBarrier();
    // Per-head RMSNorm (uniform: depends on the workgroup's head only).
    let norm_q = is_q && (p.flags & 2u) != 0u;
    let norm_k = is_k && (p.flags & 4u) != 0u;
    var ss = 0.0;
    for (var i = lid; i < hd; i += WG) {
        ss += hv[i] * hv[i];
    }
    let total = wg_sum(ss, lanes);
    if norm_q || norm_k {
        let eps = select(p.kn_eps, p.qn_eps, norm_q);
        let inv = 1.0 / sqrt(total / f32(hd) + eps);
        for (var i = lid; i < hd; i += WG) {
            var nwv = 0.0;
            if norm_q {
                nwv = qn_w[i];
            } else {
                nwv = kn_w[i];
            }
            hv[i] = hv[i] * inv * nwv;
        }
    }
    workgroupBarrier();
    let pos = tok_pos[t];
    let slot = tok_slot[t];
    let half_rot = p.n_rot / 2u;
    for (var i = lid; i < hd; i += WG) {
        var val = hv[i];
        if (is_q || is_k) && i < p.n_rot {
            // The pair of dimension i and its rotation angle.
            var pair = 0u;
            var other = 0u;
            var sign = 1.0;
            if p.neox == 1u {
                pair = i % half_rot;
                other = select(i - half_rot, i + half_rot, i < half_rot);
                sign = select(1.0, -1.0, i < half_rot);
            } else {
                pair = i / 2u;
                other = i ^ 1u;
                sign = select(1.0, -1.0, (i & 1u) == 0u);
            }
            let theta = p.freq_scale * f32(pos) * pow(p.theta_scale, f32(pair));
            val = hv[i] * cos(theta) + sign * hv[other] * sin(theta);
        }
        // The type's factor before its rotation (`k_mul`, `v_mul`: 1 but for
        // TurboQuant's signs and key scale).
        if is_q || is_k {
            head_buf[i] = val * k_mul(i, is_q);
        } else {
            head_buf[i] = val * v_mul(i, false);
        }
    }
    workgroupBarrier();
    // Into the cache's basis (uniform: the workgroup's head decides).
    if is_q || is_k {
        hadamard(p.k_rot, p.k_rs, hd, lid);
    } else {
        hadamard(p.v_rot, p.v_rs, hd, lid);
    }
    if is_q {
        for (var i = lid; i < hd; i += WG) {
            q[src + i] = head_buf[i];
        }
    } else if is_k {
        k_store(k_at(slot, pos, t, head - p.n_head), hd, lid);
    } else {
        v_store(v_at(slot, pos, t, head - p.n_head - p.n_kv), hd, lid);
    }
}
