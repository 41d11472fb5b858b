#!/usr/bin/env python3
"""The plots of BENCHMARKS.md, as standalone SVG files in docs/bench/.

    python3 benches/plots.py            # writes every docs/bench/<name>.svg below
    python3 benches/plots.py OUTDIR     # writes them to OUTDIR instead

The figures are data in this file: one dict per plot, each with a comment
naming the BENCHMARKS.md table it comes from. Every value is the string
the table prints, so a bar's label is the table's figure, unrounded. When
a table in BENCHMARKS.md changes, change its dict here and run the script.
Standard library only.

The placement scenarios' own plots (TTFT CDFs and per-engine load:
docs/bench/after.svg, after-overload.svg, before.svg) are not made here:
`llm-gateway bench --plot FILE` draws them from a run.
"""

import math
import os
import sys
from xml.sax.saxutils import escape

# Okabe-Ito: tells apart for the common kinds of colour blindness.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999", "#000000"]

WIDTH = 900
PANEL_H = 300  # plot area and its labels, one panel
TOP = 58  # figure title and subtitle
FOOT = 34  # source line
FONT = "font-family=\"Helvetica, Arial, sans-serif\""


def num(s):
    """A table's figure ("112,104", "0.865", "90.7") as a float."""
    return float(str(s).replace(",", "").replace("%", "").strip())


def nice_step(span, ticks=5):
    raw = span / ticks
    mag = 10 ** _floor_log10(raw)
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _floor_log10(x):
    e = 0
    if x <= 0:
        return 0
    while x >= 10:
        x /= 10
        e += 1
    while x < 1:
        x *= 10
        e -= 1
    return e


def tick_text(v, step):
    if step >= 1:
        return f"{v:,.0f}"
    decimals = 0
    s = step
    while s < 1 - 1e-9 and decimals < 4:
        s *= 10
        decimals += 1
    return f"{v:.{decimals}f}"


def text(x, y, s, size=12, anchor="start", weight="normal", fill="#222", rotate=None, italic=False):
    extra = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
    style = ' font-style="italic"' if italic else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" '
        f'font-weight="{weight}" fill="{fill}"{style}{extra}>{escape(s)}</text>'
    )


