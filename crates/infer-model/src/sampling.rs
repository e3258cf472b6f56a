//! Choosing the next token from a row of logits.
//!
//! A [`Sampler`] applies, in this order:
//!
//! 1. **repetition penalty** to the tokens of its recent-history window
//!    (llama.cpp's rule: a positive logit is divided by the penalty, a
//!    negative one multiplied by it);
//! 2. **greedy** choice when the temperature is 0 or `top_k` is 1: the
//!    largest logit, the lowest id among equal ones;
//! 3. **temperature**: probabilities ∝ exp(logit / T); the filters below
//!    act on this distribution (as in Hugging Face transformers; llama.cpp
//!    applies its temperature after filtering);
//! 4. **min-p**: drop tokens whose probability is below `min_p` times the
//!    largest;
//! 5. **top-k**: keep the `k` most likely tokens (ties broken towards lower
//!    ids), found by partial selection, never a sort of the vocabulary;
//! 6. **top-p** (nucleus): keep the smallest set of most likely tokens whose
//!    probabilities sum to at least `top_p`, renormalised among the tokens
//!    kept so far;
//! 7. a draw from what is left with a seeded ChaCha8 generator: the same
//!    seed, settings and logits give the same tokens on every platform and
//!    rand version.
//!
//! Without top-k, top-p buckets the row by log-probability in one pass and
//! sorts only the buckets that hold the nucleus; sampling with neither
//! takes two passes over the logits. Nothing is allocated per call once the
//! scratch buffers have grown.
//!
//! Bad logits: an empty row and a NaN anywhere are errors
//! ([`SamplingError`]); a NaN means the forward pass went wrong, and
//! hiding it would only move the failure. `-inf` masks a token (it is never
//! chosen; a row of nothing but `-inf` is an error). `+inf` makes a token
//! certain: the lowest id among the `+inf` logits is returned.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Why a token could not be sampled or a sampler not built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A setting out of its range.
    #[error("invalid sampler setting: {0}")]
    InvalidConfig(String),
    /// The logits slice was empty.
    #[error("no logits to sample from")]
    Empty,
    /// A logit is NaN.
    #[error("logit {index} is NaN")]
    NaN {
        /// Index of the first NaN.
        index: usize,
    },
    /// Every logit is `-inf`.
    #[error("every logit is -inf")]
    AllMasked,
}

/// Sampling settings. The neutral value of each filter turns it off.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature, finite and ≥ 0; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 turns it off, 1 is
    /// greedy.
    pub top_k: usize,
    /// Nucleus size in (0, 1]; 1 turns it off.
    pub top_p: f32,
    /// Minimum probability relative to the most likely token, in [0, 1];
    /// 0 turns it off.
    pub min_p: f32,
    /// Repetition penalty, finite and > 0; 1 turns it off.
    pub repetition_penalty: f32,
    /// How many of the most recent tokens the penalty applies to.
    pub repeat_last_n: usize,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95,
    /// min-p 0.05, no repetition penalty (window 64), seed 0.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Self::default() }
    }

    /// Plain sampling from the softmax at `temperature`, no filters.
    pub fn with_temperature(temperature: f32, seed: u64) -> Self {
        SamplerConfig { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..Self::default() }
    }

    /// Checks every setting's range.
    ///
    /// # Errors
    /// [`SamplingError::InvalidConfig`] naming the first bad setting.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let bad = |m: String| Err(SamplingError::InvalidConfig(m));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!("temperature {} (must be finite and >= 0)", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p {} (must be in (0, 1])", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p {} (must be in [0, 1])", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!("repetition_penalty {} (must be finite and > 0)", self.repetition_penalty));
        }
        Ok(())
    }
}

/// The index of the largest value, the lowest index among equal ones. NaN
/// values are skipped; `None` when there is no other value.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if !matches!(best, Some((_, b)) if x <= b) {
            best = Some((i as u32, x));
        }
    }
    best.map(|(i, _)| i)
}

/// A candidate token; ordered so that "greater" means "more likely":
/// higher logit, then lower id.
#[derive(Clone, Copy, Debug)]
struct Cand {
    logit: f32,
    id: u32,
}

