// Q4_0 (ggml block_q4_0, 18 bytes per 32 values, 4.5 bits per weight):
// f16 d, 16 bytes of nibbles; value j = (nibble - 8) · d, low nibbles
// first (j < 16), then high. Chunk `c` is block `c`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 18u * c;
    let d = wf16(base);
    for (var k = 0u; k < 4u; k++) {
        let q = wword(base + 2u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let x = byte_of(q, b);
            v[4u * k + b] = (f32(x & 15u) - 8.0) * d;
            v[16u + 4u * k + b] = (f32(x >> 4u) - 8.0) * d;
        }
    }
    return v;
}
