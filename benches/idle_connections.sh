#!/usr/bin/env bash
# What idle keep-alive connections cost the gateway (issue 13): N client
# connections each make one request and then sit idle for HOLD seconds
# (under client_idle_timeout, 60 s by default); the gateway's CPU time
# (utime + stime from /proc) over the idle window is what keeping them
# costs: timers, wake-ups, the runtime's background work. Run it for two
# builds to compare them.
#
#   cargo build --release
#   bash benches/idle_connections.sh                       # N=5000 HOLD=45
#   GATEWAY_BIN=/path/to/other/llm-gateway bash benches/idle_connections.sh
#
# The engine is one `llm-gateway sim`; everything listens on 127.0.0.1 and
# is stopped on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/release
GATEWAY_BIN=${GATEWAY_BIN:-$OUT/llm-gateway}
SIM_BIN=${SIM_BIN:-$OUT/llm-gateway}
N=${N:-5000}
HOLD=${HOLD:-45}
[ -x "$GATEWAY_BIN" ] || { echo "$GATEWAY_BIN missing (cargo build --release)" >&2; exit 1; }
. "$ROOT/benches/lib.sh"
bench_init idle-connections

engine=$(free_port); port=$(free_port)
"$SIM_BIN" sim --engines 1 --port "$engine" --max-running 64 >/dev/null 2>&1 &
PIDS+=($!)
gateway_config "$TMP" "$engine" "$port" 2
"$GATEWAY_BIN" --config "$TMP/gateway.yaml" 2>"$TMP/gateway.log" &
gw=$!; PIDS+=($gw)
wait_port "$engine"; wait_port "$port"

cat > "$TMP/client.py" <<'PY'
import asyncio, sys
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
body = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
req = (b"POST /r/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       b"x-sim-max-tokens: 1\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
async def one(sem, conns):
    async with sem:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(req)
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"answer: {head[:60]!r}")
        length = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")]
        if length:
            await r.readexactly(int(length[0].split(b":")[1]))
        conns.append((r, w))
async def main():
    sem = asyncio.Semaphore(200)
    conns = []
    await asyncio.gather(*[one(sem, conns) for _ in range(n)])
    print("open", len(conns), flush=True)
    await asyncio.sleep(hold)
    for r, _ in conns:
        if r.at_eof():
            sys.exit("a connection was closed inside client_idle_timeout")
    print("done", flush=True)
asyncio.run(main())
PY

cpu() { awk '{print $14 + $15}' "/proc/$gw/stat"; }
python3 "$TMP/client.py" "$port" "$N" "$HOLD" > "$TMP/client.out" &
client=$!; PIDS+=($client)
until grep -q '^open' "$TMP/client.out" 2>/dev/null; do
    kill -0 "$client" 2>/dev/null || die "client failed: $(cat "$TMP/client.out")"
    sleep 0.2
done
sleep 1
before=$(cpu); start=$SECONDS
wait "$client" || die "client failed: $(cat "$TMP/client.out")"
after=$(cpu)
ticks=$(getconf CLK_TCK)
echo "| $(basename "$GATEWAY_BIN") | $N idle connections | $((SECONDS - start)) s | gateway CPU $(python3 -c "print(f'{($after - $before) / $ticks:.2f}')") s |"
