//! Weights repacked once for the x86-64 SIMD products (AVX-512 VNNI and
//! AVX2), and the products.
//!
//! GGUF stores a matrix row by row, so a row-dot kernel reduces 32 values of
//! one row across the lanes of a vector and pays a horizontal sum per block
//! per token. Here 16 rows are interleaved so that lane `j` of a 512-bit
//! vector holds 4 consecutive codes of row `j`: one `vpdpbusd` (u8 × i8 → i32)
//! with 4 broadcast activation bytes advances 16 rows by 4 values, and after
//! a block every lane holds its row's exact integer block dot. No horizontal
//! sums remain, and in prefill the unpacked weights are shared by a tile of
//! up to [`TILE`] tokens. ggml repacks Q4_0 the same way for its AVX and ARM
//! GEMMs (`ggml-cpu/repack.cpp`); the layouts below are ours. Without VNNI,
//! the AVX2 kernels take each group as two 256-bit halves and emulate
//! `vpdpbusd` exactly, so both levels give the same bits.
//!
//! Decode (one token) and prefill (many) run the same kernel, and for every
//! (row, token) it performs the same f32 operations in the same order, so
//! the two give bit-identical results: in formats whose activations are
//! re-quantized between layers, any difference would flip roundings
//! downstream and grow.
//!
//! # Arithmetic (per row and token; [`PackedWeight::dot_ref`] is its scalar
//! statement and the SIMD kernels match it bit for bit)
//! - Q4_0, Q5_0, Q8_0, IQ4_NL (activations Q8_0): for each 32-block `b` in
//!   order, `acc = fma(f32(Σ q·a), w_d · a_d, acc)` with the integer sum exact.
//! - Q4_1, Q5_1 (activations Q8_1, whose codes and `a_d` are Q8_0's): value
//!   `w_d·q + w_m` with unsigned `q`, so for each 32-block
//!   `acc = fma(fma(w_d, f32(Σ q·a), w_m · f32(Σ a)), a_d, acc)`. The
//!   activation sum is the exact integer one, not Q8_1's f16 `s = a_d·Σ a`
//!   that ggml's row dot uses, so results differ from the row-dot path by
//!   up to about `|w_m|·|s|·2⁻¹¹` per block (the packed side is the closer).
//! - Q4_K (activations Q8_K): per super-block `S = Σ_j sc_j·Σ q·a` and
//!   `M = Σ_j m_j·Σ a` over the eight sub-blocks (exact), then
//!   `acc = fma(fma(d, f32(S), -(dmin · f32(M))), a_d, acc)`.
//! - Q6_K (activations Q8_K): `X = Σ_j sc_j·Σ q·a - 32·Σ_j sc_j·Σ a` over the
//!   16 sub-blocks (exact), then `acc = fma(f32(X), d · a_d, acc)`.
//!
//! Unsigned codes meet signed activations in `vpdpbusd`; the formats' offsets
//! (Q4_0's 8, Q5_0's 16, and 128 for the biased Q8_0 and IQ4_NL codes) are
//! taken back through the activation block sums, which start each integer
//! accumulator, so every lane ends at the exact `Σ q·a`. Q4_1 and Q5_1
//! codes have no offset (their accumulators start at zero); the block sum
//! enters through `w_m` instead.

use super::kernels::{AlignedBytes, Kernels, SimdLevel};
use super::team::Par;
use crate::error::{shape_err, Error, Result};
use crate::quant::{
    self, BlockIQ4NL, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, QK, QK_K,
};
use crate::weight::QuantWeight;
use crate::GgmlType;

/// Rows per interleaved group: the 16 i32 lanes of a 512-bit vector.
pub const GROUP: usize = 16;
/// Tokens per prefill tile: each unpacked weight vector feeds this many.
pub const TILE: usize = 8;

