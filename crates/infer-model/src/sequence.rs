//! One sequence of generation as a state machine ([`Sequence`]): which
//! tokens to feed next and at which position ([`Sequence::next_input`]),
//! and what a step's logits (or its greedy token) mean: the next token, its
//! text, whether generation stops ([`Sequence::on_logits`],
//! [`Sequence::on_token`]). It owns the sampler, the streaming decoder and
//! the stop rules, and no model: a driver runs the steps.
//! [`crate::generate`] drives one sequence against a one-slot cache; a
//! scheduler drives many, one KV pool slot each, through one
//! [`infer_compute::DeviceModel::forward`] per step.

use crate::generate::StopReason;
use crate::sampling::Sampler;
use crate::tokenizer::{Decoder, Tokenizer};
use crate::Result;

/// What one sampled token did to its sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// The token sampled.
    pub token: u32,
    /// Its text, as far as it forms whole characters (empty for an
    /// end-of-generation token).
    pub text: String,
    /// Why the sequence ends with this token, if it does.
    pub stop: Option<StopReason>,
}

/// A sequence being generated (see the module docs). Positions `0..fed`
/// of its tokens are in its KV cache; the prompt is fed first (in chunks
/// of the driver's choosing), then each sampled token.
pub struct Sequence<'t> {
    tokenizer: &'t Tokenizer,
    decoder: Decoder<'t>,
    sampler: Sampler,
    /// The prompt, then the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    fed: usize,
    max_tokens: usize,
    generated: usize,
    n_ctx: usize,
    stop: Option<StopReason>,
    /// Context shift: the tokens kept at the start when the context is full
    /// (`None`: a full context ends the sequence).
    shift_keep: Option<usize>,
}

impl<'t> Sequence<'t> {
    /// A sequence over `prompt` whose first `cached` tokens its cache holds
    /// already (reused from an earlier turn); the rest is to be fed. The
    /// sampler records the new prompt tokens (its penalties see them).
    /// `max_tokens` bounds the generated tokens (`usize::MAX`: until an
    /// end-of-generation token or a full context of `n_ctx` positions).
    ///
    /// # Errors
    /// [`crate::Error::Tokenizer`] for an empty prompt, or one that leaves
    /// no position to feed (`cached >= prompt.len()`: the last token must be
    /// fed, its logits are needed).
    pub fn new(
        tokenizer: &'t Tokenizer,
        prompt: &[u32],
        cached: usize,
        mut sampler: Sampler,
        max_tokens: usize,
        n_ctx: usize,
    ) -> Result<Self> {
        if prompt.is_empty() {
            return Err(crate::Error::Tokenizer("the prompt is empty".into()));
        }
        if cached >= prompt.len() {
            return Err(crate::Error::Tokenizer(format!(
                "{cached} cached tokens leave none of the {}-token prompt to feed",
                prompt.len()
            )));
        }
        for &t in &prompt[cached..] {
            sampler.accept(t);
        }
        Ok(Sequence {
            tokenizer,
            decoder: tokenizer.decoder(true),
            sampler,
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            fed: cached,
            max_tokens,
            generated: 0,
            n_ctx,
            stop: None,
            shift_keep: None,
        })
    }

    /// Shifts the context when it is full instead of stopping, as
    /// llama.cpp's context shift: the first `n_keep` tokens stay (its
    /// `--keep`, the whole prompt at most) and the oldest half of the rest
    /// is dropped ([`Sequence::shift`]).
    pub fn with_context_shift(mut self, n_keep: usize) -> Self {
        self.shift_keep = Some(n_keep.min(self.prompt_len));
        self
    }

    /// Whether the next token, fed at [`Sequence::position`], needs a
    /// context shift first: shifting is on, the sequence is decoding and
    /// that position is the last of the context (llama.cpp shifts when
    /// `n_past + 1 >= n_ctx`), and there is something to drop.
    pub fn needs_shift(&self) -> bool {
        self.shift_keep.is_some_and(|keep| {
            self.stop.is_none()
                && !self.in_prompt()
                && self.fed + 1 >= self.n_ctx
                && (self.fed - keep.min(self.fed)) / 2 > 0
        })
    }

