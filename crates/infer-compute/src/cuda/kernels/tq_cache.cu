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
//               one warp testing 32 indices at a time, scale |y| /
//               |c[idx]|), in f32 where the CPU sums in f64 (an index may
//               differ where a value lies on a boundary); a head below
//               n_exact is stored exact; every row of the pass is then
//               rounded to f16 in place, as the ring stores it (attention
//               rounds the pass's rows as it reads them);
//   attn_split_tq  split-K attention (attention.cu's blocks and partial
//               sums, merged by attn_combine) reading each row from where
//               tq_cache.cuh says, for a TurboQuant K or V cache or both;
//   tq_unrotate the output of TurboQuant values rotated back (H / sqrt(hd),
//               then the signs over the values' channel scale) and
//               quantized for the output projection;
//   tq_keep     after the attention, the ring takes each token's row, but
//               for a token whose entry a later token of the span takes;
//   tq_ring_copy  the ring entries of one slot holding positions below n
//               copied to another slot, the others emptied (a copy of a
//               slot's first n positions).
// A one-token span (a decode step) runs no tq_centre or tq_keep: the
// encoder does their work for it, in tq_encode or, over two TurboQuant
// caches, inside attn_decode_tq (tq_decode.cu), which replaces the rest.
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

// The cache of a role (v: the V cache; null when it is not a TurboQuant
// one), its rows.
__device__ __forceinline__ u32* tq_role(const TqArgs& a, bool v, float** rows) {
    *rows = v ? a.v : a.k;
    return kv_is_tq(v ? a.vt : a.kt) ? (v ? a.vc : a.kc) : nullptr;
}

// Values i0, i0 + step, ... below i1 of the slot's centre, from the exact
// rows and the rows of the span at p0 (the caller checked that the span
// holds position n_exact - 1).
__device__ __forceinline__ void tq_set_centre(u32* c, const float* rows, int slot, int p0, int i0, int i1, int step) {
    const int n_exact = c[TQ_F_N_EXACT], kv_dim = c[TQ_F_N_KV] * c[TQ_F_HD];
    const float inv = tq_f(c, TQ_F_CENTRE_INV);
    float* centre = (float*)(c + c[TQ_F_CENTRE]) + (size_t)slot * kv_dim;
    for (int i = i0; i < i1; i += step) {
        float s = 0.0f;
        for (int r = c[TQ_F_CENTRE_FROM]; r < n_exact; ++r) {
            if (r >= p0) {
                s += f16_round(rows[(size_t)(r - p0) * kv_dim + i]);
            } else {
                const u32 w = tq_exact_row(c, slot, r)[i / 2];
                s += f16_to_f32((u16)(i % 2 ? w >> 16 : w & 0xFFFFu));
            }
        }
        centre[i] = s * inv;
    }
}

// Grid: (1, 1, 2). Spans of several tokens (tq_encode sets the centre in a
// one-token span).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_centre(const TqArgs a) {
    PDL_PROLOGUE;
    float* rows;
    u32* c = tq_role(a, blockIdx.z == 1, &rows);
    if (!c || !c[TQ_F_HAS_CENTRE]) return;
    const int p0 = *a.pos0, t = (int)c[TQ_F_N_EXACT] - 1 - p0;
    if (t < 0 || t >= a.n_tok) return;
    tq_set_centre(c, rows, a.slot, p0, threadIdx.x, c[TQ_F_N_KV] * c[TQ_F_HD], blockDim.x);
}

// The ring entry of position pos takes head g of its row x (f16 values
// already: exact); thread 0 of head 0 sets the tag.
__device__ __forceinline__ void tq_keep_row(u32* c, int slot, int pos, int g, const float* x) {
    const int w = c[TQ_F_WINDOW], hd = c[TQ_F_HD], kv_dim = c[TQ_F_N_KV] * hd;
    const size_t e = (size_t)slot * w + pos % w;
    u32* ring = c + c[TQ_F_RING] + e * (kv_dim / 2) + g * hd / 2;
    for (int i = threadIdx.x; i < hd / 2; i += blockDim.x)
        ring[i] = (u32)f32_to_f16_sat(x[2 * i]) | ((u32)f32_to_f16_sat(x[2 * i + 1]) << 16);
    if (g == 0 && threadIdx.x == 0) c[c[TQ_F_TAGS] + e] = (u32)pos + 1;
}

