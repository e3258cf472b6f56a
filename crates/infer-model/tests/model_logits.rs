//! Every real model with reference data against llama.cpp's logits, by
//! teacher forcing (see testdata/README.md and `infer_model::reference`).
//!
//! Each directory of `testdata/` named after a known model
//! (`infer_model::fetch::KNOWN_MODELS`: `gemma3-270m`, `smollm2-135m`, ...)
//! is one model; its file is found by that name (fetched and cached on
//! first use). In each:
//! - `logits-f32/` (llama.cpp on the weights dequantized to F32, f32
//!   activations: the exact forward pass of the quantized file): our exact
//!   mode (weights dequantized to f32, f32 activations) must match tightly,
//!   and our default quantized path must stay within the quantized bounds;
//! - `logits/` (llama.cpp as users run it, 8-bit activations in its dot
//!   products): our default quantized path, with the SIMD kernels this CPU
//!   selects, within the same quantized bounds.
//!
//! # The quantized bounds
//! With 8-bit activations re-quantized in every layer the forward pass is
//! chaotic: two passes that differ only in rounding (our packed Q4_1
//! product uses the exact activation block sum where ggml uses its f16
//! rounding) or in summation order drift apart by more than either is from
//! the F32 pass. llama.cpp itself is no exception: its quantized run from
//! `bench/llama-logits` (built for AVX2) against the stored `p00`-`p02` of
//! `logits/` (another build of the same source) reaches max |Δlogit| 2.24
//! (Gemma `p02`). So the bounds are set where llama.cpp's own quantized run
//! stands against its F32 run, and our quantized path is held to them
//! against both references: per case ([`within_quantized_bounds`]) top-1
//! at 85% of the decisive positions, top-20 overlap at least 14 (mean 18),
//! max |Δlogit| 3.5, median of the per-position mean |Δ| 0.3, centered
//! last-position cosine 0.997; over all cases of a model
//! ([`QUANTIZED_POOLED_TOP1`]) top-1 at 97%. A case has 50-230 decisive
//! positions, so its own rate moves by 0.5-2 points per flip (the flips
//! measured were at reference margins of 0.1-0.45, 1.16 for llama.cpp's
//! run); the pooled rate carries the weight.
//!
//! Measured on the 13 prompts per model (AVX-512 VNNI kernels,
//! 2026-12-03; llama.cpp's quantized run against its F32 run on the same
//! tokens from `llama-logits --follow`, outside testdata):
//!
//! | pair | model | top-1 pooled | top-1 worst case | max \|Δ\| | centered cosine, min |
//! | --- | --- | --- | --- | --- | --- |
//! | ours vs `logits/` | Gemma 3 | 97.9% | 96.1% (`p07`) | 2.82 (`p05`) | 0.99797 |
//! | | SmolLM2 | 99.0% | 98.2% (`p12`) | 1.89 (`p07`) | 0.99896 |
//! | ours vs `logits-f32/` | Gemma 3 | 98.2% | 90.7% (`p10`) | 2.76 (`p05`) | 0.99847 |
//! | | SmolLM2 | 98.7% | 96.9% (`p03`) | 1.70 (`p07`) | 0.99760 |
//! | llama.cpp quantized vs F32 | Gemma 3 | 98.5% | 93.8% (`p08`) | 3.19 (`p05`)¹ | 0.99823 |
//! | | SmolLM2 | 99.2% | 97.5% (`p07`) | 1.38 (`p10`)¹ | 0.99790 |
//!
//! ¹ over the ids in both runs' top 20 (the files hold no more).
//!
//! Neither quantized pass is the closer to the F32 pass: on llama.cpp's
//! tokens, ours picks the F32 pass's top-1 at 98.4% (Gemma) and 98.7%
//! (SmolLM2) of its decisive positions, llama.cpp at 98.5% and 99.2%; our
//! scalar kernels, whose Q4_1 product rounds the activation sum to f16 as
//! ggml does, at 98.8% on SmolLM2, so that rounding is not what separates
//! them. `quantized_vs_f32_pass.rs` checks this comparison. Where our
//! quantized path and llama.cpp's differ most (Gemma `p05`, max |Δ| 2.82
//! after the chat template's first token, where every logit is near -64)
//! ours is 2.4 above the F32 pass and llama.cpp's run 0.4 from it; after
//! the next token (logits near -15) llama.cpp's run is 3.0 above it and
//! ours 1.4. Both passes' largest errors are at these positions.
//!
//! The last position's full-vocabulary cosine is on the centered logits
//! (mean removed; softmax ignores a common shift). With the row-dot
//! kernels, our own AVX2 and scalar paths, whose row dots differ only in
//! summation order (~1e-7), ended 0.28 apart in mean |Δlogit| on SmolLM2's
//! `p00`, mostly as a common shift; that prompt's logits have a mean near
//! zero (norm 890 against 3500 for the others), so its plain cosine was
//! 0.9949 on AVX2 and 0.9988 on scalar while the centered one was 0.9995
//! on both (llama.cpp's own quantized run vs its F32 run: 0.9986 plain,
//! 0.9994 centered). Exact mode holds both cosines to 0.99999.
//!
//! `INFER_TESTDATA` replaces the `testdata/` directory.

