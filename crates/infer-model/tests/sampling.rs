//! Sampler tests: greedy choice, filters checked empirically on small
//! distributions, determinism per seed, bad logits.

use std::time::Instant;

use infer_compute::greedy_token;
use infer_model::sampling::{nucleus_len, Sampler, SamplerConfig, SamplingError};
use rand::{Rng, SeedableRng};

fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerConfig {
    SamplerConfig { temperature, top_k, top_p, min_p, seed, ..SamplerConfig::default() }
}

/// Logits whose softmax is `probs`.
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

/// Draw counts over `n` draws.
fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut h = vec![0; logits.len()];
    for _ in 0..n {
        h[s.sample(logits).unwrap() as usize] += 1;
    }
    h
}

fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-8.0f32..8.0)).collect()
}

/// `is_argmax` holds exactly when `sample` is the argmax whatever the
/// logits (so generation may take it on the device), and never with a
/// penalty, which changes the logits first.
#[test]
fn is_argmax_only_when_sampling_is_the_argmax() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let cases = [
        (SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }, true),
        (SamplerConfig { top_k: 1, ..SamplerConfig::default() }, true),
        (SamplerConfig::default(), false),
        (SamplerConfig { temperature: 0.0, repetition_penalty: 1.3, ..SamplerConfig::default() }, false),
        (SamplerConfig { temperature: 0.0, presence_penalty: 0.5, ..SamplerConfig::default() }, false),
        (
            SamplerConfig { temperature: 0.0, repetition_penalty: 1.3, repeat_last_n: 0, ..SamplerConfig::default() },
            true,
        ),
    ];
    for (c, expected) in cases {
        let mut s = Sampler::new(c.clone()).unwrap();
        assert_eq!(s.is_argmax(), expected, "{c:?}");
        if expected {
            for _ in 0..50 {
                let logits: Vec<f32> = (0..97).map(|_| rng.gen_range(-5.0..5.0)).collect();
                assert_eq!(s.sample(&logits).ok(), greedy_token(&logits).ok(), "{c:?}");
            }
        }
    }
}

#[test]
fn greedy_picks_argmax_lowest_id_on_ties() {
    let mut s = Sampler::greedy();
    assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]).unwrap(), 1);
    assert_eq!(s.sample(&[1.0, 5.0, 5.0, 5.0]).unwrap(), 1);
    assert_eq!(s.sample(&[-1.0, -1.0]).unwrap(), 0);
    assert_eq!(s.sample(&[f32::NEG_INFINITY, -1e30]).unwrap(), 1);
    // The one greedy choice of every caller (infer_compute::greedy_token):
    // the first of ties, an error for NaN or no logits.
    assert!(greedy_token(&[2.0, f32::NAN, 3.0, 3.0]).is_err());
    assert!(greedy_token(&[]).is_err());
    assert!(greedy_token(&[f32::NAN; 40]).is_err());
    let mut wide = vec![0.5f32; 37];
    wide[20] = 2.0;
    wide[36] = 2.0;
    assert_eq!(greedy_token(&wide).ok(), Some(20), "first of ties past the vector lanes");
    wide[3] = f32::NAN;
    assert!(greedy_token(&wide).is_err(), "a NaN past the lanes' first pass");
    assert!(matches!(s.sample(&wide), Err(SamplingError::NaN { index: 3 })));
    for seed in 0..20 {
        let l = random_logits(1000, seed);
        let want = greedy_token(&l).unwrap();
        assert_eq!(s.sample(&l).unwrap(), want);
        // Temperature 0 through the full config.
        let mut t0 = Sampler::new(cfg(0.0, 40, 0.9, 0.1, seed)).unwrap();
        assert_eq!(t0.sample(&l).unwrap(), want);
    }
}

#[test]
fn top_k_one_is_greedy() {
    for seed in 0..50 {
        let l = random_logits(5000, seed + 100);
        let mut s = Sampler::new(cfg(1.5, 1, 1.0, 0.0, seed)).unwrap();
        assert_eq!(s.sample(&l).unwrap(), greedy_token(&l).unwrap());
    }
    let mut s = Sampler::new(cfg(1.0, 1, 1.0, 0.0, 0)).unwrap();
    assert_eq!(s.sample(&[4.0, 4.0, 1.0]).unwrap(), 0);
}

