#!/usr/bin/env python3
"""TTFT CDFs from `llm-gateway bench --records` files, one panel per
scenario and seed, one line per cell, as one SVG. Standard library only.

    python3 benches/ttft_cdf.py OUT.svg LABEL=RECORDS.jsonl[:MODE[,MODE]] ...

Each argument names a line group: LABEL prefixes the cells' names (e.g.
`before=A.jsonl:load_aware`, `after=I.jsonl`, `peers=A.jsonl:vllm-sticky,reference`).
Only measured requests are drawn: successful, started inside the cell's
window (`--window START-END` seconds, default 20-60, the bench's 60 s cell
with a 20 s warm-up). The x axis is logarithmic (TTFT spans 0.05-60 s).
"""

import json
import math
import sys
from collections import OrderedDict
from xml.sax.saxutils import escape

COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999", "#000000"]
W, H, PAD = 420, 260, 48
X_MIN, X_MAX = 0.03, 100.0


def x_of(t):
    t = min(max(t, X_MIN), X_MAX)
    return PAD + (math.log10(t) - math.log10(X_MIN)) / (math.log10(X_MAX) - math.log10(X_MIN)) * (W - 2 * PAD)


def y_of(q):
    return H - PAD - q * (H - 2 * PAD)


def main(argv):
    window = (20.0, 60.0)
    args = []
    for a in argv[1:]:
        if a.startswith("--window="):
            lo, hi = a.split("=", 1)[1].split("-")
            window = (float(lo), float(hi))
        else:
            args.append(a)
    if len(args) < 2:
        sys.exit(__doc__)
    out, groups = args[0], args[1:]
    panels = OrderedDict()  # (scenario, seed) -> {line name: [ttft...]}
    for g in groups:
        label, spec = g.split("=", 1)
        path, _, modes = spec.partition(":")
        wanted = set(modes.split(",")) if modes else None
        seed = None
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if wanted and r["mode"] not in wanted:
                    continue
                if not r["ok"] or r["ttft_s"] is None or not (window[0] <= r["start_s"] < window[1]):
                    continue
                key = r["scenario"]
                panels.setdefault(key, OrderedDict()).setdefault(f"{label} {r['mode']}", []).append(r["ttft_s"])
    cols = 2
    rows = math.ceil(len(panels) / cols)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * cols}" height="{H * rows}" font-family="Helvetica, Arial, sans-serif" font-size="11">']
    svg.append(f'<rect width="{W * cols}" height="{H * rows}" fill="white"/>')
    for n, (scenario, lines) in enumerate(panels.items()):
        ox, oy = (n % cols) * W, (n // cols) * H
        svg.append(f'<g transform="translate({ox},{oy})">')
        svg.append(f'<text x="{PAD}" y="20" font-size="13" font-weight="bold">{escape(scenario)}: TTFT CDF</text>')
        svg.append(f'<rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="none" stroke="#ccc"/>')
        for t in (0.1, 1, 10, 100):
            x = x_of(t)
            svg.append(f'<line x1="{x:.1f}" y1="{PAD}" x2="{x:.1f}" y2="{H - PAD}" stroke="#eee"/>')
            svg.append(f'<text x="{x:.1f}" y="{H - PAD + 14}" text-anchor="middle">{t:g} s</text>')
        for q in (0.5, 0.95, 0.99):
            y = y_of(q)
            svg.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - PAD}" y2="{y:.1f}" stroke="#eee"/>')
            svg.append(f'<text x="{PAD - 4}" y="{y + 4:.1f}" text-anchor="end">{q:g}</text>')
        for i, (name, values) in enumerate(lines.items()):
            values.sort()
            pts = " ".join(f"{x_of(v):.1f},{y_of((k + 1) / len(values)):.1f}" for k, v in enumerate(values))
            colour = COLOURS[i % len(COLOURS)]
            svg.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            svg.append(f'<text x="{W - PAD - 4}" y="{PAD + 14 + 13 * i}" text-anchor="end" fill="{colour}">{escape(name)} (n={len(values)})</text>')
        svg.append("</g>")
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg))
    print(f"wrote {out}: {len(panels)} panel(s)")


if __name__ == "__main__":
    main(sys.argv)
