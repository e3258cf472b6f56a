// Q2_K (ggml block_q2_K, 84 bytes per 256 values, 2.625 bits per weight):
// 16 bytes of 4-bit scale (low) and min (high) per 16 values, 64 bytes of
// 2-bit quants, f16 d, f16 dmin. Value 32g + k (h = g/4, s = g%4): q =
// (qs[32h + k] >> 2s) & 3, value = d·(sc & 15)·q − dmin·(sc >> 4) with sc
// the byte of its 16-value group. Chunk `c` is group c % 8 of super-block
// c / 8.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 84u * (c >> 3u);
    let g = c & 7u;
    let dm = wf16x2(base + 80u);
    let sc = wbyte(base + 2u * g + (q >> 2u));
    let qs = base + 16u + 32u * (g >> 2u);
    let n = (bytes4(wword(qs + 4u * q)) >> vec4<u32>(2u * (g & 3u))) & vec4<u32>(3u);
    return dm.x * f32(sc & 15u) * vec4<f32>(n) - dm.y * f32(sc >> 4u);
}
