// Q3_K (ggml block_q3_K, 110 bytes per 256 values, 3.4375 bits per
// weight): 32 bytes of high bits (bit g of byte k for value 32g + k), 64
// bytes of 2-bit quants, 12 bytes of 16 packed 6-bit scales, f16 d. Value
// 32g + k (h = g/4, s = g%4): q = ((qs[32h + k] >> 2s) & 3) − (high ? 0 :
// 4), value = d · (scale − 32) · q, one scale per 16 values. Chunk `c` is
// group c % 8 of super-block c / 8.
fn q3k_scale(s: u32, gs: u32) -> f32 {
    var low = 0u;
    if gs < 8u {
        low = wbyte(s + gs) & 15u;
    } else {
        low = wbyte(s + gs - 8u) >> 4u;
    }
    let high = (wbyte(s + 8u + (gs & 3u)) >> (2u * (gs >> 2u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 110u * (c >> 3u);
    let g = c & 7u;
    let d = wf16(base + 108u);
    let shift = 2u * (g & 3u);
    let qs = base + 32u + 32u * (g >> 2u);
    for (var half = 0u; half < 2u; half++) {
        let dl = d * q3k_scale(base + 96u, 2u * g + half);
        for (var k = 0u; k < 4u; k++) {
            let q = wword(qs + 16u * half + 4u * k);
            let h = wword(base + 16u * half + 4u * k);
            for (var b = 0u; b < 4u; b++) {
                let high = (byte_of(h, b) >> g) & 1u;
                let code = i32((byte_of(q, b) >> shift) & 3u) - select(4, 0, high == 1u);
                v[16u * half + 4u * k + b] = dl * f32(code);
            }
        }
    }
    return v;
}
