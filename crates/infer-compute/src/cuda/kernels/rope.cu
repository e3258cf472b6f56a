// After the q/k/v projections of one layer: bias add, per-head RMSNorm of
// q and k (Gemma 3, Qwen3), rotary embedding, and the append of k and v to
// the KV cache at the token's position (read from device memory, so that
// a captured graph serves every position), in the cache's type
// (kv_cache.cuh): rotated first, with the queries, where that type is.
//
// RoPE angles follow `cpu::ops::rope` exactly: theta starts at the position
// as f32 and is multiplied by theta_scale = base^(-2/n_rot) once per pair
// (the f32 recurrence of ggml), then scaled by freq_scale.
//
// Grid: x = n_head + n_kv (q heads, then kv heads), y = token. The q heads
// are rotated in place; the kv blocks write k (rotated) and v to the cache.

#define QKV_THREADS 128
#define QKV_MAX_HD 1024

// Values of a head per thread (the block has QKV_THREADS threads).
#define QKV_PER (QKV_MAX_HD / QKV_THREADS)

extern "C" __global__ void __launch_bounds__(QKV_THREADS) qkv_post(const QkvArgs a) {
    PDL_PROLOGUE;
    __shared__ float sx[QKV_MAX_HD];
    __shared__ float sv[QKV_MAX_HD];  // v, for a rotated or quantized value cache
    __shared__ float red[32];
    const int head = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int hd = a.hd;
    const bool is_q = head < a.n_head;
    const int h = is_q ? head : head - a.n_head;
    const int pos = *a.pos0 + t;
    const int kv_dim = a.n_kv * hd;
    float* src = is_q ? a.q + ((size_t)t * a.n_head + h) * hd : a.k + ((size_t)t * a.n_kv + h) * hd;
    const float* bias = is_q ? a.bq : a.bk;
    const float* nw = is_q ? a.qn_w : a.kn_w;
    const float eps = is_q ? a.qn_eps : a.kn_eps;
    const float* v = is_q ? nullptr : a.v + ((size_t)t * a.n_kv + h) * hd;

    // Every load before the first use: value d = tid + k * QKV_THREADS.
    float xv[QKV_PER], nwv[QKV_PER], vv[QKV_PER];
#pragma unroll
    for (int k = 0; k < QKV_PER; ++k) {
        const int d = tid + k * QKV_THREADS;
        const bool in = d < hd;
        xv[k] = in ? src[d] + (bias ? bias[h * hd + d] : 0.0f) : 0.0f;
        nwv[k] = in && nw ? nw[d] : 0.0f;
        vv[k] = in && v ? v[d] + (a.bv ? a.bv[h * hd + d] : 0.0f) : 0.0f;
    }
    float s = 1.0f;
    if (nw) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < QKV_PER; ++k) ss += xv[k] * xv[k];
        ss = block_sum(ss, red);
        s = 1.0f / sqrtf(ss / (float)hd + eps);
    }
#pragma unroll
    for (int k = 0; k < QKV_PER; ++k) {
        const int d = tid + k * QKV_THREADS;
        if (d < hd) sx[d] = nw ? (xv[k] * s) * nwv[k] : xv[k];
    }
    __syncthreads();
    const int half = a.n_rot / 2;
    for (int i = tid; i < half; i += QKV_THREADS) {
        float theta = (float)pos;
        for (int m = 0; m < i; ++m) theta *= a.theta_scale;
        float sn, cs;
        sincosf(a.freq_scale * theta, &sn, &cs);
        const int i0 = a.neox ? i : 2 * i;
        const int i1 = a.neox ? i + half : 2 * i + 1;
        const float x0 = sx[i0], x1 = sx[i1];
        sx[i0] = x0 * cs - x1 * sn;
        sx[i1] = x0 * sn + x1 * cs;
    }
    const bool k_tq = kv_is_tq(a.kt), v_tq = !is_q && kv_is_tq(a.vt);
    if (k_tq) __syncthreads();  // RoPE's pairs written before the factors