/// Bytes per block of a format's two regions: (scales, codes).
///
/// A group of 16 rows is stored as its `nb` blocks' scales (f16 ×16 per
/// block, `d` per lane; Q4_1, Q5_1: `d` ×16 then `m` ×16; Q4_K: `d` ×16
/// then `dmin` ×16), padded to 64 bytes,
/// then its `nb` code records. Code records are multiples of 64 bytes, so
/// with 64-byte aligned storage every code load is aligned. The sizes equal
/// the GGUF bytes of 16 rows, except Q4_K (+2.8%: its 6-bit scales and mins
/// are stored as bytes).
///
/// Code records (offsets in bytes; "lane `j`" is row `16g + j`):
/// - Q8_0, 512: `64m` (m < 8) lane `j` = codes `4m..4m+4` of row `j` plus
///   128, as u8.
/// - Q4_0 / Q4_1 / IQ4_NL, 256: `64m` (m < 4) lane `j` = bytes `4m..4m+4`
///   of row `j`'s `qs` (low nibbles: codes `4m..`, high nibbles: codes
///   `16 + 4m..`).
/// - Q5_0 / Q5_1, 320: as Q4_0, then at `256 + 8m` (m < 8) a 64-bit mask
///   whose bit `4j + i` is the fifth bit of code `4m + i` of row `j`.
/// - Q4_K, 2304 per super-block: `16s` (s < 8) sub-block scales (u8 ×16);
///   `128 + 32p` (p < 4) mins `(m_2p, m_2p+1)` (u8 pairs ×16);
///   `256 + 64(8c + m)` lane `j` = bytes `32c + 4m..+4` of row `j`'s `qs`
///   (low nibbles: sub-block `2c`, high: `2c + 1`).
/// - Q6_K, 3328 per super-block (codes `q` in `0..64`, value `q - 32`):
///   `16s` (s < 16) sub-block scales (i8 ×16); `256 + 64u` (u < 32) lane `j`
///   byte `i`: low nibble of code `4u + i`, high nibble of code
///   `128 + 4u + i`; `2304 + 64v` (v < 16) the codes' top two bits, at bits
///   4-5 for code `4v + i`, 6-7 for `64 + 4v + i`, 0-1 for `128 + 4v + i`
///   and 2-3 for `192 + 4v + i`.
pub const fn layout(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        GgmlType::Q8_0 => Some((32, 512)),
        GgmlType::Q4_0 | GgmlType::IQ4_NL => Some((32, 256)),
        GgmlType::Q5_0 => Some((32, 320)),
        GgmlType::Q4_1 => Some((64, 256)),
        GgmlType::Q5_1 => Some((64, 320)),
        GgmlType::Q4_K => Some((64, 2304)),
        GgmlType::Q6_K => Some((32, 3328)),
        _ => None,
    }
}

/// The code offset of a 32-wide format: `value = code - offset` (times the
/// scale); 0 for Q4_1 and Q5_1, whose minimum is added separately.
pub(crate) const fn offset(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q4_1 | GgmlType::Q5_1 => 0,
        _ => 128,
    }
}

/// Activation words per Q8_K super-block in [`PackedActs`]: the 16 sums of
/// 16 codes (`bsums`) as i32, then the 8 sums of 32 as four i16 pairs.
pub(crate) const AUX_K: usize = 20;

/// Activation words per block in [`PackedActs`] for weights of `ty`: one
/// block sum (Q8_0 and Q8_1 activations) or [`AUX_K`] (Q8_K activations).
pub(crate) const fn aux_words(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => AUX_K,
        _ => 1,
    }
}

/// Ids of the 32-wide formats in the SIMD kernels' const parameter (both
/// levels).
pub(crate) const F_Q8_0: u8 = 0;
pub(crate) const F_Q4_0: u8 = 1;
pub(crate) const F_Q5_0: u8 = 2;
pub(crate) const F_IQ4_NL: u8 = 3;
pub(crate) const F_Q4_1: u8 = 4;
pub(crate) const F_Q5_1: u8 = 5;

/// Whether `ty` is packed on this kernel level: AVX-512 VNNI
/// (`vpdpbusd` on 512-bit vectors) or AVX2 (the same sums emulated exactly,
/// on 256-bit halves of each group; same results).
pub fn supported(k: &Kernels, ty: GgmlType) -> bool {
    matches!(k.level(), SimdLevel::Avx512Vnni | SimdLevel::Avx2) && layout(ty).is_some()
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A `rows × cols` weight matrix in the interleaved layout of [`layout`]:
/// groups of [`GROUP`] rows (the last padded with zero rows).
pub struct PackedWeight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Blocks per row (32 or 256 values each).
    nb: usize,
    /// Scale and code bytes per block.
    scale: usize,
    code: usize,
    data: Vec<Line>,
}

fn round64(n: usize) -> usize {
    n.div_ceil(64) * 64
}

