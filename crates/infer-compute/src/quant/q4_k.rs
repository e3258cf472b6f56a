//! Q4_K: 4.5 bits per weight: 256 4-bit values in 8 groups of 32 with 6-bit scales and mins.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q4_k_ref`, `dequantize_row_q4_k`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8K};
use crate::GgmlType;

/// One Q4_K block (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    /// 8 6-bit scales and 8 6-bit mins, packed.
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl BlockFormat for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockQ4K {
    type Act = BlockQ8K;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
