//! A local HTTP server that serves GGUF files the way the Hugging Face hub
//! does, for the tests of `infer pull` and `-hf`: the tree listing of
//! `/api/models/{repo}/tree/main`, `/{repo}/resolve/main/{file}` redirected
//! (302) to `/cdn/{repo}/{file}`, which honours `Range: bytes=N-` with a
//! 206. Each file can lie about its SHA-256 or drop the connection halfway
//! through its first download; every request is logged.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// How a file misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Served as listed.
    None,
    /// The listing gives another file's SHA-256.
    WrongSha,
    /// The first download sends half the bytes, then closes the connection.
    DropOnce,
    /// Every download sends its bytes in 16 parts 50 ms apart.
    Slow,
}

/// One file of a repository.
#[derive(Clone)]
pub struct ServedFile {
    pub bytes: Arc<Vec<u8>>,
    pub fault: Fault,
}

/// A request as the server saw it: its path and its `Range` header.
#[derive(Clone, Debug)]
pub struct Logged {
    pub path: String,
    pub range: Option<String>,
}

#[derive(Default)]
struct State {
    /// repo -> file path -> file.
    repos: HashMap<String, HashMap<String, ServedFile>>,
    log: Vec<Logged>,
    /// Files whose one dropped download has happened.
    dropped: Vec<String>,
}

/// The running server (stopped with the test process; each test makes its
/// own).
pub struct HubServer {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl HubServer {
    /// A server on a free loopback port.
    pub fn start() -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let s = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &s);
                });
            }
        });
        HubServer { url, state }
    }

    /// Adds `file` with `bytes` to `repo`.
    pub fn add(&self, repo: &str, file: &str, bytes: Arc<Vec<u8>>, fault: Fault) {
        let mut st = self.state.lock().unwrap();
        st.repos.entry(repo.to_string()).or_default().insert(file.to_string(), ServedFile { bytes, fault });
    }

    /// The requests so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }
}

/// SHA-256 in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

fn serve(mut stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let target = first.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    state.lock().unwrap().log.push(Logged { path: path.clone(), range: range.clone() });

    if let Some(rest) = path.strip_prefix("/api/models/") {
        let repo = rest.strip_suffix("/tree/main").unwrap_or("");
        let listing = {
            let st = state.lock().unwrap();
            st.repos.get(repo).map(|files| {
                let entries: Vec<serde_json::Value> = files
                    .iter()
                    .map(|(name, f)| {
                        let sha =
                            if f.fault == Fault::WrongSha { sha256_hex(b"another file") } else { sha256_hex(&f.bytes) };
                        serde_json::json!({
                            "type": "file", "oid": "0123456789abcdef0123456789abcdef01234567", "size": f.bytes.len(),
                            "path": name, "lfs": {"oid": sha, "size": f.bytes.len(), "pointerSize": 134}
                        })
                    })
                    .chain([serde_json::json!({"type": "file", "oid": "1", "size": 10, "path": "README.md"})])
                    .collect();
                serde_json::to_vec(&entries).unwrap()
            })
        };
        return match listing {
            Some(body) => respond(&mut stream, "200 OK", &[("Content-Type", "application/json".into())], &body),
            None => respond(&mut stream, "404 Not Found", &[], br#"{"error":"Repository not found"}"#),
        };
    }
    if let Some(rest) = path.strip_prefix('/') {
        if let Some((repo, file)) = rest.split_once("/resolve/main/") {
            let known = state.lock().unwrap().repos.get(repo).is_some_and(|r| r.contains_key(file));
            if !known {
                return respond(&mut stream, "404 Not Found", &[], b"Entry not found");
            }
            return respond(&mut stream, "302 Found", &[("Location", format!("/cdn/{repo}/{file}"))], b"");
        }
    }
    if let Some(rest) = path.strip_prefix("/cdn/") {
        let mut parts = rest.splitn(3, '/');
        let (owner, name, file) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let repo = format!("{owner}/{name}");
        let served = state.lock().unwrap().repos.get(&repo).and_then(|r| r.get(file).cloned());
        let Some(f) = served else { return respond(&mut stream, "404 Not Found", &[], b"") };
        let start: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let body = &f.bytes[start.min(f.bytes.len())..];
        let (status, headers) = if range.is_some() {
            (
                "206 Partial Content",
                vec![("Content-Range", format!("bytes {start}-{}/{}", f.bytes.len() - 1, f.bytes.len()))],
            )
        } else {
            ("200 OK", vec![])
        };
        let drop_now = f.fault == Fault::DropOnce && {
            let mut st = state.lock().unwrap();
            let key = format!("{repo}/{file}");
            let first = !st.dropped.contains(&key);
            if first {
                st.dropped.push(key);
            }
            first
        };
        if drop_now {
            // The whole length announced, half of it sent, then closed.
            let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
            for (k, v) in &headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes())?;
            stream.write_all(&body[..body.len() / 2])?;
            stream.flush()?;
            return stream.shutdown(std::net::Shutdown::Both);
        }
        if f.fault == Fault::Slow {
            let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
            for (k, v) in &headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes())?;
            for part in body.chunks(body.len().div_ceil(16).max(1)) {
                stream.write_all(part)?;
                stream.flush()?;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            return Ok(());
        }
        return respond(&mut stream, status, &headers, body);
    }
    respond(&mut stream, "404 Not Found", &[], b"")
}
