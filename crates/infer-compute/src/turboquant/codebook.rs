//! Lloyd–Max codebooks for one coordinate of a uniformly random unit vector
//! of `R^d` (TurboQuant, Zandieh et al. 2025, arXiv 2504.19874, §3.1): after
//! a random rotation every coordinate of a unit vector follows
//!
//! ```text
//! f_d(t) = Γ(d/2) / (√π · Γ((d−1)/2)) · (1 − t²)^((d−3)/2),   t ∈ [−1, 1]
//! ```
//!
//! (close to `N(0, 1/d)` for large `d`), and the optimal scalar quantizer of
//! `2^b` levels for that density is found by Lloyd's iteration (Max 1960,
//! Lloyd 1982): boundaries at the midpoints of neighbouring centroids,
//! centroids at the conditional means of their cells. The density is
//! integrated on a fixed grid, so a codebook depends only on `(d, b)` and is
//! the same on every machine.

/// Grid points for the integrals, over `[-1, 1]` or, for large `d`, over
/// ±16 standard deviations (`16/√d`), beyond which the mass is below 1e-50.
const GRID: usize = 1 << 14;
/// Lloyd iterations: for 8 and more levels the levels creep towards the
/// optimum for thousands of iterations, while the distortion is within
/// 0.2% of the optimal one after a few hundred.
const ITERATIONS: usize = 2000;

/// The `2^bits` centroids (ascending, symmetric about 0) of the Lloyd–Max
/// quantizer of `f_d`, and the `2^bits − 1` boundaries between them.
///
/// Contract: `dim >= 2`, `1 <= bits <= 8` (checked by the caller).
pub fn lloyd_max(dim: usize, bits: u32) -> (Vec<f32>, Vec<f32>) {
    let levels = 1usize << bits;
    // Grid and the (unnormalized) density; log form for large d.
    let e = (dim as f64 - 3.0) / 2.0;
    let half = (16.0 / (dim as f64).sqrt()).min(1.0);
    let ts: Vec<f64> = (0..GRID).map(|i| half * (-1.0 + (2.0 * i as f64 + 1.0) / GRID as f64)).collect();
    let ws: Vec<f64> = ts.iter().map(|&t| if e == 0.0 { 1.0 } else { (e * (1.0 - t * t).ln()).exp() }).collect();
    // Start at the quantiles' midpoints of each cell of equal mass.
    let total: f64 = ws.iter().sum();
    let mut c = vec![0.0f64; levels];
    let mut acc = 0.0;
    let mut k = 0;
    for (&t, &w) in ts.iter().zip(&ws) {
        acc += w;
        while k < levels && acc >= (k as f64 + 0.5) / levels as f64 * total {
            c[k] = t;
            k += 1;
        }
    }
    for _ in 0..ITERATIONS {
        let bounds: Vec<f64> = c.windows(2).map(|p| (p[0] + p[1]) / 2.0).collect();
        let (mut sum, mut mass) = (vec![0.0f64; levels], vec![0.0f64; levels]);
        let mut cell = 0;
        for (&t, &w) in ts.iter().zip(&ws) {
            while cell < bounds.len() && t > bounds[cell] {
                cell += 1;
            }
            sum[cell] += w * t;
            mass[cell] += w;
        }
        for i in 0..levels {
            if mass[i] > 0.0 {
                c[i] = sum[i] / mass[i];
            }
        }
        // Exact symmetry (the density is even).
        for i in 0..levels / 2 {
            let m = (c[levels - 1 - i] - c[i]) / 2.0;
            c[i] = -m;
            c[levels - 1 - i] = m;
        }
    }
    let bounds = c.windows(2).map(|p| ((p[0] + p[1]) / 2.0) as f32).collect();
    (c.into_iter().map(|v| v as f32).collect(), bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_limit_matches_max_1960() {
        // For large d, sqrt(d) · t is close to N(0, 1), whose Lloyd–Max
        // levels are tabulated (Max 1960): 1 bit ±0.7979; 2 bits ±0.4528,
        // ±1.510; 3 bits ±0.2451, ±0.7560, ±1.344, ±2.152.
        let d = 4096;
        let s = (d as f32).sqrt();
        let (c1, _) = lloyd_max(d, 1);
        assert!((c1[1] * s - 0.7979).abs() < 2e-3, "{}", c1[1] * s);
        let (c2, b2) = lloyd_max(d, 2);
        assert!((c2[2] * s - 0.4528).abs() < 3e-3 && (c2[3] * s - 1.510).abs() < 5e-3, "{c2:?}");
        assert_eq!(b2.len(), 3);
        assert_eq!(b2[1], 0.0);
        let (c3, _) = lloyd_max(d, 3);
        let want = [0.2451, 0.7560, 1.344, 2.152];
        for (i, w) in want.iter().enumerate() {
            // Lloyd's iteration approaches the 8-level optimum slowly (the
            // distortion is within 0.2% of it long before the levels are):
            // levels within 1.5%.
            assert!((c3[4 + i] * s - w).abs() < 0.015 * w, "{i}: {} vs {w}", c3[4 + i] * s);
        }
        // Ascending and symmetric.
        let (c4, b4) = lloyd_max(128, 4);
        assert!(c4.windows(2).all(|p| p[0] < p[1]));
        assert!(b4.iter().zip(c4.windows(2)).all(|(&b, p)| p[0] < b && b < p[1]));
        assert!(c4.iter().zip(c4.iter().rev()).all(|(a, b)| a == &-b));
    }
}
