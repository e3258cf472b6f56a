// The k most likely tokens of each row of logits, so that the host reads
// rows x k candidates instead of rows x n_vocab logits
// (`DeviceModel::forward_top_k`, `backend/topk.rs` for the contract and
// the host reference it matches exactly).
//
// k <= TOPK_MAX (= TOP_K_MAX in backend/topk.rs). A logit's order key is
// topk_ord (monotone in the value, -0 taken as +0); candidates are ordered
// by key descending, then by lower id, which is a strict total order over
// a NaN-free row, so a row's top k is a subset of the union of its chunks'
// top k. The grid is (chunks, rows), blocks of TOPK_THREADS:
//  1. each block takes one chunk of a row: its max, sum of exp(x - max)
//     (online, a value equal to the running max counting 1) and lowest NaN
//     index in one pass that also histograms the keys' top 8 bits, then
//     the chunk's k best (below) into `part`;
//  2. the last block of the row to finish (a grid ticket per row) merges
//     the chunks' statistics and selects the k best of their k-candidate
//     lists the same way, reading the logits' bits back by id. A row with
//     a NaN stops at the statistics (ids 0, logits NaN).
// Selecting the k best of n keys in one block:
//  a. radix select, 8 bits per pass from the top, in a 256-bin shared
//     histogram (warp-aggregated atomics): T, the k-th largest key, and
//     `rem`, how many of the keys equal to T belong to the top k (those of
//     lowest index);
//  b. one pass collecting every key > T, and the keys == T (all of them
//     when there are exactly rem, else the rem of lowest index by a
//     block-ordered scan in index order);
//  c. a rank sort of the k collected (each finds its rank by comparing
//     with all).
// The candidate lists keep a row's ties in id order (a chunk's list is
// sorted, its ids above the chunks' before it), so lowest index is lowest
// id in step 2 as in step 1. A chunk of fewer than k values pads its list
// with key 0, below every non-NaN key, so padding is never selected.
//
// Output row r (stride 2k + 3 u32 words): ids[k], logit bits[k], then the
// max's bits, log(sum)'s bits, and the first NaN's index (0xFFFFFFFF when
// none). A chunk's list in `part` has the same stride: ids[k], keys[k],
// max's bits, sum's bits, first NaN's index.

#define TOPK_THREADS 256
#define TOPK_MAX 128
#define TOPK_NO_NAN 0xFFFFFFFFu

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

struct TopkShared {
    u32 hist[256];
    u32 key[TOPK_MAX];
    u32 id[TOPK_MAX];
    float m[WARP];
    float s[WARP];
    u32 nan[WARP];
    int warp[WARP];
    u32 sel, rem, cnt;
    int taken;
    int last;
};

// Merges (max, sum, first NaN) over the warp; every lane gets the result.
__device__ __forceinline__ void topk_warp_stats(float& m, float& s, u32& nan) {
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, off), s2 = __shfl_xor_sync(FULL_MASK, s, off);
        nan = min(nan, __shfl_xor_sync(FULL_MASK, nan, off));
        topk_merge(m, s, m2, s2);
    }
}

// Merges every thread's (max, sum, first NaN) over the block; every thread
// gets the result.
__device__ __forceinline__ void topk_block_stats(float& m, float& s, u32& nan, TopkShared& sh) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    topk_warp_stats(m, s, nan);
    if (lane == 0) {
        sh.m[warp] = m;
        sh.s[warp] = s;
        sh.nan[warp] = nan;
    }
    __syncthreads();
    m = lane < nw ? sh.m[lane] : NEG_INF;
    s = lane < nw ? sh.s[lane] : 0.0f;
    nan = lane < nw ? sh.nan[lane] : TOPK_NO_NAN;
    topk_warp_stats(m, s, nan);
    __syncthreads();
}

// Calls f(value, index) for every value of the row x of n, each thread a
// share of them: 16-byte loads, four in flight per thread, when the row is
// 16-byte aligned and n a multiple of 4; one value at a time otherwise.
// The order of the calls is unspecified.
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

