//! The bookkeeping every backend's KV cache shares ([`KvState`]), and the
//! one check of a forward step ([`KvState::check_step`]) that every backend
//! runs before touching device memory, so that the rules (no gaps, no
//! overflow, no foreign cache, ids inside the vocabulary) cannot drift
//! between backends.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use super::KvCache;
use crate::error::{Error, Result};

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

/// Owner, capacity and fill of a KV cache. Backends embed one in their cache
/// type and return it from [`KvCache::state`].
///
/// Positions `0..len` hold keys and values of the sequence so far; a step at
/// position `pos ≤ len` overwrites from `pos` on and makes `pos + n_tokens`
/// the new length (positions past it are discarded, as after
/// [`KvCache::truncate`]).
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

/// Recovers a backend's concrete cache type `T` from `kv` and checks the
/// step (see [`KvState::check_step`]).
///
/// # Errors
/// [`Error::ForeignKvCache`] when `kv` is not a `T` (another backend's
/// cache); the errors of [`KvState::check_step`].
pub fn checked_cache<'a, T: KvCache + Any>(
    kv: &'a mut dyn KvCache,
    model: ModelId,
    n_vocab: usize,
    tokens: &[u32],
    pos: usize,
) -> Result<&'a mut T> {
    let cache = kv.as_any_mut().downcast_mut::<T>().ok_or(Error::ForeignKvCache)?;
    cache.state().check_step(model, n_vocab, tokens, pos)?;
    Ok(cache)
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
}
