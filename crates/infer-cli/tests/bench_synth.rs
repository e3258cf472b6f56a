//! `infer synth` and `infer bench` end to end on tiny synthetic models, and
//! their one-line errors.

mod common;

use common::{assert_one_line_error as assert_error, infer, stderr, stdout, synth_tiny, tmpdir};

#[test]
fn synth_then_bench_json() {
    let dir = tmpdir();
    for arch in ["gemma3", "llama"] {
        let path = synth_tiny(dir.path(), arch);
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
                "model_type",
                "model_size",
                "model_n_params",
                "backends",
                "n_threads",
                "n_prompt",
                "n_gen",
                "avg_ts",
                "stddev_ts",
                "samples_ts",
            ] {
                assert!(!r[key].is_null(), "{key} missing in {r}");
            }
            assert_eq!(r["n_threads"], 1);
            assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
            assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
            assert_eq!(r["bandwidth_gbps"], 10.0);
            assert_eq!(r["model_type"].as_str().unwrap(), format!("{arch} tiny Q4_K - Medium (synthetic)"), "{r}");
            assert_eq!(r["synthetic"], true, "{r}");
            assert_eq!(r["precision"], "quantized", "{r}");
            assert!(!r["kernels"].as_str().unwrap().is_empty(), "{r}");
        }
        let (pp, tg) = (&rows[0], &rows[1]);
        assert_eq!((pp["n_prompt"].as_u64(), pp["n_gen"].as_u64()), (Some(16), Some(0)));
        assert_eq!((tg["n_prompt"].as_u64(), tg["n_gen"].as_u64()), (Some(0), Some(8)));
        assert!(pp["bytes_per_token"].is_null() && pp["roofline_fraction"].is_null());
        let bpt = tg["bytes_per_token"].as_u64().unwrap();
        // Every matrix but the embedding table (an untied Llama has its own output).
        assert!(bpt > 0 && bpt < tg["model_size"].as_u64().unwrap());
        let frac = tg["roofline_fraction"].as_f64().unwrap();
        let want = bpt as f64 * tg["avg_ts"].as_f64().unwrap() / 1e9 / 10.0;
        assert!((frac - want).abs() <= 1e-9 * want.max(1.0), "{frac} vs {want}");
    }
}

#[test]
fn bench_table_and_profile() {
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "gemma3");
    let o = infer(&["bench", "-m", path.to_str().unwrap(), "-t", "2", "-p", "8", "-n", "4", "-r", "1", "--profile"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("| model") && out.contains("| t/s") || out.contains("t/s |"), "{out}");
    assert!(out.contains("pp8") && out.contains("tg4"), "{out}");
    assert!(out.contains("decode profile") && out.contains("matvec ffn_down") && out.contains("attention"), "{out}");
    assert!(out.contains("% step"), "{out}");
    // The table names the kernels (SIMD level) and the precision that ran.
    assert!(out.contains("| kernels") && out.contains("| precision"), "{out}");
    assert!(out.contains("| quantized"), "{out}");
    assert!(out.contains("(synthetic)"), "{out}");
    assert!(out.contains("the GGUF's quantized bytes"), "{out}");
    assert!(out.contains("from position 0 on") && out.contains("KV cache K f16, V f16"), "{out}");
}

/// The profile runs the decode test's last depth and cache types.
#[test]
fn bench_profile_at_depth_with_cache_types() {
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "llama");
    let m = path.to_str().unwrap();
    let o = infer(&[
        "bench",
        "-m",
        m,
        "-t",
        "2",
        "-p",
        "0",
        "-n",
        "2",
        "-d",
        "0,24",
        "-r",
        "1",
        "-ctk",
        "q8_0",
        "-ctv",
        "tq4",
        "--profile",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("decode profile: 2 step(s) from position 24 on"), "{out}");
    assert!(out.contains("KV cache K q8_0, V tq4"), "{out}");
}

