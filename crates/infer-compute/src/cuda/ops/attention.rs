//! The q/k/v post-processing and attention launches: split-K, the
//! one-token decode kernels (staged, flat, TurboQuant), the tiled prefill.

use super::{quantize_q8, to_i32, to_u32};
use crate::cuda::device::Device;
use crate::cuda::kernels::{
    self, names, AttnArgs, AttnQkvArgs, DevPtr, QkvArgs, TqArgs, TqAttnArgs, TqDecodeArgs, ATTN_MAX_G, ATTN_SPLIT,
};
use crate::error::{Error, Result};

/// Launches the q/k/v post-processing (bias, q/k norm, RoPE, KV append).
pub(crate) fn qkv_post(dev: &Device, args: &QkvArgs) -> Result<()> {
    check_qkv_shape(args)?;
    let blocks = to_u32((args.n_head + args.n_kv) as usize, "heads")?;
    // 128 threads: QKV_THREADS in rope.cu, which the kernel indexes by.
    dev.launch(names::QKV_POST, (blocks, to_u32(args.n_tok as usize, "tokens")?, 1), 128, 0, args)
}

/// The q/k/v post-processing ([`qkv_post`]) and then [`attention`].
///
/// One token whose head dimension is 64, 128 or 256, with at most
/// [`ATTN_MAX_G`] query heads per kv head, runs all of it as one kernel
/// (`attn_decode_hd*`, attention_decode.cu, or the flat
/// `attn_decode_flat_hd*` when `flat`: see [`decode_flat`]), which needs `count`: `n_kv`
/// zeroed ints that it leaves zeroed. `CudaOptions::attn_decode` off
/// turns it off (to compare). Otherwise, for one token with several kv heads, the
/// post-processing runs inside the split kernel (`attn_split_qkv`), then
/// the combine. With a single kv head that fusion redid the
/// post-processing of every query head serially in each of its few blocks,
/// where `qkv_post` spreads it over a block per head: on the H200 it was
/// 3% faster on Gemma 3 4B (4 kv heads), 1% on Llama 1B (8), and 1–2%
/// slower on Gemma 3 270M and 1B (1). `CudaOptions::fuse_qkv` `Some(false)`
/// keeps them apart, `Some(true)` fuses whenever the shape allows (to
/// compare). With values stored rotated (`attn.v_rot`) the output is
/// rotated back before it is written or quantized.
pub(crate) fn qkv_attention(dev: &Device, qkv: &QkvArgs, attn: &AttnArgs, count: DevPtr, flat: bool) -> Result<()> {
    let (n_head, n_kv, hd) = (attn.n_head as usize, attn.n_kv as usize, attn.hd as usize);
    let one = attn.n_tok == 1 && qkv.n_tok == 1 && n_kv > 0 && n_head / n_kv <= ATTN_MAX_G;
    if let Some(l) = DecodeLaunch::of(attn, false, flat).filter(|_| one && count != 0 && dev.opts.attn_decode) {
        check_qkv_shape(qkv)?;
        check_attn_shape(n_head, n_kv, hd)?;
        let grid = (to_u32(n_kv, "kv heads")?, l.blocks(dev, attn, 1)?, 1);
        let args = AttnQkvArgs { at: *attn, qk: *qkv, count, slot: 0, k_stride: 0, v_stride: 0 };
        return dev.launch(l.kernel, grid, l.threads, l.smem, &args);
    }
    // Values stored rotated: these paths leave the output rotated and
    // unquantized, and attn_unrotate finishes it.
    let mut plain = *attn;
    if attn.v_rot != 0 {
        plain.oq = 0;
        plain.ods = 0;
    }
    let fuse = one && dev.opts.fuse_qkv.unwrap_or(n_kv >= 2);
    if !fuse {
        qkv_post(dev, qkv)?;
        attention(dev, &plain)?;
    } else {
        check_qkv_shape(qkv)?;
        check_attn_shape(n_head, n_kv, hd)?;
        let smem = ((ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + pv_reduce_len(hd).max(3 * hd)) * 4) as u32;
        let args = AttnQkvArgs { at: plain, qk: *qkv, count: 0, slot: 0, k_stride: 0, v_stride: 0 };
        let grid = (to_u32(n_kv, "kv heads")?, to_u32(attn.n_split as usize, "splits")?, 1);
        let k = if pv_reduce_len(hd) > 0 { names::ATTN_SPLIT_QKV_GRP } else { names::ATTN_SPLIT_QKV };
        dev.launch(k, grid, ATTN_THREADS as u32, smem, &args)?;
        combine(dev, &plain)?;
    }
    if attn.v_rot != 0 {
        attn_unrotate(dev, attn)?;
    }
    Ok(())
}

