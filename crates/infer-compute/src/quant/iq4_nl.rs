//! IQ4_NL: 4.5 bits per weight: f16 scale and 32 4-bit indices into a fixed non-linear table.
//!
//! Layout and algorithms: ggml `ggml-common.h` (block), `ggml-quants.c`
//! (`quantize_row_iq4_nl_ref`, `dequantize_row_iq4_nl`), `ggml-cpu/quants.c`
//! (generic `vec_dot`).

use half::f16;

use super::BlockFormat;
use super::{VecDot, BlockQ8_0};
use crate::GgmlType;

/// One IQ4_NL block (18 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);

impl BlockFormat for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ4NL {
    type Act = BlockQ8_0;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
