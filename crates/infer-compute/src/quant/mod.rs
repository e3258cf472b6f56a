//! GGUF block formats, bit-exact with ggml.
//!
//! One file per format: the `#[repr(C)]` block (size asserted against
//! ggml's `ggml-common.h`), ggml's reference quantizer
//! (`quantize_row_*_ref`), the dequantizer, and the scalar dot product with
//! the paired activation type (ggml's `vec_dot_type`). The scalar code here is
//! the specification that every SIMD and GPU kernel is tested against.
//!
//! Callers holding raw bytes use the checked, type-dispatched functions at
//! the bottom of this module ([`quantize_row`], [`dequantize_row`],
//! [`vec_dot`]); kernels use the typed [`BlockFormat`] / [`VecDot`] traits.

pub mod float;
pub mod iq4_nl;
pub mod k_common;
pub mod overflow;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;

pub use iq4_nl::BlockIQ4NL;
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_1::BlockQ8_1;
pub use q8_k::BlockQ8K;

use crate::error::{shape_err, Error, Result};
use crate::GgmlType;

/// Values per block of the 32-wide ("legacy") formats.
pub const QK: usize = 32;
/// Values per super-block of the k-quant formats.
pub const QK_K: usize = 256;

/// A block type of a GGUF tensor: `BLOCK_SIZE` values stored in
/// `size_of::<Self>()` bytes. Plain float types are blocks of one value.
///
/// Length contract of the methods: `x.len() == y.len() * BLOCK_SIZE` for the
/// float side `x` and the block side `y` (the checked byte-level functions
/// of this module verify it before calling).
pub trait BlockFormat: bytemuck::Pod + Send + Sync + 'static {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Values per block.
    const BLOCK_SIZE: usize = Self::TYPE.block_size();
    /// ggml's reference quantization (`quantize_row_*_ref`).
    fn quantize_row_ref(x: &[f32], y: &mut [Self]);
    /// ggml's dequantization (`dequantize_row_*`).
    fn dequantize_row(x: &[Self], y: &mut [f32]);
}

/// A weight format with a dot product against its activation format.
pub trait VecDot: BlockFormat {
    /// ggml's `vec_dot_type` for this weight type.
    type Act: BlockFormat;
    /// Scalar reference dot product of a weight row with an activation row
    /// quantized to `Act` (ggml's `ggml_vec_dot_*` generic path).
    /// `w.len() * Self::BLOCK_SIZE == a.len() * Self::Act::BLOCK_SIZE`.
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32;
}

/// Runs `$body` with the type alias `$B` bound to the block type of `$ty`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_block_type {
    ($ty:expr, $B:ident => $body:expr) => {{
        use $crate::quant::*;
        match $ty {
            $crate::GgmlType::F32 => {
                type $B = f32;
                $body
            }
            $crate::GgmlType::F16 => {
                type $B = half::f16;
                $body
            }
            $crate::GgmlType::BF16 => {
                type $B = half::bf16;
                $body
            }
            $crate::GgmlType::Q4_0 => {
                type $B = BlockQ4_0;
                $body
            }
            $crate::GgmlType::Q4_1 => {
                type $B = BlockQ4_1;
                $body
            }
            $crate::GgmlType::Q5_0 => {
                type $B = BlockQ5_0;
                $body
            }
            $crate::GgmlType::Q5_1 => {
                type $B = BlockQ5_1;
                $body
            }
            $crate::GgmlType::Q8_0 => {
                type $B = BlockQ8_0;
                $body
            }
            $crate::GgmlType::Q8_1 => {
                type $B = BlockQ8_1;
                $body
            }
            $crate::GgmlType::Q2_K => {
                type $B = BlockQ2K;
                $body
            }
            $crate::GgmlType::Q3_K => {
                type $B = BlockQ3K;
                $body
            }
            $crate::GgmlType::Q4_K => {
                type $B = BlockQ4K;
                $body
            }
            $crate::GgmlType::Q5_K => {
                type $B = BlockQ5K;
                $body
            }
            $crate::GgmlType::Q6_K => {
                type $B = BlockQ6K;
                $body
            }
            $crate::GgmlType::Q8_K => {
                type $B = BlockQ8K;
                $body
            }
            $crate::GgmlType::IQ4_NL => {
                type $B = BlockIQ4NL;
                $body
            }
        }
    }};
}

