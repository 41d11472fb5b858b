//! `llm-gateway bench` arguments and the engine settings derived from them.

use std::path::PathBuf;
use std::time::Duration;

use super::scenario::{self, Failover, OverloadThink, Scenario};
use super::workload::{LongSessions, WorkloadParams};
use llm_gateway_sim::EngineConfig;

const LONG_ABOUT: &str = "Replay agent sessions through the gateway on simulated engines.

Runs every --scenario with every --modes value, one cell each: fresh simulated engines (cold \
caches), a gateway in that mode over them, and the scenario's seeded workload. The reference \
cell runs no gateway: the client sends a session's first turn to the engine with the fewest of \
its requests in flight (ties: fewest sessions) and later turns to the same engine, what an ideal \
sticky router would do, to compare every mode against. Progress goes to stderr every 5 s; a \
markdown table per scenario (or JSON with --json) to stdout; --plot writes one SVG.

Exits 1 if a cell of uniform, skewed or slow-engine had more than 1% errors (in failover and \
overload errors are a result), 2 on bad arguments.";

/// The cell without a gateway: the bench client places sessions itself.
pub const REFERENCE: &str = "reference";
pub const ALL_MODES: [&str; 5] = ["load_aware", "hash", "least_conn", "round_robin", REFERENCE];

