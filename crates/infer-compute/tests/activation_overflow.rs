//! Activation blocks whose f16 scale overflows (ggml returns NaN or
//! infinities for them): every product path on every SIMD level this
//! processor has gives a finite, accurate result instead.
//!
//! Cases of the robustness issue: a Q4_1 row of zeros dotted with
//! 32 × 3000.0 (`d · Σq` = 96 000 overflows Q8_1's `s`), Q4_0 and Q8_0 at
//! |x| = 10⁷ (Q8_0's `d` = 78 740 overflows), F16 weights (their F16
//! activation holds at most 65 504), on rows of 96 and 70 values. Paths: GEMV
//! (`matvec::matvec`) and prefill (`matvec::matmul_quant`); the products of
//! the prepared (repacked) weights the CPU model runs are covered by the
//! unit tests of `quant::overflow`.

use infer_compute::cpu::kernels::{AlignedBytes, Kernels, SimdLevel};
use infer_compute::cpu::matvec::{matmul_quant, matvec, matvec_quantized};
use infer_compute::{quant, GgmlType, QuantWeight};

/// `rows` weight rows of `cols` values of type `ty`, quantized from `f`.
fn weight(ty: GgmlType, rows: usize, cols: usize, f: impl Fn(usize, usize) -> f32) -> QuantWeight {
    let rb = ty.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; rows * rb];
    for r in 0..rows {
        let x: Vec<f32> = (0..cols).map(|c| f(r, c)).collect();
        quant::quantize_row(ty, &x, &mut bytes[r * rb..(r + 1) * rb]).unwrap();
    }
    QuantWeight::new(ty, rows, cols, bytes.into()).unwrap()
}

/// The exact products in f64 of the dequantized weights with `x`, and
/// `Σ|w·x|` per row (the scale of the tolerance).
fn exact(w: &QuantWeight, x: &[f32]) -> Vec<(f64, f64)> {
    let wf = w.to_f32().unwrap();
    wf.chunks_exact(w.cols)
        .map(|row| {
            let p = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64);
            (p.clone().sum(), p.map(f64::abs).sum())
        })
        .collect()
}

/// Every output finite and within `tol · Σ|w·x|` (or 1e-30 for a zero
/// row) of the exact product.
fn check(what: &str, y: &[f32], want: &[(f64, f64)], tol: f64) {
    for (r, (&got, &(e, scale))) in y.iter().zip(want).enumerate() {
        assert!(got.is_finite(), "{what}: row {r} is {got} (exact {e})");
        let err = (got as f64 - e).abs();
        assert!(err <= tol * scale + 1e-30, "{what}: row {r} = {got}, exact {e}, |err| {err} > {tol} · {scale}");
    }
}

struct Case {
    name: &'static str,
    w: QuantWeight,
    /// Two tokens of activations, `2 × cols`.
    x: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let cols = 96; // three blocks: one normal, one overflowing, one normal
    let mut out = Vec::new();
    // Q4_1 rows of zeros and of small values with a block of 32 × 3000.0.
    let x3000: Vec<f32> = (0..2 * cols).map(|i| if (32..64).contains(&(i % cols)) { 3000.0 } else { 0.25 }).collect();
    out.push(Case { name: "Q4_1 zeros · 3000", w: weight(GgmlType::Q4_1, 4, cols, |_, _| 0.0), x: x3000.clone() });
    out.push(Case {
        name: "Q4_1 · 3000",
        w: weight(GgmlType::Q4_1, 20, cols, |r, c| ((r * 7 + c * 3) % 11) as f32 * 0.1 - 0.4),
        x: x3000,
    });
    // Q4_0 / Q8_0 (and Q5_0 and IQ4_NL, also paired with Q8_0) at |x| = 1e7.
    let x1e7: Vec<f32> = (0..2 * cols)
        .map(|i| {
            if (32..64).contains(&(i % cols)) {
                if i % 3 == 0 {
                    -1e7
                } else {
                    1e7 * (i % 5) as f32 / 4.0
                }
            } else {
                0.5
            }
        })
        .collect();
    // F16 (activation F16: any value past 65 504) as well.
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::IQ4_NL, GgmlType::Q5_1, GgmlType::F16] {
        out.push(Case {
            name: ty.name(),
            w: weight(ty, 20, cols, |r, c| ((r * 5 + c) % 13) as f32 * 0.05 - 0.3),
            x: x1e7.clone(),
        });
    }
    // F16 rows of 70 values: the overflowing value in the short last block.
    let x70: Vec<f32> = (0..140).map(|i| if i % 70 == 66 { 1e5 } else { 0.25 }).collect();
    out.push(Case {
        name: "F16 · 70 values",
        w: weight(GgmlType::F16, 9, 70, |r, c| ((r * 3 + c) % 7) as f32 * 0.125 - 0.5),
        x: x70,
    });
    out
}

