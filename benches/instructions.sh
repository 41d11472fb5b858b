#!/usr/bin/env bash
# Instructions a proxy executes per request, counted by callgrind (not time:
# the count is the same whatever else the machine is doing). For each target
# and scenario the proxy runs under valgrind twice, with N and 6N requests
# over one keep-alive connection; (total(6N) - total(N)) / 5N is the
# per-request cost with start-up and shutdown cancelled out. The engine is
# `llm-gateway sim`, outside valgrind.
#
# Targets (issue 13), all in the same run, in front of the same engine:
#   gateway  this checkout's llm-gateway (threads: 1, one route, one peer)
#   bare     benches/bare_proxy.rs: Pingora with only `upstream_peer`, built
#            from the same pingora and Cargo.lock (the floor, measured)
#   bare_mimalloc  the same proxy on the gateway's allocator (mimalloc;
#            benches/bare_proxy_mimalloc.rs), not run unless named: what the
#            allocator saves Pingora itself
#   nginx    Debian nginx, one process (`master_process off; daemon off;`),
#            upstream keepalive, `proxy_buffering off` (valgrind
#            --trace-children=no: nginx forks nothing this way anyway)
#
#   bash benches/instructions.sh                       # all three targets
#   TARGETS="gateway bare bare_mimalloc nginx" bash benches/instructions.sh
#   TARGETS=gateway bash benches/instructions.sh       # the gateway only
#   GATEWAY_BIN=/path/to/other/llm-gateway bash benches/instructions.sh
#   N=200 SCENARIOS="small stream" bash benches/instructions.sh
#   FRAME_DELAY_MS=0 SCENARIOS=stream bash benches/instructions.sh  # frames in a burst
#   GATEWAY_EXTRA=$'bodylog:\n  listener: 127.0.0.1:9999\n' bash benches/instructions.sh
#   ENGINES=4 TARGETS=gateway bash benches/instructions.sh   # a route of 4 peers
#   SESSION_ID= SCENARIOS=agent400k TARGETS=gateway bash benches/instructions.sh
#                                 # no session id: the content index decides
#                                 # (issue 30); against the same with
#   ROUTE_EXTRA=$'balancing:\n  session_affinity: {content: off}\n' SESSION_ID= ...
#                                 # appended to gateway.yaml (body logging on)
#   GATEWAY_THREADS=2 GATEWAY_EXTRA=$'work_stealing: false\n' TARGETS=gateway \
#       bash benches/instructions.sh   # the gateway's runtime settings (threads: 1 unless set)
#   BARE_WORK_STEALING=0 BARE_POOL=16 TARGETS=bare bash benches/instructions.sh
#                                 # Pingora runtime settings (benches/bare_proxy.rs)
#   SKIP_BUILD=0 bash benches/instructions.sh          # cargo build first
#   CALLGRIND_ARGS='--toggle-collect=*ResponsePipeline::process*' \
#       TARGETS=gateway bash benches/instructions.sh   # one function's cost
#                                 # (inclusive) per request, nothing else
#   KEEP_CG=/tmp/cg bash benches/instructions.sh       # keep the profiles for
#                                 # callgrind_annotate (TARGET-SCENARIO-REQUESTS.out)
#   COUNT=syscalls bash benches/instructions.sh        # system calls per request
#                                 # instead (strace -f -c), the kernel's share
#                                 # that callgrind does not count; KEEP_CG keeps
#                                 # strace's per-call table. Pingora's timer
#                                 # thread's 1 ms clock_nanosleep is left out:
#                                 # it follows the wall clock, not the requests.
#
# Scenarios: small (198-byte non-stream chat, session id), stream (20 SSE
# frames; the gateway injects include_usage and drops the usage frame, bare
# and nginx get a body that already asks for it, so the engine sends all
# three the same 21 frames), passthrough (the same stream with the client
# asking for usage itself: the gateway only observes and passes every byte
# on), body300k (300 KB non-stream body); stream300k, not run unless named
# (SCENARIOS="stream300k"): the 300 KB body as a stream of 20 frames, the
# include_usage edit made on a long prompt; agent400k, not run unless named:
# a 400 KB agent history of 201 messages (about 100k tokens).
# SESSION_ID (default bench-session-1; empty: none) is the x-session-id sent.
# The engine paces a stream's frames FRAME_DELAY_MS apart (default 2), so
# each frame reaches the proxy in a read of its own, as an engine decoding
# one token per step sends them. FRAME_DELAY_MS=0 sends them back to back:
# how many frames one read then carries depends on how fast the proxy
# under valgrind drains the socket, and the stream count moved by ~5 k
# from run to run (the paced count by under 1 k).
# With small and stream both run, a last row estimates the cost per SSE
# frame as (stream - small) / 20: an estimate, since the two responses also
# differ in their head and framing (chunked SSE vs one JSON body).
set -euo pipefail
# A failed client inside $(count ...) must stop the run, not print a figure.
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/release
GATEWAY_BIN=${GATEWAY_BIN:-$OUT/llm-gateway}
BARE_BIN=${BARE_BIN:-$OUT/examples/bare_proxy}
BARE_MIMALLOC_BIN=${BARE_MIMALLOC_BIN:-$OUT/examples/bare_proxy_mimalloc}
SIM_BIN=${SIM_BIN:-$OUT/llm-gateway}
NGINX=${NGINX:-/usr/sbin/nginx}
N=${N:-200}
SCENARIOS=${SCENARIOS:-"small stream passthrough body300k"}
TARGETS=${TARGETS:-"gateway bare nginx"}
if [ "${SKIP_BUILD:-1}" != 1 ]; then
    (cd "$ROOT" && cargo build --release --quiet --bin llm-gateway --example bare_proxy --example bare_proxy_mimalloc)