/// Replays coding-agent sessions through the gateway against simulated
/// engines, once per scenario and placement mode (a cell), each cell on fresh
/// engines (cold caches) with the identical seeded workload, and prints a
/// markdown table per scenario (or JSON with --json). The `reference` cell
/// runs no gateway: the client sends a session's first turn to the engine
/// with the fewest of its requests in flight (ties: fewest sessions), and
/// every later turn to the same engine, what an ideal sticky router would
/// do. Exits 1 if a cell of uniform, skewed or slow-engine had more than 1%
/// errors (in failover and overload errors are a result), 2 on bad arguments.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(
    about = "Replay agent sessions through the gateway on simulated engines",
    long_about = LONG_ABOUT
)]
pub struct BenchArgs {
    /// Simulated engines [default: 4]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Run shape")]
    pub engines: Option<usize>,
    /// Concurrent sessions per engine [default: 8]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Run shape")]
    pub sessions: Option<usize>,
    /// Run time per cell, warm-up included [default: 60s]
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration, help_heading = "Run shape")]
    pub duration: Option<Duration>,
    /// First part of each cell not measured [default: duration/6]
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration, help_heading = "Run shape")]
    pub warmup: Option<Duration>,
    /// Workload seed [default: 1]
    #[arg(long, value_name = "N", help_heading = "Run shape")]
    pub seed: Option<u64>,
    /// Scenarios to run, in order; repeatable or a comma list [default: uniform]
    #[arg(
        long = "scenario",
        value_name = "NAME",
        value_delimiter = ',',
        help_heading = "Run shape"
    )]
    pub scenarios: Vec<Scenario>,
    /// Modes to run in each scenario, in order [default: the four gateway
    /// modes, then reference]
    #[arg(long, value_name = "a,b", value_delimiter = ',', value_parser = ALL_MODES, help_heading = "Run shape")]
    pub modes: Vec<String>,
    /// Smoke run: 10s per cell, 2s warm-up
    #[arg(long, help_heading = "Run shape")]
    pub quick: bool,
    /// Print results as JSON instead of the table
    #[arg(long, help_heading = "Run shape")]
    pub json: bool,
    /// Also write every request (JSON lines) to FILE
    #[arg(long, value_name = "FILE", help_heading = "Run shape")]
    pub records: Option<PathBuf>,
    /// Draw the results into one SVG file: per scenario a row with the TTFT
    /// distribution (CDF, one line per cell) and, per cell, the requests in
    /// each engine over the measured window
    #[arg(long, value_name = "FILE.svg", help_heading = "Run shape")]
    pub plot: Option<PathBuf>,

    /// Shared system prompt [default: 2000]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Workload (per session)")]
    pub system_tokens: Option<usize>,
    /// User message (tool output, code) per turn [default: 500-3000]
    #[arg(long, value_name = "A-B", value_parser = parse_range::<usize>, help_heading = "Workload (per session)")]
    pub user_tokens: Option<(usize, usize)>,
    /// max_tokens per turn [default: 100-300]
    #[arg(long, value_name = "A-B", value_parser = parse_range::<usize>, help_heading = "Workload (per session)")]
    pub max_tokens: Option<(usize, usize)>,
    /// Pause after each reply [default: 500-3000]
    #[arg(long, value_name = "A-B", value_parser = parse_range::<u64>, help_heading = "Workload (per session)")]
    pub think_ms: Option<(u64, u64)>,
    /// A session ends before its prompt passes this [default: 60000]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Workload (per session)")]
    pub max_context: Option<usize>,

    /// ms per generated token [default: 10]
    #[arg(long, value_name = "N", value_parser = positive::<u64>, help_heading = "Engines (defaults explained in the output header)")]
    pub decode_ms: Option<u64>,
    /// us per uncached prompt token [default: 50]
    #[arg(
        long,
        value_name = "N",
        help_heading = "Engines (defaults explained in the output header)"
    )]
    pub prefill_us: Option<u64>,
    /// Decode slowdown per sequence prefilling on the same engine (chunked
    /// prefill shares the GPU step, so cold prefills slow neighbours) [default: 0.5]
    #[arg(long, value_name = "F", value_parser = non_negative, help_heading = "Engines (defaults explained in the output header)")]
    pub prefill_interference: Option<f64>,
    /// Sequences decoded at once [default: 3/4 of --sessions]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Engines (defaults explained in the output header)")]
    pub max_running: Option<usize>,
    /// KV capacity [default: 1.75 x sessions x mean context]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Engines (defaults explained in the output header)")]
    pub kv_tokens: Option<usize>,
    /// Multiply decode, prefill and think times by F [default: 1]
    #[arg(long, value_name = "F", value_parser = positive::<f64>, help_heading = "Engines (defaults explained in the output header)")]
    pub time_scale: Option<f64>,
    /// --time-scale 2 and --duration 120s: slower, closer to a ~30B model on
    /// one GPU (50 tok/s, 10k prefill tok/s)
    #[arg(
        long,
        help_heading = "Engines (defaults explained in the output header)"
    )]
    pub realistic_scale: bool,

    /// Gateway worker threads [default: 2]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Gateway")]
    pub threads: Option<usize>,
    /// Gateway binary [default: this executable]; an older build works as
    /// long as it reads the route file (see --route-extra)
    #[arg(long, value_name = "PATH", help_heading = "Gateway")]
    pub gateway: Option<PathBuf>,
    /// YAML merged into the generated route file of every gateway cell,
    /// e.g. 'queue_timeout: 30s'; a mapping merges with the bench's own, so
    /// 'balancing: {session_affinity: {live_window: 3s}}' keeps each cell's mode
    #[arg(long, value_name = "YAML", help_heading = "Gateway")]
    pub route_extra: Option<String>,
    /// Gateway replicas behind a front that sends each request to one of
    /// them at random, as a Kubernetes Service spreads load [default: 1]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Gateway")]
    pub replicas: Option<usize>,
    /// Where the replicas keep session bindings: local (each its own table)
    /// or redis (a redis-server the bench starts, shared) [default: local]
    #[arg(long, value_name = "KIND", value_parser = ["local", "redis"], help_heading = "Gateway")]
    pub session_store: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub engines: usize,
    pub sessions_per_engine: usize,
    pub duration: Duration,
    pub warmup: Option<Duration>,
    pub seed: u64,
    pub scenarios: Vec<Scenario>,
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
    pub plot: Option<PathBuf>,
    pub route_extra: Option<String>,
    pub replicas: usize,
    /// "local" or "redis".
    pub session_store: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            engines: 4,
            sessions_per_engine: 8,
            duration: Duration::from_secs(60),
            warmup: None,
            seed: 1,
            scenarios: vec![Scenario::Uniform],
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
            plot: None,
            route_extra: None,
            replicas: 1,
            session_store: "local".into(),
        }
    }
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