def panel_svg(p, y0, series_colours):
    """One panel: a grouped bar (or dot) chart, its axis, grid and legend."""
    out = []
    left, right = 86, WIDTH - 24
    top = y0 + 44  # panel title and legend above
    bottom = y0 + PANEL_H - 46  # group labels below
    groups = p["groups"]
    series = p["series"]
    bars = p.get("bars", True)
    log = p.get("log", False)

    values = [num(v) for s in series for v in s["values"] if v is not None]
    for s in series:
        for runs in s.get("runs", []):
            values += [num(v) for v in runs]
    if "hline" in p:
        values.append(p["hline"]["y"])
    vmax = max(values)
    if log:
        lo_e = _floor_log10(min(values))
        hi_e = _floor_log10(vmax) + 1
        ymin, ymax = 10.0 ** lo_e, 10.0 ** hi_e

        def Y(v):
            return bottom - (math.log10(v) - lo_e) / (hi_e - lo_e) * (bottom - top)

        ticks = [10.0 ** e for e in range(lo_e, hi_e + 1)]
        tick_labels = [f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in ticks]
    else:
        ymin = p.get("ymin", 0.0)
        if "ymax" in p:
            ymax = p["ymax"]
            step = nice_step(ymax - ymin)
        else:
            step = nice_step(vmax * 1.12 - ymin)
            ymax = ymin + step * (int((vmax * 1.12 - ymin) / step) + 1)

        def Y(v):
            return bottom - (v - ymin) / (ymax - ymin) * (bottom - top)

        ticks = []
        t = ymin
        while t <= ymax + step / 1000:
            ticks.append(t)
            t += step
        tick_labels = [tick_text(t, step) for t in ticks]

    # Panel title and the y-axis label.
    out.append(text(left, y0 + 16, p["title"], size=14, weight="bold"))
    out.append(text(22, (top + bottom) / 2, p["ylabel"], size=12, anchor="middle", rotate=-90))

    # Grid and ticks.
    for t, lab in zip(ticks, tick_labels):
        y = Y(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd" stroke-width="1"/>')
        out.append(text(left - 6, y + 4, lab, size=11, anchor="end", fill="#444"))
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#444" stroke-width="1"/>')
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444" stroke-width="1"/>')

    # Bars or dots, with each bar's figure above it.
    n_g, n_s = len(groups), len(series)
    gw = (right - left) / n_g
    bw = min(56.0, gw * 0.8 / n_s)
    longest = max([len(str(v)) for s in series for v in s["values"] if v is not None] or [0])
    rotate = p.get("rotate_labels", bw < 6.2 * longest)
    for gi, g in enumerate(groups):
        gx = left + gi * gw + (gw - bw * n_s) / 2
        lines = g.split("\n")
        for li, line in enumerate(lines):
            out.append(text(left + gi * gw + gw / 2, bottom + 17 + 14 * li, line, size=12, anchor="middle"))
        for si, s in enumerate(series):
            colour = series_colours[s["name"]]
            v = s["values"][gi]
            x = gx + si * bw
            cx = x + bw / 2
            if v is not None and bars:
                y = Y(num(v))
                out.append(
                    f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" height="{bottom - y:.1f}" '
                    f'fill="{colour}"/>'
                )
                if s.get("runs"):
                    # The runs' dots sit near the bar's top: its figure goes at its foot.
                    out.append(text(cx, bottom - 8, str(v), size=10, anchor="middle", fill="#fff", weight="bold"))
                elif rotate:
                    out.append(text(cx + 4, y - 4, str(v), size=10, anchor="start", rotate=-90))
                else:
                    out.append(text(cx, y - 4, str(v), size=10, anchor="middle"))
            runs = s.get("runs")
            if runs:
                for r in runs[gi]:
                    out.append(
                        f'<circle cx="{cx:.1f}" cy="{Y(num(r)):.1f}" r="3.5" fill="{"#fff" if bars else colour}" '
                        f'stroke="{"#222" if bars else colour}" stroke-width="1.2"/>'
                    )

    if "hline" in p:
        y = Y(p["hline"]["y"])
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#D55E00" '
            f'stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        # Its key sits at the right end of the legend row, clear of the bars.
        lw = 6.2 * len(p["hline"]["label"])
        out.append(
            f'<line x1="{right - lw - 34:.1f}" y1="{y0 + 31}" x2="{right - lw - 8:.1f}" y2="{y0 + 31}" '
            f'stroke="#D55E00" stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        out.append(text(right, y0 + 35, p["hline"]["label"], size=11, anchor="end", fill="#D55E00"))

    # Legend, one row under the title.
    lx = left
    for s in series:
        out.append(f'<rect x="{lx}" y="{y0 + 25}" width="12" height="12" fill="{series_colours[s["name"]]}"/>')
        out.append(text(lx + 16, y0 + 35, s["name"], size=11))
        lx += 16 + 6.4 * len(s["name"]) + 18
    if p.get("dots_note"):
        out.append(text(right, y0 + 35, p["dots_note"], size=11, anchor="end", fill="#444"))
    return out


def plot_svg(plot):
    panels = plot["panels"]
    height = TOP + PANEL_H * len(panels) + FOOT
    names = []
    for p in panels:
        for s in p["series"]:
            if s["name"] not in names:
                names.append(s["name"])
    colours = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(names)}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}">',
        f"<title>{escape(plot['title'])}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fff"/>',
        text(WIDTH / 2, 24, plot["title"], size=17, anchor="middle", weight="bold"),
        text(WIDTH / 2, 44, plot["subtitle"], size=12, anchor="middle", fill="#444"),
    ]
    for i, p in enumerate(panels):
        out += panel_svg(p, TOP + i * PANEL_H, colours)
    out.append(text(12, height - 12, plot["source"], size=11, fill="#666", italic=True))
    out.append("</svg>")
    return "\n".join(out) + "\n"


