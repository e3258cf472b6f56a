//! KV cache element types ([`KvTypes`]): a decode over a cache of each
//! type against the same backend's f16 cache, within the type's bound; a
//! prompt prefilled into a quantized cache against the same tokens decoded
//! one by one; three sequences decoded together in one pool against each
//! alone; a TurboQuant cache past its window of exact rows (queries that
//! read codes) and a copy of its positions to another slot; a cache that
//! does not fit; a head size a type cannot store.
//! A backend may refuse a type it does not store, with
//! [`Error::UnsupportedKvCache`] naming it (the case then skips, saying
//! so); any other refusal fails.
//!
//! Bounds (cosine of the logits against the f16 cache's, every step, on
//! the random models of [`super::model`]): f32 and a q8_0 cache as
//! [`check_logits`] (cosine ≥ 0.999, same top token unless a near-tie);
//! q4_0 and tq4 cosine ≥ 0.99; tq3 ≥ 0.95 (its distortion is about four
//! times 4 bits'; the CPU reaches 0.963 on the Llama model, whose random
//! values are the worst case for it). These bounds catch a wrong code or
//! rotation, not quality: perplexity on real models measures that
//! (BENCHMARKS.md). The Gemma 3 model's sliding window of 5 is far behind at the 40 positions decoded, so its local layers mask quantized
//! positions out.

use super::compare::{check_logits, cosine};
use super::model::{err, prepare, random_model, random_model_heads, tokens, with_uneven_values, Arch};
use super::{Case, Outcome};
use crate::backend::{Batch, ComputeBackend, DeviceModel, KvPool, Out};
use crate::kv_type::{TQ_EXACT_POSITIONS, TQ_WINDOW};
use crate::{Error, KvCacheType, KvTypes};

/// The pool of `types`, or why the backend refuses it: `Ok(Err(skip))` for
/// [`Error::UnsupportedKvCache`] of one of `types`; any other error fails.
fn typed_pool(m: &dyn DeviceModel, n_ctx: usize, types: KvTypes) -> Result<Result<Box<dyn KvPool>, Outcome>, String> {
    match m.new_kv_cache_typed(n_ctx, types) {
        Ok(kv) if kv.types() == types => Ok(Ok(kv)),
        Ok(kv) => Err(format!("asked for a cache of {types}, got {}", kv.types())),
        Err(Error::UnsupportedKvCache { ty, reason }) if ty == types.k || ty == types.v => {
            Ok(Err(Outcome::Skip(format!("{types}: {reason}"))))
        }
        Err(e) => Err(format!("a cache of {types}: {e}")),
    }
}

/// Whether logits `got` (a cache of `ty`) are within `ty`'s bound of
/// `want` (the f16 cache's).
fn within(what: &str, ty: KvCacheType, got: &[f32], want: &[f32]) -> Result<(), String> {
    let min_cos = match ty {
        KvCacheType::Q4_0 | KvCacheType::Tq4 => 0.99,
        KvCacheType::Tq3 => 0.95,
        _ => return check_logits(what, got, want),
    };
    let cos = cosine(got, want);
    if got.iter().any(|v| !v.is_finite()) || cos < min_cos {
        return Err(format!("{what}: cosine {cos:.6} < {min_cos} against the f16 cache"));
    }
    Ok(())
}

/// The coarser of the two types (the one whose bound applies): the one of
/// fewer bits per value.
fn coarser(t: KvTypes) -> KvCacheType {
    let bits = |ty: KvCacheType| ty.bits_per_value(64).unwrap_or(0.0);
    if bits(t.k) <= bits(t.v) {
        t.k
    } else {
        t.v
    }
}

/// 40 tokens decoded over a cache of `types` and over an f16 cache, step
/// by step within the bound; then the same tokens prefilled at once into a
/// cache of `types` against the last decode step of that cache.
fn decode_case(b: &dyn ComputeBackend, arch: Arch, types: KvTypes) -> Result<Outcome, String> {
    let spec = random_model(41, arch);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut kv = match typed_pool(m.as_ref(), 48, types)? {
        Ok(kv) => kv,
        Err(skip) => return Ok(skip),
    };
    let mut base = m.new_kv_cache_typed(48, KvTypes::default()).map_err(err("f16 cache"))?;
    let toks = tokens(42, 40, spec.n_vocab);
    let ty = coarser(types);
    let mut last = Vec::new();
    for (pos, &t) in toks.iter().enumerate() {
        let got = m.decode_token(kv.as_mut(), t, pos).map_err(err("decode_token"))?.to_vec();
        let want = m.decode_token(base.as_mut(), t, pos).map_err(err("decode_token (f16)"))?;
        within(&format!("{types}, pos {pos}"), ty, &got, want)?;
        last = got;
    }
    let mut kv2 = match typed_pool(m.as_ref(), 48, types)? {
        Ok(kv) => kv,
        Err(skip) => return Ok(skip),
    };
    let got = m.prefill(kv2.as_mut(), &toks, 0).map_err(err("prefill"))?.to_vec();
    check_logits(&format!("{types}: prefill of 40 against decode"), &got, &last)?;
    Ok(Outcome::Pass(String::new()))
}

