//! The real models with llama.cpp references in `testdata/<model>/` (see
//! testdata/README.md), shared by the tests that check a backend against
//! them (`model_logits.rs` on the CPU, `cuda_models.rs` on CUDA).

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

/// The bounds of the quantized path (8-bit activations) against llama.cpp
/// on the quantized file, by teacher forcing; the last position's cosine is
/// taken on the centered logits (see `model_logits.rs`).
pub fn within_quantized_bounds(a: &Agreement) -> bool {
    a.top1_rate() >= 0.95
        && a.min_overlap >= 14
        && a.mean_overlap >= 18.0
        && a.max_abs_diff <= 2.5
        && a.median_mean_abs_diff() <= 0.3
        && a.last_cosine_centered.is_none_or(|c| c >= 0.997)
}

/// Teacher forcing of every case of `sub` (`logits` or `logits-f32`) on
/// the model `prepare` makes of each model name, each summary printed
/// under `label`: the count of cases checked and a line for each case
/// outside `ok`.
pub fn teacher_force_all(
    sub: &str,
    label: &str,
    mut prepare: impl FnMut(&str) -> Box<dyn DeviceModel>,
    ok: impl Fn(&Agreement) -> bool,
) -> (usize, Vec<String>) {
    let mut failures = vec![];
    let mut checked = 0;
    for_each_case(sub, &mut prepare, |name, model, case| {
        let a = teacher_force(model, case).expect("teacher forcing");
        println!("{name} {label} {}: {}", case.name, a.summary());
        checked += 1;
        if !ok(&a) {
            failures.push(format!("{name} {}: {}", case.name, a.summary()));
        }
    });
    (checked, failures)
}

/// Calls `f` on every case of `sub` of every model that has some, with
/// the model `prepare` makes of its name (once per model).
fn for_each_case(
    sub: &str,
    prepare: &mut impl FnMut(&str) -> Box<dyn DeviceModel>,
    mut f: impl FnMut(&str, &mut dyn DeviceModel, &ReferenceCase),
) {
    for name in models() {
        let cases = cases(&name, sub);
        if cases.is_empty() {
            continue;
        }
        let mut model = prepare(&name);
        for case in &cases {
            f(&name, model.as_mut(), case);
        }
    }
}

/// Greedy generation of every case of `sub` on the model `prepare` makes
/// of each model name reproduces llama.cpp's greedy tokens up to the first
/// near-tie (a reference margin within `tie`; see
/// [`greedy_up_to_first_near_tie`]); panics otherwise. Returns how many
/// tokens were compared.
pub fn greedy_all(sub: &str, label: &str, tie: f32, mut prepare: impl FnMut(&str) -> Box<dyn DeviceModel>) -> usize {
    let mut compared = 0;
    for_each_case(sub, &mut prepare, |name, model, case| {
        let equal = greedy_up_to_first_near_tie(model, case, tie)
            .unwrap_or_else(|e| panic!("{name} {label} {}: {e}", case.name));
        let end = if equal == case.greedy.len() { "all" } else { "then a near-tie" };
        println!("{name} {label} {}: {equal} of {} greedy tokens equal ({end})", case.name, case.greedy.len());
        compared += equal;
    });
    compared
}

/// Greedy generation of `case` on `model` against llama.cpp's greedy
/// tokens (`greedy` in `pNN.json`): the count of equal tokens before the
/// first difference, or an error when, where they first differ, the
/// reference's top two logits are more than `tie` apart.
fn greedy_up_to_first_near_tie(model: &mut dyn DeviceModel, case: &ReferenceCase, tie: f32) -> Result<usize, String> {
    let n = case.prompt_ids.len() + case.greedy.len();
    let mut kv = model.new_kv_cache(n).map_err(|e| e.to_string())?;
    let mut logits = model.prefill(kv.as_mut(), &case.prompt_ids, 0).map_err(|e| e.to_string())?.to_vec();
    let mut reference_top = case.prompt_top.last().ok_or("no prompt_top")?;
    for (j, step) in case.greedy.iter().enumerate() {
        let ours = infer_model::sampling::argmax(&logits).ok_or("non-finite logits")?;
        if ours != step.id {
            let margin = reference_top.logits[0] - reference_top.logits[1];
            if margin > tie {
                return Err(format!(
                    "greedy step {j} gives {ours}, llama.cpp {} ({:?}) with margin {margin}",
                    step.id, step.piece
                ));
            }
            return Ok(j);
        }
        logits =
            model.decode_token(kv.as_mut(), step.id, case.prompt_ids.len() + j).map_err(|e| e.to_string())?.to_vec();
        reference_top = &step.next_top;
    }
    Ok(case.greedy.len())
}
