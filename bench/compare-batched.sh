#!/usr/bin/env bash
# Batched side by side: `infer bench --npl` against llama.cpp's
# llama-batched-bench on the same GGUF files, in alternating rounds, in one
# command (CPU or CUDA; on a machine without network with --llama-src).
#
# Usage: bench/compare-batched.sh [--backend cuda|cpu] [--llama-batched-bench PATH | --llama-src DIR]
#            [--infer PATH] [--tokenizer-from F] [--models "llama-1b gemma3-4b" | --model F]
#            [--rounds 2] [--npp 128] [--ntg 128] [--npl 1,4,16,64] [-t N] [--out DIR]
#
#   --backend B      cuda (default; llama.cpp with -ngl 99 -fa on) or cpu
#                    (both engines with -t N threads).
#   --llama-batched-bench PATH  a built llama-batched-bench; otherwise it is
#                    built with bench/build-llama-cpp.sh (--cuda for the CUDA
#                    backend; --src DIR when --llama-src names a tree, e.g. a
#                    --trim copy).
#   --infer PATH     the infer binary (default: target/release/infer).
#   --tokenizer-from F  GGUF with the Gemma 3 tokenizer, for Gemma 3 sizes on
#                    a machine that cannot fetch the default model.
#   --models LIST    synthetic Q4_K_M models, as ARCH-SIZE (made with infer
#                    synth into the output directory); --model F benchmarks
#                    one file instead.
#   --rounds K       rounds; the engine that goes first alternates.
#   --out DIR        where the files, the raw JSONL and the table go (default:
#                    a temporary directory, kept).
#
# The table (printed last, and written to DIR/table.md) gives per model and
# sequence count B the aggregate generation tokens/s (S_TG) of each engine,
# their ratio per round, and the prompt tokens/s (S_PP) beside it.

set -euo pipefail

die() { echo "compare-batched: error: $*" >&2; exit 1; }
log() { echo "compare-batched: $*" >&2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/synth-model.sh
source "$here/synth-model.sh"
root="$(cd "$here/.." && pwd)"

backend=cuda
bbench=""
llama_src=""
infer=""
tokenizer=""
models="llama-1b gemma3-4b"
model_file=""
rounds=2
npp=128
ntg=128
npl="1,4,16,64"
threads="$(nproc)"
out=""
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) need "$@"; backend="$2"; shift ;;
        --llama-batched-bench) need "$@"; bbench="$2"; shift ;;
        --llama-src) need "$@"; llama_src="$2"; shift ;;
        --infer) need "$@"; infer="$2"; shift ;;
        --tokenizer-from) need "$@"; tokenizer="$2"; shift ;;
        --models) need "$@"; models="$2"; shift ;;
        --model) need "$@"; model_file="$2"; shift ;;
        --rounds) need "$@"; rounds="$2"; shift ;;
        --npp) need "$@"; npp="$2"; shift ;;
        --ntg) need "$@"; ntg="$2"; shift ;;
        --npl) need "$@"; npl="$2"; shift ;;
        -t|--threads) need "$@"; threads="$2"; shift ;;
        --out) need "$@"; out="$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ "$backend" == cuda || "$backend" == cpu ]] || die "--backend must be cuda or cpu, got '$backend'"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
