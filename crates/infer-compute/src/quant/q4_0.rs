//! Q4_0: 4.5 bits per weight: one f16 scale and 32 4-bit values (offset 8).
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q4_0_ref`, `dequantize_row_q4_0`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8_0};
use crate::GgmlType;

/// One Q4_0 block (18 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockFormat for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockQ4_0 {
    type Act = BlockQ8_0;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
