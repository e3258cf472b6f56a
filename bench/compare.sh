#!/usr/bin/env bash
# Side-by-side speed of infer-compute's `infer` and llama.cpp's `llama-bench`
# on the same GGUF file with the same thread count.
#
# Usage: bench/compare.sh [--model PATH] [-t THREADS] [-p 128] [-n 128] [-r 5]
#                         [--rounds K] [--json-out FILE] [--cuda]
#                         [--llama-bench PATH] [--infer PATH] [--no-build]
#                         [--llama-args "ARGS"] [--infer-args "ARGS"]
#
#   --model PATH      GGUF file (default: the project's default model, Gemma 3
#                     270M Q4_K_M, fetched by scripts/fetch-model.sh if needed)
#   -t THREADS        threads for both engines (default: nproc)
#   -p N / -n N       prompt tokens (prefill test ppN) and generated tokens
#                     (decode test tgN); 0 leaves a test out
#   -r R              repetitions inside each engine's run
#   --rounds K        run the pair K times, alternating which engine goes
#                     first; the reported t/s is the mean over rounds (default 1)
#   --json-out FILE   write the raw and combined results as JSON
#   --cuda            use llama.cpp's CUDA build (bench/build-llama-cpp.sh
#                     --cuda), llama-bench -ngl 99 -fa 1, and build infer with
#                     --features cuda
#   --llama-bench P   use this llama-bench instead of the cached build
#   --infer P         use this infer binary instead of building it
#   --no-build        do not run cargo (use target/release/infer, or
#                     $CARGO_TARGET_DIR/release/infer, as it is)
#   --llama-args S    extra arguments for llama-bench (split on spaces)
#   --infer-args S    extra arguments for `infer bench` (split on spaces)
#
# Prints one markdown table (model, size, threads, test, llama.cpp t/s,
# infer t/s, ratio = infer / llama.cpp) on stdout; progress goes to stderr.
# Needs bash, python3 (stdlib only), cargo, and cmake + a C++ compiler for the
# first llama.cpp build.

set -euo pipefail

die() { echo "compare: error: $*" >&2; exit 1; }
log() { echo "compare: $*" >&2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

model=""
threads=""
n_prompt=128
n_gen=128
reps=5
rounds=1
json_out=""
cuda=0
llama_bench=""
infer=""
build_infer=1
llama_extra=()
infer_extra=()
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model|-m) need "$@"; model="$2"; shift ;;
        -t|--threads) need "$@"; threads="$2"; shift ;;
        -p|--n-prompt) need "$@"; n_prompt="$2"; shift ;;
        -n|--n-gen) need "$@"; n_gen="$2"; shift ;;
        -r|--repetitions) need "$@"; reps="$2"; shift ;;
        --rounds) need "$@"; rounds="$2"; shift ;;
        --json-out) need "$@"; json_out="$2"; shift ;;
        --cuda) cuda=1 ;;
        --llama-bench) need "$@"; llama_bench="$2"; shift ;;
        --infer) need "$@"; infer="$2"; build_infer=0; shift ;;
        --no-build) build_infer=0 ;;
        --llama-args) need "$@"; read -r -a llama_extra <<< "$2"; shift ;;
        --infer-args) need "$@"; read -r -a infer_extra <<< "$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ -n "$threads" ]] || threads="$(nproc 2>/dev/null || echo 1)"
for v in threads:"$threads" rounds:"$rounds" repetitions:"$reps"; do
    [[ "${v#*:}" =~ ^[1-9][0-9]*$ ]] || die "${v%%:*} must be a positive integer, got '${v#*:}'"
done
for v in n-prompt:"$n_prompt" n-gen:"$n_gen"; do
    [[ "${v#*:}" =~ ^[0-9]+$ ]] || die "${v%%:*} must be a non-negative integer, got '${v#*:}'"
done
[[ "$n_prompt" -gt 0 || "$n_gen" -gt 0 ]] || die "-p and -n are both 0: nothing to measure"
command -v python3 >/dev/null 2>&1 || die "python3 is required"

# ---------------------------------------------------------------- the peer
if [[ -z "$llama_bench" ]]; then
    build_args=()
    [[ $cuda == 1 ]] && build_args+=(--cuda)
    log "building (or reusing) llama.cpp's llama-bench"
    bin_dir="$("$here/build-llama-cpp.sh" "${build_args[@]}")" || die "bench/build-llama-cpp.sh failed"
    llama_bench="$bin_dir/llama-bench"
