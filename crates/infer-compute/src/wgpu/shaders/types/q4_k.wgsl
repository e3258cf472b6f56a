// Q4_K (ggml block_q4_K, 144 bytes per 256 values, 4.5 bits per weight):
// f16 d, f16 dmin, 12 bytes of 6-bit group scales and mins, 128 bytes of
// nibbles. Group g (32 values) of the super-block: value = d·sc_g·q −
// dmin·m_g, q the low nibbles of bytes 32·(g/2).. for even g, the high ones
// for odd g. Chunk `c` is group c % 8 of super-block c / 8.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 144u * (c >> 3u);
    let g = c & 7u;
    let dm = wf16x2(base) * scale_min_k4(base + 4u, g);
    let qs = base + 16u + 32u * (g >> 1u);
    let n = (bytes4(w[(qs >> 2u) + q]) >> vec4<u32>((g & 1u) * 4u)) & vec4<u32>(15u);
    return dm.x * vec4<f32>(n) - dm.y;
}
