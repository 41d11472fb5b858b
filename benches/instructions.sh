#!/usr/bin/env bash
# Instructions the gateway executes per request, counted by callgrind (not
# time: the count is the same whatever else the machine is doing). For each
# scenario the gateway runs under valgrind twice, with N and 6N requests over
# one keep-alive connection; (total(6N) - total(N)) / 5N is the per-request
# cost with start-up and shutdown cancelled out. The engine is `llm-gateway
# sim` outside valgrind.
#
#   bash benches/instructions.sh                       # this checkout's release build
#   GATEWAY_BIN=/path/to/other/llm-gateway bash benches/instructions.sh
#   N=200 SCENARIOS="small stream" bash benches/instructions.sh
#   GATEWAY_EXTRA=$'bodylog:\n  listener: 127.0.0.1:9999\n' bash benches/instructions.sh
#                                 # appended to gateway.yaml (body logging on)
#
# Scenarios: small (198-byte non-stream chat, session id), stream (20 SSE
# frames, include_usage injected), body300k (300 KB non-stream body).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GATEWAY_BIN=${GATEWAY_BIN:-$ROOT/target/release/llm-gateway}
SIM_BIN=${SIM_BIN:-$ROOT/target/release/llm-gateway}
N=${N:-200}
SCENARIOS=${SCENARIOS:-"small stream body300k"}
if [ "${SKIP_BUILD:-1}" != 1 ]; then (cd "$ROOT" && cargo build --release --quiet); fi
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 600); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

ENGINE_PORT=$(free_port)
"$SIM_BIN" sim --engines 1 --port "$ENGINE_PORT" --max-running 64 >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$ENGINE_PORT"

cat > "$TMP/client.py" <<'PY'
import http.client, json, sys
port, scenario, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
msg = {"role": "user", "content": "Say hello to the gateway benchmark, please."}
headers = {"content-type": "application/json", "x-session-id": "bench-session-1", "x-sim-frame-delay-ms": "0"}
if scenario == "small":
    body = {"model": "sim-model", "messages": [msg], "max_tokens": 1}
    headers["x-sim-max-tokens"] = "1"
elif scenario == "stream":
    body = {"model": "sim-model", "messages": [msg], "stream": True}
    headers["x-sim-max-tokens"] = "20"
else:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "x " * 150000}], "max_tokens": 1}
    headers["x-sim-max-tokens"] = "1"
data = json.dumps(body).encode()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
for _ in range(n):
    conn.request("POST", "/r/v1/chat/completions", body=data, headers=headers)
    resp = conn.getresponse()
    out = resp.read()
    if resp.status != 200:
        sys.exit(f"status {resp.status}: {out[:200]!r}")
PY

count() { # $1 scenario, $2 requests → total instructions
    local port admin dir pid
    port=$(free_port); admin=$(free_port); dir=$TMP/$1-$2; mkdir -p "$dir/routes"
    printf 'peers:\n  - {name: e0, host: 127.0.0.1, port: %s, max_concurrency: 100000}\nhealth: {enabled: false}\nengine_metrics: false\ninclude_usage: true\n' "$ENGINE_PORT" > "$dir/routes/r.yaml"
    printf 'listen: 127.0.0.1:%s\nadmin_listen: 127.0.0.1:%s\nroutes_dir: %s\nthreads: 1\napi_keys_file: %s/none\nwatch: false\n%s' "$port" "$admin" "$dir/routes" "$dir" "${GATEWAY_EXTRA:-}" > "$dir/gateway.yaml"
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "$GATEWAY_BIN" --config "$dir/gateway.yaml" 2>"$dir/log" &
    pid=$!; PIDS+=($pid)
    wait_port "$port"
    python3 "$TMP/client.py" "$port" "$1" "$2"
    kill -INT "$pid"; wait "$pid" 2>/dev/null || true
    awk '/^summary:|^totals:/{print $2; exit}' "$dir/cg.out"
}

echo "| scenario | instructions / request |"
echo "|---|--:|"
for s in $SCENARIOS; do
    a=$(count "$s" "$N"); b=$(count "$s" $((6 * N)))
    echo "| $s | $(( (b - a) / (5 * N) )) |"
done
