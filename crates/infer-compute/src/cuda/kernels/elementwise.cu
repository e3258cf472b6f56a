// Embedding lookup (dequantize one row per token, times a scale; also the
// row dequantizer used by the tests) and the GLU / activation kernels of
// the unfused feed-forward path.

#define EW_THREADS 128

// x[t][k] = scale * dequant(table[tokens[t]])[k], k < n. Grid: x = token.
extern "C" __global__ void __launch_bounds__(EW_THREADS) embed_rows(const u8* table, int ty, int row_bytes, int n,
                                                                      const int* tokens, float scale, float* x) {
    const int t = blockIdx.x, tid = threadIdx.x;
    const u8* row = table + (size_t)tokens[t] * row_bytes;
    float* xr = x + (size_t)t * n;
    if (ty == TY_F32 || ty == TY_F16 || ty == TY_BF16) {
        for (int k = tid; k < n; k += blockDim.x) {
            float v;
            if (ty == TY_F32) v = ((const float*)row)[k];
            else if (ty == TY_F16) v = f16_to_f32(((const u16*)row)[k]);
            else v = bf16_to_f32(((const u16*)row)[k]);
            xr[k] = v * scale;
        }
        return;
    }
    for (int c = tid; c < n / 32; c += blockDim.x) {
        WChunk w;
        if (!load_chunk_any(ty, row, c, w)) return;
#pragma unroll
        for (int k = 0; k < 32; ++k) xr[c * 32 + k] = chunk_value(w, k) * scale;
    }
}

// out[i] = act(gate[i]) * up[i]; act 0 = GELU (tanh), 1 = SiLU.
extern "C" __global__ void glu(const float* gate, const float* up, float* out, int n, int act) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = (act == 0 ? act_gelu_tanh(g) : act_silu(g)) * up[i];
}

// x[i] = act(x[i]) (plain FFN).
extern "C" __global__ void act_inplace(float* x, int n, int act) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = act == 0 ? act_gelu_tanh(x[i]) : act_silu(x[i]);
}
