//! The engine without HTTP: admission, chunked prefill, slot freeing, and
//! the same greedy text alone and in a batch.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Instant;

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::ComputeBackend;
use infer_model::gguf::GgufFile;
use infer_model::sampling::SamplerConfig;
use infer_model::synth::{self, SynthArch, SynthOptions, SynthQuant, SynthShape, SynthVocab};
use infer_model::tokenizer::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;

/// A tiny synthetic Llama, prepared on the CPU, and its tokenizer.
fn tiny() -> (Box<dyn DeviceModel>, Tokenizer) {
    let backend = CpuBackend::with_options(1, Kernels::detect(), Precision::Quantized).unwrap();
    tiny_on(&backend)
}

/// The tiny synthetic Llama prepared on `backend`, and its tokenizer.
fn tiny_on(backend: &dyn ComputeBackend) -> (Box<dyn DeviceModel>, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let shape = SynthShape::preset(SynthArch::Llama, "tiny").unwrap();
    let opts = SynthOptions { shape, quant: SynthQuant::Q8_0, seed: 5, threads: 1, dequantized: false };
    synth::write_synthetic(&path, &opts, SynthVocab::Generated, Arc::new(|_| {})).unwrap();
    let gguf = GgufFile::read(&path).unwrap();
    let spec = infer_model::model::load_spec(&gguf).unwrap();
    (backend.prepare(&spec).unwrap(), Tokenizer::from_gguf(&gguf).unwrap())
}

/// An engine of `n_slots` slots of 64 positions and steps of `n_batch`.
fn engine<'t>(model: &dyn DeviceModel, tok: &'t Tokenizer, n_slots: usize, n_batch: usize) -> Engine<'t> {
    let pool = model.new_kv_pool(n_slots, 64).unwrap();
    let model = model.new_context().unwrap();
    Engine::new(model, pool, tok, n_batch, Arc::new(Metrics::default()), Arc::new(AtomicUsize::new(0)))
}

/// A greedy request for `max_tokens` tokens that ignores end-of-generation.
fn request(prompt: &[u32], max_tokens: usize) -> (GenRequest, UnboundedReceiver<Event>) {
    let (tx, rx) = unbounded_channel();
    let params = GenParams {
        sampler: SamplerConfig { temperature: 0.0, ..SamplerConfig::default() },
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        logprobs: None,
    };
    (GenRequest { prompt: prompt.to_vec(), params, events: tx, arrived: Instant::now() }, rx)
}

/// Queues `req` as [`EngineHandle::submit`] would (counted in `queued`).
fn submit(e: &mut Engine<'_>, req: GenRequest) {
    e.queued.fetch_add(1, Ordering::SeqCst);
    e.enqueue(req);
}

/// Everything `rx` holds: the text and the last event.
fn drain(rx: &mut UnboundedReceiver<Event>) -> (String, Option<Event>) {
    let (mut text, mut last) = (String::new(), None);
    while let Ok(ev) = rx.try_recv() {
        if let Event::Delta { text: t, .. } = &ev {
            text.push_str(t);
        }
        last = Some(ev);
    }
    (text, last)
}

fn run_to_end(e: &mut Engine<'_>) {
    for _ in 0..10_000 {
        if e.is_idle() {
            return;
        }
        e.step();
    }
    panic!("the engine did not finish");
}

