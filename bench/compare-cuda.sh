#!/usr/bin/env bash
# GPU side by side: infer's CUDA backend against llama.cpp's CUDA build on
# synthetic Q4_K_M files, in one command, on a machine without network.
#
# Usage: bench/compare-cuda.sh [--llama-bench PATH | --llama-src DIR] [--infer PATH]
#            [--backend cuda|wgpu] [--tokenizer-from F] [--models "gemma3-270m gemma3-1b gemma3-4b llama-1b" | all]
#            [--quants "q4_k_m"] [--rounds 2] [-p 512] [-n 128] [-r 3] [--bandwidth 4300] [--out DIR]
#
#   --llama-bench PATH  a built llama-bench (CUDA); otherwise it is built with
#                       bench/build-llama-cpp.sh --cuda (--src DIR when
#                       --llama-src names a tree, e.g. a --trim copy).
#   --infer PATH        the infer binary, built with --features cuda
#                       (default: $CARGO_TARGET_DIR or target/, release).
#   --backend NAME      infer's backend (default cuda; wgpu, built with
#                       --features wgpu, runs through Vulkan: on the H200
#                       with the loader of gpu/vulkan/ and an ICD file naming
#                       libEGL_nvidia.so.0, see BENCHMARKS.md). llama-bench
#                       is the same CUDA build either way.
#   --tokenizer-from F  GGUF holding the Gemma 3 tokenizer (the default model,
#                       or a tensor-less copy of its tokenizer.* keys); needed
#                       for Gemma 3 sizes on a machine that cannot fetch it.
#   --models LIST       synthetic models, as ARCH-SIZE (llama-mistral-7b is
#                       `--arch llama --size mistral-7b`); `all` names every
#                       preset of `infer synth` (11). With llama-bench built
#                       and -r 3, one round of ten of them took 4.5 minutes
#                       on an H100, synthesis included; the llama.cpp build
#                       takes 4-9 minutes more, so on a 10-minute machine
#                       build in one call and chain the next ones at once
#                       (the machine keeps its files only 30 s after a call).
#   --quants LIST       file types, each a file per model (default q4_k_m):
#                       q4_k_m is written by `infer synth`; any other
#                       (q5_k_m, q6_k, q8_0, ...) by llama.cpp's
#                       llama-quantize (next to llama-bench, or
#                       --llama-quantize PATH) from an F32 file of the same
#                       model (`infer synth --quant q8_0 --dequantized`;
#                       4 bytes a weight, 5 GB for a 1B model, kept in DIR).
#   --rounds K          rounds per model; the engine that goes first
#                       alternates (bench/compare.sh --rounds).
#   --bandwidth GBPS    the roofline of the last column (default 4300: the
#                       H200's measured device-to-device copy rate).
#   --out DIR           where the synthetic files, the raw JSON and the
#                       table go (default: a temporary directory, kept).
#
# Each model runs `llama-bench -m F -ngl 99 -fa 1 -p P -n N -r R` and
# `infer bench --model F --backend cuda -p P -n N -r R` (or --backend) through
# bench/compare.sh; the combined table is printed last and written to
# DIR/table.md, the raw output of both engines to DIR/ARCH-SIZE-TYPE.json.

set -euo pipefail

die() { echo "compare-cuda: error: $*" >&2; exit 1; }
log() { echo "compare-cuda: $*" >&2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/synth-model.sh
source "$here/synth-model.sh"
root="$(cd "$here/.." && pwd)"

llama_bench=""
llama_quantize=""
llama_src=""
quants="q4_k_m"
all_models="gemma3-270m gemma3-1b gemma3-4b gemma3-12b gemma2-2b llama-1b llama-8b llama-mistral-7b qwen2-0.5b qwen3-0.6b phi3-mini"
infer=""
tokenizer=""
models="gemma3-270m gemma3-1b gemma3-4b llama-1b"
rounds=2
n_prompt=512
n_gen=128
reps=3
backend=cuda
bandwidth=4300
out=""
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --llama-bench) need "$@"; llama_bench="$2"; shift ;;
        --llama-src) need "$@"; llama_src="$2"; shift ;;
        --llama-quantize) need "$@"; llama_quantize="$2"; shift ;;
        --quants) need "$@"; quants="$2"; shift ;;
        --infer) need "$@"; infer="$2"; shift ;;
        --backend) need "$@"; backend="$2"; shift ;;
        --tokenizer-from) need "$@"; tokenizer="$2"; shift ;;
        --models) need "$@"; models="$2"; shift ;;
        --rounds) need "$@"; rounds="$2"; shift ;;
        -p|--n-prompt) need "$@"; n_prompt="$2"; shift ;;
        -n|--n-gen) need "$@"; n_gen="$2"; shift ;;
        -r|--repetitions) need "$@"; reps="$2"; shift ;;
        --bandwidth) need "$@"; bandwidth="$2"; shift ;;
        --out) need "$@"; out="$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ "$models" == all ]] && models="$all_models"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
