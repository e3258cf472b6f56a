//! aarch64 NEON + dot-product row dots for every weight type.
//!
//! The integer core is `sdot` (four `i8 × i8` products summed into each
//! `i32` lane), emitted with `asm!` because the `vdotq_s32` intrinsic is not
//! stable. Codes are unpacked to signed bytes (offsets applied per byte:
//! Q4_0's `q - 8`, Q5_0's `q - 16`, Q6_K's `q - 32`); Q4_K's mins come from
//! Q8_K's group sums. Per-block (or per-group) sums are reduced with `addv`
//! and scaled in f32 (legacy formats) or by the integer sub-block scale
//! (k-quants).
//!
//! Built and tested on x86-64 with the `aarch64-unknown-linux-gnu` target,
//! Debian's cross linker and `qemu-aarch64 -cpu max` as the runner
//! (`.cargo/config.toml`).

use core::arch::aarch64::*;
use core::arch::asm;

use super::blocks::layout as L;
use super::blocks::{k4_scales_mins, q3k_scales, read_f32, read_u16, read_u32};
use super::level::DotFn;
use crate::quant::iq4_nl::KVALUES_IQ4NL;
use crate::GgmlType;

/// The NEON kernels of every type.
pub(super) fn dots() -> [(GgmlType, DotFn); 14] {
    [
        (GgmlType::F32, dot_f32),
        (GgmlType::F16, dot_f16),
        (GgmlType::BF16, dot_bf16),
        (GgmlType::Q8_0, dot_q8_0),
        (GgmlType::Q4_0, dot_q4_0),
        (GgmlType::Q4_1, dot_q4_1),
        (GgmlType::Q5_0, dot_q5_0),
        (GgmlType::Q5_1, dot_q5_1),
        (GgmlType::IQ4_NL, dot_iq4_nl),
        (GgmlType::Q2_K, dot_q2_k),
        (GgmlType::Q3_K, dot_q3_k),
        (GgmlType::Q4_K, dot_q4_k),
        (GgmlType::Q5_K, dot_q5_k),
        (GgmlType::Q6_K, dot_q6_k),
    ]
}

/// Declares the safe [`DotFn`] wrapper `$name` of the NEON kernel `$kernel`.
macro_rules! safe_dot_neon {
    ($name:ident, $kernel:ident) => {
        #[doc = concat!("Safe wrapper of [`", stringify!($kernel), "`], installed only at the NEON dot-product level.")]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: `dots` lists this function only for the
            // NEON dot-product level, which `Kernels::for_level` checked
            // against the CPU.
            unsafe { $kernel(w, a) }
        }
    };
}

safe_dot_neon!(dot_f32, f32_dot);
safe_dot_neon!(dot_f16, f16_dot);
safe_dot_neon!(dot_bf16, bf16_dot);
safe_dot_neon!(dot_q8_0, q8_0_dot);
safe_dot_neon!(dot_q4_0, q4_0_dot);
safe_dot_neon!(dot_q4_1, q4_1_dot);
safe_dot_neon!(dot_q5_0, q5_0_dot);
safe_dot_neon!(dot_q5_1, q5_1_dot);
safe_dot_neon!(dot_iq4_nl, iq4_nl_dot);
safe_dot_neon!(dot_q2_k, q2_k_dot);
safe_dot_neon!(dot_q3_k, q3_k_dot);
safe_dot_neon!(dot_q4_k, q4_k_dot);
safe_dot_neon!(dot_q5_k, q5_k_dot);
safe_dot_neon!(dot_q6_k, q6_k_dot);

/// `acc + Σ` of the four `i8 × i8` products of each 32-bit lane (`sdot`).
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction, available by the caller's promise.
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Exact f16 → f32 from the bits (no `f16` type on stable Rust): the
/// exponent is rebased by a multiplication by 2^112, which is exact for
/// normal and subnormal values; infinities and NaNs are rebuilt.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let rest = (h & 0x7fff) as u32;
    if rest >= 0x7c00 {
        return f32::from_bits(sign | 0x7f80_0000 | ((rest & 0x3ff) << 13));
    }
    let magnitude = f32::from_bits(rest << 13) * f32::from_bits(0x7780_0000); // 2^112
    f32::from_bits(sign | magnitude.to_bits())
}

