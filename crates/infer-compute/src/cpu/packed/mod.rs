//! Weights repacked once for the x86-64 SIMD products (AVX-512 VNNI and
//! AVX2), and the products.
//!
//! GGUF stores a matrix row by row, so a row-dot kernel reduces 32 values of
//! one row across the lanes of a vector and pays a horizontal sum per block
//! per token. Here 16 rows are interleaved so that lane `j` of a 512-bit
//! vector holds 4 consecutive codes of row `j`: one `vpdpbusd` (u8 × i8 → i32)
//! with 4 broadcast activation bytes advances 16 rows by 4 values, and after
//! a block every lane holds its row's exact integer block dot. No horizontal
//! sums remain, and in prefill the unpacked weights are shared by a tile of
//! up to [`TILE`] tokens. ggml repacks Q4_0 the same way for its AVX and ARM
//! GEMMs (`ggml-cpu/repack.cpp`); the layouts below are ours. Without VNNI,
//! the AVX2 kernels take each group as two 256-bit halves and emulate
//! `vpdpbusd` exactly, so both levels give the same bits.
//!
//! Decode (one token) and prefill (many) run the same kernel, and for every
//! (row, token) it performs the same f32 operations in the same order, so
//! the two give bit-identical results: in formats whose activations are
//! re-quantized between layers, any difference would flip roundings
//! downstream and grow.
//!
//! # Arithmetic (per row and token; [`PackedWeight::dot_ref`] is its scalar
//! statement and the SIMD kernels match it bit for bit)
//! - Q4_0, Q5_0, Q8_0, IQ4_NL (activations Q8_0): for each 32-block `b` in
//!   order, `acc = fma(f32(Σ q·a), w_d · a_d, acc)` with the integer sum exact.
//! - Q4_1, Q5_1 (activations Q8_1, whose codes and `a_d` are Q8_0's): value
//!   `w_d·q + w_m` with unsigned `q`, so for each 32-block
//!   `acc = fma(fma(w_d, f32(Σ q·a), w_m · f32(Σ a)), a_d, acc)`. The
//!   activation sum is the exact integer one, not Q8_1's f16 `s = a_d·Σ a`
//!   that ggml's row dot uses, so results differ from the row-dot path by
//!   up to about `|w_m|·|s|·2⁻¹¹` per block (the packed side is the closer).
//! - Q4_K (activations Q8_K): per super-block `S = Σ_j sc_j·Σ q·a` and
//!   `M = Σ_j m_j·Σ a` over the eight sub-blocks (exact), then
//!   `acc = fma(fma(d, f32(S), -(dmin · f32(M))), a_d, acc)`.
//! - Q6_K (activations Q8_K): `X = Σ_j sc_j·Σ q·a - 32·Σ_j sc_j·Σ a` over the
//!   16 sub-blocks (exact), then `acc = fma(f32(X), d · a_d, acc)`.
//!
//! Unsigned codes meet signed activations in `vpdpbusd`; the formats' offsets
//! (Q4_0's 8, Q5_0's 16, and 128 for the biased Q8_0 and IQ4_NL codes) are
//! taken back through the activation block sums, which start each integer
//! accumulator, so every lane ends at the exact `Σ q·a`. Q4_1 and Q5_1
//! codes have no offset (their accumulators start at zero); the block sum
//! enters through `w_m` instead.

//!
//! Files: `format.rs` (the layouts), `weight.rs` (packing, and the scalar
//! statement), `acts.rs` (the activations), `avx512.rs` and `avx2.rs` (the
//! kernels of each level), this one (which level runs, over which rows and
//! tokens).

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod format;
mod weight;

pub use acts::PackedActs;
pub use format::{layout, GROUP, TILE};
pub use weight::PackedWeight;

use super::kernels::{Kernels, SimdLevel};
use super::team::Par;
use crate::error::{shape_err, Result};
use crate::GgmlType;

