#!/usr/bin/env bash
# Starts an OpenAI-compatible server on a free port and runs
# .ci/openai_check.py (the official `openai` Python client) against it.
#
# Usage: .ci/openai_check.sh [-m MODEL] [--venv DIR] [--timeout S] -- SERVER ARGS...
#
#   SERVER ARGS...  the server's command; `-m MODEL --host 127.0.0.1 --port
#                   PORT` are appended (the flags of both `infer serve` and
#                   llama-server), e.g.
#                     .ci/openai_check.sh -- target/release/infer serve -np 2 -c 512
#                     .ci/openai_check.sh -- ~/.cache/infer-compute/llama.cpp/build-cpu-11434.0.0/bin/llama-server -np 2 -c 1024
#   -m MODEL        a GGUF file with a chat template (default:
#                   ~/.cache/infer-compute/SmolLM2-135M-Instruct.Q4_1.gguf,
#                   or $OPENAI_CHECK_MODEL).
#   --venv DIR      the Python virtual environment holding `openai`, created
#                   (python3 -m venv; pip install from PyPI) when it lacks it
#                   (default: $OPENAI_CHECK_VENV, else
#                   ~/.cache/infer-compute/openai-venv).
#   --timeout S     seconds to wait for /health to answer 200 (default 180).
#
# The server's output goes to a log file, printed (its end) when the server
# dies or a check fails. The server is stopped on exit, Ctrl-C included.
# Exit status: that of the checks (0: all passed), 2 for a usage error or a
# server that did not come up.

set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "openai_check: error: $*" >&2; exit 2; }
log() { echo "openai_check: $*" >&2; }

model="${OPENAI_CHECK_MODEL:-${INFER_CACHE_DIR:-$HOME/.cache/infer-compute}/SmolLM2-135M-Instruct.Q4_1.gguf}"
venv="${OPENAI_CHECK_VENV:-${INFER_CACHE_DIR:-$HOME/.cache/infer-compute}/openai-venv}"
timeout=180
while [[ $# -gt 0 ]]; do
    case "$1" in
        -m|--model) [[ $# -ge 2 ]] || die "$1 needs a file"; model="$2"; shift ;;
        --venv) [[ $# -ge 2 ]] || die "--venv needs a directory"; venv="$2"; shift ;;
        --timeout) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--timeout needs seconds"; timeout="$2"; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        --) shift; break ;;
        *) die "unknown argument: $1 (the server command goes after --; see --help)" ;;
    esac
    shift
done
[[ $# -gt 0 ]] || die "no server command (after --; see --help)"
[[ -f "$model" ]] || die "model $model does not exist"
command -v "$1" >/dev/null 2>&1 || [[ -x "$1" ]] || die "server command $1 not found"

# The client, in its own virtual environment.
if ! "$venv/bin/python" -c 'import openai' >/dev/null 2>&1; then
    log "creating $venv with the openai package"
    python3 -m venv "$venv" || die "python3 -m venv $venv failed (apt-get install python3-venv?)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'openai>=1.40,<3' >&2 \
        || die "pip install openai failed (is PyPI reachable?)"
fi
log "openai $("$venv/bin/python" -c 'import openai; print(openai.__version__)')"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port"
logfile="$(mktemp "${TMPDIR:-/tmp}/openai_check.XXXXXX.log")"
server_pid=""
stop_server() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    server_pid=""
}
trap 'stop_server; rm -f -- "$logfile"' EXIT
trap 'exit 130' INT TERM

log "starting: $* -m $model --host 127.0.0.1 --port $port"
"$@" -m "$model" --host 127.0.0.1 --port "$port" > "$logfile" 2>&1 &
server_pid=$!

# /health answers 200 once the model is loaded (503 while loading).
healthy=0
deadline=$((SECONDS + timeout))
while (( SECONDS < deadline )); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        tail -n 30 "$logfile" >&2
        die "the server exited before answering /health"
    fi
    if python3 - "$url/health" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
    then healthy=1; break; fi
    sleep 0.5
done
if [[ $healthy == 0 ]]; then
    tail -n 30 "$logfile" >&2
    die "no 200 from $url/health within $timeout s"
fi
log "server healthy at $url"

rc=0
"$venv/bin/python" .ci/openai_check.py "$url" || rc=$?
if [[ $rc != 0 ]]; then
    log "the server's log (end):"
    tail -n 30 "$logfile" >&2
fi
exit "$rc"