/// Loads 32 bytes as two vectors.
///
/// # Safety
/// The CPU must support NEON; `p..p + 32` readable.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn load32(p: *const u8) -> (int8x16_t, int8x16_t) {
    (vld1q_s8(p.cast()), vld1q_s8(p.add(16).cast()))
}

/// Row loop of the 32-value formats with Q8_0 activations: `$body`
/// (`$wb` the weight block, `$aq` the activation quants) returns the
/// block's `i32` lanes, scaled by `d_w·d_a` and summed.
macro_rules! q8_0_row {
    ($w:expr, $a:expr, $wsize:expr, |$wb:ident, $aq:ident| $body:expr) => {{
        let (w, a): (&[u8], &[u8]) = ($w, $a);
        let nb = (w.len() / $wsize).min(a.len() / L::Q8_0);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 2];
        for i in 0..nb {
            // SAFETY (of every read of this iteration): block `i < nb` lies
            // inside both slices.
            let $wb = wp.add(i * $wsize);
            let ab = ap.add(i * L::Q8_0);
            let $aq = ab.add(L::Q8_0_QS);
            let sum: int32x4_t = $body;
            let d = f16_to_f32(read_u16($wb)) * f16_to_f32(read_u16(ab));
            acc[i & 1] = vfmaq_f32(acc[i & 1], vcvtq_f32_s32(sum), vdupq_n_f32(d));
        }
        vaddvq_f32(vaddq_f32(acc[0], acc[1]))
    }};
}

/// Q8_0 × Q8_0.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q8_0_dot(w: &[u8], a: &[u8]) -> f32 {
    q8_0_row!(w, a, L::Q8_0, |wb, aq| {
        let (w0, w1) = load32(wb.add(L::Q8_0_QS));
        let (a0, a1) = load32(aq);
        sdot(sdot(vdupq_n_s32(0), w0, a0), w1, a1)
    })
}

/// The 32 codes of a 16-byte nibble array as bytes: low nibbles (values
/// 0..16), high nibbles (16..32).
///
/// # Safety
/// The CPU must support NEON; `p..p + 16` readable.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let q = vld1q_u8(p);
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

/// Q4_0 × Q8_0: codes `q - 8` as signed bytes.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q4_0_dot(w: &[u8], a: &[u8]) -> f32 {
    let eight = vdupq_n_s8(8);
    q8_0_row!(w, a, L::Q4_0, |wb, aq| {
        let (lo, hi) = nibbles(wb.add(L::Q4_0_QS));
        let (a0, a1) = load32(aq);
        let x0 = vsubq_s8(vreinterpretq_s8_u8(lo), eight);
        let x1 = vsubq_s8(vreinterpretq_s8_u8(hi), eight);
        sdot(sdot(vdupq_n_s32(0), x0, a0), x1, a1)
    })
}

/// Bytes `0x10` where bit `j` of the 16 bits `bits` is set (byte `j`).
///
/// # Safety
/// The CPU must support NEON.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn bits_to_0x10(bits: u16) -> uint8x16_t {
    const SELECT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let spread = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
    vandq_u8(vtstq_u8(spread, vld1q_u8(SELECT.as_ptr())), vdupq_n_u8(0x10))
}