impl PartialEq for Cand {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Cand {
    fn cmp(&self, other: &Self) -> Ordering {
        self.logit.total_cmp(&other.logit).then_with(|| other.id.cmp(&self.id))
    }
}

/// Draws tokens from logits (see the [module documentation](self)).
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    history: VecDeque<u32>,
    /// Scratch: the logits with the repetition penalty applied.
    penalized: Vec<f32>,
    /// Scratch: distinct ids of the history.
    recent: Vec<u32>,
    /// Scratch: the heap for partial selection.
    heap: BinaryHeap<std::cmp::Reverse<Cand>>,
    /// Scratch: candidates, most likely first.
    cands: Vec<Cand>,
    /// Scratch: unnormalised probabilities of the whole row.
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler with the given settings.
    ///
    /// # Errors
    /// [`SamplingError::InvalidConfig`] when a setting is out of range.
    pub fn new(cfg: SamplerConfig) -> Result<Self, SamplingError> {
        cfg.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            history: VecDeque::new(),
            penalized: Vec::new(),
            recent: Vec::new(),
            heap: BinaryHeap::new(),
            cands: Vec::new(),
            weights: Vec::new(),
        })
    }

    /// A greedy sampler.
    pub fn greedy() -> Self {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(0),
            cfg: SamplerConfig::greedy(),
            history: VecDeque::new(),
            penalized: Vec::new(),
            recent: Vec::new(),
            heap: BinaryHeap::new(),
            cands: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Restarts the random generator from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.cfg.seed = seed;
        self.rng = ChaCha8Rng::seed_from_u64(seed);
    }

    /// Forgets the token history (the repetition-penalty window).
    pub fn reset_history(&mut self) {
        self.history.clear();
    }

    /// Records a token that was not drawn by [`Sampler::sample`] (prompt
    /// tokens, forced tokens) in the repetition-penalty window.
    pub fn accept(&mut self, id: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.cfg.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(id);
    }

    /// The tokens in the repetition-penalty window, oldest first.
    pub fn history(&self) -> impl Iterator<Item = u32> + '_ {
        self.history.iter().copied()
    }

    /// Draws the next token and records it in the history.
    ///
    /// # Errors
    /// [`SamplingError::Empty`] for an empty slice,
    /// [`SamplingError::NaN`] when a logit is NaN,
    /// [`SamplingError::AllMasked`] when every logit is `-inf`.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::Empty);
        }
        // One pass for both the NaN check and the greedy choice.
        let mut best = 0u32;
        let mut best_x = f32::NEG_INFINITY;
        for (i, &x) in logits.iter().enumerate() {
            if x > best_x {
                best = i as u32;
                best_x = x;
            } else if x.is_nan() {
                return Err(SamplingError::NaN { index: i });
            }
        }
        let mut penalized = std::mem::take(&mut self.penalized);
        let use_penalty = self.cfg.repetition_penalty != 1.0 && !self.history.is_empty();
        if use_penalty {
            penalized.clear();
            penalized.extend_from_slice(logits);
            self.recent.clear();
            self.recent.extend(self.history.iter().copied());
            self.recent.sort_unstable();
            self.recent.dedup();
            let p = self.cfg.repetition_penalty;
            for &id in &self.recent {
                if let Some(x) = penalized.get_mut(id as usize) {
                    *x = if *x > 0.0 { *x / p } else { *x * p };
                }
            }
        }
        let (l, best) = if use_penalty { (&penalized[..], argmax(&penalized).unwrap_or(0)) } else { (logits, best) };
        let chosen = self.choose(l, best);
        self.penalized = penalized;
        let id = chosen?;
        self.accept(id);
        Ok(id)
    }

    /// Draws from `l` (no NaN, not empty), whose greedy choice is `best`.
    fn choose(&mut self, l: &[f32], best: u32) -> Result<u32, SamplingError> {
        let max = l[best as usize];
        if max == f32::NEG_INFINITY {
            return Err(SamplingError::AllMasked);
        }
        let t = self.cfg.temperature;
        let inv_t = 1.0 / t as f64;
        if t == 0.0 || self.cfg.top_k == 1 || max == f32::INFINITY || !inv_t.is_finite() {
            return Ok(best);
        }
        let max = max as f64;
        // exp in f32 (faster than f64, and ample for probabilities); the
        // sums are kept in f64.
        let weight = |x: f32| (((x as f64 - max) * inv_t) as f32).exp() as f64;
        // min-p as a threshold on the logit.
        let floor =
            if self.cfg.min_p > 0.0 { max + t as f64 * (self.cfg.min_p as f64).ln() } else { f64::NEG_INFINITY };
        let keep = |x: f32| x != f32::NEG_INFINITY && x as f64 >= floor;
        let top_p = self.cfg.top_p as f64;
        let n = l.len();

        if self.cfg.top_k > 0 && self.cfg.top_k < n {
            self.select_top(l, self.cfg.top_k, &keep);
            return Ok(self.draw_sorted(&weight, None, top_p));
        }
        if top_p >= 1.0 {
            // Straight from the (min-p filtered) softmax: one pass for the
            // weights, one to find the draw.
            let mut w = std::mem::take(&mut self.weights);
            w.clear();
            w.extend(l.iter().map(|&x| if keep(x) { weight(x) as f32 } else { 0.0 }));
            let total: f64 = w.iter().map(|&v| v as f64).sum();
            let u = self.rng.gen::<f64>() * total;
            let mut acc = 0.0;
            let mut chosen = None;
            for (i, &v) in w.iter().enumerate() {
                acc += v as f64;
                if acc > u {
                    chosen = Some(i as u32);
                    break;
                }
            }
            // Rounding left `u` at the very end: the last token with a
            // nonzero weight.
            let id = chosen.or_else(|| w.iter().rposition(|&v| v > 0.0).map(|i| i as u32)).unwrap_or(best);
            self.weights = w;
            return Ok(id);
        }
        // Nucleus over the whole vocabulary. Tokens are bucketed by
        // log-probability (1/16 nat per bucket, from the most likely
        // down); the first buckets that hold `top_p` of the mass contain
        // the whole nucleus, and only their tokens are sorted.
        const BUCKETS: usize = 1024;
        const PER_NAT: f64 = 16.0;
        let bucket = |x: f32| {
            let d = (max - x as f64) * inv_t * PER_NAT;
            if d < (BUCKETS - 1) as f64 {
                d as usize
            } else {
                BUCKETS - 1
            }
        };
        let mut w = std::mem::take(&mut self.weights);
        w.clear();
        w.extend(l.iter().map(|&x| if keep(x) { weight(x) as f32 } else { 0.0 }));
        let mut mass = [0f64; BUCKETS];
        let mut total = 0f64;
        for (&x, &v) in l.iter().zip(&w) {
            if v > 0.0 {
                mass[bucket(x)] += v as f64;
                total += v as f64;
            }
        }
        let mut last = BUCKETS - 1;
        let mut cum = 0.0;
        for (b, &m) in mass.iter().enumerate() {
            cum += m;
            if cum >= top_p * total {
                last = b;
                break;
            }
        }
        self.cands.clear();
        for (i, (&x, &v)) in l.iter().zip(&w).enumerate() {
            if v > 0.0 && bucket(x) <= last {
                self.cands.push(Cand { logit: x, id: i as u32 });
            }
        }
        self.weights = w;
        self.cands.sort_unstable_by(|a, b| b.cmp(a));
        Ok(self.draw_sorted(&weight, Some(total), top_p))
    }

    /// Fills `cands` with the `k` most likely tokens that pass `keep`, most
    /// likely first.
    fn select_top(&mut self, l: &[f32], k: usize, keep: &impl Fn(f32) -> bool) {
        use std::cmp::Reverse;
        if k.saturating_mul(4) >= l.len() {
            // Most of the row: select and sort directly.
            self.cands.clear();
            self.cands
                .extend(l.iter().enumerate().filter(|&(_, &x)| keep(x)).map(|(i, &x)| Cand { logit: x, id: i as u32 }));
            if self.cands.len() > k {
                self.cands.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
                self.cands.truncate(k);
            }
            self.cands.sort_unstable_by(|a, b| b.cmp(a));
            return;
        }
        self.heap.clear();
        // Logit of the least likely token in a full heap: anything below it
        // cannot get in.
        let mut floor = f32::NEG_INFINITY;
        for (i, &x) in l.iter().enumerate() {
            if x < floor || !keep(x) {
                continue;
            }
            let c = Cand { logit: x, id: i as u32 };
            if self.heap.len() < k {
                self.heap.push(Reverse(c));
                if self.heap.len() == k {
                    floor = self.heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.logit);
                }
            } else if x >= floor {
                if let Some(mut worst) = self.heap.peek_mut() {
                    if c > worst.0 {
                        *worst = Reverse(c);
                    }
                }
                floor = self.heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.logit);
            }
        }
        self.cands.clear();
        self.cands.extend(self.heap.drain().map(|r| r.0));
        self.cands.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Applies top-p to `cands` (sorted, most likely first) and draws one.
    /// `total` is the probability mass top-p is relative to: that of
    /// `cands` when `None`.
    fn draw_sorted(&mut self, weight: &impl Fn(f32) -> f64, total: Option<f64>, top_p: f64) -> u32 {
        let total = total.unwrap_or_else(|| self.cands.iter().map(|c| weight(c.logit)).sum());
        let mut kept = 0;
        let mut mass = 0.0;
        for c in &self.cands {
            if kept > 0 && mass >= top_p * total {
                break;
            }
            mass += weight(c.logit);
            kept += 1;
        }
        let u = self.rng.gen::<f64>() * mass;
        let mut acc = 0.0;
        for c in &self.cands[..kept] {
            acc += weight(c.logit);
            if acc > u {
                return c.id;
            }
        }
        // Rounding left `u` at the very end: the least likely kept token
        // with a nonzero weight (the first one always has weight 1).
        self.cands[..kept].iter().rev().find(|c| weight(c.logit) > 0.0).map_or(self.cands[0].id, |c| c.id)
    }
}
