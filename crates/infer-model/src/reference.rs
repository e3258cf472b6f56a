//! Agreement of a model's logits with reference logits produced by another
//! implementation (llama.cpp), by teacher forcing.
//!
//! A reference file `pNN.json` holds the prompt's token ids, the top-20
//! next-token ids and logits at every prompt position (`prompt_top`), and 48
//! greedy steps with the top-20 after each (`greedy[i].next_top`). We feed
//! the prompt and then the reference's greedy ids one at a time and compare
//! our logits at each position with the reference's top-20.

use std::path::{Path, PathBuf};

use infer_compute::{DeviceModel, KvPool};
use serde::Deserialize;

use crate::{Error, Result};

/// Top-k ids and logits at one position.
#[derive(Clone, Debug, Deserialize)]
pub struct TopK {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
}

/// One greedy step of the reference.
#[derive(Clone, Debug, Deserialize)]
pub struct GreedyStep {
    pub id: u32,
    #[serde(default)]
    pub piece: String,
    pub next_top: TopK,
}

/// One reference prompt (`pNN.json`).
#[derive(Clone, Debug, Deserialize)]
pub struct ReferenceCase {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub prompt_top: Vec<TopK>,
    pub greedy: Vec<GreedyStep>,
    /// All logits at the last prompt position (`pNN.last_logits.f32`), when present.
    #[serde(skip)]
    pub last_logits: Option<Vec<f32>>,
    /// File stem (`p00`).
    #[serde(skip)]
    pub name: String,
}

impl ReferenceCase {
    /// Reads `dir/NAME.json` and, if present, `dir/NAME.last_logits.f32`.
    ///
    /// # Errors
    /// I/O errors; malformed JSON.
    pub fn load(path: &Path) -> Result<Self> {
        let io = |e| Error::Io { path: path.to_path_buf(), source: e };
        let text = std::fs::read_to_string(path).map_err(io)?;
        let mut case: ReferenceCase = serde_json::from_str(&text)
            .map_err(|e| Error::Gguf(format!("{}: bad reference JSON: {e}", path.display())))?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        let ll = path.with_file_name(format!("{stem}.last_logits.f32"));
        if ll.exists() {
            let bytes = std::fs::read(&ll).map_err(|e| Error::Io { path: ll.clone(), source: e })?;
            case.last_logits =
                Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
        }
        if case.prompt_top.len() != case.prompt_ids.len() {
            return Err(Error::Gguf(format!("{}: prompt_top and prompt_ids differ in length", path.display())));
        }
        case.name = stem;
        Ok(case)
    }

    /// Every `pNN.json` in `dir`, sorted by name.
    ///
    /// # Errors
    /// I/O errors; malformed files.
    pub fn load_dir(dir: &Path) -> Result<Vec<Self>> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::Io { path: dir.to_path_buf(), source: e })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths.iter().map(|p| Self::load(p)).collect()
    }
}

/// Agreement figures of one case.
#[derive(Clone, Debug, Default)]
pub struct Agreement {
    /// Positions compared (prompt positions + greedy steps).
    pub positions: usize,
    /// Positions where the reference's top-1 leads its top-2 by more than
    /// the margin (0.1).
    pub decisive: usize,
    /// Decisive positions where our argmax is the reference's top-1.
    pub top1_agree: usize,
    /// Decisive positions whose reference top-1 leads by more than 0.1 and we disagree.
    pub top1_disagree_positions: Vec<usize>,
    /// Minimum and mean over positions of |our top-20 ∩ reference top-20|.
    pub min_overlap: usize,
    pub mean_overlap: f64,
    /// max over positions and the reference's top-20 ids of |Δlogit|.
    pub max_abs_diff: f32,
    /// Per position, the mean |Δlogit| over the reference's top-20 ids.
    pub mean_abs_diff: Vec<f32>,
    /// Cosine similarity of all logits at the last prompt position (when the
    /// reference has them).
    pub last_cosine: Option<f64>,
    /// The same cosine after subtracting each vector's mean: softmax ignores
    /// a constant shift of the logits, so this one measures only what changes
    /// the distribution (a model whose logits have a mean near zero makes the
    /// plain cosine sensitive to a harmless common shift).
    pub last_cosine_centered: Option<f64>,
}

