//! `infer bench --profile`: where a decode step's time goes, measured by the
//! backend that runs the model ([`DeviceModel::profile_step`]: the real
//! decode path, each op timed as it runs). Timing serializes the work, so the
//! profiled steps are a little slower than the tg test's.

use std::io::Write;
use std::ops::Range;
use std::time::Duration;

use infer_compute::backend::{OpTiming, StepProfile};
use infer_compute::{DeviceModel, KvPool};

use crate::common::CliResult;

/// The ops of `steps` profiled decode steps, summed.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Decode steps profiled.
    pub steps: usize,
    /// Position of the first profiled step (the cache's depth before it).
    pub first_pos: usize,
    /// The KV cache's types, as `K f16, V f16` (empty when not known).
    pub cache: String,
    /// Time per op kind over all steps, in the order they first ran.
    pub ops: Vec<OpTiming>,
    /// Wall time of all steps.
    pub total: Duration,
}

impl Profile {
    /// Sum of all ops, nanoseconds per step.
    pub fn step_ns(&self) -> f64 {
        self.ops.iter().map(|o| o.time.as_nanos()).sum::<u128>() as f64 / self.steps.max(1) as f64
    }
}

impl Profile {
    /// An empty profile.
    pub fn new() -> Profile {
        Profile { steps: 0, first_pos: 0, cache: String::new(), ops: Vec::new(), total: Duration::ZERO }
    }

    /// Adds one profiled step.
    pub fn add(&mut self, p: StepProfile) {
        self.steps += 1;
        self.total += p.total;
        for o in p.ops {
            match self.ops.iter_mut().find(|x| x.op == o.op && x.ty == o.ty && x.shape == o.shape) {
                Some(x) => {
                    x.calls += o.calls;
                    x.time += o.time;
                    x.bytes += o.bytes;
                }
                None => self.ops.push(o),
            }
        }
    }
}

/// Profiles decode steps of token `token` at `positions` of `kv`, whose
/// earlier positions the caller filled (the depth of the bench's test).
///
/// # Errors
/// The model's errors, including a backend without timing hooks.
pub fn profile_decode(
    model: &mut dyn DeviceModel,
    kv: &mut dyn KvPool,
    token: u32,
    positions: Range<usize>,
) -> CliResult<Profile> {
    let types = kv.types();
    let mut out = Profile::new();
    out.first_pos = positions.start;
    out.cache = format!("K {}, V {}", types.k.name(), types.v.name());
    for pos in positions {
        out.add(model.profile_step(kv, token, pos)?);
    }
    Ok(out)
}

/// Writes the profile as a table, slowest op first, with the tg test's time
/// per token (`tg_ms`) for comparison.
///
/// # Errors
/// A failed write.
pub fn print_profile(out: &mut impl Write, p: &Profile, device: &str, tg_ms: Option<f64>) -> std::io::Result<()> {
    let heading = format!(
        "decode profile: {} step(s) from position {} on {device}; KV cache {}; each op timed as it runs",
        p.steps, p.first_pos, p.cache
    );
    print_table(out, p, &heading, "token")?;
    print_total(out, p, "token", tg_ms)
}

/// Writes the op table of `p` under `heading`, times per `unit` (a
/// token, or a step of a batch).
///
/// # Errors
/// A failed write.
pub fn print_table(out: &mut impl Write, p: &Profile, heading: &str, unit: &str) -> std::io::Result<()> {
    let step = p.step_ns();
    let n = p.steps.max(1) as f64;
    writeln!(out, "{heading}")?;
    writeln!(out)?;
    writeln!(
        out,
        "| {:<28} | {:<18} | {:>22} | {:>9} | {:>11} | {:>7} | {:>8} |",
        "op",
        "type",
        "shape",
        if unit == "token" { "calls/tok".to_string() } else { format!("calls/{unit}") },
        format!("µs/{unit}"),
        "% step",
        "GB/s"
    )?;
    writeln!(
        out,
        "| {:-<28} | {:-<18} | {:->21}: | {:->8}: | {:->10}: | {:->6}: | {:->7}: |",
        "", "", "", "", "", "", ""
    )?;
    let mut ops = p.ops.clone();
    ops.sort_by_key(|o| std::cmp::Reverse(o.time));
    for o in &ops {
        let per_step = o.time.as_nanos() as f64 / n;
        let gbps =
            if o.bytes > 0 && per_step > 0.0 { format!("{:.1}", o.bytes as f64 / n / per_step) } else { "-".into() };
        writeln!(
            out,
            "| {:<28} | {:<18} | {:>22} | {:>9} | {:>11.1} | {:>7.1} | {:>8} |",
            o.op,
            o.ty,
            o.shape,
            format!("{:.0}", o.calls as f64 / n),
            per_step / 1e3,
            100.0 * per_step / step.max(1.0),
            gbps
        )?;
    }
    writeln!(out)
}

/// Writes the line that sums up `p`: the profiled time per `unit`, the
/// products' share, the wall time, and the unprofiled time `tg_ms` when
/// known.
///
/// # Errors
/// A failed write.
pub fn print_total(out: &mut impl Write, p: &Profile, unit: &str, tg_ms: Option<f64>) -> std::io::Result<()> {
    let step = p.step_ns();
    let n = p.steps.max(1) as f64;
    let matvec: u128 = p.ops.iter().filter(|o| o.bytes > 0).map(|o| o.time.as_nanos()).sum();
    writeln!(
        out,
        "profiled: {:.3} ms/{unit} (products {:.1} %, wall {:.3} ms/{unit}){}",
        step / 1e6,
        100.0 * matvec as f64 / n / step.max(1.0),
        p.total.as_secs_f64() * 1e3 / n,
        match tg_ms {
            Some(ms) => format!("; unprofiled: {ms:.3} ms/{unit}"),
            None => String::new(),
        }
    )?;
    Ok(())
}
