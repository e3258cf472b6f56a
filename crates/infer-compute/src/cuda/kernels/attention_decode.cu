// Decode attention in one launch (one token, head_dim 64, 128 or 256, at
// most ATTN_MAX_G query heads per kv head): the q/k/v post-processing of
// qkv_post (bias, q/k RMSNorm, RoPE, KV append), split-K attention over
// spans of ATTN_SPLIT positions, and the merge of the spans with the q8
// quantization of the output, which attn_split + attn_combine do in two.
//
// Block (g, s): kv head g and its query heads, spans [s0, s1) of the
// attended range (decode_spans: one span a block near the start of the
// cache, several streamed through the online softmax deeper; blocks past
// the attended range exit). Near the start the kernel is built around the
// latency of a decode step, deep in the cache around its bytes:
//   - before waiting for the previous kernel (PDL), each block loads its
//     first span of the cache into registers (each later one while the
//     one before is finished), computes the rotation table and copies the
//     q/k norm weights to shared memory:
//     the position and the cached rows before it were written before this
//     step's earlier kernels, so they do not depend on the kernel just
//     before (see PDL_PROLOGUE in common.cuh);
//   - the new key and value are appended by the block of the last span,
//     which uses them from shared memory instead of reading them back;
//   - the last block of kv head g to finish (ticket on count[g], re-armed
//     for the next step) merges the blocks' partial results: no second
//     launch. A single block's result is written out at once.
// Logits follow attn_split exactly (scale, soft-cap, max-subtracted exp,
// the cache's values; those of the value cache rounded to f16 in shared
// memory, which only a quantized cache's are not already); the sums run
// in a different order.

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

// Writes one output value of head h (row offset `row` in the [n_head * HD]
// output) and, when the output is quantized, the q8 chunk a warp holds.
__device__ __forceinline__ void decode_out(const AttnArgs& a, size_t row, float v) {
    a.out[row] = v;
    if (a.oq) quantize_chunk_warp(v, a.oq + (row & ~(size_t)31), a.ods + row / 32);
}

// The outputs of query heads h0 .. h0 + G, staged in so ([G][HD], shared),
// rotated back by V's rotation and written (attn_unrotate's work, done by
// the block that has them). Every thread of the block calls it.
template <int HD>
__device__ __forceinline__ void unrotate_out(const AttnArgs& a, int h0, int G, int v_rot, float* so) {
    __syncthreads();
    hadamard_smem(so, G * HD, v_rot);
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) decode_out(a, (size_t)h0 * HD + i, so[i]);
}

// One thread's raw chunks (kv_load8) of a span's keys and values (see
// DecodeShape), zero past the span's positions and at the token's own
// position (which is not in the cache yet).
template <int HD>
struct SpanChunks {
    uint4 k[DecodeShape<HD>::CH], v[DecodeShape<HD>::CH];
};

template <int HD>
__device__ __forceinline__ void load_span(const AttnArgs& a, int kt, int vt, int g, int start, int len, int pos,
                                          SpanChunks<HD>& c) {
    typedef DecodeShape<HD> S;
    const int kv_dim = a.n_kv * HD, dc = threadIdx.x % S::CPP, j0 = threadIdx.x / S::CPP;
#pragma unroll
    for (int i = 0; i < S::CH; ++i) {
        const int j = j0 + i * S::PSTEP;
        const int col = g * HD + dc * 8;
        const bool cached = j < len && start + j < pos;
        c.k[i] = cached ? kv_load8(a.kc + (size_t)(start + j) * a.k_row, kt, kv_dim, col) : make_uint4(0, 0, 0, 0);
        c.v[i] = cached ? kv_load8(a.vc + (size_t)(start + j) * a.v_row, vt, kv_dim, col) : make_uint4(0, 0, 0, 0);
    }
}

