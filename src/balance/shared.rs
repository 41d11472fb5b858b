//! Placement agreed across gateway replicas through the shared session
//! store (`store/`): before a `load_aware` request is placed, the local
//! table is brought in line with the binding Redis holds (or a first
//! placement is claimed there, set-if-absent); after it is placed, a move
//! is written compare-and-set and a sticky turn refreshes the key's TTL.
//! With `session_store: local`, or no session id, both are no-ops.

use super::sync::{adopt, local_binding};
use super::{candidates, peer_loads, rule_view};
use crate::config::Mode;
use crate::placement::{Placement, PlacementKind};
use crate::registry::Route;
use crate::session::SessionId;
use crate::store::binding::{Claim, StoredBinding};
use crate::store::{Cas, SessionStore};
use std::collections::HashMap;
use std::sync::Arc;

/// What the agreement before placement saw, for the write after it.
#[derive(Debug, Default)]
pub struct Agreement {
    /// The peer (`host:port`) the session was on, as agreed.
    prior: Option<String>,
    /// A first placement this replica claimed in Redis.
    claimed: Option<String>,
    /// Redis did not answer: the placement is written back when it does.
    offline: bool,
    active: bool,
}

/// [`place_or_wait`](super::place_or_wait), agreed with the other replicas
/// before and after when the route shares its sessions.
pub async fn place_agreed(
    route: &Arc<Route>,
    store: &Arc<SessionStore>,
    demand: &super::Demand<'_>,
) -> Result<super::Granted, super::Refused> {
    // The local store (the default) agrees with nobody: no clock read, no
    // agreement, straight to the table.
    if store.redis().is_none() {
        return super::place_or_wait(route, demand).await;
    }
    let waited = std::time::Instant::now();
    let agreement = agree_before(route, store, demand).await;
    if agreement.active {
        crate::metrics::metrics()
            .session_store_wait
            .with_label_values(&[route.name()])
            .observe(waited.elapsed().as_secs_f64());
    }
    let mut outcome = super::place_or_wait(route, demand).await;
    if let Ok(granted) = &mut outcome {
        let first_turn = agree_after(
            route,
            store,
            agreement,
            demand.session,
            &mut granted.placed.placement,
        );
        if first_turn {
            // The table took the claim as a binding before placing, so the
            // turn looked warm there: it is cold all the same (two
            // replicas on Redis counted no first turn as prefill ahead).
            super::count_cold(&mut granted.placed, demand);
        }
    }
    outcome
}

/// Brings the local table in line with the shared binding of the demand's
/// session (waiting at most the store's timeout).
async fn agree_before(
    route: &Arc<Route>,
    store: &SessionStore,
    demand: &super::Demand<'_>,
) -> Agreement {
    let (pool, session, tokens) = (demand.pool, demand.session, demand.tokens);
    let (Some(redis), Some(sid), Mode::LoadAware) =
        (store.redis(), session, route.config.balancing.mode)
    else {
        return Agreement::default();
    };
    let sid = sid.hash;
    let name: Arc<str> = Arc::from(route.name());
    let now = crate::clock::now_ms();
    let local = || local_binding(route, sid, now);
    if redis.recently_synced(&name, sid, now) {
        return Agreement {
            prior: local().map(|b| b.peer),
            active: true,
            ..Agreement::default()
        };
    }
    let ttl = route.config.balancing.idle_timeout;
    let offline = Agreement {
        offline: true,
        active: true,
        prior: local().map(|b| b.peer),
        ..Agreement::default()
    };
    let kept = redis.claims_kept_ms();
    let read = match kept {
        Some(kept) => {
            redis
                .get_or_claims(&name, sid, now.saturating_sub(kept))
                .await
        }
        None => redis.get(&name, sid).await.map(|b| (b, Vec::new())),
    };
    let Ok((stored, claims)) = read else {
        return offline;
    };
    let mut agreement = Agreement {
        active: true,
        ..Agreement::default()
    };
    match stored {
        Some(b) => {
            adopt(route, sid, &b, tokens, now);
            agreement.prior = Some(b.peer);
        }
        None => {
            if let Some(kept) = kept {
                note_claims(route, &redis.replica, &claims, now + kept);
            }
            // Known here (placed while Redis was away, or its key expired
            // first): this replica's binding, unless another wrote one.
            let (mine, first) = match local() {
                Some(known) => (known, false),
                None => match first_placement(route, pool, sid, now) {
                    Some(placed) => (placed, true),
                    None => return agreement,
                },
            };
            let written = if first && kept.is_some() {
                let claim = Claim {
                    replica: redis.replica.clone(),
                    peer: mine.peer.clone(),
                    tokens,
                };
                redis.claim(&name, sid, &mine, ttl, &claim, now).await
            } else {
                redis.set_if_absent(&name, sid, &mine, ttl).await
            };
            match written {
                Ok(None) => {
                    // The claim is the placement: the local table takes it
                    // now, so a concurrent local decision cannot differ.
                    if route.runtime.sessions.is_bound(sid, now) {
                        agreement.prior = Some(mine.peer.clone());
                    } else {
                        adopt(route, sid, &mine, tokens, now);
                    }
                    agreement.claimed = Some(mine.peer);
                }
                Ok(Some(winner)) => {
                    adopt(route, sid, &winner, tokens, now);
                    agreement.prior = Some(winner.peer);
                }
                Err(()) => return offline,
            }
        }
    }
    redis.mark_synced(&name, sid, now);
    agreement
}

