//! `/_route_debug`: the placement a session would get and why, computed by
//! the same rules as a real request, changing nothing; and the model's
//! estimate on each peer, in its parts (`/_route_state`, `/_route_inspect`).

use super::{candidates, peer_loads, rule_view};
use crate::clock::now_ms;
use crate::config::Mode;
use crate::placement::{self, PlacementKind};
use crate::registry::Route;
use crate::session::SessionId;

/// What `place` would decide for `session`, without changing anything.
pub fn explain(route: &Route, pool: &[usize], session: &SessionId) -> serde_json::Value {
    let now = now_ms();
    let cands = candidates(route, pool, now);
    let loads = peer_loads(route, &rule_view(route, pool, &cands, now), now);
    let name_of = |id: u32| {
        route
            .peer_by_id(id)
            .map(|(_, p)| p.config.name.clone())
            .unwrap_or_default()
    };
    let candidates: Vec<String> = cands
        .iter()
        .map(|&i| route.peers[i].config.name.clone())
        .collect();
    let (peer, mode, reason, why) = match route.config.balancing.mode {
        Mode::LoadAware => match route.runtime.sessions.peek(session.hash, &loads, now) {
            Some((p, why)) => (
                Some(name_of(p.peer)),
                p.kind.as_str(),
                p.reason.map(|r| r.as_str()),
                why,
            ),
            None => (None, "none", None, "no ready peer".to_string()),
        },
        Mode::Hash => match placement::hash_place(session.hash, &loads, 0) {
            Some(p) if p.kind == PlacementKind::Hash => (
                Some(name_of(p.peer)),
                "hash",
                None,
                "rendezvous home is ready and has room".into(),
            ),
            Some(p) => (
                Some(name_of(p.peer)),
                p.kind.as_str(),
                None,
                "home not ready: next rendezvous choice; home saturated: least-connections".into(),
            ),
            None => (None, "none", None, "no ready peer".into()),
        },
        Mode::LeastConn | Mode::RoundRobin => (
            None,
            route.config.balancing.mode.as_str(),
            None,
            "mode ignores sessions".into(),
        ),
    };
    serde_json::json!({
        "session": session.hex(),
        "source": session.source.as_str(),
        "mode": route.config.balancing.mode.as_str(),
        "candidates": candidates,
        "decision": {"peer": peer, "kind": mode, "reason": reason},
        "why": why,
    })
}

/// The placement model's estimate on each ready peer of `pool` for a
/// request of `tokens` (of `session`, if bound: its home and what it held
/// there; sharing a template cached on `prefix`'s engines), in its parts,
/// and what the model knows of the route. Changes nothing.
pub fn estimates(
    route: &Route,
    pool: &[usize],
    session: Option<&SessionId>,
    tokens: u64,
    prefix: Option<placement::Prefix>,
) -> serde_json::Value {
    let now = now_ms();
    let cands = candidates(route, pool, now);
    let loads = peer_loads(route, &cands, now);
    let incoming = placement::Incoming {
        tokens,
        prefix,
        ..placement::Incoming::default()
    };
    let (model, estimates) =
        route
            .runtime
            .sessions
            .estimates(session.map(|s| s.hash), incoming, &loads, now);
    let name_of = |id: u32| {
        route
            .peer_by_id(id)
            .map(|(_, p)| p.config.name.clone())
            .unwrap_or_default()
    };
    serde_json::json!({
        "tokens": tokens,
        "route": {
            "prefill_us_per_token": model.prefill_us,
            "tpot_us": model.tpot_us,
            "typical_session_tokens": model.typical_session,
        },
        "peers": estimates.iter().map(|e| serde_json::json!({
            "peer": name_of(e.peer),
            "expected_ms": e.total_ms(),
            "queue_ms": e.queue_known.then_some(e.queue_ms),
            "backlog_ms": e.backlog_ms,
            "prefill_ms": e.prefill_ms,
            "cached_tokens": e.cached_tokens,
            "uncached_tokens": e.uncached_tokens,
            "evicts_tokens": e.evicts_tokens,
            "evicts_ms": e.evicts_ms,
            "holds_tokens": e.hold_tokens,
            "holds_permille_of_kv": e.hold_permille,
            "prefill_us_per_token": e.prefill_us,
            "speed": if e.timed { "timed" } else { "assumed" },
        })).collect::<Vec<_>>(),
    })
}
