// Writing a TurboQuant cache's head from `rope` (layout: `kv/tq.wgsl`):
// the head's values (in the rotated basis, head_buf) go to the pass's rows
// `KV_rows` in f32, where `tq_cache.wgsl` codes them (`encode`, once the
// slot's centre is set by `centre`) and the ring takes them after the
// attention (`keep`); a position below n_exact is also stored exact, in
// f16 saturated at ±65504 as the CPU's. Composed per role after the layout
// and `kv/quantize.wgsl`.

// Stores head_buf[0..hd] as the head at `h` (KV_at: slot, position, token,
// head). The whole workgroup calls it; the caller's barrier made head_buf
// visible.
fn KV_store(h: vec4<u32>, hd: u32, lid: u32) {
    let kv_dim = KV_hdr(KV_F_N_KV) * hd;
    let at = h.z * kv_dim + h.w * hd;
    for (var i = lid; i < hd; i += WG) {
        KV_rows[at + i] = head_buf[i];
    }
    let n_exact = KV_hdr(KV_F_N_EXACT);
    if h.y < n_exact {
        let e = KV_hdr(KV_F_EXACT) + (h.x * n_exact + h.y) * kv_dim / 2u + h.w * hd / 2u;
        for (var i = lid; i < hd / 2u; i += WG) {
            KV_cache[e + i] = f16_sat(head_buf[2u * i]) | (f16_sat(head_buf[2u * i + 1u]) << 16u);
        }
    }
}
