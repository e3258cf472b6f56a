// The 6-bit scale and min of group `g` (0..8) of a Q4_K/Q5_K super-block
// whose 12 packed scale bytes start at byte `s` (ggml get_scale_min_k4).
fn scale_min_k4(s: u32, g: u32) -> vec2<f32> {
    if g < 4u {
        return vec2<f32>(f32(wbyte(s + g) & 63u), f32(wbyte(s + g + 4u) & 63u));
    }
    let sc = (wbyte(s + g + 4u) & 15u) | ((wbyte(s + g - 4u) >> 6u) << 4u);
    let m = (wbyte(s + g + 4u) >> 4u) | ((wbyte(s + g) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