fn positive<T: std::str::FromStr + PartialOrd + Default>(v: &str) -> Result<T, String> {
    v.parse::<T>()
        .ok()
        .filter(|n| *n > T::default())
        .ok_or_else(|| "must be a positive number".to_string())
}

fn non_negative(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)
        .ok_or_else(|| "must be a non-negative number".to_string())
}

impl BenchArgs {
    /// The run's options: defaults, the --quick and --realistic-scale
    /// presets, and the checks that involve more than one flag.
    pub fn resolve(self) -> Result<Options, String> {
        let d = Options::default();
        let mut o = Options {
            engines: self.engines.unwrap_or(d.engines),
            sessions_per_engine: self.sessions.unwrap_or(d.sessions_per_engine),
            duration: d.duration,
            warmup: self.warmup,
            seed: self.seed.unwrap_or(d.seed),
            scenarios: if self.scenarios.is_empty() {
                d.scenarios
            } else {
                // Each once, in the order first given.
                let mut seen = Vec::new();
                for s in self.scenarios {
                    if !seen.contains(&s) {
                        seen.push(s);
                    }
                }
                seen
            },
            modes: if self.modes.is_empty() {
                d.modes
            } else {
                self.modes
            },
            json: self.json,
            system_tokens: self.system_tokens.unwrap_or(d.system_tokens),
            user_tokens: self.user_tokens.unwrap_or(d.user_tokens),
            max_tokens: self.max_tokens.unwrap_or(d.max_tokens),
            think_ms: self.think_ms.unwrap_or(d.think_ms),
            max_context: self.max_context.unwrap_or(d.max_context),
            decode_ms: self.decode_ms.unwrap_or(d.decode_ms),
            prefill_us: self.prefill_us.unwrap_or(d.prefill_us),
            prefill_interference: self.prefill_interference.unwrap_or(d.prefill_interference),
            max_running: self.max_running,
            kv_tokens: self.kv_tokens,
            time_scale: self.time_scale.unwrap_or(d.time_scale),
            threads: self.threads.unwrap_or(d.threads),
            gateway: self.gateway,
            records: self.records,
            plot: self.plot,
            route_extra: self.route_extra,
            replicas: self.replicas.unwrap_or(d.replicas),
            session_store: self.session_store.unwrap_or(d.session_store),
        };
        if self.realistic_scale && o.time_scale == 1.0 {
            o.time_scale = 2.0;
        }
        o.duration = match (self.duration, self.quick, self.realistic_scale) {
            (Some(d), _, _) => d,
            (None, true, _) => Duration::from_secs(10),
            (None, false, true) => Duration::from_secs(120),
            (None, false, false) => o.duration,
        };
        if self.quick && o.warmup.is_none() {
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
        for &s in &o.scenarios {
            Plan::for_scenario(o.clone(), s).map_err(|e| format!("scenario {s}: {e}"))?;
        }
        if let Some(g) = &o.gateway {
            if o.modes.iter().any(|m| m != REFERENCE) && !g.is_file() {
                return Err(format!("--gateway {}: no such file", g.display()));
            }
        }
        Ok(o)
    }
}

/// Everything one scenario's cells use, with the defaults that depend on
/// other options resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub opts: Options,
    pub scenario: Scenario,
    /// `opts.sessions_per_engine`, doubled by `overload`.
    pub sessions_per_engine: usize,
    pub workload: WorkloadParams,
    /// The configuration most engines have (all but `slow-engine`'s e0).
    pub engine: EngineConfig,
    /// One per engine, in order.
    pub engines: Vec<EngineConfig>,
    pub failover: Option<Failover>,
    pub overload: Option<OverloadThink>,
    pub warmup: Duration,
}

