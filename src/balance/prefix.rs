//! Templates shared by many conversations (a system prompt with its
//! documents, a few-shot block): which engines were sent one lately, so
//! that a new conversation starting with it is priced there without that
//! prefix's prefill (`placement::model`), rather than placed by load alone.
//! A template that grows hot spreads by the same comparison: once its
//! engines' queues outweigh the prefill it saves, the next newcomer goes
//! elsewhere cold, and that engine holds it too.

use crate::placement::Prefix;
use crate::registry::Route;
use crate::session::content::{How, Recognised};

/// Cold tokens an engine of unknown KV capacity may take in after a
/// prefix before the prefix is taken to be evicted: half of what a mid-size
/// model's KV holds on one GPU.
const RETENTION_UNKNOWN_KV: u64 = 200_000;

/// The request's shared prefix and the engines that still hold it: sent
/// there, and since then fewer cold tokens taken in than half the engine's
/// KV (the rest holds the sequences running there), which LRU would have
/// evicted it for; and a fork's parent's engine, which has held their
/// shared history since before anyone knew it would be shared.
pub fn prefix_for(route: &Route, content: Option<&Recognised>) -> Option<Prefix> {
    let content = content?;
    let template = content.template?;
    let holders = route.runtime.content.holders(template.node);
    let still_cached = holders.iter().filter_map(|h| {
        let (_, peer) = route.peer_by_id(h.peer)?;
        let retention = super::kv_capacity(peer).map_or(RETENTION_UNKNOWN_KV, |(cap, _)| cap / 2);
        let taken_in = peer.state.intake().saturating_sub(h.mark);
        (taken_in < retention).then_some(h.peer)
    });
    let parents_engine = match content.how {
        How::Forked { parent } => route
            .runtime
            .sessions
            .binding_of(parent, crate::clock::now_ms())
            .map(|(peer, _)| peer),
        _ => None,
    };
    Some(Prefix::new(
        template.tokens,
        parents_engine.into_iter().chain(still_cached),
    ))
}

/// The request went to `peer` (a peer id of the route): it holds the
/// request's template now.
pub fn sent(route: &Route, content: Option<&Recognised>, peer: u32) {
    let (Some(template), Some((_, p))) = (content.and_then(|c| c.template), route.peer_by_id(peer))
    else {
        return;
    };
    let now = crate::clock::now_ms();
    route
        .runtime
        .content
        .hold(template.node, peer, p.state.intake(), now);
}
