// Decoding of one 32-value chunk of a GGUF row, for every quantized
// weight type. Written from the block layouts documented in
// `crate::quant::*` (the scalar code there is the specification).
//
// A decoded chunk is 32 small integers packed four per int (value k of the
// chunk in byte k % 4 of q[k / 4]) plus, per half (values 0..15 and
// 16..31), a scale d[h] and an offset m[h]:  value_k = d[h] * q_k + m[h].
// The same decoded form serves the integer dot product against a q8
// activation chunk and plain dequantization.
//
// Chunk c of a row: for the 32-value formats it is block c; for the
// 256-value k-quants it is chunk c % 8 of super-block c / 8.

struct WChunk {
    int q[8];
    float d[2];
    float m[2];
};

// Spreads the 4 low bits of x to bit 0 of each of 4 bytes.
__device__ __forceinline__ int spread4(u32 x) {
    return (int)((x & 1u) | ((x & 2u) << 7) | ((x & 4u) << 14) | ((x & 8u) << 21));
}

__device__ __forceinline__ void set_scale(WChunk& w, float d, float m) {
    w.d[0] = d; w.d[1] = d; w.m[0] = m; w.m[1] = m;
}

struct TQ4_0 {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ4_0* b = (const BlockQ4_0*)row + c;
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld_i32_a2(b->qs + 4 * i);
            w.q[i] = v & 0x0F0F0F0F;
            w.q[4 + i] = (v >> 4) & 0x0F0F0F0F;
        }
        const float d = f16_to_f32(b->d);
        set_scale(w, d, -8.0f * d);
        return w;
    }
};

struct TQ4_1 {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ4_1* b = (const BlockQ4_1*)row + c;
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld_i32_a4(b->qs + 4 * i);
            w.q[i] = v & 0x0F0F0F0F;
            w.q[4 + i] = (v >> 4) & 0x0F0F0F0F;
        }
        set_scale(w, f16_to_f32(b->d), f16_to_f32(b->m));
        return w;
    }
};

struct TQ5_0 {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ5_0* b = (const BlockQ5_0*)row + c;
        const u32 qh = (u32)ld_i32_a2(b->qh);
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld_i32_a2(b->qs + 4 * i);
            w.q[i] = (v & 0x0F0F0F0F) | (spread4(qh >> (4 * i)) << 4);
            w.q[4 + i] = ((v >> 4) & 0x0F0F0F0F) | (spread4(qh >> (16 + 4 * i)) << 4);
        }
        const float d = f16_to_f32(b->d);
        set_scale(w, d, -16.0f * d);
        return w;
    }
};

struct TQ5_1 {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ5_1* b = (const BlockQ5_1*)row + c;
        const u32 qh = (u32)ld_i32_a4(b->qh);
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld_i32_a4(b->qs + 4 * i);
            w.q[i] = (v & 0x0F0F0F0F) | (spread4(qh >> (4 * i)) << 4);
            w.q[4 + i] = ((v >> 4) & 0x0F0F0F0F) | (spread4(qh >> (16 + 4 * i)) << 4);
        }
        set_scale(w, f16_to_f32(b->d), f16_to_f32(b->m));
        return w;
    }
};

struct TQ8_0 {
    static constexpr bool SPLIT = false, HAS_MIN = false;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ8_0* b = (const BlockQ8_0*)row + c;
        WChunk w;
#pragma unroll
        for (int i = 0; i < 8; ++i) w.q[i] = ld_i32_a2((const u8*)b->qs + 4 * i);
        set_scale(w, f16_to_f32(b->d), 0.0f);
        return w;
    }
};

// IQ4_NL's 16 levels, four per word (little-endian bytes).
#define IQ4NL_T0 0xBFAD9881u  // -127 -104  -83  -65
#define IQ4NL_T1 0xF6EADDCFu  //  -49  -35  -22  -10
#define IQ4NL_T2 0x26190D01u  //    1   13   25   38
#define IQ4NL_T3 0x71594535u  //   53   69   89  113

// Maps four 4-bit indices (one per byte) to their IQ4_NL levels.
__device__ __forceinline__ int iq4nl_lookup(u32 idx) {
    const u32 lo3 = idx & 0x07070707u;
    const u32 sel = (lo3 & 0x7u) | ((lo3 >> 4) & 0x70u) | ((lo3 >> 8) & 0x700u) | ((lo3 >> 12) & 0x7000u);
    const u32 from_lo = __byte_perm(IQ4NL_T0, IQ4NL_T1, sel);
    const u32 from_hi = __byte_perm(IQ4NL_T2, IQ4NL_T3, sel);
    const u32 b3 = (idx >> 3) & 0x01010101u;
    const u32 pick = 0x3210u | ((b3 & 1u) << 2) | (((b3 >> 8) & 1u) << 6) | (((b3 >> 16) & 1u) << 10)
                     | (((b3 >> 24) & 1u) << 14);
    return (int)__byte_perm(from_lo, from_hi, pick);
}