impl PackedWeight {
    /// Repacks `w`.
    ///
    /// # Errors
    /// A type without a packed layout; inconsistent weight bytes;
    /// [`Error::OutOfMemory`] when the packed copy cannot be allocated.
    pub fn new(w: &QuantWeight) -> Result<Self> {
        w.check()?;
        let (scale, code) = layout(w.ty).ok_or(Error::Unsupported { op: "packed weight", ty: w.ty })?;
        let nb = w.cols / w.ty.block_size();
        let groups = w.rows.div_ceil(GROUP);
        let mut p = PackedWeight { ty: w.ty, rows: w.rows, cols: w.cols, nb, scale, code, data: Vec::new() };
        let gb = p.group_bytes();
        let what = || format!("a packed copy of {}x{} {} weights", w.rows, w.cols, w.ty);
        let n_lines = groups.checked_mul(gb).ok_or_else(|| Error::OutOfMemory { what: what(), bytes: u64::MAX })? / 64;
        p.data = crate::memory::zeroed(n_lines, &what())?;
        let codes_at = p.codes_at();
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut p.data);
        for r in 0..groups * GROUP {
            let (g, j) = (r / GROUP, r % GROUP);
            let group = &mut bytes[g * gb..(g + 1) * gb];
            let (scales, codes) = group.split_at_mut(codes_at);
            for b in 0..nb {
                let sc = &mut scales[b * scale..(b + 1) * scale];
                let rec = &mut codes[b * code..(b + 1) * code];
                if r < w.rows {
                    pack_block(w.ty, w.row(r), b, j, sc, rec)?;
                } else if w.ty == GgmlType::Q8_0 {
                    // Padding rows hold code 0 (biased: 128) like the others.
                    for m in 0..8 {
                        rec[64 * m + 4 * j..][..4].fill(128);
                    }
                }
            }
        }
        Ok(p)
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes read per product with one token.
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    fn codes_at(&self) -> usize {
        round64(self.nb * self.scale)
    }

    fn group_bytes(&self) -> usize {
        self.codes_at() + self.nb * self.code
    }

    fn group(&self, g: usize) -> &[u8] {
        let n = self.group_bytes();
        &bytemuck::cast_slice(&self.data)[g * n..(g + 1) * n]
    }

    /// The scalar statement of the packed arithmetic (module docs) for row
    /// `r` and token `t` of `a`: the SIMD kernels match it bit for bit. A
    /// specification for tests, not a fast path.
    ///
    /// # Panics
    /// If `r >= rows`, `t >= a`'s tokens, or `a` was not quantized for this
    /// weight's type and columns.
    pub fn dot_ref(&self, r: usize, a: &PackedActs, t: usize) -> f32 {
        assert!(r < self.rows && t < a.n_tokens, "row {r} / token {t} out of range");
        assert!(a.kind == self.ty.vec_dot_type() && a.cols == self.cols, "activations of another type or length");
        let (g, j) = (r / GROUP, r % GROUP);
        let (scales, codes) = self.group(g).split_at(self.codes_at());
        let qs = &a.qs[t * self.cols..(t + 1) * self.cols];
        let f16_at = |b: usize, at: usize| {
            half::f16::from_le_bytes([scales[b * self.scale + at + 2 * j], scales[b * self.scale + at + 2 * j + 1]])
                .to_f32()
        };
        let mut acc = 0f32;
        for b in 0..self.nb {
            let rec = &codes[b * self.code..(b + 1) * self.code];
            let ad = a.d[t * self.nb + b];
            match self.ty {
                GgmlType::Q4_K => {
                    let aux = &a.aux[(t * self.nb + b) * AUX_K..][..AUX_K];
                    let mut s = 0i32;
                    let mut m = 0i32;
                    for sub in 0..8 {
                        let isum: i32 =
                            (0..32).map(|i| code(self.ty, rec, j, sub, i) * qs[b * QK_K + 32 * sub + i] as i32).sum();
                        s += rec[16 * sub + j] as i32 * isum;
                        m += rec[128 + 32 * (sub / 2) + 2 * j + sub % 2] as i32 * (aux[2 * sub] + aux[2 * sub + 1]);
                    }
                    acc = f16_at(b, 0).mul_add(s as f32, -(f16_at(b, 32) * m as f32)).mul_add(ad, acc);
                }
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    let isum: i32 = (0..QK).map(|i| code(self.ty, rec, j, 0, i) * qs[b * QK + i] as i32).sum();
                    let asum = a.aux[t * self.nb + b];
                    acc = f16_at(b, 0).mul_add(isum as f32, f16_at(b, 32) * asum as f32).mul_add(ad, acc);
                }
                GgmlType::Q6_K => {
                    let aux = &a.aux[(t * self.nb + b) * AUX_K..][..AUX_K];
                    let mut x = 0i32;
                    for sub in 0..16 {
                        let isum: i32 =
                            (0..16).map(|i| code(self.ty, rec, j, sub, i) * qs[b * QK_K + 16 * sub + i] as i32).sum();
                        x += rec[16 * sub + j] as i8 as i32 * (isum - 32 * aux[sub]);
                    }
                    acc = (x as f32).mul_add(f16_at(b, 0) * ad, acc);
                }
                _ => {
                    let isum: i32 =
                        (0..QK).map(|i| (code(self.ty, rec, j, 0, i) - offset(self.ty)) * qs[b * QK + i] as i32).sum();
                    acc = (isum as f32).mul_add(f16_at(b, 0) * ad, acc);
                }
            }
        }
        acc
    }
}

