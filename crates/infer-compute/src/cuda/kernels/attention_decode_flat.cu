// Decode attention with a softmax per thread ("flat"): attn_decode's work
// (attention_decode.cu: the q/k/v post-processing, the split of the
// attended range into blocks, the merge of the blocks by the last one) for
// kv heads of at most FLAT_G query heads, with the positions of a block's
// range streamed through registers instead of shared memory.
//
// Thread (dc = tid % CPP, j0 = tid / CPP) holds values dc·8 .. dc·8 + 7 of
// every position j0, j0 + PP, j0 + 2·PP ... of the block's range (CPP =
// HD / 8 lanes per position, PP = FLAT_THREADS / CPP positions per pass),
// its next position's key and value chunks loading while it finishes one.
// A position's logits are its CPP lanes' partial dot products summed by
// shuffles; each thread then keeps, per query head, its own running max,
// sum of e^(l - max) and unnormalized output over its 8 values (online
// softmax, Milakov & Gimelshein 2018), rescaled only when the max grows.
// No barrier runs per position: attn_decode's staged spans wait on three
// barriers per 32 positions and read every value from shared memory,
// which left its hd64 kernel at 0.7 TB/s of the H200's 4.8 at depth 16 384
// (L1/shared-memory bound, 50% occupancy). At the end the threads of a
// warp that share values merge by shuffles, the warps through shared
// memory, and decode_finish writes the block's result or partial.
// Logits and values as attn_decode reads them (values rounded to f16).
// Chosen per layer and pass by ops::decode_flat: where attn_decode's blocks
// would each stream two or more spans (89-128 registers, no spills; the
// conformance suite's cuda_flat runs it everywhere).

#define FLAT_THREADS 256
#define FLAT_G 4

template <int HD>
struct FlatShape {
    static constexpr int NT = FLAT_THREADS;
    static constexpr int CPP = HD / 8;   // lanes per position
    static constexpr int PP = NT / CPP;  // positions per pass
    static constexpr int NW = NT / WARP;
    static_assert(WARP % CPP == 0 || CPP == WARP, "a position's lanes in one warp");
};

// The key and value chunks (kv_load8) of position p at column col: zero at
// or past end and at pos (not in the cache yet).
__device__ __forceinline__ void flat_load(const AttnArgs& a, int kt, int vt, int kv_dim, int col, int p, int end,
                                          int pos, uint4& k, uint4& v) {
    const bool cached = p < end && p < pos;
    k = cached ? kv_load8(a.kc + (size_t)p * a.k_row, kt, kv_dim, col) : make_uint4(0, 0, 0, 0);
    v = cached ? kv_load8(a.vc + (size_t)p * a.v_row, vt, kv_dim, col) : make_uint4(0, 0, 0, 0);
}

// Merges the running (max, sum, output) of another thread into this one's.
__device__ __forceinline__ void flat_merge(float& m, float& l, float* acc, float m2, float l2, const float* acc2) {
    const float mm = fmaxf(m, m2);
    const float ra = m == mm ? 1.0f : expf(m - mm), rb = m2 == mm ? 1.0f : expf(m2 - mm);
    l = l * ra + l2 * rb;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = acc[i] * ra + acc2[i] * rb;
    m = mm;
}

