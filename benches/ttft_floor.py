#!/usr/bin/env python3
"""How low a placement could push a cell's TTFT tail, from its own records.

    python3 benches/ttft_floor.py RECORDS.jsonl [--warmup 10] [--duration 60]
        [--prefill-us 50] [--system 2000] [--max-running 6]

RECORDS: the bench's `--records` (any number of cells and modes). For each
(scenario, mode), over the requests the bench measures (started after the
warm-up, before the end, not cut):

- TTFT p50 / p95 / p99 as the bench reports them;
- wait: TTFT less the simulated prefill of the request's uncached tokens
  (`--prefill-us` per token, the sim's default), i.e. the time it queued
  for a slot on its engine;
- free move: each later turn takes the lesser of its TTFT and a cold
  prefill of its whole prompt but the shared system prompt, as if an
  oracle had moved exactly the turns a move helps, at no cost to anyone;
- replayed: the cell's own sessions (each turn's service time and each
  think gap, as recorded) replayed on engines of `--max-running` FIFO
  slots, first with each turn on the engine it had, then with an
  oracle that puts every new session on the engine truly holding the
  fewest live sessions (it knows when a session has ended; ties: fewest
  in flight) and keeps it there. The first replay checks the model
  against the cell; the second is what perfect knowledge of the bound
  sessions buys a sticky router; the last column lets that oracle's
  turns take the free move too (both oracles at once).

Only for scenarios with identical engines (uniform, skewed, overload):
slow-engine's e0 prefills at 1/0.4 of the rate. The replay keeps each
turn's cached tokens as recorded, so it says nothing about eviction, and
it needs a cell without errors (a failed turn breaks its slot's gaps).
"""
import argparse
import collections
import heapq
import json
import math


def percentile(values, p):
    """Interpolated between ranks, as the bench's report computes it."""
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


class Replay:
    """Discrete-event replay of one cell's sessions on FIFO-slot engines."""

    def __init__(self, rows, prefill, slots):
        self.prefill = prefill
        self.slots = slots
        # A bench slot runs one session after another: its turns in order,
        # with the recorded gap (think time, or the pause before the next
        # session) between one turn's end and the next turn's start.
        self.by_slot = collections.defaultdict(list)
        for r in rows:
            self.by_slot[r["slot"]].append(r)
        for turns in self.by_slot.values():
            turns.sort(key=lambda r: r["start_s"])

    def own_prefill(self, r):
        return self.prefill(r["prompt_tokens"] - r["cached_tokens"])

    def run(self, place, every_turn=False):
        """(record, TTFT) of every turn, with `place` choosing each new
        session's engine from (record, live, in_flight), or each turn's
        with `every_turn` (a cell's own moves)."""
        events, order = [], 0

        def push(at, kind, data):
            nonlocal order
            heapq.heappush(events, (at, order, kind, data))
            order += 1

        for slot, turns in self.by_slot.items():
            push(turns[0]["start_s"], "arrive", (slot, 0))
        home = {}
        live = collections.Counter()
        in_flight = collections.Counter()
        busy = collections.Counter()
        queued = collections.defaultdict(collections.deque)
        ttft = []

        def begin(engine, now, slot, index, arrived):
            r = self.by_slot[slot][index]
            recorded_wait = r["ttft_s"] - self.own_prefill(r)
            service = (r["end_s"] - r["start_s"]) - recorded_wait
            ttft.append((r, now - arrived + self.own_prefill(r)))
            push(now + service, "done", (engine, slot, index))

        while events:
            now, _, kind, data = heapq.heappop(events)
            if kind == "arrive":
                slot, index = data
                r = self.by_slot[slot][index]
                session = (slot, r["generation"])
                if session not in home:
                    home[session] = place(r, live, in_flight)
                    live[home[session]] += 1
                elif every_turn:
                    live[home[session]] -= 1
                    home[session] = place(r, live, in_flight)
                    live[home[session]] += 1
                engine = home[session]
                in_flight[engine] += 1
                if busy[engine] < self.slots:
                    busy[engine] += 1
                    begin(engine, now, slot, index, now)
                else:
                    queued[engine].append((slot, index, now))
                continue
            engine, slot, index = data
            in_flight[engine] -= 1
            if queued[engine]:
                begin(engine, now, *queued[engine].popleft())
            else:
                busy[engine] -= 1
            turns = self.by_slot[slot]
            r = turns[index]
            following = turns[index + 1] if index + 1 < len(turns) else None
            if following is None or following["generation"] != r["generation"]:
                live[home[(slot, r["generation"])]] -= 1
            if following is not None:
                push(now + following["start_s"] - r["end_s"], "arrive", (slot, index + 1))
        return ttft


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds not measured")
    ap.add_argument("--duration", type=float, default=60.0, help="the cell's --duration")
    ap.add_argument("--prefill-us", type=float, default=50.0, help="per uncached token")
    ap.add_argument("--system", type=int, default=2000, help="shared system prompt tokens")
    ap.add_argument("--max-running", type=int, default=6, help="the engines' slots")
    args = ap.parse_args()

    def prefill(tokens):
        return tokens * args.prefill_us / 1e6

    def measured(r):
        return args.warmup <= r["start_s"] < args.duration and not r["cut"]

    per_cell = collections.defaultdict(list)
    for line in open(args.records):
        r = json.loads(line)
        if r["ok"] and r["ttft_s"] is not None:
            per_cell[(r["scenario"], r["mode"])].append(r)

    def tail(values):
        return " / ".join(f"{percentile(values, p):.3f}" for p in (95, 99))

    print(
        "| scenario | mode | requests | TTFT p50 / p95 / p99 | wait p95 / p99 "
        "| free move p95 / p99 | replayed as placed p95 / p99 | replayed, fewest live p95 / p99 "
        "| fewest live + free move p95 / p99 |"
    )
    print("|---|---|--:|---|---|---|---|---|---|")
    for (scenario, mode), rows in per_cell.items():
        rows_measured = [r for r in rows if measured(r)]
        ttft = [r["ttft_s"] for r in rows_measured]
        wait = [r["ttft_s"] - prefill(r["prompt_tokens"] - r["cached_tokens"]) for r in rows_measured]

        def free_move(r, took):
            if r["first_of_session"]:
                return took
            return min(took, prefill(max(0, r["prompt_tokens"] - args.system)))

        moved = [free_move(r, r["ttft_s"]) for r in rows_measured]
        engines = sorted({r["engine"] for r in rows})
        replay = Replay(rows, prefill, args.max_running)

        def as_placed(r, _live, _in_flight):
            return r["engine"]

        def fewest_live(_r, live, in_flight):
            return min(engines, key=lambda e: (live[e], in_flight[e], e))

        def replayed(place, every_turn=False):
            return [(r, t) for r, t in replay.run(place, every_turn) if measured(r)]

        oracle = replayed(fewest_live)

        print(
            f"| {scenario} | {mode} | {len(rows_measured)} "
            f"| {percentile(ttft, 50):.3f} / {tail(ttft)} | {tail(wait)} | {tail(moved)} "
            f"| {tail([t for _, t in replayed(as_placed, every_turn=True)])} "
            f"| {tail([t for _, t in oracle])} | {tail([free_move(r, t) for r, t in oracle])} |"
        )


if __name__ == "__main__":
    main()
