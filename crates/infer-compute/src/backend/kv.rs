//! The KV pool every backend owns ([`KvPool`]: `n_slots` sequences of up
//! to `n_ctx` positions each), the bookkeeping of one slot ([`KvState`]),
//! and the checks of a forward step ([`KvState::check_step`] per span,
//! [`check_batch`] for a whole [`Batch`]) that every backend runs before
//! touching device memory, so that the rules (no gaps, no overflow, no
//! foreign pool, slots and ids in range) cannot drift between backends.
//!
//! The pool follows llama.cpp's unified KV cache (`src/llama-kv-cache.h`:
//! one cache for `n_seq_max` sequences, `seq_rm`, `seq_cp`) with a fixed
//! region of `n_ctx` positions per slot, so a slot's positions are
//! contiguous and attention reads them as one array.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use super::batch::{Batch, Span};
use crate::error::{Error, Result};
use crate::kv_type::KvTypes;

/// A backend's KV cache of `n_slots` sequences of up to `n_ctx` positions
/// each, one allocation per layer (`[n_slots][n_ctx][n_head_kv][head_dim]`
/// values of the pool's [`KvTypes`]). Opaque to callers except for its
/// bookkeeping; created by [`super::DeviceModel::new_kv_pool`]. A pool of one
/// slot is the cache of one sequence ([`super::DeviceModel::new_kv_cache`]).
pub trait KvPool: Send {
    /// One [`KvState`] per slot.
    fn states(&self) -> &[KvState];
    /// For the owning backend: record steps (see [`KvState::advance`]).
    fn states_mut(&mut self) -> &mut [KvState];
    /// For the owning backend to recover its concrete type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// For [`KvPool::copy_prefix`], which checked the arguments: copies
    /// the keys and values of positions `0..n` of slot `from` into slot
    /// `to` (`from != to`, both in range, `n` at most `from`'s fill).
    ///
    /// # Errors
    /// Device errors.
    fn copy_positions(&mut self, from: usize, to: usize, n: usize) -> Result<()>;

    /// The element types of its keys and values.
    fn types(&self) -> KvTypes;
    /// Bytes one position of one slot takes, keys and values of every
    /// layer (see [`KvTypes::bytes_per_token`]).
    fn bytes_per_token(&self) -> u64;

    /// Sequences the pool holds.
    fn n_slots(&self) -> usize {
        self.states().len()
    }
    /// Capacity of each slot in positions.
    fn n_ctx(&self) -> usize {
        self.states().first().map_or(0, KvState::n_ctx)
    }
    /// Positions filled in `slot`.
    ///
    /// # Errors
    /// [`Error::SlotOutOfRange`].
    fn seq_len(&self, slot: usize) -> Result<usize> {
        Ok(slot_state(self.states(), slot)?.len())
    }
    /// Forgets every position of `slot` from `len` on, so that its next
    /// step may start at `len` (a chat turn that diverges from what the
    /// cache holds). No-op when `len` is not below the fill.
    ///
    /// # Errors
    /// [`Error::SlotOutOfRange`].
    fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        let n_slots = self.n_slots();
        self.states_mut().get_mut(slot).ok_or(Error::SlotOutOfRange { slot, n_slots })?.truncate(len);
        Ok(())
    }
    /// Empties `slot` (a finished request frees it for the next).
    ///
    /// # Errors
    /// [`Error::SlotOutOfRange`].
    fn reset(&mut self, slot: usize) -> Result<()> {
        self.truncate(slot, 0)
    }
    /// Makes slot `to` hold a copy of the first `n` positions of slot
    /// `from` (a shared prompt prefix computed once, llama.cpp's
    /// `seq_cp`); `to`'s fill becomes `n`, `from` is unchanged.
    ///
    /// # Errors
    /// [`Error::SlotOutOfRange`]; [`Error::PositionGap`] when `from`
    /// holds fewer than `n` positions; [`Error::Shape`] when `from == to`.
    fn copy_prefix(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        let states = self.states();
        let len = slot_state(states, from)?.len();
        slot_state(states, to)?;
        if from == to {
            return Err(crate::error::shape_err("copy_prefix", format!("slot {from} copied onto itself")));
        }
        if n > len {
            return Err(Error::PositionGap { pos: n, len });
        }
        self.copy_positions(from, to, n)?;
        let s = &mut self.states_mut()[to];
        s.truncate(0);
        s.advance(0, n);
        Ok(())
    }
}

