//! Attention of one layer over TurboQuant caches that read a query's recent
//! rows exact ([`crate::kv_type::TQ_WINDOW`]; [`KvBuf::window`]).
//!
//! A query at position `i` reads rows `i − w < j ≤ i` (`w` the window) in
//! f16 and older rows as stored (codes, the slot's first positions exact).
//! The one softmax over both is computed as two parts merged by their
//! log-sum-exps, as FlashDecoding merges the splits of a sequence (Dao et
//! al. 2023), each part by the tiled kernel ([`attention_tiled_lse`]):
//!
//! - recent: the span's queries over a scratch copy of rows
//!   `pos0 − w + 1 .. pos0 + n` in f32, with a sliding window of `w` (or
//!   the layer's, if shorter); rows before the span from the slot's ring
//!   ([`KvData::recent_row_to_f32`]), the span's own rows rounded to f16
//!   as the ring keeps them;
//! - older: the queries at `i ≥ w` over the cache as stored, each as a
//!   query at `i − w` (causal up to `i − w`), the layer's window shortened
//!   by `w`.
//!
//! A span's rows enter the ring after its attention ([`KvBuf::keep_recent`]),
//! so that its first queries still find the rows before it. A query's
//! result depends only on its position and the rows, not on how the prompt
//! was cut into chunks: prefill and decode read the same values.

use super::kv_cache::{round_f16, KvBuf, KvData};
use super::ops::attn_tiled::{attention_tiled_lse, merge_lse};
use super::ops::AttnParams;
use super::team::Par;
use crate::backend::Span;

/// Attention of a batch's `spans` (`q`, `out`: `[n_tok, n_head, head_dim]`)
/// over one layer's caches `k` and `v` of `n_ctx` positions per slot, one
/// of them or both with a window, the batch's rows already written
/// ([`KvBuf::write_row`]); `fresh` holds those rows as written
/// (`[n_tok, kv_dim]`, the cache's basis). Then keeps each span's rows among
/// its slot's recent rows.
#[allow(clippy::too_many_arguments)]
pub fn attend_windowed(
    par: Par<'_>,
    q: &[f32],
    (k, v): (&mut KvBuf, &mut KvBuf),
    fresh: (&[f32], &[f32]),
    n_ctx: usize,
    spans: &[Span],
    p: &AttnParams,
    out: &mut [f32],
) {
    let w = k.window().max(v.window());
    debug_assert!(w > 0, "no window");
    let (qd, kvd) = (p.q_dim(), p.kv_dim());
    for s in spans {
        let (t0, n) = (s.start, s.len);
        let (qs, os) = (&q[t0 * qd..(t0 + n) * qd], &mut out[t0 * qd..(t0 + n) * qd]);
        let mut lse = vec![0.0f32; n * p.n_head];
        // The recent part.
        let b0 = s.pos0.saturating_sub(w - 1);
        let rows = s.pos0 + n - b0;
        let (kd, vd) = (k.view(), v.view());
        let (kb, vb) = (
            recent_rows(kd, k.window() > 0, s, b0, n_ctx, &fresh.0[t0 * kvd..(t0 + n) * kvd]),
            recent_rows(vd, v.window() > 0, s, b0, n_ctx, &fresh.1[t0 * kvd..(t0 + n) * kvd]),
        );
        debug_assert_eq!(kb.len(), rows * kvd);
        let pr = AttnParams { window: Some(p.window.map_or(w, |x| x.min(w))), ..*p };
        attention_tiled_lse(par, qs, KvData::F32(&kb), KvData::F32(&vb), s.pos0 - b0, n, &pr, os, Some(&mut lse));
        // The older part: none where the layer's own window is within `w`.
        let older = match p.window {
            Some(x) if x <= w => None,
            x => Some(x.map(|x| x - w)),
        };
        let a0 = s.pos0.max(w);
        if let Some(window) = older.filter(|_| a0 < s.pos0 + n) {
            let (ta, na) = (a0 - s.pos0, s.pos0 + n - a0);
            let slot_len = n_ctx * kvd;
            let (kc, vc) = (kd.sub(s.slot * slot_len, slot_len), vd.sub(s.slot * slot_len, slot_len));
            let mut oa = vec![0.0f32; na * qd];
            let mut la = vec![0.0f32; na * p.n_head];
            let pa = AttnParams { window, ..*p };
            attention_tiled_lse(par, &qs[ta * qd..], kc, vc, a0 - w, na, &pa, &mut oa, Some(&mut la));
            merge_lse(&mut os[ta * qd..], &mut lse[ta * p.n_head..], &oa, &la, p.head_dim);
        }
        for t in n.saturating_sub(w)..n {
            let at = (t0 + t) * kvd;
            k.keep_recent(s.slot, s.pos0 + t, &fresh.0[at..at + kvd]);
            v.keep_recent(s.slot, s.pos0 + t, &fresh.1[at..at + kvd]);
        }
    }
}

