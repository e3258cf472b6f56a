// Embedding lookup (dequantize one row per token, times a scale; also the
// row dequantizer used by the tests) and the GLU / activation kernels of
// the unfused feed-forward path.

#define EW_THREADS 128

__device__ __forceinline__ bool is_float_type(int ty) { return ty == TY_F32 || ty == TY_F16 || ty == TY_BF16; }

// Value k of a row of a float type (F32, F16, BF16).
__device__ __forceinline__ float float_value(int ty, const u8* row, int k) {
    if (ty == TY_F32) return ((const float*)row)[k];
    if (ty == TY_F16) return f16_to_f32(((const u16*)row)[k]);
    return bf16_to_f32(((const u16*)row)[k]);
}

// x[t][k] = scale * dequant(table[tokens[t]])[k], k < n. Grid: x = token.
extern "C" __global__ void __launch_bounds__(EW_THREADS) embed_rows(const u8* table, int ty, int row_bytes, int n,
                                                                      const int* tokens, float scale, float* x) {
    PDL_PROLOGUE;
    const int t = blockIdx.x, tid = threadIdx.x;
    const u8* row = table + (size_t)tokens[t] * row_bytes;
    float* xr = x + (size_t)t * n;
    if (is_float_type(ty)) {
        for (int k = tid; k < n; k += blockDim.x) xr[k] = float_value(ty, row, k) * scale;
        return;
    }
    for (int c = tid; c < n / 32; c += blockDim.x) {
        WChunk w;
        if (!load_chunk_any(ty, row, c, w)) return;
#pragma unroll
        for (int k = 0; k < 32; ++k) xr[c * 32 + k] = chunk_value(w, k) * scale;
    }
}

// dst[r][k] = src[idx[r]][k], k < words: the rows of a batch whose logits
// are wanted, gathered before the vocabulary product. Grid: x = row.
extern "C" __global__ void __launch_bounds__(EW_THREADS) gather_rows(const unsigned* src, unsigned* dst,
                                                                       const int* idx, int words) {
    PDL_PROLOGUE;
    const unsigned* s = src + (size_t)idx[blockIdx.x] * words;
    unsigned* d = dst + (size_t)blockIdx.x * words;
    for (int k = threadIdx.x; k < words; k += blockDim.x) d[k] = s[k];
}

// out[i] = act(gate[i]) * up[i]; act 0 = GELU (tanh), 1 = SiLU.
extern "C" __global__ void glu(const float* gate, const float* up, float* out, int n, int act) {
    PDL_PROLOGUE;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = (act == 0 ? act_gelu_tanh(g) : act_silu(g)) * up[i];
}

// x[i] = act(x[i]) (plain FFN).
extern "C" __global__ void act_inplace(float* x, int n, int act) {
    PDL_PROLOGUE;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = act == 0 ? act_gelu_tanh(x[i]) : act_silu(x[i]);
}

// x[i] = cap * tanh(x[i] / cap): the final logit soft-cap after a GEMM
// (the mat-vec kernels apply it in their epilogue, with the same formula).
extern "C" __global__ void softcap_inplace(float* x, int n, float cap) {
    PDL_PROLOGUE;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = cap * tanhf(x[i] * (1.0f / cap));
}

// Decodes chunk c of a repacked row (`repack.rs`; nc chunks per row).
__device__ __forceinline__ bool load_chunk_repacked(int ty, const u8* row, int c, int nc, WChunk& w) {
    switch (ty) {
        case TY_Q4_0: w = TQ4_0R::load(row, c, nc); return true;
        case TY_Q5_0: w = TQ5_0R::load(row, c, nc); return true;
        case TY_Q8_0: w = TQ8_0R::load(row, c, nc); return true;
        case TY_Q4_K: w = TQ4_KR::load(row, c, nc); return true;
        case TY_Q6_K: w = TQ6_KR::load(row, c, nc); return true;
        default: return false;
    }
}

