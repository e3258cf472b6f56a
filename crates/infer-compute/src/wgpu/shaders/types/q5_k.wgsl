// Q5_K (ggml block_q5_K, 176 bytes per 256 values, 5.5 bits per weight):
// f16 d, f16 dmin, 12 scale bytes as Q4_K, 32 bytes of fifth bits (bit g
// of byte k for value 32g + k), 128 bytes of nibbles as Q4_K. Chunk `c` is
// group c % 8 of super-block c / 8.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 176u * (c >> 3u);
    let g = c & 7u;
    let dm = wf16x2(base) * scale_min_k4(base + 4u, g);
    let qs = base + 48u + 32u * (g >> 1u);
    let n = (bytes4(w[(qs >> 2u) + q]) >> vec4<u32>((g & 1u) * 4u)) & vec4<u32>(15u);
    let hi = ((bytes4(w[((base + 16u) >> 2u) + q]) >> vec4<u32>(g)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return dm.x * vec4<f32>(n | hi) - dm.y;
}
