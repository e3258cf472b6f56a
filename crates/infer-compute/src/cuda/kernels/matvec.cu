// Quantized mat-vec and batched mat-vec (decode and prefill):
//   y[s][t][r] = sum_k W_s[r][k] * x[t][k]
// for up to three weight matrices of one type and width ("segments", e.g.
// q, k and v, launched together), or for a gate/up pair fused with the GLU
// epilogue: y[0][t][r] = act(gate_r . x_t) * (up_r . x_t).
//
// One warp per output row (one-token rows of 4096+ values: 2 or 4 warps,
// `_t1s`, the count chosen by warps_per_row in ops/matvec.rs); lane l takes the
// row's 32-value chunks l, l + 32, ... , decodes each once and dots it
// with the q8 activation of up to NT tokens (integer dp4a inside a chunk,
// f32 across chunks), then the warp reduces. Grid: x = ceil(rows /
// MV_WARPS) (MV_WARPS / wpr for `_t1s`), y = ceil(n_tok / NT).
// The one-token kernels (`_t1`) keep the GLU choice out of the chunk loop,
// so that the loop body has no branch and its loads issue together.

#define MV_WARPS 4
// mv_*_t1s: at most 48 registers (10 blocks of 128 threads per SM), where
// the compiler chose 56-64 (8 blocks) for the repacked k-quants: +3% on
// gemma3 4B, +1% on gemma3 1B, Llama 1B unchanged (H200, tg128). The same
// bound on mv_*_t1 and mv_*_t1q moved the four models by -1.5 to +1.2%,
// in both directions, so they keep the compiler's choice.
// -DMV_T1S_MIN_BLOCKS=n (INFER_CUDA_NVRTC_OPTS) sets another count.
#ifndef MV_T1S_MIN_BLOCKS
#define MV_T1S_MIN_BLOCKS 10
#endif
// mv_*_t1 keeps the compiler's register choice, except for the repacked
// Q6_K kernel (mostly the vocabulary product of a Q4_K_M file): 56
// registers instead of 62, 9 blocks per SM instead of 8, no spills: Llama
// 1B +1.2%, the Gemma 3 models -0.6 to +0.3% (H200, tg128; at 10 blocks,
// 48 registers with spills, -0.6 to +0.8%). -DMV_Q6KR_T1_MIN_BLOCKS=n
// (INFER_CUDA_NVRTC_OPTS) sets another count.
#ifndef MV_Q6KR_T1_MIN_BLOCKS
#define MV_Q6KR_T1_MIN_BLOCKS 9
#endif
#define MV_T1_BOUNDS __launch_bounds__(MV_WARPS * WARP)
#define MV_Q6KR_T1_BOUNDS __launch_bounds__(MV_WARPS * WARP, MV_Q6KR_T1_MIN_BLOCKS)

__device__ __forceinline__ float act_gelu_tanh(float x) {
    const float z = 0.7978845608028654f * x * (1.0f + 0.044715f * x * x);
    return x / (1.0f + expf(-2.0f * z));
}

__device__ __forceinline__ float act_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ int mv_total_rows(const MatvecArgs& a, bool glu) {
    return glu ? a.rows[0] : a.rows[0] + a.rows[1] + a.rows[2];
}

// Segment and row within it of row gr (< total) of the launch.
__device__ __forceinline__ void mv_locate(const MatvecArgs& a, bool glu, int gr, int& seg, int& r) {
    seg = 0;
    r = gr;
    if (!glu && r >= a.rows[0]) {
        r -= a.rows[0];
        seg = 1;
        if (r >= a.rows[1]) {
            r -= a.rows[1];
            seg = 2;
        }
    }
}

// Locates the output row of this warp: segment and row within it.
// Returns false when the warp has no row.
__device__ __forceinline__ bool mv_row(const MatvecArgs& a, bool glu, int& seg, int& r) {
    const int gr = blockIdx.x * MV_WARPS + threadIdx.x / WARP;
    if (gr >= mv_total_rows(a, glu)) return false;
    mv_locate(a, glu, gr, seg, r);
    return true;
}

// Stores output value v of row r of segment seg for token t.
__device__ __forceinline__ void mv_put(const MatvecArgs& a, int seg, int r, int t, float v) {
    // Constant indices only: a run-time index into the argument struct
    // would copy it to local memory.
    float* y = seg == 0 ? a.y[0] : seg == 1 ? a.y[1] : a.y[2];
    const int rows = seg == 0 ? a.rows[0] : seg == 1 ? a.rows[1] : a.rows[2];
    y[(size_t)t * rows + r] = v;
}

