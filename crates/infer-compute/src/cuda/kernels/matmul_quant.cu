// Quantized weights times a batch of bf16 activations on the tensor cores:
//   Y[t][r] = sum_k W[r][k] * X[t][k]
// for batched decode steps and short prompt passes (CudaOptions::
// mmq_min_tokens up to gemm_min_tokens), where dequantizing the whole
// matrix for cuBLAS (elementwise.cu: dequant_matrix) would write and read
// it again in bf16, 4.5 bytes per weight instead of the 0.56 of Q4_K.
//
// A block of MMQ_WARPS warps computes a tile of rows x tokens over one
// range of K (split-K: grid z; the ranges' partial sums are added by
// mmq_reduce, in a fixed order): MMQ_ROWS x MMQ_TOK (mmq_*: 4 x 2 warps),
// or for passes of at most MMQ_TOK / 2 tokens MMQ_ROWS · 2 x MMQ_TOK / 2
// (mmq_*_n, "narrow": 8 x 1 warps), which leaves no warp without tokens
// and has each thread decode two chunks per K-step, twice the weight bytes
// in flight (the wide tile's loads, one K-step ahead, leave it latency
// bound). Per K-step of MMQ_K values each thread decodes its 32-value
// chunks of the rows with the layout's chunk decoder (quant.cuh), converts
// them to bf16 in shared memory, and loads 8 bf16 activations per chunk
// of tokens; then each warp multiplies its 32 rows x 32 tokens with
// mma.m16n8k16 (bf16 inputs, f32 accumulation). Unlike ggml's MMQ, which
// multiplies int8 weights with q8_1 activations, the weights are decoded to
// bf16 once per block: the per-sub-block scales cost nothing per token.
// Before waiting for the kernel before it (PDL), each warp asks L2 for its
// rows' share of the block's K range. Grid: x = ceil(rows / tile rows),
// y = ceil(n_tok / tile tokens), z = split.
//
// Fragment layouts are PTX's for mma.m16n8k16 (grp = lane / 4, tig =
// lane % 4): A (16 x 16, row-major) a0 = (grp, 2 tig..+1), a1 = (grp + 8,
// 2 tig), a2 = (grp, 2 tig + 8), a3 = (grp + 8, 2 tig + 8); B (16 x 8,
// k-major per column) b0 = (k 2 tig..+1, column grp), b1 = (k 2 tig + 8);
// C c0, c1 = (grp, 2 tig..+1), c2, c3 = (grp + 8, 2 tig..+1).

#define MMQ_ROWS 128
#define MMQ_TOK 64
#define MMQ_K 64
#define MMQ_WARPS 8
#define MMQ_LD (MMQ_K + 8)  // shared row stride in bf16: conflict-free fragment loads

struct MmqArgs {
    const u8* w;      // rows x row_bytes (GGUF rows, or repack.rs's layout)
    const u16* x;     // bf16 activations [n_tok][cols]
    float* y;         // split == 1: y[t * ld_y + r]
    float* part;      // split > 1: part[(z * n_tok + t) * rows + r]
    int rows;
    int row_bytes;
    int cols;         // a multiple of 32
    int n_tok;
    int ld_y;         // >= rows
    int k_split;      // values per split, a multiple of MMQ_K
    int split;        // grid z
    int pad;
};

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Byte j (signed) of a decoded chunk word, as float.
__device__ __forceinline__ float chunk_byte(int q, int j) { return (float)((q << (24 - 8 * j)) >> 24); }

// The 32 values of a decoded chunk as bf16 at dst (16-byte aligned).
__device__ __forceinline__ void mmq_store_chunk(const WChunk& w, bool valid, u16* dst) {
    uint4* out = (uint4*)dst;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 p[4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int q = w.q[2 * i + j];
            const int h = i / 2;  // words 0..3: values 0..15
            const float d = w.d[h], m = w.m[h];
            p[2 * j] = pack_bf16x2(d * chunk_byte(q, 0) + m, d * chunk_byte(q, 1) + m);
            p[2 * j + 1] = pack_bf16x2(d * chunk_byte(q, 2) + m, d * chunk_byte(q, 3) + m);
        }
        out[i] = valid ? make_uint4(p[0], p[1], p[2], p[3]) : make_uint4(0, 0, 0, 0);
    }
}

