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
//               rounded to f16 in place, as attention and the ring read it;
//   attn_split_tq  split-K attention (attention.cu's blocks and partial
//               sums, merged by attn_combine) reading each row from where
//               tq_cache.cuh says, for a TurboQuant K or V cache or both;
//   attn_decode_tq, tq_combine  the same for one token over two TurboQuant
//               caches, in longer blocks, the merge rotating back as
//               tq_unrotate;
//   tq_unrotate the output of TurboQuant values rotated back (H / sqrt(hd),
//               then the signs) and quantized for the output projection;
//   tq_keep     after the attention, the ring takes each token's row, but
//               for a token whose entry a later token of the span takes;
//   tq_ring_copy  the ring entries of one slot holding positions below n
//               copied to another slot, the others emptied (a copy of a
//               slot's first n positions).
// A one-token span (a decode step) runs no tq_centre or tq_keep: tq_encode
// does their work for it, four launches a layer in all (qkv_post,
// tq_encode, attn_decode_tq, tq_combine).
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
    u32* c = tq_role(a, &rows);
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

// Grid: (n_kv, n_tok, 2).
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_encode(const TqArgs a) {
    PDL_PROLOGUE;
    __shared__ float y[TQ_MAX_HD];
    __shared__ u8 idx[TQ_MAX_HD];
    __shared__ float red[32];
    __shared__ float cs[16], bs[16];
    __shared__ u32 scale_bits;
    float* rows;
    u32* c = tq_role(a, &rows);
    if (!c) return;
    const int g = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int bits = blockIdx.z ? a.vt : a.kt;
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
    __syncthreads();  // y read from x before x is rounded
    for (int i = tid; i < hd; i += blockDim.x) x[i] = f16_round(x[i]);
    if (a.n_tok == 1) {
        // One token attends to none of the rows its ring entry drops (they
        // are a window behind it): the ring takes it now, not in tq_keep.
        __syncthreads();
        tq_keep_row(c, a.slot, pos, g, x);
    }
}

// Grid: (n_kv, n_tok, 2). Spans of several tokens.
extern "C" __global__ void __launch_bounds__(TQ_THREADS) tq_keep(const TqArgs a) {
    PDL_PROLOGUE;
    float* rows;
    u32* c = tq_role(a, &rows);
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
#pragma unroll
        for (int hh = 0; hh < GM; ++hh) {
            if (hh < nh) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d += qv[hh][e] * kf[e];
                for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(FULL_MASK, d, o);
                float l = (coded ? n * d + sqc[hh] : d) * a.scale;
                if (a.softcap > 0.0f) l = a.softcap * tanhf(l * (1.0f / a.softcap));
                if (jj < len && lane % L == 0) sp[hh * ATTN_SPLIT + jj] = l;
            }
        }
    }
    __syncthreads();
    split_softmax(a, b, sp);
    __syncthreads();

    // p . v, then the sums of the warp's position groups (lanes L apart),
    // then of the warps, in a fixed order.
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
#pragma unroll
        for (int hh = 0; hh < GM; ++hh) {
            if (hh < nh) {
                const float p = sp[hh * ATTN_SPLIT + jj];
                const float pn = coded ? p * n : p;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[hh][e] += pn * vf[e];
                if (coded) wc[hh] += p;
            }
        }
    }
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

// One-token decode over TurboQuant K and V caches: block (kv head chunk,
// b) takes TQ_DECODE_SPLITS splits (256 positions) and keeps, per lane
// group of a position (attn_split_tq's lanes), a running max, sum and
// weighted values (online softmax, both caches read in one pass), merged
// over the warp's groups by shuffles and over the warps through shared
// memory in a fixed order; its partial goes to split slot b of part_ml and
// part_o (tq_combine merges the blocks). Fewer, longer blocks than
// attn_split_tq's one split each: a decode step deep in the cache runs
// 16 times fewer blocks, each streaming its codes.
#define TQ_DECODE_SPLITS 8
// Rounds of positions whose codes a lane fetches before using them.
#ifndef TQ_DECODE_ROUNDS
#define TQ_DECODE_ROUNDS 2
#endif