/// Whether the K or the V cache of `attn` (or both) is a TurboQuant one
/// (tq3, tq4): its spans run [`qkv_attention_tq`].
pub(crate) fn has_tq(attn: &AttnArgs) -> bool {
    [attn.kt, attn.vt].into_iter().any(is_tq)
}

/// Whether a cache type's code in the kernels is `KV_TQ3` or `KV_TQ4`
/// ([`crate::cuda::kv_pool::CacheLayout::code`]).
fn is_tq(code: i32) -> bool {
    code == 3 || code == 4
}

/// The q/k/v post-processing and attention of one span (of slot `slot`)
/// over a layer whose K or V cache (or both) is TurboQuant (tq_cache.cu):
/// `qkv_post` rotates q, k and v into the caches' bases and leaves the
/// span's k and v rows in place; `tq_centre` and `tq_encode` code them;
/// `attn_split_tq` and the combine attend, reading each row from where
/// tq_cache.cuh says; the output is rotated back (`tq_unrotate` for
/// TurboQuant values, [`attn_unrotate`] for rotated quantized ones) and
/// quantized for the output projection; then `tq_keep` moves the span's
/// last rows into the ring. A one-token span over two TurboQuant caches
/// is two launches: `qkv_post`, then `attn_decode_tq` (tq_decode.cu),
/// which codes the token's rows, attends in blocks of 256 positions and
/// merges them (its last block, by the tickets in `count`: `n_kv ·
/// ⌈G / 8⌉` zeroed counters). Every span and token count takes this path:
/// no batched decode kernel reads these caches.
pub(crate) fn qkv_attention_tq(dev: &Device, qkv: &QkvArgs, attn: &AttnArgs, slot: usize, count: DevPtr) -> Result<()> {
    let (n_head, n_kv, hd) = (attn.n_head as usize, attn.n_kv as usize, attn.hd as usize);
    check_qkv_shape(qkv)?;
    check_attn_shape(n_head, n_kv, hd)?;
    let n_tok = to_u32(qkv.n_tok as usize, "tokens")?;
    let kv = to_u32(n_kv, "kv heads")?;
    let tq = TqArgs {
        kc: qkv.kc,
        vc: qkv.vc,
        k: qkv.k,
        v: qkv.v,
        pos0: qkv.pos0,
        kt: qkv.kt,
        vt: qkv.vt,
        slot: to_i32(slot, "slot")?,
        n_tok: qkv.n_tok,
    };
    qkv_post(dev, qkv)?;
    let n_gc = (n_head / n_kv).div_ceil(ATTN_MAX_G);
    // Up to 4 query heads per block: the kernels that hold 4 heads' q and
    // sums in registers, else those of 8.
    let four = n_head / n_kv <= 4;
    let one = n_tok == 1;
    if one && is_tq(attn.kt) && is_tq(attn.vt) && dev.opts.attn_decode {
        // sq and sacc [8][hd], the logits [8][256], q . centre, the coded
        // weights and (m, s) [8] each.
        let smem =
            ((2 * ATTN_MAX_G * hd + ATTN_MAX_G * kernels::TQ_DECODE_SPLITS * ATTN_SPLIT + 4 * ATTN_MAX_G) * 4) as u32;
        let n_blk = (attn.n_split as usize).div_ceil(kernels::TQ_DECODE_SPLITS);
        let grid = (to_u32(n_kv * n_gc, "grid")?, to_u32(2 + n_blk, "blocks")?, 1);
        let k = if four { names::ATTN_DECODE_TQ } else { names::ATTN_DECODE_TQ_G8 };
        return dev.launch(k, grid, ATTN_THREADS as u32, smem, &TqDecodeArgs { at: *attn, tq, count });
    }
    if !one {
        dev.launch(names::TQ_CENTRE, (1, 1, 2), 128, 0, &tq)?;
    }
    dev.launch(names::TQ_ENCODE, (kv, n_tok, 2), 128, 0, &tq)?;
    // Values stored rotated: the output is quantized after the rotation back.
    let mut plain = *attn;
    if attn.v_rot != 0 {
        plain.oq = 0;
        plain.ods = 0;
    }
    let smem = ((2 * ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + 2 * ATTN_MAX_G) * 4) as u32;
    let grid = (to_u32(n_kv * n_gc, "grid")?, to_u32(attn.n_split as usize, "splits")?, n_tok);
    let k = if four { names::ATTN_SPLIT_TQ } else { names::ATTN_SPLIT_TQ_G8 };
    dev.launch(k, grid, ATTN_THREADS as u32, smem, &TqAttnArgs { at: plain, tq })?;
    combine(dev, &plain)?;
    if is_tq(attn.vt) {
        dev.launch(names::TQ_UNROTATE, (to_u32(n_head, "heads")?, n_tok, 1), 128, 0, &TqAttnArgs { at: *attn, tq })?;
    } else if attn.v_rot != 0 {
        attn_unrotate(dev, attn)?;
    }
    if !one {
        dev.launch(names::TQ_KEEP, (kv, n_tok, 2), 128, 0, &tq)?;
    }
    Ok(())
}

