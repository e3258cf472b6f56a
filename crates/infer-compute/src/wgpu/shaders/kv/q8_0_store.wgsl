// Writing a q8_0 cache's head (layout: `kv/q8_0.wgsl`), bit-exact with
// ggml's quantize_row_q8_0_ref given the same f32 values: per block of 32,
// d = amax / 127 (stored as f16), codes roundf(x · (1/d)) with 1/d from
// the f32 d (0 when d is 0). A block holding a NaN gets a NaN scale, so
// that the NaN reaches the logits (as on CUDA). Composed per role after
// the layout and `kv/quantize.wgsl`.

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
        var nan = false;
        for (var j = 0u; j < 32u; j++) {
            let x = head_buf[32u * b + j];
            nan = nan || is_nan(x);
            if abs(x) > amax {
                amax = abs(x);
            }
        }
        let d = div_rn(amax, 127.0);
        KV_inv[b] = select(0.0, div_rn(1.0, d), d != 0.0);
        KV_scale[b] = select(f16_rn(d), 0x7e00u, nan);
    }
    workgroupBarrier();
    // Word w: codes 4w .. 4w + 3 of the head.
    for (var w = lid; w < hd / 4u; w += WG) {
        let id = KV_inv[w / 8u];
        var word = 0u;
        for (var e = 0u; e < 4u; e++) {
            word |= q8_code(head_buf[4u * w + e] * id) << (8u * e);
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
