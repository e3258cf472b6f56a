// Q4_1 (ggml block_q4_1, 20 bytes per 32 values, 5 bits per weight):
// f16 d, f16 m, 16 bytes of nibbles; value = nibble · d + m, low nibbles
// first. Chunk `c` is block `c`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 20u * c;
    let d = wf16(base);
    let m = wf16(base + 2u);
    for (var k = 0u; k < 4u; k++) {
        let q = wword(base + 4u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let x = byte_of(q, b);
            v[4u * k + b] = f32(x & 15u) * d + m;
            v[16u + 4u * k + b] = f32(x >> 4u) * d + m;
        }
    }
    return v;
}
