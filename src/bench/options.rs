//! `llm-gateway bench` arguments and the engine settings derived from them.

use std::path::PathBuf;
use std::time::Duration;

use super::workload::WorkloadParams;
use crate::sim::EngineConfig;

pub const ALL_MODES: [&str; 4] = ["load_aware", "hash", "least_conn", "round_robin"];

pub const USAGE: &str = "\
usage: llm-gateway bench [options]

Replays coding-agent sessions through the gateway against simulated engines,
once per placement mode (load_aware, hash, least_conn, round_robin), each on
fresh engines (cold caches) with the identical seeded workload, and prints a
markdown table (or JSON with --json). Exits 1 if a mode had more than 1%
errors, 2 on bad arguments.

Run shape:
  --engines N            simulated engines (default 4)
  --sessions N           concurrent sessions per engine (default 8)
  --duration D           run time per mode, warm-up included (default 60s)
  --warmup D             first part of each mode not measured (default duration/6)
  --seed N               workload seed (default 1)
  --modes a,b            modes to run, in order (default all four)
  --quick                smoke run: 10s per mode, 2s warm-up
  --json                 print results as JSON instead of the table
  --records FILE         also write every request (JSON lines) to FILE

Workload (per session):
  --system-tokens N      shared system prompt (default 2000)
  --user-tokens A-B      user message (tool output, code) per turn (default 500-3000)
  --max-tokens A-B       max_tokens per turn (default 100-300)
  --think-ms A-B         pause after each reply (default 500-3000)
  --max-context N        a session ends before its prompt passes this (default 60000)

Engines (defaults explained in the output header):
  --decode-ms N          ms per generated token (default 10)
  --prefill-us N         us per uncached prompt token (default 50)
  --prefill-interference F  decode slowdown per sequence prefilling on the
                         same engine (default 0.5: chunked prefill shares
                         the GPU step, so cold prefills slow neighbours)
  --max-running N        sequences decoded at once (default 3/4 of --sessions)
  --kv-tokens N          KV capacity (default 1.75 x sessions x mean context)
  --time-scale F         multiply decode, prefill and think times by F (default 1)
  --realistic-scale      --time-scale 2 and --duration 120s: slower, closer to
                         a ~30B model on one GPU (50 tok/s, 10k prefill tok/s)

Gateway:
  --threads N            gateway worker threads (default 2)
  --gateway PATH         gateway binary (default: this executable)";

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub engines: usize,
    pub sessions_per_engine: usize,
    pub duration: Duration,
    pub warmup: Option<Duration>,
    pub seed: u64,
    pub modes: Vec<String>,
    pub json: bool,
    pub system_tokens: usize,
    pub user_tokens: (usize, usize),
    pub max_tokens: (usize, usize),
    pub think_ms: (u64, u64),
    pub max_context: usize,
    pub decode_ms: u64,
    pub prefill_us: u64,
    /// See `EngineConfig::prefill_decode_interference`.
    pub prefill_interference: f64,
    pub max_running: Option<usize>,
    pub kv_tokens: Option<usize>,
    pub time_scale: f64,
    pub threads: usize,
    pub gateway: Option<PathBuf>,
    pub records: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            engines: 4,
            sessions_per_engine: 8,
            duration: Duration::from_secs(60),
            warmup: None,
            seed: 1,
            modes: ALL_MODES.iter().map(|m| m.to_string()).collect(),
            json: false,
            system_tokens: 2_000,
            user_tokens: (500, 3_000),
            max_tokens: (100, 300),
            think_ms: (500, 3_000),
            max_context: 60_000,
            decode_ms: 10,
            prefill_us: 50,
            prefill_interference: 0.5,
            max_running: None,
            kv_tokens: None,
            time_scale: 1.0,
            threads: 2,
            gateway: None,
            records: None,
        }
    }
}

/// `30s`, `2m`, `500ms` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("{s:?} is not a duration like 60s, 2m or 500ms");
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_range<T: std::str::FromStr + PartialOrd + Copy>(s: &str) -> Result<(T, T), String> {
    let bad = || format!("{s:?} is not a range like 500-3000");
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: T = a.trim().parse().map_err(|_| bad())?;
    let b: T = b.trim().parse().map_err(|_| bad())?;
    if b < a {
        return Err(bad());
    }
    Ok((a, b))
}

