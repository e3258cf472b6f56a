//! `infer perplexity`: the perplexity of a model over a text file, computed
//! as llama.cpp's `llama-perplexity` computes it (`tools/perplexity/
//! perplexity.cpp`, `perplexity()` without `--ppl-stride`):
//!
//! - the whole file is tokenized once, BOS first when the model adds one
//!   (`common_tokenize(ctx, text, add_special = true, parse_special =
//!   false)`); it must hold at least `2 · n_ctx` tokens;
//! - it is cut into `n_chunk = n_tokens / n_ctx` chunks of `n_ctx` tokens
//!   (a shorter tail is dropped; `--chunks` caps the count);
//! - each chunk runs from an empty KV cache, its first token replaced by
//!   BOS when the model adds one, and only its second half is scored: the
//!   logits at positions `first = n_ctx / 2 .. n_ctx - 2` against the next
//!   token, `n_ctx - first - 1` tokens per chunk;
//! - each scored token adds `v = −log_softmax(logits)[next]` (max in f32,
//!   `Σ expf(l − max)` in f64) to `nll` and `v²` to `nll2`;
//! - after each chunk `[i]exp(nll / count)` is printed, and at the end
//!   `PPL = exp(nll / count)` with `± PPL · sqrt((nll2 / count −
//!   (nll / count)²) / (count − 1))`, the standard error of the mean
//!   log-likelihood carried to the perplexity.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use infer_compute::{Batch, DeviceModel, KvPool, Out as Logits};
use infer_model::tokenizer::Tokenizer;

use crate::cache_type::CacheTypeArgs;
use crate::common::{at_least, CliResult, Loaded, ModelArgs, ThreadArgs};
use crate::output::Out;

/// Tokens per forward pass at most (llama.cpp's default `--ubatch-size`):
/// bounds the logits held at once (`512 · n_vocab` floats).
const UBATCH: usize = 512;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    threads: ThreadArgs,
    /// The text file to score.
    #[arg(short = 'f', long = "file", value_name = "FILE", required_unless_present = "list_devices")]
    file: Option<PathBuf>,
    /// Tokens per chunk (llama-perplexity's -c; its default 512).
    /// 0: the model's training context, as llama-perplexity.
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 512, allow_negative_numbers = true,
          value_parser = chunk_size)]
    ctx_size: usize,
    /// Tokens per forward pass (llama.cpp's -b), at most 512 at a time.
    #[arg(short = 'b', long = "batch-size", value_name = "N", default_value_t = 2048, allow_negative_numbers = true,
          value_parser = at_least::<usize>(1))]
    batch_size: usize,
    /// Score at most this many chunks (-1: all, as llama-perplexity's --chunks).
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    chunks: i64,
    #[command(flatten)]
    cache: CacheTypeArgs,
}

/// `-c`: 0 (the training context) or at least 2 tokens (one scored).
fn chunk_size(s: &str) -> Result<usize, String> {
    let range = "must be 0 (the model's training context) or at least 2";
    match s.trim().parse::<i128>() {
        Ok(n) if n < 0 || n == 1 => Err(range.into()),
        Ok(_) => at_least::<usize>(0)(s),
        Err(_) => Err(format!("not a whole number ({range})")),
    }
}

/// The running sums of llama-perplexity.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NllSums {
    /// Σ −log p(next token).
    pub nll: f64,
    /// Σ (log p)².
    pub nll2: f64,
    /// Tokens scored.
    pub count: usize,
}

impl NllSums {
    /// Adds the score of one row of logits whose next token is `next`.
    pub fn add(&mut self, logits: &[f32], next: u32) {
        let v = -log_softmax(logits, next as usize);
        self.nll += v;
        self.nll2 += v * v;
        self.count += 1;
    }

    /// `exp(nll / count)`, the perplexity so far.
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The final estimate and its ± figure, as llama-perplexity prints them;
    /// `None` for the ± figure when the variance is not positive (llama.cpp
    /// then reports an error instead of the figure).
    pub fn estimate(&self) -> (f64, Option<f64>) {
        let n = self.count as f64;
        let nll = self.nll / n;
        let var = self.nll2 / n - nll * nll;
        let ppl = nll.exp();
        if var > 0.0 && self.count > 1 {
            (ppl, Some((var / (n - 1.0)).sqrt() * ppl))
        } else {
            (ppl, None)
        }
    }
}

/// llama-perplexity's `log_softmax`: `l[tok] − max − ln Σ expf(l − max)`,
/// the maximum and each difference in f32, the sum in f64.
pub fn log_softmax(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}

/// The chunks to score: `n_tokens / n_ctx`, capped by `--chunks` when it is
/// not negative.
fn n_chunks(n_tokens: usize, n_ctx: usize, cap: i64) -> usize {
    let max = n_tokens / n_ctx;
    if cap < 0 {
        max
    } else {
        max.min(cap as usize)
    }
}

