//! Golden tests of every GGUF block format against ggml's reference output.
//!
//! The data directory is `$INFER_TESTDATA` when set, else the workspace's
//! `testdata/` (see `testdata/README.md`). Every row of
//! `quant/manifest.tsv` is one case; for each case:
//! - `quantize_row` of each input row must equal `NAME.q` bit for bit, except
//!   for the few bytes ggml never writes (see [`unspecified_bytes`]);
//! - `dequantize_row` of `NAME.q` must equal `NAME.deq.f32` bit for bit
//!   (NaN matches any NaN), where ggml dequantizes the type;
//! - where the type has a `vec_dot_type`, `quant::vec_dot` of each row of
//!   `NAME.q` with `NAME.act.f32` must match `NAME.dot.f32` within 1e-5 of
//!   the row's Σ|w·x| (ggml sums in a different order).
//!
//! Each case runs under `catch_unwind`, so a format that panics is reported
//! as failing without hiding the others; all failures are listed together.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;

use infer_compute::quant;
use infer_compute::{Error, GgmlType};

/// Relative tolerance of the dot products, against Σ|w·x| of the row.
const DOT_REL_TOL: f64 = 1e-5;
/// Absolute floor of the dot tolerance (for all-zero rows).
const DOT_ABS_FLOOR: f64 = f32::MIN_POSITIVE as f64;
/// ggml's `GROUP_MAX_EPS`: IQ4_NL blocks whose largest magnitude is below it
/// are stored with `d = 0`.
const IQ4_NL_GROUP_MAX_EPS: f32 = 1e-15;

fn data_dir() -> PathBuf {
    match std::env::var_os("INFER_TESTDATA") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata"),
    }
}

/// One row of `manifest.tsv`.
#[derive(Clone, Debug)]
struct Case {
    name: String,
    type_name: String,
    rows: usize,
    cols: usize,
    block_size: usize,
    type_size: usize,
    vec_dot_type: String,
}

fn read_manifest(dir: &Path) -> Vec<Case> {
    let path = dir.join("manifest.tsv");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e} (set INFER_TESTDATA?)", path.display()));
    let mut cases = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if lineno == 0 && f.first() == Some(&"name") {
            continue;
        }
        assert_eq!(f.len(), 7, "{}:{}: expected 7 tab-separated fields: {line:?}", path.display(), lineno + 1);
        let num = |s: &str| -> usize {
            s.parse().unwrap_or_else(|_| panic!("{}:{}: bad number {s:?}", path.display(), lineno + 1))
        };
        cases.push(Case {
            name: f[0].to_string(),
            type_name: f[1].to_string(),
            rows: num(f[2]),
            cols: num(f[3]),
            block_size: num(f[4]),
            type_size: num(f[5]),
            vec_dot_type: f[6].to_string(),
        });
    }
    assert!(!cases.is_empty(), "{} lists no cases", path.display());
    cases
}

/// A zeroed byte buffer of `n` bytes whose address is 8-byte aligned (every
/// block type needs at most 4).
struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn zeroed(len: usize) -> Self {
        Self { words: vec![0; len.div_ceil(8)], len }
    }
    fn from_slice(b: &[u8]) -> Self {
        let mut a = Self::zeroed(b.len());
        a.as_mut().copy_from_slice(b);
        a
    }
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

fn read_bytes(path: &Path, expect_len: usize) -> Result<Vec<u8>, String> {
    let b = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if b.len() != expect_len {
        return Err(format!("{} has {} bytes, expected {expect_len}", path.display(), b.len()));
    }
    Ok(b)
}

