//! The candidates of a step's output rows ([`TopK`]): per row the `k`
//! largest logits with their token ids, the row's largest logit, the
//! logarithm of its softmax normalizer and its first NaN, so that a
//! sampler that looks only at the most likely tokens (top-k, greedy) and
//! the log-probabilities of those tokens need no more of the row.
//! [`DeviceModel::forward_top_k`](super::DeviceModel::forward_top_k) fills
//! one; [`TopK::fill_from_logits`] is the host reference every backend
//! matches.

use crate::error::{shape_err, Result};

/// The largest `k` that [`DeviceModel::forward_top_k`](super::DeviceModel::forward_top_k)
/// takes (the device kernels keep the candidates of a row in shared memory).
pub const TOP_K_MAX: usize = 128;

/// The whole-row statistics of one output row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// The largest logit of the row (`-inf` for a row of nothing but
    /// `-inf`; meaningless when [`RowStats::first_nan`] is set).
    pub max: f32,
    /// `ln Σ exp(xᵢ − max)` over every logit `xᵢ` of the row, a logit equal
    /// to `max` counting 1 and `-inf` (below `max`) counting 0; so the
    /// natural-log probability of token `i` under the temperature-1 softmax
    /// is `xᵢ − max − log_sum_exp`. In `[0, ln n_vocab]`. The host reference
    /// sums in `f64`, a device in `f32` (a relative difference of about
    /// 1e-6).
    pub log_sum_exp: f32,
    /// The lowest index of a NaN logit, `None` when there is none. With a
    /// NaN the candidates and the other statistics are unspecified.
    pub first_nan: Option<u32>,
}

/// One row of a [`TopK`].
#[derive(Clone, Copy, Debug)]
pub struct TopKRow<'a> {
    /// The candidates' token ids, most likely first: by logit descending,
    /// the lower id first among equal logits (`-0.0` equal to `+0.0`), as
    /// `infer_model::sampling::Sampler` orders its top-k.
    pub ids: &'a [u32],
    /// Their logits, as the forward pass computed them (`ids[j]`'s in
    /// `logits[j]`). Some may be `-inf` when the row has fewer finite
    /// logits than `k`.
    pub logits: &'a [f32],
    /// Statistics of the whole row.
    pub stats: RowStats,
}

/// Per output row of a step, its `k` most likely tokens and its
/// [`RowStats`]: `rows() × k()` candidates, row-major, rows in the order of
/// [`DeviceModel::forward`](super::DeviceModel::forward)'s rows (the
/// batch's [`Batch::output_indices`](super::Batch::output_indices)).
/// Reusable: filling it again keeps its allocations.
#[derive(Clone, Debug, Default)]
pub struct TopK {
    k: usize,
    rows: usize,
    ids: Vec<u32>,
    logits: Vec<f32>,
    stats: Vec<RowStats>,
}

impl TopK {
    /// An empty result (no rows).
    pub fn new() -> Self {
        Self::default()
    }

    /// Candidates per row: the `k` asked for, at most the vocabulary.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row `r` (`r < rows()`).
    ///
    /// # Panics
    /// When `r >= rows()`.
    pub fn row(&self, r: usize) -> TopKRow<'_> {
        assert!(r < self.rows, "row {r} of a TopK of {} rows", self.rows);
        let at = r * self.k..(r + 1) * self.k;
        TopKRow { ids: &self.ids[at.clone()], logits: &self.logits[at], stats: self.stats[r] }
    }

    /// Resizes to `rows` rows of `k` candidates, every entry zeroed (id 0,
    /// logit `-inf`, stats of an empty row): what a backend fills through
    /// [`TopK::parts_mut`].
    pub fn reset(&mut self, rows: usize, k: usize) {
        self.k = k;
        self.rows = rows;
        self.ids.clear();
        self.ids.resize(rows * k, 0);
        self.logits.clear();
        self.logits.resize(rows * k, f32::NEG_INFINITY);
        self.stats.clear();
        self.stats.resize(rows, RowStats { max: f32::NEG_INFINITY, log_sum_exp: 0.0, first_nan: None });
    }

    /// The ids (`rows × k`), logits (`rows × k`) and statistics (`rows`),
    /// row-major, for a backend to write.
    pub fn parts_mut(&mut self) -> (&mut [u32], &mut [f32], &mut [RowStats]) {
        (&mut self.ids, &mut self.logits, &mut self.stats)
    }

    /// The host reference: fills this from `logits`, rows of `n_vocab`
    /// values (`logits.len() / n_vocab` rows), with the `min(k, n_vocab)`
    /// most likely tokens of each row.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when `k` is 0 or above [`TOP_K_MAX`], when
    /// `n_vocab` is 0, or when `logits` is not whole rows.
    pub fn fill_from_logits(&mut self, logits: &[f32], n_vocab: usize, k: usize) -> Result<()> {
        check_k(k)?;
        if n_vocab == 0 || !logits.len().is_multiple_of(n_vocab) {
            return Err(shape_err("top_k", format!("{} logits are not rows of {n_vocab}", logits.len())));
        }
        let kk = k.min(n_vocab);
        let rows = logits.len() / n_vocab;
        self.reset(rows, kk);
        let mut order: Vec<(u32, u32)> = Vec::with_capacity(n_vocab);
        for (r, row) in logits.chunks_exact(n_vocab).enumerate() {
            let stats = row_stats(row);
            self.stats[r] = stats;
            if stats.first_nan.is_some() {
                continue;
            }
            order.clear();
            order.extend(row.iter().enumerate().map(|(i, &x)| (order_key(x), i as u32)));
            let better = |a: &(u32, u32), b: &(u32, u32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
            if kk < order.len() {
                order.select_nth_unstable_by(kk - 1, better);
                order.truncate(kk);
            }
            order.sort_unstable_by(better);
            for (j, &(_, id)) in order.iter().enumerate() {
                self.ids[r * kk + j] = id;
                self.logits[r * kk + j] = row[id as usize];
            }
        }
        Ok(())
    }
}

