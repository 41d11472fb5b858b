#!/usr/bin/env bash
# Proxy overhead (issue 2): latency added by llm-gateway with ONE proxy worker
# thread, next to the same engine reached directly and through nginx as a plain
# reverse proxy. Results go to BENCHMARKS.md, "Proxy overhead (issues 13 and 2)".
#
#   bash benches/proxy_overhead.sh          # ~10 minutes, prints markdown tables
#
# Scenarios (POST /v1/chat/completions, ~200-byte JSON body):
#   non-stream  x-sim-max-tokens: 1,  x-sim-frame-delay-ms: 0
#   stream      "stream": true, x-sim-max-tokens: 20, x-sim-frame-delay-ms: 0 (20 SSE frames + [DONE])
# Targets: direct (engine), llm-gateway (threads: 1), nginx (1 worker, upstream
# keepalive, proxy_http_version 1.1, Connection "", proxy_buffering off for the
# stream, access_log off), bare (benches/bare_proxy.rs: Pingora with only
# `upstream_peer`, same pingora and Cargo.lock, 1 thread; one process per
# engine; BARE_TIMEOUTS=1 gives it the gateway's timeouts). Load: wrk -t1 -c32 and -c1, REPS runs per target,
# targets alternated within each repetition; the tables give the median and
# the min-max spread.
#
# Engines:
#   sim   `llm-gateway sim` (the requested baseline). Its simulated prefill is a
#         tokio sleep of a few microseconds, and tokio timers have 1 ms
#         resolution, so every request waits for the next millisecond tick:
#         latency is quantized to ~1 ms and throughput capped by
#         max_running(8) per tick. That hides sub-millisecond proxy overhead.
#   stub  a timer-free C stand-in compiled here from the heredoc below: same
#         response bytes and the same write pattern as the sim (one send() per
#         SSE frame), answered immediately. This is where the proxies' own
#         added latency and CPU cost are visible. STUB=0 skips it.
#
# CPU placement (2 cores): wrk alone on CLIENT_CORE (1); engine and proxy
# together on SERVER_CORE (0). The load generator never competes with what it
# measures, and a proxy's CPU cost shows up as it would on a saturated box: it
# takes cycles from the engine. Every run is checked for foreign CPU use (other
# processes on the machine) and for wrk errors / non-2xx responses; a noisy run
# is retried, a run with errors makes the script exit 1.
#
# Knobs (environment): DURATION (10s), STUB_DURATION (3s), REPS (3), CONNS
# ("32 1"), STUB (1), SERVER_CORE (0), CLIENT_CORE (1), BASE_PORT (19100),
# FOREIGN_MAX (10 = % of one core used by other processes during a run),
# QUIET_WAIT (60 = seconds to wait for a quiet machine before a run),
# QUIET_BUDGET (900 = total seconds of such waiting), MAX_RETRIES (3),
# SKIP_BUILD (0), GATEWAY_BIN (target/release/llm-gateway), KEEP_TMP (0).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${DURATION:-10s}
STUB_DURATION=${STUB_DURATION:-3s}
REPS=${REPS:-3}
CONNS=${CONNS:-"32 1"}
STUB=${STUB:-1}
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
BASE_PORT=${BASE_PORT:-19100}
FOREIGN_MAX=${FOREIGN_MAX:-10}
QUIET_WAIT=${QUIET_WAIT:-60}
QUIET_BUDGET=${QUIET_BUDGET:-900}
MAX_RETRIES=${MAX_RETRIES:-3}
SKIP_BUILD=${SKIP_BUILD:-0}
GATEWAY_BIN=${GATEWAY_BIN:-$ROOT/target/release/llm-gateway}
NGINX=${NGINX:-/usr/sbin/nginx}
WRK=${WRK:-/usr/bin/wrk}

SIM_PORT=$((BASE_PORT + 1))
STUB_PORT=$((BASE_PORT + 2))
NGINX_PORT=$((BASE_PORT + 70))
BARE_SIM_PORT=$((BASE_PORT + 60))
BARE_STUB_PORT=$((BASE_PORT + 61))
GW_PORT=$((BASE_PORT + 80))
ADMIN_PORT=$((BASE_PORT + 90))
TCK=$(getconf CLK_TCK)

