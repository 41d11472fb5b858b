#!/usr/bin/env bash
# Wall clock for a long prompt (issue 13): a 300 KB chat body, non-stream
# and as a 20-frame stream, through the gateway (threads: 1), a second
# gateway build (GATEWAY_B, to compare two builds), the bare Pingora proxy
# and nginx, in front of one `llm-gateway sim` engine. Per target and
# scenario: wrk -t1 -c1 for D seconds, REPS times with the targets
# alternated; the proxy's CPU per request from /proc (utime + stime), its
# minor page faults per request, and wrk's p50 latency, as medians over the
# repetitions.
#
#   cargo build --release --bin llm-gateway --example bare_proxy
#   bash benches/body_wallclock.sh                        # ~5 minutes
#   GATEWAY_B=/path/to/old/llm-gateway bash benches/body_wallclock.sh
#   BARE_TIMEOUTS=1 REPS=5 D=10 bash benches/body_wallclock.sh
#
# Everything listens on 127.0.0.1 and is stopped on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/release
GATEWAY_BIN=${GATEWAY_BIN:-$OUT/llm-gateway}
BARE_BIN=${BARE_BIN:-$OUT/examples/bare_proxy}
NGINX=${NGINX:-/usr/sbin/nginx}
REPS=${REPS:-3}
D=${D:-8}
for tool in wrk python3; do command -v $tool >/dev/null || { echo "$tool is needed" >&2; exit 1; }; done
. "$ROOT/benches/lib.sh"
bench_init body-wallclock

ENGINE_PORT=$(free_port)
"$GATEWAY_BIN" sim --engines 1 --port "$ENGINE_PORT" --max-running 64 >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$ENGINE_PORT"

declare -A PORT PID
start_gateway() { # name binary
    local dir=$TMP/$1
    PORT[$1]=$(free_port)
    gateway_config "$dir" "$ENGINE_PORT" "${PORT[$1]}" 1 $'include_usage: true\n'
    "$2" --config "$dir/gateway.yaml" 2>"$dir/log" &
    PID[$1]=$!; PIDS+=($!)
}
TARGETS="gateway"
start_gateway gateway "$GATEWAY_BIN"
if [ -n "${GATEWAY_B:-}" ]; then start_gateway gateway_b "$GATEWAY_B"; TARGETS+=" gateway_b"; fi
if [ -x "$BARE_BIN" ]; then
    PORT[bare]=$(free_port)
    BARE_TIMEOUTS=${BARE_TIMEOUTS:-0} "$BARE_BIN" "127.0.0.1:${PORT[bare]}" "127.0.0.1:$ENGINE_PORT" 2>"$TMP/bare.log" &
    PID[bare]=$!; PIDS+=($!); TARGETS+=" bare"
fi
if [ -x "$NGINX" ]; then
    PORT[nginx]=$(free_port); mkdir -p "$TMP/nginx"
    cat > "$TMP/nginx/nginx.conf" <<NGINX
master_process off;
daemon off;
worker_processes 1;
error_log $TMP/nginx/error.log warn;
pid $TMP/nginx/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    keepalive_requests 1000000;
    client_max_body_size 10m;
    client_body_buffer_size 1m;
    upstream sim { server 127.0.0.1:$ENGINE_PORT; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:${PORT[nginx]};
        location /r/ { proxy_pass http://sim/; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
    }
}
NGINX
    "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" 2>"$TMP/nginx/log" &
    PID[nginx]=$!; PIDS+=($!); TARGETS+=" nginx"
fi
for t in $TARGETS; do wait_port "${PORT[$t]}"; done

# The gateway adds include_usage itself; bare and nginx get a body that
# already asks for it, so the engine answers all of them alike.
for s in body300k stream300k; do
    for ask in 0 1; do
        python3 - "$s" "$ask" > "$TMP/$s-$ask.lua" <<'PY'
import json, sys
scenario, ask = sys.argv[1], sys.argv[2] == "1"
body = {"model": "sim-model", "messages": [{"role": "user", "content": "x " * 150000}]}
tokens = "1"
if scenario == "stream300k":
    body["stream"] = True
    tokens = "20"
    if ask:
        body["stream_options"] = {"include_usage": True}
else:
    body["max_tokens"] = 1
print('wrk.method = "POST"')
print('wrk.body = ' + json.dumps(json.dumps(body)))
print('wrk.headers["Content-Type"] = "application/json"')
print('wrk.headers["x-session-id"] = "bench-session-1"')
print('wrk.headers["x-sim-max-tokens"] = "%s"' % tokens)
print('wrk.headers["x-sim-frame-delay-ms"] = "0"')
PY
    done
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
minor_faults() { awk '{print $10}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
declare -A CPU P50 FAULTS
for rep in $(seq "$REPS"); do
    for s in body300k stream300k; do
        for t in $TARGETS; do
            path=/r/v1/chat/completions; ask=1
            case $t in gateway*) ask=0 ;; bare) path=/v1/chat/completions ;; esac
            before=$(cpu_ticks "${PID[$t]}"); faults=$(minor_faults "${PID[$t]}")
            out=$(wrk -t1 -c1 -d"${D}s" --latency -s "$TMP/$s-$ask.lua" "http://127.0.0.1:${PORT[$t]}$path")
            after=$(cpu_ticks "${PID[$t]}"); faults=$(( $(minor_faults "${PID[$t]}") - faults ))
            requests=$(awk '/requests in/{print $1}' <<<"$out")
            bad=$(awk '/Non-2xx/{print $NF}' <<<"$out")
            [ -z "$bad" ] || die "$t $s: $bad non-2xx answers"
            # wrk writes 850.00us, 1.23ms or 1.01s: in microseconds.
            p50=$(awk '$1=="50%"{v=$2; m=1; if (v ~ /us$/) m=1; else if (v ~ /ms$/) m=1000; else if (v ~ /s$/) m=1000000; sub(/[a-z]+$/, "", v); printf "%.0f", v * m}' <<<"$out")
            CPU[$t.$s]+=" $(python3 -c "print(round(($after - $before) / $TICK / $requests * 1e6, 1))")"
            P50[$t.$s]+=" $p50"
            FAULTS[$t.$s]+=" $(python3 -c "print(round($faults / $requests, 1))")"
            log "rep $rep $s $t: $requests requests, p50 ${p50} us"
        done
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
echo "| scenario | target | proxy CPU per request (us) | page faults per request | p50 latency (us) | CPU per request, each run |"
echo "|---|---|--:|--:|--:|---|"
for s in body300k stream300k; do
    for t in $TARGETS; do
        echo "| $s | $t | $(median <<<"${CPU[$t.$s]}") | $(median <<<"${FAULTS[$t.$s]}") | $(median <<<"${P50[$t.$s]}") |${CPU[$t.$s]} |"
    done
done