command -v python3 >/dev/null 2>&1 || die "python3 is required"
command -v nvidia-smi >/dev/null 2>&1 || log "warning: nvidia-smi not found; is there an NVIDIA GPU?"

if [[ -z "$llama_bench" ]]; then
    build_args=(--cuda)
    [[ -n "$llama_src" ]] && build_args+=(--src "$llama_src")
    log "building (or reusing) llama.cpp's CUDA llama-bench"
    bin_dir="$("$here/build-llama-cpp.sh" "${build_args[@]}")" || die "bench/build-llama-cpp.sh --cuda failed"
    llama_bench="$bin_dir/llama-bench"
fi
[[ -x "$llama_bench" ]] || die "llama-bench not found at $llama_bench"
for q in $quants; do
    case "$q" in q4_k_m) ;; *)
        [[ -n "$llama_quantize" ]] || llama_quantize="$(dirname "$llama_bench")/llama-quantize"
        [[ -x "$llama_quantize" ]] || die "--quants $q needs llama-quantize (not found at $llama_quantize)" ;;
    esac
done
[[ -n "$infer" ]] || infer="${CARGO_TARGET_DIR:-$root/target}/release/infer"
[[ -x "$infer" ]] || die "infer not found at $infer (cargo build --release -p infer-cli --features cuda)"
"$infer" info --help 2>&1 | grep -q -- '--backend' || die "$infer has no --backend option"

[[ -n "$out" ]] || out="$(mktemp -d "${TMPDIR:-/tmp}/infer-compare-cuda.XXXXXX")"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log "output: $out"

# model_file M Q: the path of model M in file type Q, written if missing.
model_file() {
    local m="$1" q="$2" f="$out/$1-$2.gguf"
    if [[ ! -s "$f" ]]; then
        case "$q" in
            q4_k_m) synth_model "$m" "$f" ;;
            *)
                local f32="$out/$m-f32.gguf"
                synth_model "$m" "$f32" --quant q8_0 --dequantized
                log "$llama_quantize $f32 $f ${q^^}"
                "$llama_quantize" "$f32" "$f" "${q^^}" > "$out/$m-$q.quantize.log" 2>&1 \
                    || die "llama-quantize $m ${q^^} failed (log: $out/$m-$q.quantize.log)"
                ;;
        esac
    fi
    echo "$f"
}

runs=()
for m in $models; do
    for q in $quants; do
        f="$(model_file "$m" "$q")" || exit 1
        "$here/compare.sh" --cuda --no-build --llama-bench "$llama_bench" --infer "$infer" --model "$f" \
            -p "$n_prompt" -n "$n_gen" -r "$reps" --rounds "$rounds" \
            --infer-args "--backend $backend --bandwidth $bandwidth" --json-out "$out/$m-$q.json" >&2 \
            || die "bench/compare.sh failed for $m $q"
        runs+=("$m-$q")
    done
done

python3 - "$out" "$bandwidth" "${runs[@]}" <<'PY' | tee "$out/table.md"
import json, os, sys

out, bw, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
print(f"| model (synthetic) | type | test | llama.cpp t/s | infer t/s | ratio | infer % of {bw / 1000:.1f} TB/s |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
for run in runs:
    m, q = run.rsplit("-", 1)
    doc = json.load(open(os.path.join(out, f"{run}.json")))
    rounds = doc["params"]["rounds"]
    # Per-round averages of each engine, in round order.
    per = {}
    for who, key in (("llama", "llama_cpp"), ("infer", "infer")):
        for k, raw in enumerate(doc[key]["raw"]):
            stack = [raw]
            while stack:
                r = stack.pop()
                if isinstance(r, list):
                    stack.extend(reversed(r))
                elif isinstance(r, dict) and "avg_ts" in r:
                    if who == "llama":
                        p, g = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0))
                        t = f"pp{p}" if g == 0 else f"tg{g}"
                    else:
                        t = r["test"]
                    per.setdefault((who, t), [None] * rounds)[k] = r
    for res in doc["results"]:
        t = res["test"]
        la = [r["avg_ts"] for r in per.get(("llama", t), []) if r]
        ia = [r for r in per.get(("infer", t), []) if r]
        ratios = [i["avg_ts"] / l for i, l in zip(ia, la) if l]
        roof = [i.get("roofline_fraction") for i in ia if i.get("roofline_fraction") is not None]
        fmt = lambda v: f"{v / 1000:.1f}k" if v >= 10000 else f"{v:.0f}"
        rr = f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 else (f"{ratios[0]:.2f}×" if ratios else "n/a")
        if ratios and f"{min(ratios):.2f}" == f"{max(ratios):.2f}":
            rr = f"{ratios[0]:.2f}×"
        roof_s = f"{100 * max(roof):.0f}%" if roof else ""
        print(f"| {m} | {q.upper()} | {t} | {' / '.join(fmt(v) for v in la)} | {' / '.join(fmt(i['avg_ts']) for i in ia)} "
              f"| {rr} | {roof_s} |")
PY
