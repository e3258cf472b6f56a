// Decode attention in one launch (one token, head_dim 64, 128 or 256, at
// most ATTN_MAX_G query heads per kv head): the q/k/v post-processing of
// qkv_post (bias, q/k RMSNorm, RoPE, KV append), split-K attention over
// spans of ATTN_SPLIT positions, and the merge of the spans with the q8
// quantization of the output, which attn_split + attn_combine do in two.
//
// Block (g, s): kv head g and its query heads, positions
// [start, start + len) of span s (spans past the attended range exit).
// The kernel is built around the latency of a decode step, not its bytes:
//   - before waiting for the previous kernel (PDL), each block loads its
//     span of the cache into registers, computes the rotation table and
//     copies the q/k norm weights to shared memory:
//     the position and the cached rows before it were written before this
//     step's earlier kernels, so they do not depend on the kernel just
//     before (see PDL_PROLOGUE in common.cuh);
//   - the new key and value are appended by the block of the last span,
//     which uses them from shared memory instead of reading them back;
//   - the last block of kv head g to finish (ticket on count[g], re-armed
//     for the next step) merges the spans: no second launch. A single span
//     is written out at once.
// Logits follow attn_split exactly (scale, soft-cap, max-subtracted exp,
// f16 cache values); the sums run in a different order.

// Threads per block: 4 * HD (at least ATTN_THREADS), so that the outputs of
// four query heads are computed at once (p . v and the merge: one thread per
// head and value). With 256 threads, head_dim 256 ran its heads one after
// the other: 13-15 us per layer against 8 us with 1024 (gemma3 1B and 270M,
// H200).
#define DECODE_THREADS(HD) ((HD) * 4 > ATTN_THREADS ? (HD) * 4 : ATTN_THREADS)

// Cache layout per block: chunk c = tid + i * NT of the span's
// [ATTN_SPLIT][HD] keys (8 values, 16 bytes) is position c / CPP, values
// (c % CPP) * 8 ..; NT is a multiple of CPP, so a thread keeps one value
// slice for its CH positions.
template <int HD>
struct DecodeShape {
    static constexpr int NT = DECODE_THREADS(HD);     // threads per block
    static constexpr int CPP = HD / 8;                // chunks per position
    static constexpr int CH = ATTN_SPLIT * CPP / NT;  // chunks per thread
    static constexpr int PSTEP = NT / CPP;            // positions between them
    static_assert(CH * NT == ATTN_SPLIT * CPP, "whole chunks per thread");
};

