//! Request rewrites that make the response observable: include_usage.

use crate::proxy::ctx::Admitted;
use crate::proxy::request::pieces::RequestBody;
use crate::registry::Route;
use crate::request_view::RequestView;
use crate::rewrite::include_usage::{include_usage_at_top, include_usage_edit};
use crate::rewrite::splice;

/// `body` with `stream_options.include_usage` added, for a streaming
/// request that lacks it (in a body of several pieces, an edit spliced
/// between them, which are shared, not copied); `None` when the route does
/// not ask for it or nothing needs to change.
pub fn rewrite(route: &Route, body: &RequestBody, view: &RequestView) -> Option<RequestBody> {
    if !view.is_stream()
        || !route
            .runtime
            .toggles
            .include_usage
            .is_on(route.config.include_usage)
    {
        return None;
    }
    let view_of_body = view.stream.is_some_and(|v| body.holds(v.get().as_ptr()));
    let edit = match include_usage_at_top(body.first_piece(), view, view_of_body) {
        Some(edit) => edit,
        // The walk of the body's members reads it whole.
        None => include_usage_edit(&body.whole(), view)?,
    };
    match body.pieces() {
        // A body in one piece is most often one read (at most 64 KiB),
        // sent whole from the retry buffer: one new buffer costs less than
        // pieces joined again there.
        [one] => Some(RequestBody::one(splice(one, &mut [edit])?.into())),
        _ => body.spliced(&mut [edit]),
    }
}

/// Puts the rewritten body in place once the content guards passed; the
/// usage frame is then the gateway's, not the client's.
pub fn apply(req: &mut Admitted) {
    if let Some(body) = req.usage_rewrite.take() {
        req.body = body;
        req.usage_injected = true;
    }
}
