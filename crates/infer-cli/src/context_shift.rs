//! llama.cpp's context shift on the command line (`run`, `chat`): a
//! generation that fills the context keeps its first `--keep` tokens, drops
//! the oldest half of the rest and goes on
//! (`infer_model::generate::CachedContext::set_context_shift`).
//! `--no-context-shift`, or `run -n -2` (llama.cpp's "until the context is
//! filled"), ends it at a full context instead.

use clap::Args;
use infer_model::tokenizer::Tokenizer;

use crate::common::CliResult;

/// The context shift options.
#[derive(Args, Clone, Debug, Default)]
pub struct ContextShiftArgs {
    /// Tokens of the prompt kept at the start when a full context is shifted (llama.cpp's --keep; BOS is kept
    /// besides; -1: the whole prompt) [default: 0; chat: the system prompt]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
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
    ///
    /// # Errors
    /// `--keep` below -1.
    pub fn n_keep(&self, ids: &[u32], tokenizer: &Tokenizer) -> CliResult<Option<usize>> {
        if self.no_context_shift {
            return Ok(None);
        }
        let keep = self.keep.unwrap_or(0);
        let bos = usize::from(tokenizer.add_bos() && ids.first().is_some_and(|&f| Some(f) == tokenizer.bos_id()));
        Ok(Some(match keep {
            -1 => ids.len(),
            k if k < -1 => {
                return Err(format!("--keep {k}: give a number of tokens, or -1 for the whole prompt").into())
            }
            k => usize::try_from(k).unwrap_or(usize::MAX).saturating_add(bos).min(ids.len()),
        }))
    }

    /// Checks `--keep` before anything loads.
    ///
    /// # Errors
    /// `--keep` below -1.
    pub fn check(&self) -> CliResult {
        match self.keep {
            Some(k) if k < -1 => Err(format!("--keep {k}: give a number of tokens, or -1 for the whole prompt").into()),
            _ => Ok(()),
        }
    }
}
