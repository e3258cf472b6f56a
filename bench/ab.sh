#!/usr/bin/env bash
# A/B of infer builds or settings on one machine: every variant runs
# `infer bench` on every model, in rounds whose order alternates, and one
# table gives each variant's tokens/s per round and its ratio to the first.
#
# Usage: bench/ab.sh --variant SPEC [--variant SPEC ...] --model F [--model F ...]
#            [--infer PATH] [--backend cuda] [-p 0] [-n 128] [-r 3] [--rounds 2] [--out DIR]
#
#   --variant SPEC   NAME[@BIN][:VAR=VALUE[;VAR=VALUE...]]: a name, the infer
#                    binary (default --infer) and environment variables for
#                    it, e.g. `base`, `old@/tmp/infer-old`,
#                    `t1s:INFER_CUDA_NVRTC_OPTS=-DMV_T1S_MIN_BLOCKS=8`.
#                    The first variant is the reference of the ratios.
#   --model F        a GGUF file (repeat for several).
#   --infer PATH     the default binary (default: $CARGO_TARGET_DIR or
#                    target/, release).
#   --backend B      passed to `infer bench --backend` (default cuda).
#   -p, -n, -r       prompt tokens, generated tokens, repetitions per run.
#   --rounds K       rounds; odd rounds run the variants in the order given,
#                    even rounds in reverse, so that drift (clocks, heat, a
#                    shared machine) does not favour one of them.
#   --out DIR        where the raw lines (ab.txt: round, model, test,
#                    variant, t/s, sd) and the table (table.md) go
#                    (default: a temporary directory, kept).
#
# The ratio column is the geometric mean over the models of each variant's
# mean over rounds divided by the reference's; the spread of the rounds is
# in the cells ("r1 / r2 / ..."), to be read before the ratio.

set -euo pipefail

die() { echo "ab: error: $*" >&2; exit 1; }
log() { echo "ab: $*" >&2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

variants=()
models=()
infer=""
backend="cuda"
n_prompt=0
n_gen=128
reps=3
rounds=2
out=""
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --variant) need "$@"; variants+=("$2"); shift ;;
        --model) need "$@"; models+=("$2"); shift ;;
        --infer) need "$@"; infer="$2"; shift ;;
        --backend) need "$@"; backend="$2"; shift ;;
        -p|--n-prompt) need "$@"; n_prompt="$2"; shift ;;
        -n|--n-gen) need "$@"; n_gen="$2"; shift ;;
        -r|--repetitions) need "$@"; reps="$2"; shift ;;
        --rounds) need "$@"; rounds="$2"; shift ;;
        --out) need "$@"; out="$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ ${#variants[@]} -ge 1 ]] || die "give at least one --variant"
[[ ${#models[@]} -ge 1 ]] || die "give at least one --model"
for v in n_prompt n_gen reps; do [[ "${!v}" =~ ^[0-9]+$ ]] || die "-p, -n and -r take whole numbers"; done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
[[ "$reps" -ge 1 ]] || die "-r must be at least 1"
command -v python3 >/dev/null 2>&1 || die "python3 is required"
[[ -n "$infer" ]] || infer="${CARGO_TARGET_DIR:-$root/target}/release/infer"
for m in "${models[@]}"; do [[ -f "$m" ]] || die "no model file at $m"; done

# Parse the variants: names, binaries, environments (one line per variable).
names=()
bins=()
envs=()
for spec in "${variants[@]}"; do
    head="${spec%%:*}"
    env_part=""
    [[ "$spec" == *:* ]] && env_part="${spec#*:}"
    name="${head%%@*}"
    bin="$infer"
    [[ "$head" == *@* ]] && bin="${head#*@}"
    [[ "$name" =~ ^[A-Za-z0-9_.+-]+$ ]] || die "variant name '$name' in '$spec': letters, digits and . _ + - only"
    for n in "${names[@]+"${names[@]}"}"; do [[ "$n" != "$name" ]] || die "two variants named '$name'"; done
    [[ -x "$bin" ]] || die "variant '$name': no executable at $bin"
    vars=""
    if [[ -n "$env_part" ]]; then
        IFS=';' read -r -a pairs <<< "$env_part"
        for p in "${pairs[@]}"; do
            [[ "$p" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "variant '$name': '$p' is not VAR=VALUE"
            vars+="$p"$'\n'
        done
    fi
    names+=("$name")
    bins+=("$bin")
    envs+=("$vars")
done

[[ -n "$out" ]] || out="$(mktemp -d "${TMPDIR:-/tmp}/infer-ab.XXXXXX")"
mkdir -p "$out"
raw="$out/ab.txt"
: > "$raw"
log "output: $out"

# One run: variant i on model m in round r; appends "r model test variant t/s sd".
run() {
    local i=$1 m=$2 r=$3
    local -a assign=()
    while IFS= read -r line; do [[ -n "$line" ]] && assign+=("$line"); done <<< "${envs[$i]}"
    local json
    json="$(env "${assign[@]+"${assign[@]}"}" "${bins[$i]}" bench --model "$m" --backend "$backend" \
        -p "$n_prompt" -n "$n_gen" -r "$reps" --json 2> "$out/last-stderr.txt")" \
        || die "variant '${names[$i]}' on $m failed: $(tail -3 "$out/last-stderr.txt")"
    python3 - "$r" "$(basename "$m" .gguf)" "${names[$i]}" "$json" >> "$raw" <<'EOF' || die "variant '${names[$i]}' on $m: unreadable JSON"
import json, sys
r, model, name, text = sys.argv[1:5]
for t in json.loads(text):
    print(r, model, t["test"], name, f'{t["avg_ts"]:.2f}', f'{t["stddev_ts"]:.2f}')
EOF
    tail -n "$(( (n_prompt > 0) + (n_gen > 0) ))" "$raw" | sed 's/^/ab: /' >&2
}

n=${#names[@]}
for ((r = 1; r <= rounds; r++)); do
    for m in "${models[@]}"; do
        for ((k = 0; k < n; k++)); do
            if (( r % 2 == 1 )); then i=$k; else i=$((n - 1 - k)); fi
            run "$i" "$m" "$r"
        done
    done
done

python3 - "$raw" "${names[@]}" > "$out/table.md" <<'EOF'
import collections, math, sys
raw, names = sys.argv[1], sys.argv[2:]
runs = collections.defaultdict(list)  # (model, test, variant) -> [t/s per round]
cols = []
for line in open(raw):
    r, model, test, name, ts, sd = line.split()
    key = (model, test)
    if key not in cols:
        cols.append(key)
    runs[(model, test, name)].append(float(ts))
mean = lambda v: sum(v) / len(v)
head = ["variant"] + [f"{m} {t}" for m, t in cols] + ["ratio"]
print("| " + " | ".join(head) + " |")
print("| --- " + "| ---: " * (len(head) - 1) + "|")
for name in names:
    cells, logs = [], []
    for m, t in cols:
        v, ref = runs[(m, t, name)], runs[(m, t, names[0])]
        cells.append(" / ".join(f"{x:.0f}" if x >= 100 else f"{x:.1f}" for x in v))
        logs.append(math.log(mean(v) / mean(ref)))
    ratio = math.exp(sum(logs) / len(logs))
    print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.3f} |")
EOF
cat "$out/table.md"
