#!/usr/bin/env python3
"""Per engine profile, one markdown table of `llm-gateway bench --json`
results: each scenario and seed, the gateway's cells against the best peer
(the lowest TTFT p95 among the peer routers and the client-side reference,
as the bench picks it), and each cell's tail over its perfect-cache bound.

    python3 benches/vs_peers.py RESULT.json [RESULT.json ...]

Files are read in order. Peer and reference cells are gathered from every
file; a gateway cell of a later file replaces one of an earlier file for
the same profile, scenario, seed, mode and `--route-extra` (a gateway rerun
against the peers measured before: the peers do not change when the
gateway does).
Reads only what the bench wrote.
"""

import json
import sys
from collections import OrderedDict

# Above this error rate a peer cannot be the best one where errors are
# not a scenario's expected result (the bench's own rule).
MAX_ERROR_RATE = 0.01
ERRORS_EXPECTED = {"failover", "overload"}


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def is_peer(cell):
    return cell.get("peer") or cell["mode"] == "reference"


def main(paths):
    runs = OrderedDict()  # (profile, scenario, seed) -> {"peers": {}, "gateway": {}}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        profile = run.get("engine_profile", "slots")
        for s in run["scenarios"]:
            params = s["parameters"]
            key = (profile, s["scenario"], params["seed"])
            slot = runs.setdefault(key, {"peers": {}, "gateway": {}})
            for cell in s["modes"]:
                extra = (params.get("route_extra") or "").strip()
                if is_peer(cell):
                    slot["peers"][cell["mode"]] = (cell, extra, params)
                else:
                    # A gateway cell per mode and route settings.
                    slot["gateway"][(cell["mode"], extra)] = (cell, extra, params)
    tables = OrderedDict()
    for (profile, scenario, seed), slot in runs.items():
        eligible = [
            c
            for c, _, _ in slot["peers"].values()
            if c["ttft_s"]["p95"] is not None
            and (scenario in ERRORS_EXPECTED or (c.get("error_rate") or 0) <= MAX_ERROR_RATE)
        ]
        best = min(eligible, key=lambda c: c["ttft_s"]["p95"], default=None)
        for cell, extra, params in slot["gateway"].values():
            t = cell["ttft_s"]
            b = best["ttft_s"] if best else {}
            bound = cell.get("ttft_perfect_cache_bound_s") or {}
            hit = cell["cache_hit"]
            best_hit = best["cache_hit"] if best else None
            label = f"{scenario} s{seed}" + (f" ({extra})" if extra else "")
            if params.get("duration_s") != 60.0 or params.get("warmup_s") not in (10.0, 20.0):
                label += f", {params['duration_s']:.0f} s cells, {params['warmup_s']:.0f} s warm-up"
            tables.setdefault(profile, []).append(
                "| {} | {} | {} | {} / {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} / {} | {} |".format(
                    label,
                    cell["mode"],
                    best["mode"] if best else "-",
                    fmt(t["p95"], ".2f"),
                    fmt(t["p99"], ".2f"),
                    fmt(hit and hit * 100, ".1f"),
                    fmt(cell["output_tok_s"], ".0f"),
                    fmt(b.get("p95"), ".2f"),
                    fmt(b.get("p99"), ".2f"),
                    fmt(best_hit and best_hit * 100, ".1f"),
                    fmt(ratio(t["p95"], b.get("p95")), ".2f"),
                    fmt(ratio(t["p99"], b.get("p99")), ".2f"),
                    fmt(None if hit is None or best_hit is None else (hit - best_hit) * 100, "+.1f"),
                    fmt(ratio(cell["output_tok_s"], best and best["output_tok_s"]), ".2f"),
                    fmt(ratio(t["p95"], bound.get("p95")), ".1f"),
                    fmt(ratio(t["p99"], bound.get("p99")), ".1f"),
                    cell["errors"],
                )
            )
    for profile, lines in tables.items():
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
