//! What the x86-64 row dots of both levels share: the prefetch distance and
//! [`prefetch_ahead`], the safe-wrapper macro `safe_dot!`, horizontal sums,
//! f16 scale conversions, and the two row loops that `avx2.rs`,
//! `avx2_kquants.rs` and `avx512.rs` each instantiate with their own
//! integer core (`q8_0_row!` for the 32-value formats with Q8_0, `k4_row!`
//! for Q4_K / Q5_K with Q8_K, with its scale preparation `k4_prepare`).
//!
//! Imports point one way: this file reads only `blocks.rs`; the kernel
//! files read it and never each other's helpers (`avx2.rs` lists the
//! k-quant kernels of `avx2_kquants.rs` in its table, and `avx2_kquants.rs`
//! imports nothing from `avx2.rs`).
//!
//! The row-loop macros name their helpers unqualified, so a file that
//! expands one imports them: `q8_0_row!` uses `L` (the block layout),
//! `prefetch_ahead`, `scale_products4`, `broadcast_load_f32`, `f16_mul`,
//! `read_u16` and `hsum_ps`; `k4_row!` uses `L`, `Pairs`, `k4_prepare`,
//! `prefetch_ahead`, `read_u32`, `read_f32` and `hsum_ps`.

use core::arch::x86_64::*;

use super::blocks::layout as L;
use super::blocks::read_u16;

/// How far ahead of the bytes being read the x86 kernels prefetch weight
/// data. A row dot alone keeps too few cache misses in flight to stream
/// from DRAM at full speed (the output matrix of a model does not fit in
/// cache); prefetching about 2 KiB ahead brought the 262144x640 Q8_0
/// mat-vec from ~60% to ~95% of the measured read bandwidth here, and costs
/// nothing measurable on cache-resident matrices.
pub(crate) const PREFETCH_DISTANCE: usize = 2048;

/// Declares the safe [`DotFn`](super::level::DotFn) wrapper `$name` of the
/// AVX2 kernel `$kernel`.
macro_rules! safe_dot {
    ($name:ident, $kernel:ident) => {
        #[doc = concat!("Safe wrapper of [`", stringify!($kernel), "`], installed only at the AVX2 or AVX-512 level.")]
        pub(super) fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: `dots` lists this function only for a
            // level that `Kernels::for_level` checked against the CPU, and
            // every such level includes AVX2, FMA and F16C.
            unsafe { $kernel(w, a) }
        }
    };
}
pub(super) use safe_dot;

// ---------------------------------------------------------------------------
// Scalar and vector helpers.

/// Prefetches the `BYTES` bytes (a multiple of 64) that lie
/// [`PREFETCH_DISTANCE`] past `p` into the cache. Prefetches never fault,
/// so the addresses may lie past the end of the data.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (SSE would do).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_ahead<const BYTES: usize>(p: *const u8) {
    let mut off = 0;
    while off < BYTES {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_DISTANCE + off).cast());
        off += 64;
    }
}

/// Sum of the 8 lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The product of two f16 values given by their bits, in f32 (one
/// conversion of both).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_mul(a: u16, b: u16) -> f32 {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((a as u32 | (b as u32) << 16) as i32));
    _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

/// One f16 to f32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_to_f32(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// The products `d_w·d_a` of four consecutive blocks of each row (f16
/// scales at offset 0 of blocks `wsize` and `asize` bytes apart), converted
/// together.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the four blocks of each side
/// must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scale_products4(wb: *const u8, wsize: usize, ab: *const u8, asize: usize) -> __m128 {
    let gather = |p: *const u8, stride: usize| {
        read_u16(p) as u64
            | (read_u16(p.add(stride)) as u64) << 16
            | (read_u16(p.add(2 * stride)) as u64) << 32
            | (read_u16(p.add(3 * stride)) as u64) << 48
    };
    let h = _mm256_cvtph_ps(_mm_set_epi64x(gather(ab, asize) as i64, gather(wb, wsize) as i64));
    _mm_mul_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
}

