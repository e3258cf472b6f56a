//! Tiled attention for prompt chunks: FlashAttention's loop (Dao et al.
//! 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
//! IO-Awareness") with the online softmax of Milakov & Gimelshein 2018, on
//! the CPU, as llama.cpp's `ggml_compute_forward_flash_attn_ext_f16` tiles
//! its prompt path.
//!
//! The formula is [`super::attention`]'s; only the order of the arithmetic
//! differs. A task takes a block of query tokens of one span and, for each kv
//! head `g`, the rows `(token, query head of g)`: they all read the same
//! keys, so each block of 32 cache positions is loaded (converted to f32
//! and transposed) once for all of them. For each key block:
//!
//! ```text
//! S   = (scale · Q) Kᵀ            rows × BK, then cap and causal/window mask
//! m'  = max(m, rowmax S)          running maximum per row
//! P   = e^(S - m')                masked entries exactly 0
//! l   = l · e^(m - m') + rowsum P
//! O   = O · e^(m - m') + P V
//! ```
//!
//! and at the end `out = O / l`. Work per (row, key) is two `head_dim`-long
//! multiply-add runs done in register tiles, and memory traffic is one read
//! of the attended cache per task instead of one per (token, head), so the
//! cost of a prompt grows with its attended area at close to the
//! processor's multiply-add rate.
//!
//! Results equal [`super::attention_decode`]'s per token to rounding (the
//! sums run in another order; tests bound the difference against an f64
//! reference). The AVX2 and AVX-512 builds use fused multiply-adds, so
//! their bits differ from the portable build's by rounding.

use super::attention::{AttnParams, AVX2, AVX512, PORTABLE};
use super::attn_few_rows::{self as few, FEW_ROWS};
use super::exp::exp;
use crate::cpu::kv_cache::KvData;
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::env_allows_x86;
use crate::cpu::team::Par;

/// Tokens of one sequence from which a prompt chunk runs tiled.
pub const TILED_MIN_TOKENS: usize = 16;

/// Attended positions from which even a single token runs tiled: the
/// per-token code reads and converts the cache once per query head and
/// uses one thread per head, the tiled one once per kv head, with the
/// keys split over the threads.
pub const TILED_MIN_KEYS: usize = 256;

/// Whether `n_tok` tokens of one sequence from position `pos0` on run
/// [`attention_tiled_on`] rather than the per-token code of
/// [`super::attention_batch_on`] (as fast below both thresholds, and free
/// of per-call set-up).
pub fn runs_tiled(p: &AttnParams, pos0: usize, n_tok: usize) -> bool {
    n_tok >= TILED_MIN_TOKENS || (n_tok > 0 && p.n_attended(pos0) >= TILED_MIN_KEYS)
}

/// Cache positions per key block.
const BK: usize = 32;

/// Floats of query rows a task holds per kv head (`rows · head_dim`):
/// 64 rows of 64, 16 of 256, so that Q and O stay in the L2 cache.
const TASK_FLOATS: usize = 4096;

/// Attention of `n_tok` query tokens at positions `pos0..pos0 + n_tok`
/// over one sequence's cache, each causal and inside its window: what
/// [`super::attention_prefill_on`] computes, tiled.
///
/// Shapes: `q`, `out`: `[n_tok, n_head, head_dim]`; `k`, `v`: the slot's
/// cache, `[n_ctx, n_head_kv, head_dim]` position-major values of any
/// [`crate::KvCacheType`] (the entries of these tokens already appended;
/// `head_dim` a multiple of the block size for a block type).
///
/// Tasks are (block of query tokens, kv head, span of keys), run on `par`:
/// when blocks × kv heads are too few for the threads (a decode step, a
/// short chunk, a model with one kv head) the attended keys are split too
/// and the partial softmax states merged (`m`, `l`, unscaled output), as
/// FlashDecoding (Dao et al. 2023) does. Scratch is per thread and kept
/// (thread-local), so a warm call allocates nothing.
///
/// Contract (debug-asserted): as [`super::attention_prefill`].
#[allow(clippy::too_many_arguments)]
pub fn attention_tiled_on(
    par: Par<'_>,
    q: &[f32],
    k: KvData<'_>,
    v: KvData<'_>,
    pos0: usize,
    n_tok: usize,
    p: &AttnParams,
    out: &mut [f32],
) {
    attention_tiled_lse(par, q, k, v, pos0, n_tok, p, out, None);
}