/// Whether `ty` is packed on this kernel level: AVX-512 VNNI
/// (`vpdpbusd` on 512-bit vectors) or AVX2 (the same sums emulated exactly,
/// on 256-bit halves of each group; same results).
pub fn supported(k: &Kernels, ty: GgmlType) -> bool {
    matches!(k.level(), SimdLevel::Avx512Vnni | SimdLevel::Avx2) && layout(ty).is_some()
}

/// Read streams per task in decode: the groups `g0..g1` are visited as
/// `STREAMS` interleaved sub-ranges, because one sequential stream per core
/// does not keep enough reads in flight to saturate DRAM (the same reason as
/// in `matvec::matvec_quantized`).
const STREAMS: usize = 4;

/// `g0..g1` as `s` interleaved sub-ranges: `g0, g0 + part, .., g0 + 1, ..`.
fn stream_order(g0: usize, g1: usize, s: usize) -> impl Iterator<Item = usize> {
    let part = (g1 - g0).div_ceil(s.max(1)).max(1);
    (0..part).flat_map(move |i| (0..s.max(1)).map(move |k| g0 + k * part + i)).filter(move |&g| g < g1)
}

/// A pointer to the output that tasks writing disjoint rows share.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task of `matmul` writes only the rows of its own groups.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `Y = X·Wᵀ`: `a` holds `n_tokens` quantized activations of `w.cols()`
/// values, `y` is `n_tokens × w.rows()` (row-major). Groups of rows are
/// split across the thread pool; each group meets the tokens in tiles of
/// [`TILE`]. On other levels (only in tests: models pack only where a
/// kernel exists) the scalar [`PackedWeight::dot_ref`] computes the same values.
///
/// # Errors
/// Activations of another type or length; `y` of the wrong length.
pub fn matmul(k: &Kernels, w: &PackedWeight, a: &PackedActs, y: &mut [f32]) -> Result<()> {
    matmul_on(k, Par::Rayon, w, a, y)
}

