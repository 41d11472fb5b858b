//! The results as JSON (`--json`): each scenario's parameters, its cells'
//! measures and how each compares with the best peer.

use std::time::Duration;

use serde_json::{json, Value};

use crate::analysis::{Recognition, Spread};
use crate::ids::SessionIdMode;
use crate::plan::Plan;
use crate::result::{ModeResult, ScenarioResult};
use crate::versus::{best_peer, vs_best, VsBest};

fn vs_best_json(v: VsBest) -> Value {
    json!({"p95": v.p95, "p99": v.p99, "hit_points": v.hit_points, "tok_s": v.tok_s})
}

fn recognition_json(g: &Option<Recognition>) -> Value {
    match g {
        Some(g) => json!({
            "later_turns": g.turns,
            "recognised": g.recognised,
            "recognised_share": g.recognised_share(),
            "wrong": g.wrong,
            "wrong_share": g.wrong_share(),
            "anonymous_turns": g.anonymous_turns,
            "anonymous_recognised": g.anonymous_recognised,
            "anonymous_recognised_share": g.anonymous_share(),
            "routed_source": g.sources,
        }),
        None => Value::Null,
    }
}

fn spread_json(s: Option<Spread>) -> Value {
    match s {
        Some(s) => {
            json!({"min_mean": s.min_mean, "max_mean": s.max_mean, "min": s.min, "max": s.max})
        }
        None => Value::Null,
    }
}

pub(super) fn cell_json(r: &ModeResult, best: Option<&ModeResult>) -> Value {
    let mut v = cell_json_measured(r);
    // Added apart: one json! of every member passes the macro's recursion
    // limit.
    if let Value::Object(m) = &mut v {
        m.insert("peer".into(), r.peer.into());
        m.insert(
            "vs_best_peer".into(),
            best.map_or(Value::Null, |b| vs_best_json(vs_best(r, b))),
        );
    }
    v
}

fn cell_json_measured(r: &ModeResult) -> Value {
    json!({
        "mode": r.mode,
        "router": r.router,
        "window_s": r.window_s,
        "requests": r.requests,
        "errors": r.errors,
        "errors_by_kind": r.error_kinds,
        "requests_total": r.requests_total,
        "errors_total": r.errors_total,
        "error_rate": r.error_rate(),
        "cut": r.cut,
        "first_error": r.first_error,
        "ttft_s": {"p50": r.ttft_p50, "p95": r.ttft_p95, "p99": r.ttft_p99},
        "ttft_perfect_cache_bound_s": {"p95": r.ttft_bound_p95, "p99": r.ttft_bound_p99},
        "decode_tok_s": {"p50": r.decode_p50, "p5": r.decode_p5},
        "output_tok_s": r.output_tok_s,
        "cache_hit": r.cache_hit,
        "cache_hit_engine": r.cache_hit_engine,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "prefilled_tokens": r.prefill.prefilled,
        "perfect_cache_bound_tokens": r.prefill.bound,
        "prefilled_over_bound": r.prefill.ratio(),
        "live_sessions_per_engine": spread_json(r.sessions_spread),
        "bound_tokens_per_engine": spread_json(r.tokens_spread),
        "moves": (!r.router).then(|| r.moves()),
        "spills": r.spills,
        "migrations": r.migrations,
        "placements": r.placements,
        "peer_switch_rate": r.switch_rate,
        "new_sessions_per_peer": r.new_sessions_per_peer,
        "session_recognition": recognition_json(&r.recognition),
        "engine_load_mean": r.engine_load,
        "engine_queue_mean": r.engine_queue,
        "kv_committed_mean": r.kv_committed,
        "load_imbalance": r.load_imbalance(),
        "gateway_cpu_cores": r.gateway_cpu,
        "bench_cpu_cores": r.bench_cpu,
        "timer_lag_s": {"p99": r.lag_p99, "max": r.lag_max, "stalled": r.stalled_s},
        "unreliable_stall": r.stalled(),
    })
}

