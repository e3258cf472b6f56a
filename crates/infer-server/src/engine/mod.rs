//! The engine: one OS thread that owns the [`DeviceModel`] and one
//! [`KvPool`] of `parallel` slots, and runs continuous batching over them.
//! The HTTP side talks to it only through channels: a request goes in with
//! [`EngineHandle::submit`], its [`Event`]s come back on the request's own
//! channel. The async runtime never waits on the model.
//!
//! Each [`Engine::step`]:
//! 1. drops requests whose client went away (their receiver is gone), so
//!    their slots are free within one step;
//! 2. admits waiting requests into free slots, each into the free slot
//!    whose cache shares the longest exact token prefix with its prompt
//!    ([`crate::slots`]), the slot cut back to that prefix;
//! 3. builds one [`Batch`]: the next token of every decoding sequence, then
//!    chunks of prompts still to compute, up to `n_batch` tokens in all
//!    (chunked prefill: a long prompt takes several steps, and the others'
//!    decoding goes on beside it);
//! 4. runs one [`DeviceModel::forward`] and hands each output row to its
//!    sequence (`Active::on_logits`), which samples, passes the text
//!    through its stop strings and sends the events; when the backend
//!    selects on the device ([`DeviceModel::top_k_on_device`]) and every
//!    row's sampler draws from a top-k (or is greedy: no penalties, a
//!    `top_k` up to [`TOP_K_MAX`](infer_compute::backend::TOP_K_MAX)), the step is a
//!    [`DeviceModel::forward_top_k`] instead and each sequence samples from
//!    its row's candidates (`Active::on_top`), the same tokens;
//! 5. frees the slots of finished requests, keeping their caches.

mod active;
mod logprobs;
pub mod request;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use infer_compute::backend::TopK;
use infer_compute::{Batch, DeviceModel, KvPool, Out};
use infer_model::sampling::Sampler;
use infer_model::sequence::Sequence;
use infer_model::tokenizer::Tokenizer;
use rayon::prelude::*;

use crate::metrics::{add, add_time, set, Metrics};
use crate::slots::SlotCache;
use active::{Active, Admitted};
pub use request::{Event, FinishReason, GenParams, GenRequest, TokenLogprob, Usage};

/// Why [`EngineHandle::submit`] refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// As many requests as the queue holds are waiting (HTTP 503).
    QueueFull,
    /// The engine thread has ended.
    Stopped,
}

/// The HTTP side's end of the engine: cheap to clone, `Send + Sync`.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    tx: Sender<GenRequest>,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Queues `req` unless `max_queue` requests are waiting for a slot
    /// already.
    ///
    /// # Errors
    /// [`SubmitError::QueueFull`]; [`SubmitError::Stopped`] when the engine
    /// has ended.
    pub fn submit(&self, req: GenRequest) -> Result<(), SubmitError> {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            add(&self.metrics.rejected, 1);
            return Err(SubmitError::QueueFull);
        }
        if self.tx.send(req).is_err() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        add(&self.metrics.requests, 1);
        Ok(())
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }
}

/// Starts the engine thread over `model` and `pool` (see the module docs);
/// it ends once every [`EngineHandle`] is dropped and its requests are
/// done.
///
/// # Errors
/// The thread could not be started.
pub fn spawn(
    model: Box<dyn DeviceModel>,
    pool: Box<dyn KvPool>,
    tokenizer: Arc<Tokenizer>,
    n_batch: usize,
    max_queue: usize,
    metrics: Arc<Metrics>,
) -> std::io::Result<(EngineHandle, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let handle = EngineHandle { tx, queued: queued.clone(), max_queue, metrics: metrics.clone() };
    let thread = std::thread::Builder::new().name("infer-engine".into()).spawn(move || {
        let mut engine = Engine::new(model, pool, &tokenizer, n_batch, metrics, queued);
        run(&mut engine, &rx);
    })?;
    Ok((handle, thread))
}