/// Runs `$body` with `$W` bound to the weight block type of `$ty` (every
/// type that has a `vec_dot_type`); `$none` for activation-only types.
#[macro_export]
#[doc(hidden)]
macro_rules! with_weight_type {
    ($ty:expr, $W:ident => $body:expr, else $none:expr) => {{
        use $crate::quant::*;
        match $ty {
            $crate::GgmlType::F32 => {
                type $W = f32;
                $body
            }
            $crate::GgmlType::F16 => {
                type $W = half::f16;
                $body
            }
            $crate::GgmlType::BF16 => {
                type $W = half::bf16;
                $body
            }
            $crate::GgmlType::Q4_0 => {
                type $W = BlockQ4_0;
                $body
            }
            $crate::GgmlType::Q4_1 => {
                type $W = BlockQ4_1;
                $body
            }
            $crate::GgmlType::Q5_0 => {
                type $W = BlockQ5_0;
                $body
            }
            $crate::GgmlType::Q5_1 => {
                type $W = BlockQ5_1;
                $body
            }
            $crate::GgmlType::Q8_0 => {
                type $W = BlockQ8_0;
                $body
            }
            $crate::GgmlType::Q2_K => {
                type $W = BlockQ2K;
                $body
            }
            $crate::GgmlType::Q3_K => {
                type $W = BlockQ3K;
                $body
            }
            $crate::GgmlType::Q4_K => {
                type $W = BlockQ4K;
                $body
            }
            $crate::GgmlType::Q5_K => {
                type $W = BlockQ5K;
                $body
            }
            $crate::GgmlType::Q6_K => {
                type $W = BlockQ6K;
                $body
            }
            $crate::GgmlType::IQ4_NL => {
                type $W = BlockIQ4NL;
                $body
            }
            $crate::GgmlType::Q8_1 | $crate::GgmlType::Q8_K => $none,
        }
    }};
}

/// Views raw bytes as blocks of `B`.
///
/// # Errors
/// [`Error::Shape`] when the length is not a whole number of blocks,
/// [`Error::Misaligned`] when the address is not aligned for `B`.
pub fn blocks<B: BlockFormat>(bytes: &[u8]) -> Result<&[B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(shape_err(
            "blocks",
            format!("{} bytes is not a whole number of {}-byte {} blocks", bytes.len(), size, B::TYPE),
        ));
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| Error::Misaligned { ty: B::TYPE })
}

/// Mutable variant of [`blocks`].
pub fn blocks_mut<B: BlockFormat>(bytes: &mut [u8]) -> Result<&mut [B]> {
    let size = std::mem::size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(shape_err(
            "blocks_mut",
            format!("{} bytes is not a whole number of {}-byte {} blocks", bytes.len(), size, B::TYPE),
        ));
    }
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| Error::Misaligned { ty: B::TYPE })
}

fn check_len(op: &'static str, ty: GgmlType, n_values: usize, n_bytes: usize) -> Result<()> {
    let need = ty.row_bytes(n_values)?;
    if need != n_bytes {
        return Err(shape_err(op, format!("{n_values} {ty} values need {need} bytes, got {n_bytes}")));
    }
    Ok(())
}

/// Quantizes `x` (a row of `x.len()` f32 values) into `out` with ggml's
/// reference algorithm for `ty`.
///
/// # Errors
/// Row length not a multiple of the block size, `out` of the wrong length,
/// or a misaligned `out`.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<()> {
    check_len("quantize_row", ty, x.len(), out.len())?;
    with_block_type!(ty, B => {
        B::quantize_row_ref(x, blocks_mut::<B>(out)?);
        Ok(())
    })
}

