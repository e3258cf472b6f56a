//! Helpers shared by the k-quant reference quantizers (ggml `make_qx_quants`,
//! `make_qkx2_quants`, `make_q3_quants`, `get_scale_min_k4`, `nearest_int`).
//!
//! Every function reproduces ggml's single-precision arithmetic operation by
//! operation (`ggml-quants.c`): the same evaluation order, `f32` throughout,
//! no fused multiply-add, the same tie-breaking. Rust never contracts
//! `a * b + c` into an FMA, and ggml's reference quantizers live in
//! `ggml-base`, which is built without FMA code generation, so the results
//! agree bit for bit. Changing the order of a single sum changes the chosen
//! quants on some inputs: keep the expressions as they are.
//!
//! Sub-block sizes are taken from the slice lengths; all functions are total
//! (no panics on NaN, infinities, zeros or huge values).

use half::f16;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is
/// treated as all zeros by [`make_qx_quants`] and [`make_q3_quants`] (and by
/// Q6_K for its block scale).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Rounds to the nearest integer, ties to even, as ggml's `nearest_int`:
/// adds 1.5·2²³ so that the float's mantissa holds the rounded integer and
/// reads it back from the bits.
///
/// Exact for `|v| <= 4_194_303`; outside that range (and for NaN or
/// infinities) it returns the same wrapped value ggml computes when its
/// `assert` is compiled out, never panicking.
#[inline]
pub fn nearest_int(v: f32) -> i32 {
    let shifted = v + 12_582_912.0f32;
    (shifted.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Rounds `v` to IEEE half precision (round to nearest even) and back, as
/// `GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))`.
#[inline]
pub fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// The per-value weight `make_qx_quants` uses for its least-squares fit.
#[derive(Clone, Copy, Debug)]
pub enum QxWeights<'a> {
    /// Caller-supplied importance weights (ggml's `qw` argument).
    Given(&'a [f32]),
    /// `x²` (ggml's `rmse_type == 1` with `qw == NULL`; used by Q6_K).
    Square,
    /// Uniform weights (`rmse_type == 2`).
    Uniform,
    /// `|x|` (`rmse_type == 3`).
    Abs,
    /// `sqrt(|x|)` (any other `rmse_type`).
    SqrtAbs,
}

impl QxWeights<'_> {
    #[inline]
    fn at(self, i: usize, x: f32) -> f32 {
        match self {
            QxWeights::Given(w) => w.get(i).copied().unwrap_or(0.0),
            QxWeights::Square => x * x,
            QxWeights::Uniform => 1.0,
            QxWeights::Abs => x.abs(),
            QxWeights::SqrtAbs => x.abs().sqrt(),
        }
    }
}

/// How [`make_qx_quants`] refines its scale (ggml's `rmse_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QxMode {
    /// `rmse_type == 0`: plain rounding with scale `max / -nmax`.
    Plain,
    /// `rmse_type < 0`: one weighted least-squares step, averaged with the
    /// plain scale.
    Early,
    /// `rmse_type > 0`: least squares plus a search over 18 nearby scales.
    Search,
}

