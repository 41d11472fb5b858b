//! `llm-gateway bench` arguments and the engine settings derived from them.

use std::path::PathBuf;
use std::time::Duration;

use crate::ids::SessionIdMode;
use crate::peers::{self, Peer};
use crate::router::{self, RouterSpec};
use crate::scenario::Scenario;

const LONG_ABOUT: &str = "Replay agent sessions through the gateway on simulated engines.

Runs every --scenario with every --modes value, one cell each: fresh simulated engines (cold \
caches), a gateway in that mode over them, and the scenario's seeded workload. The reference \
cell runs no gateway: the client sends a session's first turn to the engine with the fewest of \
its requests in flight (ties: fewest sessions) and later turns to the same engine, what an ideal \
sticky router would do, to compare every mode against. Progress goes to stderr every 5 s; a \
markdown table per scenario (or JSON with --json) to stdout; --plot writes one SVG.

With --router-cmd, each scenario runs one cell, through that external router instead of the \
gateway (e.g. vllm-router or sglang-router, to compare them on the same workload): the bench \
starts the command per cell on the cell's fresh engines, sends the requests to \
http://127.0.0.1:{port}/v1/chat/completions, tells the engine that served each request from the \
simulated engine's response id, and kills the router's process group at the cell's end. The \
cell is named by --router-label; --modes may then name at most one gateway mode, which is not \
run. A router sets no X-Routed-* headers, so the cell reports no session recognition.

