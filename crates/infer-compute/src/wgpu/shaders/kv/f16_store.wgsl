// Writing an f16 cache's head (layout: `kv/f16.wgsl`). Values past f16's
// range are stored as ±65504, as the CPU and CUDA caches do, rather than
// as infinities. Composed per role after the layout.

// Stores head_buf[0..hd] (`kv/rotation.wgsl`) as the head at `h`
// (KV_head). The whole workgroup calls it; the caller's barrier made
// head_buf visible.
fn KV_store(h: vec2<u32>, hd: u32, lid: u32) {
    for (var i = lid; i < hd / 2u; i += WG) {
        let v = vec2<f32>(head_buf[2u * i], head_buf[2u * i + 1u]);
        KV_cache[h.x + i] = pack2x16float(clamp(v, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
    }
}