/// Q5_0 × Q8_0: codes `nibble | 16·bit`, minus 16, as signed bytes.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q5_0_dot(w: &[u8], a: &[u8]) -> f32 {
    let sixteen = vdupq_n_s8(16);
    q8_0_row!(w, a, L::Q5_0, |wb, aq| {
        let qh = read_u32(wb.add(L::Q5_0_QH));
        let (lo, hi) = nibbles(wb.add(L::Q5_0_QS));
        let lo = vorrq_u8(lo, bits_to_0x10(qh as u16));
        let hi = vorrq_u8(hi, bits_to_0x10((qh >> 16) as u16));
        let (a0, a1) = load32(aq);
        let x0 = vsubq_s8(vreinterpretq_s8_u8(lo), sixteen);
        let x1 = vsubq_s8(vreinterpretq_s8_u8(hi), sixteen);
        sdot(sdot(vdupq_n_s32(0), x0, a0), x1, a1)
    })
}

/// Row loop of Q4_1 / Q5_1 with Q8_1: as [`q8_0_row!`], plus `m_w·s_a`
/// per block (`m` at offset 2 of the weight block, `s` at offset 2 of
/// Q8_1, whose quants start at offset 4).
macro_rules! q8_1_row {
    ($w:expr, $a:expr, $wsize:expr, |$wb:ident, $aq:ident| $body:expr) => {{
        let (w, a): (&[u8], &[u8]) = ($w, $a);
        let nb = (w.len() / $wsize).min(a.len() / L::Q8_1);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        let mut acc = vdupq_n_f32(0.0);
        let mut mins = 0f32;
        for i in 0..nb {
            // SAFETY (of every read of this iteration): block `i < nb` lies
            // inside both slices.
            let $wb = wp.add(i * $wsize);
            let ab = ap.add(i * L::Q8_1);
            let $aq = ab.add(L::Q8_1_QS);
            let sum: int32x4_t = $body;
            let d = f16_to_f32(read_u16($wb)) * f16_to_f32(read_u16(ab));
            acc = vfmaq_f32(acc, vcvtq_f32_s32(sum), vdupq_n_f32(d));
            mins += f16_to_f32(read_u16($wb.add(L::Q4_1_M))) * f16_to_f32(read_u16(ab.add(L::Q8_1_S)));
        }
        vaddvq_f32(acc) + mins
    }};
}

/// Q4_1 × Q8_1: `d_w·d_a·Σ q·a + m_w·s_a`.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q4_1_dot(w: &[u8], a: &[u8]) -> f32 {
    q8_1_row!(w, a, L::Q4_1, |wb, aq| {
        let (lo, hi) = nibbles(wb.add(L::Q4_1_QS));
        let (a0, a1) = load32(aq);
        sdot(sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(lo), a0), vreinterpretq_s8_u8(hi), a1)
    })
}

/// Q5_1 × Q8_1: codes `nibble | 16·bit`, then as Q4_1.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q5_1_dot(w: &[u8], a: &[u8]) -> f32 {
    q8_1_row!(w, a, L::Q5_1, |wb, aq| {
        let qh = read_u32(wb.add(L::Q5_1_QH));
        let (lo, hi) = nibbles(wb.add(L::Q5_1_QS));
        let lo = vorrq_u8(lo, bits_to_0x10(qh as u16));
        let hi = vorrq_u8(hi, bits_to_0x10((qh >> 16) as u16));
        let (a0, a1) = load32(aq);
        sdot(sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(lo), a0), vreinterpretq_s8_u8(hi), a1)
    })
}

/// IQ4_NL × Q8_0: nibbles looked up in the 16-level table (`tbl`).
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn iq4_nl_dot(w: &[u8], a: &[u8]) -> f32 {
    let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    q8_0_row!(w, a, L::IQ4_NL, |wb, aq| {
        let (lo, hi) = nibbles(wb.add(L::IQ4_NL_QS));
        let (a0, a1) = load32(aq);
        sdot(sdot(vdupq_n_s32(0), vqtbl1q_s8(table, lo), a0), vqtbl1q_s8(table, hi), a1)
    })
}

