//! Choosing the next token from a row of logits: llama.cpp's default
//! sampler chain (`common_sampler` in llama.cpp's `common/sampling.cpp`,
//! each stage as in `src/llama-sampler.cpp`), with its defaults and in its
//! order.
//!
//! A [`Sampler`] applies, in this order:
//!
//! 1. **penalties** to the tokens of the last `repeat_last_n` tokens
//!    (prompt and generated): a positive logit is divided by
//!    `repetition_penalty`, a negative or zero one multiplied by it (the
//!    CTRL paper's rule, with llama.cpp's fix for negative logits); then
//!    `count · frequency_penalty + presence_penalty` is subtracted, `count`
//!    being the token's occurrences in the window (OpenAI's definitions);
//! 2. **greedy** choice when the temperature is 0 or `top_k` is 1: the
//!    largest penalized logit, the lowest id among equal ones;
//! 3. **top-k**: keep the `k` most likely tokens (ties broken towards lower
//!    ids), found by partial selection, never a sort of the vocabulary
//!    unless `k` is the vocabulary or more and top-p follows: llama.cpp's
//!    top-k then sorts the whole row, and top-p sums its probabilities in
//!    that order;
//! 4. **top-p** (nucleus): the softmax of the remaining logits at
//!    temperature one, in `f32`, then the smallest most-likely-first prefix
//!    whose `f32` running sum is `>=` `top_p` (as an `f32`): llama.cpp's
//!    comparison, see [`nucleus_len`];
//! 5. **min-p**: keep the tokens whose logit is at least the largest plus
//!    `ln(min_p)` (in `f32`), i.e. probability ≥ `min_p` × the largest;
//! 6. **temperature**: logits divided by `T`;
//! 7. **dist**: a draw from the softmax of what is left, with a seeded
//!    ChaCha8 generator: the same seed, settings and logits give the same
//!    tokens on every platform and rand version (not llama.cpp's tokens:
//!    its generator is `std::mt19937`).
//!
//! As in llama.cpp, the filters act on the temperature-1 distribution and
//! the temperature only reshapes what they kept.
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

use crate::gguf::{GgufFile, Value};

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
    /// The scratch buffers for a row of this many logits could not be
    /// allocated.
    #[error("out of memory: sampling scratch for {logits} logits needs about {bytes} bytes")]
    OutOfMemory {
        /// Length of the logits row.
        logits: usize,
        /// Bytes the buffers need.
        bytes: usize,
    },
}

/// Sampling settings, named and defaulted as llama.cpp's (`common_params_sampling`).
/// The neutral value of each stage turns it off.
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
    /// How many of the most recent tokens the penalties apply to; 0 turns
    /// the penalties off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token in the window
    /// (finite; 0 turns it off, negative values favour repeats).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window
    /// (finite; 0 turns it off).
    pub frequency_penalty: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95,
    /// min-p 0.05, no penalties (repetition 1.0 over a window of 64,
    /// presence 0, frequency 0), seed 0 (llama.cpp draws a random seed;
    /// callers that want one pass it).
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
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

    /// Whether the penalties stage changes anything (llama.cpp's
    /// `is_disabled` negated).
    pub fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }

    /// The stages that act with these settings, in order, as
    /// `penalties -> top-k -> top-p -> min-p -> temperature -> dist`
    /// (`greedy` when the temperature is 0).
    pub fn chain(&self) -> String {
        let mut s = Vec::new();
        if self.penalties_active() {
            s.push("penalties");
        }
        if self.temperature == 0.0 || self.top_k == 1 {
            s.push("greedy");
            return s.join(" -> ");
        }
        if self.top_k > 0 {
            s.push("top-k");
        }
        if self.top_p < 1.0 {
            s.push("top-p");
        }
        if self.min_p > 0.0 {
            s.push("min-p");
        }
        s.push("temperature");
        s.push("dist");
        s.join(" -> ")
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
        if !self.presence_penalty.is_finite() {
            return bad(format!("presence_penalty {} (must be finite)", self.presence_penalty));
        }
        if !self.frequency_penalty.is_finite() {
            return bad(format!("frequency_penalty {} (must be finite)", self.frequency_penalty));
        }
        Ok(())
    }
}

