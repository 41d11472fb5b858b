//! The request's session, in order: an id the client named (the headers,
//! then the body's sources: `session/extract.rs`), a Responses API
//! `previous_response_id` mapped to the session whose turn produced it,
//! and last the conversation recognised by its content
//! (`session/content/`), on routes with `session_affinity.content` on.

use crate::api::Api;
use crate::proxy::ctx::Admitted;
use crate::registry::Route;
use crate::request_view::RequestView;
use crate::session::content::{BlockSink, Recognised};
use crate::session::{session_from_body, SessionId, SessionSource};
use crate::store::SessionStore;

/// A sink for the conversation's blocks when content may decide the
/// session: an LLM API, content on, and no id in the headers (the body's
/// own ids are known only once it is read, which is when the blocks are
/// gathered, so a body with an id pays for a sink it then drops).
pub fn sink_for(route: &Route, api: Option<Api>, named: bool) -> Option<BlockSink> {
    (api.is_some() && !named && route.config.balancing.content.is_some()).then(BlockSink::default)
}

/// The session the client named: in the headers (`named`), else in the
/// body's sources (a `previous_response_id` still the response id's hash:
/// [`settle`] maps it).
pub fn named(named: Option<SessionId>, view: Option<&RequestView>) -> Option<SessionId> {
    named.or_else(|| view.and_then(session_from_body))
}

/// What the session still needs once the body is read: a response id
/// mapped to the session it answered, or the conversation recognised by
/// content; each asks the shared store when this replica does not know.
pub async fn settle(route: &Route, store: &SessionStore, req: &mut Admitted) {
    previous_response(route, store, req).await;
    by_content(route, store, req).await;
}

/// A `previous_response_id`: the session whose turn that response
/// answered, from this replica's memory, else from the one another
/// replica wrote. One nobody knows (forgotten, or a client's own id)
/// stands for its own chain from here on.
async fn previous_response(route: &Route, store: &SessionStore, req: &mut Admitted) {
    let Some(id) = req.session.as_mut() else {
        return;
    };
    if id.source != SessionSource::BodyPreviousResponseId {
        return;
    }
    if let Some(session) = known_response(route, id.hash) {
        id.hash = session;
        return;
    }
    let Some(redis) = store.redis() else {
        return;
    };
    if let Some(Some(session)) = redis.response_get(route.name(), id.hash).await {
        let index = &route.runtime.content;
        index.remember_response(id.hash, session, crate::clock::now_ms());
        id.hash = session;
    }
}

/// The session this replica saw answered by `response` (a response id's
/// hash).
pub fn known_response(route: &Route, response: u64) -> Option<u64> {
    let now = crate::clock::now_ms();
    route.runtime.content.session_of_response(response, now)
}

/// A request that named no session: the conversation its blocks continue,
/// asking the other replicas (through the shared store, bounded by its
/// timeout) when this one knows nothing near its end, and telling them
/// where the conversation now ends.
async fn by_content(route: &Route, store: &SessionStore, req: &mut Admitted) {
    let Some(blocks) = req.blocks.take() else {
        return;
    };
    let index = &route.runtime.content;
    let redis = store
        .redis()
        .filter(|_| route.config.balancing.content.is_some());
    if let Some(redis) = redis {
        if let Some(near) = index.missing_near(&blocks, crate::clock::now_ms()) {
            if let Some(found) = redis.content_get(route.name(), &near).await {
                let now = crate::clock::now_ms();
                for (&(node, _), value) in near.iter().zip(found) {
                    if let Some((session, depth, stem)) = value {
                        index.adopt(node, depth, session, stem, now);
                    }
                }
            }
        }
    }
    let Some(found) = index.recognise(&blocks, crate::clock::now_ms()) else {
        return;
    };
    req.session = Some(SessionId {
        hash: found.session,
        source: SessionSource::Content,
    });
    req.content = Some(found);
    if let Some(redis) = redis {
        let mut nodes = vec![(found.tip.0, found.session, found.tip.1, false)];
        if let Some((stem, depth)) = found.stem {
            nodes.push((stem, found.session, depth, true));
        }
        // Written before the request goes on (one round trip, bounded by
        // the store's timeout), so that the next turn finds it on any
        // replica however soon it comes: a write spawned off the path
        // could lose that race to a fast engine.
        let ttl = route.config.balancing.idle_timeout;
        redis.content_put(route.name(), &nodes, ttl).await;
    }
}

/// What [`by_content`] would find from this replica's index alone,
/// remembering nothing (`/_route_inspect`).
pub fn peek(route: &Route, sink: Option<BlockSink>) -> Option<Recognised> {
    let blocks = sink?.finish();
    route.runtime.content.peek(&blocks, crate::clock::now_ms())
}