. "$ROOT/benches/lib.sh"

for tool in "$NGINX" "$WRK" taskset curl cc; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
[ "$(nproc)" -ge 2 ] || log "warning: fewer than 2 CPUs; wrk and the servers will share a core"

bench_init proxy-overhead

for p in $SIM_PORT $STUB_PORT $NGINX_PORT $GW_PORT $ADMIN_PORT $BARE_SIM_PORT $BARE_STUB_PORT; do
    port_in_use "$p" && die "port $p is in use (set BASE_PORT)"
done

# ---------------------------------------------------------------- build
if [ "$SKIP_BUILD" != 1 ]; then
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release --quiet --bin llm-gateway --example bare_proxy) || die "cargo build --release failed"
fi
[ -x "$GATEWAY_BIN" ] || die "$GATEWAY_BIN missing"
BARE_BIN=${BARE_BIN:-$(dirname "$GATEWAY_BIN")/examples/bare_proxy}
[ -x "$BARE_BIN" ] || die "$BARE_BIN missing (cargo build --release --example bare_proxy)"
cp "$BARE_BIN" "$TMP/bare"
# A private copy: a parallel rebuild must not swap the binary under a run. Its
# name avoids "llm-gateway" so that test clean-ups elsewhere on a shared machine
# that kill by name (pkill llm-gateway) do not hit the benchmark's processes.
cp "$GATEWAY_BIN" "$TMP/gwbench"

# ---------------------------------------------------------------- stub engine
cat >"$TMP/stub.c" <<'EOF'
/* Timer-free stand-in for `llm-gateway sim`: answers POST /v1/chat/completions
 * at once with the sim's bytes and write pattern (non-stream: one write; stream:
 * head, 20 frames, [DONE], end chunk, one send() each). One thread, epoll,
 * HTTP/1.1 keep-alive, Content-Length bodies only. Benchmark use only. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXFD 65536
#define FRAMES 20
typedef struct { char in[65536]; size_t inlen; char *out; size_t outlen, outoff, outcap; } conn;
static conn *C[MAXFD];
static int ep;

static void put(int fd, const char *p, size_t n) { /* send now, queue the rest */
  conn *c = C[fd];
  if (c->outoff == c->outlen) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w == (ssize_t)n) return;
    if (w < 0) { if (errno != EAGAIN) return; w = 0; }
    p += w; n -= w; c->outoff = c->outlen = 0;
  }
  if (c->outlen + n > c->outcap) { c->outcap = (c->outlen + n) * 2; c->out = realloc(c->out, c->outcap); }
  memcpy(c->out + c->outlen, p, n); c->outlen += n;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.fd = fd};
  epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}
static void drop(int fd) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); close(fd); free(C[fd]->out); free(C[fd]); C[fd] = NULL; }

