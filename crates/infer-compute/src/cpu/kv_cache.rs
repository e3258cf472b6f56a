//! The CPU's storage of one layer's keys or values in a
//! [`KvCacheType`]: [`KvBuf`] owns it, [`KvData`] borrows it for attention.
//!
//! Layout (every type): `[n_slots][n_ctx][n_head_kv][head_dim]` values,
//! position-major; one position is one row of `kv_dim = n_head_kv ·
//! head_dim` values, stored as `kv_dim` f32 or f16, or as `kv_dim / 32`
//! ggml blocks (`BlockQ8_0`, `BlockQ4_0`: 34 and 18 bytes), the blocks of
//! head `g` being `g · head_dim / 32 ..` of the row. Writing a row converts
//! it as ggml's `ggml_cpy` / `set_rows` does (`f32_to_f16`,
//! `quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, bit-exact), except
//! that f16 values past ±65 504 saturate instead of becoming ±inf; reading
//! converts one head's row back to f32 exactly (`dequantize_row_*`), a row
//! at a time, so attention never holds a dequantized copy of the cache.
//!
//! The TurboQuant types store each head's row as one code of
//! [`TurboQuant::code_bytes`] bytes (head `g` of position `p` at byte
//! `(p · n_head_kv + g) · code_bytes`). A row is written and read in the
//! coder's rotated basis ([`TurboQuant::encode_rotated`],
//! [`TurboQuant::decode_rotated`]): the model rotates it beforehand, as it
//! rotates the rows of a q8_0 or q4_0 cache ([`super::kv_rotation`]).

use std::sync::Arc;

use half::f16;

use crate::cpu::tq;
use crate::error::Result;
use crate::kv_type::KvCacheType;
use crate::quant::float::f32_to_f16;
use crate::quant::{BlockFormat, BlockQ4_0, BlockQ8_0, QK};
use crate::turboquant::TurboQuant;

/// One layer's K or V cache, typed (see the module docs for the layout).
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
    /// TurboQuant codes, one per head row, of the coder's `dim = head_dim`.
    Tq(Arc<TurboQuant>, Vec<u8>),
}

/// A borrowed [`KvBuf`] (all of it, or one slot's positions).
#[derive(Clone, Copy)]
pub enum KvData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
    Tq(&'a TurboQuant, &'a [u8]),
}

