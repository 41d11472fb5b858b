#!/usr/bin/env bash
# Peak resident memory of the gateway for a 10 MB request body of five
# million small numbers (`{"model":"m","messages":[0,0,...]}`): once, and
# eight at once, each on a fresh gateway process (VmHWM from /proc).
#
#   bash benches/body_memory.sh              # builds the release binary first
#   GATEWAY_BIN=path SKIP_BUILD=1 bash benches/body_memory.sh
#
# Prints one markdown table row per case. Everything listens on 127.0.0.1
# and is stopped on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GATEWAY_BIN=${GATEWAY_BIN:-$ROOT/target/release/llm-gateway}
SIM_BIN=${SIM_BIN:-$ROOT/target/release/llm-gateway}
if [ "${SKIP_BUILD:-0}" != 1 ]; then (cd "$ROOT" && cargo build --release --quiet); fi
. "$ROOT/benches/lib.sh"
bench_init body-memory

python3 - "$TMP/body.json" <<'PY'
import sys
n = (10 << 20) // 2
with open(sys.argv[1], "w") as f:
    f.write('{"model":"m","messages":[' + "0," * (n - 1) + '0]}')
PY
BODY_BYTES=$(stat -c %s "$TMP/body.json")

ENGINE_PORT=$(free_port)
"$SIM_BIN" sim --engines 1 --port "$ENGINE_PORT" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$ENGINE_PORT"

measure() { # $1 = concurrent requests
    local port dir pid
    port=$(free_port); dir=$TMP/gw-$1
    gateway_config "$dir" "$ENGINE_PORT" "$port" 2 $'max_body_size: 20m\n'
    "$GATEWAY_BIN" --config "$dir/gateway.yaml" 2>"$dir/log" &
    pid=$!; PIDS+=($pid)
    wait_port "$port"
    local idle; idle=$(awk '/VmHWM/{print $2}' "/proc/$pid/status")
    for _ in $(seq 1 "$1"); do
        curl -s -o /dev/null -H 'content-type: application/json' --data-binary @"$TMP/body.json" \
            "http://127.0.0.1:$port/r/v1/chat/completions" &
    done
    wait $(jobs -p | tail -n "$1")
    local peak; peak=$(awk '/VmHWM/{print $2}' "/proc/$pid/status")
    kill "$pid"
    printf '| %s | %d | %.1f MB | %.1f MB | %.1f MB | %.1fx |\n' "$1" "$BODY_BYTES" \
        "$(echo "$idle/1024" | bc -l)" "$(echo "$peak/1024" | bc -l)" \
        "$(echo "($peak-$idle)/1024" | bc -l)" "$(echo "($peak-$idle)*1024/($1*$BODY_BYTES)" | bc -l)"
}

echo "| concurrent 10 MB bodies | body bytes | RSS idle | peak RSS | added | added / (bodies x size) |"
echo "|--:|--:|--:|--:|--:|--:|"
measure 1
measure 8
