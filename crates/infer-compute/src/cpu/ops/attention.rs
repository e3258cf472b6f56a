//! Scaled dot-product attention over a KV cache (Vaswani et al. 2017),
//! with grouped-query attention (Ainslie et al. 2023), sliding windows
//! (Beltagy et al. 2020; Gemma 2/3 local layers) and logit soft-capping
//! (Gemma 2).
//!
//! For query head `h` at position `pos`, with kv head `g = h / (n_head / n_head_kv)`:
//!
//! ```text
//! J      = { j : j <= pos, and pos - j < window if a window is set }
//! l_j    = scale · (q_h · k[j, g])                     j ∈ J
//! l_j    ← c · tanh(l_j / c)                            if softcap c is set
//! p      = softmax(l)  over J (positions outside J have probability exactly 0)
//! out_h  = Σ_{j ∈ J} p_j · v[j, g]
//! ```
//!
//! This is llama.cpp's non-flash attention graph (`mul_mat(k, q)`,
//! soft-capping, `soft_max_ext` with the causal / sliding-window `-inf`
//! mask, `mul_mat(v, kq)`), except that the scale is applied before the cap
//! as in the Gemma 2 reference (llama.cpp folds Gemma's scale into `q`
//! beforehand, which is the same thing). Masked positions are not computed
//! at all rather than set to `-inf`, so they cannot leak through the cap
//! and cost nothing.
//!
//! Cache layout (both caches): `[n_ctx, n_head_kv, head_dim]`, position-major;
//! one position is `kv_dim = n_head_kv · head_dim` contiguous values of the
//! cache's [`crate::KvCacheType`] (see [`KvData`]). An f32 cache is read in
//! place; any other type is read a head row at a time, converted exactly to
//! f32 into a buffer on the stack ([`KvData::to_f32`]), and that row then
//! goes through the same f32 code: the cache is streamed once per head, and
//! a cache of another type gives the bits an f32 cache holding the same
//! (converted) values gives (for `head_dim <= 512`; longer heads dot in
//! chunks of 512). This is llama.cpp's flash-attention CPU path
//! (`ggml_compute_forward_flash_attn_ext_f16`: `v_to_float` of each V row,
//! `ggml_vec_mad_f32`), except that K rows are converted too instead of the
//! query being quantized to K's `vec_dot_type`, which keeps the query exact.
//!
//! The q·k dot and the p·v accumulation are written to vectorize (16
//! accumulators in the dot, four cache rows per pass in p·v).

#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::env_allows_x86;
use crate::cpu::team::Par;

use super::dot;
use super::softmax::softmax;
use crate::cpu::kv_cache::KvData;
use crate::pipeline::LayerSpec;

/// Shape and options of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; divides `n_head` (GQA group size `n_head / n_head_kv`).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Multiplier of `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// `c` of the logit cap `c · tanh(l / c)`; `None` for no cap.
    pub softcap: Option<f32>,
    /// Attend only to the last `w` positions, the current one included
    /// (`pos - j < w`); `None` for global causal attention. `Some(0)` is invalid.
    pub window: Option<usize>,
}

impl AttnParams {
    /// The attention parameters of a layer of the pipeline description.
    pub fn from_layer(l: &LayerSpec) -> Self {
        AttnParams {
            n_head: l.n_head,
            n_head_kv: l.n_head_kv,
            head_dim: l.head_dim,
            scale: l.attn_scale,
            softcap: l.attn_softcap,
            window: l.sliding_window,
        }
    }

