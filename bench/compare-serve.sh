#!/usr/bin/env bash
# Serving side by side: `infer serve` against llama.cpp's llama-server on the
# same GGUF file, loaded by `infer bench serve` (concurrent streaming
# clients), in alternating rounds, in one command (CPU or CUDA; on a machine
# without network with --llama-src).
#
# Usage: bench/compare-serve.sh [--backend cuda|cpu] [--llama-server PATH | --llama-src DIR]
#            [--infer PATH] [--tokenizer-from F] [--models "llama-1b gemma3-4b" | --model F]
#            [--rounds 2] [--clients 1,4,16,64] [-r 4] [--prompt-tokens 128] [--max-tokens 128]
#            [--endpoint completions|chat] [-np N] [--ctx-per-slot C] [-t N] [--out DIR]
#
#   --backend B      cuda (default; llama-server with -ngl 99 -fa on, infer
#                    with --backend cuda) or cpu (both servers with -t N).
#   --llama-server PATH  a built llama-server; otherwise it is built with
#                    bench/build-llama-cpp.sh (--cuda for the CUDA backend;
#                    --src DIR when --llama-src names a tree, e.g. a --trim
#                    copy).
#   --infer PATH     the infer binary: `infer serve` and the load generator
#                    `infer bench serve` (default: target/release/infer).
#   --tokenizer-from F  GGUF with the Gemma 3 tokenizer, for Gemma 3 sizes on
#                    a machine that cannot fetch the default model.
#   --models LIST    synthetic Q4_K_M models, as ARCH-SIZE (made with infer
#                    synth into the output directory); --model F serves one
#                    file instead.
#   --rounds K       rounds; the server that goes first alternates.
#   --clients LIST   concurrency levels (clients at once), each client
#                    sending -r requests in sequence.
#   -np N            slots of both servers (default: the largest client count).
#   --ctx-per-slot C context positions per slot (default 512): llama-server
#                    gets -c C·N (its -c is the total), infer serve -c C.
#   --out DIR        where the models, the servers' logs, the raw JSONL and
#                    the table go (default: a temporary directory, kept);
#                    results worth keeping are copied to bench/results/.
#
# Environment:
#   OURS_SERVER_CMD  the command of "ours" instead of `$infer serve`, e.g. a
#                    llama-server to check this script end to end with the
#                    same server on both sides; `-m F --host 127.0.0.1 --port
#                    P -np N -c C` (and -t N on the CPU) are appended.
#   INFER_SERVE_ARGS extra arguments of `infer serve` (default: --backend B).
#   LLAMA_SERVER_ARGS extra arguments of llama-server.
#   HEALTH_TIMEOUT   seconds to wait for a server's /health (default 300).
#
# Each server is started on a free port, waited for (/health answers 200),
# loaded with every client count, and stopped. The table (printed last, and
# written to DIR/table.md) gives per model and client count the aggregate
# generated tokens/s of each server (one value per round), their ratio
# (infer / llama-server) and the time to first token, p50 and p99, beside it.
# A second table gives infer serve's steps per level (its /metrics): steps,
# tokens per step and milliseconds per step in the forward, the rows and
# the rest.

set -euo pipefail

die() { echo "compare-serve: error: $*" >&2; exit 1; }
log() { echo "compare-serve: $*" >&2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/synth-model.sh
source "$here/synth-model.sh"
root="$(cd "$here/.." && pwd)"

backend=cuda
lserver=""
llama_src=""
infer=""
tokenizer=""
models="llama-1b gemma3-4b"
model_file=""
rounds=2
clients="1,4,16,64"
reqs=4
ptok=128
mtok=128
endpoint=completions
np=""
ctx_slot=512
threads="$(nproc)"
out=""
need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) need "$@"; backend="$2"; shift ;;
        --llama-server) need "$@"; lserver="$2"; shift ;;
        --llama-src) need "$@"; llama_src="$2"; shift ;;
        --infer) need "$@"; infer="$2"; shift ;;
        --tokenizer-from) need "$@"; tokenizer="$2"; shift ;;
        --models) need "$@"; models="$2"; shift ;;
        --model) need "$@"; model_file="$2"; shift ;;
        --rounds) need "$@"; rounds="$2"; shift ;;
        --clients) need "$@"; clients="$2"; shift ;;
        -r|--requests-per-client) need "$@"; reqs="$2"; shift ;;
        --prompt-tokens) need "$@"; ptok="$2"; shift ;;
        --max-tokens) need "$@"; mtok="$2"; shift ;;
        --endpoint) need "$@"; endpoint="$2"; shift ;;
        -np|--parallel) need "$@"; np="$2"; shift ;;
        --ctx-per-slot) need "$@"; ctx_slot="$2"; shift ;;
        -t|--threads) need "$@"; threads="$2"; shift ;;
        --out) need "$@"; out="$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ "$backend" == cuda || "$backend" == cpu ]] || die "--backend must be cuda or cpu, got '$backend'"