// The sweeps of encode_rotated_norm_kept over idx[0..hd] from <y, c[idx]>
// `dc` and |c[idx]|^2 `nn` (centroids `cs`); returns the final |c[idx]|^2.
// Each move depends on the ones before it, so the CPU sweeps one index at
// a time; here one warp tests 32 indices at once against the current
// (dc, nn), takes the first that moves (as the sequential sweep would: the
// ones before it did not) and starts again after it: the same moves and
// the same arithmetic in one step per move or per 32 indices that stay.
// The whole warp calls it.
__device__ float tq_refine(int passes, const float* cs, int bits, const float* y, u8* idx, int hd, float dc, float nn) {
    const int lane = threadIdx.x % WARP, last = (1 << bits) - 1;
    for (int sweep = 0; sweep < passes; ++sweep) {
        bool moved = false;
        for (int i0 = 0; i0 < hd;) {
            const int i = i0 + lane;
            int to = -1;
            float d2 = 0.0f, n2 = 0.0f;
            if (i < hd) {
                const int a = idx[i];
                const float v = y[i], ca = cs[a];
                for (int s = 0; s < 2; ++s) {
                    if ((s == 0 && a == 0) || (s == 1 && a == last)) continue;
                    const int b = s ? a + 1 : a - 1;
                    const float cb = cs[b];
                    d2 = dc + v * (cb - ca);
                    n2 = nn + cb * cb - ca * ca;
                    // cos^2 up, with the dot product positive.
                    if (d2 > 0.0f && d2 * d2 * nn > dc * dc * n2) {
                        to = b;
                        break;
                    }
                }
            }
            const unsigned movers = __ballot_sync(FULL_MASK, to >= 0);
            if (!movers) {
                i0 += WARP;
                continue;
            }
            const int f = __ffs(movers) - 1;
            dc = __shfl_sync(FULL_MASK, d2, f);
            nn = __shfl_sync(FULL_MASK, n2, f);
            if (lane == f) idx[i] = (u8)to;
            __syncwarp();
            moved = true;
            i0 += f + 1;
        }
        if (!moved) break;
    }
    return nn;
}

// Codes head g of token t of the span in the K (v false) or V cache, as
// the top says; round_rows: the span's rows are read again (by attention,
// tq_keep), so they are rounded to f16 in place. The whole block calls it.
__device__ __forceinline__ void tq_encode_head(const TqArgs& a, bool v, int g, int t, bool round_rows) {
    __shared__ float y[TQ_MAX_HD];
    __shared__ u8 idx[TQ_MAX_HD];
    __shared__ float red[32];
    __shared__ float cs[16], bs[16];
    __shared__ u32 scale_bits;
    float* rows;
    u32* c = tq_role(a, v, &rows);
    if (!c) return;
    const int tid = threadIdx.x;
    const int bits = v ? a.vt : a.kt;
    if (tid < 16) {
        cs[tid] = tq_f(c, TQ_F_CENTROIDS + tid);
        bs[tid] = tq_f(c, TQ_F_BOUNDS + tid);
    }
    __syncthreads();
    const int hd = c[TQ_F_HD], kv_dim = c[TQ_F_N_KV] * hd;
    const int pos = *a.pos0 + t;
    float* x = rows + (size_t)t * kv_dim + (size_t)g * hd;
    const int n_exact = c[TQ_F_N_EXACT];
    // The branch is the block's: its barriers stay uniform.
    if (pos < n_exact) {
        // A one-token span sets its head's share of the centre here.
        if (a.n_tok == 1 && pos == n_exact - 1 && c[TQ_F_HAS_CENTRE])
            tq_set_centre(c, rows, a.slot, pos, g * hd + tid, (g + 1) * hd, blockDim.x);
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
            for (int b = 0; b < nb; ++b) k += bs[b] < u ? 1 : 0;
            idx[i] = (u8)k;
            const float cv = cs[k];
            dc += y[i] * cv;
            nn += cv * cv;
        }
        dc = block_sum(dc, red);
        nn = block_sum(nn, red);
        __syncthreads();  // idx and y complete
        if (tid < WARP) {
            const float n2 = tq_refine(c[TQ_F_PASSES], cs, bits, y, idx, hd, dc, nn);
            const float sc = n2 > 0.0f && norm > 0.0f ? norm / sqrtf(n2) : norm;
            if (tid == 0) scale_bits = f32_to_f16(fminf(sc, 65504.0f));
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
    if (round_rows) {
        __syncthreads();  // y read from x before x is rounded
        for (int i = tid; i < hd; i += blockDim.x) x[i] = f16_round(x[i]);
    }
    if (a.n_tok == 1) {
        // One token attends to none of the rows its ring entry drops (they
        // are a window behind it): the ring takes it now, not in tq_keep
        // (f16 values: x rounded as it is stored).
        __syncthreads();
        tq_keep_row(c, a.slot, pos, g, x);
    }
}

// Grid: (n_kv, n_tok, 2).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_encode(const TqArgs a) {
    PDL_PROLOGUE;
    tq_encode_head(a, blockIdx.z == 1, blockIdx.x, blockIdx.y, true);
}

