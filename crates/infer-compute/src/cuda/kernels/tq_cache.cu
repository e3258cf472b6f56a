// The kernels of a pass over layers with a TurboQuant cache (tq_cache.cuh),
// per span (one slot's consecutive positions, token 0 at *pos0), around
// qkv_post, which rotates q, k and v into the caches' bases and leaves the
// k and v rows of the span in place ("the pass's rows"):
//   tq_centre   the token at position n_exact - 1 sets its slot's centre,
//               the mean of the exact rows centre_from .. n_exact (summed
//               in position order, then scaled, as the CPU);
//   tq_encode   each head of a token at n_exact or later is coded less the
//               centre as the CPU's encode_rotated_norm_kept codes it
//               (nearest centroids, then the sweeps that raise the cosine,
//               scale |y| / |c[idx]|), in f32 where the CPU sums in f64 (an
//               index may differ where a value lies on a boundary); a head
//               below n_exact is stored exact; every row of the pass is
//               then rounded to f16 in place, as attention and the ring
//               read it;
//   attn_split_tq  split-K attention (attention.cu's blocks and partial
//               sums, merged by attn_combine) reading each row from where
//               tq_cache.cuh says, for a TurboQuant K or V cache or both;
//   tq_unrotate the output of TurboQuant values rotated back (H / sqrt(hd),
//               then the signs) and quantized for the output projection;
//   tq_keep     after the attention, the ring takes each token's row, but
//               for a token whose entry a later token of the span takes;
//   tq_ring_copy  the ring entries of one slot holding positions below n
//               copied to another slot, the others emptied (a copy of a
//               slot's first n positions).
// Grid z of tq_centre, tq_encode and tq_keep: 0 the K cache, 1 the V cache
// (a cache of another type returns at once).

#define TQ_THREADS 128

// The caches and rows of one span. See turboquant::TqLayout and
// cuda::kernels::TqArgs.
struct TqArgs {
    u32* kc;           // layer buffers (header first), or the slot's cache of another type
    u32* vc;
    float* k;          // the pass's rows [n_tok][kv_dim], rotated by qkv_post
    float* v;
    const int* pos0;   // device: position of token 0
    int kt, vt;        // cache types
    int slot, n_tok;
};
static_assert(sizeof(TqArgs) == 56, "TqArgs layout");

struct TqAttnArgs {
    AttnArgs at;
    TqArgs tq;
};
static_assert(sizeof(TqAttnArgs) == 184, "TqAttnArgs layout");

struct TqCopyArgs {
    u32* c;
    int src, dst, n, pad_;
};
static_assert(sizeof(TqCopyArgs) == 24, "TqCopyArgs layout");

// The cache of grid z (null when it is not a TurboQuant one), its rows.
__device__ __forceinline__ u32* tq_role(const TqArgs& a, float** rows) {
    const bool v = blockIdx.z == 1;
    *rows = v ? a.v : a.k;
    return kv_is_tq(v ? a.vt : a.kt) ? (v ? a.vc : a.kc) : nullptr;
}

// Grid: (1, 1, 2).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_centre(const TqArgs a) {
    PDL_PROLOGUE;
    float* rows;
    u32* c = tq_role(a, &rows);
    if (!c || !c[TQ_F_HAS_CENTRE]) return;
    const int p0 = *a.pos0, n_exact = c[TQ_F_N_EXACT];
    const int t = n_exact - 1 - p0;
    if (t < 0 || t >= a.n_tok) return;
    const int kv_dim = c[TQ_F_N_KV] * c[TQ_F_HD];
    const float inv = tq_f(c, TQ_F_CENTRE_INV);
    float* centre = (float*)(c + c[TQ_F_CENTRE]) + (size_t)a.slot * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        float s = 0.0f;
        for (int r = c[TQ_F_CENTRE_FROM]; r < n_exact; ++r) {
            if (r >= p0) {
                s += f16_round(rows[(size_t)(r - p0) * kv_dim + i]);
            } else {
                const u32 w = tq_exact_row(c, a.slot, r)[i / 2];
                s += f16_to_f32((u16)(i % 2 ? w >> 16 : w & 0xFFFFu));
            }
        }
        centre[i] = s * inv;
    }
}

