// Q8_0 (ggml block_q8_0, 34 bytes per 32 values, 8.5 bits per weight):
// f16 d, 32 int8 codes; value = code · d. Chunk `c` is block `c`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 34u * c;
    let d = wf16(base);
    for (var k = 0u; k < 8u; k++) {
        let q = wword(base + 2u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let x = bitcast<i32>(q << (24u - 8u * b)) >> 24u;
            v[4u * k + b] = f32(x) * d;
        }
    }
    return v;
}
