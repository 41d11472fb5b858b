#!/usr/bin/env bash
# A gateway wrapper for the replay bench that also records what placement
# sees: every 0.25 s it appends "<unix time> <the route's /_route_state
# JSON>" to $ROUTE_STATE_LOG, then leaves when the gateway does. Pass it as
# the bench's gateway and compare with the client's records
# (benches/placement_view.py):
#
#   ROUTE_STATE_LOG=/tmp/state.log GATEWAY_BIN=target/release/llm-gateway \
#     target/release/llm-gateway bench --scenario skewed --modes load_aware \
#       --route-extra 'queue_timeout: 60s' --records /tmp/rec.jsonl \
#       --gateway benches/route_state_trace.sh
#   python3 benches/placement_view.py /tmp/rec.jsonl /tmp/state.log
#
# The bench starts the gateway as `<gateway> --config FILE`; the listen
# address and the routes directory come from that file (one route).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GATEWAY_BIN=${GATEWAY_BIN:-$ROOT/target/release/llm-gateway}
LOG=${ROUTE_STATE_LOG:?ROUTE_STATE_LOG=/path/to/the/log is needed}
config=""
args=("$@")
for i in "${!args[@]}"; do
    [ "${args[$i]}" = --config ] && config=${args[$((i + 1))]}
done
[ -n "$config" ] || { echo "route_state_trace.sh: no --config" >&2; exit 1; }
listen=$(awk '/^listen:/ {gsub(/"/, "", $2); print $2}' "$config")
routes=$(awk '/^routes_dir:/ {print $2}' "$config")
gateway=$$ # the exec below keeps this pid
(
    route=""
    while kill -0 "$gateway" 2>/dev/null; do
        if [ -z "$route" ]; then
            file=$(ls "$routes"/*.yaml 2>/dev/null | head -1)
            [ -n "$file" ] && route=$(basename "$file" .yaml)
        fi
        if [ -n "$route" ] && state=$(curl -sf -m 1 "http://$listen/$route/_route_state"); then
            echo "$(date +%s.%N) $state" >> "$LOG"
        fi
        sleep 0.25
    done
) &
exec "$GATEWAY_BIN" "$@"