// The sweeps of encode_rotated_norm_kept over idx[0..hd] (one thread: each
// move depends on the ones before it) from <y, c[idx]> `dc` and |c[idx]|^2
// `nn`; returns the final |c[idx]|^2.
__device__ float tq_refine(const u32* c, int bits, const float* y, u8* idx, int hd, float dc, float nn) {
    const int last = (1 << bits) - 1;
    for (int sweep = 0; sweep < (int)c[TQ_F_PASSES]; ++sweep) {
        bool moved = false;
        for (int i = 0; i < hd; ++i) {
            const int a = idx[i];
            const float v = y[i], ca = tq_f(c, TQ_F_CENTROIDS + a);
            for (int s = 0; s < 2; ++s) {
                if ((s == 0 && a == 0) || (s == 1 && a == last)) continue;
                const int b = s ? a + 1 : a - 1;
                const float cb = tq_f(c, TQ_F_CENTROIDS + b);
                const float d2 = dc + v * (cb - ca);
                const float n2 = nn + cb * cb - ca * ca;
                // cos^2 up, with the dot product positive.
                if (d2 > 0.0f && d2 * d2 * nn > dc * dc * n2) {
                    idx[i] = (u8)b;
                    dc = d2;
                    nn = n2;
                    moved = true;
                    break;
                }
            }
        }
        if (!moved) break;
    }
    return nn;
}

// Grid: (n_kv, n_tok, 2).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_encode(const TqArgs a) {
    PDL_PROLOGUE;
    __shared__ float y[TQ_MAX_HD];
    __shared__ u8 idx[TQ_MAX_HD];
    __shared__ float red[32];
    __shared__ u32 scale_bits;
    float* rows;
    u32* c = tq_role(a, &rows);
    if (!c) return;
    const int g = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int bits = blockIdx.z ? a.vt : a.kt;
    const int hd = c[TQ_F_HD], kv_dim = c[TQ_F_N_KV] * hd;
    const int pos = *a.pos0 + t;
    float* x = rows + (size_t)t * kv_dim + (size_t)g * hd;
    const int n_exact = c[TQ_F_N_EXACT];
    // The branch is the block's: its barriers stay uniform.
    if (pos < n_exact) {
        u32* e = (u32*)tq_exact_row(c, a.slot, pos) + g * hd / 2;
        for (int i = tid; i < hd / 2; i += blockDim.x)
            e[i] = (u32)f32_to_f16_sat(x[2 * i]) | ((u32)f32_to_f16_sat(x[2 * i + 1]) << 16);
    } else {
        const float* centre = tq_centre_row(c, a.slot);
        float ss = 0.0f;
        for (int i = tid; i < hd; i += blockDim.x) {
            const float v = x[i] - (centre ? centre[g * hd + i] : 0.0f);
            y[i] = v;
            ss += v * v;
        }
        const float norm = sqrtf(block_sum(ss, red));
        const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
        const int nb = (1 << bits) - 1;
        float dc = 0.0f, nn = 0.0f;
        for (int i = tid; i < hd; i += blockDim.x) {
            const float u = y[i] * inv;
            int k = 0;
            for (int b = 0; b < nb; ++b) k += tq_f(c, TQ_F_BOUNDS + b) < u ? 1 : 0;
            idx[i] = (u8)k;
            const float cv = tq_f(c, TQ_F_CENTROIDS + k);
            dc += y[i] * cv;
            nn += cv * cv;
        }
        dc = block_sum(dc, red);
        nn = block_sum(nn, red);
        __syncthreads();  // idx and y complete
        if (tid == 0) {
            const float n2 = tq_refine(c, bits, y, idx, hd, dc, nn);
            const float sc = n2 > 0.0f && norm > 0.0f ? norm / sqrtf(n2) : norm;
            scale_bits = f32_to_f16(fminf(sc, 65504.0f));
        }
        __syncthreads();
        const int hw = c[TQ_F_HEAD_WORDS];
        u32* code = c + c[TQ_F_CODES] + ((size_t)a.slot * c[TQ_F_N_CTX] + pos) * c[TQ_F_ROW_WORDS] + (size_t)g * hw;
        if (tid == 0) code[0] = scale_bits;
        // Word w of the index stream: bits 32w .. 32w + 31, index i at bits
        // i * bits, least significant first.
        for (int w = tid; w + 1 < hw; w += blockDim.x) {
            u32 word = 0;
            const int end = min(hd, (32 * w + 32 + bits - 1) / bits);
            for (int i = 32 * w / bits; i < end; ++i) {
                const int bit = i * bits;
                word |= bit >= 32 * w ? (u32)idx[i] << (bit - 32 * w) : (u32)idx[i] >> (32 * w - bit);
            }
            code[1 + w] = word;
        }
    }
    __syncthreads();  // y read from x before x is rounded
    for (int i = tid; i < hd; i += blockDim.x) x[i] = f16_round(x[i]);
}

