//! Scratch buffers of the CUDA decode pipeline and how large they are:
//! the shape maxima over the layers, the tokens per prefill pass, and the
//! split-K attention partial sums (only passes shorter than
//! [`ops::FLASH_MIN_TOKENS`] need them when every layer has a tiled
//! attention kernel).

use cudarc::driver::CudaSlice;

use super::device::{Device, PinnedBuf};
use super::kv_pool::CudaKvPool;
use super::ops::{self, GemmPrecision};
use crate::error::Result;

/// Most tokens per prefill pass (bounds the scratch buffers); passes are
/// shorter when the split-attention partial sums of one pass would exceed
/// 256 MiB (long contexts), but at least 32 tokens.
pub const PREFILL_CHUNK: usize = 512;

/// Bytes the split-attention partial sums of one pass may take; longer
/// contexts get shorter passes.
const ATTN_PARTS_BUDGET: usize = 256 << 20;

/// Tokens per prefill pass for `n_split` attention splits: [`PREFILL_CHUNK`],
/// fewer when the passes use split-K attention and its per-token partial
/// sums (`heads · n_split · head_dim` floats) would exceed
/// [`ATTN_PARTS_BUDGET`], at least 32.
pub(super) fn prefill_chunk(m: &Maxima, n_split: usize) -> usize {
    if m.flash {
        // Passes long enough to need the room run the tiled kernel instead.
        return PREFILL_CHUNK;
    }
    let per_token = (m.heads * n_split * m.hd * 4).max(1);
    (ATTN_PARTS_BUDGET / per_token).clamp(32, PREFILL_CHUNK)
}

/// Shape maxima over the layers, for sizing buffers.
#[derive(Clone, Copy, Default)]
pub(super) struct Maxima {
    pub q_dim: usize,
    pub kv_dim: usize,
    pub n_ff: usize,
    pub heads: usize,
    pub hd: usize,
    pub cols: usize,
    /// Values of the largest layer matrix.
    pub mat: usize,
    /// Every layer's attention has a tiled prefill kernel, so only passes
    /// shorter than [`ops::FLASH_MIN_TOKENS`] use the split-K partial sums.
    pub flash: bool,
}

impl Maxima {
    /// These maxima for passes over `pool`: a TurboQuant layer attends with
    /// the split-K kernels at every span length, so `flash` is off there.
    pub(super) fn for_pool(&self, pool: &CudaKvPool) -> Maxima {
        Maxima { flash: self.flash && !pool.has_tq(), ..*self }
    }

    /// Tokens of a pass of `n_tok` whose attention partial sums need room:
    /// those of the split-K kernels, or of one batched decode launch.
    pub(super) fn attn_part_tokens(&self, n_tok: usize) -> usize {
        self.split_k_tokens(n_tok).max(n_tok.min(ops::DECODE_BATCH_MAX))
    }

    /// Tokens of a pass of `n_tok` whose split-K partial sums need room.
    pub(super) fn split_k_tokens(&self, n_tok: usize) -> usize {
        if self.flash {
            n_tok.min(ops::FLASH_MIN_TOKENS - 1)
        } else {
            n_tok
        }
    }
}

