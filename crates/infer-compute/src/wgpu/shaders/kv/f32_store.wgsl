// Writing an f32 cache's head (layout: `kv/f32.wgsl`). Composed per role
// after it.

// Stores head_buf[0..hd] (`kv/rotation.wgsl`) as the head at `h`
// (KV_head). The whole workgroup calls it; the caller's barrier made
// head_buf visible.
fn KV_store(h: vec2<u32>, hd: u32, lid: u32) {
    for (var i = lid; i < hd; i += WG) {
        KV_cache[h.x + i] = bitcast<u32>(head_buf[i]);
    }
}
