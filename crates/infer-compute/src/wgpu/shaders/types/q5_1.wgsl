// Q5_1 (ggml block_q5_1, 24 bytes per 32 values, 6 bits per weight): f16
// d, f16 m, 32 fifth bits (u32 qh), 16 bytes of nibbles; value = code · d
// + m. Chunk `c` is block `c`; quarters as Q4_0's.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 24u * c;
    let n = (bytes4(wword(base + 8u + 4u * (q & 3u))) >> vec4<u32>((q >> 2u) * 4u)) & vec4<u32>(15u);
    let code = n | bits4x16(wword(base + 4u) >> (4u * q));
    return vec4<f32>(code) * wf16(base) + wf16(base + 2u);
}