/// The engine thread's loop: waits while idle, takes every new request,
/// steps.
fn run(engine: &mut Engine<'_>, rx: &Receiver<GenRequest>) {
    loop {
        if engine.is_idle() {
            match rx.recv() {
                Ok(r) => engine.enqueue(r),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(r) => engine.enqueue(r),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if engine.is_idle() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        // A bug in a step must not end the engine (and with it every
        // request to come): the requests of that step fail, the rest go on.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.step())).is_err() {
            engine.recover();
        }
    }
}

/// Rows of a step from which sampling, detokenizing and stop strings run
/// on the thread pool rather than on the engine's thread.
const PAR_MIN_ROWS: usize = 4;

/// One token range of a step's batch: `active[index]`'s tokens
/// `start..start + len` of the batch, and whether its last one's logits
/// come back.
#[derive(Clone, Copy, Debug)]
struct Planned {
    index: usize,
    start: usize,
    len: usize,
    wants: bool,
}

/// The scheduler state (see the module docs); [`spawn`] runs one on its
/// own thread, tests step one directly.
pub struct Engine<'t> {
    model: Box<dyn DeviceModel>,
    pool: Box<dyn KvPool>,
    tokenizer: &'t Tokenizer,
    n_vocab: usize,
    n_batch: usize,
    slots: SlotCache,
    waiting: VecDeque<GenRequest>,
    active: Vec<Active<'t>>,
    batch: Batch,
    planned: Vec<Planned>,
    /// Whether steps whose rows all sample from a top-k run
    /// [`DeviceModel::forward_top_k`].
    use_top_k: bool,
    /// The candidates of such a step.
    top: TopK,

    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
}

