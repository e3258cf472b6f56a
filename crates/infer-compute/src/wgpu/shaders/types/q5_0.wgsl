// Q5_0 (ggml block_q5_0, 22 bytes per 32 values, 5.5 bits per weight):
// f16 d, 32 fifth bits (u32 qh, bit j for value j), 16 bytes of nibbles;
// value = (code - 16) · d. Chunk `c` is block `c`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 22u * c;
    let d = wf16(base);
    let qh = wword(base + 2u);
    for (var k = 0u; k < 4u; k++) {
        let q = wword(base + 6u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * k + b;
            let x = byte_of(q, b);
            let lo = (x & 15u) | (((qh >> j) & 1u) << 4u);
            let hi = (x >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            v[j] = (f32(lo) - 16.0) * d;
            v[16u + j] = (f32(hi) - 16.0) * d;
        }
    }
    return v;
}