impl std::fmt::Display for SamplerConfig {
    /// One line of every setting, with llama.cpp's names.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "repeat_last_n = {}, repeat_penalty = {:.3}, frequency_penalty = {:.3}, presence_penalty = {:.3}, \
             top_k = {}, top_p = {:.3}, min_p = {:.3}, temp = {:.3}, seed = {}",
            self.repeat_last_n,
            self.repetition_penalty,
            self.frequency_penalty,
            self.presence_penalty,
            self.top_k,
            self.top_p,
            self.min_p,
            self.temperature,
            self.seed
        )
    }
}

/// Sampling settings that come with a model, to be used where the user set
/// none: the `general.sampling.*` keys of its GGUF, which llama.cpp reads
/// the same way (`common_init_sampler_from_model`: each key under the
/// command line's setting, above the built-in default). `None` leaves the
/// setting to llama.cpp's default.
///
/// Values are taken as llama.cpp's command line takes them: a temperature
/// below 0 is greedy, a top-k or a min-p below 0 is off, a penalty window
/// of -1 is the context; [`SamplerConfig::validate`] still judges the
/// result.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    /// `general.sampling.temp`.
    pub temperature: Option<f32>,
    /// `general.sampling.top_k`.
    pub top_k: Option<i64>,
    /// `general.sampling.top_p`.
    pub top_p: Option<f32>,
    /// `general.sampling.min_p`.
    pub min_p: Option<f32>,
    /// `general.sampling.penalty_repeat`.
    pub repetition_penalty: Option<f32>,
    /// `general.sampling.penalty_last_n`.
    pub repeat_last_n: Option<i64>,
}

impl SamplingDefaults {
    /// No setting: llama.cpp's defaults throughout.
    pub const NONE: SamplingDefaults = SamplingDefaults {
        temperature: None,
        top_k: None,
        top_p: None,
        min_p: None,
        repetition_penalty: None,
        repeat_last_n: None,
    };

    /// The `general.sampling.*` keys of `file` that this sampler has a stage
    /// for (temp, top_k, top_p, min_p, penalty_repeat, penalty_last_n). As
    /// llama.cpp, a key is read whatever its type, a number or a string
    /// holding one; a key whose value is not a number is ignored, as are
    /// the keys of stages this sampler lacks (sequence, xtc, mirostat).
    pub fn from_gguf(file: &GgufFile) -> SamplingDefaults {
        let number = |key: &str| -> Option<f64> {
            match file.get(&format!("general.sampling.{key}"))? {
                Value::String(s) => s.trim().parse::<f64>().ok(),
                Value::Bool(_) | Value::Array(_) => None,
                v => v.as_f64().or_else(|| v.as_i128().map(|n| n as f64)),
            }
            .filter(|x| x.is_finite())
        };
        // llama.cpp parses integer keys with strtol: a fraction is cut.
        let int = |key: &str| number(key).map(|x| x.trunc().clamp(i64::MIN as f64, i64::MAX as f64) as i64);
        let float = |key: &str| number(key).map(|x| x as f32);
        SamplingDefaults {
            temperature: float("temp"),
            top_k: int("top_k"),
            top_p: float("top_p"),
            min_p: float("min_p"),
            repetition_penalty: float("penalty_repeat"),
            repeat_last_n: int("penalty_last_n"),
        }
    }

    /// These settings less those `over` sets: what `over.or(self)` takes
    /// from here.
    pub fn under(self, over: SamplingDefaults) -> SamplingDefaults {
        SamplingDefaults {
            temperature: self.temperature.filter(|_| over.temperature.is_none()),
            top_k: self.top_k.filter(|_| over.top_k.is_none()),
            top_p: self.top_p.filter(|_| over.top_p.is_none()),
            min_p: self.min_p.filter(|_| over.min_p.is_none()),
            repetition_penalty: self.repetition_penalty.filter(|_| over.repetition_penalty.is_none()),
            repeat_last_n: self.repeat_last_n.filter(|_| over.repeat_last_n.is_none()),
        }
    }

