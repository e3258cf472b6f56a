//! Rotary position embedding (Su et al. 2021, "RoFormer"), as ggml's
//! `ggml_rope_ext` computes it on the CPU for modes NORM (0) and NEOX (2),
//! without YaRN (`ext_factor = 0`, `attn_factor = 1`, no frequency factors).
//!
//! For a head `x: [head_dim]` at position `p`, pair `i` in `0..n_rot/2` is
//! rotated by the angle
//!
//! `θ_i = freq_scale · p · base^(-2i/n_rot)`
//!
//! as `(a, b) ← (a·cos θ_i − b·sin θ_i, a·sin θ_i + b·cos θ_i)`, where the pair
//! is `(x[2i], x[2i+1])` for [`RopeType::Normal`] and `(x[i], x[i + n_rot/2])`
//! for [`RopeType::NeoX`]. Dimensions `n_rot..head_dim` are left untouched
//! (partial rotation).
//!
//! The angles are formed in f32 exactly as ggml's `ggml_rope_cache_init` /
//! `rope_yarn` do, so that results follow llama.cpp closely:
//! `theta_scale = powf(base, -2.0f / n_rot)`, `theta = (float) p`, and for
//! each pair `cos/sin(freq_scale · theta)` then `theta *= theta_scale`.
//! This recurrence carries a relative angle error of about `(2i + 2)·2⁻²⁴` for
//! pair `i` (ggml's own error, kept on purpose); at position 4096 with
//! `n_rot = 128` that is up to ~0.03 rad on the slowest-decaying pairs.

use crate::pipeline::{RopeSpec, RopeType};

/// Rotates one pair of values by `(cos, sin)`.
#[inline(always)]
fn rot(a: f32, b: f32, c: f32, s: f32) -> (f32, f32) {
    (a * c - b * s, a * s + b * c)
}

/// Index of the partner of dimension `i` for pair `i` (pair index), and of
/// the first element: Normal `(2i, 2i+1)`, NeoX `(i, i + n_rot/2)`.
#[inline(always)]
fn pair(kind: RopeType, i: usize, n_rot: usize) -> (usize, usize) {
    match kind {
        RopeType::Normal => (2 * i, 2 * i + 1),
        RopeType::NeoX => (i, i + n_rot / 2),
    }
}

/// Applies pair `i`'s rotation `(c, s)` to every head of `x`.
#[inline(always)]
fn rotate_pair_all_heads(x: &mut [f32], head_dim: usize, kind: RopeType, n_rot: usize, i: usize, c: f32, s: f32) {
    let (i0, i1) = pair(kind, i, n_rot);
    for h in x.chunks_exact_mut(head_dim) {
        let (a, b) = rot(h[i0], h[i1], c, s);
        h[i0] = a;
        h[i1] = b;
    }
}

fn debug_check(x: &[f32], n_head: usize, head_dim: usize, spec: &RopeSpec) {
    debug_assert_eq!(x.len(), n_head * head_dim, "x must be [n_head, head_dim]");
    debug_assert!(spec.n_rot <= head_dim && spec.n_rot.is_multiple_of(2), "n_rot must be even and <= head_dim");
    let _ = (x, n_head, head_dim, spec);
}

/// RoPE in place on one token: `x: [n_head, head_dim]` (row-major) at
/// position `pos`; rotates the first `spec.n_rot` dimensions of each head
/// (see the module docs for the formula and pairing). Source: ggml
/// `ggml_rope_ext`, modes NORM and NEOX.
///
/// Each angle's cos/sin is computed once and shared by all heads (no
/// allocation, `n_rot/2` sin/cos pairs per call).
///
/// Contract (debug-asserted): `x.len() == n_head · head_dim`, `spec.n_rot`
/// even and `<= head_dim`; `pos < 2²⁴` (exact as f32).
pub fn rope(x: &mut [f32], n_head: usize, head_dim: usize, pos: usize, spec: &RopeSpec) {
    debug_check(x, n_head, head_dim, spec);
    let n_rot = spec.n_rot;
    if n_rot == 0 || head_dim == 0 {
        return;
    }
    let theta_scale = spec.base.powf(-2.0f32 / n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        let t = spec.freq_scale * theta;
        rotate_pair_all_heads(x, head_dim, spec.kind, n_rot, i, t.cos(), t.sin());
        theta *= theta_scale;
    }
}

/// RoPE in place on `n_tokens` consecutive tokens (prefill):
/// `x: [n_tokens, n_head, head_dim]`, token `t` at position `pos0 + t`.
/// Same result as [`rope`] per token.
///
/// Contract (debug-asserted): `x.len() == n_tokens · n_head · head_dim`, as [`rope`].
pub fn rope_tokens(x: &mut [f32], n_tokens: usize, n_head: usize, head_dim: usize, pos0: usize, spec: &RopeSpec) {
    debug_assert_eq!(x.len(), n_tokens * n_head * head_dim);
    let row = n_head * head_dim;
    if row == 0 {
        return;
    }
    for (t, xt) in x.chunks_exact_mut(row).enumerate() {
        rope(xt, n_head, head_dim, pos0 + t, spec);
    }
}

