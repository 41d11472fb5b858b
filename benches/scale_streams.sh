#!/usr/bin/env bash
# Scale (issue 12): N concurrent slow streams (one SSE frame per second) held
# for D seconds through llm-gateway and, in the same run and against the same
# engine, through nginx as a plain reverse proxy. Reports, per proxy: errors,
# memory per open stream and CPU per 1,000 frames, as a markdown table for
# BENCHMARKS.md.
#
#   bash benches/scale_streams.sh              # N=5000 D=60: ~4 minutes
#   N=200 D=10 bash benches/scale_streams.sh   # smoke run
#
# Engine: one `llm-gateway sim` with --max-running above N, so every stream
# decodes at once; each request asks for `x-sim-frame-delay-ms: 1000` and
# more frames than the run lasts, so no stream ends on its own inside the
# window. (The sim's KV accounting overcommits rather than blocks, so N
# sequences fit.)
# Proxies: llm-gateway (THREADS worker threads, a route with max_concurrency
# above N, engine_metrics off so the sim's overcommitted KV gauge cannot make
# placement refuse) and nginx (as many workers as THREADS, proxy_buffering
# off, proxy_http_version 1.1, read timeout 1 h, access_log off).
# Client: a Python asyncio program (written below) that opens the N streams
# (at most CONNECT_CONCURRENCY connects at a time), waits until all are open
# plus SETTLE seconds, then holds them for D seconds and counts frames.
#
# Measures, from /proc of the proxy's processes (nginx: master and workers):
#   memory per open stream  (RSS with N streams open at the end of the window
#                            - RSS before the first stream) / N
#   CPU per 1,000 frames    (utime + stime over the window) / frames the
#                            client received in it x 1000
#   errors                  a stream not opened (connect failure, non-200
#                            head) or ended / broken before the window closed
# The client and the engine run on the same 2-core machine; their CPU is not
# counted, only the proxy's.
#
# Knobs (environment): N (5000), D (60 = seconds held), SETTLE (3),
# CONNECT_CONCURRENCY (200), THREADS (2), BASE_PORT (19300), SKIP_BUILD (0),
# GATEWAY_BIN (target/release/llm-gateway, or $CARGO_TARGET_DIR/release/…),
# NGINX (/usr/sbin/nginx), KEEP_TMP (0). Exit 1 if any stream had an error.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${N:-5000}
D=${D:-60}
SETTLE=${SETTLE:-3}
CONNECT_CONCURRENCY=${CONNECT_CONCURRENCY:-200}
THREADS=${THREADS:-2}
BASE_PORT=${BASE_PORT:-19300}
SKIP_BUILD=${SKIP_BUILD:-0}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
GATEWAY_BIN=${GATEWAY_BIN:-$TARGET_DIR/release/llm-gateway}
NGINX=${NGINX:-/usr/sbin/nginx}

SIM_PORT=$((BASE_PORT + 1))
NGINX_PORT=$((BASE_PORT + 70))
GW_PORT=$((BASE_PORT + 80))
ADMIN_PORT=$((BASE_PORT + 90))

. "$ROOT/benches/lib.sh"

for tool in "$NGINX" python3 curl; do
    command -v "$tool" >/dev/null || die "$tool not found"
done

# Every stream holds a descriptor in the client, two in a proxy (client and
# engine side) and one in the engine; each process inherits this limit.
need=$((2 * N + 1024))
ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge "$need" ] || die "ulimit -n is $(ulimit -n), need $need for N=$N (raise the hard limit)"

bench_init scale-streams

for p in $SIM_PORT $NGINX_PORT $GW_PORT $ADMIN_PORT; do
    port_in_use "$p" && die "port $p is in use (set BASE_PORT)"
done

# ---------------------------------------------------------------- build
if [ "$SKIP_BUILD" != 1 ]; then
    log "cargo build --release"
    (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET_DIR" cargo build --release --quiet) ||
        die "cargo build --release failed"
fi
[ -x "$GATEWAY_BIN" ] || die "$GATEWAY_BIN missing"
# A private copy: a parallel rebuild must not swap the binary under a run. Its
# name avoids "llm-gateway" so that clean-ups elsewhere on a shared machine
# that kill by name do not hit the benchmark's processes.
cp "$GATEWAY_BIN" "$TMP/gwbench"

# ---------------------------------------------------------------- client
cat >"$TMP/client.py" <<'EOF'
"""Holds N slow SSE streams through one proxy and measures the proxy."""
import asyncio, json, os, sys, time

port, n, hold, settle, conc = (int(a) for a in sys.argv[1:6])
pids = [int(p) for p in sys.argv[6].split()]
max_tokens = 600 + hold + settle  # longer than the ramp and the window
TCK = os.sysconf("SC_CLK_TCK")


def rss_kib():
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def cpu_ticks():
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


state = {"opened": 0, "frames": 0, "window_open": False, "window_closed": False}
errors = {}


def error(kind):
    errors[kind] = errors.get(kind, 0) + 1


body = json.dumps({"model": "sim-model", "stream": True,
                   "messages": [{"role": "user", "content": "hold"}]}).encode()
request = (f"POST /bench/v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
           f"x-sim-frame-delay-ms: 1000\r\nx-sim-max-tokens: {max_tokens}\r\n\r\n").encode() + body


async def stream(sem):
    writer = None
    try:
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        if status != b"200":
            error(f"status {status.decode()}")
            return
        state["opened"] += 1
        carry = b""
        while True:
            data = await reader.read(65536)
            if not data:
                if not state["window_closed"]:
                    error("ended early")
                return
            seen = carry + data
            if state["window_open"]:
                state["frames"] += seen.count(b"data: ")
            carry = seen[-5:]
    except asyncio.CancelledError:
        raise
    except Exception as e:  # connect refused, reset, ...
        if not state["window_closed"]:
            error(type(e).__name__)
    finally:
        if writer is not None:
            writer.close()


async def main():
    rss_before = rss_kib()
    sem = asyncio.Semaphore(conc)
    tasks = [asyncio.create_task(stream(sem)) for _ in range(n)]
    start = time.monotonic()
    while state["opened"] + sum(errors.values()) < n and time.monotonic() - start < 300:
        await asyncio.sleep(0.1)
    ramp = time.monotonic() - start
    await asyncio.sleep(settle)
    state["window_open"] = True
    t0, c0 = time.monotonic(), cpu_ticks()
    await asyncio.sleep(hold)
    c1, t1 = cpu_ticks(), time.monotonic()
    frames = state["frames"]
    rss_open = rss_kib()
    state["window_closed"] = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({
        "n": n, "opened": state["opened"], "errors": errors,
        "ramp_s": round(ramp, 1), "window_s": round(t1 - t0, 1),
        "rss_before_kib": rss_before, "rss_open_kib": rss_open,
        "frames": frames, "cpu_s": (c1 - c0) / TCK,
    }))