// Grid: (n_kv, n_tok, 2). Spans of several tokens.
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_keep(const TqArgs a) {
    PDL_PROLOGUE;
    float* rows;
    u32* c = tq_role(a, blockIdx.z == 1, &rows);
    if (!c) return;
    const int g = blockIdx.x, t = blockIdx.y;
    if (t + (int)c[TQ_F_WINDOW] < a.n_tok) return;
    const int kv_dim = c[TQ_F_N_KV] * c[TQ_F_HD];
    tq_keep_row(c, a.slot, *a.pos0 + t, g, rows + (size_t)t * kv_dim + (size_t)g * c[TQ_F_HD]);
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

// Where attention reads one cache: a TurboQuant view, or the slot's rows
// of `row` bytes of another type.
struct AttnSrc {
    TqView tq;
    const u8* c;
    const float* rows;  // the pass's rows (TurboQuant)
    int type, row, kv_dim;
};

__device__ __forceinline__ AttnSrc attn_src(const u8* c, int type, int row, int kv_dim, int slot, const float* rows,
                                            float* cent) {
    AttnSrc s;
    s.c = c;
    s.rows = rows;
    s.type = type;
    s.row = row;
    s.kv_dim = kv_dim;
    if (kv_is_tq(type)) s.tq = tq_view((const u32*)c, type, slot, cent);
    return s;
}

// Values d0 .. d0 + 7 of head g of row j (tq_load8's contract; another
// type's row is never coded).
__device__ __forceinline__ bool attn_load8(const AttnSrc& s, int j, int pos, int p0, int g, int hd, int d0, float* x,
                                           float* n) {
    if (kv_is_tq(s.type)) return tq_load8(s.tq, j, pos, p0, s.rows, g, hd, d0, x, n);
    kv_unpack8(kv_load8(s.c + (size_t)j * s.row, s.type, s.kv_dim, g * hd + d0), s.type, x);
    return false;
}

// Stages query heads q[0 .. nh) ([nh][hd]) in sq and their products with
// the keys' centre (kcentre, head g's at g * hd; null: none) in sqc. The
// whole block calls it (it starts after the caller's shared setup); sqc is
// complete after the caller's next barrier.
__device__ __forceinline__ void tq_stage_q(const float* q, int nh, int hd, const float* kcentre, int g, float* sq,
                                           float* sqc) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) sq[i] = q[i];
    __syncthreads();
    if (warp < nh) {
        float d = 0.0f;
        if (kcentre)
            for (int i = lane; i < hd; i += WARP) d += sq[warp * hd + i] * kcentre[g * hd + i];
        d = warp_sum(d);
        if (lane == 0) sqc[warp] = d;
    }
}

// The logits of one position for the nh query heads whose q (this lane's
// eight values each) is in qv, from its values kf (a coded row: the
// centroids c[idx], scale n; sqc the heads' q . centre): n * (q . c[idx])
// + q . centre or q . k, scaled and soft-capped, summed over the L lanes
// that hold the position; with `store`, head hh's goes to out[hh *
// stride]. The whole warp calls it.
template <int GM>
__device__ __forceinline__ void tq_logit8(const AttnArgs& a, const float (&qv)[GM][8], const float* kf, float n,
                                          bool coded, const float* sqc, int nh, int L, bool store, float* out,
                                          int stride) {
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) {
        if (hh < nh) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) d += qv[hh][e] * kf[e];
            for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(FULL_MASK, d, o);
            float l = (coded ? n * d + sqc[hh] : d) * a.scale;
            if (a.softcap > 0.0f) l = a.softcap * tanhf(l * (1.0f / a.softcap));
            if (store) out[hh * stride] = l;
        }
    }
}

