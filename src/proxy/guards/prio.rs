//! Session turn priority as the proxy applies it: which bucket a request's
//! turn falls in (from `x-phanrouter-session`), when the route has the
//! feature on. With it off nothing is read and every path is unchanged.

use crate::protect::prio::{bucket_of, parse_header, HEADER};
use crate::protect::route::TurnBucket;
use crate::registry::Route;
use pingora::proxy::Session;

/// The request's bucket, or `None` when session priority is off for the
/// route (or the request is no LLM request).
pub fn turn_of(route: &Route, session: &Session, llm: bool) -> Option<TurnBucket> {
    let prio = &route.config.protection.session_prio;
    if !llm || !route.runtime.toggles.session_prio.is_on(prio.enabled) {
        return None;
    }
    let header = session
        .req_header()
        .headers
        .get(HEADER)
        .map(|v| v.as_bytes());
    let turn = parse_header(header);
    let now = crate::clock::now_ms();
    if let Some((unusable, total)) =
        route
            .runtime
            .protection
            .count_turn_header(turn, now, prio.warn_frac)
    {
        log::warn!(
            "route {}: {unusable} of {total} requests this minute had no usable {HEADER} header (session_prio_warn_frac {}); they are treated as fully warm",
            route.name(),
            prio.warn_frac
        );
    }
    let bucket = bucket_of(&prio.table, turn);
    let share = prio.table.get(bucket).map_or(1.0, |b| b.share);
    Some(TurnBucket {
        turn,
        bucket,
        share,
    })
}
