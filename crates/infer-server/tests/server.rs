//! The real server on a free port, with a tiny synthetic model, through a
//! real HTTP client: both endpoints whole and streamed, concurrent greedy
//! clients equal to serial ones, every bad request, a client that goes
//! away mid-stream, the API key, prompt-cache isolation, a full queue.

mod common;

use common::{config, server, stream_text, text_of, Client};
use infer_server::ServerConfig;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

fn chat_body(user: &str, max_tokens: usize) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": user}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
    })
}

fn completion_body(prompt: Value, max_tokens: usize) -> Value {
    json!({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

/// `body` with `stream: true` and usage asked for.
fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_and_streamed_replies_agree_in_openai_shapes() {
    let srv = server(config());
    let c = Client::new(&srv);
    for (path, body) in [(CHAT, chat_body("Hello", 12)), (COMPLETIONS, completion_body(json!("Once upon"), 12))] {
        let whole = c.complete(path, &body).await;
        let text = text_of(&whole);
        assert!(!text.is_empty(), "{whole}");
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
        assert_eq!(whole["usage"]["completion_tokens"], 12);
        let n_prompt = whole["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(whole["usage"]["total_tokens"].as_u64().unwrap(), n_prompt + 12);
        assert_eq!(whole["model"], "tiny");
        let r = c.post(path, streamed(body).to_string()).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let events = r.events();
        let (s_text, finish, usage) = stream_text(&events);
        assert_eq!(s_text, text, "{path}");
        assert_eq!(finish.as_deref(), Some("length"));
        let usage = usage.expect("a usage chunk");
        assert_eq!(usage["completion_tokens"], 12);
        assert_eq!(usage["prompt_tokens"].as_u64(), Some(n_prompt));
        let first: Value = serde_json::from_str(&events[0]).unwrap();
        if path == CHAT {
            assert_eq!(first["object"], "chat.completion.chunk");
            assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        } else {
            assert_eq!(first["object"], "text_completion");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_in_openai_shapes() {
    let srv = server(config());
    let c = Client::new(&srv);
    let mut body = chat_body("Hi", 5);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let v = c.complete(CHAT, &body).await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    let joined: String = content.iter().map(|t| t["token"].as_str().unwrap()).collect();
    for t in content {
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(t["top_logprobs"].as_array().unwrap().len(), 3);
        // Greedy: the sampled token is the most likely.
        assert_eq!(t["top_logprobs"][0]["token"], t["token"]);
        assert!(t["bytes"].is_array());
    }
    // The token texts are the reply (replacement characters aside).
    if !joined.contains('\u{fffd}') {
        assert_eq!(joined, text_of(&v));
    }
    let mut body = completion_body(json!("abc"), 4);
    body["logprobs"] = json!(2);
    let v = c.complete(COMPLETIONS, &body).await;
    let lp = &v["choices"][0]["logprobs"];
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().unwrap().len(), 4, "{key}: {lp}");
    }
    assert_eq!(lp["text_offset"][0], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_greedy_clients_equal_the_same_requests_one_at_a_time() {
    // Fewer slots than clients: some wait, and join the running batch later.
    let srv = server(ServerConfig { parallel: 3, n_batch: 16, ..config() });
    let c = Client::new(&srv);
    let bodies: Vec<(&str, Value)> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                (CHAT, chat_body(&format!("Question number {i}, please answer at length."), 10 + i))
            } else {
                (COMPLETIONS, completion_body(json!(format!("The story of item {i} begins")), 10 + i))
            }
        })
        .collect();
    let mut serial = Vec::new();
    for (path, b) in &bodies {
        serial.push(text_of(&c.complete(path, b).await));
    }
    let tasks: Vec<_> = bodies
        .iter()
        .enumerate()
        .map(|(i, (path, b))| {
            let (c, path) = (c.clone(), path.to_string());
            // Half streamed, half whole.
            let b = if i % 4 < 2 { streamed(b.clone()) } else { b.clone() };
            tokio::spawn(async move {
                let r = c.post(&path, b.to_string()).await;
                assert_eq!(r.status, 200, "{}", r.text);
                if r.text.starts_with("data:") {
                    stream_text(&r.events()).0
                } else {
                    text_of(&r.json())
                }
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), serial[i], "client {i}");
    }
    c.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_naming_the_field() {
    let srv = server(ServerConfig { n_ctx: 64, max_body: 64 * 1024, ..config() });
    let c = Client::new(&srv);
    let long = "word ".repeat(200);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        (CHAT, "{\"messages\": [".into(), 400, None),
        (CHAT, "[1, 2]".into(), 400, None),
        (CHAT, json!({"messages": msgs, "temperature": "warm"}).to_string(), 400, Some("temperature")),
        (CHAT, json!({"messages": msgs, "temperature": 2.5}).to_string(), 400, Some("temperature")),
        (CHAT, json!({"messages": msgs, "model": "other"}).to_string(), 404, Some("model")),
        (CHAT, json!({"messages": msgs, "model": "/etc/passwd"}).to_string(), 404, Some("model")),
        (CHAT, json!({"messages": msgs, "max_tokens": -1}).to_string(), 400, Some("max_tokens")),
        (CHAT, json!({"messages": msgs, "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        (CHAT, json!({"messages": msgs, "max_completion_tokens": 1.5}).to_string(), 400, Some("max_completion_tokens")),
        (CHAT, json!({"messages": []}).to_string(), 400, Some("messages")),
        (CHAT, json!({"model": "tiny"}).to_string(), 400, Some("messages")),
        (CHAT, json!({"messages": [{"role": "user", "content": long}]}).to_string(), 400, Some("messages")),
        (CHAT, json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        (CHAT, json!({"messages": [{"role": "user", "content": 5}]}).to_string(), 400, Some("messages[0].content")),
        (
            CHAT,
            json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}]}).to_string(),
            400,
            Some("tools"),
        ),
        (CHAT, json!({"messages": msgs, "tool_choice": "required"}).to_string(), 400, Some("tool_choice")),
        (
            CHAT,
            json!({"messages": msgs, "response_format": {"type": "json_object"}}).to_string(),
            400,
            Some("response_format"),
        ),
        (CHAT, json!({"messages": msgs, "n": 2}).to_string(), 400, Some("n")),
        (CHAT, json!({"messages": msgs, "logit_bias": {"1": 5}}).to_string(), 400, Some("logit_bias")),
        (CHAT, json!({"messages": msgs, "top_logprobs": 2}).to_string(), 400, Some("top_logprobs")),
        (CHAT, json!({"messages": msgs, "stop": [1]}).to_string(), 400, Some("stop")),
        (CHAT, json!({"messages": msgs, "stream": "yes"}).to_string(), 400, Some("stream")),
        (COMPLETIONS, json!({"prompt": long}).to_string(), 400, Some("prompt")),
        (COMPLETIONS, json!({"prompt": [1, 2, 99999]}).to_string(), 400, Some("prompt")),
        (COMPLETIONS, json!({"prompt": ["a", "b"]}).to_string(), 400, Some("prompt")),
        (COMPLETIONS, json!({"prompt": []}).to_string(), 400, Some("prompt")),
        (COMPLETIONS, json!({"prompt": "x", "echo": true}).to_string(), 400, Some("echo")),
        (COMPLETIONS, json!({"prompt": "x", "best_of": 2}).to_string(), 400, Some("best_of")),
        (COMPLETIONS, json!({"prompt": "x", "suffix": "y"}).to_string(), 400, Some("suffix")),
        (COMPLETIONS, json!({"prompt": "x", "logprobs": 50}).to_string(), 400, Some("logprobs")),
        (COMPLETIONS, json!({"prompt": "x", "max_tokens": 5000}).to_string(), 400, Some("max_tokens")),
        ("/detokenize", json!({"tokens": [-1]}).to_string(), 400, Some("tokens")),
        ("/tokenize", json!({"content": 3}).to_string(), 400, Some("content")),
    ];
    for (path, body, status, param) in cases {
        let r = c.post(path, body.clone()).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.text);
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", r.text);
        assert_eq!(e["type"], "invalid_request_error", "{}", r.text);
        assert_eq!(e["param"].as_str(), param, "{path} {body}: {}", r.text);
    }
    let r = c.post(COMPLETIONS, json!({"prompt": "x", "model": "nope"}).to_string()).await;
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = c.post(COMPLETIONS, json!({"prompt": "x ".repeat(100)}).to_string()).await;
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // Past a slot's context, found before all of it is tokenized: a
    // completion's string (within and past the byte limit of the context)
    // and a chat's rendered messages.
    for prompt in ["x ".repeat(2000), "x".repeat(20_000)] {
        let r = c.post(COMPLETIONS, json!({"prompt": prompt}).to_string()).await;
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str()),
            (400, Some("context_length_exceeded")),
            "{}",
            r.text
        );
        assert_eq!(r.json()["error"]["param"], "prompt", "{}", r.text);
        let r = c.post(CHAT, chat_body(&prompt, 4).to_string()).await;
        assert_eq!(
            (r.status, r.json()["error"]["code"].as_str()),
            (400, Some("context_length_exceeded")),
            "{}",
            r.text
        );
        assert_eq!(r.json()["error"]["param"], "messages", "{}", r.text);
    }
    // Past the body limit: 413, still in OpenAI's shape.
    let r = c.post(COMPLETIONS, json!({"prompt": "x".repeat(100_000)}).to_string()).await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert!(r.json()["error"]["message"].is_string());
    let r = c.get("/v1/nothing").await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (404, Some("unknown_url")));
    // A known route with another method: 405, in OpenAI's shape too.
    let r = c.get(COMPLETIONS).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (405, Some("method_not_allowed")), "{}", r.text);
    // The server still answers.
    let v = c.complete(COMPLETIONS, &completion_body(json!("still there?"), 3)).await;
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_frees_its_slot() {
    let srv = server(ServerConfig { parallel: 1, n_ctx: 4096, ..config() });
    let c = Client::new(&srv);
    let body = streamed(completion_body(json!("Tell me everything"), 4000));
    let mut resp = c.http.post(format!("{}{COMPLETIONS}", c.base)).body(body.to_string()).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"data: "), "{first:?}");
    assert_eq!(c.busy_slots().await, 1);
    drop(resp);
    c.wait_idle().await;
    assert!(srv.metrics().cancelled.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // Its slot serves the next client.
    let v = c.complete(COMPLETIONS, &completion_body(json!("next"), 4)).await;
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // A client of a whole (non-streamed) reply that gives up waiting.
    let long = completion_body(json!("Tell me more"), 4000);
    let url = format!("{}{COMPLETIONS}", c.base);
    let gave_up = c.http.post(url).body(long.to_string()).timeout(std::time::Duration::from_millis(200)).send().await;
    assert!(gave_up.is_err(), "the reply came within 200 ms");
    c.wait_idle().await;
    assert!(srv.metrics().cancelled.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_every_route_but_health() {
    let srv = server(ServerConfig { api_key: Some("s3cret".into()), ..config() });
    let mut c = Client::new(&srv);
    for key in [None, Some("wrong"), Some("s3cre"), Some("s3cret2")] {
        c.key = key.map(str::to_string);
        for path in ["/v1/models", "/metrics"] {
            let r = c.get(path).await;
            assert_eq!(r.status, 401, "{path} {key:?}");
            assert_eq!(r.json()["error"]["type"], "authentication_error");
        }
        for path in [CHAT, COMPLETIONS, "/tokenize"] {
            assert_eq!(c.post(path, "{}").await.status, 401, "{path} {key:?}");
        }
        assert_eq!(c.get("/health").await.status, 200);
    }
    c.key = Some("s3cret".into());
    assert_eq!(c.get("/v1/models").await.json()["data"][0]["id"], "tiny");
    assert_eq!(c.complete(COMPLETIONS, &completion_body(json!("hi"), 2)).await["usage"]["completion_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_cache_reuses_only_an_exact_token_prefix() {
    let shared: Vec<u32> = (100..140).collect();
    let a: Vec<u32> = shared.iter().copied().chain([7, 8, 9, 10]).collect();
    let b: Vec<u32> = shared.iter().copied().chain([20, 21, 22]).collect();
    let mut c_prompt = a.clone();
    c_prompt[0] = 99;
    let prompts = [a.clone(), b, c_prompt, a];
    // Cold: each prompt on a fresh server.
    let mut cold = Vec::new();
    for p in &prompts {
        let srv = server(ServerConfig { parallel: 1, ..config() });
        let c = Client::new(&srv);
        let v = c.complete(COMPLETIONS, &completion_body(json!(p), 16)).await;
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        cold.push(text_of(&v));
    }
    // Warm: one slot, so each request finds the previous one's cache.
    let srv = server(ServerConfig { parallel: 1, ..config() });
    let c = Client::new(&srv);
    let mut cached = Vec::new();
    for (p, want) in prompts.iter().zip(&cold) {
        let v = c.complete(COMPLETIONS, &completion_body(json!(p), 16)).await;
        assert_eq!(&text_of(&v), want, "prompt {p:?}");
        cached.push(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap());
    }
    // b shares 40 tokens with a; c differs in its first token; a again
    // finds c's cache, which differs in the first token too.
    assert_eq!(cached, [0, 40, 0, 0]);
    // Twice the same prompt: all but its last token reused.
    let v = c.complete(COMPLETIONS, &completion_body(json!(prompts[0]), 16)).await;
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 43);
    assert_eq!(text_of(&v), cold[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_split_across_tokens_is_never_streamed_in_part() {
    let srv = server(config());
    let c = Client::new(&srv);
    let mut body = completion_body(json!("The stop test"), 16);
    body["logprobs"] = json!(0);
    let v = c.complete(COMPLETIONS, &body).await;
    let tokens: Vec<String> =
        v["choices"][0]["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().into()).collect();
    let full = text_of(&v);
    // A stop string made of the end of one token and the start of the next.
    let i = (2..tokens.len() - 1)
        .find(|&i| {
            let (a, b) = (&tokens[i], &tokens[i + 1]);
            a.is_ascii() && b.is_ascii() && !a.is_empty() && !b.is_empty()
        })
        .expect("two ASCII tokens in a row");
    let stop = format!("{}{}", tokens[i].chars().last().unwrap(), tokens[i + 1].chars().next().unwrap());
    let cut = full.find(&stop).unwrap();
    let mut body = streamed(completion_body(json!("The stop test"), 16));
    body["stop"] = json!(stop);
    let (text, finish, _) = stream_text(&c.post(COMPLETIONS, body.to_string()).await.events());
    assert_eq!(text, full[..cut], "stop {stop:?} in {full:?}");
    assert_eq!(finish.as_deref(), Some("stop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_gets_503_and_the_server_answers_afterwards() {
    let srv = server(ServerConfig { parallel: 1, max_queue: 16, ..config() });
    let c = Client::new(&srv);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let r = c.post(COMPLETIONS, completion_body(json!(format!("request {i}")), 24).to_string()).await;
                if r.status == 503 {
                    assert_eq!(r.json()["error"]["code"], "queue_full");
                } else {
                    assert_eq!(r.status, 200, "{}", r.text);
                    assert_eq!(r.json()["usage"]["completion_tokens"], 24);
                }
                r.status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let busy = statuses.iter().filter(|&&s| s == 503).count();
    assert!(busy > 0, "no request was refused");
    assert!(busy < 200, "every request was refused");
    let v = c.complete(CHAT, &chat_body("after the storm", 3)).await;
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let m = c.get("/metrics").await.text;
    assert!(m.contains(&format!("infer_requests_rejected_total {busy}\n")), "{m}");
    assert!(m.contains("infer_queue_length 0\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_tokenize_and_metrics() {
    let srv = server(config());
    let c = Client::new(&srv);
    let m = c.get("/v1/models").await.json();
    assert_eq!((m["object"].as_str(), m["data"][0]["id"].as_str()), (Some("list"), Some("tiny")));
    let h = c.get("/health").await.json();
    assert_eq!((h["status"].as_str(), h["slots_idle"].as_u64()), (Some("ok"), Some(2)));
    let t = c.post("/tokenize", json!({"content": "hello world"}).to_string()).await.json();
    let ids = t["tokens"].clone();
    assert!(!ids.as_array().unwrap().is_empty());
    let d = c.post("/detokenize", json!({"tokens": ids}).to_string()).await.json();
    assert_eq!(d["content"], "hello world");
    c.complete(CHAT, &chat_body("x", 2)).await;
    let text = c.get("/metrics").await.text;
    for name in [
        "infer_requests_total 1",
        "infer_generated_tokens_total 2",
        "infer_time_to_first_token_seconds_count 1",
        "infer_batch_tokens_count",
        "infer_slots_total 2",
    ] {
        assert!(text.contains(name), "{name}: {text}");
    }
}

#[test]
fn half_sent_and_oversized_requests_are_dropped_and_do_not_hold_up_shutdown() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let cfg = ServerConfig { header_timeout: Duration::from_millis(500), ..common::config() };
    let server = common::server(cfg);
    let addr = server.local_addr();
    let partial = |s: &mut std::net::TcpStream| {
        s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n").unwrap();
    };
    // The connection is closed once the header deadline passes.
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    partial(&mut slow);
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(t.elapsed() < Duration::from_secs(5), "the half-sent request was held {:?}", t.elapsed());
    // A declared body past the limit is refused at once, not waited for.
    let mut huge = std::net::TcpStream::connect(addr).unwrap();
    huge.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n{}").unwrap();
    huge.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut head = [0u8; 12];
    huge.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 413", "{:?}", String::from_utf8_lossy(&head));
    assert!(t.elapsed() < Duration::from_secs(5), "the 413 took {:?}", t.elapsed());
    // A shutdown with another one open ends within the deadline too.
    let mut other = std::net::TcpStream::connect(addr).unwrap();
    partial(&mut other);
    let t = Instant::now();
    server.shutdown().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "shutdown waited {:?}", t.elapsed());
}
