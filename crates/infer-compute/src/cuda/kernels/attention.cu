// Split-K decode attention over the KV cache, of any of its types
// (kv_cache.cuh; also serves prefill: one grid layer per token, each
// attending causally to its own position).
//
// For query head h at position p, kv head g = h / (n_head / n_kv):
//   J = { j <= p, and p - j < window if a window is set }
//   l_j = scale * q_h . k_j   (then c * tanh(l_j / c) with a soft-cap c)
//   out_h = softmax(l) . v    over J
// The attended range is cut into splits of ATTN_SPLIT positions; attn_split
// computes, per (kv group chunk, split, token), the unnormalized partial
// sum_j e^(l_j - m) v_j with its max m and sum of e^(l_j - m);
// attn_combine merges the splits of each head and optionally quantizes the
// result for the output projection. The grid has a fixed number of splits
// (enough for the cache's capacity); splits past the attended range exit
// at once, so one captured graph serves every position.

#define ATTN_THREADS 256

// First position a query at `pos` attends to (its sliding window's start).
__device__ __forceinline__ int attn_first(const AttnArgs& a, int pos) {
    return a.window > 0 ? max(0, pos + 1 - a.window) : 0;
}

// Spans of ATTN_SPLIT positions that hold attended positions of a query
// at `pos` (the first ones of the grid's a.n_split).
__device__ __forceinline__ int attn_spans(const AttnArgs& a, int pos) {
    return min(a.n_split, (pos - attn_first(a, pos)) / ATTN_SPLIT + 1);
}

// Block coordinates of attn_split: kv head g, query heads h0 .. h0 + nh,
// split s of token t over positions [start, start + len).
struct AttnBlock {
    int g, h0, nh, s, t, start, len;
    size_t ml_base;  // index of (token t, head h0, split s) in part_ml
};

// Locates this block; false (after marking its heads' partials empty) when
// its split holds no attended position.
__device__ __forceinline__ bool attn_block(const AttnArgs& a, AttnBlock& b) {
    const int G = a.n_head / a.n_kv;
    const int n_gc = (G + ATTN_MAX_G - 1) / ATTN_MAX_G;
    b.g = blockIdx.x / n_gc;
    const int gc = blockIdx.x % n_gc;
    b.h0 = b.g * G + gc * ATTN_MAX_G;
    b.nh = min(ATTN_MAX_G, G - gc * ATTN_MAX_G);
    b.s = blockIdx.y;
    b.t = blockIdx.z;
    const int pos = *a.pos0 + b.t;
    const int first = attn_first(a, pos);
    b.start = first + b.s * ATTN_SPLIT;
    const int end = min(b.start + ATTN_SPLIT, pos + 1);
    b.len = end - b.start;
    b.ml_base = ((size_t)b.t * a.n_head + b.h0) * a.n_split + b.s;
    if (b.len <= 0) {
        if (threadIdx.x < b.nh) a.part_ml[b.ml_base + (size_t)threadIdx.x * a.n_split] = make_float2(NEG_INF, 0.0f);
        return false;
    }
    return true;
}

// acc[hh] += sum over positions j in [j0, j1) of p[hh][j] v[j] for value
// column col (v0: the split's first cached row; p in sp,
// [ATTN_MAX_G][ATTN_SPLIT]); eight value rows loaded before use.
__device__ __forceinline__ void pv_accumulate(const AttnArgs& a, const u8* v0, int col, const float* sp, int nh, int j0,
                                              int j1, float* acc) {
    const int kv_dim = a.n_kv * a.hd;
    for (int jb = j0; jb < j1; jb += 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
            v[u] = jb + u < j1 ? kv_value(v0 + (size_t)(jb + u) * a.v_row, a.vt, kv_dim, col) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (jb + u < j1) {
#pragma unroll
                for (int hh = 0; hh < ATTN_MAX_G; ++hh)
                    if (hh < nh) acc[hh] += sp[hh * ATTN_SPLIT + jb + u] * v[u];
            }
        }
    }
}