impl Plan {
    /// The `uniform` plan, for options that `resolve` accepted.
    #[cfg(test)]
    pub fn new(opts: Options) -> Plan {
        Plan::build(opts, Scenario::Uniform)
    }

    /// The plan of `scenario`, or why the options do not fit it.
    pub fn for_scenario(opts: Options, scenario: Scenario) -> Result<Plan, String> {
        let p = Plan::build(opts, scenario);
        let w = &p.workload;
        let room = |shape: super::workload::Shape| {
            w.system_tokens + shape.user_tokens.1 + w.max_tokens.1 < shape.max_context
        };
        if !room(w.common()) || !room(w.shape(0)) {
            return Err(
                "the context limit leaves no room for a turn after the system prompt".into(),
            );
        }
        Ok(p)
    }

    fn build(opts: Options, scenario: Scenario) -> Plan {
        let scale = opts.time_scale;
        let scaled = |v: u64| ((v as f64) * scale).round() as u64;
        let spe = match scenario {
            Scenario::Overload => opts.sessions_per_engine * 2,
            _ => opts.sessions_per_engine,
        };
        let mut workload = WorkloadParams {
            seed: opts.seed,
            slots: (opts.engines * spe) as u32,
            system_tokens: opts.system_tokens,
            user_tokens: opts.user_tokens,
            max_tokens: opts.max_tokens,
            think_ms: (scaled(opts.think_ms.0), scaled(opts.think_ms.1)),
            max_context: opts.max_context,
            long: None,
        };
        if scenario == Scenario::Skewed {
            // Many short chats, and one long agent session per engine: a
            // placement that counts sessions can still pile two 120k
            // contexts onto one engine, whose KV holds one.
            workload.user_tokens = scenario::SKEWED_SHORT_USER;
            workload.max_context = opts.system_tokens + scenario::SKEWED_SHORT_CONTEXT_PAST_SYSTEM;
            workload.long = Some(LongSessions {
                slots: opts.engines as u32,
                user_tokens: scenario::SKEWED_LONG_USER,
                max_context: scenario::SKEWED_LONG_CONTEXT,
            });
        }
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
        //   engine evicts prefixes before they are reused. `overload` keeps
        //   the KV of the engines sized for the sessions it doubles: the
        //   same fleet under twice the demand.
        let max_running = opts
            .max_running
            .unwrap_or_else(|| (spe * 3).div_ceil(4).max(1));
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
        let mut engines = vec![engine.clone(); opts.engines];
        if scenario == Scenario::SlowEngine {
            engines[0] = scenario::slowed(&engine);
        }
        let overload = (scenario == Scenario::Overload).then(|| {
            let t = scenario::overload_think(
                turn_busy_s(&workload, &engine),
                spe,
                workload.mean_context(),
                kv,
            );
            workload.think_ms = t.think_ms;
            t
        });
        let warmup = opts.warmup.unwrap_or(opts.duration / 6);
        let failover =
            (scenario == Scenario::Failover).then(|| Failover::within(warmup, opts.duration));
        Plan {
            opts,
            scenario,
            sessions_per_engine: spe,
            workload,
            engine,
            engines,
            failover,
            overload,
            warmup,
        }
    }

    pub fn slots(&self) -> usize {
        self.opts.engines * self.sessions_per_engine
    }