/// `Σ_g c_g · bsum_g` of a Q8_K block for 16 per-group `i16` factors.
///
/// # Safety
/// The CPU must support NEON; `ab` must point to a readable Q8_K block.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn bsums_dot(ab: *const u8, c: int16x8x2_t) -> i32 {
    let bs = ab.add(L::Q8_K_BSUMS).cast::<i16>();
    let (b0, b1) = (vld1q_s16(bs), vld1q_s16(bs.add(8)));
    let p = vaddq_s32(
        vaddq_s32(vmull_s16(vget_low_s16(b0), vget_low_s16(c.0)), vmull_high_s16(b0, c.0)),
        vaddq_s32(vmull_s16(vget_low_s16(b1), vget_low_s16(c.1)), vmull_high_s16(b1, c.1)),
    );
    vaddvq_s32(p)
}

/// Q2_K × Q8_K: 2-bit codes, 16 groups of 16 with 4-bit scales (low nibble
/// of `scales[g]`) and mins (high nibble);
/// `d_a·(d·Σ_g sc_g·Σ q·a − dmin·Σ_g m_g·bsum_g)`.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q2_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / L::Q2_K).min(a.len() / L::Q8_K);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let three = vdupq_n_u8(3);
    let mut sum = 0f32;
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q2_K);
        let ab = ap.add(i * L::Q8_K);
        let aq = ab.add(L::Q8_K_QS);
        let da = read_f32(ab);
        let d = f16_to_f32(read_u16(wb.add(L::Q2_K_D))) * da;
        let dmin = f16_to_f32(read_u16(wb.add(L::Q2_K_DMIN))) * da;
        let packed = vld1q_u8(wb);
        let m = vshrq_n_u8::<4>(packed);
        let mins =
            int16x8x2_t(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m))), vreinterpretq_s16_u16(vmovl_high_u8(m)));
        let msum = bsums_dot(ab, mins);
        let sc = wb; // low nibbles of scales[g]
        let mut sumi = 0i32;
        for n in 0..2 {
            let q = wb.add(L::Q2_K_QS + 32 * n);
            let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
            for j in 0..4 {
                let shift = vdupq_n_s8(-2 * j as i8);
                let c0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, shift), three));
                let c1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, shift), three));
                let y0 = vld1q_s8(aq.add(128 * n + 32 * j).cast());
                let y1 = vld1q_s8(aq.add(128 * n + 32 * j + 16).cast());
                let g = 8 * n + 2 * j;
                sumi += vaddvq_s32(sdot(vdupq_n_s32(0), c0, y0)) * (*sc.add(g) & 0xf) as i32;
                sumi += vaddvq_s32(sdot(vdupq_n_s32(0), c1, y1)) * (*sc.add(g + 1) & 0xf) as i32;
            }
        }
        sum += d * sumi as f32 - dmin * msum as f32;
    }
    sum
}

/// Q3_K × Q8_K: codes `low2 | hbit << 2` minus 4 as signed bytes, 16 groups
/// of 16 with signed 6-bit scales.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q3_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / L::Q3_K).min(a.len() / L::Q8_K);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let three = vdupq_n_u8(3);
    let four = vdupq_n_u8(4);
    let mut sum = 0f32;
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q3_K);
        let ab = ap.add(i * L::Q8_K);
        let aq = ab.add(L::Q8_K_QS);
        let d = f16_to_f32(read_u16(wb.add(L::Q3_K_D))) * read_f32(ab);
        let scales = q3k_scales(wb.add(L::Q3_K_SCALES).cast::<[u8; 12]>().read_unaligned());
        let (h0, h1) = (vld1q_u8(wb), vld1q_u8(wb.add(16)));
        let mut sumi = 0i32;
        for n in 0..2 {
            let q = wb.add(L::Q3_K_QS + 32 * n);
            let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
            for j in 0..4 {
                let shift = vdupq_n_s8(-2 * j as i8);
                let bit = vdupq_n_u8(1 << (4 * n + j));
                let u0 = vorrq_u8(vandq_u8(vshlq_u8(q0, shift), three), vandq_u8(vtstq_u8(h0, bit), four));
                let u1 = vorrq_u8(vandq_u8(vshlq_u8(q1, shift), three), vandq_u8(vtstq_u8(h1, bit), four));
                let c0 = vsubq_s8(vreinterpretq_s8_u8(u0), vreinterpretq_s8_u8(four));
                let c1 = vsubq_s8(vreinterpretq_s8_u8(u1), vreinterpretq_s8_u8(four));
                let y0 = vld1q_s8(aq.add(128 * n + 32 * j).cast());
                let y1 = vld1q_s8(aq.add(128 * n + 32 * j + 16).cast());
                let g = 8 * n + 2 * j;
                sumi += vaddvq_s32(sdot(vdupq_n_s32(0), c0, y0)) * scales[g] as i32;
                sumi += vaddvq_s32(sdot(vdupq_n_s32(0), c1, y1)) * scales[g + 1] as i32;
            }
        }
        sum += d * sumi as f32;
    }
    sum
}

