// The k most likely tokens of each row of logits, so that the host reads
// rows x k candidates instead of rows x n_vocab logits
// (`DeviceModel::forward_top_k`, `backend/topk.rs` for the contract and
// the host reference it matches exactly).
//
// One block of TOPK_THREADS threads per row; k <= TOPK_MAX (= TOP_K_MAX in
// backend/topk.rs). A logit's order key is topk_ord (monotone in the value,
// -0 taken as +0); candidates are ordered by key descending, then by lower
// id, which is a strict total order over a NaN-free row. The block:
//  1. one pass: the row's max, sum of exp(x - max) (online, a value equal
//     to the running max counting 1), lowest NaN index and the histogram
//     of the keys' top 8 bits; a row with a NaN stops here (ids 0, logits
//     NaN);
//  2. radix select over the 32-bit keys, 8 bits per pass from the top (the
//     first from pass 1's histogram, three more passes), in a 256-bin
//     shared histogram (warp-aggregated atomics): T, the key of the k-th
//     largest logit, and `rem`, how many of the logits whose key is T
//     belong to the top k (the lowest-id ones);
//  3. one pass collecting into shared memory every key > T, and the keys == T
//     (all of them when there are exactly rem, else the rem of lowest
//     index by a block-ordered scan in index order);
//  4. rank sort of the k collected (each finds its rank by comparing with
//     all), written to the output row in order.
//
// Output row r (stride 2k + 3 u32 words): ids[k], logit bits[k], then the
// max's bits, log(sum)'s bits, and the first NaN's index (0xFFFFFFFF when
// none).

#define TOPK_THREADS 1024
#define TOPK_MAX 128

__device__ __forceinline__ u32 topk_ord(float v) {
    const u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Merges the running (max, sum) pair (m2, s2) into (m, s); no NaN for any
// mix of infinities (a value equal to the max counts 1).
__device__ __forceinline__ void topk_merge(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    const float a = m == mm ? s : s * expf(m - mm);
    const float b = m2 == mm ? s2 : s2 * expf(m2 - mm);
    m = mm;
    s = a + b;
}

// Calls f(value, index) for every value of the row x of n, each thread a
// share of them: 16-byte loads, four in flight per thread, when the row is
// 16-byte aligned and n a multiple of 4 (rows of llama's 128 256 logits);
// one value at a time otherwise. The order of the calls is unspecified.
template <typename F>
__device__ __forceinline__ void topk_visit(const float* x, int n, F f) {
    const int bd = blockDim.x;
    if ((n & 3) == 0 && (((size_t)x) & 15) == 0) {
        const float4* x4 = (const float4*)x;
        const int n4 = n >> 2;
        int i = threadIdx.x;
        for (; i + 3 * bd < n4; i += 4 * bd) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = x4[i + u * bd];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int b = (i + u * bd) * 4;
                f(v[u].x, b);
                f(v[u].y, b + 1);
                f(v[u].z, b + 2);
                f(v[u].w, b + 3);
            }
        }
        for (; i < n4; i += bd) {
            const float4 v = x4[i];
            f(v.x, 4 * i);
            f(v.y, 4 * i + 1);
            f(v.z, 4 * i + 2);
            f(v.w, 4 * i + 3);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += bd) f(x[i], i);
    }
}

