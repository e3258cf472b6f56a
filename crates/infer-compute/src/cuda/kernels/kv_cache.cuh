// The KV cache's element types on the device: how the attention kernels
// read a cached row and how the q/k/v post-processing writes one.
//
// A cache (one layer's K or V of one slot) is n_ctx rows of `row` bytes,
// position-major; a row holds the kv_dim = n_kv * hd values of one position
// (cuda/kv_pool.rs, CacheLayout, sizes each row):
//   KV_F16:  kv_dim f16 values;
//   KV_Q8_0: kv_dim int8 codes (ggml Q8_0's qs, block after block), then
//            kv_dim / 32 f16 scales, padded to 16 bytes;
//   KV_Q4_0: kv_dim / 2 bytes of 4-bit codes, 16 per block of 32 values in
//            ggml Q4_0's order (byte j: value j in the low nibble, value
//            j + 16 in the high one, each offset by 8), then kv_dim / 32
//            f16 scales, padded to 16 bytes.
// The codes and scales are those of ggml's quantize_row_q8_0_ref and
// quantize_row_q4_0_ref (quant::q8_0, quant::q4_0 on the CPU); only the
// scales sit apart from their codes, so that eight values are one aligned
// 8-byte load. The quantized types are stored rotated as the CPU stores
// them (cpu::kv_rotation: H/sqrt(n) on blocks of n values; the queries
// that meet rotated keys are rotated alike, and the attention output of
// rotated values is rotated back: by the decode kernels themselves, by
// attn_unrotate after the others). A widened value rounds to f16 where a
// kernel stages it as f16, as the f16 cache's values are; a scale past
// f16's range (a block whose largest value passes 8.3 million in q8_0,
// 524 000 in q4_0) is an infinity, as on the CPU.

#define KV_F16 0
#define KV_Q8_0 1
#define KV_Q4_0 2

// Eight f32 values as f16 (round to nearest even, saturating).
__device__ __forceinline__ uint4 pack8_f16(const float* x) {
    u32 w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = (u32)f32_to_f16_sat(x[2 * e]) | ((u32)f32_to_f16_sat(x[2 * e + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The raw chunk of values col .. col + 7 (col a multiple of 8) of a row:
// KV_F16 the eight halves; KV_Q8_0 the eight codes in x, y and the block's
// scale in z; KV_Q4_0 the eight code bytes in x, y whose low (w = 0) or
// high (w = 1) nibbles are the values, the scale in z. Zero is a chunk of
// zeros in every type.
__device__ __forceinline__ uint4 kv_load8(const u8* row, int type, int kv_dim, int col) {
    if (type == KV_F16) return *(const uint4*)(row + (size_t)col * 2);
    const int b = col / 32, c = (col % 32) / 8;
    if (type == KV_Q8_0) {
        const uint2 q = *(const uint2*)(row + col);
        return make_uint4(q.x, q.y, *(const u16*)(row + kv_dim + b * 2), 0);
    }
    const uint2 q = *(const uint2*)(row + b * 16 + (c & 1) * 8);
    return make_uint4(q.x, q.y, *(const u16*)(row + kv_dim / 2 + b * 2), c >> 1);
}

// Byte i of w as an exact float (0..255), by the exponent trick: the
// word [b, 0, 0, 0x4B] is 2^23 + b. One byte permute and one add, where a
// conversion instruction runs at a quarter of the rate.
__device__ __forceinline__ float byte_f32(u32 w, int i) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | i)) - 8388608.0f;
}

// The codes of a quantized raw chunk as exact floats (q8_0: -128..127,
// q4_0: -8..7), scale not applied.
__device__ __forceinline__ void kv_codes8(const uint4 r, int type, float* c) {
    u32 x = r.x, y = r.y;
    float off = 128.0f;
    if (type == KV_Q8_0) {
        x ^= 0x80808080u;  // two's complement to offset binary: b = q + 128
        y ^= 0x80808080u;
    } else {
        const int sh = r.w ? 4 : 0;
        x = (x >> sh) & 0x0F0F0F0Fu;
        y = (y >> sh) & 0x0F0F0F0Fu;
        off = 8.0f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        c[e] = byte_f32(x, e) - off;
        c[4 + e] = byte_f32(y, e) - off;
    }
}

// The eight values of a raw chunk (kv_load8).
__device__ __forceinline__ void kv_unpack8(const uint4 r, int type, float* x) {
    if (type == KV_F16) {
        const u32 w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            x[2 * e] = f16_to_f32((u16)(w[e] & 0xFFFFu));
            x[2 * e + 1] = f16_to_f32((u16)(w[e] >> 16));
        }
        return;
    }
    const float d = f16_to_f32((u16)r.z);
    kv_codes8(r, type, x);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] *= d;
}

