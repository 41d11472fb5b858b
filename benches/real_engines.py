#!/usr/bin/env python3
"""A bench cell on REAL engines (issue 32, item 4): agent sessions replayed
through the gateway onto N real llama.cpp `llama-server`s, per mode.

What it measures, per (seed, mode), each mode on freshly started engines
(cold caches):

- the ENGINE-measured prefix-cache hit: sum(usage.prompt_tokens_details.
  cached_tokens) / sum(usage.prompt_tokens) over the answered requests (the
  engine's own numbers, from the final `include_usage` frame of each
  stream), cross-checked with the engines' /metrics counters
  (llamacpp:prompt_tokens_cached_total / (that + llamacpp:prompt_tokens_total),
  the delta over the cell);
- the client-measured TTFT (request sent -> first non-empty content delta):
  p50 / p95 / p99, mean for turn 1 and for later turns;
- requests, errors (non-200 once --retries retries of a 429 / 503 are
  spent, transport errors, streams cut before their usage frame / [DONE];
  an error ends its session, whose later turns count as not run) and the
  429 / 503 answers the client retried (TTFT counts from the first try);
- how many later turns landed on another engine than the session's
  previous turn (from `X-Routed-Peer`), and the placement kinds the
  gateway reported (`X-Routed-Mode`: new, sticky, spill, overflow, ...).

Modes: any gateway `balancing.mode` (load_aware, round_robin, hash,
least_conn), and `reference`: no gateway, the client pins each session to
engine crc32(session id) % N and talks to it directly (perfect affinity;
note that the simulated bench's `reference` places by least load instead).

Workload (seeded, the same bytes for every mode of a seed): S sessions,
staggered starts; turn 1 = a system prompt shared by all sessions plus a
user message of pseudo-random words (~--first-tokens in all), each later
turn appends the engine's previous reply and a new user message of
--turn-tokens; think time between turns uniform in --think; greedy
decoding of --max-tokens. One thread per session, http.client, streaming.
The tiny test model tokenizes one token per letter and caps a slot's
context at its training context (4096, whatever -c / --parallel say), so
later turns are scaled down per session to keep each conversation inside
the slot context read from the engine's /props (the scale is reported);
a turn that would still not fit ends its session (`ctx_stopped`).

Gateway route: the engines as peers e0..eN-1 with --max-concurrency,
`balancing.mode`, a 1 s health probe, X-Routed-* headers on; --route-extra
adds route keys (e.g. `queue_timeout: 30s`), --peer-extra peer keys. The
gateway shows a llama-server's /props capacity (slots x slot context) but
does not measure live sessions against it, since llama-server keeps
prompt prefixes in host RAM between turns (--cache-ram, 8 GiB by default);
this bench found that (before 9ec63e6, new sessions waited out the whole
queue_timeout while the engines idled).

Needs only Python 3's standard library, a llama-server binary, a GGUF model
(e.g. tests/real_engine/tiny_model.py's) and an llm-gateway binary:

    python3 benches/real_engines.py --quick                       # smoke, ~1 min
    python3 benches/real_engines.py --seed 1 --json out.json      # 3 modes, a few min
    python3 benches/real_engines.py --seed 1,2,3 --modes load_aware,reference \\
        --gateway ./target/release/llm-gateway \\
        --llama-server /path/to/llama-server --model /path/to/model.gguf

--llama-server / --model default to $LLM_GATEWAY_LLAMA_SERVER /
$LLM_GATEWAY_LLAMA_MODEL; --gateway to $LLM_GATEWAY_BIN, else
target/release/llm-gateway of this checkout. Every process it starts it
stops by its pid; each cell has a deadline (--cell-deadline) and the run a
total one (--deadline), past which requests stop being sent and what is
left is reported as not run.
"""
import argparse
import atexit
import collections
import http.client
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GATEWAY_MODES = ("load_aware", "round_robin", "hash", "least_conn")
ROUTE = "chat"
# Per-message chat-template overhead (ChatML markers, role, newlines), in
# tokens, and the generation prompt's; generous: only used for budgeting.
MSG_OVERHEAD = 16
GEN_OVERHEAD = 12
CTX_MARGIN = 32

