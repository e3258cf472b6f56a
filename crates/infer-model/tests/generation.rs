//! The generation loop on the real SmolLM2 135M Instruct (fetched and cached
//! by name on first use): it stops at `<|im_end|>`, and a continued
//! conversation prefills only its new tokens.

use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::{ComputeBackend, DeviceModel};
use infer_model::chat::{ChatTemplate, Message};
use infer_model::generate::{generate, generate_cached, CachedContext, StopReason};
use infer_model::gguf::GgufFile;
use infer_model::sampling::Sampler;
use infer_model::tokenizer::Tokenizer;

struct Smol {
    model: Box<dyn DeviceModel>,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

fn smollm2() -> Smol {
    let path = infer_model::fetch::ensure_model("smollm2-135m").unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    let gguf = GgufFile::open(&path).expect("open");
    let spec = infer_model::model::load_spec(&gguf).expect("spec");
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let cpu = CpuBackend::with_options(threads, Kernels::detect(), Precision::Quantized).expect("CPU backend");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer).expect("chat template");
    Smol { model: cpu.prepare(&spec).expect("prepare"), tokenizer, template }
}

const QUESTION: &str = "What is the capital of France? Answer in one word.";

#[test]
fn generation_stops_at_im_end() {
    let mut s = smollm2();
    let im_end = s.tokenizer.token_id("<|im_end|>").expect("<|im_end|> in the vocabulary");
    assert!(s.tokenizer.is_eog(im_end), "<|im_end|> is not an end-of-generation token");
    let ids = s.template.encode(&s.tokenizer, &[Message::user(QUESTION)], true).unwrap();
    let mut text = String::new();
    let mut sampler = Sampler::greedy();
    let stats = generate(s.model.as_mut(), &s.tokenizer, &ids, 64, 256, &mut sampler, |t| {
        text.push_str(t);
        true
    })
    .unwrap();
    println!("reply ({} tokens, stop {:?}): {text:?}", stats.generated_tokens, stats.stop);
    assert_eq!(stats.stop, StopReason::EndOfGeneration, "{text:?}");
    assert!(stats.generated_tokens < 64);
    assert!(text.contains("Paris"), "{text:?}");
    assert!(!text.contains("<|im_end|>") && !text.contains("<|im_start|>"), "{text:?}");
}

#[test]
fn a_continued_conversation_prefills_only_the_new_turn() {
    let mut s = smollm2();
    let mut ctx = CachedContext::new(s.model.as_ref(), 512).unwrap();
    let mut messages = vec![Message::user(QUESTION)];
    let turn1 = s.template.encode(&s.tokenizer, &messages, true).unwrap();
    let mut reply = String::new();
    let mut sampler = Sampler::greedy();
    let st1 = generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &turn1, 64, &mut sampler, |t| {
        reply.push_str(t);
        true
    })
    .unwrap();
    assert_eq!((st1.reused_tokens, st1.prompt_tokens), (0, turn1.len()));
    assert_eq!(st1.stop, StopReason::EndOfGeneration);
    // The cache holds the prompt and every generated token but the final
    // `<|im_end|>` (sampled, never fed).
    assert_eq!(ctx.tokens().len(), turn1.len() + st1.generated_tokens);
    assert_eq!(&ctx.tokens()[..turn1.len()], &turn1[..]);

    messages.push(Message::assistant(reply.trim()));
    messages.push(Message::user("And of Germany?"));
    let turn2 = s.template.encode(&s.tokenizer, &messages, true).unwrap();
    let common = ctx.tokens().iter().zip(&turn2).take_while(|(a, b)| a == b).count();
    let mut reply2 = String::new();
    let st2 = generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &turn2, 64, &mut Sampler::greedy(), |t| {
        reply2.push_str(t);
        true
    })
    .unwrap();
    println!(
        "turn 1: {} prompt tokens, reply {reply:?}; turn 2: {} reused, {} prefilled of {}, reply {reply2:?}",
        st1.prompt_tokens,
        st2.reused_tokens,
        st2.prompt_tokens,
        turn2.len()
    );
    assert_eq!(st2.reused_tokens, common);
    assert!(common > turn1.len(), "the first turn's prompt and reply were not reused ({common} tokens)");
    assert_eq!(st2.prompt_tokens, turn2.len() - common);
    assert_eq!(st2.stop, StopReason::EndOfGeneration);

    // The same conversation from an empty cache gives the same reply.
    let mut fresh = String::new();
    generate(s.model.as_mut(), &s.tokenizer, &turn2, 64, 512, &mut Sampler::greedy(), |t| {
        fresh.push_str(t);
        true
    })
    .unwrap();
    assert_eq!(reply2, fresh);

    // After a reset nothing is reused.
    ctx.reset();
    let st3 =
        generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &turn2, 1, &mut Sampler::greedy(), |_| true).unwrap();
    assert_eq!((st3.reused_tokens, st3.prompt_tokens), (0, turn2.len()));
    // A sequence the cache already holds entirely still feeds its last
    // token (its logits are needed).
    let held: Vec<u32> = ctx.tokens().to_vec();
    let st4 =
        generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &held, 1, &mut Sampler::greedy(), |_| true).unwrap();
    assert_eq!((st4.reused_tokens, st4.prompt_tokens), (held.len() - 1, 1));
}