/// [`attention_tiled_on`], and with `lse` (`[n_tok, n_head]`) each row's
/// log-sum-exp of its logits, `ln Σ_j e^(l_j)` (`-inf` for a row that sees
/// no key, whose output is then 0): what merging this output with another
/// part of the same softmax needs ([`merge_lse`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_tiled_lse(
    par: Par<'_>,
    q: &[f32],
    k: KvData<'_>,
    v: KvData<'_>,
    pos0: usize,
    n_tok: usize,
    p: &AttnParams,
    out: &mut [f32],
    mut lse: Option<&mut [f32]>,
) {
    let qd = p.q_dim();
    debug_assert_eq!(q.len(), n_tok * qd);
    debug_assert_eq!(out.len(), n_tok * qd);
    debug_assert!(lse.as_ref().is_none_or(|l| l.len() == n_tok * p.n_head));
    debug_assert!(k.len() >= (pos0 + n_tok) * p.kv_dim() && v.len() == k.len(), "cache too short");
    if n_tok == 0 {
        return;
    }
    let plan = Plan::new(p, pos0, n_tok, par.threads());
    let job = Job { q, k, v, pos0, p, plan };
    let task_len = plan.rows * (p.head_dim + 2);
    let n_tasks = n_tok.div_ceil(plan.bq) * (p.n_head_kv / plan.heads) * plan.n_split;
    let mut go = |staging: &mut Vec<f32>| {
        fit(staging, n_tasks * task_len);
        let staging = &mut staging[..n_tasks * task_len];
        par.for_each_chunk_mut(staging, task_len, |i, buf| job.run(i, buf));
        job.merge(staging, task_len, out, lse.as_deref_mut());
    };
    // A rayon thread that waits inside this call may run another one (work
    // stealing); that nested call takes a buffer of its own.
    STAGING.with(|staging| match staging.try_borrow_mut() {
        Ok(mut staging) => go(&mut staging),
        Err(_) => go(&mut Vec::new()),
    });
}

/// How one call is cut into tasks.
#[derive(Clone, Copy)]
struct Plan {
    /// Query tokens per block.
    bq: usize,
    /// Query tokens in all.
    n_tok: usize,
    /// Spans the keys of each (block, kv heads) are split into.
    n_split: usize,
    /// Kv heads per task: 1, or all of them for a decode step of few rows
    /// (one task then reads whole cache rows, each span of positions in one
    /// run of memory, where a task per kv head read a head's 128 bytes of
    /// every row: about 3× the data from DRAM).
    heads: usize,
    /// Rows of a whole task: `bq · (n_head / n_head_kv) · heads`.
    rows: usize,
}

impl Plan {
    /// Blocks of about 64 rows of 64 values; keys split when blocks × kv
    /// heads are fewer than two tasks per thread, each split keeping 4 key
    /// blocks or more. One token of few rows per kv head: one task per
    /// split for all kv heads.
    fn new(p: &AttnParams, pos0: usize, n_tok: usize, threads: usize) -> Self {
        let group = p.n_head / p.n_head_kv;
        let max_rows = (TASK_FLOATS / p.head_dim).clamp(ROW_PAD, 128);
        let bq = (max_rows / group).clamp(1, n_tok);
        let heads = if n_tok == 1 && group <= FEW_ROWS { p.n_head_kv } else { 1 };
        let base = n_tok.div_ceil(bq) * (p.n_head_kv / heads);
        // Keys of the last (widest) block.
        let keys = pos0 + n_tok - p.first_pos(pos0 + n_tok - bq);
        let n_split = (2 * threads).div_ceil(base).min(keys.div_ceil(4 * BK)).max(1);
        Plan { bq, n_tok, n_split, heads, rows: bq * group * heads }
    }
}