/// Positions of [`long_case`]'s prompt: past the TurboQuant window
/// ([`TQ_WINDOW`]) and exact rows ([`TQ_EXACT_POSITIONS`]), so that its
/// queries read coded rows, and past 256, so that a decode step spans two
/// of the blocks of 256 positions that CUDA's one-token kernel over
/// TurboQuant caches merges.
const LONG_PROMPT: usize = 300;
const _: () = assert!(LONG_PROMPT > TQ_WINDOW + TQ_EXACT_POSITIONS + 16 && LONG_PROMPT > 256 + 16);
/// A longer prompt for one tq4 shape: a decode step then spans three of
/// those blocks, so that their merge takes more than one pair.
const LONGER_PROMPT: usize = 700;
const _: () = assert!(LONGER_PROMPT > 2 * 256 + 16);

/// A prompt long enough that a TurboQuant cache's queries read coded rows
/// (the 40 positions of [`decode_case`] are all within the window of
/// exact rows): prefilled in two chunks into slot 0 of a pool of `types`,
/// then four tokens decoded, each within the type's bound of the f16
/// cache's logits; then slot 0's positions before the last step copied to
/// slot 1 ([`KvPool::copy_prefix`]: codes, exact rows, centre and the
/// ring's entries), where the last step is decoded again and must give
/// the same logits as in slot 0. `heads`: `n_head`, `n_head_kv` and
/// `head_dim` of the model (`n_embd` 256); `n_prompt`: the prompt's
/// length ([`LONG_PROMPT`] or [`LONGER_PROMPT`]); `uneven`: value
/// channels of uneven size ([`with_uneven_values`]), so that a TurboQuant
/// value cache's scale is far from 1.
fn long_case(
    b: &dyn ComputeBackend,
    arch: Arch,
    types: KvTypes,
    heads: (usize, usize, usize),
    n_prompt: usize,
    uneven: bool,
) -> Result<Outcome, String> {
    let (nh, nkv, hd) = heads;
    let spec = random_model_heads(45, arch, 256, nh, nkv, hd);
    let spec = if uneven { with_uneven_values(spec) } else { spec };
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let n_ctx = n_prompt + 8;
    let mut pool = match m.new_kv_pool_typed(2, n_ctx, types) {
        Ok(p) => p,
        Err(Error::UnsupportedKvCache { ty, reason }) if ty == types.k || ty == types.v => {
            return Ok(Outcome::Skip(format!("{types}: {reason}")))
        }
        Err(e) => return Err(format!("a pool of {types}: {e}")),
    };
    let mut base = m.new_kv_cache_typed(n_ctx, KvTypes::default()).map_err(err("f16 cache"))?;
    let toks = tokens(46, n_prompt + 4, spec.n_vocab);
    let (prompt, steps) = toks.split_at(n_prompt);
    let ty = coarser(types);
    let n_vocab = m.n_vocab();
    let mut batch = Batch::new();
    let cut = 100;
    batch.push_seq(0, 0, &prompt[..cut], Out::Last);
    m.forward(pool.as_mut(), &batch).map_err(err("prefill, first chunk"))?;
    batch.clear();
    batch.push_seq(0, cut, &prompt[cut..], Out::Last);
    let got = m.forward(pool.as_mut(), &batch).map_err(err("prefill, second chunk"))?.to_vec();
    let want = m.prefill(base.as_mut(), prompt, 0).map_err(err("prefill (f16)"))?;
    within(&format!("{types}: prompt of {n_prompt}"), ty, &got, want)?;
    let mut last = Vec::new();
    for (i, &t) in steps.iter().enumerate() {
        let pos = n_prompt + i;
        if i + 1 == steps.len() {
            pool.copy_prefix(0, 1, pos).map_err(err("copy_prefix"))?;
        }
        batch.clear();
        batch.push(t, pos, 0, true);
        last = m.forward(pool.as_mut(), &batch).map_err(err("decode"))?[..n_vocab].to_vec();
        let want = m.decode_token(base.as_mut(), t, pos).map_err(err("decode_token (f16)"))?;
        within(&format!("{types}, pos {pos}"), ty, &last, want)?;
    }
    let pos = n_prompt + steps.len() - 1;
    batch.clear();
    batch.push(steps[steps.len() - 1], pos, 1, true);
    let copied = m.forward(pool.as_mut(), &batch).map_err(err("decode after copy_prefix"))?;
    check_logits(&format!("{types}: slot 1 after copy_prefix of {pos}"), copied, &last)?;
    Ok(Outcome::Pass(String::new()))
}