#[test]
fn temperature_towards_zero_is_greedy() {
    for seed in 0..20 {
        // The best logit 0.1 ahead of the rest: at these temperatures the
        // others' probabilities underflow (exp(-0.1 / T)).
        let mut l = random_logits(2000, seed + 200);
        let want = greedy_token(&l).unwrap();
        l[want as usize] += 0.1;
        for t in [1e-3f32, 1e-6, 1e-20, f32::MIN_POSITIVE, 1e-45] {
            let mut s = Sampler::new(SamplerConfig::with_temperature(t, seed)).unwrap();
            assert_eq!(s.sample(&l).unwrap(), want, "temperature {t}");
        }
    }
}

#[test]
fn seeded_runs_reproduce() {
    let l = random_logits(50_000, 7);
    let run = |seed, c: fn(u64) -> SamplerConfig| {
        let mut s = Sampler::new(c(seed)).unwrap();
        (0..200).map(|_| s.sample(&l).unwrap()).collect::<Vec<_>>()
    };
    let configs: [fn(u64) -> SamplerConfig; 4] = [
        |seed| SamplerConfig::with_temperature(1.0, seed),
        |seed| cfg(0.9, 40, 1.0, 0.0, seed),
        |seed| cfg(1.2, 0, 0.9, 0.0, seed),
        |seed| SamplerConfig { seed, repetition_penalty: 1.3, ..SamplerConfig::default() },
    ];
    for c in configs {
        let a = run(42, c);
        assert_eq!(a, run(42, c));
        assert_ne!(a, run(43, c));
    }
    // Reseeding restarts the sequence.
    let mut s = Sampler::new(SamplerConfig::with_temperature(1.0, 5)).unwrap();
    let first: Vec<u32> = (0..20).map(|_| s.sample(&l).unwrap()).collect();
    s.reseed(5);
    let again: Vec<u32> = (0..20).map(|_| s.sample(&l).unwrap()).collect();
    assert_eq!(first, again);
}

#[test]
fn temperature_one_follows_the_softmax() {
    let probs = [0.5, 0.3, 0.15, 0.05];
    let mut s = Sampler::new(SamplerConfig::with_temperature(1.0, 1)).unwrap();
    let n = 40_000;
    let h = histogram(&mut s, &logits_of(&probs), n);
    for (i, &p) in probs.iter().enumerate() {
        let f = h[i] as f64 / n as f64;
        assert!((f - p).abs() < 0.01, "token {i}: {f} vs {p} ({h:?})");
    }
    // Temperature 2 flattens: p ∝ sqrt(p).
    let mut s = Sampler::new(SamplerConfig::with_temperature(2.0, 2)).unwrap();
    let h = histogram(&mut s, &logits_of(&probs), n);
    let z: f64 = probs.iter().map(|p: &f64| p.sqrt()).sum();
    for (i, &p) in probs.iter().enumerate() {
        let (f, want) = (h[i] as f64 / n as f64, p.sqrt() / z);
        assert!((f - want).abs() < 0.01, "token {i}: {f} vs {want}");
    }
}

