// Shared definitions of the infer-compute CUDA kernels: integer types,
// half/bfloat conversions, the GGUF block structs (mirroring
// `crate::quant`, sizes asserted), warp/block reductions and the
// by-value argument structs whose Rust mirrors live in `cuda/kernels.rs`.
//
// The sources are concatenated in the order given by `kernels::SOURCES`
// (this header first) into NVRTC programs, one per module (kernels.rs,
// `Module`), so nothing here may depend on the CUDA headers: NVRTC
// compiles them without any include path.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP 32
#define FULL_MASK 0xffffffffu
#define NEG_INF (__int_as_float(0xff800000))

// ---------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+; see `Device::launch`). Every kernel
// runs PDL_PROLOGUE before it touches memory that the kernel just before
// it may write:
//   pdl_wait():    blocks until the grid launched before this one on the
//                  stream has completed and its memory is visible (returns
//                  at once for a plain launch);
//   pdl_trigger(): lets the next grid be scheduled now; its blocks then
//                  wait in their own pdl_wait(), so this changes only when
//                  they are launched, never what they see.
// A kernel runs only once the grid before it has passed its own pdl_wait
// (in every kernel some block waits before it triggers or exits), so every
// grid before that one has completed: what they wrote (weights,
// the position written before the step, KV-cache rows of earlier steps)
// may be read before pdl_wait. The one-token mat-vecs prefetch their
// weight rows and attn_decode loads its cache span there.

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#define PDL_PROLOGUE \
    pdl_wait();      \
    pdl_trigger()

// Asks L2 for `bytes` bytes at p (a hint: no data moves into registers).
// Called by lane 0 of a warp on sm_90+ (one bulk prefetch of the 16-byte
// aligned middle of the range), by every lane before (one line each).
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x % 32 != 0) return;
    const u64 lo = ((u64)p + 15) & ~(u64)15, hi = ((u64)p + (u64)bytes) & ~(u64)15;
    if (hi > lo) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"((u32)(hi - lo)) : "memory");
#else
    for (int o = (threadIdx.x % 32) * 128; o < bytes; o += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)p + o));
#endif
}

// ---------------------------------------------------------------------------
// Grid tickets: the last of n blocks to finish does the work that needs all
// of them (merging split-K partial sums, a final reduction), instead of a
// second launch.
// Every thread of the block calls it after its global writes; it returns
// true in the last block, which then sees every block's writes (read them
// with __ldcg) and has re-armed *count to 0 for the next launch. One
// release atomic per block (not __threadfence() in every thread, which is
// a MEMBAR.SC.GPU each). s_last: an int of shared memory.

__device__ __forceinline__ bool last_block(int* count, int n, int& s_last) {
    __syncthreads();  // the block's writes happen before thread 0's release
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.add.release.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
        const bool last = old == n - 1;
        if (last) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            *count = 0;
        }
        s_last = last;
    }
    __syncthreads();
    return s_last;
}

// ---------------------------------------------------------------------------
// Floating-point conversions (PTX cvt; round to nearest even).

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// f32 -> f16 for the KV cache: a finite value past f16's range saturates
// to +-65504 instead of becoming an infinity (a key of 1e7 would otherwise
// turn its attention scores into inf - inf = NaN); NaN stays NaN.
__device__ __forceinline__ float f16_range(float f) { return fabsf(f) > 65504.0f ? copysignf(65504.0f, f) : f; }

__device__ __forceinline__ u16 f32_to_f16_sat(float f) { return f32_to_f16(f16_range(f)); }

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

// Round to nearest even (sm_80+ instruction).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// ---------------------------------------------------------------------------
// GGUF blocks. Every struct has 2-byte alignment (its f16 fields), so a
// block inside a row is only guaranteed 2-byte aligned unless its size is
// a multiple of 4 (Q4_1, Q5_1, Q2_K) or 16 (Q4_K, Q5_K).

struct BlockQ4_0 { u16 d; u8 qs[16]; };                                  // 4.5 bpw
struct BlockQ4_1 { u16 d; u16 m; u8 qs[16]; };                           // 5.0 bpw
struct BlockQ5_0 { u16 d; u8 qh[4]; u8 qs[16]; };                        // 5.5 bpw
struct BlockQ5_1 { u16 d; u16 m; u8 qh[4]; u8 qs[16]; };                 // 6.0 bpw
struct BlockQ8_0 { u16 d; i8 qs[32]; };                                  // 8.5 bpw
struct BlockIQ4NL { u16 d; u8 qs[16]; };                                 // 4.5 bpw
struct BlockQ2K { u8 scales[16]; u8 qs[64]; u16 d; u16 dmin; };          // 2.625 bpw
struct BlockQ3K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; u16 d; };      // 3.4375 bpw
struct BlockQ4K { u16 d; u16 dmin; u8 scales[12]; u8 qs[128]; };         // 4.5 bpw
struct BlockQ5K { u16 d; u16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }; // 5.5 bpw
struct BlockQ6K { u8 ql[128]; u8 qh[64]; i8 scales[16]; u16 d; };        // 6.5625 bpw

