#!/usr/bin/env bash
# Two gateway builds on the replay bench (`llm-gateway bench`, load_aware),
# run in alternation, A then B, for every scenario, seed and repetition, so
# that both see the same hour of a shared machine. Prints one line per run
# (with its moves by reason: which placement rule moved sessions),
# then the median of each build per scenario.
#
# Why a script: a placement change moves uniform's tail as much as
# skewed's, in either direction, while one build's own runs agree closely
# (issue 8, stop 20: main's uniform p95 0.59-0.60 s over six runs; four
# rules that helped one scenario hurt the other). One run of one scenario
# and one seed decides nothing.
#
#   A=/tmp/llm-gateway-main B=./target/release/llm-gateway \
#       bash benches/placement_ab.sh                    # skewed and uniform, seed 1, 3 reps
#   SCENARIOS="skewed uniform slow-engine" SEEDS="1 2 3" REPS=1 bash benches/placement_ab.sh
#   ROUTE_EXTRA='queue_timeout: 0s' bash benches/placement_ab.sh
#   RECORDS=/tmp/ab bash benches/placement_ab.sh        # every request, per run (JSON lines)
#   QUICK=1 REPS=1 SCENARIOS=uniform bash benches/placement_ab.sh   # smoke run, 10 s cells
#   BENCH_ARGS="--duration 120s --warmup 60s" bash benches/placement_ab.sh   # after the table learned
#
# A run is one 60 s cell (10 s warm-up), about 70 s: the default is ~7 min.
# The bench client is B's binary in both runs, so only the gateway differs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/release
A=${A:?A=/path/to/the/base/llm-gateway is needed}
B=${B:-$OUT/llm-gateway}
SCENARIOS=${SCENARIOS:-"skewed uniform"}
SEEDS=${SEEDS:-1}
REPS=${REPS:-3}
ROUTE_EXTRA=${ROUTE_EXTRA:-"queue_timeout: 60s"}
# Extra `bench` options for both builds, split on spaces (no quoting).
read -r -a BENCH_ARGS <<< "${BENCH_ARGS:-}"
for bin in "$A" "$B"; do
    [ -x "$bin" ] || { echo "$bin is not an executable" >&2; exit 1; }
done
. "$ROOT/benches/lib.sh"
bench_init placement_ab

run() { # $1 label, $2 gateway binary, $3 scenario, $4 seed, $5 rep
    local records=()
    if [ -n "${RECORDS:-}" ]; then
        mkdir -p "$RECORDS"
        records=(--records "$RECORDS/$3-seed$4-rep$5-$1.jsonl")
    fi
    "$B" bench --scenario "$3" --seed "$4" --modes load_aware --gateway "$2" \
        --route-extra "$ROUTE_EXTRA" ${QUICK:+--quick} "${BENCH_ARGS[@]}" --json "${records[@]}" \
        > "$TMP/${1}_${3}_${4}_${5}.json" \
        || die "bench failed: $1 $3 seed $4 rep $5"
}

for rep in $(seq "$REPS"); do
    for seed in $SEEDS; do
        for scenario in $SCENARIOS; do
            for label in A B; do
                bin=$A; [ "$label" = B ] && bin=$B
                log "$scenario seed $seed rep $rep: $label"
                run "$label" "$bin" "$scenario" "$seed" "$rep"
            done
        done
    done
done

python3 - "$TMP" <<'PY'
import json, pathlib, statistics, sys
rows = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    label, scenario, seed, rep = path.stem.split("_")
    mode = json.loads(path.read_text())["scenarios"][0]["modes"][0]
    rows.append((scenario, label, seed, rep, mode))
def by_reason(m):
    # Which rule moved sessions: spills by reason, and moves off a peer
    # that was gone or not ready ("migrate").
    counts = {**(m.get("spills") or {})}
    migrated = sum((m.get("migrations") or {}).values())
    if migrated:
        counts["migrate"] = migrated
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items()) if v) or "-"
print("| scenario | build | seed | rep | requests | errors | TTFT p50 | p95 | p99 | cache hit | moves | by reason |")
print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
for scenario, label, seed, rep, m in sorted(rows, key=lambda r: (r[0], r[2], r[3], r[1])):
    t = m["ttft_s"]
    print(f"| {scenario} | {label} | {seed} | {rep} | {m['requests']} | {m['errors']} | "
          f"{t['p50']:.3f} | {t['p95']:.3f} | {t['p99']:.3f} | {m['cache_hit']:.3f} | {m['moves']:.0f} | "
          f"{by_reason(m)} |")
print()
print("| scenario | build | runs | median TTFT p95 | median p99 | median moves |")
print("|---|---|--:|--:|--:|--:|")
for scenario in sorted({r[0] for r in rows}):
    for label in ("A", "B"):
        ms = [r[4] for r in rows if r[0] == scenario and r[1] == label]
        med = lambda f: statistics.median(f(m) for m in ms)
        print(f"| {scenario} | {label} | {len(ms)} | {med(lambda m: m['ttft_s']['p95']):.3f} | "
              f"{med(lambda m: m['ttft_s']['p99']):.3f} | {med(lambda m: m['moves']):.0f} |")
PY
