//! `infer bench --npl …`: aggregate throughput of many sequences stepped
//! together through one KV pool, in the terms of llama.cpp's
//! `llama-batched-bench` (`tools/batched-bench`): for each `B` of `--npl`,
//! `B` sequences each prefill `--npp` prompt tokens (their own prompts, not
//! a shared one), then generate `--ntg` tokens, every step one batch of
//! `B` tokens. Speeds are aggregate tokens per second over all sequences:
//! `S_PP = B · npp / T_PP`, `S_TG = B · ntg / T_TG`, `S = B · (npp + ntg) /
//! (T_PP + T_TG)`.
//!
//! As llama-batched-bench, the generated tokens are not sampled (each step
//! feeds a fixed token; the logits are computed and copied to the host but
//! not read), prompts are prefilled in batches of at most [`UBATCH`]
//! tokens, and every size runs once after one warm-up of the largest.

use std::io::Write;
use std::time::Instant;

use infer_compute::{Batch, DeviceModel, KvPool, KvTypes, Out as Logits};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::common::CliResult;
use crate::output::Out;
use crate::profile::Profile;

/// Most prompt tokens per batch (llama.cpp's default `n_ubatch`).
pub const UBATCH: usize = 512;

/// One row of the table, with llama-batched-bench's `--output-format
/// jsonl` field names.
#[derive(Serialize, Clone, Debug)]
pub struct BatchedResult {
    /// Positions per slot of the pool (`npp + ntg`).
    pub n_kv_max: usize,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub is_pp_shared: bool,
    pub n_threads: usize,
    /// Prompt tokens per sequence.
    pub pp: usize,
    /// Generated tokens per sequence.
    pub tg: usize,
    /// Sequences.
    pub pl: usize,
    /// Positions filled in all: `pl · (pp + tg)`.
    pub n_kv: usize,
    /// Prefill time, seconds.
    pub t_pp: f64,
    /// Prompt tokens per second, all sequences.
    pub speed_pp: f64,
    /// Generation time, seconds.
    pub t_tg: f64,
    /// Generated tokens per second, all sequences.
    pub speed_tg: f64,
    /// `t_pp + t_tg`.
    pub t: f64,
    /// `n_kv / t`.
    pub speed: f64,
}

/// A fresh pool of `pl` slots of `n_ctx` positions, each slot prefilled
/// with its own `npp` random prompt tokens; returns the pool and the
/// prefill time in seconds.
fn prefilled(
    model: &mut dyn DeviceModel,
    types: KvTypes,
    npp: usize,
    n_ctx: usize,
    pl: usize,
    seed: u64,
) -> CliResult<(Box<dyn KvPool>, f64)> {
    let n_vocab = model.n_vocab() as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let prompts: Vec<Vec<u32>> = (0..pl).map(|_| (0..npp).map(|_| rng.gen_range(0..n_vocab)).collect()).collect();
    let mut pool = model.new_kv_pool_typed(pl, n_ctx, types)?;
    let mut batch = Batch::new();
    let t0 = Instant::now();
    // Whole prompts packed into batches of at most UBATCH tokens, a prompt
    // split across batches where it does not fit.
    let mut fill = vec![0usize; pl];
    let mut s = 0;
    while s < pl {
        batch.clear();
        while s < pl && batch.len() < UBATCH {
            let take = (npp - fill[s]).min(UBATCH - batch.len());
            let last = fill[s] + take == npp;
            batch.push_seq(
                s,
                fill[s],
                &prompts[s][fill[s]..fill[s] + take],
                if last { Logits::Last } else { Logits::None },
            );
            fill[s] += take;
            if last {
                s += 1;
            }
        }
        if !batch.is_empty() {
            model.forward(pool.as_mut(), &batch)?;
        }
    }
    Ok((pool, t0.elapsed().as_secs_f64()))
}

/// One generation step of every slot `0..pl` at position `pos`: a fixed
/// token, as llama-batched-bench feeds.
fn step_batch(batch: &mut Batch, pl: usize, pos: usize) {
    batch.clear();
    for s in 0..pl {
        batch.push(0, pos, s, true);
    }
}

