//! `infer serve` as a user starts it: llama-server's flags, `--port 0`,
//! the `listening on` line, a request over plain HTTP/1.1, and a clean
//! stop on SIGINT.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

/// Sends one HTTP/1.1 request and returns the whole response.
fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[cfg(unix)]
#[test]
fn serve_listens_on_a_free_port_answers_and_stops_on_sigint() {
    let dir = common::tmpdir();
    let model = common::synth_tiny(dir.path(), "llama");
    let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["serve", "-m", model.to_str().unwrap(), "--port", "0", "-np", "2", "-c", "256", "-b", "32", "-t", "1"])
        // A host name is resolved, as llama-server takes it.
        .args(["--host", "localhost"])
        .args(["--alias", "tiny-llama"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run infer serve");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("infer serve ended before listening: {seen}");
        }
        seen.push_str(&line);
        if let Some(url) = line.trim().strip_prefix("listening on http://") {
            break url.to_string();
        }
    };
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{addr}");
    assert!(seen.contains("2 slots x 256 positions"), "{seen}");
    let models = http(&addr, "GET", "/v1/models", "");
    assert!(models.starts_with("HTTP/1.1 200"), "{models}");
    assert!(models.contains("\"id\":\"tiny-llama\""), "{models}");
    let body = r#"{"model": "tiny-llama", "prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": true}"#;
    let reply = http(&addr, "POST", "/v1/completions", body);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"completion_tokens\":3"), "{reply}");
    // SAFETY: signals the child this test started, by its id.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
    assert!(rest.contains("shutting down"), "{rest}");
}

#[test]
fn serve_refuses_bad_sizes_before_loading() {
    let dir = common::tmpdir();
    let model = common::synth_tiny(dir.path(), "llama");
    let m = model.to_str().unwrap();
    let o = common::infer(&["serve", "-m", m, "--port", "0", "-np", "8", "-b", "4"]);
    common::assert_one_line_error(&o, "--batch-size 4 is smaller than --parallel 8");
    let o = common::infer(&["serve", "-m", m, "--port", "0", "-np", "0"]);
    common::assert_one_line_error(&o, "--parallel must be at least 1");
    // As run and chat: one position leaves no room to generate.
    let o = common::infer(&["serve", "-m", m, "--port", "0", "-c", "1"]);
    common::assert_one_line_error(&o, "-c 1: a slot of 1 position leaves no room to generate");
    let o = common::infer(&["serve", "-m", m, "--port", "0", "--host", "no-such-host.invalid"]);
    common::assert_one_line_error(&o, "cannot resolve no-such-host.invalid");
}
