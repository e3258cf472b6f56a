//! The random rotation of TurboQuant: `Π x = (1/√d) · H · (s ⊙ x)`, with
//! `H` the `d × d` Sylvester–Hadamard matrix (`H[i][j] = (−1)^popcount(i &
//! j)`, applied by the fast Walsh–Hadamard transform in `d · log₂ d`
//! additions) and `s ∈ {±1}^d` random signs (Ailon & Chazelle's randomized
//! Hadamard transform). `Π` is orthogonal; its inverse is
//! `Π⁻¹ y = s ⊙ ((1/√d) · H · y)` (`H` is symmetric and `H² = d · I`).
//!
//! Signs: bit `i % 64` of the `i / 64`-th output of SplitMix64 seeded with
//! the seed (`s_i = −1` where the bit is set).

/// The signs `s` of dimension `dim` for `seed` (±1.0).
pub fn signs(dim: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut word = 0u64;
    (0..dim)
        .map(|i| {
            if i % 64 == 0 {
                word = splitmix64(&mut state);
            }
            if word >> (i % 64) & 1 == 1 {
                -1.0
            } else {
                1.0
            }
        })
        .collect()
}

/// SplitMix64 (Steele, Lea & Flood 2014): the next output of `state`.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// In-place unnormalized fast Walsh–Hadamard transform: `x ← H x`.
///
/// Contract: `x.len()` is a power of two (debug-asserted).
pub fn fwht(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*u, *v);
                *u = p + q;
                *v = p - q;
            }
        }
        h *= 2;
    }
}

/// `out = Π x` (see the module docs).
pub fn rotate(signs: &[f32], x: &[f32], out: &mut [f32]) {
    let scale = 1.0 / (x.len() as f32).sqrt();
    for ((o, &v), &s) in out.iter_mut().zip(x).zip(signs) {
        *o = v * s;
    }
    fwht(out);
    out.iter_mut().for_each(|o| *o *= scale);
}

/// `y ← Π y`, in place.
pub fn rotate_in_place(signs: &[f32], y: &mut [f32]) {
    let scale = 1.0 / (y.len() as f32).sqrt();
    for (v, &s) in y.iter_mut().zip(signs) {
        *v *= s;
    }
    fwht(y);
    y.iter_mut().for_each(|v| *v *= scale);
}

/// `x = Π⁻¹ y`, in place.
pub fn unrotate(signs: &[f32], y: &mut [f32]) {
    let scale = 1.0 / (y.len() as f32).sqrt();
    fwht(y);
    for (v, &s) in y.iter_mut().zip(signs) {
        *v *= scale * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_and_inverse() {
        for dim in [1usize, 2, 8, 64, 256] {
            let s = signs(dim, 7);
            let x: Vec<f32> = (0..dim).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 25.0).collect();
            let mut y = vec![0.0; dim];
            rotate(&s, &x, &mut y);
            let nx: f32 = x.iter().map(|v| v * v).sum();
            let ny: f32 = y.iter().map(|v| v * v).sum();
            assert!((nx - ny).abs() <= 1e-4 * nx.max(1.0), "dim {dim}: {nx} {ny}");
            unrotate(&s, &mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "dim {dim}");
            }
        }
        // H of size 4 against its definition.
        let mut e = [0.0f32, 1.0, 0.0, 0.0];
        fwht(&mut e);
        assert_eq!(e, [1.0, -1.0, 1.0, -1.0]);
        // Signs: about half negative, and another seed differs.
        let s = signs(1024, 1);
        let neg = s.iter().filter(|&&v| v < 0.0).count();
        assert!((400..624).contains(&neg), "{neg}");
        assert_ne!(s, signs(1024, 2));
    }
}