template <int HD>
__device__ __forceinline__ void store_values(const SpanChunks<HD>& c, int vt, u16* sv) {
    typedef DecodeShape<HD> S;
    const int dc = threadIdx.x % S::CPP, j0 = threadIdx.x / S::CPP;
#pragma unroll
    for (int i = 0; i < S::CH; ++i) *(uint4*)(sv + (j0 + i * S::PSTEP) * HD + dc * 8) = kv_f16x8(c.v[i], vt);
}

// The spans of the attended range that block s (of gridDim.y per kv head)
// takes: [s0, s1), `per` of them. Near the start of the cache every span
// has a block of its own (per = 1); deeper, each block streams `per`
// spans through the online softmax, so that the grid fills the GPU once
// and the merge reads at most gridDim.y partial results (FlashDecoding's
// split, Dao et al. 2023), instead of one block per span and a merge of
// every span by one block.
struct DecodeSpans {
    int n_active;  // spans holding attended positions
    int n_parts;   // blocks with spans: the partial results to merge
    int s0, s1;
};

__device__ __forceinline__ DecodeSpans decode_spans(const AttnArgs& a, int pos, int s) {
    DecodeSpans r;
    r.n_active = attn_spans(a, pos);
    const int per = (r.n_active + (int)gridDim.y - 1) / (int)gridDim.y;
    r.n_parts = (r.n_active + per - 1) / per;
    r.s0 = s * per;
    r.s1 = min(r.n_active, r.s0 + per);
    return r;
}

// The end of a decode block: thread (head tid / HD + i · NT / HD, value
// tid % HD) holds acc[i], its head's unnormalized output over the block's
// spans, and sml[hh] the head's (max, sum); writes the output when the
// block is alone, else its partial result, and the last block of kv head g
// to finish (ticket on count[g], re-armed for the next step) merges them
// all. sq ([G][HD], free by now) stages a rotated output. Every thread of
// the block calls it after a barrier that made sml visible.
template <int HD, int NT>
__device__ __forceinline__ void decode_finish(const AttnQkvArgs& args, const DecodeSpans& ds, int g, int G, int v_rot,
                                              const float* acc, const float2* sml, float* sq) {
    const AttnArgs& a = args.at;
    const int tid = threadIdx.x, d = tid % HD, h0 = g * G;
    constexpr int HSTEP = NT / HD;
    constexpr int PV = ATTN_MAX_G / HSTEP;
    const size_t ml0 = (size_t)h0 * a.n_split + blockIdx.y;  // part_ml index of (h0, block)
    // Values stored rotated (v_rot): the outputs go through sq to be
    // rotated back before they are written.
#pragma unroll
    for (int i = 0; i < PV; ++i) {
        const int hh = tid / HD + i * HSTEP;
        if (hh >= G) continue;
        if (ds.n_parts == 1) {
            if (v_rot) sq[hh * HD + d] = acc[i] / sml[hh].y;
            else decode_out(a, (size_t)(h0 + hh) * HD + d, acc[i] / sml[hh].y);
        } else {
            const size_t ml = ml0 + (size_t)hh * a.n_split;
            a.part_o[ml * HD + d] = acc[i];
            if (d == 0) a.part_ml[ml] = sml[hh];
        }
    }
    if (ds.n_parts == 1) {
        if (v_rot) unrotate_out<HD>(a, h0, G, v_rot, sq);
        return;
    }

    // ---- The last block of kv head g merges the partial results.
    __shared__ int s_last;
    if (!last_block(args.count + g, ds.n_parts, s_last)) return;
    // In batches of MERGE_BATCH partials, every load of a batch issued
    // before the first use (one L2 round trip per batch); a batch rescales
    // the sums of the ones before it. With one batch the sums are those of
    // a plain two-pass merge (max, then sum of e^(m_t - m) terms), in order.
    constexpr int MERGE_BATCH = 8;
#pragma unroll
    for (int i = 0; i < PV; ++i) {
        const int hh = tid / HD + i * HSTEP;
        if (hh >= G) continue;
        const size_t ml = (size_t)(h0 + hh) * a.n_split;
        float m = NEG_INF, total = 0.0f, out = 0.0f;
        for (int t0 = 0; t0 < ds.n_parts; t0 += MERGE_BATCH) {
            float2 st[MERGE_BATCH];
            float o[MERGE_BATCH];
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                const bool in = t0 + u < ds.n_parts;
                st[u] = in ? __ldcg(&a.part_ml[ml + t0 + u]) : make_float2(NEG_INF, 0.0f);
                o[u] = in ? __ldcg(&a.part_o[(ml + t0 + u) * HD + d]) : 0.0f;
            }
            float mb = m;
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) mb = fmaxf(mb, st[u].x);
            // Every partial holds a position: its max logit is finite, and
            // e^(-inf) = 0 clears the zero sums of the first batch.
            const float r = expf(m - mb);
            total *= r;
            out *= r;
#pragma unroll
            for (int u = 0; u < MERGE_BATCH; ++u) {
                if (t0 + u < ds.n_parts) {
                    const float w = expf(st[u].x - mb);
                    total += w * st[u].y;
                    out += w * o[u];
                }
            }
            m = mb;
        }
        if (v_rot) sq[hh * HD + d] = out / total;
        else decode_out(a, (size_t)(h0 + hh) * HD + d, out / total);
    }
    if (v_rot) unrotate_out<HD>(a, h0, G, v_rot, sq);
}

