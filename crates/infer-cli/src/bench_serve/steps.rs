//! The server's own account of a level, where it gives one: `infer
//! serve`'s step counters from `GET /metrics` (`infer_steps_total`,
//! `infer_batch_tokens_sum`, `infer_engine_seconds_total{part=...}`),
//! read before and after the level. Servers without these counters
//! (llama-server, vLLM) give none, and the level's result has `null`.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::Method;
use serde::Serialize;

use super::Ctx;

/// What the engine did during a level, per step (`server_steps` of the
/// JSON).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct StepProfile {
    /// Forward steps run.
    pub steps: u64,
    /// Mean tokens per step: decode tokens and prompt chunks.
    pub tokens_per_step: f64,
    /// Milliseconds per step in the model's forward (the device step and
    /// its read-back).
    pub forward_ms: f64,
    /// Milliseconds per step handing out the rows (sampling,
    /// detokenizing, stop strings, events).
    pub rows_ms: f64,
    /// Milliseconds per step in the rest of the engine's step
    /// (cancellations, admissions, planning).
    pub schedule_ms: f64,
    /// Fraction of the level's wall time the engine's thread spent in steps.
    pub busy_fraction: f64,
}

/// The counters read at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    steps: f64,
    tokens: f64,
    forward_s: f64,
    rows_s: f64,
    schedule_s: f64,
}

impl Counters {
    /// The counters in a Prometheus text, `None` without `infer_steps_total`.
    pub fn parse(text: &str) -> Option<Counters> {
        let mut c = Counters::default();
        let mut seen = false;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else { continue };
            let Ok(v) = value.trim().parse::<f64>() else { continue };
            match name.trim() {
                "infer_steps_total" => (c.steps, seen) = (v, true),
                "infer_batch_tokens_sum" => c.tokens = v,
                "infer_engine_seconds_total{part=\"forward\"}" => c.forward_s = v,
                "infer_engine_seconds_total{part=\"rows\"}" => c.rows_s = v,
                "infer_engine_seconds_total{part=\"schedule\"}" => c.schedule_s = v,
                _ => {}
            }
        }
        seen.then_some(c)
    }

    /// The profile of the steps between `self` and `after`, over a level of
    /// `wall` seconds; `None` when no step ran.
    pub fn profile(&self, after: &Counters, wall: f64) -> Option<StepProfile> {
        let steps = after.steps - self.steps;
        if steps < 1.0 {
            return None;
        }
        let per = |a: f64, b: f64| (a - b) * 1e3 / steps;
        let busy =
            (after.forward_s + after.rows_s + after.schedule_s) - (self.forward_s + self.rows_s + self.schedule_s);
        Some(StepProfile {
            steps: steps as u64,
            tokens_per_step: (after.tokens - self.tokens) / steps,
            forward_ms: per(after.forward_s, self.forward_s),
            rows_ms: per(after.rows_s, self.rows_s),
            schedule_ms: per(after.schedule_s, self.schedule_s),
            busy_fraction: if wall > 0.0 { busy / wall } else { 0.0 },
        })
    }
}

/// The server's counters now, `None` when it has no such `/metrics` (or
/// does not answer within 5 s).
pub async fn scrape(ctx: &Ctx) -> Option<Counters> {
    let req = ctx.request(Method::GET, "/metrics", None).ok()?;
    let fut = async {
        let resp = ctx.client.request(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Counters::parse(std::str::from_utf8(&bytes).ok()?)
    };
    tokio::time::timeout(Duration::from_secs(5), fut).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_infer_serve_and_none_elsewhere() {
        let before = "# HELP infer_steps_total Forward steps run.\ninfer_steps_total 10\ninfer_batch_tokens_sum 100\n\
                      infer_engine_seconds_total{part=\"forward\"} 1\ninfer_engine_seconds_total{part=\"rows\"} 0.5\n\
                      infer_engine_seconds_total{part=\"schedule\"} 0.25\n";
        let after = "infer_steps_total 110\ninfer_batch_tokens_sum 900\n\
                     infer_engine_seconds_total{part=\"forward\"} 2\ninfer_engine_seconds_total{part=\"rows\"} 0.6\n\
                     infer_engine_seconds_total{part=\"schedule\"} 0.35\n";
        let (b, a) = (Counters::parse(before).unwrap(), Counters::parse(after).unwrap());
        let p = b.profile(&a, 2.4).unwrap();
        assert_eq!(p.steps, 100);
        assert!((p.tokens_per_step - 8.0).abs() < 1e-9);
        assert!((p.forward_ms - 10.0).abs() < 1e-9 && (p.rows_ms - 1.0).abs() < 1e-9);
        assert!((p.schedule_ms - 1.0).abs() < 1e-9 && (p.busy_fraction - 0.5).abs() < 1e-9);
        assert_eq!(b.profile(&b, 1.0), None, "no step, no profile");
        assert_eq!(Counters::parse("llamacpp:prompt_tokens_total 5\n"), None);
    }
}