/// Code `i` of sub-block `sub` of lane `j` in a code record, as the kernels
/// unpack it (32-wide formats have one sub-block; Q8_0 and IQ4_NL codes are
/// biased by 128).
fn code(ty: GgmlType, rec: &[u8], j: usize, sub: usize, i: usize) -> i32 {
    let lane = |base: usize, k: usize| rec[base + 64 * (k / 4) + 4 * j + k % 4];
    match ty {
        GgmlType::Q8_0 => lane(0, i) as i32,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let byte = lane(0, i % 16);
            let nib = if i < 16 { byte & 15 } else { byte >> 4 };
            match ty {
                GgmlType::Q4_0 | GgmlType::Q4_1 => nib as i32,
                GgmlType::IQ4_NL => quant::iq4_nl::KVALUES_IQ4NL[nib as usize] as i32 + 128,
                _ => {
                    let m = u64::from_le_bytes(rec[256 + 8 * (i / 4)..][..8].try_into().unwrap());
                    nib as i32 | (((m >> (4 * j + i % 4)) & 1) as i32) << 4
                }
            }
        }
        GgmlType::Q4_K => {
            let byte = lane(256 + 64 * 8 * (sub / 2), i);
            (if sub.is_multiple_of(2) { byte & 15 } else { byte >> 4 }) as i32
        }
        GgmlType::Q6_K => {
            let c = 16 * sub + i;
            let gi = c / 4;
            let byte = rec[256 + 64 * (gi % 32) + 4 * j + c % 4];
            let nib = if gi < 32 { byte & 15 } else { byte >> 4 };
            let hi = rec[2304 + 64 * (gi % 16) + 4 * j + c % 4];
            nib as i32 | (((hi >> [4, 6, 0, 2][gi / 16]) & 3) as i32) << 4
        }
        _ => 0,
    }
}

/// Writes block `b` of one row (lane `j`): its scales into `sc`, its codes
/// into the code record `rec`.
fn pack_block(ty: GgmlType, row: &[u8], b: usize, j: usize, sc: &mut [u8], rec: &mut [u8]) -> Result<()> {
    let lane =
        |rec: &mut [u8], base: usize, m: usize, v: [u8; 4]| rec[base + 64 * m + 4 * j..][..4].copy_from_slice(&v);
    let put_f16 =
        |sc: &mut [u8], at: usize, v: half::f16| sc[at + 2 * j..at + 2 * j + 2].copy_from_slice(&v.to_le_bytes());
    match ty {
        GgmlType::Q8_0 => {
            let blk = &quant::blocks::<BlockQ8_0>(row)?[b];
            put_f16(sc, 0, blk.d);
            for m in 0..8 {
                lane(rec, 0, m, std::array::from_fn(|i| (blk.qs[4 * m + i] as i32 + 128) as u8));
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            // (d, m, qs, qh); m only for Q4_1 and Q5_1, qh for Q5_0 and Q5_1.
            let zero = half::f16::ZERO;
            let (d, m, qs, qh) = match ty {
                GgmlType::Q4_0 => quant::blocks::<BlockQ4_0>(row).map(|x| (x[b].d, zero, x[b].qs, [0; 4]))?,
                GgmlType::Q4_1 => quant::blocks::<BlockQ4_1>(row).map(|x| (x[b].d, x[b].m, x[b].qs, [0; 4]))?,
                GgmlType::Q5_0 => quant::blocks::<BlockQ5_0>(row).map(|x| (x[b].d, zero, x[b].qs, x[b].qh))?,
                GgmlType::Q5_1 => quant::blocks::<BlockQ5_1>(row).map(|x| (x[b].d, x[b].m, x[b].qs, x[b].qh))?,
                _ => quant::blocks::<BlockIQ4NL>(row).map(|x| (x[b].d, zero, x[b].qs, [0; 4]))?,
            };
            put_f16(sc, 0, d);
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                put_f16(sc, 32, m);
            }
            for m in 0..4 {
                lane(rec, 0, m, qs[4 * m..4 * m + 4].try_into().unwrap());
            }
            if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
                let qh = u32::from_le_bytes(qh);
                for m in 0..8 {
                    let at = 256 + 8 * m;
                    let mask = u64::from_le_bytes(rec[at..at + 8].try_into().unwrap())
                        | (((qh >> (4 * m)) & 15) as u64) << (4 * j);
                    rec[at..at + 8].copy_from_slice(&mask.to_le_bytes());
                }
            }
        }
        GgmlType::Q4_K => {
            let blk = &quant::blocks::<BlockQ4K>(row)?[b];
            put_f16(sc, 0, blk.d);
            put_f16(sc, 32, blk.dmin);
            for sub in 0..8 {
                let (s, m) = quant::k_common::get_scale_min_k4(sub, &blk.scales);
                rec[16 * sub + j] = s;
                rec[128 + 32 * (sub / 2) + 2 * j + sub % 2] = m;
            }
            for c in 0..4 {
                for m in 0..8 {
                    lane(rec, 256 + 64 * 8 * c, m, blk.qs[32 * c + 4 * m..][..4].try_into().unwrap());
                }
            }
        }
        GgmlType::Q6_K => {
            let blk = &quant::blocks::<BlockQ6K>(row)?[b];
            put_f16(sc, 0, blk.d);
            for sub in 0..16 {
                rec[16 * sub + j] = blk.scales[sub] as u8;
            }
            let q: [u8; QK_K] = quant::q6_k::quants(blk).map(|v| (v as i32 + 32) as u8);
            for c in 0..QK_K {
                let (gi, i) = (c / 4, c % 4);
                rec[256 + 64 * (gi % 32) + 4 * j + i] |= (q[c] & 15) << (4 * (gi / 32));
                rec[2304 + 64 * (gi % 16) + 4 * j + i] |= (q[c] >> 4) << [4, 6, 0, 2][gi / 16];
            }
        }
        _ => return Err(Error::Unsupported { op: "packed weight", ty }),
    }
    Ok(())
}

