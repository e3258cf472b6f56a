//! The single ops of [`ComputeBackend`]: f32 GEMM, quantized GEMV and the
//! batched product of every weight type, on awkward shapes, against scalar
//! references (f64 sums; [`quant::vec_dot`], ggml's CPU semantics), the
//! same products with activations past f16's range (finite where ggml
//! gives NaN), and the errors bad operands must give.

use std::sync::Arc;

use ndarray::Array2;

use super::compare::{first_mismatches, nmse};
use super::rng::Rng;
use super::{Case, Outcome};
use crate::backend::ComputeBackend;
use crate::weight::{QuantWeight, WeightBytes};
use crate::{quant, Error, GgmlType};

/// Weight types with a dot product: the ones a GEMV takes.
pub const WEIGHT_TYPES: [GgmlType; 14] = [
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

/// NMSE bound of a quantized product against the scalar reference, over all
/// outputs of a case (ggml's `test-backend-ops` uses 5e-4 for quantized
/// matrix products).
const NMSE_QUANT: f64 = 5e-4;
/// Bound of each output's error as a fraction of `Σ|w·x|` over its row: a
/// backend may quantize the activation in its own blocks (a GPU's q8_1 for
/// every type, where ggml's CPU pairs k-quants with Q8_K), which moves a dot
/// by a small fraction of that sum, never more.
const ROW_QUANT: f64 = 1e-2;
/// NMSE bound of f32 GEMM against the f64 reference.
const NMSE_F32: f64 = 1e-7;

/// `rows × cols` random weights quantized to `ty` with ggml's reference
/// quantizer (values N(0, 1/cols)).
pub fn random_weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> QuantWeight {
    let rows_f32: Vec<Vec<f32>> = (0..rows).map(|_| rng.normals(cols, 1.0 / (cols as f32).sqrt())).collect();
    quantize(ty, cols, &rows_f32)
}

/// The rows of `values` (each `cols` long) quantized to `ty`.
pub fn quantize(ty: GgmlType, cols: usize, values: &[Vec<f32>]) -> QuantWeight {
    let rb = ty.row_bytes(cols).expect("block-multiple row");
    let len = values.len() * rb;
    // u64 words keep every block type aligned.
    let mut words = vec![0u64; len.div_ceil(8)];
    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len];
    for (row, x) in bytes.chunks_exact_mut(rb.max(1)).zip(values) {
        quant::quantize_row(ty, x, row).expect("quantize");
    }
    let data = WeightBytes::new(Arc::new(Words(words, len)));
    QuantWeight::new(ty, values.len(), cols, data).expect("consistent weight")
}

/// Bytes held in u64 words (8-byte aligned).
struct Words(Vec<u64>, usize);

impl AsRef<[u8]> for Words {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..self.1]
    }
}

/// Column counts per block size: one block, two, an odd count, many.
fn cols_for(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size();
    if bs == 1 {
        vec![1, 7, 64, 129, 1000]
    } else {
        [1, 2, 5, if bs == 32 { 33 } else { 9 }].iter().map(|m| m * bs).collect()
    }
}

/// Row counts: one, a few, one past a multiple of 16 and of 64.
const ROWS: [usize; 4] = [1, 3, 17, 65];

fn reference_matvec(w: &QuantWeight, x: &[f32]) -> Vec<f32> {
    (0..w.rows).map(|r| quant::vec_dot(w.ty, w.row(r), x).expect("reference dot")).collect()
}

/// `Σ_i f(w[r,i]·x_i)` of each row in f64, with the weights dequantized.
fn row_sums(w: &QuantWeight, x: &[f32], f: impl Fn(f64) -> f64) -> Vec<f64> {
    let mut row = vec![0f32; w.cols];
    (0..w.rows)
        .map(|r| {
            quant::dequantize_row(w.ty, w.row(r), &mut row).expect("dequantize");
            row.iter().zip(x).map(|(&a, &b)| f(a as f64 * b as f64)).sum()
        })
        .collect()
}