    /// These settings, each missing one taken from `fallback`.
    pub fn or(self, fallback: SamplingDefaults) -> SamplingDefaults {
        SamplingDefaults {
            temperature: self.temperature.or(fallback.temperature),
            top_k: self.top_k.or(fallback.top_k),
            top_p: self.top_p.or(fallback.top_p),
            min_p: self.min_p.or(fallback.min_p),
            repetition_penalty: self.repetition_penalty.or(fallback.repetition_penalty),
            repeat_last_n: self.repeat_last_n.or(fallback.repeat_last_n),
        }
    }

    /// Whether no setting is given.
    pub fn is_empty(&self) -> bool {
        *self == SamplingDefaults::NONE
    }

    /// `base` with the settings given here put in, read as llama.cpp reads
    /// its options: a temperature below 0 is 0 (greedy), a top-k or a
    /// min-p below 0 is 0 (off), a penalty window of -1 is the context
    /// (`n_ctx`) and any window is at most the context (a longer one would
    /// only reserve memory). Then the whole is validated.
    ///
    /// # Errors
    /// [`SamplingError::InvalidConfig`] for a penalty window below -1, and
    /// [`SamplerConfig::validate`]'s.
    pub fn apply(&self, base: SamplerConfig, n_ctx: usize) -> Result<SamplerConfig, SamplingError> {
        let mut c = base;
        if let Some(t) = self.temperature {
            // NaN stays, to be refused by `validate`.
            c.temperature = if t < 0.0 { 0.0 } else { t };
        }
        if let Some(k) = self.top_k {
            c.top_k = usize::try_from(k.max(0)).unwrap_or(usize::MAX);
        }
        if let Some(p) = self.top_p {
            c.top_p = p;
        }
        if let Some(p) = self.min_p {
            c.min_p = if p < 0.0 { 0.0 } else { p };
        }
        if let Some(r) = self.repetition_penalty {
            c.repetition_penalty = r;
        }
        c.repeat_last_n = match self.repeat_last_n {
            None => c.repeat_last_n,
            Some(-1) => n_ctx,
            Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            Some(n) => {
                return Err(SamplingError::InvalidConfig(format!(
                    "repeat_last_n {n} (must be >= 0, or -1 for the context size)"
                )))
            }
        };
        c.repeat_last_n = c.repeat_last_n.min(n_ctx);
        c.validate()?;
        Ok(c)
    }
}

impl std::fmt::Display for SamplingDefaults {
    /// The settings given, with llama.cpp's option names: `temp = 0.2,
    /// top_p = 0.9`; `none` when there is none.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(v) = self.temperature {
            parts.push(format!("temp = {v}"));
        }
        if let Some(v) = self.top_k {
            parts.push(format!("top_k = {v}"));
        }
        if let Some(v) = self.top_p {
            parts.push(format!("top_p = {v}"));
        }
        if let Some(v) = self.min_p {
            parts.push(format!("min_p = {v}"));
        }
        if let Some(v) = self.repetition_penalty {
            parts.push(format!("repeat_penalty = {v}"));
        }
        if let Some(v) = self.repeat_last_n {
            parts.push(format!("repeat_last_n = {v}"));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// How many of `probs` (sorted, most likely first) the nucleus keeps:
/// the shortest prefix whose running `f32` sum is `>= top_p`, or all of
/// them when the sum never gets there. This is llama.cpp's comparison
/// (`llama_sampler_top_p_apply`): both sides are `f32`, so a `top_p` of
/// 0.8 (the `f32` 0.800000011920929) is reached by probabilities 0.5 and
/// 0.3 (`0.5f32 + 0.3f32` rounds to that same `f32`). At least one token is
/// kept.
pub fn nucleus_len(probs: &[f32], top_p: f32) -> usize {
    nucleus_reached(probs, top_p).unwrap_or(probs.len())
}

/// Like [`nucleus_len`], but `None` when the running sum never reaches
/// `top_p`.
fn nucleus_reached(probs: &[f32], top_p: f32) -> Option<usize> {
    let mut cum = 0f32;
    for (i, &p) in probs.iter().enumerate() {
        cum += p;
        if cum >= top_p {
            return Some(i + 1);
        }
    }
    None
}

/// A candidate token; ordered so that "greater" means "more likely":
/// higher logit (`-0.0` equal to `+0.0`, as the greedy choice compares),
/// then lower id.
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
        // `x + 0.0` is `+0.0` for both zeros and `x` otherwise.
        (self.logit + 0.0).total_cmp(&(other.logit + 0.0)).then_with(|| other.id.cmp(&self.id))
    }
}