/// Q4_K × Q8_K: `d_a·(d·Σ_g sc_g·Σ q·a − dmin·Σ_g m_g·(bsum_2g + bsum_2g+1))`.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q4_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / L::Q4_K).min(a.len() / L::Q8_K);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low4 = vdupq_n_u8(0x0f);
    let mut sum = 0f32;
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q4_K);
        let ab = ap.add(i * L::Q8_K);
        let aq = ab.add(L::Q8_K_QS);
        let da = read_f32(ab);
        let d = f16_to_f32(read_u16(wb)) * da;
        let dmin = f16_to_f32(read_u16(wb.add(L::Q4_K_DMIN))) * da;
        let sm = k4_scales_mins(wb.add(L::Q4_K_SCALES).cast::<[u8; 12]>().read_unaligned()).to_le_bytes();
        // Mins against the pairwise group sums.
        let bs = ab.add(L::Q8_K_BSUMS).cast::<i16>();
        let pairs = vpaddq_s16(vld1q_s16(bs), vld1q_s16(bs.add(8)));
        let mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm.as_ptr().add(8))));
        let pm = vaddq_s32(vmull_s16(vget_low_s16(pairs), vget_low_s16(mins)), vmull_high_s16(pairs, mins));
        let mut sumi = 0i32;
        for j in 0..4 {
            let q = wb.add(L::Q4_K_QS + 32 * j);
            let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
            let (a0, a1) = load32(aq.add(64 * j));
            let (a2, a3) = load32(aq.add(64 * j + 32));
            let lo0 = vreinterpretq_s8_u8(vandq_u8(q0, low4));
            let lo1 = vreinterpretq_s8_u8(vandq_u8(q1, low4));
            let hi0 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q0));
            let hi1 = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q1));
            let p_lo = vaddvq_s32(sdot(sdot(vdupq_n_s32(0), lo0, a0), lo1, a1));
            let p_hi = vaddvq_s32(sdot(sdot(vdupq_n_s32(0), hi0, a2), hi1, a3));
            sumi += p_lo * sm[2 * j] as i32 + p_hi * sm[2 * j + 1] as i32;
        }
        sum += d * sumi as f32 - dmin * vaddvq_s32(pm) as f32;
    }
    sum
}

