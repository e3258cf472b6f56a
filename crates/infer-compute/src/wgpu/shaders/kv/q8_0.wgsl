// KV cache of ggml Q8_0 blocks (32 values: int8 codes, an f16 scale d;
// value = code · d), laid out as CUDA's cache is: a position's row is its
// kv_dim codes (block after block, four to a word, little-endian), then
// each head's hd / 32 scales, two to a word (the even block's in the low
// half), each head's from a word of its own (⌈hd / 64⌉ words a head, so
// that the workgroups writing two heads never share a word). Head g's
// codes start at word g · hd / 4, its scales at word kv_dim / 4 + g ·
// ⌈hd / 64⌉; head_dim is a multiple of 32. Codes and scales are those of
// ggml's quantize_row_q8_0_ref (`kv/q8_0_store.wgsl`). Composed per role
// as `kv/f32.wgsl` says.

// The word offsets of head g in the row that starts at word `row`: its
// codes (x) and its scales (y).
fn KV_head(row: u32, g: u32, hd: u32, kv_dim: u32) -> vec2<u32> {
    return vec2<u32>(row + g * hd / 4u, row + kv_dim / 4u + g * ((hd + 63u) / 64u));
}

// Values 2i and 2i + 1 of the head at `h` (code · d in f32, as ggml's
// dequantize_row_q8_0).
fn KV_load2(h: vec2<u32>, i: u32) -> vec2<f32> {
    let w = bitcast<i32>(KV_cache[h.x + i / 2u]);
    let sh = 16u * (i % 2u);
    let c = vec2<f32>(f32(extractBits(w, sh, 8u)), f32(extractBits(w, sh + 8u, 8u)));
    let b = i / 16u;
    return c * unpack2x16float(KV_cache[h.y + b / 2u])[b % 2u];
}