impl KvBuf {
    /// A zeroed cache of `n_values` values of `ty` in heads of `head_dim`
    /// values (`n_values` a multiple of `head_dim`, `ty` checked to store
    /// such heads: [`KvCacheType::check_head_dim`]).
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] naming `what`;
    /// [`crate::Error::Overflow`].
    pub fn zeroed(ty: KvCacheType, n_values: usize, head_dim: usize, what: &str) -> Result<Self> {
        use crate::memory::zeroed;
        Ok(match ty {
            KvCacheType::F32 => KvBuf::F32(zeroed(n_values, what)?),
            KvCacheType::F16 => KvBuf::F16(zeroed(n_values, what)?),
            KvCacheType::Q8_0 => KvBuf::Q8_0(zeroed(n_values / QK, what)?),
            KvCacheType::Q4_0 => KvBuf::Q4_0(zeroed(n_values / QK, what)?),
            KvCacheType::Tq3 | KvCacheType::Tq4 => {
                let tq = TurboQuant::shared(head_dim, ty.turboquant_bits().unwrap_or(4))?;
                let bytes = (n_values / head_dim)
                    .checked_mul(tq.code_bytes())
                    .ok_or(crate::Error::Overflow("the bytes of a TurboQuant KV cache"))?;
                KvBuf::Tq(tq, zeroed(bytes, what)?)
            }
        })
    }

    /// The element type.
    pub fn ty(&self) -> KvCacheType {
        self.view().ty()
    }

    /// The coder of a TurboQuant cache.
    pub fn turboquant(&self) -> Option<&Arc<TurboQuant>> {
        match self {
            KvBuf::Tq(t, _) => Some(t),
            _ => None,
        }
    }

    /// All of it, borrowed.
    pub fn view(&self) -> KvData<'_> {
        match self {
            KvBuf::F32(v) => KvData::F32(v),
            KvBuf::F16(v) => KvData::F16(v),
            KvBuf::Q8_0(v) => KvData::Q8_0(v),
            KvBuf::Q4_0(v) => KvData::Q4_0(v),
            KvBuf::Tq(t, v) => KvData::Tq(t, v),
        }
    }

    /// Writes `x` (one position's row, `kv_dim` values; for a TurboQuant
    /// cache in its coder's rotated basis) at value offset
    /// `at` (a multiple of `kv_dim`, hence of the block size), converted to
    /// the element type as ggml does.
    ///
    /// Contract (debug-asserted): the row lies inside the cache.
    pub fn write_row(&mut self, at: usize, x: &[f32]) {
        debug_assert!(at.is_multiple_of(QK) || matches!(self, KvBuf::F32(_) | KvBuf::F16(_)));
        match self {
            KvBuf::F32(c) => c[at..at + x.len()].copy_from_slice(x),
            KvBuf::F16(c) => {
                // Saturated at ±65 504, where ggml stores ±inf (whose
                // attention scores become inf - inf = NaN); NaN stays NaN.
                for (o, &v) in c[at..at + x.len()].iter_mut().zip(x) {
                    *o = f32_to_f16(v.clamp(-65504.0, 65504.0));
                }
            }
            KvBuf::Q8_0(c) => BlockQ8_0::quantize_row_ref(x, &mut c[at / QK..(at + x.len()) / QK]),
            KvBuf::Q4_0(c) => BlockQ4_0::quantize_row_ref(x, &mut c[at / QK..(at + x.len()) / QK]),
            KvBuf::Tq(t, c) => {
                let (hd, cb) = (t.dim(), t.code_bytes());
                for (h, yh) in x.chunks_exact(hd).enumerate() {
                    t.encode_rotated(yh, &mut c[(at / hd + h) * cb..][..cb]);
                }
            }
        }
    }

    /// Copies values `src..src + n` onto `dst..dst + n` (offsets and `n`
    /// multiples of the block size), as `copy_within`.
    pub fn copy_within(&mut self, src: usize, n: usize, dst: usize) {
        match self {
            KvBuf::F32(c) => c.copy_within(src..src + n, dst),
            KvBuf::F16(c) => c.copy_within(src..src + n, dst),
            KvBuf::Q8_0(c) => c.copy_within(src / QK..(src + n) / QK, dst / QK),
            KvBuf::Q4_0(c) => c.copy_within(src / QK..(src + n) / QK, dst / QK),
            KvBuf::Tq(t, c) => {
                let (hd, cb) = (t.dim(), t.code_bytes());
                c.copy_within(src / hd * cb..(src + n) / hd * cb, dst / hd * cb)
            }
        }
    }
}

impl<'a> KvData<'a> {
    /// The element type.
    pub fn ty(&self) -> KvCacheType {
        match self {
            KvData::F32(_) => KvCacheType::F32,
            KvData::F16(_) => KvCacheType::F16,
            KvData::Q8_0(_) => KvCacheType::Q8_0,
            KvData::Q4_0(_) => KvCacheType::Q4_0,
            KvData::Tq(t, _) if t.bits() == 3 => KvCacheType::Tq3,
            KvData::Tq(..) => KvCacheType::Tq4,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            KvData::F32(c) => c.len(),
            KvData::F16(c) => c.len(),
            KvData::Q8_0(c) => c.len() * QK,
            KvData::Q4_0(c) => c.len() * QK,
            KvData::Tq(t, c) => c.len() / t.code_bytes() * t.dim(),
        }
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `start..start + n` (both multiples of the block size, or of
    /// `head_dim` for the TurboQuant types).
    pub fn sub(&self, start: usize, n: usize) -> KvData<'a> {
        match *self {
            KvData::F32(c) => KvData::F32(&c[start..start + n]),
            KvData::F16(c) => KvData::F16(&c[start..start + n]),
            KvData::Q8_0(c) => KvData::Q8_0(&c[start / QK..(start + n) / QK]),
            KvData::Q4_0(c) => KvData::Q4_0(&c[start / QK..(start + n) / QK]),
            KvData::Tq(t, c) => {
                let (hd, cb) = (t.dim(), t.code_bytes());
                KvData::Tq(t, &c[start / hd * cb..(start + n) / hd * cb])
            }
        }
    }

    /// The f32 values `at..at + out.len()` when the cache is f32, without
    /// a copy.
    #[inline(always)]
    pub fn as_f32(&self, at: usize, n: usize) -> Option<&'a [f32]> {
        match *self {
            KvData::F32(c) => Some(&c[at..at + n]),
            _ => None,
        }
    }