static const char *ID = "\"id\":\"chatcmpl-sim19101-1000000\",\"object\":\"chat.completion%s\",\"created\":1796021776,\"model\":\"sim-model\",";
static void respond(int fd, int stream) {
  char buf[1024], body[1024], idb[256];
  if (!stream) {
    snprintf(idb, sizeof idb, ID, "");
    int bl = snprintf(body, sizeof body, "{%s\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"tok \"},\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":35,\"completion_tokens\":1,\"total_tokens\":36,\"prompt_tokens_details\":{\"cached_tokens\":32}}}", idb);
    int n = snprintf(buf, sizeof buf, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s", bl, body);
    put(fd, buf, n);
    return;
  }
  static const char head[] = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";
  put(fd, head, sizeof head - 1);
  snprintf(idb, sizeof idb, ID, ".chunk");
  for (int i = 0; i < FRAMES; i++) {
    int bl = snprintf(body, sizeof body, "data: {%s\"choices\":[{\"index\":0,\"delta\":{%s\"content\":\"tok \"},\"logprobs\":null,\"finish_reason\":%s}]}\n\n",
                      idb, i == 0 ? "\"role\":\"assistant\"," : "", i == FRAMES - 1 ? "\"length\"" : "null");
    int n = snprintf(buf, sizeof buf, "%x\r\n%s\r\n", bl, body);
    put(fd, buf, n);
  }
  static const char done[] = "e\r\ndata: [DONE]\n\n\r\n";
  put(fd, done, sizeof done - 1);
  put(fd, "0\r\n\r\n", 5);
}

/* Answers every complete request in the input buffer; -1 = close. */
static int serve(int fd) {
  conn *c = C[fd];
  for (;;) {
    char *end = memmem(c->in, c->inlen, "\r\n\r\n", 4);
    if (!end) return c->inlen < sizeof c->in ? 0 : -1;
    size_t hlen = end + 4 - c->in, clen = 0;
    for (char *p = c->in; p < end;) {
      char *eol = memmem(p, end + 2 - p, "\r\n", 2);
      if (!eol) break;
      if (eol - p > 15 && !strncasecmp(p, "content-length:", 15)) clen = strtoul(p + 15, NULL, 10);
      if (eol - p > 18 && !strncasecmp(p, "transfer-encoding:", 18)) return -1;
      p = eol + 2;
    }
    if (hlen + clen > sizeof c->in) return -1;
    if (c->inlen < hlen + clen) return 0;
    respond(fd, memmem(c->in + hlen, clen, "\"stream\":true", 13) != NULL);
    memmove(c->in, c->in + hlen + clen, c->inlen - hlen - clen);
    c->inlen -= hlen + clen;
  }
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 19102, one = 1;
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1024)) { perror("stub: bind/listen"); return 1; }
  ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[256];
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == ls) {
        int cfd;
        while ((cfd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (cfd >= MAXFD) { close(cfd); continue; }
          setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          C[cfd] = calloc(1, sizeof(conn));
          struct epoll_event e2 = {.events = EPOLLIN, .data.fd = cfd};
          epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &e2);
        }
        continue;
      }
      conn *c = C[fd];
      if (!c) continue;
      if (evs[i].events & EPOLLOUT) {
        while (c->outoff < c->outlen) {
          ssize_t w = send(fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);
          if (w <= 0) break;
          c->outoff += w;
        }
        if (c->outoff == c->outlen) {
          c->outoff = c->outlen = 0;
          struct epoll_event e2 = {.events = EPOLLIN, .data.fd = fd};
          epoll_ctl(ep, EPOLL_CTL_MOD, fd, &e2);
        } else if (errno != EAGAIN) { drop(fd); continue; }
      }
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        ssize_t r = recv(fd, c->in + c->inlen, sizeof c->in - c->inlen, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN)) { drop(fd); continue; }
        if (r > 0) { c->inlen += r; if (serve(fd) < 0) drop(fd); }
      }
    }
  }
}
EOF
if [ "$STUB" = 1 ]; then
    cc -O2 -Wall -Werror -o "$TMP/stub" "$TMP/stub.c" || die "cannot compile the stub engine"
fi

# ---------------------------------------------------------------- configs
mkdir -p "$TMP/routes" "$TMP/nginx"
for r in bench:$SIM_PORT stub:$STUB_PORT; do
    cat >"$TMP/routes/${r%%:*}.yaml" <<EOF