fi
COUNT=${COUNT:-instructions}
case $COUNT in
    instructions) command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; } ;;
    syscalls) command -v strace >/dev/null || { echo "strace is needed (apt-get install strace)" >&2; exit 1; } ;;
    *) echo "COUNT is instructions or syscalls" >&2; exit 1 ;;
esac
for t in $TARGETS; do
    case $t in
        gateway) [ -x "$GATEWAY_BIN" ] || { echo "$GATEWAY_BIN missing (cargo build --release)" >&2; exit 1; } ;;
        bare) [ -x "$BARE_BIN" ] || { echo "$BARE_BIN missing (cargo build --release --example bare_proxy)" >&2; exit 1; } ;;
        bare_mimalloc) [ -x "$BARE_MIMALLOC_BIN" ] || { echo "$BARE_MIMALLOC_BIN missing (cargo build --release --example bare_proxy_mimalloc)" >&2; exit 1; } ;;
        nginx) [ -x "$NGINX" ] || { echo "$NGINX missing (apt-get install nginx)" >&2; exit 1; } ;;
        *) echo "unknown target $t (gateway, bare, bare_mimalloc, nginx)" >&2; exit 1 ;;
    esac
done
. "$ROOT/benches/lib.sh"
bench_init instructions

ENGINE_PORT=$(free_port)
# ENGINES (default 1): the gateway's route gets that many peers, simulated
# engines on consecutive ports (placement weighs each on every request);
# bare and nginx use the first.
ENGINES=${ENGINES:-1}
"$SIM_BIN" sim --engines "$ENGINES" --port "$ENGINE_PORT" --max-running 64 >/dev/null 2>&1 &
PIDS+=($!)
ENGINE_PORTS=$ENGINE_PORT
for i in $(seq 1 $((ENGINES - 1))); do
    ENGINE_PORTS+=",$((ENGINE_PORT + i))"
    wait_port "$((ENGINE_PORT + i))"
done
wait_port "$ENGINE_PORT"

cat > "$TMP/client.py" <<'PY'
import http.client, json, os, sys
port, path, scenario, n, ask_usage = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
msg = {"role": "user", "content": "Say hello to the gateway benchmark, please."}
headers = {"content-type": "application/json", "x-sim-frame-delay-ms": os.environ.get("FRAME_DELAY_MS", "2")}
session = os.environ.get("SESSION_ID", "bench-session-1")
if session:
    headers["x-session-id"] = session
if scenario == "small":
    body = {"model": "sim-model", "messages": [msg], "max_tokens": 1}
    headers["x-sim-max-tokens"] = "1"
elif scenario in ("stream", "passthrough", "stream300k"):
    if scenario == "stream300k":
        msg = {"role": "user", "content": "x " * 150000}
    body = {"model": "sim-model", "messages": [msg], "stream": True}
    if ask_usage or scenario == "passthrough":
        body["stream_options"] = {"include_usage": True}
    headers["x-sim-max-tokens"] = "20"
elif scenario == "agent400k":
    # An agent's history: a 8 KB system prompt, then 200 turns of ~2 KB
    # (tool output, code), each message its own block for the content index.
    turns = [{"role": "system", "content": "rules of the repository. " * 330}]
    for i in range(200):
        role = "user" if i % 2 == 0 else "assistant"
        turns.append({"role": role, "content": f"turn {i}: " + "fn main() { println!(\"x\"); } " * 64})
    body = {"model": "sim-model", "messages": turns, "max_tokens": 1}
    headers["x-sim-max-tokens"] = "1"
else:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "x " * 150000}], "max_tokens": 1}
    headers["x-sim-max-tokens"] = "1"
data = json.dumps(body).encode()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
for _ in range(n):
    conn.request("POST", path, body=data, headers=headers)
    resp = conn.getresponse()
    out = resp.read()
    if resp.status != 200:
        sys.exit(f"status {resp.status}: {out[:200]!r}")
    # 20 content frames and [DONE]; the usage frame too where the client
    # asked for it (the gateway drops the one it asked for itself).
    frames = 21 + (ask_usage or scenario == "passthrough")
    if scenario in ("stream", "passthrough", "stream300k") and out.count(b"data: ") != frames:
        sys.exit(f"stream: {out.count(b'data: ')} frames, expected {frames}: {out[:300]!r}")