#[test]
fn overflowing_activation_blocks_give_exact_products_on_every_level() {
    let levels = SimdLevel::all_available();
    println!("levels: {levels:?}");
    let mut checked = 0;
    for level in levels {
        let k = Kernels::for_level(level);
        for c in cases() {
            let (rows, cols) = (c.w.rows, c.w.cols);
            let what = |path: &str| format!("{} on {level:?}, {path}", c.name);
            let want0 = exact(&c.w, &c.x[..cols]);
            let want1 = exact(&c.w, &c.x[cols..]);
            let want_both: Vec<(f64, f64)> = want0.iter().chain(&want1).copied().collect();

            // The row path replaces the overflowing block by its exact f32
            // product: only f32 rounding remains.
            let mut y = vec![f32::NAN; rows];
            let mut s = AlignedBytes::default();
            matvec(&k, &c.w, &c.x[..cols], &mut y, &mut s).unwrap();
            check(&what("matvec"), &y, &want0, 1e-5);
            // ggml's arithmetic alone gives a non-finite value here.
            let mut raw = vec![0f32; rows];
            matvec_quantized(&k, &c.w, s.as_bytes(), &mut raw);
            assert!(raw.iter().any(|v| !v.is_finite()), "{}: the case does not overflow", what("raw"));

            let mut y2 = vec![f32::NAN; 2 * rows];
            matmul_quant(&k, &c.w, &c.x, 2, &mut y2, &mut s).unwrap();
            check(&what("matmul_quant"), &y2, &want_both, 1e-5);

            if c.name.starts_with("Q4_1 zeros") {
                assert!(y.iter().all(|&v| v == 0.0), "{}: {y:?}", what("zeros"));
            }
            checked += 1;
        }
    }
    println!("{checked} case(s) × level(s) checked");
}

#[test]
fn rows_without_overflow_are_bit_identical_to_the_integer_path() {
    for level in SimdLevel::all_available() {
        let k = Kernels::for_level(level);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_1] {
            let w = weight(ty, 9, 64, |r, c| ((r * 3 + c) % 7) as f32 - 3.0);
            // Large but below the overflow: Q8_0 amax 8e6 (d = 62 992 <
            // 65 504); Q8_1 `d · Σq` about 2 000.
            let big = if ty.vec_dot_type() == Some(GgmlType::Q8_0) { 8e6 } else { 2e3 };
            let x: Vec<f32> = (0..64).map(|i| if i == 5 { big } else { i as f32 - 30.0 }).collect();
            let mut y = vec![0f32; 9];
            let mut s = AlignedBytes::default();
            matvec(&k, &w, &x, &mut y, &mut s).unwrap();
            let mut raw = vec![0f32; 9];
            matvec_quantized(&k, &w, s.as_bytes(), &mut raw);
            assert_eq!(y.map_bits(), raw.map_bits(), "{ty} on {level:?}");
        }
    }
}

trait Bits {
    fn map_bits(&self) -> Vec<u32>;
}

impl Bits for Vec<f32> {
    fn map_bits(&self) -> Vec<u32> {
        self.iter().map(|v| v.to_bits()).collect()
    }
}

#[test]
fn the_overflow_is_detected_only_for_finite_blocks() {
    use quant::overflow::overflowed_blocks;
    let mut x = vec![1.0f32; 96];
    x[40] = 1e7;
    x[70] = f32::INFINITY;
    let mut q = vec![0u8; GgmlType::Q8_0.row_bytes(96).unwrap()];
    let mut aligned = AlignedBytes::default();
    aligned.resize(q.len());
    quant::quantize_row(GgmlType::Q8_0, &x, aligned.as_bytes_mut()).unwrap();
    q.copy_from_slice(aligned.as_bytes());
    // Block 1 overflowed; block 2 holds an infinity, whose result is
    // infinite anyway.
    assert_eq!(overflowed_blocks(GgmlType::Q8_0, aligned.as_bytes(), &x).unwrap(), [1]);
    assert!(overflowed_blocks(GgmlType::Q8_0, aligned.as_bytes(), &x[..64]).is_err());
    assert!(overflowed_blocks(GgmlType::Q8_K, &[], &[]).unwrap().is_empty());
}