    /// The parameters and the reasoning behind the engine timings, for the
    /// output header.
    pub fn describe(&self) -> String {
        let w = &self.workload;
        let e = &self.engine;
        let common = w.common();
        let mean = |r: (usize, usize)| (r.0 + r.1) as f64 / 2.0;
        let prefill_s = |tokens: f64| tokens * e.prefill_us_per_token as f64 / 1e6;
        let cold = prefill_s(common.max_context as f64);
        let warm_new = mean(common.user_tokens) + mean(w.max_tokens);
        let warm = prefill_s(warm_new);
        let decode = mean(w.max_tokens) * e.decode_ms_per_token as f64 / 1e3;
        let think = (w.think_ms.0 + w.think_ms.1) as f64 / 2e3;
        let busy = (warm + decode) / (warm + decode + think);
        let spe = self.sessions_per_engine;
        let share = spe * w.mean_context();
        let mut out = format!(
            "scenario {}: {}\n\
             engines {} x sessions/engine {} = {} concurrent sessions; seed {}; {} per cell \
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
            self.scenario,
            self.scenario_note(),
            self.opts.engines,
            spe,
            self.slots(),
            self.opts.seed,
            fmt_secs(self.opts.duration),
            fmt_secs(self.warmup),
            self.opts.threads,
            w.system_tokens,
            common.user_tokens.0,
            common.user_tokens.1,
            w.max_tokens.0,
            w.max_tokens.1,
            w.think_ms.0,
            w.think_ms.1,
            common.max_context,
            w.expected_turns(common),
            e.decode_ms_per_token,
            1000.0 / e.decode_ms_per_token as f64,
            e.prefill_us_per_token,
            1.0 + e.prefill_decode_interference,
            e.max_running,
            e.kv_capacity_tokens,
            e.block_tokens,
            common.max_context,
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
        );
        if let Some(route_extra) = self.opts.route_extra.as_deref() {
            let one_line = route_extra.trim().replace('\n', "; ");
            out.push_str(&format!(
                "\nroute file of the gateway cells ends with: {one_line}"
            ));
        }
        if self.opts.replicas > 1 || self.opts.session_store != "local" {
            out.push_str(&format!(
                "\n{} gateway replica(s), each request sent to one at random; session store: {}",
                self.opts.replicas, self.opts.session_store
            ));
        }
        out
    }

    /// What the scenario changes, with the numbers it derived.
    fn scenario_note(&self) -> String {
        let w = &self.workload;
        let e = &self.engine;
        match self.scenario {
            Scenario::Uniform => {
                "every session has the shape below, on identical engines".to_string()
            }
            Scenario::Skewed => {
                let long = w.shape(0);
                let cold = long.max_context as f64 * e.prefill_us_per_token as f64 / 1e6;
                format!(
                    "{} long agent sessions (slots 0-{}) with user turns of {}-{} tokens and \
                     contexts to {} (~{} turns; cold, one costs {:.1} s of prefill) among {} short \
                     chats (below); KV {} holds one long context and the engine's share of chats, \
                     not two long ones, so placing by session count alone is not enough",
                    w.long_slots(),
                    w.long_slots().saturating_sub(1),
                    long.user_tokens.0,
                    long.user_tokens.1,
                    long.max_context,
                    w.expected_turns(long),
                    cold,
                    self.slots() - w.long_slots() as usize,
                    e.kv_capacity_tokens,
                )
            }
            Scenario::SlowEngine => {
                let s = &self.engines[0];
                format!(
                    "engine e0 runs at {:.1}x speed: decode {} ms/token, prefill {} us per \
                     uncached token ({:.1}x the others, below); the rest are identical",
                    scenario::SLOW_SPEED,
                    s.decode_ms_per_token,
                    s.prefill_us_per_token,
                    1.0 / scenario::SLOW_SPEED,
                )
            }
            Scenario::Failover => match self.failover {
                Some(f) => format!(
                    "engine e{} is shut down at {} (connections refused, open ones cut) and a \
                     new engine with an empty cache starts on its port at {} ({} out)",
                    f.engine,
                    fmt_secs(f.at),
                    fmt_secs(f.back()),
                    fmt_secs(f.outage),
                ),
                None => String::new(),
            },
            Scenario::Overload => match self.overload {
                Some(t) => format!(
                    "2x the sessions ({} per engine) on the engines sized for {} (KV {}), \
                     max_running {}; think times derived ({}-{} ms, overriding --think-ms): a \
                     turn keeps a sequence in the engine ~{:.2} s, so each session is in the \
                     engine {:.0}% of the time, ~{:.1} sequences x {} mean context = {:.0} tokens \
                     = {:.0}% of KV committed to running sequences",
                    self.sessions_per_engine,
                    self.opts.sessions_per_engine,
                    e.kv_capacity_tokens,
                    e.max_running,
                    t.think_ms.0,
                    t.think_ms.1,
                    t.busy_s,
                    t.in_engine * 100.0,
                    t.sequences,
                    w.mean_context(),
                    t.committed_tokens,
                    t.committed_tokens / e.kv_capacity_tokens.max(1) as f64 * 100.0,
                ),
                None => String::new(),
            },
        }
    }
}