/// Scratch buffers, sized for `cap` tokens, `out_cap` rows of logits and
/// `n_split` attention splits.
pub(super) struct Buffers {
    pub cap: usize,
    pub out_cap: usize,
    pub n_split: usize,
    /// The [`Maxima::flash`] the partial sums were sized for.
    pub flash: bool,
    /// Bumped on every reallocation (invalidates captured graphs).
    pub generation: usize,
    /// A step's integers on the host (pinned) and the device (see
    /// [`Params`]): its spans' first positions, its token ids, the batch
    /// indices of the rows whose logits are wanted.
    pub params_host: PinnedBuf<i32>,
    pub params: CudaSlice<i32>,
    pub x: CudaSlice<f32>,
    /// A second residual row for one-token steps: the fused-norm products
    /// (`mvn_*`) write the updated residual here while their other blocks
    /// still read `x`, and the two swap roles at each such norm.
    pub x_alt: CudaSlice<f32>,
    pub h: CudaSlice<f32>,
    pub aq: CudaSlice<i8>,
    pub ad: CudaSlice<f32>,
    /// q8 activation of one token's GLU output, written by the gate/up
    /// product while other blocks still read `aq` / `ad`
    /// ([`ops::matvec_glu_q8`]): `n_ff` quants, `n_ff / 32` (d, d * sum).
    pub glu_q: CudaSlice<i8>,
    pub glu_ds: CudaSlice<f32>,
    pub q: CudaSlice<f32>,
    pub k: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    pub attn: CudaSlice<f32>,
    pub o: CudaSlice<f32>,
    pub gate: CudaSlice<f32>,
    pub up: CudaSlice<f32>,
    pub act: CudaSlice<f32>,
    pub part_o: CudaSlice<f32>,
    pub part_ml: CudaSlice<f32>,
    /// Finished spans per kv head of the one-launch decode attention
    /// ([`ops::qkv_attention`]); zero between launches.
    pub attn_count: CudaSlice<i32>,
    /// Finished blocks per q8 chunk of a one-token GLU product that
    /// quantizes its output ([`ops::matvec_glu_q8`]); zero between launches.
    pub glu_count: CudaSlice<i32>,
    /// `out_cap` rows of `n_vocab` logits.
    pub logits: CudaSlice<f32>,
    /// The wanted rows of `h` and of its q8 copy (`aq`, `ad`), gathered
    /// for the vocabulary product (`out_cap` rows each).
    pub out_h: CudaSlice<f32>,
    pub out_q: CudaSlice<i8>,
    pub out_d: CudaSlice<f32>,
    /// The device argmax: per-block keys, the blocks' finish counter, the
    /// result (see [`ops::argmax`]).
    pub argmax_part: CudaSlice<u64>,
    pub argmax_count: CudaSlice<u32>,
    pub argmax_key: CudaSlice<u64>,
    /// The prefill GEMMs' scratch (`None` when the buffers serve fewer
    /// than `CudaOptions::gemm_min_tokens` tokens or the path is off).
    pub gemm: Option<GemmScratch>,
    /// The `mmq_*` products' scratch (`None` when the buffers serve fewer
    /// than `CudaOptions::mmq_min_tokens` tokens or the path is off).
    pub mmq: Option<MmqScratch>,
}

/// Where a step's integers lie in [`Buffers::params`] (`i32` each): the
/// first position of each of its `n_spans` spans, then its `n` token ids,
/// then the batch indices of its wanted rows (room for `n`), then each
/// span's slot. A one-token step is `[pos0, token, ...]` at every position,
/// so its captured graph replays.
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub n_spans: usize,
    pub n: usize,
}

impl Params {
    /// Values for a step of up to `cap` tokens (as many spans and rows).
    pub fn len(cap: usize) -> usize {
        4 * cap.max(1)
    }
    /// Index of span `i`'s first position.
    pub fn pos(&self, i: usize) -> usize {
        i
    }
    /// Index of the first token id.
    pub fn tokens(&self) -> usize {
        self.n_spans
    }
    /// Index of the first wanted row's batch index (room for `n`).
    pub fn outputs(&self) -> usize {
        self.n_spans + self.n
    }
    /// Index of span `i`'s slot.
    pub fn slot(&self, i: usize) -> usize {
        self.n_spans + 2 * self.n + i
    }
    /// Values the step writes.
    pub fn end(&self) -> usize {
        self.slot(self.n_spans)
    }
}

/// Scratch of the prefill GEMMs.
pub(super) struct GemmScratch {
    pub prec: GemmPrecision,
    /// One layer matrix, dequantized (f32 or bf16 values).
    pub w: CudaSlice<f32>,
    /// The pass's activations in bf16 (unused with TF32).
    pub x: CudaSlice<u16>,
}

/// Scratch of the `mmq_*` products ([`ops::mmq`]), for passes of fewer
/// than `CudaOptions::gemm_min_tokens` tokens.
pub(super) struct MmqScratch {
    /// The pass's activations in bf16 (`tokens × cols`).
    pub x: CudaSlice<u16>,
    /// Split-K partial sums ([`ops::mmq_part_len`] floats).
    pub part: CudaSlice<f32>,
}