/// Three sequences in one pool of `types`: their prompts (3, 9 and 20
/// tokens) prefilled in one step, then four steps decoding all three at
/// once, against each sequence alone in a one-slot pool of `types`,
/// within [`check_logits`]; with heads of 64 values (GQA), of 128 (one kv
/// head) and of 96 (no Hadamard rotation, no one-launch decode kernel on
/// CUDA): the paths a GPU backend takes for short and long prompt chunks
/// and for decode steps of several sequences, over a quantized cache.
fn batch_case(b: &dyn ComputeBackend, arch: Arch, types: KvTypes) -> Result<Outcome, String> {
    for (spec, heads) in [
        (random_model(41, arch), "4/2 heads of 64"),
        (random_model_heads(48, arch, 256, 2, 1, 128), "2/1 heads of 128"),
        (random_model_heads(49, arch, 256, 8, 2, 96), "8/2 heads of 96"),
    ] {
        let mut m = match prepare(b, &spec)? {
            Ok(m) => m,
            Err(skip) => return Ok(skip),
        };
        let mut pool = match m.new_kv_pool_typed(3, 32, types) {
            Ok(p) => p,
            Err(Error::UnsupportedKvCache { ty, reason }) if ty == types.k || ty == types.v => {
                return Ok(Outcome::Skip(format!("{types}: {reason}")))
            }
            Err(e) => return Err(format!("{heads}: a pool of {types}: {e}")),
        };
        let prompts: Vec<Vec<u32>> = [3usize, 9, 20].iter().map(|&n| tokens(50 + n as u64, n, spec.n_vocab)).collect();
        let steps: Vec<Vec<u32>> = (0..3).map(|s| tokens(60 + s, 4, spec.n_vocab)).collect();
        let n_vocab = m.n_vocab();
        let mut batch = Batch::new();
        for (slot, p) in prompts.iter().enumerate() {
            batch.push_seq(slot, 0, p, Out::Last);
        }
        let mut got = vec![m.forward(pool.as_mut(), &batch).map_err(err("prefill of three"))?.to_vec()];
        for i in 0..4 {
            batch.clear();
            for (slot, p) in prompts.iter().enumerate() {
                batch.push(steps[slot][i], p.len() + i, slot, true);
            }
            got.push(m.forward(pool.as_mut(), &batch).map_err(err("decode of three"))?.to_vec());
        }
        for (slot, p) in prompts.iter().enumerate() {
            let mut kv = m.new_kv_cache_typed(32, types).map_err(err("one-slot cache"))?;
            let want = m.prefill(kv.as_mut(), p, 0).map_err(err("prefill alone"))?.to_vec();
            let row = |step: &Vec<f32>| step[slot * n_vocab..(slot + 1) * n_vocab].to_vec();
            check_logits(&format!("{types}, {heads}: slot {slot}'s prompt"), &row(&got[0]), &want)?;
            for i in 0..4 {
                let want = m.decode_token(kv.as_mut(), steps[slot][i], p.len() + i).map_err(err("decode alone"))?;
                check_logits(&format!("{types}, {heads}: slot {slot}, step {i}"), &row(&got[i + 1]), want)?;
            }
        }
    }
    Ok(Outcome::Pass(String::new()))
}