// The q and k norm weights into shared memory snw ([2][HD]: q's, then
// k's), before the PDL wait: one global round trip fewer after it. Returns
// k with its norm pointers at them (qkv_stage reads through these).
template <int HD>
__device__ __forceinline__ QkvArgs norms_to_smem(const QkvArgs& k, float* snw) {
    QkvArgs ks = k;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        if (k.qn_w) snw[d] = k.qn_w[d];
        if (k.kn_w) snw[HD + d] = k.kn_w[d];
    }
    ks.qn_w = k.qn_w ? snw : nullptr;
    ks.kn_w = k.kn_w ? snw + HD : nullptr;
    return ks;
}

// The block whose range holds pos appends the new key and value (skv: k at
// [0, HD), v after). A quantized cache's new row (reread) is read back as
// stored, after the barrier, so that this step sees the values later
// steps will.
template <int HD>
__device__ __forceinline__ void decode_append(const QkvArgs& k, int pos, int kt, int vt, int kv_dim, int g,
                                              const float* skv, bool reread) {
    kv_store_head(k.kc + (size_t)pos * k.k_row, kt, kv_dim, g, skv, HD);
    kv_store_head(k.vc + (size_t)pos * k.v_row, vt, kv_dim, g, skv + HD, HD);
    if (reread) __syncthreads();
}

// The raw chunks (kv_load8) at column col = g · HD + dc · 8 of the new key
// and value at pos: as stored when reread, else skv's rounded to f16 (what
// the f16 cache holds).
template <int HD>
__device__ __forceinline__ void new_row_chunks(const AttnArgs& a, int pos, int kt, int vt, int kv_dim, int col, int dc,
                                               const float* skv, bool reread, uint4& k, uint4& v) {
    k = reread ? kv_load8(a.kc + (size_t)pos * a.k_row, kt, kv_dim, col) : pack8_f16(skv + dc * 8);
    v = reread ? kv_load8(a.vc + (size_t)pos * a.v_row, vt, kv_dim, col) : pack8_f16(skv + HD + dc * 8);
}

