// KV cache of f32 values: a position's row is its kv_dim values as f32
// bits, one word each; head g's value c at word g · hd + c.
//
// Every file of `kv/` is composed once per role: `KV_` becomes `k_` (the
// keys) or `v_` (the values), naming the kernel's binding `KV_cache`
// (`array<u32>`) and this file's functions, so that K and V may be of two
// types in one kernel.

// The word offsets of head g in the row that starts at word `row` of a
// cache of kv_dim values per position: its values (x) and its scales (y;
// none here).
fn KV_head(row: u32, g: u32, hd: u32, kv_dim: u32) -> vec2<u32> {
    return vec2<u32>(row + g * hd, 0u);
}

// Values 2i and 2i + 1 of the head at `h`.
fn KV_load2(h: vec2<u32>, i: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(KV_cache[h.x + 2u * i]), bitcast<f32>(KV_cache[h.x + 2u * i + 1u]));
}