/// Chat's cache reuse over quantized caches (K q8_0, V q4_0): the second
/// turn reuses the first turn's positions and replies as the same
/// conversation run from an empty cache of the same types.
#[test]
fn a_continued_conversation_over_a_quantized_cache_replies_as_from_scratch() {
    use infer_compute::{KvCacheType, KvTypes};
    continued_conversation(KvTypes { k: KvCacheType::Q8_0, v: KvCacheType::Q4_0 });
}

/// The same over TurboQuant caches (K tq4, V tq3): rotated, the first 16
/// positions exact and the rest centred on their mean, which the reused
/// positions keep.
#[test]
fn a_continued_conversation_over_a_turboquant_cache_replies_as_from_scratch() {
    use infer_compute::{KvCacheType, KvTypes};
    continued_conversation(KvTypes { k: KvCacheType::Tq4, v: KvCacheType::Tq3 });
}

fn continued_conversation(types: infer_compute::KvTypes) {
    let mut s = smollm2();
    let mut ctx = CachedContext::with_types(s.model.as_ref(), 512, types).unwrap();
    let mut messages = vec![Message::user(QUESTION)];
    let turn1 = s.template.encode(&s.tokenizer, &messages, true).unwrap();
    let mut reply = String::new();
    generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &turn1, 32, &mut Sampler::greedy(), |t| {
        reply.push_str(t);
        true
    })
    .unwrap();
    assert!(reply.contains("Paris"), "{types}: {reply:?}");
    messages.push(Message::assistant(reply.trim()));
    messages.push(Message::user("And of Germany?"));
    let turn2 = s.template.encode(&s.tokenizer, &messages, true).unwrap();
    let mut reply2 = String::new();
    let st2 = generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &turn2, 32, &mut Sampler::greedy(), |t| {
        reply2.push_str(t);
        true
    })
    .unwrap();
    assert!(st2.reused_tokens > turn1.len(), "{} reused", st2.reused_tokens);
    let mut fresh_ctx = CachedContext::with_types(s.model.as_ref(), 512, types).unwrap();
    let mut fresh = String::new();
    generate_cached(s.model.as_mut(), &mut fresh_ctx, &s.tokenizer, &turn2, 32, &mut Sampler::greedy(), |t| {
        fresh.push_str(t);
        true
    })
    .unwrap();
    assert_eq!(reply2, fresh, "{types}");
}