/// Q5_K × Q8_K: Q4_K with a fifth bit per code from `qh` (bit `2j` for the
/// low nibbles of `qs[32j..]`, bit `2j + 1` for the high nibbles).
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q5_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / L::Q5_K).min(a.len() / L::Q8_K);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low4 = vdupq_n_u8(0x0f);
    let bit4 = vdupq_n_u8(0x10);
    let mut sum = 0f32;
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q5_K);
        let ab = ap.add(i * L::Q8_K);
        let aq = ab.add(L::Q8_K_QS);
        let da = read_f32(ab);
        let d = f16_to_f32(read_u16(wb)) * da;
        let dmin = f16_to_f32(read_u16(wb.add(L::Q5_K_DMIN))) * da;
        let sm = k4_scales_mins(wb.add(L::Q5_K_SCALES).cast::<[u8; 12]>().read_unaligned()).to_le_bytes();
        let bs = ab.add(L::Q8_K_BSUMS).cast::<i16>();
        let pairs = vpaddq_s16(vld1q_s16(bs), vld1q_s16(bs.add(8)));
        let mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm.as_ptr().add(8))));
        let pm = vaddq_s32(vmull_s16(vget_low_s16(pairs), vget_low_s16(mins)), vmull_high_s16(pairs, mins));
        let (qh0, qh1) = (vld1q_u8(wb.add(L::Q5_K_QH)), vld1q_u8(wb.add(L::Q5_K_QH + 16)));
        let mut sumi = 0i32;
        for j in 0..4 {
            let q = wb.add(L::Q5_K_QS + 32 * j);
            let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
            let (b_lo, b_hi) = (vdupq_n_u8(1 << (2 * j)), vdupq_n_u8(2 << (2 * j)));
            let (a0, a1) = load32(aq.add(64 * j));
            let (a2, a3) = load32(aq.add(64 * j + 32));
            let lo0 = vorrq_u8(vandq_u8(q0, low4), vandq_u8(vtstq_u8(qh0, b_lo), bit4));
            let lo1 = vorrq_u8(vandq_u8(q1, low4), vandq_u8(vtstq_u8(qh1, b_lo), bit4));
            let hi0 = vorrq_u8(vshrq_n_u8::<4>(q0), vandq_u8(vtstq_u8(qh0, b_hi), bit4));
            let hi1 = vorrq_u8(vshrq_n_u8::<4>(q1), vandq_u8(vtstq_u8(qh1, b_hi), bit4));
            let p_lo =
                vaddvq_s32(sdot(sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(lo0), a0), vreinterpretq_s8_u8(lo1), a1));
            let p_hi =
                vaddvq_s32(sdot(sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(hi0), a2), vreinterpretq_s8_u8(hi1), a3));
            sumi += p_lo * sm[2 * j] as i32 + p_hi * sm[2 * j + 1] as i32;
        }
        sum += d * sumi as f32 - dmin * vaddvq_s32(pm) as f32;
    }
    sum
}

/// Q6_K × Q8_K: codes `low4 | high2 << 4` minus 32 as signed bytes, 16
/// groups of 16 with signed 8-bit scales.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q6_k_dot(w: &[u8], a: &[u8]) -> f32 {
    let nb = (w.len() / L::Q6_K).min(a.len() / L::Q8_K);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let low4 = vdupq_n_u8(0x0f);
    let three = vdupq_n_u8(3);
    let m32 = vdupq_n_s8(32);
    let mut sum = 0f32;
    for i in 0..nb {
        // SAFETY (of every read of this iteration): block `i < nb` lies
        // inside both slices.
        let wb = wp.add(i * L::Q6_K);
        let ab = ap.add(i * L::Q8_K);
        let aq = ab.add(L::Q8_K_QS);
        let d = f16_to_f32(read_u16(wb.add(L::Q6_K_D))) * read_f32(ab);
        let sc = wb.add(L::Q6_K_SCALES).cast::<i8>();
        let mut sumi = 0i32;
        for n in 0..2 {
            let ql = wb.add(64 * n);
            let qh = wb.add(L::Q6_K_QH + 32 * n);
            for h in 0..2 {
                // 16 of the 32 positions `l` of this half.
                let l0 = ql.add(16 * h);
                let l1 = ql.add(32 + 16 * h);
                let (ql0, ql1, qhv) = (vld1q_u8(l0), vld1q_u8(l1), vld1q_u8(qh.add(16 * h)));
                let codes = [
                    vorrq_u8(vandq_u8(ql0, low4), vshlq_n_u8::<4>(vandq_u8(qhv, three))),
                    vorrq_u8(vandq_u8(ql1, low4), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qhv), three))),
                    vorrq_u8(vshrq_n_u8::<4>(ql0), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qhv), three))),
                    vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qhv))),
                ];
                for (k, c) in codes.into_iter().enumerate() {
                    // Values 128n + 32k + 16h .. +16: group 8n + 2k + h.
                    let x = vsubq_s8(vreinterpretq_s8_u8(c), m32);
                    let y = vld1q_s8(aq.add(128 * n + 32 * k + 16 * h).cast());
                    let g = 8 * n + 2 * k + h;
                    sumi += vaddvq_s32(sdot(vdupq_n_s32(0), x, y)) * *sc.add(g) as i32;
                }
            }
        }
        sum += d * sumi as f32;
    }
    sum
}

