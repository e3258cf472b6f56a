// Q5_K (ggml block_q5_K, 176 bytes per 256 values, 5.5 bits per weight):
// f16 d, f16 dmin, 12 scale bytes as Q4_K, 32 bytes of fifth bits (bit g
// of byte k for value 32g + k), 128 bytes of nibbles as Q4_K. Chunk `c` is
// group c % 8 of super-block c / 8.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 176u * (c >> 3u);
    let g = c & 7u;
    let sm = scale_min_k4(base + 4u, g);
    let dl = wf16(base) * sm.x;
    let ml = wf16(base + 2u) * sm.y;
    let shift = (g & 1u) * 4u;
    let qs = base + 48u + 32u * (g >> 1u);
    for (var k = 0u; k < 8u; k++) {
        let q = wword(qs + 4u * k);
        let h = wword(base + 16u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let hi = ((byte_of(h, b) >> g) & 1u) << 4u;
            v[4u * k + b] = dl * f32(((byte_of(q, b) >> shift) & 15u) | hi) - ml;
        }
    }
    return v;
}