/// `Σ_i |w[r,i]·x_i|` of each row, with the weights dequantized.
fn abs_sums(w: &QuantWeight, x: &[f32]) -> Vec<f64> {
    row_sums(w, x, f64::abs)
}

/// Checks each output against the reference within [`ROW_QUANT`] of its
/// row's `Σ|w·x|`, and adds both to the case's totals (for the NMSE).
fn check_rows(
    what: &str,
    got: &[f32],
    want: &[f32],
    sums: &[f64],
    all: &mut (Vec<f32>, Vec<f32>),
) -> Result<(), String> {
    for (r, ((&g, &w), &s)) in got.iter().zip(want).zip(sums).enumerate() {
        let err = (g as f64 - w as f64).abs();
        if !(err <= ROW_QUANT * s + 1e-6) {
            return Err(format!(
                "{what} row {r}: got {g:e}, want {w:e}: error {err:.3e} > {ROW_QUANT} x sum|w.x| {s:.3e}"
            ));
        }
    }
    all.0.extend_from_slice(got);
    all.1.extend_from_slice(want);
    Ok(())
}

/// The NMSE over all outputs of a case, checked against [`NMSE_QUANT`].
fn check_nmse(ty: GgmlType, all: &(Vec<f32>, Vec<f32>)) -> Result<Outcome, String> {
    let err = nmse(&all.0, &all.1);
    if err > NMSE_QUANT {
        return Err(format!(
            "{ty}: NMSE {err:.3e} > {NMSE_QUANT:e} over {} outputs; {}",
            all.0.len(),
            first_mismatches(&all.0, &all.1, 1e-2, 1e-3, 4)
        ));
    }
    Ok(Outcome::Pass(format!("NMSE {err:.2e} over {} outputs", all.0.len())))
}

fn unsupported(e: &Error) -> bool {
    matches!(e, Error::Unsupported { .. } | Error::NotImplemented { .. })
}

fn matvec_case(b: &dyn ComputeBackend, ty: GgmlType) -> Result<Outcome, String> {
    let mut rng = Rng::new(0x6D76 + ty.id() as u64);
    let mut all = (Vec::new(), Vec::new());
    for cols in cols_for(ty) {
        for rows in ROWS {
            let w = random_weight(&mut rng, ty, rows, cols);
            let x = rng.normals(cols, 1.0);
            let mut y = vec![f32::NAN; rows];
            match b.matvec(&w, &x, &mut y) {
                Ok(()) => {}
                Err(e) if unsupported(&e) => return Ok(Outcome::Skip(format!("{ty}: {e}"))),
                Err(e) => return Err(format!("{ty} {rows}x{cols}: {e}")),
            }
            let want = reference_matvec(&w, &x);
            check_rows(&format!("{ty} {rows}x{cols}"), &y, &want, &abs_sums(&w, &x), &mut all)?;
        }
    }
    check_nmse(ty, &all)
}

fn matmul_quant_case(b: &dyn ComputeBackend, ty: GgmlType) -> Result<Outcome, String> {
    let mut rng = Rng::new(0x6D71 + ty.id() as u64);
    let mut all = (Vec::new(), Vec::new());
    let cols = *cols_for(ty).last().unwrap_or(&ty.block_size());
    for (rows, n_tokens) in [(17, 2), (65, 7), (3, 33), (130, 20), (70, 67)] {
        let w = random_weight(&mut rng, ty, rows, cols);
        let x = Array2::from_shape_vec((n_tokens, cols), rng.normals(n_tokens * cols, 1.0)).expect("shape");
        let y = match b.matmul_quant(&w, x.view()) {
            Ok(y) => y,
            Err(e) if unsupported(&e) => return Ok(Outcome::Skip(format!("{ty}: {e}"))),
            Err(e) => return Err(format!("{ty} {rows}x{cols}, {n_tokens} tokens: {e}")),
        };
        if y.dim() != (n_tokens, rows) {
            return Err(format!("{ty}: result {:?}, want ({n_tokens}, {rows})", y.dim()));
        }
        for t in 0..n_tokens {
            let xt = x.row(t).to_vec();
            let what = format!("{ty} {rows}x{cols} token {t}/{n_tokens}");
            check_rows(&what, &y.row(t).to_vec(), &reference_matvec(&w, &xt), &abs_sums(&w, &xt), &mut all)?;
        }
    }
    check_nmse(ty, &all)
}

