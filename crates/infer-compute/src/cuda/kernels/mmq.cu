// Quantized products of several tokens on the int8 tensor cores, straight
// from the weight blocks (the approach of ggml's MMQ, written here from the
// PTX ISA's mma fragment layouts):
//   y[s][t][r] = sum_k W_s[r][k] * x[t][k]
// with the segments, GLU and soft-cap epilogues of matvec.cu.
//
// A block of MMQ_WARPS warps owns a tile of MMQ_ROWS weight rows (16 per
// warp) and up to MMQ_TOK tokens (grid y steps over more). Per step of
// MMQ_KC chunks of 32 values:
//   1. the block decodes its rows' chunks into shared memory as int8 (the
//      decoded form of quant.cuh: T::load) with each half's scale d and
//      offset m, and copies the tokens' q8 chunks there with each half's
//      activation sum (scaled by the chunk's d);
//   2. each warp multiplies its 16 rows by every 8-token tile with
//      mma.sync (m16n8k32 for one scale per chunk; two m16n8k16, one per
//      16-value half, for the k-quants with 16-value scales) and adds
//      d_w * d_x * sum + m_w * (d_x * sum x) into f32 accumulators, as
//      dot_chunk does.
// Shared rows are MMQ_STRIDE bytes (36 words: rows 4 banks apart), so the
// fragment loads of a warp (8 rows x 4 words) hit 32 distinct banks.
//
// GLU: the tile's first half is 32 gate rows, its second the same 32 up
// rows; the up sums meet the gate sums in shared memory after the loop.

#define MMQ_WARPS 4
#define MMQ_ROWS (MMQ_WARPS * 16)
#define MMQ_KC 4
#define MMQ_WORDS (MMQ_KC * 8 + 4)
#define MMQ_TOK 64

struct MmqSmem {
    int w[MMQ_ROWS][MMQ_WORDS];
    int x[MMQ_TOK][MMQ_WORDS];
    float4 wd[MMQ_ROWS][MMQ_KC];  // d[0], d[1], m[0], m[1]
    float4 xd[MMQ_TOK][MMQ_KC];   // d, d * sum(half 0), d * sum(half 1), d * sum(chunk)
};

__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// Weight matrix and row of tile row i of block `tile` (false past the end).
__device__ __forceinline__ bool mmq_row(const MatvecArgs& a, bool glu, int tile, int i, const u8*& wrow) {
    if (glu) {
        const int r = tile * (MMQ_ROWS / 2) + i % (MMQ_ROWS / 2);
        if (r >= a.rows[0]) return false;
        wrow = (i < MMQ_ROWS / 2 ? a.w[0] : a.w[1]) + (size_t)r * a.row_bytes;
        return true;
    }
    const int gr = tile * MMQ_ROWS + i;
    if (gr >= mv_total_rows(a, false)) return false;
    int seg, r;
    mv_locate(a, false, gr, seg, r);
    wrow = (seg == 0 ? a.w[0] : seg == 1 ? a.w[1] : a.w[2]) + (size_t)r * a.row_bytes;
    return true;
}