// (m, s, acc, wc) <- the merge of it with (m2, s2, acc2, wc2): partial
// sums relative to their maxima, -inf for none.
__device__ __forceinline__ void tq_merge(float& m, float& s, float* acc, float& wc, float m2, float s2,
                                         const float* acc2, float wc2) {
    const float mx = fmaxf(m, m2);
    const float a = m == NEG_INF ? 0.0f : expf(m - mx), c = m2 == NEG_INF ? 0.0f : expf(m2 - mx);
    s = s * a + s2 * c;
    wc = wc * a + wc2 * c;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = acc[e] * a + acc2[e] * c;
    m = mx;
}

// Values d0 .. d0 + 7 of row j for the one-token query at pos (rows: its
// pass's rows): from the code fetched ahead (r) when `fetched`, else as
// tq_load8 reads them, zeros for a row past the block's range (!in).
__device__ __forceinline__ bool tq_read8(const TqView& v, bool fetched, const TqRaw& r, bool in, int j, int pos,
                                         const float* rows, int g, int hd, int d0, float* x, float* n) {
    if (fetched) {
        tq_unpack(v, r, x, n);
        return true;
    }
    if (in) return tq_load8(v, j, pos, pos, rows, g, hd, d0, x, n);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = 0.0f;
    return false;
}