thread_local! {
    /// Each thread's task scratch ([`Scratch`]).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    /// The calling thread's task outputs, merged into the result.
    static STAGING: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Grows `v` to at least `n` values (kept between calls).
fn fit(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// The buffers of one task, reused by the next one on the same thread.
#[derive(Default)]
struct Scratch {
    /// Transposed, pre-scaled queries: `[head_dim][rp]`.
    qt: Vec<f32>,
    /// Logits, then probabilities, of a key block: `[BK][rp]`.
    s: Vec<f32>,
    /// A key block and a value block converted to f32 (caches not f32).
    kb: Vec<f32>,
    vb: Vec<f32>,
    st: Rows,
}

/// The shared inputs of one [`attention_tiled_on`] call.
struct Job<'a> {
    q: &'a [f32],
    k: KvData<'a>,
    v: KvData<'a>,
    pos0: usize,
    p: &'a AttnParams,
    plan: Plan,
}

impl Job<'_> {
    /// Task `i` into `buf` (`[rows][head_dim]` unscaled output, then `m`
    /// and `l` of each row), on the widest instruction set the processor has.
    fn run(&self, i: usize, buf: &mut [f32]) {
        // The scratch is borrowed here, outside the builds below: a closure
        // inside them would be compiled without their features.
        SCRATCH.with(|sc| {
            // Nested on this thread (see `attention_tiled_on`): fresh scratch.
            let (mut guard, mut fresh) = (sc.try_borrow_mut().ok(), None);
            let sc: &mut Scratch = match guard.as_deref_mut() {
                Some(sc) => sc,
                None => fresh.insert(Scratch::default()),
            };
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") && env_allows_x86(true)
            {
                // SAFETY: the processor supports AVX-512 F and FMA, the
                // features the function enables.
                unsafe { self.run_avx512(i, buf, sc) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
                && env_allows_x86(false)
            {
                // SAFETY: the processor supports AVX2, FMA and F16C, the
                // features the function enables.
                unsafe { self.run_avx2(i, buf, sc) };
                return;
            }
            self.task::<PORTABLE>(i, buf, sc);
        })
    }

    /// [`Job::task`] built for AVX-512.
    ///
    /// # Safety
    /// The processor must support AVX-512 F and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn run_avx512(&self, i: usize, buf: &mut [f32], sc: &mut Scratch) {
        self.task::<AVX512>(i, buf, sc);
    }

    /// [`Job::task`] built for AVX2.
    ///
    /// # Safety
    /// The processor must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_avx2(&self, i: usize, buf: &mut [f32], sc: &mut Scratch) {
        self.task::<AVX2>(i, buf, sc);
    }

    /// Task `i`'s block, first kv head and split: `(t0, nt, g, split)`
    /// (kv heads `g..g + plan.heads`).
    fn task_of(&self, i: usize) -> (usize, usize, usize, usize) {
        let Plan { bq, n_tok, n_split, heads, .. } = self.plan;
        let per_block = self.p.n_head_kv / heads;
        let (b, g, split) = (i / n_split / per_block, i / n_split % per_block * heads, i % n_split);
        let t0 = b * bq;
        (t0, bq.min(n_tok - t0), g, split)
    }

    /// Keys of split `split` of the block of tokens `t0..t0 + nt`: whole
    /// key blocks from the first position its first token sees.
    fn keys_of(&self, t0: usize, nt: usize, split: usize) -> std::ops::Range<usize> {
        let (lo, end) = (self.p.first_pos(self.pos0 + t0), self.pos0 + t0 + nt);
        let per = (end - lo).div_ceil(BK).div_ceil(self.plan.n_split) * BK;
        (lo + split * per).min(end)..(lo + (split + 1) * per).min(end)
    }

    /// One task: the rows of kv head `g` for its tokens, over its keys.
    #[inline(always)]
    fn task<const W: u8>(&self, i: usize, buf: &mut [f32], sc: &mut Scratch) {
        let p = self.p;
        let (hd, qd, kvd) = (p.head_dim, p.q_dim(), p.kv_dim());
        let group = p.n_head / p.n_head_kv;
        let (t0, nt, g, split) = self.task_of(i);
        let keys = self.keys_of(t0, nt, split);
        if nt == 1 && group <= FEW_ROWS {
            return self.task_few::<W>((t0, g, keys), buf, sc);
        }
        debug_assert_eq!(self.plan.heads, 1);
        let rows = nt * group;
        let (o, ml) = buf.split_at_mut(self.plan.rows * hd);
        let o = &mut o[..rows * hd];
        o.fill(0.0);
        // Rows padded to whole vectors; padding rows are zero queries
        // whose results are dropped.
        let rp = rows.next_multiple_of(ROW_PAD);
        fit(&mut sc.qt, hd * rp);
        fit(&mut sc.s, BK * rp);
        if !matches!(self.k, KvData::F32(_)) {
            fit(&mut sc.kb, BK * hd);
        }
        if !matches!(self.v, KvData::F32(_)) {
            fit(&mut sc.vb, BK * hd);
        }
        let (qt, s, st) = (&mut sc.qt[..hd * rp], &mut sc.s[..BK * rp], &mut sc.st);
        st.reset(rp);
        qt.fill(0.0);
        for r in 0..rows {
            let h = g * group + r % group;
            let src = &self.q[(t0 + r / group) * qd + h * hd..][..hd];
            for (d, &x) in src.iter().enumerate() {
                qt[d * rp + r] = p.scale * x;
            }
        }
        // Row r is token t0 + r / group, query head g · group + r % group.
        let pos_of = |r: usize| self.pos0 + t0 + r / group;
        let (pos_lo, pos_hi) = (self.pos0 + t0, self.pos0 + t0 + nt - 1);
        // Keys every row sees (no mask needed): first_pos(pos_hi)..=pos_lo.
        let (all_from, all_to) = (p.first_pos(pos_hi), pos_lo);
        let mut kb = keys.start;
        while kb < keys.end {
            let nk = BK.min(keys.end - kb);
            let at = kb * kvd + g * hd;
            let k = block_rows::<W>(self.k, at, kvd, nk, hd, &mut sc.kb);
            let v = block_rows::<W>(self.v, at, kvd, nk, hd, &mut sc.vb);
            scores::<W>(qt, rp, k, nk, hd, s);
            if let Some(cap) = p.softcap {
                let inv = 1.0 / cap;
                for x in &mut s[..nk * rp] {
                    *x = cap * (*x * inv).tanh();
                }
            }
            if !(nk == BK && kb >= all_from && kb + BK - 1 <= all_to) {
                // A block on the diagonal or the window's edge: each
                // row sees positions first_pos(pos)..=pos only.
                for r in 0..rows {
                    let (first, last) = (p.first_pos(pos_of(r)), pos_of(r));
                    for c in 0..nk {
                        if kb + c < first || kb + c > last {
                            s[c * rp + r] = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            st.online_softmax(s, nk);
            pv::<W>(s, rp, &st.alpha, v, nk, hd, o);
            kb += BK;
        }
        let (m, l) = ml.split_at_mut(self.plan.rows);
        m[..rows].copy_from_slice(&st.m[..rows]);
        l[..rows].copy_from_slice(&st.l[..rows]);
    }

    /// [`Job::task`] for one token of at most [`FEW_ROWS`] rows per kv
    /// head (a decode step) and kv heads `g..g + plan.heads`, with the
    /// few-row kernels: queries and logits row-major, row `r` query head
    /// `g · group + r`. Each key block is converted once for all the heads.
    /// Every key of the span is visible to the token (`keys_of` starts at
    /// its window's first position and ends at it), so nothing is masked.
    #[inline(always)]
    fn task_few<const W: u8>(
        &self,
        (t0, g, keys): (usize, usize, std::ops::Range<usize>),
        buf: &mut [f32],
        sc: &mut Scratch,
    ) {
        let p = self.p;
        let (hd, qd, kvd) = (p.head_dim, p.q_dim(), p.kv_dim());
        let (group, heads) = (p.n_head / p.n_head_kv, self.plan.heads);
        let (rows, width) = (group * heads, heads * hd);
        let (o, ml) = buf.split_at_mut(self.plan.rows * hd);
        let o = &mut o[..rows * hd];
        o.fill(0.0);
        fit(&mut sc.qt, rows * hd);
        fit(&mut sc.s, rows * BK);
        if !matches!(self.k, KvData::F32(_)) {
            fit(&mut sc.kb, BK * width);
        }
        if !matches!(self.v, KvData::F32(_)) {
            fit(&mut sc.vb, BK * width);
        }
        let (q, s, st) = (&mut sc.qt[..rows * hd], &mut sc.s[..rows * BK], &mut sc.st);
        st.reset(rows);
        // The task's query heads are consecutive: g · group onwards.
        for (d, &x) in q.iter_mut().zip(&self.q[t0 * qd + g * group * hd..][..rows * hd]) {
            *d = p.scale * x;
        }
        let mut kb = keys.start;
        while kb < keys.end {
            let nk = BK.min(keys.end - kb);
            let at = kb * kvd + g * hd;
            let (k, ks) = block_rows::<W>(self.k, at, kvd, nk, width, &mut sc.kb);
            let (v, vs) = block_rows::<W>(self.v, at, kvd, nk, width, &mut sc.vb);
            for j in 0..heads {
                let rs = j * group * BK..(j + 1) * group * BK;
                few::scores::<W>(&q[j * group * hd..], group, (&k[j * hd..], ks), nk, hd, (&mut s[rs], BK));
            }
            if let Some(cap) = p.softcap {
                let inv = 1.0 / cap;
                for r in 0..rows {
                    for x in &mut s[r * BK..][..nk] {
                        *x = cap * (*x * inv).tanh();
                    }
                }
            }
            st.online_softmax_rows(s, BK, nk);
            for j in 0..heads {
                let (ps, al) = (&s[j * group * BK..], &st.alpha[j * group..]);
                few::pv::<W>((ps, BK), group, al, (&v[j * hd..], vs), nk, hd, &mut o[j * group * hd..]);
            }
            kb += BK;
        }
        let (m, l) = ml.split_at_mut(self.plan.rows);
        m[..rows].copy_from_slice(&st.m[..rows]);
        l[..rows].copy_from_slice(&st.l[..rows]);
    }

    /// Merges the tasks' outputs (`staging`, `task_len` floats each) into
    /// `out`: per row, the splits weighted by `e^(m_s - M)`, `M` the
    /// largest `m_s`, over the same-weighted sum of their `l_s` (one split:
    /// `O / l`).
    fn merge(&self, staging: &[f32], task_len: usize, out: &mut [f32], mut lse: Option<&mut [f32]>) {
        let p = self.p;
        let (hd, qd) = (p.head_dim, p.q_dim());
        let group = p.n_head / p.n_head_kv;
        let n_split = self.plan.n_split;
        let part = |i: usize| {
            let buf = &staging[i * task_len..(i + 1) * task_len];
            let (o, ml) = buf.split_at(self.plan.rows * hd);
            let (m, l) = ml.split_at(self.plan.rows);
            (o, m, l)
        };
        for first in (0..staging.len() / task_len).step_by(n_split) {
            let (t0, nt, g, _) = self.task_of(first);
            for r in 0..nt * group * self.plan.heads {
                // Row r: token t0 + (r mod nt·group) / group, query head
                // (g + r / (nt·group)) · group + r mod group.
                let (t, h) = (t0 + r % (nt * group) / group, (g + r / (nt * group)) * group + r % group);
                let dst = &mut out[t * qd + h * hd..][..hd];
                let big = (0..n_split).map(|s| part(first + s).1[r]).fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0f32;
                dst.fill(0.0);
                for s in 0..n_split {
                    let (o, m, l) = part(first + s);
                    if m[r] == f32::NEG_INFINITY {
                        continue; // no key of this split is visible to the row
                    }
                    let w = exp(m[r] - big);
                    total += w * l[r];
                    for (d, &x) in dst.iter_mut().zip(&o[r * hd..][..hd]) {
                        *d += w * x;
                    }
                }
                // A row that sees no key (only in a part of a softmax
                // split by the caller) is 0, not 0/0.
                let inv = if total > 0.0 { 1.0 / total } else { 0.0 };
                for d in dst.iter_mut() {
                    *d *= inv;
                }
                if let Some(lse) = lse.as_deref_mut() {
                    lse[t * p.n_head + h] = if total > 0.0 { big + total.ln() } else { f32::NEG_INFINITY };
                }
            }
        }
    }
}

/// Merges two parts of one softmax attention over disjoint key sets: `a`
/// becomes, row by row (`head_dim` values, `lse_a[r]` its log-sum-exp from
/// [`attention_tiled_lse`]), the output over both key sets,
/// `(e^(lse_a − M) · a + e^(lse_b − M) · b) / (e^(lse_a − M) + e^(lse_b − M))`
/// with `M` the larger log-sum-exp; a part that saw no key (`-inf`) has
/// weight 0. `lse_a` becomes the merged log-sum-exp.
///
/// Contract (debug-asserted): `a.len() == b.len() == lse_a.len() · head_dim`,
/// `lse_b.len() == lse_a.len()`.
pub fn merge_lse(a: &mut [f32], lse_a: &mut [f32], b: &[f32], lse_b: &[f32], head_dim: usize) {
    debug_assert!(a.len() == b.len() && a.len() == lse_a.len() * head_dim && lse_b.len() == lse_a.len());
    for (((a, la), b), &lb) in
        a.chunks_exact_mut(head_dim).zip(lse_a.iter_mut()).zip(b.chunks_exact(head_dim)).zip(lse_b)
    {
        let big = la.max(lb);
        if big == f32::NEG_INFINITY {
            continue; // neither part sees a key: 0 stays 0
        }
        let (wa, wb) = ((*la - big).exp(), (lb - big).exp());
        let inv = 1.0 / (wa + wb);
        for (x, &y) in a.iter_mut().zip(b) {
            *x = (wa * *x + wb * y) * inv;
        }
        *la = big + (wa + wb).ln();
    }
}

/// Rows of a task are padded to a multiple of this (the widest score tile).
const ROW_PAD: usize = 16;

/// Rows `nk` cache positions of one kv head, from value index `at` on,
/// `stride` apart, as f32: `(values, stride)`, read in place from an f32
/// cache, else converted into `buf` (rows `hd` apart).
#[inline(always)]
fn block_rows<'a, const W: u8>(
    c: KvData<'a>,
    at: usize,
    stride: usize,
    nk: usize,
    hd: usize,
    buf: &'a mut [f32],
) -> (&'a [f32], usize) {
    match c {
        KvData::F32(_) => return (c.as_f32(at, (nk - 1) * stride + hd).expect("an f32 cache"), stride),
        KvData::F16(h) => {
            for j in 0..nk {
                f16_to_f32::<W>(&h[at + j * stride..][..hd], &mut buf[j * hd..][..hd]);
            }
        }
        _ => {
            for j in 0..nk {
                c.to_f32(at + j * stride, &mut buf[j * hd..][..hd]);
            }
        }
    }
    (&buf[..nk * hd], hd)
}

/// `dst[i] = src[i]` widened (exact), with the build's conversion
/// instruction (`vcvtph2ps`: AVX-512 F, or F16C beside AVX2) inline: the
/// `half` crate's slice conversion is a call per 8 values, which cost a
/// quarter of a decode step deep in an f16 cache.
#[inline(always)]
fn f16_to_f32<const W: u8>(src: &[half::f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        if W == AVX512 {
            while i + 16 <= n {
                // SAFETY: `W == AVX512` only inside `Job::run_avx512` (AVX-512
                // F enabled); `i + 16 <= n` keeps both accesses in bounds.
                unsafe {
                    let x = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                    _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(x));
                }
                i += 16;
            }
        }
        if W == AVX2 {
            while i + 8 <= n {
                // SAFETY: `W == AVX2` only inside `Job::run_avx2` (AVX2 and
                // F16C enabled); `i + 8 <= n` keeps both accesses in bounds.
                unsafe {
                    let x = _mm_loadu_si128(src.as_ptr().add(i).cast());
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(x));
                }
                i += 8;
            }
        }
    }
    for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = s.to_f32();
    }
}