#[test]
fn admission_fills_free_slots_in_order_and_the_rest_waits() {
    let (model, tok) = tiny();
    let mut e = engine(model.as_ref(), &tok, 2, 64);
    let mut rxs = Vec::new();
    for p in [[1u32, 2, 3], [4, 5, 6], [7, 8, 9]] {
        let (r, rx) = request(&p, 4);
        submit(&mut e, r);
        rxs.push(rx);
    }
    assert!(e.step());
    assert_eq!((e.n_active(), e.n_waiting()), (2, 1));
    assert_eq!(e.queued.load(Ordering::SeqCst), 1);
    // Both prompts ran whole in one batch.
    assert_eq!(e.last_batch().len(), 6);
    run_to_end(&mut e);
    for rx in &mut rxs {
        let (_, last) = drain(rx);
        match last {
            Some(Event::Done { finish, usage }) => {
                assert_eq!(finish, FinishReason::Length);
                assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 4));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(e.queued.load(Ordering::SeqCst), 0);
    assert_eq!(e.slots().n_busy(), 0);
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_beside_decoding_sequences() {
    let (model, tok) = tiny();
    let mut e = engine(model.as_ref(), &tok, 2, 8);
    let (a, mut rx_a) = request(&[1, 2, 3], 12);
    submit(&mut e, a);
    assert!(e.step());
    let long: Vec<u32> = (10..40).collect();
    let (b, mut rx_b) = request(&long, 2);
    submit(&mut e, b);
    // Each step: a's one decode token, then at most 7 of b's prompt.
    let mut chunks = Vec::new();
    loop {
        assert!(e.step());
        let batch = e.last_batch();
        assert!(batch.len() <= 8, "{}", batch.len());
        assert_eq!(batch.slots()[0], 0, "the decoding sequence comes first");
        chunks.push(batch.len() - 1);
        assert!(batch.n_outputs() >= 1);
        if !e.active.iter().any(|s| s.seq.in_prompt()) {
            break;
        }
    }
    assert_eq!(chunks.iter().sum::<usize>(), 30, "{chunks:?}");
    assert!(chunks.len() >= 5, "{chunks:?}");
    run_to_end(&mut e);
    assert!(matches!(drain(&mut rx_a).1, Some(Event::Done { .. })));
    assert!(matches!(drain(&mut rx_b).1, Some(Event::Done { .. })));
}

#[test]
fn a_dropped_receiver_frees_its_slot_at_the_next_step() {
    let (model, tok) = tiny();
    let mut e = engine(model.as_ref(), &tok, 1, 64);
    let (a, rx_a) = request(&[1, 2, 3], 1000);
    let (b, mut rx_b) = request(&[4, 5], 2);
    submit(&mut e, a);
    submit(&mut e, b);
    e.step();
    e.step();
    assert_eq!((e.n_active(), e.n_waiting()), (1, 1));
    drop(rx_a);
    e.step();
    // a is gone; b took its slot in the same step.
    assert_eq!((e.n_active(), e.n_waiting()), (1, 0));
    assert_eq!(e.metrics.cancelled.load(Ordering::SeqCst), 1);
    run_to_end(&mut e);
    assert!(matches!(drain(&mut rx_b).1, Some(Event::Done { .. })));
    assert_eq!(e.slots().n_busy(), 0);
}

#[test]
fn greedy_text_is_the_same_alone_and_batched_and_the_cache_is_reused() {
    let (model, tok) = tiny();
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[1, 2, 3, 9], &[6, 2, 3, 4, 5]];
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let mut e = engine(model.as_ref(), &tok, 1, 64);
            let (r, mut rx) = request(p, 6);
            submit(&mut e, r);
            run_to_end(&mut e);
            drain(&mut rx).0
        })
        .collect();
    assert!(alone.iter().all(|t| !t.is_empty()), "{alone:?}");
    // Together, on two slots, after the first prompt warmed slot 0's cache.
    let mut e = engine(model.as_ref(), &tok, 2, 64);
    let (r, mut rx) = request(prompts[0], 6);
    submit(&mut e, r);
    run_to_end(&mut e);
    assert_eq!(drain(&mut rx).0, alone[0]);
    let mut rxs = Vec::new();
    for p in prompts {
        let (r, rx) = request(p, 6);
        submit(&mut e, r);
        rxs.push(rx);
    }
    run_to_end(&mut e);
    let mut cached = Vec::new();
    for (rx, want) in rxs.iter_mut().zip(&alone) {
        let (text, last) = drain(rx);
        assert_eq!(&text, want);
        let Some(Event::Done { usage, .. }) = last else { panic!("{last:?}") };
        cached.push(usage.cached_tokens);
    }
    // The same prompt reuses all but its last token; the one differing in
    // its first token reuses nothing.
    assert_eq!(cached[0], 4);
    assert_eq!(cached[2], 0);
}

/// Requests of several samplers run together, with the step reading back
/// only each row's candidates (`forward_top_k`) and with whole rows: the
/// same events (texts, log-probabilities to the bit, finish reasons).
/// Without the penalized request every step with rows runs the candidates
/// path; with it, every step reads whole rows.
/// Requests of several samplers (greedy, llama.cpp's defaults, top-p,
/// top-k 1, min-p; end-of-generation ignored or not; log-probabilities),
/// with a penalized one when `penalized`: (sampler, ignore_eos, logprobs).
fn mixed_samplers(penalized: bool) -> Vec<(SamplerConfig, bool, Option<usize>)> {
    let cfg = |temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64| SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
        ..SamplerConfig::default()
    };
    let mut v = vec![
        (cfg(0.0, 40, 1.0, 0.0, 0), true, None),
        (SamplerConfig { seed: 11, ..SamplerConfig::default() }, false, None),
        (cfg(1.0, 5, 0.9, 0.0, 12), false, Some(3)),
        (cfg(0.7, 1, 1.0, 0.0, 13), false, Some(2)),
        (cfg(1.5, 3, 1.0, 0.3, 14), true, None),
        (cfg(1.0, 8, 1.0, 0.0, 15), false, Some(0)),
    ];
    if penalized {
        v.push((SamplerConfig { repetition_penalty: 1.3, seed: 16, ..SamplerConfig::default() }, false, None));
    }
    v
}