/// Broadcasts the f32 at `p` to 8 lanes with a load (`vbroadcastss` from
/// memory, no shuffle port). Written as `asm!` because the compiler turns
/// a broadcast of a value it has just stored into register shuffles.
///
/// # Safety
/// The CPU must support AVX2; `p..p + 4` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast_load_f32(p: *const f32) -> __m256 {
    let r: __m256;
    // SAFETY: reads 4 bytes at `p` (the caller's promise); no other effect.
    core::arch::asm!(
        "vbroadcastss {r}, dword ptr [{p}]",
        r = out(ymm_reg) r,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags)
    );
    r
}

// ---------------------------------------------------------------------------
// Row loops.

/// Row loop of the 32-value formats paired with Q8_0: for each of the
/// whole blocks in both rows, `$body` (with `$wb` the weight block and
/// `$aq` the activation block's quants) returns the block's `i32` lanes,
/// which are scaled by `d_w·d_a` (both f16 at offset 0) and summed.
///
/// Blocks go four at a time: their scales are converted together and
/// stored, so that each block's broadcast is a plain load, and four
/// accumulators hide the FMA latency.
macro_rules! q8_0_row {
    ($w:expr, $a:expr, $wsize:expr, |$wb:ident, $aq:ident| $body:expr) => {{
        let (w, a): (&[u8], &[u8]) = ($w, $a);
        let nb = (w.len() / $wsize).min(a.len() / L::Q8_0);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut scales = [0f32; 4];
        let mut i = 0;
        // SAFETY (of the pointer arithmetic and of every read below): the
        // blocks `i..i + 4` (first loop) and `i` (second loop) are below
        // `nb`, so they lie inside both slices.
        while i + 4 <= nb {
            let (wb0, ab0) = (wp.add(i * $wsize), ap.add(i * L::Q8_0));
            // Four blocks are 72..136 bytes: two or three cache lines.
            if 4 * $wsize > 128 {
                prefetch_ahead::<192>(wb0);
            } else {
                prefetch_ahead::<128>(wb0);
            }
            _mm_storeu_ps(scales.as_mut_ptr(), scale_products4(wb0, $wsize, ab0, L::Q8_0));
            for (j, acc) in acc.iter_mut().enumerate() {
                let $wb = wb0.add(j * $wsize);
                let $aq = ab0.add(j * L::Q8_0 + L::Q8_0_QS);
                let sum: __m256i = $body;
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), broadcast_load_f32(&scales[j]), *acc);
            }
            i += 4;
        }
        while i < nb {
            let $wb = wp.add(i * $wsize);
            let ab = ap.add(i * L::Q8_0);
            let $aq = ab.add(L::Q8_0_QS);
            let sum: __m256i = $body;
            let d = _mm256_set1_ps(f16_mul(read_u16($wb), read_u16(ab)));
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d, acc[0]);
            i += 1;
        }
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
    }};
}
pub(super) use q8_0_row;

/// Scratch for [`k4_prepare`]: 16 dwords, aligned for vector stores.
#[repr(C, align(32))]
pub(super) struct Pairs(pub(super) [u32; 16]);

/// The scales and mins of a Q4_K / Q5_K block, prepared for the row loop:
/// every 6-bit scale `s_g` as the `i16` pair `(s_g, s_g)` in dword `g` of
/// `pairs` (`g < 4`) or `g + 4` (`g ≥ 4`), so that spreading one over a
/// vector is a plain broadcast load; returned, the mins as 16 `i16` lanes
/// `m_0 m_0 m_1 m_1 … m_7 m_7`, one per Q8_K group sum.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `wb` must point to a readable
/// Q4_K or Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_prepare(wb: *const u8, pairs: &mut Pairs) -> __m256i {
    // `k4_scales_mins` in vector lanes: with the packed words u0, u1, u2 at
    // offsets 4, 8, 12 of the block (the 16-byte load also takes 4 bytes of
    // `qs`, unused), lanes [u0 & 3f, u2 & 0f | (u0 >> 6 & 3) << 4,
    // u1 & 3f, u2 >> 4 & 0f | (u1 >> 6 & 3) << 4] are the scales 0..4,
    // scales 4..8, mins 0..4 and mins 4..8.
    let u = _mm_loadu_si128(wb.add(L::Q4_K_SCALES).cast());
    let low = _mm_srlv_epi32(_mm_shuffle_epi32::<0b10_01_10_00>(u), _mm_setr_epi32(0, 0, 0, 4));
    let low = _mm_and_si128(low, _mm_setr_epi32(0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f));
    let top = _mm_srli_epi32::<6>(_mm_shuffle_epi32::<0b01_00_00_00>(u));
    let top = _mm_slli_epi32::<4>(_mm_and_si128(top, _mm_setr_epi32(0, 0x0303_0303, 0, 0x0303_0303)));
    let sm = _mm_or_si128(low, top);
    // Lane 0: the 8 scales, lane 1: the 8 mins, as i16.
    let v = _mm256_cvtepu8_epi16(sm);
    let lo = _mm256_unpacklo_epi16(v, v);
    let hi = _mm256_unpackhi_epi16(v, v);
    _mm256_store_si256(pairs.0.as_mut_ptr().cast(), lo);
    _mm256_store_si256(pairs.0.as_mut_ptr().add(8).cast(), hi);
    _mm256_permute2x128_si256::<0x31>(lo, hi)
}