/// The first turns the other replicas claimed lately, as prefill ahead on
/// their engines until `until_ms`: sessions that start at one moment on
/// several replicas spread as on one, where each replica alone would put
/// its own on the engine its last sync left least loaded, the same one.
fn note_claims(route: &Route, me: &str, claims: &[Claim], until_ms: u64) {
    let mut claimed: HashMap<&str, (u32, u64)> = HashMap::new();
    for c in claims.iter().filter(|c| c.replica != me) {
        let (requests, tokens) = claimed.entry(c.peer.as_str()).or_default();
        *requests += 1;
        *tokens += c.tokens;
    }
    for p in &route.peers {
        let (requests, tokens) = claimed
            .get(p.state.address.as_str())
            .copied()
            .unwrap_or_default();
        p.state.note_remote_claims(requests, tokens, until_ms);
    }
}

/// Where the local rules would put a session seen for the first time.
fn first_placement(route: &Route, pool: &[usize], sid: u64, now: u64) -> Option<StoredBinding> {
    let cands = candidates(route, pool, now);
    let loads = peer_loads(route, &rule_view(route, pool, &cands, now), now);
    let (placement, _) = route.runtime.sessions.peek(sid, &loads, now)?;
    if placement.kind != PlacementKind::New {
        return None;
    }
    let (_, p) = route.peer_by_id(placement.peer)?;
    Some(StoredBinding {
        peer: p.state.address.clone(),
        bound_at_ms: now,
        moved_at_ms: 0,
        last_seen_ms: now,
    })
}

/// A first turn this replica claimed in Redis is placed by the table as if
/// the session were bound to the claimed engine: kept there it looks like a
/// sticky (warm) turn, sent elsewhere like a spill. Either way it is the
/// session's first turn: its kind is new (and a write replaces the claim,
/// not nothing: a set-if-absent against its own claim failed, the binding
/// stayed on the claimed engine, and the next turn through another replica
/// went there cold; two replicas on the skewed replay, 12 such turns a
/// run). The flag: its prompt is not yet counted as cold prefill (it
/// looked warm).
fn first_turn(
    kind: PlacementKind,
    claimed: bool,
    claimed_here: bool,
) -> Option<(PlacementKind, bool)> {
    match kind {
        _ if !claimed => None,
        PlacementKind::Sticky if claimed_here => Some((PlacementKind::New, true)),
        PlacementKind::Spill | PlacementKind::Migrated => Some((PlacementKind::New, false)),
        _ => None,
    }
}

