// Q2_K (ggml block_q2_K, 84 bytes per 256 values, 2.625 bits per weight):
// 16 bytes of 4-bit scale (low) and min (high) per 16 values, 64 bytes of
// 2-bit quants, f16 d, f16 dmin. Value 32g + k (h = g/4, s = g%4): q =
// (qs[32h + k] >> 2s) & 3, value = d·(sc & 15)·q − dmin·(sc >> 4) with sc
// the byte of its 16-value group. Chunk `c` is group c % 8 of super-block
// c / 8.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 84u * (c >> 3u);
    let g = c & 7u;
    let d = wf16(base + 80u);
    let dmin = wf16(base + 82u);
    let shift = 2u * (g & 3u);
    let qs = base + 16u + 32u * (g >> 2u);
    for (var half = 0u; half < 2u; half++) {
        let sc = wbyte(base + 2u * g + half);
        let dl = d * f32(sc & 15u);
        let ml = dmin * f32(sc >> 4u);
        for (var k = 0u; k < 4u; k++) {
            let q = wword(qs + 16u * half + 4u * k);
            for (var b = 0u; b < 4u; b++) {
                v[16u * half + 4u * k + b] = dl * f32((byte_of(q, b) >> shift) & 3u) - ml;
            }
        }
    }
    return v;
}