PY

# Starts target $1 under callgrind in $2 listening on $3; its pid in STARTED
# (not echoed: a command substitution would wait for the server's stdout).
start() {
    local target=$1 dir=$2 port=$3
    # shellcheck disable=SC2206 # CALLGRIND_ARGS is split on purpose
    local vg=(valgrind --tool=callgrind --trace-children=no --callgrind-out-file="$dir/cg.out" ${CALLGRIND_ARGS:-})
    [ "$COUNT" = syscalls ] && vg=(strace -f -c -o "$dir/cg.out" --)
    case $target in
        gateway)
            gateway_config "$dir" "$ENGINE_PORTS" "$port" "${GATEWAY_THREADS:-1}" $'include_usage: true\n'"${ROUTE_EXTRA:-}" "${GATEWAY_EXTRA:-}"
            "${vg[@]}" "$GATEWAY_BIN" --config "$dir/gateway.yaml" 2>"$dir/log" &
            ;;
        bare|bare_mimalloc)
            local bin=$BARE_BIN
            [ "$target" = bare_mimalloc ] && bin=$BARE_MIMALLOC_BIN
            "${vg[@]}" "$bin" "127.0.0.1:$port" "127.0.0.1:$ENGINE_PORT" 2>"$dir/log" &
            ;;
        nginx)
            # As issue 2's nginx: the route prefix stripped like the
            # gateway's, keep-alive both sides without a request limit.
            # The 300 KB body fits client_body_buffer_size, so nginx holds it
            # in memory as the gateway does instead of spooling it to disk.
            cat > "$dir/nginx.conf" <<NGINX
master_process off;
daemon off;
worker_processes 1;
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    keepalive_requests 1000000;
    client_max_body_size 10m;
    client_body_buffer_size 1m;
    upstream sim { server 127.0.0.1:$ENGINE_PORT; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$port;
        location /r/ {
            proxy_pass http://sim/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
NGINX
            "${vg[@]}" "$NGINX" -p "$dir" -c "$dir/nginx.conf" 2>"$dir/log" &
            ;;
    esac
    STARTED=$!
}

count() { # $1 target, $2 scenario, $3 requests → total instructions
    local port dir pid path ask_usage=1
    port=$(free_port); dir=$TMP/$1-$2-$3; mkdir -p "$dir"
    start "$1" "$dir" "$port" >/dev/null
    pid=$STARTED; PIDS+=($pid)
    wait_port "$port" 60 # a gateway under callgrind starts slowly
    case $1 in
        gateway) path=/r/v1/chat/completions; ask_usage=0 ;;
        bare|bare_mimalloc) path=/v1/chat/completions ;;
        nginx) path=/r/v1/chat/completions ;;
    esac
    python3 "$TMP/client.py" "$port" "$path" "$2" "$3" "$ask_usage" >&2
    # SIGINT: Pingora's fast shutdown; SIGTERM: nginx's. Under strace the
    # signal goes to the traced proxy (strace itself would detach and leave
    # it running).
    local sig=-INT proxy=$pid
    [ "$1" = nginx ] && sig=-TERM
    [ "$COUNT" = syscalls ] && proxy=$(cat "/proc/$pid/task/$pid/children")
    kill "$sig" "$proxy"
    wait "$pid" 2>/dev/null || true
    if [ -n "${KEEP_CG:-}" ]; then mkdir -p "$KEEP_CG"; cp "$dir/cg.out" "$KEEP_CG/$1-$2-$3.out"; fi
    if [ "$COUNT" = syscalls ]; then
        awk '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" && $NF != "clock_nanosleep" {n += $4} END {print n}' "$dir/cg.out"
    else
        awk '/^summary:|^totals:/{print $2; exit}' "$dir/cg.out"
    fi
}

declare -A PER
header="| scenario |"; rule="|---|"
for t in $TARGETS; do header+=" $t |"; rule+="--:|"; done
if [ "$COUNT" = syscalls ]; then
    echo "system calls per request (strace -f -c, N=$N and $((6 * N)) requests, difference / $((5 * N)))"
else
    echo "instructions per request (callgrind, N=$N and $((6 * N)) requests, difference / $((5 * N)))"
fi
echo
echo "$header"
echo "$rule"
for s in $SCENARIOS; do
    row="| $s |"
    for t in $TARGETS; do
        a=$(count "$t" "$s" "$N"); b=$(count "$t" "$s" $((6 * N)))
        PER[$t.$s]=$(( (b - a) / (5 * N) ))
        row+=" $(printf "%'d" "${PER[$t.$s]}") |"
    done
    echo "$row"
done
for s in stream passthrough; do
    if [[ " $SCENARIOS " == *" small "* && " $SCENARIOS " == *" $s "* ]]; then
        row="| per SSE frame, ($s - small) / 20 |"
        for t in $TARGETS; do
            row+=" $(printf "%'d" $(( (PER[$t.$s] - PER[$t.small]) / 20 ))) |"
        done
        echo "$row"
    fi
done
