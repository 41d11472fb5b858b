//! A scenario's plan: the workload and engine settings derived from the
//! options, and the header that explains them.

use std::time::Duration;

use crate::family::Draw;
use crate::ids::SessionIdMode;
use crate::options::Options;
use crate::scenario::{self, Failover, OverloadThink, Scenario};
use crate::workload::{Forks, LongSessions, Shape, Tenants, WorkloadParams};
use llm_gateway_sim::{EngineConfig, Profile, StepCost, DEFAULT_HOST_CACHE_TOKENS};

/// Everything one scenario's cells use, with the defaults that depend on
/// other options resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub opts: Options,
    pub scenario: Scenario,
    /// `opts.sessions_per_engine`, doubled by `overload`; in `forks`, the
    /// parents (3/4 of it).
    pub sessions_per_engine: usize,
    pub workload: WorkloadParams,
    /// The configuration most engines have (all but `slow-engine`'s e0).
    pub engine: EngineConfig,
    /// One per engine, in order.
    pub engines: Vec<EngineConfig>,
    pub failover: Option<Failover>,
    pub overload: Option<OverloadThink>,
    pub warmup: Duration,
    /// The family draw the engines come from (`--family`).
    pub draw: Option<Draw>,
}

/// Each scenario's plans, in the order given: one per engine draw of the
/// family (or the engines the flags describe) and workload seed; or the
/// first scenario the options do not fit.
pub fn plans(opts: &Options) -> Result<Vec<Plan>, String> {
    let draws: Vec<Option<Draw>> = if opts.family.is_empty() {
        vec![None]
    } else {
        opts.family.iter().copied().map(Some).collect()
    };
    let mut plans = Vec::new();
    for &s in &opts.scenarios {
        for draw in &draws {
            for &seed in &opts.seeds {
                let mut o = opts.clone();
                o.seed = seed;
                if let Some(d) = draw {
                    apply(d, &mut o);
                }
                let mut plan =
                    Plan::for_scenario(o, s).map_err(|e| format!("scenario {s}: {e}"))?;
                plan.draw = *draw;
                plans.push(plan);
            }
        }
    }
    Ok(plans)
}

/// The engine flags a family draw stands for.
fn apply(d: &Draw, o: &mut Options) {
    o.kv_tokens = None;
    o.kv_factor = Some(d.kv_factor);
    o.max_running = Some(d.max_num_seqs);
    o.prefill_us = d.prefill_us;
    o.decode_ms = d.decode_ms;
    o.per_seq_us = Some(d.per_seq_us);
    o.per_context_us = Some(d.per_context_us);
    o.hide_kv_capacity = !d.publish_kv;
    o.slow_first = d.slow_first;
}

/// KV over an engine's share of the working set, unless `--kv-tokens` or
/// `--kv-factor` say otherwise (see `build` for why).
const KV_OVER_WORKING_SET: f64 = 1.75;

/// An engine's share of what the sessions hold: its sessions (those the
/// engines are sized for, `--sessions`: `overload` doubles them on the same
/// fleet) times their mean context; with tenants, its share of their
/// prefixes and its conversations' own turns.
fn working_set(w: &WorkloadParams, opts: &Options, spe: usize) -> usize {
    match w.tenants {
        Some(t) => {
            t.count as usize * t.prefix_tokens / opts.engines.max(1)
                + spe * w.mean_turn_tokens(w.common())
        }
        None => opts.sessions_per_engine * w.mean_context(),
    }
}