/// Symmetric quantization of `x` to integers in `[-nmax, nmax - 1]`, stored
/// offset by `nmax` in `l` (so `0 ..= 2·nmax - 1`); returns the scale `d`
/// with `x ≈ d · (l - nmax)`. ggml `make_qx_quants`.
///
/// The initial scale maps the value of largest magnitude to `-nmax`; in
/// [`QxMode::Search`] the weighted least-squares scale is then refined over
/// `iscale = -(nmax + 0.1·is) / max` for `is` in `-9..=9`, keeping the
/// candidate that maximises `(Σ w·x·l)² / Σ w·l²`. Groups whose largest
/// magnitude is below [`GROUP_MAX_EPS`] give `d = 0` and `l = 0`.
/// A zero weight sum yields scale 0 (never NaN).
///
/// `l.len()` must be at least `x.len()`; extra entries are left untouched.
pub fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], mode: QxMode, weights: QxWeights<'_>) -> f32 {
    let n = x.len().min(l.len());
    let x = &x[..n];
    let l = &mut l[..n];
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let clamp = |q: i32| q.clamp(-nmax, nmax - 1);
    let mut iscale = (-nmax) as f32 / max;
    if mode == QxMode::Plain {
        for (li, &v) in l.iter_mut().zip(x) {
            *li = (nmax + clamp(nearest_int(iscale * v))) as i8;
        }
        return 1.0 / iscale;
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (i, (li, &v)) in l.iter_mut().zip(x).enumerate() {
        let q = clamp(nearest_int(iscale * v));
        *li = (q + nmax) as i8;
        let w = weights.at(i, v);
        let qf = q as f32;
        sumlx += w * v * qf;
        suml2 += w * qf * qf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if mode == QxMode::Early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let qf = clamp(nearest_int(iscale * v)) as f32;
            let w = weights.at(i, v);
            sumlx += w * v * qf;
            suml2 += w * qf * qf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric quantization for Q3_K's 16-value groups: integers in
/// `[-nmax, nmax - 1]` stored offset by `nmax` in `l`; returns the scale.
/// ggml `make_q3_quants`.
///
/// With `do_rmse`, starts from the rounding that maps the largest magnitude
/// to `-nmax` and then, for up to 5 passes, moves single values to the level
/// that most improves the `x²`-weighted fit `(Σ w·x·l)² / Σ w·l²`, returning
/// the least-squares scale (0 when `Σ w·l² = 0`). Without it, returns
/// `max / -nmax`. Groups below [`GROUP_MAX_EPS`] give 0 and `l = 0`.
pub fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len().min(l.len());
    let x = &x[..n];
    let l = &mut l[..n];
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let clamp = |q: i32| q.clamp(-nmax, nmax - 1);
    let iscale = (-nmax) as f32 / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for (li, &v) in l.iter_mut().zip(x) {
            let q = clamp(nearest_int(iscale * v));
            *li = q as i8;
            let w = v * v;
            let qf = q as f32;
            sumlx += w * v * qf;
            suml2 += w * qf * qf;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for (li, &v) in l.iter_mut().zip(x) {
                let w = v * v;
                let cur = *li as f32;
                let mut slx = sumlx - w * v * cur;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * cur * cur;
                    let new_l = clamp(nearest_int(v * sl2 / slx));
                    if new_l != *li as i32 {
                        let nf = new_l as f32;
                        slx += w * v * nf;
                        sl2 += w * nf * nf;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            *li = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for li in l.iter_mut() {
            *li = (*li as i32 + nmax) as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (li, &v) in l.iter_mut().zip(x) {
        *li = (clamp(nearest_int(iscale * v)) + nmax) as i8;
    }
    1.0 / iscale
}

/// Search parameters of [`make_qkx2_quants`]: candidate inverse scales are
/// `(rmin + rdelta·is + nmax) / (max - min)` for `is` in `0..=nstep`.
#[derive(Clone, Copy, Debug)]
pub struct Qkx2Params {
    /// Offset of the first candidate, in quantization levels.
    pub rmin: f32,
    /// Step between candidates, in levels.
    pub rdelta: f32,
    /// Number of steps (`nstep + 1` candidates); below 1, no search.
    pub nstep: i32,
    /// Minimise the weighted absolute error instead of the squared error.
    pub use_mad: bool,
}

/// Asymmetric quantization `x ≈ scale · l - min` with `l` in `0 ..= nmax`
/// and `min >= 0`; returns `(scale, min)`. ggml `make_qkx2_quants`.
///
/// Starts from the range `[min(x, 0), max(x)]` divided into `nmax` steps,
/// then tries each candidate inverse scale of `params`, refitting scale and
/// offset by weighted least squares (offset clamped so that `min >= 0`),
/// and keeps the candidate with the smallest weighted error. `l` receives the
/// chosen levels; `laux` (at least `x.len()` long) is scratch. Q2_K uses
/// `(-0.5, 0.1, 15, mad)`, Q4_K `(-1.0, 0.1, 20, squared)`, Q5_K
/// `(-0.5, 0.1, 15, squared)`. A constant group gives `(0, -min(x, 0))` and
/// `l = 0`.
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    laux: &mut [u8],
    params: Qkx2Params,
) -> (f32, f32) {
    let n = x.len().min(weights.len()).min(l.len()).min(laux.len());
    if n == 0 {
        return (0.0, 0.0);
    }
    let (x, weights, l, laux) = (&x[..n], &weights[..n], &mut l[..n], &mut laux[..n]);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let err = |d: f32| if params.use_mad { d.abs() } else { d * d };
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((li, &v), &w) in l.iter_mut().zip(x).zip(weights) {
        let q = nearest_int(iscale * (v - min)).clamp(0, nmax);
        *li = q as u8;
        let diff = scale * q as f32 + min - v;
        best_error += w * err(diff);
    }
    if params.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=params.nstep {
        iscale = (params.rmin + params.rdelta * is as f32 + nmaxf) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for ((la, &v), &w) in laux.iter_mut().zip(x).zip(weights) {
            let q = nearest_int(iscale * (v - min)).clamp(0, nmax);
            *la = q as u8;
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for ((&la, &v), &w) in laux.iter().zip(x).zip(weights) {
                let diff = this_scale * la as f32 + this_min - v;
                cur_error += w * err(diff);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The 6-bit scale and 6-bit min of sub-block `j` (0..8) from the 12 packed
/// bytes of Q4_K / Q5_K. ggml `get_scale_min_k4`.
///
/// Layout: bytes 0..4 hold scales 0..3 (low 6 bits) and the top 2 bits of
/// scales 4..7; bytes 4..8 the same for mins; bytes 8..12 hold the low
/// nibbles of scale (low) and min (high) 4..7.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    let j = j & 7;
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (d, m)
    }
}

/// Packs 8 six-bit scales and mins into Q4_K / Q5_K's 12 bytes, the inverse
/// of [`get_scale_min_k4`] (values above 63 are masked to 6 bits).
pub fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for j in 0..8 {
        let (s, m) = (ls[j] & 63, lm[j] & 63);
        if j < 4 {
            out[j] |= s;
            out[j + 4] |= m;
        } else {
            out[j + 4] = (s & 0xF) | ((m & 0xF) << 4);
            out[j - 4] |= (s >> 4) << 6;
            out[j] |= (m >> 4) << 6;
        }
    }
    out
}

/// Packs 256 2-bit values (`l[i] & 3`) into 64 bytes as Q2_K and Q3_K store
/// them: byte `32·h + k` holds values `128·h + k + 32·s` at bits `2s`.
pub fn pack_2bit(l: &[u8; 256], qs: &mut [u8; 64]) {
    for h in 0..2 {
        for k in 0..32 {
            let base = 128 * h + k;
            qs[32 * h + k] =
                (l[base] & 3) | ((l[base + 32] & 3) << 2) | ((l[base + 64] & 3) << 4) | ((l[base + 96] & 3) << 6);
        }
    }
}

/// Integer dot product of 256 decoded weights with a Q8_K block's quants,
/// weighted per group of `G` values by `scale(group)`:
/// `Σ_g scale(g) · Σ_{i in g} a[i]·q8[i]`.
#[inline]
pub fn scaled_dot_i32<const G: usize>(a: &[i8; 256], q8: &[i8; 256], scale: impl Fn(usize) -> i32) -> i32 {
    let mut total = 0i32;
    for (g, (ag, qg)) in a.chunks_exact(G).zip(q8.chunks_exact(G)).enumerate() {
        let s: i32 = ag.iter().zip(qg).map(|(&w, &q)| w as i32 * q as i32).sum();
        total += scale(g) * s;
    }
    total
}

#[cfg(test)]
pub(crate) mod golden {
    //! Reader for the golden quantization vectors (`manifest.tsv` and the
    //! per-case binary files), shared by the k-quant unit tests.

    use std::path::{Path, PathBuf};

    /// One golden case of the manifest.
    pub struct Case {
        pub name: String,
        pub rows: usize,
        pub cols: usize,
        pub input: Vec<f32>,
        pub quant: Vec<u8>,
        pub deq: Option<Vec<f32>>,
        pub act: Option<Vec<f32>>,
        pub dot: Option<Vec<f32>>,
    }

    /// The golden directory: the project's copy if present, else the
    /// shared reference data; `None` when neither exists.
    pub fn dir() -> Option<PathBuf> {
        let local = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/quant"));
        if local.join("manifest.tsv").exists() {
            return Some(local.to_path_buf());
        }
        let shared = Path::new("/work/shared/golden/quant");
        shared.join("manifest.tsv").exists().then(|| shared.to_path_buf())
    }

    fn f32s(path: &Path) -> Option<Vec<f32>> {
        let b = std::fs::read(path).ok()?;
        Some(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// All cases of ggml type `ty` (ggml's name, e.g. `"q4_K"`).
    pub fn cases(ty: &str) -> Vec<Case> {
        let Some(dir) = dir() else {
            eprintln!("golden quant data not found; skipping {ty} golden tests");
            return Vec::new();
        };
        let manifest = std::fs::read_to_string(dir.join("manifest.tsv")).expect("read manifest");
        let mut out = Vec::new();
        for line in manifest.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() < 7 || f[1] != ty {
                continue;
            }
            let name = f[0].to_string();
            let rows: usize = f[2].parse().expect("rows");
            let cols: usize = f[3].parse().expect("cols");
            let p = |ext: &str| dir.join(format!("{name}.{ext}"));
            out.push(Case {
                rows,
                cols,
                input: f32s(&p("in.f32")).expect("input"),
                quant: std::fs::read(p("q")).expect("quant"),
                deq: f32s(&p("deq.f32")),
                act: f32s(&p("act.f32")),
                dot: f32s(&p("dot.f32")),
                name,
            });
        }
        assert!(!out.is_empty(), "no golden cases for {ty}");
        out
    }

    /// Checks quantization, dequantization and the dot product of every
    /// golden case of weight format `B` bit for bit (dot: relative 1e-5 of
    /// `Σ|w·x|`).
    pub fn check_weight_format<B>(ty: &str)
    where
        B: crate::quant::VecDot,
    {
        use crate::quant::quantize_activation;
        for c in cases(ty) {
            let nb = c.cols / B::BLOCK_SIZE;
            let row_bytes = nb * std::mem::size_of::<B>();
            assert_eq!(c.quant.len(), c.rows * row_bytes, "{}: quant size", c.name);
            for r in 0..c.rows {
                let x = &c.input[r * c.cols..(r + 1) * c.cols];
                let mut q = vec![<B as bytemuck::Zeroable>::zeroed(); nb];
                B::quantize_row_ref(x, &mut q);
                let got: &[u8] = bytemuck::cast_slice(&q);
                let want = &c.quant[r * row_bytes..(r + 1) * row_bytes];
                if got != want {
                    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    panic!(
                        "{} row {r}: quant differs first at byte {i} (block {}, offset {}): got {:?} want {:?}",
                        c.name,
                        i / std::mem::size_of::<B>(),
                        i % std::mem::size_of::<B>(),
                        &got[i..(i + 8).min(got.len())],
                        &want[i..(i + 8).min(want.len())]
                    );
                }
                // Dequantize ggml's own bytes (independent of our quantizer).
                let want_blocks: Vec<B> = bytemuck::pod_collect_to_vec(want);
                let mut y = vec![0.0f32; c.cols];
                B::dequantize_row(&want_blocks, &mut y);
                if let Some(deq) = &c.deq {
                    let want_y = &deq[r * c.cols..(r + 1) * c.cols];
                    for (i, (a, b)) in y.iter().zip(want_y).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "{} row {r}: deq[{i}] got {a:e} want {b:e}", c.name);
                    }
                }
                if let (Some(act), Some(dot)) = (&c.act, &c.dot) {
                    let a = quantize_activation::<B>(act).expect("activation");
                    let got = B::vec_dot_ref(&want_blocks, &a);
                    let mag: f32 = y.iter().zip(act).map(|(w, x)| (w * x).abs()).sum();
                    let want = dot[r];
                    assert!(
                        got.is_finite() && (got - want).abs() <= 1e-5 * mag,
                        "{} row {r}: dot got {got:e} want {want:e} (Σ|w·x| = {mag:e})",
                        c.name
                    );
                }
            }
        }
    }

    /// Inputs that stress the quantizers: zeros, tiny, huge, outliers, NaN-free.
    pub fn stress_rows() -> Vec<Vec<f32>> {
        let n = 512;
        let mut rows = vec![
            vec![0.0; n],
            vec![-0.0; n],
            (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-38).collect(),
            (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-44).collect(),
            (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 6e34).collect(),
            (0..n).map(|i| if i % 97 == 0 { -3e38 } else { (i % 13) as f32 * 0.01 }).collect(),
            (0..n).map(|i| if i == 5 { 1.0 } else { 0.0 }).collect(),
            (0..n).map(|i| if i % 2 == 0 { 65504.0 * 4.0 } else { -1e-3 }).collect(),
            vec![f32::MAX; n],
            vec![f32::MIN; n],
            vec![1e-20; n],
        ];
        rows.push((0..n).map(|i| (i as f32 * 0.37).sin() * 10f32.powi((i % 7) as i32 - 3)).collect());
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.4999), -2);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
        // Out of range and non-finite: defined, no panic.
        let _ = nearest_int(f32::NAN);
        let _ = nearest_int(f32::INFINITY);
        let _ = nearest_int(-1e30);
    }

    #[test]
    fn scale_min_k4_roundtrip() {
        let ls = [0, 1, 62, 63, 17, 33, 48, 5];
        let lm = [63, 2, 31, 0, 40, 9, 63, 22];
        let packed = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (ls[j], lm[j]));
        }
    }
}

