//! Q8_K: 9.125 bits per value: activation type paired with the k-quants.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_q8_k_ref`, `dequantize_row_q8_k`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use super::BlockFormat;
use crate::GgmlType;

/// One Q8_K block (292 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    /// Sums of each group of 16 `qs`.
    pub bsums: [i16; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl BlockFormat for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}
