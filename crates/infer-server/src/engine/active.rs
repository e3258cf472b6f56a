//! One admitted request ([`Active`]): its slot, its [`Sequence`], its stop
//! strings, and what a row of logits does to it (sample, release text
//! through the [`StopMatcher`], send the events, say whether it is done).

use std::sync::Arc;
use std::time::Instant;

use infer_model::generate::StopReason;
use infer_model::sequence::Sequence;
use infer_model::stop::StopMatcher;
use infer_model::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::logprobs::token_logprob;
use super::request::{Event, FinishReason, Usage};
use crate::metrics::{add, Metrics};

/// An admitted request (see the module docs).
pub struct Active<'t> {
    /// Its KV pool slot.
    pub slot: usize,
    /// The generation state.
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
        }
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
        let done = self.on_row(row, tokenizer, &mut scratch, m);
        self.scratch = scratch;
        done
    }

    /// [`Active::on_logits`] with the scratch for the masked row.
    fn on_row(&mut self, row: &[f32], tokenizer: &Tokenizer, scratch: &mut Vec<f32>, m: &Arc<Metrics>) -> bool {
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
        let e = match self.seq.on_logits(row) {
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
        let logprobs = self.logprobs.map(|n| token_logprob(tokenizer, row, e.token, n)).into_iter().collect();
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

    fn send_delta(&self, text: String, logprobs: Vec<super::request::TokenLogprob>) {
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = self.events.send(Event::Delta { text, logprobs });
        }
    }
}
