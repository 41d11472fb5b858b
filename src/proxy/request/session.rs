//! The request's session, in order: an id the client named (the headers,
//! then the body's sources: `session/extract.rs`), a Responses API
//! `previous_response_id` mapped to the session whose turn produced it,
//! and last the conversation recognised by its content
//! (`session/content/`), on routes with `session_affinity.content` on.

use crate::api::Api;
use crate::registry::Route;
use crate::request_view::RequestView;
use crate::session::content::{BlockSink, Recognised};
use crate::session::{session_from_body, SessionId, SessionSource};

/// A sink for the conversation's blocks when content may decide the
/// session: an LLM API, content on, and no id in the headers (the body's
/// own ids are known only once it is read, which is when the blocks are
/// gathered, so a body with an id pays for a sink it then drops).
pub fn sink_for(route: &Route, api: Option<Api>, named: bool) -> Option<BlockSink> {
    (api.is_some() && !named && route.config.balancing.content.is_some()).then(BlockSink::default)
}

/// The session of a request whose headers named none (`named` is what
/// they named), from its body's view and blocks; `remember`: the content
/// index keeps this request for the next turn (`/_route_inspect` peeks).
pub fn resolve(
    route: &Route,
    named: Option<SessionId>,
    view: Option<&RequestView>,
    sink: Option<BlockSink>,
    remember: bool,
) -> (Option<SessionId>, Option<Recognised>) {
    if named.is_some() {
        return (named, None);
    }
    let now = crate::clock::now_ms();
    match view.and_then(session_from_body) {
        Some(mut id) => {
            if id.source == SessionSource::BodyPreviousResponseId {
                // An id this route has not seen (another replica's, or
                // forgotten) stands for its own chain from here on.
                if let Some(session) = route.runtime.content.session_of_response(id.hash, now) {
                    id.hash = session;
                }
            }
            (Some(id), None)
        }
        None => {
            let blocks = sink.map(BlockSink::finish).unwrap_or_default();
            let index = &route.runtime.content;
            let found = if remember {
                index.recognise(&blocks, now)
            } else {
                index.peek(&blocks, now)
            };
            let id = found.map(|r| SessionId {
                hash: r.session,
                source: SessionSource::Content,
            });
            (id, found)
        }
    }
}
