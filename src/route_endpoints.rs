//! Per-route endpoints on the main listener, `/<route>/_…`: dispatched by
//! `proxy/request/endpoints.rs`, and read by the admin listener's
//! dashboard too, which is why they live outside `proxy`.
//! The status endpoints report state and change nothing (`/_route_debug`
//! explains a placement without making it); the toggles and the limit
//! overrides (loopback only, checked by the caller) set the route's
//! runtime switches. No raw session id is ever echoed: only its hash.
//!
//! This file lists the endpoints and dispatches the reads; the answers are
//! `state.rs` (peers, options, sessions), `protection.rs` (429s, limits,
//! measurements) and `switches.rs` (the toggles and limit overrides).

use crate::registry::{Registry, Route};
use serde_json::{json, Value};

mod protection;
mod state;
mod switches;

use protection::{
    cluster_avg, measurement_status, rate_limit_json, reject_rules_status, status_429,
};
use state::{
    active_conns, health_status, route_debug, route_opts, route_state, session_status, sessions,
};
use switches::toggle_json;
pub use switches::{apply_limit_override, apply_toggle, limit_override_name, toggle_name};

pub const ENDPOINTS: &[&str] = &[
    "/_route_state",
    "/_health_status",
    "/_active_conns",
    "/_route_debug?sid=…",
    "/_sessions",
    "/_reject_rules_status",
    "/_ttft_status",
    "/_tps_status",
    "/_429_status[?all=1][&reset=1]",
    "/_rate_limit_status",
    "/_session_status",
    "/_route_opts",
    "/_cluster_avg",
    "POST /_route_inspect (a request body and headers: where it would go and why; GET: the headers alone, ?model= for a model pool)",
    "POST /_reject_rules_toggle?on=0|1|reset=1",
    "POST /_include_usage_toggle?on=0|1|reset=1",
    "POST /_postprocess_toggle?on=0|1|reset=1",
    "POST /_cch_strip_toggle?on=0|1|reset=1, /_kimi_normalize_toggle?on=0|1|reset=1",
    "POST /_ttft_toggle, /_ttft_429_toggle, /_tps_toggle, /_tps_429_toggle, /_rate_limit_toggle, /_session_prio_toggle ?on=0|1|reset=1",
    "POST /_ttft_limit?ms=N[&ttl=S]|reset=1, /_tps_limit?tps=N[&ttl=S]|reset=1",
];

/// What the route's prefix-stability transforms would change in `body`,
/// with the toggles in force: for `/_route_inspect`, which shows what the
/// gateway does to a body without sending it anywhere.
pub fn preview(route: &Route, body: &[u8]) -> Value {
    let t = &route.runtime.toggles;
    let c = &route.config;
    let mut out = crate::rewrite::preview(body, route.prefix_transforms());
    out["route"] = json!(c.name);
    out["cch_strip"] = toggle_json(&t.cch_strip, c.cch_strip);
    out["kimi_normalize"] = toggle_json(&t.kimi_normalize, c.kimi_normalize);
    out
}

/// The JSON for `path` (query included) under `route`, or None if unknown.
/// Keys whose values say where something runs: engine `host:port`s (in
/// `/_route_state` and `/_route_opts`), the body-log listener and its last
/// connect error (`/_bodylog_status`), a store URL.
// `dns` and `api`: where `peers_from` finds its engines;
// `service_account_dir`: where its credentials lie on the host;
// `tenants_file` (`/_tenants`): where the tenants file lies.
const ADDRESS_KEYS: [&str; 10] = [
    "address",
    "host",
    "port",
    "target",
    "last_error",
    "url",
    "dns",
    "api",
    "service_account_dir",
    "tenants_file",
];
/// `/_route_opts` options whose value is a file path.
const PATH_OPTIONS: [&str; 2] = ["api_keys_file", "engine_api_key_file"];

/// Replaces every address and file path in an endpoint's answer with
/// `"[redacted]"`, for callers not on this machine: they may see how a
/// route behaves (peers by name, load, sessions, limits), not where its
/// engines are or how the host is laid out.
pub fn redact_addresses(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let path_option = map
                .get("key")
                .and_then(Value::as_str)
                .is_some_and(|k| PATH_OPTIONS.contains(&k));
            for (key, v) in map.iter_mut() {
                let hides = ADDRESS_KEYS.contains(&key.as_str()) || (path_option && key == "value");
                if hides && !v.is_null() {
                    *v = Value::String("[redacted]".into());
                } else {
                    redact_addresses(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_addresses),
        _ => {}
    }
}

/// A read endpoint: its answer from the route, the registry and the query
/// string ("" when none).
pub type Read = fn(&Route, &Registry, &str) -> Value;

/// The methods every read endpoint serves, as a 405's `Allow` lists them.
pub const READ_METHODS: &str = "GET, HEAD";

/// The read endpoint at `path` (no query), or None when there is none.
/// Looked up before anything is computed, so that a caller can be refused
/// (a method it does not serve) without the endpoint having run: some
/// answers change state (`/_429_status?reset=1`).
pub fn read_endpoint(path: &str) -> Option<Read> {
    let read: Read = match path {
        "/_route_state" => |r, g, _| route_state(r, g),
        "/_health_status" => |r, g, _| health_status(r, g),
        "/_reject_rules_status" => |r, _, _| reject_rules_status(r),
        "/_active_conns" => |r, _, _| active_conns(r),
        "/_sessions" => |r, _, _| sessions(r),
        "/_route_debug" => |r, _, q| route_debug(r, q),
        "/_ttft_status" | "/_tps_status" => |r, g, _| measurement_status(r, g),
        "/_429_status" => status_429,
        "/_session_status" => |r, _, _| session_status(r),
        "/_route_opts" => |r, _, _| route_opts(r),
        "/_cluster_avg" => |r, _, _| cluster_avg(r),
        "/_rate_limit_status" => |r, g, _| {
            json!({
                "route": r.config.name,
                "rate_limit": rate_limit_json(r, g),
            })
        },
        _ => return None,
    };
    Some(read)
}

/// The answer of the read endpoint at `path_and_query`, if there is one.
pub fn respond(route: &Route, registry: &Registry, path_and_query: &str) -> Option<Value> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    read_endpoint(path).map(|read| read(route, registry, query))
}

