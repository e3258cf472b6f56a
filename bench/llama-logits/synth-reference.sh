#!/usr/bin/env bash
# Regenerates testdata/synth-<arch>/: llama.cpp's logits on the tiny
# synthetic model of each architecture (`infer synth --size tiny`).
#
# Usage: bench/llama-logits/synth-reference.sh [--llama-logits BIN] [ARCH...]
#
# Per architecture it writes the Q4_K_M file and the same weights as F32
# (`--dequantized`), both with seed $SEED (default 1), and runs llama-logits
# (bench/llama-logits/build.sh) on each: `logits/` (f16 KV cache, as users
# run llama.cpp) and `logits-f32/` (F32 weights, F32 KV cache: the exact
# forward pass). tests/arch_logits.rs regenerates the same files with the
# same seed and compares by teacher forcing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin=""
archs=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --llama-logits) bin="$2"; shift ;;
        *) archs+=("$1") ;;
    esac
    shift
done
[[ ${#archs[@]} -gt 0 ]] || archs=(gemma3 gemma2 llama qwen2 qwen3 phi3)
[[ -n "$bin" ]] || bin="$root/bench/llama-logits/build/llama-logits"
[[ -x "$bin" ]] || { echo "no llama-logits at $bin (run bench/llama-logits/build.sh)" >&2; exit 1; }
seed="${SEED:-1}"
greedy="${GREEDY:-24}"
infer="${INFER:-${CARGO_TARGET_DIR:-$root/target}/release/infer}"
[[ -x "$infer" ]] || { echo "no infer binary at $infer (cargo build --release -p infer-cli)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf -- "$work"' EXIT
for a in "${archs[@]}"; do
    out="$root/testdata/synth-$a"
    mkdir -p "$out/logits" "$out/logits-f32"
    "$infer" synth --arch "$a" --size tiny --seed "$seed" -o "$work/$a.gguf" >/dev/null
    "$infer" synth --arch "$a" --size tiny --seed "$seed" --dequantized -o "$work/$a-f32.gguf" >/dev/null
    for sub in logits logits-f32; do
        cp "$root/bench/llama-logits/prompts.txt" "$out/$sub/prompts.txt"
        rm -f "$out/$sub"/p*.json "$out/$sub"/p*.last_logits.f32
    done
    "$bin" "$work/$a.gguf" "$out/logits/prompts.txt" "$out/logits" --kv f16 --greedy "$greedy" 2>/dev/null
    "$bin" "$work/$a-f32.gguf" "$out/logits-f32/prompts.txt" "$out/logits-f32" --kv f32 --greedy "$greedy" 2>/dev/null
    printf 'seed %s\nsize tiny\nquant q4_k_m\n' "$seed" > "$out/synth.txt"
    echo "synth-$a: $(ls "$out/logits" | wc -l) + $(ls "$out/logits-f32" | wc -l) files"
done
