//! The batched step ([`DeviceModel::forward`] over a [`KvPool`]): a batch
//! mixing decode steps and prompt chunks of several slots equals the same
//! work one sequence at a time (bit for bit on the CPU, whose kernels fix
//! the arithmetic per (row, token); within [`check_logits`]'s bounds
//! elsewhere), slots are reset, reused and copied, rows without logits
//! return nothing, bad tokens are typed errors that leave every slot as it
//! was, and a second context on the same weights computes the same.

use super::compare::check_logits;
use super::model::{err, fill, prepare, random_model, random_model_heads, tokens, Arch};
use super::{Case, Outcome};
use crate::backend::{Batch, ComputeBackend, DeviceModel, KvPool, Out};
use crate::Error;

/// Compares a row of the batched step with the same row computed alone:
/// the same bits on the CPU, within the suite's bounds on other backends.
fn same(b: &dyn ComputeBackend, what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if b.name() != "cpu" {
        return check_logits(what, got, want);
    }
    match got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!("{what}: {} logits, want {}", got.len(), want.len())),
        Some(i) => Err(format!("{what}: logit {i} is {}, alone {} (the CPU must give the same bits)", got[i], want[i])),
    }
}

/// One sequence's steps run alone: `chunks` prefilled in turn on a fresh
/// one-slot cache; the logits of each chunk's tokens that `outs` names.
fn alone(m: &mut dyn DeviceModel, n_ctx: usize, chunks: &[(&[u32], Out)]) -> Result<Vec<Vec<f32>>, String> {
    let mut kv = m.new_kv_cache(n_ctx).map_err(err("kv"))?;
    let n_vocab = m.n_vocab();
    let mut rows = Vec::new();
    let mut pos = 0;
    for &(toks, out) in chunks {
        let l = m.forward(kv.as_mut(), &Batch::seq(0, pos, toks, out)).map_err(err("alone"))?;
        rows.extend(l.chunks_exact(n_vocab).map(<[f32]>::to_vec));
        pos += toks.len();
    }
    Ok(rows)
}

/// Two slots decoding (adjacent in the batch: GPU backends may run their
/// attention in one launch) beside a third's prompt chunk of `p` tokens
/// (with all its logits) and a fourth's chunk without logits in one step,
/// then one more step of all four, against each sequence alone with the
/// same chunks; for chunks of 6, 14 and 30 tokens (steps of 12, 20 and 36
/// tokens: CUDA runs the gate/up pairs of 20 four rows per warp, and GPU
/// backends run passes of the last through their prefill GEMMs and tiled
/// attention), with heads
/// of 64 values in GQA and of 96 without (Phi-3's shape), and with rows of
/// 2048 values (CUDA splits a group of rows of 64+ chunks over two warps).
fn mixed_case(b: &dyn ComputeBackend, arch: Arch) -> Result<Outcome, String> {
    for (spec, heads) in [
        (random_model(41, arch), "4/2 heads of 64"),
        (random_model_heads(46, arch, 256, 8, 8, 96), "8/8 heads of 96"),
        (random_model_heads(47, arch, 2048, 4, 2, 64), "n_embd 2048"),
    ] {
        let mut m = match prepare(b, &spec)? {
            Ok(m) => m,
            Err(skip) => return Ok(skip),
        };
        for p in [6, 14, 30] {
            mixed_step(b, m.as_mut(), p).map_err(|e| format!("{heads}, a prompt chunk of {p}: {e}"))?;
        }
    }
    Ok(Outcome::Pass(String::new()))
}