/// `states[slot]`, or [`Error::SlotOutOfRange`].
fn slot_state(states: &[KvState], slot: usize) -> Result<&KvState> {
    states.get(slot).ok_or(Error::SlotOutOfRange { slot, n_slots: states.len() })
}

/// Identifies one prepared model, so that a KV cache is only ever used with
/// the model that created it (its layer count and shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelId(u64);

impl ModelId {
    /// A process-wide unique id.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ModelId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Owner, capacity and fill of one slot of a KV pool. Backends keep one per
/// slot and return them from [`KvPool::states`].
///
/// Positions `0..len` hold keys and values of the sequence so far; a step at
/// position `pos ≤ len` overwrites from `pos` on and makes `pos + n_tokens`
/// the new length (positions past it are discarded, as after
/// [`KvPool::truncate`]).
#[derive(Clone, Debug)]
pub struct KvState {
    model: ModelId,
    n_ctx: usize,
    len: usize,
}

impl KvState {
    /// An empty cache of `n_ctx` positions for `model`.
    ///
    /// # Errors
    /// [`Error::EmptyKvCache`] when `n_ctx == 0`.
    pub fn new(model: ModelId, n_ctx: usize) -> Result<Self> {
        if n_ctx == 0 {
            return Err(Error::EmptyKvCache);
        }
        Ok(KvState { model, n_ctx, len: 0 })
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks a forward step of `tokens` at positions `pos..pos + tokens.len()`
    /// by `model`, whose vocabulary has `n_vocab` entries.
    ///
    /// # Errors
    /// [`Error::ForeignKvCache`] when another model made the cache;
    /// [`Error::EmptyBatch`] for no tokens; [`Error::PositionGap`] when `pos`
    /// is past the filled positions; [`Error::ContextOverflow`] when the step
    /// does not fit; [`Error::TokenOutOfRange`] for an id outside the
    /// vocabulary.
    pub fn check_step(&self, model: ModelId, n_vocab: usize, tokens: &[u32], pos: usize) -> Result<()> {
        if self.model != model {
            return Err(Error::ForeignKvCache);
        }
        let n = tokens.len();
        if n == 0 {
            return Err(Error::EmptyBatch);
        }
        if pos > self.len {
            return Err(Error::PositionGap { pos, len: self.len });
        }
        if pos.checked_add(n).is_none_or(|end| end > self.n_ctx) {
            return Err(Error::ContextOverflow { pos, n_tokens: n, n_ctx: self.n_ctx });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::TokenOutOfRange { token, n_vocab });
        }
        Ok(())
    }

    /// Records a finished step of `n_tokens` at `pos` (checked by
    /// [`KvState::check_step`]): the cache now holds `pos + n_tokens`
    /// positions, capped at the capacity.
    pub fn advance(&mut self, pos: usize, n_tokens: usize) {
        self.len = pos.saturating_add(n_tokens).min(self.n_ctx);
    }