    /// Values per cache position: `n_head_kv · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Values per query token: `n_head · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// First position attended by a query at `pos`: `pos + 1 - window`
    /// (saturating), or 0 without a window.
    pub fn first_pos(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Number of positions attended by a query at `pos`: `min(pos + 1, window)`.
    pub fn n_attended(&self, pos: usize) -> usize {
        pos + 1 - self.first_pos(pos)
    }

    fn debug_check(&self) {
        debug_assert!(self.n_head > 0 && self.n_head_kv > 0 && self.head_dim > 0);
        debug_assert!(self.n_head.is_multiple_of(self.n_head_kv), "n_head must be a multiple of n_head_kv");
        debug_assert!(self.window != Some(0), "window of 0");
        debug_assert!(self.softcap.is_none_or(|c| c > 0.0), "softcap must be positive");
    }
}

/// Scratch floats [`attention_decode`] needs at position `pos`:
/// `n_head · min(pos + 1, window)`. `n_head · n_ctx` always suffices.
pub fn attention_scratch_len(pos: usize, p: &AttnParams) -> usize {
    p.n_head * p.n_attended(pos)
}

/// Below this many multiply-adds (`n_head · n_attended · head_dim`) decode
/// attention runs on the calling thread; above, heads run on rayon.
const PAR_MIN_WORK: usize = 1 << 16;

/// Logits of one head: `scores[j - first] = cap(scale · q_h · k[j, g])` for
/// `j` in `first..=pos`.
#[inline(always)]
fn head_logits<const W: u8>(
    qh: &[f32],
    k_cache: KvData<'_>,
    g: usize,
    first: usize,
    p: &AttnParams,
    scores: &mut [f32],
) {
    let (hd, stride) = (p.head_dim, p.kv_dim());
    if let KvData::F32(k_cache) = k_cache {
        for (s, j) in scores.iter_mut().zip(first..) {
            let k = &k_cache[j * stride + g * hd..][..hd];
            *s = p.scale * dot_any::<W>(qh, k);
        }
    } else {
        let mut buf = [0.0f32; ROW_CHUNK];
        for (s, j) in scores.iter_mut().zip(first..) {
            let mut d = 0.0f32;
            for c in (0..hd).step_by(ROW_CHUNK) {
                let n = ROW_CHUNK.min(hd - c);
                k_cache.to_f32(j * stride + g * hd + c, &mut buf[..n]);
                d += dot_any::<W>(&qh[c..c + n], &buf[..n]);
            }
            *s = p.scale * d;
        }
    }
    if let Some(c) = p.softcap {
        let inv = 1.0 / c;
        for s in scores.iter_mut() {
            *s = c * (*s * inv).tanh();
        }
    }
}

/// Values of a head row converted at a time by [`head_logits`] and
/// [`head_pv`] for a cache that is not f32 (a stack buffer).
const ROW_CHUNK: usize = 512;

/// `out = Σ_j probs[j - first] · v[j, g]`, four cache rows per pass. A
/// cache that is not f32 is converted four rows at a time, in column
/// chunks of [`ROW_CHUNK`] (columns are independent, so the chunking does
/// not change a bit).
#[inline(always)]
fn head_pv(probs: &[f32], v_cache: KvData<'_>, g: usize, first: usize, p: &AttnParams, out: &mut [f32]) {
    let (hd, stride) = (p.head_dim, p.kv_dim());
    if let KvData::F32(v_cache) = v_cache {
        let row = |j: usize| &v_cache[j * stride + g * hd..][..hd];
        pv_rows(probs, first, out, row);
        return;
    }
    let mut buf = [[0.0f32; ROW_CHUNK]; 4];
    for c in (0..hd).step_by(ROW_CHUNK) {
        let n = ROW_CHUNK.min(hd - c);
        let out = &mut out[c..c + n];
        out.fill(0.0);
        let mut quads = probs.chunks_exact(4);
        let mut j = first;
        for w in &mut quads {
            for (r, b) in buf.iter_mut().enumerate() {
                v_cache.to_f32((j + r) * stride + g * hd + c, &mut b[..n]);
            }
            acc4(out, w, [&buf[0][..n], &buf[1][..n], &buf[2][..n], &buf[3][..n]]);
            j += 4;
        }
        for &w in quads.remainder() {
            v_cache.to_f32(j * stride + g * hd + c, &mut buf[0][..n]);
            acc1(out, w, &buf[0][..n]);
            j += 1;
        }
    }
}

/// [`head_pv`] over f32 rows `row(j)`.
#[inline(always)]
fn pv_rows<'a>(probs: &[f32], first: usize, out: &mut [f32], row: impl Fn(usize) -> &'a [f32]) {
    out.fill(0.0);
    let mut quads = probs.chunks_exact(4);
    let mut j = first;
    for w in &mut quads {
        acc4(out, w, [row(j), row(j + 1), row(j + 2), row(j + 3)]);
        j += 4;
    }
    for &w in quads.remainder() {
        acc1(out, w, row(j));
        j += 1;
    }
}

/// `out += w[0]·v[0] + w[1]·v[1] + w[2]·v[2] + w[3]·v[3]`.
#[inline(always)]
fn acc4(out: &mut [f32], w: &[f32], v: [&[f32]; 4]) {
    for ((((o, &a), &b), &c), &d) in out.iter_mut().zip(v[0]).zip(v[1]).zip(v[2]).zip(v[3]) {
        *o += w[0] * a + w[1] * b + w[2] * c + w[3] * d;
    }
}

/// `out += w · v`.
#[inline(always)]
fn acc1(out: &mut [f32], w: f32, v: &[f32]) {
    for (o, &a) in out.iter_mut().zip(v) {
        *o += w * a;
    }
}

