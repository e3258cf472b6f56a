// BF16 rows: the high 16 bits of an f32; values 32c + 4q .. + 3 of the
// row, zero past `cols`.
fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let i = c * 32u + 4u * q;
    let a = wword(row_byte + 2u * i);
    let b = wword(row_byte + 2u * i + 4u);
    let v = vec4<f32>(
        bitcast<f32>(a << 16u),
        bitcast<f32>(a & 0xffff0000u),
        bitcast<f32>(b << 16u),
        bitcast<f32>(b & 0xffff0000u),
    );
    return select(vec4<f32>(0.0), v, vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(cols));
}