fn reference_matmul(a: &Array2<f32>, b: &Array2<f32>) -> Vec<f32> {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[[i, p]] as f64 * b[[p, j]] as f64).sum::<f64>() as f32;
        }
    }
    out
}

fn matmul_case(b: &dyn ComputeBackend, transposed: bool) -> Result<Outcome, String> {
    let mut rng = Rng::new(0x3333 + transposed as u64);
    let mut worst = 0f64;
    for (m, k, n) in [(1, 1, 1), (3, 5, 7), (1, 256, 33), (17, 64, 33), (64, 130, 65)] {
        let a = Array2::from_shape_vec((m, k), rng.normals(m * k, 1.0)).expect("shape");
        let bm = Array2::from_shape_vec((k, n), rng.normals(k * n, 1.0)).expect("shape");
        let got = if transposed {
            let bt = bm.t().as_standard_layout().to_owned();
            b.matmul_transb(a.view(), bt.view())
        } else {
            b.matmul(a.view(), bm.view())
        }
        .map_err(|e| format!("{m}x{k}x{n}: {e}"))?;
        if got.dim() != (m, n) {
            return Err(format!("{m}x{k}x{n}: result {:?}", got.dim()));
        }
        let want = reference_matmul(&a, &bm);
        let err = nmse(got.as_standard_layout().as_slice().expect("contiguous"), &want);
        if err > NMSE_F32 {
            return Err(format!("{m}x{k}x{n}: NMSE {err:.3e} > {NMSE_F32:e}"));
        }
        worst = worst.max(err);
    }
    let (a, c) = (Array2::<f32>::zeros((2, 3)), Array2::<f32>::zeros((4, 5)));
    let bad = if transposed { b.matmul_transb(a.view(), c.view()) } else { b.matmul(a.view(), c.view()) };
    if !matches!(bad, Err(Error::Shape { .. })) {
        return Err(format!("mismatched inner dimensions gave {:?}, want Error::Shape", bad.map(|r| r.dim())));
    }
    Ok(Outcome::Pass(format!("worst NMSE {worst:.2e}")))
}

/// Bad operands give errors (never a panic or a write past `y`).
fn op_errors(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let mut rng = Rng::new(7);
    let w = random_weight(&mut rng, GgmlType::Q8_0, 4, 64);
    let mut y = vec![0f32; 4];
    let expect_shape = |what: &str, r: crate::Result<()>| match r {
        Err(Error::Shape { .. }) => Ok(()),
        other => Err(format!("{what}: {other:?}, want Error::Shape")),
    };
    expect_shape("x too short", b.matvec(&w, &[0.0; 32], &mut y))?;
    expect_shape("y too short", b.matvec(&w, &[0.0; 64], &mut y[..3]))?;
    let x = Array2::<f32>::zeros((2, 32));
    if !matches!(b.matmul_quant(&w, x.view()), Err(Error::Shape { .. })) {
        return Err("matmul_quant with the wrong width: want Error::Shape".into());
    }
    // An activation-only type has no product.
    let q8k = QuantWeight::new(GgmlType::Q8_K, 1, 256, vec![0u8; 292].into()).map_err(|e| e.to_string())?;
    match b.matvec(&q8k, &[0.0; 256], &mut y[..1]) {
        Err(Error::Unsupported { .. }) => {}
        other => return Err(format!("Q8_K weights: {other:?}, want Error::Unsupported")),
    }
    // A weight whose public fields were edited after construction.
    let mut edited = w.clone();
    edited.rows = 5;
    let mut y5 = vec![0f32; 5];
    if b.matvec(&edited, &[0.0; 64], &mut y5).is_ok() {
        return Err("a weight with more rows than bytes was accepted".into());
    }
    Ok(Outcome::Pass(String::new()))
}