/// Rows `b0 .. s.pos0 + s.len` of span `s`'s slot as its recent part reads
/// them, f32: with a window (`windowed`), rows before the span from the
/// ring and the span's own (`fresh`) rounded to f16; without, every row as
/// stored.
fn recent_rows(c: KvData<'_>, windowed: bool, s: &Span, b0: usize, n_ctx: usize, fresh: &[f32]) -> Vec<f32> {
    let kvd = fresh.len() / s.len;
    let mut buf = vec![0.0f32; (s.pos0 + s.len - b0) * kvd];
    for (j, row) in (b0..).zip(buf.chunks_exact_mut(kvd)) {
        if !windowed {
            c.to_f32((s.slot * n_ctx + j) * kvd, row);
        } else if j < s.pos0 {
            c.recent_row_to_f32(s.slot, n_ctx, j, row);
        } else {
            let f = &fresh[(j - s.pos0) * kvd..][..kvd];
            row.iter_mut().zip(f).for_each(|(o, &x)| *o = round_f16(x));
        }
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::Rng;
    use crate::kv_type::{KvCacheType, TQ_WINDOW};

    /// The softmax attention of query `qh` (one head, kv head `g`) at `i`
    /// over rows `lo..=i`, each row `j` read by `row(j)`, in f64.
    fn naive(qh: &[f32], i: usize, p: &AttnParams, g: usize, rows: &dyn Fn(usize, bool) -> Vec<f32>) -> Vec<f64> {
        let (hd, lo) = (p.head_dim, p.first_pos(i));
        let logits: Vec<f64> = (lo..=i)
            .map(|j| {
                let k = &rows(j, true)[g * hd..][..hd];
                let s = qh.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * p.scale as f64;
                p.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
            })
            .collect();
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        let mut o = vec![0.0f64; hd];
        for (j, w) in (lo..=i).zip(&e) {
            let v = &rows(j, false)[g * hd..][..hd];
            o.iter_mut().zip(v).for_each(|(o, &v)| *o += w / sum * v as f64);
        }
        o
    }

    /// Chunks of every length class (single tokens, chunks inside and
    /// across the window, one longer than it) fed into slot 1 of a
    /// two-slot pool: each query's output equals the per-pair reference
    /// (recent rows as f16 of what was written, older ones decoded), for
    /// tq4/tq3 keys and values, one side f16, with and without a sliding
    /// window (shorter and longer than the recent window) and a softcap.
    #[test]
    fn windowed_attention_matches_the_per_pair_reference() {
        let w = TQ_WINDOW;
        let (n_kv, hd, n_head) = (2usize, 64usize, 4usize);
        let kvd = n_kv * hd;
        let chunks = [1usize, 5, 3 * w / 2, 1, 1, 37, w + 9, 2];
        let n_ctx: usize = chunks.iter().sum::<usize>() + 3;
        let p0 = AttnParams { n_head, n_head_kv: n_kv, head_dim: hd, scale: 0.3, softcap: None, window: None };
        let params = [
            p0,
            AttnParams { window: Some(w / 2), ..p0 },
            AttnParams { window: Some(w + 40), softcap: Some(5.0), ..p0 },
        ];
        let types = [(KvCacheType::Tq4, KvCacheType::Tq4), (KvCacheType::Tq3, KvCacheType::F16)];
        for p in params {
            for (kt, vt) in types {
                let mut rng = Rng::new(11);
                let mk = |ty| KvBuf::zeroed_slots(ty, 2, n_ctx, (n_kv, hd), "test").unwrap();
                let (mut k, mut v) = (mk(kt), mk(vt));
                let (mut ks, mut vs) = (Vec::new(), Vec::new()); // every row written, slot 1
                let mut pos0 = 0;
                for &n in &chunks {
                    // Keys with a shared mean, as real keys have.
                    let kx: Vec<f32> = rng.normals(n * kvd, 1.0).iter().map(|x| x + 0.7).collect();
                    let vx = rng.normals(n * kvd, 1.0);
                    let q = rng.normals(n * n_head * hd, 1.0);
                    for t in 0..n {
                        let at = (n_ctx + pos0 + t) * kvd;
                        k.write_row(at, &kx[t * kvd..][..kvd]);
                        v.write_row(at, &vx[t * kvd..][..kvd]);
                    }
                    ks.extend_from_slice(&kx);
                    vs.extend_from_slice(&vx);
                    let span = Span { slot: 1, pos0, start: 0, len: n };
                    let mut out = vec![f32::NAN; n * n_head * hd];
                    attend_windowed(Par::Rayon, &q, (&mut k, &mut v), (&kx, &vx), n_ctx, &[span], &p, &mut out);
                    for t in 0..n {
                        let i = pos0 + t;
                        let rows = |j: usize, key: bool| {
                            let (c, all, ty) = if key { (&k, &ks, kt) } else { (&v, &vs, vt) };
                            let mut r = vec![0.0f32; kvd];
                            if i - j < w && matches!(ty, KvCacheType::Tq3 | KvCacheType::Tq4) {
                                r.iter_mut().zip(&all[j * kvd..][..kvd]).for_each(|(o, &x)| *o = round_f16(x));
                            } else {
                                c.view().to_f32((n_ctx + j) * kvd, &mut r);
                            }
                            r
                        };
                        for h in 0..n_head {
                            let qh = &q[(t * n_head + h) * hd..][..hd];
                            let want = naive(qh, i, &p, h / (n_head / n_kv), &rows);
                            let got = &out[(t * n_head + h) * hd..][..hd];
                            for (d, (&g, &e)) in got.iter().zip(&want).enumerate() {
                                assert!(
                                    (g as f64 - e).abs() <= 2e-5 * (1.0 + e.abs()),
                                    "{p:?} {kt}/{vt}: position {i} head {h} value {d}: {g} vs {e}"
                                );
                            }
                        }
                    }
                    pos0 += n;
                }
            }
        }
    }
}