#[test]
fn top_p_restricts_support_to_the_nucleus() {
    // Sorted 0.5, 0.3, 0.15, 0.05 (shuffled in the vocabulary): top-p 0.7
    // keeps {0.5, 0.3}; 0.85 keeps three; 0.5 keeps one.
    let probs = [0.15, 0.5, 0.05, 0.3];
    let l = logits_of(&probs);
    let n = 20_000;
    let mut s = Sampler::new(cfg(1.0, 0, 0.7, 0.0, 3)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!((h[0], h[2]), (0, 0), "{h:?}");
    let f = h[1] as f64 / n as f64;
    assert!((f - 0.5 / 0.8).abs() < 0.015, "{h:?}");

    let mut s = Sampler::new(cfg(1.0, 0, 0.85, 0.0, 4)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!(h[2], 0, "{h:?}");
    assert!(h[0] > 0 && h[1] > 0 && h[3] > 0);

    let mut s = Sampler::new(cfg(1.0, 0, 0.45, 0.0, 5)).unwrap();
    assert_eq!(histogram(&mut s, &l, 1000)[1], 1000);
    // Even a tiny top-p keeps the most likely token.
    let mut s = Sampler::new(cfg(1.0, 0, 1e-6, 0.0, 5)).unwrap();
    assert_eq!(histogram(&mut s, &l, 100)[1], 100);
}

#[test]
fn top_k_and_min_p_restrict_support() {
    let probs = [0.15, 0.5, 0.05, 0.3];
    let l = logits_of(&probs);
    let n = 20_000;
    let mut s = Sampler::new(cfg(1.0, 2, 1.0, 0.0, 6)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!((h[0], h[2]), (0, 0), "{h:?}");
    assert!((h[1] as f64 / n as f64 - 0.625).abs() < 0.015, "{h:?}");
    // min-p 0.2: p >= 0.1 keeps 0.5, 0.3, 0.15.
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.2, 7)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!(h[2], 0, "{h:?}");
    assert!((h[0] as f64 / n as f64 - 0.15 / 0.95).abs() < 0.015, "{h:?}");
    // top-k then top-p: of the top 3 (0.5, 0.3, 0.15, renormalised to
    // 0.526, 0.316, 0.158), top-p 0.8 keeps two.
    let mut s = Sampler::new(cfg(1.0, 3, 0.8, 0.0, 8)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!((h[0], h[2]), (0, 0), "{h:?}");
    // Ties at the top-k boundary go to the lower id.
    let mut s = Sampler::new(cfg(1.0, 2, 1.0, 0.0, 9)).unwrap();
    let h = histogram(&mut s, &[1.0, 0.0, 1.0, 1.0], 2000);
    assert_eq!((h[1], h[3]), (0, 0), "{h:?}");
}

/// The nucleus as llama.cpp computes it, written out plainly: the `f32`
/// softmax of the row (`exp(l - max)` over their `f32` sum in id order), a
/// full sort, the `f32` running sum compared with `top_p` as an `f32`.
fn reference_nucleus(l: &[f32], top_p: f32) -> Vec<bool> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f32> = l.iter().map(|&x| (x - max).exp()).collect();
    let total: f32 = w.iter().sum();
    let mut order: Vec<u32> = (0..l.len() as u32).collect();
    order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
    let mut nucleus = vec![false; l.len()];
    let mut cum = 0f32;
    for &i in &order {
        nucleus[i as usize] = true;
        cum += w[i as usize] / total;
        if cum >= top_p {
            break;
        }
    }
    nucleus
}

#[test]
fn large_vocabulary_nucleus_matches_a_full_sort() {
    // A flat distribution over 262144 tokens, so that the nucleus is far
    // wider than the first partial selection.
    let l = random_logits(262_144, 11).iter().map(|x| x * 0.3).collect::<Vec<_>>();
    for top_p in [0.5f32, 0.95] {
        let nucleus = reference_nucleus(&l, top_p);
        let size = nucleus.iter().filter(|&&b| b).count();
        assert!(size > 1000, "nucleus of {size}");
        let mut s = Sampler::new(cfg(1.0, 0, top_p, 0.0, 12)).unwrap();
        for _ in 0..100 {
            let id = s.sample(&l).unwrap() as usize;
            assert!(nucleus[id], "token {id} outside the nucleus of {size} (top_p {top_p})");
        }
    }
}

#[test]
fn top_p_boundary_is_llama_cpp_comparison() {
    // Exactly representable sums.
    assert_eq!(nucleus_len(&[0.5, 0.25, 0.125, 0.125], 0.75), 2);
    assert_eq!(nucleus_len(&[0.5, 0.25, 0.125, 0.125], 0.5), 1);
    assert_eq!(nucleus_len(&[0.5, 0.25, 0.125, 0.125], 0.625), 2);
    assert_eq!(nucleus_len(&[0.5, 0.25, 0.125, 0.125], 0.875), 3);
    // 0.5f32 + 0.3f32 rounds to 0.8f32 exactly: the nucleus of issue 14.
    assert_eq!(nucleus_len(&[0.5, 0.3, 0.1, 0.1], 0.8), 2);
    // Five times 0.2f32: the f32 running sum 0.4 + 0.2 rounds up to
    // 0.6f32, so three tokens reach 0.6 (their exact sum, 0.6000000089,
    // is below 0.6f32 = 0.6000000238: a comparison in f64 keeps four).
    let fifth = [0.2f32; 5];
    assert_eq!([0.2f32, 0.4, 0.6, 0.8].map(|p| nucleus_len(&fifth, p)), [1, 2, 3, 4]);
    let tenth = [0.1f32; 10];
    assert_eq!(
        [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9].map(|p| nucleus_len(&tenth, p)),
        [1, 2, 3, 4, 5, 6, 7, 8, 9]
    );
    // A sum that never reaches top_p keeps everything.
    assert_eq!(nucleus_len(&[0.3, 0.3, 0.3], 0.95), 3);

    // The same boundaries through the sampler: n equal logits have the
    // f32 probability 1/n each; ties go to the lower ids, so the draws are
    // exactly ids 0..nucleus_len.
    for (n, top_ps) in [(4usize, vec![0.25f32, 0.5, 0.75]), (5, vec![0.2, 0.4, 0.6, 0.8]), (10, vec![0.3, 0.6, 0.9])] {
        let probs = vec![1.0 / n as f32; n];
        for top_p in top_ps {
            let want = nucleus_len(&probs, top_p);
            for top_k in [0, n - 1] {
                let mut s = Sampler::new(cfg(1.0, top_k, top_p, 0.0, 21)).unwrap();
                let h = histogram(&mut s, &vec![0.0; n], 4000);
                let drawn = h.iter().take_while(|&&c| c > 0).count();
                let want = want.min(if top_k > 0 { top_k } else { n });
                assert_eq!(drawn, want, "n {n}, top_p {top_p}, top_k {top_k}: {h:?}");
                assert!(h[drawn..].iter().all(|&c| c == 0), "n {n}, top_p {top_p}: {h:?}");
            }
        }
    }
    // Issue 14's case, [0.3, 0.1, 0.1, 0.5] as the f32 logits ln(p), at
    // temperature 1 and top_p 0.8: the f32 softmax gives 0.5 and 0.3 a sum
    // just below 0.8f32, so llama.cpp's top-p keeps a third token, one of
    // the 0.1s (checked with llama.cpp's own `llama_sampler_top_p`, which
    // keeps 3 of these 4 logits); the other 0.1 is never drawn.
    let l = logits_of(&[0.3, 0.1, 0.1, 0.5]);
    let mut s = Sampler::new(cfg(1.0, 0, 0.8, 0.0, 22)).unwrap();
    let h = histogram(&mut s, &l, 20_000);
    assert_eq!(h[2], 0, "{h:?}");
    assert!((h[1] as f64 / 20_000.0 - 0.1 / 0.9).abs() < 0.01, "{h:?}");
    // With top_p 0.79 the two most likely tokens are enough.
    let mut s = Sampler::new(cfg(1.0, 0, 0.79, 0.0, 23)).unwrap();
    let h = histogram(&mut s, &l, 20_000);
    assert_eq!((h[1], h[2]), (0, 0), "{h:?}");
}

#[test]
fn filters_act_before_the_temperature() {
    // llama.cpp's order: top-p and min-p see the temperature-1
    // distribution; a high temperature then flattens what they kept.
    let probs = [0.5, 0.3, 0.15, 0.05];
    let l = logits_of(&probs);
    let n = 20_000;
    let mut s = Sampler::new(cfg(5.0, 0, 0.8, 0.0, 31)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!((h[2], h[3]), (0, 0), "top-p at T=1 keeps two tokens: {h:?}");
    let want = 0.5f64.powf(0.2) / (0.5f64.powf(0.2) + 0.3f64.powf(0.2));
    assert!((h[0] as f64 / n as f64 - want).abs() < 0.015, "{h:?} vs {want}");
    let mut s = Sampler::new(cfg(10.0, 0, 1.0, 0.2, 32)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!(h[3], 0, "min-p 0.2 at T=1 drops 0.05: {h:?}");
    assert!(h[2] > 0, "{h:?}");
    let mut s = Sampler::new(cfg(10.0, 3, 0.95, 0.2, 33)).unwrap();
    let h = histogram(&mut s, &l, n);
    assert_eq!(h[3], 0, "{h:?}");
}

#[test]
fn presence_and_frequency_penalties() {
    let greedy = |presence_penalty, frequency_penalty, repetition_penalty| SamplerConfig {
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        ..SamplerConfig::greedy()
    };
    // Presence: subtracted once per token present in the window.
    let mut s = Sampler::new(greedy(0.6, 0.0, 1.0)).unwrap();
    for _ in 0..3 {
        s.accept(0);
    }
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 1, "2.0 - 0.6 < 1.5");
    let mut s = Sampler::new(greedy(0.4, 0.0, 1.0)).unwrap();
    s.accept(0);
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 0, "2.0 - 0.4 > 1.5");
    // Frequency: once per occurrence.
    let mut s = Sampler::new(greedy(0.0, 0.2, 1.0)).unwrap();
    s.accept(0);
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 0, "2.0 - 2 x 0.2 > 1.5");
    let mut s = Sampler::new(greedy(0.0, 0.2, 1.0)).unwrap();
    for _ in 0..3 {
        s.accept(0);
    }
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 1, "2.0 - 3 x 0.2 < 1.5");
    // Repetition first, then frequency and presence: 3.0 / 2 - 0.1 - 0.3.
    let mut s = Sampler::new(greedy(0.3, 0.1, 2.0)).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 1.05]).unwrap(), 0, "1.1 > 1.05");
    let mut s = Sampler::new(greedy(0.3, 0.1, 2.0)).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 1.15]).unwrap(), 1, "1.1 < 1.15");
    // A window of 0 turns the penalties off.
    let mut s = Sampler::new(SamplerConfig { repeat_last_n: 0, ..greedy(5.0, 5.0, 5.0) }).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 0);
}