/// Row loop of Q4_K (`$qh = false`) and Q5_K (`$qh = true`) with Q8_K:
/// `d_a·(d·Σ_g sc_g·Σ q·a − dmin·Σ_g m_g·(bsum_2g + bsum_2g+1))`, 8 groups
/// of 32. `$scaled(acc, p, s)` adds the `i16` pair sums `p` times the
/// scale pair at `s` (broadcast) to the `i32` lanes of `acc` (`vpmaddwd` +
/// add, or VNNI's `vpdpwssd` with a broadcast memory operand).
macro_rules! k4_row {
    ($w:expr, $a:expr, $wsize:expr, $qh:expr, |$acc:ident, $p:ident, $s:ident| $scaled:expr) => {{
        let (w, a): (&[u8], &[u8]) = ($w, $a);
        let nb = (w.len() / $wsize).min(a.len() / L::Q8_K);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let qs_at = if $qh { L::Q5_K_QS } else { L::Q4_K_QS };
        let low4 = _mm256_set1_epi8(0x0f);
        let bit4 = _mm256_set1_epi8(0x10);
        let mut pairs = Pairs([0u32; 16]);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm256_setzero_ps();
        for i in 0..nb {
            // SAFETY (of every read of this iteration): block `i < nb` lies
            // inside both slices.
            let wb = wp.add(i * $wsize);
            prefetch_ahead::<192>(wb);
            let ab = ap.add(i * L::Q8_K);
            let aq = ab.add(L::Q8_K_QS);
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(read_u32(wb) as i32));
            let dd = _mm_mul_ps(dd, _mm_set1_ps(read_f32(ab))); // [d, dmin, ..]
            let mins = k4_prepare(wb, &mut pairs);
            let pm = _mm256_madd_epi16(mins, _mm256_loadu_si256(ab.add(L::Q8_K_BSUMS).cast()));
            acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), acc_m);
            let mut qh = if $qh { _mm256_loadu_si256(wb.add(L::Q5_K_QH).cast()) } else { _mm256_setzero_si256() };
            let mut sum = [_mm256_setzero_si256(); 2];
            for j in 0..4 {
                let q = _mm256_loadu_si256(wb.add(qs_at + 32 * j).cast());
                let mut lo = _mm256_and_si256(q, low4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
                if $qh {
                    // Bits 0 and 1 of the progressively shifted qh bytes
                    // become bit 4 of the low and high codes.
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4));
                    qh = _mm256_srli_epi16::<2>(qh);
                }
                let g_lo = if j < 2 { 2 * j } else { 2 * j + 4 };
                for (k, (codes, g)) in [(lo, g_lo), (hi, g_lo + 1)].into_iter().enumerate() {
                    let $p = _mm256_maddubs_epi16(codes, _mm256_loadu_si256(aq.add(64 * j + 32 * k).cast()));
                    let $s: *const u32 = pairs.0.as_ptr().add(g);
                    let $acc = sum[k];
                    sum[k] = $scaled;
                }
            }
            let sumi = _mm256_add_epi32(sum[0], sum[1]);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcastss_ps(dd), acc);
        }
        hsum_ps(_mm256_sub_ps(acc, acc_m))
    }};
}
pub(super) use k4_row;