STARTED = []  # Popen objects this run started; stopped by pid only


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


def free_port(taken):
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in taken:
            taken.add(port)
            return port


def start(cmd, logpath):
    f = open(logpath, "wb")
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    f.close()
    STARTED.append(p)
    return p


def stop(p, grace=5.0):
    if p.poll() is None:
        try:
            p.terminate()
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        except ProcessLookupError:
            pass
    if p in STARTED:
        STARTED.remove(p)


def stop_all():
    for p in list(STARTED):
        stop(p, 3.0)


def http_get(port, path, timeout=2.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_until(pred, timeout, what, proc=None):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        try:
            if pred():
                return
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f} s")


class Engines:
    def __init__(self, args, n, workdir, tag, ports):
        self.ports = [free_port(ports) for _ in range(n)]
        self.procs = []
        for i, port in enumerate(self.ports):
            cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1",
                   "--port", str(port), "--parallel", str(args.parallel),
                   "-c", str(args.ctx), "--metrics", "-t", str(args.engine_threads)]
            self.procs.append(start(cmd, os.path.join(workdir, f"{tag}-engine{i}.log")))
        for i, (port, p) in enumerate(zip(self.ports, self.procs)):
            wait_until(lambda: http_get(port, "/health")[0] == 200, 180, f"engine {i} /health", p)

    def slot_ctx(self):
        _, body = http_get(self.ports[0], "/props")
        return int(json.loads(body)["default_generation_settings"]["n_ctx"])

    def counters(self):
        out = []
        for port in self.ports:
            _, body = http_get(port, "/metrics")
            vals = {}
            for line in body.decode().splitlines():
                if line.startswith("llamacpp:"):
                    k, _, v = line.partition(" ")
                    try:
                        vals[k[len("llamacpp:"):]] = float(v)
                    except ValueError:
                        pass
            out.append(vals)
        return out

    def warm(self):
        """One short unrelated request per engine (first-request setup off
        the clock); its tokens are subtracted from the counters."""
        for port in self.ports:
            body = json.dumps({"messages": [{"role": "user", "content": "warm up"}],
                               "max_tokens": 2, "temperature": 0})
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            c.getresponse().read()
            c.close()

    def close(self):
        for p in self.procs:
            stop(p)


class Gateway:
    def __init__(self, args, mode, engines, workdir, tag, ports):
        self.port = free_port(ports)
        self.admin = free_port(ports)
        d = os.path.join(workdir, f"{tag}-gw")
        os.makedirs(os.path.join(d, "routes"), exist_ok=True)
        peers = "\n".join(
            f"  - {{name: e{i}, host: 127.0.0.1, port: {p}, max_concurrency: {args.max_concurrency}"
            + "".join(f", {x}" for x in args.peer_extra) + "}"
            for i, p in enumerate(engines.ports))
        with open(os.path.join(d, "routes", f"{ROUTE}.yaml"), "w") as f:
            f.write(f"peers:\n{peers}\nbalancing:\n  mode: {mode}\n"
                    "health: {interval: 1s, probe_path: /health, timeout: 2s}\n"
                    "routed_headers: true\n")
            for line in args.route_extra:
                f.write(line + "\n")
        with open(os.path.join(d, "gateway.yaml"), "w") as f:
            f.write(f"listen: 127.0.0.1:{self.port}\nadmin_listen: 127.0.0.1:{self.admin}\n"
                    f"routes_dir: {os.path.join(d, 'routes')}\nwatch: false\n"
                    f"api_keys_file: {os.path.join(d, 'no-keys')}\n")
        self.proc = start([args.gateway, "-c", os.path.join(d, "gateway.yaml")],
                          os.path.join(workdir, f"{tag}-gateway.log"))
        wait_until(lambda: http_get(self.admin, "/healthz")[0] == 200, 30, "gateway /healthz", self.proc)

        def ready():
            st, body = http_get(self.port, f"/{ROUTE}/_health_status")
            peers = json.loads(body)["peers"]
            return st == 200 and len(peers) == len(engines.ports) and all(p["ready"] for p in peers)

        wait_until(ready, 30, "gateway route readiness", self.proc)

    def route_state(self):
        try:
            return json.loads(http_get(self.port, f"/{ROUTE}/_route_state")[1])
        except (OSError, ValueError, http.client.HTTPException):
            return None

    def close(self):
        stop(self.proc)