/// Three sequences driven together, one `forward` per step over a pool of
/// three slots (prompts prefilled in one batch, then one token of each per
/// step), give the texts each gives alone through `generate`.
#[test]
fn sequences_stepped_together_through_one_pool_generate_as_alone() {
    use infer_compute::{Batch, Out};
    use infer_model::sequence::Sequence;
    let mut s = smollm2();
    let questions = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"];
    let prompts: Vec<Vec<u32>> =
        questions.iter().map(|q| s.template.encode(&s.tokenizer, &[Message::user(*q)], true).unwrap()).collect();
    let alone: Vec<String> = prompts
        .iter()
        .map(|ids| {
            let mut text = String::new();
            generate(s.model.as_mut(), &s.tokenizer, ids, 16, 128, &mut Sampler::greedy(), |t| {
                text.push_str(t);
                true
            })
            .unwrap();
            text
        })
        .collect();
    let mut seqs: Vec<Sequence> =
        prompts.iter().map(|ids| Sequence::new(&s.tokenizer, ids, 0, Sampler::greedy(), 16, 128).unwrap()).collect();
    let mut texts = vec![String::new(); seqs.len()];
    let mut pool = s.model.new_kv_pool(seqs.len(), 128).unwrap();
    let nv = s.model.n_vocab();
    let mut batch = Batch::new();
    let mut steps = 0;
    while seqs.iter().any(|q| q.stop().is_none()) {
        batch.clear();
        let live: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].stop().is_none()).collect();
        for &i in &live {
            let input = seqs[i].next_input(usize::MAX);
            batch.push_seq(i, seqs[i].position(), input, Out::Last);
        }
        let n: Vec<usize> = live.iter().map(|&i| seqs[i].next_input(usize::MAX).len()).collect();
        let logits = s.model.forward(pool.as_mut(), &batch).unwrap();
        for (r, &i) in live.iter().enumerate() {
            seqs[i].advance(n[r]);
            let e = seqs[i].on_logits(&logits[r * nv..(r + 1) * nv]).unwrap();
            texts[i].push_str(&e.text);
        }
        steps += 1;
        assert!(steps <= 17, "more steps than the prompt and 16 tokens");
    }
    for (i, seq) in seqs.iter_mut().enumerate() {
        texts[i].push_str(&seq.finish_text());
        assert_eq!(texts[i], alone[i], "sequence {i}: together {:?}, alone {:?}", texts[i], alone[i]);
    }
}

/// The positions llama.cpp's context shift leaves after `generated` tokens
/// of a `prompt`-token prompt: before feeding a token at `n_past` with
/// `n_past + 1 >= n_ctx`, `(n_past - n_keep) / 2` tokens after the first
/// `n_keep` go. The last sampled token is not fed.
fn llama_cpp_positions(prompt: usize, generated: usize, n_ctx: usize, n_keep: usize) -> (usize, usize) {
    let (mut n_past, mut shifts) = (prompt, 0);
    for _ in 1..generated {
        if n_past + 1 >= n_ctx {
            n_past -= (n_past - n_keep) / 2;
            shifts += 1;
        }
        n_past += 1;
    }
    (n_past, shifts)
}

#[test]
fn a_full_context_shifts_keeping_the_first_tokens_as_llama_cpp_counts() {
    let mut s = smollm2();
    let ids = s.tokenizer.encode("Counting: 1, 2, 3, 4, 5, 6, 7,", true);
    let (n_ctx, n_keep, max) = (40, 4, 70);
    assert!(ids.len() + 4 < n_ctx && ids.len() > n_keep, "prompt of {} tokens", ids.len());
    let mut ctx = CachedContext::new(s.model.as_ref(), n_ctx).unwrap();
    ctx.set_context_shift(Some(n_keep));
    let mut text = String::new();
    let mut sampler = Sampler::greedy();
    let stats = generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &ids, max, &mut sampler, |t| {
        text.push_str(t);
        true
    })
    .unwrap();
    println!("{text}");
    assert_eq!(stats.stop, StopReason::MaxTokens, "{text}");
    assert_eq!(stats.generated_tokens, max);
    let (positions, shifts) = llama_cpp_positions(ids.len(), max, n_ctx, n_keep);
    assert_eq!(stats.context_shifts, shifts);
    assert!(shifts >= 2, "{shifts} shifts");
    assert_eq!(ctx.tokens().len(), positions, "positions in the cache after the shifts");
    assert_eq!(&ctx.tokens()[..n_keep], &ids[..n_keep], "the kept start");
    // The text goes on counting across the shifts.
    assert!(text.contains("20"), "{text}");

    // Without shift, the same generation ends at the full context.
    let mut ctx = CachedContext::new(s.model.as_ref(), n_ctx).unwrap();
    let stats =
        generate_cached(s.model.as_mut(), &mut ctx, &s.tokenizer, &ids, max, &mut Sampler::greedy(), |_| true).unwrap();
    assert_eq!(stats.stop, StopReason::ContextFull);
    assert_eq!(stats.context_shifts, 0);
}
