// Q6_K (ggml block_q6_K, 210 bytes per 256 values, 6.5625 bits per
// weight): 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8
// scales (one per 16 values), f16 d. Value 32g + k (h = g/4, s = g%4): low
// nibble of ql[64h + 32(s%2) + k] (high nibble for s ≥ 2), high bits
// (qh[32h + k] >> 2s) & 3, value = d · scale · (q − 32). Chunk `c` is group
// c % 8 of super-block c / 8.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 210u * (c >> 3u);
    let g = c & 7u;
    let h = g >> 2u;
    let s = g & 3u;
    let ql = base + 64u * h + 32u * (s & 1u);
    let qh = base + 128u + 32u * h;
    let sc = wf16(base + 208u) * f32(bitcast<i32>(wbyte(base + 192u + 2u * g + (q >> 2u)) << 24u) >> 24u);
    let lo = (bytes4(wword(ql + 4u * q)) >> vec4<u32>((s >> 1u) * 4u)) & vec4<u32>(15u);
    let hi = ((bytes4(wword(qh + 4u * q)) >> vec4<u32>(2u * s)) & vec4<u32>(3u)) << vec4<u32>(4u);
    return sc * (vec4<f32>(lo | hi) - 32.0);
}
