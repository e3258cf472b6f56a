// IQ4_NL (ggml block_iq4_nl, 18 bytes per 32 values, 4.5 bits per weight):
// f16 d, 16 bytes of 4-bit indices into ggml's non-linear levels
// kvalues_iq4nl; value j = d · level[nibble], low nibbles first. Chunk `c`
// is block `c`; quarters as Q4_0's.
const IQ4NL_LEVELS = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn load4(row_byte: u32, c: u32, q: u32, cols: u32) -> vec4<f32> {
    let base = row_byte + 18u * c;
    let n = (bytes4(wword(base + 2u + 4u * (q & 3u))) >> vec4<u32>((q >> 2u) * 4u)) & vec4<u32>(15u);
    var levels = IQ4NL_LEVELS;
    return vec4<f32>(levels[n.x], levels[n.y], levels[n.z], levels[n.w]) * wf16(base);
}