/// F32 × F32, 16 values per iteration.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn f32_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 4;
    let (wp, ap) = (w.as_ptr().cast::<f32>(), a.as_ptr().cast::<f32>());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY (of every read below): element indices stay below `n`; `ld1`
    // needs no alignment beyond the element's, and the reads of single
    // values use `read_unaligned`.
    while i + 16 <= n {
        for (j, acc) in acc.iter_mut().enumerate() {
            let x = vld1q_f32(wp.cast::<u8>().add(4 * (i + 4 * j)).cast());
            let y = vld1q_f32(ap.cast::<u8>().add(4 * (i + 4 * j)).cast());
            *acc = vfmaq_f32(*acc, x, y);
        }
        i += 16;
    }
    let mut sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    while i < n {
        sum += wp.add(i).read_unaligned() * ap.add(i).read_unaligned();
        i += 1;
    }
    sum
}

/// Exact f16 → f32 of 4 lanes (the vector form of [`f16_to_f32`]).
///
/// # Safety
/// The CPU must support NEON.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let h = vmovl_u16(h);
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let rest = vandq_u32(h, vdupq_n_u32(0x7fff));
    let scaled = vmulq_f32(vreinterpretq_f32_u32(vshlq_n_u32::<13>(rest)), vdupq_n_f32(f32::from_bits(0x7780_0000)));
    let special = vorrq_u32(vdupq_n_u32(0x7f80_0000), vshlq_n_u32::<13>(vandq_u32(rest, vdupq_n_u32(0x3ff))));
    let is_special = vcgeq_u32(rest, vdupq_n_u32(0x7c00));
    let mag = vbslq_u32(is_special, special, vreinterpretq_u32_f32(scaled));
    vreinterpretq_f32_u32(vorrq_u32(mag, sign))
}

/// F16 × F16 (products and sums in f32), 16 values per iteration.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn f16_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 2;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY (of every read below): element indices stay below `n`.
    while i + 16 <= n {
        for (j, acc) in acc.iter_mut().enumerate() {
            let x = f16x4_to_f32(vld1_u16(wp.add(2 * (i + 4 * j)).cast()));
            let y = f16x4_to_f32(vld1_u16(ap.add(2 * (i + 4 * j)).cast()));
            *acc = vfmaq_f32(*acc, x, y);
        }
        i += 16;
    }
    let mut sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    while i < n {
        sum += f16_to_f32(read_u16(wp.add(2 * i))) * f16_to_f32(read_u16(ap.add(2 * i)));
        i += 1;
    }
    sum
}

/// BF16 × BF16 (products and sums in f32), 16 values per iteration.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn bf16_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len().min(a.len()) / 2;
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let widen = |h: uint16x4_t| vreinterpretq_f32_u32(vshll_n_u16::<16>(h));
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY (of every read below): element indices stay below `n`.
    while i + 16 <= n {
        for (j, acc) in acc.iter_mut().enumerate() {
            let x = widen(vld1_u16(wp.add(2 * (i + 4 * j)).cast()));
            let y = widen(vld1_u16(ap.add(2 * (i + 4 * j)).cast()));
            *acc = vfmaq_f32(*acc, x, y);
        }
        i += 16;
    }
    let mut sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    let bf = |p: *const u8| f32::from_bits((read_u16(p) as u32) << 16);
    while i < n {
        sum += bf(wp.add(2 * i)) * bf(ap.add(2 * i));
        i += 1;
    }
    sum
}
