// Tensor-core attention for prefill passes (FlashAttention-2: Dao, 2023,
// "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning"), over the KV cache (a quantized one's tiles widened to
// f16 as they are staged). Same result as attn_split +
// attn_combine (attention.cu) for every token of the pass, computed once
// per tile of queries instead of once per query.
//
// Rows are (token, query head of the kv group) pairs, token-major: row
// r = t * G + i is head g * G + i of token t, for kv head g = blockIdx.y.
// Each warp owns 16 rows, a block 16 * (blockDim.x / 32). The block walks
// the key positions its rows can see in tiles of FA_BK, staged in shared
// memory; per tile each warp computes S = Q K^T (mma m16n8k16, f16 inputs,
// f32 accumulation), masks it (causal, sliding window), updates the
// running row max and sum (online softmax) and accumulates P V. Q is
// pre-multiplied by the attention scale and rounded to f16 once; P is
// rounded to f16 for the second product (values in [0, 1]).
//
// Fragment layouts are PTX's for mma.m16n8k16 (grp = lane / 4, tig =
// lane % 4): A rows grp and grp + 8, columns 2 tig (+1) and 2 tig + 8
// (+9); B column grp, rows 2 tig (+1) and 2 tig + 8 (+9); C rows grp and
// grp + 8, columns 2 tig (+1).

#define FA_BK 32
// Heads of at most this many values load the next tile of keys and values
// into registers while this one's products run: llama 1B pp512 at depth
// 16384 +38% (f16 cache) and +44% (q8_0) on an H100. Larger heads would
// spill (96 and 128 did). -DFA_AHEAD_MAX_HD=n (INFER_CUDA_NVRTC_OPTS) sets
// another bound; 0 turns it off.
#ifndef FA_AHEAD_MAX_HD
#define FA_AHEAD_MAX_HD 64
#endif

__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as f16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four transposed 8x8 f16 matrices from shared memory; lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const u16* p) {
    u32 addr;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(addr) : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <int HD>
__device__ __forceinline__ void attn_prefill(const AttnArgs& a) {
    constexpr int NK = HD / 16;  // k-steps of S = Q K^T
    constexpr int ND = HD / 8;   // n-tiles of O
    constexpr int LD = HD + 8;   // shared row stride in halves (conflict-free fragments)
    __shared__ __align__(16) u16 ks[FA_BK * LD];
    __shared__ __align__(16) u16 vs[FA_BK * LD];

    const int G = a.n_head / a.n_kv;
    const int g = blockIdx.y;
    const int n_rows = a.n_tok * G;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    const int grp = lane >> 2, tig = lane & 3;
    const int row0 = blockIdx.x * n_warps * 16;
    const int pos0 = *a.pos0;
    const size_t kv_dim = (size_t)a.n_kv * HD;
    const size_t kv_off = (size_t)g * HD;

    // This thread's two rows (grp and grp + 8 of the warp's 16).
    bool valid[2];
    int rpos[2], rfirst[2];
    size_t qoff[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = row0 + warp * 16 + grp + 8 * i;
        valid[i] = r < n_rows;
        const int t = valid[i] ? r / G : 0;
        rpos[i] = pos0 + t;
        rfirst[i] = a.window > 0 ? max(0, rpos[i] + 1 - a.window) : 0;
        qoff[i] = ((size_t)t * a.n_head + (size_t)g * G + r % G) * HD;
    }
    // Positions the warp's rows attend (for skipping tiles it cannot see).
    const int w_t0 = min(row0 + warp * 16, n_rows - 1) / G;
    const int w_t1 = min(row0 + warp * 16 + 15, n_rows - 1) / G;
    const int w_lo = a.window > 0 ? max(0, pos0 + w_t0 + 1 - a.window) : 0;
    const int w_hi = pos0 + w_t1;
    // Positions the block's rows attend.
    const int b_t0 = row0 / G;
    const int b_t1 = (min(row0 + n_warps * 16, n_rows) - 1) / G;
    const int j_lo = a.window > 0 ? max(0, pos0 + b_t0 + 1 - a.window) : 0;
    const int j_hi = pos0 + b_t1;

    u32 qa[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; ++kk)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float2 v = make_float2(0.0f, 0.0f);
                if (valid[i]) v = *(const float2*)(a.q + qoff[i] + kk * 16 + h * 8 + 2 * tig);
                qa[kk][i + 2 * h] = pack_f16x2(f16_range(v.x * a.scale), f16_range(v.y * a.scale));
            }

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};

    // The tile of keys and values kb .. kb + FA_BK - 1 as raw chunks
    // (kv_load8), zeros past j_hi (the cache there may hold anything, and
    // 0 * NaN is NaN). Small heads (FA_AHEAD_MAX_HD) load the next tile into
    // registers while the products of this one run (the blocks are few,
    // about two per multiprocessor, so each waited out every tile's loads);
    // larger heads have no registers to spare and load in turn.
    constexpr bool AHEAD = HD <= FA_AHEAD_MAX_HD;
    constexpr int NCH = FA_BK * (HD / 8);    // chunks of K (and of V) per tile
    constexpr int PER = AHEAD ? NCH / 64 : 1;  // per thread, for the fewest threads (2 warps)
    uint4 rk[PER], rv[PER];
    const auto fetch = [&](int kb, int c) {
        const int i = threadIdx.x + c * blockDim.x;
        const int j = i / (HD / 8), col = (int)kv_off + (i % (HD / 8)) * 8;
        const bool in = i < NCH && kb + j <= j_hi;
        rk[c % PER] = in ? kv_load8(a.kc + (size_t)(kb + j) * a.k_row, a.kt, (int)kv_dim, col) : make_uint4(0, 0, 0, 0);
        rv[c % PER] = in ? kv_load8(a.vc + (size_t)(kb + j) * a.v_row, a.vt, (int)kv_dim, col) : make_uint4(0, 0, 0, 0);
    };
    const auto stage = [&](int c) {
        const int i = threadIdx.x + c * blockDim.x;
        if (i >= NCH) return;
        const int j = i / (HD / 8), d = (i % (HD / 8)) * 8;
        *(uint4*)(ks + j * LD + d) = kv_f16x8(rk[c % PER], a.kt);
        *(uint4*)(vs + j * LD + d) = kv_f16x8(rv[c % PER], a.vt);
    };
    if (AHEAD) {
#pragma unroll
        for (int c = 0; c < PER; ++c) fetch(j_lo, c);
    }
    for (int kb = j_lo; kb <= j_hi; kb += FA_BK) {
        __syncthreads();
        if (AHEAD) {
#pragma unroll
            for (int c = 0; c < PER; ++c) stage(c);
        } else {
            for (int c = 0; c * (int)blockDim.x < NCH; ++c) {
                fetch(kb, c);
                stage(c);
            }
        }
        __syncthreads();
        if (AHEAD && kb + FA_BK <= j_hi) {
#pragma unroll
            for (int c = 0; c < PER; ++c) fetch(kb + FA_BK, c);
        }
        if (kb > w_hi || kb + FA_BK <= w_lo) continue;

        float s[FA_BK / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; ++kk)
#pragma unroll
            for (int n = 0; n < FA_BK / 8; ++n) {
                const u16* kr = ks + (n * 8 + grp) * LD + kk * 16 + 2 * tig;
                mma_f16_16816(s[n], qa[kk], *(const u32*)kr, *(const u32*)(kr + 8));
            }

        // Mask, soft-cap, online softmax (row i's values: s[n][2i], s[n][2i+1]).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < FA_BK / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1, j = kb + n * 8 + 2 * tig + (e & 1);
                float v = s[n][e];
                if (a.softcap > 0.0f) v = a.softcap * tanhf(v * (1.0f / a.softcap));
                if (!valid[i] || j > rpos[i] || j < rfirst[i]) v = NEG_INF;
                s[n][e] = v;
                mx[i] = fmaxf(mx[i], v);
            }
        float alpha[2], base[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL_MASK, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL_MASK, mx[i], 2));
            const float mn = fmaxf(m[i], mx[i]);
            base[i] = mn == NEG_INF ? 0.0f : mn;  // a row with nothing seen yet stays at zero
            alpha[i] = expf(m[i] - base[i]);
            m[i] = mn;
            l[i] *= alpha[i];
        }