/// The online-softmax state of a task's rows (padded).
#[derive(Default)]
struct Rows {
    /// Running maximum of each row's logits (`-inf` before any key).
    m: Vec<f32>,
    /// Running sum of `e^(logit - m)`.
    l: Vec<f32>,
    /// `e^(m_old - m_new)` of the last block: the factor on earlier output.
    alpha: Vec<f32>,
    /// The maximum the last block's exponents were taken against.
    m_use: Vec<f32>,
}

impl Rows {
    /// `rp` rows before any key.
    fn reset(&mut self, rp: usize) {
        for (v, x) in
            [(&mut self.m, f32::NEG_INFINITY), (&mut self.l, 0.0), (&mut self.alpha, 1.0), (&mut self.m_use, 0.0)]
        {
            v.clear();
            v.resize(rp, x);
        }
    }

    /// One key block of logits `s[c][r]` (`nk` keys; masked ones `-inf`)
    /// becomes `P = e^(s - m')`, exactly 0 where masked; updates `m`, `l`
    /// and `alpha`. Every loop runs along the rows, so it vectorizes. A row
    /// that has seen no key yet keeps `m = -inf`, and its `P`, `l` and
    /// output stay 0.
    #[inline(always)]
    fn online_softmax(&mut self, s: &mut [f32], nk: usize) {
        let rp = self.m.len();
        // The block's maxima, in `m_use` until it holds the reference.
        self.m_use.copy_from_slice(&s[..rp]);
        for c in 1..nk {
            for (x, &y) in self.m_use.iter_mut().zip(&s[c * rp..][..rp]) {
                *x = x.max(y);
            }
        }
        for r in 0..rp {
            let m_new = self.m[r].max(self.m_use[r]);
            // Against 0 while nothing is seen, so that -inf - -inf is never taken.
            self.m_use[r] = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
            self.alpha[r] = exp(self.m[r] - self.m_use[r]);
            self.m[r] = m_new;
            self.l[r] *= self.alpha[r];
        }
        for c in 0..nk {
            let row = &mut s[c * rp..][..rp];
            for ((x, &mu), l) in row.iter_mut().zip(&self.m_use).zip(&mut self.l) {
                *x = exp(*x - mu);
                *l += *x;
            }
        }
    }