With --peers, each scenario also runs, after the --modes cells, one cell per real peer router \
on the same fresh engines and workload: vllm-sticky, vllm-cache and vllm-hash (vllm-router \
--policy sticky_least_loaded, cache_aware, consistent_hash), sglang-cache (sglang-router's smg, \
cache_aware) and nginx-hash (nginx, upstream hash $http_x_session_id consistent). Their \
requests carry the session as --session-id says (default: the x-session-id header). Binaries \
are looked for in $LLM_GATEWAY_PEERS_DIR (default target/peers: vllm/bin/vllm-router, \
sglang/bin/smg), then on PATH (vllm-router, smg, nginx); benches/peers.sh installs them. A peer \
not found is skipped with a line on stderr and listed as skipped in the report. The report \
names each scenario's best peer, the lowest TTFT p95 among the peer cells and the reference \
cell, and every cell's TTFT p95 and p99 ratios, cache hit difference and output tok/s ratio to \
it. A peer's errors are reported but do not fail the run.

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
    /// Workload seeds: every scenario runs once per seed (a comma list;
    /// replaces --seed)
    #[arg(
        long,
        value_name = "a,b",
        value_delimiter = ',',
        help_heading = "Run shape"
    )]
    pub seeds: Vec<u64>,
    /// Scenarios to run, in order; repeatable or a comma list [default: uniform]
    #[arg(
        long = "scenario",
        value_name = "NAME",
        value_delimiter = ',',
        help_heading = "Run shape"
    )]
    pub scenarios: Vec<Scenario>,
    /// Modes to run in each scenario, in order [default: the four gateway
    /// modes, then reference]; with --router-cmd one cell, the router's, and
    /// at most one gateway mode here, not run
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
    /// How requests name their session: the x-session-id header, none
    /// (the gateway must recognise conversations by content),
    /// prompt-cache-key (the body's prompt_cache_key field), or mixed
    /// (--id-share of the sessions the header, the rest nothing); the
    /// reference cell sends none either way [default: header]
    #[arg(long, value_name = "HOW", help_heading = "Run shape")]
    pub session_id: Option<SessionIdMode>,
    /// With --session-id mixed: the share of sessions that send the header,
    /// chosen per session from the seed [default: 0.5]
    #[arg(long, value_name = "F", value_parser = unit_share, help_heading = "Run shape")]
    pub id_share: Option<f64>,

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
    /// KV capacity as a multiple of an engine's share of the sessions'
    /// working set (sessions x mean context); instead of --kv-tokens
    #[arg(long, value_name = "F", value_parser = positive::<f64>, conflicts_with = "kv_tokens", help_heading = "Engines (defaults explained in the output header)")]
    pub kv_factor: Option<f64>,
    /// vllm/sglang: step cost per sequence in the batch, in us [default:
    /// the calibrated preset's, scaled to --decode-ms]
    #[arg(long, value_name = "US", value_parser = non_negative, help_heading = "Engines (defaults explained in the output header)")]
    pub per_seq_us: Option<f64>,
    /// vllm/sglang: step cost per context token attended, in us [default:
    /// the calibrated preset's, scaled to --decode-ms]
    #[arg(long, value_name = "US", value_parser = non_negative, help_heading = "Engines (defaults explained in the output header)")]
    pub per_context_us: Option<f64>,
    /// Engine e0 runs at 0.4x speed in every scenario (as in slow-engine)
    #[arg(
        long,
        help_heading = "Engines (defaults explained in the output header)"
    )]
    pub slow_first: bool,
    /// Engine imitated: vllm, sglang, llamacpp or slots [default: vllm]
    #[arg(
        long,
        value_name = "NAME",
        help_heading = "Engines (defaults explained in the output header)"
    )]
    pub engine_profile: Option<llm_gateway_sim::Profile>,
    /// Engines keep their KV capacity out of /metrics (no
    /// vllm:cache_config_info, no sglang:max_total_num_tokens): a gateway
    /// must find it elsewhere or learn it
    #[arg(
        long,
        help_heading = "Engines (defaults explained in the output header)"
    )]
    pub hide_kv_capacity: bool,
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
    /// Each engine's max_concurrency in the route file [default: 256, or
    /// half an engine's sessions on noisy-neighbor]; with
    /// --route-extra 'queue_timeout: 0s', noisy-neighbor on a route that
    /// configures nothing
    #[arg(long, value_name = "N", value_parser = positive::<u32>, help_heading = "Gateway")]
    pub max_concurrency: Option<u32>,
    /// noisy-neighbor: only the quiet tenant's sessions send (its solo
    /// run, what fair share is measured against)
    #[arg(long)]
    pub quiet_alone: bool,
    /// Gateway replicas behind a front that sends each request to one of
    /// them at random, as a Kubernetes Service spreads load [default: 1]
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Gateway")]
    pub replicas: Option<usize>,
    /// Where the replicas keep session bindings: local (each its own table)
    /// or redis (a redis-server the bench starts, shared) [default: local]
    #[arg(long, value_name = "KIND", value_parser = ["local", "redis"], help_heading = "Gateway")]
    pub session_store: Option<String>,
    /// With --session-store redis: the replicas reach Redis through a relay
    /// the bench runs that holds every client-to-Redis chunk MS ms, so each
    /// round trip gains MS [default: 0, no relay]
    #[arg(long, value_name = "MS", help_heading = "Gateway")]
    pub redis_delay: Option<u64>,
    /// With --session-store redis: kill redis-server SECS seconds into each
    /// gateway cell's measured window (after --warmup) and run on without it
    #[arg(long, value_name = "SECS", value_parser = seconds, help_heading = "Gateway")]
    pub redis_stop_at: Option<Duration>,

    /// Run each scenario's one cell through this router instead of the
    /// gateway: a shell command (sh -c, its own process group, killed at the
    /// cell's end) with {port} (where it must listen; the bench waits up to
    /// 60s for it to accept), {engines} (the engines' URLs, space-separated),
    /// {engine_ports} (their ports, comma-separated) and {metrics_port} (a
    /// free port for its Prometheus listener) filled per cell. Requests go
    /// to /v1/chat/completions, no route prefix. --modes may name at most one
    /// gateway mode, which is not run; no reference cell, no --replicas,
    /// --session-store, --route-extra or --gateway
    #[arg(long, value_name = "CMD", help_heading = "External router")]
    pub router_cmd: Option<String>,
    /// The router cell's name in the report, the JSON and --records
    /// [default: router]
    #[arg(long, value_name = "NAME", help_heading = "External router")]
    pub router_label: Option<String>,
    /// Run every scenario over N engine configurations drawn from
    /// --family-seed instead of the engine flags: KV 0.5-4x the working
    /// set, max_num_seqs 32-256, prefill 5k-40k tok/s, decode steps of 5-15
    /// ms plus 90-900 us per sequence plus the context term x0.5-1.5,
    /// capacity published or not, e0 slowed or not; each draw is printed as
    /// the flags that rerun it
    #[arg(long, value_name = "N", value_parser = positive::<usize>, help_heading = "Engine family")]
    pub family: Option<usize>,
    /// Seed of the --family draws [default: 1]
    #[arg(
        long,
        value_name = "N",
        requires = "family",
        help_heading = "Engine family"
    )]
    pub family_seed: Option<u64>,
    /// Run only these draws of the family (1-based; a comma list)
    #[arg(
        long,
        value_name = "a,b",
        value_delimiter = ',',
        requires = "family",
        help_heading = "Engine family"
    )]
    pub family_only: Vec<usize>,
    /// Also run another gateway binary in load_aware mode, as a cell named
    /// LABEL (an earlier build, side by side); repeatable
    #[arg(long, value_name = "LABEL=PATH", value_parser = parse_compare, help_heading = "Gateway")]
    pub compare: Vec<(String, PathBuf)>,

    /// Also run the peer routers, one cell each after the --modes cells:
    /// all, or a comma list of vllm-sticky, vllm-cache, vllm-hash,
    /// sglang-cache, nginx-hash (see the description at the top)
    #[arg(long, value_name = "a,b", num_args = 0..=1, value_delimiter = ',', default_missing_value = "all", value_parser = peers::CHOICES, help_heading = "External router")]
    pub peers: Option<Vec<String>>,
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
    pub kv_factor: Option<f64>,
    pub per_seq_us: Option<f64>,
    pub per_context_us: Option<f64>,
    pub slow_first: bool,
    /// Workload seeds, one run of every scenario each (`seed` is the first).
    pub seeds: Vec<u64>,
    /// `--family`: the engine configurations every scenario runs over.
    pub family: Vec<crate::family::Draw>,
    /// `--compare`: other gateway binaries, each a load_aware cell.
    pub compare: Vec<(String, PathBuf)>,
    pub engine_profile: llm_gateway_sim::Profile,
    /// `--hide-kv-capacity`.
    pub hide_kv_capacity: bool,
    pub time_scale: f64,
    pub threads: usize,
    pub gateway: Option<PathBuf>,
    pub records: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub session_id: SessionIdMode,
    /// `mixed`: the share of sessions that send the header.
    pub id_share: f64,
    pub route_extra: Option<String>,
    pub max_concurrency: Option<u32>,
    pub quiet_alone: bool,
    pub replicas: usize,
    /// "local" or "redis".
    pub session_store: String,
    /// `--redis-delay`: added to each round trip between a replica and
    /// Redis; zero runs no relay.
    pub redis_delay: Duration,
    /// `--redis-stop-at`: when Redis is killed, from the measured window's
    /// start.
    pub redis_stop_at: Option<Duration>,
    /// `--router-cmd`: the one cell of each scenario goes through this
    /// router, and `modes` is its label alone.
    pub router: Option<RouterSpec>,
    /// `--peers`: their cells run after `modes`, those found.
    pub peers: Vec<Peer>,
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
            kv_factor: None,
            per_seq_us: None,
            per_context_us: None,
            slow_first: false,
            seeds: vec![1],
            family: Vec::new(),
            compare: Vec::new(),
            engine_profile: llm_gateway_sim::Profile::Vllm,
            hide_kv_capacity: false,
            time_scale: 1.0,
            threads: 2,
            gateway: None,
            records: None,
            plot: None,
            session_id: SessionIdMode::Header,
            id_share: 0.5,
            route_extra: None,
            max_concurrency: None,
            quiet_alone: false,
            replicas: 1,
            session_store: "local".into(),
            redis_delay: Duration::ZERO,
            redis_stop_at: None,
            router: None,
            peers: Vec::new(),
        }
    }
}