__device__ __forceinline__ uint4 pack8_f16(const float* x) {
    u32 w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = (u32)f32_to_f16_sat(x[2 * e]) | ((u32)f32_to_f16_sat(x[2 * e + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Dot product of 8 f16 values with 8 f32 values in shared memory.
__device__ __forceinline__ float dot8_f16(const uint4 k, const float* q) {
    const float4 qa = *(const float4*)q, qb = *(const float4*)(q + 4);
    const u32 kw[4] = {k.x, k.y, k.z, k.w};
    float kf[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        kf[2 * e] = f16_to_f32((u16)(kw[e] & 0xFFFFu));
        kf[2 * e + 1] = f16_to_f32((u16)(kw[e] >> 16));
    }
    return qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6]
           + qb.w * kf[7];
}

// Writes one output value of head h (row offset `row` in the [n_head * HD]
// output) and, when the output is quantized, the q8 chunk a warp holds.
__device__ __forceinline__ void decode_out(const AttnArgs& a, size_t row, float v) {
    a.out[row] = v;
    if (a.oq) quantize_chunk_warp(v, a.oq + (row & ~(size_t)31), a.ods + row / 32);
}

template <int HD>
__device__ __forceinline__ void attn_decode_impl(const AttnQkvArgs& args) {
    typedef DecodeShape<HD> S;
    extern __shared__ float smem[];
    const AttnArgs& a = args.at;
    const QkvArgs& k = args.qk;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = blockIdx.x, s = blockIdx.y;
    const int G = a.n_head / a.n_kv, h0 = g * G, kv_dim = a.n_kv * HD;
    float* sq = smem;                        // [G][HD] query heads
    float* sp = sq + ATTN_MAX_G * HD;        // [G][ATTN_SPLIT] logits, then weights
    float* skv = sp + ATTN_MAX_G * ATTN_SPLIT;  // new k at [0, HD), v at [HD, 2 HD)
    float* srot = skv + 2 * HD;              // cos at [0, n_rot / 2), sin after
    float2* sml = (float2*)(srot + HD);      // [G] (max, sum) of the span
    float* snw = (float*)(sml + ATTN_MAX_G);  // q norm weights at [0, HD), k's after
    u16* sv = (u16*)(snw + 2 * HD);          // [ATTN_SPLIT][HD] values

    // ---- Independent of the previous kernel (before pdl_wait).
    const int pos = *a.pos0;
    const int n_active = attn_spans(a, pos);
    if (s >= n_active) return;
    const int start = attn_first(a, pos) + s * ATTN_SPLIT;
    const int len = min(ATTN_SPLIT, pos + 1 - start);
    const bool append = s == n_active - 1;  // the span holding pos
    const int dc = tid % S::CPP, j0 = tid / S::CPP;
    uint4 kr[S::CH], vr[S::CH];
#pragma unroll
    for (int i = 0; i < S::CH; ++i) {
        const int j = j0 + i * S::PSTEP;
        const size_t at = (size_t)(start + j) * kv_dim + (size_t)g * HD + dc * 8;
        const bool cached = j < len && start + j < pos;
        kr[i] = cached ? *(const uint4*)(a.kc + at) : make_uint4(0, 0, 0, 0);
        vr[i] = cached ? *(const uint4*)(a.vc + at) : make_uint4(0, 0, 0, 0);
    }
    rope_table(k, pos, srot);
    // The norm weights, into shared memory: one global round trip fewer
    // after the wait (qkv_stage reads them through these pointers).
    QkvArgs ks = k;
    for (int d = tid; d < HD; d += blockDim.x) {
        if (k.qn_w) snw[d] = k.qn_w[d];
        if (k.kn_w) snw[HD + d] = k.kn_w[d];
    }
    ks.qn_w = k.qn_w ? snw : nullptr;
    ks.kn_w = k.kn_w ? snw + HD : nullptr;
    PDL_PROLOGUE;

    // ---- q (and on the last span the new k, v) with bias, norm, RoPE;
    // the span's values into shared memory while their loads are in flight.
    qkv_stage(ks, h0, G, g, append, HD, sq, skv, srot, [&] {
#pragma unroll
        for (int i = 0; i < S::CH; ++i) *(uint4*)(sv + (j0 + i * S::PSTEP) * HD + dc * 8) = vr[i];
    });
    if (append) {
        const size_t base = (size_t)pos * kv_dim + (size_t)g * HD;
        const int jn = pos - start;
        for (int d = tid; d < HD; d += blockDim.x) {
            const u16 kh = f32_to_f16_sat(skv[d]), vh = f32_to_f16_sat(skv[HD + d]);
            k.kc[base + d] = kh;
            k.vc[base + d] = vh;
            sv[jn * HD + d] = vh;
        }
#pragma unroll
        for (int i = 0; i < S::CH; ++i)
            if (j0 + i * S::PSTEP == jn) kr[i] = pack8_f16(skv + dc * 8);
    }

    // ---- q . k: each thread's slice, summed over the CPP lanes of a position.
    float dots[S::CH][ATTN_MAX_G];
#pragma unroll
    for (int i = 0; i < S::CH; ++i)
#pragma unroll
        for (int hh = 0; hh < ATTN_MAX_G; ++hh)
            dots[i][hh] = hh < G ? dot8_f16(kr[i], sq + hh * HD + dc * 8) : 0.0f;
#pragma unroll
    for (int o = S::CPP / 2; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < S::CH; ++i)
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh)
                if (hh < G) dots[i][hh] += __shfl_xor_sync(FULL_MASK, dots[i][hh], o);
    if (dc == 0) {
#pragma unroll
        for (int i = 0; i < S::CH; ++i) {
            const int j = j0 + i * S::PSTEP;
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
                if (hh < G && j < len) {
                    float l = dots[i][hh] * a.scale;
                    if (a.softcap > 0.0f) l = a.softcap * tanhf(l * (1.0f / a.softcap));
                    sp[hh * ATTN_SPLIT + j] = l;
                }
            }
        }
    }
    __syncthreads();

    // ---- Softmax over the span: one warp per head, one position per lane.
    if (warp < G) {
        const float l = lane < len ? sp[warp * ATTN_SPLIT + lane] : NEG_INF;
        const float m = warp_max(l);
        const float e = lane < len ? expf(l - m) : 0.0f;
        sp[warp * ATTN_SPLIT + lane] = e;
        const float sum = warp_sum(e);
        if (lane == 0) sml[warp] = make_float2(m, sum);
    }
    __syncthreads();

    // ---- p . v: thread (head hh, value d), over the span's positions.
    constexpr int HSTEP = S::NT / HD;  // heads in flight
    const int d = tid % HD;
    const size_t ml0 = (size_t)h0 * a.n_split + s;  // part_ml index of (h0, s)
    for (int hh = tid / HD; hh < G; hh += HSTEP) {
        const float* p = sp + hh * ATTN_SPLIT;
        float acc = 0.0f;
#pragma unroll 8
        for (int j = 0; j < len; ++j) acc += p[j] * f16_to_f32(sv[j * HD + d]);
        if (n_active == 1) {
            decode_out(a, (size_t)(h0 + hh) * HD + d, acc / sml[hh].y);
        } else {
            const size_t ml = ml0 + (size_t)hh * a.n_split;
            a.part_o[ml * HD + d] = acc;
            if (d == 0) a.part_ml[ml] = sml[hh];
        }
    }
    if (n_active == 1) return;

    // ---- The last block of kv head g merges the spans.
    __shared__ int s_last;
    if (!last_block(args.count + g, n_active, s_last)) return;
    // In batches of MERGE_BATCH spans, every load of a batch issued before
    // the first use (one L2 round trip per batch); a batch rescales the sums
    // of the ones before it. With one batch the sums are those of a plain
    // two-pass merge (max, then sum of e^(m_t - m) terms), in span order.
    constexpr int MERGE_BATCH = 8;
    for (int hh = tid / HD; hh < G; hh += HSTEP) {
        const size_t ml = (size_t)(h0 + hh) * a.n_split;
        float m = NEG_INF, total = 0.0f, acc = 0.0f;
        for (int t0 = 0; t0 < n_active; t0 += MERGE_BATCH) {
            float2 st[MERGE_BATCH];
            float o[MERGE_BATCH];
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                const bool in = t0 + u < n_active;
                st[u] = in ? __ldcg(&a.part_ml[ml + t0 + u]) : make_float2(NEG_INF, 0.0f);
                o[u] = in ? __ldcg(&a.part_o[(ml + t0 + u) * HD + d]) : 0.0f;
            }
            float mb = m;
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) mb = fmaxf(mb, st[u].x);
            // Every span holds a position: its max logit is finite, and
            // e^(-inf) = 0 clears the zero sums of the first batch.
            const float r = expf(m - mb);
            total *= r;
            acc *= r;
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                if (t0 + u < n_active) {
                    const float w = expf(st[u].x - mb);
                    total += w * st[u].y;
                    acc += w * o[u];
                }
            }
            m = mb;
        }
        decode_out(a, (size_t)(h0 + hh) * HD + d, acc / total);
    }
}