__device__ __forceinline__ u32 f16x2_sub(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ u32 f16x2_mul(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// A raw chunk as eight f16 values (the layout of the f16 cache), for the
// kernels that stage the cache in shared memory as f16. Quantized codes go
// through the f16 exponent trick (the half 0x6400 | b is 1024 + b, exact)
// and half2 arithmetic: (1024 + b) - (1024 + offset) is the code exactly,
// and its product with the f16 scale is rounded once, to the value that
// rounding the f32 product d * q gives.
__device__ __forceinline__ uint4 kv_f16x8(const uint4 r, int type) {
    if (type == KV_F16) return r;
    u32 x = r.x, y = r.y, bias;
    if (type == KV_Q8_0) {
        x ^= 0x80808080u;
        y ^= 0x80808080u;
        bias = 0x64806480u;  // 1152 = 1024 + 128
    } else {
        const int sh = r.w ? 4 : 0;
        x = (x >> sh) & 0x0F0F0F0Fu;
        y = (y >> sh) & 0x0F0F0F0Fu;
        bias = 0x64086408u;  // 1032 = 1024 + 8
    }
    const u32 d = (r.z & 0xFFFFu) * 0x10001u;
    const auto pair = [&](u32 w, u32 sel) { return f16x2_mul(f16x2_sub(__byte_perm(w, 0x64646464u, sel), bias), d); };
    return make_uint4(pair(x, 0x4140), pair(x, 0x4342), pair(y, 0x4140), pair(y, 0x4342));
}

// Dot product of a raw chunk with eight f32 values (q, 16-byte aligned);
// a quantized chunk's scale multiplies the sum once.
__device__ __forceinline__ float kv_dot8(const uint4 r, int type, const float* q) {
    float x[8];
    if (type == KV_F16) kv_unpack8(r, type, x);
    else kv_codes8(r, type, x);
    const float4 qa = *(const float4*)q, qb = *(const float4*)(q + 4);
    const float s = qa.x * x[0] + qa.y * x[1] + qa.z * x[2] + qa.w * x[3] + qb.x * x[4] + qb.y * x[5] + qb.z * x[6]
                    + qb.w * x[7];
    return type == KV_F16 ? s : s * f16_to_f32((u16)r.z);
}

// Value col of a row.
__device__ __forceinline__ float kv_value(const u8* row, int type, int kv_dim, int col) {
    if (type == KV_F16) return f16_to_f32(*(const u16*)(row + (size_t)col * 2));
    const int b = col / 32, j = col % 32;
    if (type == KV_Q8_0) return (float)(signed char)row[col] * f16_to_f32(*(const u16*)(row + kv_dim + b * 2));
    const u8 byte = row[b * 16 + (j & 15)];
    const int code = j < 16 ? byte & 15 : byte >> 4;
    return (float)(code - 8) * f16_to_f32(*(const u16*)(row + kv_dim / 2 + b * 2));
}

// Writes the 32 values held by a warp's lanes (value `lane`) as block
// col0 / 32 of a quantized row (col0 a multiple of 32), bit-exact with
// ggml's reference quantizers given the same f32 values. A block holding a
// NaN gets a NaN scale, so that the NaN reaches the logits.
__device__ __forceinline__ void kv_store32_warp(u8* row, int type, int kv_dim, int col0, float x) {
    const int lane = threadIdx.x % WARP, b = col0 / 32;
    const bool nan = __any_sync(FULL_MASK, x != x);
    const float amax = warp_max(fabsf(x));
    if (type == KV_Q8_0) {
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        row[col0 + lane] = (u8)(signed char)(int)roundf(x * id);
        if (lane == 0) *(u16*)(row + kv_dim + b * 2) = f32_to_f16(nan ? __int_as_float(0x7fc00000) : d);
        return;
    }
    // Q4_0: the value of largest magnitude with its sign, the first of equal ones.
    const unsigned at = __ballot_sync(FULL_MASK, fabsf(x) == amax);
    const float mx = __shfl_sync(FULL_MASK, x, at ? __ffs(at) - 1 : 0);
    const float d = mx / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float t = x * id + 8.5f;
    const int code = min(15, t >= 0.0f ? (int)t : 0);
    const int hi = __shfl_down_sync(FULL_MASK, code, 16);
    if (lane < 16) row[b * 16 + lane] = (u8)(code | (hi << 4));
    if (lane == 0) *(u16*)(row + kv_dim / 2 + b * 2) = f32_to_f16(nan ? __int_as_float(0x7fc00000) : d);
}

// Stores the hd values x (any memory the block can read) as head g's
// values of a row, in `type`: the whole block takes part (quantized types:
// a warp per block of 32 values, hd a multiple of 32).
__device__ __forceinline__ void kv_store_head(u8* row, int type, int kv_dim, int g, const float* x, int hd) {
    if (type == KV_F16) {
        u16* r = (u16*)row + (size_t)g * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) r[d] = f32_to_f16_sat(x[d]);
        return;
    }
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    for (int b = warp; b < hd / 32; b += n_warps) kv_store32_warp(row, type, kv_dim, g * hd + b * 32, x[b * 32 + lane]);
}

// Segments of shared memory rotated together by hadamard_smem: seg[i]
// holds len[i] values (a multiple of n[i]) rotated in blocks of n[i] (a
// power of two; 0 or len 0: left alone).
struct HadSegs {
    float* seg[3];
    int len[3], n[3];
};

// Each segment <- (H / sqrt(n)) x on each of its blocks of n values, in
// the order of cpu::kv_rotation's hadamard (butterflies of span 1, 2, 4,
// ..., then the scale, which each segment's last butterfly applies to the
// sums it writes: the same products). All segments share each stage's
// barrier. Every thread of the block calls it, after the barrier that
// makes the segments visible; it ends with a barrier.
__device__ __forceinline__ void hadamard_smem(const HadSegs& h) {
    int n_max = 1;
#pragma unroll
    for (int i = 0; i < 3; ++i)
        if (h.len[i] > 0) n_max = max(n_max, h.n[i]);
    for (int span = 1; span < n_max; span <<= 1) {
        // The segments' butterflies of this stage, laid end to end.
        int pairs[3];
#pragma unroll
        for (int i = 0; i < 3; ++i) pairs[i] = h.len[i] > 0 && span < h.n[i] ? h.len[i] / 2 : 0;
        for (int t = threadIdx.x; t < pairs[0] + pairs[1] + pairs[2]; t += blockDim.x) {
            const int i = t < pairs[0] ? 0 : t < pairs[0] + pairs[1] ? 1 : 2;
            const int k = t - (i > 0 ? pairs[0] : 0) - (i > 1 ? pairs[1] : 0);
            float* x = i == 0 ? h.seg[0] : i == 1 ? h.seg[1] : h.seg[2];
            const int n = i == 0 ? h.n[0] : i == 1 ? h.n[1] : h.n[2];
            const int j = (k / span) * 2 * span + k % span;
            const float p = x[j], q = x[j + span];
            if (2 * span == n) {
                const float s = 1.0f / sqrtf((float)n);
                x[j] = (p + q) * s;
                x[j + span] = (p - q) * s;
            } else {
                x[j] = p + q;
                x[j + span] = p - q;
            }
        }
        __syncthreads();
    }
}

// One segment (hadamard_smem).
__device__ __forceinline__ void hadamard_smem(float* x, int n_vals, int n) {
    hadamard_smem(HadSegs{{x, nullptr, nullptr}, {n_vals, 0, 0}, {n, 0, 0}});
}
