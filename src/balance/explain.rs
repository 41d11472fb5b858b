//! `/_route_debug`: the placement a session would get and why, computed by
//! the same rules as a real request, changing nothing.

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