/// Most one-token steps of different sequences in one launch of the
/// batched decode attention ([`qkv_attention_batch`]): the partial sums and
/// tickets are sized for this many tokens.
pub(crate) const DECODE_BATCH_MAX: usize = 64;

/// Whether [`qkv_attention_batch`] runs the shape of `attn` (the kernel of
/// [`qkv_attention`]'s one-token path exists for it).
pub(crate) fn has_decode_batch(dev: &Device, attn: &AttnArgs) -> bool {
    let (n_head, n_kv) = (attn.n_head as usize, attn.n_kv as usize);
    DecodeLaunch::of(attn, true, false).is_some() && n_kv > 0 && n_head / n_kv <= ATTN_MAX_G && dev.opts.attn_decode
}

/// [`qkv_attention`] for `n_tok` one-token steps of different sequences in
/// one launch (`attn_decode_batch_hd*`, grid z over the tokens): `qkv` and
/// `attn` describe token 0 with `n_tok` = 1 (its rows, the caches of slot
/// 0, `pos0` the first of `n_tok` device positions); token `t` reads row
/// `t` of each activation, position `pos0[t]` and the caches at
/// `slot[t] · strides` bytes (K's, V's) from slot 0's. `count` holds `n_tok ·
/// n_kv` zeroed tickets, the partial sums room for `n_tok` tokens.
/// `flat` picks the flat kernel as in [`qkv_attention`].
///
/// # Errors
/// A shape without the kernel (check [`has_decode_batch`]), more than
/// [`DECODE_BATCH_MAX`] tokens, launch errors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_attention_batch(
    dev: &Device,
    qkv: &QkvArgs,
    attn: &AttnArgs,
    count: DevPtr,
    slot: DevPtr,
    strides: (usize, usize),
    n_tok: usize,
    flat: bool,
) -> Result<()> {
    let (n_kv, hd) = (attn.n_kv as usize, attn.hd as usize);
    let l = DecodeLaunch::of(attn, true, flat)
        .ok_or_else(|| Error::Device(format!("no batched decode attention for head_dim {hd}")))?;
    if !has_decode_batch(dev, attn) || n_tok == 0 || n_tok > DECODE_BATCH_MAX || count == 0 || slot == 0 {
        return Err(Error::Device(format!("batched decode attention of {n_tok} tokens does not apply here")));
    }
    check_qkv_shape(qkv)?;
    check_attn_shape(attn.n_head as usize, n_kv, hd)?;
    let grid = (to_u32(n_kv, "kv heads")?, l.blocks(dev, attn, n_tok)?, to_u32(n_tok, "tokens")?);
    let stride = |s: usize| i64::try_from(s).map_err(|_| Error::Overflow("KV pool slot stride"));
    let args =
        AttnQkvArgs { at: *attn, qk: *qkv, count, slot, k_stride: stride(strides.0)?, v_stride: stride(strides.1)? };
    dev.launch(l.kernel, grid, l.threads, l.smem, &args)
}

/// Query heads per kv head that the flat decode kernels take (`FLAT_G`
/// in attention_decode_flat.cu).
const FLAT_G: usize = 4;

