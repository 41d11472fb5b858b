//! Request rewrites that make the response observable: include_usage.

use crate::proxy::ctx::Admitted;
use crate::registry::Route;
use crate::request_view::RequestView;
use crate::stream::usage::inject_include_usage;
use bytes::Bytes;

/// `body` with `stream_options.include_usage` added, for a streaming
/// request that lacks it (editing only the bytes needed); `None` when the
/// route does not ask for it or nothing needs to change.
pub fn rewrite(route: &Route, body: &Bytes, view: &RequestView) -> Option<Bytes> {
    if !route
        .runtime
        .toggles
        .include_usage
        .is_on(route.config.include_usage)
    {
        return None;
    }
    inject_include_usage(body, view).map(Bytes::from)
}

/// Puts the rewritten body in place once the content guards passed; the
/// usage frame is then the gateway's, not the client's.
pub fn apply(req: &mut Admitted) {
    if let Some(body) = req.usage_rewrite.take() {
        req.body = body;
        req.usage_injected = true;
    }
}