/// Precomputed `cos θ_i` and `sin θ_i` for positions `0..n_pos` of one
/// [`RopeSpec`] (layout `[n_pos, n_rot/2]` each), bit-identical to what
/// [`rope`] computes on the fly.
///
/// Worth it when the same positions are rotated many times: every layer
/// sharing a spec rotates q and k at the same position (Gemma 3 has two
/// specs for 18+ layers), so a table turns `2 · n_layer · n_rot/2` sin/cos
/// pairs per token into lookups. It costs `n_pos · n_rot · 4` bytes
/// (32 768 positions × 128 dims = 16 MiB), so build it for the context
/// actually used. For a single decode step [`rope`] is already cheap next
/// to the mat-vecs.
#[derive(Clone, Debug)]
pub struct RopeCache {
    spec: RopeSpec,
    n_pos: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeCache {
    /// Builds the table for positions `0..n_pos`.
    ///
    /// Contract (debug-asserted): `spec.n_rot` even.
    pub fn new(spec: &RopeSpec, n_pos: usize) -> Self {
        debug_assert!(spec.n_rot.is_multiple_of(2));
        let half = spec.n_rot / 2;
        let mut cos = Vec::with_capacity(n_pos * half);
        let mut sin = Vec::with_capacity(n_pos * half);
        if half > 0 {
            let theta_scale = spec.base.powf(-2.0f32 / spec.n_rot as f32);
            for p in 0..n_pos {
                let mut theta = p as f32;
                for _ in 0..half {
                    let t = spec.freq_scale * theta;
                    cos.push(t.cos());
                    sin.push(t.sin());
                    theta *= theta_scale;
                }
            }
        }
        RopeCache { spec: *spec, n_pos, cos, sin }
    }

    /// The spec this table was built for.
    pub fn spec(&self) -> &RopeSpec {
        &self.spec
    }

    /// Number of positions in the table.
    pub fn n_pos(&self) -> usize {
        self.n_pos
    }

    /// `(cos, sin)` of position `pos`, each `[n_rot/2]`.
    ///
    /// Contract (debug-asserted): `pos < n_pos`.
    pub fn row(&self, pos: usize) -> (&[f32], &[f32]) {
        debug_assert!(pos < self.n_pos);
        let half = self.spec.n_rot / 2;
        let r = pos * half..(pos + 1) * half;
        (&self.cos[r.clone()], &self.sin[r])
    }

    /// [`rope`] from the table: `x: [n_head, head_dim]` at position `pos`.
    ///
    /// Contract (debug-asserted): as [`rope`], and `pos < n_pos`.
    pub fn apply(&self, x: &mut [f32], n_head: usize, head_dim: usize, pos: usize) {
        debug_check(x, n_head, head_dim, &self.spec);
        if self.spec.n_rot == 0 || head_dim == 0 {
            return;
        }
        let (c, s) = self.row(pos);
        for (i, (&c, &s)) in c.iter().zip(s).enumerate() {
            rotate_pair_all_heads(x, head_dim, self.spec.kind, self.spec.n_rot, i, c, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    const EPS32: f64 = 1.0 / (1u64 << 24) as f64;

    /// The textbook formula in f64: exact angles, explicit pairing.
    fn rope_ref(x: &[f32], n_head: usize, hd: usize, pos: usize, spec: &RopeSpec, angles: &[f64]) -> Vec<f64> {
        let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let n_rot = spec.n_rot;
        for h in 0..n_head {
            let b = h * hd;
            for i in 0..n_rot / 2 {
                let (i0, i1) = match spec.kind {
                    RopeType::Normal => (2 * i, 2 * i + 1),
                    RopeType::NeoX => (i, i + n_rot / 2),
                };
                let (c, s) = (angles[i].cos(), angles[i].sin());
                let (a, bb) = (x[b + i0] as f64, x[b + i1] as f64);
                y[b + i0] = a * c - bb * s;
                y[b + i1] = a * s + bb * c;
            }
        }
        let _ = pos;
        y
    }

    fn exact_angles(pos: usize, spec: &RopeSpec) -> Vec<f64> {
        (0..spec.n_rot / 2)
            .map(|i| spec.freq_scale as f64 * pos as f64 * (spec.base as f64).powf(-2.0 * i as f64 / spec.n_rot as f64))
            .collect()
    }

    /// ggml's f32 angle recurrence, widened to f64 afterwards.
    fn ggml_angles(pos: usize, spec: &RopeSpec) -> Vec<f64> {
        let ts = spec.base.powf(-2.0f32 / spec.n_rot as f32);
        let mut theta = pos as f32;
        (0..spec.n_rot / 2)
            .map(|_| {
                let t = spec.freq_scale * theta;
                theta *= ts;
                t as f64
            })
            .collect()
    }

    fn specs() -> Vec<(usize, RopeSpec)> {
        let mk = |kind, base, n_rot, freq_scale| RopeSpec { kind, base, n_rot, freq_scale };
        let mut v = Vec::new();
        for kind in [RopeType::Normal, RopeType::NeoX] {
            v.push((64, mk(kind, 10_000.0, 64, 1.0)));
            v.push((256, mk(kind, 1_000_000.0, 256, 1.0)));
            v.push((80, mk(kind, 10_000.0, 32, 1.0))); // partial
            v.push((10, mk(kind, 500.0, 6, 0.25))); // partial + linear scaling
            v.push((7, mk(kind, 10_000.0, 2, 0.5))); // odd head_dim, one pair
        }
        v
    }

    #[test]
    fn rope_matches_f64_formula() {
        let n_head = 3;
        for (case, (hd, spec)) in specs().into_iter().enumerate() {
            for (k, &pos) in [0usize, 1, 7, 640, 1000, 4099].iter().enumerate() {
                let seed = (case * 10 + k) as u64;
                let x = rand_vec(seed, n_head * hd, 2.0);
                let mut y = x.clone();
                rope(&mut y, n_head, hd, pos, &spec);
                let what = format!("{:?} hd={hd} n_rot={} fs={} pos={pos}", spec.kind, spec.n_rot, spec.freq_scale);

                // 1. Against ggml's f32 angles rotated in f64: tight.
                let want = rope_ref(&x, n_head, hd, pos, &spec, &ggml_angles(pos, &spec));
                assert_close(&format!("{what} (ggml angles)"), &y, &want, 1e-5, 1e-6);

                // 2. Against the exact formula: within the recurrence's
                //    angle error θ·(2i+2)·2⁻²⁴ ≤ p·fs·(n_rot+2)·2⁻²⁴, times |x| ≤ 2·√2.
                let want = rope_ref(&x, n_head, hd, pos, &spec, &exact_angles(pos, &spec));
                let bound = 3.0 * (pos as f64 * spec.freq_scale as f64 * (spec.n_rot + 2) as f64 * EPS32 + EPS32);
                assert_close(&format!("{what} (exact)"), &y, &want, 1e-5, bound + 1e-6);

                // Partial rotation: the tail is untouched, bit for bit.
                for h in 0..n_head {
                    assert_eq!(
                        &y[h * hd + spec.n_rot..(h + 1) * hd],
                        &x[h * hd + spec.n_rot..(h + 1) * hd],
                        "{what}: tail"
                    );
                }
            }
        }
    }

    #[test]
    fn rope_pos0_is_identity_and_norm_is_kept() {
        for (hd, spec) in specs() {
            let x = rand_vec(77, 2 * hd, 1.0);
            let mut y = x.clone();
            rope(&mut y, 2, hd, 0, &spec);
            assert_eq!(x, y);
            rope(&mut y, 2, hd, 123, &spec);
            let n0: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
            let n1: f64 = y.iter().map(|&v| (v as f64).powi(2)).sum();
            assert!((n0 - n1).abs() <= 1e-5 * n0);
        }
    }

    #[test]
    fn normal_and_neox_pair_differently() {
        // One head, n_rot = 4, only x[1] set: Normal moves it into x[0],
        // NeoX (pairs (0,2), (1,3)) into x[3].
        let mk = |kind| RopeSpec { kind, base: 10_000.0, n_rot: 4, freq_scale: 1.0 };
        let mut a = vec![0.0, 1.0, 0.0, 0.0, 5.0];
        rope(&mut a, 1, 5, 1, &mk(RopeType::Normal));
        assert!(a[0] != 0.0 && a[2] == 0.0 && a[3] == 0.0 && a[4] == 5.0, "{a:?}");
        let mut b = vec![0.0, 1.0, 0.0, 0.0, 5.0];
        rope(&mut b, 1, 5, 1, &mk(RopeType::NeoX));
        assert!(b[0] == 0.0 && b[2] == 0.0 && b[3] != 0.0 && b[4] == 5.0, "{b:?}");
    }

    #[test]
    fn cache_and_tokens_equal_rope() {
        for (hd, spec) in specs() {
            let n_head = 2;
            let cache = RopeCache::new(&spec, 50);
            let n_tok = 5;
            let pos0 = 43;
            let x = rand_vec(91, n_tok * n_head * hd, 3.0);
            let mut by_tokens = x.clone();
            rope_tokens(&mut by_tokens, n_tok, n_head, hd, pos0, &spec);
            for t in 0..n_tok {
                let r = t * n_head * hd..(t + 1) * n_head * hd;
                let mut a = x[r.clone()].to_vec();
                let mut b = a.clone();
                rope(&mut a, n_head, hd, pos0 + t, &spec);
                cache.apply(&mut b, n_head, hd, pos0 + t);
                assert_eq!(a, b, "cache differs from rope");
                assert_eq!(a, &by_tokens[r], "rope_tokens differs from rope");
            }
        }
    }
}