// QUANT: the cache types as args say (one of them quantized); otherwise
// both f16, known at compile time, so that the f16 kernels keep their
// registers (the type branches cost the hd64 kernel 19 more).
template <int HD, bool QUANT>
__device__ __forceinline__ void attn_decode_impl(const AttnQkvArgs& args) {
    typedef DecodeShape<HD> S;
    extern __shared__ float smem[];
    const AttnArgs& a = args.at;
    const QkvArgs& k = args.qk;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = blockIdx.x;
    const int G = a.n_head / a.n_kv, h0 = g * G, kv_dim = a.n_kv * HD;
    float* sq = smem;                           // [G][HD] query heads
    float* sp = sq + ATTN_MAX_G * HD;           // [G][ATTN_SPLIT] logits, then weights
    float* skv = sp + ATTN_MAX_G * ATTN_SPLIT;  // new k at [0, HD), v at [HD, 2 HD)
    float* srot = skv + 2 * HD;                 // cos at [0, n_rot / 2), sin after
    float2* sml = (float2*)(srot + HD);         // [G] (max, sum) of the block's spans
    float* sr = (float*)(sml + ATTN_MAX_G);     // [G] rescale of the sums before a span
    float* snw = sr + ATTN_MAX_G;               // q norm weights at [0, HD), k's after
    u16* sv = (u16*)(snw + 2 * HD);             // [ATTN_SPLIT][HD] values

    // ---- Independent of the previous kernel (before pdl_wait).
    const int pos = *a.pos0;
    const DecodeSpans ds = decode_spans(a, pos, blockIdx.y);
    if (ds.s0 >= ds.n_active) return;
    const int first = attn_first(a, pos);
    const bool append = ds.s1 == ds.n_active;  // holds the span of pos
    const int span_len0 = min(ATTN_SPLIT, pos + 1 - first - ds.s0 * ATTN_SPLIT);
    SpanChunks<HD> c;
    const int kt = QUANT ? a.kt : KV_F16, vt = QUANT ? a.vt : KV_F16;
    load_span<HD>(a, kt, vt, g, first + ds.s0 * ATTN_SPLIT, span_len0, pos, c);
    rope_table(k, pos, srot);
    const QkvArgs ks = norms_to_smem<HD>(k, snw);
    PDL_PROLOGUE;

    // ---- q (and in the block of the last span the new k, v) with bias,
    // norm, RoPE; the first span's values into shared memory while their
    // loads are in flight.
    qkv_stage(ks, h0, G, g, append, HD, sq, skv, srot, [&] { store_values<HD>(c, vt, sv); });
    const bool reread = QUANT;
    if (append) decode_append<HD>(k, pos, kt, vt, kv_dim, g, skv, reread);

    constexpr int HSTEP = S::NT / HD;            // heads in flight in p . v
    constexpr int PV = ATTN_MAX_G / HSTEP;       // heads per thread in p . v
    static_assert(PV * HSTEP == ATTN_MAX_G, "whole heads per thread");
    const int dc = tid % S::CPP, j0 = tid / S::CPP, d = tid % HD;
    float acc[PV];
#pragma unroll
    for (int i = 0; i < PV; ++i) acc[i] = 0.0f;
    float m_run = NEG_INF, sum_run = 0.0f;  // warp hh < G: head hh's so far
    for (int s = ds.s0; s < ds.s1; ++s) {
        const int start = first + s * ATTN_SPLIT;
        const int len = min(ATTN_SPLIT, pos + 1 - start);
        if (s == ds.n_active - 1) {
            // The new key and value at pos, from shared memory (the first
            // span's chunk is stored again by the thread that stored it).
            const int jn = pos - start;
#pragma unroll
            for (int i = 0; i < S::CH; ++i) {
                if (j0 + i * S::PSTEP == jn) {
                    new_row_chunks<HD>(a, pos, kt, vt, kv_dim, g * HD + dc * 8, dc, skv, reread, c.k[i], c.v[i]);
                    if (s == ds.s0) *(uint4*)(sv + jn * HD + dc * 8) = kv_f16x8(c.v[i], vt);
                }
            }
        }
        if (s > ds.s0) store_values<HD>(c, vt, sv);

        // ---- q . k: each thread's slice, summed over the CPP lanes of a position.
        float dots[S::CH][ATTN_MAX_G];
#pragma unroll
        for (int i = 0; i < S::CH; ++i)
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh)
                dots[i][hh] = hh < G ? kv_dot8(c.k[i], kt, sq + hh * HD + dc * 8) : 0.0f;
        // The next span's chunks load while this one is finished.
        if (s + 1 < ds.s1) load_span<HD>(a, kt, vt, g, start + ATTN_SPLIT, min(ATTN_SPLIT, pos + 1 - start - ATTN_SPLIT), pos, c);
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

        // ---- Online softmax: one warp per head, one position per lane; the
        // sums so far are rescaled to the new maximum (by 0 before the first
        // span: e^-inf).
        if (warp < G) {
            const float l = lane < len ? sp[warp * ATTN_SPLIT + lane] : NEG_INF;
            const float m = fmaxf(m_run, warp_max(l));
            const float e = lane < len ? expf(l - m) : 0.0f;
            sp[warp * ATTN_SPLIT + lane] = e;
            const float r = expf(m_run - m);
            sum_run = sum_run * r + warp_sum(e);
            m_run = m;
            if (lane == 0) sr[warp] = r;
        }
        __syncthreads();

        // ---- p . v: thread (head hh, value d), over the span's positions.
#pragma unroll
        for (int i = 0; i < PV; ++i) {
            const int hh = tid / HD + i * HSTEP;
            if (hh < G) {
                const float* p = sp + hh * ATTN_SPLIT;
                float x = 0.0f;
#pragma unroll 8
                for (int j = 0; j < len; ++j) x += p[j] * f16_to_f32(sv[j * HD + d]);
                acc[i] = acc[i] * sr[hh] + x;
            }
        }
        __syncthreads();  // sp, sr and sv are the next span's
    }
    if (warp < G && lane == 0) sml[warp] = make_float2(m_run, sum_run);
    __syncthreads();
    decode_finish<HD, S::NT>(args, ds, g, G, QUANT ? a.v_rot : 0, acc, sml, sq);
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
    const long long slot = in.slot[t];
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
    b.at.kc += slot * in.k_stride;
    b.at.vc += slot * in.v_stride;
    b.qk.kc += slot * in.k_stride;
    b.qk.vc += slot * in.v_stride;
    b.count += (size_t)t * in.at.n_kv;
    return b;
}