// The softmax of a split's logits in sp ([ATTN_MAX_G][ATTN_SPLIT]): warp
// hh turns head hh's row into e^(l - m) in place and writes (m, sum) to
// part_ml. Between the barriers that make sp visible.
__device__ __forceinline__ void split_softmax(const AttnArgs& a, const AttnBlock& b, float* sp) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (warp >= b.nh) return;
    float* row = sp + warp * ATTN_SPLIT;
    float m = NEG_INF;
    for (int j = lane; j < b.len; j += WARP) m = fmaxf(m, row[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < b.len; j += WARP) {
        const float e = expf(row[j] - m);
        row[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) a.part_ml[b.ml_base + (size_t)warp * a.n_split] = make_float2(m, sum);
}

// The split's partial softmax-weighted sums for the query heads staged in
// sq ([nh][hd], shared); sp is [ATTN_MAX_G][ATTN_SPLIT] shared scratch.
template <bool GROUPED>
__device__ __forceinline__ void attn_split_body(const AttnArgs& a, const AttnBlock& b, const float* sq, float* sp) {
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd, kv_dim = a.n_kv * hd;
    const int g = b.g, nh = b.nh, start = b.start, len = b.len;
    const size_t ml_base = b.ml_base;

    // q . k: each warp takes positions warp, warp + n_warps, ... four at a
    // time, so that four key rows are in flight before the arithmetic.
    for (int jb = warp * 4; jb < len; jb += n_warps * 4) {
        float dots[4][ATTN_MAX_G];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh) dots[u][hh] = 0.0f;
        for (int d0 = lane * 8; d0 < hd; d0 += WARP * 8) {
            uint4 kk[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int j = min(jb + u, len - 1);
                kk[u] = kv_load8(a.kc + (size_t)(start + j) * a.k_row, a.kt, kv_dim, g * hd + d0);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float kf[8];
                kv_unpack8(kk[u], a.kt, kf);
#pragma unroll
                for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
                    if (hh < nh) {
                        const float4* qv = (const float4*)(sq + hh * hd + d0);
                        const float4 qa = qv[0], qb = qv[1];
                        dots[u][hh] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4]
                                       + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
                if (hh < nh) {
                    float l = warp_sum(dots[u][hh]) * a.scale;
                    if (a.softcap > 0.0f) l = a.softcap * tanhf(l * (1.0f / a.softcap));
                    if (lane == 0 && jb + u < len) sp[hh * ATTN_SPLIT + jb + u] = l;
                }
            }
        }
    }
    __syncthreads();
    split_softmax(a, b, sp);
    __syncthreads();

    if (!GROUPED) {
        // p . v: one thread per dimension; eight value rows loaded before use.
        for (int d = tid; d < hd; d += blockDim.x) {
            float acc[ATTN_MAX_G];
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh) acc[hh] = 0.0f;
            pv_accumulate(a, a.vc + (size_t)start * a.v_row, g * hd + d, sp, nh, 0, len, acc);
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh)
                if (hh < nh) a.part_o[((ml_base + (size_t)hh * a.n_split)) * hd + d] = acc[hh];
        }
        return;
    }
    // p . v: thread (group r, dimension d). With hd < blockDim.x the block
    // holds n_grp = blockDim.x / hd groups, each over a contiguous slice of
    // the split's positions, summed through shared memory (after sp) at the
    // end, 8 value rows per load batch. Head dimensions of 256 and more keep
    // the loop above: the grouped code made Gemma 3 (256) 1-3% slower there.
    const int n_grp = (int)blockDim.x / hd;  // > 1: the host picks GROUPED for hd < 256
    const int grp = n_grp > 1 ? tid / hd : 0;
    const int per = (len + n_grp - 1) / n_grp;
    const int j0 = min(len, grp * per), j1 = min(len, j0 + per);
    float* sred = sp + ATTN_MAX_G * ATTN_SPLIT;  // [n_grp][ATTN_MAX_G][hd]
    const int d_step = n_grp > 1 ? hd : (int)blockDim.x;
    for (int d = n_grp > 1 ? tid - grp * hd : tid; grp < n_grp && d < hd; d += d_step) {
        float acc[ATTN_MAX_G];
#pragma unroll
        for (int hh = 0; hh < ATTN_MAX_G; ++hh) acc[hh] = 0.0f;
        pv_accumulate(a, a.vc + (size_t)start * a.v_row, g * hd + d, sp, nh, j0, j1, acc);
#pragma unroll
        for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
            if (hh < nh) {
                if (n_grp > 1) sred[(grp * ATTN_MAX_G + hh) * hd + d] = acc[hh];
                else a.part_o[((ml_base + (size_t)hh * a.n_split)) * hd + d] = acc[hh];
            }
        }
    }
    if (n_grp > 1) {
        __syncthreads();
        for (int i = tid; i < nh * hd; i += blockDim.x) {
            const int hh = i / hd, d = i % hd;
            float acc = 0.0f;
            for (int r = 0; r < n_grp; ++r) acc += sred[(r * ATTN_MAX_G + hh) * hd + d];
            a.part_o[((ml_base + (size_t)hh * a.n_split)) * hd + d] = acc;
        }
    }
}

template <bool GROUPED>
__device__ __forceinline__ void attn_split_impl(const AttnArgs& a) {
    extern __shared__ float smem[];
    AttnBlock b;
    if (!attn_block(a, b)) return;
    float* sq = smem;                        // [ATTN_MAX_G][hd]
    float* sp = smem + ATTN_MAX_G * a.hd;    // [ATTN_MAX_G][ATTN_SPLIT]
    const float* q = a.q + ((size_t)b.t * a.n_head + b.h0) * a.hd;
    for (int i = threadIdx.x; i < b.nh * a.hd; i += blockDim.x) sq[i] = q[i];
    __syncthreads();
    attn_split_body<GROUPED>(a, b, sq, sp);
}

