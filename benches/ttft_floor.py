#!/usr/bin/env python3
"""How low a placement could push a cell's TTFT tail, from its own records.

    python3 benches/ttft_floor.py RECORDS.jsonl [--warmup 10] [--duration 60] [--prefill-us 50] [--system 2000]

RECORDS: the bench's `--records` (any number of cells and modes). For each
(scenario, mode), over the requests started after the warm-up:

- TTFT p50 / p95 / p99 as the bench reports them;
- wait: TTFT less the simulated prefill of the request's uncached tokens
  (`--prefill-us` per token, the sim's default), i.e. the time it queued
  for a slot on its engine: what placement can change without moving
  caches;
- free move: each later turn takes the lesser of its TTFT and a cold
  prefill of its whole prompt but the shared system prompt on an engine
  with a free slot, as if an oracle had moved exactly the turns a move
  helps, at no cost to anyone else. No router does better on the same
  sessions per engine, so a tail aim below this line asks for fewer
  sessions per engine than the workload has, not for better placement.

Only for scenarios with identical engines (uniform, skewed, overload):
slow-engine's e0 prefills at 1/0.4 of the rate.
"""
import argparse
import collections
import json
import math


def percentile(values, p):
    """Interpolated between ranks, as the bench's report computes it."""
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds not measured")
    ap.add_argument("--duration", type=float, default=60.0, help="the cell's --duration")
    ap.add_argument("--prefill-us", type=float, default=50.0, help="per uncached token")
    ap.add_argument("--system", type=int, default=2000, help="shared system prompt tokens")
    args = ap.parse_args()
    per_cell = collections.defaultdict(list)
    for line in open(args.records):
        r = json.loads(line)
        measured = args.warmup <= r["start_s"] < args.duration and not r["cut"]
        if measured and r["ok"] and r["ttft_s"] is not None:
            per_cell[(r["scenario"], r["mode"])].append(r)
    print("| scenario | mode | requests | TTFT p50 / p95 / p99 | wait p95 / p99 | free move p95 / p99 |")
    print("|---|---|--:|---|---|---|")
    for (scenario, mode), rows in per_cell.items():
        prefill = lambda tokens: tokens * args.prefill_us / 1e6
        ttft = [r["ttft_s"] for r in rows]
        wait = [r["ttft_s"] - prefill(r["prompt_tokens"] - r["cached_tokens"]) for r in rows]
        moved = [
            r["ttft_s"] if r["first_of_session"]
            else min(r["ttft_s"], prefill(max(0, r["prompt_tokens"] - args.system)))
            for r in rows
        ]
        cell = lambda v: " / ".join(f"{percentile(v, p):.3f}" for p in (95, 99))
        print(
            f"| {scenario} | {mode} | {len(rows)} | {percentile(ttft, 50):.3f} / {cell(ttft)} "
            f"| {cell(wait)} | {cell(moved)} |"
        )


if __name__ == "__main__":
    main()
