//! Bad input to the CPU backend is an error, never a panic or a silent
//! wrong answer.

use infer_compute::cpu::CpuBackend;
use infer_compute::QuantWeight;
use infer_compute::{quant, ComputeBackend, GgmlType};
use ndarray::Array2;

fn weight(ty: GgmlType, rows: usize, cols: usize) -> QuantWeight {
    let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let rb = ty.row_bytes(cols).unwrap();
    let mut q = vec![0u8; rows * rb];
    for r in 0..rows {
        quant::quantize_row(ty, &x[r * cols..(r + 1) * cols], &mut q[r * rb..(r + 1) * rb]).unwrap();
    }
    QuantWeight::new(ty, rows, cols, q.into()).unwrap()
}

#[test]
fn inconsistent_weights_are_errors_in_matvec_and_matmul_quant() {
    let cpu = CpuBackend::new();
    for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_0] {
        let good = weight(ty, 8, 256);
        let doctored = [
            QuantWeight { rows: 16, ..good.clone() },
            QuantWeight { cols: 512, ..good.clone() },
            QuantWeight { cols: 100, ..good.clone() },
        ];
        for w in &doctored {
            let x = vec![1f32; w.cols];
            let mut y = vec![0f32; w.rows];
            assert!(cpu.matvec(w, &x, &mut y).is_err(), "{ty} {}x{}: matvec accepted it", w.rows, w.cols);
            let xs = Array2::<f32>::ones((3, w.cols));
            assert!(cpu.matmul_quant(w, xs.view()).is_err(), "{ty} {}x{}: matmul_quant accepted it", w.rows, w.cols);
        }
        // Shape mismatches of x and y.
        let mut y = vec![0f32; 8];
        assert!(cpu.matvec(&good, &[1.0; 255], &mut y).is_err());
        assert!(cpu.matvec(&good, &[1.0; 256], &mut y[..7]).is_err());
        assert!(cpu.matmul_quant(&good, Array2::<f32>::ones((2, 128)).view()).is_err());
    }
}

#[test]
fn activation_only_types_have_no_matvec() {
    let cpu = CpuBackend::new();
    for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
        let w = weight(ty, 2, 256);
        let mut y = vec![0f32; 2];
        let err = cpu.matvec(&w, &[0.5; 256], &mut y).unwrap_err();
        assert!(matches!(err, infer_compute::Error::Unsupported { .. }), "{ty}: {err}");
    }
}