    /// [`Rows::online_softmax`] for row-major logits `s[r · ls + c]` (the
    /// few-row kernels): each row's `nk` keys in one run.
    #[inline(always)]
    fn online_softmax_rows(&mut self, s: &mut [f32], ls: usize, nk: usize) {
        for r in 0..self.m.len() {
            let row = &mut s[r * ls..][..nk];
            let m_new = row.iter().fold(self.m[r], |a, &x| a.max(x));
            // Against 0 while nothing is seen, so that -inf - -inf is never taken.
            let mu = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
            self.alpha[r] = exp(self.m[r] - mu);
            self.m[r] = m_new;
            for x in row.iter_mut() {
                *x = exp(*x - mu);
            }
            self.l[r] = self.l[r] * self.alpha[r] + row.iter().sum::<f32>();
        }
    }
}

/// `a · b + c`: fused in the AVX2 and AVX-512 builds (which enable FMA),
/// plain in the portable one (where `mul_add` would be a library call).
#[inline(always)]
fn fma<const W: u8>(a: f32, b: f32, c: f32) -> f32 {
    if W == PORTABLE {
        a * b + c
    } else {
        a.mul_add(b, c)
    }
}

/// Logits `s[c][r] = qt[·][r] · k[c]` of `nk` keys (rows `(values,
/// stride)`) against every row of the transposed, pre-scaled queries `qt`
/// (`hd × rp`): tiles of keys × one vector of rows, sized per build.
#[inline(always)]
fn scores<const W: u8>(qt: &[f32], rp: usize, k: (&[f32], usize), nk: usize, hd: usize, s: &mut [f32]) {
    match W {
        AVX512 => scores_in::<W, 8, 16>(qt, rp, k, nk, hd, s),
        AVX2 => scores_in::<W, 8, 8>(qt, rp, k, nk, hd, s),
        _ => scores_in::<W, 4, 4>(qt, rp, k, nk, hd, s),
    }
}

