#!/usr/bin/env python3
"""Per engine profile, one markdown table of `llm-gateway bench --peers --json`
results: each scenario and seed, the gateway's cells against the best peer of
that run (the bench names it: the lowest TTFT p95 among the peer routers and
the client-side reference), and each cell's tail over its perfect-cache bound.

    python3 benches/vs_peers.py RESULT.json [RESULT.json ...]

Reads only what the bench wrote; computes nothing the bench did not measure.
"""

import json
import sys
from collections import defaultdict


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def main(paths):
    rows = defaultdict(list)
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        profile = run.get("engine_profile", "slots")
        for s in run["scenarios"]:
            params = s["parameters"]
            label = f"{s['scenario']} s{params['seed']}"
            if params.get("route_extra"):
                label += f" ({params['route_extra'].strip()})"
            best = s.get("best_peer")
            by_name = {m["mode"]: m for m in s["modes"]}
            b = by_name.get(best)
            for m in s["modes"]:
                if m.get("peer") or m["mode"] == "reference":
                    continue
                v = m.get("vs_best_peer") or {}
                t = m["ttft_s"]
                bound = m.get("ttft_perfect_cache_bound_s") or {}
                rows[profile].append(
                    "| {} | {} | {} | {} / {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |".format(
                        label,
                        m["mode"],
                        best or "-",
                        fmt(t["p95"], ".2f"),
                        fmt(t["p99"], ".2f"),
                        fmt(m["cache_hit"] and m["cache_hit"] * 100, ".1f"),
                        fmt(m["output_tok_s"], ".0f"),
                        fmt(b and b["ttft_s"]["p95"], ".2f"),
                        fmt(b and b["ttft_s"]["p99"], ".2f"),
                        fmt(b and b["cache_hit"] and b["cache_hit"] * 100, ".1f"),
                        fmt(v.get("p95"), ".2f"),
                        fmt(v.get("p99"), ".2f"),
                        fmt(v.get("hit_points"), "+.1f"),
                        fmt(v.get("tok_s"), ".2f"),
                        "{} / {}".format(
                            fmt(ratio(t["p95"], bound.get("p95")), ".1f"),
                            fmt(ratio(t["p99"], bound.get("p99")), ".1f"),
                        ),
                        m["errors"],
                    )
                )
    for profile, lines in rows.items():
        print(f"\n### Engine profile `{profile}`\n")
        print(
            "| scenario | cell | best peer | TTFT p95 / p99 (s) | hit % | tok/s "
            "| best peer p95 / p99 (s) | its hit % | p95 ratio | p99 ratio | hit pts "
            "| tok/s ratio | p95 / p99 over bound | errors |"
        )
        print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
