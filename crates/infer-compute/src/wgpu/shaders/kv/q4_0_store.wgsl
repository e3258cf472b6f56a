// Writing a q4_0 cache's head (layout: `kv/q4_0.wgsl`), bit-exact with
// ggml's quantize_row_q4_0_ref given the same f32 values: per block of 32,
// max the value of largest magnitude (sign kept, the first of equal
// ones), d = max / −8 (stored as f16), codes min(15, trunc(x · (1/d) +
// 8.5)) with 1/d from the f32 d (0 when d is 0). A block holding a NaN
// gets a NaN scale, so that the NaN reaches the logits (as on CUDA).
// Composed per role after the layout and `kv/quantize.wgsl`.

// Per block of the head: 1/d, and d's f16 bits.
var<workgroup> KV_inv: array<f32, MAX_HD / 32u>;
var<workgroup> KV_scale: array<u32, MAX_HD / 32u>;

// Stores head_buf[0..hd] (`kv/rotation.wgsl`) as the head at `h`
// (KV_head). The whole workgroup calls it (uniform control flow); the
// caller's barrier made head_buf visible.
fn KV_store(h: vec2<u32>, hd: u32, lid: u32) {
    let nb = hd / 32u;
    for (var b = lid; b < nb; b += WG) {
        var amax = 0.0;
        var mx = 0.0;
        var nan = false;
        for (var j = 0u; j < 32u; j++) {
            let x = head_buf[32u * b + j];
            nan = nan || is_nan(x);
            if amax < abs(x) {
                amax = abs(x);
                mx = x;
            }
        }
        // mx / −8 exactly (a power of two: one rounding, as the division's).
        let d = mx * -0.125;
        KV_inv[b] = select(0.0, div_rn(1.0, d), d != 0.0);
        KV_scale[b] = select(f16_rn(d), 0x7e00u, nan);
    }
    workgroupBarrier();
    // Word w: bytes 4(w % 4) .. + 3 of block w / 4, each the codes of
    // values j (low nibble) and j + 16 (high nibble) of the block.
    for (var w = lid; w < hd / 8u; w += WG) {
        let b = w / 4u;
        let id = KV_inv[b];
        let j0 = 32u * b + 4u * (w % 4u);
        var word = 0u;
        for (var e = 0u; e < 4u; e++) {
            let lo = q4_code(head_buf[j0 + e] * id);
            let hi = q4_code(head_buf[j0 + e + 16u] * id);
            word |= (lo | (hi << 4u)) << (8u * e);
        }
        KV_cache[h.x + w] = word;
    }
    for (var s = lid; 2u * s < nb; s += WG) {
        var word = KV_scale[2u * s];
        if 2u * s + 1u < nb {
            word |= KV_scale[2u * s + 1u] << 16u;
        }
        KV_cache[h.y + s] = word;
    }
}