fn positive<T: std::str::FromStr + PartialOrd + Default>(flag: &str, v: &str) -> Result<T, String> {
    v.parse::<T>()
        .ok()
        .filter(|n| *n > T::default())
        .ok_or_else(|| format!("{flag} must be a positive number"))
}

/// `Ok(None)` means help was asked for.
pub fn parse(args: &[String]) -> Result<Option<Options>, String> {
    let args = match args.first() {
        Some(first) if first == "bench" => &args[1..],
        _ => args,
    };
    let mut o = Options::default();
    let mut duration = None;
    let mut quick = false;
    let mut realistic = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--quick" => quick = true,
            "--json" => o.json = true,
            "--realistic-scale" => realistic = true,
            "--engines" => o.engines = positive(flag, &value()?)?,
            "--sessions" => o.sessions_per_engine = positive(flag, &value()?)?,
            "--duration" => duration = Some(parse_duration(&value()?)?),
            "--warmup" => o.warmup = Some(parse_duration(&value()?)?),
            "--seed" => {
                o.seed = value()?
                    .parse()
                    .map_err(|_| "--seed must be a non-negative integer")?
            }
            "--modes" => {
                let modes: Vec<String> = value()?
                    .split(',')
                    .map(|m| m.trim().to_string())
                    .filter(|m| !m.is_empty())
                    .collect();
                if let Some(bad) = modes.iter().find(|m| !ALL_MODES.contains(&m.as_str())) {
                    return Err(format!(
                        "unknown mode {bad:?}; modes are {}",
                        ALL_MODES.join(", ")
                    ));
                }
                if modes.is_empty() {
                    return Err("--modes needs at least one mode".into());
                }
                o.modes = modes;
            }
            "--system-tokens" => o.system_tokens = positive(flag, &value()?)?,
            "--user-tokens" => o.user_tokens = parse_range(&value()?)?,
            "--max-tokens" => o.max_tokens = parse_range(&value()?)?,
            "--think-ms" => o.think_ms = parse_range(&value()?)?,
            "--max-context" => o.max_context = positive(flag, &value()?)?,
            "--decode-ms" => o.decode_ms = positive(flag, &value()?)?,
            "--prefill-us" => {
                o.prefill_us = value()?
                    .parse()
                    .map_err(|_| "--prefill-us must be a non-negative integer")?
            }
            "--prefill-interference" => {
                o.prefill_interference = value()?
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .ok_or("--prefill-interference must be a non-negative number")?
            }
            "--max-running" => o.max_running = Some(positive(flag, &value()?)?),
            "--kv-tokens" => o.kv_tokens = Some(positive(flag, &value()?)?),
            "--time-scale" => o.time_scale = positive(flag, &value()?)?,
            "--threads" => o.threads = positive(flag, &value()?)?,
            "--gateway" => o.gateway = Some(PathBuf::from(value()?)),
            "--records" => o.records = Some(PathBuf::from(value()?)),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if realistic && o.time_scale == 1.0 {
        o.time_scale = 2.0;
    }
    o.duration = match (duration, quick, realistic) {
        (Some(d), _, _) => d,
        (None, true, _) => Duration::from_secs(10),
        (None, false, true) => Duration::from_secs(120),
        (None, false, false) => o.duration,
    };
    if quick && o.warmup.is_none() {
        o.warmup = Some(Duration::from_secs(2));
    }
    if o.duration < Duration::from_secs(2) {
        return Err("--duration must be at least 2s".into());
    }
    if o.warmup.is_some_and(|w| w >= o.duration) {
        return Err("--warmup must be shorter than --duration".into());
    }
    if o.user_tokens.0 == 0 || o.max_tokens.0 == 0 {
        return Err("--user-tokens and --max-tokens must start above 0".into());
    }
    if o.system_tokens + o.user_tokens.1 + o.max_tokens.1 >= o.max_context {
        return Err("--max-context leaves no room for a turn after the system prompt".into());
    }
    Ok(Some(o))
}