impl<'t> Engine<'t> {
    /// An engine over `model` and its `pool`, steps of at most `n_batch`
    /// tokens (at least the pool's slot count). `queued` counts the
    /// requests submitted and not yet admitted (shared with the
    /// [`EngineHandle`]).
    pub fn new(
        model: Box<dyn DeviceModel>,
        pool: Box<dyn KvPool>,
        tokenizer: &'t Tokenizer,
        n_batch: usize,
        metrics: Arc<Metrics>,
        queued: Arc<AtomicUsize>,
    ) -> Engine<'t> {
        let n_slots = pool.n_slots();
        set(&metrics.slots_total, n_slots);
        Engine {
            n_vocab: model.n_vocab(),
            use_top_k: model.top_k_on_device(),
            model,
            pool,
            tokenizer,
            n_batch: n_batch.max(n_slots).max(1),
            slots: SlotCache::new(n_slots),
            waiting: VecDeque::new(),
            active: Vec::new(),
            batch: Batch::new(),
            planned: Vec::new(),
            top: TopK::new(),
            metrics,
            queued,
        }
    }

    /// Adds a request to the waiting queue (it counts in `queued` until
    /// admitted or dropped).
    pub fn enqueue(&mut self, req: GenRequest) {
        self.waiting.push_back(req);
    }

    /// Whether nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.active.is_empty() && self.waiting.is_empty()
    }

    /// Requests generating.
    pub fn n_active(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting for a slot.
    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The slots and what their caches hold.
    pub fn slots(&self) -> &SlotCache {
        &self.slots
    }

    /// The batch of the last step.
    pub fn last_batch(&self) -> &Batch {
        &self.batch
    }

    /// Whether steps whose every row samples from a top-k read back only
    /// the candidates ([`DeviceModel::forward_top_k`]); by default when the
    /// backend selects on the device. The tokens are the same either way.
    pub fn set_top_k(&mut self, on: bool) {
        self.use_top_k = on;
    }

    /// One step (see the module docs); returns whether a forward ran.
    pub fn step(&mut self) -> bool {
        let t0 = Instant::now();
        self.drop_cancelled();
        self.admit();
        // Before the forward, so that a client that has its first token
        // sees its slot counted.
        self.publish();
        let ran = self.plan() && self.run_batch();
        self.publish();
        add_time(&self.metrics.engine_busy_us, t0.elapsed());
        ran
    }

    /// Frees the slots of requests whose client went away, and forgets
    /// waiting ones.
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|r| !r.events.is_closed());
        let gone = before - self.waiting.len();
        self.unqueue(gone);
        add(&self.metrics.cancelled, gone);
        add(&self.metrics.finished, gone);
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].is_cancelled() {
                let a = self.active.swap_remove(i);
                self.slots.release(a.slot);
                add(&self.metrics.cancelled, 1);
                add(&self.metrics.finished, 1);
            } else {
                i += 1;
            }
        }
    }

    fn unqueue(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::SeqCst);
    }

    /// Admits waiting requests, oldest first, while slots are free.
    fn admit(&mut self) {
        while self.slots.has_free() {
            let Some(req) = self.waiting.pop_front() else { break };
            self.unqueue(1);
            match self.admit_one(req) {
                Ok(a) => self.active.push(a),
                Err(()) => add(&self.metrics.finished, 1),
            }
        }
    }

    /// Takes a slot for `req` and sets up its sequence; a request that
    /// cannot run gets an [`Event::Error`].
    fn admit_one(&mut self, req: GenRequest) -> Result<Active<'t>, ()> {
        let n_ctx = self.pool.n_ctx();
        let fail = |m: String| {
            let _ = req.events.send(Event::Error(m));
        };
        if req.prompt.is_empty() || req.prompt.len() > n_ctx {
            fail(format!("the prompt has {} tokens; a slot holds 1 to {n_ctx}", req.prompt.len()));
            return Err(());
        }
        let sampler = Sampler::new(req.params.sampler.clone()).map_err(|e| fail(e.to_string()))?;
        let Some(taken) = self.slots.take(&req.prompt) else { return Err(()) };
        if let Err(e) = self.pool.truncate(taken.slot, taken.reused) {
            self.slots.discard(taken.slot);
            fail(e.to_string());
            return Err(());
        }
        // The sampler's penalty window sees the prompt tokens to compute
        // (`Sequence::new` records them).
        let seq = Sequence::new(self.tokenizer, &req.prompt, taken.reused, sampler, req.params.max_tokens, n_ctx);
        let seq = match seq {
            Ok(s) => s,
            Err(e) => {
                self.slots.release(taken.slot);
                fail(e.to_string());
                return Err(());
            }
        };
        add(&self.metrics.prompt_tokens, req.prompt.len() - taken.reused);
        add(&self.metrics.cached_tokens, taken.reused);
        Ok(Active::new(Admitted {
            slot: taken.slot,
            seq,
            prompt_len: req.prompt.len(),
            reused: taken.reused,
            stop: req.params.stop,
            ignore_eos: req.params.ignore_eos,
            logprobs: req.params.logprobs,
            events: req.events,
            arrived: req.arrived,
        }))
    }

    /// Fills the batch: decode tokens first, then prompt chunks up to the
    /// budget. Returns whether it holds any token.
    fn plan(&mut self) -> bool {
        self.batch.clear();
        self.planned.clear();
        let mut budget = self.n_batch;
        for prompt_pass in [false, true] {
            for (index, a) in self.active.iter().enumerate() {
                if a.seq.in_prompt() != prompt_pass || budget == 0 {
                    continue;
                }
                let pos = a.seq.position();
                let input = a.seq.next_input(if prompt_pass { budget } else { 1 });
                if input.is_empty() {
                    continue;
                }
                let wants = !prompt_pass || pos + input.len() == a.prompt_len;
                let start = self.batch.len();
                self.batch.push_seq(a.slot, pos, input, if wants { Out::Last } else { Out::None });
                self.planned.push(Planned { index, start, len: input.len(), wants });
                budget -= input.len();
            }
        }
        !self.batch.is_empty()
    }

    /// Runs the planned batch and hands out its rows; returns `true`.
    fn run_batch(&mut self) -> bool {
        add(&self.metrics.steps, 1);
        self.metrics.batch_tokens.observe(self.batch.len() as f64);
        let n_vocab = self.n_vocab;
        let top_k = if self.use_top_k { self.top_needed() } else { None };
        let t0 = Instant::now();
        let ran = match top_k {
            Some(k) => self.model.forward_top_k(self.pool.as_mut(), &self.batch, k, &mut self.top).map(|()| None),
            None => self.model.forward(self.pool.as_mut(), &self.batch).map(Some),
        };
        let t1 = Instant::now();
        add_time(&self.metrics.step_forward_us, t1 - t0);
        let logits = match ran {
            Ok(l) => l,
            Err(e) => {
                self.fail_batch(&e.to_string());
                return true;
            }
        };
        // Bookkeeping in batch order, then each sequence's row (sampling,
        // detokenizing, stop strings, events) in parallel: every request
        // has its own sampler and random stream, so the results do not
        // depend on the threads.
        let mut row_of: Vec<Option<usize>> = vec![None; self.active.len()];
        let mut row = 0;
        for p in &self.planned {
            let a = &mut self.active[p.index];
            self.slots.extend(a.slot, &self.batch.tokens()[p.start..p.start + p.len]);
            a.seq.advance(p.len);
            if p.wants {
                row_of[p.index] = Some(row);
                row += 1;
            }
        }
        let (tokenizer, metrics, top) = (self.tokenizer, &self.metrics, &self.top);
        let one = |(i, a): (usize, &mut Active)| {
            let r = row_of[i]?;
            let done = match logits {
                Some(l) => a.on_logits(&l[r * n_vocab..(r + 1) * n_vocab], tokenizer, metrics),
                None => a.on_top(top.row(r), tokenizer, metrics),
            };
            done.then_some(i)
        };
        // Few rows run on this thread: handing them to the pool costs a
        // wake-up of its threads per step, about what a row's work is.
        let done: Vec<usize> = if row >= PAR_MIN_ROWS {
            self.active.par_iter_mut().enumerate().filter_map(&one).collect()
        } else {
            self.active.iter_mut().enumerate().filter_map(&one).collect()
        };
        self.remove(done, false);
        add_time(&self.metrics.step_rows_us, t1.elapsed());
        true
    }

    /// The candidates per row the planned step needs when every row that
    /// gets logits can sample from its top-k ([`Active::top_needed`]);
    /// `None` when one needs its whole row, or no row gets logits.
    fn top_needed(&self) -> Option<usize> {
        let mut k = 0;
        for p in self.planned.iter().filter(|p| p.wants) {
            k = k.max(self.active[p.index].top_needed(self.n_vocab, self.tokenizer)?);
        }
        (k > 0).then_some(k)
    }

    /// A failed step: every request in it gets the error and its slot's
    /// cache is forgotten.
    fn fail_batch(&mut self, message: &str) {
        let mut hit: Vec<usize> = self.planned.iter().map(|p| p.index).collect();
        for &i in &hit {
            self.active[i].fail(format!("the model step failed: {message}"));
            let slot = self.active[i].slot;
            let _ = self.pool.reset(slot);
        }
        hit.sort_unstable();
        hit.dedup();
        self.remove(hit, true);
    }

    /// Removes the requests at `indices` (ascending), freeing their slots
    /// (forgetting their caches when `discard`).
    fn remove(&mut self, mut indices: Vec<usize>, discard: bool) {
        indices.sort_unstable();
        for &i in indices.iter().rev() {
            let a = self.active.swap_remove(i);
            if discard {
                self.slots.discard(a.slot);
            } else {
                self.slots.release(a.slot);
            }
            add(&self.metrics.finished, 1);
        }
    }

    /// After a step panicked: every admitted request fails and every slot's
    /// cache is forgotten (what the step wrote is unknown); waiting
    /// requests stay queued.
    pub fn recover(&mut self) {
        for a in self.active.drain(..) {
            a.fail("internal error in the engine's step".into());
            add(&self.metrics.finished, 1);
        }
        for slot in 0..self.slots.n_slots() {
            self.slots.discard(slot);
            let _ = self.pool.reset(slot);
        }
        self.publish();
    }

    fn publish(&self) {
        set(&self.metrics.queue_len, self.queued.load(Ordering::SeqCst));
        set(&self.metrics.slots_busy, self.slots.n_busy());
    }
}

#[cfg(test)]
mod tests;
