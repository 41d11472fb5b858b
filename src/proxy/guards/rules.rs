//! Content reject rules, as the route's toggle allows.

use crate::errors::ErrorResponse;
use crate::metrics::metrics;
use crate::proxy::ctx::Admitted;
use crate::registry::Route;
use crate::reject::{rejection_body, RequestFacts};

/// The first matching content rule's refusal, if rules are on for the route.
///
/// Rules may look at any path of the body, so it is parsed whole here, and
/// only when the route has rules switched on.
pub fn check(route: &Route, req: &Admitted) -> Result<(), ErrorResponse> {
    if !req.json_object {
        return Ok(());
    }
    let raw_len = req.body.len();
    let enabled = route
        .runtime
        .toggles
        .reject_rules
        .is_on(route.config.reject_rules_enabled);
    let rules = &route.config.reject_rules;
    if !enabled || rules.is_empty() {
        return Ok(());
    }
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(&req.body.whole()) else {
        return Ok(());
    };
    let Some(rule) = rules.evaluate(&RequestFacts {
        body: &body,
        raw_len,
        api: req.api,
    }) else {
        return Ok(());
    };
    route
        .runtime
        .protection
        .count(crate::protect::gate::Gate::Rule, true);
    metrics()
        .rejections
        .with_label_values(&[route.name(), &rule.name])
        .inc();
    let body = rejection_body(rule, route.name());
    let mut err = ErrorResponse::new(rule.status, "rejected_by_rule", rule.message.clone());
    if let Some(fields) = body.get("error").and_then(|e| e.as_object()) {
        for (k, v) in fields {
            if k != "type" && k != "message" {
                err = err.with(k, v.clone());
            }
        }
    }
    if rule.status == 429 || rule.status == 503 {
        err = err.retry_after(1);
    }
    Err(err)
}
