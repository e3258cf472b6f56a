// F16 rows: chunk `c` is values 32c..32c+32 of the row, zero past `cols`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    for (var j = 0u; j < 32u; j += 2u) {
        let i = c * 32u + j;
        let pair = unpack2x16float(wword(row_byte + 2u * i));
        v[j] = select(0.0, pair.x, i < cols);
        v[j + 1u] = select(0.0, pair.y, i + 1u < cols);
    }
    return v;
}
