#!/usr/bin/env bash
# Perplexity of one model over one text, by `infer perplexity` and by
# llama.cpp's `llama-perplexity`, with the same chunking (-c), the same
# number of chunks and the same KV cache types, one after the other.
#
# Usage: bench/compare-perplexity.sh -m MODEL [-f TEXT] [-c 2048] [--chunks N]
#            [-t THREADS] [-ctk f16] [-ctv f16] [--infer PATH] [--out DIR]
#
# TEXT defaults to the benchmark text, the Book of Genesis of the King
# James Version (public domain), as the Debian package bible-kjv-text ships
# it, printed by its `bible` program (`bible "Genesis1:1-50:26"`); it is
# installed with apt-get when missing and written to
# ${INFER_CACHE_DIR:-~/.cache/infer-compute}/kjv-genesis.txt.
#
# Prints both tools' final estimates and their ratio; the raw outputs are
# kept in DIR (default: a temporary directory, printed).

set -euo pipefail

die() { echo "compare-perplexity: error: $*" >&2; exit 1; }

model="" text="" ctx=2048 chunks=-1 threads="" ctk=f16 ctv=f16 infer="" out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -m|--model) model="$2"; shift ;;
        -f|--file) text="$2"; shift ;;
        -c|--ctx-size) ctx="$2"; shift ;;
        --chunks) chunks="$2"; shift ;;
        -t|--threads) threads="$2"; shift ;;
        -ctk|--cache-type-k) ctk="$2"; shift ;;
        -ctv|--cache-type-v) ctv="$2"; shift ;;
        --infer) infer="$2"; shift ;;
        --out) out="$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ -n "$model" ]] || die "-m MODEL is required"

cache="${INFER_CACHE_DIR:-$HOME/.cache/infer-compute}"
if [[ -z "$text" ]]; then
    text="$cache/kjv-genesis.txt"
    if [[ ! -s "$text" ]]; then
        command -v bible >/dev/null || apt-get install -y bible-kjv bible-kjv-text >&2 \
            || die "installing bible-kjv bible-kjv-text failed"
        mkdir -p "$cache"
        bible "Genesis1:1-50:26" > "$text.tmp" && mv "$text.tmp" "$text"
    fi
fi
[[ -s "$text" ]] || die "no text at $text"

here="$(cd "$(dirname "$0")" && pwd)"
llama_bin="$("$here/build-llama-cpp.sh")"
[[ -x "$llama_bin/llama-perplexity" ]] || die "llama-perplexity is not in $llama_bin"
if [[ -z "$infer" ]]; then
    (cd "$here/.." && cargo build --release -p infer-cli >&2)
    infer="${CARGO_TARGET_DIR:-$here/../target}/release/infer"
fi
[[ -n "$out" ]] || out="$(mktemp -d)"
mkdir -p "$out"

targs=()
[[ -n "$threads" ]] && targs=(-t "$threads")
"$llama_bin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" "${targs[@]}" \
    -ctk "$ctk" -ctv "$ctv" > "$out/llama.txt" 2>&1 || die "llama-perplexity failed: see $out/llama.txt"
"$infer" perplexity -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" "${targs[@]}" \
    -ctk "$ctk" -ctv "$ctv" > "$out/infer.txt" 2>&1 || die "infer perplexity failed: see $out/infer.txt"

final() { grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$1" | tail -1; }
l="$(final "$out/llama.txt")" i="$(final "$out/infer.txt")"
echo "llama-perplexity: $l"
echo "infer perplexity: $i"
lp="$(awk '{print $5}' <<< "$l")" ip="$(awk '{print $5}' <<< "$i")"
awk -v a="$ip" -v b="$lp" 'BEGIN { printf "infer / llama.cpp: %.5f (%+.3f%%)\n", a / b, (a / b - 1) * 100 }'
echo "raw output: $out"
