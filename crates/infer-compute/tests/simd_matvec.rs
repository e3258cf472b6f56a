//! Every SIMD level's quantized mat-vec against the scalar reference.
//!
//! For every weight type and every [`SimdLevel`] this processor supports,
//! random f32 weight rows are quantized with `quant::quantize_row` and
//! multiplied with random activations through
//! `cpu::matvec::matvec(&Kernels::for_level(level), ..)`; each output must
//! match the scalar level's within a relative tolerance of the row's
//! `Σ|w·x|` (w dequantized): 1e-5 for the integer paths, whose only
//! difference is the order of the f32 sums, looser for the float types,
//! where the reference sums in another order or in f64.
//!
//! The scalar kernels themselves are checked against ggml's golden dot
//! products by `tests/golden_quant.rs`.
//!
//! Levels this processor lacks are listed as skipped, with the reason.

use infer_compute::cpu::kernels::{AlignedBytes, Kernels, SimdLevel};
use infer_compute::cpu::matvec::matvec;
use infer_compute::{quant, GgmlType};
use infer_compute::{QuantWeight, WeightBytes};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// Every weight type with a dot product.
const WEIGHT_TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
];

/// Every level this crate knows, whether or not this CPU has it.
const ALL_LEVELS: [SimdLevel; 4] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni, SimdLevel::NeonDotprod];

/// Relative tolerance (of `Σ|w·x|`) for the integer paths.
const INT_TOL: f64 = 1e-5;
/// Relative tolerance for the float types (F32 sums in one f32 chain in the
/// reference, F16/BF16 in f64).
const FLOAT_TOL: f64 = 5e-5;

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Why `level` is not available here.
fn skip_reason(level: SimdLevel) -> String {
    let wanted: &[&str] = match level {
        SimdLevel::Scalar => return "always available".into(),
        SimdLevel::Avx2 | SimdLevel::Avx512Vnni if !cfg!(target_arch = "x86_64") => {
            return "not an x86-64 target".into()
        }
        SimdLevel::NeonDotprod if !cfg!(target_arch = "aarch64") => return "not an aarch64 target".into(),
        SimdLevel::Avx2 => &["avx2", "fma", "f16c"],
        SimdLevel::Avx512Vnni => &["avx512f", "avx512bw", "avx512vl", "avx512vnni", "fma", "f16c"],
        SimdLevel::NeonDotprod => &["neon", "dotprod"],
    };
    let missing: Vec<&str> = wanted.iter().copied().filter(|f| !has_feature(f)).collect();
    format!("CPU lacks {}", missing.join(", "))
}

