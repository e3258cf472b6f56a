// A decode step (one token) over TurboQuant K and V caches in one launch
// after qkv_post: the coding of the token's k and v rows, the attention and
// the merge of its blocks, which the split path does in four (tq_encode,
// attn_split_tq, attn_combine, tq_unrotate).
//
// Grid (n_kv * n_gc, 2 + n_blk), ATTN_THREADS threads:
//   y = 0, 1   tq_encode_head of kv head g's row in the K (0) or V (1)
//              cache (chunk gc = 0 only). Nothing this step's attention
//              reads depends on it: the token's own row is read from the
//              pass's rows (rounded as read), the code it writes is read
//              once the row has left the window, its ring entry drops a
//              row the token does not attend to in the ring, and the
//              centre it may set is weighted by coded rows only, of which
//              a token that sets the centre has none.
//   y = 2 + b  attention over positions [first + 256 b, first + 256 (b + 1))
//              of the attended range (blocks past it exit), in two phases
//              instead of an online softmax: every logit of the block into
//              shared memory, one max and one exp per logit, then p . v.
//              A position's values are read by L = hd / 8 lanes (eight
//              each), P = 32 / L positions per warp at a time, the codes of
//              TQ_DECODE_AHEAD rounds fetched before use. A coded row's
//              logit is n * (q . c[idx]) + q . centre, its values
//              n * c[idx], the centre added once weighted by the coded
//              rows' probabilities. The last attention block of (g, gc) to
//              finish (ticket on count[g * n_gc + gc], re-armed) merges the
//              blocks (attn_combine's arithmetic) and rotates the heads
//              back (tq_unrotate); a lone block does so at once.

#define TQ_SPAN (TQ_DECODE_SPLITS * ATTN_SPLIT)
#define TQ_DECODE_SPLITS 8
// Rounds of positions whose codes a lane fetches before using them.
#ifndef TQ_DECODE_AHEAD
#define TQ_DECODE_AHEAD 2
#endif

struct TqDecodeArgs {
    AttnArgs at;
    TqArgs tq;
    int* count;  // [n_kv * n_gc] finished blocks, zero between launches
};
static_assert(sizeof(TqDecodeArgs) == 192, "TqDecodeArgs layout");

// The blocks of (g, gc) with positions: the attended range in spans of
// TQ_SPAN.
__device__ __forceinline__ int tq_decode_blocks(const AttnArgs& a, int pos) {
    const int n_blk = (a.n_split + TQ_DECODE_SPLITS - 1) / TQ_DECODE_SPLITS;
    return min(n_blk, (pos - attn_first(a, pos)) / TQ_SPAN + 1);
}

// The codes of values d0 .. d0 + 7 of head g at positions start + jj,
// jj = j0, j0 + step, ... (TQ_DECODE_AHEAD of them) where they are read
// from their code (f[u]), all loads issued before any is used.
__device__ __forceinline__ void tq_fetch_ahead(const TqView& v, int start, int j0, int step, int len, int pos, int g,
                                               int d0, bool (&f)[TQ_DECODE_AHEAD], TqRaw (&r)[TQ_DECODE_AHEAD]) {
#pragma unroll
    for (int u = 0; u < TQ_DECODE_AHEAD; ++u) {
        const int jj = j0 + u * step;
        f[u] = jj < len && tq_coded(v, start + jj, pos);
        if (f[u]) r[u] = tq_fetch(v, start + jj, g, d0);
    }
}

// Phase 1: the logits of positions [start, start + len) for the nh query
// heads whose q (lane's eight values each) is in qv, into sl
// ([GM][TQ_SPAN]).
template <int GM>
__device__ __forceinline__ void tq_logits(const AttnArgs& a, const TqView& kv, const float* rows, float (&qv)[GM][8],
                                          const float* sqc, int nh, int g, int start, int len, int pos, float* sl) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd, L = hd / 8, P = WARP / L, gi = lane / L, d0 = (lane % L) * 8;
    const int step = n_warps * P;
    for (int jb = warp * P; jb < len; jb += TQ_DECODE_AHEAD * step) {
        bool fk[TQ_DECODE_AHEAD];
        TqRaw kr[TQ_DECODE_AHEAD];
        tq_fetch_ahead(kv, start, jb + gi, step, len, pos, g, d0, fk, kr);
#pragma unroll
        for (int u = 0; u < TQ_DECODE_AHEAD; ++u) {
            const int jj = jb + u * step + gi;
            if (jb + u * step >= len) break;  // the warp's rounds are done
            const bool in = jj < len;
            float kf[8], n = 0.0f;
            bool coded = fk[u];
            if (coded) {
                tq_unpack(kv, kr[u], kf, &n);
            } else if (in) {
                coded = tq_load8(kv, start + jj, pos, pos, rows, g, hd, d0, kf, &n);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) kf[e] = 0.0f;
            }
            tq_logit8<GM>(a, qv, kf, n, coded, sqc, nh, L, in && lane % L == 0, sl + jj, TQ_SPAN);
        }
    }
}

