// Byte access to GGUF blocks stored as they are in a `array<u32>` buffer
// (blocks of 18, 22, 34, 110 or 210 bytes are not word-aligned).
// Little-endian, as GGUF. `w` is binding 0 of group 0 in every kernel that
// reads weights. Every weight type composed after this file defines
// `load4(row_byte, c, q, cols) -> vec4<f32>`: values 32c + 4q .. 32c + 4q
// + 3 (q in 0..8) of the row whose first byte is `row_byte`, zero past
// `cols`. A quarter of a 32-value chunk is what one invocation of the
// products takes, so that neighbouring invocations read neighbouring
// words and no kernel holds a dynamically indexed array (which drivers
// put in local memory).

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

// The f16 at byte offset `i`, which is even (every block size and row
// length in bytes is), so both bytes lie in one word.
fn wf16(i: u32) -> f32 {
    return unpack2x16float(w[i >> 2u] >> ((i & 2u) << 3u)).x;
}

// The two f16 at byte offset `i` (4-byte aligned: d and dmin of a
// k-quant super-block of a word-aligned size).
fn wf16x2(i: u32) -> vec2<f32> {
    return unpack2x16float(w[i >> 2u]);
}

// Byte `k` (0..4) of word `v`.
fn byte_of(v: u32, k: u32) -> u32 {
    return (v >> (k << 3u)) & 0xffu;
}

// The four bytes of `v`, lowest first.
fn bytes4(v: u32) -> vec4<u32> {
    return (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// The four bytes of `v` as signed 8-bit values, lowest first.
fn sbytes4(v: u32) -> vec4<i32> {
    return (vec4<i32>(bitcast<i32>(v)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
}

// Bits 0..4 of `v` (the next four high bits of a Q5 block), as 0 or 16.
fn bits4x16(v: u32) -> vec4<u32> {
    return ((vec4<u32>(v) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u);
}