asyncio.run(main())
EOF

# ---------------------------------------------------------------- engine
log "sim engine on $SIM_PORT (max_running $((N + 100)))"
"$TMP/gwbench" sim --engines 1 --port "$SIM_PORT" --max-running $((N + 100)) \
    >"$TMP/sim.log" 2>&1 &
PIDS+=($!)
wait_port "$SIM_PORT"

# ---------------------------------------------------------------- proxies
mkdir -p "$TMP/routes" "$TMP/nginx/logs"
cat >"$TMP/routes/bench.yaml" <<EOF
peers:
  - {name: e0, host: 127.0.0.1, port: $SIM_PORT, max_concurrency: $((N * 2 + 100))}
engine_metrics: false
EOF
cat >"$TMP/gateway.yaml" <<EOF
listen: 127.0.0.1:$GW_PORT
admin_listen: 127.0.0.1:$ADMIN_PORT
routes_dir: $TMP/routes
api_keys_file: $TMP/no-api-keys
threads: $THREADS
grace_period: 1s
watch: false
EOF
cat >"$TMP/nginx/nginx.conf" <<EOF
worker_processes $THREADS;
worker_rlimit_nofile $need;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections $need; }
http {
    access_log off;
    upstream sim { server 127.0.0.1:$SIM_PORT; }
    server {
        listen 127.0.0.1:$NGINX_PORT backlog=4096;
        location /bench/ {
            proxy_pass http://sim/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 3600s;
        }
    }
}
EOF

# Runs the client against one proxy; prints its JSON line.
measure() {
    local name=$1 port=$2 pids=$3
    log "$name: $N streams, held ${D}s"
    python3 "$TMP/client.py" "$port" "$N" "$D" "$SETTLE" "$CONNECT_CONCURRENCY" "$pids" \
        >"$TMP/$name.json" || die "$name: client failed"
    log "$name: $(cat "$TMP/$name.json")"
}

stop() {
    local pid
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

RUST_LOG=warn "$TMP/gwbench" --config "$TMP/gateway.yaml" >"$TMP/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=($GW_PID)
wait_port "$GW_PORT"
curl -fsS -o /dev/null "http://127.0.0.1:$ADMIN_PORT/healthz" || die "gateway not healthy"
measure llm-gateway "$GW_PORT" "$GW_PID"
stop "$GW_PID"

"$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" -g 'daemon off;' 2>>"$TMP/nginx/logs/error.log" &
NGINX_PID=$!
PIDS+=($NGINX_PID)
wait_port "$NGINX_PORT"
sleep 0.2
NGINX_PIDS="$NGINX_PID $(cat "/proc/$NGINX_PID/task/$NGINX_PID/children")"
measure nginx "$NGINX_PORT" "$NGINX_PIDS"
stop $NGINX_PIDS

# ---------------------------------------------------------------- table
python3 - "$TMP/llm-gateway.json" "$TMP/nginx.json" "$THREADS" <<'EOF'
import json, sys
threads = sys.argv[3]
rows = [("llm-gateway", json.load(open(sys.argv[1]))), ("nginx", json.load(open(sys.argv[2])))]
r0 = rows[0][1]
print(f"{r0['n']} streams, one frame per second each, held {r0['window_s']} s "
      f"(after all were open); {threads} worker threads / processes per proxy.\n")
print("| proxy | streams open | errors | RSS before | RSS with the streams open "
      "| memory per open stream | frames in the window | CPU (user+sys) | CPU per 1,000 frames |")
print("|---|---|---|---|---|---|---|---|---|")
bad = 0
for name, r in rows:
    errs = sum(r["errors"].values())
    bad += errs
    detail = ", ".join(f"{k}: {v}" for k, v in r["errors"].items())
    per_stream = (r["rss_open_kib"] - r["rss_before_kib"]) / r["n"]
    per_k = r["cpu_s"] / r["frames"] * 1000 if r["frames"] else float("nan")
    print(f"| {name} | {r['opened']} / {r['n']} (ramp {r['ramp_s']} s) | {errs}{' (' + detail + ')' if detail else ''} "
          f"| {r['rss_before_kib'] / 1024:.1f} MiB | {r['rss_open_kib'] / 1024:.1f} MiB "
          f"| {per_stream:.1f} KiB | {r['frames']} | {r['cpu_s']:.2f} s | {per_k * 1000:.1f} ms |")
sys.exit(1 if bad else 0)
EOF
