// IQ4_NL (ggml block_iq4_nl, 18 bytes per 32 values, 4.5 bits per weight):
// f16 d, 16 bytes of 4-bit indices into ggml's non-linear levels
// kvalues_iq4nl; value j = d · level[nibble], low nibbles first. Chunk `c`
// is block `c`.
const IQ4NL_LEVELS = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn load_chunk(row_byte: u32, c: u32, cols: u32) -> array<f32, 32> {
    var v: array<f32, 32>;
    var levels = IQ4NL_LEVELS;
    let base = row_byte + 18u * c;
    let d = wf16(base);
    for (var k = 0u; k < 4u; k++) {
        let q = wword(base + 2u + 4u * k);
        for (var b = 0u; b < 4u; b++) {
            let x = byte_of(q, b);
            v[4u * k + b] = d * levels[x & 15u];
            v[16u + 4u * k + b] = d * levels[x >> 4u];
        }
    }
    return v;
}