/// Draws tokens from logits (see the [module documentation](self)).
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    history: VecDeque<u32>,
    /// Scratch: the logits with the penalties applied.
    penalized: Vec<f32>,
    /// Scratch: the ids of the history, sorted.
    recent: Vec<u32>,
    /// Scratch: the heap for partial selection.
    heap: BinaryHeap<std::cmp::Reverse<Cand>>,
    /// Scratch: candidates, most likely first.
    cands: Vec<Cand>,
    /// Scratch: `exp(logit - max)` of the whole row, or the candidates'
    /// probabilities.
    weights: Vec<f32>,
    /// Scratch: the probabilities of `cands` (top-p over the whole row).
    probs: Vec<f32>,
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
            probs: Vec::new(),
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
            probs: Vec::new(),
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

    /// Forgets the token history (the penalties' window).
    pub fn reset_history(&mut self) {
        self.history.clear();
    }

    /// Whether [`Sampler::sample`] always returns the largest logit's index
    /// with these settings (temperature 0 or top-k 1, no penalties): a
    /// caller may then take the argmax where the logits are, on the device
    /// (`DeviceModel::decode_greedy`), and record it with
    /// [`Sampler::accept`].
    pub fn is_argmax(&self) -> bool {
        !self.cfg.penalties_active() && (self.cfg.temperature == 0.0 || self.cfg.top_k == 1)
    }

    /// Records a token that was not drawn by [`Sampler::sample`] (prompt
    /// tokens, forced tokens) in the penalties' window.
    pub fn accept(&mut self, id: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.cfg.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(id);
    }

    /// The tokens in the penalties' window, oldest first.
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
        self.reserve_scratch(logits.len())?;
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
        let use_penalty = self.cfg.penalties_active() && !self.history.is_empty();
        if use_penalty {
            penalized.clear();
            penalized.extend_from_slice(logits);
            self.recent.clear();
            self.recent.extend(self.history.iter().copied());
            self.recent.sort_unstable();
            let (rep, freq, pres) =
                (self.cfg.repetition_penalty, self.cfg.frequency_penalty, self.cfg.presence_penalty);
            for run in self.recent.chunk_by(|a, b| a == b) {
                if let Some(x) = penalized.get_mut(run[0] as usize) {
                    let v = if *x <= 0.0 { *x * rep } else { *x / rep };
                    *x = v - (run.len() as f32 * freq + pres);
                }
            }
        }
        let (l, best) = if use_penalty {
            (&penalized[..], infer_compute::greedy_token(&penalized).unwrap_or(0))
        } else {
            (logits, best)
        };
        let chosen = self.choose(l, best);
        self.penalized = penalized;
        let id = chosen?;
        self.accept(id);
        Ok(id)
    }

    /// How many of a row's most likely tokens [`Sampler::sample_top`] needs
    /// to draw exactly what [`Sampler::sample`] would from the whole row of
    /// `n_vocab` logits, or `None` when these settings need the whole row:
    /// 1 for the greedy choice (temperature 0 or top-k 1), `top_k` for a
    /// top-k below the vocabulary; `None` with active penalties (they
    /// change logits outside any top-k) or without a top-k (top-p and the
    /// draw then see the whole row).
    pub fn top_needed(&self, n_vocab: usize) -> Option<usize> {
        if self.cfg.penalties_active() || n_vocab == 0 {
            return None;
        }
        if self.cfg.temperature == 0.0 || self.cfg.top_k == 1 {
            return Some(1);
        }
        (self.cfg.top_k > 0 && self.cfg.top_k < n_vocab).then_some(self.cfg.top_k)
    }

    /// Draws the next token from a row's most likely tokens instead of the
    /// whole row, and records it in the history: the same token, and the
    /// same use of the random stream, as [`Sampler::sample`] on the row.
    ///
    /// `ids` and `logits` are the candidates, most likely first (by logit
    /// descending, `-0.0` equal to `+0.0`, the lower id first on a tie:
    /// `infer_compute::backend::TopK`'s order), at least
    /// [`Sampler::top_needed`] of them, or every token of the row that is
    /// not `-inf`; a caller that masks tokens leaves them out (as `-inf` in
    /// the row, they are never drawn). `first_nan` is the row's lowest NaN
    /// index ([`SamplingError::NaN`] before anything else).
    ///
    /// # Errors
    /// [`SamplingError::NaN`]; [`SamplingError::AllMasked`] when there is
    /// no candidate or the first is `-inf`; [`SamplingError::InvalidConfig`]
    /// when these settings need the whole row ([`Sampler::top_needed`] is
    /// `None`) or `ids` and `logits` differ in length.
    pub fn sample_top(&mut self, ids: &[u32], logits: &[f32], first_nan: Option<u32>) -> Result<u32, SamplingError> {
        if let Some(index) = first_nan {
            return Err(SamplingError::NaN { index: index as usize });
        }
        if ids.len() != logits.len() {
            return Err(SamplingError::InvalidConfig(format!("{} candidate ids, {} logits", ids.len(), logits.len())));
        }
        let Some(k) = self.top_needed(usize::MAX) else {
            return Err(SamplingError::InvalidConfig("these settings sample from the whole row".into()));
        };
        let (best, max) = match (ids.first(), logits.first()) {
            (Some(&id), Some(&x)) if x != f32::NEG_INFINITY => (id, x),
            _ => return Err(SamplingError::AllMasked),
        };
        let t = self.cfg.temperature;
        let id = if t == 0.0 || self.cfg.top_k == 1 || max == f32::INFINITY {
            best
        } else {
            self.reserve_scratch(k)?;
            self.cands.clear();
            self.cands.extend(
                ids.iter()
                    .zip(logits)
                    .take(k)
                    .take_while(|(_, &x)| x != f32::NEG_INFINITY)
                    .map(|(&id, &logit)| Cand { logit, id }),
            );
            self.draw_top(t, self.cfg.top_p < 1.0)
        };
        self.accept(id);
        Ok(id)
    }

    /// Reserves every scratch buffer for rows of `n` logits, fallibly, so
    /// that the draws after it never grow one (the capacity stays: this is
    /// a no-op after the first row).
    fn reserve_scratch(&mut self, n: usize) -> Result<(), SamplingError> {
        fn room<T>(v: &mut Vec<T>, n: usize) -> bool {
            v.try_reserve(n.saturating_sub(v.len())).is_ok()
        }
        let k = if self.cfg.top_k > 0 { self.cfg.top_k.min(n) } else { n };
        let window = self.cfg.repeat_last_n;
        let ok = room(&mut self.penalized, n)
            && room(&mut self.cands, n)
            && room(&mut self.weights, n)
            && room(&mut self.probs, n)
            && room(&mut self.recent, window)
            && self.heap.try_reserve(k.saturating_sub(self.heap.len())).is_ok()
            && self.history.try_reserve(window.saturating_sub(self.history.len())).is_ok();
        if ok {
            Ok(())
        } else {
            let bytes = n * (3 * size_of::<f32>() + size_of::<Cand>()) + k * size_of::<Cand>() + 8 * window;
            Err(SamplingError::OutOfMemory { logits: n, bytes })
        }
    }

    /// Runs top-k, top-p, min-p, temperature and the draw on `l` (no NaN,
    /// not empty), whose greedy choice is `best`.
    fn choose(&mut self, l: &[f32], best: u32) -> Result<u32, SamplingError> {
        let max = l[best as usize];
        if max == f32::NEG_INFINITY {
            return Err(SamplingError::AllMasked);
        }
        let t = self.cfg.temperature;
        if t == 0.0 || self.cfg.top_k == 1 || max == f32::INFINITY {
            return Ok(best);
        }
        if self.cfg.top_k > 0 && (self.cfg.top_k < l.len() || self.cfg.top_p < 1.0) {
            // A `top_k` of the vocabulary or more keeps every token, but
            // llama.cpp's top-k sorts them: the top-p after it then sums the
            // probabilities in that order, not in id order.
            self.select_top(l, self.cfg.top_k.min(l.len()));
            return Ok(self.draw_top(t, self.cfg.top_p < 1.0));
        }
        if self.cfg.top_p < 1.0 {
            self.top_p_row(l, max);
            return Ok(self.draw_top(t, false));
        }
        let floor = if self.cfg.min_p > 0.0 { max + self.cfg.min_p.ln() } else { f32::NEG_INFINITY };
        // The whole row (min-p filtered): one pass for the weights, one to
        // find the draw.
        let mut w = std::mem::take(&mut self.weights);
        w.clear();
        w.extend(l.iter().map(|&x| if x != f32::NEG_INFINITY && x >= floor { ((x - max) / t).exp() } else { 0.0 }));
        let total: f64 = w.iter().map(|&v| v as f64).sum();
        let u = self.rng.gen::<f64>() * total;
        let mut acc = 0.0;
        let mut chosen = None;
        for (i, &v) in w.iter().enumerate() {
            acc += v as f64;
            if v > 0.0 && acc >= u {
                chosen = Some(i as u32);
                break;
            }
        }
        // Rounding left `u` past the end: the last token with a nonzero
        // weight.
        let id = chosen.or_else(|| w.iter().rposition(|&v| v > 0.0).map(|i| i as u32)).unwrap_or(best);
        self.weights = w;
        Ok(id)
    }

    /// The stages after top-k on `cands` (sorted, not empty): top-p when
    /// `top_p` (else it was applied already or is off), min-p, temperature
    /// `t` and the draw.
    fn draw_top(&mut self, t: f32, top_p: bool) -> u32 {
        if top_p {
            self.top_p_sorted();
        }
        if self.cfg.min_p > 0.0 {
            let floor = self.cands[0].logit + self.cfg.min_p.ln();
            let keep = 1 + self.cands[1..].iter().take_while(|c| c.logit >= floor).count();
            self.cands.truncate(keep);
        }
        self.draw_sorted(t)
    }

    /// Top-p on `cands` (sorted): their softmax in `f32`, then the nucleus.
    fn top_p_sorted(&mut self) {
        let m = self.cands[0].logit;
        self.weights.clear();
        self.weights.extend(self.cands.iter().map(|c| (c.logit - m).exp()));
        let sum: f32 = self.weights.iter().sum();
        for p in &mut self.weights {
            *p /= sum;
        }
        let keep = nucleus_len(&self.weights, self.cfg.top_p);
        self.cands.truncate(keep);
    }

    /// Top-p over the whole row `l` (largest logit `max`), leaving the
    /// nucleus in `cands`, sorted. The probabilities are llama.cpp's: the
    /// `f32` weights `exp(l - max)` over their `f32` sum in id order. Tokens
    /// are bucketed by logit (1/16 nat per bucket, from the largest down);
    /// only the first buckets that hold the nucleus, plus a margin for the
    /// `f32` sums, are sorted, and the whole row when the margin was short.
    fn top_p_row(&mut self, l: &[f32], max: f32) {
        const BUCKETS: usize = 1024;
        const PER_NAT: f32 = 16.0;
        let bucket = |x: f32| {
            let d = (max - x) * PER_NAT;
            if d < (BUCKETS - 1) as f32 {
                d as usize
            } else {
                BUCKETS - 1
            }
        };
        let top_p = self.cfg.top_p;
        let mut w = std::mem::take(&mut self.weights);
        w.clear();
        w.extend(l.iter().map(|&x| (x - max).exp()));
        let total32: f32 = w.iter().sum();
        let mut mass = [0f64; BUCKETS];
        let mut total = 0f64;
        for (&x, &v) in l.iter().zip(&w) {
            if v > 0.0 {
                mass[bucket(x)] += v as f64;
                total += v as f64;
            }
        }
        let target = (top_p as f64 + 1e-3).min(1.0) * total;
        let mut last = BUCKETS - 1;
        let mut cum = 0.0;
        for (b, &m) in mass.iter().enumerate() {
            cum += m;
            if cum >= target {
                last = b;
                break;
            }
        }
        let mut probs = std::mem::take(&mut self.probs);
        loop {
            self.cands.clear();
            for (i, (&x, &v)) in l.iter().zip(&w).enumerate() {
                if v > 0.0 && bucket(x) <= last {
                    self.cands.push(Cand { logit: x, id: i as u32 });
                }
            }
            self.cands.sort_unstable_by(|a, b| b.cmp(a));
            probs.clear();
            probs.extend(self.cands.iter().map(|c| w[c.id as usize] / total32));
            match nucleus_reached(&probs, top_p) {
                Some(keep) => {
                    self.cands.truncate(keep);
                    break;
                }
                None if last < BUCKETS - 1 => last = BUCKETS - 1,
                // The f32 sum never reaches top_p: llama.cpp keeps every
                // token (those of probability 0 cannot be drawn).
                None => break,
            }
        }
        self.weights = w;
        self.probs = probs;
    }

    /// Fills `cands` with the `k` most likely tokens that are not `-inf`,
    /// most likely first.
    fn select_top(&mut self, l: &[f32], k: usize) {
        use std::cmp::Reverse;
        let keep = |x: f32| x != f32::NEG_INFINITY;
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

    /// Temperature `t` and the draw from `cands` (sorted, not empty).
    fn draw_sorted(&mut self, t: f32) -> u32 {
        let m = self.cands[0].logit;
        let weight = |c: &Cand| ((c.logit - m) / t).exp();
        let total: f64 = self.cands.iter().map(|c| weight(c) as f64).sum();
        let u = self.rng.gen::<f64>() * total;
        let mut acc = 0.0;
        for c in &self.cands {
            let v = weight(c);
            acc += v as f64;
            if v > 0.0 && acc >= u {
                return c.id;
            }
        }
        // Rounding left `u` past the end: the least likely candidate with a
        // nonzero weight (the first one always has weight 1).
        self.cands.iter().rev().find(|c| weight(c) > 0.0).map_or(self.cands[0].id, |c| c.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_compute::backend::TopK;
    use rand::rngs::StdRng;

    /// A row of `n` logits from a few values (many ties), with zeros of
    /// both signs and `-inf`s.
    fn tied_row(r: &mut StdRng, n: usize) -> Vec<f32> {
        let palette = [-0.0, 0.0, 1.5, 1.5, 2.25, -3.0, 0.75, f32::NEG_INFINITY, 4.0];
        (0..n)
            .map(|_| if r.gen_bool(0.5) { palette[r.gen_range(0..palette.len())] } else { r.gen_range(-6.0f32..6.0) })
            .collect()
    }

    /// Candidates of `row` for `s` as the engine asks for them: `top_needed
    /// + masked.len()` of the row, the masked ids left out.
    fn candidates(s: &Sampler, row: &[f32], masked: &[u32]) -> Option<(Vec<u32>, Vec<f32>, Option<u32>)> {
        let k = s.top_needed(row.len())? + masked.len();
        let mut t = TopK::new();
        t.fill_from_logits(row, row.len(), k.min(infer_compute::backend::TOP_K_MAX)).unwrap();
        let r = t.row(0);
        let keep: Vec<usize> = (0..r.ids.len()).filter(|&j| !masked.contains(&r.ids[j])).collect();
        Some((keep.iter().map(|&j| r.ids[j]).collect(), keep.iter().map(|&j| r.logits[j]).collect(), r.stats.first_nan))
    }

    /// `sample_top` on the candidates gives `sample`'s token on the whole
    /// (masked) row, and leaves the random stream where `sample` leaves it:
    /// many seeds, settings and rows, 6 draws per pair.
    #[test]
    fn sampling_from_candidates_equals_sampling_the_row() {
        let mut r = StdRng::seed_from_u64(7);
        let mut compared = 0;
        for case in 0..600 {
            let n = [5, 17, 64, 300, 2000][case % 5];
            let cfg = SamplerConfig {
                temperature: [0.0, 0.8, 1.0, 0.3, 2.0][r.gen_range(0..5)],
                top_k: [1, 2, 3, 10, 40][r.gen_range(0..5)].min(n - 1),
                top_p: [1.0, 0.95, 0.5, 0.9][r.gen_range(0..4)],
                min_p: [0.0, 0.05, 0.3][r.gen_range(0..3)],
                seed: r.gen(),
                ..SamplerConfig::default()
            };
            let masked: Vec<u32> = if case % 3 == 0 { vec![0, (n / 2) as u32] } else { Vec::new() };
            let mut full = Sampler::new(cfg.clone()).unwrap();
            let mut top = full.clone();
            for _ in 0..6 {
                let mut row = if case % 2 == 0 {
                    tied_row(&mut r, n)
                } else {
                    (0..n).map(|_| r.gen_range(-8.0f32..8.0)).collect()
                };
                if case % 7 == 0 {
                    row[n - 1] = f32::INFINITY;
                }
                let (ids, logits, nan) = candidates(&top, &row, &masked).expect("a top-k config");
                let mut masked_row = row.clone();
                for &m in &masked {
                    masked_row[m as usize] = f32::NEG_INFINITY;
                }
                let want = full.sample(&masked_row);
                let got = top.sample_top(&ids, &logits, nan);
                assert_eq!(got, want, "case {case} {cfg:?} row {row:?}");
                compared += 1;
            }
            // Same random stream afterwards.
            assert_eq!(full.rng.gen::<u64>(), top.rng.gen::<u64>(), "case {case}");
            assert_eq!(full.history().collect::<Vec<_>>(), top.history().collect::<Vec<_>>());
        }
        assert_eq!(compared, 3600);
    }

    #[test]
    fn top_needed_names_the_settings_candidates_serve() {
        let s = |cfg: SamplerConfig| Sampler::new(cfg).unwrap();
        assert_eq!(s(SamplerConfig::default()).top_needed(1000), Some(40));
        assert_eq!(s(SamplerConfig::greedy()).top_needed(1000), Some(1));
        assert_eq!(s(SamplerConfig { top_k: 1, ..SamplerConfig::default() }).top_needed(1000), Some(1));
        // No top-k, or one of the whole vocabulary: the whole row.
        assert_eq!(s(SamplerConfig::with_temperature(0.7, 1)).top_needed(1000), None);
        assert_eq!(s(SamplerConfig::default()).top_needed(40), None);
        // Penalties change logits outside the top-k.
        assert_eq!(s(SamplerConfig { repetition_penalty: 1.1, ..SamplerConfig::default() }).top_needed(1000), None);
        assert_eq!(s(SamplerConfig { repetition_penalty: 1.1, ..SamplerConfig::greedy() }).top_needed(1000), None);
    }

    #[test]
    fn sample_top_errors_as_sample() {
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert_eq!(s.sample_top(&[3, 1], &[2.0, 1.0], Some(5)), Err(SamplingError::NaN { index: 5 }));
        assert_eq!(s.sample_top(&[], &[], None), Err(SamplingError::AllMasked));
        assert_eq!(s.sample_top(&[2, 1], &[f32::NEG_INFINITY; 2], None), Err(SamplingError::AllMasked));
        assert!(matches!(s.sample_top(&[2, 1], &[1.0], None), Err(SamplingError::InvalidConfig(_))));
        let mut whole = Sampler::new(SamplerConfig::with_temperature(1.0, 3)).unwrap();
        assert!(matches!(whole.sample_top(&[2], &[1.0], None), Err(SamplingError::InvalidConfig(_))));
        // A NaN row reports the same index through both paths.
        let row = [1.0, f32::NAN, 3.0, f32::NAN];
        let mut t = TopK::new();
        t.fill_from_logits(&row, 4, 2).unwrap();
        let want = s.clone().sample(&row);
        assert_eq!(s.sample_top(t.row(0).ids, t.row(0).logits, t.row(0).stats.first_nan), want);
        // +inf is certain; the greedy choice takes the lowest id of the max,
        // -0.0 tying with +0.0.
        let mut g = Sampler::greedy();
        let row = [-0.0, 0.0, f32::NEG_INFINITY];
        t.fill_from_logits(&row, 3, 1).unwrap();
        assert_eq!(g.sample_top(t.row(0).ids, t.row(0).logits, None), Ok(0));
        assert_eq!(g.sample(&row), Ok(0));
    }
}
