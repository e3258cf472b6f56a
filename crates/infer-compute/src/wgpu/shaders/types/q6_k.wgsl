// Q6_K (ggml block_q6_K, 210 bytes per 256 values, 6.5625 bits per
// weight): 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8
// scales (one per 16 values), f16 d. Value 32g + k (h = g/4, s = g%4): low
// nibble of ql[64h + 32(s%2) + k] (high nibble for s ≥ 2), high bits
// (qh[32h + k] >> 2s) & 3, value = d · scale · (q − 32). Chunk `c` is group
// c % 8 of super-block c / 8.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte + 210u * (c >> 3u);
    let g = c & 7u;
    let h = g >> 2u;
    let s = g & 3u;
    let d = wf16(base + 208u);
    let lo_shift = (s >> 1u) * 4u;
    let ql = base + 64u * h + 32u * (s & 1u);
    let qh = base + 128u + 32u * h;
    let sc0 = d * f32(bitcast<i32>(wbyte(base + 192u + 2u * g) << 24u) >> 24u);
    let sc1 = d * f32(bitcast<i32>(wbyte(base + 193u + 2u * g) << 24u) >> 24u);
    for (var k = 0u; k < 8u; k++) {
        let lw = wword(ql + 4u * k);
        let hw = wword(qh + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let q = ((byte_of(lw, b) >> lo_shift) & 15u) | (((byte_of(hw, b) >> (2u * s)) & 3u) << 4u);
            let sc = select(sc1, sc0, k < 4u);
            v[4u * k + b] = sc * (f32(q) - 32.0);
        }
    }
    return v;
}