/// Activations quantized for the packed products: `n_tokens` rows of `cols`
/// values, quantized exactly as the row-dot path quantizes them (Q8_0 for
/// the 32-wide formats, Q8_1 for Q4_1 and Q5_1, Q8_K for the k-quants) and
/// split into the arrays the kernels read. Buffers are reused between calls.
#[derive(Default)]
pub struct PackedActs {
    /// `Q8_0`, `Q8_1` or `Q8_K`.
    pub(crate) kind: Option<GgmlType>,
    pub(crate) n_tokens: usize,
    pub(crate) cols: usize,
    /// `[n_tokens][cols]` codes.
    pub(crate) qs: Vec<i8>,
    /// `[n_tokens][blocks]` scales.
    pub(crate) d: Vec<f32>,
    /// Q8_0, Q8_1: `[n_tokens][blocks]` block sums `Σ a`; Q8_K:
    /// `[n_tokens][blocks][AUX_K]` (see [`AUX_K`]).
    pub(crate) aux: Vec<i32>,
}

impl PackedActs {
    /// Quantizes `x` (`n_tokens × cols`, row-major) for products with
    /// weights of type `ty`.
    ///
    /// # Errors
    /// `x.len()` not `n_tokens · cols`; `cols` not a multiple of the block;
    /// a type without a packed layout.
    pub fn quantize(
        &mut self,
        k: &Kernels,
        ty: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
        scratch: &mut AlignedBytes,
    ) -> Result<()> {
        let kind = ty
            .vec_dot_type()
            .filter(|_| layout(ty).is_some())
            .ok_or(Error::Unsupported { op: "packed product", ty })?;
        self.kind = None;
        self.n_tokens = 0;
        self.qs.clear();
        self.d.clear();
        self.aux.clear();
        if n_tokens.checked_mul(cols) != Some(x.len()) {
            return Err(shape_err("packed activations", format!("{} values for {n_tokens} x {cols}", x.len())));
        }
        // A block with a NaN input gets a NaN scale, so that its products are
        // NaN on every level (the quantizers turn NaN into arbitrary codes,
        // such as -128, on which the kernels need not agree).
        // A Q8_0 block whose scale overflowed f16 (finite inputs above
        // about 8.3e6, `crate::quant::overflow`) keeps its scale in f32,
        // `amax / 127` as the quantizer computed it before rounding: the
        // codes were made with that scale, and this buffer holds f32 scales.
        let scale = |d: f32, xb: &[f32]| {
            if xb.iter().any(|v| v.is_nan()) {
                f32::NAN
            } else if d.is_infinite() && xb.iter().all(|v| v.is_finite()) {
                xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0
            } else {
                d
            }
        };
        // Q8_1's codes and scale are Q8_0's (ggml's `quantize_row_q8_1_ref`
        // quantizes each block as Q8_0 does, then adds `s`, unused here), so
        // Q8_1 activations come from the Q8_0 quantizer, which has SIMD.
        let quantize_as = if kind == GgmlType::Q8_1 { GgmlType::Q8_0 } else { ty };
        for row in x.chunks_exact(cols.max(1)).take(n_tokens) {
            k.quantize_activation(quantize_as, row, scratch)?;
            if kind != GgmlType::Q8_K {
                for (b, xb) in quant::blocks::<BlockQ8_0>(scratch.as_bytes())?.iter().zip(row.chunks_exact(QK)) {
                    self.qs.extend_from_slice(&b.qs);
                    self.d.push(scale(b.d.to_f32(), xb));
                    self.aux.push(b.qs.iter().map(|&q| q as i32).sum());
                }
            } else {
                for (b, xb) in quant::blocks::<BlockQ8K>(scratch.as_bytes())?.iter().zip(row.chunks_exact(QK_K)) {
                    self.qs.extend_from_slice(&b.qs);
                    self.d.push(scale(b.d, xb));
                    self.aux.extend(b.bsums.iter().map(|&v| v as i32));
                    let s32: [i32; 8] = std::array::from_fn(|i| b.bsums[2 * i] as i32 + b.bsums[2 * i + 1] as i32);
                    self.aux
                        .extend(s32.chunks_exact(2).map(|p| (p[0] as u16 as u32 | (p[1] as u16 as u32) << 16) as i32));
                }
            }
        }
        (self.kind, self.n_tokens, self.cols) = (Some(kind), n_tokens, cols);
        Ok(())
    }