template <int GM>
__device__ __forceinline__ void attn_decode_tq_impl(const TqAttnArgs& args, float* smem) {
    __shared__ float cent[2][16];
    const AttnArgs& a = args.at;
    const TqArgs& t = args.tq;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd;
    const int L = hd / 8, P = WARP / L;
    const int gi = lane / L, d0 = (lane % L) * 8;
    const int G = a.n_head / a.n_kv, n_gc = (G + ATTN_MAX_G - 1) / ATTN_MAX_G;
    const int g = blockIdx.x / n_gc, gc = blockIdx.x % n_gc;
    const int h0 = g * G + gc * ATTN_MAX_G, nh = min(ATTN_MAX_G, G - gc * ATTN_MAX_G);
    const int n_blk = (a.n_split + TQ_DECODE_SPLITS - 1) / TQ_DECODE_SPLITS, blk = blockIdx.y;
    const int pos = *a.pos0;
    const int start = attn_first(a, pos) + blk * TQ_DECODE_SPLITS * ATTN_SPLIT;
    const int len = min(TQ_DECODE_SPLITS * ATTN_SPLIT, pos + 1 - start);
    if (len <= 0) return;  // past the attended range: tq_combine reads no further
    const size_t ml_base = (size_t)h0 * n_blk + blk;
    const TqView kv = tq_view((const u32*)a.kc, a.kt, t.slot, cent[0]);
    const TqView vv = tq_view((const u32*)a.vc, a.vt, t.slot, cent[1]);
    float* sq = smem;                     // [nh][hd]
    float* sacc = sq + ATTN_MAX_G * hd;   // [nh][hd]
    float* sqc = sacc + ATTN_MAX_G * hd;  // [nh]
    float* sms = sqc + ATTN_MAX_G;        // [nh][3]: m, s, wc
    tq_stage_q(a.q + (size_t)h0 * hd, nh, hd, kv.centre, g, sq, sqc);
    __syncthreads();
    float qc[GM];
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) qc[hh] = hh < nh ? sqc[hh] : 0.0f;

    float m[GM], s[GM], wc[GM], acc[GM][8];
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) {
        m[hh] = NEG_INF;
        s[hh] = wc[hh] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = 0.0f;
    }
    // Two rounds of positions at a time, the codes of both fetched before
    // either is used (more loads in flight; each lane group still takes its
    // positions in the same order).
    const int step = n_warps * P;
    for (int jb = warp * P; jb < len; jb += TQ_DECODE_ROUNDS * step) {
        bool fk[TQ_DECODE_ROUNDS], fv[TQ_DECODE_ROUNDS];
        TqRaw kr[TQ_DECODE_ROUNDS], vr[TQ_DECODE_ROUNDS];
#pragma unroll
        for (int u = 0; u < TQ_DECODE_ROUNDS; ++u) {
            const int jj = jb + u * step + gi, j = start + jj;
            fk[u] = jj < len && tq_coded(kv, j, pos);
            fv[u] = jj < len && tq_coded(vv, j, pos);
            if (fk[u]) kr[u] = tq_fetch(kv, j, g, d0);
            if (fv[u]) vr[u] = tq_fetch(vv, j, g, d0);
        }
#pragma unroll
        for (int u = 0; u < TQ_DECODE_ROUNDS; ++u) {
            const int jj = jb + u * step + gi;
            const bool in = jj < len;
            float kf[8], vf[8], nk = 0.0f, nv = 1.0f;
            const bool kc = tq_read8(kv, fk[u], kr[u], in, start + jj, pos, t.k, g, hd, d0, kf, &nk);
            const bool vc = tq_read8(vv, fv[u], vr[u], in, start + jj, pos, t.v, g, hd, d0, vf, &nv);
#pragma unroll
            for (int hh = 0; hh < GM; ++hh) {
                if (hh < nh) {
                    // q from shared memory: registers for the fetched codes.
                    const float4 q0 = *(const float4*)(sq + hh * hd + d0), q1 = *(const float4*)(sq + hh * hd + d0 + 4);
                    float d = q0.x * kf[0] + q0.y * kf[1] + q0.z * kf[2] + q0.w * kf[3];
                    d += q1.x * kf[4] + q1.y * kf[5] + q1.z * kf[6] + q1.w * kf[7];
                    for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(FULL_MASK, d, o);
                    if (in) {
                        float l = (kc ? nk * d + qc[hh] : d) * a.scale;
                        if (a.softcap > 0.0f) l = a.softcap * tanhf(l * (1.0f / a.softcap));
                        const float mx = fmaxf(m[hh], l);
                        const float c = m[hh] == NEG_INF ? 0.0f : expf(m[hh] - mx), p = expf(l - mx);
                        const float pn = vc ? p * nv : p;
                        s[hh] = s[hh] * c + p;
                        wc[hh] = wc[hh] * c + (vc ? p : 0.0f);
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[hh][e] = acc[hh][e] * c + pn * vf[e];
                        m[hh] = mx;
                    }
                }
            }
        }
    }
    // The warp's position groups (lanes L apart), then the warps in order.
    for (int o = L; o < WARP; o <<= 1) {
#pragma unroll
        for (int hh = 0; hh < GM; ++hh) {
            if (hh < nh) {
                const float m2 = __shfl_xor_sync(FULL_MASK, m[hh], o), s2 = __shfl_xor_sync(FULL_MASK, s[hh], o);
                const float w2 = __shfl_xor_sync(FULL_MASK, wc[hh], o);
                float a2[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) a2[e] = __shfl_xor_sync(FULL_MASK, acc[hh][e], o);
                tq_merge(m[hh], s[hh], acc[hh], wc[hh], m2, s2, a2, w2);
            }
        }
    }
    for (int w = 0; w < n_warps; ++w) {
        if (warp == w) {
#pragma unroll
            for (int hh = 0; hh < GM; ++hh) {
                if (hh < nh && gi == 0) {
                    float* x = sacc + hh * hd + d0;
                    float* ms = sms + hh * 3;
                    if (w == 0) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) x[e] = acc[hh][e];
                    } else {
                        float mm = ms[0], ss = ms[1], ww = ms[2], xs[8];
#pragma unroll
                        for (int e = 0; e < 8; ++e) xs[e] = x[e];
                        tq_merge(mm, ss, xs, ww, m[hh], s[hh], acc[hh], wc[hh]);
#pragma unroll
                        for (int e = 0; e < 8; ++e) x[e] = xs[e];
                        m[hh] = mm;
                        s[hh] = ss;
                        wc[hh] = ww;
                    }
                }
            }
            __syncwarp();  // every lane read ms before lane 0 writes it
            if (lane == 0) {
#pragma unroll
                for (int hh = 0; hh < GM; ++hh) {
                    if (hh < nh) {
                        sms[hh * 3] = m[hh];
                        sms[hh * 3 + 1] = s[hh];
                        sms[hh * 3 + 2] = wc[hh];
                    }
                }
            }
        }
        __syncthreads();
    }
    for (int i = tid; i < nh * hd; i += blockDim.x) {
        const int hh = i / hd, d = i % hd;
        const float o = sacc[i] + (vv.centre ? sms[hh * 3 + 2] * vv.centre[g * hd + d] : 0.0f);
        a.part_o[(ml_base + (size_t)hh * n_blk) * hd + d] = o;
    }
    if (tid < nh) a.part_ml[ml_base + (size_t)tid * n_blk] = make_float2(sms[tid * 3], sms[tid * 3 + 1]);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) attn_decode_tq(const TqAttnArgs args) {
    PDL_PROLOGUE;
    extern __shared__ __align__(16) float tq_smem[];  // float4 reads of q
    attn_decode_tq_impl<4>(args, tq_smem);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_decode_tq_g8(const TqAttnArgs args) {
    PDL_PROLOGUE;
    extern __shared__ __align__(16) float tq_smem[];  // float4 reads of q
    attn_decode_tq_impl<ATTN_MAX_G>(args, tq_smem);
}

// Head `row` of the attention output, staged in x (shared), rotated back
// (H / sqrt(hd), then the factors), stored and, with a.oq, quantized for
// the output projection. The whole block calls it.
__device__ __forceinline__ void tq_unrotate_head(const AttnArgs& a, float* x, size_t row) {
    const u32* c = (const u32*)a.vc;
    const int hd = a.hd;
    __syncthreads();
    hadamard_smem(x, hd, hd);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        const float v = x[d] * tq_mul(c, d, false);
        a.out[row + d] = v;
        if (a.oq) quantize_chunk_warp(v, a.oq + row + (d & ~31), a.ods + (row + d) / 32);
    }
}

