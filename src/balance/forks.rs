//! A conversation that branches off another (a sub-agent handed its
//! parent's history, an edited turn) starts next to its parent, where
//! the prefix they share is cached.

use crate::config::Mode;
use crate::registry::Route;
use crate::session::content::{How, Recognised};
use crate::session::SessionId;

/// Binds a fork, before its first placement, to the peer its parent is
/// bound to, so the placement rules treat it as they treat the parent's
/// next turn: it stays there unless that peer is backed up or the fork
/// does not fit its KV, and then it goes where it fits. Only in
/// `load_aware` mode, whose table this is; a fork of a parent no longer
/// bound is placed as any new session.
pub fn start_near_parent(route: &Route, session: Option<&SessionId>, content: Option<&Recognised>) {
    let (Some(sid), Some(How::Forked { parent })) = (session, content.map(|c| c.how)) else {
        return;
    };
    if route.config.balancing.mode != Mode::LoadAware {
        return;
    }
    let now = crate::clock::now_ms();
    let table = &route.runtime.sessions;
    if table.is_bound(sid.hash, now) {
        return;
    }
    if let Some((peer, _)) = table.binding_of(parent, now) {
        table.adopt(sid.hash, peer, None, now);
    }
}