template <int NT>
__device__ __forceinline__ void mv_store(const MatvecArgs& a, int seg, int r, int t0, int nt, float* acc, float* acc2,
                                         bool glu) {
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t < nt) {
            const float v = warp_sum(acc[t]);
            float out = v;
            if (glu) {
                const float u = warp_sum(acc2[t]);
                out = (a.mode == MV_GLU_GELU ? act_gelu_tanh(v) : act_silu(v)) * u;
            } else if (a.mode == MV_SOFTCAP) {
                out = a.cap * tanhf(v * (1.0f / a.cap));
            }
            if (lane == 0) mv_put(a, seg, r, t0 + t, out);
        }
    }
}

template <class T, int NT>
__device__ __forceinline__ void matvec_q(const MatvecArgs& a) {
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    int seg, r;
    if (!mv_row(a, glu, seg, r)) return;
    const int lane = threadIdx.x % WARP;
    const int t0 = blockIdx.y * NT;
    const int nt = min(NT, a.n_tok - t0);
    const int n_chunk = a.cols / 32;
    const u8* wbase = seg == 0 ? a.w[0] : seg == 1 ? a.w[1] : a.w[2];
    const u8* wrow = wbase + (size_t)r * a.row_bytes;
    const u8* wrow2 = glu ? a.w[1] + (size_t)r * a.row_bytes : wrow;
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) { acc[t] = 0.0f; acc2[t] = 0.0f; }
    for (int c = lane; c < n_chunk; c += WARP) {
        const WChunk w = T::load(wrow, c, n_chunk);
        WChunk w2;
        if (glu) w2 = T::load(wrow2, c, n_chunk);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const size_t tc = (size_t)(t0 + t) * n_chunk + c;
                const int4* q = (const int4*)(a.aq + tc * 32);
                const int4 q0 = q[0], q1 = q[1];
                const float2 ds = a.ad[tc];
                acc[t] += dot_chunk<T>(w, q0, q1, ds);
                if (glu) acc2[t] += dot_chunk<T>(w2, q0, q1, ds);
            }
        }
    }
    mv_store<NT>(a, seg, r, t0, nt, acc, acc2, glu);
}

// matvec_q with MV_TR_ROWS weight rows per warp (register tiles; for GLU
// the gate and up rows of MV_TR_ROWS / 2 outputs): lane l decodes chunks
// l, l + 32, ... of each of its warp's rows once and dots them with the q8
// activation of up to 8 tokens, loading each activation chunk once for the
// R rows. With one row per warp, those
// activation loads outnumber the weight loads n_tok to 1 and bound a
// product of many tokens; here they drop R-fold, at R-fold fewer warps.
// So that few-row products still have warps enough to hide their loads,
// a group of R rows may be split over wpr = 2 (or 4) warps of the block
// (warp w takes part w % wpr of the chunks: part * 32 + lane, stepping by
// 32 * wpr); the parts meet in shared memory, where lane j of the group's
// first warp adds up output j (row j / 8, token j % 8). Before waiting for
// the kernel before it (PDL), each warp asks L2 for its rows. Grid: x =
// ceil(ceil(rows / R) / (MV_WARPS / wpr)), y = ceil(n_tok / 8).
#define MV_TR_ROWS 4
// Blocks per SM the tr kernels' register budget must allow (the compiler
// chose 128-185 registers, 2-3 blocks; at 4, 128 registers, 4 bytes of
// spills in five layouts: +3-5% at 12-23 tokens, H200). -DMV_TR_MIN_BLOCKS=n
// (INFER_CUDA_NVRTC_OPTS) sets another count.
#ifndef MV_TR_MIN_BLOCKS
#define MV_TR_MIN_BLOCKS 4
#endif
template <class T, bool GLU>
__device__ __forceinline__ void matvec_qr_mode(const MatvecArgs& a) {
    constexpr int R = MV_TR_ROWS, NT = 8;
    static_assert(R * NT == WARP, "one output of the group per lane");
    static_assert(R % 2 == 0, "GLU: whole gate/up pairs per group");
    constexpr bool glu = GLU;
    // Output rows per group: R, or R / 2 gate/up pairs (weight row i is
    // output gr0 + i / 2 of the gate matrix for even i, of up for odd i).
    const int per = glu ? R / 2 : R;
    const int total = mv_total_rows(a, glu);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int wpr = a.wpr, part = warp % wpr;
    const int gr0 = (blockIdx.x * (MV_WARPS / wpr) + warp / wpr) * per;
    const bool valid = gr0 < total;
    const u8* wrow[R];
    int seg[R], row[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        // Rows past the last repeat it; their sums are not stored.
        const int gi = gr0 + (glu ? i / 2 : i);
        mv_locate(a, glu, min(gi, total - 1), seg[i], row[i]);
        const u8* wbase = glu ? (i % 2 == 0 ? a.w[0] : a.w[1]) : seg[i] == 0 ? a.w[0] : seg[i] == 1 ? a.w[1] : a.w[2];
        wrow[i] = wbase + (size_t)row[i] * a.row_bytes;
        if (valid && part == 0 && a.prefetch && gi < total) prefetch_l2(wrow[i], a.row_bytes);
    }
    PDL_PROLOGUE;
    const int t0 = blockIdx.y * NT;
    const int nt = min(NT, a.n_tok - t0);
    const int n_chunk = a.cols / 32;
    float acc[R][NT];
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[i][t] = 0.0f;
    }
    for (int c = part * WARP + lane; valid && c < n_chunk; c += WARP * wpr) {
        WChunk w[R];
#pragma unroll
        for (int i = 0; i < R; ++i) w[i] = T::load(wrow[i], c, n_chunk);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const size_t tc = (size_t)(t0 + t) * n_chunk + c;
                const int4* q = (const int4*)(a.aq + tc * 32);
                const int4 q0 = q[0], q1 = q[1];
                const float2 ds = a.ad[tc];
#pragma unroll
                for (int i = 0; i < R; ++i) acc[i][t] += dot_chunk<T>(w[i], q0, q1, ds);
            }
        }
    }
    if (wpr == 1) {
        if (!valid) return;
        if constexpr (glu) {
#pragma unroll
            for (int j = 0; j < R / 2; ++j) {
                if (gr0 + j < total) mv_store<NT>(a, 0, gr0 + j, t0, nt, acc[2 * j], acc[2 * j + 1], true);
            }
        } else {
#pragma unroll
            for (int i = 0; i < R; ++i) {
                if (gr0 + i < total) mv_store<NT>(a, seg[i], row[i], t0, nt, acc[i], acc[i], false);
            }
        }
        return;
    }
    __shared__ float sums[MV_WARPS][R * NT];
