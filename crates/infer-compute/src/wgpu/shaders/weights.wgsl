// Byte access to GGUF blocks stored as they are in a `array<u32>` buffer
// (blocks of 18, 22, 34 or 210 bytes are not word-aligned). Little-endian,
// as GGUF. `w` is binding 0 of group 0 in every kernel that reads weights.

@group(0) @binding(0) var<storage, read> w: array<u32>;

fn wbyte(i: u32) -> u32 {
    return (w[i >> 2u] >> ((i & 3u) << 3u)) & 0xffu;
}

// The four bytes at byte offset `i` (any alignment) as one little-endian word.
fn wword(i: u32) -> u32 {
    let s = (i & 3u) << 3u;
    let a = w[i >> 2u];
    if s == 0u {
        return a;
    }
    return (a >> s) | (w[(i >> 2u) + 1u] << (32u - s));
}

// The f16 at byte offset `i` (2-byte aligned within its block).
fn wf16(i: u32) -> f32 {
    return unpack2x16float(wbyte(i) | (wbyte(i + 1u) << 8u)).x;
}

// Byte `k` (0..4) of word `v`.
fn byte_of(v: u32, k: u32) -> u32 {
    return (v >> (k << 3u)) & 0xffu;
}
