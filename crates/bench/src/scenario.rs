//! The scenarios of `--scenario`: presets over the workload and engine
//! parameters that every other option sets, each run once per mode.
//!
//! `uniform` is the workload the bench always had; the others each stress
//! one thing a placement policy must handle: uneven sessions (`skewed`), an
//! uneven fleet (`slow-engine`), an engine that leaves and comes back cold
//! (`failover`), more demand than the engines' KV comfortably holds
//! (`overload`), agents that fork sub-agents sharing their history
//! (`forks`), sessions of one size that grow, end and restart together and
//! outgrow the KV at the end of each generation (`outgrow`), and many
//! tenants' conversations that share a long prefix per tenant and name no
//! session (`shared-prefix`, the shape of llm-d's prefix benchmark), and
//! two tenants on saturated engines, one sending ten times the other's rate
//! (`noisy-neighbor`, issue 43's fair share).

use std::time::Duration;

use llm_gateway_sim::EngineConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Scenario {
    /// Every session has the same shape on identical engines (the default).
    Uniform,
    /// One long agent session per engine (user turns 4k-12k tokens, contexts
    /// to 120k) among many short chats.
    Skewed,
    /// Engine e0 decodes and prefills at 0.4x speed.
    SlowEngine,
    /// Engine e0 refuses connections for 20 s, then comes back with an empty
    /// cache.
    Failover,
    /// 2x the sessions, with think times short enough that ~80% of KV is
    /// committed to running sequences.
    Overload,
    /// Coding agents that, at some turns, spawn 2-3 sub-agents whose first
    /// request is the parent's history plus a sub-task; the parent waits for
    /// them and goes on with their results (3/4 as many parents, so the
    /// sessions live at once are about those of uniform).
    Forks,
    /// Sessions of one shape (user turns 6k-8k tokens) that start
    /// together, not pre-aged: they reach the context limit at about the
    /// same time, end and restart together, and each generation outgrows
    /// the engines' KV near its end.
    Outgrow,
    /// 80 tenants, each with an 8k-token prefix of its own (a system
    /// prompt with its documents); conversations of one or two turns that
    /// start with their tenant's prefix; 12 at once per engine; no session
    /// id. The reference cell places each tenant on one engine.
    SharedPrefix,
    /// Two tenants on saturated engines (twice uniform's sessions, think
    /// times as in overload): one slot in 11 is tenant `quiet`, the other
    /// ten `noisy`, so noisy sends 10x quiet's rate; each request names its
    /// tenant in `x-gateway-inference-fairness-id`. The gateway holds back
    /// what the engines cannot start now: each engine takes half its
    /// sessions at once (`max_concurrency`), and the route waits up to 60 s
    /// for room (`queue_timeout`, unless --route-extra sets it), so the
    /// queue's order decides who goes next. `--route-extra 'fair_share:
    /// false'` is the control.
    NoisyNeighbor,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Uniform => "uniform",
            Scenario::Skewed => "skewed",
            Scenario::SlowEngine => "slow-engine",
            Scenario::Failover => "failover",
            Scenario::Overload => "overload",
            Scenario::Forks => "forks",
            Scenario::Outgrow => "outgrow",
            Scenario::SharedPrefix => "shared-prefix",
            Scenario::NoisyNeighbor => "noisy-neighbor",
        }
    }

    /// Whether errors are an expected result here (an engine disappears,
    /// or a gateway may shed load with 429s) rather than a sign that the
    /// bench itself is broken: such scenarios do not fail the run's exit code.
    pub fn errors_expected(self) -> bool {
        matches!(
            self,
            Scenario::Failover | Scenario::Overload | Scenario::NoisyNeighbor
        )
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `skewed`: short chats take small turns and end this far past the
/// system prompt (~8 turns), so their slots start new sessions often.
pub const SKEWED_SHORT_USER: (usize, usize) = (100, 1_000);
pub const SKEWED_SHORT_CONTEXT_PAST_SYSTEM: usize = 6_000;
/// `skewed`: the long agent sessions, one per engine.
pub const SKEWED_LONG_USER: (usize, usize) = (4_000, 12_000);
pub const SKEWED_LONG_CONTEXT: usize = 120_000;

/// `outgrow`: big tool outputs, short replies and short pauses, so a
/// session reaches the 60k limit in eight turns or so (about half a
/// minute); no pre-aged first sessions.
pub const OUTGROW_USER: (usize, usize) = (6_000, 8_000);
pub const OUTGROW_MAX_TOKENS: (usize, usize) = (100, 200);
pub const OUTGROW_THINK_MS: (u64, u64) = (300, 1_000);

/// `shared-prefix`: tenants, the prefix each one's conversations start
/// with, turns per conversation, a question's size, conversations at once
/// per engine.
pub const SHARED_TENANTS: u32 = 80;
pub const SHARED_PREFIX_TOKENS: usize = 8_000;
pub const SHARED_TURNS: (u32, u32) = (1, 2);
pub const SHARED_USER: (usize, usize) = (200, 800);
pub const SHARED_SESSIONS_PER_ENGINE: usize = 12;

/// `noisy-neighbor`: one slot in this many is the quiet tenant's, the
/// others the noisy one's; the header that names them; the route's queue.
pub const NOISY_EVERY: u32 = 11;
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
pub const NOISY_QUEUE_TIMEOUT: &str = "queue_timeout: 60s";

/// `noisy-neighbor`: each engine's `max_concurrency`, half its sessions
/// (about 70% of them are in the engine at once with overload's think
/// times, so the gateway's queue always holds some).
pub fn noisy_max_concurrency(sessions_per_engine: usize) -> u32 {
    u32::try_from(sessions_per_engine / 2)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// `noisy-neighbor`: the tenant of `slot` (0 quiet, 1 noisy) and its name.
pub fn noisy_tenant(slot: u32) -> (u32, &'static str) {
    if slot.is_multiple_of(NOISY_EVERY) {
        (0, "quiet")
    } else {
        (1, "noisy")
    }
}

/// `slow-engine`: e0's speed relative to the others.
pub const SLOW_SPEED: f64 = 0.4;

/// `failover`: how long e0 is gone, and when it goes (after warm-up, so the
/// window sees the sessions it held move and the cold engine come back).
pub const OUTAGE: Duration = Duration::from_secs(20);
pub const FAIL_AFTER_WARMUP: Duration = Duration::from_secs(10);

/// `overload`: the share of KV that running sequences should hold.
pub const OVERLOAD_KV_COMMIT: f64 = 0.8;

/// `forks`: after a successful turn (not its first), a parent spawns
/// sub-agents with a chance of 1 in this.
pub const FORK_ONE_IN: u64 = 12;
/// `forks`: sub-agents per fork, and turns per sub-agent (inclusive).
pub const FORK_AGENTS: (u32, u32) = (2, 3);
pub const FORK_AGENT_TURNS: (u32, u32) = (2, 4);
/// `forks`: parents per engine, as a share of --sessions. A parent is one
/// live session between forks and itself plus 2-3 sub-agents (it waits)
/// during one; with the numbers above that is ~1.3 sessions on average, so
/// 3/4 of --sessions parents keep about --sessions live per engine.
pub const FORK_PARENTS: (usize, usize) = (3, 4);

/// `slow-engine`'s e0: decode and prefill take 1/SLOW_SPEED as long.
pub fn slowed(cfg: &EngineConfig) -> EngineConfig {
    let slow = |v: u64| ((v as f64) / SLOW_SPEED).round() as u64;
    EngineConfig {
        decode_ms_per_token: slow(cfg.decode_ms_per_token).max(1),
        prefill_us_per_token: slow(cfg.prefill_us_per_token),
        // The batch profiles' time is the step's.
        step_cost: cfg.step_cost.times(1.0 / SLOW_SPEED),
        ..cfg.clone()
    }
}

/// `failover`: engine `engine` is shut down at `at` (from the start of the
/// cell) and a new one, with an empty cache, listens on its port from
/// `at + outage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failover {
    pub engine: usize,
    pub at: Duration,
    pub outage: Duration,
}

impl Failover {
    /// Ten seconds into the measured window and twenty seconds out, or, in
    /// a window too short for that (`--quick`), a quarter in and half the
    /// window out, so the engine is always back before the cell ends.
    pub fn within(warmup: Duration, duration: Duration) -> Failover {
        let window = duration.saturating_sub(warmup);
        Failover {
            engine: 0,
            at: warmup + FAIL_AFTER_WARMUP.min(window / 4),
            outage: OUTAGE.min(window / 2),
        }
    }

    pub fn back(&self) -> Duration {
        self.at + self.outage
    }
}

/// `overload`'s think times, derived so that running sequences hold
/// `OVERLOAD_KV_COMMIT` of KV on average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverloadThink {
    /// Seconds a turn keeps a sequence in the engine (warm prefill + decode).
    pub busy_s: f64,
    /// Share of its time a session must spend in the engine.
    pub in_engine: f64,
    pub think_ms: (u64, u64),
    /// Sequences in an engine on average, and the tokens they commit.
    pub sequences: f64,
    pub committed_tokens: f64,
}