# ---------------------------------------------------------------- workload


def make_words(rng, n=3000):
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def text(rng, words, tokens):
    """Pseudo-random words holding about `tokens` tokens (the tiny model:
    one token per letter)."""
    out, k = [], 0
    while k < tokens:
        w = rng.choice(words)
        out.append(w)
        k += len(w)
    return " ".join(out)


def est_tokens(s):
    return sum(1 for ch in s if not ch.isspace())


def make_workload(args, seed, slot_ctx):
    rng = random.Random(seed)
    words = make_words(rng)
    system = "You are a coding agent. Follow the tool protocol. " + text(rng, words, args.system_tokens)
    budget = slot_ctx - args.max_tokens - CTX_MARGIN
    reply_reserve = 3 * args.max_tokens  # a noisy reply re-tokenizes to at most ~3 tokens per token
    sessions = []
    for i in range(args.sessions):
        sid = f"rb-{seed}-{i}-{rng.getrandbits(32):08x}"
        first = text(rng, words, max(50, args.first_tokens - est_tokens(system)))
        later = [rng.randint(args.turn_tokens[0], args.turn_tokens[1]) for _ in range(args.turns - 1)]
        fixed = (est_tokens(system) + est_tokens(first) + 2 * MSG_OVERHEAD + GEN_OVERHEAD
                 + (args.turns - 1) * (2 * MSG_OVERHEAD + reply_reserve))
        room = budget - fixed
        scale = 1.0
        if later and sum(later) > room:
            scale = max(0.0, room / sum(later))
            later = [max(20, int(t * scale)) for t in later]
        users = [first] + [text(rng, words, t) for t in later]
        thinks = [rng.uniform(args.think[0], args.think[1]) for _ in range(args.turns - 1)]
        start_at = i * args.stagger + rng.uniform(0, args.stagger / 2)
        sessions.append({"id": sid, "start": start_at, "users": users, "thinks": thinks,
                         "scale": scale, "engine_ref": zlib.crc32(sid.encode()) % args.engines})
    return {"seed": seed, "system": system, "sessions": sessions, "slot_ctx": slot_ctx}


# ---------------------------------------------------------------- client


def one_request(port, path, headers, body, timeout):
    """POST a streaming chat request; returns a record of what came back."""
    rec = {"status": None, "error": None, "ttft": None, "first_frame": None, "total": None,
           "usage": None, "timings": None, "headers": {}, "reply": ""}
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body, headers)
        r = c.getresponse()
        rec["status"] = r.status
        rec["headers"] = {k.lower(): v for k, v in r.getheaders() if k.lower().startswith("x-routed-")}
        if r.status != 200:
            rec["error"] = f"http {r.status}: {r.read(300)!r}"
            return rec
        done = False
        parts = []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            j = json.loads(data)
            now = time.monotonic() - t0
            if rec["first_frame"] is None:
                rec["first_frame"] = now
            for ch in j.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if rec["ttft"] is None:
                        rec["ttft"] = now
                    parts.append(piece)
            if j.get("usage"):
                rec["usage"] = j["usage"]
                rec["timings"] = j.get("timings")
        rec["reply"] = "".join(parts)
        if not done or rec["usage"] is None:
            rec["error"] = "cut stream (no usage frame / [DONE])"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        rec["total"] = time.monotonic() - t0
        c.close()
    return rec


