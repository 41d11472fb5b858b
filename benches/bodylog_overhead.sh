#!/usr/bin/env bash
# What body logging (issue 10) costs per request, counted in instructions
# (callgrind, via benches/instructions.sh) so the figure does not move with
# the machine's load: off, on with the listener up (`llm-gateway
# bodylog-listen`), and on with the listener down (nothing listening: the
# frames are queued, then dropped).
#
#   bash benches/bodylog_overhead.sh          # N=100 by default; ~10 minutes
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GATEWAY_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/llm-gateway}
export N=${N:-100} SCENARIOS=${SCENARIOS:-"small stream"} TARGETS=${TARGETS:-gateway}
. "$ROOT/benches/lib.sh"
bench_init bodylog-overhead

UP=$(free_port); DOWN=$(free_port)
"$BIN" bodylog-listen --listen "127.0.0.1:$UP" --dir "$TMP/logs" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$UP"

run() { # label extra
  echo "### $1"
  GATEWAY_EXTRA=$2 bash "$ROOT/benches/instructions.sh"
  echo
}
run "body logging off" ""
run "body logging on, listener up" $'bodylog:\n  listener: 127.0.0.1:'"$UP"$'\n'
run "body logging on, listener down" $'bodylog:\n  listener: 127.0.0.1:'"$DOWN"$'\n'
echo "records written by the listener: $(cat "$TMP"/logs/*.jsonl 2>/dev/null | wc -l)"
