//! Fuzz harnesses: one function per `cargo fuzz` target. Each
//! `fuzz/fuzz_targets/<name>.rs` calls the function of its name, and
//! `tests/fuzz_corpus.rs` includes this same file to run every committed
//! corpus input and crash reproducer through it under plain `cargo test`,
//! so what the fuzzer once found stays found.
//!
//! A harness takes the fuzzer's raw bytes, drives the library's real entry
//! points (nothing here reimplements what it tests, except the small
//! reference models named as such), and panics — a finding — when a
//! property the code documents does not hold. Inputs that carry more than
//! one thing (rules and a body, settings and a stream) are cut at the first
//! NUL byte or by a short binary prefix, so seeds stay readable.

// Each fuzz target uses one function of this file.
#![allow(dead_code)]

use bytes::Bytes;
use llm_gateway::api::Api;
use llm_gateway::bodylog::frame::{self, Frame, HeadTail};
use llm_gateway::bodylog::record;
use llm_gateway::config::{catalog, GatewayConfig, Overrides, RouteConfig};
use llm_gateway::protect::prio::{self, Turn};
use llm_gateway::reject::{rejection_body, RequestFacts, RuleSet};
use llm_gateway::store::binding::StoredBinding;
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

// Two harnesses too long to sit with the rest, in files of their own (a
// path each: this file is included from fuzz_targets/ and from tests/).
#[path = "harness/request_body.rs"]
mod request_body;
#[path = "harness/sse_pipeline.rs"]
mod sse_pipeline;

pub use request_body::request_body;
pub use sse_pipeline::sse_pipeline;

/// One target's harness: panics on a finding.
pub type Harness = fn(&[u8]);

/// Every target, by name (the directory names under `fuzz/corpus/` and
/// `fuzz/regressions/`).
pub const TARGETS: &[(&str, Harness)] = &[
    ("config_route", config_route),
    ("config_gateway", config_gateway),
    ("request_body", request_body),
    ("reject_rules", reject_rules),
    ("sse_pipeline", sse_pipeline),
    ("prio_header", prio_header),
    ("bodylog_frame", bodylog_frame),
    ("store_binding", store_binding),
];

/// The bytes before the first NUL and those after it (all of `data` and
/// nothing when there is none).
fn split_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// The gateway every route is parsed under: an empty `gateway.yaml`.
fn gateway() -> &'static GatewayConfig {
    static GATEWAY: OnceLock<GatewayConfig> = OnceLock::new();
    GATEWAY.get_or_init(|| {
        GatewayConfig::parse(Path::new("gateway.yaml"), "", &Overrides::default())
            .expect("an empty gateway.yaml is valid")
    })
}

const MINIMAL_ROUTE: &str = "peers:\n  - {name: a, host: 127.0.0.1, port: 8001}\n";

// ---------------------------------------------------------------- config

/// A route file: `RouteConfig::parse`, then everything `/_route_opts`
/// derives from the parsed route (the catalog indexes peers by the model
/// pools' indices, so a bad index would panic there).
pub fn config_route(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("routes/fuzz.yaml");
    let parsed = RouteConfig::parse("fuzz", path, text, gateway());
    // Parsing is a function of the text alone: a reload compares the new
    // config with the old one to tell a changed route from an unchanged one.
    assert_eq!(
        parsed,
        RouteConfig::parse("fuzz", path, text, gateway()),
        "parse is deterministic"
    );
    let route = match parsed {
        Ok(route) => route,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    for (model, pool) in &route.peers_by_model {
        for &i in pool {
            assert!(i < route.peers.len(), "pool {model:?} names peer {i}");
        }
    }
    assert_eq!(
        route.reject_rules.len() + route.reject_rule_errors.len(),
        route.reject_rules.configured(),
        "every configured rule is compiled or reported"
    );
    let values = catalog::values(&route);
    for option in catalog::ROUTE_OPTIONS {
        let _ = catalog::option_json(option, &values, &route.keys_set);
    }
    let prio = &route.protection.session_prio;
    if prio.enabled {
        assert!(prio::validate_table(&prio.table).is_ok(), "table validated");
    }
}

/// `gateway.yaml`: `GatewayConfig::parse`; any gateway it accepts must
/// serve a minimal route file.
pub fn config_gateway(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("gateway.yaml");
    let parsed = GatewayConfig::parse(path, text, &Overrides::default());
    let again = GatewayConfig::parse(path, text, &Overrides::default());
    assert_eq!(format!("{parsed:?}"), format!("{again:?}"), "deterministic");
    let gateway = match parsed {
        Ok(gateway) => gateway,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert!((1..=1024).contains(&gateway.threads));
    assert!(gateway.client_idle_timeout.as_secs() >= 1);
    if let Err(e) = RouteConfig::parse(
        "chat",
        Path::new("routes/chat.yaml"),
        MINIMAL_ROUTE,
        &gateway,
    ) {
        panic!("a valid gateway refuses the minimal route: {e}");
    }
}

// ---------------------------------------------------------------- reject

/// Reject rules (YAML or JSON, before the NUL) compiled as a route file's
/// are, evaluated against the body after it.
pub fn reject_rules(data: &[u8]) {
    let (rules, body) = split_nul(data);
    let Ok(text) = std::str::from_utf8(rules) else {
        return;
    };
    let Ok(yaml) = serde_yaml::from_str::<serde_yaml::Value>(text) else {
        return;
    };
    // As config/route/sections.rs turns the route file's `reject_rules` into JSON.
    let Ok(rules) = serde_json::to_value(yaml) else {
        return;
    };
    let (set, errors) = RuleSet::compile(&rules);
    match &rules {
        Value::Array(items) => assert_eq!(set.len() + errors.len(), items.len()),
        Value::Null => assert!(set.is_empty() && errors.is_empty()),
        _ => assert!(set.is_empty() && errors.len() == 1),
    }
    let parsed = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    let mut matched = 0u64;
    // The parsed body, then (as for a body that does not parse) null: the
    // computed fields still work on the latter. Each as every API reads it.
    let apis = [
        None,
        Some(Api::Chat),
        Some(Api::Completions),
        Some(Api::Messages),
        Some(Api::Responses),
    ];
    for value in [&parsed, &Value::Null] {
        for api in apis {
            let facts = RequestFacts {
                body: value,
                raw_len: body.len(),
                api,
            };
            let first = set.evaluate(&facts).map(|r| r.name.clone());
            let again = set.evaluate(&facts).map(|r| {
                assert!((400..=599).contains(&r.status));
                let _ = rejection_body(r, "fuzz");
                r.name.clone()
            });
            assert_eq!(first, again, "evaluation is deterministic");
            matched += 2 * u64::from(first.is_some());
        }
    }
    let hits: u64 = set
        .status_json()
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["hits"].as_u64().expect("a count"))
        .sum();
    assert_eq!(hits, matched, "each match is counted once");
}

// ---------------------------------------------------------------- headers

/// `x-phanrouter-session`: `parse_header`, checked against the parsed tree.
pub fn prio_header(data: &[u8]) {
    let turn = prio::parse_header(Some(data));
    if let Turn::Known(t) = turn {
        assert!((1..=prio::MAX_TURN).contains(&t));
        // Members it does not read are skipped unchecked (a number out of
        // f64 range there is fine), so only a header the tree parser also
        // takes can be compared with it.
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            assert!(v.is_object(), "the header is an object");
            assert_eq!(v["turn"].as_u64(), Some(t));
            let id = v["session_id"].as_str().expect("session_id is a string");
            assert!(!id.trim().is_empty());
            assert!(id.chars().count() <= prio::MAX_SESSION_ID_CHARS);
        }
    }
    let table = prio::default_table(0.3, 16, 2.0);
    assert!(prio::bucket_of(&table, turn) < table.len());
    assert_eq!(prio::parse_header(None), Turn::Unusable);
}

