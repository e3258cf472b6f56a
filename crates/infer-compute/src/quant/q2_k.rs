//! Q2_K: 2.625 bits per weight: 256 2-bit values in 16 groups of 16 with 4-bit scales and mins.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q2_k_ref`, `dequantize_row_q2_k`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8K};
use crate::GgmlType;

/// One Q2_K block (84 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// 4-bit scale (low) and 4-bit min (high) per 16 values.
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

impl BlockFormat for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockQ2K {
    type Act = BlockQ8K;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
