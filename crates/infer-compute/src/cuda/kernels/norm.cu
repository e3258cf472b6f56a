// Activation quantization to q8 chunks, and the fused residual add +
// normalization (+ quantization) that sits between the mat-vecs.
//
// residual_norm, one block per token row of n values:
//   if add:   a' = add_w ? rms_norm(add) * add_w : add;  x += a'   (x updated)
//   out = RMSNorm: x * (1 / sqrt(mean(x^2) + eps)) * w
//         LayerNorm: (x - mean) * (1 / sqrt(var + eps)) * w (+ b)
//   if q:     out quantized to q8 chunks (n a multiple of 32).
// This covers Gemma's sandwich norms (post-norm of the block output, add,
// pre-norm of the next block) and the plain pre-norm of Llama-style models.

#define NORM_THREADS 1024

// One warp per 32-value chunk; x, q, ds are [n_chunks * 32], [n_chunks * 32], [n_chunks].
extern "C" __global__ void __launch_bounds__(256) quantize_q8(const float* x, i8* q, float2* ds, int n_chunks) {
    PDL_PROLOGUE;
    const int gc = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (gc >= n_chunks) return;
    const int lane = threadIdx.x % WARP;
    quantize_chunk_warp(x[(size_t)gc * 32 + lane], q + (size_t)gc * 32, ds + gc);
}

// Values per thread kept in registers (rows up to NORM_THREADS * NORM_REG).
#define NORM_REG 4

// The whole-row path of residual_norm for row t (n <= blockDim.x *
// NORM_REG): the residual add (x_out[i] = x[i] + a'[i] when there is an
// addend and x_out is not null) and the norm, into ov (value tid + k *
// blockDim.x). Every load (row, addend, weights) is issued before the first
// use. Shared by mvn_* (matvec_norm.cu), which must match it bit for bit.
__device__ __forceinline__ void norm_row_regs(const NormArgs& a, int t, float* x_out, float (&ov)[NORM_REG],
                                              float* red) {
    const int n = a.n, tid = threadIdx.x, nt = blockDim.x;
    const float* x = a.x + (size_t)t * n;
    float xv[NORM_REG], av[NORM_REG], awv[NORM_REG], wv[NORM_REG], bv[NORM_REG];
    const float* ad = a.add ? a.add + (size_t)t * n : nullptr;
#pragma unroll
    for (int k = 0; k < NORM_REG; ++k) {
        const int i = tid + k * nt;
        const bool in = i < n;
        xv[k] = in ? x[i] : 0.0f;
        av[k] = in && ad ? ad[i] : 0.0f;
        awv[k] = in && a.add_w ? a.add_w[i] : 0.0f;
        wv[k] = in ? a.w[i] : 0.0f;
        bv[k] = in && a.b ? a.b[i] : 0.0f;
    }
    if (ad) {
        float sa = 1.0f;
        if (a.add_w) {
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < NORM_REG; ++k) ss += av[k] * av[k];
            ss = block_sum(ss, red);
            sa = 1.0f / sqrtf(ss / (float)n + a.add_eps);
        }
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) {
            const int i = tid + k * nt;
            if (i < n) {
                float v = av[k];
                if (a.add_w) v = (v * sa) * awv[k];
                xv[k] += v;
                if (x_out) x_out[(size_t)t * n + i] = xv[k];
            }
        }
    }
    if (a.kind == 0) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) ss += xv[k] * xv[k];
        ss = block_sum(ss, red);
        const float s = 1.0f / sqrtf(ss / (float)n + a.eps);
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) ov[k] = (xv[k] * s) * wv[k];
    } else {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) sum += xv[k];
        const float mean = block_sum(sum, red) / (float)n;
        float sv = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) {
            const int i = tid + k * nt;
            if (i < n) sv += (xv[k] - mean) * (xv[k] - mean);
        }
        const float var = block_sum(sv, red) / (float)n;
        const float s = 1.0f / sqrtf(var + a.eps);
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) ov[k] = ((xv[k] - mean) * s) * wv[k] + bv[k];
    }
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS) residual_norm(const NormArgs a) {
    PDL_PROLOGUE;
    __shared__ float red[32];
    const int t = blockIdx.x, n = a.n, tid = threadIdx.x, nt = blockDim.x;
    float* x = a.x + (size_t)t * n;
    float* out = a.out + (size_t)t * n;
    if (n <= nt * NORM_REG) {
        // Whole row in registers; the q8 chunks are quantized from
        // registers: value tid + k * nt sits in lane tid % 32 of chunk
        // (tid + k * nt) / 32, so a warp holds whole chunks.
        float ov[NORM_REG];
        norm_row_regs(a, t, a.x, ov, red);
        const int n_chunks = n / 32;
#pragma unroll
        for (int k = 0; k < NORM_REG; ++k) {
            const int i = tid + k * nt;
            if (i < n) {
                out[i] = ov[k];
                // n is a multiple of 32 when q is set, so i < n holds for
                // all lanes of the warp or none.
                if (a.q) {
                    const size_t gc = (size_t)t * n_chunks + i / 32;
                    quantize_chunk_warp(ov[k], a.q + gc * 32, a.ds + gc);
                }
            }
        }
        return;
    } else {
        // Long rows: the same arithmetic, streaming from memory.
        if (a.add) {
            const float* ad = a.add + (size_t)t * n;
            float sa = 1.0f;
            if (a.add_w) {
                float ss = 0.0f;
                for (int i = tid; i < n; i += nt) ss += ad[i] * ad[i];
                ss = block_sum(ss, red);
                sa = 1.0f / sqrtf(ss / (float)n + a.add_eps);
            }
            for (int i = tid; i < n; i += nt) {
                float v = ad[i];
                if (a.add_w) v = (v * sa) * a.add_w[i];
                x[i] += v;
            }
        }
        if (a.kind == 0) {
            float ss = 0.0f;
            for (int i = tid; i < n; i += nt) ss += x[i] * x[i];
            ss = block_sum(ss, red);
            const float s = 1.0f / sqrtf(ss / (float)n + a.eps);
            for (int i = tid; i < n; i += nt) out[i] = (x[i] * s) * a.w[i];
        } else {
            float sum = 0.0f;
            for (int i = tid; i < n; i += nt) sum += x[i];
            const float mean = block_sum(sum, red) / (float)n;
            float sv = 0.0f;
            for (int i = tid; i < n; i += nt) sv += (x[i] - mean) * (x[i] - mean);
            const float var = block_sum(sv, red) / (float)n;
            const float s = 1.0f / sqrtf(var + a.eps);
            for (int i = tid; i < n; i += nt) {
                float v = ((x[i] - mean) * s) * a.w[i];
                if (a.b) v += a.b[i];
                out[i] = v;
            }
        }
    }
    // Long rows: quantize from the stored row.
    if (a.q) {
        __syncthreads();  // out written by other threads of this block
        const int lane = tid % WARP, warp = tid / WARP, n_warps = nt / WARP;
        const int n_chunks = n / 32;
        for (int c = warp; c < n_chunks; c += n_warps) {
            const size_t gc = (size_t)t * n_chunks + c;
            quantize_chunk_warp(out[c * 32 + lane], a.q + gc * 32, a.ds + gc);
        }
    }
}