fn mixed_step(b: &dyn ComputeBackend, m: &mut dyn DeviceModel, p: usize) -> Result<(), String> {
    let n = m.n_vocab();
    let t: Vec<Vec<u32>> = (0..4).map(|i| tokens(50 + i, p + 6, n)).collect();
    let mut pool = m.new_kv_pool(4, p + 8).map_err(err("pool"))?;
    // Before: slot 0 holds 5 positions, slot 1 holds 3; slots 2 and 3 are empty.
    let mut setup = Batch::seq(0, 0, &t[0][..5], Out::None);
    setup.push_seq(1, 0, &t[1][..3], Out::None);
    if !m.forward(pool.as_mut(), &setup).map_err(err("setup"))?.is_empty() {
        return Err("a batch without wanted logits returned rows".into());
    }
    let mut step = Batch::seq(1, 3, &t[1][3..4], Out::Last);
    step.push_seq(0, 5, &t[0][5..6], Out::Last);
    step.push_seq(2, 0, &t[2][..p], Out::All);
    step.push_seq(3, 0, &t[3][..4], Out::None);
    let got = m.forward(pool.as_mut(), &step).map_err(err("mixed step"))?.to_vec();
    if got.len() != (p + 2) * n {
        return Err(format!("the mixed step returned {} logits, want {} rows of {n}", got.len(), p + 2));
    }
    let mut next = Batch::new();
    for (slot, pos) in [(0, 6), (1, 4), (2, p), (3, 4)] {
        next.push_seq(slot, pos, &t[slot][pos..pos + 1], Out::Last);
    }
    let got_next = m.forward(pool.as_mut(), &next).map_err(err("second step"))?.to_vec();
    for (slot, want_len) in [(0, 7), (1, 5), (2, p + 1), (3, 5)] {
        if pool.seq_len(slot).map_err(err("seq_len"))? != want_len {
            return Err(format!("slot {slot} holds {:?} positions, want {want_len}", pool.seq_len(slot)));
        }
    }
    let c = p + 8;
    let a0 = alone(m, c, &[(&t[0][..5], Out::None), (&t[0][5..6], Out::Last), (&t[0][6..7], Out::Last)])?;
    let a1 = alone(m, c, &[(&t[1][..3], Out::None), (&t[1][3..4], Out::Last), (&t[1][4..5], Out::Last)])?;
    let a2 = alone(m, c, &[(&t[2][..p], Out::All), (&t[2][p..p + 1], Out::Last)])?;
    let a3 = alone(m, c, &[(&t[3][..4], Out::None), (&t[3][4..5], Out::Last)])?;
    let rows: Vec<&[f32]> = got.chunks_exact(n).collect();
    same(b, "slot 1 decode", rows[0], &a1[0])?;
    same(b, "slot 0 decode", rows[1], &a0[0])?;
    for i in 0..p {
        same(b, &format!("slot 2 prompt token {i}"), rows[2 + i], &a2[i])?;
    }
    let rows: Vec<&[f32]> = got_next.chunks_exact(n).collect();
    for (r, (want, slot)) in [(&a0[1], 0), (&a1[1], 1), (&a2[p], 2), (&a3[0], 3)].into_iter().enumerate() {
        same(b, &format!("second step, slot {slot}"), rows[r], want)?;
    }
    Ok(())
}

/// Reset and reuse of a slot, a prefix copied into another slot, and
/// contexts that share the weights.
fn slots_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(42, Arch::LlamaBias);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let n = spec.n_vocab;
    let (ta, tb) = (tokens(60, 10, n), tokens(61, 10, n));
    let want_b = alone(m.as_mut(), 16, &[(&tb[..6], Out::Last), (&tb[6..7], Out::Last)])?;
    let mut pool = m.new_kv_pool(3, 16).map_err(err("pool"))?;
    // Slot 1 runs sequence a, is reset, then runs sequence b.
    m.forward(pool.as_mut(), &Batch::seq(1, 0, &ta[..8], Out::Last)).map_err(err("a"))?;
    pool.reset(1).map_err(err("reset"))?;
    if pool.seq_len(1).map_err(err("seq_len"))? != 0 {
        return Err("a reset slot is not empty".into());
    }
    let got = m.forward(pool.as_mut(), &Batch::seq(1, 0, &tb[..6], Out::Last)).map_err(err("b"))?.to_vec();
    same(b, "a reset slot reused", &got, &want_b[0])?;
    // Slot 1's first 6 positions copied into slot 2, which goes on alone.
    pool.copy_prefix(1, 2, 6).map_err(err("copy_prefix"))?;
    let got = m.forward(pool.as_mut(), &Batch::seq(2, 6, &tb[6..7], Out::Last)).map_err(err("after copy"))?.to_vec();
    same(b, "decode after copy_prefix", &got, &want_b[1])?;
    // A shorter copy over a fuller slot: slot 2 now holds 4 positions.
    pool.copy_prefix(1, 2, 4).map_err(err("copy_prefix"))?;
    if pool.seq_len(2).map_err(err("seq_len"))? != 4 {
        return Err(format!("copy_prefix(1, 2, 4) left slot 2 at {:?}", pool.seq_len(2)));
    }
    for (what, r) in [
        ("copy past the source's fill", pool.copy_prefix(1, 0, 7)),
        ("copy onto itself", pool.copy_prefix(1, 1, 2)),
        ("copy to a missing slot", pool.copy_prefix(1, 3, 2)),
    ] {
        if r.is_ok() {
            return Err(format!("{what} was accepted"));
        }
    }
    // A second context over the same weights, stepping the same pool.
    let mut c = m.new_context().map_err(err("new_context"))?;
    let got = c.forward(pool.as_mut(), &Batch::seq(1, 6, &tb[6..7], Out::Last)).map_err(err("context"))?.to_vec();
    same(b, "a second context on the same pool", &got, &want_b[1])?;
    Ok(Outcome::Pass(String::new()))
}

