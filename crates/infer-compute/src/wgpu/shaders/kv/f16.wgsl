// KV cache of f16 values: a position's row is its kv_dim values as IEEE
// f16, two per word (value 2i in the low half); head g's values 2i and
// 2i + 1 in word g · hd / 2 + i (head_dim is even). Composed per role as
// `kv/f32.wgsl` says.

// The word offsets of head g in the row that starts at word `row`: its
// values (x) and its scales (y; none here).
fn KV_head(row: u32, g: u32, hd: u32, kv_dim: u32) -> vec2<u32> {
    return vec2<u32>(row + g * hd / 2u, 0u);
}

// Values 2i and 2i + 1 of the head at `h`.
fn KV_load2(h: vec2<u32>, i: u32) -> vec2<f32> {
    return unpack2x16float(KV_cache[h.x + i]);
}