/// Run-time detection of one CPU feature by name.
fn has_feature(name: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match name {
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            "f16c" => std::is_x86_feature_detected!("f16c"),
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => std::is_x86_feature_detected!("avx512vnni"),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match name {
            "neon" => std::arch::is_aarch64_feature_detected!("neon"),
            "dotprod" => std::arch::is_aarch64_feature_detected!("dotprod"),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = name;
        false
    }
}

/// The SIMD levels to test (every available one but scalar), after
/// printing the plan.
fn simd_levels() -> Vec<SimdLevel> {
    let avail = SimdLevel::all_available();
    for l in ALL_LEVELS {
        if avail.contains(&l) {
            eprintln!("level {:<13} runs", l.name());
        } else {
            eprintln!("level {:<13} skipped: {}", l.name(), skip_reason(l));
        }
    }
    avail.into_iter().filter(|l| *l != SimdLevel::Scalar).collect()
}

/// A weight matrix of `rows` quantized random rows. At most `distinct`
/// different rows are quantized (quantizing is slow in test builds); the
/// rest repeat them cyclically, which still checks every row's placement
/// because `distinct` is odd and the rows differ.
fn random_weight(ty: GgmlType, rows: usize, cols: usize, distinct: usize, rng: &mut StdRng) -> (QuantWeight, Vec<f32>) {
    let rb = ty.row_bytes(cols).unwrap();
    let n_distinct = rows.min(distinct);
    let mut pool = vec![0u8; n_distinct * rb];
    let mut deq = vec![0f32; n_distinct * cols];
    for r in 0..n_distinct {
        // Rows of different magnitudes, some with an outlier.
        let scale = 10f32.powf(rng.gen_range(-2.0..1.0));
        let normal = Normal::new(0.0f32, scale).unwrap();
        let mut x: Vec<f32> = (0..cols).map(|_| normal.sample(rng)).collect();
        if r % 5 == 1 {
            let i = rng.gen_range(0..cols);
            x[i] *= 20.0;
        }
        let out = &mut pool[r * rb..(r + 1) * rb];
        quant::quantize_row(ty, &x, out).unwrap();
        quant::dequantize_row(ty, out, &mut deq[r * cols..(r + 1) * cols]).unwrap();
    }
    let mut data = Vec::with_capacity(rows * rb);
    for r in 0..rows {
        let p = r % n_distinct;
        data.extend_from_slice(&pool[p * rb..(p + 1) * rb]);
    }
    let w = QuantWeight::new(ty, rows, cols, WeightBytes::from(data)).unwrap();
    (w, deq)
}

fn random_activation(cols: usize, rng: &mut StdRng) -> Vec<f32> {
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    (0..cols).map(|_| normal.sample(rng) * if rng.gen_bool(0.02) { 8.0 } else { 1.0 }).collect()
}

/// Compares one level's mat-vec with the scalar one on a random matrix.
/// Returns the worst error relative to `Σ|w·x|`.
fn check_shape(level: SimdLevel, ty: GgmlType, rows: usize, cols: usize, rng: &mut StdRng) -> f64 {
    let (w, deq) = random_weight(ty, rows, cols, 33, rng);
    let x = random_activation(cols, rng);
    let mut scratch = AlignedBytes::default();
    let mut want = vec![0f32; rows];
    matvec(&Kernels::for_level(SimdLevel::Scalar), &w, &x, &mut want, &mut scratch).unwrap();
    let kernels = Kernels::for_level(level);
    assert_eq!(kernels.level(), level);
    let mut got = vec![f32::NAN; rows];
    matvec(&kernels, &w, &x, &mut got, &mut scratch).unwrap();

    let n_distinct = rows.min(33);
    let mut scale = vec![0f64; n_distinct];
    for (p, s) in scale.iter_mut().enumerate() {
        *s = deq[p * cols..(p + 1) * cols].iter().zip(&x).map(|(w, x)| (*w as f64 * *x as f64).abs()).sum();
    }
    let tol = if is_float(ty) { FLOAT_TOL } else { INT_TOL };
    let mut worst = 0f64;
    let mut bad = Vec::new();
    for r in 0..rows {
        let s = scale[r % n_distinct];
        let err = (got[r] as f64 - want[r] as f64).abs();
        let rel = err / s.max(f64::from(f32::MIN_POSITIVE));
        worst = worst.max(rel);
        // NaN counts as failing.
        let within = err <= tol * s + f64::from(f32::MIN_POSITIVE);
        if !within {
            bad.push(format!("row {r}: got {} want {} (rel {rel:.2e})", got[r], want[r]));
        }
    }
    assert!(
        bad.is_empty(),
        "{} {ty} {rows}x{cols}: {} of {rows} rows off (tolerance {tol:e} of Σ|w·x|), first: {}",
        level.name(),
        bad.len(),
        bad.iter().take(4).cloned().collect::<Vec<_>>().join("; ")
    );
    worst
}

#[test]
fn every_level_matches_scalar() {
    let levels = simd_levels();
    if levels.is_empty() {
        eprintln!("no SIMD level on this CPU: nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    let scalar = Kernels::for_level(SimdLevel::Scalar);
    for level in &levels {
        let k = Kernels::for_level(*level);
        // Function addresses tell a level's own kernel from the scalar
        // fallback (for the report only).
        let own: Vec<&str> =
            WEIGHT_TYPES.iter().filter(|t| k.dot(**t) as usize != scalar.dot(**t) as usize).map(|t| t.name()).collect();
        eprintln!("{:<13} has kernels for: {}", level.name(), own.join(" "));
        for ty in WEIGHT_TYPES {
            let bs = ty.block_size();
            let mut worst = 0f64;
            for cols in [bs, 7 * bs, 4096] {
                for rows in [1, 3, 17, 4099] {
                    worst = worst.max(check_shape(*level, ty, rows, cols, &mut rng));
                }
            }
            eprintln!("{:<13} {:<7} worst rel. error {worst:.1e}", level.name(), ty.name());
        }
    }
}

/// Odd lengths of the float types (vector bodies plus scalar or masked
/// tails).
#[test]
fn float_tails() {
    let levels = simd_levels();
    let mut rng = StdRng::seed_from_u64(0x5eed_0002);
    for level in &levels {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for cols in [2, 15, 16, 17, 31, 33, 63, 65, 100, 129] {
                check_shape(*level, ty, 5, cols, &mut rng);
            }
        }
    }
}

/// One full-size matrix per priority type.
#[test]
fn large_4096x4096() {
    let levels = simd_levels();
    let mut rng = StdRng::seed_from_u64(0x5eed_0003);
    for level in &levels {
        for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
            let worst = check_shape(*level, ty, 4096, 4096, &mut rng);
            eprintln!("{:<13} {:<7} 4096x4096 worst rel. error {worst:.1e}", level.name(), ty.name());
        }
    }
}

/// Raw random bytes as weights (every code and sub-block scale the format
/// can hold, not only those the quantizer produces), with sane f16 super
/// scales, dotted row by row against quantized activations: each level's
/// kernel against the scalar one.
#[test]
fn random_bytes_every_code() {
    let levels = simd_levels();
    let mut rng = StdRng::seed_from_u64(0x5eed_0004);
    let scalar = Kernels::for_level(SimdLevel::Scalar);
    for level in &levels {
        let k = Kernels::for_level(*level);
        for ty in WEIGHT_TYPES.into_iter().filter(|t| !is_float(*t)) {
            let cols = 8 * ty.block_size();
            let act_ty = ty.vec_dot_type().unwrap();
            for _ in 0..50 {
                let mut w = AlignedBytes::default();
                w.resize(ty.row_bytes(cols).unwrap());
                rng.fill(w.as_bytes_mut());
                set_sane_scales(ty, w.as_bytes_mut(), &mut rng);
                let x = random_activation(cols, &mut rng);
                let mut a = AlignedBytes::default();
                a.resize(act_ty.row_bytes(cols).unwrap());
                quant::quantize_row(act_ty, &x, a.as_bytes_mut()).unwrap();
                let want = scalar.dot(ty)(w.as_bytes(), a.as_bytes());
                let got = k.dot(ty)(w.as_bytes(), a.as_bytes());
                let mut deq = vec![0f32; cols];
                quant::dequantize_row(ty, w.as_bytes(), &mut deq).unwrap();
                let mut xa = vec![0f32; cols];
                quant::dequantize_row(act_ty, a.as_bytes(), &mut xa).unwrap();
                let s: f64 = deq.iter().zip(&xa).map(|(w, x)| (*w as f64 * *x as f64).abs()).sum();
                let err = (got as f64 - want as f64).abs();
                assert!(err <= INT_TOL * s + 1e-30, "{} {ty}: got {got}, want {want}, Σ|w·x| {s}", level.name());
            }
        }
    }
}

/// Overwrites the f16 scales of every block of `w` with finite values of
/// moderate size (random bytes would give infinities and NaNs).
fn set_sane_scales(ty: GgmlType, w: &mut [u8], rng: &mut StdRng) {
    let ts = ty.type_size();
    let offsets = infer_compute::quant::f16_scale_offsets(ty);
    for b in w.chunks_exact_mut(ts) {
        for &o in offsets {
            let v = half::f16::from_f32(rng.gen_range(-0.05f32..0.05));
            b[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
}

/// Kernels read only whole blocks present in both slices: short or
/// mismatched inputs must not read out of bounds (checked by running on
/// exactly sized heap buffers; a debug allocator or Miri would flag a
/// stray read) and give the dot of the common whole blocks.
#[test]
fn short_and_mismatched_inputs() {
    let levels = simd_levels();
    let mut rng = StdRng::seed_from_u64(0x5eed_0005);
    for level in &levels {
        let k = Kernels::for_level(*level);
        let scalar = Kernels::for_level(SimdLevel::Scalar);
        for ty in WEIGHT_TYPES {
            let bs = ty.block_size();
            let cols = 5 * bs.max(8);
            let (w, _) = random_weight(ty, 1, cols, 1, &mut rng);
            let act_ty = ty.vec_dot_type().unwrap();
            let x = random_activation(cols, &mut rng);
            let mut a = AlignedBytes::default();
            a.resize(act_ty.row_bytes(cols).unwrap());
            quant::quantize_row(act_ty, &x, a.as_bytes_mut()).unwrap();
            let (wb, ab) = (w.row(0), a.as_bytes());
            // Empty inputs (from an aligned empty buffer: the scalar
            // fallback views the bytes as blocks, which needs alignment).
            let empty = AlignedBytes::default();
            assert_eq!(k.dot(ty)(empty.as_bytes(), empty.as_bytes()), 0.0, "{} {ty}", level.name());
            assert_eq!(k.dot(ty)(wb, empty.as_bytes()), 0.0, "{} {ty}", level.name());
            // Fewer activation blocks than weight blocks: the common prefix.
            let n_act = 2 * bs.max(8) / act_ty.block_size();
            let a_short = &ab[..n_act * act_ty.type_size()];
            let w_prefix = &wb[..ty.row_bytes(2 * bs.max(8)).unwrap()];
            let got = k.dot(ty)(wb, a_short);
            let want = scalar.dot(ty)(w_prefix, a_short);
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1e-3),
                "{} {ty}: short activation gave {got}, want {want}",
                level.name()
            );
        }
    }
}

/// Activation rows that exercise the quantizers' corner cases: ties at
/// exactly half a step (a block whose maximum is 127 has step 1), equal
/// magnitudes of both signs, all-zero blocks, tiny and huge values, and
/// non-finite values (which must give the reference's bytes too).
fn activation_cases(n: usize, rng: &mut StdRng) -> Vec<Vec<f32>> {
    let mut cases = Vec::new();
    for _ in 0..20 {
        cases.push(random_activation(n, rng));
    }
    let ties: Vec<f32> = (0..n).map(|i| if i % 32 == 0 { 127.0 } else { (i % 255) as f32 * 0.5 - 63.5 }).collect();
    cases.push(ties.clone());
    cases.push(ties.iter().map(|v| -v).collect());
    let mut both_signs = random_activation(n, rng);
    for c in both_signs.chunks_mut(32) {
        c[3] = 9.0;
        c[7] = -9.0;
    }
    cases.push(both_signs.clone());
    cases.push(both_signs.iter().map(|v| -v).collect());
    cases.push(vec![0.0; n]);
    let mut some_zero = random_activation(n, rng);
    some_zero[..n.min(256)].fill(0.0);
    cases.push(some_zero);
    cases.push(random_activation(n, rng).iter().map(|v| v * 1e-30).collect());
    cases.push(random_activation(n, rng).iter().map(|v| v * 1e30).collect());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = random_activation(n, rng);
        x[n / 2] = bad;
        cases.push(x);
    }
    cases
}

/// The SIMD activation quantizers give the reference's bytes exactly.
#[test]
fn activation_quantizers_are_bit_exact() {
    let levels = simd_levels();
    let mut rng = StdRng::seed_from_u64(0x5eed_0006);
    for level in &levels {
        let k = Kernels::for_level(*level);
        for act in [GgmlType::Q8_0, GgmlType::Q8_K] {
            let mut covered = false;
            for n in [256, 768, 2048] {
                for (c, x) in activation_cases(n, &mut rng).into_iter().enumerate() {
                    let mut want = vec![0u8; act.row_bytes(n).unwrap()];
                    quant::quantize_row(act, &x, &mut want).unwrap();
                    let mut got = vec![0xa5u8; want.len()];
                    if !infer_compute::cpu::simd::quantize_activation_row(k.level(), act, &x, &mut got) {
                        continue;
                    }
                    covered = true;
                    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                        let bs = act.type_size();
                        panic!(
                            "{} {act} n={n} case {c}: byte {i} (block {}, offset {}) is {:#04x}, reference {:#04x}",
                            level.name(),
                            i / bs,
                            i % bs,
                            got[i],
                            want[i]
                        );
                    }
                }
            }
            eprintln!(
                "{:<13} {act:<5} fast quantizer: {}",
                level.name(),
                if covered { "bit-exact" } else { "none (reference used)" }
            );
        }
    }
}