/// A bad token anywhere in a batch is its typed error naming the token,
/// and no slot changes; the same batch without it then runs.
fn errors_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(43, Arch::Gemma3);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let n = spec.n_vocab;
    let t = tokens(62, 8, n);
    // The good part of each batch steps slots 0 and 2; the bad tokens
    // follow it (from index 3), mostly in slot 1.
    let mut pool = m.new_kv_pool(3, 8).map_err(err("pool"))?;
    m.forward(pool.as_mut(), &Batch::seq(0, 0, &t[..3], Out::None)).map_err(err("setup"))?;
    let good = || {
        let mut g = Batch::seq(0, 3, &t[3..4], Out::Last);
        g.push_seq(2, 0, &t[..2], Out::Last);
        g
    };
    type Want = fn(&Error) -> bool;
    let bad: [(&str, Batch, usize, Want); 6] = [
        ("a slot past the pool", Batch::seq(3, 0, &[1], Out::Last), 3, |e| matches!(e, Error::SlotOutOfRange { .. })),
        ("a gap", Batch::seq(1, 1, &[1], Out::Last), 3, |e| matches!(e, Error::PositionGap { .. })),
        ("past n_ctx", Batch::seq(1, 0, &[1; 9], Out::Last), 3, |e| matches!(e, Error::ContextOverflow { .. })),
        ("a position past usize", Batch::seq(1, usize::MAX, &[1], Out::Last), 3, |e| {
            matches!(e, Error::PositionGap { .. } | Error::ContextOverflow { .. })
        }),
        ("a token past the vocabulary", Batch::seq(1, 0, &[1, n as u32], Out::Last), 4, |e| {
            matches!(e, Error::TokenOutOfRange { .. })
        }),
        ("a slot twice", Batch::seq(0, 4, &[1], Out::Last), 3, |e| matches!(e, Error::SlotRepeated { .. })),
    ];
    for (what, tail, index, want) in bad {
        let mut batch = good();
        for i in 0..tail.len() {
            batch.push(tail.tokens()[i], tail.positions()[i], tail.slots()[i], tail.wants_logits()[i]);
        }
        match m.forward(pool.as_mut(), &batch) {
            Err(Error::InBatch { index: i, source }) if i == index && want(&source) => {}
            Err(e) => return Err(format!("{what}: {e}, want the typed error for token {index}")),
            Ok(_) => return Err(format!("{what}: accepted")),
        }
        let lens = (pool.seq_len(0).ok(), pool.seq_len(1).ok(), pool.seq_len(2).ok());
        if lens != (Some(3), Some(0), Some(0)) {
            return Err(format!("{what}: a failed step changed the slots"));
        }
    }
    if !matches!(m.forward(pool.as_mut(), &Batch::new()), Err(Error::EmptyBatch)) {
        return Err("an empty batch: want Error::EmptyBatch".into());
    }
    if !matches!(m.new_kv_pool(0, 8), Err(Error::EmptyKvCache)) {
        return Err("new_kv_pool(0, 8): want Error::EmptyKvCache".into());
    }
    let got = m.forward(pool.as_mut(), &good()).map_err(err("after errors"))?.to_vec();
    let want0 = alone(m.as_mut(), 8, &[(&t[..3], Out::None), (&t[3..4], Out::Last)])?;
    let want1 = alone(m.as_mut(), 8, &[(&t[..2], Out::Last)])?;
    same(b, "slot 0 after the failed steps", &got[..n], &want0[0])?;
    same(b, "slot 2 after the failed steps", &got[n..], &want1[0])?;
    if fill(pool.as_ref()) != 4 {
        return Err(format!("slot 0 holds {} positions, want 4", fill(pool.as_ref())));
    }
    Ok(Outcome::Pass(String::new()))
}

/// A pool used through the one-slot methods: `decode_token` and `prefill`
/// step slot 0 of any pool.
fn wrappers_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(44, Arch::Gemma2Caps);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let t = tokens(63, 8, spec.n_vocab);
    // A one-token step without logits before the one-token steps with them
    // (a backend that captures and replays one-token steps must not replay
    // the first for the others).
    let want = alone(
        m.as_mut(),
        12,
        &[(&t[..5], Out::Last), (&t[5..6], Out::None), (&t[6..7], Out::Last), (&t[7..8], Out::Last)],
    )?;
    let mut pool: Box<dyn KvPool> = m.new_kv_pool(2, 12).map_err(err("pool"))?;
    let got = m.prefill(pool.as_mut(), &t[..5], 0).map_err(err("prefill"))?.to_vec();
    same(b, "prefill", &got, &want[0])?;
    if !m.forward(pool.as_mut(), &Batch::seq(0, 5, &t[5..6], Out::None)).map_err(err("no logits"))?.is_empty() {
        return Err("a one-token step without wanted logits returned rows".into());
    }
    for (i, pos) in [6, 7].into_iter().enumerate() {
        let got = m.decode_token(pool.as_mut(), t[pos], pos).map_err(err("decode_token"))?.to_vec();
        same(b, &format!("decode_token at {pos}, after a step without logits"), &got, &want[1 + i])?;
    }
    match m.decode_token(pool.as_mut(), t[5], 11) {
        Err(Error::PositionGap { .. }) => Ok(Outcome::Pass(String::new())),
        other => Err(format!("decode_token past the fill: {:?}, want PositionGap (not wrapped)", other.err())),
    }
}

