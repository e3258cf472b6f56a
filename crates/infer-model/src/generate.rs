//! The generation loop: prefill the prompt, then decode and sample one token
//! at a time, streaming text as it is produced; one driver over a
//! [`Sequence`] (which holds the sampler, the decoder and the stop rules).

use std::time::{Duration, Instant};

use infer_compute::{DeviceModel, KvPool, KvTypes};

use crate::sampling::Sampler;
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Timings and counts of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    /// Prompt tokens prefilled (those the cache did not hold already).
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the cache ([`generate_cached`]).
    pub reused_tokens: usize,
    pub prefill_time: Duration,
    pub generated_tokens: usize,
    pub decode_time: Duration,
    /// Context shifts during the generation ([`CachedContext::set_context_shift`]); a full context without
    /// room to shift still ends it.
    pub context_shifts: usize,
    /// Tokens fed again after the shifts (the kept tail of the context).
    pub shift_tokens: usize,
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
    /// The KV cache is full (and context shift is off, or left nothing to
    /// drop).
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

/// A KV cache together with the tokens it holds (positions `0..len`), so
/// that a conversation can be continued turn after turn prefilling only
/// what is new.
pub struct CachedContext {
    kv: Box<dyn KvPool>,
    tokens: Vec<u32>,
    /// Context shift: the tokens kept at the start of a full context.
    shift_keep: Option<usize>,
}

impl CachedContext {
    /// An empty context of `n_ctx` positions for `model`.
    ///
    /// # Errors
    /// The model's cache allocation errors (e.g. out of memory).
    pub fn new(model: &dyn DeviceModel, n_ctx: usize) -> Result<CachedContext> {
        Self::with_types(model, n_ctx, model.default_kv_types())
    }

    /// An empty context of `n_ctx` positions for `model`, its keys and
    /// values stored as `types` say.
    ///
    /// # Errors
    /// The model's cache allocation errors (out of memory, a type the
    /// backend does not store).
    pub fn with_types(model: &dyn DeviceModel, n_ctx: usize, types: KvTypes) -> Result<CachedContext> {
        Ok(CachedContext { kv: model.new_kv_cache_typed(n_ctx, types)?, tokens: Vec::new(), shift_keep: None })
    }

    /// Turns context shift on (`Some(n_keep)`) or off: a generation that
    /// fills the context keeps its first `n_keep` tokens (at most the
    /// prompt's), drops the oldest half of the rest and goes on, as
    /// llama.cpp's context shift with `--keep n_keep`. The cache is rebuilt
    /// by feeding the kept tail again, so it works the same on a cache of
    /// any type.
    pub fn set_context_shift(&mut self, n_keep: Option<usize>) {
        self.shift_keep = n_keep;
    }