/// One query head at `pos`: logits, softmax, p·v. `scores` holds exactly
/// `n_attended(pos)` floats. The single code path behind decode and prefill.
///
/// On x86-64 processors with AVX-512 or AVX2 the same Rust code is compiled
/// again with those instructions enabled and chosen at run time. Rust neither
/// reassociates nor contracts f32 arithmetic, so both builds give the same
/// bits; the wide one is faster.
#[inline]
#[allow(clippy::too_many_arguments)]
fn attend_head(
    qh: &[f32],
    k_cache: KvData<'_>,
    v_cache: KvData<'_>,
    h: usize,
    pos: usize,
    p: &AttnParams,
    scores: &mut [f32],
    out_h: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && env_allows_x86(true) {
        // SAFETY: the processor supports AVX-512 F, the only feature the
        // function enables.
        unsafe { attend_head_avx512(qh, k_cache, v_cache, h, pos, p, scores, out_h) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && env_allows_x86(false) {
        // SAFETY: the processor supports AVX2, the only feature the
        // function enables.
        unsafe { attend_head_avx2(qh, k_cache, v_cache, h, pos, p, scores, out_h) };
        return;
    }
    attend_head_portable::<PORTABLE>(qh, k_cache, v_cache, h, pos, p, scores, out_h);
}

/// [`attend_head_portable`] compiled with AVX2 (8-wide vectors; no FMA, so
/// the arithmetic is the portable build's).
///
/// # Safety
/// The processor must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_head_avx2(
    qh: &[f32],
    k_cache: KvData<'_>,
    v_cache: KvData<'_>,
    h: usize,
    pos: usize,
    p: &AttnParams,
    scores: &mut [f32],
    out_h: &mut [f32],
) {
    attend_head_portable::<AVX2>(qh, k_cache, v_cache, h, pos, p, scores, out_h);
}

/// [`attend_head_portable`] compiled with AVX-512 F.
///
/// # Safety
/// The processor must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_head_avx512(
    qh: &[f32],
    k_cache: KvData<'_>,
    v_cache: KvData<'_>,
    h: usize,
    pos: usize,
    p: &AttnParams,
    scores: &mut [f32],
    out_h: &mut [f32],
) {
    attend_head_portable::<AVX512>(qh, k_cache, v_cache, h, pos, p, scores, out_h);
}

/// Builds of the per-head code (`W`): portable, AVX2, AVX-512.
pub(super) const PORTABLE: u8 = 0;
pub(super) const AVX2: u8 = 1;
pub(super) const AVX512: u8 = 2;

/// [`dot`], or its AVX2 or AVX-512 form (`W`: only inside
/// [`attend_head_avx2`] and [`attend_head_avx512`]), which give the same bits.
#[inline(always)]
fn dot_any<const W: u8>(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match W {
        // SAFETY: `AVX512` is set only by `attend_head_avx512`, which runs
        // only where AVX-512 F is available.
        AVX512 => return unsafe { super::dot_avx512(a, b) },
        // SAFETY: `AVX2` is set only by `attend_head_avx2`, which runs only
        // where AVX2 is available.
        AVX2 => return unsafe { super::dot_avx2(a, b) },
        _ => {}
    }
    dot(a, b)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_head_portable<const W: u8>(
    qh: &[f32],
    k_cache: KvData<'_>,
    v_cache: KvData<'_>,
    h: usize,
    pos: usize,
    p: &AttnParams,
    scores: &mut [f32],
    out_h: &mut [f32],
) {
    let g = h / (p.n_head / p.n_head_kv);
    let first = p.first_pos(pos);
    debug_assert_eq!(scores.len(), pos + 1 - first);
    head_logits::<W>(qh, k_cache, g, first, p, scores);
    softmax(scores);
    head_pv(scores, v_cache, g, first, p, out_h);
}

fn debug_check_cache(k_cache: KvData<'_>, v_cache: KvData<'_>, last_pos: usize, p: &AttnParams) {
    let kv = p.kv_dim();
    debug_assert_eq!(k_cache.len() % kv, 0, "k_cache must be [n_ctx, n_head_kv, head_dim]");
    debug_assert_eq!(v_cache.len(), k_cache.len(), "k and v caches differ in size");
    debug_assert!(k_cache.len() >= (last_pos + 1) * kv, "position {last_pos} is past the cache");
    let _ = (k_cache, v_cache, last_pos, kv);
}

/// Decode attention: one query position `pos` against the cached positions
/// `0..=pos` (restricted to the window, if any).
///
/// Shapes: `q`, `out`: `[n_head, head_dim]`; `k_cache`, `v_cache`:
/// `[n_ctx, n_head_kv, head_dim]` position-major f32 (the entry at `pos`
/// already appended); `scratch`: at least [`attention_scratch_len`]`(pos, p)`
/// floats (`n_head · n_ctx` always suffices), overwritten. Query head `h`
/// reads kv head `h / (n_head / n_head_kv)`. See the module docs for the
/// formula. Does not allocate; heads run in parallel on rayon when the
/// context is long enough to pay for it (results do not depend on it).
///
/// Contract (debug-asserted): `n_head % n_head_kv == 0`; `q.len() == out.len()
/// == n_head · head_dim`; both caches are `n_ctx · kv_dim` long with `pos < n_ctx`;
/// `scratch` as above; `window != Some(0)`; `softcap > 0`.
pub fn attention_decode(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos: usize,
    p: &AttnParams,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    attention_decode_on(Par::Rayon, q, KvData::F32(k_cache), KvData::F32(v_cache), pos, p, scratch, out)
}

/// Work below which a loop on `par` is not worth splitting: rayon wakes
/// sleeping threads, a [`crate::cpu::team::Team`] finds them spinning.
fn par_min_work(par: Par<'_>) -> usize {
    match par {
        Par::Rayon => PAR_MIN_WORK,
        Par::Team(_) => PAR_MIN_WORK / 8,
    }
}

/// [`attention_decode`] over caches of any [`crate::KvCacheType`], with its
/// heads run on `par`.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_on(
    par: Par<'_>,
    q: &[f32],
    k_cache: KvData<'_>,
    v_cache: KvData<'_>,
    pos: usize,
    p: &AttnParams,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    p.debug_check();
    debug_check_cache(k_cache, v_cache, pos, p);
    debug_assert_eq!(q.len(), p.q_dim());
    debug_assert_eq!(out.len(), p.q_dim());
    let n_att = p.n_attended(pos);
    debug_assert!(scratch.len() >= p.n_head * n_att, "scratch too small");
    let hd = p.head_dim;
    let scratch = &mut scratch[..p.n_head * n_att];
    let work = |h: usize, out_h: &mut [f32], sc: &mut [f32]| {
        attend_head(&q[h * hd..][..hd], k_cache, v_cache, h, pos, p, sc, out_h);
    };
    if p.n_head > 1 && p.n_head * n_att * hd >= par_min_work(par) {
        par.for_each_chunk_pair_mut(out, hd, scratch, n_att, work);
    } else {
        for (h, (out_h, sc)) in out.chunks_mut(hd).zip(scratch.chunks_mut(n_att)).enumerate() {
            work(h, out_h, sc);
        }
    }
}