fn read_f32(path: &Path, expect_values: usize) -> Result<Vec<f32>, String> {
    let b = read_bytes(path, expect_values * 4)?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Bytes of one block that ggml leaves unspecified for this input block
/// (it never writes them, so they hold whatever its buffer held):
/// - IQ4_NL blocks whose largest magnitude is below `GROUP_MAX_EPS` get
///   `d = 0` and indices from an uninitialised scratch array;
/// - Q8_K blocks of zeros get `d = 0` and zero codes, but no `bsums`.
///
/// These bytes are excluded from the comparison; the rest of the block,
/// including `d`, must still match.
fn unspecified_bytes(ty: GgmlType, x: &[f32]) -> Option<std::ops::Range<usize>> {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    match ty {
        GgmlType::IQ4_NL if amax < IQ4_NL_GROUP_MAX_EPS => Some(2..18),
        GgmlType::Q8_K if amax == 0.0 => Some(260..292),
        _ => None,
    }
}

/// What one case established, beyond pass/fail.
#[derive(Default)]
struct CaseOutcome {
    failures: Vec<String>,
    waived_blocks: usize,
    /// Largest finite dot-product error relative to Σ|w·x| (0 for none).
    worst_dot_rel: f64,
}

fn check_case(dir: &Path, c: &Case) -> Result<CaseOutcome, String> {
    let ty = GgmlType::from_name(&c.type_name)
        .filter(|t| t.name() == c.type_name)
        .ok_or_else(|| format!("unknown type name {:?}", c.type_name))?;
    if ty.block_size() != c.block_size || ty.type_size() != c.type_size {
        return Err(format!(
            "manifest says block {}/{} bytes, the library {}/{}",
            c.block_size,
            c.type_size,
            ty.block_size(),
            ty.type_size()
        ));
    }
    let lib_vdt = ty.vec_dot_type().map_or("none", GgmlType::name);
    if lib_vdt != c.vec_dot_type {
        return Err(format!("manifest says vec_dot_type {}, the library {lib_vdt}", c.vec_dot_type));
    }
    let row_bytes = ty.row_bytes(c.cols).map_err(|e| e.to_string())?;
    let file = |ext: &str| dir.join(format!("{}.{ext}", c.name));

    let input = read_f32(&file("in.f32"), c.rows * c.cols)?;
    let want_q = read_bytes(&file("q"), c.rows * row_bytes)?;
    let mut out = CaseOutcome::default();

    // Quantization, bit for bit.
    let mut q = AlignedBytes::zeroed(row_bytes);
    for r in 0..c.rows {
        let x = &input[r * c.cols..][..c.cols];
        let want = &want_q[r * row_bytes..][..row_bytes];
        quant::quantize_row(ty, x, q.as_mut()).map_err(|e| format!("quantize_row: {e}"))?;
        let got = q.as_ref();
        let mut first_bad = None;
        for b in 0..row_bytes / c.type_size {
            let range = b * c.type_size..(b + 1) * c.type_size;
            if got[range.clone()] == want[range.clone()] {
                continue;
            }
            let skip = unspecified_bytes(ty, &x[b * c.block_size..][..c.block_size]).unwrap_or(0..0);
            let bad = range.clone().find(|&i| got[i] != want[i] && !skip.contains(&(i - range.start)));
            match bad {
                Some(i) => {
                    first_bad.get_or_insert((b, i));
                }
                None => out.waived_blocks += 1,
            }
        }
        if let Some((b, i)) = first_bad {
            out.failures.push(format!(
                "quantize row {r}: first differing byte {i} (block {b}, byte {} of it): got {:#04x}, want {:#04x}",
                i - b * c.type_size,
                got[i],
                want[i]
            ));
            break;
        }
    }

    // Dequantization of ggml's blocks, bit for bit (ggml has no dequantizer
    // for the activation-only types, so there is no reference for them).
    let has_deq = ty.vec_dot_type().is_some();
    let deq_path = file("deq.f32");
    let want_deq = if has_deq {
        Some(read_f32(&deq_path, c.rows * c.cols)?)
    } else {
        if deq_path.exists() {
            out.failures.push(format!("unexpected {} for an activation-only type", deq_path.display()));
        }
        None
    };
    if let Some(want_deq) = &want_deq {
        let mut y = vec![0f32; c.cols];
        for r in 0..c.rows {
            let qb = AlignedBytes::from_slice(&want_q[r * row_bytes..][..row_bytes]);
            quant::dequantize_row(ty, qb.as_ref(), &mut y).map_err(|e| format!("dequantize_row: {e}"))?;
            let want = &want_deq[r * c.cols..][..c.cols];
            if let Some(i) = (0..c.cols).find(|&i| !same_f32(y[i], want[i])) {
                out.failures.push(format!(
                    "dequantize row {r}: first differing value {i}: got {:e} ({:#010x}), want {:e} ({:#010x})",
                    y[i],
                    y[i].to_bits(),
                    want[i],
                    want[i].to_bits()
                ));
                break;
            }
        }
    }

    // Dot products with the activation, within tolerance.
    if let (Some(_), Some(want_deq)) = (ty.vec_dot_type(), &want_deq) {
        let act = read_f32(&file("act.f32"), c.cols)?;
        let want_dot = read_f32(&file("dot.f32"), c.rows)?;
        for r in 0..c.rows {
            let qb = AlignedBytes::from_slice(&want_q[r * row_bytes..][..row_bytes]);
            let got = quant::vec_dot(ty, qb.as_ref(), &act).map_err(|e| format!("vec_dot: {e}"))?;
            let want = want_dot[r];
            let scale: f64 = want_deq[r * c.cols..][..c.cols]
                .iter()
                .zip(&act)
                .map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs())
                .sum();
            let tol = DOT_REL_TOL * scale + DOT_ABS_FLOOR;
            let err = (f64::from(got) - f64::from(want)).abs();
            let ok = if want.is_nan() || got.is_nan() {
                got.is_nan() && want.is_nan()
            } else if want.is_infinite() || got.is_infinite() {
                got == want
            } else {
                err <= tol
            };
            if ok && err.is_finite() && scale > 0.0 {
                out.worst_dot_rel = out.worst_dot_rel.max(err / scale);
            }
            if !ok {
                out.failures.push(format!(
                    "dot row {r}: got {got:e}, want {want:e}: |diff| {err:.3e} > tol {tol:.3e} (rel {:.3e} of sum|w*x| {scale:.3e})",
                    err / scale.max(DOT_ABS_FLOOR)
                ));
            }
        }
    }
    Ok(out)
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAPTURED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the message and location of
/// panics on threads inside [`run_captured`] instead of printing them, and
/// defers to the previous hook everywhere else.
fn install_capturing_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(Cell::get) {
                let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                    (*s).to_string()
                } else if let Some(s) = info.payload().downcast_ref::<String>() {
                    s.clone()
                } else {
                    "non-string panic payload".to_string()
                };
                let loc = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                CAPTURED.with(|c| *c.borrow_mut() = Some(format!("{msg}{loc}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err(message with location)`.
fn run_captured<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_capturing_hook();
    CAPTURING.with(|c| c.set(true));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    CAPTURING.with(|c| c.set(false));
    r.map_err(|_| CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_else(|| "panic".to_string()))
}

#[test]
fn golden_quant_all_manifest_cases() {
    let dir = data_dir().join("quant");
    let cases = read_manifest(&dir);

    // Per type: (cases, passed).
    let mut per_type: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut report = String::new();
    let mut failed = 0usize;
    let mut waived = Vec::new();
    let mut worst_dot: BTreeMap<String, f64> = BTreeMap::new();
    for c in &cases {
        let result = match run_captured(|| check_case(&dir, c)) {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => Err(vec![e]),
            Err(panic) => Err(vec![format!("panicked: {panic}")]),
        };
        let failures = match result {
            Ok(outcome) => {
                if c.vec_dot_type != "none" {
                    let w = worst_dot.entry(c.type_name.clone()).or_default();
                    *w = w.max(outcome.worst_dot_rel);
                }
                if outcome.waived_blocks > 0 {
                    waived.push(format!("{} ({} blocks)", c.name, outcome.waived_blocks));
                }
                outcome.failures
            }
            Err(f) => f,
        };
        let entry = per_type.entry(c.type_name.clone()).or_default();
        entry.0 += 1;
        if failures.is_empty() {
            entry.1 += 1;
        } else {
            failed += 1;
            for f in failures {
                let _ = writeln!(report, "  {} [{}]: {f}", c.name, c.type_name);
            }
        }
    }

    let passing: Vec<&str> = per_type.iter().filter(|(_, (n, p))| n == p).map(|(t, _)| t.as_str()).collect();
    let failing: Vec<String> =
        per_type.iter().filter(|(_, (n, p))| n != p).map(|(t, (n, p))| format!("{t} ({p}/{n})")).collect();
    println!(
        "golden_quant: {}/{} cases passed; {}/{} types fully passing: {}",
        cases.len() - failed,
        cases.len(),
        passing.len(),
        per_type.len(),
        passing.join(" ")
    );
    let worst: Vec<String> = worst_dot.iter().map(|(t, w)| format!("{t} {w:.1e}")).collect();
    println!("golden_quant: worst dot error / sum|w*x| per type: {}", worst.join(", "));
    if !waived.is_empty() {
        println!(
            "golden_quant: blocks compared without the bytes ggml leaves unspecified (IQ4_NL indices of blocks below GROUP_MAX_EPS, Q8_K bsums of zero blocks): {}",
            waived.join(", ")
        );
    }
    if failed > 0 {
        panic!("{failed} of {} golden cases failed; types failing: {}\n{report}", cases.len(), failing.join(", "));
    }
}

/// Every block type rejects a row that is not a whole number of blocks, in
/// each of the three byte-level entry points.
#[test]
fn partial_blocks_are_errors() {
    for ty in GgmlType::ALL.into_iter().filter(|t| t.block_size() > 1) {
        let bs = ty.block_size();
        for n in [bs - 1, bs + 1, 2 * bs + bs / 2] {
            let x = vec![0.5f32; n];
            let mut out = AlignedBytes::zeroed(ty.type_size() * (n / bs + 1));
            let r = quant::quantize_row(ty, &x, out.as_mut());
            assert!(
                matches!(r, Err(Error::RowNotBlockMultiple { ty: t, cols, block_size }) if t == ty && cols == n && block_size == bs),
                "quantize_row({ty}, {n} values): {r:?}"
            );
            let q = AlignedBytes::zeroed(ty.type_size() * (n / bs + 1));
            let mut y = vec![0f32; n];
            let r = quant::dequantize_row(ty, q.as_ref(), &mut y);
            assert!(
                matches!(r, Err(Error::RowNotBlockMultiple { ty: t, cols, .. }) if t == ty && cols == n),
                "dequantize_row({ty}, {n} values): {r:?}"
            );
            let r = quant::vec_dot(ty, q.as_ref(), &x);
            let ok = match r {
                Err(Error::RowNotBlockMultiple { ty: t, cols, .. }) => t == ty && cols == n,
                // Activation-only types may refuse the operation first.
                Err(Error::Unsupported { ty: t, .. }) => t == ty && ty.vec_dot_type().is_none(),
                _ => false,
            };
            assert!(ok, "vec_dot({ty}, {n} values): {r:?}");
        }
    }
}

/// Q8_1 and Q8_K are activation formats: no dot product of their own.
#[test]
fn activation_only_types_have_no_vec_dot() {
    for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
        let n = 2 * ty.block_size();
        let x = vec![0.25f32; n];
        let q = AlignedBytes::zeroed(ty.row_bytes(n).unwrap());
        let r = quant::vec_dot(ty, q.as_ref(), &x);
        assert!(matches!(r, Err(Error::Unsupported { op: "vec_dot", ty: t }) if t == ty), "vec_dot({ty}): {r:?}");
    }
}

/// Buffers of the wrong length are reported, not panicked on.
#[test]
fn wrong_buffer_lengths_are_errors() {
    for ty in GgmlType::ALL {
        let n = 2 * ty.block_size();
        let x = vec![1.0f32; n];
        let mut short = AlignedBytes::zeroed(ty.row_bytes(n).unwrap() - 1);
        assert!(matches!(quant::quantize_row(ty, &x, short.as_mut()), Err(Error::Shape { .. })), "{ty}");
        let mut y = vec![0f32; n];
        assert!(matches!(quant::dequantize_row(ty, short.as_ref(), &mut y), Err(Error::Shape { .. })), "{ty}");
        assert!(matches!(quant::vec_dot(ty, short.as_ref(), &x), Err(Error::Shape { .. })), "{ty}");
    }
}

/// NaN, infinities, extremes and subnormals give some result, never a
/// panic (integer overflow included), in every type's three entry points.
#[test]
fn extreme_inputs_do_not_panic() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        -0.0,
        65520.0,
        1e-40,
    ];
    let mut failures = Vec::new();
    for ty in GgmlType::ALL {
        let n = 2 * ty.block_size().max(32);
        let rows: Vec<Vec<f32>> = specials
            .iter()
            .map(|&s| vec![s; n])
            .chain(
                specials
                    .iter()
                    .map(|&s| (0..n).map(|i| if i % 7 == 3 { s } else { (i as f32 - 20.0) * 0.37 }).collect()),
            )
            .collect();
        for x in &rows {
            let r = run_captured(|| -> Result<(), Error> {
                let mut q = AlignedBytes::zeroed(ty.row_bytes(n)?);
                quant::quantize_row(ty, x, q.as_mut())?;
                let mut y = vec![0f32; n];
                quant::dequantize_row(ty, q.as_ref(), &mut y)?;
                if ty.vec_dot_type().is_some() {
                    quant::vec_dot(ty, q.as_ref(), x)?;
                    quant::vec_dot(ty, q.as_ref(), &y)?;
                }
                Ok(())
            });
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(format!("{ty}: error {e} for input starting {:?}", &x[..4])),
                Err(p) => failures.push(format!("{ty}: panicked ({p}) for input starting {:?}", &x[..4])),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