#pragma unroll
    for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float v = warp_sum(acc[i][t]);
            if (lane == 0) sums[warp][i * NT + t] = v;
        }
    }
    __syncthreads();
    const int i = lane / NT, t = lane % NT;
    // GLU: the lanes of gate rows (even i) finish their pair.
    if (!valid || part != 0 || t >= nt || (glu && i % 2 != 0)) return;
    const int out = glu ? gr0 + i / 2 : gr0 + i;
    if (out >= total) return;
    float v = 0.0f;
    for (int k = 0; k < wpr; ++k) v += sums[warp + k][lane];
    if constexpr (glu) {
        float u = 0.0f;
        for (int k = 0; k < wpr; ++k) u += sums[warp + k][lane + NT];
        v = (a.mode == MV_GLU_GELU ? act_gelu_tanh(v) : act_silu(v)) * u;
        mv_put(a, 0, out, t0 + t, v);
    } else {
        if (a.mode == MV_SOFTCAP) v = a.cap * tanhf(v * (1.0f / a.cap));
        // Constant indices into seg and row (a run-time one would put them
        // in local memory).
        int sg = seg[0], r = row[0];
#pragma unroll
        for (int k = 1; k < R; ++k) {
            if (i == k) { sg = seg[k]; r = row[k]; }
        }
        mv_put(a, sg, r, t0 + t, v);
    }
}

// matvec_qr_mode for the launch's mode: GLU a compile-time choice, so that
// the plain products keep their registers.
template <class T>
__device__ __forceinline__ void matvec_qr(const MatvecArgs& a) {
    if (a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU) matvec_qr_mode<T, true>(a);
    else matvec_qr_mode<T, false>(a);
}

// The chunk loop of matvec_q1 for one GLU choice, against the q8
// activation aq / ad (global memory, or shared memory in mvn_*).
template <class T, bool GLU>
__device__ __forceinline__ void mv1_loop(const MatvecArgs& a, const u8* wrow, const u8* wrow2, const i8* aq,
                                         const float2* ad, float& acc, float& acc2, int c0 = threadIdx.x % WARP,
                                         int stride = WARP) {
    const int n_chunk = a.cols / 32;
    for (int c = c0; c < n_chunk; c += stride) {
        const int4* q = (const int4*)(aq + (size_t)c * 32);
        const int4 q0 = q[0], q1 = q[1];
        const float2 ds = ad[c];
        acc += dot_chunk<T>(T::load(wrow, c, n_chunk), q0, q1, ds);
        if (GLU) acc2 += dot_chunk<T>(T::load(wrow2, c, n_chunk), q0, q1, ds);
    }
}