template <int HD, bool QUANT>
__device__ __forceinline__ void attn_decode_flat_impl(const AttnQkvArgs& args) {
    typedef FlatShape<HD> S;
    extern __shared__ float smem[];
    const AttnArgs& a = args.at;
    const QkvArgs& k = args.qk;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int g = blockIdx.x;
    const int G = a.n_head / a.n_kv, h0 = g * G, kv_dim = a.n_kv * HD;
    float* sq = smem;                                      // [FLAT_G][HD] query heads
    float* skv = sq + FLAT_G * HD;                         // new k at [0, HD), v at [HD, 2 HD)
    float* srot = skv + 2 * HD;                            // cos at [0, n_rot / 2), sin after
    float* snw = srot + HD;                                // q norm weights at [0, HD), k's after
    float2* sml = (float2*)(snw + 2 * HD);                 // [FLAT_G] the block's (max, sum)
    float2* swml = sml + FLAT_G;                           // [NW][FLAT_G] the warps' (max, sum)
    float* sacc = (float*)(swml + S::NW * FLAT_G);         // [NW][FLAT_G][HD] the warps' outputs

    // ---- Independent of the previous kernel (before pdl_wait).
    const int pos = *a.pos0;
    const DecodeSpans ds = decode_spans(a, pos, blockIdx.y);
    if (ds.s0 >= ds.n_active) return;
    const int first = attn_first(a, pos);
    const bool append = ds.s1 == ds.n_active;  // holds pos
    const int b0 = first + ds.s0 * ATTN_SPLIT, b1 = min(first + ds.s1 * ATTN_SPLIT, pos + 1);
    const int n_it = (b1 - b0 + S::PP - 1) / S::PP;
    const int dc = tid % S::CPP, j0 = tid / S::CPP, col = g * HD + dc * 8;
    const int kt = QUANT ? a.kt : KV_F16, vt = QUANT ? a.vt : KV_F16;
    uint4 ck, cv;
    flat_load(a, kt, vt, kv_dim, col, b0 + j0, b1, pos, ck, cv);
    rope_table(k, pos, srot);
    const QkvArgs ks = norms_to_smem<HD>(k, snw);
    PDL_PROLOGUE;

    qkv_stage(ks, h0, G, g, append, HD, sq, skv, srot, [] {});
    const bool reread = QUANT;
    if (append) decode_append<HD>(k, pos, kt, vt, kv_dim, g, skv, reread);

    float acc[FLAT_G][8], m[FLAT_G], l[FLAT_G];
#pragma unroll
    for (int hh = 0; hh < FLAT_G; ++hh) {
        m[hh] = NEG_INF;
        l[hh] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[hh][i] = 0.0f;
    }
    for (int it = 0; it < n_it; ++it) {
        const int p = b0 + it * S::PP + j0;
        uint4 kk = ck, vv = cv;
        if (p == pos) new_row_chunks<HD>(a, pos, kt, vt, kv_dim, col, dc, skv, reread, kk, vv);
        if (it + 1 < n_it) flat_load(a, kt, vt, kv_dim, col, p + S::PP, b1, pos, ck, cv);
        float dots[FLAT_G];
#pragma unroll
        for (int hh = 0; hh < FLAT_G; ++hh) dots[hh] = hh < G ? kv_dot8(kk, kt, sq + hh * HD + dc * 8) : 0.0f;
#pragma unroll
        for (int o = S::CPP / 2; o > 0; o >>= 1)
#pragma unroll
            for (int hh = 0; hh < FLAT_G; ++hh) dots[hh] += __shfl_xor_sync(FULL_MASK, dots[hh], o);
        float v[8];
        kv_unpack8(kv_f16x8(vv, vt), KV_F16, v);
        const bool valid = p < b1;
#pragma unroll
        for (int hh = 0; hh < FLAT_G; ++hh) {
            if (hh >= G) continue;
            float x = dots[hh] * a.scale;
            if (a.softcap > 0.0f) x = a.softcap * tanhf(x * (1.0f / a.softcap));
            if (valid && x > m[hh]) {
                const float r = expf(m[hh] - x);
                l[hh] *= r;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[hh][i] *= r;
                m[hh] = x;
            }
            const float e = valid ? expf(x - m[hh]) : 0.0f;
            l[hh] += e;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[hh][i] += e * v[i];
        }
    }

    // ---- The threads of a warp that hold the same values merge (lanes
    // dc, dc + CPP, ...), then the warps through shared memory.
#pragma unroll
    for (int o = S::CPP; o < WARP; o <<= 1) {
#pragma unroll
        for (int hh = 0; hh < FLAT_G; ++hh) {
            float acc2[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) acc2[i] = __shfl_xor_sync(FULL_MASK, acc[hh][i], o);
            const float m2 = __shfl_xor_sync(FULL_MASK, m[hh], o), l2 = __shfl_xor_sync(FULL_MASK, l[hh], o);
            flat_merge(m[hh], l[hh], acc[hh], m2, l2, acc2);
        }
    }
    if (lane < S::CPP) {
#pragma unroll
        for (int hh = 0; hh < FLAT_G; ++hh) {
            if (hh >= G) continue;
            float* o = sacc + (size_t)(warp * FLAT_G + hh) * HD + dc * 8;
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = acc[hh][i];
            if (lane == 0) swml[warp * FLAT_G + hh] = make_float2(m[hh], l[hh]);
        }
    }
    __syncthreads();
    constexpr int HSTEP = S::NT / HD;       // heads at once in the final merge
    constexpr int PV = ATTN_MAX_G / HSTEP;  // heads per thread (decode_finish's layout)
    const int d = tid % HD;
    float out[PV];
#pragma unroll
    for (int i = 0; i < PV; ++i) {
        const int hh = tid / HD + i * HSTEP;
        out[i] = 0.0f;
        if (hh >= G) continue;
        float mm = NEG_INF;
        for (int w = 0; w < S::NW; ++w) mm = fmaxf(mm, swml[w * FLAT_G + hh].x);
        float sum = 0.0f, o = 0.0f;
        for (int w = 0; w < S::NW; ++w) {
            const float2 ml = swml[w * FLAT_G + hh];
            const float r = ml.x == mm ? 1.0f : expf(ml.x - mm);
            sum += ml.y * r;
            o += sacc[(size_t)(w * FLAT_G + hh) * HD + d] * r;
        }
        out[i] = o;
        if (d == 0) sml[hh] = make_float2(mm, sum);
    }
    __syncthreads();
    decode_finish<HD, S::NT>(args, ds, g, G, QUANT ? a.v_rot : 0, out, sml, sq);
}

// attn_decode_flat_hd*, attn_decode_flat_batch_hd* and their _q kernels:
// as attn_decode's (grid, arguments, tickets), for G <= FLAT_G; at most 128
// registers, so that two blocks stay resident per multiprocessor.
#define ATTN_DECODE_FLAT_KERNELS(HD, Q, SUFFIX)                                                               \
    extern "C" __global__ void __launch_bounds__(FLAT_THREADS, 2)                                            \
        attn_decode_flat##SUFFIX##_hd##HD(const AttnQkvArgs args) {                                          \
        attn_decode_flat_impl<HD, Q>(args);                                                                  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(FLAT_THREADS, 2)                                            \
        attn_decode_flat_batch##SUFFIX##_hd##HD(const AttnQkvArgs args) {                                    \
        const AttnQkvArgs b = batch_token<HD>(args);                                                         \
        attn_decode_flat_impl<HD, Q>(b);                                                                     \
    }
#define ATTN_DECODE_FLAT(HD)                    \
    ATTN_DECODE_FLAT_KERNELS(HD, false, )       \
    ATTN_DECODE_FLAT_KERNELS(HD, true, _q)

ATTN_DECODE_FLAT(64)
ATTN_DECODE_FLAT(128)
ATTN_DECODE_FLAT(256)