def run_session(sess, wl, args, mode, target, t_start, deadline, out):
    """target: ("gateway", port) or ("engines", [ports])."""
    time.sleep(max(0.0, t_start + sess["start"] - time.monotonic()))
    messages = [{"role": "system", "content": wl["system"]}]
    last_prompt = 0
    for turn, user in enumerate(sess["users"], start=1):
        rec = {"session": sess["id"], "turn": turn, "sent_at": None}
        if time.monotonic() >= deadline:
            rec["not_run"] = "deadline"
            out.append(rec)
            continue
        if turn > 1:
            prev = out[-1]
            need = (last_prompt + 3 * (prev.get("completion_tokens") or args.max_tokens)
                    + est_tokens(user) + 2 * MSG_OVERHEAD + GEN_OVERHEAD + args.max_tokens)
            if need > wl["slot_ctx"]:
                rec["not_run"] = "ctx_stopped"
                out.append(rec)
                break
            messages.append({"role": "assistant", "content": prev.get("reply", "")})
        messages.append({"role": "user", "content": user})
        body = json.dumps({"messages": messages, "max_tokens": args.max_tokens,
                           "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        headers = {"content-type": "application/json", "x-session-id": sess["id"]}
        if target[0] == "gateway":
            port, path, engine = target[1], f"/{ROUTE}/v1/chat/completions", None
        else:
            engine = sess["engine_ref"]
            port, path = target[1][engine], "/v1/chat/completions"
        timeout = max(5.0, min(args.request_timeout, deadline + 30 - time.monotonic()))
        rec["sent_at"] = time.monotonic() - t_start
        # A client retries a 429 / 503 after a backoff, as the OpenAI SDK
        # does (2 retries by default); TTFT and total count from the first
        # attempt, what the user waits.
        t_first = time.monotonic()
        refused = []
        for attempt in range(args.retries + 1):
            r = one_request(port, path, headers, body, timeout)
            if r["status"] not in (429, 503) or attempt == args.retries:
                break
            refused.append(r["status"])
            backoff = args.retry_backoff * 2 ** attempt
            if time.monotonic() + backoff >= deadline:
                break
            time.sleep(backoff)
        waited = time.monotonic() - t_first - r["total"]
        for k in ("ttft", "first_frame"):
            if r[k] is not None:
                r[k] += waited
        r["total"] += waited
        rec["refused"] = refused
        if engine is None:
            peer = r["headers"].get("x-routed-peer")
            engine = int(peer[1:]) if peer and peer[1:].isdigit() else None
        usage = r["usage"] or {}
        rec.update({
            "status": r["status"], "error": r["error"], "ttft": r["ttft"],
            "first_frame": r["first_frame"], "total": r["total"], "engine": engine,
            "placement": r["headers"].get("x-routed-mode"),
            "retries": r["headers"].get("x-routed-retries"),
            "queued_ms": int(r["headers"].get("x-routed-queued-ms") or 0),
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "timings": r["timings"], "reply": r["reply"],
        })
        out.append(rec)
        if r["error"]:
            break  # the conversation cannot go on without this turn's reply
        last_prompt = usage.get("prompt_tokens") or last_prompt
        if turn < len(sess["users"]):
            time.sleep(max(0.0, min(sess["thinks"][turn - 1], deadline - time.monotonic())))
    # turns never reached (an error or ctx stop ended the session) are not run
    ran = {r["turn"] for r in out}
    for turn in range(1, len(sess["users"]) + 1):
        if turn not in ran:
            out.append({"session": sess["id"], "turn": turn, "not_run": "session_ended"})


# ---------------------------------------------------------------- summary


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)]


def mean(values):
    return sum(values) / len(values) if values else None


