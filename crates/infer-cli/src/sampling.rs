//! The sampling options of `infer run`: llama.cpp's sampler chain with its
//! names and defaults (see [`infer_model::sampling`] for what each stage
//! does, in this order: penalties, top-k, top-p, min-p, temperature, draw).

use clap::Args;
use infer_model::sampling::SamplerConfig;

use crate::common::CliResult;

/// Sampling options, named and defaulted as llama.cpp's `llama-cli`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature, applied after the filters; 0 (or below, as llama.cpp) is greedy (the most likely token,
    /// deterministic).
    #[arg(long, value_name = "T", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 or below: off, as llama.cpp).
    #[arg(long, value_name = "K", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i64,
    /// Keep the most likely tokens whose probabilities sum to P, compared in f32 as llama.cpp does (1: off).
    #[arg(long, value_name = "P", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P × the most likely one (0 or below: off).
    #[arg(long, value_name = "P", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Divide the positive (multiply the negative) logits of the recent tokens by X (1: off).
    #[arg(long, value_name = "X", default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt and output) the penalties look at (0: off, -1 or more than the
    /// context: the context size).
    #[arg(long, value_name = "N", default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// Subtract X once from the logit of every recent token (0: off).
    #[arg(long, value_name = "X", default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtract X per occurrence from the logit of every recent token (0: off).
    #[arg(long, value_name = "X", default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Seed of the draw (default, or -1: a random seed, printed on the `sampling:` line).
    #[arg(short = 's', long, value_name = "N", allow_negative_numbers = true)]
    pub seed: Option<i64>,
}

impl SamplingArgs {
    /// The sampler settings for a context of `n_ctx` positions; a random
    /// seed when none (or -1) was given.
    ///
    /// # Errors
    /// A setting out of its range (also when greedy decoding ignores it),
    /// a seed below -1, `--repeat-last-n` below -1.
    pub fn config(&self, n_ctx: usize) -> CliResult<SamplerConfig> {
        let seed = match self.seed {
            None | Some(-1) => u64::from(rand::random::<u32>()),
            Some(s) if s >= 0 => s as u64,
            Some(s) => return Err(format!("--seed {s}: must be a number >= 0, or -1 for a random seed").into()),
        };
        // The window never holds more than the context: a larger one is the
        // context (and would only reserve memory).
        let repeat_last_n = match self.repeat_last_n {
            -1 => n_ctx,
            n if n >= 0 => (n as u64).min(n_ctx as u64) as usize,
            n => return Err(format!("--repeat-last-n {n}: must be >= 0, or -1 for the context size").into()),
        };
        // llama.cpp's readings of negative values: a temperature below 0 is
        // greedy, a top-k or a min-p below 0 is off. NaN stays, to be refused
        // by `validate`.
        let temperature = if self.temp < 0.0 { 0.0 } else { self.temp };
        let top_k = usize::try_from(self.top_k.max(0)).unwrap_or(usize::MAX);
        let min_p = if self.min_p < 0.0 { 0.0 } else { self.min_p };
        let cfg = SamplerConfig {
            temperature,
            top_k,
            top_p: self.top_p,
            min_p,
            repetition_penalty: self.repeat_penalty,
            repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}
