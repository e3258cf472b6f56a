//! `infer pull`, `-hf`, `infer models` and `infer rm` against a local server
//! that serves a tiny GGUF the way the Hugging Face hub does (the hub
//! itself cannot be reached from the test machines): the file listing, the
//! quantization picked by name, redirected and ranged downloads, a dropped
//! connection resumed, a wrong checksum and a 404.

mod common;
#[path = "common/hub_server.rs"]
mod hub_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use common::{assert_one_line_error, stderr, stdout, synth_tiny, tmpdir};
use hub_server::{sha256_hex, Fault, HubServer};

/// `infer ARGS` with its cache in `cache` and the hub at `endpoint`.
fn hub_command(cache: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infer"));
    cmd.args(args)
        .env("INFER_CACHE_DIR", cache)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .env_remove("INFER_MODEL")
        .stdin(Stdio::null());
    cmd
}

/// Runs `infer` with its cache in `cache` and the hub at `endpoint`.
fn infer_hub(cache: &Path, endpoint: &str, args: &[&str]) -> Output {
    hub_command(cache, endpoint, args).output().expect("run infer")
}

/// A tiny real model (Llama architecture, random weights), as bytes.
fn tiny_gguf() -> Arc<Vec<u8>> {
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "llama");
    Arc::new(std::fs::read(path).expect("read the tiny model"))
}

/// Where `infer pull` puts `file` of `repo` in `cache`.
fn cached(cache: &Path, repo: &str, file: &str) -> PathBuf {
    cache.join("hf").join(repo).join(file)
}

