//! Counters and gauges of a running server, shared by the HTTP side and the
//! engine thread (atomics, no lock), and their Prometheus text rendering
//! (`GET /metrics`, exposition format 0.0.4).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A histogram with fixed upper bounds (seconds or counts), Prometheus'
/// cumulative buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// Sum of observations in millionths.
    sum_micro: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micro: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records `v`.
    pub fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micro.fetch_add((v.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micro.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const BATCH_BOUNDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0];

/// The server's metrics (see the module docs).
#[derive(Debug)]
pub struct Metrics {
    /// Requests accepted by the engine's queue.
    pub requests: AtomicU64,
    /// Requests refused with 503 (queue full).
    pub rejected: AtomicU64,
    /// Requests finished (any reason, errors and cancellations included).
    pub finished: AtomicU64,
    /// Requests cancelled by a client that went away.
    pub cancelled: AtomicU64,
    /// Prompt tokens computed.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens reused from a slot's cache.
    pub cached_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Forward steps run.
    pub steps: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_len: AtomicU64,
    /// Slots in use.
    pub slots_busy: AtomicU64,
    /// Slots in all.
    pub slots_total: AtomicU64,
    /// Microseconds the engine's thread spent in steps (from taking in
    /// cancellations and admissions to the last event sent).
    pub engine_busy_us: AtomicU64,
    /// Microseconds of that in the model's forward (the device step and
    /// its read-back of logits or candidates).
    pub step_forward_us: AtomicU64,
    /// Microseconds of that handing out the rows: sampling, detokenizing,
    /// stop strings, events, freeing finished slots.
    pub step_rows_us: AtomicU64,
    /// Tokens of each forward step.
    pub batch_tokens: Histogram,
    /// Seconds from a request's arrival at the engine to its first token.
    pub ttft: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Metrics {
            requests: z(),
            rejected: z(),
            finished: z(),
            cancelled: z(),
            prompt_tokens: z(),
            cached_tokens: z(),
            generated_tokens: z(),
            steps: z(),
            engine_busy_us: z(),
            step_forward_us: z(),
            step_rows_us: z(),
            queue_len: z(),
            slots_busy: z(),
            slots_total: z(),
            batch_tokens: Histogram::new(BATCH_BOUNDS),
            ttft: Histogram::new(TTFT_BOUNDS),
        }
    }
}

/// Adds `n` to a counter.
pub fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

/// Adds `d` to a counter of microseconds.
pub fn add_time(c: &AtomicU64, d: Duration) {
    c.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
}

/// Sets a gauge.
pub fn set(c: &AtomicU64, n: usize) {
    c.store(n as u64, Ordering::Relaxed);
}

/// Reads a counter or gauge.
pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Metrics {
    /// Records a time to first token.
    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    /// The Prometheus text of every metric, names prefixed `infer_`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &AtomicU64); 8] = [
            ("infer_requests_total", "Requests accepted into the queue.", &self.requests),
            ("infer_requests_rejected_total", "Requests refused because the queue was full.", &self.rejected),
            ("infer_requests_finished_total", "Requests finished, failed or cancelled.", &self.finished),
            ("infer_requests_cancelled_total", "Requests whose client went away.", &self.cancelled),
            ("infer_prompt_tokens_total", "Prompt tokens computed.", &self.prompt_tokens),
            ("infer_prompt_tokens_cached_total", "Prompt tokens reused from a slot's cache.", &self.cached_tokens),
            ("infer_generated_tokens_total", "Tokens generated.", &self.generated_tokens),
            ("infer_steps_total", "Forward steps run.", &self.steps),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", get(v));
        }
        // The engine's time by part; `schedule` is the rest of its steps
        // (cancellations, admissions with their prompts' prefix matching,
        // planning the batch, these metrics).
        let (busy, forward, rows) = (get(&self.engine_busy_us), get(&self.step_forward_us), get(&self.step_rows_us));
        let name = "infer_engine_seconds_total";
        let _ = writeln!(
            out,
            "# HELP {name} Seconds the engine's thread spent in steps, by part: forward (the model's step and its \
             read-back), rows (sampling, detokenizing, stop strings, events), schedule (the rest).\n# TYPE {name} counter"
        );
        for (part, us) in [("forward", forward), ("rows", rows), ("schedule", busy.saturating_sub(forward + rows))] {
            let _ = writeln!(out, "{name}{{part=\"{part}\"}} {}", us as f64 / 1e6);
        }
        let gauges: [(&str, &str, &AtomicU64); 3] = [
            ("infer_queue_length", "Requests waiting for a slot.", &self.queue_len),
            ("infer_slots_busy", "Slots generating.", &self.slots_busy),
            ("infer_slots_total", "Slots of the KV pool.", &self.slots_total),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", get(v));
        }
        self.batch_tokens.render(&mut out, "infer_batch_tokens", "Tokens per forward step.");
        self.ttft.render(&mut out, "infer_time_to_first_token_seconds", "Seconds from arrival to the first token.");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::default();
        m.ttft.observe(0.02);
        m.ttft.observe(0.3);
        m.ttft.observe(100.0);
        add(&m.requests, 3);
        add_time(&m.engine_busy_us, Duration::from_millis(10));
        add_time(&m.step_forward_us, Duration::from_millis(6));
        add_time(&m.step_rows_us, Duration::from_millis(3));
        let text = m.render();
        assert!(text.contains("infer_engine_seconds_total{part=\"forward\"} 0.006\n"), "{text}");
        assert!(text.contains("infer_engine_seconds_total{part=\"schedule\"} 0.001\n"), "{text}");
        assert!(text.contains("infer_requests_total 3\n"), "{text}");
        assert!(text.contains("infer_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), "{text}");
        assert!(text.contains("infer_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"), "{text}");
        assert!(text.contains("infer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("infer_time_to_first_token_seconds_count 3\n"), "{text}");
    }
}