// out[r][k] = dequant(W)[r][k] in f32 (or bf16 when `out_bf16`) for a whole
// matrix: rows of `stride` bytes (GGUF rows, or the layout of `repack.rs`
// when `repacked`), n values each; the input of the prefill GEMM. Grid: x = row. Each thread decodes
// one 32-value chunk into shared memory, then the block writes the row
// segment with consecutive threads on consecutive floats (coalesced).
#define DQ_THREADS 64
extern "C" __global__ void __launch_bounds__(DQ_THREADS) dequant_matrix(const u8* w, int ty, int stride, int n,
                                                                          int repacked, int out_bf16, void* out) {
    PDL_PROLOGUE;
    __shared__ float sm[DQ_THREADS * 33];  // chunk i at sm[33 i ..]: no bank conflicts
    const int r = blockIdx.x, tid = threadIdx.x;
    const u8* row = w + (size_t)r * stride;
    float* of = (float*)out + (size_t)r * n;
    u16* ob = (u16*)out + (size_t)r * n;
    if (is_float_type(ty)) {
        for (int k = tid; k < n; k += blockDim.x) {
            const float v = float_value(ty, row, k);
            if (out_bf16) ob[k] = f32_to_bf16(v);
            else of[k] = v;
        }
        return;
    }
    const int nc = n / 32;
    for (int c0 = 0; c0 < nc; c0 += DQ_THREADS) {
        const int c = c0 + tid;
        if (c < nc) {
            WChunk wc;
            const bool ok = repacked ? load_chunk_repacked(ty, row, c, nc, wc) : load_chunk_any(ty, row, c, wc);
#pragma unroll
            for (int k = 0; k < 32; ++k) sm[tid * 33 + k] = ok ? chunk_value(wc, k) : 0.0f;
        }
        __syncthreads();
        const int cnt = min(DQ_THREADS, nc - c0) * 32;
        for (int i = tid; i < cnt; i += DQ_THREADS) {
            const float v = sm[(i / 32) * 33 + i % 32];
            if (out_bf16) ob[c0 * 32 + i] = f32_to_bf16(v);
            else of[c0 * 32 + i] = v;
        }
        __syncthreads();
    }
}

// out[i] = bf16(x[i]), i < n: activations for the bf16 prefill GEMM.
extern "C" __global__ void __launch_bounds__(256) to_bf16(const float* x, u16* out, int n) {
    PDL_PROLOGUE;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16(x[i]);
}

// Greedy token of a decode step on the device, so that the host reads
// 8 bytes instead of the logits. A logit's key orders by value, then by
// lower index (the host argmax's first-on-ties):
//   key = ord(value) << 32 | ~index
// where ord maps f32 to u32 monotonically (-0 taken as +0) and any NaN to
// the largest ord, so that a NaN logit always wins and the caller sees it.
// Each block reduces a grid stride of the logits to one key in part[]; the
// last block to finish (ticket on count) reduces those, writes *out, and
// re-arms count for the next replay of the graph.

#define ARGMAX_THREADS 256

__device__ __forceinline__ u64 argmax_key(float v, int i) {
    u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    if (v != v) b = 0xFFFFFFFFu;
    return ((u64)b << 32) | (u64)(~(u32)i);
}

__device__ __forceinline__ u64 warp_max_u64(u64 k) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) {
        const u64 other = __shfl_xor_sync(0xFFFFFFFFu, k, o);
        k = other > k ? other : k;
    }
    return k;
}

// Block-wide maximum (every thread gets it).
__device__ __forceinline__ u64 block_max_u64(u64 k, u64* red) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    k = warp_max_u64(k);
    if (lane == 0) red[warp] = k;
    __syncthreads();
    k = lane < (int)(blockDim.x / WARP) ? red[lane] : 0;
    k = warp_max_u64(k);
    __syncthreads();
    return k;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_logits(const float* x, int n, u64* part,
                                                                             u32* count, u64* out) {
    PDL_PROLOGUE;
    __shared__ u64 red[ARGMAX_THREADS / WARP];
    u64 k = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u64 c = argmax_key(x[i], i);
        k = c > k ? c : k;
    }
    k = block_max_u64(k, red);
    if (threadIdx.x == 0) part[blockIdx.x] = k;
    __shared__ int s_last;
    if (!last_block((int*)count, gridDim.x, s_last)) return;
    u64 m = 0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        const u64 c = __ldcg(part + b);
        m = c > m ? c : m;
    }
    m = block_max_u64(m, red);
    if (threadIdx.x == 0) *out = m;
}

// y[t * ld_y + r] = sum over z < split of part[(z * n_tok + t) * rows + r]
// (in order of z): the split-K partial sums of mmq_* (matmul_quant.cu).
extern "C" __global__ void __launch_bounds__(256) mmq_reduce(const float* part, float* y, int rows, int n_tok,
                                                             int ld_y, int split) {
    PDL_PROLOGUE;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n_tok) return;
    const int t = i / rows, r = i % rows;
    const size_t plane = (size_t)n_tok * rows;
    float s = 0.0f;
    for (int z = 0; z < split; ++z) s += part[z * plane + i];
    y[(size_t)t * ld_y + r] = s;
}