#[test]
fn pull_picks_q4_k_m_follows_the_redirect_and_checks_the_file() {
    let gguf = tiny_gguf();
    let hub = HubServer::start();
    hub.add("owner/tiny-GGUF", "tiny-Q4_K_M.gguf", gguf.clone(), Fault::None);
    hub.add("owner/tiny-GGUF", "tiny-Q8_0.gguf", Arc::new(b"GGUF other".to_vec()), Fault::None);
    hub.add("owner/tiny-GGUF", "mmproj-tiny-Q4_K_M.gguf", Arc::new(b"GGUF projector".to_vec()), Fault::None);
    let cache = tmpdir();
    let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/tiny-GGUF"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = cached(cache.path(), "owner/tiny-GGUF", "tiny-Q4_K_M.gguf");
    assert_eq!(stdout(&o).trim(), path.display().to_string());
    assert!(stderr(&o).contains("download:") && stderr(&o).contains("sha256 checked"), "{}", stderr(&o));
    assert_eq!(sha256_hex(&std::fs::read(&path).unwrap()), sha256_hex(&gguf));
    let paths: Vec<String> = hub.log().into_iter().map(|l| l.path).collect();
    assert!(paths.contains(&"/api/models/owner/tiny-GGUF/tree/main".to_string()), "{paths:?}");
    assert!(paths.contains(&"/owner/tiny-GGUF/resolve/main/tiny-Q4_K_M.gguf".to_string()), "{paths:?}");
    assert!(paths.contains(&"/cdn/owner/tiny-GGUF/tiny-Q4_K_M.gguf".to_string()), "{paths:?}");
    assert!(!paths.iter().any(|p| p.contains("Q8_0") || p.contains("mmproj")), "{paths:?}");

    // Cached: `-hf` runs it without asking the hub (here: a closed port).
    let offline = "http://127.0.0.1:9";
    let o = infer_hub(
        cache.path(),
        offline,
        &["run", "-hf", "owner/tiny-GGUF:q4_k_m", "-n", "3", "--temp", "0", "--ignore-eos", "-p", "Hi"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("decode:   3 tokens"), "{}", stderr(&o));
    // So does -m with the same reference, and `infer models` lists it.
    let o = infer_hub(cache.path(), offline, &["info", "-m", "owner/tiny-GGUF"]);
    assert!(o.status.success() && stdout(&o).contains("llama"), "{}", stderr(&o));
    // $INFER_MODEL, the default of -m, takes the same reference.
    let o = hub_command(cache.path(), offline, &["info"])
        .env("INFER_MODEL", "hf.co/owner/tiny-GGUF")
        .output()
        .expect("run infer");
    assert!(o.status.success() && stdout(&o).contains("llama"), "{}", stderr(&o));
    let o = infer_hub(cache.path(), offline, &["models"]);
    assert!(stdout(&o).contains("owner/tiny-GGUF  tiny-Q4_K_M.gguf"), "{}", stdout(&o));

    // Another quantization is fetched by name; `rm` removes one, then all.
    let o = infer_hub(cache.path(), &hub.url, &["pull", "hf.co/owner/tiny-GGUF:Q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = infer_hub(cache.path(), offline, &["rm", "owner/tiny-GGUF:Q4_K_M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!path.exists() && cached(cache.path(), "owner/tiny-GGUF", "tiny-Q8_0.gguf").exists());
    let o = infer_hub(cache.path(), offline, &["rm", "owner/tiny-GGUF:Q4_K_M"]);
    assert_one_line_error(&o, "owner/tiny-GGUF has no cached Q4_K_M file");
    // Without a quantization the reference means Q4_K_M, cached or not: the
    // Q8_0 that alone is cached is not taken for it (the hub is asked).
    let o = infer_hub(cache.path(), offline, &["pull", "owner/tiny-GGUF"]);
    assert_one_line_error(&o, "127.0.0.1:9");
    let o = infer_hub(cache.path(), offline, &["rm", "owner/tiny-GGUF"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = infer_hub(cache.path(), offline, &["models"]);
    assert!(!stdout(&o).contains("owner/tiny-GGUF"), "{}", stdout(&o));
    let o = infer_hub(cache.path(), offline, &["rm", "owner/tiny-GGUF"]);
    assert_one_line_error(&o, "is not in the cache");
}

#[test]
fn a_partial_file_and_a_dropped_connection_are_resumed_with_ranges() {
    let gguf = Arc::new((0..300_000u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>());
    let hub = HubServer::start();
    hub.add("owner/big", "big-Q4_K_M.gguf", gguf.clone(), Fault::DropOnce);
    hub.add("owner/part", "part-Q4_K_M.gguf", gguf.clone(), Fault::None);
    let cache = tmpdir();

    // The connection drops halfway: the download goes on from there.
    let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/big"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = cached(cache.path(), "owner/big", "big-Q4_K_M.gguf");
    assert_eq!(std::fs::read(&path).unwrap(), *gguf);
    let cdn: Vec<Option<String>> =
        hub.log().into_iter().filter(|l| l.path.starts_with("/cdn/owner/big/")).map(|l| l.range).collect();
    assert_eq!(cdn, [None, Some(format!("bytes={}-", gguf.len() / 2))], "the second request resumes at the half");

    // A partial file left by an earlier run is continued, not started over.
    let dest = cached(cache.path(), "owner/part", "part-Q4_K_M.gguf");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(format!("{}.partial", dest.display()), &gguf[..100_000]).unwrap();
    let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/part:Q4_K_M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed at 0.1 MB"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&dest).unwrap(), *gguf);
    let ranges: Vec<Option<String>> =
        hub.log().into_iter().filter(|l| l.path.starts_with("/cdn/owner/part/")).map(|l| l.range).collect();
    assert_eq!(ranges, [Some("bytes=100000-".to_string())]);
}

/// Processes pulling the same file at once wait for the one that
/// downloads it (they had resumed each other's `.partial` file and failed
/// on a file renamed under them).
#[test]
fn concurrent_pulls_of_one_file_download_it_once() {
    let gguf = tiny_gguf();
    let hub = HubServer::start();
    hub.add("owner/slow", "slow-Q4_K_M.gguf", gguf.clone(), Fault::Slow);
    let cache = tmpdir();
    let pulls: Vec<std::process::Child> = (0..3)
        .map(|_| {
            hub_command(cache.path(), &hub.url, &["pull", "owner/slow"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start infer")
        })
        .collect();
    let path = cached(cache.path(), "owner/slow", "slow-Q4_K_M.gguf");
    for p in pulls {
        let o = p.wait_with_output().expect("wait for infer");
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o).trim(), path.display().to_string());
    }
    assert_eq!(sha256_hex(&std::fs::read(&path).unwrap()), sha256_hex(&gguf));
    let downloads = hub.log().into_iter().filter(|l| l.path.starts_with("/cdn/")).count();
    assert_eq!(downloads, 1, "{:?}", hub.log());
}

#[test]
fn a_wrong_checksum_a_missing_repository_and_a_missing_quantization_are_one_line_errors() {
    let hub = HubServer::start();
    hub.add("owner/liar", "liar-Q4_K_M.gguf", Arc::new(b"GGUF not what the listing says".to_vec()), Fault::WrongSha);
    hub.add("owner/q8", "q8-Q8_0.gguf", Arc::new(b"GGUF".to_vec()), Fault::None);
    hub.add("owner/q8", "q8-Q6_K.gguf", Arc::new(b"GGUF".to_vec()), Fault::None);
    let cache = tmpdir();

    let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/liar"]);
    assert_one_line_error(&o, "is not the one the hub lists");
    let dest = cached(cache.path(), "owner/liar", "liar-Q4_K_M.gguf");
    assert!(!dest.exists() && !Path::new(&format!("{}.partial", dest.display())).exists(), "the bad file stays");

    let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/nothing"]);
    assert_one_line_error(&o, "not found (404)");
    let o = infer_hub(cache.path(), &hub.url, &["run", "-hf", "owner/q8", "-p", "x"]);
    assert_one_line_error(&o, "no GGUF file of quantization Q4_K_M");
    // -m names a file first: one that does not exist is then asked of the hub.
    let o = infer_hub(cache.path(), &hub.url, &["info", "-m", "owner/nothing"]);
    assert_one_line_error(&o, "no model file owner/nothing; as a Hugging Face model: ");
    let o = infer_hub(cache.path(), &hub.url, &["pull", "not a repo"]);
    assert_one_line_error(&o, "is not a Hugging Face model");
    // Nothing listens there: the error names the address.
    let o = infer_hub(cache.path(), "http://127.0.0.1:9", &["pull", "owner/q8:Q8_0"]);
    assert_one_line_error(&o, "127.0.0.1:9");
}

#[test]
fn model_references_with_a_hub_prefix_and_hf_file_pick_files() {
    let gguf = tiny_gguf();
    let hub = HubServer::start();
    hub.add("owner/tiny-GGUF", "tiny-Q4_K_M.gguf", gguf.clone(), Fault::None);
    hub.add("owner/two", "two-Q4_K_M.gguf", Arc::new(b"GGUF not this one".to_vec()), Fault::None);
    hub.add("owner/two", "two-v2-Q4_K_M.gguf", gguf.clone(), Fault::None);

    // -m takes the prefixes `pull` takes (the prefix is not a folder).
    for m in
        ["hf.co/owner/tiny-GGUF", "huggingface.co/owner/tiny-GGUF:Q4_K_M", "https://huggingface.co/owner/tiny-GGUF"]
    {
        let cache = tmpdir();
        let o = infer_hub(cache.path(), &hub.url, &["info", "-m", m]);
        assert!(o.status.success() && stdout(&o).contains("llama"), "{m}: {}", stderr(&o));
        assert!(cached(cache.path(), "owner/tiny-GGUF", "tiny-Q4_K_M.gguf").exists(), "{m}");
    }

    // Two files of one quantization: the error says -hff, which picks one.
    let cache = tmpdir();
    let o = infer_hub(cache.path(), &hub.url, &["run", "-hf", "owner/two", "-p", "x"]);
    assert_one_line_error(
        &o,
        "more than one file is Q4_K_M (two-Q4_K_M.gguf, two-v2-Q4_K_M.gguf); name the one you want with -hff NAME",
    );
    let run = ["run", "-hf", "owner/two", "-hff", "two-v2-Q4_K_M.gguf", "-n", "2", "--ignore-eos", "-p", "x"];
    let o = infer_hub(cache.path(), &hub.url, &run);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(cached(cache.path(), "owner/two", "two-v2-Q4_K_M.gguf").exists());
    assert!(!cached(cache.path(), "owner/two", "two-Q4_K_M.gguf").exists());
    // Cached: taken without the hub; also with -m USER/REPO, and by `pull`.
    let offline = "http://127.0.0.1:9";
    let o = infer_hub(cache.path(), offline, &run);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = infer_hub(cache.path(), offline, &["info", "-m", "owner/two", "--hf-file", "two-v2-Q4_K_M.gguf"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = infer_hub(cache.path(), offline, &["pull", "owner/two", "-hff", "two-v2-Q4_K_M.gguf"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), cached(cache.path(), "owner/two", "two-v2-Q4_K_M.gguf").display().to_string());
    // A file the repository does not have is named, with the ones it has.
    let o = infer_hub(cache.path(), &hub.url, &["run", "-hf", "owner/two", "-hff", "three.gguf", "-p", "x"]);
    assert_one_line_error(&o, "owner/two has no file three.gguf (its GGUF files: two-Q4_K_M.gguf, two-v2-Q4_K_M.gguf)");
    // A file that is not a GGUF, small (README.md, not in the listing of
    // large files) or large (LFS), is said to be one, never downloaded.
    hub.add("owner/two", "model.safetensors", Arc::new(b"not a model infer loads".to_vec()), Fault::None);
    for file in ["README.md", "model.safetensors"] {
        let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/two", "-hff", file]);
        assert_one_line_error(
            &o,
            &format!(
                "owner/two: {file} is not a GGUF file, which infer loads (its GGUF files: two-Q4_K_M.gguf, \
                 two-v2-Q4_K_M.gguf)"
            ),
        );
    }
    assert!(!hub.log().iter().any(|l| l.path.contains("safetensors") || l.path.contains("README")), "{:?}", hub.log());
}

/// An incomplete download (`.partial`) in the cache is listed by `infer
/// models` with its size, and removed by `infer rm` with its `.lock`
/// file, unless a running download holds the lock: then nothing is
/// removed and one line says why.
#[test]
fn partial_downloads_are_listed_and_removed_unless_a_download_holds_them() {
    let cache = tmpdir();
    let offline = "http://127.0.0.1:9";
    let dest = cached(cache.path(), "owner/part", "part-Q4_K_M.gguf");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let partial = PathBuf::from(format!("{}.partial", dest.display()));
    let lock = PathBuf::from(format!("{}.lock", dest.display()));
    std::fs::write(&partial, vec![7u8; 200_000]).unwrap();
    let o = infer_hub(cache.path(), offline, &["models"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let row = stdout(&o).lines().find(|l| l.contains("owner/part")).map(str::to_string);
    let row = row.unwrap_or_else(|| panic!("no row for the partial download: {}", stdout(&o)));
    assert!(row.contains("part-Q4_K_M.gguf") && row.contains("0.2 MB"), "{row}");
    assert!(row.contains("(partial: an incomplete download") && row.contains(&partial.display().to_string()), "{row}");

    // A download in progress holds the lock: `rm` keeps everything.
    let held = std::fs::File::create(&lock).unwrap();
    held.lock().unwrap();
    let o = infer_hub(cache.path(), offline, &["rm", "owner/part"]);
    assert_one_line_error(&o, &format!("{} is being downloaded by another process", dest.display()));
    assert!(partial.exists() && lock.exists());
    drop(held);
    let o = infer_hub(cache.path(), offline, &["rm", "owner/part:Q4_K_M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("removed {}", partial.display())), "{}", stderr(&o));
    assert!(!partial.exists() && !lock.exists());
    let o = infer_hub(cache.path(), offline, &["models"]);
    assert!(!stdout(&o).contains("owner/part"), "{}", stdout(&o));
}

/// `-hf` on `bench`, `perplexity` and `serve`: the file is fetched from the
/// hub and the command runs on it.
#[test]
fn hf_runs_bench_perplexity_and_serve() {
    let hub = HubServer::start();
    hub.add("owner/tiny-GGUF", "tiny-Q4_K_M.gguf", tiny_gguf(), Fault::None);
    let cache = tmpdir();
    let path = cached(cache.path(), "owner/tiny-GGUF", "tiny-Q4_K_M.gguf");

    let o = infer_hub(
        cache.path(),
        &hub.url,
        &["bench", "-hf", "owner/tiny-GGUF", "-p", "4", "-n", "2", "-r", "1", "-t", "1", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(rows[0]["model_filename"], path.display().to_string());
    assert_eq!(rows.as_array().unwrap().len(), 2);

    let text = cache.path().join("text.txt");
    std::fs::write(&text, "the quick brown fox jumps over the lazy dog ".repeat(20)).unwrap();
    let hf = ["perplexity", "-hf", "owner/tiny-GGUF", "-c", "16", "--chunks", "2", "-t", "1", "-f"];
    let o = infer_hub(cache.path(), &hub.url, &[&hf[..], &[text.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Final estimate: PPL = "), "{}", stdout(&o));

    // A fresh cache: serve fetches the file, then answers /health.
    let cache = tmpdir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["serve", "-hf", "owner/tiny-GGUF", "--port", "0", "-c", "64", "-t", "1"])
        .env("INFER_CACHE_DIR", cache.path())
        .env("HF_ENDPOINT", &hub.url)
        .env_remove("HF_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run infer serve");
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut err, &mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("infer serve ended before listening: {seen}");
        }
        seen.push_str(&line);
        if let Some(url) = line.trim().strip_prefix("listening on http://") {
            break url.to_string();
        }
    };
    let health = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        write!(s, "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let served = cached(cache.path(), "owner/tiny-GGUF", "tiny-Q4_K_M.gguf");
    assert!(seen.contains(&served.display().to_string()), "{seen}");
}

/// Symbolic links in the cache are never followed: a repository folder
/// that links elsewhere is neither listed by `infer models` nor emptied by
/// `infer rm` (which removes the link alone), and a `.partial` file that
/// links to another file is not written through (the link goes, the
/// download starts afresh).
#[cfg(unix)]
#[test]
fn links_in_the_cache_are_not_followed() {
    use std::os::unix::fs::symlink;
    let cache = tmpdir();
    let offline = "http://127.0.0.1:9";
    let victim = tmpdir();
    let kept = victim.path().join("sub").join("mine-Q4_K_M.gguf");
    std::fs::create_dir_all(kept.parent().unwrap()).unwrap();
    std::fs::write(&kept, b"GGUF mine").unwrap();
    std::fs::write(victim.path().join("top.gguf"), b"GGUF top").unwrap();
    let owner = cache.path().join("hf").join("c");
    std::fs::create_dir_all(&owner).unwrap();
    symlink(victim.path(), owner.join("victim")).unwrap();
    symlink(victim.path(), cache.path().join("hf").join("linked")).unwrap();

    let o = infer_hub(cache.path(), offline, &["models"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("mine-Q4_K_M") && !stdout(&o).contains("top.gguf"), "{}", stdout(&o));
    let o = infer_hub(cache.path(), offline, &["rm", "c/victim"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(kept.exists() && victim.path().join("top.gguf").exists(), "rm removed files outside the cache");
    assert!(std::fs::symlink_metadata(owner.join("victim")).is_err(), "the link stays");
    let o = infer_hub(cache.path(), offline, &["rm", "linked/sub"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(kept.exists(), "rm removed files outside the cache");

    // A `.partial` linking to a file outside the cache.
    let gguf = tiny_gguf();
    let hub = HubServer::start();
    hub.add("good/repo-GGUF", "repo-Q4_K_M.gguf", gguf.clone(), Fault::None);
    let target = victim.path().join("victim.txt");
    std::fs::write(&target, b"precious").unwrap();
    let dest = cached(cache.path(), "good/repo-GGUF", "repo-Q4_K_M.gguf");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    symlink(&target, format!("{}.partial", dest.display())).unwrap();
    let o = infer_hub(cache.path(), &hub.url, &["pull", "good/repo-GGUF"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&target).unwrap(), b"precious", "the download wrote through the link");
    assert_eq!(std::fs::read(&dest).unwrap(), *gguf);
    // A `.partial` that is a folder: one line, nothing removed.
    hub.add("good/dir-GGUF", "dir-Q4_K_M.gguf", gguf, Fault::None);
    let dest = cached(cache.path(), "good/dir-GGUF", "dir-Q4_K_M.gguf");
    let partial = PathBuf::from(format!("{}.partial", dest.display()));
    std::fs::create_dir_all(&partial).unwrap();
    let o = infer_hub(cache.path(), &hub.url, &["pull", "good/dir-GGUF"]);
    assert_one_line_error(&o, "is not a regular file");
    assert!(partial.is_dir());
}

/// A listed file of no bytes is downloaded as one (nothing is asked of the
/// server), then refused by the loader as too short to be a model.
#[test]
fn a_zero_byte_file_is_fetched_without_a_missing_partial_error() {
    let hub = HubServer::start();
    hub.add("owner/empty", "empty-Q4_K_M.gguf", Arc::new(Vec::new()), Fault::None);
    let cache = tmpdir();
    let o = infer_hub(cache.path(), &hub.url, &["pull", "owner/empty"]);
    assert!(!stderr(&o).contains(".partial"), "{}", stderr(&o));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(cached(cache.path(), "owner/empty", "empty-Q4_K_M.gguf")).unwrap(), b"");
}

/// `-hff ''` says the name is empty; a finished pull leaves no `.lock`
/// file; a GGUF placed in the cache by hand (no sidecar) is named in the
/// error when the hub cannot be reached to check it.
#[test]
fn an_empty_hf_file_no_lock_left_and_an_unverified_cached_file_named_offline() {
    let hub = HubServer::start();
    hub.add("good/repo-GGUF", "repo-Q4_K_M.gguf", tiny_gguf(), Fault::None);
    let cache = tmpdir();
    let o = infer_hub(cache.path(), &hub.url, &["pull", "good/repo-GGUF", "-hff", ""]);
    assert_one_line_error(&o, "the file name given with -hff/--hf-file is empty");
    let o = infer_hub(cache.path(), &hub.url, &["pull", "good/repo-GGUF"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dest = cached(cache.path(), "good/repo-GGUF", "repo-Q4_K_M.gguf");
    assert!(dest.exists() && !PathBuf::from(format!("{}.lock", dest.display())).exists(), "a .lock file stays");

    let by_hand = cached(cache.path(), "foo/bar", "bar-Q4_K_M.gguf");
    std::fs::create_dir_all(by_hand.parent().unwrap()).unwrap();
    std::fs::copy(&dest, &by_hand).unwrap();
    let o = infer_hub(cache.path(), "http://127.0.0.1:9", &["info", "-m", "foo/bar"]);
    assert_one_line_error(&o, &format!("{} is in the cache but unverified", by_hand.display()));
}
