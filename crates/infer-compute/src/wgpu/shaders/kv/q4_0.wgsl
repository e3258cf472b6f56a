// KV cache of ggml Q4_0 blocks (32 values: 4-bit codes offset by 8, an
// f16 scale d; value = (code − 8) · d), laid out as CUDA's cache is: a
// position's row is its kv_dim / 2 bytes of codes, 16 per block in ggml's
// order (byte j: value j in the low nibble, value j + 16 in the high
// one; four bytes to a word, little-endian), then each head's hd / 32
// scales, two to a word (the even block's in the low half), each head's
// from a word of its own (⌈hd / 64⌉ words a head, so that the workgroups
// writing two heads never share a word). Head g's codes start at word
// g · hd / 8, its scales at word kv_dim / 8 + g · ⌈hd / 64⌉; head_dim is
// a multiple of 32. Codes and scales are those of ggml's
// quantize_row_q4_0_ref (`kv/q4_0_store.wgsl`). Composed per role as
// `kv/f32.wgsl` says.

// The word offsets of head g in the row that starts at word `row`: its
// codes (x) and its scales (y).
fn KV_head(row: u32, g: u32, hd: u32, kv_dim: u32) -> vec2<u32> {
    return vec2<u32>(row + g * hd / 8u, row + kv_dim / 8u + g * ((hd + 63u) / 64u));
}

// Values 2i and 2i + 1 of the head at `h` ((code − 8) · d in f32, as
// ggml's dequantize_row_q4_0).
fn KV_load2(h: vec2<u32>, i: u32) -> vec2<f32> {
    let b = i / 16u;
    // The values' place in their block (even), and the byte holding the
    // first: the low nibbles hold values 0..16, the high ones 16..32.
    let j = 2u * (i % 16u);
    let byte = j % 16u;
    let w = KV_cache[h.x + 4u * b + byte / 4u];
    let sh = 8u * (byte % 4u) + 4u * (j / 16u);
    let c = vec2<f32>(f32((w >> sh) & 15u), f32((w >> (sh + 8u)) & 15u)) - 8.0;
    return c * unpack2x16float(KV_cache[h.y + b / 2u])[b % 2u];
}
