//! Every real model with reference data against llama.cpp's logits, by
//! teacher forcing (see testdata/README.md and `infer_model::reference`).
//!
//! Each directory of `testdata/` named after a known model
//! (`infer_model::fetch::KNOWN_MODELS`: `gemma3-270m`, `smollm2-135m`, ...)
//! is one model; its file is found by that name (fetched and cached on
//! first use). In each:
//! - `logits-f32/` (llama.cpp on the weights dequantized to F32): our exact
//!   mode (weights dequantized to f32, f32 activations) must match tightly;
//! - `logits/` (llama.cpp as users run it, 8-bit activations in its dot
//!   products): our default quantized path, with the SIMD kernels this CPU
//!   selects.
//!
//! The quantized bound on the last position's full-vocabulary cosine is on
//! the centered logits (mean removed; softmax ignores a common shift).
//! With 8-bit activations re-quantized in every layer the forward pass is
//! chaotic: with the row-dot kernels, our own AVX2 and scalar paths, whose
//! row dots differ only in summation order (~1e-7), ended 0.28 apart in
//! mean |Δlogit| on SmolLM2's `p00`, mostly as a common shift; that
//! prompt's logits have a mean near zero (norm 890 against 3500 for the
//! others), so its plain cosine was 0.9949 on AVX2 and 0.9988 on scalar
//! while the centered one was 0.9995 on both (llama.cpp's own quantized run
//! vs its F32 run: 0.9986 plain, 0.9994 centered). With the packed Q4_1
//! kernels the plain cosine is 0.9988 or more on every prompt. Exact mode
//! holds both cosines to 0.99999.
//!
//! `INFER_TESTDATA` replaces the `testdata/` directory.

mod real_refs;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::{ComputeBackend, DeviceModel};
use infer_model::reference::DECISIVE_MARGIN;
use real_refs::{cases, greedy_all, load_spec, models, teacher_force_all, within_quantized_bounds};

fn prepare(name: &str, precision: Precision) -> Box<dyn DeviceModel> {
    let spec = load_spec(name);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let cpu = CpuBackend::with_options(threads, Kernels::detect(), precision).expect("CPU backend");
    cpu.prepare(&spec).unwrap_or_else(|e| panic!("{name}: prepare: {e}"))
}

#[test]
fn exact_mode_matches_llama_cpp_f32_logits() {
    let (checked, failures) = teacher_force_all(
        "logits-f32",
        "exact",
        |name| prepare(name, Precision::Exact),
        |a| {
            a.top1_agree == a.decisive
                && a.min_overlap >= 18
                && a.max_abs_diff <= 0.1
                && a.last_cosine.is_none_or(|c| c >= 0.99999)
                && a.last_cosine_centered.is_none_or(|c| c >= 0.99999)
        },
    );
    assert!(checked > 0, "no exact-mode reference cases");
    assert!(failures.is_empty(), "exact mode out of bounds:\n{}", failures.join("\n"));
}

#[test]
fn quantized_path_matches_llama_cpp_logits() {
    let (checked, failures) =
        teacher_force_all("logits", "quant", |name| prepare(name, Precision::Quantized), within_quantized_bounds);
    assert!(checked > 0, "no quantized reference cases");
    assert!(failures.is_empty(), "quantized path out of bounds:\n{}", failures.join("\n"));
}

/// Greedy generation on the CPU backend at `precision` against the
/// references of `sub` (see [`greedy_all`]).
fn greedy_matches(precision: Precision, sub: &str, tie: f32) -> usize {
    greedy_all(sub, sub, tie, |name| prepare(name, precision))
}

/// The exact mode against llama.cpp on the F32 weights: a near-tie is a
/// margin within [`DECISIVE_MARGIN`], the bound under which the exact
/// mode's top-1 must already agree at every position.
#[test]
fn exact_greedy_generation_matches_llama_cpp_up_to_the_first_near_tie() {
    assert!(greedy_matches(Precision::Exact, "logits-f32", DECISIVE_MARGIN) > 0, "no greedy tokens compared");
}