// Keys of a chunk of logits: x[i] is the logit of token base + i.
struct TopkLogits {
    const float* x;
    int n, base;
    __device__ u32 key(int i) const { return topk_ord(x[i]); }
    __device__ u32 id(int i) const { return (u32)(base + i); }
    template <typename F>
    __device__ void visit(F f) const {
        topk_visit(x, n, [&](float v, int i) { f(topk_ord(v), i); });
    }
};

// Keys of a row's chunk lists (n = chunks x k), written by other blocks of
// this grid: read through L2.
struct TopkLists {
    const u32* part;
    int n, k, stride;
    __device__ u32 key(int i) const { return __ldcg(part + (size_t)(i / k) * stride + k + i % k); }
    __device__ u32 id(int i) const { return __ldcg(part + (size_t)(i / k) * stride + i % k); }
    template <typename F>
    __device__ void visit(F f) const {
        for (int i = threadIdx.x; i < n; i += blockDim.x) f(key(i), i);
    }
};

// Adds 1 to hist[d] for each calling thread, one shared atomic per distinct
// digit of the converged threads.
__device__ __forceinline__ void topk_count(u32* hist, u32 d) {
    const u32 peers = __match_any_sync(__activemask(), d);
    if ((int)(threadIdx.x % WARP) == __ffs(peers) - 1) atomicAdd(&hist[d], (u32)__popc(peers));
}

// The k best keys of src (k <= src.n), as emit(rank, key, id) for ranks 0
// to k - 1, the best first (steps a-c above). With top_done, sh.hist
// already holds the histogram of the keys' top digits.
template <typename Src, typename Emit>
__device__ void topk_select(const Src& src, int k, bool top_done, TopkShared& sh, Emit emit) {
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, nw = blockDim.x / WARP;
    // a. Radix select of the k-th largest key, a digit per pass.
    u32 prefix = 0, mask = 0, rem = (u32)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (shift < 24 || !top_done) {
            for (int j = tid; j < 256; j += blockDim.x) sh.hist[j] = 0;
            __syncthreads();
            src.visit([&](u32 key, int) {
                if ((key & mask) == prefix) topk_count(sh.hist, (key >> shift) & 255u);
            });
            __syncthreads();
        }
        if (warp == 0) {
            // Lane l holds digits 255 - 8l down to 248 - 8l: counts from
            // the top, the lane whose range reaches rem finds the digit.
            u32 c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                c[j] = sh.hist[255 - lane * 8 - j];
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
                        sh.sel = 255u - (u32)(lane * 8 + j);
                        sh.rem = rem - acc;
                        sh.cnt = c[j];
                        break;
                    }
                    acc += c[j];
                }
            }
        }
        __syncthreads();
        prefix |= sh.sel << shift;
        mask |= 255u << shift;
        rem = sh.rem;
    }
    const u32 t_key = prefix;

    // b. Collection: keys above T, and rem of the keys equal to T.
    if (tid == 0) sh.taken = 0;
    __syncthreads();
    const bool all_eq = sh.cnt == rem;
    src.visit([&](u32 key, int i) {
        if (key > t_key || (all_eq && key == t_key)) {
            const int p = atomicAdd(&sh.taken, 1);
            sh.key[p] = key;
            sh.id[p] = src.id(i);
        }
    });
    if (!all_eq) {
        // The lowest-index rem of the ties, in chunks of the block in index
        // order (base: ties in the chunks before, the same in every thread).
        u32 base = 0;
        for (int c0 = 0; c0 < src.n && base < rem; c0 += blockDim.x) {
            const int i = c0 + tid;
            const bool f = i < src.n && src.key(i) == t_key;
            const u32 b = __ballot_sync(FULL_MASK, f);
            if (lane == 0) sh.warp[warp] = __popc(b);
            __syncthreads();
            u32 before = 0, total = 0;
            for (int w = 0; w < nw; ++w) {
                const u32 cw = (u32)sh.warp[w];
                total += cw;
                if (w < warp) before += cw;
            }
            const u32 r = base + before + (u32)__popc(b & ((1u << lane) - 1u));
            if (f && r < rem) {
                const int p = atomicAdd(&sh.taken, 1);
                sh.key[p] = t_key;
                sh.id[p] = src.id(i);
            }
            base += total;
            __syncthreads();
        }
    }
    __syncthreads();

    // c. Rank sort (keys and ids are distinct pairs).
    for (int t = tid; t < k; t += blockDim.x) {
        const u32 key = sh.key[t], id = sh.id[t];
        int rank = 0;
        for (int j = 0; j < k; ++j) {
            const u32 k2 = sh.key[j], id2 = sh.id[j];
            rank += (k2 > key) || (k2 == key && id2 < id);
        }
        emit(rank, key, id);
    }
}