mod real_refs;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::{ComputeBackend, DeviceModel};
use infer_model::reference::DECISIVE_MARGIN;
use real_refs::{
    cases, greedy_all, load_spec, models, teacher_force_all, within_quantized_bounds, QUANTIZED_POOLED_TOP1,
};

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
        None,
        "exact",
        |name| prepare(name, Precision::Exact),
        |a| {
            a.top1_agree == a.decisive
                && a.min_overlap >= 18
                && a.max_abs_diff <= 0.1
                && a.last_cosine.is_none_or(|c| c >= 0.99999)
                && a.last_cosine_centered.is_none_or(|c| c >= 0.99999)
        },
        1.0,
    );
    assert!(checked > 0, "no exact-mode reference cases");
    assert!(failures.is_empty(), "exact mode out of bounds:\n{}", failures.join("\n"));
}

#[test]
fn quantized_path_matches_llama_cpp_logits() {
    let (checked, failures) = teacher_force_all(
        "logits",
        None,
        "quant",
        |name| prepare(name, Precision::Quantized),
        within_quantized_bounds,
        QUANTIZED_POOLED_TOP1,
    );
    assert!(checked > 0, "no quantized reference cases");
    assert!(failures.is_empty(), "quantized path out of bounds:\n{}", failures.join("\n"));
}

/// The quantized path against the F32 pass (llama.cpp on the weights
/// dequantized to F32), under the same bounds: what our quantized path
/// computes, whatever llama.cpp's own quantized run does.
#[test]
fn quantized_path_matches_llama_cpp_f32_logits() {
    let (checked, failures) = teacher_force_all(
        "logits-f32",
        None,
        "quant-vs-f32",
        |name| prepare(name, Precision::Quantized),
        within_quantized_bounds,
        QUANTIZED_POOLED_TOP1,
    );
    assert!(checked > 0, "no F32 reference cases");
    assert!(failures.is_empty(), "quantized path out of bounds against the F32 pass:\n{}", failures.join("\n"));
}

/// Greedy generation on the CPU backend at `precision` against the
/// references of `sub`, near-ties judged in `sub` or `referee` (see
/// [`greedy_all`]).
fn greedy_matches(precision: Precision, sub: &str, referee: Option<&str>, tie: f32) -> usize {
    greedy_all(sub, None, referee, sub, tie, |name| prepare(name, precision))
}

/// The exact mode against llama.cpp on the F32 weights: a near-tie is a
/// margin within [`DECISIVE_MARGIN`], the bound under which the exact
/// mode's top-1 must already agree at every position.
#[test]
fn exact_greedy_generation_matches_llama_cpp_up_to_the_first_near_tie() {
    assert!(greedy_matches(Precision::Exact, "logits-f32", None, DECISIVE_MARGIN) > 0, "no greedy tokens compared");
}

/// The quantized path against llama.cpp on the quantized file. Both
/// re-quantize activations to 8 bits in every layer and sum in different
/// orders, and that forward pass is chaotic (the module docs): our own
/// AVX2 and scalar kernels end up to 0.3 apart in mean |Δlogit| on one
/// prompt. A near-tie here is a margin within 0.5, twice that spread, in
/// llama.cpp's quantized run or, where the F32 run (`logits-f32/`) saw the
/// same tokens, in that run: llama.cpp's quantized margin between its top
/// two differs from its F32 run's by 0.56 at the 99th percentile and 1.67
/// at most over the 26 prompts. Gemma `p04` (code) is such a case: at
/// greedy step 2 llama.cpp's quantized run leads by 0.955, its F32 run by
/// 0.224 and ours goes the other way by 0.062. The logit bounds of
/// `quantized_path_matches_llama_cpp_logits` still hold at every position.
#[test]
fn quantized_greedy_generation_matches_llama_cpp_up_to_the_first_near_tie() {
    assert!(greedy_matches(Precision::Quantized, "logits", Some("logits-f32"), 0.5) > 0, "no greedy tokens compared");
}

/// A prompt's prefill and its token-by-token decode compute the same
/// formula; prompt chunks run the tiled attention kernel, which sums in
/// another order than the per-token one. In exact mode that is rounding
/// (relative L2 within 1e-5; 1.1e-6 at most on the 26 prompts); the
/// quantized path re-quantizes activations to 8 bits in every layer, which
/// turns such rounding differences into flipped quanta (chaotic, as the
/// module docs say), so it is held to the logit cosine of the llama.cpp
/// bounds instead, and to a relative L2 of 0.1 (measured: up to 6.4e-2,
/// SmolLM2 `p08`, cosine 0.99866 or more; the earlier 5e-2 failed Gemma
/// `p08` at 5.4e-2 and SmolLM2 `p08` and `p11`).
#[test]
fn prefill_equals_token_by_token_decode() {
    for (precision, max_rel, max_cos_gap) in [(Precision::Exact, 1e-5, 1e-9), (Precision::Quantized, 1e-1, 3e-3)] {
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
