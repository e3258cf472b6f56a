// One-token products that normalize their own input (mvn_<type>): the
// residual add + norm + q8 quantization that residual_norm runs as a
// kernel of its own between two products, run instead at the start of
// every block of the product that reads it, into shared memory. The
// decode pipeline uses it for the q/k/v product (model.rs: one launch and
// one grid-wide wait fewer per layer; for gate/up it measured slower).
//
// Each block (MVN_THREADS threads; ceil(rows / 32) blocks, at most one per
// SM, so that a short product leaves SMs free for the next kernel's early
// blocks) recomputes the same norm
// with norm_row_regs, bit for bit what residual_norm computes, from the
// residual x and the addend (read from L2); block 0 alone writes the
// updated residual to x_out (a second buffer: other blocks still read x),
// the f32 output and the global q8 copy (for launches of the same step
// that read them). Then warp w of block b takes rows b * 32 + w, stepping
// by the grid's warps, against the activation in shared memory. Weight
// rows are asked of L2 before the PDL wait, as in the mv_*_t1 kernels,
// a few rows per warp ahead of the one computed.
//
// Needs n (norm.n == mv.cols) a multiple of 32 and at most MVN_THREADS *
// NORM_REG; dynamic shared memory: n bytes of quants, then n / 32 float2.

#define MVN_THREADS 1024
// The same block size as residual_norm: the same reduction order, the same bits.
static_assert(MVN_THREADS == NORM_THREADS, "mvn_* and residual_norm must reduce alike");
// Rows per warp asked of L2 ahead of the one being computed.
#define MVN_AHEAD 4

// A launch covers product a's rows, then (MIXED) those of product b, of
// weight type T2: launch row total_a + r is b's row r. Without MIXED the
// second product compiles out, and mvn_* keep their code.
template <class T, class T2, bool MIXED>
__device__ __forceinline__ void mvn_prefetch_row(const MatvecArgs& a, const MatvecArgs& b, bool glu, int total_a,
                                                 int gr) {
    if (!MIXED || gr < total_a) mv_prefetch_row(a, glu, gr);
    else if (b.prefetch) mv_prefetch_row(b, false, gr - total_a);
}

template <class T, class T2, bool MIXED>
__device__ __forceinline__ void matvec_norm1(const MvNormArgs& p, const MatvecArgs& b) {
    const MatvecArgs& a = p.mv;
    const NormArgs& nm = p.norm;
    extern __shared__ __align__(16) u8 mvn_smem[];
    __shared__ float red[32];
    i8* sq = (i8*)mvn_smem;                   // [n] quants
    float2* sds = (float2*)(mvn_smem + nm.n);  // [n / 32] (d, d * sum)
    const bool glu = a.mode == MV_GLU_GELU || a.mode == MV_GLU_SILU;
    const int total_a = mv_total_rows(a, glu);
    const int total = MIXED ? total_a + mv_total_rows(b, false) : total_a;
    const int nw = blockDim.x / WARP, step = gridDim.x * nw;
    const int first = blockIdx.x * nw + threadIdx.x / WARP;
    // ---- Independent of the previous kernel: the first rows' weights.
    if (a.prefetch)
        for (int k = 0, gr = first; k < MVN_AHEAD && gr < total; ++k, gr += step)
            mvn_prefetch_row<T, T2, MIXED>(a, b, glu, total_a, gr);
    PDL_PROLOGUE;

    // ---- The norm, as residual_norm (row 0), into shared memory.
    float ov[NORM_REG];
    const bool lead = blockIdx.x == 0;
    norm_row_regs(nm, 0, lead ? p.x_out : nullptr, ov, red);
#pragma unroll
    for (int k = 0; k < NORM_REG; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        // n is a multiple of 32: i < n holds for all lanes of a warp or none.
        if (i < nm.n) {
            quantize_chunk_warp(ov[k], sq + (i & ~31), sds + i / 32);
            if (lead) {
                nm.out[i] = ov[k];
                if (nm.q) quantize_chunk_warp(ov[k], nm.q + (i & ~31), nm.ds + i / 32);
            }
        }
    }
    __syncthreads();

    // ---- The product against the shared activation.
    for (int gr = first; gr < total; gr += step) {
        const int ahead = gr + MVN_AHEAD * step;
        if (a.prefetch && ahead < total) mvn_prefetch_row<T, T2, MIXED>(a, b, glu, total_a, ahead);
        if (!MIXED || gr < total_a) mv1_row<T>(a, glu, gr, sq, sds);
        else mv1_row<T2>(b, false, gr - total_a, sq, sds);
    }
}

#define MVN_KERNEL(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(MVN_THREADS, 1) mvn_##name(const MvNormArgs p) {  \
        matvec_norm1<T, T, false>(p, p.mv);                                                          \
    }

// Two weight types after one norm (mvn2_<a>_<b>): a layer's q/k/v launch
// when v's type differs from q's and k's (attn_v is Q6_K in the layers
// llama.cpp's use_more_bits picks in Q4_K_M and Q5_K_M files; Q8_0 beside
// Q5_0 where rows are not a multiple of 256, as in Gemma 3 270M and 1B):
// one launch and one grid-wide wait fewer in those layers. Product b is
// one-token, non-GLU, of the same width.
#define MVN2_KERNEL(name, T, T2)                                                                    \
    extern "C" __global__ void __launch_bounds__(MVN_THREADS, 1) mvn2_##name(const MvNorm2Args p) { \
        matvec_norm1<T, T2, true>(p.p, p.b);                                                         \
    }

// Both are instantiated in the module of their first layout (kernels.rs,
// `PRODUCTS` and `MIXED_NORM_KERNELS`).