// The arguments of token t = blockIdx.z of a batch of one-token steps of
// different sequences (attn_decode_batch_hd*): its rows of q/k/v, of the
// output and of the partial sums, its position pos0[t], its slot's caches
// and its own tickets.
template <int HD>
__device__ __forceinline__ AttnQkvArgs batch_token(const AttnQkvArgs& in) {
    AttnQkvArgs b = in;
    const int t = blockIdx.z;
    const size_t qd = (size_t)in.at.n_head * HD, kvd = (size_t)in.at.n_kv * HD;
    const size_t parts = (size_t)t * in.at.n_head * in.at.n_split;
    const long long off = (long long)in.slot[t] * in.slot_stride;
    b.at.q += t * qd;
    b.qk.q += t * qd;
    b.qk.k += t * kvd;
    b.qk.v += t * kvd;
    b.at.out += t * qd;
    if (in.at.oq) {
        b.at.oq += t * qd;
        b.at.ods += t * qd / 32;
    }
    b.at.part_o += parts * HD;
    b.at.part_ml += parts;
    b.at.pos0 += t;
    b.qk.pos0 += t;
    b.at.kc += off;
    b.at.vc += off;
    b.qk.kc += off;
    b.qk.vc += off;
    b.count += (size_t)t * in.at.n_kv;
    return b;
}

// attn_decode_hd*: one token; attn_decode_batch_hd*: grid z over the tokens
// of a batch, each of its own sequence (a slot of the KV pool).
#define ATTN_DECODE(HD)                                                                    \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS(HD))                       \
        attn_decode_hd##HD(const AttnQkvArgs args) {                                       \
        attn_decode_impl<HD>(args);                                                        \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS(HD))                       \
        attn_decode_batch_hd##HD(const AttnQkvArgs args) {                                 \
        const AttnQkvArgs b = batch_token<HD>(args);                                       \
        attn_decode_impl<HD>(b);                                                           \
    }

ATTN_DECODE(64)
ATTN_DECODE(128)
ATTN_DECODE(256)