pub(super) fn parameters_json(plan: &Plan) -> Value {
    let w = &plan.workload;
    let engine = |e: &llm_gateway_sim::EngineConfig| {
        json!({
            "max_running": e.max_running,
            "kv_capacity_tokens": e.kv_capacity_tokens,
            "prefill_us_per_token": e.prefill_us_per_token,
            "decode_ms_per_token": e.decode_ms_per_token,
            "block_tokens": e.block_tokens,
        })
    };
    json!({
        "scenario": plan.scenario.name(),
        "engines": plan.opts.engines,
        "sessions_per_engine": plan.sessions_per_engine,
        "duration_s": plan.opts.duration.as_secs_f64(),
        "warmup_s": plan.warmup.as_secs_f64(),
        "seed": plan.opts.seed,
        "gateway_threads": plan.opts.threads,
        "route_extra": plan.opts.route_extra,
        "replicas": plan.opts.replicas,
        "session_store": plan.opts.session_store,
        "redis_delay_ms": plan.opts.redis_delay.as_millis() as u64,
        "redis_stop_at_s": plan.opts.redis_stop_at.map(|d| d.as_secs_f64()),
        "router": plan.opts.router.as_ref().map(|r| json!({
            "label": r.label,
            "command": r.command,
        })),
        "session_id": plan.opts.session_id.name(),
        "id_share": (plan.opts.session_id == SessionIdMode::Mixed).then_some(plan.opts.id_share),
        "workload": {
            "system_tokens": w.system_tokens,
            "user_tokens": [w.user_tokens.0, w.user_tokens.1],
            "max_tokens": [w.max_tokens.0, w.max_tokens.1],
            "think_ms": [w.think_ms.0, w.think_ms.1],
            "max_context": w.max_context,
            "long_sessions": w.long.map(|l| json!({
                "slots": w.long_slots(),
                "user_tokens": [l.user_tokens.0, l.user_tokens.1],
                "max_context": l.max_context,
            })),
            "forks": w.forks.map(|f| json!({
                "one_in": f.one_in,
                "agents": [f.agents.0, f.agents.1],
                "turns": [f.turns.0, f.turns.1],
                "mean_live_per_parent": f.mean_live(),
            })),
        },
        "engine": engine(&plan.engine),
        "per_engine": plan.engines.iter().map(engine).collect::<Vec<_>>(),
        "failover": plan.failover.map(|f| json!({
            "engine": f.engine,
            "at_s": f.at.as_secs_f64(),
            "outage_s": f.outage.as_secs_f64(),
        })),
        "overload": plan.overload.map(|t| json!({
            "turn_busy_s": t.busy_s,
            "in_engine_share": t.in_engine,
            "sequences_per_engine": t.sequences,
            "committed_kv_tokens": t.committed_tokens,
        })),
    })
}

pub fn json(results: &[ScenarioResult], elapsed: Duration) -> Value {
    let scenarios: Vec<Value> = results
        .iter()
        .map(|s| {
            let best = best_peer(&s.cells, s.plan.scenario.errors_expected()).map(|i| &s.cells[i]);
            json!({
                "scenario": s.plan.scenario.name(),
                "run": s.plan.label(),
                "engines_flags": s.plan.draw.map(|d| d.flags()),
                "parameters": parameters_json(&s.plan),
                "modes": s.cells.iter().map(|c| cell_json(c, best)).collect::<Vec<_>>(),
                "best_peer": best.map(|b| b.mode.as_str()),
                "peers": s.peers.iter().map(|(name, command)| json!({
                    "name": name,
                    "command": command,
                })).collect::<Vec<_>>(),
                "skipped_peers": s.skipped_peers.iter().map(|k| json!({
                    "name": k.name,
                    "reason": k.reason,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "elapsed_s": elapsed.as_secs_f64(),
        "scenarios": scenarios,
        "over_runs": super::family::json(results),
    })
}