/// [`matmul`] with its tasks run on `par`.
///
/// # Errors
/// As [`matmul`].
pub fn matmul_on(k: &Kernels, par: Par<'_>, w: &PackedWeight, a: &PackedActs, y: &mut [f32]) -> Result<()> {
    let n = a.n_tokens;
    if a.kind != w.ty.vec_dot_type() || a.cols != w.cols || n.checked_mul(w.rows) != Some(y.len()) {
        return Err(shape_err(
            "packed matmul",
            format!("W is {} {}x{}, activations {:?} {n}x{}, y has {}", w.ty, w.rows, w.cols, a.kind, a.cols, y.len()),
        ));
    }
    let groups = w.rows.div_ceil(GROUP);
    let threads = par.threads().max(1);
    // Decode: a few large tasks per thread (each reads several streams).
    // Prefill: about 16 tasks per thread, so that a core slowed by other
    // work hands groups to the others instead of holding up the join.
    let per_task = groups.div_ceil(threads * if n == 1 { 4 } else { 16 }).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let level = k.level();
    par.for_each(groups.div_ceil(per_task), |task| {
        // Moves the whole `OutPtr` (Send) into the closure; without it the
        // closure would capture only its raw-pointer field, which is not.
        #[allow(clippy::redundant_locals)]
        let out = out;
        let (g0, g1) = (task * per_task, ((task + 1) * per_task).min(groups));
        for g in stream_order(g0, g1, if n == 1 { STREAMS } else { 1 }) {
            let valid = (w.rows - g * GROUP).min(GROUP);
            let mut t = 0;
            while t < n {
                let m = (n - t).min(TILE);
                if matches!(level, SimdLevel::Avx512Vnni | SimdLevel::Avx2) {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the level (AVX-512 VNNI, or AVX2 with FMA and
                    // F16C) was checked against this CPU by
                    // `Kernels::for_level`; the group holds `w.nb` scale
                    // entries and, 64-byte aligned, `w.nb` code records of
                    // `w.ty`; `a` holds tokens `t..t + m` of `w.cols` values
                    // (checked above); the kernel writes lanes `..valid` of
                    // rows `t..t + m` of `y` at columns `16g..`, inside `y`
                    // and owned by this task alone.
                    unsafe {
                        let group = w.group(g).as_ptr();
                        let (scales, codes) = (group, group.add(w.codes_at()));
                        let y = out.0.add(t * w.rows + g * GROUP);
                        if level == SimdLevel::Avx512Vnni {
                            avx512::tile(w.ty, scales, codes, w.nb, a, t, m, y, w.rows, valid);
                        } else {
                            avx2::tile(w.ty, scales, codes, w.nb, a, t, m, y, w.rows, valid);
                        }
                    }
                } else {
                    for tt in t..t + m {
                        for j in 0..valid {
                            let v = w.dot_ref(g * GROUP + j, a, tt);
                            // SAFETY: as above, inside `y` and owned by this task.
                            unsafe { *out.0.add(tt * w.rows + g * GROUP + j) = v };
                        }
                    }
                }
                t += m;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::AlignedBytes;
    use crate::cpu::matvec;
    use crate::quant::{self, QK};
    use crate::{Error, QuantWeight};

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }

    fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<f32>, QuantWeight) {
        let mut rnd = rng(seed);
        // Rows of different magnitudes, so that scales differ across lanes.
        let wf: Vec<f32> = (0..rows * cols).map(|i| rnd() * (1.0 + (i / cols % 5) as f32)).collect();
        let rb = ty.row_bytes(cols).unwrap();
        let mut wq = vec![0u8; rows * rb];
        for r in 0..rows {
            quant::quantize_row(ty, &wf[r * cols..(r + 1) * cols], &mut wq[r * rb..(r + 1) * rb]).unwrap();
        }
        (wf, QuantWeight::new(ty, rows, cols, wq.into()).unwrap())
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    /// Awkward shapes: one row, rows not a multiple of 16, one block, many
    /// blocks, token counts below, at and past a tile.
    fn shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
        let bs = ty.block_size();
        vec![(1, bs, 1), (17, 7 * bs.min(32), 3), (33, 2048, 9), (16, 20 * 32, 8), (40, 3 * bs, 13), (5, bs, 17)]
            .into_iter()
            .map(|(r, c, n)| (r, c.div_ceil(bs) * bs, n))
            .collect()
    }

    #[test]
    fn kernels_match_the_scalar_statement_bit_for_bit_and_the_reference_dot() {
        for level in SimdLevel::all_available() {
            let k = Kernels::for_level(level);
            if !supported(&k, GgmlType::Q8_0) {
                println!("packed kernels: level {} has none (the scalar statement is checked instead)", level.name());
            }
            check_level(&k);
        }
    }

    fn check_level(best: &Kernels) {
        let best = *best;
        let scalar = Kernels::for_level(SimdLevel::Scalar);
        for ty in TYPES {
            for (rows, cols, n) in shapes(ty) {
                let (wf, qw) = weight(ty, rows, cols, (rows * 131 + cols + n) as u64);
                let pw = PackedWeight::new(&qw).unwrap();
                let mut rnd = rng(cols as u64 * 7 + n as u64);
                let x: Vec<f32> = (0..n * cols).map(|i| rnd() * if i % 97 == 0 { 300.0 } else { 2.0 }).collect();
                let mut scratch = AlignedBytes::default();
                let mut a = PackedActs::default();
                a.quantize(&best, ty, &x, n, cols, &mut scratch).unwrap();
                let mut y = vec![f32::NAN; n * rows];
                matmul(&best, &pw, &a, &mut y).unwrap();
                for t in 0..n {
                    // One token at a time (decode) gives the same bits.
                    let mut a1 = PackedActs::default();
                    a1.quantize(&best, ty, &x[t * cols..(t + 1) * cols], 1, cols, &mut scratch).unwrap();
                    let mut y1 = vec![f32::NAN; rows];
                    matmul(&best, &pw, &a1, &mut y1).unwrap();
                    let mut want = vec![0f32; rows];
                    matvec::matvec(&scalar, &qw, &x[t * cols..(t + 1) * cols], &mut want, &mut scratch).unwrap();
                    for r in 0..rows {
                        let got = y[t * rows + r];
                        let stmt = pw.dot_ref(r, &a, t);
                        assert_eq!(
                            got.to_bits(),
                            stmt.to_bits(),
                            "{} {ty} {rows}x{cols} n={n} t={t} r={r}: kernel {got} vs statement {stmt}",
                            best.level().name()
                        );
                        assert_eq!(
                            y1[r].to_bits(),
                            got.to_bits(),
                            "{ty} {rows}x{cols} n={n} t={t} r={r}: decode {} vs prefill {got}",
                            y1[r]
                        );
                        let mag: f32 = (0..cols).map(|c| (wf[r * cols + c] * x[t * cols + c]).abs()).sum();
                        // The reference adds `w_m · s` with Q8_1's f16 block
                        // sum `s` (module docs): allow its rounding.
                        let min_term: f32 = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                            (0..cols / QK)
                                .map(|b| {
                                    let blk = b * QK..(b + 1) * QK;
                                    let wmax = wf[r * cols..][blk.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
                                    let xsum: f32 = x[t * cols..][blk].iter().map(|v| v.abs()).sum();
                                    wmax * xsum / 1024.0
                                })
                                .sum()
                        } else {
                            0.0
                        };
                        assert!(
                            (got - want[r]).abs() <= 2e-5 * mag + 1e-6 + min_term,
                            "{ty} {rows}x{cols} t={t} r={r}: {got} vs reference {}",
                            want[r]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn stream_order_visits_every_group_once() {
        for (g0, g1, s) in [(0, 0, 4), (0, 1, 4), (3, 10, 4), (0, 16, 4), (5, 6, 1), (0, 13, 3)] {
            let mut v: Vec<usize> = stream_order(g0, g1, s).collect();
            v.sort();
            assert_eq!(v, (g0..g1).collect::<Vec<_>>(), "{g0}..{g1} in {s} streams");
        }
    }

    #[test]
    fn a_nan_activation_gives_nan_outputs_on_every_level() {
        for ty in TYPES {
            let cols = ty.block_size() * 2;
            let (_, qw) = weight(ty, 17, cols, 5);
            let pw = PackedWeight::new(&qw).unwrap();
            let mut x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            x[cols / 2 + 10] = f32::NAN; // in the second block
            for level in SimdLevel::all_available() {
                let k = Kernels::for_level(level);
                let (mut a, mut tmp) = (PackedActs::default(), AlignedBytes::default());
                a.quantize(&k, ty, &x, 1, cols, &mut tmp).unwrap();
                let mut y = vec![0f32; 17];
                matmul(&k, &pw, &a, &mut y).unwrap();
                assert!(y.iter().all(|v| v.is_nan()), "{ty} {}: {y:?}", level.name());
                assert!(pw.dot_ref(3, &a, 0).is_nan());
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let k = Kernels::detect();
        let (_, f16w) = weight(GgmlType::F16, 2, 32, 1);
        assert!(matches!(PackedWeight::new(&f16w), Err(Error::Unsupported { .. })));
        let (_, qw) = weight(GgmlType::Q8_0, 3, 64, 2);
        let pw = PackedWeight::new(&qw).unwrap();
        let mut a = PackedActs::default();
        let mut scratch = AlignedBytes::default();
        assert!(a.quantize(&k, GgmlType::Q8_0, &[0.0; 63], 1, 64, &mut scratch).is_err());
        a.quantize(&k, GgmlType::Q8_0, &[0.5; 128], 2, 64, &mut scratch).unwrap();
        assert!(matmul(&k, &pw, &a, &mut [0.0; 5]).is_err(), "short output");
        let (_, q4k) = weight(GgmlType::Q4_K, 3, 256, 3);
        let mut a4 = PackedActs::default();
        a4.quantize(&k, GgmlType::Q4_K, &[0.5; 256], 1, 256, &mut scratch).unwrap();
        assert!(matmul(&k, &pw, &a4, &mut [0.0; 3]).is_err(), "Q8_K activations for Q8_0 weights");
        let p4 = PackedWeight::new(&q4k).unwrap();
        let mut y = [0.0; 3];
        matmul(&k, &p4, &a4, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()));
    }
}
