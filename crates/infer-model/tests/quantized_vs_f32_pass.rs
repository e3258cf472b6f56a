//! Which quantized forward pass is closer to the F32 pass of the same
//! weights: ours or llama.cpp's (issue 31, item 7)?
//!
//! Both quantize the activations to 8 bits in every layer; they differ in
//! rounding (our packed Q4_1 product uses the exact sum of each activation
//! block, where ggml uses its f16 rounding) and in summation order, and
//! with 8-bit activations re-quantized in every layer the forward pass is
//! chaotic, so the two drift apart by more than either is from the F32
//! pass. The F32 pass is our exact mode (weights dequantized to f32, f32
//! activations), which `model_logits.rs` holds to llama.cpp's F32 run
//! within 0.1 per logit and a cosine of 0.99999.
//!
//! For every case of `testdata/<model>/logits/` (llama.cpp's quantized
//! run), along its tokens (prompt and greedy steps), at each position
//! where the F32 pass's top-1 leads by more than
//! [`infer_model::reference::DECISIVE_MARGIN`]: does each quantized pass
//! pick that top-1? And over llama.cpp's top-20 ids at every position, the
//! mean |Δlogit| of each from the F32 pass.
//!
//! Measured on the 13 cases per model of `testdata/` (AVX-512 VNNI
//! kernels, 2026-12-03): Gemma 3 270M, 1071 decisive positions, ours 1054
//! (98.4%), llama.cpp 1055 (98.5%), mean |Δ| ours 0.196, llama.cpp 0.210;
//! SmolLM2 135M (packed Q4_1), 1157 positions, ours 1142 (98.7%),
//! llama.cpp 1148 (99.2%), mean |Δ| ours 0.163, llama.cpp 0.161; our
//! scalar kernels on SmolLM2 (row dots, whose Q4_1 product rounds the
//! activation sum to f16 as ggml does) 1143 (98.8%). Against llama.cpp's
//! own F32 run on the same tokens (`bench/llama-logits` with `--follow`)
//! the counts are the same. Earlier, on four SmolLM2 prompts outside
//! `testdata/` (a story, a chat turn, a short fact, code), 252 positions:
//! ours 249 (98.8%), llama.cpp 251 (99.6%), mean |Δ| ours 0.163, llama.cpp
//! 0.159. Neither pass is closer to the F32 pass than the other, and the
//! f16 rounding of the Q4_1 activation sum is not what separates them:
//! where they disagree with each other (the top-1 bound of
//! `model_logits.rs` against llama.cpp), each is about as far from the F32
//! pass, so the bound that says what our quantized path computes is one
//! against the F32 pass: this one, and `model_logits.rs`'s
//! `quantized_path_matches_llama_cpp_f32_logits`.

// The shared helpers; this test uses a few of them.
#[allow(dead_code)]
mod real_refs;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::{ComputeBackend, DeviceModel};
use infer_model::reference::{ReferenceCase, DECISIVE_MARGIN};
use real_refs::{cases, load_spec, models};

fn prepare(name: &str, precision: Precision) -> Box<dyn DeviceModel> {
    let spec = load_spec(name);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let cpu = CpuBackend::with_options(threads, Kernels::detect(), precision).expect("CPU backend");
    cpu.prepare(&spec).unwrap_or_else(|e| panic!("{name}: prepare: {e}"))
}

/// The ids of the two largest logits.
fn top2(v: &[f32]) -> (usize, usize) {
    let (mut a, mut b) = (0, usize::MAX);
    for (i, &x) in v.iter().enumerate().skip(1) {
        if x > v[a] {
            b = a;
            a = i;
        } else if b == usize::MAX || x > v[b] {
            b = i;
        }
    }
    (a, b)
}

/// Agreement of the two quantized passes with the F32 pass.
#[derive(Default, Debug)]
struct Tally {
    decisive: usize,
    ours_agree: usize,
    llama_agree: usize,
    ids: usize,
    ours_diff: f64,
    llama_diff: f64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.decisive += other.decisive;
        self.ours_agree += other.ours_agree;
        self.llama_agree += other.llama_agree;
        self.ids += other.ids;
        self.ours_diff += other.ours_diff;
        self.llama_diff += other.llama_diff;
    }

    fn line(&self) -> String {
        let pct = |n: usize| 100.0 * n as f64 / self.decisive.max(1) as f64;
        format!(
            "top-1 of the F32 pass at {} decisive positions: ours {} ({:.1}%), llama.cpp {} ({:.1}%); \
             mean |Δ| from it over llama.cpp's top-20: ours {:.3}, llama.cpp {:.3}",
            self.decisive,
            self.ours_agree,
            pct(self.ours_agree),
            self.llama_agree,
            pct(self.llama_agree),
            self.ours_diff / self.ids.max(1) as f64,
            self.llama_diff / self.ids.max(1) as f64
        )
    }
}

fn compare(exact: &mut dyn DeviceModel, quant: &mut dyn DeviceModel, case: &ReferenceCase) -> Tally {
    let n = case.prompt_ids.len() + case.greedy.len();
    let mut kv_exact = exact.new_kv_cache(n).expect("kv");
    let mut kv_quant = quant.new_kv_cache(n).expect("kv");
    let tokens = case.prompt_ids.iter().copied().chain(case.greedy.iter().map(|g| g.id));
    let llama = case.prompt_top.iter().chain(case.greedy.iter().map(|g| &g.next_top));
    let mut t = Tally::default();
    for (pos, (tok, llama_top)) in tokens.zip(llama).enumerate() {
        let f32_pass = exact.decode_token(kv_exact.as_mut(), tok, pos).expect("exact").to_vec();
        let ours = quant.decode_token(kv_quant.as_mut(), tok, pos).expect("quantized").to_vec();
        let (first, second) = top2(&f32_pass);
        if f32_pass[first] - f32_pass[second] > DECISIVE_MARGIN {
            t.decisive += 1;
            t.ours_agree += usize::from(top2(&ours).0 == first);
            t.llama_agree += usize::from(llama_top.ids[0] as usize == first);
        }
        for (&id, &l) in llama_top.ids.iter().zip(&llama_top.logits) {
            t.ids += 1;
            t.ours_diff += f64::from((ours[id as usize] - f32_pass[id as usize]).abs());
            t.llama_diff += f64::from((l - f32_pass[id as usize]).abs());
        }
    }
    t
}

#[test]
fn our_quantized_path_is_as_close_to_the_f32_pass_as_llama_cpps() {
    let mut all = Tally::default();
    for name in models() {
        let cases = cases(&name, "logits");
        if cases.is_empty() {
            continue;
        }
        let mut exact = prepare(&name, Precision::Exact);
        let mut quant = prepare(&name, Precision::Quantized);
        let mut model = Tally::default();
        for case in &cases {
            let t = compare(exact.as_mut(), quant.as_mut(), case);
            println!("{name} {}: {}", case.name, t.line());
            model.add(&t);
        }
        println!("{name}: {}", model.line());
        all.add(&model);
    }
    println!("all: {}", all.line());
    assert!(all.decisive > 0, "no decisive positions compared");
    // The bound against the F32 pass: the top-1 at 97% of its decisive
    // positions, and within one point of llama.cpp's own quantized run.
    let rate = |n: usize| n as f64 / all.decisive as f64;
    assert!(rate(all.ours_agree) >= 0.97, "{}", all.line());
    assert!(rate(all.ours_agree) + 0.01 >= rate(all.llama_agree), "{}", all.line());
}