fi
[[ -x "$llama_bench" ]] || die "llama-bench not found at $llama_bench"
[[ $cuda == 1 && ${#llama_extra[@]} -eq 0 ]] && llama_extra=(-ngl 99 -fa 1)

# ---------------------------------------------------------------- our CLI
if [[ $build_infer == 1 ]]; then
    command -v cargo >/dev/null 2>&1 || die "cargo is required to build infer (or pass --infer PATH)"
    cargo_args=(build --release -p infer-cli)
    [[ $cuda == 1 ]] && cargo_args+=(--features cuda)
    log "cargo ${cargo_args[*]}"
    (cd "$root" && nice -n 19 cargo "${cargo_args[@]}" >&2) || die "cargo ${cargo_args[*]} failed"
fi
[[ -n "$infer" ]] || infer="${CARGO_TARGET_DIR:-$root/target}/release/infer"
[[ -x "$infer" ]] || die "infer not found at $infer (build it with: cargo build --release -p infer-cli)"
bench_help="$("$infer" bench --help 2>&1 || true)"
if ! grep -q -- '--json' <<< "$bench_help"; then
    die "'infer bench' is not available in $infer (no 'bench' subcommand with --json yet); this script needs 'infer bench --model F -t T -p P -n N -r R --json'"
fi

# ---------------------------------------------------------------- the model
if [[ -z "$model" ]]; then
    model="$("$root/scripts/fetch-model.sh")" || die "scripts/fetch-model.sh failed"
fi
[[ -f "$model" ]] || die "model not found: $model"
model="$(cd "$(dirname "$model")" && pwd)/$(basename "$model")"

# A loaded machine makes both engines slow and noisy; llama.cpp's OpenMP
# threads spin at every barrier and collapse when they share cores.
load_start="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)"
if python3 -c "import os, sys; sys.exit(0 if float('$load_start') > 0.5 * (os.cpu_count() or 1) else 1)"; then
    log "warning: load average $load_start on $(nproc) cores: other work is running, the numbers will be noisy"
    [[ -z "${OMP_WAIT_POLICY:-}" ]] \
        && log "warning: with cores shared, llama.cpp's spinning OpenMP threads slow it down many times over; OMP_WAIT_POLICY=passive avoids that"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/infer-compare.XXXXXX")"
trap 'rm -rf -- "$work"' EXIT

run_llama() {  # run_llama ROUND
    local out="$work/llama.$1.json"
    log "round $1: llama-bench -m $(basename "$model") -t $threads -p $n_prompt -n $n_gen -r $reps ${llama_extra[*]}"
    "$llama_bench" -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" \
        "${llama_extra[@]}" -o json > "$out" 2> "$work/llama.$1.err" \
        || { tail -n 20 "$work/llama.$1.err" >&2; die "llama-bench failed"; }
}
run_infer() {  # run_infer ROUND
    local out="$work/infer.$1.json"
    log "round $1: infer bench --model $(basename "$model") -t $threads -p $n_prompt -n $n_gen -r $reps --json ${infer_extra[*]}"
    "$infer" bench --model "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" \
        --json "${infer_extra[@]}" > "$out" 2> "$work/infer.$1.err" \
        || { tail -n 20 "$work/infer.$1.err" >&2; die "infer bench failed"; }
}
for ((k = 1; k <= rounds; k++)); do
    if (( k % 2 == 1 )); then run_llama "$k"; run_infer "$k"; else run_infer "$k"; run_llama "$k"; fi
done

# ---------------------------------------------------------------- report
load_end="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)"
python3 - "$work" "$rounds" "$model" "$threads" "$n_prompt" "$n_gen" "$reps" "$json_out" \
    "$llama_bench" "$infer" "${llama_extra[*]:-}" "${infer_extra[*]:-}" "$load_start" "$load_end" <<'PY'
import json, math, os, platform, sys, time

(work, rounds, model, threads, n_prompt, n_gen, reps, json_out,
 llama_bin, infer_bin, llama_extra, infer_extra, load_start, load_end) = sys.argv[1:]
rounds, threads = int(rounds), int(threads)


def fail(msg):
    print(f"compare: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load_json(path, who):
    text = open(path, encoding="utf-8", errors="replace").read().strip()
    if not text:
        fail(f"{who} printed no JSON ({path})")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # JSON lines, or JSON documents among other lines of text.
    docs, dec, lines = [], json.JSONDecoder(), text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if stripped.startswith(("{", "[")):
            rest = "".join(lines[i:]).lstrip()
            try:
                doc, end = dec.raw_decode(rest)
            except json.JSONDecodeError:
                i += 1
                continue
            docs.append(doc)
            consumed = rest[:end].count("\n")
            i += consumed + 1
        else:
            i += 1
    if not docs:
        fail(f"{who} did not print valid JSON on stdout; first line: {text.splitlines()[0][:200]!r}")
    return docs


def records(doc):
    """Every object in doc (recursively) that carries a result."""
    if isinstance(doc, dict):
        if "avg_ts" in doc:
            yield doc
        else:
            for v in doc.values():
                yield from records(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from records(v)


def llama_test_name(r):
    p, g, d = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0)), int(r.get("n_depth", 0) or 0)
    name = f"pp{p}" if g == 0 else f"tg{g}" if p == 0 else f"pp{p}+tg{g}"
    return name + (f" @ d{d}" if d else "")


def num(r, key, who):
    try:
        v = float(r[key])
    except (KeyError, TypeError, ValueError):
        fail(f"{who}: result {r.get('test', '?')!r} has no numeric {key!r}")
    return v


llama_raw, infer_raw = [], []
llama = {}  # test -> list of (avg, stddev), one per round
infer = {}
meta = {}
for k in range(1, rounds + 1):
    doc = load_json(os.path.join(work, f"llama.{k}.json"), "llama-bench")
    llama_raw.append(doc)
    recs = list(records(doc))
    if not recs:
        fail("llama-bench's JSON has no results")
    for r in recs:
        llama.setdefault(llama_test_name(r), []).append(
            (num(r, "avg_ts", "llama-bench"), num(r, "stddev_ts", "llama-bench")))
        meta.setdefault("model_type", r.get("model_type"))
        meta.setdefault("model_size", r.get("model_size"))
        meta.setdefault("model_n_params", r.get("model_n_params"))
        meta.setdefault("cpu_info", r.get("cpu_info"))
        meta.setdefault("gpu_info", r.get("gpu_info"))
        meta.setdefault("backends", r.get("backends"))
        meta.setdefault("build_commit", r.get("build_commit"))
        meta.setdefault("n_threads", r.get("n_threads"))

    doc = load_json(os.path.join(work, f"infer.{k}.json"), "infer bench")
    infer_raw.append(doc)
    recs = [r for r in records(doc)]
    if not recs:
        fail("the JSON of 'infer bench --json' has no object with \"avg_ts\" "
             "(expected per test at least \"test\", \"avg_ts\", \"stddev_ts\")")
    for r in recs:
        if "test" not in r:
            fail(f"'infer bench --json' result without \"test\": {json.dumps(r)[:200]}")
        infer.setdefault(str(r["test"]), []).append(
            (num(r, "avg_ts", "infer bench"), num(r, "stddev_ts", "infer bench")))


def combine(samples):
    """Mean of the rounds' averages; the spread pools the within-round
    standard deviations with the spread of the round averages."""
    if not samples:
        return None, None
    avgs = [a for a, _ in samples]
    mean = sum(avgs) / len(avgs)
    within = sum(s * s for _, s in samples) / len(samples)
    between = sum((a - mean) ** 2 for a in avgs) / (len(avgs) - 1) if len(avgs) > 1 else 0.0
    return mean, math.sqrt(within + between)


tests = list(llama) + [t for t in infer if t not in llama]
results = []
for t in tests:
    la, ls = combine(llama.get(t, []))
    ia, is_ = combine(infer.get(t, []))
    results.append({
        "test": t,
        "llama_cpp_avg_ts": la, "llama_cpp_stddev_ts": ls,
        "infer_avg_ts": ia, "infer_stddev_ts": is_,
        "ratio": (ia / la) if (la and ia is not None) else None,
    })
missing = [t for t in llama if t not in infer]
if missing:
    print(f"compare: warning: 'infer bench' reported no {', '.join(missing)} "
          f"(it reported: {', '.join(infer) or 'nothing'})", file=sys.stderr)


def size_str(n):
    if not n:
        n = os.path.getsize(model)
    n = float(n)
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def ts(a, s):
    return "n/a" if a is None else f"{a:.2f} ± {s:.2f}"


model_name = meta.get("model_type") or os.path.basename(model)
size = size_str(meta.get("model_size"))
print(f"| model | size | threads | test | llama.cpp t/s | infer t/s | ratio |")
print(f"| --- | ---: | ---: | --- | ---: | ---: | ---: |")
for r in results:
    ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
    print(f"| {model_name} | {size} | {threads} | {r['test']} | "
          f"{ts(r['llama_cpp_avg_ts'], r['llama_cpp_stddev_ts'])} | "
          f"{ts(r['infer_avg_ts'], r['infer_stddev_ts'])} | {ratio} |")

if json_out:
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "nproc": os.cpu_count(),
                 "cpu_info": meta.get("cpu_info"), "gpu_info": meta.get("gpu_info"),
                 "loadavg_1m_start": float(load_start), "loadavg_1m_end": float(load_end),
                 "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
        "model": {"path": model, "file_size": os.path.getsize(model),
                  "type": meta.get("model_type"), "size": meta.get("model_size"),
                  "n_params": meta.get("model_n_params")},
        "params": {"threads": threads, "n_prompt": int(n_prompt), "n_gen": int(n_gen),
                   "repetitions": int(reps), "rounds": rounds,
                   "llama_bench_extra_args": llama_extra, "infer_extra_args": infer_extra},
        "llama_cpp": {"binary": llama_bin, "build_commit": meta.get("build_commit"),
                      "backends": meta.get("backends"), "raw": llama_raw},
        "infer": {"binary": infer_bin, "raw": infer_raw},
        "results": results,
    }
    with open(json_out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"compare: wrote {json_out}", file=sys.stderr)
PY