/// Seconds a typical turn keeps a sequence in an engine: the warm prefill
/// of its new tokens and its decode.
fn turn_busy_s(w: &WorkloadParams, e: &EngineConfig) -> f64 {
    let mean = |r: (usize, usize)| (r.0 + r.1) as f64 / 2.0;
    let new_tokens = mean(w.common().user_tokens) + mean(w.max_tokens);
    new_tokens * e.prefill_us_per_token as f64 / 1e6
        + mean(w.max_tokens) * e.decode_ms_per_token as f64 / 1e3
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
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(s: &str) -> Result<Options, String> {
        let argv = std::iter::once("bench").chain(s.split_whitespace());
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .args
            .resolve()
    }

    #[test]
    fn defaults_and_derived_engine_settings() {
        let o = parse("").unwrap();
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
        let o = parse(
            "--engines=2 --sessions 4 --duration 30s --seed 9 --modes hash,least_conn \
             --user-tokens 100-200 --think-ms=10-20 --json",
        )
        .unwrap();
        assert_eq!((o.engines, o.sessions_per_engine, o.seed), (2, 4, 9));
        assert_eq!(o.duration, Duration::from_secs(30));
        assert_eq!(o.modes, vec!["hash", "least_conn"]);
        assert_eq!(o.user_tokens, (100, 200));
        assert_eq!(o.think_ms, (10, 20));
        assert!(o.json);
        let q = parse("--quick").unwrap();
        assert_eq!(q.duration, Duration::from_secs(10));
        assert_eq!(q.warmup, Some(Duration::from_secs(2)));
        let r = parse("--realistic-scale").unwrap();
        assert_eq!(r.duration, Duration::from_secs(120));
        let p = Plan::new(r);
        assert_eq!(p.engine.decode_ms_per_token, 20);
        assert_eq!(p.engine.prefill_us_per_token, 100);
        assert_eq!(p.workload.think_ms, (1_000, 6_000));
    }

    fn plan(args: &str, scenario: Scenario) -> Plan {
        Plan::for_scenario(parse(args).unwrap(), scenario).unwrap()
    }

    #[test]
    fn scenarios_and_modes_default_and_parse() {
        let d = parse("").unwrap();
        assert_eq!(d.scenarios, vec![Scenario::Uniform]);
        assert_eq!(
            d.modes,
            vec![
                "load_aware",
                "hash",
                "least_conn",
                "round_robin",
                "reference"
            ]
        );
        let o = parse(
            "--scenario uniform,failover --scenario skewed --scenario=failover \
             --scenario slow-engine,overload --route-extra queue_timeout:30s --plot /tmp/x.svg",
        )
        .unwrap();
        use Scenario::*;
        assert_eq!(
            o.scenarios,
            vec![Uniform, Failover, Skewed, SlowEngine, Overload]
        );
        assert_eq!(o.route_extra.as_deref(), Some("queue_timeout:30s"));
        assert_eq!(o.plot, Some(PathBuf::from("/tmp/x.svg")));
        // The reference cell needs no gateway binary.
        assert!(parse("--gateway /nonexistent/gw --modes reference").is_ok());
    }

    #[test]
    fn uniform_is_the_workload_the_bench_always_had() {
        let u = plan("", Scenario::Uniform);
        let old = Plan::new(parse("").unwrap());
        assert_eq!(u.workload, old.workload);
        assert_eq!(u.workload.long, None);
        assert_eq!(u.engines.len(), 4);
        assert!(u
            .engines
            .iter()
            .all(|e| e.decode_ms_per_token == 10 && e.kv_capacity_tokens == 434_000));
        assert_eq!((u.failover, u.overload), (None, None));
        assert!(u.describe().starts_with("scenario uniform: "));
    }

    #[test]
    fn skewed_mixes_one_long_session_per_engine_into_short_chats() {
        let p = plan("", Scenario::Skewed);
        let w = &p.workload;
        assert_eq!((w.slots, w.long_slots()), (32, 4));
        assert_eq!(w.shape(0).user_tokens, (4_000, 12_000));
        assert_eq!(w.shape(3).max_context, 120_000);
        assert_eq!(w.shape(4).user_tokens, (100, 1_000));
        assert_eq!(w.shape(31).max_context, 8_000);
        // (4 x 61k + 28 x 5k) / 32 = 12k mean; KV 1.75 x 8 x 12k.
        assert_eq!(w.mean_context(), 12_000);
        assert_eq!(p.engine.kv_capacity_tokens, 168_000);
        let d = p.describe();
        assert!(d.contains("4 long agent sessions"), "{d}");
        assert!(d.contains("among 28 short chats"), "{d}");
        // The long sessions must fit a turn after the system prompt.
        let err = Plan::for_scenario(
            parse("--system-tokens 108000 --max-context 200000").unwrap(),
            Scenario::Skewed,
        );
        assert!(err.is_err());
        assert!(parse("--system-tokens 108000 --max-context 200000 --scenario skewed").is_err());
    }

    #[test]
    fn slow_engine_slows_only_e0() {
        let p = plan("--time-scale 2", Scenario::SlowEngine);
        let speeds: Vec<(u64, u64)> = p
            .engines
            .iter()
            .map(|e| (e.decode_ms_per_token, e.prefill_us_per_token))
            .collect();
        assert_eq!(speeds, vec![(50, 250), (20, 100), (20, 100), (20, 100)]);
        assert!(p
            .describe()
            .contains("e0 runs at 0.4x speed: decode 50 ms/token"));
    }

    #[test]
    fn failover_is_scheduled_inside_the_window() {
        let p = plan("", Scenario::Failover);
        let f = p.failover.unwrap();
        assert_eq!((f.engine, f.at, f.back()), (0, secs(20), secs(40)));
        let q = plan("--quick", Scenario::Failover);
        assert_eq!(
            q.failover.map(|f| (f.at, f.back())),
            Some((secs(4), secs(8)))
        );
        assert!(p.describe().contains("e0 is shut down at 20s"));
    }

    #[test]
    fn overload_doubles_sessions_on_the_same_kv_and_derives_think_times() {
        let p = plan("", Scenario::Overload);
        assert_eq!((p.sessions_per_engine, p.slots()), (16, 64));
        assert_eq!(p.workload.slots, 64);
        // KV of the engines sized for 8 sessions; 3/4 of 16 may run.
        assert_eq!(p.engine.kv_capacity_tokens, 434_000);
        assert_eq!(p.engine.max_running, 12);
        // A turn is busy (1750 + 200) x 50 us + 200 x 10 ms = 2.0975 s; 80%
        // of 434k over 16 x 31k is 70% in the engine: 0.899 s mean think.
        let t = p.overload.unwrap();
        assert_eq!(p.workload.think_ms, (449, 1348));
        assert_eq!(t.think_ms, p.workload.think_ms);
        assert!((t.in_engine - 0.7).abs() < 1e-6);
        let d = p.describe();
        assert!(d.contains("80% of KV committed"), "{d}");
        assert!(d.contains("sessions/engine 16 = 64 concurrent"), "{d}");
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
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
            "--scenario nope",
            "--scenario",
            "--gateway /nonexistent/gw",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
