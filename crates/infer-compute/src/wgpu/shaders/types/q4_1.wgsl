// Q4_1 (ggml block_q4_1, 20 bytes per 32 values, 5 bits per weight):
// f16 d, f16 m, 16 bytes of nibbles; value = nibble · d + m, low nibbles
// first. Chunk `c` is block `c`; quarters as Q4_0's.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 20u * c;
    let n = (bytes4(wword(base + 4u + 4u * (q & 3u))) >> vec4<u32>((q >> 2u) * 4u)) & vec4<u32>(15u);
    return vec4<f32>(n) * wf16(base) + wf16(base + 2u);
}