/// Batched mode (llama-batched-bench's rows) runs in the cache types asked
/// for, and says which.
#[test]
fn bench_batched_rows_in_the_cache_types_given() {
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "llama");
    let m = path.to_str().unwrap();
    let args = ["bench", "-m", m, "-t", "2", "--npl", "1,3", "--npp", "8", "--ntg", "4", "-ctk", "q8_0"];
    let o = infer(&[&args[..], &["--profile"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("KV cache K q8_0, V f16"), "{out}");
    assert!(out.contains("step profile: 4 steps of 3 sequences"), "{out}");
    let o = infer(&[&args[..], &["-o", "jsonl"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!((rows[1]["pl"].as_u64(), rows[1]["n_kv"].as_u64()), (Some(3), Some(36)), "{rows:?}");
    assert!(rows[1]["speed_tg"].as_f64().is_some_and(|v| v > 0.0), "{rows:?}");
}

#[test]
fn bench_exact_counts_f32_weight_bytes() {
    // --precision exact reads f32 weights: 4 bytes per weight, far more than
    // the Q4_K file's bytes.
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "llama");
    let bench = |precision: &str| {
        let o = infer(&[
            "bench",
            "-m",
            path.to_str().unwrap(),
            "-t",
            "1",
            "-p",
            "0",
            "-n",
            "4",
            "-r",
            "1",
            "--json",
            "--precision",
            precision,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
        v[0].clone()
    };
    let (q, e) = (bench("quantized"), bench("exact"));
    assert_eq!(e["precision"], "exact");
    let (bq, be) = (q["bytes_per_token"].as_u64().unwrap(), e["bytes_per_token"].as_u64().unwrap());
    // Q4_K is 4.5 bits per weight (Q6_K 6.56): f32 is 5 to 7 times larger.
    assert!(be > 4 * bq && be < 8 * bq, "exact {be} B vs quantized {bq} B");
    assert_eq!(be % 4, 0);
    let o = infer(&[
        "bench",
        "-m",
        path.to_str().unwrap(),
        "-t",
        "1",
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "--precision",
        "exact",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("| exact") && stdout(&o).contains("f32 weights"), "{}", stdout(&o));
}

#[test]
fn bench_clamps_positions_to_the_training_context() {
    // The tiny models' training context is small: -p beyond it is clamped
    // with a warning naming it, as `run -c` is.
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "llama");
    let info = infer(&["info", "-m", path.to_str().unwrap()]);
    let out = stdout(&info);
    let n_ctx_train: usize = out
        .split("n_ctx_train ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no n_ctx_train in {out}"));
    let p = (n_ctx_train + 1).to_string();
    let o = infer(&["bench", "-m", path.to_str().unwrap(), "-t", "1", "-p", &p, "-n", "0", "-r", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let warn = format!("training context of {n_ctx_train} positions");
    assert!(stderr(&o).contains(&warn) && stderr(&o).contains("warning: -p"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v[0]["test"], format!("pp{n_ctx_train}"));
}

#[test]
fn run_generates_from_a_synthetic_model() {
    let dir = tmpdir();
    let path = synth_tiny(dir.path(), "llama");
    let o = infer(&["run", "--model", path.to_str().unwrap(), "-n", "8", "--temp", "0", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("hello"));
    assert!(stderr(&o).contains("decode:   8 tokens"), "{}", stderr(&o));
}

#[test]
fn bad_input_gives_one_line_errors() {
    let dir = tmpdir();
    let out = dir.path().join("never-written.gguf");
    let out = out.to_str().unwrap();
    assert_error(
        &infer(&["synth", "--arch", "mamba", "--size", "1b", "-o", out]),
        "gemma3, gemma2, llama, qwen2, qwen3, phi3",
    );
    assert_error(&infer(&["synth", "--arch", "llama", "--size", "70b", "-o", out]), "1b, 8b, mistral-7b, tiny");
    assert_error(&infer(&["synth", "--size", "1b", "--quant", "q3_k", "-o", out]), "q4_k_m, q5_k_m, q8_0, q4_0");
    assert_error(&infer(&["synth", "--size", "tiny", "-o", "/nonexistent-dir/x.gguf"]), "does not exist");
    assert!(!std::path::Path::new(out).exists());
    assert_error(&infer(&["bench", "-m", "/nonexistent.gguf"]), "does not exist");
    assert_error(&infer(&["bench", "-p", "0", "-n", "0"]), "nothing to measure");
    assert_error(&infer(&["bench", "-r", "0"]), "repetitions");
    assert_error(&infer(&["bench", "--bandwidth=-3", "-n", "1"]), "--bandwidth");
    assert_error(&infer(&["bench", "-t", "0"]), "threads");
    assert_error(&infer(&["bench", "--synth", "gemma3-3b"]), "270m, 1b, 4b, 12b");
    let bad = dir.path().join("not-a-model.gguf");
    std::fs::write(&bad, b"GGUF but not really").unwrap();
    assert_error(&infer(&["bench", "-m", bad.to_str().unwrap()]), "not-a-model.gguf");
}