static_assert(sizeof(BlockQ4_0) == 18, "BlockQ4_0 size");
static_assert(sizeof(BlockQ4_1) == 20, "BlockQ4_1 size");
static_assert(sizeof(BlockQ5_0) == 22, "BlockQ5_0 size");
static_assert(sizeof(BlockQ5_1) == 24, "BlockQ5_1 size");
static_assert(sizeof(BlockQ8_0) == 34, "BlockQ8_0 size");
static_assert(sizeof(BlockIQ4NL) == 18, "BlockIQ4NL size");
static_assert(sizeof(BlockQ2K) == 84, "BlockQ2K size");
static_assert(sizeof(BlockQ3K) == 110, "BlockQ3K size");
static_assert(sizeof(BlockQ4K) == 144, "BlockQ4K size");
static_assert(sizeof(BlockQ5K) == 176, "BlockQ5K size");
static_assert(sizeof(BlockQ6K) == 210, "BlockQ6K size");

// ggml type ids (GgmlType discriminants).
#define TY_F32 0
#define TY_F16 1
#define TY_Q4_0 2
#define TY_Q4_1 3
#define TY_Q5_0 6
#define TY_Q5_1 7
#define TY_Q8_0 8
#define TY_Q2_K 10
#define TY_Q3_K 11
#define TY_Q4_K 12
#define TY_Q5_K 13
#define TY_Q6_K 14
#define TY_IQ4_NL 20
#define TY_BF16 30

// ---------------------------------------------------------------------------
// Unaligned-safe loads of 4 quant bytes as one int.

__device__ __forceinline__ int ld_i32_a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}

__device__ __forceinline__ int ld_i32_a4(const u8* p) { return *(const int*)p; }

// ---------------------------------------------------------------------------
// Reductions.

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024).
// `scratch` holds 32 floats; every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int n_warps = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// ---------------------------------------------------------------------------
// The activation format of the integer dot products ("q8 activation"):
// per 32 values, 32 int8 quants (in their own array, 16-byte aligned per
// block) and a float2 (d, d * sum(q)). d = absmax / 127, q = round(x / d)
// (half away from zero), as `quant::q8_0`, but d is kept in f32.

// Quantizes the 32 values held by the lanes of one warp (value `lane`).
__device__ __forceinline__ void quantize_chunk_warp(float v, i8* q, float2* ds) {
    const int lane = threadIdx.x % WARP;
    // fmaxf skips NaN and a NaN rounds to an arbitrary code: a chunk with a
    // NaN gets a NaN scale, so that the NaN reaches the logits.
    const bool nan = __any_sync(FULL_MASK, v != v);
    const float amax = nan ? __int_as_float(0x7fc00000) : warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int qi = (int)roundf(v * id);
    const int sum = warp_sum_i(qi);
    q[lane] = (i8)qi;
    if (lane == 0) *ds = make_float2(d, d * (float)sum);
}

// ---------------------------------------------------------------------------
// Kernel argument structs, passed by value. Field order: 8-byte fields
// first, so that the Rust #[repr(C)] mirrors have no padding.

// Mat-vec / batched mat-vec. See matvec.cu.
struct MatvecArgs {
    const u8* w[3];      // weight matrices of one type and width, row-major
    float* y[3];         // outputs: y[s][t * rows[s] + r]
    const i8* aq;        // q8 activation quants, [n_tok][cols]
    const float2* ad;    // q8 activation scales, [n_tok][cols / 32]
    const float* ax;     // f32 activation, [n_tok][cols] (float weights)
    int rows[3];         // rows of each segment (0 when unused)
    int row_bytes;       // bytes per weight row
    int cols;            // values per row
    int n_tok;           // tokens (activation rows)
    int mode;            // MV_STORE, MV_GLU_GELU, MV_GLU_SILU, MV_SOFTCAP
    float cap;           // soft-cap c for MV_SOFTCAP
    int prefetch;        // 1: one-token and tr kernels ask L2 for their rows before pdl_wait
    int wpr;             // mv_*_t1s, mv_*_tr: warps per row (group), 1, 2 or 4 (others ignore it)
};
static_assert(sizeof(MatvecArgs) == 112, "MatvecArgs layout");

#define MV_STORE 0
#define MV_GLU_GELU 1
#define MV_GLU_SILU 2
#define MV_SOFTCAP 3

// Residual add + normalization (+ q8 quantization). See norm.cu.
struct NormArgs {
    float* x;            // residual [n_tok][n], updated in place when `add` is set
    const float* add;    // addend [n_tok][n] or null
    const float* add_w;  // RMSNorm weights applied to the addend first, or null
    const float* w;      // norm weights [n]
    const float* b;      // norm bias [n] or null (LayerNorm)
    float* out;          // normalized output [n_tok][n]
    i8* q;               // q8 output quants or null
    float2* ds;          // q8 output scales or null
    int n;               // row length
    int kind;            // 0 RMSNorm, 1 LayerNorm
    float eps;
    float add_eps;
};
static_assert(sizeof(NormArgs) == 80, "NormArgs layout");

