// One-token products with the weights streamed through shared memory
// (mv_<type>_ts): the same sums as mv_*_t1 / _t1s / _t1q, and the same
// order within a row, with the weights moved by the copy engine.
//
// Why: mv_*_t1 loads each weight chunk into registers just before it is
// used, so a lane has one or two loads in flight, and on the large
// products of an 8B model the SMs sat idle 60% of the cycles waiting for
// them, at about half the bandwidth (ncu, H100). Here thread 0 of each
// block keeps a ring of MVS_STAGES stages of shared memory filled with
// bulk copies (cp.async.bulk, TMA; completion counted in bytes on an
// mbarrier per stage), each stage a tile of `tile_rows` consecutive rows
// of one segment (GLU: the tile's gate rows, then its up rows, each in a
// region of `region` bytes). So each block has MVS_STAGES tiles in flight
// whatever its registers, and the first ones are requested before the PDL
// wait (weights never depend on the kernel before).
//
// The grid is persistent (a few blocks per SM, ops.rs); block b takes
// groups b, b + grid, ... of `group` consecutive tiles. With tile_rows >=
// MV_WARPS, warp w takes rows w, w + MV_WARPS, ... of a tile; with fewer
// (long rows) each row is split over MV_WARPS / tile_rows warps as in
// mv_*_t1s, whose sums meet in shared memory. With `oq` set (GLU only),
// the output is also written as the q8 activation of the next product, as
// in mv_*_t1q: tile_rows is then a power of two and a group covers 32 rows
// (or a tile a multiple of 32), so the block that computed a chunk
// quantizes it, with no grid-wide ticket.
//
// A tile's rows lie at the same address modulo 16 in shared memory as in
// global memory (the copy covers the 16-byte aligned span around them), so
// every layout's chunk reader works unchanged.

#define MVS_STAGES 3

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 addr;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(addr) : "l"(p));
    return addr;
}

__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}

// Makes the initialized barriers visible to the copy engine.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Arrives on `bar` (count 1) and adds `bytes` to the bytes its phase waits for.
__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

// Waits until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const u32 addr = smem_u32(bar);
    u32 done;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// global to shared memory, counted on `bar` when they have landed.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, u32 bytes, u64* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}

// A tile: rows r0 .. r0 + n - 1 of segment seg (n == 0: past the end).
struct MvsTile {
    int seg, r0, n;
};

__device__ __forceinline__ MvsTile mvs_tile(const MatvecArgs& a, bool glu, int tr, int t) {
    MvsTile x = {0, 0, 0};
    // Constant indices into a.rows (a run-time one would copy the
    // arguments to local memory).
#pragma unroll
    for (int s = 0; s < 3; ++s) {
        const int rows = a.rows[s];
        const int nt = (s == 0 || !glu) ? (rows + tr - 1) / tr : 0;
        if (x.n == 0 && t < nt) {
            x.seg = s;
            x.r0 = t * tr;
            x.n = min(tr, rows - t * tr);
        }
        t -= nt;
    }
    return x;
}

// The 16-byte aligned span of global memory holding rows r0 .. r0 + n - 1
// of matrix w: its start, and its length in bytes.
__device__ __forceinline__ const u8* mvs_span(const u8* w, int row_bytes, int r0, int n, u32& bytes) {
    const u64 lo = (u64)(w + (size_t)r0 * row_bytes), hi = lo + (u64)n * (u64)row_bytes;
    const u64 alo = lo & ~(u64)15, ahi = (hi + 15) & ~(u64)15;
    bytes = (u32)(ahi - alo);
    return (const u8*)alo;
}

// The k-th tile of this block (>= n_tiles: none).
__device__ __forceinline__ int mvs_tile_index(const MvStreamArgs& p, int k) {
    return (blockIdx.x + (k / p.group) * gridDim.x) * p.group + k % p.group;
}