#[test]
fn chain_and_settings_are_described() {
    let d = SamplerConfig::default();
    assert_eq!(d.chain(), "top-k -> top-p -> min-p -> temperature -> dist");
    assert_eq!(SamplerConfig { repetition_penalty: 1.1, ..d.clone() }.chain().split(" -> ").next(), Some("penalties"));
    assert_eq!(SamplerConfig { presence_penalty: 0.5, temperature: 0.0, ..d.clone() }.chain(), "penalties -> greedy");
    assert_eq!(SamplerConfig::with_temperature(1.0, 0).chain(), "temperature -> dist");
    let line = SamplerConfig { seed: 1234, ..d }.to_string();
    for key in [
        "repeat_last_n = 64",
        "repeat_penalty = 1.000",
        "top_k = 40",
        "top_p = 0.950",
        "min_p = 0.050",
        "temp = 0.800",
        "seed = 1234",
    ] {
        assert!(line.contains(key), "{line} lacks {key}");
    }
}

#[test]
fn large_vocabulary_top_k_speed() {
    let l = random_logits(262_144, 13);
    let mut s = Sampler::new(SamplerConfig { seed: 1, ..SamplerConfig::default() }).unwrap();
    let mut best = std::time::Duration::MAX;
    let mut top = l.clone();
    top.sort_by(|a, b| b.total_cmp(a));
    let kth = top[39];
    for _ in 0..20 {
        let t0 = Instant::now();
        let id = s.sample(&l).unwrap();
        best = best.min(t0.elapsed());
        assert!(l[id as usize] >= kth, "outside the top 40");
    }
    println!("sampling 262144 logits with top-k 40: {best:?} (best of 20)");
}