struct TIQ4_NL {
    static constexpr bool SPLIT = false, HAS_MIN = false;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockIQ4NL* b = (const BlockIQ4NL*)row + c;
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 v = (u32)ld_i32_a2(b->qs + 4 * i);
            w.q[i] = iq4nl_lookup(v & 0x0F0F0F0Fu);
            w.q[4 + i] = iq4nl_lookup((v >> 4) & 0x0F0F0F0Fu);
        }
        set_scale(w, f16_to_f32(b->d), 0.0f);
        return w;
    }
};

struct TQ2_K {
    static constexpr bool SPLIT = true, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ2K* b = (const BlockQ2K*)row + c / 8;
        const int j = c % 8, h = j / 4, s = j % 4;
        WChunk w;
#pragma unroll
        for (int i = 0; i < 8; ++i) w.q[i] = (ld_i32_a4(b->qs + 32 * h + 4 * i) >> (2 * s)) & 0x03030303;
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int sc = b->scales[2 * j + k];
            w.d[k] = d * (float)(sc & 0xF);
            w.m[k] = -(dmin * (float)(sc >> 4));
        }
        return w;
    }
};

struct TQ3_K {
    static constexpr bool SPLIT = true, HAS_MIN = false;
    static __device__ __forceinline__ int group_scale(const u8* sc, int g) {
        const int low = g < 8 ? (sc[g] & 0xF) : (sc[g - 8] >> 4);
        const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        return (low | (high << 4)) - 32;
    }
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ3K* b = (const BlockQ3K*)row + c / 8;
        const int j = c % 8, h = j / 4, s = j % 4;
        WChunk w;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int lo = (ld_i32_a2(b->qs + 32 * h + 4 * i) >> (2 * s)) & 0x03030303;
            const int hm = (ld_i32_a2(b->hmask + 4 * i) >> j) & 0x01010101;
            w.q[i] = (int)__vsub4((u32)(lo | (hm << 2)), 0x04040404u);
        }
        const float d = f16_to_f32(b->d);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            w.d[k] = d * (float)group_scale(b->scales, 2 * j + k);
            w.m[k] = 0.0f;
        }
        return w;
    }
};

// Q4_K / Q5_K 6-bit scale and min of group j (0..8).
__device__ __forceinline__ void scale_min_k4(const u8* q, int j, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

struct TQ4_K {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ4K* b = (const BlockQ4K*)row + c / 8;
        const int j = c % 8;
        const int4* p = (const int4*)(b->qs + 32 * (j / 2));
        const int4 v0 = p[0], v1 = p[1];
        const int sh = 4 * (j % 2);
        WChunk w;
        w.q[0] = (v0.x >> sh) & 0x0F0F0F0F; w.q[1] = (v0.y >> sh) & 0x0F0F0F0F;
        w.q[2] = (v0.z >> sh) & 0x0F0F0F0F; w.q[3] = (v0.w >> sh) & 0x0F0F0F0F;
        w.q[4] = (v1.x >> sh) & 0x0F0F0F0F; w.q[5] = (v1.y >> sh) & 0x0F0F0F0F;
        w.q[6] = (v1.z >> sh) & 0x0F0F0F0F; w.q[7] = (v1.w >> sh) & 0x0F0F0F0F;
        int sc, m;
        scale_min_k4(b->scales, j, sc, m);
        set_scale(w, f16_to_f32(b->d) * (float)sc, -(f16_to_f32(b->dmin) * (float)m));
        return w;
    }
};

struct TQ5_K {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ5K* b = (const BlockQ5K*)row + c / 8;
        const int j = c % 8;
        const int4* p = (const int4*)(b->qs + 32 * (j / 2));
        const int4* ph = (const int4*)b->qh;
        const int4 v0 = p[0], v1 = p[1], h0 = ph[0], h1 = ph[1];
        const int v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const int hh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const int sh = 4 * (j % 2);
        WChunk w;
#pragma unroll
        for (int i = 0; i < 8; ++i) w.q[i] = ((v[i] >> sh) & 0x0F0F0F0F) | (((hh[i] >> j) & 0x01010101) << 4);
        int sc, m;
        scale_min_k4(b->scales, j, sc, m);
        set_scale(w, f16_to_f32(b->d) * (float)sc, -(f16_to_f32(b->dmin) * (float)m));
        return w;
    }
};