// Row gr (< total) of a one-token launch, by one warp.
template <class T>
__device__ __forceinline__ void mv1_row(const MatvecArgs& a, bool glu, int gr, const i8* aq, const float2* ad) {
    int seg, r;
    mv_locate(a, glu, gr, seg, r);
    const u8* wbase = seg == 0 ? a.w[0] : seg == 1 ? a.w[1] : a.w[2];
    const u8* wrow = wbase + (size_t)r * a.row_bytes;
    const u8* wrow2 = glu ? a.w[1] + (size_t)r * a.row_bytes : wrow;
    float acc = 0.0f, acc2 = 0.0f;
    if (glu) mv1_loop<T, true>(a, wrow, wrow2, aq, ad, acc, acc2);
    else mv1_loop<T, false>(a, wrow, wrow2, aq, ad, acc, acc2);
    mv_store<1>(a, seg, r, 0, 1, &acc, &acc2, glu);
}

// One token: matvec_q for NT = 1, with the loop of mv1_loop.
template <class T>
__device__ __forceinline__ void matvec_q1(const MatvecArgs& a) {
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    const int gr = blockIdx.x * MV_WARPS + threadIdx.x / WARP;
    if (gr >= mv_total_rows(a, glu)) return;
    mv1_row<T>(a, glu, gr, a.aq, a.ad);
}

// One token, wpr warps per row (long rows): warp w of block b takes part
// w % wpr of row b * (MV_WARPS / wpr) + w / wpr (chunks part * 32 + lane,
// stepping by 32 * wpr); the parts meet in shared memory and the row's
// first warp runs the epilogue.
template <class T>
__device__ __forceinline__ void matvec_q1_split(const MatvecArgs& a, int wpr) {
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, part = warp % wpr;
    const int gr = blockIdx.x * (MV_WARPS / wpr) + warp / wpr;
    const bool valid = gr < mv_total_rows(a, glu);
    __shared__ float2 sacc[MV_WARPS];
    int seg = 0, r = 0;
    float acc = 0.0f, acc2 = 0.0f;
    if (valid) {
        mv_locate(a, glu, gr, seg, r);
        const u8* wbase = seg == 0 ? a.w[0] : seg == 1 ? a.w[1] : a.w[2];
        const u8* wrow = wbase + (size_t)r * a.row_bytes;
        const u8* wrow2 = glu ? a.w[1] + (size_t)r * a.row_bytes : wrow;
        if (glu) mv1_loop<T, true>(a, wrow, wrow2, a.aq, a.ad, acc, acc2, part * WARP + lane, WARP * wpr);
        else mv1_loop<T, false>(a, wrow, wrow2, a.aq, a.ad, acc, acc2, part * WARP + lane, WARP * wpr);
        acc = warp_sum(acc);
        if (glu) acc2 = warp_sum(acc2);
    }
    if (lane == 0) sacc[warp] = make_float2(acc, acc2);
    __syncthreads();
    if (!valid || part != 0) return;
    float s = 0.0f, s2 = 0.0f;
    for (int k = 0; k < wpr; ++k) {
        s += sacc[warp + k].x;
        s2 += sacc[warp + k].y;
    }
    // mv_store sums over the warp: the total on lane 0, zeros elsewhere.
    float v = lane == 0 ? s : 0.0f, v2 = lane == 0 ? s2 : 0.0f;
    mv_store<1>(a, seg, r, 0, 1, &v, &v2, glu);
}

// One token, GLU, the output also quantized to q8 for the product after
// it: the 32 output rows of a q8 chunk belong to 32 / MV_WARPS blocks, and
// the last of them to finish (ticket on count[chunk], re-armed) quantizes
// the chunk, as quantize_q8 would, so that product needs no launch of its
// own first. The host checks that the rows fill whole chunks.
template <class T>
__device__ __forceinline__ void matvec_q1_quant(const MvQuantArgs& p) {
    const MatvecArgs& a = p.mv;
    const int gr = blockIdx.x * MV_WARPS + threadIdx.x / WARP;
    mv1_row<T>(a, true, gr, a.aq, a.ad);
    __shared__ int s_last;
    const int chunk = blockIdx.x / (32 / MV_WARPS);
    if (!last_block(p.count + chunk, 32 / MV_WARPS, s_last)) return;
    if (threadIdx.x < WARP) {
        const size_t i = (size_t)chunk * 32 + threadIdx.x;
        quantize_chunk_warp(__ldcg(a.y[0] + i), p.oq + (size_t)chunk * 32, p.ods + chunk);
    }
}

