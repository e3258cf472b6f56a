//! One admitted request ([`Active`]): its slot, its [`Sequence`] (which
//! samples), its stop strings, and what a row of logits (or the row's most
//! likely tokens, [`TopKRow`]) does to it (sample, release text through the
//! [`StopMatcher`], send the events, say whether it is done).

use std::sync::Arc;
use std::time::Instant;

use infer_compute::backend::{TopKRow, TOP_K_MAX};
use infer_model::generate::StopReason;
use infer_model::sequence::{Emitted, Sequence};
use infer_model::stop::StopMatcher;
use infer_model::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::logprobs::{candidates_logprob, token_logprob};
use super::request::{Event, FinishReason, TokenLogprob, Usage};
use crate::metrics::{add, Metrics};

/// An admitted request (see the module docs).
pub struct Active<'t> {
    /// Its KV pool slot.
    pub slot: usize,
    /// The generation state, with the request's sampler.
    pub seq: Sequence<'t>,
    /// Tokens of the prompt.
    pub prompt_len: usize,
    /// Prompt tokens reused from the slot's cache.
    pub reused: usize,
    stop: StopMatcher,
    ignore_eos: bool,
    logprobs: Option<usize>,
    events: UnboundedSender<Event>,
    arrived: Instant,
    started: bool,
    /// The masked row when end-of-generation tokens are ignored.
    scratch: Vec<f32>,
    /// The candidates left when end-of-generation tokens are ignored.
    kept_ids: Vec<u32>,
    kept_logits: Vec<f32>,
}

/// The parts of a request [`Active::new`] takes over.
pub struct Admitted<'t> {
    pub slot: usize,
    pub seq: Sequence<'t>,
    pub prompt_len: usize,
    pub reused: usize,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub logprobs: Option<usize>,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
}

impl<'t> Active<'t> {
    /// A request admitted into its slot.
    pub fn new(a: Admitted<'t>) -> Active<'t> {
        Active {
            slot: a.slot,
            seq: a.seq,
            prompt_len: a.prompt_len,
            reused: a.reused,
            stop: StopMatcher::new(a.stop),
            ignore_eos: a.ignore_eos,
            logprobs: a.logprobs,
            events: a.events,
            arrived: a.arrived,
            started: false,
            scratch: Vec::new(),
            kept_ids: Vec::new(),
            kept_logits: Vec::new(),
        }
    }

    /// How many of its row's most likely tokens the next token needs
    /// ([`Active::on_top`]), or `None` for the whole row
    /// ([`Active::on_logits`]): the sampler's count
    /// ([`Sampler::top_needed`]), plus the end-of-generation ids when they
    /// are masked (they are dropped from the candidates), at least the
    /// `top_logprobs` asked for; the whole row for log-probabilities under
    /// the mask (their normalizer leaves the masked tokens out) or past
    /// [`TOP_K_MAX`].
    pub fn top_needed(&self, n_vocab: usize, tokenizer: &Tokenizer) -> Option<usize> {
        let mut k = self.seq.sampler().top_needed(n_vocab)?;
        if self.ignore_eos {
            if self.logprobs.is_some() {
                return None;
            }
            k += tokenizer.eog_ids().len();
        }
        if let Some(n) = self.logprobs {
            k = k.max(n);
        }
        (k <= TOP_K_MAX).then_some(k)
    }

    /// Whether the client went away (its receiver is dropped).
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed()
    }

    /// Sends a failure; the request is over.
    pub fn fail(&self, message: String) {
        let _ = self.events.send(Event::Error(message));
    }