// One position's values vf (a coded row: the centroids, scale n) weighted
// by head hh's probability p[hh * stride] into acc[hh], and p into wc[hh]
// for a coded row (its centre is added once, weighted by wc).
template <int GM>
__device__ __forceinline__ void tq_accumulate8(float (&acc)[GM][8], float (&wc)[GM], const float* vf, float n,
                                               bool coded, const float* p, int stride, int nh) {
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) {
        if (hh < nh) {
            const float ph = p[hh * stride];
            const float pn = coded ? ph * n : ph;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[hh][e] += pn * vf[e];
            if (coded) wc[hh] += ph;
        }
    }
}

// The block's sums of the lanes' p . v sums (acc[hh]: values d0 .. d0 + 7
// of head hh, L = hd / 8 lanes a position) and coded weights wc, over the
// warp's position groups (lanes L apart) by shuffles, then over the warps
// in order, into sacc ([nh][hd]) and swc ([nh]), shared; complete at return
// (it ends with a barrier). The whole block calls it.
template <int GM>
__device__ __forceinline__ void tq_block_sums(float (&acc)[GM][8], float (&wc)[GM], int nh, int hd, float* sacc,
                                              float* swc) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    const int L = hd / 8, gi = lane / L, d0 = (lane % L) * 8;
    for (int o = L; o < WARP; o <<= 1) {
#pragma unroll
        for (int hh = 0; hh < GM; ++hh) {
            if (hh < nh) {
                wc[hh] += __shfl_xor_sync(FULL_MASK, wc[hh], o);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[hh][e] += __shfl_xor_sync(FULL_MASK, acc[hh][e], o);
            }
        }
    }
    for (int w = 0; w < n_warps; ++w) {
        if (warp == w && gi == 0) {
#pragma unroll
            for (int hh = 0; hh < GM; ++hh) {
                if (hh < nh) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        float* x = sacc + hh * hd + d0 + e;
                        *x = (w == 0 ? 0.0f : *x) + acc[hh][e];
                    }
                    if (lane == 0) swc[hh] = (w == 0 ? 0.0f : swc[hh]) + wc[hh];
                }
            }
        }
        __syncthreads();
    }
}