// Weights do not depend on the kernel before this one: before waiting for
// it (PDL), each warp of a one-token launch asks L2 for its row(s), so that
// the weight stream overlaps that kernel instead of following it.
// Asks L2 for row gr (< total) of the launch (both rows of a GLU pair).
__device__ __forceinline__ void mv_prefetch_row(const MatvecArgs& a, bool glu, int gr) {
    int seg, r;
    mv_locate(a, glu, gr, seg, r);
    const u8* wbase = seg == 0 ? a.w[0] : seg == 1 ? a.w[1] : a.w[2];
    prefetch_l2(wbase + (size_t)r * a.row_bytes, a.row_bytes);
    if (glu) prefetch_l2(a.w[1] + (size_t)r * a.row_bytes, a.row_bytes);
}

__device__ __forceinline__ void mv_prefetch(const MatvecArgs& a) {
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    const int gr = blockIdx.x * MV_WARPS + threadIdx.x / WARP;
    if (a.prefetch && gr < mv_total_rows(a, glu)) mv_prefetch_row(a, glu, gr);
}

// mv_prefetch for the rows of matvec_q1_split (the first warp of a row).
__device__ __forceinline__ void mv_prefetch_split(const MatvecArgs& a) {
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    const int warp = threadIdx.x / WARP;
    const int gr = blockIdx.x * (MV_WARPS / a.wpr) + warp / a.wpr;
    if (a.prefetch && warp % a.wpr == 0 && gr < mv_total_rows(a, glu)) mv_prefetch_row(a, glu, gr);
}

// Float weights (F32, F16, BF16) against the f32 activation.
struct FF32 { static __device__ __forceinline__ float at(const u8* row, int k) { return ((const float*)row)[k]; } };
struct FF16 { static __device__ __forceinline__ float at(const u8* row, int k) { return f16_to_f32(((const u16*)row)[k]); } };
struct FBF16 { static __device__ __forceinline__ float at(const u8* row, int k) { return bf16_to_f32(((const u16*)row)[k]); } };

template <class F, int NT>
__device__ __forceinline__ void matvec_f(const MatvecArgs& a) {
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    int seg, r;
    if (!mv_row(a, glu, seg, r)) return;
    const int lane = threadIdx.x % WARP;
    const int t0 = blockIdx.y * NT;
    const int nt = min(NT, a.n_tok - t0);
    const u8* wbase = seg == 0 ? a.w[0] : seg == 1 ? a.w[1] : a.w[2];
    const u8* wrow = wbase + (size_t)r * a.row_bytes;
    const u8* wrow2 = glu ? a.w[1] + (size_t)r * a.row_bytes : wrow;
    float acc[NT], acc2[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) { acc[t] = 0.0f; acc2[t] = 0.0f; }
    for (int k = lane; k < a.cols; k += WARP) {
        const float w = F::at(wrow, k);
        const float w2 = glu ? F::at(wrow2, k) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const float x = a.ax[(size_t)(t0 + t) * a.cols + k];
                acc[t] += w * x;
                if (glu) acc2[t] += w2 * x;
            }
        }
    }
    mv_store<NT>(a, seg, r, t0, nt, acc, acc2, glu);
}

#define MV_KERNELS(name, T, T1B)                                                                   \
    extern "C" __global__ void T1B mv_##name##_t1(const MatvecArgs a) {                            \
        mv_prefetch(a);                                                                            \
        PDL_PROLOGUE;                                                                              \
        matvec_q1<T>(a);                                                                           \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_T1S_MIN_BLOCKS) mv_##name##_t1s(const MatvecArgs a) { \
        mv_prefetch_split(a);                                                                      \
        PDL_PROLOGUE;                                                                              \
        matvec_q1_split<T>(a, a.wpr);                                                              \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP) mv_##name##_t8(const MatvecArgs a) { \
        PDL_PROLOGUE;                                                                              \
        matvec_q<T, 8>(a);                                                                         \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, MV_TR_MIN_BLOCKS) mv_##name##_tr(const MatvecArgs a) { \
        matvec_qr<T>(a);                                                                           \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP) mv_##name##_t1q(const MvQuantArgs p) { \
        mv_prefetch(p.mv);                                                                         \
        PDL_PROLOGUE;                                                                              \
        matvec_q1_quant<T>(p);                                                                     \
    }

// The kernels of each quantized layout are instantiated in a module of their
// own (kernels.rs, `PRODUCTS`): `MV_KERNELS(name, T, T1B)`, compiled only
// for the weight types a model has.