impl Agreement {
    /// Fraction of decisive positions where the top-1 agrees.
    pub fn top1_rate(&self) -> f64 {
        if self.decisive == 0 {
            1.0
        } else {
            self.top1_agree as f64 / self.decisive as f64
        }
    }

    /// Median over positions of the mean |Δlogit|.
    pub fn median_mean_abs_diff(&self) -> f32 {
        let mut v = self.mean_abs_diff.clone();
        v.sort_by(f32::total_cmp);
        if v.is_empty() {
            0.0
        } else {
            v[v.len() / 2]
        }
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        format!(
            "positions {} top1 {}/{} ({:.1}%) overlap min {} mean {:.2} max|d| {:.3} median mean|d| {:.3} last cosine {} (centered {})",
            self.positions,
            self.top1_agree,
            self.decisive,
            100.0 * self.top1_rate(),
            self.min_overlap,
            self.mean_overlap,
            self.max_abs_diff,
            self.median_mean_abs_diff(),
            self.last_cosine.map_or("n/a".into(), |c| format!("{c:.6}")),
            self.last_cosine_centered.map_or("n/a".into(), |c| format!("{c:.6}"))
        )
    }
}

/// Margin above which a reference top-1 counts as decisive.
pub const DECISIVE_MARGIN: f32 = 0.1;

fn top_k_ids(logits: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return vec![];
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    idx.truncate(k);
    idx
}

fn centered_cosine(a: &[f32], b: &[f32]) -> f64 {
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64;
    let (ma, mb) = (mean(a), mean(b));
    let ca: Vec<f32> = a.iter().map(|&x| (x as f64 - ma) as f32).collect();
    let cb: Vec<f32> = b.iter().map(|&x| (x as f64 - mb) as f32).collect();
    cosine(&ca, &cb)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(f64::MIN_POSITIVE)
}

/// Scores our logits at one position against the reference's top-k.
fn score(agg: &mut Agreement, ours: &[f32], reference: &TopK) {
    let k = reference.ids.len();
    agg.positions += 1;
    if k >= 2 && reference.logits[0] - reference.logits[1] > DECISIVE_MARGIN {
        agg.decisive += 1;
        let ours_top = top_k_ids(ours, 1)[0];
        if ours_top == reference.ids[0] {
            agg.top1_agree += 1;
        } else {
            agg.top1_disagree_positions.push(agg.positions - 1);
        }
    }
    let ours_topk = top_k_ids(ours, k);
    let overlap = reference.ids.iter().filter(|id| ours_topk.contains(id)).count();
    agg.min_overlap = if agg.positions == 1 { overlap } else { agg.min_overlap.min(overlap) };
    agg.mean_overlap += overlap as f64;
    let mut sum = 0f32;
    for (&id, &l) in reference.ids.iter().zip(&reference.logits) {
        let d = (ours.get(id as usize).copied().unwrap_or(f32::NAN) - l).abs();
        agg.max_abs_diff = if d.is_nan() { f32::NAN } else { agg.max_abs_diff.max(d) };
        sum += d;
    }
    agg.mean_abs_diff.push(sum / k.max(1) as f32);
}

/// Teacher-forces `case` through `model` (a fresh KV cache of `n_ctx`
/// positions) one token at a time, and returns the agreement figures.
///
/// # Errors
/// Errors of the model (context overflow, bad token ids).
pub fn teacher_force(model: &mut dyn DeviceModel, case: &ReferenceCase) -> Result<Agreement> {
    let n_total = case.prompt_ids.len() + case.greedy.len();
    let mut kv: Box<dyn KvPool> = model.new_kv_cache(n_total)?;
    let mut agg = Agreement::default();
    let tokens = case.prompt_ids.iter().copied().chain(case.greedy.iter().map(|g| g.id));
    let refs = case.prompt_top.iter().chain(case.greedy.iter().map(|g| &g.next_top));
    for (pos, (tok, reference)) in tokens.zip(refs).enumerate() {
        let logits = model.decode_token(kv.as_mut(), tok, pos)?;
        if pos + 1 == case.prompt_ids.len() {
            if let Some(full) = &case.last_logits {
                agg.last_cosine = Some(cosine(logits, full));
                agg.last_cosine_centered = Some(centered_cosine(logits, full));
            }
        }
        score(&mut agg, logits, reference);
    }
    agg.mean_overlap /= agg.positions.max(1) as f64;
    Ok(agg)
}