/// Runs `requests` together on one engine over `model` (candidates path
/// on or off); returns each request's events and the number of steps that
/// sampled from candidates.
fn run_mixed(
    model: &dyn DeviceModel,
    tok: &Tokenizer,
    requests: Vec<(SamplerConfig, bool, Option<usize>)>,
    top_k: bool,
) -> (Vec<Vec<Event>>, usize) {
    let mut e = engine(model, tok, 8, 64);
    e.set_top_k(top_k);
    let mut rxs = Vec::new();
    for (i, (sampler, ignore_eos, logprobs)) in requests.into_iter().enumerate() {
        let (tx, rx) = unbounded_channel();
        let params = GenParams { sampler, max_tokens: 12, stop: Vec::new(), ignore_eos, logprobs };
        let prompt = [1 + i as u32, 2, 3];
        submit(&mut e, GenRequest { prompt: prompt.to_vec(), params, events: tx, arrived: Instant::now() });
        rxs.push(rx);
    }
    let mut candidate_steps = 0;
    while !e.is_idle() {
        e.top.reset(0, 1);
        e.step();
        candidate_steps += usize::from(e.top.rows() > 0);
    }
    let events = rxs
        .iter_mut()
        .map(|rx| {
            let mut v = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                v.push(ev);
            }
            v
        })
        .collect();
    (events, candidate_steps)
}

#[test]
fn candidate_steps_give_the_events_of_whole_rows() {
    let (model, tok) = tiny();
    for penalized in [false, true] {
        let (with, steps) = run_mixed(model.as_ref(), &tok, mixed_samplers(penalized), true);
        if penalized {
            assert_eq!(steps, 0, "a penalized row needs the whole row");
        } else {
            assert!(steps >= 12, "{steps} steps sampled from candidates");
        }
        let (without, steps) = run_mixed(model.as_ref(), &tok, mixed_samplers(penalized), false);
        assert_eq!(steps, 0);
        for (i, (a, b)) in with.iter().zip(&without).enumerate() {
            assert!(a.len() > 2, "request {i}: {a:?}");
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "request {i}, penalized {penalized}");
        }
    }
}

/// On a CUDA device (skipped without one, unless `INFER_REQUIRE_CUDA=1`):
/// the device top-k path gives the tokens of the whole rows sampled on the
/// host, and log-probabilities within f32 rounding (the device sums the
/// normalizer in f32).
#[test]
fn on_cuda_the_device_top_k_gives_the_tokens_of_whole_rows() {
    let cuda = match infer_compute::backend_by_name("cuda") {
        Ok(b) => b,
        Err(e) if std::env::var("INFER_REQUIRE_CUDA").as_deref() == Ok("1") => panic!("INFER_REQUIRE_CUDA=1: {e}"),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipped (no CUDA backend: {e})");
            return;
        }
    };
    let (model, tok) = tiny_on(cuda.as_ref());
    assert!(model.top_k_on_device());
    let (with, steps) = run_mixed(model.as_ref(), &tok, mixed_samplers(false), true);
    assert!(steps >= 12, "{steps} steps sampled from candidates");
    let (without, _) = run_mixed(model.as_ref(), &tok, mixed_samplers(false), false);
    for (i, (a, b)) in with.iter().zip(&without).enumerate() {
        assert_eq!(a.len(), b.len(), "request {i}: {a:?} / {b:?}");
        for (x, y) in a.iter().zip(b) {
            match (x, y) {
                (Event::Delta { text: t1, logprobs: l1 }, Event::Delta { text: t2, logprobs: l2 }) => {
                    assert_eq!(t1, t2, "request {i}");
                    assert_eq!(l1.len(), l2.len(), "request {i}");
                    for (p, q) in l1.iter().zip(l2) {
                        assert_eq!((&p.token, p.top.len()), (&q.token, q.top.len()), "request {i}");
                        assert!((p.logprob - q.logprob).abs() < 1e-4, "request {i}: {} / {}", p.logprob, q.logprob);
                        for (u, v) in p.top.iter().zip(&q.top) {
                            assert_eq!(u.0, v.0, "request {i}");
                            assert!((u.2 - v.2).abs() < 1e-4, "request {i}: {} / {}", u.2, v.2);
                        }
                    }
                }
                _ => assert_eq!(format!("{x:?}"), format!("{y:?}"), "request {i}"),
            }
        }
    }
}
