//! The rotation of a quantized KV cache's rows: keys (and the queries that
//! meet them) or values are stored rotated by an orthogonal `R`, attention
//! runs in the rotated basis (`⟨R q, R k⟩ = ⟨q, k⟩`; `Σ p_j R v_j = R Σ p_j
//! v_j`) and its output is rotated back once per head. Spreading a head's
//! outlier channels over all of its values is what lets a few bits per
//! value hold it.
//!
//! - q8_0 and q4_0, when `head_dim` is a multiple of 64: the normalized
//!   Sylvester–Hadamard matrix `H/√n` on blocks of `n` values, as llama.cpp
//!   does by default for a quantized cache since its PR 21038
//!   (`llama-kv-cache.cpp`: `n_rot_k` is the largest power of two from 64
//!   on dividing `head_dim`, `n_rot_v` is 64);
//! - tq3 and tq4: TurboQuant's own rotation of the whole head (random
//!   signs, then `H/√head_dim`; [`crate::turboquant::rotation`]); for
//!   the keys of a layer with q and k norms of one gain per head channel
//!   (Gemma 3, Qwen3), each key channel first multiplied by a fixed
//!   [`ChannelScale`] and each query channel divided by it (`⟨q/s, s⊙k⟩
//!   = ⟨q, k⟩`); values likewise by their layer's scale
//!   ([`ChannelScale::for_values`]), the output divided by it after it is
//!   rotated back (`Σ p_j s⊙v_j = s ⊙ Σ p_j v_j`).
//!
//! f32 and f16 caches are not rotated.

use std::sync::Arc;

use crate::kv_type::KvCacheType;
use crate::turboquant::rotation::fwht;
use crate::turboquant::{ChannelScale, TurboQuant};

/// How the rows of one cache (a layer's K or V) are rotated.
#[derive(Clone, Debug)]
pub enum KvRotation {
    /// `H/√n` on each block of `n` values (self-inverse).
    Hadamard(usize),
    /// TurboQuant's rotation of each head (the coder's `dim` values), the
    /// rows scaled per channel first where a [`ChannelScale`] is given.
    Turbo(Arc<TurboQuant>, Option<ChannelScale>),
}

impl KvRotation {
    /// The rotation of a key cache of `ty` (`None`: stored as computed).
    /// `tq` is the cache's coder for the TurboQuant types.
    pub fn for_keys(ty: KvCacheType, head_dim: usize, tq: Option<&Arc<TurboQuant>>) -> Option<Self> {
        Self::of(ty, head_dim, tq, true)
    }

    /// The rotation of a value cache of `ty` (as [`KvRotation::for_keys`]).
    pub fn for_values(ty: KvCacheType, head_dim: usize, tq: Option<&Arc<TurboQuant>>) -> Option<Self> {
        Self::of(ty, head_dim, tq, false)
    }

    fn of(ty: KvCacheType, head_dim: usize, tq: Option<&Arc<TurboQuant>>, keys: bool) -> Option<Self> {
        match ty {
            KvCacheType::Tq3 | KvCacheType::Tq4 => tq.map(|t| KvRotation::Turbo(t.clone(), None)),
            _ => ty.hadamard_block(head_dim, keys).map(KvRotation::Hadamard),
        }
    }

    /// This rotation with the stored rows scaled by `scale` first
    /// (TurboQuant only; the others are returned as they are).
    pub fn with_scale(self, scale: Option<ChannelScale>) -> Self {
        match self {
            KvRotation::Turbo(t, _) if scale.as_ref().is_some_and(|s| s.key().len() == t.dim()) => {
                KvRotation::Turbo(t, scale)
            }
            r => r,
        }
    }

    /// The scale in use, if any.
    pub fn scale(&self) -> Option<&ChannelScale> {
        match self {
            KvRotation::Turbo(_, s) => s.as_ref(),
            KvRotation::Hadamard(_) => None,
        }
    }

    /// `rows ← R rows`, block by block (`rows.len()` a multiple of
    /// `head_dim`, which the block divides), no scale.
    pub fn rotate(&self, rows: &mut [f32]) {
        match self {
            KvRotation::Hadamard(n) => rows.chunks_exact_mut(*n).for_each(hadamard),
            KvRotation::Turbo(t, _) => rows.chunks_exact_mut(t.dim()).for_each(|h| t.rotate_in_place(h)),
        }
    }

    /// `rows ← R (s ⊙ rows)` per head: keys or values as stored.
    pub fn rotate_stored(&self, rows: &mut [f32]) {
        self.rotate_scaled(rows, self.scale().map(|s| s.key()));
    }

