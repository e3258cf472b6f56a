//! The device top-k (`kernels/topk.cu`) behind
//! `DeviceModel::forward_top_k` on the CUDA backend, against the host
//! reference (`TopK::fill_from_logits`): crafted rows through
//! `CudaBackend::top_k_rows`, and whole steps of a random model (prompts,
//! then decode steps replayed as graphs) against `forward`'s logits.
//!
//! Without a GPU every test is reported as ignored, with the reason,
//! unless `INFER_REQUIRE_CUDA=1`, which turns a missing device into a
//! failure. Built only with the `cuda` feature.

use infer_compute::backend::{TopK, TOP_K_MAX};
use infer_compute::conformance::model::{random_model, tokens, Arch};
use infer_compute::cuda::CudaBackend;
use infer_compute::{Batch, DeviceModel, Error, Out};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[macro_use]
#[path = "support/cuda.rs"]
mod cuda_support;

fn rand_vec(rng: &mut StdRng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-amp..amp)).collect()
}

/// The device's rows against the host reference's: the same ids in the
/// same order and the same logit bits, the same max and first NaN, the
/// log-sum-exp within f32 rounding of the host's f64 sum.
fn assert_top_k_equal(what: &str, got: &TopK, want: &TopK) {
    assert_eq!((got.rows(), got.k()), (want.rows(), want.k()), "{what}");
    for r in 0..want.rows() {
        let (g, w) = (got.row(r), want.row(r));
        assert_eq!(g.stats.first_nan, w.stats.first_nan, "{what}, row {r}: first NaN");
        if w.stats.first_nan.is_some() {
            continue;
        }
        assert_eq!(g.ids, w.ids, "{what}, row {r}: ids");
        let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(g.logits), bits(w.logits), "{what}, row {r}: logits");
        assert_eq!(g.stats.max, w.stats.max, "{what}, row {r}: max");
        let (gl, wl) = (g.stats.log_sum_exp, w.stats.log_sum_exp);
        assert!((gl - wl).abs() <= 2e-5 * wl.abs().max(1.0), "{what}, row {r}: log-sum-exp {gl}, host {wl}");
    }
}

/// `CudaBackend::top_k_rows` equals the host reference on rows of 7 to
/// 262 144 logits (Gemma 3's vocabulary) for k = 1, 40 and the maximum:
/// distinct values, heavy ties (a palette with -0.0 and +0.0), all equal,
/// fewer finite logits than k, all -inf, two +inf, two NaNs; all rows of a
/// length in one launch, and the tied rows alone (a launch of fewer rows
/// splits each row into more chunks, whose lists then hold the ties).
fn top_k_rows_equal_the_host_reference() {
    let cuda = cuda_or_skip!();
    let mut rng = StdRng::seed_from_u64(90);
    let palette = [-0.0f32, 0.0, 1.5, 2.25, -3.0, f32::NEG_INFINITY, 4.0];
    for n in [7usize, 1000, 32_000, 128_256, 262_144] {
        let mut rows = vec![rand_vec(&mut rng, n, 12.0)];
        rows.push((0..n).map(|_| palette[rng.gen_range(0..palette.len())]).collect());
        rows.push(vec![0.5; n]);
        let mut r = vec![f32::NEG_INFINITY; n];
        r[n / 2] = 1.0;
        rows.push(r);
        rows.push(vec![f32::NEG_INFINITY; n]);
        let mut r = rand_vec(&mut rng, n, 5.0);
        (r[0], r[n - 1]) = (f32::INFINITY, f32::INFINITY);
        rows.push(r);
        let mut r = rand_vec(&mut rng, n, 5.0);
        (r[n / 3], r[n - 1]) = (f32::NAN, f32::NAN);
        rows.push(r);
        let flat = rows.concat();
        for k in [1, 40, TOP_K_MAX] {
            let (mut got, mut want) = (TopK::new(), TopK::new());
            cuda.top_k_rows(&flat, n, k, &mut got).unwrap();
            want.fill_from_logits(&flat, n, k).unwrap();
            assert_eq!(got.row(6).stats.first_nan, Some((n / 3) as u32), "rows of {n}, k {k}");
            assert_top_k_equal(&format!("rows of {n}, k {k}"), &got, &want);
            let ties = &flat[n..3 * n];
            for one in [ties, &ties[n..]] {
                cuda.top_k_rows(one, n, k, &mut got).unwrap();
                want.fill_from_logits(one, n, k).unwrap();
                assert_top_k_equal(&format!("{} tied rows of {n}, k {k}", one.len() / n), &got, &want);
            }
        }
    }
    let mut out = TopK::new();
    assert!(matches!(cuda.top_k_rows(&[1.0; 8], 4, 0, &mut out), Err(Error::Shape { .. })));
    assert!(matches!(cuda.top_k_rows(&[1.0; 8], 4, TOP_K_MAX + 1, &mut out), Err(Error::Shape { .. })));
    assert!(matches!(cuda.top_k_rows(&[1.0; 7], 4, 2, &mut out), Err(Error::Shape { .. })));
}