/// Runs `pl` sequences of `npp` prompt tokens then `ntg` generated ones in
/// a fresh pool of `pl` slots of `types`; returns `(t_pp, t_tg)` in seconds.
fn run_once(
    model: &mut dyn DeviceModel,
    types: KvTypes,
    npp: usize,
    ntg: usize,
    pl: usize,
    seed: u64,
) -> CliResult<(f64, f64)> {
    let (mut pool, t_pp) = prefilled(model, types, npp, npp + ntg, pl, seed)?;
    let mut batch = Batch::new();
    let t1 = Instant::now();
    for i in 0..ntg {
        step_batch(&mut batch, pl, npp + i);
        model.forward(pool.as_mut(), &batch)?;
    }
    Ok((t_pp, t1.elapsed().as_secs_f64()))
}

/// The op profile of `steps` generation steps of `pl` sequences after
/// prompts of `npp` tokens, in a pool of `types` (the backend's
/// `profile_forward`: each op timed as it runs, so a step is slower than an
/// unprofiled one).
///
/// # Errors
/// The model's errors, including a backend without timing hooks.
pub fn profile(
    model: &mut dyn DeviceModel,
    types: KvTypes,
    npp: usize,
    steps: usize,
    pl: usize,
    seed: u64,
) -> CliResult<Profile> {
    let steps = steps.max(1);
    let (mut pool, _) = prefilled(model, types, npp, npp + steps, pl, seed)?;
    let mut batch = Batch::new();
    let mut out = Profile::new();
    for i in 0..steps {
        step_batch(&mut batch, pl, npp + i);
        out.add(model.profile_forward(pool.as_mut(), &batch)?);
    }
    Ok(out)
}

/// The batched benchmark of `model` for each sequence count of `npl`.
///
/// # Errors
/// An empty `npl`, a zero size, and the model's errors (out of memory for a
/// pool that does not fit).
pub fn run(
    model: &mut dyn DeviceModel,
    types: KvTypes,
    npp: usize,
    ntg: usize,
    npl: &[usize],
    threads: usize,
    seed: u64,
) -> CliResult<Vec<BatchedResult>> {
    if npl.is_empty() || npl.contains(&0) || npp == 0 {
        return Err("--npl needs sequence counts of at least 1 and --npp at least 1 prompt token".into());
    }
    let max = npl.iter().copied().max().unwrap_or(1);
    // Warm-up: buffers sized for the largest batch, kernels loaded.
    run_once(model, types, npp.min(UBATCH), ntg.min(2), max, seed)?;
    let mut out = Vec::new();
    for &pl in npl {
        let (t_pp, t_tg) = run_once(model, types, npp, ntg, pl, seed)?;
        let n_kv = pl * (npp + ntg);
        out.push(BatchedResult {
            n_kv_max: npp + ntg,
            n_batch: UBATCH,
            n_ubatch: UBATCH,
            is_pp_shared: false,
            n_threads: threads,
            pp: npp,
            tg: ntg,
            pl,
            n_kv,
            t_pp,
            speed_pp: (pl * npp) as f64 / t_pp.max(1e-12),
            t_tg,
            speed_tg: if ntg > 0 { (pl * ntg) as f64 / t_tg.max(1e-12) } else { 0.0 },
            t: t_pp + t_tg,
            speed: n_kv as f64 / (t_pp + t_tg).max(1e-12),
        });
    }
    Ok(out)
}

/// The table llama-batched-bench prints (`json`: one JSON object per line,
/// as its `--output-format jsonl`), after a line naming what ran.
pub fn print(out: &mut Out, results: &[BatchedResult], what: &str, json: bool) -> std::io::Result<()> {
    if json {
        for r in results {
            writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default())?;
        }
        return Ok(());
    }
    writeln!(out, "{what}")?;
    writeln!(out)?;
    writeln!(
        out,
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"
    )?;
    writeln!(
        out,
        "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|"
    )?;
    for r in results {
        writeln!(
            out,
            "| {:5} | {:6} | {:4} | {:6} | {:8.3} | {:8.2} | {:8.3} | {:8.2} | {:8.3} | {:8.2} |",
            r.pp, r.tg, r.pl, r.n_kv, r.t_pp, r.speed_pp, r.t_tg, r.speed_tg, r.t, r.speed
        )?;
    }
    Ok(())
}
