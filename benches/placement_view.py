#!/usr/bin/env python3
"""Each new session's placement, as the truth was and as the table saw it.

    python3 benches/placement_view.py RECORDS.jsonl ROUTE_STATE.log

RECORDS: the bench's `--records` (one cell). ROUTE_STATE.log: written by
benches/route_state_trace.sh during the same cell. For every session's
first request (after the first 3 s) one line: when, its prompt tokens, the
engine it went to, the sessions truly live on each engine (from the
records: first request started, last not yet ended), and per engine what
`/_route_state` showed just before: returning / live sessions, load,
returning tokens, KV-full. `<-- +N` marks a newcomer placed on an engine
truly holding N more sessions than the emptiest one (N >= 2).

The log's clock is aligned to the records' by the first moment any peer
had a request in flight, which is the bench's first request (to ~0.25 s).
"""
import bisect
import collections
import json
import sys


def main(records_path, state_path):
    records = [json.loads(line) for line in open(records_path)]
    records = [r for r in records if r["ok"]]
    states = []
    for line in open(state_path):
        stamp, body = line.split(" ", 1)
        states.append((float(stamp), json.loads(body)))
    busy = next(t for t, s in states if any(p["in_flight"] > 0 for p in s["peers"]))
    offset = busy - min(r["start_s"] for r in records)
    times = [t - offset for t, _ in states]

    sessions = collections.defaultdict(list)
    for r in records:
        sessions[(r["slot"], r["generation"])].append(r)
    for turns in sessions.values():
        turns.sort(key=lambda r: r["start_s"])
    engines = sorted({r["engine"] for r in records})

    def truly_live(t):
        count = collections.Counter()
        for turns in sessions.values():
            if turns[0]["start_s"] <= t < turns[-1]["end_s"]:
                count[[r for r in turns if r["start_s"] <= t][-1]["engine"]] += 1
        return [count.get(e, 0) for e in engines]

    stacked = 0
    firsts = sorted((turns[0] for turns in sessions.values()), key=lambda r: r["start_s"])
    # The first 3 s are the pre-aged sessions arriving all at once.
    firsts = [r for r in firsts if r["start_s"] >= 3 and r["start_s"] >= times[0]]
    for r in firsts:
        live = truly_live(r["start_s"] - 1e-6)
        i = bisect.bisect_right(times, r["start_s"]) - 1
        seen = " ".join(
            f"[{p['returning_sessions']:.1f}/{p['live_sessions']} L{p['load']} "
            f"{p['returning_tokens'] // 1000}k{' KV-full' if p['kv_full'] else ''}]"
            for p in states[i][1]["peers"]
        )
        extra = live[engines.index(r["engine"])] - min(live)
        mark = f" <-- +{extra}" if extra >= 2 else ""
        stacked += extra >= 2
        print(f"{r['start_s']:5.1f} s {r['prompt_tokens']:6d} tok -> e{r['engine']}  "
              f"truly live {live}  table {seen}{mark}")
    print(f"{stacked} of {len(firsts)} newcomers went to an engine holding 2+ more than the emptiest")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
