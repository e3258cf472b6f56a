// The mat-vec kernels of the float weight types (F32, F16, BF16), in the
// module every model loads (kernels.rs, `Module::Common`).

#define MVF_KERNELS(name, F)                                                                       \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP) mv_##name##_t1(const MatvecArgs a) { \
        mv_prefetch(a);                                                                            \
        PDL_PROLOGUE;                                                                              \
        matvec_f<F, 1>(a);                                                                         \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP) mv_##name##_t8(const MatvecArgs a) { \
        PDL_PROLOGUE;                                                                              \
        matvec_f<F, 8>(a);                                                                         \
    }

MVF_KERNELS(f32, FF32)
MVF_KERNELS(f16, FF16)
MVF_KERNELS(bf16, FBF16)