// Grid: (n_kv, n_tok, 2).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_keep(const TqArgs a) {
    PDL_PROLOGUE;
    float* rows;
    u32* c = tq_role(a, &rows);
    if (!c) return;
    const int g = blockIdx.x, t = blockIdx.y;
    const int w = c[TQ_F_WINDOW];
    if (t + w < a.n_tok) return;
    const int pos = *a.pos0 + t;
    const int hd = c[TQ_F_HD], kv_dim = c[TQ_F_N_KV] * hd;
    const size_t e = (size_t)a.slot * w + pos % w;
    u32* ring = c + c[TQ_F_RING] + e * (kv_dim / 2) + g * hd / 2;
    const float* x = rows + (size_t)t * kv_dim + (size_t)g * hd;
    // The rows are f16 values already (tq_encode): exact.
    for (int i = threadIdx.x; i < hd / 2; i += blockDim.x)
        ring[i] = (u32)f32_to_f16_sat(x[2 * i]) | ((u32)f32_to_f16_sat(x[2 * i + 1]) << 16);
    if (g == 0 && threadIdx.x == 0) c[c[TQ_F_TAGS] + e] = (u32)pos + 1;
}

// Grid: (window).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_ring_copy(const TqCopyArgs a) {
    PDL_PROLOGUE;
    u32* c = a.c;
    const int i = blockIdx.x, w = c[TQ_F_WINDOW];
    const size_t half = (size_t)c[TQ_F_N_KV] * c[TQ_F_HD] / 2;
    u32* tags = c + c[TQ_F_TAGS];
    const u32 tag = tags[(size_t)a.src * w + i];
    const bool kept = tag != 0 && (int)(tag - 1) < a.n;
    if (kept) {
        const u32* from = c + c[TQ_F_RING] + ((size_t)a.src * w + i) * half;
        u32* to = c + c[TQ_F_RING] + ((size_t)a.dst * w + i) * half;
        for (size_t k = threadIdx.x; k < half; k += blockDim.x) to[k] = from[k];
    }
    if (threadIdx.x == 0) tags[(size_t)a.dst * w + i] = kept ? tag : 0;
}

// Values d0 .. d0 + 7 of head g of row j of a cache of type `type` (c: the
// layer's TurboQuant buffer, or the slot's rows of `row` bytes), as the
// query at pos of the span reads it.
__device__ __forceinline__ void tq_attn_load8(const TqArgs& t, bool v, const u8* c, int type, int row, int kv_dim,
                                              int j, int pos, int p0, int g, int hd, int d0, float* x) {
    if (kv_is_tq(type)) {
        tq_load8((const u32*)c, type, t.slot, j, pos, p0, v ? t.v : t.k, g, d0, x);
        return;
    }
    kv_unpack8(kv_load8(c + (size_t)j * row, type, kv_dim, g * hd + d0), type, x);
}

