//! A weight matrix repacked into the interleaved layout of
//! [`super::format::layout`], and [`PackedWeight::dot_ref`], the scalar
//! statement of the packed products' arithmetic.

use super::acts::PackedActs;
use super::format::{layout, offset, AUX_K, GROUP};
use crate::error::{Error, Result};
use crate::quant::{
    self, BlockIQ4NL, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, QK, QK_K,
};
use crate::weight::QuantWeight;
use crate::GgmlType;

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A `rows × cols` weight matrix in the interleaved layout of [`layout`]:
/// groups of [`GROUP`] rows (the last padded with zero rows).
pub struct PackedWeight {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Blocks per row (32 or 256 values each).
    pub(super) nb: usize,
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

    pub(super) fn codes_at(&self) -> usize {
        round64(self.nb * self.scale)
    }

    fn group_bytes(&self) -> usize {
        self.codes_at() + self.nb * self.code
    }

    pub(super) fn group(&self, g: usize) -> &[u8] {
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