/// Prefill attention: `n_tokens` queries at positions `pos0..pos0 + n_tokens`,
/// each causal over the cache (which already holds these tokens' k/v) and
/// restricted to its window: [`attention_decode`] per position, to rounding.
/// Long chunks and chunks deep in the cache ([`super::attn_tiled::runs_tiled`])
/// run the tiled kernel ([`super::attention_tiled_on`]), others the
/// per-token code, parallel over (token, head) on rayon.
///
/// Shapes: `q`, `out`: `[n_tokens, n_head, head_dim]`; caches as in
/// [`attention_decode`]. Allocates scratch per parallel task.
///
/// Contract (debug-asserted): as [`attention_decode`] with
/// `pos0 + n_tokens <= n_ctx`, and `q.len() == out.len() == n_tokens · n_head · head_dim`.
pub fn attention_prefill(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    n_tokens: usize,
    p: &AttnParams,
    out: &mut [f32],
) {
    attention_prefill_on(Par::Rayon, q, k_cache, v_cache, pos0, n_tokens, p, out)
}

/// [`attention_prefill`] with its tasks run on `par`.
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill_on(
    par: Par<'_>,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    n_tokens: usize,
    p: &AttnParams,
    out: &mut [f32],
) {
    let (k, v) = (KvData::F32(k_cache), KvData::F32(v_cache));
    if super::attn_tiled::runs_tiled(p, pos0, n_tokens) {
        super::attention_tiled_on(par, q, k, v, pos0, n_tokens, p, out);
        return;
    }
    let pos: Vec<usize> = (pos0..pos0 + n_tokens).collect();
    let slot = vec![0; n_tokens];
    attention_batch_on(par, q, k, v, k_cache.len(), &slot, &pos, p, out);
}

/// Attention of a batch of tokens of several sequences (a
/// [`crate::backend::Batch`]): token `t` at position `pos[t]` attends over
/// the cache of its slot, `slot[t]`, causally and inside its window.
/// Exactly [`attention_decode`] per token (the same per-head code, so the
/// same bits), parallel over (token, head) on `par`; for a cache that is
/// not f32 (`head_dim` ≤ 512, every token at most 4096 positions deep),
/// parallel over tokens, each converting a kv head's attended rows once
/// for the query heads of its group (the same bits: a cache of type T
/// gives those of an f32 cache holding T's converted values).
///
/// Shapes: `q`, `out`: `[n_tokens, n_head, head_dim]`; `k_pool`, `v_pool`:
/// `[n_slots][slot_len]` values of any [`crate::KvCacheType`], each slot a
/// cache as in [`attention_decode`]
/// (`slot_len = n_ctx · kv_dim` values, the entries at each token's position
/// already appended). Allocates one score row (`≤ n_ctx` floats) per
/// parallel task of an f32 cache; other caches use per-thread buffers kept
/// between calls.
///
/// Contract (debug-asserted): as [`attention_decode`] for each token's
/// slot; `slot.len() == pos.len() == n_tokens`.
#[allow(clippy::too_many_arguments)]
pub fn attention_batch_on(
    par: Par<'_>,
    q: &[f32],
    k_pool: KvData<'_>,
    v_pool: KvData<'_>,
    slot_len: usize,
    slot: &[usize],
    pos: &[usize],
    p: &AttnParams,
    out: &mut [f32],
) {
    p.debug_check();
    let n_tokens = pos.len();
    debug_assert_eq!(slot.len(), n_tokens);
    debug_assert_eq!(q.len(), n_tokens * p.q_dim());
    debug_assert_eq!(out.len(), n_tokens * p.q_dim());
    if n_tokens == 0 {
        return;
    }
    let cache = |t: usize| (k_pool.sub(slot[t] * slot_len, slot_len), v_pool.sub(slot[t] * slot_len, slot_len));
    for t in 0..n_tokens {
        let (k, v) = cache(t);
        debug_check_cache(k, v, pos[t], p);
    }
    let hd = p.head_dim;
    let shallow = pos.iter().all(|&j| p.n_attended(j) <= CONVERT_MAX_ROWS);
    if !matches!(k_pool, KvData::F32(_)) && hd <= ROW_CHUNK && shallow {
        batch_converted(par, q, (k_pool, v_pool), slot_len, (slot, pos), p, out);
        return;
    }
    // Group small tasks so that each carries some work.
    let avg = pos.iter().map(|&j| p.n_attended(j)).sum::<usize>() / n_tokens * hd;
    let per_task = (PAR_MIN_WORK / 4 / avg.max(1)).max(1);
    par.for_each_chunk_mut(out, per_task * hd, |task, outs| {
        let mut scores = Vec::new();
        for (k, out_h) in outs.chunks_mut(hd).enumerate() {
            let i = task * per_task + k;
            let (t, h) = (i / p.n_head, i % p.n_head);
            let (kc, vc) = cache(t);
            scores.resize(p.n_attended(pos[t]), 0.0);
            attend_head(&q[i * hd..][..hd], kc, vc, h, pos[t], p, &mut scores, out_h);
        }
    });
}

