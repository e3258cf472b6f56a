#!/usr/bin/env bash
# Builds bench/llama-logits/llama-logits, a static binary (libllama, ggml and
# the C library linked in, so it runs on any x86-64 Linux), against a
# llama.cpp source tree: the one bench/build-llama-cpp.sh caches, or --src
# DIR (for instance a `bench/build-llama-cpp.sh --trim` copy).
#
# Usage: bench/llama-logits/build.sh [--src DIR] [--jobs N] [--out DIR] [--quantize]
# CPU code: AVX2/FMA/F16C, no AVX-512 (the development machines' level).
# --quantize also builds the tree's llama-quantize (static, the same
# libllama), which makes the F32 files of the logits-f32/ references:
#   llama-quantize --allow-requantize MODEL.gguf MODEL-f32.gguf F32
# The tree's common library and tools are configured (not built unless
# asked for) either way, so both targets share one build directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src=""; jobs=2; out="$here/build"; targets=(llama-logits)
while [[ $# -gt 0 ]]; do
    case "$1" in
        --src) src="$2"; shift ;;
        --jobs) jobs="$2"; shift ;;
        --out) out="$2"; shift ;;
        --quantize) targets+=(llama-quantize) ;;
        *) echo "llama-logits/build.sh: unknown argument $1" >&2; exit 1 ;;
    esac
    shift
done
if [[ -z "$src" ]]; then
    cache="${INFER_CACHE_DIR:-$HOME/.cache/infer-compute}/llama.cpp"
    src="$(ls -d "$cache"/src-*/llama.cpp 2>/dev/null | tail -n1)"
    [[ -n "$src" ]] || { echo "no llama.cpp source in $cache (run bench/build-llama-cpp.sh)" >&2; exit 1; }
fi
cmake -S "$here" -B "$out" -DLLAMA_CPP_DIR="$src" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_EXE_LINKER_FLAGS="-static" >&2
cmake --build "$out" --target "${targets[@]}" -j "$jobs" >&2
echo "$out/llama-logits"
[[ ${#targets[@]} -eq 1 ]] || echo "$out/bin/llama-quantize"