// ---------------------------------------------------------------- bodylog

/// Body-log frames: `decode` of arbitrary bytes (what a listener reads),
/// the record built from a frame, and `HeadTail` over arbitrary chunks.
pub fn bodylog_frame(data: &[u8]) {
    // As the listener reads: the bytes after the length prefix.
    if let Ok(f) = frame::decode(data) {
        let wire = Frame::new(
            f.meta.to_vec(),
            Bytes::copy_from_slice(f.req),
            Bytes::copy_from_slice(f.resp),
        )
        .to_vec();
        assert_eq!(&wire[4..], data, "decode and encode round-trip");
        assert_eq!(wire[..4], (data.len() as u32).to_be_bytes());
        build_record(&f);
    }
    // As the gateway writes: meta, request and response cut at NULs.
    let (meta, rest) = split_nul(data);
    let (req, resp) = split_nul(rest);
    if meta.len() <= usize::from(u16::MAX) {
        let wire = Frame::new(
            meta.to_vec(),
            Bytes::copy_from_slice(req),
            Bytes::copy_from_slice(resp),
        )
        .to_vec();
        let f = frame::decode(&wire[4..]).expect("a frame decodes");
        assert_eq!((f.meta, f.req, f.resp), (meta, req, resp));
        build_record(&f);
    }
    head_tail(data);
}

fn build_record(f: &frame::FrameRef<'_>) {
    let Ok(rec) = record::build(f, std::time::SystemTime::UNIX_EPOCH) else {
        return;
    };
    let line: Value = serde_json::from_slice(&rec.line).expect("a record is JSON");
    for key in ["req", "resp", "resp_meta", "received_at"] {
        assert!(line.get(key).is_some(), "record has {key}");
    }
}

/// `HeadTail` with small caps (the first two bytes) over chunks of the
/// rest (1 to 17 bytes, stepping with the third byte): the first
/// `head` bytes, the marker with the exact count missing, the last `tail`.
fn head_tail(data: &[u8]) {
    let [h, t, step, body @ ..] = data else {
        return;
    };
    let (head, tail) = (usize::from(h % 64), usize::from(t % 64));
    let mut ht = HeadTail::new(head, tail);
    let mut rest = body;
    let mut k = usize::from(*step);
    while !rest.is_empty() {
        // Never 0: an empty push would not move on.
        let len = (1 + k % 17).min(rest.len());
        ht.push(&rest[..len]);
        rest = &rest[len..];
        k = k / 17 + usize::from(*step) + len;
    }
    assert_eq!(ht.total(), body.len() as u64);
    let (kept, cut) = ht.finish();
    if body.len() <= head + tail {
        assert_eq!((&kept[..], cut), (body, false));
    } else {
        let missing = body.len() - head - tail;
        let mut want = body[..head].to_vec();
        want.extend_from_slice(frame::truncation_marker(missing as u64).as_bytes());
        want.extend_from_slice(&body[body.len() - tail..]);
        assert_eq!((&kept[..], cut), (&want[..], true));
    }
}

// ---------------------------------------------------------------- store

/// A session binding's value as read back from Redis.
pub fn store_binding(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(binding) = StoredBinding::decode(text) else {
        return;
    };
    assert!(!binding.peer.is_empty() && !binding.peer.contains('|'));
    assert_eq!(
        StoredBinding::decode(&binding.encode()),
        Some(binding.clone()),
        "what decodes re-encodes to the same binding"
    );
    let _ = binding.moved_ago_ms(0);
    let _ = binding.moved_ago_ms(u64::MAX);
}