// Thread 0: asks for tile t into `stage`, counted on `bar`.
__device__ __forceinline__ void mvs_issue(const MvStreamArgs& p, bool glu, int t, u8* stage, u64* bar) {
    const MatvecArgs& a = p.mv;
    const MvsTile x = mvs_tile(a, glu, p.tile_rows, t);
    const u8* w = x.seg == 0 ? a.w[0] : x.seg == 1 ? a.w[1] : a.w[2];
    u32 b0, b1 = 0;
    const u8* s0 = mvs_span(w, a.row_bytes, x.r0, x.n, b0);
    const u8* s1 = glu ? mvs_span(a.w[1], a.row_bytes, x.r0, x.n, b1) : nullptr;
    mbar_expect_tx(bar, b0 + b1);
#ifdef MVS_PIECE
    for (u32 o = 0; o < b0; o += MVS_PIECE) bulk_copy_g2s(stage + o, s0 + o, min((u32)MVS_PIECE, b0 - o), bar);
    for (u32 o = 0; o < b1; o += MVS_PIECE) bulk_copy_g2s(stage + p.region + o, s1 + o, min((u32)MVS_PIECE, b1 - o), bar);
#else
    bulk_copy_g2s(stage, s0, b0, bar);
    if (glu) bulk_copy_g2s(stage + p.region, s1, b1, bar);
#endif
}

#ifdef MVS_LDGSTS
// Trial: every thread copies its share of tile t's 16-byte pieces
// (cp.async, sm_80), then commits a group (an empty one past the end).
__device__ __forceinline__ void mvs_copy_span(u8* dst, const u8* src, u32 bytes) {
    for (u32 o = threadIdx.x * 16; o < bytes; o += blockDim.x * 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst + o)), "l"(src + o) : "memory");
}

