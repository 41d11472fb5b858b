//! The catalog of every route option: key, label, group, kind, default and
//! description, and the value a loaded route runs with. `/_route_opts`
//! serves it; the book's option reference (docs/src/configuration/route-options.md)
//! is generated from it (and a test fails when either drifts); another test fails when a literal default
//! here is not what the parser applies. Engine internals (windows, EWMA and
//! probe allowances, the fine print of session priority) are `hidden`:
//! still settable, served under `advanced` rather than offered first.

use super::file::FORMER_KEYS;
use super::route::RouteConfig;
use serde_json::{json, Value};
use std::time::Duration;

/// What kind of value an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Integer,
    Number,
    Duration,
    Size,
    Text,
    Choice(&'static [&'static str]),
    Map,
    List,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Integer => "integer",
            Kind::Number => "number",
            Kind::Duration => "duration",
            Kind::Size => "size",
            Kind::Text => "text",
            Kind::Choice(_) => "choice",
            Kind::Map => "map",
            Kind::List => "list",
        }
    }
}

/// An option's default: a literal as a route file would write it (the
/// drift test writes exactly this and compares), or a note for one that is
/// absent or derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionDefault {
    Literal(&'static str),
    Note(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub struct RouteOption {
    /// As written in the route file; dotted for nested keys, `peers[].x`
    /// for a field of each peer.
    pub key: &'static str,
    pub label: &'static str,
    pub group: &'static str,
    pub kind: Kind,
    pub default: OptionDefault,
    pub description: &'static str,
    pub hidden: bool,
}

const fn opt(
    key: &'static str,
    label: &'static str,
    group: &'static str,
    kind: Kind,
    default: OptionDefault,
    description: &'static str,
) -> RouteOption {
    RouteOption {
        key,
        label,
        group,
        kind,
        default,
        description,
        hidden: false,
    }
}

const fn hidden(o: RouteOption) -> RouteOption {
    RouteOption { hidden: true, ..o }
}

use OptionDefault::{Literal as L, Note as N};

pub const ROUTE_OPTIONS: &[RouteOption] = &[
    opt("peers", "Peers", "peers", Kind::List, N("none"), "the engines: {name, host, port}; with none (and no peers_from) the route loads with a warning and answers 503 until a reload gives it some"),
    opt("peers[].priority", "Tier", "peers", Kind::Integer, L("0"), "lower is preferred; a higher tier takes traffic only when the lower one is down"),
    opt("peers[].max_concurrency", "Max concurrency", "peers", Kind::Integer, L("64"), "requests in flight to this peer at most; unset, a llama.cpp engine's own slots (its /props total_slots) when it says, else 64"),
    hidden(opt("peers[].probe_path", "Probe path", "peers", Kind::Text, N("health.probe_path"), "this peer's own health probe path")),
    hidden(opt("peers[].kv_capacity_tokens", "KV capacity", "peers", Kind::Integer, N("from the engine's metrics"), "KV capacity in tokens for KV-aware admission")),
    opt("peers[].tls", "TLS to the engine", "peers", Kind::Map, N("plain HTTP"), "{sni, ca_file, client_cert, client_key, verify: true}: requests, probes and scrapes over TLS with this name, CA and client certificate; a build without the tls feature refuses it"),
    opt("peers_from", "Discovered peers", "peers", Kind::Map, N("none"), "{dns: name, port} or {kubernetes: {namespace, selector, port}}: a peer per address or ready endpoint, found while running; takes the peers[] settings"),
    opt("peers_by_model", "Model pools", "peers", Kind::Map, N("one pool"), "{model: [peer names]}: a pool per model"),
    opt("max_body_size", "Max body size", "requests", Kind::Size, L("10m"), "larger request bodies get a 413"),
    opt("balancing.mode", "Balancing mode", "balancing", Kind::Choice(&["load_aware", "hash", "least_conn", "round_robin"]), L("load_aware"), "how a peer is chosen"),
    opt("balancing.session_affinity.headers", "Session headers", "balancing", Kind::List, N("none"), "extra headers that carry a session id, checked first"),
    opt("balancing.session_affinity.idle_timeout", "Session idle timeout", "balancing", Kind::Duration, L("30m"), "a session unseen this long is forgotten (1m .. 24h)"),
    opt("balancing.session_affinity.content", "Recognise conversations by content", "balancing", Kind::Bool, L("on"), "a request with no session id joins the conversation its history continues (load_aware and hash modes)"),
    hidden(opt("balancing.session_affinity.content.template_fanout", "Template fan-out", "balancing", Kind::Integer, L("4"), "continuations after which a shared prefix (system prompt, template) links no conversation; 0: never")),
    hidden(opt("balancing.session_affinity.content.max_blocks", "Content index cap", "balancing", Kind::Integer, L("500000"), "blocks the route remembers at most (~40 bytes each)")),
    hidden(opt("balancing.session_affinity.live_window", "Live window", "balancing", Kind::Duration, L("10s"), "longest a session counts as holding KV on its engine after an answer; shorter when its clients think less (twice their 90th-percentile gap)")),
    opt("balancing.cross_tier_fallback", "Cross-tier fallback", "balancing", Kind::Bool, L("false"), "spill to a higher tier when the primary tier is full, not only when it is down"),
    opt("health.enabled", "Health checks", "health", Kind::Bool, L("true"), "probe each peer"),
    opt("health.interval", "Probe interval", "health", Kind::Duration, L("5s"), "time between probes"),
    opt("health.ban_ttl", "Ban TTL", "health", Kind::Duration, L("30s"), "a failed peer stays banned this long"),
    opt("health.probe_path", "Probe path", "health", Kind::Text, L("/health"), "path probed on each peer"),
    hidden(opt("health.timeout", "Probe timeout", "health", Kind::Duration, L("2s"), "a probe slower than this counts as busy, not down")),
    hidden(opt("engine_metrics.interval", "Engine scrape interval", "engine", Kind::Duration, L("1s"), "how often each engine's /metrics is read (engine_metrics: false turns scraping off)")),
    hidden(opt("engine_metrics.kv_full_threshold", "KV full threshold", "engine", Kind::Number, L("0.98"), "KV usage at which an engine counts as full")),
    hidden(opt("engine_metrics.path", "Engine metrics path", "engine", Kind::Text, L("/metrics"), "the engines' Prometheus path")),
    opt("timeouts.connect", "Connect timeout", "timeouts", Kind::Duration, L("5s"), "connecting to a peer"),
    opt("timeouts.read", "Read timeout", "timeouts", Kind::Duration, L("600s"), "between bytes from a peer, the response head included; enforced within a quarter of it"),
    hidden(opt("timeouts.idle", "Upstream idle timeout", "timeouts", Kind::Duration, L("60s"), "an idle pooled upstream connection is closed after this")),
    opt("routed_headers", "X-Routed headers", "responses", Kind::Bool, L("true"), "add X-Routed-* to responses"),
    opt("api_keys_file", "API keys file", "auth", Kind::Text, N("the gateway's"), "this route's own key file"),
    opt("forward_client_key", "Forward client key", "auth", Kind::Bool, L("false"), "send the client's Authorization / x-api-key on to the engines"),
    opt("engine_api_key_file", "Engine key file", "auth", Kind::Text, N("none"), "the engines' own key, sent as Bearer"),
    opt("allow_upgrade", "Allow Upgrade", "requests", Kind::Bool, L("false"), "let Upgrade requests (WebSocket) through; an engine's 101 then makes the connection a raw tunnel past every check"),
    opt("reject_rules", "Reject rules", "requests", Kind::List, N("none"), "content rules answered with 4xx before any engine is used"),
    opt("reject_rules_enabled", "Reject rules on", "requests", Kind::Bool, L("true"), "the rules' switch (runtime: /_reject_rules_toggle)"),
    opt("postprocess", "Post-processing", "responses", Kind::Choice(&["strip_actual_usage", "vllm_format"]), N("gateway.yaml postprocess_default"), "response rewrite handler"),
    opt("cch_strip", "Strip cch", "requests", Kind::Bool, L("false"), "remove Claude Code's per-request cch=<hash>; field from the system prompt's billing line (runtime: /_cch_strip_toggle)"),
    opt("kimi_normalize", "Normalize Kimi ids", "requests", Kind::Bool, L("false"), "renumber Kimi tool-call ids by first appearance so history stays byte-stable (runtime: /_kimi_normalize_toggle)"),
    opt("include_usage", "Include usage", "requests", Kind::Bool, L("false"), "ask streams for a usage frame and strip it from the client's copy if the client did not ask"),
    opt("queue_timeout", "Queue timeout", "protection", Kind::Duration, L("0s"), "wait this long for room instead of an immediate 429"),
    opt("fair_share", "Fair share", "protection", Kind::Bool, L("true"), "release the queue by priority class, then by tenant (least weighted tokens served first); false: arrival order"),
    opt("fair_hold_depth", "Fair hold depth", "protection", Kind::Number, L("0"), "with fair_share and two tenants or more sending: a streamed request whose engine has this many prompts awaiting their first token waits at the gateway, released in the fair order; 0: never"),
    opt("fair_hold_timeout", "Fair hold timeout", "protection", Kind::Duration, L("30s"), "the longest such a hold lasts; then the request goes on (never refused for it)"),
    opt("protection.ttft.limit_ms", "TTFT limit (ms)", "protection", Kind::Number, L("30000"), "TTFT EWMA at which a pool sheds with 429"),
    opt("protection.ttft.limit_by_model", "TTFT limit per model", "protection", Kind::Map, N("none"), "{model: ms}"),
    opt("protection.tps.limit_tps", "Decode-rate floor", "protection", Kind::Number, N("none"), "decode-rate EWMA (tok/s) at or under which a pool sheds (not on an adaptive route)"),
    hidden(opt("protection.ttft.metrics", "TTFT metric table", "protection", Kind::List, N("none"), "[{metric: pNN|avg, q, threshold}], at most 4; replaces the TTFT limits")),
    hidden(opt("protection.tps.metrics", "Decode-rate metric table", "protection", Kind::List, N("none"), "[{metric: pNN|avg, q, threshold}], at most 4; replaces the floor")),
    hidden(opt("protection.ttft.window", "TTFT window", "protection", Kind::Duration, L("20s"), "samples folded (P80) into one value per window")),
    hidden(opt("protection.tps.window", "Decode-rate window", "protection", Kind::Duration, L("20s"), "samples folded (P20) per window; also the adaptive tick")),
    hidden(opt("protection.ewma.alpha", "EWMA alpha", "protection", Kind::Number, L("0.3"), "weight of the newest window, clamped to [0, 1]")),
    hidden(opt("protection.ewma.ttl", "EWMA TTL", "protection", Kind::Duration, L("60s"), "an EWMA without samples this long expires (fail-open)")),
    hidden(opt("protection.tps.min_tokens", "Decode sample min tokens", "protection", Kind::Integer, L("16"), "shorter completions are no decode-rate sample")),
    hidden(opt("protection.tps.min_decode_s", "Decode sample min time", "protection", Kind::Number, L("0.5"), "shorter decodes (seconds) are no sample")),
    hidden(opt("protection.probes", "Probes", "protection", Kind::Integer, L("5"), "requests per probe window that pass a tripped gate")),
    hidden(opt("protection.probe_window", "Probe window", "protection", Kind::Duration, L("10s"), "the probes' window")),
    opt("protection.rate_limit", "Load 429s", "protection", Kind::Bool, N("gateway.yaml load_rate_limit (true)"), "the route layer of the rate-limit master switch"),
    opt("protection.adaptive.enabled", "Adaptive concurrency", "adaptive", Kind::Bool, L("false"), "AIMD pool limit, steered by the decode-rate floor (which then sheds nothing) and TTFT"),
    opt("protection.adaptive.min", "Adaptive floor", "adaptive", Kind::Number, N("max(1, floor(min_frac × pool max))"), "the adaptive limit's floor (>= 1)"),
    opt("protection.adaptive.init", "Adaptive start (slots)", "adaptive", Kind::Number, N("the floor"), "start point inside [floor, pool max]"),
    opt("protection.adaptive.init_frac", "Adaptive start (fraction)", "adaptive", Kind::Number, N("the floor"), "start point as a fraction of the pool max"),
    hidden(opt("protection.adaptive.hold_when_idle", "Hold when idle", "adaptive", Kind::Bool, L("true"), "idle traffic never lowers (or expires) the limit")),
    hidden(opt("protection.adaptive.use_ttft", "Adaptive uses TTFT", "adaptive", Kind::Bool, L("true"), "TTFT over its limit shrinks the limit too")),
    hidden(opt("protection.adaptive.inc", "Growth factor", "adaptive", Kind::Number, L("1.02"), "the limit × this per step after concurrency refusals or under pressure (> 1)")),
    hidden(opt("protection.adaptive.dec", "Shrink factor", "adaptive", Kind::Number, L("0.97"), "the limit × this per step while the decode rate is under its floor or TTFT over its limit (in (0, 1))")),
    hidden(opt("protection.adaptive.pressure_frac", "Pressure fraction", "adaptive", Kind::Number, L("0.9"), "in flight at this share of the limit is pressure: it grows (in (0, 1])")),
    hidden(opt("protection.adaptive.slack_frac", "Slack fraction", "adaptive", Kind::Number, L("0.7"), "in flight under this share of the limit is slack: it shrinks unless held (in (0, pressure_frac)); the load's need is in flight over the two fractions' mean")),
    hidden(opt("protection.adaptive.abs", "Absolute headroom", "adaptive", Kind::Number, L("5"), "slots kept above in flight whatever the fractions say (>= 0)")),
    hidden(opt("protection.adaptive.min_frac", "Floor fraction", "adaptive", Kind::Number, L("0.4"), "the floor when min is unset, as a share of the pool max (in (0, 1])")),
    hidden(opt("protection.adaptive.ttl", "Limit TTL", "adaptive", Kind::Duration, L("300s"), "a limit not moved this long starts again at init (only with hold_when_idle false)")),
    hidden(opt("protection.adaptive.interval", "Step interval", "adaptive", Kind::Duration, N("protection.tps.window"), "time between two steps (>= 50ms)")),
    opt("protection.session_prio.enabled", "Session turn priority", "session_prio", Kind::Bool, L("false"), "under load refuse early turns first (runtime: /_session_prio_toggle)"),
    opt("protection.session_prio.r_new", "Turn-1 share", "session_prio", Kind::Number, L("0.85"), "turn 1's share of the limit, rising to 1.0"),
    hidden(opt("protection.session_prio.full_turn", "Full-warmth turn", "session_prio", Kind::Integer, L("32"), "the turn whose bucket has share 1.0")),
    hidden(opt("protection.session_prio.table", "Bucket table", "session_prio", Kind::List, N("derived"), "[{min_turn, share, tol}], first min_turn 1, ascending")),
    hidden(opt("protection.session_prio.severe", "Hard trip factor", "session_prio", Kind::Number, L("1.5"), "every bucket is refused at threshold × this (>= 1)")),
    hidden(opt("protection.session_prio.release", "Turn-1 release", "session_prio", Kind::Number, L("0.9"), "turn 1's hold releases under threshold × this")),
    hidden(opt("protection.session_prio.t1_probes", "Turn-1 probes", "session_prio", Kind::Integer, L("1"), "turn 1's own probes per window while tripped")),
    hidden(opt("protection.session_prio.warn_frac", "No-header warn share", "session_prio", Kind::Number, L("0.2"), "WARN when more of a minute's requests had no usable header")),
    hidden(opt("protection.session_prio.rt_limit_factor", "Ceiling factor", "session_prio", Kind::Number, L("1.0"), "scales the per-bucket concurrency ceilings")),
];

fn dur(d: Duration) -> Value {
    json!(humantime::format_duration(d).to_string())
}

/// The values a validated route runs with, laid out as a route file lays
/// them out, so that an option's value is found by its key (`null`: unset /
/// none).
pub fn values(route: &RouteConfig) -> Value {
    let em = route.engine_metrics.as_ref();
    let pools: serde_json::Map<String, Value> = route
        .peers_by_model
        .iter()
        .map(|(m, idx)| {
            let names: Vec<&str> = idx.iter().map(|&i| route.peers[i].name.as_str()).collect();
            (m.clone(), json!(names))
        })
        .collect();
    json!({
        "peers": route.peers.iter().map(|p| json!({
            "name": p.name, "host": p.host, "port": p.port, "priority": p.priority,
            "max_concurrency": p.max_concurrency, "probe_path": p.probe_path,
            "kv_capacity_tokens": p.kv_capacity_tokens,
            "tls": p.tls.as_deref().map(tls_json),
        })).collect::<Vec<_>>(),
        "peers_from": route.peers_from.as_ref().map(|from| {
            let source = match &from.source {
                crate::config::PeerSource::Dns { name, port } => json!({"dns": name, "port": port}),
                crate::config::PeerSource::Kubernetes(k) => json!({"kubernetes": {
                    "namespace": k.namespace, "selector": k.selector,
                    "port": match &k.port {
                        crate::discovery::kubernetes::PortRef::Number(n) => json!(n),
                        crate::discovery::kubernetes::PortRef::Name(n) => json!(n),
                    },
                    "api": k.api,
                    "service_account_dir": k.service_account_dir,
                }}),
            };
            let mut v = source;
            v["priority"] = json!(from.priority);
            v["max_concurrency"] = json!(from.max_concurrency);
            v["probe_path"] = json!(from.probe_path);
            v["kv_capacity_tokens"] = json!(from.kv_capacity_tokens);
            v["tls"] = json!(from.tls.as_deref().map(tls_json));
            v
        }),
        "peers_by_model": if pools.is_empty() { Value::Null } else { Value::Object(pools) },
        "max_body_size": route.max_body_size,
        "balancing": {
            "mode": route.balancing.mode.as_str(),
            "session_affinity": {
                "headers": route.balancing.session_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
                "idle_timeout": dur(route.balancing.idle_timeout),
                "live_window": dur(route.balancing.live_window),
                "content": route.balancing.content.map_or(Value::Bool(false), |c| json!({
                    "template_fanout": c.template_fanout,
                    "max_blocks": c.max_nodes,
                })),
            },
            "cross_tier_fallback": route.balancing.cross_tier_fallback,
        },
        "health": {
            "enabled": route.health.enabled,
            "interval": dur(route.health.interval),
            "ban_ttl": dur(route.health.ban_ttl),
            "probe_path": route.health.probe_path,
            "timeout": dur(route.health.timeout),
        },
        "engine_metrics": {
            "interval": em.map_or(Value::Null, |m| dur(m.interval)),
            "kv_full_threshold": em.map(|m| m.kv_full_threshold),
            "path": em.map(|m| &m.path),
        },
        "timeouts": {
            "connect": dur(route.timeouts.connect),
            "read": dur(route.timeouts.read),
            "idle": dur(route.timeouts.idle),
        },
        "routed_headers": route.routed_headers,
        "api_keys_file": route.api_keys_file,
        "forward_client_key": route.forward_client_key,
        "allow_upgrade": route.allow_upgrade,
        "engine_api_key_file": route.engine_api_key_file,
        "reject_rules": route.reject_rules.configured(),
        "reject_rules_enabled": route.reject_rules_enabled,
        "postprocess": route.postprocess.as_ref().map(|h| h.name()),
        "include_usage": route.include_usage,
        "cch_strip": route.cch_strip,
        "kimi_normalize": route.kimi_normalize,
        "queue_timeout": dur(route.queue_timeout),
        "fair_share": route.fair_share,
        "fair_hold_depth": route.fair_hold_depth,
        "fair_hold_timeout": dur(route.fair_hold_timeout),
        "protection": protection_values(&route.protection),
    })
}

/// The `protection:` section of [`values`] (its own `json!`: one for the
/// whole route passes the macro's recursion limit).
fn protection_values(p: &crate::config::Protection) -> Value {
    let prio = &p.session_prio;
    let adaptive = &p.adaptive;
    let table = |t: &Option<Vec<crate::protect::limits::MetricLimit>>| {
        t.as_ref().map_or(Value::Null, |t| {
            json!(t
                .iter()
                .map(|m| json!({"metric": m.fold.name(), "threshold": m.threshold}))
                .collect::<Vec<_>>())
        })
    };
    json!({
        "ttft": {
            "limit_ms": p.ttft_limit_ms,
            "limit_by_model": p.ttft_limit_by_model.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "metrics": table(&p.ttft_metrics),
            "window": dur(Duration::from_millis(p.meter.ttft_window_ms)),
        },
        "tps": {
            "limit_tps": p.tps_limit_tps,
            "metrics": table(&p.tps_metrics),
            "window": dur(Duration::from_millis(p.meter.tps_window_ms)),
            "min_tokens": p.meter.tps_min_tokens,
            "min_decode_s": p.meter.tps_min_decode_ms as f64 / 1000.0,
        },
        "ewma": {
            "alpha": p.meter.alpha,
            "ttl": dur(Duration::from_millis(p.meter.ttl_ms)),
        },
        "probes": p.probes,
        "probe_window": dur(p.probe_window),
        "rate_limit": p.load_rate_limit,
        "adaptive": {
            "enabled": adaptive.enabled,
            "min": adaptive.min,
            "init": adaptive.init,
            "init_frac": adaptive.init_frac,
            "hold_when_idle": adaptive.hold_when_idle,
            "use_ttft": adaptive.use_ttft,
            "inc": adaptive.coefficients.inc,
            "dec": adaptive.coefficients.dec,
            "pressure_frac": adaptive.coefficients.pressure_frac,
            "slack_frac": adaptive.coefficients.slack_frac,
            "abs": adaptive.coefficients.abs,
            "min_frac": adaptive.coefficients.min_frac,
            "ttl": dur(Duration::from_millis(adaptive.ttl_ms)),
            "interval": dur(Duration::from_millis(adaptive.interval_ms)),
        },
        "session_prio": {
            "enabled": prio.enabled,
            "r_new": prio.table.first().map(|b| b.share),
            "full_turn": prio.table.last().map(|b| b.min_turn),
            "table": prio.table.iter()
                .map(|b| json!({"min_turn": b.min_turn, "share": b.share, "tol": b.tol}))
                .collect::<Vec<_>>(),
            "severe": prio.severe,
            "release": prio.release,
            "t1_probes": prio.t1_probes,
            "warn_frac": prio.warn_frac,
            "rt_limit_factor": prio.rt_limit_factor,
        },
    })
}

/// A peer's TLS as its route file set it: the file paths, never what they hold.
fn tls_json(tls: &crate::engine_tls::EngineTls) -> Value {
    let s = &tls.settings;
    json!({
        "sni": s.sni, "ca_file": s.ca_file, "client_cert": s.client_cert,
        "client_key": s.client_key, "verify": s.verify,
    })
}

/// The value `key` has in `values` (a dotted key, or `peers[].x`: one per
/// peer; a former key names its place now);
/// `null` for a key the view does not hold.
pub fn lookup(values: &Value, key: &str) -> Value {
    let key = FORMER_KEYS
        .iter()
        .find(|f| f.old == key)
        .map_or(key, |f| f.new);
    if key == "peers" {
        // The peers' addresses, not their every field (those have keys).
        let peers = values["peers"].as_array().into_iter().flatten();
        return json!(peers
            .map(|p| json!({"name": p["name"], "host": p["host"], "port": p["port"]}))
            .collect::<Vec<_>>());
    }
    if let Some(field) = key.strip_prefix("peers[].") {
        let peers = values["peers"].as_array().into_iter().flatten();
        return Value::Array(peers.map(|p| p[field].clone()).collect());
    }
    key.split('.')
        .try_fold(values, |at, part| at.get(part))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The value `route` runs with for `key` (`null`: unset / none).
pub fn effective(route: &RouteConfig, key: &str) -> Value {
    lookup(&values(route), key)
}

/// The name a key had before (the OpenResty gateway's, or the first flat
/// spelling of the protection keys), if it had one.
pub fn formerly(key: &str) -> Option<&'static str> {
    FORMER_KEYS.iter().find(|f| f.new == key).map(|f| f.old)
}

/// One option as `/_route_opts` serves it.
pub fn option_json(o: &RouteOption, values: &Value, set: &[String]) -> Value {
    let (default, note) = match o.default {
        OptionDefault::Literal(l) => (json!(l), Value::Null),
        OptionDefault::Note(n) => (Value::Null, json!(n)),
    };
    let mut v = json!({
        "key": o.key,
        "label": o.label,
        "group": o.group,
        "kind": o.kind.as_str(),
        "default": default,
        "default_note": note,
        "description": o.description,
        "value": lookup(values, o.key),
        "set_by_route": set.iter().any(|k| {
            k == o.key || k.starts_with(&format!("{}.", o.key)) || Some(k.as_str()) == formerly(o.key)
        }),
        "formerly": formerly(o.key),
    });
    if let Kind::Choice(choices) = o.kind {
        v["choices"] = json!(choices);
    }
    v
}

/// The book's table of route options, generated from the catalog. `<` is
/// written as `&lt;`: Markdown takes `<hash>` in a cell for an HTML tag and
/// shows nothing.
pub fn markdown_table() -> String {
    let cell = |text: &str| text.replace('|', "\\|").replace('<', "&lt;");
    let mut out = String::from("| option | default | group | meaning |\n|---|---|---|---|\n");
    for o in ROUTE_OPTIONS {
        let default = match o.default {
            OptionDefault::Literal(l) => format!("`{l}`"),
            OptionDefault::Note(n) => n.to_string(),
        };
        let advanced = if o.hidden { " (advanced)" } else { "" };
        out.push_str(&format!(
            "| `{}` | {} | {}{advanced} | {} |\n",
            o.key,
            cell(&default),
            o.group,
            cell(o.description),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file::keys_set;
    use crate::config::{GatewayConfig, Overrides};
    use std::path::Path;

    const MINIMAL: &str = "peers:\n  - {name: a, host: 127.0.0.1, port: 8001}\n";

    const ROUTE_OPTIONS_BEGIN: &str = "<!-- route-options:begin -->\n";
    const ROUTE_OPTIONS_END: &str = "<!-- route-options:end -->";

    /// The page with `table` between its route-options markers: `None` when it
    /// already has it, else the page as it should be; an error without markers.
    fn table_between_markers(page: &str, table: &str) -> Result<Option<String>, &'static str> {
        let start = page
            .find(ROUTE_OPTIONS_BEGIN)
            .ok_or("no <!-- route-options:begin --> marker")?
            + ROUTE_OPTIONS_BEGIN.len();
        let stop = page
            .find(ROUTE_OPTIONS_END)
            .ok_or("no <!-- route-options:end --> marker")?;
        if stop < start {
            return Err("the end marker comes before the begin marker");
        }
        if &page[start..stop] == table {
            return Ok(None);
        }
        Ok(Some(format!("{}{table}{}", &page[..start], &page[stop..])))
    }

    fn parse(text: &str) -> RouteConfig {
        let gw = GatewayConfig::parse(Path::new("gateway.yaml"), "", &Overrides::default())
            .expect("gateway");
        RouteConfig::parse("chat", Path::new("routes/chat.yaml"), text, &gw)
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// `MINIMAL` with `key` (dotted, or `peers[].x`) set to `literal`.
    fn with_option(key: &str, literal: &str) -> String {
        let mut doc: serde_yaml::Value = serde_yaml::from_str(MINIMAL).expect("yaml");
        let value: serde_yaml::Value = serde_yaml::from_str(literal).expect("literal");
        if let Some(field) = key.strip_prefix("peers[].") {
            for peer in doc["peers"].as_sequence_mut().expect("peers") {
                peer[field] = value.clone();
            }
        } else {
            let mut at = &mut doc;
            let parts: Vec<&str> = key.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                if at.get(*part).is_none() {
                    at[*part] = serde_yaml::Value::Mapping(Default::default());
                }
                at = &mut at[*part];
            }
            at[parts[parts.len() - 1]] = value;
        }
        serde_yaml::to_string(&doc).expect("yaml")
    }

    #[test]
    fn every_literal_default_is_what_the_parser_applies() {
        let minimal = parse(MINIMAL);
        let mut checked = 0;
        for o in ROUTE_OPTIONS {
            let OptionDefault::Literal(literal) = o.default else {
                continue;
            };
            let written = parse(&with_option(o.key, literal));
            assert_eq!(
                effective(&minimal, o.key),
                effective(&written, o.key),
                "{}: the catalog says {literal}, the parser applies {}",
                o.key,
                effective(&minimal, o.key)
            );
            checked += 1;
        }
        assert!(checked >= 40, "only {checked} literal defaults checked");
    }

    #[test]
    fn the_drift_check_catches_a_changed_default() {
        // Control: a value other than the default does show as different.
        let minimal = parse(MINIMAL);
        let other = parse(&with_option("ttft_limit_ms", "12345"));
        assert_ne!(
            effective(&minimal, "ttft_limit_ms"),
            effective(&other, "ttft_limit_ms")
        );
        let other = parse(&with_option(
            "balancing.session_affinity.idle_timeout",
            "45m",
        ));
        assert_ne!(
            effective(&minimal, "balancing.session_affinity.idle_timeout"),
            effective(&other, "balancing.session_affinity.idle_timeout")
        );
    }

    #[test]
    fn every_option_the_route_file_accepts_is_in_the_catalog() {
        // Each catalog key written alone (with a valid sample) must parse, and
        // the parser's own list of fields must be covered by the catalog.
        let fields = crate::config::route_file_fields();
        assert!(fields.len() > 40, "the parser's fields: {fields:?}");
        for field in &fields {
            let covered = ROUTE_OPTIONS.iter().any(|o| {
                o.key == field
                    || o.key.starts_with(&format!("{field}."))
                    || formerly(o.key) == Some(field.as_str())
            });
            assert!(covered, "route option {field} is not in the catalog");
        }
        for o in ROUTE_OPTIONS {
            assert!(
                !matches!(effective(&parse(MINIMAL), o.key), Value::Null)
                    || !matches!(o.default, OptionDefault::Literal(_)),
                "{} has a literal default but no effective value",
                o.key
            );
        }
    }

    #[test]
    fn keys_set_names_what_the_file_wrote() {
        let text = "peers:\n  - {name: a, host: h, port: 1, max_concurrency: 4}\nbalancing:\n  session_affinity: {idle_timeout: 5m}\nttft_limit_ms: 100\n";
        assert_eq!(
            keys_set(text),
            [
                "balancing.session_affinity.idle_timeout",
                "peers",
                "peers[].host",
                "peers[].max_concurrency",
                "peers[].name",
                "peers[].port",
                "ttft_limit_ms"
            ]
        );
    }

    #[test]
    fn the_route_options_page_is_the_catalogs() {
        let page_path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/src/configuration/route-options.md"
        );
        let page = std::fs::read_to_string(page_path).expect("the route options page");
        let table = markdown_table();
        match table_between_markers(&page, &table) {
            Ok(None) => {}
            Ok(Some(updated)) if std::env::var_os("UPDATE_DOCS").is_some() => {
                std::fs::write(page_path, updated).expect("write the route options page");
            }
            Ok(Some(_)) => panic!(
                "docs/src/configuration/route-options.md differs from the catalog; \
                 run UPDATE_DOCS=1 cargo test --lib route_options_page"
            ),
            Err(e) => panic!("docs/src/configuration/route-options.md: {e}"),
        }
    }

    /// The control: the page with one cell changed, or without its markers,
    /// is not taken for the catalog's.
    #[test]
    fn a_route_options_page_that_drifted_is_caught() {
        let table = markdown_table();
        let page = format!("# Options\n\n{ROUTE_OPTIONS_BEGIN}{table}{ROUTE_OPTIONS_END}\n");
        assert_eq!(table_between_markers(&page, &table), Ok(None));
        let drifted = page.replacen("`30m`", "`31m`", 1);
        assert_ne!(drifted, page, "the fixture has the default it changes");
        assert!(table_between_markers(&table, &table).is_err());
        assert_eq!(table_between_markers(&drifted, &table), Ok(Some(page)));
    }
}
