//! The results of a level, as JSON and as a markdown table.

use std::collections::BTreeMap;

use serde::Serialize;

use super::stats::Summary;
use super::steps::StepProfile;
use super::{Ctx, Endpoint, Failure, Reply, ServeBenchArgs};

/// One concurrency level's results (`-o json`), with the run's settings.
#[derive(Serialize, Clone, Debug)]
pub struct LevelResult {
    /// `--label`, or the URL.
    pub server: String,
    pub url: String,
    pub endpoint: Endpoint,
    pub model: String,
    /// Concurrent clients.
    pub clients: usize,
    pub requests_per_client: usize,
    /// `--prompt-tokens`.
    pub prompt_tokens_target: usize,
    /// Words per prompt (fitted by the warm-up to the target).
    pub prompt_words: usize,
    pub max_tokens: usize,
    pub temperature: f64,
    pub seed: Option<u64>,
    /// Requests sent.
    pub requests: usize,
    /// Requests that streamed to the end.
    pub ok: usize,
    /// Failed requests by kind.
    pub errors: BTreeMap<String, usize>,
    /// Successful requests whose completion tokens were not `max_tokens`.
    pub short_replies: usize,
    /// First request sent to last reply ended, seconds.
    pub wall_s: f64,
    /// Completion tokens of the successful requests.
    pub completion_tokens: usize,
    /// Mean prompt tokens the server reported (`null` without usage).
    pub prompt_tokens_mean: Option<f64>,
    /// `completion_tokens / wall_s`.
    pub tokens_per_s: f64,
    /// `ok / wall_s`.
    pub requests_per_s: f64,
    /// Request sent to first content chunk, milliseconds.
    pub ttft_ms: Summary,
    /// Gaps between content chunks per token, milliseconds.
    pub itl_ms: Summary,
    /// Request sent to end of stream, milliseconds.
    pub e2e_ms: Summary,
    /// Where the completion tokens were counted: `usage` (the server's
    /// final usage chunk), `chunks` (content chunks: the server sent no
    /// usage) or `mixed`.
    pub tokens_from: String,
    /// The server's steps during the level, from its `/metrics` (`infer
    /// serve`); `null` for servers without those counters.
    pub server_steps: Option<StepProfile>,
}

pub(super) fn summarize(
    a: &ServeBenchArgs,
    ctx: &Ctx,
    label: &str,
    words: usize,
    clients: usize,
    wall: f64,
    replies: &[Result<Reply, Failure>],
) -> LevelResult {
    let ok: Vec<&Reply> = replies.iter().filter_map(|r| r.as_ref().ok()).collect();
    let mut errors = BTreeMap::new();
    for f in replies.iter().filter_map(|r| r.as_ref().err()) {
        *errors.entry(f.kind.clone()).or_insert(0) += 1;
    }
    let completion_tokens: usize = ok.iter().map(|r| r.completion_tokens).sum();
    let prompts: Vec<f64> = ok.iter().filter_map(|r| r.prompt_tokens).map(|p| p as f64).collect();
    let n_usage = ok.iter().filter(|r| r.usage).count();
    let ms = |xs: Vec<f64>| Summary::of(&xs.into_iter().map(|x| x * 1e3).collect::<Vec<_>>());
    LevelResult {
        server: label.to_string(),
        url: ctx.base.clone(),
        endpoint: a.endpoint,
        model: ctx.model.clone(),
        clients,
        requests_per_client: a.requests_per_client,
        prompt_tokens_target: a.prompt_tokens,
        prompt_words: words,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        seed: a.seed,
        requests: replies.len(),
        ok: ok.len(),
        errors,
        short_replies: ok.iter().filter(|r| r.completion_tokens != a.max_tokens).count(),
        wall_s: wall,
        completion_tokens,
        prompt_tokens_mean: (!prompts.is_empty()).then(|| prompts.iter().sum::<f64>() / prompts.len() as f64),
        tokens_per_s: if wall > 0.0 { completion_tokens as f64 / wall } else { 0.0 },
        requests_per_s: if wall > 0.0 { ok.len() as f64 / wall } else { 0.0 },
        ttft_ms: ms(ok.iter().map(|r| r.ttft).collect()),
        itl_ms: ms(ok.iter().flat_map(|r| r.itl.iter().copied()).collect()),
        e2e_ms: ms(ok.iter().map(|r| r.e2e).collect()),
        tokens_from: match n_usage {
            0 if ok.is_empty() => "usage",
            0 => "chunks",
            n if n == ok.len() => "usage",
            _ => "mixed",
        }
        .to_string(),
        server_steps: None,
    }
}

pub(super) fn fmt_ms(x: Option<f64>) -> String {
    match x {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".to_string(),
    }
}

/// The markdown table of `-o md`, with a line of settings and notes.
pub fn markdown(results: &[LevelResult]) -> String {
    let mut s = String::new();
    let Some(r0) = results.first() else { return s };
    s.push_str(&format!(
        "server `{}`, model `{}`, /v1/{}, prompt ≈ {} tokens ({} words), {} tokens per reply, {} requests per client, temperature {}\n\n",
        r0.server,
        r0.model,
        if r0.endpoint == Endpoint::Chat { "chat/completions" } else { "completions" },
        r0.prompt_tokens_target,
        r0.prompt_words,
        r0.max_tokens,
        r0.requests_per_client,
        r0.temperature
    ));
    s.push_str("| clients | ok/requests | errors | gen tokens/s | requests/s | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | E2E p50 ms | E2E p99 ms | prompt tokens | wall s |\n");
    s.push_str("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in results {
        let errors = if r.errors.is_empty() {
            "0".to_string()
        } else {
            r.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
        };
        s.push_str(&format!(
            "| {} | {}/{} | {} | {:.1} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |\n",
            r.clients,
            r.ok,
            r.requests,
            errors,
            r.tokens_per_s,
            r.requests_per_s,
            fmt_ms(r.ttft_ms.p50),
            fmt_ms(r.ttft_ms.p90),
            fmt_ms(r.ttft_ms.p99),
            fmt_ms(r.itl_ms.p50),
            fmt_ms(r.itl_ms.p99),
            fmt_ms(r.e2e_ms.p50),
            fmt_ms(r.e2e_ms.p99),
            r.prompt_tokens_mean.map_or("-".to_string(), |p| format!("{p:.1}")),
            r.wall_s
        ));
    }
    let chunks: Vec<String> =
        results.iter().filter(|r| r.tokens_from != "usage").map(|r| r.clients.to_string()).collect();
    if !chunks.is_empty() {
        s.push_str(&format!(
            "\nThe server sent no usage chunk (clients {}): completion tokens counted from content chunks.\n",
            chunks.join(", ")
        ));
    }
    if results.iter().any(|r| r.server_steps.is_some()) {
        s.push_str("\nThe server's steps (its /metrics):\n\n| clients | steps | tokens/step | forward ms/step | rows ms/step | schedule ms/step | engine busy |\n");
        s.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for r in results {
            if let Some(p) = &r.server_steps {
                s.push_str(&format!(
                    "| {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.0}% |\n",
                    r.clients,
                    p.steps,
                    p.tokens_per_step,
                    p.forward_ms,
                    p.rows_ms,
                    p.schedule_ms,
                    p.busy_fraction * 100.0
                ));
            }
        }
    }
    let short: usize = results.iter().map(|r| r.short_replies).sum();
    if short > 0 {
        s.push_str(&format!(
            "\n{short} replies had fewer or more tokens than max_tokens (ignore_eos not honoured?).\n"
        ));
    }
    s
}