// Shared memory: sq [ATTN_MAX_G][hd], sp [ATTN_MAX_G][ATTN_SPLIT], then
// the p . v reduction [ATTN_MAX_G][hd].
extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_tq(const TqAttnArgs args) {
    PDL_PROLOGUE;
    extern __shared__ float tq_smem[];
    const AttnArgs& a = args.at;
    const TqArgs& tq = args.tq;
    AttnBlock b;
    if (!attn_block(a, b)) return;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd, kv_dim = a.n_kv * hd, nc = hd / 8;
    const int g = b.g, nh = b.nh, start = b.start, len = b.len;
    const int p0 = *a.pos0, pos = p0 + b.t;
    float* sq = tq_smem;
    float* sp = sq + ATTN_MAX_G * hd;
    float* sacc = sp + ATTN_MAX_G * ATTN_SPLIT;
    const float* q = a.q + ((size_t)b.t * a.n_head + b.h0) * hd;
    for (int i = tid; i < nh * hd; i += blockDim.x) sq[i] = q[i];
    for (int i = tid; i < nh * hd; i += blockDim.x) sacc[i] = 0.0f;
    __syncthreads();

    // q . k: a warp per position, lanes over chunks of eight values.
    for (int jj = warp; jj < len; jj += n_warps) {
        float dots[ATTN_MAX_G];
#pragma unroll
        for (int hh = 0; hh < ATTN_MAX_G; ++hh) dots[hh] = 0.0f;
        for (int ch = lane; ch < nc; ch += WARP) {
            float kf[8];
            tq_attn_load8(tq, false, a.kc, a.kt, a.k_row, kv_dim, start + jj, pos, p0, g, hd, ch * 8, kf);
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
                if (hh < nh) {
                    const float* qh = sq + hh * hd + ch * 8;
#pragma unroll
                    for (int e = 0; e < 8; ++e) dots[hh] += qh[e] * kf[e];
                }
            }
        }
#pragma unroll
        for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
            if (hh < nh) {
                float l = warp_sum(dots[hh]) * a.scale;
                if (a.softcap > 0.0f) l = a.softcap * tanhf(l * (1.0f / a.softcap));
                if (lane == 0) sp[hh * ATTN_SPLIT + jj] = l;
            }
        }
    }
    __syncthreads();

    if (warp < nh) {
        float* row = sp + warp * ATTN_SPLIT;
        float m = NEG_INF;
        for (int j = lane; j < len; j += WARP) m = fmaxf(m, row[j]);
        m = warp_max(m);
        float sum = 0.0f;
        for (int j = lane; j < len; j += WARP) {
            const float e = expf(row[j] - m);
            row[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) a.part_ml[b.ml_base + (size_t)warp * a.n_split] = make_float2(m, sum);
    }
    __syncthreads();

    // p . v: thread (group r, chunk ch) over positions r, r + n_grp, ...
    // (nc <= TQ_MAX_HD / 8 = 128: at least two groups); the groups' sums
    // are added into sacc one group at a time, a fixed order.
    const int n_grp = min(ATTN_SPLIT, (int)blockDim.x / nc);
    const int grp = tid / nc, ch = tid % nc;
    float acc[ATTN_MAX_G][8];
#pragma unroll
    for (int hh = 0; hh < ATTN_MAX_G; ++hh)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = 0.0f;
    if (grp < n_grp) {
        for (int jj = grp; jj < len; jj += n_grp) {
            float vf[8];
            tq_attn_load8(tq, true, a.vc, a.vt, a.v_row, kv_dim, start + jj, pos, p0, g, hd, ch * 8, vf);
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh) {
                if (hh < nh) {
                    const float p = sp[hh * ATTN_SPLIT + jj];
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[hh][e] += p * vf[e];
                }
            }
        }
    }
    for (int r = 0; r < n_grp; ++r) {
        if (grp == r) {
#pragma unroll
            for (int hh = 0; hh < ATTN_MAX_G; ++hh)
                if (hh < nh)
#pragma unroll
                    for (int e = 0; e < 8; ++e) sacc[hh * hd + ch * 8 + e] += acc[hh][e];
        }
        __syncthreads();
    }
    for (int i = tid; i < nh * hd; i += blockDim.x)
        a.part_o[(b.ml_base + (size_t)(i / hd) * a.n_split) * hd + i % hd] = sacc[i];
}

// Grid: x = head, y = token; a.oq: quantize the result.
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_unrotate(const TqAttnArgs args) {
    PDL_PROLOGUE;
    __shared__ float x[TQ_MAX_HD];
    const AttnArgs& a = args.at;
    const u32* c = (const u32*)a.vc;
    const int hd = a.hd;
    const size_t row = ((size_t)blockIdx.y * a.n_head + blockIdx.x) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = a.out[row + d];
    __syncthreads();
    hadamard_smem(x, hd, hd);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = x[d] * tq_mul(c, d, false);
        a.out[row + d] = v;
        if (a.oq) quantize_chunk_warp(v, a.oq + row + (d & ~31), a.ods + (row + d) / 32);
    }
}
