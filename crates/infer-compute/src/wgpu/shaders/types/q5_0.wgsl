// Q5_0 (ggml block_q5_0, 22 bytes per 32 values, 5.5 bits per weight):
// f16 d, 32 fifth bits (u32 qh, bit j for value j), 16 bytes of nibbles
// (low nibbles values 0..16, high ones 16..32); value = (code - 16) · d.
// Chunk `c` is block `c`; quarters as Q4_0's.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 22u * c;
    let n = (bytes4(wword(base + 6u + 4u * (q & 3u))) >> vec4<u32>((q >> 2u) * 4u)) & vec4<u32>(15u);
    let code = n | bits4x16(wword(base + 2u) >> (4u * q));
    return (vec4<f32>(code) - 16.0) * wf16(base);
}
