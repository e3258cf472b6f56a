//! The fixed per-channel scale of a TurboQuant cache's keys
//! ([`ChannelScale`]), shared by every backend that stores tq3 and tq4.

use crate::pipeline::{RopeSpec, RopeType};

/// A fixed per-channel scale of a layer's keys (its inverse on the
/// queries), one factor per head channel, from the layer's q and k norm
/// gains `g_q`, `g_k` (the same for every head):
/// `s_i = ((e_q + ε_q) / (e_k + ε_k))^(1/4)` with `e` the mean of the
/// squared gains over the channel's RoPE pair (RoPE mixes a pair's two
/// channels) and `ε` a thousandth of `e`'s mean. A key's coding error,
/// isotropic after the rotation, then lands less on the channels the
/// queries weigh most: `(Q_ii / K_ii)^(1/4)` minimizes the
/// query-weighted error `Σ Q_ii e_i²` of a rotated code, and the gains
/// set most of both energies. On Gemma 3 270M this cut the attention KL of
/// a tq4 key code about threefold (BENCHMARKS.md).
#[derive(Clone, Debug)]
pub struct ChannelScale {
    key: Vec<f32>,
    query: Vec<f32>,
}

impl ChannelScale {
    /// The scale of `head_dim`-channel heads with q and k norm gains
    /// `q_gain`, `k_gain` and RoPE `rope`; `None` unless both have
    /// `head_dim` finite values.
    pub fn from_qk_norms(q_gain: &[f32], k_gain: &[f32], rope: &RopeSpec) -> Option<Self> {
        let d = q_gain.len();
        if k_gain.len() != d || d == 0 || q_gain.iter().chain(k_gain).any(|v| !v.is_finite()) {
            return None;
        }
        let n_rot = rope.n_rot.min(d) & !1;
        let partner = |i: usize| match rope.kind {
            _ if i >= n_rot => i,
            RopeType::Normal => i ^ 1,
            RopeType::NeoX => (i + n_rot / 2) % n_rot,
        };
        let energy = |g: &[f32]| -> Vec<f64> {
            let e: Vec<f64> = (0..d).map(|i| (g[i] as f64).powi(2) + (g[partner(i)] as f64).powi(2)).collect();
            let eps = 1e-3 * e.iter().sum::<f64>() / d as f64;
            e.iter().map(|v| v + eps).collect()
        };
        let (eq, ek) = (energy(q_gain), energy(k_gain));
        let key: Vec<f32> = eq.iter().zip(&ek).map(|(q, k)| (q / k).powf(0.25) as f32).collect();
        if key.iter().any(|v| !v.is_finite() || *v <= 0.0) {
            return None;
        }
        let query = key.iter().map(|s| 1.0 / s).collect();
        Some(ChannelScale { key, query })
    }

    /// The factor of each key channel (`head_dim` values).
    pub fn key(&self) -> &[f32] {
        &self.key
    }

    /// The factor of each query channel: `1 / key` (`head_dim` values).
    pub fn query(&self) -> &[f32] {
        &self.query
    }
}