/// Checks a requested `k`: 1 to [`TOP_K_MAX`].
///
/// # Errors
/// [`crate::Error::Shape`] otherwise.
pub fn check_k(k: usize) -> Result<()> {
    if (1..=TOP_K_MAX).contains(&k) {
        Ok(())
    } else {
        Err(shape_err("top_k", format!("k = {k}; 1 to {TOP_K_MAX} candidates per row")))
    }
}

/// A `u32` that orders non-NaN logits as their values (`-0.0` as `+0.0`),
/// larger value, larger key: the key of the device kernels.
pub fn order_key(x: f32) -> u32 {
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// [`RowStats`] of one row, summed in `f64`.
pub fn row_stats(row: &[f32]) -> RowStats {
    if let Some(i) = row.iter().position(|x| x.is_nan()) {
        return RowStats { max: f32::NAN, log_sum_exp: f32::NAN, first_nan: Some(i as u32) };
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| if x == max { 1.0 } else { f64::from(x - max).exp() }).sum();
    RowStats { max, log_sum_exp: sum.ln() as f32, first_nan: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_key_orders_values() {
        let xs = [f32::NEG_INFINITY, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, f32::MAX, f32::INFINITY];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) <= order_key(w[1]), "{} {}", w[0], w[1]);
            assert_eq!(order_key(w[0]) == order_key(w[1]), w[0] == w[1]);
        }
    }

    #[test]
    fn reference_sorts_with_ties_by_id() {
        let row = [1.0, 3.0, -0.0, 3.0, f32::NEG_INFINITY, 0.0, 2.0];
        let mut t = TopK::new();
        t.fill_from_logits(&row, 7, 5).unwrap();
        assert_eq!((t.rows(), t.k()), (1, 5));
        assert_eq!(t.row(0).ids, [1, 3, 6, 0, 2]);
        assert_eq!(t.row(0).logits, [3.0, 3.0, 2.0, 1.0, -0.0]);
        let s = t.row(0).stats;
        assert_eq!(s.max, 3.0);
        assert_eq!(s.first_nan, None);
        let want: f64 = row.iter().map(|&x| f64::from(x - 3.0).exp()).sum::<f64>().ln();
        assert!((f64::from(s.log_sum_exp) - want).abs() < 1e-6);
        // k past the vocabulary: the whole row, sorted, -inf last.
        t.fill_from_logits(&row, 7, 100).unwrap();
        assert_eq!(t.row(0).ids, [1, 3, 6, 0, 2, 5, 4]);
    }

    #[test]
    fn reference_rows_nan_and_masked() {
        let rows = [0.5, f32::NAN, 2.0, f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 7.0];
        let mut t = TopK::new();
        t.fill_from_logits(&rows, 4, 2).unwrap();
        assert_eq!(t.rows(), 2);
        assert_eq!(t.row(0).stats.first_nan, Some(1));
        let r = t.row(1);
        assert_eq!(r.ids, [3, 0]);
        assert_eq!(r.logits, [7.0, f32::NEG_INFINITY]);
        assert_eq!((r.stats.max, r.stats.log_sum_exp, r.stats.first_nan), (7.0, 0.0, None));
        let all_masked = [f32::NEG_INFINITY; 3];
        t.fill_from_logits(&all_masked, 3, 1).unwrap();
        assert_eq!(t.row(0).stats.max, f32::NEG_INFINITY);
        assert!((t.row(0).stats.log_sum_exp - 3f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn reference_refuses_bad_k_and_shapes() {
        let mut t = TopK::new();
        assert!(t.fill_from_logits(&[1.0, 2.0], 2, 0).is_err());
        assert!(t.fill_from_logits(&[1.0, 2.0], 2, TOP_K_MAX + 1).is_err());
        assert!(t.fill_from_logits(&[1.0, 2.0, 3.0], 2, 1).is_err());
        assert!(t.fill_from_logits(&[1.0], 0, 1).is_err());
    }
}
