//! The route's runtime switches, loopback only (checked by the caller):
//! the toggles (`/_toggle_…`) and the limit overrides (`/_ttft_limit`,
//! `/_tps_limit`), and how each reads in the status endpoints.

use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::registry::{Route, Toggle, TOGGLE_NAMES};
use serde_json::{json, Value};

/// `/_ttft_limit`, `/_tps_limit` → which limit a runtime override sets.
pub fn limit_override_name(path: &str) -> Option<&'static str> {
    match path.split('?').next()? {
        "/_ttft_limit" => Some("ttft"),
        "/_tps_limit" => Some("tps"),
        _ => None,
    }
}

/// Sets (`?ms=` / `?tps=`, with `&ttl=` in seconds or as a duration,
/// default two hours) or clears (`?reset=1`) a runtime limit override.
/// The caller has already checked that the request came from loopback.
pub fn apply_limit_override(route: &Route, path_and_query: &str) -> Result<Value, ErrorResponse> {
    let name = limit_override_name(path_and_query)
        .ok_or_else(|| ErrorResponse::not_found("unknown limit"))?;
    let (o, key) = match name {
        "ttft" => (&route.runtime.protection.overrides().ttft_ms, "ms"),
        _ => (&route.runtime.protection.overrides().tps, "tps"),
    };
    let query = path_and_query.split_once('?').map(|(_, q)| q).unwrap_or("");
    let param = |k: &str| crate::query::param(query, k);
    let now = now_ms();
    match (param(key).as_deref(), param("reset").as_deref()) {
        (_, Some("1")) => o.clear(),
        (Some(v), _) => {
            let value = v
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    ErrorResponse::bad_request(format!("{key} must be a positive number"))
                })?;
            let ttl = match param("ttl").as_deref() {
                None => {
                    std::time::Duration::from_secs(crate::protect::limits::DEFAULT_OVERRIDE_TTL_S)
                }
                Some(t) => crate::config::units::parse_duration(t)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        ErrorResponse::bad_request("ttl must be seconds or a duration (90s, 2h)")
                    })?,
            };
            o.set(value, now.saturating_add(ttl.as_millis() as u64));
        }
        _ => {
            return Err(ErrorResponse::bad_request(format!(
                "use ?{key}=N[&ttl=S] or ?reset=1"
            )))
        }
    }
    Ok(
        json!({"route": route.config.name, "limit": name, "state": limits_json(route)[name].clone()}),
    )
}

/// The limits in force for the route's default model, where each comes
/// from, and the runtime overrides with their expiry.
pub(super) fn limits_json(route: &Route) -> Value {
    let p = &route.config.protection;
    let now = now_ms();
    let o = route.runtime.protection.overrides();
    let reading = crate::protect::meter::Reading::default();
    let override_json = |ov: &crate::protect::limits::Override| match ov.get(now) {
        Some(v) => {
            json!({"value": v, "expires_in_s": ov.expires_ms(now).map(|e| e.saturating_sub(now) / 1000)})
        }
        None => Value::Null,
    };
    let table_json = |t: &Option<Vec<crate::protect::limits::MetricLimit>>| match t {
        Some(t) => json!(t
            .iter()
            .map(|m| json!({"metric": m.fold.name(), "threshold": m.threshold}))
            .collect::<Vec<_>>()),
        None => Value::Null,
    };
    let ttft = p.judge_ttft(&reading, None, o.ttft_ms.get(now));
    let tps = p.judge_tps(&reading, o.tps.get(now));
    json!({
        "ttft": {
            "limit_ms": (p.ttft_metrics.is_none()).then_some(ttft.limit),
            "source": ttft.source.as_str(),
            "metric_table": table_json(&p.ttft_metrics),
            "override": override_json(&o.ttft_ms),
            "static_ms": p.ttft_limit_ms,
            "by_model": p.ttft_limit_by_model.iter().map(|(m, l)| json!({"model": m, "limit_ms": l})).collect::<Vec<_>>(),
        },
        "tps": {
            "floor": tps.filter(|_| p.tps_metrics.is_none()).map(|j| j.limit),
            "source": tps.map(|j| j.source.as_str()),
            "metric_table": table_json(&p.tps_metrics),
            "override": override_json(&o.tps),
            "static": p.tps_limit_tps,
        },
    })
}

/// `/_<name>_toggle` → the toggle's name.
pub fn toggle_name(path: &str) -> Option<&str> {
    let name = path
        .split('?')
        .next()?
        .strip_prefix("/_")?
        .strip_suffix("_toggle")?;
    TOGGLE_NAMES.contains(&name).then_some(name)
}

/// Applies `?on=0|1` or `?reset=1` to the named toggle and reports the result.
/// The caller has already checked that the request came from loopback.
pub fn apply_toggle(route: &Route, path_and_query: &str) -> Result<Value, ErrorResponse> {
    let name =
        toggle_name(path_and_query).ok_or_else(|| ErrorResponse::not_found("unknown toggle"))?;
    let toggle = route
        .runtime
        .toggles
        .by_name(name)
        .ok_or_else(|| ErrorResponse::not_found("unknown toggle"))?;
    let query = path_and_query.split_once('?').map(|(_, q)| q).unwrap_or("");
    let param = |key: &str| crate::query::param(query, key);
    match (param("on").as_deref(), param("reset").as_deref()) {
        (_, Some("1")) => toggle.reset(),
        (Some("1"), _) => toggle.set(true),
        (Some("0"), _) => toggle.set(false),
        _ => return Err(ErrorResponse::bad_request("use ?on=0, ?on=1 or ?reset=1")),
    }
    Ok(
        json!({"route": route.config.name, "toggle": name, "state": toggles_json(route)[name].clone()}),
    )
}

pub(super) fn toggle_json(toggle: &Toggle, configured: bool) -> Value {
    let (on, source) = toggle.effective(configured);
    json!({"on": on, "source": source, "configured": configured})
}

pub(super) fn toggles_json(route: &Route) -> Value {
    let t = &route.runtime.toggles;
    let c = &route.config;
    let mut postprocess = toggle_json(&t.postprocess, c.postprocess.is_some());
    postprocess["handler"] = json!(c.postprocess.map(|h| h.name()));
    json!({
        "reject_rules": toggle_json(&t.reject_rules, c.reject_rules_enabled),
        "include_usage": toggle_json(&t.include_usage, c.include_usage),
        "postprocess": postprocess,
        "ttft": toggle_json(&t.ttft, true),
        "ttft_429": toggle_json(&t.ttft_429, true),
        "tps": toggle_json(&t.tps, true),
        "tps_429": toggle_json(&t.tps_429, true),
        "cch_strip": toggle_json(&t.cch_strip, c.cch_strip),
        "kimi_normalize": toggle_json(&t.kimi_normalize, c.kimi_normalize),
    })
}
