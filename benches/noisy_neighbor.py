#!/usr/bin/env python3
"""Per-tenant figures of `noisy-neighbor` bench runs, from their --records.

The bench's own table is per cell, not per tenant; this reads the records
(one JSON line per request, `tenant` 0 = quiet, 1 = noisy) of one or more
runs and prints, per run and tenant, the requests measured, errors, TTFT
p50 / p95 / p99 and the share of output tokens served, after the warm-up.

    llm-gateway bench --scenario noisy-neighbor --engine-profile vllm \\
        --modes load_aware --records fair.jsonl
    llm-gateway bench --scenario noisy-neighbor --engine-profile vllm \\
        --modes load_aware --route-extra 'fair_share: false' --records off.jsonl
    python3 benches/noisy_neighbor.py --warmup 10 fair.jsonl off.jsonl
"""
import argparse
import json

TENANTS = {0: "quiet", 1: "noisy"}


def quantile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fmt(seconds):
    return "-" if seconds is None else f"{seconds:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds left out at the start")
    ap.add_argument("records", nargs="+")
    args = ap.parse_args()
    print("| run | tenant | requests | errors | TTFT p50 s | p95 s | p99 s | output tokens | share |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for path in args.records:
        rows = []
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("scenario") == "noisy-neighbor" and r["start_s"] >= args.warmup:
                    rows.append(r)
        out = {t: sum(r["completion_tokens"] or 0 for r in rows if r["tenant"] == t) for t in TENANTS}
        total = sum(out.values()) or 1
        for t, name in TENANTS.items():
            mine = [r for r in rows if r["tenant"] == t]
            ttft = [r["ttft_s"] for r in mine if r["ok"] and r["ttft_s"] is not None]
            errors = sum(1 for r in mine if not r["ok"])
            print(
                f"| {path} | {name} | {len(mine)} | {errors} | {fmt(quantile(ttft, 0.5))} "
                f"| {fmt(quantile(ttft, 0.95))} | {fmt(quantile(ttft, 0.99))} "
                f"| {out[t]} | {out[t] / total:.2f} |"
            )


if __name__ == "__main__":
    main()
