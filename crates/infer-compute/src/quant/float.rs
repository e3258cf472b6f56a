//! Plain float "blocks" of one value: F32, F16 and BF16.
//!
//! Conversions follow ggml: f32→f16 is IEEE round-to-nearest-even (F16C),
//! f32→bf16 rounds to nearest even and quiets NaN (`ggml_compute_fp32_to_bf16`).

use half::{bf16, f16};

use super::{BlockFormat, VecDot};
use crate::GgmlType;

impl BlockFormat for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        y.copy_from_slice(x);
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        y.copy_from_slice(x);
    }
}

impl VecDot for f32 {
    type Act = f32;
    fn vec_dot_ref(w: &[Self], a: &[Self::Act]) -> f32 {
        w.iter().zip(a).map(|(w, a)| w * a).sum()
    }
}

impl BlockFormat for f16 {
    const TYPE: GgmlType = GgmlType::F16;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for f16 {
    type Act = f16;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl BlockFormat for bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    fn quantize_row_ref(_x: &[f32], _y: &mut [Self]) {
        todo!()
    }
    fn dequantize_row(_x: &[Self], _y: &mut [f32]) {
        todo!()
    }
}

impl VecDot for bf16 {
    type Act = bf16;
    fn vec_dot_ref(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
