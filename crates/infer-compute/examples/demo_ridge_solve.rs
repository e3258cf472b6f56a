//! Solves a small key–value editing problem with
//! `infer_compute::linalg::ridge_decomposition_solve_with_report` and prints
//! how well the edit maps each key to its target.
//!
//! 8 facts, d = 64: keys `K: [8, 64]`, targets `T: [8, 64]`, update
//! `ΔW = Tᵀ (K·Kᵀ + λI)⁻¹ K : [64, 64]`. Two key sets: independent random
//! keys, and keys that share a dominant direction (`kᵢ = c + 1e-3·noise`,
//! the hard case that needs the f64 solve), each at a small and a large λ.
//!
//! Run: `cargo run --release --example demo_ridge_solve`

use infer_compute::linalg::ridge_decomposition_solve_with_report;
use ndarray::Array2;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

const FACTS: usize = 8;
const D: usize = 64;

fn randn(rng: &mut StdRng, r: usize, c: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

fn main() -> Result<(), infer_compute::Error> {
    let mut rng = StdRng::seed_from_u64(2022);
    let targets = randn(&mut rng, FACTS, D);

    let independent = randn(&mut rng, FACTS, D);
    let common = randn(&mut rng, 1, D);
    let noise = randn(&mut rng, FACTS, D);
    let shared = Array2::from_shape_fn((FACTS, D), |(i, j)| common[[0, j]] + 1e-3 * noise[[i, j]]);

    for (name, keys, lambdas) in [
        ("independent keys", &independent, [1e-4, 1e1]),
        ("keys sharing a dominant direction (c + 1e-3 noise)", &shared, [1e-9, 1e-4]),
    ] {
        println!("{name}: K [{FACTS}, {D}], T [{FACTS}, {D}]");
        for lambda in lambdas {
            let (dw, report) = ridge_decomposition_solve_with_report(keys.view(), targets.view(), lambda)?;
            let norm = dw.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            println!("  lambda = {lambda:e}: ΔW [{}, {}], ‖ΔW‖_F = {norm:.3}", dw.nrows(), dw.ncols());
            println!("    fact  cos(ΔW·k, t)  ‖ΔW·k − t‖/‖t‖");
            for (i, (c, r)) in report.cosine.iter().zip(&report.relative_residual).enumerate() {
                println!("    {i:>4}  {c:>12.8}  {r:>15.3e}");
            }
            println!(
                "    min cosine {:.8}, max relative residual {:.3e}",
                report.min_cosine(),
                report.max_relative_residual()
            );
        }
    }
    Ok(())
}