/// A cache too large for memory, in each type the backend stores, is
/// [`Error::OutOfMemory`] or [`Error::Overflow`] (or the backend's
/// [`Error::UnsupportedModel`] for a length past its kernels' range), not
/// an abort; a head size
/// that is not a whole number of a type's blocks is
/// [`Error::UnsupportedKvCache`].
fn limits_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(43, Arch::LlamaBias);
    let m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let mut stored = Vec::new();
    for ty in KvCacheType::ALL {
        let types = KvTypes::both(ty);
        if typed_pool(m.as_ref(), 4, types)?.is_err() {
            continue;
        }
        stored.push(ty.name());
        for n_ctx in [1usize << 40, usize::MAX / 2] {
            match m.new_kv_cache_typed(n_ctx, types) {
                // A backend whose kernels index positions in 32 bits
                // (CUDA) refuses such a length before allocating.
                Err(Error::OutOfMemory { .. } | Error::Overflow(_) | Error::UnsupportedModel(_)) => {}
                Err(e) => return Err(format!("{types}, n_ctx {n_ctx}: {e}, want out of memory")),
                Ok(_) => return Err(format!("{types}: a cache of {n_ctx} positions was allocated")),
            }
        }
    }
    // head_dim 48: not a multiple of the 32-value blocks nor a power of
    // two (16 heads, so that the q rows, 768, are whole k-quant blocks).
    let odd = random_model_heads(44, Arch::LlamaBias, 256, 16, 2, 48);
    let m = match prepare(b, &odd)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    for ty in [KvCacheType::Q8_0, KvCacheType::Q4_0, KvCacheType::Tq3, KvCacheType::Tq4] {
        match m.new_kv_cache_typed(8, KvTypes { k: KvCacheType::F16, v: ty }) {
            Err(Error::UnsupportedKvCache { ty: t, .. }) if t == ty => {}
            Err(e) => return Err(format!("V {ty} with head_dim 48: {e}, want UnsupportedKvCache")),
            Ok(_) => return Err(format!("V {ty} with head_dim 48 was accepted")),
        }
    }
    Ok(Outcome::Pass(format!("stores {}", stored.join(", "))))
}

/// The KV cache type cases.
pub fn cases() -> Vec<Case> {
    use KvCacheType as T;
    let mut v = Vec::new();
    let kinds = [
        ("f32", KvTypes::both(T::F32)),
        ("q8_0", KvTypes::both(T::Q8_0)),
        ("q4_0", KvTypes::both(T::Q4_0)),
        ("k_q8_0_v_f16", KvTypes { k: T::Q8_0, v: T::F16 }),
        ("k_f16_v_q4_0", KvTypes { k: T::F16, v: T::Q4_0 }),
        ("tq4", KvTypes::both(T::Tq4)),
        ("tq3", KvTypes::both(T::Tq3)),
        ("k_tq3_v_f16", KvTypes { k: T::Tq3, v: T::F16 }),
        ("k_f16_v_tq4", KvTypes { k: T::F16, v: T::Tq4 }),
    ];
    for (arch, arch_name) in [(Arch::Gemma3, "gemma3"), (Arch::LlamaBias, "llama_bias")] {
        for (name, types) in kinds {
            v.push(Case::new(&format!("kv::{arch_name}::decode_{name}"), move |b| decode_case(b, arch, types)));
        }
        for (name, types) in [("q8_0", KvTypes::both(T::Q8_0)), ("q4_0", KvTypes::both(T::Q4_0))] {
            v.push(Case::new(&format!("kv::{arch_name}::batch_{name}"), move |b| batch_case(b, arch, types)));
        }
        // 4/2 heads of 64, then shapes for CUDA's one-token kernel over
        // TurboQuant caches with more query heads per kv head than its
        // 4-head variant holds: 6 (its 8-head variant) and 12 (two chunks
        // of heads per kv head), with heads of 128 and 64; a prompt that
        // spans three of its blocks; value channels of uneven size.
        for (name, types, heads, n_prompt, uneven) in [
            ("tq4", KvTypes::both(T::Tq4), (4, 2, 64), LONG_PROMPT, false),
            ("tq3", KvTypes::both(T::Tq3), (4, 2, 64), LONG_PROMPT, false),
            ("tq3_heads_6_1_128", KvTypes::both(T::Tq3), (6, 1, 128), LONG_PROMPT, false),
            ("tq4_heads_12_1_64", KvTypes::both(T::Tq4), (12, 1, 64), LONG_PROMPT, false),
            ("tq4_prompt_700", KvTypes::both(T::Tq4), (4, 2, 64), LONGER_PROMPT, false),
            ("tq3_uneven_values", KvTypes::both(T::Tq3), (4, 2, 64), LONG_PROMPT, true),
        ] {
            v.push(Case::new(&format!("kv::{arch_name}::long_{name}"), move |b| {
                long_case(b, arch, types, heads, n_prompt, uneven)
            }));
        }
    }
    v.push(Case::new("kv::limits", limits_case));
    v
}
