//! Slot choice and the prompt cache: each KV pool slot remembers the
//! tokens its cache holds, and a new request takes the free slot whose
//! tokens share the longest exact prefix with its prompt.
//!
//! A request reuses nothing beyond that exact token prefix: the slot is cut
//! back to the common prefix before the request's first step, so what
//! another request left past it is never attended to. At least one prompt
//! token is always left to compute, since its logits give the first reply
//! token.

/// What every slot of a pool holds and whether it is in use.
#[derive(Clone, Debug)]
pub struct SlotCache {
    /// Per slot: the tokens at positions `0..` of its KV cache.
    tokens: Vec<Vec<u32>>,
    busy: Vec<bool>,
}

/// A slot chosen for a prompt ([`SlotCache::take`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The slot.
    pub slot: usize,
    /// Prompt tokens its cache holds already (positions to keep).
    pub reused: usize,
}

impl SlotCache {
    /// `n_slots` free, empty slots.
    pub fn new(n_slots: usize) -> SlotCache {
        SlotCache { tokens: vec![Vec::new(); n_slots], busy: vec![false; n_slots] }
    }

    /// Slots in all.
    pub fn n_slots(&self) -> usize {
        self.busy.len()
    }

    /// Slots in use.
    pub fn n_busy(&self) -> usize {
        self.busy.iter().filter(|&&b| b).count()
    }

    /// Whether a slot is free.
    pub fn has_free(&self) -> bool {
        self.busy.iter().any(|&b| !b)
    }

    /// The tokens `slot`'s cache holds.
    pub fn tokens(&self, slot: usize) -> &[u32] {
        &self.tokens[slot]
    }

    /// Marks the free slot with the longest common prefix with `prompt` as
    /// busy (on a tie the one holding the fewest tokens, so that caches
    /// worth keeping are kept, then the lowest), cuts its record back to the
    /// tokens reused (at most `prompt.len() - 1`), and returns it; `None`
    /// when every slot is busy. The caller truncates the KV pool's slot to
    /// [`Taken::reused`] positions.
    pub fn take(&mut self, prompt: &[u32]) -> Option<Taken> {
        let limit = prompt.len().saturating_sub(1);
        let (slot, reused) = (0..self.n_slots())
            .filter(|&s| !self.busy[s])
            .map(|s| (s, common_prefix(&self.tokens[s], prompt).min(limit)))
            .min_by_key(|&(s, reused)| (std::cmp::Reverse(reused), self.tokens[s].len(), s))?;
        self.busy[slot] = true;
        self.tokens[slot].truncate(reused);
        Some(Taken { slot, reused })
    }

    /// Records that `tokens` were appended to `slot`'s cache.
    pub fn extend(&mut self, slot: usize, tokens: &[u32]) {
        self.tokens[slot].extend_from_slice(tokens);
    }

    /// Frees `slot`, keeping what its cache holds for the next prompt.
    pub fn release(&mut self, slot: usize) {
        self.busy[slot] = false;
    }

    /// Frees `slot` and forgets its cache (after a failed step, whose
    /// writes are not to be trusted).
    pub fn discard(&mut self, slot: usize) {
        self.busy[slot] = false;
        self.tokens[slot].clear();
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_exact_prefix_wins_and_one_token_is_left_to_compute() {
        let mut c = SlotCache::new(3);
        assert_eq!(c.take(&[1, 2, 3]), Some(Taken { slot: 0, reused: 0 }));
        c.extend(0, &[1, 2, 3, 9]);
        c.release(0);
        assert_eq!(c.take(&[5, 6]), Some(Taken { slot: 1, reused: 0 }), "an empty slot before a filled one");
        c.extend(1, &[5, 6]);
        c.release(1);
        // Same prompt again: everything but its last token is reused.
        assert_eq!(c.take(&[1, 2, 3]), Some(Taken { slot: 0, reused: 2 }));
        assert_eq!(c.tokens(0), [1, 2], "the record is cut back to what is reused");
        c.release(0);
        // Differs in the first token: nothing is reused.
        let t = c.take(&[7, 2, 3]).unwrap();
        assert_eq!(t.reused, 0);
        assert!(c.tokens(t.slot).is_empty());
        // Extends the cache: all of it is reused.
        let t = c.take(&[1, 2, 4, 4]).unwrap();
        assert_eq!(t, Taken { slot: 0, reused: 2 });
        assert_eq!(c.take(&[1]), Some(Taken { slot: 1, reused: 0 }));
        assert_eq!(c.take(&[1]), None, "all slots busy");
        assert_eq!(c.n_busy(), 3);
        c.discard(0);
        assert!(c.tokens(0).is_empty() && c.has_free());
    }
}
