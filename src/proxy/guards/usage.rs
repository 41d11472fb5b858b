//! Request rewrites that make the response observable: include_usage.

use crate::proxy::ctx::Admitted;
use crate::registry::Route;
use crate::stream::usage::inject_include_usage;
use bytes::Bytes;

/// Adds `stream_options.include_usage` to a streaming request that lacks it,
/// editing only the bytes needed; the usage frame is then the gateway's, not
/// the client's.
pub fn inject(route: &Route, req: &mut Admitted) {
    if let Some(rewritten) = req
        .json
        .as_ref()
        .and_then(|json| rewrite(route, &req.body, json))
    {
        req.body = rewritten;
        req.usage_injected = true;
    }
}

fn rewrite(route: &Route, body: &Bytes, json: &serde_json::Value) -> Option<Bytes> {
    if !route
        .runtime
        .toggles
        .include_usage
        .is_on(route.config.include_usage)
    {
        return None;
    }
    if json.get("stream") != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    inject_include_usage(body, json).map(Bytes::from)
}