    /// The tokens in the cache, in position order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Forgets everything (the next turn prefills from position 0).
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Keeps the longest prefix of the cache that `ids` starts with (the
    /// start that the next turn shares, such as a conversation's system
    /// prompt), dropping the rest; returns the positions kept.
    pub fn keep_common_prefix(&mut self, ids: &[u32]) -> usize {
        let common = self.tokens.iter().zip(ids).take_while(|(a, b)| a == b).count();
        self.truncate(common);
        common
    }

    /// Keeps the first `len` positions (slot 0 of the one-slot pool).
    fn truncate(&mut self, len: usize) {
        // The pool has one slot: slot 0 is always in range.
        let _ = self.kv.truncate(0, len);
        self.tokens.truncate(len);
    }

    /// Keeps the longest prefix of the cache that `ids` starts with, always
    /// leaving at least the last token of `ids` to be fed (its logits are
    /// needed); returns the number of positions kept.
    fn keep_prefix_of(&mut self, ids: &[u32]) -> usize {
        let common = self.tokens.iter().zip(ids).take_while(|(a, b)| a == b).count();
        let keep = common.min(ids.len().saturating_sub(1));
        self.truncate(keep);
        keep
    }
}

/// As [`generate`], continuing `ctx`: `ids` is the whole token sequence
/// (e.g. the conversation rendered with its chat template); the part the
/// cache already holds is reused and only the rest is prefilled
/// ([`GenerationStats::reused_tokens`] and `prompt_tokens` say how much of
/// each). A cache that diverges from `ids` is cut back to the common prefix.
/// Afterwards `ctx` holds `ids` and the generated tokens that were fed back
/// (all but the last sampled one).
///
/// # Errors
/// As [`generate`]; the context is left consistent (what it holds is what
/// its token list says).
pub fn generate_cached(
    model: &mut dyn DeviceModel,
    ctx: &mut CachedContext,
    tokenizer: &Tokenizer,
    ids: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    let all = ids.len().max(1);
    generate_cached_with_progress(model, ctx, tokenizer, ids, max_tokens, sampler, all, |_, _| true, on_text)
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
    on_prefill: impl FnMut(usize, usize) -> bool,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    if prompt_ids.is_empty() {
        return Err(Error::Tokenizer("the prompt is empty".into()));
    }
    if prompt_ids.len() > n_ctx {
        return Err(infer_compute::Error::ContextOverflow { pos: 0, n_tokens: prompt_ids.len(), n_ctx }.into());
    }
    let mut ctx = CachedContext::new(model, n_ctx)?;
    generate_cached_with_progress(
        model,
        &mut ctx,
        tokenizer,
        prompt_ids,
        max_tokens,
        sampler,
        prefill_chunk,
        on_prefill,
        on_text,
    )
}

/// [`generate_cached`] with the new tokens prefilled in passes, as
/// [`generate_with_progress`].
///
/// # Errors
/// As [`generate_with_progress`].
#[allow(clippy::too_many_arguments)]
pub fn generate_cached_with_progress(
    model: &mut dyn DeviceModel,
    ctx: &mut CachedContext,
    tokenizer: &Tokenizer,
    ids: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    prefill_chunk: usize,
    mut on_prefill: impl FnMut(usize, usize) -> bool,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    if ids.is_empty() {
        return Err(Error::Tokenizer("the prompt is empty".into()));
    }
    if prefill_chunk == 0 {
        return Err(Error::Tokenizer("the prefill pass size is 0".into()));
    }
    let n_ctx = ctx.n_ctx();
    if ids.len() > n_ctx {
        return Err(infer_compute::Error::ContextOverflow { pos: 0, n_tokens: ids.len(), n_ctx }.into());
    }
    let reused = ctx.keep_prefix_of(ids);
    let mut seq = Sequence::new(tokenizer, ids, reused, sampler.clone(), max_tokens, n_ctx)?;
    if let Some(keep) = ctx.shift_keep {
        seq = seq.with_context_shift(keep);
    }
    let stats = drive(model, ctx, &mut seq, prefill_chunk, &mut on_prefill, &mut on_text);
    // The sampler's history goes on with the caller (the next chat turn),
    // also after an error.
    *sampler = seq.into_sampler();
    stats
}

/// A context shift of `seq` (see [`Sequence::shift`]): the cache cut to
/// the kept start, the kept tail and the next token fed again in passes of
/// `prefill_chunk`; returns what the sampler drew from the last logits.
fn shift_context(
    model: &mut dyn DeviceModel,
    ctx: &mut CachedContext,
    seq: &mut Sequence<'_>,
    prefill_chunk: usize,
    stats: &mut GenerationStats,
) -> Result<crate::sequence::Emitted> {
    let keep = seq.shift();
    ctx.truncate(keep);
    let refill = seq.tokens_from(keep).to_vec();
    let mut logits: &[f32] = &[];
    for (i, pass) in refill.chunks(prefill_chunk).enumerate() {
        logits = model.prefill(ctx.kv.as_mut(), pass, keep + i * prefill_chunk)?;
        ctx.tokens.extend_from_slice(pass);
    }
    seq.advance(1);
    stats.context_shifts += 1;
    stats.shift_tokens += refill.len();
    seq.on_logits(logits)
}

/// Runs `seq` to its end against `ctx`: its prompt in passes of
/// `prefill_chunk` tokens, then one token per step (the backend's greedy
/// token when the sampler is a plain argmax: on a GPU a few bytes come
/// back instead of the vocabulary's logits).
fn drive(
    model: &mut dyn DeviceModel,
    ctx: &mut CachedContext,
    seq: &mut Sequence<'_>,
    prefill_chunk: usize,
    on_prefill: &mut dyn FnMut(usize, usize) -> bool,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<GenerationStats> {
    let reused = seq.position();
    let total = seq.next_input(usize::MAX).len();
    let mut stats = GenerationStats { prompt_tokens: 0, reused_tokens: reused, ..Default::default() };
    let t0 = Instant::now();
    let mut logits: &[f32] = &[];
    while seq.in_prompt() {
        let pos = seq.position();
        let pass = seq.next_input(prefill_chunk);
        let n = pass.len();
        logits = model.prefill(ctx.kv.as_mut(), pass, pos)?;
        // `ctx.tokens` follows the KV cache.
        ctx.tokens.extend_from_slice(pass);
        seq.advance(n);
        stats.prompt_tokens += n;
        if !on_prefill(stats.prompt_tokens, total) && seq.in_prompt() {
            stats.prefill_time = t0.elapsed();
            stats.stop = StopReason::Stopped;
            return Ok(stats);
        }
    }
    stats.prefill_time = t0.elapsed();
    if seq.max_tokens() == 0 {
        return Ok(stats);
    }
    let mut e = seq.on_logits(logits)?;
    let t1 = Instant::now();
    loop {
        if e.stop == Some(StopReason::EndOfGeneration) {
            stats.stop = StopReason::EndOfGeneration;
            break;
        }
        stats.generated_tokens += 1;
        if !on_text(&e.text) {
            stats.stop = StopReason::Stopped;
            break;
        }
        if let Some(why) = e.stop {
            stats.stop = why;
            break;
        }
        if seq.needs_shift() {
            e = shift_context(model, ctx, seq, prefill_chunk, &mut stats)?;
            continue;
        }
        // A token is recorded in `ctx.tokens` once its step has run, even
        // if the draw after it fails.
        let pos = seq.position();
        e = if seq.is_greedy() {
            let id = model.decode_greedy(ctx.kv.as_mut(), e.token, pos)?;
            ctx.tokens.push(e.token);
            seq.advance(1);
            seq.on_token(id)
        } else {
            let logits = model.decode_token(ctx.kv.as_mut(), e.token, pos)?;
            ctx.tokens.push(e.token);
            seq.advance(1);
            seq.on_logits(logits)?
        };
    }
    stats.decode_time = t1.elapsed();
    if stats.stop != StopReason::Stopped {
        on_text(&seq.finish_text());
    }
    Ok(stats)
}