    /// The activation type these were quantized to, if any.
    pub fn kind(&self) -> Option<GgmlType> {
        self.kind
    }
}

/// Read streams per task in decode: the groups `g0..g1` are visited as
/// `STREAMS` interleaved sub-ranges, because one sequential stream per core
/// does not keep enough reads in flight to saturate DRAM (the same reason as
/// in `matvec::matvec_quantized`).
const STREAMS: usize = 4;

/// `g0..g1` as `s` interleaved sub-ranges: `g0, g0 + part, .., g0 + 1, ..`.
fn stream_order(g0: usize, g1: usize, s: usize) -> impl Iterator<Item = usize> {
    let part = (g1 - g0).div_ceil(s.max(1)).max(1);
    (0..part).flat_map(move |i| (0..s.max(1)).map(move |k| g0 + k * part + i)).filter(move |&g| g < g1)
}

/// A pointer to the output that tasks writing disjoint rows share.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task of `matmul` writes only the rows of its own groups.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `Y = X·Wᵀ`: `a` holds `n_tokens` quantized activations of `w.cols()`
/// values, `y` is `n_tokens × w.rows()` (row-major). Groups of rows are
/// split across the thread pool; each group meets the tokens in tiles of
/// [`TILE`]. On other levels (only in tests: models pack only where a
/// kernel exists) the scalar [`PackedWeight::dot_ref`] computes the same values.
///
/// # Errors
/// Activations of another type or length; `y` of the wrong length.
pub fn matmul(k: &Kernels, w: &PackedWeight, a: &PackedActs, y: &mut [f32]) -> Result<()> {
    matmul_on(k, Par::Rayon, w, a, y)
}