[[ "$npl" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--npl must be a comma list of positive counts, got '$npl'"
command -v python3 >/dev/null 2>&1 || die "python3 is required"

if [[ -z "$bbench" ]]; then
    build_args=()
    [[ "$backend" == cuda ]] && build_args+=(--cuda)
    [[ -n "$llama_src" ]] && build_args+=(--src "$llama_src")
    log "building (or reusing) llama.cpp's $backend build"
    bin_dir="$("$here/build-llama-cpp.sh" "${build_args[@]}")" || die "bench/build-llama-cpp.sh failed"
    bbench="$bin_dir/llama-batched-bench"
fi
[[ -x "$bbench" ]] || die "llama-batched-bench not found at $bbench"
[[ -n "$infer" ]] || infer="${CARGO_TARGET_DIR:-$root/target}/release/infer"
[[ -x "$infer" ]] || die "infer not found at $infer"

[[ -n "$out" ]] || out="$(mktemp -d "${TMPDIR:-/tmp}/infer-compare-batched.XXXXXX")"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log "output: $out"

max_pl="$(tr ',' '\n' <<< "$npl" | sort -n | tail -n1)"
n_ctx=$(( max_pl * (npp + ntg) ))
llama_args=(-npp "$npp" -ntg "$ntg" -npl "$npl" -c "$n_ctx" -fa on --output-format jsonl)
infer_args=(bench --backend "$backend" --npp "$npp" --ntg "$ntg" --npl "$npl" --json)
if [[ "$backend" == cuda ]]; then
    llama_args+=(-ngl 99)
else
    llama_args+=(-ngl 0 -t "$threads" -tb "$threads")
    infer_args+=(-t "$threads")
fi

names=()
if [[ -n "$model_file" ]]; then
    [[ -s "$model_file" ]] || die "no model file $model_file"
    names=(file)
else
    for m in $models; do names+=("$m"); done
fi
for m in "${names[@]}"; do
    if [[ "$m" == file ]]; then
        f="$model_file"
    else
        f="$out/$m-q4_k_m.gguf"
        synth_model "$m" "$f"
    fi
    for k in $(seq 1 "$rounds"); do
        order=(llama infer)
        (( k % 2 == 0 )) && order=(infer llama)
        for who in "${order[@]}"; do
            log "$m round $k: $who"
            if [[ "$who" == llama ]]; then
                "$bbench" -m "$f" "${llama_args[@]}" > "$out/$m-r$k-llama.jsonl" 2> "$out/$m-r$k-llama.log" \
                    || { tail -n 20 "$out/$m-r$k-llama.log" >&2; die "llama-batched-bench failed on $m"; }
            else
                "$infer" "${infer_args[@]}" --model "$f" > "$out/$m-r$k-infer.jsonl" 2> "$out/$m-r$k-infer.log" \
                    || { tail -n 20 "$out/$m-r$k-infer.log" >&2; die "infer bench failed on $m"; }
            fi
        done
    done
done

python3 - "$out" "$rounds" "${names[@]}" <<'PY' | tee "$out/table.md"
import json, os, sys

out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def rows(path):
    got = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            got[int(r["pl"])] = r
    return got

print("| model | B | llama.cpp S_TG t/s | infer S_TG t/s | S_TG ratio | llama.cpp S_PP t/s | infer S_PP t/s | S_PP ratio |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for m in names:
    per = [(rows(os.path.join(out, f"{m}-r{k}-llama.jsonl")), rows(os.path.join(out, f"{m}-r{k}-infer.jsonl")))
           for k in range(1, rounds + 1)]
    for pl in sorted(per[0][0]):
        lt = [l[pl]["speed_tg"] for l, i in per if pl in l and pl in i]
        it = [i[pl]["speed_tg"] for l, i in per if pl in l and pl in i]
        lp = [l[pl]["speed_pp"] for l, i in per if pl in l and pl in i]
        ip = [i[pl]["speed_pp"] for l, i in per if pl in l and pl in i]
        rt = [b / a for a, b in zip(lt, it) if a]
        rp = [b / a for a, b in zip(lp, ip) if a]
        f = lambda v: " / ".join(f"{x:.0f}" for x in v)
        r = lambda v: (f"{min(v):.2f}–{max(v):.2f}×" if len(v) > 1 else f"{v[0]:.2f}×") if v else "n/a"
        print(f"| {m} | {pl} | {f(lt)} | {f(it)} | {r(rt)} | {f(lp)} | {f(ip)} | {r(rp)} |")
PY