// A one-token product that first runs residual_norm's whole-row path on
// its input (mvn_*, matvec_norm.cu): `mv` without aq / ad, which come from
// `norm` (its q / ds / out are written by block 0 only, for later launches).
struct MvNormArgs {
    MatvecArgs mv;
    NormArgs norm;
    float* x_out;        // the updated residual (norm.x + addend), by block 0; null: no addend
};
static_assert(sizeof(MvNormArgs) == 200, "MvNormArgs layout");

// A fused-norm product followed by a second product of another weight type
// against the same normalized input (mvn2_*, matvec_norm.cu).
struct MvNorm2Args {
    MvNormArgs p;
    MatvecArgs b;        // one token, MV_STORE, b.cols == p.mv.cols
};
static_assert(sizeof(MvNorm2Args) == 312, "MvNorm2Args layout");

// One-token GLU product that also writes its output as the q8 activation
// of the product after it (mv_<type>_t1q, matvec.cu).
struct MvQuantArgs {
    MatvecArgs mv;
    i8* oq;              // q8 quants of the output, [rows]
    float2* ods;         // q8 scales of the output, [rows / 32]
    int* count;          // finished blocks per 32 output rows, [rows / 32]; zero between launches
};
static_assert(sizeof(MvQuantArgs) == 136, "MvQuantArgs layout");

// q/k bias, per-head norm, RoPE and KV-cache append. See rope.cu.
struct QkvArgs {
    float* q;            // [n_tok][n_head * hd], rotated in place
    float* k;            // [n_tok][n_kv * hd], rotated in place
    float* v;            // [n_tok][n_kv * hd] (rotated in place for a TurboQuant cache)
    const float* bq;     // biases or null
    const float* bk;
    const float* bv;
    const float* qn_w;   // per-head RMSNorm weights [hd] or null
    const float* kn_w;
    u8* kc;              // caches: n_ctx rows of k_row / v_row bytes (kv_cache.cuh), or the
    u8* vc;              // layer's TurboQuant buffer (tq_cache.cuh)
    const int* pos0;     // device: position of token 0
    int n_head, n_kv, hd, n_rot;
    int neox;            // 1: pairs (i, i + n_rot/2); 0: (2i, 2i+1)
    int n_tok;
    float theta_scale;   // base^(-2/n_rot)
    float freq_scale;
    float qn_eps, kn_eps;
    int kt, vt;          // cache types (KV_F16, KV_Q8_0, KV_Q4_0, KV_TQ3, KV_TQ4)
    int k_row, v_row;    // bytes per cached position
    int k_rot, v_rot;    // Hadamard block of the stored keys (and queries) / values; 0: none
};
static_assert(sizeof(QkvArgs) == 152, "QkvArgs layout");

// Split-K decode attention. See attention.cu.
struct AttnArgs {
    const float* q;      // [n_tok][n_head * hd]
    const u8* kc;        // caches: n_ctx rows of k_row / v_row bytes (kv_cache.cuh)
    const u8* vc;
    float* part_o;       // [n_tok][n_head][n_split][hd]
    float2* part_ml;     // [n_tok][n_head][n_split]: (max logit, sum of exp)
    float* out;          // [n_tok][n_head * hd]
    i8* oq;              // q8 of `out` or null
    float2* ods;
    const int* pos0;     // device: position of token 0
    int n_head, n_kv, hd, n_split;
    int window;          // 0: global
    int n_tok;
    float scale;
    float softcap;       // 0: none
    int kt, vt;          // cache types (KV_F16, KV_Q8_0, KV_Q4_0, KV_TQ3, KV_TQ4)
    int k_row, v_row;    // bytes per cached position
    int v_rot;           // Hadamard block of the stored values (attn_unrotate); 0: none
    int pad_;
};
static_assert(sizeof(AttnArgs) == 128, "AttnArgs layout");

// Decode attention with the q/k/v post-processing folded in (attn_split_qkv,
// attn_decode_hd*).
struct AttnQkvArgs {
    AttnArgs at;
    QkvArgs qk;
    int* count;          // attn_decode: [n_tok][n_kv] finished spans, zero between launches
    const int* slot;     // attn_decode_batch: token t's pool slot (pos0[t] its position)
    long long k_stride;  // attn_decode_batch: bytes per slot of the K cache (n_ctx * k_row)
    long long v_stride;  // and of the V cache
};
static_assert(sizeof(AttnQkvArgs) == 312, "AttnQkvArgs layout");

// Positions per attention split (one block's share of the cache).
#define ATTN_SPLIT 32
// Query heads per attention block (heads of one kv group beyond this are
// spread over more blocks).
#define ATTN_MAX_G 8