    /// Takes the logits of the sequence's last fed token: samples, sends
    /// the text released and returns whether the request is over (its
    /// [`Event::Done`] or [`Event::Error`] sent).
    pub fn on_logits(&mut self, row: &[f32], tokenizer: &Tokenizer, m: &Arc<Metrics>) -> bool {
        let mut scratch = std::mem::take(&mut self.scratch);
        let row = if self.ignore_eos {
            scratch.clear();
            scratch.extend_from_slice(row);
            for &id in tokenizer.eog_ids() {
                if let Some(x) = scratch.get_mut(id as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
            &scratch[..]
        } else {
            row
        };
        let sampled = self.seq.on_logits(row);
        let logprobs = self.logprobs;
        let done = self.on_sampled(sampled, m, |t| logprobs.map(|n| token_logprob(tokenizer, row, t, n)));
        self.scratch = scratch;
        done
    }

    /// [`Active::on_logits`] from the row's most likely tokens, at least
    /// [`Active::top_needed`] of them: the same token, text and
    /// log-probabilities (the normalizer from the row's statistics). One
    /// difference: a NaN logit fails the request even at a masked
    /// end-of-generation id, which the whole row's mask would hide (a NaN
    /// means the step went wrong).
    pub fn on_top(&mut self, row: TopKRow<'_>, tokenizer: &Tokenizer, m: &Arc<Metrics>) -> bool {
        let nan = row.stats.first_nan;
        let sampled = if self.ignore_eos {
            let (mut ids, mut logits) = (std::mem::take(&mut self.kept_ids), std::mem::take(&mut self.kept_logits));
            ids.clear();
            logits.clear();
            let eog = tokenizer.eog_ids();
            for (&id, &x) in row.ids.iter().zip(row.logits).filter(|(id, _)| !eog.contains(id)) {
                ids.push(id);
                logits.push(x);
            }
            let sampled = self.seq.on_top(&ids, &logits, nan);
            (self.kept_ids, self.kept_logits) = (ids, logits);
            sampled
        } else {
            self.seq.on_top(row.ids, row.logits, nan)
        };
        let logprobs = self.logprobs;
        self.on_sampled(sampled, m, |t| logprobs.map(|n| candidates_logprob(tokenizer, &row, t, n)))
    }

    /// What a sampled token does (see [`Active::on_logits`]); `logprob`
    /// gives its log-probabilities when asked for.
    fn on_sampled(
        &mut self,
        sampled: infer_model::Result<Emitted>,
        m: &Arc<Metrics>,
        logprob: impl FnOnce(u32) -> Option<TokenLogprob>,
    ) -> bool {
        let e = match sampled {
            Ok(e) => e,
            Err(err) => {
                self.fail(format!("sampling failed: {err}"));
                return true;
            }
        };
        if !self.started {
            self.started = true;
            m.observe_ttft(self.arrived.elapsed());
        }
        if e.stop == Some(StopReason::EndOfGeneration) {
            return self.finish(FinishReason::Stop, false);
        }
        add(&m.generated_tokens, 1);
        let logprobs = logprob(e.token).into_iter().collect();
        let released = self.stop.push(&e.text);
        self.send_delta(released.text, logprobs);
        if released.stopped {
            self.seq.set_stopped(StopReason::Stopped);
            return self.finish(FinishReason::Stop, true);
        }
        match e.stop {
            Some(_) => self.finish(FinishReason::Length, false),
            None => false,
        }
    }

    /// Sends what is left (unless a stop string ended the reply) and
    /// [`Event::Done`]; returns `true`.
    fn finish(&mut self, finish: FinishReason, stopped: bool) -> bool {
        if !stopped {
            let tail = self.seq.finish_text();
            let mut text = self.stop.push(&tail).text;
            if !self.stop.is_stopped() {
                text.push_str(&self.stop.finish());
            }
            self.send_delta(text, Vec::new());
        }
        let finish = if self.stop.is_stopped() { FinishReason::Stop } else { finish };
        let usage = Usage {
            prompt_tokens: self.prompt_len,
            cached_tokens: self.reused,
            completion_tokens: self.seq.generated(),
        };
        let _ = self.events.send(Event::Done { finish, usage });
        true
    }

    fn send_delta(&self, text: String, logprobs: Vec<TokenLogprob>) {
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = self.events.send(Event::Delta { text, logprobs });
        }
    }
}
