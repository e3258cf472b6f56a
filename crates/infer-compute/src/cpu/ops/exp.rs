//! `e^x` for f32 by range reduction and a polynomial (Cephes' `expf`,
//! Moshier 1989), written with plain `+`, `*` and bit operations so that it
//! vectorizes where libm's `expf` (a call per value) does not. Rust neither
//! reassociates nor contracts f32 arithmetic, so scalar and vector builds
//! give the same bits on every processor.
//!
//! `x = n·ln 2 + r` with `n = ⌊x·log₂e + ½⌋` and `|r| ≤ ½ ln 2` (`ln 2` in
//! two parts, so `r` is exact to f32), `e^r ≈ 1 + r + r²·P(r)` (degree 5),
//! then scaled by `2^n` in two halves so that results near overflow and in
//! the subnormal range round as one would expect. Error: within 2 ulp of
//! the exact value over the normal range (tested against f64).

/// `e^x`: `+inf` above about 88.72, `0` below about -103.97, NaN for NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Clamped so that the two scale factors stay normal (NaN stays NaN).
    let x = x.clamp(-104.0, 89.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - n * 0.693_359_4;
    let r = r - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // `n` in -150..=129, an integer: adding 1.5 · 2^23 puts it in the low
    // mantissa bits, read without `as i32` (whose saturating NaN rule keeps
    // the compiler from vectorizing this function). For NaN it is some
    // integer, and `y` is already NaN.
    const MAGIC: f32 = 12_582_912.0;
    let n = (n + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32;
    let (n1, n2) = (n / 2, n - n / 2);
    let two = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    y * two(n1) * two(n2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_and_handles_the_edges() {
        let mut worst = 0f64;
        let mut x = -103.0f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            // ulp of the result (normal range; subnormals by absolute error).
            let ulp = if want >= f32::MIN_POSITIVE as f64 { want * f32::EPSILON as f64 } else { 1.4e-45 };
            worst = worst.max((got - want).abs() / ulp);
            x += 0.0137;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }
}
