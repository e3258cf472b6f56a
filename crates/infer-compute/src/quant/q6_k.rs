//! Q6_K: 6.5625 bits per weight: 256 6-bit values in 16 groups of 16 with 8-bit scales.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q6_k_ref`, `dequantize_row_q6_k`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8K};
use crate::GgmlType;

/// One Q6_K block (210 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; 128],
    /// High 2 bits.
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockFormat for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockQ6K {
    type Act = BlockQ8K;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