// Adds 1 to hist[d] for each calling thread, one shared atomic per distinct
// digit of the converged threads.
__device__ __forceinline__ void topk_count(u32* hist, u32 d) {
    const u32 peers = __match_any_sync(__activemask(), d);
    if ((int)(threadIdx.x % WARP) == __ffs(peers) - 1) atomicAdd(&hist[d], (u32)__popc(peers));
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_rows(const float* logits, int n, int k, u32* out) {
    PDL_PROLOGUE;
    __shared__ u32 hist[256];
    __shared__ u32 s_key[TOPK_MAX];
    __shared__ u32 s_id[TOPK_MAX];
    __shared__ float s_m[WARP];
    __shared__ float s_s[WARP];
    __shared__ int s_nan[WARP];
    __shared__ int s_warp[WARP];
    __shared__ u32 s_sel, s_rem, s_cnt;
    __shared__ int s_taken;
    const float* x = logits + (size_t)blockIdx.x * n;
    u32* o = out + (size_t)blockIdx.x * (2 * k + 3);
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, nw = blockDim.x / WARP;

    // 1. Max, sum and first NaN, and the histogram of the keys' top digit
    //    (the first radix pass).
    for (int j = tid; j < 256; j += blockDim.x) hist[j] = 0;
    __syncthreads();
    float m = NEG_INF, s = 0.0f;
    int nan = n;
    topk_visit(x, n, [&](float v, int i) {
        if (v != v) {
            nan = min(nan, i);
            return;
        }
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else if (v == m) {
            s += 1.0f;
        } else {
            s += expf(v - m);
        }
        topk_count(hist, topk_ord(v) >> 24);
    });
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, off), s2 = __shfl_xor_sync(FULL_MASK, s, off);
        nan = min(nan, __shfl_xor_sync(FULL_MASK, nan, off));
        topk_merge(m, s, m2, s2);
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_s[warp] = s;
        s_nan[warp] = nan;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < nw ? s_m[lane] : NEG_INF;
        s = lane < nw ? s_s[lane] : 0.0f;
        nan = lane < nw ? s_nan[lane] : n;
#pragma unroll
        for (int off = WARP / 2; off > 0; off /= 2) {
            const float m2 = __shfl_xor_sync(FULL_MASK, m, off), s2 = __shfl_xor_sync(FULL_MASK, s, off);
            nan = min(nan, __shfl_xor_sync(FULL_MASK, nan, off));
            topk_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            o[2 * k] = __float_as_uint(m);
            o[2 * k + 1] = __float_as_uint(logf(s));
            o[2 * k + 2] = nan < n ? (u32)nan : 0xFFFFFFFFu;
            s_nan[0] = nan;
        }
    }
    __syncthreads();
    if (s_nan[0] < n) {
        for (int j = tid; j < k; j += blockDim.x) {
            o[j] = 0;
            o[k + j] = 0x7FC00000u;
        }
        return;
    }

    // 2. Radix select of the k-th largest key: a digit per pass, from the
    //    top (whose histogram pass 1 made).
    u32 prefix = 0, mask = 0, rem = (u32)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (shift < 24) {
            for (int j = tid; j < 256; j += blockDim.x) hist[j] = 0;
            __syncthreads();
            topk_visit(x, n, [&](float v, int) {
                const u32 key = topk_ord(v);
                if ((key & mask) == prefix) topk_count(hist, (key >> shift) & 255u);
            });
            __syncthreads();
        }
        if (warp == 0) {
            // Lane l holds digits 255 - 8l down to 248 - 8l: counts from
            // the top, the lane whose range reaches rem finds the digit.
            u32 c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                c[j] = hist[255 - lane * 8 - j];
                sum += c[j];
            }
            u32 incl = sum;
#pragma unroll
            for (int off = 1; off < WARP; off *= 2) {
                const u32 t = __shfl_up_sync(FULL_MASK, incl, off);
                if (lane >= off) incl += t;
            }
            const u32 excl = incl - sum;
            if (excl < rem && rem <= incl) {
                u32 acc = excl;
                for (int j = 0; j < 8; ++j) {
                    if (acc + c[j] >= rem) {
                        s_sel = 255u - (u32)(lane * 8 + j);
                        s_rem = rem - acc;
                        s_cnt = c[j];
                        break;
                    }
                    acc += c[j];
                }
            }
        }
        __syncthreads();
        prefix |= s_sel << shift;
        mask |= 255u << shift;
        rem = s_rem;
    }
    const u32 t_key = prefix;

    // 3. Collection: keys above T, and rem of the keys equal to T.
    if (tid == 0) s_taken = 0;
    __syncthreads();
    const bool all_eq = s_cnt == rem;
    topk_visit(x, n, [&](float v, int i) {
        const u32 key = topk_ord(v);
        if (key > t_key || (all_eq && key == t_key)) {
            const int p = atomicAdd(&s_taken, 1);
            s_key[p] = key;
            s_id[p] = (u32)i;
        }
    });
    if (!all_eq) {
        // The lowest-index rem of the ties, in chunks of the block in index
        // order (base: ties in the chunks before, the same in every thread).
        u32 base = 0;
        for (int c0 = 0; c0 < n && base < rem; c0 += blockDim.x) {
            const int i = c0 + tid;
            const bool f = i < n && topk_ord(x[i]) == t_key;
            const u32 b = __ballot_sync(FULL_MASK, f);
            if (lane == 0) s_warp[warp] = __popc(b);
            __syncthreads();
            u32 before = 0, total = 0;
            for (int w = 0; w < nw; ++w) {
                const u32 cw = (u32)s_warp[w];
                total += cw;
                if (w < warp) before += cw;
            }
            const u32 r = base + before + (u32)__popc(b & ((1u << lane) - 1u));
            if (f && r < rem) {
                const int p = atomicAdd(&s_taken, 1);
                s_key[p] = t_key;
                s_id[p] = (u32)i;
            }
            base += total;
            __syncthreads();
        }
    }
    __syncthreads();

    // 4. Rank sort (keys and ids are distinct pairs).
    for (int t = tid; t < k; t += blockDim.x) {
        const u32 key = s_key[t], id = s_id[t];
        int rank = 0;
        for (int j = 0; j < k; ++j) {
            const u32 k2 = s_key[j], id2 = s_id[j];
            rank += (k2 > key) || (k2 == key && id2 < id);
        }
        o[rank] = id;
        o[k + rank] = __float_as_uint(x[id]);
    }
}