/// Whether the one-launch decode attention of `attn` over `n_tok` one-token
/// steps (1 to [`DECODE_BATCH_MAX`]), the deepest at position `max_pos`,
/// runs the flat kernel: as `CudaOptions::attn_flat` says, and by default
/// for heads of 64 values where the staged kernel's blocks would each
/// stream two or more 32-position spans of the attended range (the last
/// `window` positions for a sliding-window layer). There the flat kernel,
/// which keeps its positions in registers without a barrier per span, was
/// faster (llama 1B); where a block takes one span the staged one was
/// (BENCHMARKS.md). Heads of 128 and 256 values (a position over 16 or 32
/// lanes) stay staged by default: not yet measured there.
pub(crate) fn decode_flat(dev: &Device, attn: &AttnArgs, n_tok: usize, max_pos: usize) -> bool {
    match dev.opts.attn_flat {
        Some(on) => on,
        None if attn.hd != 64 => false,
        None => {
            let Some(staged) = DecodeLaunch::of(attn, n_tok > 1, false) else { return false };
            let attended = match attn.window {
                w if w > 0 => (max_pos + 1).min(w as usize),
                _ => max_pos + 1,
            };
            staged.blocks(dev, attn, n_tok).is_ok_and(|b| attended.div_ceil(ATTN_SPLIT) > b as usize)
        }
    }
}

/// Threads of a flat decode block (`FLAT_THREADS`).
const FLAT_THREADS: usize = 256;

/// A one-launch decode attention kernel and its launch shape.
struct DecodeLaunch {
    kernel: kernels::KernelName,
    threads: u32,
    smem: u32,
    /// Threads of it that stay resident per multiprocessor (its registers).
    resident: usize,
}

impl DecodeLaunch {
    /// The kernel for `attn` (`batch`: the grid-z-over-tokens variant):
    /// the flat one (attention_decode_flat.cu) when `flat` (see
    /// [`decode_flat`]) and kv heads have at most [`FLAT_G`] query heads,
    /// else the staged one (attention_decode.cu); `None` for a head_dim
    /// without either (64, 128 and 256 have them).
    fn of(attn: &AttnArgs, batch: bool, flat: bool) -> Option<DecodeLaunch> {
        let hd = attn.hd as usize;
        let i = match hd {
            64 => 0,
            128 => 1,
            256 => 2,
            _ => return None,
        };
        let quant = quantized(attn);
        let g = (attn.n_head as usize).checked_div(attn.n_kv as usize).unwrap_or(usize::MAX);
        if flat && g <= FLAT_G {
            // attention_decode_flat.cu's smem: q [FLAT_G][hd], new k and v
            // [2][hd], rotation [hd], norm weights [2][hd], the block's and
            // the warps' (max, sum) [1 + warps][FLAT_G] as float2, the
            // warps' outputs [warps][FLAT_G][hd].
            let warps = FLAT_THREADS / 32;
            let floats = FLAT_G * hd + 5 * hd + 2 * (1 + warps) * FLAT_G + warps * FLAT_G * hd;
            return Some(DecodeLaunch {
                kernel: names::ATTN_DECODE_FLAT[(batch as usize * 2 + quant as usize) * 3 + i],
                threads: FLAT_THREADS as u32,
                smem: (floats * 4) as u32,
                // __launch_bounds__(FLAT_THREADS, 2).
                resident: 2 * FLAT_THREADS,
            });
        }
        let kernel = match (hd, quant, batch) {
            (64, false, false) => names::ATTN_DECODE_HD64,
            (128, false, false) => names::ATTN_DECODE_HD128,
            (256, false, false) => names::ATTN_DECODE_HD256,
            (64, true, false) => names::ATTN_DECODE_Q_HD64,
            (128, true, false) => names::ATTN_DECODE_Q_HD128,
            (256, true, false) => names::ATTN_DECODE_Q_HD256,
            (64, false, true) => names::ATTN_DECODE_BATCH_HD64,
            (128, false, true) => names::ATTN_DECODE_BATCH_HD128,
            (256, false, true) => names::ATTN_DECODE_BATCH_HD256,
            (64, true, true) => names::ATTN_DECODE_BATCH_Q_HD64,
            (128, true, true) => names::ATTN_DECODE_BATCH_Q_HD128,
            _ => names::ATTN_DECODE_BATCH_Q_HD256,
        };
        // attention_decode.cu's smem: q [G][hd], logits [G][span], new k
        // and v [2][hd], rotation [hd], (max, sum) [G] and rescale [G] of
        // the softmax, q and k norm weights [2][hd] as f32; values
        // [span][hd] as f16. Registers held to keep 1024 threads resident.
        let floats = ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + 5 * hd + 3 * ATTN_MAX_G;
        Some(DecodeLaunch {
            kernel,
            threads: decode_threads(hd),
            smem: (floats * 4 + ATTN_SPLIT * hd * 2) as u32,
            resident: 1024,
        })
    }

