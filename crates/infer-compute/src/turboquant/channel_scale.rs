//! The fixed per-channel scales of a TurboQuant cache's keys and values
//! ([`ChannelScale`]), shared by every backend that stores tq3 and tq4.

use crate::error::Result;
use crate::pipeline::{RopeSpec, RopeType};
use crate::weight::QuantWeight;

/// The power `p` of a value cache's scale `s_i = (1 / r_i)^p`
/// ([`ChannelScale::for_values`]). Whole benchmark text, `-c 2048`, tq3
/// (BENCHMARKS.md, "A fixed value scale"): Gemma 3 270M +3.23% → +2.32%
/// over the f16 cache at 1/2, +3.08% at 1.
pub const VALUE_SCALE_POWER: f64 = 0.5;

/// A fixed per-channel scale of a layer's keys (its inverse on the
/// queries) or values (its inverse on attention's output), one factor per
/// head channel. Keys ([`ChannelScale::from_qk_norms`]): from the layer's q and k norm
/// gains `g_q`, `g_k` (the same for every head):
/// `s_i = ((e_q + ε_q) / (e_k + ε_k))^(1/4)` with `e` the mean of the
/// squared gains over the channel's RoPE pair (RoPE mixes a pair's two
/// channels) and `ε` a thousandth of `e`'s mean. A key's coding error,
/// isotropic after the rotation, then lands less on the channels the
/// queries weigh most: `(Q_ii / K_ii)^(1/4)` minimizes the
/// query-weighted error `Σ Q_ii e_i²` of a rotated code, and the gains
/// set most of both energies. On Gemma 3 270M this cut the attention KL of
/// a tq4 key code about threefold (BENCHMARKS.md). Values:
/// [`ChannelScale::for_values`].
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

    /// The scale of a value cache's rows, from the layer's value matrix
    /// `wv` (`[n_head_kv · head_dim][n_embd]`) and the gain of the norm
    /// before it (`n_embd` values): with `w_c` the row of channel `c`
    /// times the gain, `r_i` is the mean over the kv heads of
    /// `‖w_{h,i}‖² / mean_k ‖w_{h,k}‖²` (the share of the head's variance
    /// its channel `i` gets from a normalized input of even channels), and
    /// `s_i = (1 / (r_i + 10⁻³))^p`, `p` = [`VALUE_SCALE_POWER`]. A
    /// rotated code spreads its error evenly over the channels; the scale
    /// moves it from the channels that carry little to those that carry
    /// much. Fixed per layer (no data), so every row of a slot, exact or
    /// coded, is stored the same way and attention's output divided by it
    /// once. `None` when the shapes disagree or a value is not finite.
    ///
    /// # Errors
    /// A weight type without a dequantizer.
    pub fn for_values(wv: &QuantWeight, norm_gain: &[f32], head_dim: usize) -> Result<Option<Self>> {
        let (rows, e) = (wv.rows, wv.cols);
        if head_dim == 0 || rows == 0 || rows % head_dim != 0 || norm_gain.len() != e {
            return Ok(None);
        }
        let mut row = vec![0.0f32; e];
        let mut share = vec![0.0f64; head_dim];
        let mut head = vec![0.0f64; head_dim];
        for h in 0..rows / head_dim {
            for (i, v) in head.iter_mut().enumerate() {
                crate::quant::dequantize_row(wv.ty, wv.row(h * head_dim + i), &mut row)?;
                *v = row.iter().zip(norm_gain).map(|(&w, &g)| (w as f64 * g as f64).powi(2)).sum();
            }
            let mean = head.iter().sum::<f64>() / head_dim as f64;
            if mean > 0.0 {
                share.iter_mut().zip(&head).for_each(|(s, v)| *s += v / mean);
            }
        }
        let n_heads = (rows / head_dim) as f64;
        let key: Vec<f32> =
            share.iter().map(|r| (1.0 / (r / n_heads + 1e-3)).powf(tune_p()) as f32).collect();
        if key.iter().any(|v| !v.is_finite() || *v <= 0.0) {
            return Ok(None);
        }
        let query = key.iter().map(|s| 1.0 / s).collect();
        Ok(Some(ChannelScale { key, query }))
    }

    /// The factor of each stored channel: a key's or a value's (`head_dim`
    /// values).
    pub fn key(&self) -> &[f32] {
        &self.key
    }

    /// The inverse factor, `1 / key` (`head_dim` values): a query's that
    /// meets the keys, or attention's output over the values.
    pub fn query(&self) -> &[f32] {
        &self.query
    }
}

fn tune_p() -> f64 { std::env::var("INFER_TQ_VP").ok().and_then(|s| s.parse().ok()).unwrap_or(VALUE_SCALE_POWER) } // TUNE
