//! The fixed per-channel scales of a TurboQuant cache's keys and values
//! ([`ChannelScale`]), shared by every backend that stores tq3 and tq4.

use crate::error::Result;
use crate::kv_type::TQ_VALUE_SCALE_POWER;
use crate::pipeline::{RopeSpec, RopeType};
use crate::weight::QuantWeight;
use rayon::prelude::*;

/// A fixed per-channel scale of a layer's keys (its inverse on the
/// queries) or values (its inverse on attention's output), one factor per
/// head channel. Keys ([`ChannelScale::from_qk_norms`]): from the layer's
/// q and k norm gains `g_q`, `g_k` (the same for every head):
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
        Self::from_stored(eq.iter().zip(&ek).map(|(q, k)| (q / k).powf(0.25) as f32).collect())
    }

    /// The scale of stored factors `key` and their inverses; `None` unless
    /// every factor is finite and positive.
    fn from_stored(key: Vec<f32>) -> Option<Self> {
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
    /// `s_i = (1 / (r_i + 10⁻³))^p`, `p` = [`TQ_VALUE_SCALE_POWER`]. A
    /// rotated code spreads its error evenly over the channels; the scale
    /// moves it from the channels that carry little to those that carry
    /// much. Fixed per layer (no data), so every row of a slot, exact or
    /// coded, is stored the same way and attention's output divided by it
    /// once. `None` when the shapes disagree, every row is 0 or a value is
    /// not finite.
    ///
    /// # Errors
    /// A weight type without a dequantizer.
    pub fn for_values(wv: &QuantWeight, norm_gain: &[f32], head_dim: usize) -> Result<Option<Self>> {
        let (rows, e) = (wv.rows, wv.cols);
        if head_dim == 0 || rows == 0 || rows % head_dim != 0 || norm_gain.len() != e {
            return Ok(None);
        }
        // Every model a GPU backend prepares computes this (8B: 32 Ki rows
        // of 4096), so the rows are dequantized in parallel.
        let energy: Vec<f64> = (0..rows)
            .into_par_iter()
            .map_init(
                || vec![0.0f32; e],
                |row, r| {
                    crate::quant::dequantize_row(wv.ty, wv.row(r), row)?;
                    Ok(row.iter().zip(norm_gain).map(|(&w, &g)| (w as f64 * g as f64).powi(2)).sum())
                },
            )
            .collect::<Result<_>>()?;
        let mut share = vec![0.0f64; head_dim];
        let mut n_heads = 0usize;
        for head in energy.chunks_exact(head_dim) {
            let mean = head.iter().sum::<f64>() / head_dim as f64;
            if mean > 0.0 {
                share.iter_mut().zip(head).for_each(|(s, v)| *s += v / mean);
                n_heads += 1;
            }
        }
        if n_heads == 0 {
            return Ok(None);
        }
        let share = share.iter().map(|r| r / n_heads as f64);
        Ok(Self::from_stored(share.map(|r| (1.0 / (r + 1e-3)).powf(TQ_VALUE_SCALE_POWER) as f32).collect()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgmlType;

    fn f32_matrix(rows: usize, cols: usize, v: &[f32]) -> QuantWeight {
        assert_eq!(v.len(), rows * cols);
        crate::conformance::ops::quantize(GgmlType::F32, cols, &v.chunks(cols).map(<[f32]>::to_vec).collect::<Vec<_>>())
    }

    /// Two heads of 4 channels over 3 inputs: head 0's channels of squared
    /// norms 1, 1, 4, 4 (shares 0.4, 0.4, 1.6, 1.6), head 1's even
    /// (shares 1); the norm's gain weighs the inputs.
    #[test]
    fn value_scale_follows_each_channels_share_of_its_head() {
        #[rustfmt::skip]
        let w = [
            1.0, 0.0, 0.0,  0.0, 1.0, 0.0,  2.0, 0.0, 0.0,  0.0, 0.0, 2.0,
            0.0, 1.0, 0.0,  1.0, 0.0, 0.0,  0.0, 0.0, 1.0,  0.0, 1.0, 0.0,
        ];
        let s = ChannelScale::for_values(&f32_matrix(8, 3, &w), &[1.0; 3], 4).unwrap().unwrap();
        for (i, r) in [0.7f64, 0.7, 1.3, 1.3].into_iter().enumerate() {
            let want = (1.0 / (r + 1e-3)).powf(TQ_VALUE_SCALE_POWER) as f32;
            assert!((s.key()[i] - want).abs() <= 1e-6 * want, "channel {i}: {} want {want}", s.key()[i]);
            assert!((s.key()[i] * s.query()[i] - 1.0).abs() <= 1e-6);
        }
        // Doubling input 2 (the gain): head 0's norms 1, 1, 4, 16 and head
        // 1's 1, 1, 4, 1; the last channel's share grows, its scale shrinks.
        let g = ChannelScale::for_values(&f32_matrix(8, 3, &w), &[1.0, 1.0, 2.0], 4).unwrap().unwrap();
        assert!(g.key()[3] < s.key()[3] && g.key()[0] > s.key()[0]);
        // Shapes that disagree, and a matrix of zeros: no scale.
        assert!(ChannelScale::for_values(&f32_matrix(8, 3, &w), &[1.0; 2], 4).unwrap().is_none());
        assert!(ChannelScale::for_values(&f32_matrix(8, 3, &w), &[1.0; 3], 3).unwrap().is_none());
        assert!(ChannelScale::for_values(&f32_matrix(8, 3, &[0.0; 24]), &[1.0; 3], 4).unwrap().is_none());
    }
}