peers:
  - {name: e0, host: 127.0.0.1, port: ${r#*:}, max_concurrency: 100000}
health: {enabled: false}
engine_metrics: false
EOF
done
cat >"$TMP/proxy.yaml" <<EOF
listen: 127.0.0.1:$GW_PORT
admin_listen: 127.0.0.1:$ADMIN_PORT
routes_dir: $TMP/routes
api_keys_file: $TMP/no-api-keys
threads: 1
grace_period: 1s
EOF
cat >"$TMP/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    # Defaults are 1000 requests per connection; keep connections for the whole run,
    # as llm-gateway (Pingora) does, so neither side pays for reconnects.
    keepalive_requests 1000000;
    upstream sim  { server 127.0.0.1:$SIM_PORT;  keepalive 64; keepalive_requests 1000000; }
    upstream stub { server 127.0.0.1:$STUB_PORT; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        # Same prefix-stripping as llm-gateway routes: /bench/v1/... -> /v1/...
        location /bench/        { proxy_pass http://sim/; }
        location /bench-stream/ { proxy_pass http://sim/;  proxy_buffering off; }
        location /stub/         { proxy_pass http://stub/; }
        location /stub-stream/  { proxy_pass http://stub/; proxy_buffering off; }
    }
}
EOF

# wrk scripts: the request, plus a done() that prints exact numbers (µs) and
# every error counter, including non-2xx/3xx responses (errors.status).
BODY_NS='{"model":"sim-model","messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Benchmark request: reply with one token, nothing else, please."}],"temperature":0}'
BODY_ST='{"model":"sim-model","stream":true,"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Benchmark request: reply briefly, nothing else, please."}],"temperature":0}'
write_lua() { # file body max_tokens
    cat >"$1" <<EOF
wrk.method = "POST"
wrk.body = '$2'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-sim-max-tokens"] = "$3"
wrk.headers["x-sim-frame-delay-ms"] = "0"
function done(s, latency, requests)
  local e = s.errors
  io.write(string.format("RESULT requests=%d duration_us=%d bytes=%d p50_us=%d p99_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    s.requests, s.duration, s.bytes, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
EOF
}
write_lua "$TMP/non-stream.lua" "$BODY_NS" 1
write_lua "$TMP/stream.lua" "$BODY_ST" 20

# ---------------------------------------------------------------- start servers
declare -A PID_OF
start() { # name cmd...
    local name=$1; shift
    taskset -c "$SERVER_CORE" "$@" >"$TMP/$name.log" 2>&1 &
    PIDS+=($!)
    PID_OF[$name]=$!
}
start sim "$TMP/gwbench" sim --engines 1 --port "$SIM_PORT"
[ "$STUB" = 1 ] && start stub "$TMP/stub" "$STUB_PORT"
start llm-gateway "$TMP/gwbench" --config "$TMP/proxy.yaml"
start nginx "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf"
start bare-sim "$TMP/bare" "127.0.0.1:$BARE_SIM_PORT" "127.0.0.1:$SIM_PORT"
[ "$STUB" = 1 ] && start bare-stub "$TMP/bare" "127.0.0.1:$BARE_STUB_PORT" "127.0.0.1:$STUB_PORT"

url() { # engine scenario target
    local prefix=bench port
    [ "$1" = stub ] && prefix=stub
    case $3 in
        direct) port=$SIM_PORT; [ "$1" = stub ] && port=$STUB_PORT
                echo "http://127.0.0.1:$port/v1/chat/completions" ;;
        llm-gateway) echo "http://127.0.0.1:$GW_PORT/$prefix/v1/chat/completions" ;;
        nginx) [ "$2" = stream ] && prefix=$prefix-stream
               echo "http://127.0.0.1:$NGINX_PORT/$prefix/v1/chat/completions" ;;
        bare) port=$BARE_SIM_PORT; [ "$1" = stub ] && port=$BARE_STUB_PORT
              echo "http://127.0.0.1:$port/v1/chat/completions" ;;
    esac
}
ENGINES="sim"; [ "$STUB" = 1 ] && ENGINES="sim stub"
TARGETS=(direct llm-gateway nginx bare)

# Readiness, then one correct response through every path.
for i in $(seq 100); do
    ok=1
    for e in $ENGINES; do for t in "${TARGETS[@]}"; do
        curl -fs -o /dev/null -X POST -H 'x-sim-max-tokens: 1' -d "$BODY_NS" "$(url "$e" non-stream "$t")" || ok=0
    done; done
    [ $ok = 1 ] && break
    [ "$i" = 100 ] && { tail -n 20 "$TMP"/*.log >&2; die "servers did not come up"; }
    sleep 0.1
done
for e in $ENGINES; do for t in "${TARGETS[@]}"; do
    out=$(curl -fsS -X POST -H 'content-type: application/json' -H 'x-sim-max-tokens: 1' -H 'x-sim-frame-delay-ms: 0' \
        -d "$BODY_NS" "$(url "$e" non-stream "$t")") || die "$e/$t non-stream: request failed"
    grep -q '"object":"chat.completion"' <<<"$out" || die "$e/$t non-stream: unexpected body: $out"
    out=$(curl -fsSN -X POST -H 'content-type: application/json' -H 'x-sim-max-tokens: 20' -H 'x-sim-frame-delay-ms: 0' \
        -d "$BODY_ST" "$(url "$e" stream "$t")") || die "$e/$t stream: request failed"
    frames=$(grep -c '^data: {' <<<"$out" || true)
    [ "$frames" = 20 ] && [ "$(grep -c '^data: \[DONE\]' <<<"$out")" = 1 ] ||
        die "$e/$t stream: expected 20 frames and [DONE], got $frames frames"
done; done
log "servers up, every path answers correctly (engines: $ENGINES; llm-gateway threads=1; nginx 1 worker)"

# ---------------------------------------------------------------- CPU accounting
# busy = user+nice+system ticks of the whole machine; per-process ticks (all
# threads, plus nginx's worker) for the servers; `times` for finished wrk runs.
busy_ticks() { awk '/^cpu /{print $2+$3+$4, $9}' /proc/stat; }
proc_ticks() { # name: CPU ticks of that server and its children so far
    local p=${PID_OF[$1]:-} t=0 v c
    [ -n "$p" ] || { echo 0; return; }
    for c in "$p" $(cat "/proc/$p/task/$p/children" 2>/dev/null); do
        v=$(sed 's/.*) //' "/proc/$c/stat" 2>/dev/null | awk '{print $12+$13}')
        t=$((t + ${v:-0}))
    done
    echo $t
}
# `times` must run in this shell (a subshell starts with zero child usage):
# callers do `times >"$TMP/times"` first.
child_ticks() { awk -v tck="$TCK" 'NR==2{split($1,u,/[ms]/); split($2,s,/[ms]/); printf "%d\n", ((u[1]*60+u[2])+(s[1]*60+s[2]))*tck}' "$TMP/times"; }
server_ticks() { local n t=0; for n in "${!PID_OF[@]}"; do t=$((t + $(proc_ticks "$n"))); done; echo $t; }
# Waits until the machine is quiet: other processes using less than FOREIGN_MAX %
# of a core over 1 s. At most QUIET_WAIT s per run and QUIET_BUDGET s in all;
# after that it measures anyway (the report shows how noisy each run was).
WAITED=0
wait_quiet() {
    local waited=0 b0 b1 s0 s1 foreign
    while :; do
        read -r b0 _ < <(busy_ticks); s0=$(server_ticks)
        sleep 1
        read -r b1 _ < <(busy_ticks); s1=$(server_ticks)
        foreign=$(( (b1 - b0 - (s1 - s0)) * 100 / TCK ))
        [ $foreign -le "$FOREIGN_MAX" ] && return 0
        [ $waited = 0 ] && log "machine busy (${foreign}% of a core used by other processes); waiting"
        waited=$((waited + 1)); WAITED=$((WAITED + 1))
        if [ $waited -ge "$QUIET_WAIT" ] || [ $WAITED -ge "$QUIET_BUDGET" ]; then
            log "warning: still busy, measuring anyway"
            return 0
        fi
    done
}

# ---------------------------------------------------------------- runs
RESULTS=$TMP/results.tsv
printf 'engine\tscenario\tconns\ttarget\trep\trps\tp50_us\tp99_us\terrors\tforeign_pct\tsteal_pct\tbytes_per_resp\tengine_cpu_us_per_req\tproxy_cpu_us_per_req\n' >"$RESULTS"
FAILED=0
run_one() { # engine scenario conns target rep duration
    local e=$1 s=$2 c=$3 t=$4 rep=$5 d=$6 attempt proxy=none
    [ "$t" = direct ] || proxy=$t
    [ "$t" = bare ] && proxy=bare-$e
    for attempt in $(seq "$MAX_RETRIES"); do
        wait_quiet
        local b0 st0 s0 w0 e0 p0 b1 st1 s1 w1 e1 p1
        read -r b0 st0 < <(busy_ticks); s0=$(server_ticks); e0=$(proc_ticks "$e"); p0=$(proc_ticks "$proxy")
        times >"$TMP/times"; w0=$(child_ticks)
        taskset -c "$CLIENT_CORE" "$WRK" -t1 -c"$c" -d"$d" --latency -s "$TMP/$s.lua" "$(url "$e" "$s" "$t")" \
            >"$TMP/wrk.out" 2>&1 || true
        times >"$TMP/times"; w1=$(child_ticks)
        read -r b1 st1 < <(busy_ticks); s1=$(server_ticks); e1=$(proc_ticks "$e"); p1=$(proc_ticks "$proxy")
        local n
        for n in "${!PID_OF[@]}"; do
            kill -0 "${PID_OF[$n]}" 2>/dev/null || { tail -n 5 "$TMP/$n.log" >&2; die "$n (pid ${PID_OF[$n]}) died during the run"; }
        done
        grep -q '^RESULT' "$TMP/wrk.out" || { cat "$TMP/wrk.out" >&2; die "wrk printed no RESULT line"; }
        local line
        line=$(awk -v e="$e" -v s="$s" -v c="$c" -v t="$t" -v r="$rep" -v tck="$TCK" \
                   -v busy=$((b1 - b0)) -v ours=$((s1 - s0 + w1 - w0)) -v steal=$((st1 - st0)) \
                   -v eng=$((e1 - e0)) -v prx=$((p1 - p0)) '/^RESULT/{
                for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                err = v["connect"] + v["read"] + v["write"] + v["status"] + v["timeout"]
                secs = v["duration_us"] / 1e6; n = v["requests"] ? v["requests"] : 1
                foreign = (busy - ours) * 100 / tck / secs; if (foreign < 0) foreign = 0
                printf "%s\t%s\t%s\t%s\t%s\t%.0f\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\n", e, s, c, t, r,
                    v["requests"] / secs, v["p50_us"], v["p99_us"], err, foreign, steal * 100 / tck / secs,
                    v["bytes"] / n, eng * 1e6 / tck / n, prx * 1e6 / tck / n }' "$TMP/wrk.out")
        log "$(awk -F'\t' '{printf "%-4s %-10s c=%-2s %-11s rep %s: %6s req/s  p50 %6s us  p99 %6s us  errors %s  foreign %s%%  steal %s%%  %s B/resp  CPU/req engine %s us proxy %s us",
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14}' <<<"$line")"
        if [ "$(cut -f9 <<<"$line")" != 0 ]; then
            log "ERRORS in this run (non-2xx responses or socket errors); wrk output:"; cat "$TMP/wrk.out" >&2
            FAILED=1
        fi
        if [ "$(cut -f10 <<<"$line")" -gt "$FOREIGN_MAX" ] && [ "$attempt" -lt "$MAX_RETRIES" ]; then
            log "other processes used the CPU during this run; repeating it"
            continue
        fi
        printf '%s\n' "$line" >>"$RESULTS"
        return 0
    done
}

for e in $ENGINES; do
    d=$DURATION; [ "$e" = stub ] && d=$STUB_DURATION
    for s in non-stream stream; do
        # Warm-up: upstream keep-alive pools, the sim's prefix cache, page faults.
        for t in "${TARGETS[@]}"; do
            taskset -c "$CLIENT_CORE" "$WRK" -t1 -c32 -d1s -s "$TMP/$s.lua" "$(url "$e" "$s" "$t")" >/dev/null 2>&1 || true
        done
        for c in $CONNS; do
            for rep in $(seq "$REPS"); do
                for k in "${!TARGETS[@]}"; do # rotate the order: direct/gw/nginx/bare, gw/nginx/bare/direct, ...
                    run_one "$e" "$s" "$c" "${TARGETS[$(((rep - 1 + k) % ${#TARGETS[@]}))]}" "$rep" "$d"
                done
            done
        done
    done
done

# ---------------------------------------------------------------- report
# wrk cuts its connections when a run ends, mid-request at -c32: the gateway
# logs those as "Downstream ConnectionClosed/WriteError/ReadError". Anything else is shown.
log "gateway: $(grep -c 'Downstream \(ConnectionClosed\|WriteError\|ReadError\)' "$TMP/llm-gateway.log" || true) end-of-run client disconnects logged"
if grep -hE ' ERROR | WARN |panicked|\[(warn|error|crit|alert|emerg)\]' "$TMP/llm-gateway.log" "$TMP/nginx/error.log" "$TMP/sim.log" 2>/dev/null |
    grep -v 'Downstream \(ConnectionClosed\|WriteError\|ReadError\)' | grep -vi 'api key' >&2; then
    log "(lines above: other errors/warnings logged by the servers)"
fi
{
    echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); $("$NGINX" -v 2>&1); $("$WRK" -v 2>&1 | head -1 | cut -d' ' -f1-2)"
    echo "Gateway: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" && [ -n "$(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ] && echo " + uncommitted changes in src/"), cargo build --release; 1 proxy thread."
    echo "Cores: wrk on $CLIENT_CORE, engine + proxy on $SERVER_CORE. Runs: $REPS per target, alternated; sim runs $DURATION, stub runs $STUB_DURATION."
    echo "Cells: median (min-max) over the runs; added = median(target) - median(direct); proxy CPU/req = user+sys CPU time of the proxy process / requests."
    echo
    awk -F'\t' '
    function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
                                     return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
    function stat(k, col,   n, i, a) { n = cnt[k]; lo[k, col] = 1e18; hi[k, col] = -1
        for (i = 1; i <= n; i++) { a[i] = val[k, col, i]; if (a[i] < lo[k, col]) lo[k, col] = a[i]; if (a[i] > hi[k, col]) hi[k, col] = a[i] }
        m[k, col] = med(a, n) }
    function cell(k, col, f) { return sprintf(f " (" f "-" f ")", m[k, col], lo[k, col], hi[k, col]) }
    function sgn(x) { return (x >= 0 ? "+" : "") sprintf("%d", x) }
    NR > 1 { k = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4; n = ++cnt[k]
             val[k, "rps", n] = $6; val[k, "p50", n] = $7; val[k, "p99", n] = $8; val[k, "pcpu", n] = $14; err[k] += $9
             if (!(($1, $2, $3) in seen)) { seen[$1, $2, $3] = 1; order[++groups] = $1 SUBSEP $2 SUBSEP $3 } }
    END {
        nt = split("direct llm-gateway nginx bare", T, " ")
        for (g = 1; g <= groups; g++) {
            split(order[g], p, SUBSEP)
            printf "#### %s, %s, wrk -t1 -c%s\n\n", p[2] == "stream" ? "20-frame stream" : "Non-stream (1 token)",
                   p[1] == "sim" ? "llm-gateway sim engine" : "timer-free stub engine", p[3]
            print "| target | req/s | p50 (us) | p99 (us) | added p50 (us) | added p99 (us) | proxy CPU/req (us) | errors |"
            print "|---|---|---|---|---|---|---|---|"
            d = order[g] SUBSEP "direct"
            for (i = 1; i <= nt; i++) { k = order[g] SUBSEP T[i]; if (!(k in cnt)) continue
                stat(k, "rps"); stat(k, "p50"); stat(k, "p99"); stat(k, "pcpu") }
            for (i = 1; i <= nt; i++) { k = order[g] SUBSEP T[i]; if (!(k in cnt)) continue
                if (T[i] == "direct" || !(d in cnt)) { x = "-"; y = "-"; c = "-" }
                else { x = sgn(m[k, "p50"] - m[d, "p50"]); y = sgn(m[k, "p99"] - m[d, "p99"]); c = cell(k, "pcpu", "%.1f") }
                printf "| %s | %s | %s | %s | %s | %s | %s | %d |\n", T[i], cell(k, "rps", "%d"), cell(k, "p50", "%d"), cell(k, "p99", "%d"), x, y, c, err[k] }
            print ""
        }
    }' "$RESULTS"
    awk -F'\t' -v lim="$FOREIGN_MAX" 'NR > 1 { n++; if ($10 > max) max = $10; if ($10 > lim) bad++; if ($11 > smax) smax = $11 }
        END { printf "Machine noise: other processes used at most %d%% of a core during a recorded run (%d of %d runs above %d%%); steal at most %d%%.\n\n", max, bad, n, lim, smax }' "$RESULTS"
    echo "<details><summary>raw runs</summary>"
    echo
    echo '```'
    column -t -s $'\t' "$RESULTS"
    echo '```'
    echo "</details>"
}

if [ "$FAILED" = 1 ]; then
    log "INVALID: at least one run had errors or non-2xx responses (see above)"
    exit 1
fi
