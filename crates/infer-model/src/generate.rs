//! The generation loop: prefill the prompt, then decode and sample one token
//! at a time, streaming text as it is produced.

use std::time::{Duration, Instant};

use infer_compute::{DeviceModel, KvCache};

use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Timings and counts of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub prefill_time: Duration,
    pub generated_tokens: usize,
    pub decode_time: Duration,
    /// Why generation ended.
    pub stop: StopReason,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    /// The requested number of tokens was produced.
    #[default]
    MaxTokens,
    /// An end-of-generation token (EOS, `<end_of_turn>`) was sampled.
    EndOfGeneration,
    /// The KV cache is full.
    ContextFull,
    /// The caller's text callback asked to stop.
    Stopped,
}

impl GenerationStats {
    /// Prompt tokens per second of the prefill.
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Generated tokens per second of the decode (the first token comes from
    /// the prefill's logits, so it is not counted here).
    pub fn decode_tps(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Generates up to `max_tokens` tokens after `prompt_ids` with a fresh KV
/// cache of `n_ctx` positions, calling `on_text` with each piece of text as
/// soon as it forms whole characters; `on_text` returns `false` to stop.
/// `max_tokens = usize::MAX` generates until an end-of-generation token or
/// a full context.
///
/// # Errors
/// [`Error::Compute`] with [`infer_compute::Error::ContextOverflow`] when the
/// prompt does not fit in `n_ctx`; an empty prompt; model and sampling errors.
pub fn generate(
    model: &mut dyn DeviceModel,
    tokenizer: &Tokenizer,
    prompt_ids: &[u32],
    max_tokens: usize,
    n_ctx: usize,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    let all = prompt_ids.len().max(1);
    generate_with_progress(model, tokenizer, prompt_ids, max_tokens, n_ctx, sampler, all, |_, _| true, on_text)
}

/// [`generate`] with the prompt prefilled in passes of at most
/// `prefill_chunk` tokens (each continuing the KV cache at its position),
/// calling `on_prefill(done, total)` after each pass; `on_prefill` returns
/// `false` to stop before the next pass (then nothing is generated and the
/// stop reason is [`StopReason::Stopped`]; `prompt_tokens` counts the
/// tokens prefilled).
///
/// # Errors
/// As [`generate`]; a `prefill_chunk` of 0.
#[allow(clippy::too_many_arguments)]
pub fn generate_with_progress(
    model: &mut dyn DeviceModel,
    tokenizer: &Tokenizer,
    prompt_ids: &[u32],
    max_tokens: usize,
    n_ctx: usize,
    sampler: &mut Sampler,
    prefill_chunk: usize,
    mut on_prefill: impl FnMut(usize, usize) -> bool,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    if prompt_ids.is_empty() {
        return Err(Error::Tokenizer("the prompt is empty".into()));
    }
    if prefill_chunk == 0 {
        return Err(Error::Tokenizer("the prefill pass size is 0".into()));
    }
    if prompt_ids.len() > n_ctx {
        return Err(infer_compute::Error::ContextOverflow { pos: 0, n_tokens: prompt_ids.len(), n_ctx }.into());
    }
    let mut kv: Box<dyn KvCache> = model.new_kv_cache(n_ctx)?;
    let mut stats = GenerationStats { prompt_tokens: 0, ..Default::default() };
    for &t in prompt_ids {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let n_passes = prompt_ids.len().div_ceil(prefill_chunk);
    let mut logits: &[f32] = &[];
    for (i, pass) in prompt_ids.chunks(prefill_chunk).enumerate() {
        logits = model.prefill(kv.as_mut(), pass, stats.prompt_tokens)?;
        stats.prompt_tokens += pass.len();
        if !on_prefill(stats.prompt_tokens, prompt_ids.len()) && i + 1 < n_passes {
            stats.prefill_time = t0.elapsed();
            stats.stop = StopReason::Stopped;
            return Ok(stats);
        }
    }
    stats.prefill_time = t0.elapsed();
    if max_tokens == 0 {
        return Ok(stats);
    }
    let mut next = sampler.sample(logits)?;
    let mut decoder = tokenizer.decoder(true);
    let mut pos = prompt_ids.len();
    let t1 = Instant::now();
    loop {
        if tokenizer.is_eog(next) {
            stats.stop = StopReason::EndOfGeneration;
            break;
        }
        // `sample` already recorded `next` in the sampler's history.
        stats.generated_tokens += 1;
        if !on_text(&decoder.push(next)) {
            stats.stop = StopReason::Stopped;
            break;
        }
        if stats.generated_tokens >= max_tokens {
            stats.stop = StopReason::MaxTokens;
            break;
        }
        if pos >= n_ctx {
            stats.stop = StopReason::ContextFull;
            break;
        }
        next = sampler.sample(model.decode_token(kv.as_mut(), next, pos)?)?;
        pos += 1;
    }
    stats.decode_time = t1.elapsed();
    if stats.stop != StopReason::Stopped {
        on_text(&decoder.finish());
    }
    Ok(stats)
}