    /// Blocks per kv head (and token): the spans of the cache's capacity,
    /// at most
    /// [`CudaOptions::attn_decode_blocks`](crate::cuda::CudaOptions::attn_decode_blocks)
    /// or, by default, as many as stay resident over the whole device at
    /// once. Deeper than that many spans each block streams several
    /// (`decode_spans` in attention_decode.cu).
    fn blocks(&self, dev: &Device, attn: &AttnArgs, n_tok: usize) -> Result<u32> {
        let per_sm = (self.resident / self.threads as usize).max(1);
        let sms = dev.info.multiprocessors.max(1) as usize;
        let per_head = (attn.n_kv as usize * n_tok).max(1);
        let cap = dev.opts.attn_decode_blocks.unwrap_or_else(|| (per_sm * sms).div_ceil(per_head));
        to_u32(cap.clamp(1, (attn.n_split as usize).max(1)), "decode attention blocks")
    }
}

/// Whether the K or the V cache of `attn` is of a quantized type.
fn quantized(attn: &AttnArgs) -> bool {
    attn.kt != 0 || attn.vt != 0
}

/// Rotates the attention output of a value cache stored rotated back
/// (`args.v_rot`: `H/√n` on blocks of `n`, its own inverse) in place, rows
/// `args.out` of `n_head · hd` values for `args.n_tok` tokens, and writes
/// its q8 copy for the output projection when `args.oq` is set
/// (`attn_unrotate`, attention.cu): after the kernels of
/// [`qkv_attention`] that leave it rotated (the decode kernels rotate
/// their own output back).
pub(crate) fn attn_unrotate(dev: &Device, args: &AttnArgs) -> Result<()> {
    let hd = args.hd as usize;
    let n = args.v_rot as usize;
    if !n.is_power_of_two() || !hd.is_multiple_of(n) || !hd.is_multiple_of(32) || hd > kernels::QKV_MAX_HD {
        return Err(Error::Device(format!("no rotation of blocks of {n} in heads of {hd} values")));
    }
    let grid = (to_u32(args.n_head as usize, "heads")?, to_u32(args.n_tok as usize, "tokens")?, 1);
    dev.launch(names::ATTN_UNROTATE, grid, 128, 0, args)
}

/// Threads of an `attn_decode_hd*` block (`DECODE_THREADS` in
/// attention_decode.cu): four query heads' outputs at once.
fn decode_threads(hd: usize) -> u32 {
    (4 * hd).max(ATTN_THREADS) as u32
}

fn check_qkv_shape(args: &QkvArgs) -> Result<()> {
    if args.hd as usize > kernels::QKV_MAX_HD || args.n_rot > args.hd {
        return Err(Error::Device(format!(
            "head_dim {} (n_rot {}) exceeds the CUDA limit {}",
            args.hd,
            args.n_rot,
            kernels::QKV_MAX_HD
        )));
    }
    Ok(())
}

/// Threads of the split-K attention kernels (`ATTN_THREADS`).
const ATTN_THREADS: usize = 256;

/// Floats of the p·v reduction space of the split-K kernels for head
/// dimension `hd`: position groups of `hd` threads, one partial per group,
/// query head and dimension (attention.cu); 0 where the kernels without
/// groups (`attn_split`, `attn_split_qkv`) run, for `hd` ≥ 256.
fn pv_reduce_len(hd: usize) -> usize {
    let n_grp = if hd < ATTN_THREADS { ATTN_THREADS / hd } else { 1 };
    if n_grp > 1 {
        n_grp * ATTN_MAX_G * hd
    } else {
        0
    }
}

/// Splits needed for a cache of `n_ctx` positions.
pub(crate) fn attn_splits(n_ctx: usize) -> usize {
    n_ctx.div_ceil(ATTN_SPLIT).max(1)
}

/// Checks the attention kernels' shape assumptions.
pub(crate) fn check_attn_shape(n_head: usize, n_kv: usize, hd: usize) -> Result<()> {
    if !hd.is_multiple_of(8) || hd > kernels::QKV_MAX_HD || n_kv == 0 || !n_head.is_multiple_of(n_kv) {
        return Err(Error::UnsupportedModel(format!(
            "the CUDA attention needs head_dim a multiple of 8 and at most {} and n_head a multiple of n_head_kv (head_dim {hd}, heads {n_head}/{n_kv})",
            kernels::QKV_MAX_HD
        )));
    }
    Ok(())
}