impl Options {
    /// The part of each cell not measured: `--warmup`, else a sixth of the
    /// duration.
    pub fn warmup_or_default(&self) -> Duration {
        self.warmup.unwrap_or(self.duration / 6)
    }

    /// Whether a cell runs the gateway binary.
    pub fn needs_gateway(&self) -> bool {
        self.router.is_none() && self.modes.iter().any(|m| m != REFERENCE)
    }
}

/// A router cell's name goes in a markdown table and a file of records.
fn check_label(label: &str) -> Result<(), String> {
    if label.is_empty() || label.chars().any(|c| c == '|' || c.is_whitespace()) {
        return Err(format!(
            "--router-label {label:?}: a name without spaces or '|'"
        ));
    }
    if label == REFERENCE {
        return Err("--router-label: \"reference\" names the cell without a router".into());
    }
    Ok(())
}

fn parse_compare(s: &str) -> Result<(String, PathBuf), String> {
    let (label, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected LABEL=PATH"))?;
    check_label(label)?;
    if ALL_MODES.contains(&label) {
        return Err(format!(
            "{label:?} names a mode; give the cell another name"
        ));
    }
    Ok((label.to_string(), PathBuf::from(path)))
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

fn unit_share(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| (0.0..=1.0).contains(f))
        .ok_or_else(|| "must be a share between 0 and 1".to_string())
}

fn non_negative(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)
        .ok_or_else(|| "must be a non-negative number".to_string())
}