// Merges attn_decode_tq's blocks of one token (attn_combine's arithmetic,
// over blocks of TQ_DECODE_SPLITS splits), then rotates the head back as
// tq_unrotate. Grid: x = head.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) tq_combine(const TqAttnArgs args) {
    PDL_PROLOGUE;
    __shared__ float x[TQ_MAX_HD];
    const AttnArgs& a = args.at;
    const int h = blockIdx.x, hd = a.hd;
    const int n_blk = (a.n_split + TQ_DECODE_SPLITS - 1) / TQ_DECODE_SPLITS;
    const size_t base = (size_t)h * n_blk;
    const float2* ml = a.part_ml + base;
    const int pos = *a.pos0;
    const int n_active = min(n_blk, (pos - attn_first(a, pos)) / (TQ_DECODE_SPLITS * ATTN_SPLIT) + 1);
    float m = NEG_INF;
    for (int b = 0; b < n_active; ++b) m = fmaxf(m, ml[b].x);
    float total = 0.0f;
    for (int b = 0; b < n_active; ++b) total += expf(ml[b].x - m) * ml[b].y;
    const float inv = 1.0f / total;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < n_active; ++b) acc += expf(ml[b].x - m) * a.part_o[(base + b) * hd + d];
        x[d] = acc * inv;
    }
    tq_unrotate_head(a, x, (size_t)h * hd);
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