/// A session alternates a turn in the engine (`busy_s`) and a think pause.
/// With `sessions` per engine of `mean_context` tokens each, the engine
/// holds `sessions x in_engine` sequences on average; solving
/// `sessions x in_engine x mean_context = commit x kv` for the think time
/// gives `busy x (1 - in_engine) / in_engine`, spread +-50% around it.
pub fn overload_think(
    busy_s: f64,
    sessions: usize,
    mean_context: usize,
    kv_tokens: usize,
) -> OverloadThink {
    let demand = (sessions * mean_context).max(1) as f64;
    // Below 5% the think time would be absurdly long; at 100% sessions
    // never pause and the engine cannot commit more than all of them.
    let in_engine = (OVERLOAD_KV_COMMIT * kv_tokens as f64 / demand).clamp(0.05, 1.0);
    let mean_ms = busy_s * (1.0 - in_engine) / in_engine * 1e3;
    let think_ms = (
        (mean_ms * 0.5).round() as u64,
        (mean_ms * 1.5).round() as u64,
    );
    let sequences = sessions as f64 * in_engine;
    OverloadThink {
        busy_s,
        in_engine,
        think_ms,
        sequences,
        committed_tokens: sequences * mean_context as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_sits_inside_the_window() {
        let s = Duration::from_secs;
        // The default run: 10 s warm-up of 60 s.
        let f = Failover::within(s(10), s(60));
        assert_eq!(
            (f.engine, f.at, f.outage, f.back()),
            (0, s(20), s(20), s(40))
        );
        // --quick: 2 s warm-up of 10 s.
        let q = Failover::within(s(2), s(10));
        assert_eq!((q.at, q.outage, q.back()), (s(4), s(4), s(8)));
        assert!(q.back() < s(10));
    }

    #[test]
    fn slow_engine_is_two_and_a_half_times_slower() {
        let base = EngineConfig {
            decode_ms_per_token: 10,
            prefill_us_per_token: 50,
            ..EngineConfig::default()
        };
        let s = slowed(&base);
        assert_eq!((s.decode_ms_per_token, s.prefill_us_per_token), (25, 125));
        assert_eq!(s.kv_capacity_tokens, base.kv_capacity_tokens);
        assert_eq!(s.max_running, base.max_running);
        // Every profile: the batch profiles' steps too.
        let base = EngineConfig {
            profile: llm_gateway_sim::Profile::Vllm,
            ..base
        };
        let s = slowed(&base);
        let (b, c) = (base.step_cost, s.step_cost);
        assert_eq!(c.base_us, b.base_us * 2.5);
        assert_eq!(c.per_token_us, b.per_token_us * 2.5);
        assert_eq!(c.per_seq_us, b.per_seq_us * 2.5);
        assert_eq!(c.per_context_token_us, b.per_context_token_us * 2.5);
    }

    #[test]
    fn overload_think_commits_the_target_share_of_kv() {
        // 16 sessions of 31k mean context on an engine with 434k of KV:
        // 80% of it is 347k, i.e. 11.2 sequences, 70% of the sessions.
        let t = overload_think(2.1, 16, 31_000, 434_000);
        assert!((t.in_engine - 0.7).abs() < 1e-3, "{t:?}");
        assert!((t.sequences - 11.2).abs() < 0.01);
        assert!((t.committed_tokens / 434_000.0 - 0.8).abs() < 1e-3);
        // Mean think 2.1 x 0.3 / 0.7 = 0.9 s, spread 450-1350 ms.
        assert_eq!(t.think_ms, (450, 1350));
        // Demand below the target: sessions never pause.
        let t = overload_think(2.0, 2, 1_000, 1_000_000);
        assert_eq!((t.in_engine, t.think_ms), (1.0, (0, 0)));
    }
}