pub fn perplexity(a: PerplexityArgs) -> CliResult {
    // 0 or at least 2, and at least 1, by their parsers.
    if a.chunks == 0 {
        return Err("--chunks 0: nothing to measure (give a number of chunks, or -1 for all)".into());
    }
    // Required by clap unless --list-devices, which runs nothing else.
    let file = a.file.as_deref().ok_or("perplexity needs a text file: -f FILE")?;
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let path = a.model.resolve_model()?;
    let (loaded, (tokenizer, n_ctx)) = a.model.load(&path, a.threads.get(), |gguf, spec| {
        let n_ctx = if a.ctx_size == 0 { spec.n_ctx_train.max(2) } else { a.ctx_size };
        if n_ctx > spec.n_ctx_train {
            eprintln!("warning: the model was trained on only {} context tokens ({n_ctx} specified)", spec.n_ctx_train);
        }
        Ok((Tokenizer::from_gguf(gguf)?, n_ctx))
    })?;
    let Loaded { backend, mut model, .. } = loaded;
    let t0 = Instant::now();
    let tokens = crate::common::with_spinner("tokenizing", || tokenizer.encode_with(&text, true, false));
    eprintln!("perplexity: tokenizing the input took {:.3} s: {} tokens", t0.elapsed().as_secs_f64(), tokens.len());
    if tokens.len() < 2 * n_ctx {
        return Err(format!(
            "you need at least {} tokens to evaluate perplexity with a context of {n_ctx}; {} tokenizes to only {}",
            2 * n_ctx,
            file.display(),
            tokens.len()
        )
        .into());
    }
    let n_chunk = n_chunks(tokens.len(), n_ctx, a.chunks);
    let n_batch = a.batch_size.min(n_ctx).min(UBATCH);
    let types = a.cache.types_for(model.as_ref());
    let mut kv = model.new_kv_cache_typed(n_ctx, types)?;
    eprintln!("backend: {}", backend.device_info());
    eprintln!(
        "perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, KV cache {types} ({} bytes per token)",
        kv.bytes_per_token()
    );
    let bos = tokenizer.add_bos().then(|| tokenizer.bos_id()).flatten();
    crate::interrupt::graceful();
    let pb = ProgressBar::new(n_chunk as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} chunks {elapsed}/{duration} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut out = Out::new();
    let mut sums = NllSums::default();
    let t0 = Instant::now();
    for i in 0..n_chunk {
        if crate::interrupt::requested() {
            pb.abandon();
            return Err(crate::Interrupted.into());
        }
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        score_chunk(model.as_mut(), kv.as_mut(), chunk, bos, n_batch, &mut sums)?;
        pb.inc(1);
        pb.set_message(format!("PPL {:.4}", sums.ppl()));
        pb.suspend(|| -> std::io::Result<()> {
            write!(out, "[{}]{:.4},", i + 1, sums.ppl())?;
            out.flush()
        })?;
    }
    pb.finish_and_clear();
    writeln!(out)?;
    let (ppl, pm) = sums.estimate();
    match pm {
        Some(pm) => writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {pm:.5}")?,
        None => {
            writeln!(out, "Final estimate: PPL = {ppl:.4}")?;
            eprintln!("warning: unexpected negative standard deviation of log(prob)");
        }
    }
    out.flush()?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "perplexity: {n_chunk} chunks of {n_ctx} tokens in {secs:.2} s ({:.1} tokens/s), {} tokens scored",
        (n_chunk * n_ctx) as f64 / secs,
        sums.count
    );
    Ok(())
}

/// Runs one chunk from an empty cache (its first token BOS when `bos` is
/// given) in passes of `n_batch` tokens, split where the scored half
/// begins, and adds the scores of positions `n_ctx / 2 .. n_ctx - 1` to
/// `sums`.
fn score_chunk(
    model: &mut dyn DeviceModel,
    kv: &mut dyn KvPool,
    chunk: &[u32],
    bos: Option<u32>,
    n_batch: usize,
    sums: &mut NllSums,
) -> CliResult {
    let n_ctx = chunk.len();
    let first = n_ctx / 2;
    let mut input = chunk.to_vec();
    if let Some(b) = bos {
        input[0] = b;
    }
    kv.reset(0)?;
    let n_vocab = model.n_vocab();
    let mut pos = 0;
    while pos < n_ctx {
        let limit = if pos < first { first } else { n_ctx };
        let end = (pos + n_batch).min(limit);
        let scored = pos >= first;
        let batch = Batch::seq(0, pos, &input[pos..end], if scored { Logits::All } else { Logits::None });
        let logits = model.forward(kv, &batch)?;
        if scored {
            for (row, p) in logits.chunks_exact(n_vocab).zip(pos..end) {
                if p + 1 < n_ctx {
                    sums.add(row, chunk[p + 1]);
                }
            }
        }
        pos = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_estimate() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        assert!((log_softmax(&l, 2) - (3.0 - z.ln())).abs() < 1e-6);
        // Uniform logits: every token has probability 1/4, so PPL = 4 and
        // no spread.
        let mut s = NllSums::default();
        for t in 0..4 {
            s.add(&[0.5; 4], t);
        }
        assert_eq!(s.count, 4);
        assert!((s.ppl() - 4.0).abs() < 1e-9);
        assert_eq!(s.estimate().1, None);
        // Two scores a and b: mean m, ± = PPL · sqrt(((a² + b²)/2 − m²) / 1).
        let mut s = NllSums::default();
        s.add(&[0.0, 0.0], 0); // v = ln 2
        s.add(&[0.0, 0.0, 0.0, 0.0], 1); // v = ln 4
        let (a, b) = (2f64.ln(), 4f64.ln());
        let m = (a + b) / 2.0;
        let (ppl, pm) = s.estimate();
        assert!((ppl - m.exp()).abs() < 1e-9);
        let want = (((a * a + b * b) / 2.0 - m * m) / 1.0).sqrt() * m.exp();
        assert!((pm.unwrap() - want).abs() < 1e-9);
    }

    #[test]
    fn chunk_count_as_llama_perplexity() {
        assert_eq!(n_chunks(10_000, 2048, -1), 4);
        assert_eq!(n_chunks(10_000, 2048, 2), 2);
        assert_eq!(n_chunks(10_000, 2048, 0), 0);
    }
}