impl Buffers {
    /// Allocates the buffers of passes of up to `cap` tokens over a cache
    /// of `n_split` attention splits.
    #[allow(clippy::too_many_arguments)] // sizes, one by one
    pub(super) fn new(
        d: &Device,
        m: &Maxima,
        e: usize,
        n_vocab: usize,
        cap: usize,
        out_cap: usize,
        n_split: usize,
        generation: usize,
    ) -> Result<Self> {
        Ok(Buffers {
            cap,
            out_cap,
            n_split,
            flash: m.flash,
            generation,
            params_host: d.pinned(Params::len(cap))?,
            params: d.zeros(Params::len(cap))?,
            x: d.zeros(cap * e)?,
            x_alt: d.zeros(e)?,
            h: d.zeros(cap * e)?,
            aq: d.zeros(cap * m.cols)?,
            ad: d.zeros(cap * m.cols.div_ceil(32) * 2)?,
            glu_q: d.zeros(m.n_ff.max(1))?,
            glu_ds: d.zeros((m.n_ff / 32).max(1) * 2)?,
            q: d.zeros(cap * m.q_dim)?,
            k: d.zeros(cap * m.kv_dim)?,
            v: d.zeros(cap * m.kv_dim)?,
            attn: d.zeros(cap * m.q_dim)?,
            o: d.zeros(cap * e)?,
            gate: d.zeros(cap * m.n_ff)?,
            up: d.zeros(cap * m.n_ff)?,
            act: d.zeros(cap * m.n_ff)?,
            part_o: d.zeros(m.attn_part_tokens(cap) * m.heads * n_split * m.hd)?,
            part_ml: d.zeros(m.attn_part_tokens(cap) * m.heads * n_split * 2)?,
            attn_count: d.zeros(cap.min(ops::DECODE_BATCH_MAX) * m.heads.max(1))?,
            glu_count: d.zeros((m.n_ff / 32).max(1))?,
            logits: d.zeros(out_cap * n_vocab)?,
            out_h: d.zeros(out_cap * e)?,
            out_q: d.zeros(out_cap * e)?,
            out_d: d.zeros(out_cap * e.div_ceil(32) * 2)?,
            argmax_part: d.zeros(ops::ARGMAX_BLOCKS)?,
            argmax_count: d.zeros(1)?,
            argmax_key: d.zeros(1)?,
            gemm: match d.opts.prefill_gemm.filter(|_| cap >= d.opts.gemm_min_tokens) {
                Some(prec) => Some(GemmScratch {
                    prec,
                    // f32 slots: m.mat values of 4 (TF32) or 2 (bf16) bytes.
                    w: d.zeros((m.mat * prec.bytes()).div_ceil(4))?,
                    x: d.zeros(if prec == GemmPrecision::Bf16 { cap * m.cols } else { 1 })?,
                }),
                None => None,
            },
            mmq: match d.opts.mmq_min_tokens.filter(|&min| cap >= min) {
                Some(_) => {
                    let n = cap.min(d.opts.gemm_min_tokens.saturating_sub(1)).max(1);
                    Some(MmqScratch { x: d.zeros(n * m.cols)?, part: d.zeros(ops::mmq_part_len(d, n))? })
                }
                None => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maxima(flash: bool) -> Maxima {
        Maxima { heads: 8, hd: 256, cols: 2560, flash, ..Default::default() }
    }

    #[test]
    fn passes_stay_long_when_the_tiled_attention_needs_no_partial_sums() {
        // 4096 positions: 128 splits of 32; 8 heads of 256 -> 1 MiB per token.
        assert_eq!(prefill_chunk(&maxima(true), 128), PREFILL_CHUNK);
        assert_eq!(prefill_chunk(&maxima(false), 128), 256);
        assert_eq!(prefill_chunk(&maxima(false), 1 << 20), 32);
        assert_eq!(maxima(true).split_k_tokens(PREFILL_CHUNK), ops::FLASH_MIN_TOKENS - 1);
        assert_eq!(maxima(true).split_k_tokens(3), 3);
        assert_eq!(maxima(false).split_k_tokens(PREFILL_CHUNK), PREFILL_CHUNK);
    }
}