    /// `rows ← R (rows / s)` per head: the queries that meet the keys.
    pub fn rotate_queries(&self, rows: &mut [f32]) {
        self.rotate_scaled(rows, self.scale().map(|s| s.query()));
    }

    /// `rows ← (R⁻¹ rows) / s` per head: attention's output over the
    /// values, back in the model's basis.
    pub fn unrotate_output(&self, rows: &mut [f32]) {
        self.unrotate(rows);
        scale_heads(rows, self.scale().map(|s| s.query()));
    }

    fn rotate_scaled(&self, rows: &mut [f32], s: Option<&[f32]>) {
        scale_heads(rows, s);
        self.rotate(rows);
    }

    /// `rows ← R⁻¹ rows` (as [`KvRotation::rotate`]; no scale).
    pub fn unrotate(&self, rows: &mut [f32]) {
        match self {
            KvRotation::Hadamard(n) => rows.chunks_exact_mut(*n).for_each(hadamard),
            KvRotation::Turbo(t, _) => rows.chunks_exact_mut(t.dim()).for_each(|h| t.unrotate(h)),
        }
    }
}

/// Each head of `rows` (`s.len()` values) times `s`, channel by channel.
fn scale_heads(rows: &mut [f32], s: Option<&[f32]>) {
    if let Some(s) = s {
        for h in rows.chunks_exact_mut(s.len()) {
            h.iter_mut().zip(s).for_each(|(v, &s)| *v *= s);
        }
    }
}