#[test]
fn masked_and_infinite_logits() {
    let inf = f32::INFINITY;
    let ninf = f32::NEG_INFINITY;
    for c in [SamplerConfig::with_temperature(1.0, 1), cfg(1.0, 2, 0.9, 0.05, 1), cfg(1.0, 0, 0.5, 0.0, 1)] {
        let mut s = Sampler::new(c).unwrap();
        let h = histogram(&mut s, &[ninf, 0.0, ninf, 0.0], 2000);
        assert_eq!((h[0], h[2]), (0, 0));
        assert_eq!(s.sample(&[0.0, inf, 5.0, inf]).unwrap(), 1);
        assert_eq!(s.sample(&[ninf, ninf]), Err(SamplingError::AllMasked));
    }
}

#[test]
fn bad_logits_are_errors() {
    for c in [SamplerConfig::greedy(), SamplerConfig::default()] {
        let mut s = Sampler::new(c).unwrap();
        assert_eq!(s.sample(&[]), Err(SamplingError::Empty));
        assert_eq!(s.sample(&[1.0, f32::NAN, 2.0]), Err(SamplingError::NaN { index: 1 }));
        assert_eq!(s.sample(&[f32::NAN; 3]), Err(SamplingError::NaN { index: 0 }));
        // The sampler stays usable.
        assert_eq!(Sampler::greedy().sample(&[1.0, 2.0]).unwrap(), 1);
    }
}