/// [`scores`] with tiles of `KC` keys × `RW` rows (`RW` divides `rp`).
#[inline(always)]
fn scores_in<const W: u8, const KC: usize, const RW: usize>(
    qt: &[f32],
    rp: usize,
    (k, stride): (&[f32], usize),
    nk: usize,
    hd: usize,
    s: &mut [f32],
) {
    let key = |c: usize| &k[c * stride..][..hd];
    let mut c = 0;
    while c + KC <= nk {
        let keys: [&[f32]; KC] = std::array::from_fn(|i| key(c + i));
        for r0 in (0..rp).step_by(RW) {
            s_tile::<W, KC, RW>(qt, rp, r0, keys, &mut s[c * rp..]);
        }
        c += KC;
    }
    while c < nk {
        for r0 in (0..rp).step_by(RW) {
            s_tile::<W, 1, RW>(qt, rp, r0, [key(c)], &mut s[c * rp..]);
        }
        c += 1;
    }
}

/// `KC` keys × rows `r0..r0 + RW` of logits, in registers; `s` starts at
/// the first key's row.
#[inline(always)]
fn s_tile<const W: u8, const KC: usize, const RW: usize>(
    qt: &[f32],
    rp: usize,
    r0: usize,
    keys: [&[f32]; KC],
    s: &mut [f32],
) {
    let hd = keys[0].len();
    // Lets the compiler drop the bounds checks of `keys[c][d]`.
    assert!(keys.iter().all(|k| k.len() == hd) && qt.len() >= hd * rp && r0 + RW <= rp);
    let mut acc = [[0.0f32; RW]; KC];
    for d in 0..hd {
        let q: &[f32; RW] = qt[d * rp + r0..][..RW].try_into().unwrap();
        for c in 0..KC {
            let kd = keys[c][d];
            for i in 0..RW {
                acc[c][i] = fma::<W>(kd, q[i], acc[c][i]);
            }
        }
    }
    for c in 0..KC {
        s[c * rp + r0..][..RW].copy_from_slice(&acc[c]);
    }
}

/// `o[r] = o[r] · alpha[r] + Σ_c p[c][r] · v[c]` for every (unpadded) row
/// `r` of `o` (rows `hd` apart), over `nk` value rows `v = (values,
/// stride)`, in tiles sized per build: AVX-512 4 rows × 64 columns (16 of
/// its 32 registers), AVX2 4 rows × 16 columns (8 of 16).
#[inline(always)]
fn pv<const W: u8>(p: &[f32], rp: usize, alpha: &[f32], v: (&[f32], usize), nk: usize, hd: usize, o: &mut [f32]) {
    match W {
        AVX512 => pv_in::<W, 4, 64>(p, rp, alpha, v, nk, hd, o),
        AVX2 => pv_in::<W, 4, 16>(p, rp, alpha, v, nk, hd, o),
        _ => pv_in::<W, 4, 4>(p, rp, alpha, v, nk, hd, o),
    }
}