    /// Keeps only the first `len` positions (no-op when `len` is not
    /// smaller than the fill).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Checks a forward step of `batch` by `model` (vocabulary of `n_vocab`)
/// against the pool's slots and returns its spans: every span by
/// [`KvState::check_step`] against its slot, before anything runs, so a
/// failed step changes no slot.
///
/// # Errors
/// [`Error::EmptyBatch`]; [`Error::ForeignKvCache`] when another model made
/// the pool; otherwise [`Error::InBatch`] with the index of the first
/// offending token, wrapping [`Error::SlotOutOfRange`],
/// [`Error::SlotRepeated`] (a slot in two spans of one batch), or an error
/// of [`KvState::check_step`].
pub fn check_batch(states: &[KvState], model: ModelId, n_vocab: usize, batch: &Batch) -> Result<Vec<Span>> {
    if batch.is_empty() {
        return Err(Error::EmptyBatch);
    }
    if states.first().is_some_and(|s| s.model != model) {
        return Err(Error::ForeignKvCache);
    }
    let in_batch = |index: usize, e: Error| Error::InBatch { index, source: Box::new(e) };
    let tokens = batch.tokens();
    if let Some(i) = tokens.iter().position(|&t| t as usize >= n_vocab) {
        return Err(in_batch(i, Error::TokenOutOfRange { token: tokens[i], n_vocab }));
    }
    let spans = batch.spans();
    let mut seen = vec![false; states.len()];
    for s in &spans {
        let state = slot_state(states, s.slot).map_err(|e| in_batch(s.start, e))?;
        if std::mem::replace(&mut seen[s.slot], true) {
            return Err(in_batch(s.start, Error::SlotRepeated { slot: s.slot }));
        }
        state
            .check_step(model, n_vocab, &tokens[s.start..s.start + s.len], s.pos0)
            .map_err(|e| in_batch(s.start, e))?;
    }
    Ok(spans)
}

/// Recovers a backend's concrete pool type `T` from `pool` and checks the
/// step (see [`check_batch`]).
///
/// # Errors
/// [`Error::ForeignKvCache`] when `pool` is not a `T` (another backend's
/// pool); the errors of [`check_batch`].
pub fn checked_pool<'a, T: KvPool + Any>(
    pool: &'a mut dyn KvPool,
    model: ModelId,
    n_vocab: usize,
    batch: &Batch,
) -> Result<(&'a mut T, Vec<Span>)> {
    let pool = pool.as_any_mut().downcast_mut::<T>().ok_or(Error::ForeignKvCache)?;
    let spans = check_batch(pool.states(), model, n_vocab, batch)?;
    Ok((pool, spans))
}

/// Records a finished step's `spans` in `states`.
pub fn advance_spans(states: &mut [KvState], spans: &[Span]) {
    for s in spans {
        states[s.slot].advance(s.pos0, s.len);
    }
}

/// `n_slots` empty slots of `n_ctx` positions for `model`, after checking
/// the pool's size: `n_slots · n_ctx · row` values of up to 4 bytes must fit
/// in a `usize` of bytes (`row`: the largest per-position value count of a
/// layer), and the slots' bookkeeping is allocated fallibly, so an
/// impossible pool is an error before any layer is allocated.
///
/// # Errors
/// [`Error::EmptyKvCache`] when `n_slots` or `n_ctx` is 0;
/// [`Error::Overflow`] when the size overflows; [`Error::OutOfMemory`].
pub fn new_states(model: ModelId, n_slots: usize, n_ctx: usize, row: usize) -> Result<Vec<KvState>> {
    if n_slots == 0 {
        return Err(Error::EmptyKvCache);
    }
    let first = KvState::new(model, n_ctx)?;
    n_slots
        .checked_mul(n_ctx)
        .and_then(|p| p.checked_mul(row))
        .and_then(|v| v.checked_mul(4))
        .ok_or(Error::Overflow("KV pool size"))?;
    let mut states = Vec::new();
    crate::memory::resize(&mut states, n_slots, first, "the KV pool's slot states")?;
    Ok(states)
}

/// Forgets what a failed step may have written: every span's slot keeps
/// only the positions before the span (a failed run may have overwritten
/// them from there on, in some layers).
pub fn rollback_spans(states: &mut [KvState], spans: &[Span]) {
    for s in spans {
        states[s.slot].truncate(s.pos0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_rules() {
        let m = ModelId::next();
        let mut s = KvState::new(m, 4).unwrap();
        assert!(matches!(KvState::new(m, 0), Err(Error::EmptyKvCache)));
        assert!(matches!(s.check_step(ModelId::next(), 10, &[1], 0), Err(Error::ForeignKvCache)));
        assert!(matches!(s.check_step(m, 10, &[], 0), Err(Error::EmptyBatch)));
        assert!(matches!(s.check_step(m, 10, &[1], 1), Err(Error::PositionGap { pos: 1, len: 0 })));
        assert!(matches!(s.check_step(m, 10, &[1; 5], 0), Err(Error::ContextOverflow { .. })));
        assert!(matches!(s.check_step(m, 10, &[10], 0), Err(Error::TokenOutOfRange { token: 10, n_vocab: 10 })));
        s.check_step(m, 10, &[1, 2, 3], 0).unwrap();
        s.advance(0, 3);
        assert_eq!(s.len(), 3);
        assert!(matches!(s.check_step(m, 10, &[1], usize::MAX), Err(Error::PositionGap { .. })));
        s.check_step(m, 10, &[1], 3).unwrap();
        // Rewinding overwrites and discards what followed.
        s.advance(1, 1);
        assert_eq!(s.len(), 2);
        s.truncate(5);
        assert_eq!(s.len(), 2);
        s.truncate(0);
        assert!(s.is_empty());
    }

    #[test]
    fn batch_rules() {
        use crate::backend::batch::Out;
        let m = ModelId::next();
        let mut states = new_states(m, 3, 8, 4).unwrap();
        assert!(matches!(new_states(m, 0, 8, 4), Err(Error::EmptyKvCache)));
        assert!(matches!(new_states(m, usize::MAX, 8, 4), Err(Error::Overflow(_))));
        // Fits the size check, not the memory: an error, not an abort.
        assert!(matches!(new_states(m, 1 << 56, 1, 1), Err(Error::OutOfMemory { .. })));
        states[1].advance(0, 2);
        let inner = |r: Result<Vec<Span>>| match r {
            Err(Error::InBatch { index, source }) => Some((index, *source)),
            _ => None,
        };
        assert!(matches!(check_batch(&states, m, 10, &Batch::new()), Err(Error::EmptyBatch)));
        assert!(matches!(
            check_batch(&states, ModelId::next(), 10, &Batch::seq(0, 0, &[1], Out::Last)),
            Err(Error::ForeignKvCache)
        ));
        let mut b = Batch::seq(1, 2, &[1], Out::Last);
        b.push_seq(0, 0, &[1, 2, 3], Out::Last);
        assert_eq!(check_batch(&states, m, 10, &b).unwrap().len(), 2);
        b.push_seq(3, 0, &[1], Out::Last);
        assert!(matches!(
            inner(check_batch(&states, m, 10, &b)),
            Some((4, Error::SlotOutOfRange { slot: 3, n_slots: 3 }))
        ));
        let mut b = Batch::seq(0, 0, &[1, 2], Out::Last);
        b.push_seq(2, 1, &[1], Out::Last);
        assert!(matches!(inner(check_batch(&states, m, 10, &b)), Some((2, Error::PositionGap { pos: 1, len: 0 }))));
        let mut b = Batch::seq(0, 0, &[1, 2], Out::Last);
        b.push_seq(0, 5, &[1], Out::Last);
        assert!(matches!(inner(check_batch(&states, m, 10, &b)), Some((2, Error::SlotRepeated { slot: 0 }))));
        let b = Batch::seq(2, 0, &[1, 2, 10], Out::Last);
        assert!(matches!(inner(check_batch(&states, m, 10, &b)), Some((2, Error::TokenOutOfRange { token: 10, .. }))));
        let b = Batch::seq(2, 0, &[1; 9], Out::Last);
        assert!(matches!(inner(check_batch(&states, m, 10, &b)), Some((0, Error::ContextOverflow { .. }))));
        let spans = check_batch(&states, m, 10, &Batch::seq(1, 1, &[4, 4, 4], Out::None)).unwrap();
        advance_spans(&mut states, &spans);
        assert_eq!(states[1].len(), 4);
    }
}
