//! Q5_K: 5.5 bits per weight: 256 5-bit values in 8 groups of 32 with 6-bit scales and mins.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q5_k_ref`, `dequantize_row_q5_k`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8K};
use crate::GgmlType;

/// One Q5_K block (176 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockFormat for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockQ5K {
    type Act = BlockQ8K;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
