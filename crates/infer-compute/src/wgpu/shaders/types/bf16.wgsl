// BF16 rows: the high 16 bits of an f32; chunk `c` is values 32c..32c+32,
// zero past `cols`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    for (var j = 0u; j < 32u; j += 2u) {
        let i = c * 32u + j;
        let pair = wword(row_byte + 2u * i);
        v[j] = select(0.0, bitcast<f32>(pair << 16u), i < cols);
        v[j + 1u] = select(0.0, bitcast<f32>(pair & 0xffff0000u), i + 1u < cols);
    }
    return v;
}