#pragma unroll
    for (int k = 0; k < QKV_PER; ++k) {
        const int d = tid + k * QKV_THREADS;
        if (d >= hd) continue;
        // A TurboQuant cache's factors before its rotation (tq_cache.cuh).
        if (k_tq) sx[d] *= tq_mul((const u32*)a.kc, d, is_q);
        if (!is_q) sv[d] = v_tq ? vv[k] * tq_mul((const u32*)a.vc, d, false) : vv[k];
    }
    __syncthreads();
    // q or k by K's rotation, v by V's, in one set of stages.
    hadamard_smem(HadSegs{{sx, sv, nullptr}, {a.k_rot ? hd : 0, !is_q && a.v_rot ? hd : 0, 0}, {a.k_rot, a.v_rot, 0}});
    if (is_q) {
        for (int d = tid; d < hd; d += QKV_THREADS) src[d] = sx[d];
        return;
    }
    // A TurboQuant cache takes the rows of the pass in place (tq_cache.cu
    // codes and stores them).
    if (k_tq) {
        for (int d = tid; d < hd; d += QKV_THREADS) src[d] = sx[d];
    } else {
        kv_store_head(a.kc + (size_t)pos * a.k_row, a.kt, kv_dim, h, sx, hd);
    }
    if (v_tq) {
        float* vr = a.v + ((size_t)t * a.n_kv + h) * hd;
        for (int d = tid; d < hd; d += QKV_THREADS) vr[d] = sv[d];
    } else {
        kv_store_head(a.vc + (size_t)pos * a.v_row, a.vt, kv_dim, h, sv, hd);
    }
}

// The same post-processing inside a decode attention block (attn_split_qkv,
// attn_decode_hd*), on rows staged in shared memory.

// cos and sin of the angles of position pos into srot (cos at
// [0, n_rot / 2), sin after), by qkv_post's recurrence.
__device__ __forceinline__ void rope_table(const QkvArgs& k, int pos, float* srot) {
    const int half = k.n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = (float)pos;
        for (int m = 0; m < i; ++m) theta *= k.theta_scale;
        sincosf(k.freq_scale * theta, &srot[half + i], &srot[i]);
    }
}

// Stages query heads h0 .. h0 + nh of token 0 into sq ([nh][hd]) and, with
// `with_kv`, kv head g's new k and v into skv ([2][hd]), with bias,
// per-head RMSNorm of q and k (one warp per row) and RoPE from srot
// (rope_table, written before the call and ordered by the first barrier
// here), and rotated where the cache's types are (kv_cache.cuh: q and k
// by k_rot, v by v_rot). `pre()` runs between the loads and that barrier, so that its work
// overlaps their latency (attn_decode stores its cached values there; that
// order measured 4% faster on llama 1B than storing them before the call).
// Ends with a barrier: every thread may read the rows afterwards.
template <class Pre>
__device__ __forceinline__ void qkv_stage(const QkvArgs& k, int h0, int nh, int g, bool with_kv, int hd, float* sq,
                                          float* skv, const float* srot, Pre pre) {
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    for (int i = tid; i < nh * hd; i += blockDim.x) {
        const int h = h0 + i / hd, d = i % hd;
        sq[i] = k.q[(size_t)h * hd + d] + (k.bq ? k.bq[h * hd + d] : 0.0f);
    }
    if (with_kv) {
        for (int d = tid; d < hd; d += blockDim.x) {
            skv[d] = k.k[(size_t)g * hd + d] + (k.bk ? k.bk[g * hd + d] : 0.0f);
            skv[hd + d] = k.v[(size_t)g * hd + d] + (k.bv ? k.bv[g * hd + d] : 0.0f);
        }
    }
    pre();
    __syncthreads();
    const int n_rows = nh + (with_kv ? 1 : 0);  // row nh: the new k
    for (int row = warp; row < n_rows; row += blockDim.x / WARP) {
        const bool is_k = row == nh;
        const float* nw = is_k ? k.kn_w : k.qn_w;
        if (!nw) continue;
        float* x = is_k ? skv : sq + row * hd;
        float ss = 0.0f;
        for (int d = lane; d < hd; d += WARP) ss += x[d] * x[d];
        ss = warp_sum(ss);
        const float sc = 1.0f / sqrtf(ss / (float)hd + (is_k ? k.kn_eps : k.qn_eps));
        for (int d = lane; d < hd; d += WARP) x[d] = (x[d] * sc) * nw[d];
    }
    __syncthreads();
    const int half = k.n_rot / 2;
    for (int i = tid; i < n_rows * half; i += blockDim.x) {
        const int row = i / half, p = i % half;
        float* x = row == nh ? skv : sq + row * hd;
        const int i0 = k.neox ? p : 2 * p;
        const int i1 = k.neox ? p + half : 2 * p + 1;
        const float cs = srot[p], sn = srot[half + p];
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cs - x1 * sn;
        x[i1] = x0 * sn + x1 * cs;
    }
    __syncthreads();
    const int kr = k.k_rot ? hd : 0, vr = k.v_rot && with_kv ? hd : 0;
    hadamard_smem(HadSegs{{sq, skv, skv + hd}, {kr * nh, with_kv ? kr : 0, vr}, {k.k_rot, k.k_rot, k.v_rot}});
}
