//! `infer bench serve` against a small HTTP server in the test (std only):
//! canned SSE streams written in small pieces that split lines and UTF-8
//! characters, 503s, a stream without usage, a server that hangs, and one
//! that is not there. No model and no llama.cpp are needed.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{infer, stderr};
use serde_json::Value;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Every reply streamed whole, with a usage chunk.
    Good,
    /// Every second completion request gets a 503; no usage chunks.
    Busy,
    /// Completion requests stream one chunk and then nothing.
    Hang,
}

struct Fake {
    port: u16,
    posts: Arc<AtomicUsize>,
}

/// Serves on a free port until the test ends (the thread is left behind).
fn serve(mode: Mode) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let posts = Arc::new(AtomicUsize::new(0));
    let p = Arc::clone(&posts);
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let _ = handle(conn, mode, &p);
            });
        }
    });
    Fake { port, posts }
}

fn handle(conn: TcpStream, mode: Mode, posts: &AtomicUsize) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    if request_line.starts_with("GET /v1/models") {
        let b = r#"{"object":"list","data":[{"id":"fake-model","object":"model"}]}"#;
        write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len())?;
        return Ok(());
    }
    assert!(request_line.starts_with("POST /v1/completions"), "{request_line}");
    let req: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(req["stream"], true);
    assert_eq!(req["ignore_eos"], true);
    assert_eq!(req["stream_options"]["include_usage"], true);
    assert_eq!(req["model"], "fake-model");
    let n = req["max_tokens"].as_u64().unwrap() as usize;
    let prompt_tokens = req["prompt"].as_str().unwrap().split(' ').count();
    let k = posts.fetch_add(1, Ordering::SeqCst);
    if mode == Mode::Busy && k % 2 == 1 {
        let b = r#"{"error":{"code":503,"message":"busy","type":"unavailable_error"}}"#;
        write!(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\n\r\n{b}", b.len())?;
        return Ok(());
    }
    write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")?;
    let mut sse = String::new();
    for i in 0..n {
        // Two-byte characters, so that pieces split them.
        sse.push_str(&format!("data: {{\"choices\":[{{\"index\":0,\"text\":\" é{i}\"}}]}}\r\n\r\n"));
    }
    sse.push_str("data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n");
    if mode == Mode::Good {
        sse.push_str(&format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\n",
            prompt_tokens + n
        ));
    }
    sse.push_str(": keep-alive comment\n\ndata: [DONE]\n\n");
    let bytes = sse.as_bytes();
    if mode == Mode::Hang {
        conn.write_all(&bytes[..40])?;
        conn.flush()?;
        thread::sleep(Duration::from_secs(30));
        return Ok(());
    }
    for piece in bytes.chunks(7) {
        conn.write_all(piece)?;
        conn.flush()?;
        thread::sleep(Duration::from_micros(300));
    }
    Ok(())
}

fn url(f: &Fake) -> String {
    format!("http://127.0.0.1:{}", f.port)
}

#[test]
fn streams_are_measured_per_level() {
    let f = serve(Mode::Good);
    let o = infer(&[
        "bench",
        "serve",
        "--url",
        &url(&f),
        "--clients",
        "1,3",
        "-r",
        "2",
        "--prompt-tokens",
        "20",
        "--max-tokens",
        "6",
        "-o",
        "json",
        "--seed",
        "7",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let levels = v.as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (l, clients) in levels.iter().zip([1u64, 3]) {
        let n = clients * 2;
        assert_eq!(l["clients"], clients);
        assert_eq!(l["requests"], n);
        assert_eq!(l["ok"], n, "{l}");
        assert_eq!(l["errors"], serde_json::json!({}));
        assert_eq!(l["completion_tokens"], n * 6);
        assert_eq!(l["short_replies"], 0);
        assert_eq!(l["tokens_from"], "usage");
        assert_eq!(l["model"], "fake-model");
        assert_eq!(l["endpoint"], "completions");
        // The fake counts words as tokens: the warm-up fits the prompt exactly.
        assert_eq!(l["prompt_tokens_mean"], 20.0);
        assert_eq!(l["prompt_words"], 20);
        assert_eq!(l["ttft_ms"]["n"], n);
        assert_eq!(l["e2e_ms"]["n"], n);
        // Six content chunks per reply, five gaps.
        assert_eq!(l["itl_ms"]["n"], n * 5);
        assert!(l["tokens_per_s"].as_f64().unwrap() > 0.0);
        let (p50, p99) = (l["e2e_ms"]["p50"].as_f64().unwrap(), l["e2e_ms"]["p99"].as_f64().unwrap());
        assert!(0.0 < p50 && p50 <= p99, "{l}");
        assert!(l["ttft_ms"]["p50"].as_f64().unwrap() <= p50, "{l}");
    }
    // One warm-up request, then 2 + 6.
    assert_eq!(f.posts.load(Ordering::SeqCst), 1 + 2 + 6);
}

#[test]
fn refusals_are_counted_and_tokens_counted_from_chunks_without_usage() {
    let f = serve(Mode::Busy);
    let o = infer(&[
        "bench",
        "serve",
        "--url",
        &url(&f),
        "--clients",
        "2",
        "-r",
        "3",
        "--max-tokens",
        "4",
        "--no-warmup",
        "-o",
        "md",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| 2 | 3/6 | http_503: 3 |"), "{out}");
    assert!(out.contains("no usage chunk"), "{out}");
    assert!(stderr(&o).contains("busy"), "{}", stderr(&o));
    let o = infer(&[
        "bench",
        "serve",
        "--url",
        &url(&f),
        "--clients",
        "2",
        "-r",
        "1",
        "--max-tokens",
        "4",
        "--no-warmup",
        "-o",
        "jsonl",
    ]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let l: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(l["tokens_from"], "chunks");
    assert_eq!(l["ok"].as_u64().unwrap() + l["errors"]["http_503"].as_u64().unwrap(), 2);
    assert_eq!(l["completion_tokens"], l["ok"].as_u64().unwrap() * 4);
}

#[test]
fn a_hanging_stream_times_out() {
    let f = serve(Mode::Hang);
    let t = Instant::now();
    let o = infer(&[
        "bench",
        "serve",
        "--url",
        &url(&f),
        "--clients",
        "2",
        "-r",
        "1",
        "--no-warmup",
        "--timeout",
        "1",
        "-o",
        "jsonl",
    ]);
    assert!(t.elapsed() < Duration::from_secs(15));
    // Every request failed: the results, then an error.
    assert!(!o.status.success());
    let l: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(l["errors"]["timeout"], 2, "{l}");
    assert!(stderr(&o).contains("no request succeeded"), "{}", stderr(&o));
}

#[test]
fn an_unreachable_server_is_one_clear_error() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Instant::now();
    let o = infer(&["bench", "serve", "--url", &format!("http://127.0.0.1:{port}"), "--clients", "1"]);
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("cannot reach the server at http://127.0.0.1:"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn bench_keeps_its_own_flags_beside_the_subcommand() {
    let o = infer(&["bench", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(out.contains("serve") && out.contains("--n-prompt"), "{out}");
    let o = infer(&["bench", "-p", "8", "serve"]);
    assert!(!o.status.success());
    let o = infer(&["bench", "serve", "--url", "https://example.com"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("https is not supported"), "{}", stderr(&o));
}
