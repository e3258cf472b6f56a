// Q8_0 (ggml block_q8_0, 34 bytes per 32 values, 8.5 bits per weight):
// f16 d, 32 int8 codes; value = code · d. Chunk `c` is block `c`; quarter
// q is codes 4q .. + 3.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 34u * c;
    return vec4<f32>(sbytes4(wword(base + 2u + 4u * q))) * wf16(base);
}
