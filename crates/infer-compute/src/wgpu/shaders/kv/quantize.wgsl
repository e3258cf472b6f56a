// The arithmetic of ggml's reference quantizers (quantize_row_q8_0_ref,
// quantize_row_q4_0_ref; quant::q8_0 and quant::q4_0 on the CPU), done so
// that a quantized KV cache stores the CPU's bits for the same f32 values
// on any adapter: WGSL lets division be 2.5 ULP off and leaves the
// rounding of a conversion to f16 to the implementation, and a driver may
// fuse a product into the add after it. So division and the f16 rounding
// are done in integers here, and a code is derived from its product with
// comparisons and integer operations only. Composed before the cache
// types' stores.

// Whether x is a NaN (by its bits: a comparison may be optimized away).
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// a / b rounded to nearest, ties to even (IEEE division), by long
// division of the significands, where both operands and the quotient are
// normal numbers; otherwise (zeros, infinities, NaNs, subnormals) WGSL's
// `a / b`.
fn div_rn(a: f32, b: f32) -> f32 {
    let ua = bitcast<u32>(a);
    let ub = bitcast<u32>(b);
    let ea = i32((ua >> 23u) & 0xffu);
    let eb = i32((ub >> 23u) & 0xffu);
    if ea == 0 || eb == 0 || ea == 255 || eb == 255 {
        return a / b;
    }
    let mb = (ub & 0x7fffffu) | 0x800000u;
    var r = (ua & 0x7fffffu) | 0x800000u;
    var e = ea - eb + 127;
    if r < mb {
        r <<= 1u;
        e -= 1;
    }
    // r / mb is in [1, 2): 24 bits of quotient and a guard bit; r < 2^26.
    var q = 0u;
    for (var i = 0u; i < 25u; i++) {
        q <<= 1u;
        if r >= mb {
            r -= mb;
            q |= 1u;
        }
        r <<= 1u;
    }
    var m = q >> 1u;
    if (q & 1u) == 1u && (r != 0u || (m & 1u) == 1u) {
        m += 1u;
    }
    if m == 0x1000000u {
        m >>= 1u;
        e += 1;
    }
    if e <= 0 || e >= 255 {
        return a / b;
    }
    return bitcast<f32>(((ua ^ ub) & 0x80000000u) | (u32(e) << 23u) | (m & 0x7fffffu));
}

// The bits of x as an IEEE f16, rounded to nearest, ties to even (the
// CPU's f32_to_f16): past f16's range an infinity, a NaN 0x7e00 with x's
// sign, subnormals kept.
fn f16_rn(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    let sign = (u >> 16u) & 0x8000u;
    let a = u & 0x7fffffffu;
    if a > 0x7f800000u {
        return sign | 0x7e00u;
    }
    if a >= 0x47800000u {
        // 65 536 and above (65 520 and above round up to it below).
        return sign | 0x7c00u;
    }
    if a <= 0x33000000u {
        // At most 2^-25, half the smallest subnormal: a tie to the even 0.
        return sign;
    }
    let e = i32(a >> 23u) - 127;
    let m = (a & 0x7fffffu) | 0x800000u;
    var h = 0u;
    var sh = 13u;
    if e >= -14 {
        // Normal: 10 of the 23 fraction bits; a carry may reach the
        // exponent, and from 65 520 on the infinity.
        h = (u32(e + 15) << 10u) | ((a & 0x7fffffu) >> 13u);
    } else {
        // Subnormal: m · 2^(e − 23) = h · 2^−24.
        sh = u32(-e - 1);
        h = m >> sh;
    }
    let rem = m & ((1u << sh) - 1u);
    let half = 1u << (sh - 1u);
    if rem > half || (rem == half && (h & 1u) == 1u) {
        h += 1u;
    }
    return sign | h;
}

// The q8_0 code of v = x · (1/d): C's roundf (half away from zero) as an
// i8 in the low byte; a NaN's is 0 (the CPU's `as` conversion).
fn q8_code(v: f32) -> u32 {
    if is_nan(v) {
        return 0u;
    }
    let t = trunc(v);
    let c = select(t, t + sign(v), abs(v) >= abs(t) + 0.5);
    return u32(i32(c)) & 0xffu;
}

// The q4_0 code of p = x · (1/d): min(15, trunc(p + 8.5)) with the sum
// rounded to f32 first, as the CPU's unfused arithmetic rounds it; a
// NaN's is 0. p + 8.5 is formed exactly in integers (in units of 2^-25)
// and rounded to 24 bits to nearest, ties to even.
fn q4_code(p: f32) -> u32 {
    if is_nan(p) || p <= -8.5 {
        return 0u;
    }
    if p >= 6.5 {
        return 15u;
    }
    if abs(p) < 0.25 {
        // p + 8.5 lies in (8.25, 8.75) before and after rounding.
        return 8u;
    }
    // From 2^-2 on p is a multiple of 2^-25, so this is exact; 8.5 · 2^25.
    var s = u32(i32(p * 33554432.0) + 285212672);
    let lead = firstLeadingBit(s);
    if lead > 23u {
        let sh = lead - 23u;
        let rem = s & ((1u << sh) - 1u);
        let half = 1u << (sh - 1u);
        s -= rem;
        if rem > half || (rem == half && ((s >> sh) & 1u) == 1u) {
            s += 1u << sh;
        }
    }
    return min(15u, s >> 25u);
}

// The bits of x as an f16 cache stores it: f16_rn of x saturated at
// ±65504 (the CPU's f16_sat; a NaN stays a NaN).
fn f16_sat(x: f32) -> u32 {
    if is_nan(x) {
        return f16_rn(x);
    }
    return f16_rn(clamp(x, -65504.0, 65504.0));
}