/// `forward_top_k` equals the host reference on `forward`'s logits of the
/// same steps (on a twin pool): a step of four prompts (one with all its
/// rows), then decode steps of the four slots (captured once and replayed
/// when graphs are on), for k = 1, 40 and the maximum (above this model's
/// vocabulary: the whole row); a k out of range is an error that leaves
/// the slot as it was.
fn forward_top_k_equals_host_top_k_of_forward() {
    let cuda = cuda_or_skip!();
    let spec = random_model(35, Arch::LlamaBias);
    let mut m = cuda.prepare_cuda(&spec).unwrap();
    let n = spec.n_vocab;
    let prompt = tokens(36, 8, n);
    for graph in [true, false] {
        m.set_use_graph(graph);
        for k in [1, 40, TOP_K_MAX] {
            let (mut a, mut b) = (m.new_kv_pool(4, 32).unwrap(), m.new_kv_pool(4, 32).unwrap());
            let mut batch = Batch::new();
            for slot in 0..4 {
                batch.push_seq(slot, 0, &prompt[..slot + 2], if slot == 1 { Out::All } else { Out::Last });
            }
            let mut len: Vec<usize> = (0..4).map(|s| s + 2).collect();
            let before = m.captures();
            for step in 0..5 {
                let mut want = TopK::new();
                want.fill_from_logits(m.forward(a.as_mut(), &batch).unwrap(), n, k).unwrap();
                let mut got = TopK::new();
                m.forward_top_k(b.as_mut(), &batch, k, &mut got).unwrap();
                assert_top_k_equal(&format!("graphs {graph}, k {k}, step {step}"), &got, &want);
                batch = Batch::new();
                for slot in 0..4 {
                    batch.push(prompt[(slot + step) % prompt.len()], len[slot], slot, true);
                    len[slot] += 1;
                }
            }
            if graph {
                assert_eq!(m.captures() - before, 2, "k {k}: one graph for the logits, one for the top-k, replayed");
            }
        }
    }
    let mut pool = m.new_kv_pool(1, 8).unwrap();
    let mut out = TopK::new();
    let step = Batch::seq(0, 0, &prompt[..2], Out::Last);
    assert!(matches!(m.forward_top_k(pool.as_mut(), &step, 0, &mut out), Err(Error::Shape { .. })));
    assert!(matches!(m.forward_top_k(pool.as_mut(), &step, TOP_K_MAX + 1, &mut out), Err(Error::Shape { .. })));
    // The failed calls left slot 0 empty: the prompt goes in at position 0.
    m.forward_top_k(pool.as_mut(), &step, 3, &mut out).unwrap();
    assert_eq!((out.rows(), out.k()), (1, 3));
}

#[path = "support/gpu_tests.rs"]
mod gpu_tests;

fn main() {
    let tests: Vec<(&'static str, fn())> = vec![
        ("top_k_rows_equal_the_host_reference", top_k_rows_equal_the_host_reference),
        ("forward_top_k_equals_host_top_k_of_forward", forward_top_k_equals_host_top_k_of_forward),
    ];
    let unavailable = CudaBackend::new(0).err().map(|e| format!("no CUDA device here ({e})"));
    gpu_tests::run(tests, unavailable, "INFER_REQUIRE_CUDA")
}