__device__ __forceinline__ void mvs_issue_all(const MvStreamArgs& p, bool glu, int t, u8* stage) {
    if (t < p.n_tiles) {
        const MatvecArgs& a = p.mv;
        const MvsTile x = mvs_tile(a, glu, p.tile_rows, t);
        const u8* w = x.seg == 0 ? a.w[0] : x.seg == 1 ? a.w[1] : a.w[2];
        u32 b;
        const u8* s0 = mvs_span(w, a.row_bytes, x.r0, x.n, b);
        mvs_copy_span(stage, s0, b);
        if (glu) {
            const u8* s1 = mvs_span(a.w[1], a.row_bytes, x.r0, x.n, b);
            mvs_copy_span(stage + p.region, s1, b);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}
#endif

// Row i of a tile in `stage` (region 0, or 1 for the up rows of GLU).
__device__ __forceinline__ const u8* mvs_row(const MvStreamArgs& p, const u8* stage, const u8* w, int r0, int i,
                                             int region) {
    const u64 lo = (u64)(w + (size_t)r0 * p.mv.row_bytes);
    return stage + region * p.region + (lo & 15) + (size_t)i * p.mv.row_bytes;
}

template <class T, bool GLU>
__device__ __forceinline__ void matvec_stream(const MvStreamArgs& p) {
    const MatvecArgs& a = p.mv;
    extern __shared__ __align__(128) u8 mvs_smem[];
    __shared__ __align__(8) u64 full[MVS_STAGES];
    __shared__ float2 partial[2][MV_WARPS];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int tr = p.tile_rows;
    const int stage_bytes = p.region * (GLU ? 2 : 1);
#ifdef MVS_LDGSTS
    for (int k = 0; k < MVS_STAGES; ++k) mvs_issue_all(p, GLU, mvs_tile_index(p, k), mvs_smem + k * stage_bytes);
#else
    if (threadIdx.x == 0) {
        for (int s = 0; s < MVS_STAGES; ++s) mbar_init(&full[s], 1);
        mbar_init_fence();
        for (int k = 0; k < MVS_STAGES; ++k) {
            const int t = mvs_tile_index(p, k);
            if (t < p.n_tiles) mvs_issue(p, GLU, t, mvs_smem + k * stage_bytes, &full[k]);
        }
    }
    __syncthreads();
#endif
    PDL_PROLOGUE;

    const int wpr = tr >= MV_WARPS ? 1 : MV_WARPS / tr;
    const int part = warp % wpr;
    for (int k = 0, t = mvs_tile_index(p, 0); t < p.n_tiles; t = mvs_tile_index(p, ++k)) {
        const int s = k % MVS_STAGES;
        u8* stage = mvs_smem + s * stage_bytes;
        const MvsTile x = mvs_tile(a, GLU, tr, t);
        const u8* w = x.seg == 0 ? a.w[0] : x.seg == 1 ? a.w[1] : a.w[2];
#ifdef MVS_LDGSTS
        asm volatile("cp.async.wait_group %0;" ::"n"(MVS_STAGES - 1) : "memory");
        __syncthreads();
#else
        mbar_wait(&full[s], (u32)(k / MVS_STAGES) & 1);
#endif
        // ---- This warp's rows of the tile.
        float acc = 0.0f, acc2 = 0.0f;
        if (wpr == 1) {
            for (int i = warp; i < x.n; i += MV_WARPS) {
                acc = 0.0f;
                acc2 = 0.0f;
                const u8* row = mvs_row(p, stage, w, x.r0, i, 0);
                const u8* row2 = GLU ? mvs_row(p, stage, a.w[1], x.r0, i, 1) : row;
                mv1_loop<T, GLU>(a, row, row2, a.aq, a.ad, acc, acc2);
                mv_store<1>(a, x.seg, x.r0 + i, 0, 1, &acc, &acc2, GLU);
            }
        } else {
            const int i = warp / wpr;
            if (i < x.n) {
                const u8* row = mvs_row(p, stage, w, x.r0, i, 0);
                const u8* row2 = GLU ? mvs_row(p, stage, a.w[1], x.r0, i, 1) : row;
                mv1_loop<T, GLU>(a, row, row2, a.aq, a.ad, acc, acc2, part * WARP + lane, WARP * wpr);
                acc = warp_sum(acc);
                if (GLU) acc2 = warp_sum(acc2);
            }
            if (lane == 0) partial[k & 1][warp] = make_float2(acc, acc2);
        }
        // ---- The stage is free: ask for the tile MVS_STAGES ahead.
        __syncthreads();
        const int ahead = mvs_tile_index(p, k + MVS_STAGES);
#ifdef MVS_LDGSTS
        mvs_issue_all(p, GLU, ahead, stage);
#else
        if (threadIdx.x == 0 && ahead < p.n_tiles) mvs_issue(p, GLU, ahead, stage, &full[s]);
#endif
        // ---- Split rows: the row's first warp adds up its parts (the
        // buffer of the next tile is the other one).
        if (wpr > 1 && part == 0 && warp / wpr < x.n) {
            float v = 0.0f, v2 = 0.0f;
            for (int j = 0; j < wpr; ++j) {
                v += partial[k & 1][warp + j].x;
                v2 += partial[k & 1][warp + j].y;
            }
            // mv_store sums over the warp: the total on lane 0, zeros elsewhere.
            v = lane == 0 ? v : 0.0f;
            v2 = lane == 0 ? v2 : 0.0f;
            mv_store<1>(a, x.seg, x.r0 + warp / wpr, 0, 1, &v, &v2, GLU);
        }
        // ---- q8 output: after the last tile of a group, its 32-row
        // chunks are whole (the block's stores are visible to it after
        // the barrier).
        if (GLU && p.oq != nullptr && k % p.group == p.group - 1) {
            __syncthreads();
            if (warp == 0) {
                const int c0 = (x.r0 + x.n - p.group * tr) / 32;
                for (int c = c0; c * 32 < x.r0 + x.n; ++c) {
                    const size_t i = (size_t)c * 32 + lane;
                    quantize_chunk_warp(a.y[0][i], p.oq + (size_t)c * 32, p.ods + c);
                }
            }
        }
    }
}

template <class T>
__device__ __forceinline__ void matvec_stream_mode(const MvStreamArgs& p) {
    if (p.mv.mode == MV_GLU_GELU || p.mv.mode == MV_GLU_SILU) matvec_stream<T, true>(p);
    else matvec_stream<T, false>(p);
}

// Instantiated per layout with the other products (kernels.rs, `PRODUCTS`).
#define MV_STREAM_KERNEL(name, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP) mv_##name##_ts(const MvStreamArgs p) { \
        matvec_stream_mode<T>(p);                                                                        \
    }
