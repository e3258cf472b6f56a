//! The device argmax and the per-row top-k candidates.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{to_i32, to_u32};
use crate::backend::{RowStats, TopK};
use crate::cuda::device::Device;
use crate::cuda::kernels::{names, DevPtr};
use crate::error::{Error, Result};

/// Blocks of the device argmax (each reduces a grid stride of the logits).
pub(crate) const ARGMAX_BLOCKS: usize = 128;

/// Writes the greedy token's key of the `n` logits at `x` to `out` (one
/// u64: the order-preserving bits of the largest logit, any NaN counting as
/// the largest, in the high half; the complement of its lowest index in the
/// low half; see [`argmax_token`]). `part` holds [`ARGMAX_BLOCKS`] u64,
/// `count` one u32 that must be 0 (the kernel leaves it 0).
pub(crate) fn argmax(dev: &Device, x: DevPtr, n: usize, part: DevPtr, count: DevPtr, out: DevPtr) -> Result<()> {
    let ni = to_i32(n, "logits")?;
    let blocks = n.div_ceil(256).clamp(1, ARGMAX_BLOCKS);
    let cfg = LaunchConfig { grid_dim: (to_u32(blocks, "grid")?, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: x holds n floats, part ARGMAX_BLOCKS u64 (blocks ≤ that),
    // count one u32, out one u64.
    unsafe {
        dev.launch_with(names::ARGMAX_LOGITS, cfg, |b| {
            b.arg(&x).arg(&ni).arg(&part).arg(&count).arg(&out);
        })
    }
}

/// The token of a key written by [`argmax`]; an error when the largest
/// logit was NaN.
pub(crate) fn argmax_token(key: u64) -> Result<u32> {
    if (key >> 32) as u32 == u32::MAX {
        return Err(Error::NonFinite("the logits"));
    }
    Ok(!(key as u32))
}

/// Threads of a `topk_rows` block.
const TOPK_THREADS: u32 = 256;

/// Blocks a [`top_k`] launch aims at: about two per SM of an H100 or H200,
/// so that one row of a decode step is selected by the whole device.
const TOPK_BLOCKS: usize = 256;

/// The fewest logits a [`top_k`] block takes while a row has more.
const TOPK_CHUNK_MIN: usize = 4096;

/// u32 words of one row of [`top_k`]'s output: `k` ids, `k` logits' bits,
/// then the row's max's bits, `ln Σ exp(x - max)`'s bits and its first
/// NaN's index (`u32::MAX` when none).
pub(crate) fn top_k_stride(k: usize) -> usize {
    2 * k + 3
}

/// How [`top_k`] splits rows of `n` logits when it selects over `rows` of
/// them: `(chunks, chunk)`, each chunk `chunk` logits (a multiple of 4, for
/// 16-byte loads) but the last.
fn top_k_chunks(n: usize, rows: usize) -> (usize, usize) {
    let want = TOPK_BLOCKS.div_ceil(rows.max(1)).min(n.div_ceil(TOPK_CHUNK_MIN)).max(1);
    let chunk = n.div_ceil(want).next_multiple_of(4);
    (n.div_ceil(chunk), chunk)
}

/// u32 words of the scratch buffer [`top_k`] needs for up to `max_rows`
/// rows of any `k`: a ticket per row, then every chunk's candidate list.
/// The buffer must be zeroed once when allocated (the tickets; each launch
/// leaves them zeroed).
pub(crate) fn top_k_scratch_words(max_rows: usize) -> usize {
    // rows · ⌈TOPK_BLOCKS / rows⌉ < rows + TOPK_BLOCKS chunks in all.
    max_rows + (max_rows + TOPK_BLOCKS) * top_k_stride(crate::backend::TOP_K_MAX)
}

/// Writes, for each of the `rows` rows of `n` logits at `x`, its `k` most
/// likely tokens (by logit descending, the lower id first on a tie; see
/// `kernels/topk.cu`) and its statistics to `out`, [`top_k_stride`]`(k)`
/// u32 words per row. `k` is 1 to `min(n, TOP_K_MAX)`; `scratch` holds
/// [`top_k_scratch_words`]`(max_rows)` words, `rows ≤ max_rows`, its
/// tickets zeroed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_k(
    dev: &Device,
    x: DevPtr,
    n: usize,
    rows: usize,
    k: usize,
    scratch: DevPtr,
    max_rows: usize,
    out: DevPtr,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    if k == 0 || k > n || k > crate::backend::TOP_K_MAX || rows > max_rows {
        return Err(Error::Device(format!("top-k of {k} over {rows} rows of {n} (scratch for {max_rows})")));
    }
    let (ni, ki) = (to_i32(n, "logits")?, to_i32(k, "k")?);
    to_i32(rows * n, "logits")?;
    let (chunks, chunk) = top_k_chunks(n, rows);
    let chunk_i = to_i32(chunk, "top-k chunk")?;
    let count = scratch;
    let part = scratch + 4 * max_rows as u64;
    let cfg = LaunchConfig {
        grid_dim: (to_u32(chunks, "chunks")?, to_u32(rows, "rows")?, 1),
        block_dim: (TOPK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds rows·n floats, out rows·top_k_stride(k) u32 (the
    // caller's buffers); scratch holds top_k_scratch_words(max_rows) words:
    // rows ≤ max_rows tickets, then rows·chunks < rows + TOPK_BLOCKS lists
    // of top_k_stride(k) ≤ top_k_stride(TOP_K_MAX) words; k ≤ TOPK_MAX,
    // the kernel's shared arrays.
    unsafe {
        dev.launch_with(names::TOPK_ROWS, cfg, |b| {
            b.arg(&x).arg(&ni).arg(&ki).arg(&chunk_i).arg(&part).arg(&count).arg(&out);
        })
    }
}

/// Fills `out` with `rows` rows of `k` candidates from [`top_k`]'s output
/// words (`rows × top_k_stride(k)` of them).
pub(crate) fn unpack_top_k(words: &[u32], rows: usize, k: usize, out: &mut TopK) {
    let stride = top_k_stride(k);
    out.reset(rows, k);
    let (ids, logits, stats) = out.parts_mut();
    for (r, w) in words.chunks_exact(stride).take(rows).enumerate() {
        ids[r * k..(r + 1) * k].copy_from_slice(&w[..k]);
        for (dst, &bits) in logits[r * k..(r + 1) * k].iter_mut().zip(&w[k..2 * k]) {
            *dst = f32::from_bits(bits);
        }
        let nan = w[2 * k + 2];
        stats[r] = RowStats {
            max: f32::from_bits(w[2 * k]),
            log_sum_exp: f32::from_bits(w[2 * k + 1]),
            first_nan: (nan != u32::MAX).then_some(nan),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of `top_k`: chunks of a multiple of 4 that cover the row
    /// with none empty, and within the scratch that `top_k_scratch_words`
    /// sizes.
    #[test]
    fn top_k_chunks_cover_the_row_within_the_scratch() {
        for n in [1usize, 3, 4, 7, 4095, 4096, 4097, 32_000, 128_256, 262_144, 1 << 22] {
            for rows in [1usize, 2, 3, 7, 64, 255, 256, 257, 1000] {
                let (chunks, chunk) = top_k_chunks(n, rows);
                assert!(chunks >= 1 && chunk.is_multiple_of(4), "n {n}, rows {rows}");
                assert!(
                    chunks * chunk >= n && (chunks - 1) * chunk < n,
                    "n {n}, rows {rows}: a chunk empty or missing"
                );
                assert!(rows * chunks < rows + TOPK_BLOCKS, "n {n}, rows {rows}: {chunks} chunks");
                if n >= TOPK_CHUNK_MIN * 2 && rows == 1 {
                    assert!(chunks > 1, "n {n}: one row is split");
                }
            }
        }
    }
}