/// A number of seconds, fractions allowed.
fn seconds(v: &str) -> Result<Duration, String> {
    non_negative(v).and_then(|s| {
        Duration::try_from_secs_f64(s).map_err(|_| "must be a number of seconds".to_string())
    })
}

impl BenchArgs {
    /// The run's options: defaults, the --quick and --realistic-scale
    /// presets, and the checks that involve more than one flag.
    pub fn resolve(self) -> Result<Options, String> {
        let d = Options::default();
        let modes_given = !self.modes.is_empty();
        let mut o = Options {
            engines: self.engines.unwrap_or(d.engines),
            sessions_per_engine: self.sessions.unwrap_or(d.sessions_per_engine),
            duration: d.duration,
            warmup: self.warmup,
            seed: self.seeds.first().copied().or(self.seed).unwrap_or(d.seed),
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
            kv_factor: self.kv_factor,
            per_seq_us: self.per_seq_us,
            per_context_us: self.per_context_us,
            slow_first: self.slow_first,
            seeds: if self.seeds.is_empty() {
                vec![self.seed.unwrap_or(d.seed)]
            } else {
                self.seeds.clone()
            },
            family: match self.family {
                None => Vec::new(),
                Some(n) => {
                    crate::family::draws(n, self.family_seed.unwrap_or(1), &self.family_only)?
                }
            },
            compare: self.compare.clone(),
            engine_profile: self.engine_profile.unwrap_or(d.engine_profile),
            hide_kv_capacity: self.hide_kv_capacity,
            time_scale: self.time_scale.unwrap_or(d.time_scale),
            threads: self.threads.unwrap_or(d.threads),
            gateway: self.gateway,
            records: self.records,
            plot: self.plot,
            session_id: self.session_id.unwrap_or(d.session_id),
            id_share: self.id_share.unwrap_or(d.id_share),
            route_extra: self.route_extra,
            max_concurrency: self.max_concurrency,
            quiet_alone: self.quiet_alone,
            replicas: self.replicas.unwrap_or(d.replicas),
            session_store: self.session_store.unwrap_or(d.session_store),
            redis_delay: self
                .redis_delay
                .map_or(d.redis_delay, Duration::from_millis),
            redis_stop_at: self.redis_stop_at,
            router: None,
            peers: match self.peers {
                Some(names) if names.iter().any(|n| n == "all") => peers::PEERS.to_vec(),
                names => {
                    let mut chosen: Vec<Peer> = Vec::new();
                    for p in names.iter().flatten().filter_map(|n| peers::by_name(n)) {
                        if !chosen.contains(&p) {
                            chosen.push(p);
                        }
                    }
                    chosen
                }
            },
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
        let redis_only = [
            ("--redis-delay", self.redis_delay.is_some()),
            ("--redis-stop-at", self.redis_stop_at.is_some()),
        ];
        if let Some((flag, _)) = redis_only.iter().find(|(_, set)| *set) {
            if o.session_store != "redis" {
                return Err(format!("{flag} applies to --session-store redis only"));
            }
        }
        if let Some(at) = o.redis_stop_at {
            let measured = o.duration.saturating_sub(o.warmup_or_default());
            if at >= measured {
                return Err(format!(
                    "--redis-stop-at {}: past the measured window ({:.1}s after a warm-up of \
                     {:.1}s)",
                    at.as_secs_f64(),
                    measured.as_secs_f64(),
                    o.warmup_or_default().as_secs_f64(),
                ));
            }
        }
        if self.id_share.is_some() && o.session_id != SessionIdMode::Mixed {
            return Err("--id-share applies to --session-id mixed only".into());
        }
        if o.user_tokens.0 == 0 || o.max_tokens.0 == 0 {
            return Err("--user-tokens and --max-tokens must start above 0".into());
        }
        if o.system_tokens + o.user_tokens.1 + o.max_tokens.1 >= o.max_context {
            return Err("--max-context leaves no room for a turn after the system prompt".into());
        }
        match (self.router_cmd, self.router_label) {
            (Some(_), _) if !o.peers.is_empty() => {
                return Err(
                    "--router-cmd and --peers: run them separately (--router-cmd \
                            replaces the gateway cells, --peers adds to them)"
                        .into(),
                )
            }
            (Some(command), label) => {
                router::check_template(&command)?;
                let label = label.unwrap_or_else(|| router::DEFAULT_LABEL.to_string());
                check_label(&label)?;
                if modes_given && (o.modes.len() != 1 || o.modes[0] == REFERENCE) {
                    return Err(
                        "--router-cmd runs one cell per scenario, the router: --modes may \
                                name at most one gateway mode, which is not run"
                            .into(),
                    );
                }
                let gateway_only = [
                    ("--replicas", o.replicas != 1),
                    ("--session-store redis", o.session_store != "local"),
                    ("--route-extra", o.route_extra.is_some()),
                    ("--max-concurrency", o.max_concurrency.is_some()),
                    ("--gateway", o.gateway.is_some()),
                ];
                if let Some((flag, _)) = gateway_only.iter().find(|(_, set)| *set) {
                    return Err(format!(
                        "{flag} applies to the gateway, not to --router-cmd"
                    ));
                }
                o.modes = vec![label.clone()];
                o.router = Some(RouterSpec { command, label });
            }
            (None, Some(_)) => return Err("--router-label applies to --router-cmd only".into()),
            (None, None) => {}
        }
        if let Some(g) = &o.gateway {
            if o.needs_gateway() && !g.is_file() {
                return Err(format!("--gateway {}: no such file", g.display()));
            }
        }
        if self.seed.is_some() && !self.seeds.is_empty() {
            return Err("--seed and --seeds: give one".into());
        }
        if !o.compare.is_empty() && o.router.is_some() {
            return Err("--compare adds gateway cells; --router-cmd runs none".into());
        }
        for (label, path) in &o.compare {
            if !path.is_file() {
                return Err(format!(
                    "--compare {label}={}: no such file",
                    path.display()
                ));
            }
        }
        if !o.family.is_empty() && (o.kv_tokens.is_some() || o.kv_factor.is_some()) {
            return Err(
                "--family draws the engines' KV; leave out --kv-tokens and --kv-factor".into(),
            );
        }
        if o.quiet_alone && !o.scenarios.contains(&Scenario::NoisyNeighbor) {
            return Err("--quiet-alone applies to --scenario noisy-neighbor".into());
        }
        Ok(o)
    }
}

#[cfg(test)]
pub(crate) mod tests;