#[cfg(test)]
mod tests {
    use super::state::percent_decode;
    use super::{preview, redact_addresses, respond, ENDPOINTS};
    use crate::config::{GatewayConfig, Overrides};
    use crate::registry::Registry;

    /// A registry with one route `chat` whose file ends with `extra`.
    fn registry(dir: &std::path::Path, extra: &str) -> Registry {
        std::fs::write(
            dir.join("chat.yaml"),
            format!("peers:\n  - {{name: a, host: 127.0.0.1, port: 9}}\n{extra}"),
        )
        .unwrap();
        let overrides = Overrides {
            routes_dir: Some(dir.to_path_buf()),
            ..Overrides::default()
        };
        let gw =
            GatewayConfig::parse(std::path::Path::new("gateway.yaml"), "", &overrides).unwrap();
        let registry = Registry::new(gw);
        registry.reload();
        registry
    }

    #[test]
    fn preview_follows_options_and_toggles() {
        let dir = tempfile::tempdir().unwrap();
        let body = br#"{"messages":[{"role":"system","content":"x-anthropic-billing-header: cc_version=1; cch=ab12;"},{"role":"assistant","tool_calls":[{"id":"functions.f:3"}]}]}"#;
        let reg = registry(dir.path(), "cch_strip: true\n");
        let route = reg.route("chat").unwrap();
        let p = preview(&route, body);
        assert_eq!(p["route"], "chat");
        assert_eq!(p["changed"], true);
        assert_eq!(p["cch_strip"]["on"], true);
        assert_eq!(p["cch_stripped"]["removed"], " cch=ab12;");
        assert_eq!(p["kimi_normalize"]["on"], false);
        assert_eq!(p["kimi_ids_renumbered"], 0, "kimi_normalize is off");
        // The runtime toggles decide, both ways.
        route.runtime.toggles.cch_strip.set(false);
        route.runtime.toggles.kimi_normalize.set(true);
        let p = preview(&route, body);
        assert_eq!(p["cch_stripped"], serde_json::Value::Null);
        assert_eq!(p["kimi_ids_renumbered"], 1);
        assert_eq!(p["kimi_renamed"][0]["to"], "functions.f:0");
        assert_eq!(p["kimi_normalize"]["source"], "runtime");
    }

    #[test]
    fn no_endpoint_answer_shows_an_address_or_a_key_path_once_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("secret-keys");
        std::fs::write(&keys, "k:o\n").unwrap();
        let extra = format!(
            "  - {{name: b, host: 10.9.8.7, port: 9123}}\napi_keys_file: {}\n\
             peers_from: {{kubernetes: {{namespace: n, selector: s, port: 1, \
             api: \"https://10.9.8.7:9123\", service_account_dir: /secret-kube}}}}\n",
            keys.display()
        );
        let reg = registry(dir.path(), &extra);
        let route = reg.route("chat").unwrap();
        let gets: Vec<&str> = ENDPOINTS
            .iter()
            .filter(|e| !e.starts_with("POST"))
            .map(|e| e.split(['[', '?']).next().unwrap())
            .collect();
        assert!(gets.len() >= 12, "{gets:?}");
        for path in gets {
            let mut v = respond(&route, &reg, path).unwrap_or_else(|| panic!("{path}"));
            let before = v.to_string();
            redact_addresses(&mut v);
            let after = v.to_string();
            for secret in ["10.9.8.7", "9123", "secret-keys", "secret-kube"] {
                assert!(!after.contains(secret), "{path} shows {secret}: {after}");
            }
            if path == "/_route_state" || path == "/_route_opts" {
                // Control: there was something to hide, and names stay.
                assert!(before.contains("10.9.8.7"), "{path}: {before}");
                if path == "/_route_opts" {
                    assert!(before.contains("secret-kube"), "{path}: {before}");
                }
                assert!(after.contains("\"b\""), "{path}: {after}");
            }
        }
    }

    #[test]
    fn decodes_percent_and_plus() {
        assert_eq!(percent_decode("a%20b+c"), b"a b c");
        assert_eq!(percent_decode("%zz%4"), b"%zz%4");
        assert_eq!(percent_decode("%41"), b"A");
    }
}