/// Writes what the placement changed, off the request path: a move as a
/// compare-and-set on the agreed peer, a first placement that differs from
/// the one claimed, a sticky turn's TTL refresh when it is due. True when
/// its prompt is still to be counted as cold: the session's first turn,
/// claimed here and kept on the claim (its kind set back to new).
fn agree_after(
    route: &Arc<Route>,
    store: &Arc<SessionStore>,
    agreement: Agreement,
    session: Option<&SessionId>,
    placement: &mut Placement,
) -> bool {
    let (true, Some(redis), Some(sid)) = (agreement.active, store.redis(), session) else {
        return false;
    };
    let sid = sid.hash;
    let name: Arc<str> = Arc::from(route.name());
    if agreement.offline {
        if matches!(
            placement.kind,
            PlacementKind::New | PlacementKind::Spill | PlacementKind::Migrated
        ) {
            redis.mark_dirty(&name, sid);
        }
        return false;
    }
    let now = crate::clock::now_ms();
    let Some(placed) = route
        .peer_by_id(placement.peer)
        .map(|(_, p)| p.state.address.clone())
    else {
        return false;
    };
    let ttl = route.config.balancing.idle_timeout;
    let claimed_here = agreement.claimed.as_deref() == Some(placed.as_str());
    let claimed = agreement.claimed.is_some() && agreement.prior.is_none();
    if let Some((kind, uncounted)) = first_turn(placement.kind, claimed, claimed_here) {
        placement.kind = kind;
        if uncounted {
            return true;
        }
    }
    let expected = match placement.kind {
        PlacementKind::New if claimed_here => return false,
        // A session let go by an engine over its KV comes back new: for the
        // cluster that is a move from where it was bound.
        PlacementKind::New if agreement.prior.is_some() => agreement.prior.clone(),
        PlacementKind::New => agreement.claimed.clone(),
        PlacementKind::Spill | PlacementKind::Migrated => agreement.prior.clone(),
        PlacementKind::Sticky => {
            if redis.ttl_refresh_due(&name, sid, ttl, now) {
                let (store, name) = (Arc::clone(store), Arc::clone(&name));
                tokio::spawn(async move {
                    if let Some(redis) = store.redis() {
                        redis.refresh_ttl(&name, sid, ttl).await;
                    }
                });
            }
            return false;
        }
        _ => return false,
    };
    let Some(binding) = local_binding(route, sid, now) else {
        return false;
    };
    let (route, store) = (Arc::clone(route), Arc::clone(store));
    tokio::spawn(async move {
        let Some(redis) = store.redis() else {
            return;
        };
        let result = match &expected {
            Some(expected) => {
                redis
                    .compare_and_set(&name, sid, expected, &binding, ttl)
                    .await
            }
            None => redis
                .set_if_absent(&name, sid, &binding, ttl)
                .await
                .map(|won| match won {
                    None => Cas::Moved,
                    Some(other) => Cas::Kept(Some(other)),
                }),
        };
        let now = crate::clock::now_ms();
        match result {
            Ok(Cas::Moved) => redis.mark_synced(&name, sid, now),
            // Another replica moved it first: follow it from the next turn.
            Ok(Cas::Kept(Some(current))) => {
                adopt(&route, sid, &current, 0, now);
                redis.mark_synced(&name, sid, now);
            }
            Ok(Cas::Kept(None)) => {}
            Err(()) => redis.mark_dirty(&name, sid),
        }
    });
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_first_turn_is_new_wherever_the_table_put_it_with_controls() {
        // Kept on the claim: new, and its prompt still to count as cold.
        assert_eq!(
            first_turn(PlacementKind::Sticky, true, true),
            Some((PlacementKind::New, true))
        );
        // Sent elsewhere: new (the write replaces the claim), counted cold
        // already as a spill.
        for moved in [PlacementKind::Spill, PlacementKind::Migrated] {
            assert_eq!(
                first_turn(moved, true, false),
                Some((PlacementKind::New, false))
            );
        }
        // Controls: a session agreed before (no claim) keeps its kind, a
        // spill for a spill and a sticky turn for a sticky one.
        assert_eq!(first_turn(PlacementKind::Spill, false, false), None);
        assert_eq!(first_turn(PlacementKind::Sticky, false, true), None);
        // An overflow of a claimed first turn is left alone, as a warm
        // turn's is: the binding stays where it was claimed.
        assert_eq!(first_turn(PlacementKind::Overflow, true, false), None);
    }
}