    /// Converts values `at..at + out.len()` (`at` and the length multiples
    /// of the block size) to f32 into `out`, exactly: f16 widened, blocks
    /// dequantized as ggml's `dequantize_row_q8_0` / `dequantize_row_q4_0`;
    /// TurboQuant codes decoded in the rotated basis
    /// ([`tq::decode_rotated`]; any range of values, a head's code decoded
    /// whole where the range covers it).
    #[inline(always)]
    pub fn to_f32(&self, at: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = out.len();
        match *self {
            KvData::F32(c) => out.copy_from_slice(&c[at..at + n]),
            KvData::F16(c) => c[at..at + n].convert_to_f32_slice(out),
            KvData::Q8_0(c) => BlockQ8_0::dequantize_row(&c[at / QK..(at + n) / QK], out),
            KvData::Q4_0(c) => BlockQ4_0::dequantize_row(&c[at / QK..(at + n) / QK], out),
            KvData::Tq(t, c) => tq_to_f32(t, c, at, out),
        }
    }
}

/// [`KvData::to_f32`] of TurboQuant codes `c`.
fn tq_to_f32(t: &TurboQuant, c: &[u8], at: usize, out: &mut [f32]) {
    let (hd, cb) = (t.dim(), t.code_bytes());
    let mut i = 0;
    while i < out.len() {
        let (head, e) = ((at + i) / hd, (at + i) % hd);
        let n = (hd - e).min(out.len() - i);
        let code = &c[head * cb..][..cb];
        if n == hd {
            tq::decode_rotated(t, code, &mut out[i..i + hd]);
        } else {
            let mut whole = vec![0.0f32; hd];
            tq::decode_rotated(t, code, &mut whole);
            out[i..i + n].copy_from_slice(&whole[e..e + n]);
        }
        i += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    #[test]
    fn rows_round_trip_as_ggml_converts_them() {
        let kv_dim = 64;
        let x: Vec<f32> = (0..kv_dim).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        for ty in KvCacheType::ALL {
            let mut buf = KvBuf::zeroed(ty, 3 * kv_dim, 32, "test").unwrap();
            buf.write_row(kv_dim, &x);
            // What ggml stores: the reference quantizer, then its dequantizer.
            let mut want = vec![0.0f32; kv_dim];
            if ty == KvCacheType::F32 {
                want.copy_from_slice(&x);
            } else if let Some(b) = ty.turboquant_bits() {
                // The reference coder's code of each head (taken as rotated).
                let t = TurboQuant::new(32, b).unwrap();
                for (xh, wh) in x.chunks_exact(32).zip(want.chunks_exact_mut(32)) {
                    let mut code = vec![0u8; t.code_bytes()];
                    t.encode_rotated(xh, &mut code);
                    t.decode_rotated(&code, wh).unwrap();
                }
            } else {
                let g = ty.ggml_type().unwrap();
                // Blocks need 2-byte alignment: quantize into u16 storage.
                let mut words = vec![0u16; g.row_bytes(kv_dim).unwrap() / 2];
                quant::quantize_row(g, &x, bytemuck::cast_slice_mut(&mut words)).unwrap();
                quant::dequantize_row(g, bytemuck::cast_slice(&words), &mut want).unwrap();
            }
            let mut got = vec![f32::NAN; kv_dim];
            buf.view().to_f32(kv_dim, &mut got);
            assert_eq!(got, want, "{ty}");
            // Positions 0 and 2 untouched (zero).
            let mut other = vec![f32::NAN; kv_dim];
            buf.view().to_f32(0, &mut other);
            assert!(other.iter().all(|&v| v == 0.0), "{ty}");
            // Head 1 of 2 (head_dim 32) alone.
            let mut head = vec![f32::NAN; 32];
            buf.view().sub(kv_dim, kv_dim).to_f32(32, &mut head);
            assert_eq!(head, want[32..], "{ty}");
            // A range across the two heads.
            let mut mid = vec![f32::NAN; 20];
            buf.view().to_f32(kv_dim + 22, &mut mid);
            if ty.ggml_type().is_none_or(|g| g.block_size() == 1) {
                assert_eq!(mid, want[22..42], "{ty}");
            }
            buf.copy_within(kv_dim, kv_dim, 2 * kv_dim);
            buf.view().to_f32(2 * kv_dim, &mut got);
            assert_eq!(got, want, "{ty} copied");
            assert_eq!(buf.view().len(), 3 * kv_dim);
            assert_eq!(buf.ty(), ty);
        }
    }
}