/// Passes of at least this many tokens run attention as one tensor-core
/// kernel over tiles of queries (`attention_prefill.cu`) where the head
/// dimension has one (64, 96, 128, 256); shorter passes and other head
/// dimensions use the split-K kernels. `CudaOptions::flash` off turns the
/// tiled kernel off (to compare the two).
pub const FLASH_MIN_TOKENS: usize = 16;

/// Whether passes of [`FLASH_MIN_TOKENS`] or more tokens over heads of
/// `hd` values run the tiled kernel (and need no split-K partial sums).
pub(crate) fn has_flash(dev: &Device, hd: usize) -> bool {
    flash_kernel(hd).is_some() && dev.opts.flash
}

/// The tiled prefill kernel for head dimension `hd`, if there is one.
fn flash_kernel(hd: usize) -> Option<kernels::KernelName> {
    match hd {
        64 => Some(names::ATTN_PREFILL_HD64),
        96 => Some(names::ATTN_PREFILL_HD96),
        128 => Some(names::ATTN_PREFILL_HD128),
        256 => Some(names::ATTN_PREFILL_HD256),
        _ => None,
    }
}

/// Quantizes the attention output for the output projection (`args.oq`).
fn quantize_attn_out(dev: &Device, args: &AttnArgs) -> Result<()> {
    let q_dim = args.n_head as usize * args.hd as usize;
    if !q_dim.is_multiple_of(32) {
        return Err(Error::Device(format!("attention output of {q_dim} values cannot be quantized in chunks of 32")));
    }
    quantize_q8(dev, args.out, args.oq, args.ods, args.n_tok as usize * q_dim / 32)
}

/// Launches attention: the tiled tensor-core kernel for passes of at least
/// [`FLASH_MIN_TOKENS`] tokens, else split-K attention and the combine;
/// then the q8 quantization of the output when `args.oq` is set.
pub(crate) fn attention(dev: &Device, args: &AttnArgs) -> Result<()> {
    let (n_head, n_kv, hd) = (args.n_head as usize, args.n_kv as usize, args.hd as usize);
    check_attn_shape(n_head, n_kv, hd)?;
    let n_tok = args.n_tok as usize;
    if let Some(k) = flash_kernel(hd).filter(|_| n_tok >= FLASH_MIN_TOKENS && dev.opts.flash) {
        // 16 rows (token, head of the group) per warp; 4 warps per block
        // when that still gives about two blocks per SM, else 2.
        let rows = n_tok * (n_head / n_kv);
        let warps = if rows.div_ceil(64) * n_kv >= 256 { 4 } else { 2 };
        let grid = (to_u32(rows.div_ceil(16 * warps), "grid")?, to_u32(n_kv, "kv heads")?, 1);
        dev.launch(k, grid, 32 * warps as u32, 0, args)?;
        if args.oq != 0 {
            quantize_attn_out(dev, args)?;
        }
        return Ok(());
    }
    let g = n_head / n_kv;
    let n_gc = g.div_ceil(ATTN_MAX_G);
    let smem = ((ATTN_MAX_G * hd + ATTN_MAX_G * ATTN_SPLIT + pv_reduce_len(hd)) * 4) as u32;
    let n_tok = to_u32(n_tok, "tokens")?;
    dev.launch(
        if pv_reduce_len(hd) > 0 { names::ATTN_SPLIT_GRP } else { names::ATTN_SPLIT },
        (to_u32(n_kv * n_gc, "grid")?, to_u32(args.n_split as usize, "splits")?, n_tok),
        ATTN_THREADS as u32,
        smem,
        args,
    )?;
    combine(dev, args)
}

/// Merges the splits of [`attention`] (and quantizes the output when
/// `args.oq` is set).
fn combine(dev: &Device, args: &AttnArgs) -> Result<()> {
    let mut c = *args;
    if args.hd % 32 != 0 {
        c.oq = 0;
        c.ods = 0;
    }
    let grid = (to_u32(args.n_head as usize, "heads")?, to_u32(args.n_tok as usize, "tokens")?, 1);
    dev.launch(names::ATTN_COMBINE, grid, 128, 0, &c)?;
    if args.hd % 32 != 0 && args.oq != 0 {
        quantize_attn_out(dev, args)?;
    }
    Ok(())
}