#[test]
fn invalid_settings_are_rejected() {
    let base = SamplerConfig::default;
    let bad = [
        SamplerConfig { temperature: -0.1, ..base() },
        SamplerConfig { temperature: f32::NAN, ..base() },
        SamplerConfig { temperature: f32::INFINITY, ..base() },
        SamplerConfig { top_p: 0.0, ..base() },
        SamplerConfig { top_p: 1.5, ..base() },
        SamplerConfig { min_p: -0.5, ..base() },
        SamplerConfig { min_p: f32::NAN, ..base() },
        SamplerConfig { repetition_penalty: 0.0, ..base() },
        SamplerConfig { repetition_penalty: f32::NAN, ..base() },
        SamplerConfig { presence_penalty: f32::NAN, ..base() },
        SamplerConfig { frequency_penalty: f32::INFINITY, ..base() },
    ];
    for c in bad {
        assert!(matches!(Sampler::new(c.clone()), Err(SamplingError::InvalidConfig(_))), "{c:?}");
    }
    assert!(Sampler::new(base()).is_ok());
}

#[test]
fn repetition_penalty() {
    let c = SamplerConfig { repetition_penalty: 2.0, repeat_last_n: 2, ..SamplerConfig::greedy() };
    let mut s = Sampler::new(c).unwrap();
    // Positive logits are divided: 2.0 -> 1.0 < 1.9.
    s.accept(0);
    assert_eq!(s.sample(&[2.0, 1.9, 0.0]).unwrap(), 1);
    // Negative logits are multiplied: -1.0 -> -2.0 < -1.5.
    s.reset_history();
    s.accept(0);
    assert_eq!(s.sample(&[-1.0, -1.5]).unwrap(), 1);
    // Sampled tokens are recorded too; the window holds the last two.
    assert_eq!(s.history().collect::<Vec<_>>(), vec![0, 1]);
    s.accept(7);
    assert_eq!(s.history().collect::<Vec<_>>(), vec![1, 7]);
    assert_eq!(s.sample(&[2.0, 3.0, 1.0]).unwrap(), 0, "3.0 / 2 < 2.0");
    // Ids outside the logits are ignored.
    s.reset_history();
    s.accept(1_000_000);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 0);
    // Input logits are left untouched.
    let l = vec![2.0, 1.9];
    s.accept(0);
    s.sample(&l).unwrap();
    assert_eq!(l, vec![2.0, 1.9]);
}

/// Issue 31 item 6: with `top_k` at or past the vocabulary, llama.cpp's
/// top-k keeps every token but sorts them, so top-p sums the probabilities
/// most likely first. 100 000 tiny tokens before two large ones: in id
/// order their `f32` sum counts (2·10⁻⁴), most likely first it is lost in
/// the rounding of 1.25, and the nucleus at 0.7999 is the first token alone
/// (probability 0.8 exactly in `f32`) rather than two tokens.
#[test]
fn top_p_after_a_top_k_of_the_whole_vocabulary_sums_in_sorted_order() {
    let tiny = 100_000;
    let mut l = vec![-20.0f32; tiny];
    l.push(0.0);
    l.push(0.25f32.ln());
    let (first, second) = (tiny as u32, tiny as u32 + 1);
    for top_k in [l.len(), l.len() + 10, 1_000_000] {
        let mut s = Sampler::new(cfg(1.0, top_k, 0.7999, 0.0, 9)).unwrap();
        let h = histogram(&mut s, &l, 200);
        assert_eq!(h[first as usize], 200, "top_k {top_k}: the nucleus is the first token alone");
        assert_eq!(h[second as usize], 0, "top_k {top_k}");
    }
    // The same nucleus as a top-k just below the vocabulary (sorted too).
    let mut s = Sampler::new(cfg(1.0, l.len() - 1, 0.7999, 0.0, 9)).unwrap();
    assert_eq!(histogram(&mut s, &l, 200)[first as usize], 200);
    // Without top-k, llama.cpp's top-p sums in id order: both tokens.
    let mut s = Sampler::new(cfg(1.0, 0, 0.7999, 0.0, 9)).unwrap();
    let h = histogram(&mut s, &l, 2000);
    assert!(h[second as usize] > 0 && h[first as usize] + h[second as usize] == 2000, "{:?}", &h[tiny..]);
}