/// [`matmul`] with its tasks run on `par`.
///
/// # Errors
/// As [`matmul`].
pub fn matmul_on(k: &Kernels, par: Par<'_>, w: &PackedWeight, a: &PackedActs, y: &mut [f32]) -> Result<()> {
    let n = a.n_tokens;
    if a.kind != w.ty.vec_dot_type() || a.cols != w.cols || n.checked_mul(w.rows) != Some(y.len()) {
        return Err(shape_err(
            "packed matmul",
            format!("W is {} {}x{}, activations {:?} {n}x{}, y has {}", w.ty, w.rows, w.cols, a.kind, a.cols, y.len()),
        ));
    }
    let groups = w.rows.div_ceil(GROUP);
    let threads = par.threads().max(1);
    // Decode: a few large tasks per thread (each reads several streams).
    // Prefill: about 16 tasks per thread, so that a core slowed by other
    // work hands groups to the others instead of holding up the join.
    let per_task = groups.div_ceil(threads * if n == 1 { 4 } else { 16 }).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let level = k.level();
    par.for_each(groups.div_ceil(per_task), |task| {
        // Moves the whole `OutPtr` (Send) into the closure; without it the
        // closure would capture only its raw-pointer field, which is not.
        #[allow(clippy::redundant_locals)]
        let out = out;
        let (g0, g1) = (task * per_task, ((task + 1) * per_task).min(groups));
        for g in stream_order(g0, g1, if n == 1 { STREAMS } else { 1 }) {
            let valid = (w.rows - g * GROUP).min(GROUP);
            let mut t = 0;
            while t < n {
                let m = (n - t).min(TILE);
                if matches!(level, SimdLevel::Avx512Vnni | SimdLevel::Avx2) {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the level (AVX-512 VNNI, or AVX2 with FMA and
                    // F16C) was checked against this CPU by
                    // `Kernels::for_level`; the group holds `w.nb` scale
                    // entries and, 64-byte aligned, `w.nb` code records of
                    // `w.ty`; `a` holds tokens `t..t + m` of `w.cols` values
                    // (checked above); the kernel writes lanes `..valid` of
                    // rows `t..t + m` of `y` at columns `16g..`, inside `y`
                    // and owned by this task alone.
                    unsafe {
                        let group = w.group(g).as_ptr();
                        let (scales, codes) = (group, group.add(w.codes_at()));
                        let y = out.0.add(t * w.rows + g * GROUP);
                        if level == SimdLevel::Avx512Vnni {
                            super::simd::avx512_packed::tile(w.ty, scales, codes, w.nb, a, t, m, y, w.rows, valid);
                        } else {
                            super::simd::avx2_packed::tile(w.ty, scales, codes, w.nb, a, t, m, y, w.rows, valid);
                        }
                    }
                } else {
                    for tt in t..t + m {
                        for j in 0..valid {
                            let v = w.dot_ref(g * GROUP + j, a, tt);
                            // SAFETY: as above, inside `y` and owned by this task.
                            unsafe { *out.0.add(tt * w.rows + g * GROUP + j) = v };
                        }
                    }
                }
                t += m;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::matvec;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }

    fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Vec<f32>, QuantWeight) {
        let mut rnd = rng(seed);
        // Rows of different magnitudes, so that scales differ across lanes.
        let wf: Vec<f32> = (0..rows * cols).map(|i| rnd() * (1.0 + (i / cols % 5) as f32)).collect();
        let rb = ty.row_bytes(cols).unwrap();
        let mut wq = vec![0u8; rows * rb];
        for r in 0..rows {
            quant::quantize_row(ty, &wf[r * cols..(r + 1) * cols], &mut wq[r * rb..(r + 1) * rb]).unwrap();
        }
        (wf, QuantWeight::new(ty, rows, cols, wq.into()).unwrap())
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    /// Awkward shapes: one row, rows not a multiple of 16, one block, many
    /// blocks, token counts below, at and past a tile.
    fn shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
        let bs = ty.block_size();
        vec![(1, bs, 1), (17, 7 * bs.min(32), 3), (33, 2048, 9), (16, 20 * 32, 8), (40, 3 * bs, 13), (5, bs, 17)]
            .into_iter()
            .map(|(r, c, n)| (r, c.div_ceil(bs) * bs, n))
            .collect()
    }

    #[test]
    fn kernels_match_the_scalar_statement_bit_for_bit_and_the_reference_dot() {
        for level in SimdLevel::all_available() {
            let k = Kernels::for_level(level);
            if !supported(&k, GgmlType::Q8_0) {
                println!("packed kernels: level {} has none (the scalar statement is checked instead)", level.name());
            }
            check_level(&k);
        }
    }

    fn check_level(best: &Kernels) {
        let best = *best;
        let scalar = Kernels::for_level(SimdLevel::Scalar);
        for ty in TYPES {
            for (rows, cols, n) in shapes(ty) {
                let (wf, qw) = weight(ty, rows, cols, (rows * 131 + cols + n) as u64);
                let pw = PackedWeight::new(&qw).unwrap();
                let mut rnd = rng(cols as u64 * 7 + n as u64);
                let x: Vec<f32> = (0..n * cols).map(|i| rnd() * if i % 97 == 0 { 300.0 } else { 2.0 }).collect();
                let mut scratch = AlignedBytes::default();
                let mut a = PackedActs::default();
                a.quantize(&best, ty, &x, n, cols, &mut scratch).unwrap();
                let mut y = vec![f32::NAN; n * rows];
                matmul(&best, &pw, &a, &mut y).unwrap();
                for t in 0..n {
                    // One token at a time (decode) gives the same bits.
                    let mut a1 = PackedActs::default();
                    a1.quantize(&best, ty, &x[t * cols..(t + 1) * cols], 1, cols, &mut scratch).unwrap();
                    let mut y1 = vec![f32::NAN; rows];
                    matmul(&best, &pw, &a1, &mut y1).unwrap();
                    let mut want = vec![0f32; rows];
                    matvec::matvec(&scalar, &qw, &x[t * cols..(t + 1) * cols], &mut want, &mut scratch).unwrap();
                    for r in 0..rows {
                        let got = y[t * rows + r];
                        let stmt = pw.dot_ref(r, &a, t);
                        assert_eq!(
                            got.to_bits(),
                            stmt.to_bits(),
                            "{} {ty} {rows}x{cols} n={n} t={t} r={r}: kernel {got} vs statement {stmt}",
                            best.level().name()
                        );
                        assert_eq!(
                            y1[r].to_bits(),
                            got.to_bits(),
                            "{ty} {rows}x{cols} n={n} t={t} r={r}: decode {} vs prefill {got}",
                            y1[r]
                        );
                        let mag: f32 = (0..cols).map(|c| (wf[r * cols + c] * x[t * cols + c]).abs()).sum();
                        // The reference adds `w_m · s` with Q8_1's f16 block
                        // sum `s` (module docs): allow its rounding.
                        let min_term: f32 = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                            (0..cols / QK)
                                .map(|b| {
                                    let blk = b * QK..(b + 1) * QK;
                                    let wmax = wf[r * cols..][blk.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
                                    let xsum: f32 = x[t * cols..][blk].iter().map(|v| v.abs()).sum();
                                    wmax * xsum / 1024.0
                                })
                                .sum()
                        } else {
                            0.0
                        };
                        assert!(
                            (got - want[r]).abs() <= 2e-5 * mag + 1e-6 + min_term,
                            "{ty} {rows}x{cols} t={t} r={r}: {got} vs reference {}",
                            want[r]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn stream_order_visits_every_group_once() {
        for (g0, g1, s) in [(0, 0, 4), (0, 1, 4), (3, 10, 4), (0, 16, 4), (5, 6, 1), (0, 13, 3)] {
            let mut v: Vec<usize> = stream_order(g0, g1, s).collect();
            v.sort();
            assert_eq!(v, (g0..g1).collect::<Vec<_>>(), "{g0}..{g1} in {s} streams");
        }
    }

    #[test]
    fn a_nan_activation_gives_nan_outputs_on_every_level() {
        for ty in TYPES {
            let cols = ty.block_size() * 2;
            let (_, qw) = weight(ty, 17, cols, 5);
            let pw = PackedWeight::new(&qw).unwrap();
            let mut x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            x[cols / 2 + 10] = f32::NAN; // in the second block
            for level in SimdLevel::all_available() {
                let k = Kernels::for_level(level);
                let (mut a, mut tmp) = (PackedActs::default(), AlignedBytes::default());
                a.quantize(&k, ty, &x, 1, cols, &mut tmp).unwrap();
                let mut y = vec![0f32; 17];
                matmul(&k, &pw, &a, &mut y).unwrap();
                assert!(y.iter().all(|v| v.is_nan()), "{ty} {}: {y:?}", level.name());
                assert!(pw.dot_ref(3, &a, 0).is_nan());
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let k = Kernels::detect();
        let (_, f16w) = weight(GgmlType::F16, 2, 32, 1);
        assert!(matches!(PackedWeight::new(&f16w), Err(Error::Unsupported { .. })));
        let (_, qw) = weight(GgmlType::Q8_0, 3, 64, 2);
        let pw = PackedWeight::new(&qw).unwrap();
        let mut a = PackedActs::default();
        let mut scratch = AlignedBytes::default();
        assert!(a.quantize(&k, GgmlType::Q8_0, &[0.0; 63], 1, 64, &mut scratch).is_err());
        a.quantize(&k, GgmlType::Q8_0, &[0.5; 128], 2, 64, &mut scratch).unwrap();
        assert!(matmul(&k, &pw, &a, &mut [0.0; 5]).is_err(), "short output");
        let (_, q4k) = weight(GgmlType::Q4_K, 3, 256, 3);
        let mut a4 = PackedActs::default();
        a4.quantize(&k, GgmlType::Q4_K, &[0.5; 256], 1, 256, &mut scratch).unwrap();
        assert!(matmul(&k, &pw, &a4, &mut [0.0; 3]).is_err(), "Q8_K activations for Q8_0 weights");
        let p4 = PackedWeight::new(&q4k).unwrap();
        let mut y = [0.0; 3];
        matmul(&k, &p4, &a4, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()));
    }
}
