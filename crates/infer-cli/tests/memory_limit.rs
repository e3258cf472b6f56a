//! The `infer` binary under a memory limit (`ulimit -v`): a model or file
//! that does not fit ends in one clear error line and exit code 1, never in
//! the allocator's abort. Also `--no-mmap`, which reads the model into
//! memory instead of mapping it.
//!
//! Unix only (the limit is set by `bash -c 'ulimit -v ...'`); the tests on
//! the default model fetch it when it is not cached.

#![cfg(unix)]

use std::path::PathBuf;
use std::process::{Command, Output};

use infer_model::gguf::GgufWriter;

/// Runs `infer args` under a virtual-memory limit of `kib` KiB.
fn infer_limited(kib: u64, args: &[&str]) -> Output {
    let mut script = format!("ulimit -v {kib} && exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${i}\""));
    }
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_infer"))
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .expect("run infer under bash")
}

fn default_model() -> String {
    infer_model::fetch::default_model_path().expect("default model").display().to_string()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infer-cli-memlimit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Exit code 1 (not a signal: an abort is SIGABRT) and one error line
/// mentioning every fragment.
fn assert_clean_error(o: &Output, fragments: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "status {:?}, stderr: {err}", o.status);
    assert!(!err.contains("memory allocation of"), "the allocator aborted: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    for f in fragments {
        assert!(lines[0].contains(f), "{:?} lacks {f:?}", lines[0]);
    }
    eprintln!("{}", lines[0]);
}

#[test]
fn exact_precision_that_does_not_fit_is_a_clean_error() {
    // The exact mode dequantizes the 270M model to f32 (about 1.1 GB of
    // weights): under 700 MB the allocation fails and says how much it
    // needed.
    let model = default_model();
    let o =
        infer_limited(700_000, &["run", "--model", &model, "--precision", "exact", "-n", "2", "--threads", "2", "Hi"]);
    assert_clean_error(&o, &["out of memory", "bytes"]);
}

#[test]
fn a_50m_element_metadata_array_fits_in_its_size() {
    // 50 M u8 elements: a 50 MB file. Held one enum per element it cost
    // 1.6 GB and aborted under this limit; now it is read into 50 MB and
    // `info` lists it.
    let path = tmp("big-array.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("big.array", vec![1u8; 50_000_000]).unwrap();
    w.write_to_path(&path).unwrap();
    drop(w);
    let p = path.display().to_string();
    for extra in [&[][..], &["--no-mmap"][..]] {
        let mut args = vec!["info", "--model", &p];
        args.extend_from_slice(extra);
        let o = infer_limited(400_000, &args);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{extra:?}: status {:?}, stderr: {err}", o.status);
        assert!(out.contains("1 metadata keys"), "{extra:?}: {out}");
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn no_mmap_reads_the_model_into_memory() {
    let model = default_model();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--model", &model, "-n", "4", "--threads", "2", "--temp", "0"];
        args.extend_from_slice(extra);
        args.push("The capital of France is");
        let o = Command::new(env!("CARGO_BIN_EXE_infer")).args(&args).output().expect("run infer");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(run(&["--no-mmap"]), run(&[]), "the same text, mapped or read");
    // A file that is not a model fails the same way.
    let bad = tmp("not-a-model.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_infer"))
        .args(["info", "--no-mmap", "--model", &bad.display().to_string()])
        .output()
        .unwrap();
    assert_clean_error(&o, &["not-a-model.gguf", "truncated"]);
    std::fs::remove_file(&bad).unwrap();
}