/// [`pv`] with tiles of `R` rows × `DC` columns, then single rows, and
/// columns of 8 and 1 past the last whole tile.
#[inline(always)]
#[allow(clippy::int_plus_one)] // `d0 + $dc <= hd` reads alike for every width
fn pv_in<const W: u8, const R: usize, const DC: usize>(
    p: &[f32],
    rp: usize,
    alpha: &[f32],
    v: (&[f32], usize),
    nk: usize,
    hd: usize,
    o: &mut [f32],
) {
    let rows = o.len() / hd;
    let mut r = 0;
    while r < rows {
        let nr = if rows - r >= R { R } else { 1 };
        let mut d0 = 0;
        macro_rules! cols {
            ($dc:expr) => {
                while d0 + $dc <= hd {
                    let at = (r, d0, hd, rp);
                    if nr == R {
                        pv_tile::<W, R, { $dc }>(p, alpha, v, nk, at, o);
                    } else {
                        pv_tile::<W, 1, { $dc }>(p, alpha, v, nk, at, o);
                    }
                    d0 += $dc;
                }
            };
        }
        cols!(DC);
        cols!(8);
        cols!(1);
        r += nr;
    }
}

/// Rows `r0..r0 + R` × columns `d0..d0 + DC` of the `P·V` update, in
/// registers.
#[inline(always)]
fn pv_tile<const W: u8, const R: usize, const DC: usize>(
    p: &[f32],
    alpha: &[f32],
    (v, stride): (&[f32], usize),
    nk: usize,
    (r0, d0, hd, rp): (usize, usize, usize, usize),
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if W == AVX2 && DC == 16 {
        // The compiler vectorizes this tile across rows for AVX2, building
        // every vector lane by lane; written out instead.
        assert!(nk == 0 || (nk - 1) * stride + d0 + 16 <= v.len());
        assert!((nk == 0 || (nk - 1) * rp + r0 + R <= p.len()) && r0 + R <= alpha.len());
        assert!((r0 + R - 1) * hd + d0 + 16 <= o.len());
        // SAFETY: `W == AVX2` only inside `Job::run_avx2`, where AVX2 and
        // FMA are enabled; the asserts bound every access.
        unsafe { pv_tile_avx2::<R>(p, alpha, (v, stride), nk, (r0, d0, hd, rp), o) };
        return;
    }
    let mut acc = [[0.0f32; DC]; R];
    for i in 0..R {
        let src = &o[(r0 + i) * hd + d0..][..DC];
        for x in 0..DC {
            acc[i][x] = src[x] * alpha[r0 + i];
        }
    }
    for c in 0..nk {
        let vr: &[f32; DC] = v[c * stride + d0..][..DC].try_into().unwrap();
        let pc: &[f32; R] = p[c * rp + r0..][..R].try_into().unwrap();
        for i in 0..R {
            for x in 0..DC {
                acc[i][x] = fma::<W>(pc[i], vr[x], acc[i][x]);
            }
        }
    }
    for i in 0..R {
        o[(r0 + i) * hd + d0..][..DC].copy_from_slice(&acc[i]);
    }
}