    /// The context shift: drops `n_discard = (position - n_keep) / 2` tokens
    /// after the first `n_keep` (llama.cpp's `n_left / 2`), moving the
    /// position back by as many. Returns `n_keep`: the cache must then hold
    /// the first `n_keep` tokens, and [`Sequence::tokens_from`]`(n_keep)`
    /// are to be fed again (the kept tail and the next token), after which
    /// [`Sequence::advance`]`(1)`.
    pub fn shift(&mut self) -> usize {
        let keep = self.shift_keep.unwrap_or(0).min(self.fed);
        let discard = (self.fed - keep) / 2;
        self.tokens.drain(keep..keep + discard);
        self.fed -= discard;
        self.prompt_len = self.prompt_len.min(self.fed);
        keep
    }

    /// The tokens from position `start` to the next one to feed, inclusive.
    pub fn tokens_from(&self, start: usize) -> &[u32] {
        &self.tokens[start.min(self.tokens.len())..]
    }

    /// The position of the next token to feed (tokens in the cache).
    pub fn position(&self) -> usize {
        self.fed
    }

    /// Up to `max` tokens to feed next, from [`Sequence::position`]: the
    /// rest of the prompt, or the last sampled token; nothing once the
    /// sequence has stopped.
    pub fn next_input(&self, max: usize) -> &[u32] {
        if self.stop.is_some() {
            return &[];
        }
        let end = self.tokens.len().min(self.fed.saturating_add(max));
        &self.tokens[self.fed..end]
    }

    /// Records that the first `n` tokens of [`Sequence::next_input`] ran.
    pub fn advance(&mut self, n: usize) {
        self.fed = (self.fed + n).min(self.tokens.len());
    }

    /// Whether prompt tokens remain to be fed (their logits are not
    /// sampled).
    pub fn in_prompt(&self) -> bool {
        self.fed < self.prompt_len
    }

    /// Why the sequence stopped, once it has.
    pub fn stop(&self) -> Option<StopReason> {
        self.stop
    }

    /// Stops the sequence (a caller's decision, e.g. a stop string or a
    /// disconnected client).
    pub fn set_stopped(&mut self, why: StopReason) {
        self.stop.get_or_insert(why);
    }

    /// Whether the next token is the plain argmax, so that a driver can
    /// ask the backend for the greedy token instead of the logits.
    pub fn is_greedy(&self) -> bool {
        self.sampler.is_argmax()
    }

    /// Samples the next token from the logits of the last fed token.
    ///
    /// # Errors
    /// Sampling errors (NaN logits).
    pub fn on_logits(&mut self, logits: &[f32]) -> Result<Emitted> {
        let id = self.sampler.sample(logits)?;
        Ok(self.emit(id))
    }

    /// [`Sequence::on_logits`] from the row's most likely tokens
    /// ([`Sampler::sample_top`]: `ids` and `logits` best first, at least
    /// [`Sampler::top_needed`] of them; `first_nan` the row's first NaN).
    ///
    /// # Errors
    /// Sampling errors (a NaN in the row, settings that need the whole row).
    pub fn on_top(&mut self, ids: &[u32], logits: &[f32], first_nan: Option<u32>) -> Result<Emitted> {
        let id = self.sampler.sample_top(ids, logits, first_nan)?;
        Ok(self.emit(id))
    }

    /// The sampler, with the history of this sequence.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Takes `id` as the next token (the backend's greedy token, when
    /// [`Sequence::is_greedy`]).
    pub fn on_token(&mut self, id: u32) -> Emitted {
        self.sampler.accept(id);
        self.emit(id)
    }

    /// The rest of the text held back by the decoder (an incomplete
    /// character at the end).
    pub fn finish_text(&mut self) -> String {
        self.decoder.finish()
    }

    /// The most tokens it generates.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Generated tokens so far (an end-of-generation token is not counted).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// The sampler, with the history of this sequence.
    pub fn into_sampler(self) -> Sampler {
        self.sampler
    }

    fn emit(&mut self, id: u32) -> Emitted {
        if self.tokenizer.is_eog(id) {
            self.stop = Some(StopReason::EndOfGeneration);
            return Emitted { token: id, text: String::new(), stop: self.stop };
        }
        self.generated += 1;
        let text = self.decoder.push(id);
        self.tokens.push(id);
        if self.generated >= self.max_tokens {
            self.stop = Some(StopReason::MaxTokens);
        } else if self.fed >= self.n_ctx {
            self.stop = Some(StopReason::ContextFull);
        }
        Emitted { token: id, text, stop: self.stop }
    }
}