#pragma unroll
        for (int n = 0; n < ND; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int n = 0; n < FA_BK / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = expf(s[n][e] - base[e >> 1]);
                s[n][e] = p;
                l[e >> 1] += p;
            }

        // O += P V, 16 positions per k-step; V fragments by transposed loads.
#pragma unroll
        for (int kp = 0; kp < FA_BK / 16; ++kp) {
            const u32 pa[4] = {pack_f16x2(s[2 * kp][0], s[2 * kp][1]), pack_f16x2(s[2 * kp][2], s[2 * kp][3]),
                               pack_f16x2(s[2 * kp + 1][0], s[2 * kp + 1][1]),
                               pack_f16x2(s[2 * kp + 1][2], s[2 * kp + 1][3])};
            const int mat = lane >> 3;
            const u16* vrow = vs + (kp * 16 + (mat & 1) * 8 + (lane & 7)) * LD + (mat >> 1) * 8;
#pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                u32 b[4];
                ldmatrix_x4_trans(b, vrow + dp * 16);
                mma_f16_16816(o[2 * dp], pa, b[0], b[1]);
                mma_f16_16816(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(FULL_MASK, l[i], 1);
        l[i] += __shfl_xor_sync(FULL_MASK, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!valid[i]) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float* out = a.out + qoff[i] + 2 * tig;
#pragma unroll
        for (int n = 0; n < ND; ++n) *(float2*)(out + n * 8) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
}

#define ATTN_PREFILL_KERNEL(hd)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) attn_prefill_hd##hd(const AttnArgs a) { \
        PDL_PROLOGUE;                                                                            \
        attn_prefill<hd>(a);                                                                     \
    }

ATTN_PREFILL_KERNEL(64)
ATTN_PREFILL_KERNEL(96)
ATTN_PREFILL_KERNEL(128)
ATTN_PREFILL_KERNEL(256)