/// The shared part of ggml's `quantize_row_q4_K_ref` and
/// `quantize_row_q5_K_ref` for one super-block `xb` (256 values): per group
/// of 32, a scale and min by [`make_qkx2_quants`] with weights
/// `sqrt(mean x²) + |x|`; the group scales and mins rounded to 6 bits
/// against their maxima; the levels `0..=nmax` re-rounded against the
/// f16-rounded effective scale and min. Returns the packed 6-bit scales,
/// `d`, `dmin` and the levels.
pub(crate) fn quantize_superblock_qkx2(
    xb: &[f32],
    nmax: i32,
    params: Qkx2Params,
) -> ([u8; 12], f16, f16, [u8; super::QK_K]) {
    let mut l = [0u8; super::QK_K];
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        let xg = &xb[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xg {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xg) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(nmax, xg, &weights, &mut l[32 * j..32 * j + 32], &mut laux, params);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);

    let d_all = d.to_f32();
    let m_all = dmin.to_f32();
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let dj = d_all * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = m_all * m as f32;
        for ii in 0..32 {
            let q = nearest_int((xb[32 * j + ii] + dm) / dj).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    (packed, d, dmin, l)
}

/// One super-block's share of ggml's generic `ggml_vec_dot_q4_K_q8_K` /
/// `ggml_vec_dot_q5_K_q8_K`: `d·d8·Σ_g s_g·Σ q·q8 - dmin·d8·Σ_g
/// m_g·(bsum_2g + bsum_2g+1)` for unpacked levels `q` (0..=15 or 0..=31)
/// in groups of 32 with packed 6-bit scales and mins, integer sums inside.
pub(crate) fn dot_block_scale_min_k4(
    q: &[i8; super::QK_K],
    scales: &[u8; 12],
    d: f16,
    dmin: f16,
    yb: &super::BlockQ8K,
) -> f32 {
    let mut sm = [(0u8, 0u8); 8];
    for (j, v) in sm.iter_mut().enumerate() {
        *v = get_scale_min_k4(j, scales);
    }
    let sumi: i32 = yb.bsums.iter().enumerate().map(|(j, &b)| b as i32 * sm[j / 2].1 as i32).sum();
    let isum = scaled_dot_i32::<32>(q, &yb.qs, |g| sm[g].0 as i32);
    let d = d.to_f32() * yb.d;
    let dmin = dmin.to_f32() * yb.d;
    d * isum as f32 - dmin * sumi as f32
}