/// `x ← (H/√n) x`.
fn hadamard(x: &mut [f32]) {
    fwht(x);
    let s = 1.0 / (x.len() as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{RopeSpec, RopeType};

    #[test]
    fn sizes_as_llama_cpp_and_inverse() {
        let tq = TurboQuant::shared(128, 4).unwrap();
        let size = |r: Option<KvRotation>| match r {
            Some(KvRotation::Hadamard(n)) => n,
            Some(KvRotation::Turbo(t, _)) => 1000 + t.dim(),
            None => 0,
        };
        assert_eq!(size(KvRotation::for_keys(KvCacheType::Q4_0, 64, None)), 64);
        assert_eq!(size(KvRotation::for_keys(KvCacheType::Q8_0, 256, None)), 256);
        assert_eq!(size(KvRotation::for_keys(KvCacheType::Q4_0, 192, None)), 64);
        assert_eq!(size(KvRotation::for_values(KvCacheType::Q4_0, 256, None)), 64);
        assert_eq!(size(KvRotation::for_keys(KvCacheType::Q4_0, 96, None)), 0);
        assert_eq!(size(KvRotation::for_keys(KvCacheType::F16, 128, None)), 0);
        assert_eq!(size(KvRotation::for_values(KvCacheType::Tq4, 128, Some(&tq))), 1128);
        let x: Vec<f32> = (0..256).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.3).collect();
        for r in [KvRotation::Hadamard(64), KvRotation::Hadamard(256), KvRotation::Turbo(tq, None)] {
            let mut y = x.clone();
            r.rotate(&mut y);
            let (nx, ny): (f32, f32) = (x.iter().map(|v| v * v).sum(), y.iter().map(|v| v * v).sum());
            assert!((nx - ny).abs() <= 1e-4 * nx, "{r:?}: norm {nx} -> {ny}");
            assert!(x.iter().zip(&y).any(|(a, b)| (a - b).abs() > 0.1), "{r:?} changed nothing");
            r.unrotate(&mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= 1e-5, "{r:?}: {a} -> {b}");
            }
        }
    }

    /// The key scale: one factor per RoPE pair (NeoX halves, or adjacent
    /// channels), `(e_q/e_k)^(1/4)`; rotated scaled keys against rotated
    /// inverse-scaled queries keep every dot product; refused gains.
    #[test]
    fn key_scale_keeps_dot_products() {
        let rope = |kind, n_rot| RopeSpec { kind, base: 10000.0, n_rot, freq_scale: 1.0 };
        let q: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 * 0.25).collect();
        let k: Vec<f32> = (0..16).map(|i| 2.0 - i as f32 * 0.1).collect();
        let s = ChannelScale::from_qk_norms(&q, &k, &rope(RopeType::NeoX, 16)).unwrap();
        for i in 0..8 {
            assert_eq!(s.key()[i], s.key()[i + 8], "NeoX pair {i}");
            let e = |g: &[f32]| (g[i] as f64).powi(2) + (g[i + 8] as f64).powi(2);
            let eps = |g: &[f32]| 1e-3 * (0..16).map(|j| (g[j] as f64).powi(2) * 2.0).sum::<f64>() / 16.0;
            let want = ((e(&q) + eps(&q)) / (e(&k) + eps(&k))).powf(0.25) as f32;
            assert!((s.key()[i] - want).abs() <= 1e-6 * want, "{i}: {} vs {want}", s.key()[i]);
            assert!((s.query()[i] * s.key()[i] - 1.0).abs() < 1e-6);
        }
        let n = ChannelScale::from_qk_norms(&q, &k, &rope(RopeType::Normal, 12)).unwrap();
        assert!((0..6).all(|i| n.key()[2 * i] == n.key()[2 * i + 1]));
        assert!(ChannelScale::from_qk_norms(&q, &k[..8], &rope(RopeType::NeoX, 16)).is_none());
        let mut bad = k.clone();
        bad[3] = f32::NAN;
        assert!(ChannelScale::from_qk_norms(&q, &bad, &rope(RopeType::NeoX, 16)).is_none());
        // A zero gain (a channel the keys never use) gets a finite scale.
        let mut zero = k.clone();
        zero[2] = 0.0;
        zero[10] = 0.0;
        assert!(ChannelScale::from_qk_norms(&q, &zero, &rope(RopeType::NeoX, 16)).unwrap().key()[2].is_finite());

        let tq = TurboQuant::shared(16, 4).unwrap();
        let r = KvRotation::for_keys(KvCacheType::Tq4, 16, Some(&tq)).unwrap().with_scale(Some(s));
        assert!(r.scale().is_some());
        let (mut kr, mut qr): (Vec<f32>, Vec<f32>) =
            ((0..32).map(|i| (i as f32 * 0.7).sin()).collect(), (0..64).map(|i| (i as f32 * 0.3).cos()).collect());
        let (k0, q0) = (kr.clone(), qr.clone());
        r.rotate_stored(&mut kr);
        r.rotate_queries(&mut qr);
        for (qh, qh0) in qr.chunks_exact(16).zip(q0.chunks_exact(16)) {
            for (kh, kh0) in kr.chunks_exact(16).zip(k0.chunks_exact(16)) {
                let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
                assert!((dot(qh, kh) - dot(qh0, kh0)).abs() < 1e-4, "{} vs {}", dot(qh, kh), dot(qh0, kh0));
            }
        }
        // Scales of another head size, and other rotations, are not taken.
        let s8 = ChannelScale::from_qk_norms(&q[..8], &k[..8], &rope(RopeType::NeoX, 8));
        assert!(KvRotation::for_keys(KvCacheType::Tq4, 16, Some(&tq)).unwrap().with_scale(s8).scale().is_none());
        let s16 = ChannelScale::from_qk_norms(&q, &k, &rope(RopeType::NeoX, 16));
        assert!(KvRotation::Hadamard(64).with_scale(s16).scale().is_none());
    }

    /// Values stored with a scale: attention's output over them (a
    /// weighted sum of the stored rows), rotated back, is the weighted sum
    /// of the rows as computed.
    #[test]
    fn scaled_values_sum_back_to_the_unscaled_output() {
        use crate::GgmlType;
        let (hd, cols) = (16usize, 5usize);
        // Row r (channel r mod 16) grows with its channel.
        let w: Vec<Vec<f32>> = (0..2 * hd)
            .map(|r| (0..cols).map(|c| (((r * cols + c) * 7 % 11) as f32 - 5.0) * (1.0 + (r % hd) as f32)).collect())
            .collect();
        let wv = crate::conformance::ops::quantize(GgmlType::F32, cols, &w);
        let s = ChannelScale::for_values(&wv, &[1.0; 5], hd).unwrap().unwrap();
        let spread = s.key().iter().fold(0.0f32, |a, &v| a.max(v)) / s.key().iter().fold(f32::MAX, |a, &v| a.min(v));
        assert!(spread > 4.0, "a scale of spread {spread}");
        let tq = TurboQuant::shared(hd, 3).unwrap();
        let r = KvRotation::for_values(KvCacheType::Tq3, hd, Some(&tq)).unwrap().with_scale(Some(s));
        let rows: Vec<Vec<f32>> =
            (0..3).map(|j| (0..2 * hd).map(|i| ((i + 5 * j) as f32 * 0.37).sin()).collect()).collect();
        let p = [0.2f32, 0.5, 0.3];
        let mut out = vec![0.0f32; 2 * hd];
        let mut want = vec![0.0f32; 2 * hd];
        for (row, &pj) in rows.iter().zip(&p) {
            let mut stored = row.clone();
            r.rotate_stored(&mut stored);
            out.iter_mut().zip(&stored).for_each(|(o, &v)| *o += pj * v);
            want.iter_mut().zip(row).for_each(|(o, &v)| *o += pj * v);
        }
        r.unrotate_output(&mut out);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
        }
    }
}