/// Everything a run uses, with the defaults that depend on other options
/// resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub opts: Options,
    pub workload: WorkloadParams,
    pub engine: EngineConfig,
    pub warmup: Duration,
}

impl Plan {
    pub fn new(opts: Options) -> Plan {
        let scale = opts.time_scale;
        let scaled = |v: u64| ((v as f64) * scale).round() as u64;
        let workload = WorkloadParams {
            seed: opts.seed,
            slots: (opts.engines * opts.sessions_per_engine) as u32,
            system_tokens: opts.system_tokens,
            user_tokens: opts.user_tokens,
            max_tokens: opts.max_tokens,
            think_ms: (scaled(opts.think_ms.0), scaled(opts.think_ms.1)),
            max_context: opts.max_context,
        };
        // Why these defaults (also printed in the output header):
        // - max_running at 3/4 of the sessions an engine serves: a session
        //   spends a little over half its time waiting on the engine (reply
        //   plus first token, against think time), so a balanced engine
        //   averages ~4.5 running sequences out of 6 and queues only at
        //   peaks, while an engine carrying a few extra sessions, or busy
        //   re-prefilling cold contexts, queues persistently. (The simulator
        //   admits by slot count, not by KV room, so max_running is what
        //   stands in for "the batch is full".)
        // - KV at 1.75x the engine's share of live context: its own sessions
        //   (sessions x mean context) fit with room for growth, everyone's
        //   (engines times that) does not, so spreading a session over every
        //   engine evicts prefixes before they are reused.
        let max_running = opts
            .max_running
            .unwrap_or_else(|| (opts.sessions_per_engine * 3).div_ceil(4).max(1));
        let block_tokens = 16;
        let kv = opts.kv_tokens.unwrap_or_else(|| {
            let share = opts.sessions_per_engine * workload.mean_context();
            (share * 7 / 4).div_ceil(block_tokens) * block_tokens
        });
        let engine = EngineConfig {
            name: "sim-model".to_string(),
            max_running,
            kv_capacity_tokens: kv,
            prefill_us_per_token: scaled(opts.prefill_us),
            decode_ms_per_token: scaled(opts.decode_ms).max(1),
            default_max_tokens: opts.max_tokens.1,
            block_tokens,
            prefill_decode_interference: opts.prefill_interference,
        };
        let warmup = opts.warmup.unwrap_or(opts.duration / 6);
        Plan {
            opts,
            workload,
            engine,
            warmup,
        }
    }

    pub fn slots(&self) -> usize {
        self.opts.engines * self.opts.sessions_per_engine
    }

