//! The sampling options of `infer run`: llama.cpp's sampler chain with its
//! names and defaults (see [`infer_model::sampling`] for what each stage
//! does, in this order: penalties, top-k, top-p, min-p, temperature, draw).

use clap::Args;
use infer_model::gguf::GgufFile;
use infer_model::sampling::{SamplerConfig, SamplingDefaults};

use crate::common::CliResult;

/// Sampling options, named and defaulted as llama.cpp's `llama-cli`. A
/// setting not given is the model's when its GGUF has one (the
/// `general.sampling.*` keys, read by
/// [`SamplingDefaults::from_gguf`]), else llama.cpp's default.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature, applied after the filters; 0 (or below, as llama.cpp) is greedy (the most likely token,
    /// deterministic) [default: 0.8, or the model's].
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temp: Option<f32>,
    /// Keep the K most likely tokens (0 or below: off, as llama.cpp) [default: 40, or the model's].
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    pub top_k: Option<i64>,
    /// Keep the most likely tokens whose probabilities sum to P, compared in f32 as llama.cpp does (1 or more:
    /// off; 0 or below: the most likely token alone) [default: 0.95, or the model's].
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than P × the most likely one (0 or below: off; 1 or more: all but the most likely)
    /// [default: 0.05, or the model's].
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Divide the positive (multiply the negative) logits of the recent tokens by X (1: off) [default: 1, or
    /// the model's].
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// How many recent tokens (prompt and output) the penalties look at (0: off, -1 or more than the
    /// context: the context size) [default: 64, or the model's].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub repeat_last_n: Option<i64>,
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
    /// The sampler settings for a context of `n_ctx` positions: each
    /// setting as given, else the model's (`general.sampling.*` of `gguf`,
    /// [`SamplingDefaults::from_gguf`]), else llama.cpp's default; a random
    /// seed when none (or -1) was given. Also the model's settings it used
    /// (those not given here), for the `sampling:` line.
    ///
    /// # Errors
    /// A setting out of its range (also when greedy decoding ignores it),
    /// a seed below -1, `--repeat-last-n` below -1 (naming the model's
    /// metadata when the value came from there).
    pub fn config(&self, n_ctx: usize, gguf: &GgufFile) -> CliResult<(SamplerConfig, SamplingDefaults)> {
        let seed = match self.seed {
            None | Some(-1) => u64::from(rand::random::<u32>()),
            Some(s) if s >= 0 => s as u64,
            Some(s) => return Err(format!("--seed {s}: must be a number >= 0, or -1 for a random seed").into()),
        };
        if let Some(n) = self.repeat_last_n.filter(|&n| n < -1) {
            return Err(format!("--repeat-last-n {n}: must be >= 0, or -1 for the context size").into());
        }
        // As llama.cpp's samplers: top-p of 1 or more is off, 0 or below
        // keeps the most likely token alone (the smallest positive value
        // does the same here); min-p above 1 keeps only the most likely
        // token (and its ties), as 1 does.
        let top_p = self.top_p.map(|p| {
            if p >= 1.0 {
                1.0
            } else if p <= 0.0 {
                f32::MIN_POSITIVE
            } else {
                p
            }
        });
        let min_p = self.min_p.map(|p| if p > 1.0 { 1.0 } else { p });
        let given = SamplingDefaults {
            temperature: self.temp,
            top_k: self.top_k,
            top_p,
            min_p,
            repetition_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
        };
        let base = SamplerConfig {
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            ..SamplerConfig::default()
        };
        let model = SamplingDefaults::from_gguf(gguf);
        let used = model.under(given);
        // A bad value that came from the model (the command line's are
        // checked above or named by the sampler) says so.
        let cfg = given.or(model).apply(base, n_ctx).map_err(|e| {
            if used.is_empty() {
                e.to_string()
            } else {
                format!("{e} (the model sets {used})")
            }
        })?;
        Ok((cfg, used))
    }
}

/// What a `sampling:` line adds for the model's settings in use (`used`,
/// from [`SamplingArgs::config`]): `"; the model's temp = 0.2, top_p =
/// 0.9"`, or nothing.
pub fn model_settings_note(used: &SamplingDefaults) -> String {
    if used.is_empty() {
        String::new()
    } else {
        format!("; the model's {used}")
    }
}