/// The f64 product of the dequantized rows of `w` with `x` (no rounding
/// of the activation, unlike [`quant::vec_dot`]).
fn exact_matvec(w: &QuantWeight, x: &[f32]) -> Vec<f32> {
    row_sums(w, x, |p| p).into_iter().map(|s| s as f32).collect()
}

/// Activations past f16's range (1e5: F16 weights take their activation
/// as f16 in ggml) and past what an 8-bit block with an f16 scale holds
/// (−1e7: Q8_0's scale would be 78 740), on which ggml returns NaN, give
/// finite products within [`ROW_QUANT`] of the f64 product, through the
/// GEMV and the batched product (3 and 20 tokens, the big values in
/// different tokens' blocks).
fn huge_activation_case(b: &dyn ComputeBackend, ty: GgmlType) -> Result<Outcome, String> {
    let mut rng = Rng::new(0x4855 + ty.id() as u64);
    let cols = 8 * ty.block_size().max(32);
    let w = random_weight(&mut rng, ty, 9, cols);
    let token = |t: usize, rng: &mut Rng| {
        // 1e5 in the first half, −1e7 in the second: a 256-value block
        // (Q8_K's) holding both would lose the 1e5 values to its 8-bit
        // codes, in ggml as here, which is rounding, not the overflow this
        // case is about.
        let mut x = rng.normals(cols, 1.0);
        for (i, v) in x[..cols / 2].iter_mut().enumerate() {
            if i % 61 == (5 + 7 * t) % 61 {
                *v = 1e5;
            }
        }
        x[cols / 2 + (32 * t) % (cols / 2)] = -1e7;
        x
    };
    let x = token(0, &mut rng);
    let mut y = vec![f32::NAN; w.rows];
    match b.matvec(&w, &x, &mut y) {
        Ok(()) => {}
        Err(e) if unsupported(&e) => return Ok(Outcome::Skip(format!("{ty}: {e}"))),
        Err(e) => return Err(format!("{ty} GEMV: {e}")),
    }
    let mut all = (Vec::new(), Vec::new());
    check_rows(&format!("{ty} GEMV"), &y, &exact_matvec(&w, &x), &abs_sums(&w, &x), &mut all)?;
    for n_tok in [3, 20] {
        let xs: Vec<Vec<f32>> = (0..n_tok).map(|t| token(t, &mut rng)).collect();
        let x2 = Array2::from_shape_vec((n_tok, cols), xs.concat()).expect("shape");
        let y = match b.matmul_quant(&w, x2.view()) {
            Ok(y) => y,
            Err(e) if unsupported(&e) => return Ok(Outcome::Skip(format!("{ty}: {e}"))),
            Err(e) => return Err(format!("{ty}, {n_tok} tokens: {e}")),
        };
        for (t, xt) in xs.iter().enumerate() {
            let got: Vec<f32> = y.row(t).to_vec();
            let what = format!("{ty}, token {t} of {n_tok}");
            check_rows(&what, &got, &exact_matvec(&w, xt), &abs_sums(&w, xt), &mut all)?;
        }
    }
    Ok(Outcome::Pass(format!("{} outputs finite and within the bound", all.0.len())))
}

/// The op cases.
pub fn cases() -> Vec<Case> {
    let mut v = vec![
        Case::new("ops::matmul", |b| matmul_case(b, false)),
        Case::new("ops::matmul_transb", |b| matmul_case(b, true)),
        Case::new("ops::errors", op_errors),
    ];
    for ty in WEIGHT_TYPES {
        v.push(Case::new(&format!("ops::matvec::{}", ty.name()), move |b| matvec_case(b, ty)));
        v.push(Case::new(&format!("ops::matmul_quant::{}", ty.name()), move |b| matmul_quant_case(b, ty)));
        v.push(Case::new(&format!("ops::huge_activations::{}", ty.name()), move |b| huge_activation_case(b, ty)));
    }
    v
}