struct TQ6_K {
    static constexpr bool SPLIT = true, HAS_MIN = false;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int) {
        const BlockQ6K* b = (const BlockQ6K*)row + c / 8;
        const int j = c % 8, h = j / 4, s = j % 4;
        const u8* ql = b->ql + 64 * h + 32 * (s % 2);
        const u8* qh = b->qh + 32 * h;
        const int shl = 4 * (s / 2);
        WChunk w;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int lo = (ld_i32_a2(ql + 4 * i) >> shl) & 0x0F0F0F0F;
            const int hi = (ld_i32_a2(qh + 4 * i) >> (2 * s)) & 0x03030303;
            w.q[i] = (int)__vsub4((u32)(lo | (hi << 4)), 0x20202020u);
        }
        const float d = f16_to_f32(b->d);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            w.d[k] = d * (float)b->scales[2 * j + k];
            w.m[k] = 0.0f;
        }
        return w;
    }
};

// Repacked rows (built by `cuda::repack` when a model is prepared): the
// quant bytes of every block first, contiguous, so that a chunk's quants
// are one or two aligned 16-byte loads; then the per-block fields
// (high bits, scales) as arrays. `nc` is the row's chunk count. Row strides
// are padded to 16 bytes.
struct TQ8_0R {
    static constexpr bool SPLIT = false, HAS_MIN = false;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int nc) {
        const int4* p = (const int4*)(row + 32 * c);
        const int4 a = p[0], b = p[1];
        WChunk w;
        w.q[0] = a.x; w.q[1] = a.y; w.q[2] = a.z; w.q[3] = a.w;
        w.q[4] = b.x; w.q[5] = b.y; w.q[6] = b.z; w.q[7] = b.w;
        set_scale(w, f16_to_f32(((const u16*)(row + 32 * nc))[c]), 0.0f);
        return w;
    }
};

struct TQ4_0R {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int nc) {
        const int4 v = *(const int4*)(row + 16 * c);
        const int vv[4] = {v.x, v.y, v.z, v.w};
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w.q[i] = vv[i] & 0x0F0F0F0F;
            w.q[4 + i] = (vv[i] >> 4) & 0x0F0F0F0F;
        }
        const float d = f16_to_f32(((const u16*)(row + 16 * nc))[c]);
        set_scale(w, d, -8.0f * d);
        return w;
    }
};

struct TQ5_0R {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int nc) {
        const int4 v = *(const int4*)(row + 16 * c);
        const u32 qh = ((const u32*)(row + 16 * nc))[c];
        const int vv[4] = {v.x, v.y, v.z, v.w};
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w.q[i] = (vv[i] & 0x0F0F0F0F) | (spread4(qh >> (4 * i)) << 4);
            w.q[4 + i] = ((vv[i] >> 4) & 0x0F0F0F0F) | (spread4(qh >> (16 + 4 * i)) << 4);
        }
        const float d = f16_to_f32(((const u16*)(row + 20 * nc))[c]);
        set_scale(w, d, -16.0f * d);
        return w;
    }
};

// Q4_K: chunk c's 32 4-bit values as 16 bytes (byte l = value l | value
// l + 16 << 4, the Q4_0 order), all chunks first; then per super-block
// its 16 header bytes (d, dmin, the 12 packed 6-bit scales and mins), so a
// chunk is one 16-byte load of quants and one (shared by the 8 chunks of a
// super-block) of its header.
struct TQ4_KR {
    static constexpr bool SPLIT = false, HAS_MIN = true;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int nc) {
        const int4 v = *(const int4*)(row + 16 * c);
        const int4 h = *(const int4*)(row + 16 * nc + 16 * (c / 8));
        const int vv[4] = {v.x, v.y, v.z, v.w};
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w.q[i] = vv[i] & 0x0F0F0F0F;
            w.q[4 + i] = (vv[i] >> 4) & 0x0F0F0F0F;
        }
        // scale_min_k4 on the scale bytes held in h.y (0..3), h.z (4..7), h.w (8..11).
        const int j = c % 8, sh = 8 * (j % 4);
        const int by = (h.y >> sh) & 0xFF, bz = (h.z >> sh) & 0xFF, bw = (h.w >> sh) & 0xFF;
        const int sc = j < 4 ? by & 63 : (bw & 0xF) | ((by >> 6) << 4);
        const int m = j < 4 ? bz & 63 : (bw >> 4) | ((bz >> 6) << 4);
        const float d = f16_to_f32((u16)(h.x & 0xFFFF)), dmin = f16_to_f32((u16)((u32)h.x >> 16));
        set_scale(w, d * (float)sc, -(dmin * (float)m));
        return w;
    }
};

