# Shared by the bench scripts (source it after `set -euo pipefail`):
#   bench_init NAME   makes $TMP and an empty PIDS array, and traps EXIT,
#                     INT and TERM so that every process in PIDS (and its
#                     children: nginx's workers) is stopped and $TMP removed
#                     (kept when the script fails, or with KEEP_TMP=1)
#   log, die          timestamped messages on stderr; die exits 1
#   free_port         a free 127.0.0.1 port
#   port_in_use PORT  something accepts on 127.0.0.1:PORT
#   wait_port PORT [SECONDS]   until it does (default 30 s), else die
#   gateway_config DIR ENGINE_PORT PORT THREADS [ROUTE_LINES [GATEWAY_LINES]]
#                     DIR/gateway.yaml and DIR/routes/r.yaml for a gateway
#                     on PORT in front of one engine (see below)
# Written once here because each script otherwise carried its own copy,
# and the copies had drifted (some left nginx workers or temp dirs behind).

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
    local deadline=$((SECONDS + ${2:-30}))
    until port_in_use "$1"; do
        [ "$SECONDS" -lt "$deadline" ] || die "nothing listens on port $1 (logs in $TMP)"
        sleep 0.05
    done
}

# One route `r` with one peer `e0` on ENGINE_PORT that no limit holds back
# (max_concurrency 100000), probes and engine scrapes off; the gateway on
# PORT with THREADS threads, a free admin port, no API keys, no file
# watch. ROUTE_LINES and GATEWAY_LINES are YAML lines (each ending in a
# newline) appended to the route file and the gateway file.
gateway_config() {
    local dir=$1 engine=$2 port=$3 threads=$4
    mkdir -p "$dir/routes"
    # $engine: one port, or several separated by commas (one peer each).
    local peers="" i=0 p
    for p in ${engine//,/ }; do
        peers+=$(printf '  - {name: e%s, host: 127.0.0.1, port: %s, max_concurrency: 100000}\n' "$i" "$p")$'\n'
        i=$((i + 1))
    done
    printf 'peers:\n%shealth: {enabled: false}\nengine_metrics: false\n%s' \
        "$peers" "${5:-}" > "$dir/routes/r.yaml"
    printf 'listen: 127.0.0.1:%s\nadmin_listen: 127.0.0.1:%s\nroutes_dir: %s\nthreads: %s\napi_keys_file: %s/none\nwatch: false\n%s' \
        "$port" "$(free_port)" "$dir/routes" "$threads" "$dir" "${6:-}" > "$dir/gateway.yaml"
}

bench_init() {
    TMP=$(mktemp -d -t "$1.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

bench_cleanup() {
    local rc=$? pid i alive
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        PIDS+=($(cat "/proc/$pid/task/$pid/children" 2>/dev/null || true))
    done
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for i in $(seq 50); do
        alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP_TMP:-0}" = 1 ] || [ $rc -ne 0 ]; then
        log "temporary files kept in $TMP"
    else
        rm -rf "$TMP"
    fi
    exit $rc
}