/// vLLM's defaults for the batch profiles.
const DEFAULT_MAX_NUM_SEQS: usize = 256;
const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 8192;

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
        let room = |shape: Shape| {
            w.system_tokens + shape.user_tokens.1 + w.max_tokens.1 < shape.max_context
        };
        if !room(w.common()) || !room(w.shape(0)) {
            return Err(
                "the context limit leaves no room for a turn after the system prompt".into(),
            );
        }
        Ok(p)
    }

    fn build(mut opts: Options, scenario: Scenario) -> Plan {
        if scenario == Scenario::SharedPrefix {
            // The shape of llm-d's prefix benchmark names no session.
            opts.session_id = SessionIdMode::None;
        }
        let scale = opts.time_scale;
        let scaled = |v: u64| ((v as f64) * scale).round() as u64;
        let spe = match scenario {
            Scenario::Overload | Scenario::NoisyNeighbor => opts.sessions_per_engine * 2,
            Scenario::SharedPrefix => {
                opts.sessions_per_engine * scenario::SHARED_SESSIONS_PER_ENGINE / 8
            }
            Scenario::Forks => {
                let (num, den) = scenario::FORK_PARENTS;
                (opts.sessions_per_engine * num).div_ceil(den).max(1)
            }
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
            forks: None,
            pre_age: true,
            tenants: None,
            noisy_neighbor: false,
            quiet_alone: false,
        };
        if scenario == Scenario::Outgrow {
            workload.user_tokens = scenario::OUTGROW_USER;
            workload.max_tokens = scenario::OUTGROW_MAX_TOKENS;
            workload.think_ms = (
                scaled(scenario::OUTGROW_THINK_MS.0),
                scaled(scenario::OUTGROW_THINK_MS.1),
            );
            workload.pre_age = false;
        }
        if scenario == Scenario::SharedPrefix {
            let t = Tenants {
                count: scenario::SHARED_TENANTS,
                prefix_tokens: scenario::SHARED_PREFIX_TOKENS,
                turns: scenario::SHARED_TURNS,
            };
            workload.system_tokens = t.prefix_tokens;
            workload.user_tokens = scenario::SHARED_USER;
            // A conversation ends on its turns, long before any limit.
            let turn = workload.user_tokens.1 + workload.max_tokens.1;
            workload.max_context = t.prefix_tokens + (t.turns.1 as usize + 1) * turn;
            workload.tenants = Some(t);
        }
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
        if scenario == Scenario::Forks {
            workload.forks = Some(Forks {
                one_in: scenario::FORK_ONE_IN,
                agents: scenario::FORK_AGENTS,
                turns: scenario::FORK_AGENT_TURNS,
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
        // `forks` has fewer parents but about as many live sessions: the
        // engines of --sessions.
        let live_spe = match scenario {
            Scenario::Forks => opts.sessions_per_engine,
            _ => spe,
        };
        // vllm and sglang batch up to max_num_seqs (vLLM's default 256) and
        // are bound by KV blocks instead: --max-running is their
        // max_num_seqs. llamacpp's slots are its --parallel.
        let profile = opts.engine_profile;
        let max_running = opts.max_running.unwrap_or_else(|| {
            if profile.batched() {
                DEFAULT_MAX_NUM_SEQS
            } else {
                (live_spe * 3).div_ceil(4).max(1)
            }
        });
        let block_tokens = 16;
        let kv = opts.kv_tokens.unwrap_or_else(|| {
            let share = working_set(&workload, &opts, spe);
            let factor = opts.kv_factor.unwrap_or(KV_OVER_WORKING_SET);
            let mut kv = (share as f64 * factor) as usize;
            if profile == Profile::Llamacpp {
                // llama-server refuses a prompt past its slot's context,
                // so each slot holds the longest conversation, as an
                // operator sizes --ctx-size for the clients it serves.
                let longest = workload
                    .long
                    .map_or(0, |l| l.max_context)
                    .max(workload.max_context)
                    + opts.max_tokens.1;
                kv = kv.max(longest * max_running);
            }
            kv.div_ceil(block_tokens) * block_tokens
        });
        let decode_ms = scaled(opts.decode_ms).max(1);
        let prefill_us = scaled(opts.prefill_us);
        let engine = EngineConfig {
            name: "sim-model".to_string(),
            max_running,
            kv_capacity_tokens: kv,
            prefill_us_per_token: prefill_us,
            decode_ms_per_token: decode_ms,
            default_max_tokens: opts.max_tokens.1,
            block_tokens,
            prefill_decode_interference: opts.prefill_interference,
            profile,
            max_num_seqs: max_running,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            // The calibrated preset's shape at the bench's speeds
            // (crates/sim/CALIBRATION.md); no front-end time: the bench
            // measures the gateway, not a Python server.
            step_cost: {
                let scaled = StepCost::scaled_to(decode_ms, prefill_us);
                StepCost {
                    per_seq_us: opts.per_seq_us.unwrap_or(scaled.per_seq_us),
                    per_context_token_us: opts
                        .per_context_us
                        .unwrap_or(scaled.per_context_token_us),
                    ..scaled
                }
            },
            request_overhead_us: 0,
            publish_kv_capacity: !opts.hide_kv_capacity,
            // llama-server's default --cache-ram (llamacpp only).
            host_cache_tokens: DEFAULT_HOST_CACHE_TOKENS,
            health_path: "/health".to_string(),
        };
        let mut engines = vec![engine.clone(); opts.engines];
        if scenario == Scenario::SlowEngine || opts.slow_first {
            engines[0] = scenario::slowed(&engine);
        }
        let overload =
            matches!(scenario, Scenario::Overload | Scenario::NoisyNeighbor).then(|| {
                let t = scenario::overload_think(
                    turn_busy_s(&workload, &engine),
                    spe,
                    workload.mean_context(),
                    kv,
                );
                workload.think_ms = t.think_ms;
                t
            });
        workload.noisy_neighbor = scenario == Scenario::NoisyNeighbor;
        workload.quiet_alone = workload.noisy_neighbor && opts.quiet_alone;
        let warmup = opts.warmup_or_default();
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
            draw: None,
        }
    }

    /// The scenario, with the family draw and the seed when the run has
    /// more than one of either: `uniform f3 s2`.
    pub fn label(&self) -> String {
        let mut out = self.scenario.name().to_string();
        if let Some(d) = self.draw {
            out.push_str(&format!(" {}", d.label()));
        }
        if self.opts.seeds.len() > 1 || self.draw.is_some() {
            out.push_str(&format!(" s{}", self.opts.seed));
        }
        out
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
        // `forks`: the live sessions (parents and sub-agents) are about
        // --sessions, the engines' sizing.
        let spe = match self.scenario {
            Scenario::Forks => self.opts.sessions_per_engine,
            _ => self.sessions_per_engine,
        };
        let share = spe * w.mean_context();
        // The batch profiles' max_running is their max_num_seqs.
        let batch_limit = if e.profile.batched() {
            "max_num_seqs"
        } else {
            "max_running"
        };
        let mut out = format!(
            "scenario {}: {}\n\
             engines {} x sessions/engine {} = {} concurrent sessions; seed {}; {} per cell \
             ({} warm-up not measured); gateway threads {}\n\
             workload: system prompt {} tokens shared by all; per turn a user message of {}-{} \
             tokens and max_tokens {}-{}; think {}-{} ms; a session ends near {} tokens \
             (~{} turns) and a new one takes its slot; first sessions pre-aged to a random turn; \
             streaming with include_usage\n\
             engine: decode {} ms/token ({:.0} tok/s per sequence), prefill {} us per uncached \
             token, decode slowed x{} per prefill in progress, {} {}, KV {} tokens, \
             {}-token blocks\n\
             why: a cold {}-token context costs {:.1} s of prefill, a warm turn ~{:.0} new tokens \
             = {:.2} s, so cache misses show in TTFT. A session waits on the engine ~{:.0}% of the \
             time ({:.1} s decode vs {:.2} s think), so {} sessions keep ~{:.1} sequences busy per \
             engine against {} {}: balanced engines queue at peaks, overloaded or \
             cold-prefilling ones queue persistently (the `waiting` signal). KV {} holds {:.1}x an \
             engine's share of live context ({} sessions x {} mean = {}), not all {} sessions' \
             ({}), so spreading sessions over every engine evicts prefixes before reuse.",
            self.scenario,
            self.scenario_note(),
            self.opts.engines,
            self.sessions_per_engine,
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
            batch_limit,
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
            batch_limit,
            e.max_running,
            e.kv_capacity_tokens,
            e.kv_capacity_tokens as f64 / share as f64,
            spe,
            w.mean_context(),
            share,
            self.opts.engines * spe,
            self.opts.engines * spe * w.mean_context(),
        );
        if let Some(route_extra) = self.opts.route_extra.as_deref() {
            let one_line = route_extra.trim().replace('\n', "; ");
            out.push_str(&format!(
                "\nroute file of the gateway cells ends with: {one_line}"
            ));
        }
        out.push_str(&format!("\nengine profile: {}", self.profile_note()));
        out.push_str(&format!("\nsession ids: {}", self.session_ids()));
        if self.opts.replicas > 1 || self.opts.session_store != "local" {
            out.push_str(&format!(
                "\n{} gateway replica(s), each request sent to one at random; session store: {}",
                self.opts.replicas, self.opts.session_store
            ));
            if !self.opts.redis_delay.is_zero() {
                out.push_str(&format!(
                    "; Redis reached through a relay adding {} ms per round trip",
                    self.opts.redis_delay.as_millis()
                ));
            }
            if let Some(at) = self.opts.redis_stop_at {
                out.push_str(&format!(
                    "; redis-server killed {} into the measured window, the run going on \
                     without it",
                    fmt_secs(at)
                ));
            }
        }
        out
    }

    /// What the engine profile does with the numbers above.
    pub fn profile_note(&self) -> String {
        let e = &self.engine;
        let c = &e.step_cost;
        match e.profile {
            Profile::Vllm | Profile::Sglang => format!(
                "{} (vLLM V1's scheduler{}: up to {} sequences per batch, admitted while KV \
                 blocks last, preemption by recompute when they run out; each step computes \
                 at most {} tokens, decodes first, then prefill chunks; a step takes {:.1} ms \
                 + {:.0} us per token + {:.0} us per sequence + {:.3} us per context token, \
                 the calibrated preset scaled to decode and prefill above; max_running and \
                 the prefill slowdown do not apply)",
                e.profile,
                if e.profile == Profile::Sglang {
                    " under SGLang's metric names"
                } else {
                    ""
                },
                e.max_num_seqs,
                e.max_num_batched_tokens,
                c.base_us / 1e3,
                c.per_token_us,
                c.per_seq_us,
                c.per_context_token_us,
            ),
            Profile::Llamacpp => format!(
                "llamacpp (llama-server with --parallel {}: each slot caches its own last \
                 conversation in a context of {} tokens, KV {} / slots; a request takes the \
                 idle slot sharing the longest prefix, else the least recently used; a \
                 host-memory prompt cache of {} tokens keeps the prompts slots give up; no \
                 KV figures in /metrics)",
                e.max_running,
                e.kv_capacity_tokens / e.max_running.max(1),
                e.kv_capacity_tokens,
                e.host_cache_tokens,
            ),
            Profile::Slots => "slots (max_running sequences, each on its own clock; the \
                 simulator's original model)"
                .to_string(),
        }
    }

    /// How the gateway cells' requests name their session.
    pub fn session_ids(&self) -> String {
        let how = match self.opts.session_id {
            SessionIdMode::Header => "every request sends the header x-session-id".to_string(),
            SessionIdMode::None => {
                "none sent (the gateway must recognise conversations by content)".to_string()
            }
            SessionIdMode::PromptCacheKey => {
                "in the body's prompt_cache_key field, no header".to_string()
            }
            SessionIdMode::Mixed => format!(
                "{:.0}% of sessions (chosen per session from the seed) send the header \
                 x-session-id, the rest nothing",
                self.opts.id_share * 100.0
            ),
        };
        format!(
            "{} ({how}; the reference cell sends none)",
            self.opts.session_id
        )
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
                     {}; think times derived ({}-{} ms, overriding --think-ms): a \
                     turn keeps a sequence in the engine ~{:.2} s, so each session is in the \
                     engine {:.0}% of the time, ~{:.1} sequences x {} mean context = {:.0} tokens \
                     = {:.0}% of KV committed to running sequences",
                    self.sessions_per_engine,
                    self.opts.sessions_per_engine,
                    e.kv_capacity_tokens,
                    if e.profile.batched() {
                        format!("max_num_seqs {}", e.max_num_seqs)
                    } else {
                        format!("max_running {}", e.max_running)
                    },
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
            Scenario::NoisyNeighbor => format!(
                "tenant quiet has one slot in {} and noisy the other {}, so noisy sends {}x \
                 quiet's rate, each request naming its tenant in {}; {} sessions per engine \
                 (2x), think times as in overload ({}-{} ms); each engine takes {} at once \
                 (max_concurrency) and the gateway's route waits up to 60 s for room unless \
                 --route-extra sets queue_timeout",
                scenario::NOISY_EVERY,
                scenario::NOISY_EVERY - 1,
                scenario::NOISY_EVERY - 1,
                scenario::FAIRNESS_HEADER,
                self.sessions_per_engine,
                w.think_ms.0,
                w.think_ms.1,
                scenario::noisy_max_concurrency(self.sessions_per_engine),
            ),
            Scenario::Forks => match w.forks {
                Some(f) => {
                    let live = f.mean_live();
                    format!(
                        "{} parent agents per engine (3/4 of {}); after a successful turn a \
                         parent spawns, with a chance of 1 in {}, {}-{} sub-agents whose first \
                         request is its last request's messages, the reply to it and a \
                         sub-task; each runs {}-{} turns of its own while the parent waits, \
                         then the parent's next message is their results (a tool message). \
                         ~{:.2} live sessions per parent, so ~{:.1} per engine; max_running \
                         and KV as for {} sessions per engine",
                        self.sessions_per_engine,
                        self.opts.sessions_per_engine,
                        f.one_in,
                        f.agents.0,
                        f.agents.1,
                        f.turns.0,
                        f.turns.1,
                        live,
                        live * self.sessions_per_engine as f64,
                        self.opts.sessions_per_engine,
                    )
                }
                None => String::new(),
            },
            Scenario::Outgrow => format!(
                "sessions of one shape start together, not pre-aged: user turns of {}-{} \
                 tokens, max_tokens {}-{}, think {}-{} ms, so each reaches {} tokens in ~{} \
                 turns and the slots restart together; near the end of a generation {} \
                 sessions hold ~{} tokens an engine against KV {}",
                w.user_tokens.0,
                w.user_tokens.1,
                w.max_tokens.0,
                w.max_tokens.1,
                w.think_ms.0,
                w.think_ms.1,
                w.max_context,
                w.expected_turns(w.common()),
                self.sessions_per_engine,
                self.sessions_per_engine * w.max_context,
                e.kv_capacity_tokens,
            ),
            Scenario::SharedPrefix => match w.tenants {
                Some(t) => format!(
                    "{} tenants, each with a {}-token prefix of its own ({} tokens of prefixes, \
                     {} an engine if each tenant had one); conversations of {}-{} turns of \
                     {}-{}-token questions start with their tenant's prefix; {} at once per \
                     engine; no session id; KV {}. The reference cell sends tenant k to \
                     engine k mod {}",
                    t.count,
                    t.prefix_tokens,
                    t.count as usize * t.prefix_tokens,
                    t.count as usize * t.prefix_tokens / self.opts.engines.max(1),
                    t.turns.0,
                    t.turns.1,
                    w.user_tokens.0,
                    w.user_tokens.1,
                    self.sessions_per_engine,
                    e.kv_capacity_tokens,
                    self.opts.engines,
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
mod tests;