// Q6_K: per chunk c, its 32 low nibbles as 16 bytes (the Q4_0 order) at
// 16c; its high 2-bit pairs as 8 bytes at 16 nc + 8c (bits 2i..2i+1 of
// byte 4h + k hold value 16h + 4i + k); its two int8 scales at 24 nc + 2c;
// then the row's d values, one per super-block, at 26 nc.
struct TQ6_KR {
    static constexpr bool SPLIT = true, HAS_MIN = false;
    static __device__ __forceinline__ WChunk load(const u8* row, int c, int nc) {
        const int4 v = *(const int4*)(row + 16 * c);
        const int2 hb = *(const int2*)(row + 16 * nc + 8 * c);
        const u32 sc = *(const u16*)(row + 24 * nc + 2 * c);
        const float d = f16_to_f32(((const u16*)(row + 26 * nc))[c / 8]);
        const int vv[4] = {v.x, v.y, v.z, v.w};
        WChunk w;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int lo0 = (vv[i] & 0x0F0F0F0F) | (((hb.x >> (2 * i)) & 0x03030303) << 4);
            const int lo1 = ((vv[i] >> 4) & 0x0F0F0F0F) | (((hb.y >> (2 * i)) & 0x03030303) << 4);
            w.q[i] = (int)__vsub4((u32)lo0, 0x20202020u);
            w.q[4 + i] = (int)__vsub4((u32)lo1, 0x20202020u);
        }
        w.d[0] = d * (float)(i8)(sc & 0xFF);
        w.d[1] = d * (float)(i8)(sc >> 8);
        w.m[0] = 0.0f;
        w.m[1] = 0.0f;
        return w;
    }
};

// Dot product of a decoded weight chunk with a q8 activation chunk
// (quants a0 = values 0..15, a1 = values 16..31; ds = (d, d * sum)).
template <class T>
__device__ __forceinline__ float dot_chunk(const WChunk& w, const int4 a0, const int4 a1, const float2 ds) {
    const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    if (!T::SPLIT) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) s = __dp4a(w.q[i], a[i], s);
        float r = w.d[0] * ds.x * (float)s;
        if (T::HAS_MIN) r += w.m[0] * ds.y;
        return r;
    } else {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s0 = __dp4a(w.q[i], a[i], s0);
            s1 = __dp4a(w.q[4 + i], a[4 + i], s1);
        }
        float r = ds.x * (w.d[0] * (float)s0 + w.d[1] * (float)s1);
        if (T::HAS_MIN) {
            int u0 = 0, u1 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                u0 = __dp4a(0x01010101, a[i], u0);
                u1 = __dp4a(0x01010101, a[4 + i], u1);
            }
            r += ds.x * (w.m[0] * (float)u0 + w.m[1] * (float)u1);
        }
        return r;
    }
}

// Value k (0..32) of a decoded chunk as float.
__device__ __forceinline__ float chunk_value(const WChunk& w, int k) {
    const int b = (w.q[k / 4] >> (8 * (k % 4))) & 0xFF;
    const int q = (int)(i8)b;
    const int h = k / 16;
    return w.d[h] * (float)q + w.m[h];
}

// Decodes chunk c of a row of any quantized type (run-time dispatch; used
// off the hot path: embedding lookup, dequantization).
__device__ __forceinline__ bool load_chunk_any(int ty, const u8* row, int c, WChunk& w) {
    switch (ty) {
        case TY_Q4_0: w = TQ4_0::load(row, c, 0); return true;
        case TY_Q4_1: w = TQ4_1::load(row, c, 0); return true;
        case TY_Q5_0: w = TQ5_0::load(row, c, 0); return true;
        case TY_Q5_1: w = TQ5_1::load(row, c, 0); return true;
        case TY_Q8_0: w = TQ8_0::load(row, c, 0); return true;
        case TY_IQ4_NL: w = TIQ4_NL::load(row, c, 0); return true;
        case TY_Q2_K: w = TQ2_K::load(row, c, 0); return true;
        case TY_Q3_K: w = TQ3_K::load(row, c, 0); return true;
        case TY_Q4_K: w = TQ4_K::load(row, c, 0); return true;
        case TY_Q5_K: w = TQ5_K::load(row, c, 0); return true;
        case TY_Q6_K: w = TQ6_K::load(row, c, 0); return true;
        default: return false;
    }
}