/// The quantized path against llama.cpp on the quantized file. Both
/// re-quantize activations to 8 bits in every layer and sum in different
/// orders (our packed Q4_1 product uses the exact activation block sum
/// where ggml uses its f16 rounding), and that forward pass is chaotic:
/// our own AVX2 and scalar kernels end up to 0.3 apart in mean |Δlogit| on
/// one prompt. A near-tie here is a margin within 0.5, twice that spread;
/// the logit bounds of `quantized_path_matches_llama_cpp_logits` still
/// hold at every position.
#[test]
fn quantized_greedy_generation_matches_llama_cpp_up_to_the_first_near_tie() {
    assert!(greedy_matches(Precision::Quantized, "logits", 0.5) > 0, "no greedy tokens compared");
}

/// A prompt's prefill and its token-by-token decode compute the same
/// formula; prompt chunks run the tiled attention kernel, which sums in
/// another order than the per-token one. In exact mode that is rounding
/// (relative L2 within 1e-5); the quantized path re-quantizes activations
/// to 8 bits in every layer, which turns such rounding differences into
/// flipped quanta (chaotic, as the note above says), so it is held to the
/// logit cosine of the llama.cpp bounds instead.
#[test]
fn prefill_equals_token_by_token_decode() {
    for (precision, max_rel, max_cos_gap) in [(Precision::Exact, 1e-5, 1e-9), (Precision::Quantized, 5e-2, 3e-3)] {
        for name in models() {
            let mut model = prepare(&name, precision);
            for case in cases(&name, "logits") {
                let ids = &case.prompt_ids;
                let mut kv = model.new_kv_cache(ids.len() + 1).unwrap();
                let batched = model.prefill(kv.as_mut(), ids, 0).unwrap().to_vec();
                let mut kv = model.new_kv_cache(ids.len() + 1).unwrap();
                let mut stepped = vec![];
                for (pos, &t) in ids.iter().enumerate() {
                    stepped = model.decode_token(kv.as_mut(), t, pos).unwrap().to_vec();
                }
                let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                let diff: Vec<f32> = batched.iter().zip(&stepped).map(|(a, b)| a - b).collect();
                let rel = norm(&diff) / norm(&stepped);
                let dot: f64 = batched.iter().zip(&stepped).map(|(&a, &b)| a as f64 * b as f64).sum();
                let cos = dot / (norm(&batched) * norm(&stepped));
                println!(
                    "{name} {precision:?} prefill vs decode {}: relative L2 {rel:.2e}, cosine {cos:.8}",
                    case.name
                );
                assert!(
                    rel <= max_rel && 1.0 - cos <= max_cos_gap,
                    "{name} {precision:?} {}: prefill and decode differ (relative L2 {rel:.2e}, cosine {cos})",
                    case.name
                );
            }
        }
    }
}

#[test]
fn context_overflow_is_an_error_not_a_wrap() {
    for name in models() {
        let spec = load_spec(&name);
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cpu = CpuBackend::with_options(threads, Kernels::detect(), Precision::Quantized).expect("CPU backend");
        let mut model = cpu.prepare(&spec).expect("prepare");
        let ids: Vec<u32> = cases(&name, "logits")[0].prompt_ids.iter().copied().cycle().take(5).collect();
        let mut kv = model.new_kv_cache(4).unwrap();
        model.prefill(kv.as_mut(), &ids[..4], 0).unwrap();
        let err = model.decode_token(kv.as_mut(), ids[4], 4).unwrap_err();
        assert!(matches!(err, infer_compute::Error::ContextOverflow { .. }), "{name}: {err}");
        let err = model.prefill(kv.as_mut(), &ids, 0).unwrap_err();
        assert!(matches!(err, infer_compute::Error::ContextOverflow { .. }), "{name}: {err}");
        // A token id past the vocabulary is an error too.
        let mut kv = model.new_kv_cache(4).unwrap();
        assert!(model.decode_token(kv.as_mut(), u32::MAX, 0).is_err());
        // A cache from another model is rejected.
        let other = cpu.prepare(&spec).expect("prepare");
        let mut foreign = other.new_kv_cache(4).unwrap();
        assert!(model.decode_token(foreign.as_mut(), ids[0], 0).is_err());
        // A cache far beyond any memory is an error, not an abort.
        assert!(model.new_kv_cache(1 << 40).is_err());
        assert!(model.new_kv_cache(usize::MAX).is_err());
    }
}