/// Attended positions up to which [`attention_batch_on`] converts a token's
/// rows into per-thread buffers (`2 · rows · head_dim` floats, kept between
/// calls); the model's batches reach it only under 256.
const CONVERT_MAX_ROWS: usize = 4096;

thread_local! {
    /// [`batch_converted`]'s per-thread buffers: one kv head's attended
    /// keys and values as f32, and a score row.
    static CONVERTED: std::cell::RefCell<[Vec<f32>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// [`attention_batch_on`] over a cache that is not f32: one task per
/// token, which converts each kv head's attended rows (keys and values)
/// to f32 once, then runs the per-head code of each query head of the
/// group over them as an f32 cache of one kv head, positions renumbered
/// from the window's first. A cache of type T gives the bits an f32 cache
/// holding T's converted values gives (the module's rule; with rows of at
/// most [`ROW_CHUNK`] values the dot products are not chunked either), so
/// these are [`attention_decode`]'s bits, where the (token, head) tasks
/// converted each kv head's rows once per query head: for Gemma 3 (four
/// query heads per kv head) four times.
fn batch_converted(
    par: Par<'_>,
    q: &[f32],
    (k_pool, v_pool): (KvData<'_>, KvData<'_>),
    slot_len: usize,
    (slot, pos): (&[usize], &[usize]),
    p: &AttnParams,
    out: &mut [f32],
) {
    let (hd, qd, kvd) = (p.head_dim, p.q_dim(), p.kv_dim());
    let group = p.n_head / p.n_head_kv;
    // One kv head: query head `h` of a group reads kv head 0.
    let one = AttnParams { n_head: group, n_head_kv: 1, ..*p };
    let task = |t: usize, out_t: &mut [f32], bufs: &mut [Vec<f32>; 3]| {
        let (kc, vc) = (k_pool.sub(slot[t] * slot_len, slot_len), v_pool.sub(slot[t] * slot_len, slot_len));
        let first = p.first_pos(pos[t]);
        let n = pos[t] + 1 - first;
        let [kb, vb, scores] = bufs;
        for b in [&mut *kb, &mut *vb] {
            b.resize(n * hd, 0.0);
        }
        scores.resize(n, 0.0);
        for g in 0..p.n_head_kv {
            for j in 0..n {
                let at = (first + j) * kvd + g * hd;
                kc.to_f32(at, &mut kb[j * hd..][..hd]);
                vc.to_f32(at, &mut vb[j * hd..][..hd]);
            }
            for hl in 0..group {
                let h = g * group + hl;
                let qh = &q[t * qd + h * hd..][..hd];
                let oh = &mut out_t[h * hd..][..hd];
                attend_head(qh, KvData::F32(kb), KvData::F32(vb), hl, n - 1, &one, scores, oh);
            }
        }
    };
    par.for_each_chunk_mut(out, qd, |t, out_t| {
        CONVERTED.with(|c| match c.try_borrow_mut() {
            Ok(mut bufs) => task(t, out_t, &mut bufs),
            Err(_) => task(t, out_t, &mut Default::default()),
        })
    });
}

/// The attention probabilities of one decode step, for inspection and
/// tests: `probs: [n_head, pos + 1]`, `probs[h][j]` = weight of position `j`
/// for head `h`, exactly 0 for positions outside the window. Same arithmetic
/// as [`attention_decode`].
///
/// Contract (debug-asserted): as [`attention_decode`]; `probs.len() == n_head · (pos + 1)`.
pub fn attention_probs(q: &[f32], k_cache: &[f32], pos: usize, p: &AttnParams, probs: &mut [f32]) {
    let k_cache = KvData::F32(k_cache);
    p.debug_check();
    debug_check_cache(k_cache, k_cache, pos, p);
    debug_assert_eq!(q.len(), p.q_dim());
    debug_assert_eq!(probs.len(), p.n_head * (pos + 1));
    let hd = p.head_dim;
    let first = p.first_pos(pos);
    for (h, row) in probs.chunks_exact_mut(pos + 1).enumerate() {
        let g = h / (p.n_head / p.n_head_kv);
        row[..first].fill(0.0);
        let scores = &mut row[first..];
        head_logits::<PORTABLE>(&q[h * hd..][..hd], k_cache, g, first, p, scores);
        softmax(scores);
    }
}

/// KV-cache append: copies `k`, `v` (`[kv_dim]` = `[n_head_kv, head_dim]`)
/// into position `pos` of `k_cache`, `v_cache` (`[n_ctx, kv_dim]`).
///
/// Contract (debug-asserted): `k.len() == v.len() == kv_dim`; both caches
/// hold at least `(pos + 1) · kv_dim` values.
pub fn kv_append(k_cache: &mut [f32], v_cache: &mut [f32], k: &[f32], v: &[f32], pos: usize, kv_dim: usize) {
    debug_assert_eq!(k.len(), kv_dim);
    debug_assert_eq!(v.len(), kv_dim);
    debug_assert!(
        k_cache.len() >= (pos + 1) * kv_dim && v_cache.len() >= (pos + 1) * kv_dim,
        "position {pos} is past the cache"
    );
    let r = pos * kv_dim..(pos + 1) * kv_dim;
    k_cache[r.clone()].copy_from_slice(k);
    v_cache[r].copy_from_slice(v);
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    /// Random q and caches of `n_ctx` positions.
    fn data(seed: u64, n_ctx: usize, p: &AttnParams) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (
            rand_vec(seed, p.q_dim(), 2.0),
            rand_vec(seed + 1, n_ctx * p.kv_dim(), 2.0),
            rand_vec(seed + 2, n_ctx * p.kv_dim(), 1.0),
        )
    }

    fn decode(q: &[f32], kc: &[f32], vc: &[f32], pos: usize, p: &AttnParams) -> Vec<f32> {
        let mut scratch = vec![f32::NAN; attention_scratch_len(pos, p)];
        let mut out = vec![f32::NAN; p.q_dim()];
        attention_decode(q, kc, vc, pos, p, &mut scratch, &mut out);
        out
    }

    #[test]
    fn a_batch_over_an_f16_pool_gives_each_token_its_decode_bits() {
        // Tokens of three slots at positions inside and past the window,
        // softcap on: `batch_converted` (rows converted once per kv head,
        // positions renumbered from the window's first) against each
        // token's own decode over its slot; f32 for the (token, head) path.
        let (n_ctx, n_slots) = (40, 3);
        let cases =
            [params(8, 2, 64, Some(30.0), Some(7)), params(4, 1, 256, None, None), params(9, 3, 40, None, Some(3))];
        let (slot, pos) = ([0usize, 2, 1, 2, 0], [0usize, 3, 6, 39, 17]);
        for (k, p) in cases.iter().enumerate() {
            let slot_len = n_ctx * p.kv_dim();
            let kf = rand_vec(70 + k as u64, n_slots * slot_len, 2.0);
            let vf = rand_vec(80 + k as u64, n_slots * slot_len, 1.0);
            let q = rand_vec(90 + k as u64, pos.len() * p.q_dim(), 2.0);
            let (kh, vh): (Vec<half::f16>, Vec<half::f16>) = (
                kf.iter().map(|&x| half::f16::from_f32(x)).collect(),
                vf.iter().map(|&x| half::f16::from_f32(x)).collect(),
            );
            for (kp, vp) in [(KvData::F16(&kh), KvData::F16(&vh)), (KvData::F32(&kf), KvData::F32(&vf))] {
                let mut got = vec![f32::NAN; pos.len() * p.q_dim()];
                attention_batch_on(Par::Rayon, &q, kp, vp, slot_len, &slot, &pos, p, &mut got);
                for t in 0..pos.len() {
                    let (kc, vc) = (kp.sub(slot[t] * slot_len, slot_len), vp.sub(slot[t] * slot_len, slot_len));
                    let mut scratch = vec![f32::NAN; attention_scratch_len(pos[t], p)];
                    let mut want = vec![f32::NAN; p.q_dim()];
                    let qt = &q[t * p.q_dim()..][..p.q_dim()];
                    attention_decode_on(Par::Rayon, qt, kc, vc, pos[t], p, &mut scratch, &mut want);
                    let g = &got[t * p.q_dim()..][..p.q_dim()];
                    assert!(
                        g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "case {k} token {t}: {g:?} vs {want:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn decode_matches_f64() {
        let shapes = [(4, 1, 64), (8, 2, 7), (6, 6, 80)];
        let opts = [(None, None), (Some(50.0), None), (None, Some(5)), (Some(1.0), Some(512))];
        let mut seed = 0;
        for &n in &LENS {
            let pos = n - 1;
            for &(nh, nkv, hd) in &shapes {
                for &(cap, win) in &opts {
                    seed += 10;
                    let p = params(nh, nkv, hd, cap, win);
                    // A cache one position longer than needed: the extra
                    // (future) position must be ignored.
                    let (q, kc, vc) = data(seed, n + 1, &p);
                    let out = decode(&q, &kc, &vc, pos, &p);
                    let (want_p, want) = attn_ref(&q, &kc, &vc, pos, &p);
                    let what = format!("decode pos={pos} {p:?}");
                    assert_close(&what, &out, &want, 1e-5, 1e-6);
                    let mut probs = vec![f32::NAN; nh * (pos + 1)];
                    attention_probs(&q, &kc, pos, &p, &mut probs);
                    assert_close(&format!("probs {what}"), &probs, &want_p, 1e-5, 1e-12);
                }
            }
        }
    }

    #[test]
    fn gqa_maps_query_heads_to_groups() {
        // 8 query heads over 2 kv heads: heads 0..4 read kv head 0, 4..8 kv
        // head 1 (not h % n_head_kv). v is constant per kv head, so each
        // output is that constant exactly when the mapping is right.
        let p = params(8, 2, 16, None, None);
        let n_ctx = 7;
        let (q, kc, _) = data(3, n_ctx, &p);
        let mut vc = vec![0.0f32; n_ctx * p.kv_dim()];
        for j in 0..n_ctx {
            for g in 0..2 {
                vc[j * p.kv_dim() + g * 16..][..16].fill(10.0 * (g + 1) as f32);
            }
        }
        let out = decode(&q, &kc, &vc, n_ctx - 1, &p);
        for h in 0..8 {
            let want = if h < 4 { 10.0 } else { 20.0 };
            for &o in &out[h * 16..(h + 1) * 16] {
                assert!((o - want).abs() <= 1e-5 * want, "head {h}: {o} vs {want}");
            }
        }
        // Heads of one group with the same query are identical.
        let mut q2 = q.clone();
        for h in 1..4 {
            q2.copy_within(0..16, h * 16);
        }
        let out = decode(&q2, &kc, &vc, n_ctx - 1, &p);
        let (_, want) = attn_ref(&q2, &kc, &vc, n_ctx - 1, &p);
        assert_close("gqa", &out, &want, 1e-5, 1e-6);
        for h in 1..4 {
            assert_eq!(out[..16], out[h * 16..(h + 1) * 16]);
        }
    }

    #[test]
    fn sliding_window_ignores_old_positions() {
        for w in [1usize, 3, 640] {
            let p = params(4, 2, 8, Some(30.0), Some(w));
            let n_ctx = 1000;
            let pos = 999;
            let (q, mut kc, mut vc) = data(40, n_ctx, &p);
            let before = decode(&q, &kc, &vc, pos, &p);
            // Poison every position outside the window with NaN: the result
            // must not change by a single bit.
            let kvd = p.kv_dim();
            for j in 0..=pos - w {
                kc[j * kvd..(j + 1) * kvd].fill(f32::NAN);
                vc[j * kvd..(j + 1) * kvd].fill(f32::NAN);
            }
            let after = decode(&q, &kc, &vc, pos, &p);
            assert_eq!(before, after, "window {w}");
            let mut probs = vec![f32::NAN; 4 * (pos + 1)];
            attention_probs(&q, &kc, pos, &p, &mut probs);
            for h in 0..4 {
                let row = &probs[h * (pos + 1)..(h + 1) * (pos + 1)];
                assert!(row[..=pos - w].iter().all(|&x| x == 0.0));
                assert!(row[pos + 1 - w..].iter().all(|&x| x > 0.0));
                let s: f32 = row.iter().sum();
                assert!((s - 1.0).abs() < 1e-5);
            }
        }
        // w = 1: only the current position, so out == v[pos].
        let p = params(2, 1, 5, None, Some(1));
        let (q, kc, vc) = data(50, 9, &p);
        let out = decode(&q, &kc, &vc, 6, &p);
        assert_eq!(&out[..5], &vc[6 * 5..7 * 5]);
        assert_eq!(&out[5..], &vc[6 * 5..7 * 5]);
    }

    #[test]
    fn softcap_one_masked_position_has_probability_exactly_zero() {
        // With c = 1 every logit lies in [-1, 1]; a mask applied as a large
        // negative bias before the cap would leave the masked position with
        // weight ≈ e^-2 of the others. It must be exactly 0.
        let p = params(2, 1, 4, Some(1.0), Some(3));
        let n_ctx = 8;
        let pos = 5; // attends 3, 4, 5; position 2 (and below) masked
        let masked = 2;
        let (q, mut kc, _) = data(60, n_ctx, &p);
        // Make the masked position the most attractive key.
        for d in 0..4 {
            kc[masked * 4 + d] = 100.0 * q[d].signum();
        }
        let mut probs = vec![f32::NAN; 2 * (pos + 1)];
        attention_probs(&q, &kc, pos, &p, &mut probs);
        for h in 0..2 {
            assert_eq!(probs[h * (pos + 1) + masked], 0.0, "probs {probs:?}");
            assert!(probs[h * (pos + 1) + 3..(h + 1) * (pos + 1)].iter().all(|&x| x > 0.05));
        }
        // Through the output: v is zero except at the masked position.
        let mut vc = vec![0.0f32; n_ctx * 4];
        vc[masked * 4..masked * 4 + 4].fill(1.0);
        let out = decode(&q, &kc, &vc, pos, &p);
        assert!(out.iter().all(|&o| o == 0.0), "{out:?}");
        // And the same v at an attended position does show up.
        let mut vc = vec![0.0f32; n_ctx * 4];
        vc[3 * 4..3 * 4 + 4].fill(1.0);
        let out = decode(&q, &kc, &vc, pos, &p);
        assert!(out.iter().all(|&o| o > 0.05), "{out:?}");
    }

    #[test]
    fn softcap_bounds_logits() {
        // With c = 1, the probability ratio of any two attended positions is
        // at most e^2, however large the raw logits are.
        let mut p = params(1, 1, 8, Some(1.0), None);
        p.scale = 1000.0;
        let (q, kc, _) = data(70, 640, &p);
        let mut probs = vec![0.0; 640];
        attention_probs(&q, &kc, 639, &p, &mut probs);
        let (mn, mx) = probs.iter().fold((f32::MAX, 0.0f32), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(mx / mn <= (2.0f32).exp() * 1.0001, "{mn} {mx}");
    }

    #[test]
    fn prefill_equals_decode_per_position() {
        // Short chunks (per-token code) and long ones (tiled), against the
        // f64 reference and the decode path of each position.
        let cases = [
            (params(4, 1, 64, None, None), 0usize, 7usize),
            (params(8, 2, 7, Some(50.0), Some(5)), 633, 9),
            (params(6, 3, 80, Some(1.0), Some(512)), 500, 40),
            (params(2, 2, 16, None, None), 0, 1),
            (params(4, 2, 32, None, Some(20)), 3, 64),
        ];
        for (k, (p, pos0, n_tok)) in cases.into_iter().enumerate() {
            let n_ctx = pos0 + n_tok + 3;
            let (_, kc, vc) = data(80 + k as u64, n_ctx, &p);
            let q = rand_vec(90 + k as u64, n_tok * p.q_dim(), 2.0);
            let mut out = vec![f32::NAN; n_tok * p.q_dim()];
            attention_prefill(&q, &kc, &vc, pos0, n_tok, &p, &mut out);
            let qd = p.q_dim();
            for t in 0..n_tok {
                let qt = &q[t * qd..(t + 1) * qd];
                let (_, want) = attn_ref(qt, &kc, &vc, pos0 + t, &p);
                let got = &out[t * qd..(t + 1) * qd];
                assert_close(&format!("case {k} token {t}"), got, &want, 2e-5, 1e-6);
                let dec: Vec<f64> = decode(qt, &kc, &vc, pos0 + t, &p).iter().map(|&x| x as f64).collect();
                assert_close(&format!("case {k} token {t} vs decode"), got, &dec, 2e-5, 1e-6);
            }
        }
    }

    #[test]
    fn decode_parallel_and_serial_agree() {
        // Long enough to take the rayon path; compare against per-head calls
        // with one head each (serial path).
        let p = params(8, 2, 64, Some(50.0), None);
        let n_ctx = 4099;
        let (q, kc, vc) = data(95, n_ctx, &p);
        let out = decode(&q, &kc, &vc, n_ctx - 1, &p);
        let (_, want) = attn_ref(&q, &kc, &vc, n_ctx - 1, &p);
        assert_close("parallel decode", &out, &want, 1e-5, 1e-6);
        let mut serial = vec![0.0f32; p.q_dim()];
        let mut scores = vec![0.0f32; n_ctx];
        for h in 0..8 {
            attend_head(
                &q[h * 64..][..64],
                KvData::F32(&kc),
                KvData::F32(&vc),
                h,
                n_ctx - 1,
                &p,
                &mut scores,
                &mut serial[h * 64..][..64],
            );
        }
        assert_eq!(out, serial);
    }

    #[test]
    fn kv_append_writes_one_position() {
        let kv_dim = 6;
        let mut kc = vec![0.0f32; 4 * kv_dim];
        let mut vc = vec![0.0f32; 4 * kv_dim];
        let k = rand_vec(1, kv_dim, 1.0);
        let v = rand_vec(2, kv_dim, 1.0);
        kv_append(&mut kc, &mut vc, &k, &v, 2, kv_dim);
        assert_eq!(&kc[2 * kv_dim..3 * kv_dim], &k[..]);
        assert_eq!(&vc[2 * kv_dim..3 * kv_dim], &v[..]);
        assert!(kc[..2 * kv_dim].iter().chain(&kc[3 * kv_dim..]).all(|&x| x == 0.0));
        assert!(vc[..2 * kv_dim].iter().chain(&vc[3 * kv_dim..]).all(|&x| x == 0.0));
    }
}