// Step 1: the weight chunks c0 .. c0 + MMQ_KC of the tile's rows. Every
// load of the step is issued before the first store (unrolled), so that a
// step waits for one memory latency, not one per chunk.
#define MMQ_W_ITER (MMQ_ROWS * MMQ_KC / (MMQ_WARPS * WARP))
template <class T>
__device__ __forceinline__ void mmq_stage_w(MmqSmem& s, const MatvecArgs& a, bool glu, int c0, int n_chunk) {
    WChunk w[MMQ_W_ITER];
    bool ok[MMQ_W_ITER];
#pragma unroll
    for (int it = 0; it < MMQ_W_ITER; ++it) {
        const int e = threadIdx.x + it * MMQ_WARPS * WARP, i = e / MMQ_KC, c = c0 + e % MMQ_KC;
        const u8* wrow;
        ok[it] = c < n_chunk && mmq_row(a, glu, blockIdx.x, i, wrow);
        if (ok[it]) w[it] = T::load(wrow, c, n_chunk);
    }
#pragma unroll
    for (int it = 0; it < MMQ_W_ITER; ++it) {
        const int e = threadIdx.x + it * MMQ_WARPS * WARP, i = e / MMQ_KC, k = e % MMQ_KC;
        int4* dst = (int4*)&s.w[i][k * 8];
        if (ok[it]) {
            dst[0] = make_int4(w[it].q[0], w[it].q[1], w[it].q[2], w[it].q[3]);
            dst[1] = make_int4(w[it].q[4], w[it].q[5], w[it].q[6], w[it].q[7]);
            s.wd[i][k] = make_float4(w[it].d[0], w[it].d[1], w[it].m[0], w[it].m[1]);
        } else {
            dst[0] = make_int4(0, 0, 0, 0);
            dst[1] = make_int4(0, 0, 0, 0);
            s.wd[i][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
}

// Step 1: the q8 chunks c0 .. c0 + MMQ_KC of the block's NT * 8 tokens
// (loads first, as mmq_stage_w).
template <int NT>
__device__ __forceinline__ void mmq_stage_x(MmqSmem& s, const MatvecArgs& a, int t0, int c0, int n_chunk) {
    constexpr int N = NT * 8 * MMQ_KC, ITER = (N + MMQ_WARPS * WARP - 1) / (MMQ_WARPS * WARP);
    int4 q[ITER][2];
    float2 ds[ITER];
    bool ok[ITER];
#pragma unroll
    for (int it = 0; it < ITER; ++it) {
        const int e = threadIdx.x + it * MMQ_WARPS * WARP, t = e / MMQ_KC, c = c0 + e % MMQ_KC;
        ok[it] = e < N && c < n_chunk && t0 + t < a.n_tok;
        if (ok[it]) {
            const size_t tc = (size_t)(t0 + t) * n_chunk + c;
            const int4* p = (const int4*)(a.aq + tc * 32);
            q[it][0] = p[0];
            q[it][1] = p[1];
            ds[it] = a.ad[tc];
        }
    }
#pragma unroll
    for (int it = 0; it < ITER; ++it) {
        const int e = threadIdx.x + it * MMQ_WARPS * WARP, t = e / MMQ_KC, k = e % MMQ_KC;
        if (e >= N) break;
        int4* dst = (int4*)&s.x[t][k * 8];
        if (ok[it]) {
            const int4 q0 = q[it][0], q1 = q[it][1];
            int u0 = 0, u1 = 0;
            u0 = __dp4a(q0.x, 0x01010101, u0);
            u0 = __dp4a(q0.y, 0x01010101, u0);
            u0 = __dp4a(q0.z, 0x01010101, u0);
            u0 = __dp4a(q0.w, 0x01010101, u0);
            u1 = __dp4a(q1.x, 0x01010101, u1);
            u1 = __dp4a(q1.y, 0x01010101, u1);
            u1 = __dp4a(q1.z, 0x01010101, u1);
            u1 = __dp4a(q1.w, 0x01010101, u1);
            dst[0] = q0;
            dst[1] = q1;
            s.xd[t][k] = make_float4(ds[it].x, ds[it].x * (float)u0, ds[it].x * (float)u1, ds[it].y);
        } else {
            dst[0] = make_int4(0, 0, 0, 0);
            dst[1] = make_int4(0, 0, 0, 0);
            s.xd[t][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
}

// acc += the scaled integer sum c of weight row scale wd (half h) and
// token scale xd, as dot_chunk computes a chunk (SPLIT: one half).
template <class T>
__device__ __forceinline__ float mmq_term(int c, const float4& wd, const float4& xd, int h) {
    if (!T::SPLIT) {
        float r = wd.x * xd.x * (float)c;
        if (T::HAS_MIN) r += wd.z * xd.w;
        return r;
    }
    float r = xd.x * (h == 0 ? wd.x : wd.y) * (float)c;
    if (T::HAS_MIN) r += h == 0 ? wd.z * xd.y : wd.w * xd.z;
    return r;
}

// Step 2 for one chunk k of the step: warp rows 16 * warp + (g, g + 8),
// tokens 8 * j + 2 * t4 + (0, 1) of each tile j.
template <class T, int NT>
__device__ __forceinline__ void mmq_chunk(const MmqSmem& s, int k, float (&acc)[NT][4]) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int g = lane / 4, t4 = lane % 4;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const float4 wd0 = s.wd[r0][k], wd1 = s.wd[r1][k];
#pragma unroll
    for (int h = 0; h < (T::SPLIT ? 2 : 1); ++h) {
        const int o = k * 8 + h * 4 + t4;
        const int a0 = s.w[r0][o], a1 = s.w[r1][o];
        const int a2 = T::SPLIT ? 0 : s.w[r0][o + 4], a3 = T::SPLIT ? 0 : s.w[r1][o + 4];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int tb = j * 8;
            int c[4] = {0, 0, 0, 0};
            if (T::SPLIT) mma_k16(c, a0, a1, s.x[tb + g][o]);
            else mma_k32(c, a0, a1, a2, a3, s.x[tb + g][o], s.x[tb + g][o + 4]);
            const float4 xd0 = s.xd[tb + 2 * t4][k], xd1 = s.xd[tb + 2 * t4 + 1][k];
            acc[j][0] += mmq_term<T>(c[0], wd0, xd0, h);
            acc[j][1] += mmq_term<T>(c[1], wd0, xd1, h);
            acc[j][2] += mmq_term<T>(c[2], wd1, xd0, h);
            acc[j][3] += mmq_term<T>(c[3], wd1, xd1, h);
        }
    }
}

// The epilogue: accumulator e of tile j is tile row 16 * warp + g + 8 * (e / 2),
// token t0 + 8 * j + 2 * t4 + e % 2.
template <int NT>
__device__ __forceinline__ void mmq_store(MmqSmem& s, const MatvecArgs& a, bool glu, int t0,
                                          const float (&acc)[NT][4]) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int g = lane / 4, t4 = lane % 4;
    // GLU: the up half parks its sums in the (no longer needed) x tile,
    // as floats [tile row - 32][token].
    float* up = (float*)&s.x[0][0];
    constexpr int UP_STRIDE = NT * 8 + 1;
    static_assert((MMQ_ROWS / 2) * (NT * 8 + 1) * 4 <= sizeof(s.x), "GLU exchange fits the x tile");
    if (glu) {
        __syncthreads();
        if (warp >= MMQ_WARPS / 2) {
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = warp * 16 + g + 8 * (e / 2) - MMQ_ROWS / 2;
                    up[i * UP_STRIDE + j * 8 + 2 * t4 + e % 2] = acc[j][e];
                }
        }
        __syncthreads();
        if (warp >= MMQ_WARPS / 2) return;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = warp * 16 + g + 8 * (e / 2), tl = j * 8 + 2 * t4 + e % 2, t = t0 + tl;
            if (t >= a.n_tok) continue;
            float v = acc[j][e];
            if (glu) {
                const int r = blockIdx.x * (MMQ_ROWS / 2) + i;
                if (r >= a.rows[0]) continue;
                const float u = up[i * UP_STRIDE + tl];
                v = (a.mode == MV_GLU_GELU ? act_gelu_tanh(v) : act_silu(v)) * u;
                a.y[0][(size_t)t * a.rows[0] + r] = v;
                continue;
            }
            const int gr = blockIdx.x * MMQ_ROWS + i;
            if (gr >= mv_total_rows(a, false)) continue;
            int seg, r;
            mv_locate(a, false, gr, seg, r);
            if (a.mode == MV_SOFTCAP) v = a.cap * tanhf(v * (1.0f / a.cap));
            float* y = seg == 0 ? a.y[0] : seg == 1 ? a.y[1] : a.y[2];
            const int rows = seg == 0 ? a.rows[0] : seg == 1 ? a.rows[1] : a.rows[2];
            y[(size_t)t * rows + r] = v;
        }
}

template <class T, int NT>
__device__ __forceinline__ void mmq(const MatvecArgs& a) {
    __shared__ MmqSmem s;
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    const int n_chunk = a.cols / 32;
    const int t0 = blockIdx.y * MMQ_TOK;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    for (int c0 = 0; c0 < n_chunk; c0 += MMQ_KC) {
        __syncthreads();
        mmq_stage_w<T>(s, a, glu, c0, n_chunk);
        mmq_stage_x<NT>(s, a, t0, c0, n_chunk);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < MMQ_KC; ++k) mmq_chunk<T, NT>(s, k, acc);
    }
    mmq_store<NT>(s, a, glu, t0, acc);
}

// mmq_<type>_<NT>: NT 8-token tiles per block (tokens per block: 8 * NT,
// at most MMQ_TOK).
#define MMQ_KERNEL(name, T, NT)                                                                    \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * WARP) mmq_##name##_##NT(const MatvecArgs a) { \
        PDL_PROLOGUE;                                                                              \
        mmq<T, NT>(a);                                                                             \
    }
#define MMQ_KERNELS(name, T) MMQ_KERNEL(name, T, 1) MMQ_KERNEL(name, T, 2) MMQ_KERNEL(name, T, 4) MMQ_KERNEL(name, T, 8)

MMQ_KERNELS(q4_0, TQ4_0)
MMQ_KERNELS(q4_1, TQ4_1)
MMQ_KERNELS(q5_0, TQ5_0)
MMQ_KERNELS(q5_1, TQ5_1)
MMQ_KERNELS(q8_0, TQ8_0)
MMQ_KERNELS(iq4_nl, TIQ4_NL)
MMQ_KERNELS(q2_k, TQ2_K)
MMQ_KERNELS(q3_k, TQ3_K)
MMQ_KERNELS(q4_k, TQ4_K)
MMQ_KERNELS(q5_k, TQ5_K)
MMQ_KERNELS(q6_k, TQ6_K)
MMQ_KERNELS(q8_0r, TQ8_0R)
MMQ_KERNELS(q4_0r, TQ4_0R)
MMQ_KERNELS(q5_0r, TQ5_0R)
MMQ_KERNELS(q4_kr, TQ4_KR)
MMQ_KERNELS(q6_kr, TQ6_KR)
