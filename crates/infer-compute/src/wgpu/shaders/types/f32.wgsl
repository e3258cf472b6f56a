// F32 rows: chunk `c` is values 32c..32c+32 of the row, zero past `cols`.
fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    let base = row_byte >> 2u;
    for (var j = 0u; j < 32u; j++) {
        let i = c * 32u + j;
        v[j] = select(0.0, bitcast<f32>(w[base + i]), i < cols);
    }
    return v;
}
