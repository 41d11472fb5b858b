//! The request body's rewrites, in the order the hook runs them, after the
//! content guards (which judge the body the client sent):
//!
//! - include_usage: `stream_options.include_usage` added to a streaming
//!   request the route asks it for, so the stream reports its usage. The
//!   edit is worked out when the body is read, from its first view
//!   ([`with_include_usage`]), and put in place by [`include_usage`].
//! - the prefix-stability transforms (`cch_strip`, `kimi_normalize`) as the
//!   route's options and toggles allow ([`prefix_transforms`]).
//!
//! Both land on the one body the engine receives: include_usage edits the
//! top-level object, the transforms edit strings inside `system` /
//! `messages`, so running them on include_usage's output touches disjoint
//! bytes. The edits themselves are pure, in `crate::rewrite`.

use crate::metrics::metrics;
use crate::proxy::ctx::Admitted;
use crate::proxy::request::pieces::RequestBody;
use crate::registry::Route;
use crate::request_view::RequestView;
use crate::rewrite::include_usage::{include_usage_at_top, include_usage_edit};
use crate::rewrite::{self, splice};
use bytes::Bytes;

/// `body` with `stream_options.include_usage` added, for a streaming
/// request that lacks it (in a body of several pieces, an edit spliced
/// between them, which are shared, not copied); `None` when the route does
/// not ask for it or nothing needs to change.
pub fn with_include_usage(
    route: &Route,
    body: &RequestBody,
    view: &RequestView,
) -> Option<RequestBody> {
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
pub fn include_usage(req: &mut Admitted) {
    if let Some(body) = req.usage_rewrite.take() {
        req.body = body;
        req.usage_injected = true;
    }
}

/// Rewrites `req.body` in place when a transform applies, and records what
/// changed. A body the transforms cannot read or edit safely goes on as it
/// is: these are cache optimisations, never a reason to refuse a request.
pub fn prefix_transforms(route: &Route, req: &mut Admitted) {
    let opts = route.prefix_transforms();
    // Any JSON body, not only the LLM endpoints the gateway parses: an
    // Anthropic-shaped `/v1/messages` carries the billing line too.
    if !opts.any() || req.body.is_empty() {
        return;
    }
    let Some(out) = rewrite::apply(&req.body.whole(), opts) else {
        return;
    };
    req.body = RequestBody::one(Bytes::from(out.body));
    req.cch_stripped = out.report.cch.is_some();
    req.kimi_ids_renumbered = out.report.kimi_ids_renumbered;
    let count = |transform: &str| {
        metrics()
            .prefix_rewrites
            .with_label_values(&[route.name(), transform])
            .inc();
    };
    if req.cch_stripped {
        count("cch_strip");
    }
    if req.kimi_ids_renumbered > 0 {
        count("kimi_normalize");
    }
}
