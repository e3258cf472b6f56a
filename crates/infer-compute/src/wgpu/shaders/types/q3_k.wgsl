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

fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 110u * (c >> 3u);
    let g = c & 7u;
    let dl = wf16(base + 108u) * q3k_scale(base + 96u, 2u * g + (q >> 2u));
    let qs = base + 32u + 32u * (g >> 2u);
    let low = (bytes4(wword(qs + 4u * q)) >> vec4<u32>(2u * (g & 3u))) & vec4<u32>(3u);
    let high = (bytes4(wword(base + 4u * q)) >> vec4<u32>(g)) & vec4<u32>(1u);
    let code = vec4<i32>(low) - select(vec4<i32>(4), vec4<i32>(0), high == vec4<u32>(1u));
    return dl * vec4<f32>(code);
}
