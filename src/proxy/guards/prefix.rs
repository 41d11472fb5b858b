//! Prefix-stability transforms (`cch_strip`, `kimi_normalize`) as the
//! route's options and toggles allow.
//!
//! Applied after the content guards, which judge the body the client sent,
//! and after include_usage, so both rewrites land on the one body the engine
//! receives: include_usage edits the top-level object (and is computed from
//! the body's first view), these edit strings inside `system` / `messages`,
//! so running them on include_usage's output touches disjoint bytes.

use crate::metrics::metrics;
use crate::proxy::ctx::Admitted;
use crate::proxy::request::pieces::RequestBody;
use crate::registry::Route;
use crate::rewrite;
use bytes::Bytes;

/// Rewrites `req.body` in place when a transform applies, and records what
/// changed. A body the transforms cannot read or edit safely goes on as it
/// is: these are cache optimisations, never a reason to refuse a request.
pub fn apply(route: &Route, req: &mut Admitted) {
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