def summarize(mode, seed, recs, before, after, wall, n_engines):
    sent = [r for r in recs if "not_run" not in r]
    ok = [r for r in sent if not r.get("error")]
    errors = collections.Counter()
    for r in sent:
        if r.get("error"):
            errors["cut" if r["error"].startswith("cut") else
                   (f"http_{r['status']}" if r["error"].startswith("http") else "transport")] += 1
    not_run = collections.Counter(r["not_run"] for r in recs if "not_run" in r)
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    m_prompt = m_cached = 0.0
    for b, a in zip(before, after):
        m_prompt += a.get("prompt_tokens_total", 0) - b.get("prompt_tokens_total", 0)
        m_cached += a.get("prompt_tokens_cached_total", 0) - b.get("prompt_tokens_cached_total", 0)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    by_sess = collections.defaultdict(list)
    for r in sent:
        by_sess[r["session"]].append(r)
    moves = later_known = 0
    for rs in by_sess.values():
        rs.sort(key=lambda r: r["turn"])
        for a, b in zip(rs, rs[1:]):
            if a.get("engine") is not None and b.get("engine") is not None:
                later_known += 1
                moves += a["engine"] != b["engine"]
    per_engine = collections.Counter(r.get("engine") for r in sent)
    return {
        "mode": mode, "seed": seed, "wall_s": round(wall, 1),
        "requests": len(sent), "ok": len(ok), "errors": sum(errors.values()),
        "errors_by_kind": dict(errors), "not_run": dict(not_run),
        "refused_retried": sum(len(r.get("refused") or []) for r in sent),
        "gateway_queued": sum(1 for r in sent if r.get("queued_ms")),
        "gateway_queued_ms_max": max((r.get("queued_ms") or 0 for r in sent), default=0),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
        "hit": cached / prompt if prompt else None,
        "metrics_prompt_tokens": m_prompt + m_cached, "metrics_cached_tokens": m_cached,
        "hit_metrics": m_cached / (m_prompt + m_cached) if m_prompt + m_cached else None,
        "ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "ttft_p99": pct(ttft, 99),
        "ttft_mean_turn1": mean([r["ttft"] for r in ok if r["turn"] == 1 and r["ttft"] is not None]),
        "ttft_mean_later": mean([r["ttft"] for r in ok if r["turn"] > 1 and r["ttft"] is not None]),
        "no_content_delta": sum(1 for r in ok if r["ttft"] is None),
        "moves": moves, "later_turns_known": later_known,
        "placements": dict(collections.Counter(r.get("placement") for r in sent if r.get("placement"))),
        "per_engine_requests": {f"e{k}": v for k, v in sorted(per_engine.items(), key=lambda kv: str(kv[0]))
                                if k is not None},
        "max_prompt_tokens": max((r["prompt_tokens"] or 0 for r in ok), default=0),
    }


def f3(v):
    return "-" if v is None else f"{v:.3f}"


