//! The real models with llama.cpp references in `testdata/<model>/` (see
//! testdata/README.md), shared by the tests that check a backend against
//! them (`model_logits.rs` on the CPU, `cuda_models.rs` on CUDA,
//! `wgpu_models.rs` on wgpu).

use std::path::PathBuf;

use infer_compute::pipeline::ModelSpec;
use infer_compute::DeviceModel;
use infer_model::gguf::GgufFile;
use infer_model::reference::{teacher_force, Agreement, ReferenceCase};

/// `INFER_TESTDATA`, or the repository's `testdata/`.
pub fn testdata() -> PathBuf {
    std::env::var_os("INFER_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata")))
}

/// The model directories present in testdata, by registry name. A
/// directory with `logits/` that names no known model fails the test (it
/// could not be checked); `synth-*` directories hold synthetic models'
/// references, which `arch_logits.rs` checks.
pub fn models() -> Vec<String> {
    let root = testdata();
    let mut names = vec![];
    let entries = std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("synth-") || !e.path().join("logits").is_dir() && !e.path().join("logits-f32").is_dir() {
            continue;
        }
        assert!(
            infer_model::fetch::find_model(&name).is_some(),
            "testdata/{name} has reference logits but names no known model ({})",
            infer_model::fetch::known_names()
        );
        names.push(name);
    }
    names.sort();
    assert!(!names.is_empty(), "no model directories with reference logits in {}", root.display());
    names
}