// GROUPED: the p . v of attn_split_body over position groups (hd < 256).
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split(const AttnArgs a) {
    PDL_PROLOGUE;
    attn_split_impl<false>(a);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_grp(const AttnArgs a) {
    PDL_PROLOGUE;
    attn_split_impl<true>(a);
}

// Decode (one token) with qkv_post folded in: each block stages its query
// heads with bias, q norm and RoPE applied (as qkv_post does, rope.cu), and
// the block whose split holds the token's position also finishes k and v
// and appends them to the cache before attending. One query-head chunk per
// kv head (n_head / n_kv <= ATTN_MAX_G). Shared memory: attn_split's, where
// k and v [2][hd] and the rotation's cos and sin [hd] sit in the p . v
// reduction's space (done with before it is used).
template <bool GROUPED>
__device__ __forceinline__ void attn_split_qkv_impl(const AttnQkvArgs& args) {
    extern __shared__ float smem[];
    const AttnArgs& a = args.at;
    const QkvArgs& k = args.qk;
    AttnBlock b;
    if (!attn_block(a, b)) return;
    const int hd = a.hd;
    const int pos = *a.pos0;
    const bool append = b.start + b.len == pos + 1;  // the split holding pos
    float* sq = smem;
    float* sp = smem + ATTN_MAX_G * hd;
    float* skv = sp + ATTN_MAX_G * ATTN_SPLIT;  // k at [0, hd), v at [hd, 2 hd)
    float* srot = skv + 2 * hd;                 // cos at [0, n_rot / 2), sin after
    rope_table(k, pos, srot);
    qkv_stage(k, b.h0, b.nh, b.g, append, hd, sq, skv, srot, [] {});
    if (append) {
        // Visible to this block's reads of the cache after the barrier.
        const int kv_dim = a.n_kv * hd;
        kv_store_head(k.kc + (size_t)pos * k.k_row, k.kt, kv_dim, b.g, skv, hd);
        kv_store_head(k.vc + (size_t)pos * k.v_row, k.vt, kv_dim, b.g, skv + hd, hd);
        __syncthreads();
    }
    attn_split_body<GROUPED>(a, b, sq, sp);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_qkv(const AttnQkvArgs args) {
    PDL_PROLOGUE;
    attn_split_qkv_impl<false>(args);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_qkv_grp(const AttnQkvArgs args) {
    PDL_PROLOGUE;
    attn_split_qkv_impl<true>(args);
}


#define COMBINE_THREADS 128

// Grid: x = head, y = token.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) attn_combine(const AttnArgs a) {
    PDL_PROLOGUE;
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int hd = a.hd, q_dim = a.n_head * hd;
    const size_t base = ((size_t)t * a.n_head + h) * a.n_split;
    const float2* ml = a.part_ml + base;
    // Only the first ceil(attended / ATTN_SPLIT) splits hold positions.
    const int pos = *a.pos0 + t;
    const int n_active = attn_spans(a, pos);
    float m = NEG_INF;
    for (int s = 0; s < n_active; ++s) m = fmaxf(m, ml[s].x);
    float total = 0.0f;
    for (int s = 0; s < n_active; ++s) total += expf(ml[s].x - m) * ml[s].y;
    const float inv = 1.0f / total;
    const size_t row = (size_t)t * q_dim + (size_t)h * hd;
    for (int d = tid; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_active; ++s) acc += expf(ml[s].x - m) * a.part_o[(base + s) * hd + d];
        const float v = acc * inv;
        a.out[row + d] = v;
        // oq is only set when hd is a multiple of 32: then d < hd holds for
        // all lanes of a warp or none, and a warp holds chunk d / 32 whole.
        if (a.oq) quantize_chunk_warp(v, a.oq + row + (d & ~31), a.ods + (row + d) / 32);
    }
}

// The attention output of a rotated value cache rotated back (H / sqrt(n)
// is its own inverse), then quantized for the output projection when
// a.oq is set: the attention kernels ran with oq unset. Grid: x = head,
// y = token; blockDim.x is a multiple of 32 and hd of 32.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) attn_unrotate(const AttnArgs a) {
    PDL_PROLOGUE;
    __shared__ float x[QKV_MAX_HD];
    const int hd = a.hd;
    const size_t row = ((size_t)blockIdx.y * a.n_head + blockIdx.x) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = a.out[row + d];
    __syncthreads();
    hadamard_smem(x, hd, a.v_rot);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        a.out[row + d] = x[d];
        if (a.oq) quantize_chunk_warp(x[d], a.oq + row + (d & ~31), a.ods + (row + d) / 32);
    }
}