// WN: warps along the tokens (2: the MMQ_ROWS x MMQ_TOK tile; 1: narrow).
template <class T, int WN>
__device__ __forceinline__ void matmul_quant(const MmqArgs& a) {
    constexpr int WM = MMQ_WARPS / WN;            // warps along the rows
    constexpr int ROWS = 32 * WM, TOK = 32 * WN;  // the block's tile
    constexpr int NT = MMQ_WARPS * WARP;
    constexpr int CH = ROWS * (MMQ_K / 32) / NT;  // weight chunks per thread per K-step
    constexpr int XL = TOK * (MMQ_K / 8) / NT;    // 8-value activation loads per thread
    static_assert(CH >= 1 && XL >= 1, "whole loads per thread");
    __shared__ __align__(16) u16 sw[ROWS * MMQ_LD];
    __shared__ __align__(16) u16 sx[TOK * MMQ_LD];
    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int grp = lane / 4, tig = lane % 4;
    const int r0 = blockIdx.x * ROWS, t0 = blockIdx.y * TOK;
    const int nt = min(TOK, a.n_tok - t0);
    const int kb = blockIdx.z * a.k_split, ke = min(a.cols, kb + a.k_split);
    const int n_chunk = a.cols / 32;

    // This thread's chunks: rows r0 + wr[i], chunk wc of each K-step (rows
    // past the last read the last one and store zeros).
    int wr[CH];
    bool row_ok[CH];
    const u8* wrow[CH];
    const int wc = tid % 2;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        wr[i] = tid / 2 + i * (NT / 2);
        row_ok[i] = r0 + wr[i] < a.rows;
        wrow[i] = a.w + (size_t)min(r0 + wr[i], a.rows - 1) * a.row_bytes;
    }
    // Each warp asks L2 for its rows' share of [kb, ke) (a hint: for
    // repacked rows the share is approximate).
    if (lane < ROWS / MMQ_WARPS) {
        const int r = min(r0 + warp * (ROWS / MMQ_WARPS) + lane, a.rows - 1);
        const long lo = (long)kb * a.row_bytes / a.cols, hi = ((long)ke * a.row_bytes + a.cols - 1) / a.cols;
        const u8* p = a.w + (size_t)r * a.row_bytes + lo;
        const int bytes = (int)(hi - lo);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const u64 plo = ((u64)p + 15) & ~(u64)15, phi = ((u64)p + (u64)bytes) & ~(u64)15;
        if (phi > plo)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(plo), "r"((u32)(phi - plo)) : "memory");
#endif
    }
    PDL_PROLOGUE;

    // Activation loads: XL x 8 bf16 per thread per K-step.
    const u16* xrow[XL];
    int xt[XL], xp[XL];
#pragma unroll
    for (int i = 0; i < XL; ++i) {
        const int idx = tid + i * NT;
        xt[i] = idx / (MMQ_K / 8);
        xp[i] = idx % (MMQ_K / 8);
        xrow[i] = a.x + (size_t)(t0 + min(xt[i], nt - 1)) * a.cols;
    }
    auto load_w = [&](int k0, int i, bool& ok) {
        const int c = k0 / 32 + wc;
        ok = row_ok[i] && c < n_chunk && k0 + 32 * wc < ke;
        return T::load(wrow[i], min(c, n_chunk - 1), n_chunk);
    };
    auto load_x = [&](int k0, int i) {
        const int k = k0 + xp[i] * 8;
        return (xt[i] < nt && k < ke) ? *(const uint4*)(xrow[i] + k) : make_uint4(0, 0, 0, 0);
    };

    const int wm = warp % WM, wn = warp / WM;  // warp tile: rows 32 wm.., tokens 32 wn..
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    bool wok[CH];
    WChunk wcur[CH];
    uint4 xcur[XL];
#pragma unroll
    for (int i = 0; i < CH; ++i) wcur[i] = load_w(kb, i, wok[i]);
#pragma unroll
    for (int i = 0; i < XL; ++i) xcur[i] = load_x(kb, i);
    for (int k0 = kb; k0 < ke; k0 += MMQ_K) {
        __syncthreads();  // the previous step's fragments are read
#pragma unroll
        for (int i = 0; i < CH; ++i) mmq_store_chunk(wcur[i], wok[i], sw + wr[i] * MMQ_LD + wc * 32);
#pragma unroll
        for (int i = 0; i < XL; ++i) *(uint4*)(sx + xt[i] * MMQ_LD + xp[i] * 8) = xcur[i];
        __syncthreads();
        if (k0 + MMQ_K < ke) {
#pragma unroll
            for (int i = 0; i < CH; ++i) wcur[i] = load_w(k0 + MMQ_K, i, wok[i]);
#pragma unroll
            for (int i = 0; i < XL; ++i) xcur[i] = load_x(k0 + MMQ_K, i);
        }
#pragma unroll
        for (int kk = 0; kk < MMQ_K / 16; ++kk) {
            u32 af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const u16* s = sw + (wm * 32 + mi * 16 + grp) * MMQ_LD + kk * 16 + 2 * tig;
                af[mi][0] = *(const u32*)s;
                af[mi][1] = *(const u32*)(s + 8 * MMQ_LD);
                af[mi][2] = *(const u32*)(s + 8);
                af[mi][3] = *(const u32*)(s + 8 * MMQ_LD + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                if (wn * 32 + ni * 8 < nt) {
                    const u16* s = sx + (wn * 32 + ni * 8 + grp) * MMQ_LD + kk * 16 + 2 * tig;
                    const u32 b0 = *(const u32*)s, b1 = *(const u32*)(s + 8);
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) mma_bf16_16816(acc[mi][ni], af[mi], b0, b1);
                }
            }
        }
    }

    const bool direct = a.split == 1;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + wm * 32 + mi * 16 + grp + (e / 2) * 8;
                const int t = wn * 32 + ni * 8 + 2 * tig + e % 2;
                if (r < a.rows && t < nt) {
                    const int tg = t0 + t;
                    if (direct) a.y[(size_t)tg * a.ld_y + r] = acc[mi][ni][e];
                    else a.part[((size_t)blockIdx.z * a.n_tok + tg) * a.rows + r] = acc[mi][ni][e];
                }
            }
        }
    }
}

// The kernels of one layout: `MMQ_KERNEL(name, T)` in its products module.
#define MMQ_KERNEL(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * WARP) mmq_##name(const MmqArgs a) {     \
        matmul_quant<T, 2>(a);                                                                       \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * WARP) mmq_##name##_n(const MmqArgs a) { \
        matmul_quant<T, 1>(a);                                                                       \
    }