PLOTS = [
    # BENCHMARKS.md, "Proxy overhead (issues 13 and 2)": the table "Instructions
    # per request" (acf957a). The system calls panel: the table of "Stop 26: the
    # kernel's share, counted in system calls" (bb83ff8) in the history,
    # docs/bench/history/BENCHMARKS-to-stop-27.md; the page quotes its figures.
    {
        "file": "instructions.svg",
        "title": "Proxy overhead: work per request, gateway against bare Pingora and nginx",
        "subtitle": "one proxy thread, one keep-alive client connection, llm-gateway sim engine outside the count",
        "source": "Source: BENCHMARKS.md, Proxy overhead (issues 13 and 2). callgrind N=50 at acf957a; strace -f -c N=50 at bb83ff8.",
        "panels": [
            {
                "title": "User-space instructions per request (callgrind)",
                "ylabel": "instructions per request",
                "groups": ["small", "stream\n(20 frames, paced)", "passthrough\n(20 frames, paced)", "body300k"],
                "series": [
                    {"name": "gateway", "values": ["112,104", "407,625", "409,987", "684,679"]},
                    {"name": "bare Pingora", "values": ["103,960", "360,909", "361,228", "590,411"]},
                    {"name": "bare Pingora on mimalloc", "values": ["88,353", "340,908", "340,608", "571,895"]},
                    {"name": "nginx", "values": ["22,742", "74,988", "75,387", "25,059"]},
                ],
                "rotate_labels": True,
            },
            {
                "title": "System calls per request (strace)",
                "ylabel": "system calls per request",
                "groups": ["small", "stream\n(20 frames, paced)", "passthrough", "body300k"],
                "series": [
                    {"name": "gateway", "values": ["8", "68", "70", "17"]},
                    {"name": "bare Pingora", "values": ["8", "68", "69", "19"]},
                    {"name": "bare Pingora on mimalloc", "values": ["8", "69", "70", "17"]},
                    {"name": "nginx", "values": ["7", "68", "68", "9"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Scale (issue 12)": its table (the D=60 run) and the two
    # D=30 runs quoted under it (gateway on mimalloc and on glibc).
    {
        "file": "scale-streams.svg",
        "title": "Scale: 5,000 slow streams held, gateway against nginx",
        "subtitle": "one SSE frame per second per stream, 2 worker threads / processes per proxy, 0 errors in every run",
        "source": "Source: BENCHMARKS.md, Scale (issue 12). benches/scale_streams.sh, N=5000.",
        "panels": [
            {
                "title": "Memory per open stream",
                "ylabel": "KiB per open stream",
                "groups": ["D=60 run", "D=30, gateway on mimalloc", "D=30, gateway on glibc"],
                "series": [
                    {"name": "llm-gateway", "values": ["54.8", "51.8", "56.0"]},
                    {"name": "nginx", "values": ["17.9", "17.9", "17.9"]},
                ],
            },
            {
                "title": "CPU (user + sys) per 1,000 frames",
                "ylabel": "ms per 1,000 frames",
                "groups": ["D=60 run", "D=30, gateway on mimalloc", "D=30, gateway on glibc"],
                "series": [
                    {"name": "llm-gateway", "values": ["20.7", "27.3", "25.5"]},
                    {"name": "nginx", "values": ["14.6", "17.9", "17.1"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Body logging (issue 10)": its table (off / on, listener
    # up / on, listener down).
    {
        "file": "bodylog.svg",
        "title": "Body logging: instructions per request, off and on",
        "subtitle": "callgrind, N=100 and 600 requests per run, the difference divided out",
        "source": "Source: BENCHMARKS.md, Body logging (issue 10). benches/bodylog_overhead.sh.",
        "panels": [
            {
                "title": "Gateway instructions per request",
                "ylabel": "instructions per request",
                "groups": ["small (198-byte non-stream chat)", "stream (20 SSE frames, include_usage)"],
                "series": [
                    {"name": "body logging off", "values": ["199,240", "418,936"]},
                    {"name": "on, listener up", "values": ["279,317", "512,703"]},
                    {"name": "on, listener down", "values": ["278,273", "514,979"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Scale-out: replicas sharing sessions through Redis
    # (issue 11)": its table of medians; every 180 s cell (TTFT p95 and cache
    # hit per run) in the section's full record,
    # docs/bench/history/BENCHMARKS-to-stop-39.md.
    {
        "file": "scale-out.svg",
        "title": "Scale-out: TTFT p95 and cache hit with 1, 2 and 4 replicas",
        "subtitle": "uniform scenario, load_aware, 180 s cells, queue_timeout 60s; a front sends each request to a random replica",
        "source": "Source: BENCHMARKS.md, Scale-out (issue 11). llm-gateway bench --replicas N --session-store local|redis.",
        "panels": [
            {
                "title": "TTFT p95: median of the runs (bar, figure at its foot) and each run (dot)",
                "ylabel": "TTFT p95 (s)",
                "groups": ["1 replica (local table)", "2 replicas (redis)", "4 replicas (redis)"],
                "series": [
                    {
                        "name": "seed 1",
                        "values": ["0.601", "0.598", "0.572"],
                        "runs": [["0.606", "0.601", "0.596", "0.601"], ["0.598", "0.638", "0.589"], ["0.641", "0.503"]],
                    },
                    {
                        "name": "seed 2",
                        "values": ["0.605", "0.579", "0.591"],
                        "runs": [["0.575", "0.634"], ["0.579"], ["0.548", "0.634"]],
                    },
                ],
            },
            {
                "title": "Cache hit, each run",
                "ylabel": "cache hit (%)",
                "groups": ["1 replica (local table)", "2 replicas (redis)", "4 replicas (redis)"],
                "bars": False,
                "ymin": 90.0,
                "ymax": 95.0,
                "series": [
                    {
                        "name": "seed 1",
                        "values": [None, None, None],
                        "runs": [["93.2", "93.0", "93.0", "92.7"], ["93.0", "92.7", "92.7"], ["93.4", "93.4"]],
                    },
                    {
                        "name": "seed 2",
                        "values": [None, None, None],
                        "runs": [["93.5", "92.7"], ["93.3"], ["92.9", "92.8"]],
                    },
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Protection layer (issue 9)": the table of the replay
    # (overload and slow-engine rows; the page keeps four, the section's full
    # record, docs/bench/history/BENCHMARKS-to-stop-39.md, all eight) and the
    # gate decision's medians in the paragraph above it.
    {
        "file": "protection.svg",
        "title": "Protection layer: the layer on and off, and the gate's cost",
        "subtitle": "replay bench, load_aware, seed 1, 60 s cells, queue_timeout 30s; criterion for the gate decision",
        "source": "Source: BENCHMARKS.md, Protection layer (issue 9). llm-gateway bench --route-extra R; cargo bench --bench gates.",
        "panels": [
            {
                "title": "Overload scenario: TTFT",
                "ylabel": "TTFT (s)",
                "groups": ["none (defaults)", "tps_limit_tps: 60", "tps_limit_tps: 60,\nttft_limit_ms: 2000", "ttft_limit_ms: 2000"],
                "series": [
                    {"name": "p50", "values": ["0.813", "0.149", "0.579", "0.628"]},
                    {"name": "p95", "values": ["4.183", "4.734", "4.128", "3.888"]},
                    {"name": "p99", "values": ["23.329", "15.983", "14.839", "29.375"]},
                ],
            },
            {
                "title": "Slow-engine scenario: errors the client saw (all 429s)",
                "ylabel": "client errors in the cell",
                "groups": ["none (defaults)", "tps_limit_tps: 60", "tps_limit_tps: 60,\nttft_limit_ms: 2000", "ttft_limit_ms: 2000"],
                "series": [
                    {"name": "errors", "values": ["0", "0", "374", "381"]},
                ],
            },
            {
                "title": "Cost of the gate decision (criterion median)",
                "ylabel": "ns per decision",
                "groups": ["no EWMA yet\n(fail-open)", "EWMA under\nits limit", "session priority,\nwarm turn", "tripped,\n429 built"],
                "series": [
                    {"name": "median", "values": ["49", "65", "65", "663"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Placement (issues 8 and 3)": the tables "Seed 1, TTFT
    # p95 / p99" and "Overload, seed 1, every mode" in the section's full
    # record, docs/bench/history/BENCHMARKS-to-stop-39.md (the page quotes
    # them).
    {
        "file": "placement.svg",
        "title": "Placement: TTFT p95 and p99 per scenario and mode (seed 1)",
        "subtitle": "4 simulated engines; 60 s cells but overload (180 s, 90 s warm-up); reference = an ideal sticky router, no proxy",
        "source": "Source: BENCHMARKS.md, Placement (issues 8 and 3). llm-gateway bench --route-extra 'queue_timeout: 60s'; before = a51ce13.",
        "panels": [
            {
                "title": "TTFT p95, 60 s cells",
                "ylabel": "TTFT p95 (s)",
                "groups": ["uniform", "skewed", "slow-engine", "failover"],
                "series": [
                    {"name": "before (a51ce13)", "values": ["0.593", "0.971", "0.956", "2.063"]},
                    {"name": "load_aware", "values": ["0.603", "0.927", "0.970", "1.725"]},
                    {"name": "reference", "values": ["0.682", "0.594", "0.852", "2.200"]},
                ],
            },
            {
                "title": "TTFT p99, 60 s cells",
                "ylabel": "TTFT p99 (s)",
                "groups": ["uniform", "skewed", "slow-engine", "failover"],
                "series": [
                    {"name": "before (a51ce13)", "values": ["1.311", "2.344", "2.561", "2.707"]},
                    {"name": "load_aware", "values": ["1.123", "1.540", "2.123", "7.197"]},
                    {"name": "reference", "values": ["1.017", "0.803", "1.757", "3.362"]},
                ],
            },
            {
                "title": "Overload (180 s cells, 90 s warm-up), every mode",
                "ylabel": "TTFT (s)",
                "groups": ["load_aware", "hash", "least_conn", "round_robin", "reference"],
                "series": [
                    {"name": "p95", "values": ["0.865", "6.885", "4.175", "8.345", "3.973"]},
                    {"name": "p99", "values": ["40.394", "7.656", "4.877", "9.481", "4.604"]},
                ],
            },
        ],
    },
    # The history (docs/bench/history/BENCHMARKS-to-stop-27.md), "Stop 27", its
    # first table: uniform's TTFT tail next to the floors under it (65389a9).
    # BENCHMARKS.md, "Placement (issues 8 and 3)", links this plot.
    {
        "file": "placement-floor.svg",
        "title": "Placement: uniform's TTFT p99 against the floors under it",
        "subtitle": "each cell's own sessions; the floors need no proxy and know which sessions are live",
        "source": "Source: docs/bench/history/BENCHMARKS-to-stop-27.md, Stop 27. benches/ttft_floor.py on --records, 65389a9.",
        "panels": [
            {
                "title": "The gateway's cells (load_aware)",
                "ylabel": "TTFT p99 (s)",
                "groups": ["seed 1", "seed 2", "seed 3"],
                "hline": {"y": 0.655, "label": "issue 8's p99 aim: 0.655 s"},
                "series": [
                    {"name": "TTFT", "values": ["0.843", "0.912", "1.115"]},
                    {"name": "wait for a slot", "values": ["0.745", "0.751", "0.864"]},
                    {"name": "replayed, fewest live", "values": ["1.022", "0.898", "0.882"]},
                    {"name": "fewest live + free move", "values": ["0.792", "0.783", "0.851"]},
                ],
            },
            {
                "title": "The reference's cells (ideal sticky router)",
                "ylabel": "TTFT p99 (s)",
                "groups": ["seed 1", "seed 2", "seed 3"],
                "hline": {"y": 0.655, "label": "issue 8's p99 aim: 0.655 s"},
                "series": [
                    {"name": "TTFT", "values": ["1.094", "1.141", "1.027"]},
                    {"name": "wait for a slot", "values": ["1.009", "1.007", "0.963"]},
                    {"name": "replayed, fewest live", "values": ["0.952", "0.698", "0.933"]},
                    {"name": "fewest live + free move", "values": ["0.863", "0.698", "0.816"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Placement (issues 8 and 3)": the table "The minute after
    # the table has learned" (65389a9), in the section's full record,
    # docs/bench/history/BENCHMARKS-to-stop-39.md.
    {
        "file": "placement-learned.svg",
        "title": "Placement: TTFT p99 in the minute after the table has learned",
        "subtitle": "120 s cells, the first 60 s not measured, queue_timeout 60s; one run per cell",
        "source": "Source: BENCHMARKS.md, Placement (issues 8 and 3), the minute after the table has learned. 65389a9; before = a51ce13.",
        "panels": [
            {
                "title": "skewed",
                "ylabel": "TTFT p99 (s)",
                "groups": ["seed 1", "seed 2", "seed 3"],
                "series": [
                    {"name": "before (a51ce13)", "values": ["2.252", "2.091", "1.715"]},
                    {"name": "main", "values": ["1.405", "0.928", "1.407"]},
                    {"name": "reference", "values": ["2.777", "2.509", "2.309"]},
                ],
            },
            {
                "title": "uniform",
                "ylabel": "TTFT p99 (s)",
                "groups": ["seed 1", "seed 2", "seed 3"],
                "series": [
                    {"name": "before (a51ce13)", "values": ["1.278", "0.918", "1.319"]},
                    {"name": "main", "values": ["0.887", "1.340", "1.334"]},
                    {"name": "reference", "values": ["0.957", "0.955", "0.968"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Restructure and hostile-input fixes (issue 7)": its
    # memory table, and the mimalloc / glibc figures under it in the section's
    # full record, docs/bench/history/BENCHMARKS-to-stop-39.md.
    {
        "file": "body-memory.svg",
        "title": "Hostile body: memory a 10 MB body of five million numbers adds",
        "subtitle": "peak RSS (VmHWM) after the bodies less before, a fresh gateway per case; log scale",
        "source": "Source: BENCHMARKS.md, Restructure and hostile-input fixes (issue 7). benches/body_memory.sh.",
        "panels": [
            {
                "title": "Memory added by the bodies",
                "ylabel": "MB added (log scale)",
                "log": True,
                "groups": ["1 body", "8 bodies at once"],
                "series": [
                    {"name": "before (a51ce13)", "values": ["370.4", "2,891.1"]},
                    {"name": "after issue 7", "values": ["10.3", "81.2"]},
                    {"name": "gateway on glibc", "values": ["10.9", "80.9"]},
                    {"name": "gateway on mimalloc (as shipped)", "values": ["10.7", "81.6"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Sessions without an id (issue 30)": the medians over
    # seeds 1-3 of its first table (before: content off, f13621e / 78ace31);
    # the page shows seed 1, the section's full record
    # (docs/bench/history/BENCHMARKS-to-stop-39.md) all three.
    {
        "file": "anonymous-sessions.svg",
        "title": "Sessions without an id: recognised by content, against a session header",
        "subtitle": "median of three seeds, 60 s cells, load_aware; before = the same anonymous sessions with recognition off",
        "source": "Source: BENCHMARKS.md, Sessions without an id (issue 30). llm-gateway bench --session-id header|none, 78ace31 and f13621e.",
        "panels": [
            {
                "title": "TTFT p95",
                "ylabel": "TTFT p95 (s)",
                "groups": ["uniform", "skewed", "forks", "slow-engine", "failover", "overload"],
                "series": [
                    {"name": "before: no id, content off", "values": ["2.793", "1.528", "2.659", "3.979", "4.180", "3.955"]},
                    {"name": "header", "values": ["0.559", "0.883", "1.548", "0.927", "1.495", "4.115"]},
                    {"name": "no id (content)", "values": ["0.548", "0.919", "0.593", "0.840", "1.532", "4.291"]},
                ],
            },
            {
                "title": "Cache hit",
                "ylabel": "prompt tokens cached (%)",
                "groups": ["uniform", "skewed", "forks", "slow-engine", "failover", "overload"],
                "series": [
                    {"name": "before: no id, content off", "values": ["34.2", "43.2", "51.8", "32.8", "34.0", "9.4"]},
                    {"name": "header", "values": ["93.6", "83.6", "85.5", "93.3", "89.9", "38.1"]},
                    {"name": "no id (content)", "values": ["93.6", "82.5", "93.7", "92.5", "90.7", "40.3"]},
                ],
            },
        ],
    },
    # BENCHMARKS.md, "Placement over a family of engines (issue 42)": each
    # run's TTFT p95 over its best real peer's: now (362d2b5, the gateway's
    # cells against the peers' cells of an earlier sitting) and before this
    # stop (374de3e: uniform beside its peers, shared-prefix gateway-only
    # against the same peers' cells as now).
    {
        "file": "placement-family.svg",
        "title": "Placement over a family of engines: TTFT p95 over the best real peer's, per run",
        "subtitle": "4 engine configurations drawn from --family-seed 1 (f1-f4), workload seeds s1-s3; below 1: better than every peer",
        "source": "Source: BENCHMARKS.md, Placement over a family of engines (issue 42). llm-gateway bench --family 4 --seeds 1,2,3.",
        "panels": [
            {
                "title": "uniform: 32 agent sessions, 60 s after 20 s of warm-up",
                "ylabel": "p95 / best peer's p95",
                "groups": ["f1 s1", "f1 s2", "f1 s3", "f2 s1", "f2 s2", "f2 s3", "f3 s1", "f3 s2", "f3 s3", "f4 s1", "f4 s2", "f4 s3"],
                "series": [
                    {"name": "now (362d2b5)", "values": ["0.32", "1.61", "1.03", "0.93", "0.91", "0.90", "2.04", "1.34", "1.01", "0.36", "0.13", "0.25"]},
                    {"name": "before (374de3e)", "values": ["0.31", "1.61", "1.03", "0.97", "1.06", "0.94", "1.82", "1.34", "1.08", "0.30", "0.17", "0.26"]},
                ],
                "hline": {"y": 1.0, "label": "the best peer"},
            },
            {
                "title": "shared-prefix: 80 tenants with an 8k-token prefix, no id, 60 s",
                "ylabel": "p95 / best peer's p95",
                "groups": ["f1 s1", "f1 s2", "f1 s3", "f2 s1", "f2 s2", "f2 s3", "f3 s1", "f3 s2", "f3 s3", "f4 s1", "f4 s2", "f4 s3"],
                "series": [
                    {"name": "now (362d2b5)", "values": ["1.33", "0.91", "1.00", "0.99", "1.00", "0.98", "0.82", "0.73", "0.60", "1.09", "0.70", "1.05"]},
                    {"name": "before (374de3e)", "values": ["1.14", "0.98", "1.04", "1.07", "1.04", "1.03", "2.34", "1.02", "0.70", "1.01", "0.92", "1.05"]},
                ],
                "hline": {"y": 1.0, "label": "the best peer"},
            },
        ],
    },
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "docs", "bench")
    os.makedirs(outdir, exist_ok=True)
    for plot in PLOTS:
        path = os.path.join(outdir, plot["file"])
        with open(path, "w", encoding="utf-8") as f:
            f.write(plot_svg(plot))
        print(os.path.normpath(path))


if __name__ == "__main__":
    main()
