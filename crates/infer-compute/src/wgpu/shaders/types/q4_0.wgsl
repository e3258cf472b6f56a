// Q4_0 (ggml block_q4_0, 18 bytes per 32 values, 4.5 bits per weight):
// f16 d, 16 bytes of nibbles; value j = (nibble - 8) · d, low nibbles
// first (j < 16), then high. Chunk `c` is block `c`; quarter q holds the
// low (q < 4) or high nibbles of bytes 4(q % 4) .. + 3.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 18u * c;
    let n = (bytes4(wword(base + 2u + 4u * (q & 3u))) >> vec4<u32>((q >> 2u) * 4u)) & vec4<u32>(15u);
    return (vec4<f32>(n) - 8.0) * wf16(base);
}
