// Q4_K (ggml block_q4_K, 144 bytes per 256 values, 4.5 bits per weight):
// f16 d, f16 dmin, 12 bytes of 6-bit group scales and mins, 128 bytes of
// nibbles. Group g (32 values) of the super-block: value = d·sc_g·q −
// dmin·m_g, q the low nibbles of bytes 32·(g/2).. for even g, the high ones
// for odd g. Chunk `c` is group c % 8 of super-block c / 8.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 144u * (c >> 3u);
    let g = c & 7u;
    let sm = scale_min_k4(base + 4u, g);
    let dl = wf16(base) * sm.x;
    let ml = wf16(base + 2u) * sm.y;
    let shift = (g & 1u) * 4u;
    let qs = base + 16u + 32u * (g >> 1u);
    for (var k = 0u; k < 8u; k++) {
        let q = wword(qs + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            v[4u * k + b] = dl * f32((byte_of(q, b) >> shift) & 15u) - ml;
        }
    }
    return v;
}
