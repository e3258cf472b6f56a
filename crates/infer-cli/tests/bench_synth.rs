//! `infer synth` and `infer bench` end to end on tiny synthetic models, and
//! their one-line errors.

use std::path::PathBuf;
use std::process::{Command, Output};

fn infer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infer")).args(args).output().expect("run infer")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infer-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failed run with one `error:` line on stderr containing `needle`.
#[track_caller]
fn assert_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("error:") && lines[0].contains(needle), "{err}");
}

fn synth_tiny(arch: &str) -> PathBuf {
    let path = tmp(&format!("{arch}-tiny.gguf"));
    let o = infer(&["synth", "--arch", arch, "--size", "tiny", "--seed", "3", "-t", "2", "-o", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("random weights"), "{}", stdout(&o));
    path
}

#[test]
fn synth_then_bench_json() {
    for arch in ["gemma3", "llama"] {
        let path = synth_tiny(arch);
        let o = infer(&[
            "bench",
            "-m",
            path.to_str().unwrap(),
            "-t",
            "1",
            "-p",
            "16",
            "-n",
            "8",
            "-r",
            "2",
            "--json",
            "--bandwidth",
            "10",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON on stdout");
        let rows = v.as_array().expect("an array");
        assert_eq!(rows.len(), 2);
        for (r, test) in rows.iter().zip(["pp16", "tg8"]) {
            assert_eq!(r["test"], test);
            for key in [
                "model",
                "size_bytes",
                "params",
                "backend",
                "threads",
                "n_prompt",
                "n_gen",
                "avg_ts",
                "stddev_ts",
                "samples_ts",
            ] {
                assert!(!r[key].is_null(), "{key} missing in {r}");
            }
            assert_eq!(r["threads"], 1);
            assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
            assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
            assert_eq!(r["bandwidth_gbps"], 10.0);
            assert!(r["model"].as_str().unwrap().starts_with(&format!("{arch} tiny Q4_K - Medium")), "{r}");
        }
        let (pp, tg) = (&rows[0], &rows[1]);
        assert_eq!((pp["n_prompt"].as_u64(), pp["n_gen"].as_u64()), (Some(16), Some(0)));
        assert_eq!((tg["n_prompt"].as_u64(), tg["n_gen"].as_u64()), (Some(0), Some(8)));
        assert!(pp["bytes_per_token"].is_null() && pp["roofline_fraction"].is_null());
        let bpt = tg["bytes_per_token"].as_u64().unwrap();
        // Every matrix but the embedding table (an untied Llama has its own output).
        assert!(bpt > 0 && bpt < tg["size_bytes"].as_u64().unwrap());
        let frac = tg["roofline_fraction"].as_f64().unwrap();
        let want = bpt as f64 * tg["avg_ts"].as_f64().unwrap() / 1e9 / 10.0;
        assert!((frac - want).abs() <= 1e-9 * want.max(1.0), "{frac} vs {want}");
    }
}

#[test]
fn bench_table_and_profile() {
    let path = synth_tiny("gemma3");
    let o = infer(&["bench", "-m", path.to_str().unwrap(), "-t", "2", "-p", "8", "-n", "4", "-r", "1", "--profile"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("| model") && out.contains("| t/s") || out.contains("t/s |"), "{out}");
    assert!(out.contains("pp8") && out.contains("tg4"), "{out}");
    assert!(out.contains("replay") && out.contains("matvec ffn_down") && out.contains("attention"), "{out}");
    assert!(out.contains("% step"), "{out}");
}

#[test]
fn run_generates_from_a_synthetic_model() {
    let path = synth_tiny("llama");
    let o = infer(&["run", "--model", path.to_str().unwrap(), "-n", "8", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("hello"));
    assert!(stderr(&o).contains("decode:   8 tokens"), "{}", stderr(&o));
}

#[test]
fn bad_input_gives_one_line_errors() {
    let out = tmp("never-written.gguf");
    let out = out.to_str().unwrap();
    assert_error(
        &infer(&["synth", "--arch", "mamba", "--size", "1b", "-o", out]),
        "gemma3, gemma2, llama, qwen2, qwen3, phi3",
    );
    assert_error(&infer(&["synth", "--arch", "llama", "--size", "70b", "-o", out]), "1b, 8b, mistral-7b, tiny");
    assert_error(&infer(&["synth", "--size", "1b", "--quant", "q3_k", "-o", out]), "q4_k_m, q8_0, q4_0");
    assert_error(&infer(&["synth", "--size", "tiny", "-o", "/nonexistent-dir/x.gguf"]), "does not exist");
    assert!(!std::path::Path::new(out).exists());
    assert_error(&infer(&["bench", "-m", "/nonexistent.gguf"]), "does not exist");
    assert_error(&infer(&["bench", "-p", "0", "-n", "0"]), "nothing to measure");
    assert_error(&infer(&["bench", "-r", "0"]), "repetitions");
    assert_error(&infer(&["bench", "--bandwidth=-3", "-n", "1"]), "--bandwidth");
    assert_error(&infer(&["bench", "-t", "0"]), "threads");
    assert_error(&infer(&["bench", "--synth", "gemma3-3b"]), "270m, 1b, 4b, 12b");
    let bad = tmp("not-a-model.gguf");
    std::fs::write(&bad, b"GGUF but not really").unwrap();
    assert_error(&infer(&["bench", "-m", bad.to_str().unwrap()]), "not-a-model.gguf");
}