// Phase 2: the lane's sums of p . v over its positions (sl holding the
// probabilities), acc[hh] its eight values, wc[hh] the probabilities of
// the coded rows.
template <int GM>
__device__ __forceinline__ void tq_values(const AttnArgs& a, const TqView& vv, const float* rows, const float* sl,
                                          int nh, int g, int start, int len, int pos, float (&acc)[GM][8],
                                          float (&wc)[GM]) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd, L = hd / 8, P = WARP / L, gi = lane / L, d0 = (lane % L) * 8;
    const int step = n_warps * P;
    for (int jb = warp * P; jb < len; jb += TQ_DECODE_AHEAD * step) {
        bool fv[TQ_DECODE_AHEAD];
        TqRaw vr[TQ_DECODE_AHEAD];
        tq_fetch_ahead(vv, start, jb + gi, step, len, pos, g, d0, fv, vr);
#pragma unroll
        for (int u = 0; u < TQ_DECODE_AHEAD; ++u) {
            const int jj = jb + u * step + gi;
            if (jj >= len) continue;
            float vf[8], n = 1.0f;
            bool coded = fv[u];
            if (coded) tq_unpack(vv, vr[u], vf, &n);
            else coded = tq_load8(vv, start + jj, pos, pos, rows, g, hd, d0, vf, &n);
            tq_accumulate8<GM>(acc, wc, vf, n, coded, sl + jj, TQ_SPAN, nh);
        }
    }
}

// The merge of the n blocks' partial sums of heads h0 .. h0 + nh into x
// ([nh][hd], shared; attn_combine's arithmetic). The whole block calls it.
__device__ __forceinline__ void tq_merge_blocks(const AttnArgs& a, int h0, int nh, int n, float* x, float2* mt) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP, hd = a.hd;
    const int n_blk = (a.n_split + TQ_DECODE_SPLITS - 1) / TQ_DECODE_SPLITS;
    for (int hh = warp; hh < nh; hh += n_warps) {
        const float2* ml = a.part_ml + (size_t)(h0 + hh) * n_blk;
        float m = NEG_INF;
        for (int b = lane; b < n; b += WARP) m = fmaxf(m, __ldcg(&ml[b]).x);
        m = warp_max(m);
        float total = 0.0f;
        for (int b = lane; b < n; b += WARP) {
            const float2 v = __ldcg(&ml[b]);
            total += expf(v.x - m) * v.y;
        }
        total = warp_sum(total);
        if (lane == 0) mt[hh] = make_float2(m, 1.0f / total);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) {
        const int hh = i / hd, d = i % hd;
        const size_t base = (size_t)(h0 + hh) * n_blk;
        const float2* ml = a.part_ml + base;
        float o = 0.0f;
        for (int b = 0; b < n; ++b) o += expf(__ldcg(&ml[b]).x - mt[hh].x) * __ldcg(&a.part_o[(base + b) * hd + d]);
        x[i] = o * mt[hh].y;
    }
}

// Heads h0 .. h0 + nh of the output, staged in x ([nh][hd], shared),
// rotated back (H / sqrt(hd), then the inverse factors: the signs over the
// values' channel scale), stored and, with a.oq, quantized for the output
// projection (tq_unrotate_head for several heads). The whole block calls it.
__device__ __forceinline__ void tq_unrotate_heads(const AttnArgs& a, int h0, int nh, float* x) {
    const u32* c = (const u32*)a.vc;
    const int hd = a.hd;
    __syncthreads();
    hadamard_smem(x, nh * hd, hd);
    for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) {
        const float v = x[i] * tq_mul(c, i % hd, true);
        const size_t row = (size_t)h0 * hd + i;
        a.out[row] = v;
        if (a.oq) quantize_chunk_warp(v, a.oq + (row & ~(size_t)31), a.ods + row / 32);
    }
}