/// The model file of `name` (fetched and cached on first use), opened.
pub fn load_model(name: &str) -> GgufFile {
    let path = infer_model::fetch::ensure_model(name).unwrap_or_else(|e| panic!("model {name}: {e}"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// The pipeline description of model `name`.
pub fn load_spec(name: &str) -> ModelSpec {
    infer_model::model::load_spec(&load_model(name)).unwrap_or_else(|e| panic!("{name}: spec: {e}"))
}

/// The cases of `model/sub`, or none when that directory is absent (said in
/// the output).
pub fn cases(model: &str, sub: &str) -> Vec<ReferenceCase> {
    let dir = testdata().join(model).join(sub);
    if !dir.is_dir() {
        println!("{model}: no {sub}/ reference, not checked");
        return vec![];
    }
    let cases = ReferenceCase::load_dir(&dir).unwrap_or_else(|e| panic!("reference cases in {}: {e}", dir.display()));
    assert!(!cases.is_empty(), "no reference cases in {}", dir.display());
    cases
}

/// The bounds of the quantized path (8-bit activations) per case, by
/// teacher forcing, against llama.cpp on the quantized file and against
/// llama.cpp on the same weights as F32 alike; the last position's cosine
/// is taken on the centered logits. With them goes the top-1 rate over
/// all cases of a model, [`QUANTIZED_POOLED_TOP1`]. `model_logits.rs` says
/// what was measured.
pub fn within_quantized_bounds(a: &Agreement) -> bool {
    a.top1_rate() >= 0.85
        && a.min_overlap >= 14
        && a.mean_overlap >= 18.0
        && a.max_abs_diff <= 3.5
        && a.median_mean_abs_diff() <= 0.3
        && a.last_cosine_centered.is_none_or(|c| c >= 0.997)
}

/// The quantized path's top-1 agreement over all decisive positions of
/// all cases of one model (see [`within_quantized_bounds`]).
pub const QUANTIZED_POOLED_TOP1: f64 = 0.97;

/// Teacher forcing of every case of `sub` (`logits` or `logits-f32`), or
/// of the first `max_cases` of each model, on the model `prepare` makes of
/// each model name, each summary printed under `label`: the count of cases
/// checked and a line for each case outside `ok`, and for each model whose
/// top-1 agreement over the decisive positions of its cases is below
/// `pooled_top1`.
pub fn teacher_force_all(
    sub: &str,
    max_cases: Option<usize>,
    label: &str,
    mut prepare: impl FnMut(&str) -> Box<dyn DeviceModel>,
    ok: impl Fn(&Agreement) -> bool,
    pooled_top1: f64,
) -> (usize, Vec<String>) {
    let mut failures = vec![];
    let mut checked = 0;
    // Per model: (top-1 agreements, decisive positions).
    let mut pooled: Vec<(String, usize, usize)> = vec![];
    for_each_case(sub, max_cases, &mut prepare, |name, model, case| {
        let a = teacher_force(model, case).expect("teacher forcing");
        println!("{name} {label} {}: {}", case.name, a.summary());
        checked += 1;
        if !ok(&a) {
            failures.push(format!("{name} {}: {}", case.name, a.summary()));
        }
        if pooled.last().is_none_or(|p| p.0 != name) {
            pooled.push((name.to_string(), 0, 0));
        }
        let p = pooled.last_mut().expect("pushed");
        p.1 += a.top1_agree;
        p.2 += a.decisive;
    });
    for (name, agree, decisive) in pooled {
        let rate = agree as f64 / decisive.max(1) as f64;
        println!("{name} {label}: top-1 {agree}/{decisive} ({:.2}%) over all cases", 100.0 * rate);
        if rate < pooled_top1 {
            failures.push(format!("{name}: top-1 {agree}/{decisive} over all cases, below {pooled_top1}"));
        }
    }
    (checked, failures)
}

/// Calls `f` on every case of `sub` of every model that has some (the
/// first `max_cases` of each, said in the output), with the model
/// `prepare` makes of its name (once per model).
fn for_each_case(
    sub: &str,
    max_cases: Option<usize>,
    prepare: &mut impl FnMut(&str) -> Box<dyn DeviceModel>,
    mut f: impl FnMut(&str, &mut dyn DeviceModel, &ReferenceCase),
) {
    for name in models() {
        let mut cases = cases(&name, sub);
        if cases.is_empty() {
            continue;
        }
        if let Some(n) = max_cases.filter(|&n| n < cases.len()) {
            println!("{name}: the first {n} of the {} cases of {sub}/", cases.len());
            cases.truncate(n);
        }
        let mut model = prepare(&name);
        for case in &cases {
            f(&name, model.as_mut(), case);
        }
    }
}

/// Greedy generation of every case of `sub` (or of the first `max_cases`
/// of each model) on the model `prepare` makes of each model name reproduces llama.cpp's greedy tokens up to the first
/// near-tie (a margin within `tie` in the reference, or in the case of the
/// same name in `referee` where that run saw the same tokens; see
/// [`greedy_up_to_first_near_tie`]); panics otherwise. Returns how many
/// tokens were compared.
pub fn greedy_all(
    sub: &str,
    max_cases: Option<usize>,
    referee: Option<&str>,
    label: &str,
    tie: f32,
    mut prepare: impl FnMut(&str) -> Box<dyn DeviceModel>,
) -> usize {
    let mut compared = 0;
    let mut referees: Option<(String, Vec<ReferenceCase>)> = None;
    for_each_case(sub, max_cases, &mut prepare, |name, model, case| {
        let referee = referee.and_then(|r| {
            if referees.as_ref().is_none_or(|(n, _)| n != name) {
                referees = Some((name.to_string(), cases(name, r)));
            }
            referees.as_ref().and_then(|(_, cs)| cs.iter().find(|c| c.name == case.name))
        });
        let (equal, end) = greedy_up_to_first_near_tie(model, case, referee, tie)
            .unwrap_or_else(|e| panic!("{name} {label} {}: {e}", case.name));
        println!("{name} {label} {}: {equal} of {} greedy tokens equal ({end})", case.name, case.greedy.len());
        compared += equal;
    });
    compared
}

/// Greedy generation of `case` on `model` against llama.cpp's greedy
/// tokens (`greedy` in `pNN.json`): the count of equal tokens before the
/// first difference, and how the comparison ended; or an error when, where
/// they first differ, the reference's top two logits are more than `tie`
/// apart and `referee` (llama.cpp's F32 run of the same prompt) does not
/// have the two tokens within `tie` either. The referee counts only where
/// it saw the same tokens (the prompt and the greedy steps so far), with
/// both tokens in its top 20.
fn greedy_up_to_first_near_tie(
    model: &mut dyn DeviceModel,
    case: &ReferenceCase,
    referee: Option<&ReferenceCase>,
    tie: f32,
) -> Result<(usize, &'static str), String> {
    let n = case.prompt_ids.len() + case.greedy.len();
    let mut kv = model.new_kv_cache(n).map_err(|e| e.to_string())?;
    let mut logits = model.prefill(kv.as_mut(), &case.prompt_ids, 0).map_err(|e| e.to_string())?.to_vec();
    let mut reference_top = case.prompt_top.last().ok_or("no prompt_top")?;
    for (j, step) in case.greedy.iter().enumerate() {
        let ours = infer_compute::greedy_token(&logits).map_err(|e| e.to_string())?;
        if ours != step.id {
            let margin = reference_top.logits[0] - reference_top.logits[1];
            if margin <= tie {
                return Ok((j, "then a near-tie"));
            }
            let referee_margin = referee.and_then(|r| referee_margin(r, case, j, step.id, ours));
            if referee_margin.is_some_and(|m| m <= tie) {
                return Ok((j, "then a near-tie in the referee"));
            }
            return Err(format!(
                "greedy step {j} gives {ours}, llama.cpp {} ({:?}) with margin {margin} (referee: {referee_margin:?})",
                step.id, step.piece
            ));
        }
        logits =
            model.decode_token(kv.as_mut(), step.id, case.prompt_ids.len() + j).map_err(|e| e.to_string())?.to_vec();
        reference_top = &step.next_top;
    }
    Ok((case.greedy.len(), "all"))
}

/// How far `theirs` leads `ours` in `referee` after the prompt and the
/// first `step` greedy tokens of `case`, where the referee saw those same
/// tokens and has both in its top 20.
fn referee_margin(referee: &ReferenceCase, case: &ReferenceCase, step: usize, theirs: u32, ours: u32) -> Option<f32> {
    let same = referee.prompt_ids == case.prompt_ids
        && referee.greedy.len() >= step
        && referee.greedy[..step].iter().zip(&case.greedy[..step]).all(|(a, b)| a.id == b.id);
    if !same {
        return None;
    }
    let top = if step == 0 { referee.prompt_top.last()? } else { &referee.greedy[step - 1].next_top };
    let logit = |id: u32| top.ids.iter().position(|&i| i == id).map(|k| top.logits[k]);
    Some(logit(theirs)? - logit(ours)?)
}
