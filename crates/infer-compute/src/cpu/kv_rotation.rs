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
//!   signs, then `H/√head_dim`; [`crate::turboquant::rotation`]).
//!
//! f32 and f16 caches are not rotated.

use std::sync::Arc;

use crate::kv_type::KvCacheType;
use crate::turboquant::rotation::fwht;
use crate::turboquant::TurboQuant;

/// How the rows of one cache (a layer's K or V) are rotated.
#[derive(Clone, Debug)]
pub enum KvRotation {
    /// `H/√n` on each block of `n` values (self-inverse).
    Hadamard(usize),
    /// TurboQuant's rotation of each head (the coder's `dim` values).
    Turbo(Arc<TurboQuant>),
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
            KvCacheType::Q8_0 | KvCacheType::Q4_0 if head_dim.is_multiple_of(64) => {
                let mut n = 64;
                while keys && head_dim.is_multiple_of(2 * n) {
                    n *= 2;
                }
                Some(KvRotation::Hadamard(n))
            }
            KvCacheType::Tq3 | KvCacheType::Tq4 => tq.map(|t| KvRotation::Turbo(t.clone())),
            _ => None,
        }
    }

    /// `rows ← R rows`, block by block (`rows.len()` a multiple of
    /// `head_dim`, which the block divides).
    pub fn rotate(&self, rows: &mut [f32]) {
        match self {
            KvRotation::Hadamard(n) => rows.chunks_exact_mut(*n).for_each(hadamard),
            KvRotation::Turbo(t) => rows.chunks_exact_mut(t.dim()).for_each(|h| t.rotate_in_place(h)),
        }
    }

    /// `rows ← R⁻¹ rows` (as [`KvRotation::rotate`]).
    pub fn unrotate(&self, rows: &mut [f32]) {
        match self {
            KvRotation::Hadamard(n) => rows.chunks_exact_mut(*n).for_each(hadamard),
            KvRotation::Turbo(t) => rows.chunks_exact_mut(t.dim()).for_each(|h| t.unrotate(h)),
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

    #[test]
    fn sizes_as_llama_cpp_and_inverse() {
        let tq = TurboQuant::shared(128, 4).unwrap();
        let size = |r: Option<KvRotation>| match r {
            Some(KvRotation::Hadamard(n)) => n,
            Some(KvRotation::Turbo(t)) => 1000 + t.dim(),
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
        for r in [KvRotation::Hadamard(64), KvRotation::Hadamard(256), KvRotation::Turbo(tq)] {
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
}
