//! Q8_1: 9 bits per value: activation type paired with Q4_1/Q5_1.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q8_1_ref`, `dequantize_row_q8_1`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use crate::GgmlType;

/// One Q8_1 block (36 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    /// `d * sum(qs)`, rounded to f16.
    pub s: f16,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl BlockFormat for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}
