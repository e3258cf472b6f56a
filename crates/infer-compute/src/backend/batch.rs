//! The input of one forward step ([`Batch`]): tokens of any number of
//! sequences, token-major, as llama.cpp's `llama_batch` (`include/llama.h`):
//! for each token its id, its position in its sequence, the KV pool slot of
//! its sequence, and whether its logits are wanted.
//!
//! A run of consecutive tokens of one slot at consecutive positions is a
//! [`Span`]: a span of one token is a decode step, a longer one a prefill
//! chunk, and one batch mixes both (two sequences decoding beside a third's
//! prompt chunk). Attention iterates over spans; the products see the batch
//! as one matrix of `len()` tokens.

/// Which tokens of a sequence pushed with [`Batch::push_seq`] get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// None (a prompt chunk that is not the prompt's end).
    None,
    /// The last token only (the end of a prompt, a decode step).
    Last,
    /// Every token (perplexity, speculative verification).
    All,
}

/// A maximal run of the batch's tokens `start..start + len`, all of `slot`
/// at positions `pos0..pos0 + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The KV pool slot.
    pub slot: usize,
    /// Position of the span's first token in its sequence.
    pub pos0: usize,
    /// Index of the span's first token in the batch.
    pub start: usize,
    /// Tokens in the span (at least 1).
    pub len: usize,
}

/// Tokens of one forward step, token-major (see the module docs). Reuse one
/// across steps with [`Batch::clear`] to avoid allocating.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    tokens: Vec<u32>,
    pos: Vec<usize>,
    slot: Vec<usize>,
    logits: Vec<bool>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// One sequence's `tokens` at positions `pos0..` of `slot`, logits as
    /// `out` says.
    pub fn seq(slot: usize, pos0: usize, tokens: &[u32], out: Out) -> Self {
        let mut b = Self::new();
        b.push_seq(slot, pos0, tokens, out);
        b
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pos.clear();
        self.slot.clear();
        self.logits.clear();
    }

    /// Appends one token.
    pub fn push(&mut self, token: u32, pos: usize, slot: usize, logits: bool) {
        self.tokens.push(token);
        self.pos.push(pos);
        self.slot.push(slot);
        self.logits.push(logits);
    }

    /// Appends `tokens` of `slot` at positions `pos0, pos0 + 1, …`, with
    /// logits for the tokens `out` names. Positions that would pass
    /// `usize::MAX` saturate (the step's check then reports the overflow).
    pub fn push_seq(&mut self, slot: usize, pos0: usize, tokens: &[u32], out: Out) {
        let n = tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            let wanted = match out {
                Out::None => false,
                Out::Last => i + 1 == n,
                Out::All => true,
            };
            self.push(t, pos0.saturating_add(i), slot, wanted);
        }
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Token ids, one per token.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions, one per token.
    pub fn positions(&self) -> &[usize] {
        &self.pos
    }

    /// KV pool slots, one per token.
    pub fn slots(&self) -> &[usize] {
        &self.slot
    }

    /// Whether each token's logits are wanted.
    pub fn wants_logits(&self) -> &[bool] {
        &self.logits
    }

    /// Tokens whose logits are wanted: the rows a forward step returns.
    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l).count()
    }

    /// Indices of the tokens whose logits are wanted, in batch order (row
    /// `r` of a step's logits is token `output_indices()[r]`).
    pub fn output_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.logits.iter().enumerate().filter(|(_, &l)| l).map(|(i, _)| i)
    }

    /// The batch as maximal spans (see [`Span`]), in batch order.
    pub fn spans(&self) -> Vec<Span> {
        let mut out: Vec<Span> = Vec::new();
        for i in 0..self.len() {
            match out.last_mut() {
                Some(s) if s.slot == self.slot[i] && s.pos0.checked_add(s.len) == Some(self.pos[i]) => s.len += 1,
                _ => out.push(Span { slot: self.slot[i], pos0: self.pos[i], start: i, len: 1 }),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_outputs() {
        let mut b = Batch::new();
        b.push_seq(2, 7, &[1], Out::Last);
        b.push_seq(0, 0, &[4, 5, 6], Out::Last);
        b.push_seq(1, 3, &[9, 9], Out::All);
        b.push_seq(1, 9, &[3], Out::None);
        assert_eq!(b.len(), 7);
        assert_eq!(b.n_outputs(), 4);
        assert_eq!(b.output_indices().collect::<Vec<_>>(), [0, 3, 4, 5]);
        assert_eq!(
            b.spans(),
            [
                Span { slot: 2, pos0: 7, start: 0, len: 1 },
                Span { slot: 0, pos0: 0, start: 1, len: 3 },
                Span { slot: 1, pos0: 3, start: 4, len: 2 },
                // Same slot, not the next position: a span of its own.
                Span { slot: 1, pos0: 9, start: 6, len: 1 },
            ]
        );
        b.clear();
        assert!(b.is_empty() && b.spans().is_empty());
        let s = Batch::seq(0, usize::MAX, &[1, 2], Out::None);
        assert_eq!(s.positions(), [usize::MAX, usize::MAX]);
        assert_eq!(s.spans().len(), 2);
    }
}
