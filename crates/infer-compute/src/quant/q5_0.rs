//! Q5_0: 5.5 bits per weight: f16 scale, 32 5-bit values (offset 16), high bits packed in `qh`.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q5_0_ref`, `dequantize_row_q5_0`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8_0};
use crate::GgmlType;

/// One Q5_0 block (22 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

impl BlockFormat for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockQ5_0 {
    type Act = BlockQ8_0;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