// GM: the most query heads per block, which sizes the registers holding q
// and the sums: 4 (attn_decode_tq) or ATTN_MAX_G (attn_decode_tq_g8).
// Shared memory: sq [ATTN_MAX_G][hd], sacc [ATTN_MAX_G][hd], sl
// [ATTN_MAX_G][TQ_SPAN], then q . centre [ATTN_MAX_G], the coded weights
// [ATTN_MAX_G] and (m, s) [ATTN_MAX_G] (the smem of qkv_attention_tq in ops/attention.rs).
template <int GM>
__device__ __forceinline__ void attn_decode_tq_impl(const TqDecodeArgs& args, float* smem) {
    __shared__ float cent[2][16];
    __shared__ int s_last;
    const AttnArgs& a = args.at;
    const TqArgs& t = args.tq;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, n_warps = blockDim.x / WARP;
    const int hd = a.hd, d0 = (lane % (hd / 8)) * 8;
    const int G = a.n_head / a.n_kv, n_gc = (G + ATTN_MAX_G - 1) / ATTN_MAX_G;
    const int g = blockIdx.x / n_gc, gc = blockIdx.x % n_gc;
    if (blockIdx.y < 2) {
        if (gc == 0) tq_encode_head(t, blockIdx.y == 1, g, 0, false);
        return;
    }
    const int h0 = g * G + gc * ATTN_MAX_G, nh = min(ATTN_MAX_G, G - gc * ATTN_MAX_G);
    const int n_blk = (a.n_split + TQ_DECODE_SPLITS - 1) / TQ_DECODE_SPLITS, blk = blockIdx.y - 2;
    const int pos = *a.pos0;
    const int start = attn_first(a, pos) + blk * TQ_SPAN;
    const int len = min(TQ_SPAN, pos + 1 - start);
    if (len <= 0) return;  // past the attended range: not counted
    const int n_active = tq_decode_blocks(a, pos);
    const TqView kv = tq_view((const u32*)a.kc, a.kt, t.slot, cent[0]);
    const TqView vv = tq_view((const u32*)a.vc, a.vt, t.slot, cent[1]);
    float* sq = smem;                              // [nh][hd]
    float* sacc = sq + ATTN_MAX_G * hd;            // [nh][hd]
    float* sl = sacc + ATTN_MAX_G * hd;            // [nh][TQ_SPAN]
    float* sqc = sl + ATTN_MAX_G * TQ_SPAN;        // [nh]
    float* swc = sqc + ATTN_MAX_G;                 // [nh]
    float2* sms = (float2*)(swc + ATTN_MAX_G);     // [nh]
    // q . centre matters only for coded rows, which a token below n_exact
    // (whose step may be setting the centre) does not have.
    tq_stage_q(a.q + (size_t)h0 * hd, nh, hd, pos >= kv.n_exact ? kv.centre : nullptr, g, sq, sqc);
    __syncthreads();
    {
        float qv[GM][8];
#pragma unroll
        for (int hh = 0; hh < GM; ++hh)
#pragma unroll
            for (int e = 0; e < 8; ++e) qv[hh][e] = hh < nh ? sq[hh * hd + d0 + e] : 0.0f;
        tq_logits<GM>(a, kv, t.k, qv, sqc, nh, g, start, len, pos, sl);
    }
    __syncthreads();
    // One warp per head: the max, then e^(l - m) in place and its sum.
    for (int hh = warp; hh < nh; hh += n_warps) {
        float* row = sl + hh * TQ_SPAN;
        float m = NEG_INF;
        for (int j = lane; j < len; j += WARP) m = fmaxf(m, row[j]);
        m = warp_max(m);
        float s = 0.0f;
        for (int j = lane; j < len; j += WARP) {
            const float e = expf(row[j] - m);
            row[j] = e;
            s += e;
        }
        s = warp_sum(s);
        if (lane == 0) sms[hh] = make_float2(m, s);
    }
    __syncthreads();

    float acc[GM][8], wc[GM];
#pragma unroll
    for (int hh = 0; hh < GM; ++hh) {
        wc[hh] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[hh][e] = 0.0f;
    }
    tq_values<GM>(a, vv, t.v, sl, nh, g, start, len, pos, acc, wc);
    tq_block_sums<GM>(acc, wc, nh, hd, sacc, swc);
    // The centre, weighted by the coded rows' probabilities (none: no term,
    // whatever the centre holds).
    for (int i = tid; i < nh * hd; i += blockDim.x) {
        const int hh = i / hd;
        if (vv.centre && swc[hh] != 0.0f) sacc[i] += swc[hh] * vv.centre[g * hd + i % hd];
    }
    if (n_active == 1) {
        __syncthreads();
        for (int i = tid; i < nh * hd; i += blockDim.x) sacc[i] /= sms[i / hd].y;
        tq_unrotate_heads(a, h0, nh, sacc);
        return;
    }
    const size_t ml_base = (size_t)h0 * n_blk + blk;
    for (int i = tid; i < nh * hd; i += blockDim.x)
        a.part_o[(ml_base + (size_t)(i / hd) * n_blk) * hd + i % hd] = sacc[i];
    if (tid < nh) a.part_ml[ml_base + (size_t)tid * n_blk] = sms[tid];
    if (!last_block(args.count + blockIdx.x, n_active, s_last)) return;
    tq_merge_blocks(a, h0, nh, n_active, sacc, sms);
    tq_unrotate_heads(a, h0, nh, sacc);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) attn_decode_tq(const TqDecodeArgs args) {
    PDL_PROLOGUE;
    extern __shared__ __align__(16) float tq_smem[];  // (m, s) read as float2
    attn_decode_tq_impl<4>(args, tq_smem);
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_decode_tq_g8(const TqDecodeArgs args) {
    PDL_PROLOGUE;
    extern __shared__ __align__(16) float tq_smem[];  // (m, s) read as float2
    attn_decode_tq_impl<ATTN_MAX_G>(args, tq_smem);
}