/// [`pv_tile`] of `R` rows × 16 columns in AVX2 registers.
///
/// # Safety
/// The processor must support AVX2 and FMA; every index the loops form
/// must lie inside its slice (what [`pv_tile`] asserts).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pv_tile_avx2<const R: usize>(
    p: &[f32],
    alpha: &[f32],
    (v, stride): (&[f32], usize),
    nk: usize,
    (r0, d0, hd, rp): (usize, usize, usize, usize),
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for (i, a) in acc.iter_mut().enumerate() {
        let f = _mm256_set1_ps(*alpha.get_unchecked(r0 + i));
        let src = o.as_ptr().add((r0 + i) * hd + d0);
        *a = [_mm256_mul_ps(_mm256_loadu_ps(src), f), _mm256_mul_ps(_mm256_loadu_ps(src.add(8)), f)];
    }
    for c in 0..nk {
        let vp = v.as_ptr().add(c * stride + d0);
        let (v0, v1) = (_mm256_loadu_ps(vp), _mm256_loadu_ps(vp.add(8)));
        for (i, a) in acc.iter_mut().enumerate() {
            let pc = _mm256_set1_ps(*p.get_unchecked(c * rp + r0 + i));
            a[0] = _mm256_fmadd_ps(pc, v0, a[0]);
            a[1] = _mm256_fmadd_ps(pc, v1, a[1]);
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let dst = o.as_mut_ptr().add((r0 + i) * hd + d0);
        _mm256_storeu_ps(dst, a[0]);
        _mm256_storeu_ps(dst.add(8), a[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::cpu::team::Team;
    use crate::KvCacheType;

    /// Awkward shapes (head_dim 7 and 80, odd groups, windows shorter and
    /// longer than a key block, chunks starting mid-cache, split keys) on
    /// rayon and on a team of two, against the f64 reference.
    #[test]
    fn tiled_matches_f64_reference() {
        let cases = [
            (params(4, 1, 64, None, None), 0usize, 37usize),
            (params(8, 2, 7, Some(50.0), Some(5)), 633, 19),
            (params(6, 3, 80, Some(1.0), Some(40)), 500, 70),
            (params(9, 3, 64, None, None), 3, 100),
            (params(2, 2, 16, None, Some(1)), 10, 17),
            (params(4, 1, 256, None, Some(16)), 31, 33),
            (params(8, 8, 96, None, None), 0, 1),
            // Decode steps deep in the cache, one kv head: keys split
            // across tasks and merged.
            (params(4, 1, 256, None, None), 900, 1),
            (params(9, 3, 64, Some(30.0), Some(300)), 2000, 1),
            (params(8, 2, 64, None, None), 1500, 3),
            // A block of 128 tokens with a window of 64: the first key
            // split holds nothing the last rows see.
            (params(2, 2, 32, None, Some(64)), 500, 128),
            // Blocks of 16 tokens and a last one of one token: the
            // few-row kernels for one kv head at a time.
            (params(8, 2, 64, None, Some(100)), 40, 33),
            // Eight query heads per kv head, the most the few-row
            // kernels take, with a tail past the last whole vector.
            (params(16, 2, 40, Some(20.0), None), 300, 1),
        ];
        let team = Team::new(2).unwrap();
        for (k, &(p, pos0, n)) in cases.iter().enumerate().skip(7).take(4) {
            assert!(Plan::new(&p, pos0, n, 2).n_split > 1, "case {k} does not split its keys");
        }
        for (k, (p, pos0, n)) in cases.into_iter().enumerate() {
            let n_ctx = pos0 + n + 5;
            // Future positions hold NaN: a read past a token's position shows.
            let mut kc = rand_vec(10 + k as u64, n_ctx * p.kv_dim(), 2.0);
            let mut vc = rand_vec(20 + k as u64, n_ctx * p.kv_dim(), 1.0);
            kc[(pos0 + n) * p.kv_dim()..].fill(f32::NAN);
            vc[(pos0 + n) * p.kv_dim()..].fill(f32::NAN);
            let q = rand_vec(30 + k as u64, n * p.q_dim(), 2.0);
            for par in [Par::Rayon, Par::Team(&team)] {
                let mut out = vec![f32::NAN; n * p.q_dim()];
                attention_tiled_on(par, &q, KvData::F32(&kc), KvData::F32(&vc), pos0, n, &p, &mut out);
                let qd = p.q_dim();
                for t in 0..n {
                    let (_, want) = attn_ref(&q[t * qd..(t + 1) * qd], &kc, &vc, pos0 + t, &p);
                    assert_close(&format!("case {k} token {t} {p:?}"), &out[t * qd..(t + 1) * qd], &want, 2e-5, 1e-6);
                }
            }
        }
    }

    /// A cache of every type gives what an f32 cache holding its
    /// converted values gives, to rounding.
    #[test]
    fn tiled_reads_every_cache_type() {
        // head_dim 40 (f16 and f32 only: the block types need whole blocks
        // of 32, TurboQuant a power of two)
        // converts past the last whole vector; a decode step deep in the
        // cache takes the split-key path.
        let cases = [
            (params(8, 2, 64, None, Some(50)), 20usize, 60usize),
            (params(4, 2, 40, None, None), 700, 1),
            (params(8, 2, 64, None, None), 500, 1),
        ];
        for (p, pos0, n) in cases {
            let n_ctx = pos0 + n;
            let kvd = p.kv_dim();
            let kx = rand_vec(1, n_ctx * kvd, 2.0);
            let vx = rand_vec(2, n_ctx * kvd, 1.0);
            let q = rand_vec(3, n * p.q_dim(), 2.0);
            // TurboQuant caches read back in their rotated basis, as the
            // converted f32 copy holds them.
            for ty in KvCacheType::ALL.into_iter().filter(|t| t.check_head_dim(p.head_dim).is_ok()) {
                let mut kb = crate::cpu::kv_cache::KvBuf::zeroed(ty, n_ctx * kvd, p.head_dim, "k").unwrap();
                let mut vb = crate::cpu::kv_cache::KvBuf::zeroed(ty, n_ctx * kvd, p.head_dim, "v").unwrap();
                for j in 0..n_ctx {
                    kb.write_row(j * kvd, &kx[j * kvd..(j + 1) * kvd]);
                    vb.write_row(j * kvd, &vx[j * kvd..(j + 1) * kvd]);
                }
                let (mut kf, mut vf) = (vec![0.0f32; n_ctx * kvd], vec![0.0f32; n_ctx * kvd]);
                kb.view().to_f32(0, &mut kf);
                vb.view().to_f32(0, &mut vf);
                let mut got = vec![f32::NAN; n * p.q_dim()];
                attention_tiled_on(Par::Rayon, &q, kb.view(), vb.view(), pos0, n, &p, &mut got);
                let mut want = vec![f32::NAN; n * p.q_dim()];
                attention_tiled_on(Par::Rayon, &q, KvData::F32(&kf), KvData::F32(&vf), pos0, n, &p, &mut want);
                let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
                assert_close(&format!("{ty} {p:?}"), &got, &want, 1e-6, 1e-7);
            }
        }
    }

    /// A call on a thread whose buffers are in use (a rayon thread running
    /// another call while it waits) takes buffers of its own: same result,
    /// no panic.
    #[test]
    fn a_nested_call_uses_buffers_of_its_own() {
        let p = params(8, 2, 64, None, None);
        let (pos0, n) = (300usize, 20usize);
        let kc = rand_vec(5, (pos0 + n) * p.kv_dim(), 2.0);
        let vc = rand_vec(6, (pos0 + n) * p.kv_dim(), 1.0);
        let q = rand_vec(7, n * p.q_dim(), 2.0);
        let one = Team::new(1).unwrap();
        let run = || {
            let mut out = vec![f32::NAN; n * p.q_dim()];
            attention_tiled_on(Par::Team(&one), &q, KvData::F32(&kc), KvData::F32(&vc), pos0, n, &p, &mut out);
            out
        };
        let free = run();
        let held = STAGING.with(|st| {
            let _staging = st.borrow_mut();
            SCRATCH.with(|sc| {
                let _scratch = sc.borrow_mut();
                run()
            })
        });
        assert_eq!(free, held);
    }
}