/// Batches longer than one pass of a GPU backend (512 tokens): a last pass
/// of one token with logits puts its row after the first pass's; every row
/// of a 513-token prompt is its token's; a decode after a batch that wanted
/// more rows than any before is right. Each row is compared with its
/// sequence run alone in the same chunks (prompt chunks and token-by-token
/// decode sum attention in different orders, so only the same chunks give
/// the CPU's same bits).
fn passes_case(b: &dyn ComputeBackend) -> Result<Outcome, String> {
    let spec = random_model(45, Arch::LlamaBias);
    let mut m = match prepare(b, &spec)? {
        Ok(m) => m,
        Err(skip) => return Ok(skip),
    };
    let n = spec.n_vocab;
    let (a, c) = (tokens(64, 515, n), tokens(65, 3, n));
    let last = |rows: Vec<Vec<f32>>| rows.into_iter().last().unwrap_or_default();
    let want_512 = last(alone(m.as_mut(), 520, &[(&a[..512], Out::Last)])?);
    let want_c = last(alone(m.as_mut(), 520, &[(&c[..2], Out::None), (&c[2..], Out::Last)])?);
    let want_513 = alone(m.as_mut(), 520, &[(&a[..513], Out::All)])?;
    let want_dec = alone(m.as_mut(), 520, &[(&a[..513], Out::None), (&a[513..514], Out::Last)])?;
    let after: [(&[u32], Out); 3] = [(&a[..513], Out::None), (&a[513..514], Out::None), (&a[514..], Out::Last)];
    let want_after = last(alone(m.as_mut(), 520, &after)?);
    let mut pool = m.new_kv_pool(3, 520).map_err(err("pool"))?;
    m.forward(pool.as_mut(), &Batch::seq(1, 0, &c[..2], Out::None)).map_err(err("setup"))?;
    let mut step = Batch::seq(0, 0, &a[..512], Out::Last);
    step.push_seq(1, 2, &c[2..], Out::Last);
    let got = m.forward(pool.as_mut(), &step).map_err(err("512 + 1 tokens"))?.to_vec();
    same(b, "slot 0 after 512 tokens", &got[..n], &want_512)?;
    same(b, "slot 1, the last pass", &got[n..], &want_c)?;
    let got = m.forward(pool.as_mut(), &Batch::seq(0, 0, &a[..513], Out::All)).map_err(err("513 tokens"))?.to_vec();
    for p in [0, 511, 512] {
        same(b, &format!("row {p} of a 513-token prompt"), &got[p * n..(p + 1) * n], &want_513[p])?;
    }
    // One-token steps (a GPU backend replays a captured one), then a batch
    // wanting more rows than any before, then a one-token step again.
    let got = m.decode_token(pool.as_mut(), a[513], 513).map_err(err("decode"))?.to_vec();
    same(b, "decode at 513", &got, &want_dec[0])?;
    let mut two = Batch::seq(1, 0, &tokens(66, 512, n), Out::Last);
    two.push_seq(2, 0, &tokens(67, 512, n), Out::Last);
    two.push_seq(0, 514, &a[514..], Out::Last);
    if m.forward(pool.as_mut(), &two).map_err(err("1025 tokens"))?.len() != 3 * n {
        return Err("a batch of three wanted rows returned another count".into());
    }
    pool.truncate(0, 514).map_err(err("truncate"))?;
    let got = m.decode_token(pool.as_mut(), a[514], 514).map_err(err("decode after"))?.to_vec();
    same(b, "decode after a batch of three rows", &got, &want_after)?;
    Ok(Outcome::Pass(String::new()))
}

/// The batch cases.
pub fn cases() -> Vec<Case> {
    vec![
        Case::new("batch::gemma3::mixed", |b| mixed_case(b, Arch::Gemma3)),
        Case::new("batch::gemma2_caps::mixed", |b| mixed_case(b, Arch::Gemma2Caps)),
        Case::new("batch::llama_bias::mixed", |b| mixed_case(b, Arch::LlamaBias)),
        Case::new("batch::slots", slots_case),
        Case::new("batch::errors", errors_case),
        Case::new("batch::wrappers", wrappers_case),
        Case::new("batch::passes", passes_case),
    ]
}