// Step 1 for the chunk of len logits at x (token ids base...): its
// statistics and sorted list of k (padded) into p.
__device__ void topk_chunk(const float* x, int len, int base, int k, TopkShared& sh, u32* p) {
    const int tid = threadIdx.x;
    for (int j = tid; j < 256; j += blockDim.x) sh.hist[j] = 0;
    __syncthreads();
    float m = NEG_INF, s = 0.0f;
    u32 nan = TOPK_NO_NAN;
    topk_visit(x, len, [&](float v, int i) {
        if (v != v) {
            nan = min(nan, (u32)(base + i));
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
        topk_count(sh.hist, topk_ord(v) >> 24);
    });
    topk_block_stats(m, s, nan, sh);
    if (tid == 0) {
        p[2 * k] = __float_as_uint(m);
        p[2 * k + 1] = __float_as_uint(s);
        p[2 * k + 2] = nan;
    }
    if (nan != TOPK_NO_NAN) return;
    const int kk = min(k, len);
    topk_select(TopkLogits{x, len, base}, kk, true, sh, [&](int rank, u32 key, u32 id) {
        p[rank] = id;
        p[k + rank] = key;
    });
    for (int j = kk + tid; j < k; j += blockDim.x) {
        p[j] = 0xFFFFFFFFu;
        p[k + j] = 0;
    }
}

// Step 2 for the row x of n logits: merges the nc lists at part into o.
__device__ void topk_merge_lists(const float* x, int k, int nc, const u32* part, TopkShared& sh, u32* o) {
    const int tid = threadIdx.x, stride = 2 * k + 3;
    float m = NEG_INF, s = 0.0f;
    u32 nan = TOPK_NO_NAN;
    for (int c = tid; c < nc; c += blockDim.x) {
        const u32* q = part + (size_t)c * stride;
        topk_merge(m, s, __uint_as_float(__ldcg(q + 2 * k)), __uint_as_float(__ldcg(q + 2 * k + 1)));
        nan = min(nan, __ldcg(q + 2 * k + 2));
    }
    topk_block_stats(m, s, nan, sh);
    if (tid == 0) {
        o[2 * k] = __float_as_uint(m);
        o[2 * k + 1] = __float_as_uint(logf(s));
        o[2 * k + 2] = nan;
    }
    if (nan != TOPK_NO_NAN) {
        for (int j = tid; j < k; j += blockDim.x) {
            o[j] = 0;
            o[k + j] = 0x7FC00000u;
        }
        return;
    }
    topk_select(TopkLists{part, nc * k, k, stride}, k, false, sh, [&](int rank, u32, u32 id) {
        o[rank] = id;
        o[k + rank] = __float_as_uint(x[id]);
    });
}

// Grid (chunks, rows): block (c, r) takes logits r·n + c·chunk onwards;
// part holds rows x chunks lists, count one zeroed ticket per row (left
// zeroed).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    topk_rows(const float* logits, int n, int k, int chunk, u32* part, int* count, u32* out) {
    PDL_PROLOGUE;
    __shared__ TopkShared sh;
    const int row = blockIdx.y, c = blockIdx.x, nc = gridDim.x, stride = 2 * k + 3;
    const int i0 = c * chunk;
    const float* x = logits + (size_t)row * n;
    u32* row_part = part + (size_t)row * nc * stride;
    topk_chunk(x + i0, min(chunk, n - i0), i0, k, sh, row_part + (size_t)c * stride);
    if (!last_block(count + row, nc, sh.last)) return;
    topk_merge_lists(x, k, nc, row_part, sh, out + (size_t)row * stride);
}
