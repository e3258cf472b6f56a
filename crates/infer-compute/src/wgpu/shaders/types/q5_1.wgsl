// Q5_1 (ggml block_q5_1, 24 bytes per 32 values, 6 bits per weight): f16
// d, f16 m, 32 fifth bits (u32 qh), 16 bytes of nibbles; value = code · d
// + m. Chunk `c` is block `c`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 24u * c;
    let d = wf16(base);
    let m = wf16(base + 2u);
    let qh = wword(base + 4u);
    for (var k = 0u; k < 4u; k++) {
        let q = wword(base + 8u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * k + b;
            let x = byte_of(q, b);
            let lo = (x & 15u) | (((qh >> j) & 1u) << 4u);
            let hi = (x >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            v[j] = f32(lo) * d + m;
            v[16u + j] = f32(hi) * d + m;
        }
    }
    return v;
}