// attn_decode_hd*: one token; attn_decode_batch_hd*: grid z over the tokens
// of a batch, each of its own sequence (a slot of the KV pool); the _q
// kernels for a cache with a quantized K or V (attn_decode_impl's QUANT),
// held to the registers that keep 1024 threads resident per multiprocessor
// (DecodeLaunch::blocks in ops/attention.rs counts on them; the type branches took 7 to 22
// more).
#define DECODE_BOUNDS(HD) __launch_bounds__(DECODE_THREADS(HD))
#define DECODE_BOUNDS_Q(HD) __launch_bounds__(DECODE_THREADS(HD), 1024 / DECODE_THREADS(HD))
#define ATTN_DECODE_KERNELS(HD, Q, SUFFIX, BOUNDS)                                         \
    extern "C" __global__ void BOUNDS(HD) attn_decode##SUFFIX##_hd##HD(const AttnQkvArgs args) { \
        attn_decode_impl<HD, Q>(args);                                                     \
    }                                                                                      \
    extern "C" __global__ void BOUNDS(HD)                                                  \
        attn_decode_batch##SUFFIX##_hd##HD(const AttnQkvArgs args) {                       \
        const AttnQkvArgs b = batch_token<HD>(args);                                       \
        attn_decode_impl<HD, Q>(b);                                                        \
    }
#define ATTN_DECODE(HD)                       \
    ATTN_DECODE_KERNELS(HD, false, , DECODE_BOUNDS) \
    ATTN_DECODE_KERNELS(HD, true, _q, DECODE_BOUNDS_Q)

ATTN_DECODE(64)
ATTN_DECODE(128)
ATTN_DECODE(256)