[[ "$endpoint" == completions || "$endpoint" == chat ]] || die "--endpoint must be completions or chat"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
[[ "$clients" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--clients must be a comma list of positive counts, got '$clients'"
for v in reqs ptok mtok ctx_slot threads; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
max_clients="$(tr ',' '\n' <<< "$clients" | sort -n | tail -n1)"
[[ -n "$np" ]] || np="$max_clients"
[[ "$np" =~ ^[1-9][0-9]*$ ]] || die "-np must be a positive integer, got '$np'"
(( ptok + mtok + 16 <= ctx_slot )) || log "warning: --prompt-tokens + --max-tokens ($((ptok + mtok))) nearly fills --ctx-per-slot $ctx_slot"
command -v python3 >/dev/null 2>&1 || die "python3 is required"

if [[ -z "$lserver" ]]; then
    build_args=()
    [[ "$backend" == cuda ]] && build_args+=(--cuda)
    [[ -n "$llama_src" ]] && build_args+=(--src "$llama_src")
    log "building (or reusing) llama.cpp's $backend build"
    bin_dir="$("$here/build-llama-cpp.sh" "${build_args[@]}")" || die "bench/build-llama-cpp.sh failed"
    lserver="$bin_dir/llama-server"
fi
[[ -x "$lserver" ]] || die "llama-server not found at $lserver"
[[ -n "$infer" ]] || infer="${CARGO_TARGET_DIR:-$root/target}/release/infer"
[[ -x "$infer" ]] || die "infer not found at $infer"

[[ -n "$out" ]] || out="$(mktemp -d "${TMPDIR:-/tmp}/infer-compare-serve.XXXXXX")"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log "output: $out"

# The servers' commands, before `-m F --host H --port P`.
llama_cmd=("$lserver" -np "$np" -c "$((ctx_slot * np))" --no-webui)
extra=()
[[ -n "${LLAMA_SERVER_ARGS:-}" ]] && read -r -a extra <<< "$LLAMA_SERVER_ARGS"
if [[ "$backend" == cuda ]]; then
    llama_cmd+=(-ngl 99 -fa on)
else
    llama_cmd+=(-ngl 0 -t "$threads" -tb "$threads")
fi
llama_cmd+=("${extra[@]}")
if [[ -n "${OURS_SERVER_CMD:-}" ]]; then
    read -r -a ours_cmd <<< "$OURS_SERVER_CMD"
    ours_cmd+=(-np "$np" -c "$ctx_slot")
    [[ "$backend" == cpu ]] && ours_cmd+=(-t "$threads")
    log "ours: $OURS_SERVER_CMD (OURS_SERVER_CMD), not infer serve"
else
    ours_cmd=("$infer" serve -np "$np" -c "$ctx_slot")
    [[ "$backend" == cpu ]] && ours_cmd+=(-t "$threads")
    if [[ -n "${INFER_SERVE_ARGS+set}" ]]; then
        read -r -a extra <<< "$INFER_SERVE_ARGS"
        ours_cmd+=("${extra[@]}")
    else
        ours_cmd+=(--backend "$backend")
    fi
fi
load_args=(bench serve --clients "$clients" -r "$reqs" --prompt-tokens "$ptok" --max-tokens "$mtok"
           --endpoint "$endpoint" -o jsonl)

server_pid=""
stop_server() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$server_pid" 2>/dev/null || true
    fi
    [[ -n "$server_pid" ]] && { wait "$server_pid" 2>/dev/null || true; }
    server_pid=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_health URL LOG: until URL/health answers 200; fails when the server
# exits or HEALTH_TIMEOUT passes.
wait_health() {
    local deadline=$((SECONDS + ${HEALTH_TIMEOUT:-300}))
    while (( SECONDS < deadline )); do
        kill -0 "$server_pid" 2>/dev/null || { tail -n 20 "$2" >&2; die "the server exited before answering /health (log: $2)"; }
        python3 - "$1/health" <<'EOF' 2>/dev/null && return 0
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
        sleep 0.5
    done
    tail -n 20 "$2" >&2
    die "no 200 from $1/health within ${HEALTH_TIMEOUT:-300} s (log: $2)"
}

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
            if [[ "$who" == llama ]]; then cmd=("${llama_cmd[@]}"); else cmd=("${ours_cmd[@]}"); fi
            port="$(free_port)"
            url="http://127.0.0.1:$port"
            slog="$out/$m-r$k-$who-server.log"
            log "$m round $k: $who: ${cmd[*]} -m $f --port $port"
            "${cmd[@]}" -m "$f" --host 127.0.0.1 --port "$port" > "$slog" 2>&1 &
            server_pid=$!
            wait_health "$url" "$slog"
            "$infer" "${load_args[@]}" --url "$url" --label "$who" --seed "$k" \
                > "$out/$m-r$k-$who.jsonl" 2> "$out/$m-r$k-$who.log" \
                || { tail -n 20 "$out/$m-r$k-$who.log" >&2; die "infer bench serve against $who failed on $m"; }
            stop_server
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
            got[int(r["clients"])] = r
    return got

first = None
print("| model | clients | infer gen t/s | llama-server gen t/s | ratio | infer TTFT p50 / p99 ms | llama-server TTFT p50 / p99 ms | errors (infer; llama) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for m in names:
    per = [(rows(os.path.join(out, f"{m}-r{k}-infer.jsonl")), rows(os.path.join(out, f"{m}-r{k}-llama.jsonl")))
           for k in range(1, rounds + 1)]
    for c in sorted(per[0][0]):
        both = [(i[c], l[c]) for i, l in per if c in i and c in l]
        first = first or both[0][0]
        it = [i["tokens_per_s"] for i, _ in both]
        lt = [l["tokens_per_s"] for _, l in both]
        ratio = [a / b for a, b in zip(it, lt) if b]
        f = lambda v: " / ".join(f"{x:.1f}" for x in v)
        r = lambda v: (f"{min(v):.2f}–{max(v):.2f}×" if len(v) > 1 else f"{v[0]:.2f}×") if v else "n/a"
        def ms(x):
            return "-" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.1f}")
        ttft = lambda rs: " · ".join(f"{ms(x['ttft_ms']['p50'])} / {ms(x['ttft_ms']['p99'])}" for x in rs)
        def errs(rs):
            n = sum(sum(x["errors"].values()) for x in rs)
            return str(n) if n == 0 else ", ".join(sorted({f"{k}: {v}" for x in rs for k, v in x["errors"].items()}))
        print(f"| {m} | {c} | {f(it)} | {f(lt)} | {r(ratio)} | {ttft([i for i, _ in both])} | "
              f"{ttft([l for _, l in both])} | {errs([i for i, _ in both])}; {errs([l for _, l in both])} |")
steps = [(m, c, k, r["server_steps"]) for m in names for k in range(1, rounds + 1)
         for c, r in sorted(rows(os.path.join(out, f"{m}-r{k}-infer.jsonl")).items()) if r.get("server_steps")]
if steps:
    print("\ninfer serve's steps (its /metrics, read before and after each level):\n")
    print("| model | clients | round | steps | tokens/step | forward ms/step | rows ms/step | schedule ms/step | engine busy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m, c, k, p in steps:
        print(f"| {m} | {c} | {k} | {p['steps']} | {p['tokens_per_step']:.1f} | {p['forward_ms']:.3f} | "
              f"{p['rows_ms']:.3f} | {p['schedule_ms']:.3f} | {100 * p['busy_fraction']:.0f}% |")
if first:
    print(f"\nOne value per round. {first['requests_per_client']} requests per client, prompt ≈ "
          f"{first['prompt_tokens_target']} tokens ({first['prompt_tokens_mean'] or 0:.0f} reported), "
          f"{first['max_tokens']} tokens per reply (ignore_eos), /v1/{first['endpoint']}, "
          f"temperature {first['temperature']}; ratio = infer / llama-server generated tokens/s.")
PY
if [[ -n "${OURS_SERVER_CMD:-}" ]]; then
    echo "\"infer\" above ran OURS_SERVER_CMD=$OURS_SERVER_CMD, not infer serve." | tee -a "$out/table.md"
fi