    /// The parameters and the reasoning behind the engine timings, for the
    /// output header.
    pub fn describe(&self) -> String {
        let w = &self.workload;
        let e = &self.engine;
        let mean = |r: (usize, usize)| (r.0 + r.1) as f64 / 2.0;
        let prefill_s = |tokens: f64| tokens * e.prefill_us_per_token as f64 / 1e6;
        let cold = prefill_s(w.max_context as f64);
        let warm_new = mean(w.user_tokens) + mean(w.max_tokens);
        let warm = prefill_s(warm_new);
        let decode = mean(w.max_tokens) * e.decode_ms_per_token as f64 / 1e3;
        let think = (w.think_ms.0 + w.think_ms.1) as f64 / 2e3;
        let busy = (warm + decode) / (warm + decode + think);
        let spe = self.opts.sessions_per_engine;
        let share = spe * w.mean_context();
        format!(
            "engines {} x sessions/engine {} = {} concurrent sessions; seed {}; {} per mode \
             ({} warm-up not measured); gateway threads {}\n\
             workload: system prompt {} tokens shared by all; per turn a user message of {}-{} \
             tokens and max_tokens {}-{}; think {}-{} ms; a session ends near {} tokens \
             (~{} turns) and a new one takes its slot; first sessions pre-aged to a random turn; \
             streaming with include_usage\n\
             engine: decode {} ms/token ({:.0} tok/s per sequence), prefill {} us per uncached \
             token, decode slowed x{} per prefill in progress, max_running {}, KV {} tokens, \
             {}-token blocks\n\
             why: a cold {}-token context costs {:.1} s of prefill, a warm turn ~{:.0} new tokens \
             = {:.2} s, so cache misses show in TTFT. A session waits on the engine ~{:.0}% of the \
             time ({:.1} s decode vs {:.2} s think), so {} sessions keep ~{:.1} sequences busy per \
             engine against max_running {}: balanced engines queue at peaks, overloaded or \
             cold-prefilling ones queue persistently (the `waiting` signal). KV {} holds {:.1}x an \
             engine's share of live context ({} sessions x {} mean = {}), not all {} sessions' \
             ({}), so spreading sessions over every engine evicts prefixes before reuse.",
            self.opts.engines,
            spe,
            self.slots(),
            self.opts.seed,
            fmt_secs(self.opts.duration),
            fmt_secs(self.warmup),
            self.opts.threads,
            w.system_tokens,
            w.user_tokens.0,
            w.user_tokens.1,
            w.max_tokens.0,
            w.max_tokens.1,
            w.think_ms.0,
            w.think_ms.1,
            w.max_context,
            w.expected_turns(),
            e.decode_ms_per_token,
            1000.0 / e.decode_ms_per_token as f64,
            e.prefill_us_per_token,
            1.0 + e.prefill_decode_interference,
            e.max_running,
            e.kv_capacity_tokens,
            e.block_tokens,
            w.max_context,
            cold,
            warm_new,
            warm,
            busy * 100.0,
            decode,
            think,
            spe,
            busy * spe as f64,
            e.max_running,
            e.kv_capacity_tokens,
            e.kv_capacity_tokens as f64 / share as f64,
            spe,
            w.mean_context(),
            share,
            self.slots(),
            self.slots() * w.mean_context(),
        )
    }
}

pub fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_and_derived_engine_settings() {
        let o = parse(&[]).unwrap().unwrap();
        assert_eq!(o, Options::default());
        let p = Plan::new(o);
        assert_eq!(p.engine.max_running, 6);
        // 1.75 x 8 sessions x 31k mean context, block-aligned.
        assert_eq!(p.engine.kv_capacity_tokens, 434_000);
        assert_eq!(p.warmup, Duration::from_secs(10));
        assert_eq!(p.slots(), 32);
        assert!(p.describe().contains("max_running 6"));
    }

    #[test]
    fn flags_in_both_forms_and_presets() {
        let o = parse(&args(
            "bench --engines=2 --sessions 4 --duration 30s --seed 9 --modes hash,least_conn \
             --user-tokens 100-200 --think-ms=10-20 --json",
        ))
        .unwrap()
        .unwrap();
        assert_eq!((o.engines, o.sessions_per_engine, o.seed), (2, 4, 9));
        assert_eq!(o.duration, Duration::from_secs(30));
        assert_eq!(o.modes, vec!["hash", "least_conn"]);
        assert_eq!(o.user_tokens, (100, 200));
        assert_eq!(o.think_ms, (10, 20));
        assert!(o.json);
        let q = parse(&args("--quick")).unwrap().unwrap();
        assert_eq!(q.duration, Duration::from_secs(10));
        assert_eq!(q.warmup, Some(Duration::from_secs(2)));
        let r = parse(&args("--realistic-scale")).unwrap().unwrap();
        assert_eq!(r.duration, Duration::from_secs(120));
        let p = Plan::new(r);
        assert_eq!(p.engine.decode_ms_per_token, 20);
        assert_eq!(p.engine.prefill_us_per_token, 100);
        assert_eq!(p.workload.think_ms, (1_000, 6_000));
        assert_eq!(parse(&args("--help")), Ok(None));
    }

    #[test]
    fn bad_arguments_are_rejected() {
        for bad in [
            "--engines 0",
            "--engines x",
            "--duration 1s",
            "--duration 10s --warmup 10s",
            "--modes fastest",
            "--user-tokens 300-100",
            "--max-context 3000",
            "--bogus",
            "--seed",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("").is_err());
    }
}
