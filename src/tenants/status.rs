//! `/_tenants`: per tenant, what the file gives it (weight, class, allowed
//! classes, limits) and how it stands (in flight, tokens and requests in
//! the last minute, what is left of each budget, refusals by reason).
//! Tenants the file names come first, then the others seen, by name.
//! Names only: a tenant is a key's owner or a header's value, never a key.

use super::state::{Reason, TenantState};
use crate::budget::Standing;
use crate::config::tenants::{TenantPolicy, TenantsConfig};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(super) fn json(config: &TenantsConfig, seen: &[Arc<TenantState>], now_ms: u64) -> Value {
    // By name: up to `MAX_TRACKED` tenants are looked up, one by one.
    let by_name: HashMap<&str, &TenantState> = seen.iter().map(|s| (&*s.name, &**s)).collect();
    let mut names: Vec<&str> = config.tenants.keys().map(String::as_str).collect();
    let mut others: Vec<&str> = by_name
        .keys()
        .copied()
        .filter(|n| !config.names(n))
        .collect();
    others.sort_unstable();
    names.extend(others);
    let tenants: Vec<Value> = names
        .into_iter()
        .map(|name| tenant(config, name, by_name.get(name).copied(), now_ms))
        .collect();
    json!({
        "tenants_file": config.file.as_ref().map(|p| p.display().to_string()),
        "classes": config.classes,
        "defaults": policy(&config.defaults),
        "window_seconds": crate::budget::window::WINDOW_SECONDS,
        "tenants": tenants,
    })
}

fn policy(p: &TenantPolicy) -> Value {
    json!({
        "weight": p.weight,
        "class": p.class,
        "allowed_classes": p.allowed_classes,
        "limits": {
            "input_tokens_per_minute": p.limits.input_tokens,
            "output_tokens_per_minute": p.limits.output_tokens,
            "cached_input_tokens_per_minute": p.limits.cached_input_tokens,
            "requests_per_minute": p.limits.requests,
            "max_in_flight": p.max_in_flight,
        },
    })
}

fn tenant(config: &TenantsConfig, name: &str, state: Option<&TenantState>, now_ms: u64) -> Value {
    let p = config.policy(name);
    let mut out = policy(p);
    let standing = state.map(|s| s.standing(p, now_ms));
    let mut last_minute = Map::new();
    let mut left = Map::new();
    for d in crate::budget::Dimension::ALL {
        let st: Option<&Standing> = standing.iter().flatten().find(|s| s.dimension == d);
        last_minute.insert(d.as_str().into(), json!(st.map_or(0, |s| s.used)));
        left.insert(
            d.as_str().into(),
            json!(st.map_or(p.limits.of(d), |s| s.remaining)),
        );
    }
    let refusals: Map<String, Value> = Reason::ALL
        .iter()
        .map(|r| {
            let n = state.map_or(0, |s| s.refusals[r.index()].load(Ordering::Relaxed));
            (r.as_str().to_string(), json!(n))
        })
        .collect();
    if let Value::Object(o) = &mut out {
        o.insert("name".into(), json!(name));
        o.insert("named".into(), json!(config.names(name)));
        o.insert(
            "in_flight".into(),
            json!(state.map_or(0, |s| s.in_flight())),
        );
        o.insert("last_minute".into(), Value::Object(last_minute));
        o.insert("remaining".into(), Value::Object(left));
        o.insert("refusals".into(), Value::Object(refusals));
    }
    out
}