// The split's partial softmax-weighted sums (attention.cu's blocks and
// partials) over caches of which one or both are TurboQuant. A position's
// values are read by L = hd / 8 lanes (eight each; hd <= 256), P = 32 / L
// positions per warp at a time; q stays in registers. A coded row's logit
// is n * (q . c[idx]) + q . centre, its values n * c[idx], the centre
// added once at the end weighted by the coded rows' probabilities.
// Shared memory: sq [ATTN_MAX_G][hd], sp [ATTN_MAX_G][ATTN_SPLIT], sacc
// [ATTN_MAX_G][hd], then q . centre and the coded weights [2][ATTN_MAX_G].
// GM: the most query heads per block (b.nh), which sizes the registers
// holding q and the sums: 4 (attn_split_tq, 2 blocks per SM) or
// ATTN_MAX_G (attn_split_tq_g8).
template <int GM>
__device__ __forceinline__ void attn_split_tq_impl(const TqAttnArgs& args, float* tq_smem) {
    __shared__ float cent[2][16];
    const AttnArgs& a = args.at;
    const TqArgs& t = args.tq;
    AttnBlock b;
    if (!attn_block(a, b)) return;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd, kv_dim = a.n_kv * hd;
    const int L = hd / 8, P = WARP / L;
    const int gi = lane / L, d0 = (lane % L) * 8;
    const int g = b.g, nh = b.nh, start = b.start, len = b.len;
    const int p0 = *a.pos0, pos = p0 + b.t;
    const AttnSrc ks = attn_src(a.kc, a.kt, a.k_row, kv_dim, t.slot, t.k, cent[0]);
    const AttnSrc vs = attn_src(a.vc, a.vt, a.v_row, kv_dim, t.slot, t.v, cent[1]);
    float* sq = tq_smem;
    float* sp = sq + ATTN_MAX_G * hd;
    float* sacc = sp + ATTN_MAX_G * ATTN_SPLIT;
    float* sqc = sacc + ATTN_MAX_G * hd;
    float* swc = sqc + ATTN_MAX_G;
    tq_stage_q(a.q + ((size_t)b.t * a.n_head + b.h0) * hd, nh, hd, kv_is_tq(a.kt) ? ks.tq.centre : nullptr, g, sq, sqc);
    // This lane's eight values of each head's q, in registers.
    float qv[GM][8];
#pragma unroll
    for (int hh = 0; hh < GM; ++hh)
#pragma unroll
        for (int e = 0; e < 8; ++e) qv[hh][e] = hh < nh ? sq[hh * hd + d0 + e] : 0.0f;
    __syncthreads();

    // q . k.
    for (int jb = warp * P; jb < len; jb += n_warps * P) {
        const int jj = jb + gi;
        float kf[8], n = 0.0f;
        bool coded = false;
        if (jj < len) {
            coded = attn_load8(ks, start + jj, pos, p0, g, hd, d0, kf, &n);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) kf[e] = 0.0f;
        }
        tq_logit8<GM>(a, qv, kf, n, coded, sqc, nh, L, jj < len && lane % L == 0, sp + jj, ATTN_SPLIT);
    }
    __syncthreads();
    split_softmax(a, b, sp);
    __syncthreads();

    // p . v, then the block's sums.
    float acc[GM][8], wc[GM];
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) {
        wc[hh] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = 0.0f;
    }
    for (int jb = warp * P; jb < len; jb += n_warps * P) {
        const int jj = jb + gi;
        if (jj >= len) continue;
        float vf[8], n = 1.0f;
        const bool coded = attn_load8(vs, start + jj, pos, p0, g, hd, d0, vf, &n);
        tq_accumulate8<GM>(acc, wc, vf, n, coded, sp + jj, ATTN_SPLIT, nh);
    }
    tq_block_sums<GM>(acc, wc, nh, hd, sacc, swc);
    const float* vcentre = kv_is_tq(a.vt) ? vs.tq.centre : nullptr;
    for (int i = tid; i < nh * hd; i += blockDim.x) {
        const int hh = i / hd, d = i % hd;
        const float o = sacc[i] + (vcentre ? swc[hh] * vcentre[g * hd + d] : 0.0f);
        a.part_o[(b.ml_base + (size_t)hh * a.n_split) * hd + d] = o;
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) attn_split_tq(const TqAttnArgs args) {
    PDL_PROLOGUE;
    extern __shared__ float tq_smem[];
    attn_split_tq_impl<4>(args, tq_smem);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_tq_g8(const TqAttnArgs args) {
    PDL_PROLOGUE;
    extern __shared__ float tq_smem[];
    attn_split_tq_impl<ATTN_MAX_G>(args, tq_smem);
}

// Head `row` of the attention output, staged in x (shared), rotated back
// (H / sqrt(hd), then the inverse factors: the signs over the values'
// channel scale), stored and, with a.oq, quantized for the output
// projection. The whole block calls it.
__device__ __forceinline__ void tq_unrotate_head(const AttnArgs& a, float* x, size_t row) {
    const u32* c = (const u32*)a.vc;
    const int hd = a.hd;
    __syncthreads();
    hadamard_smem(x, hd, hd);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = x[d] * tq_mul(c, d, true);
        a.out[row + d] = v;
        if (a.oq) quantize_chunk_warp(v, a.oq + row + (d & ~31), a.ods + (row + d) / 32);
    }
}

// Grid: x = head, y = token; a.oq: quantize the result.
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_unrotate(const TqAttnArgs args) {
    PDL_PROLOGUE;
    __shared__ float x[TQ_MAX_HD];
    const AttnArgs& a = args.at;
    const size_t row = ((size_t)blockIdx.y * a.n_head + blockIdx.x) * a.hd;
    for (int d = threadIdx.x; d < a.hd; d += blockDim.x) x[d] = a.out[row + d];
    tq_unrotate_head(a, x, row);
}
