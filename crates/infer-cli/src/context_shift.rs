//! llama.cpp's context shift on the command line (`run`, `chat`): a
//! generation that fills the context keeps its first `--keep` tokens, drops
//! the oldest half of the rest and goes on
//! (`infer_model::generate::CachedContext::set_context_shift`).
//! `--no-context-shift`, or `run -n -2` (llama.cpp's "until the context is
//! filled"), ends it at a full context instead.

use clap::Args;
use infer_model::tokenizer::Tokenizer;

/// The context shift options.
#[derive(Args, Clone, Debug, Default)]
pub struct ContextShiftArgs {
    /// Tokens of the prompt kept at the start when a full context is shifted (llama.cpp's --keep; BOS is kept
    /// besides; -1: the whole prompt) [default: 0; chat: the system prompt]
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = keep_value)]
    pub keep: Option<i64>,
    /// End the generation at a full context instead of dropping the oldest half of the tokens after --keep.
    #[arg(long)]
    pub no_context_shift: bool,
}

impl ContextShiftArgs {
    /// The tokens kept at the start of a shifted context for the prompt
    /// `ids`, as llama.cpp's `n_keep`: `--keep N` plus the BOS token when the
    /// prompt starts with one; `-1`, or more than the prompt, the whole
    /// prompt; `None` with `--no-context-shift`.
    pub fn n_keep(&self, ids: &[u32], tokenizer: &Tokenizer) -> Option<usize> {
        if self.no_context_shift {
            return None;
        }
        let keep = self.keep.unwrap_or(0);
        let bos = usize::from(tokenizer.add_bos() && ids.first().is_some_and(|&f| Some(f) == tokenizer.bos_id()));
        Some(match keep {
            k if k < 0 => ids.len(),
            k => usize::try_from(k).unwrap_or(usize::MAX).saturating_add(bos).min(ids.len()),
        })
    }
}

/// `--keep`'s value: llama.cpp documents `-1` as "all" (the whole prompt)
/// and no other negative value; any other negative number is refused with
/// the range, on one line.
fn keep_value(s: &str) -> Result<i64, String> {
    let s = s.trim();
    match s.parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        Err(_) if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() => {
            Err("too large (give a number of tokens, or -1 for the whole prompt)".to_string())
        }
        _ => Err("must be at least 0, or -1 for the whole prompt".to_string()),
    }
}