def table(cells):
    head = ("| seed | mode | req | err | 429/503 retried | not run | gw queued (max ms) | hit (usage) | hit (/metrics) | prefill tok "
            "| TTFT p50 | p95 | p99 | mean t1 | mean t>1 | moved | placements | per engine |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        if c.get("skipped"):
            lines.append(f"| {c['seed']} | {c['mode']} | skipped: {c['skipped']} |")
            continue
        pl = " ".join(f"{k}:{v}" for k, v in sorted(c["placements"].items())) or "-"
        pe = " ".join(f"{k}:{v}" for k, v in c["per_engine_requests"].items())
        nr = sum(c["not_run"].values())
        lines.append(
            f"| {c['seed']} | {c['mode']} | {c['requests']} | {c['errors']} | {c['refused_retried']} | {nr} "
            f"| {c['gateway_queued']} ({c['gateway_queued_ms_max']}) "
            f"| {f3(c['hit'])} | {f3(c['hit_metrics'])} | {c['prefill_tokens']} "
            f"| {f3(c['ttft_p50'])} | {f3(c['ttft_p95'])} | {f3(c['ttft_p99'])} "
            f"| {f3(c['ttft_mean_turn1'])} | {f3(c['ttft_mean_later'])} "
            f"| {c['moves']}/{c['later_turns_known']} | {pl} | {pe} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- cells


def run_cell(args, mode, seed, workloads, workdir, ports, run_deadline):
    tag = f"s{seed}-{mode}"
    log(f"cell {tag}: starting {args.engines} engines")
    engines = Engines(args, args.engines, workdir, tag, ports)
    gw = None
    try:
        if seed not in workloads:
            workloads[seed] = make_workload(args, seed, args.slot_ctx or engines.slot_ctx())
        wl = workloads[seed]
        engines.warm()
        if mode == "reference":
            target = ("engines", engines.ports)
        else:
            gw = Gateway(args, mode, engines, workdir, tag, ports)
            target = ("gateway", gw.port)
        before = engines.counters()
        load_start = os.getloadavg()[0]
        log(f"cell {tag}: {len(wl['sessions'])} sessions x {args.turns} turns")
        t_start = time.monotonic()
        deadline = min(t_start + args.cell_deadline, run_deadline)
        outs = [[] for _ in wl["sessions"]]
        threads = [threading.Thread(target=run_session, daemon=True,
                                    args=(s, wl, args, mode, target, t_start, deadline, outs[i]))
                   for i, s in enumerate(wl["sessions"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.1, deadline + args.request_timeout + 5 - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        wall = time.monotonic() - t_start
        time.sleep(0.3)  # let the engines' counters settle
        after = engines.counters()
        state = gw.route_state() if gw else None
        recs = [dict(r) for o in outs for r in list(o)]
        cell = summarize(mode, seed, recs, before, after, wall, args.engines)
        cell["stuck_sessions"] = stuck
        # The machine's 1-minute load average at the cell's start and end:
        # TTFT is wall-clock, so anything else running on the cores shows in it.
        cell["loadavg_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
        cell["later_turn_scale_min"] = round(min(s["scale"] for s in wl["sessions"]), 3)
        cell["route_state"] = state
        for r in recs:
            r.pop("reply", None)
        cell["records"] = recs
        log(f"cell {tag}: {cell['requests']} requests, {cell['errors']} errors, "
            f"hit {f3(cell['hit'])}, TTFT p50 {f3(cell['ttft_p50'])} p95 {f3(cell['ttft_p95'])}, "
            f"{wall:.0f} s, load average {cell['loadavg_1m']}")
        return cell
    finally:
        if gw:
            gw.close()
        engines.close()


def pair(s, conv=float):
    a, _, b = s.partition(",")
    return (conv(a), conv(b or a))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default=os.environ.get("LLM_GATEWAY_BIN",
                                                         os.path.join(REPO, "target/release/llm-gateway")))
    ap.add_argument("--llama-server", default=os.environ.get("LLM_GATEWAY_LLAMA_SERVER"))
    ap.add_argument("--model", default=os.environ.get("LLM_GATEWAY_LLAMA_MODEL"))
    ap.add_argument("--modes", default="load_aware,round_robin,reference")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=None, help="default 8 (--quick: 4)")
    ap.add_argument("--turns", type=int, default=None, help="default 6 (--quick: 3)")
    ap.add_argument("--seed", default="1", help="one seed or a comma list: 1,2,3")
    ap.add_argument("--first-tokens", type=int, default=None, help="turn 1 prompt, default 1500 (--quick: 800)")
    ap.add_argument("--system-tokens", type=int, default=300, help="the shared system prompt's part of turn 1")
    ap.add_argument("--turn-tokens", type=lambda s: pair(s, int), default=None,
                    help="later user messages LO,HI tokens, default 300,600 (--quick: 150,300)")
    ap.add_argument("--think", type=pair, default=None, help="think time LO,HI s, default 0.5,3 (--quick: 0.3,1)")
    ap.add_argument("--stagger", type=float, default=None, help="s between session starts, default 1 (--quick: 0.5)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-concurrency", type=int, default=8, help="each peer's max_concurrency in the route")
    ap.add_argument("--route-extra", action="append", default=[],
                    help="a line appended to the route file, e.g. 'queue_timeout: 30s'")
    ap.add_argument("--peer-extra", action="append", default=[],
                    help="a key added to every peer, e.g. 'kv_capacity_tokens: 200000'")
    ap.add_argument("--parallel", type=int, default=2, help="llama-server --parallel")
    ap.add_argument("--ctx", type=int, default=16384, help="llama-server -c")
    ap.add_argument("--engine-threads", type=int, default=1, help="llama-server -t")
    ap.add_argument("--slot-ctx", type=int, default=0, help="a slot's context; default: the engine's /props n_ctx")
    ap.add_argument("--cell-deadline", type=float, default=None, help="s per cell, default 150 (--quick: 60)")
    ap.add_argument("--deadline", type=float, default=900, help="s for the whole run")
    ap.add_argument("--request-timeout", type=float, default=60)
    ap.add_argument("--retries", type=int, default=2, help="retries of a 429 / 503 answer (then it is an error)")
    ap.add_argument("--retry-backoff", type=float, default=0.5, help="s before the first retry, doubling")
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--json", help="write every cell (summary and per-request records) here")
    ap.add_argument("--workdir", help="keep engine/gateway logs and configs here (default: a temp dir, removed)")
    a = ap.parse_args(argv)
    q = a.quick
    for name, full, quick in (("sessions", 8, 4), ("turns", 6, 3), ("first_tokens", 1500, 800),
                              ("turn_tokens", (300, 600), (150, 300)), ("think", (0.5, 3.0), (0.3, 1.0)),
                              ("stagger", 1.0, 0.5), ("cell_deadline", 150.0, 60.0)):
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    a.seeds = [int(s) for s in a.seed.split(",") if s.strip()]
    for m in a.modes:
        if m not in GATEWAY_MODES and m != "reference":
            ap.error(f"unknown mode {m}")
    for name in ("llama_server", "model"):
        if not getattr(a, name) or not os.path.exists(getattr(a, name)):
            ap.error(f"--{name.replace('_', '-')} missing or not found: {getattr(a, name)}")
    if any(m != "reference" for m in a.modes) and not os.path.exists(a.gateway):
        ap.error(f"--gateway not found: {a.gateway}")
    return a


def main(argv):
    args = parse(argv)
    atexit.register(stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (stop_all(), os._exit(130)))
    tmp = None
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
        workdir = args.workdir
    else:
        tmp = tempfile.TemporaryDirectory(prefix="real-engines-")
        workdir = tmp.name
    run_deadline = time.monotonic() + args.deadline
    ports, workloads, cells = set(), {}, []
    t0 = time.time()
    for seed in args.seeds:
        for mode in args.modes:
            if time.monotonic() >= run_deadline:
                cells.append({"mode": mode, "seed": seed, "skipped": "run deadline"})
                continue
            try:
                cells.append(run_cell(args, mode, seed, workloads, workdir, ports, run_deadline))
            except RuntimeError as e:
                log(f"cell s{seed}-{mode} failed: {e}")
                cells.append({"mode": mode, "seed": seed, "skipped": str(e)})
    params = {k: v for k, v in vars(args).items() if k not in ("json",)}
    params["slot_ctx_used"] = {s: w["slot_ctx"] for s, w in workloads.items()}
    md = table(cells)
    print(md)
    log(f"run took {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"parameters": params, "cells": cells, "table": md}, f, indent=1, default=str)
    if tmp:
        tmp.cleanup()
    return 0 if all(not c.get("skipped") for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