/// A GGUF holding only the metadata `kv`.
fn gguf_with(kv: Vec<(&str, infer_model::gguf::Value)>) -> infer_model::gguf::GgufFile {
    let mut w = infer_model::gguf::GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    for (k, v) in kv {
        w.add_metadata(k, v).unwrap();
    }
    infer_model::gguf::GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn sampling_defaults_read_the_general_sampling_keys_as_llama_cpp() {
    use infer_model::gguf::Value;
    use infer_model::sampling::SamplingDefaults;
    // No keys: nothing.
    assert!(SamplingDefaults::from_gguf(&gguf_with(vec![])).is_empty());
    // Any numeric type, or a string holding a number (llama.cpp reads every
    // value through its text); integer keys cut a fraction as strtol does.
    let d = SamplingDefaults::from_gguf(&gguf_with(vec![
        ("general.sampling.temp", Value::F64(0.25)),
        ("general.sampling.top_k", Value::F32(20.9)),
        ("general.sampling.top_p", Value::String(" 0.9".into())),
        ("general.sampling.min_p", Value::U8(0)),
        ("general.sampling.penalty_repeat", Value::F32(1.5)),
        ("general.sampling.penalty_last_n", Value::I64(-1)),
        ("general.sampling.mirostat", Value::I32(2)),
    ]));
    let want = SamplingDefaults {
        temperature: Some(0.25),
        top_k: Some(20),
        top_p: Some(0.9),
        min_p: Some(0.0),
        repetition_penalty: Some(1.5),
        repeat_last_n: Some(-1),
    };
    assert_eq!(d, want);
    assert_eq!(
        d.to_string(),
        "temp = 0.25, top_k = 20, top_p = 0.9, min_p = 0, repeat_penalty = 1.5, repeat_last_n = -1"
    );
    // Values that are not numbers are ignored.
    let d = SamplingDefaults::from_gguf(&gguf_with(vec![
        ("general.sampling.temp", Value::String("warm".into())),
        ("general.sampling.top_k", Value::Bool(true)),
        ("general.sampling.top_p", Value::F32(f32::NAN)),
    ]));
    assert!(d.is_empty(), "{d:?}");
    assert_eq!(d.to_string(), "none");
}

#[test]
fn sampling_defaults_fill_in_and_apply_with_llama_cpp_readings() {
    use infer_model::sampling::SamplingDefaults;
    let file = SamplingDefaults { temperature: Some(0.2), top_p: Some(0.9), ..SamplingDefaults::NONE };
    let given = SamplingDefaults { temperature: Some(0.7), ..SamplingDefaults::NONE };
    let both = given.or(file);
    assert_eq!((both.temperature, both.top_p, both.top_k), (Some(0.7), Some(0.9), None));
    // Unset settings keep the base.
    let base = SamplerConfig { seed: 5, presence_penalty: 0.5, ..SamplerConfig::default() };
    assert_eq!(SamplingDefaults::NONE.apply(base.clone(), 4096).unwrap(), base);
    let c = both.apply(base.clone(), 4096).unwrap();
    assert_eq!((c.temperature, c.top_p, c.top_k, c.min_p, c.seed), (0.7, 0.9, 40, 0.05, 5));
    // Negative temperature: greedy; negative top-k, min-p: off; window -1:
    // the context, and never past it.
    let neg = SamplingDefaults {
        temperature: Some(-1.0),
        top_k: Some(-5),
        min_p: Some(-0.5),
        repeat_last_n: Some(-1),
        ..SamplingDefaults::NONE
    };
    let c = neg.apply(base.clone(), 300).unwrap();
    assert_eq!((c.temperature, c.top_k, c.min_p, c.repeat_last_n), (0.0, 0, 0.0, 300));
    let long = SamplingDefaults { repeat_last_n: Some(1 << 40), ..SamplingDefaults::NONE };
    assert_eq!(long.apply(base.clone(), 300).unwrap().repeat_last_n, 300);
    // Out of range: the sampler's errors.
    for bad in [
        SamplingDefaults { repeat_last_n: Some(-2), ..SamplingDefaults::NONE },
        SamplingDefaults { top_p: Some(0.0), ..SamplingDefaults::NONE },
        SamplingDefaults { repetition_penalty: Some(0.0), ..SamplingDefaults::NONE },
    ] {
        assert!(matches!(bad.apply(base.clone(), 300), Err(SamplingError::InvalidConfig(_))), "{bad:?}");
    }
}
