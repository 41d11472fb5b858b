#!/usr/bin/env bash
# What the shared session store (issue 11) adds to a request: two gateway
# replicas on one redis-server and one simulated engine, wrk driving replica A
# while B takes the other turns, then A's own histogram of the time a request
# waited on Redis before placement (llm_gateway_session_store_wait_seconds)
# and its Redis commands per request (llm_gateway_session_store_ops_total).
#
#   bash benches/session_store_overhead.sh     # ~1 minute; prints a markdown table
#
# Two workloads, DURATION each (default 10s), one connection:
#   new      every request a new session: a GET and a SET NX on the path
#   64-cycle 64 sessions in turn, each turn alternating A and B: a session
#            comes back after ~64 requests, past the 1 s trust window only
#            when the rate is below 64/s, so most turns are agreed locally
# Needs: redis-server, wrk, curl, a release build (SKIP_BUILD=1 to reuse it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${DURATION:-10s}
BIN=${GATEWAY_BIN:-$ROOT/target/release/llm-gateway}
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release --quiet)
. "$ROOT/benches/lib.sh"
bench_init session-store-overhead

RP=$(free_port); EP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" >/dev/null &
PIDS+=($!)
"$BIN" sim --engines 1 --port "$EP" --max-running 64 >/dev/null 2>&1 &
PIDS+=($!)
start_gateway() { # name
  local dir=$TMP/$1 port admin
  mkdir -p "$dir/routes"
  port=$(free_port); admin=$(free_port)
  printf 'peers:\n  - {name: e0, host: 127.0.0.1, port: %s, max_concurrency: 256}\n' "$EP" > "$dir/routes/chat.yaml"
  printf 'listen: 127.0.0.1:%s\nadmin_listen: 127.0.0.1:%s\nroutes_dir: %s/routes\nthreads: 1\napi_keys_file: /nonexistent\nwatch: false\nsession_store:\n  kind: redis\n  url: redis://127.0.0.1:%s/0\n' \
    "$port" "$admin" "$dir" "$RP" > "$dir/gateway.yaml"
  RUST_LOG=warn "$BIN" --config "$dir/gateway.yaml" >"$dir/log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$admin/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "$port $admin"
}
read -r A_PORT A_ADMIN < <(start_gateway a)
read -r B_PORT B_ADMIN < <(start_gateway b)

cat > "$TMP/new.lua" <<'LUA'
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
request = function()
  n = n + 1
  wrk.headers["x-session-id"] = "new-" .. n
  return wrk.format(nil, "/chat/v1/chat/completions")
end
LUA
cat > "$TMP/cycle.lua" <<'LUA'
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
request = function()
  n = n + 1
  wrk.headers["x-session-id"] = "cycle-" .. (n % 64)
  return wrk.format(nil, "/chat/v1/chat/completions")
end
LUA

metric() { # admin name filter
  { curl -fs "http://127.0.0.1:$1/metrics" | grep "^$2" | grep -- "$3" || true; } | awk '{s+=$2} END {print s+0}'
}
buckets() { # admin: "le count" lines of the wait histogram
  { curl -fs "http://127.0.0.1:$1/metrics" | grep '^llm_gateway_session_store_wait_seconds_bucket' || true; } |
    sed -E 's/.*le="([^"]+)".* ([0-9.e+]+)$/\1 \2/'
}
delta_quantile() { # before-file after-file q: the bucket bound holding quantile q of the new samples
  python3 - "$1" "$2" "$3" <<'PY'
import sys
def read(p):
    out = {"+Inf": 0.0}
    for line in open(p):
        le, c = line.split()
        out[le] = float(c)
    return out
a, b, q = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
les = sorted(b, key=lambda x: float("inf") if x == "+Inf" else float(x))
total = b["+Inf"] - a.get("+Inf", 0)
if total <= 0:
    print("-")
    sys.exit(0)
for le in les:
    if b[le] - a.get(le, 0) >= q * total:
        print(le if le == "+Inf" else f"{float(le) * 1e6:.0f} µs")
        break
PY
}

echo "| workload | requests (A) | wait p50 ≤ | wait p99 ≤ | Redis commands / request |"
echo "|---|---|---|---|---|"
for w in new cycle; do
  buckets "$A_ADMIN" > "$TMP/before"
  ops0=$(metric "$A_ADMIN" llm_gateway_session_store_ops_total "")
  req0=$(metric "$A_ADMIN" llm_gateway_session_store_wait_seconds_count "")
  # B takes every other turn of the cycled sessions, as a Service would.
  if [ "$w" = cycle ]; then
    wrk -t1 -c1 -d"$DURATION" -s "$TMP/cycle.lua" "http://127.0.0.1:$B_PORT" >/dev/null &
    PIDS+=($!)
  fi
  wrk -t1 -c1 -d"$DURATION" -s "$TMP/$w.lua" "http://127.0.0.1:$A_PORT" >/dev/null
  [ "$w" = cycle ] && { wait "${PIDS[-1]}" 2>/dev/null || true; }
  buckets "$A_ADMIN" > "$TMP/after"
  ops=$(metric "$A_ADMIN" llm_gateway_session_store_ops_total "")
  req=$(metric "$A_ADMIN" llm_gateway_session_store_wait_seconds_count "")
  n=$(awk -v a="$req" -v b="$req0" 'BEGIN {print a-b}')
  per=$(awk -v a="$ops" -v b="$ops0" -v n="$n" 'BEGIN {printf "%.2f", (a-b)/(n>0?n:1)}')
  echo "| $w | $n | $(delta_quantile "$TMP/before" "$TMP/after" 0.5) | $(delta_quantile "$TMP/before" "$TMP/after" 0.99) | $per |"
done
echo
echo "(bucket bounds of A's wait histogram over each workload; commands include the load exchange: in-flight 20/s, live sessions 4/s)"