/// Dequantizes a row of `ty` blocks in `q` into `out` (`out.len()` values).
///
/// # Errors
/// Length mismatch, misalignment.
pub fn dequantize_row(ty: GgmlType, q: &[u8], out: &mut [f32]) -> Result<()> {
    check_len("dequantize_row", ty, out.len(), q.len())?;
    with_block_type!(ty, B => {
        B::dequantize_row(blocks::<B>(q)?, out);
        Ok(())
    })
}

/// Reference dot product of a weight row `w` (`n` values of type `ty`) with
/// the f32 activation `x`: `x` is first quantized to ggml's `vec_dot_type`
/// for `ty`, as ggml's CPU backend does.
///
/// # Errors
/// [`Error::Unsupported`] for activation-only types (Q8_1, Q8_K); length
/// mismatches.
pub fn vec_dot(ty: GgmlType, w: &[u8], x: &[f32]) -> Result<f32> {
    check_len("vec_dot", ty, x.len(), w.len())?;
    with_weight_type!(ty, W => {
        let act = quantize_activation::<W>(x)?;
        Ok(W::vec_dot_ref(blocks::<W>(w)?, &act))
    }, else Err(Error::Unsupported { op: "vec_dot", ty }))
}

/// Quantizes an activation row to the pair type of weight format `W`.
///
/// # Errors
/// Row length not a multiple of the activation block size.
pub fn quantize_activation<W: VecDot>(x: &[f32]) -> Result<Vec<W::Act>> {
    let bs = <W::Act as BlockFormat>::BLOCK_SIZE;
    if !x.len().is_multiple_of(bs) {
        return Err(Error::RowNotBlockMultiple { ty: <W::Act as BlockFormat>::TYPE, cols: x.len(), block_size: bs });
    }
    let mut out = vec![<W::Act as bytemuck::Zeroable>::zeroed(); x.len() / bs];
    W::Act::quantize_row_ref(x, &mut out);
    Ok(out)
}

/// Byte offsets of the f16 scale fields (`d`, `m`, `dmin`) inside one block
/// of `ty`, taken from the block structs; empty for the float types and for
/// the activation types. Tests that fill blocks with random bytes overwrite
/// these with finite values (random bits would give infinities and NaNs).
pub fn f16_scale_offsets(ty: GgmlType) -> &'static [usize] {
    use core::mem::offset_of;
    const Q4_0: [usize; 1] = [offset_of!(BlockQ4_0, d)];
    const Q5_0: [usize; 1] = [offset_of!(BlockQ5_0, d)];
    const Q8_0: [usize; 1] = [offset_of!(BlockQ8_0, d)];
    const IQ4_NL: [usize; 1] = [offset_of!(BlockIQ4NL, d)];
    const Q4_1: [usize; 2] = [offset_of!(BlockQ4_1, d), offset_of!(BlockQ4_1, m)];
    const Q5_1: [usize; 2] = [offset_of!(BlockQ5_1, d), offset_of!(BlockQ5_1, m)];
    const Q2_K: [usize; 2] = [offset_of!(BlockQ2K, d), offset_of!(BlockQ2K, dmin)];
    const Q3_K: [usize; 1] = [offset_of!(BlockQ3K, d)];
    const Q4_K: [usize; 2] = [offset_of!(BlockQ4K, d), offset_of!(BlockQ4K, dmin)];
    const Q5_K: [usize; 2] = [offset_of!(BlockQ5K, d), offset_of!(BlockQ5K, dmin)];
    const Q6_K: [usize; 1] = [offset_of!(BlockQ6K, d)];
    match ty {
        GgmlType::Q4_0 => &Q4_0,
        GgmlType::Q5_0 => &Q5_0,
        GgmlType::Q8_0 => &Q8_0,
        GgmlType::IQ4_NL => &IQ4_NL,
        GgmlType::Q4_1 => &Q4_1,
        GgmlType::Q5_1 => &Q5_1,
        GgmlType::Q2_K => &Q2_K,
        GgmlType::Q3_K => &Q3_K,
        GgmlType::Q4_K => &Q4_K,
        GgmlType::Q5_K => &Q5_K,
        GgmlType::Q6_K => &Q6_K,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_1 | GgmlType::Q8_K => &[],
    }
}
