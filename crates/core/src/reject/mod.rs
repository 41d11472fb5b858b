//! Content-based rejection: per-route rules that refuse a request because of
//! what it contains (README "Content-based rejection").
//!
//! A route's `reject_rules` is a list of rules:
//!
//! ```yaml
//! reject_rules:
//!   - name: huge-prompt
//!     status: 413            # optional, 400..=599, default 429
//!     message: prompt too long   # optional
//!     when:
//!       any:
//!         - {field: input_chars, op: gt, value: 200000}
//!         - all:
//!             - {field: model, op: prefix, value: "llama-"}
//!             - {field: max_tokens, op: gt, value: 8192}
//! ```
//!
//! Rules are tried in order and the first that matches rejects the request.
//! A rule that does not compile is dropped with one error, and the others keep
//! working: a typo must not take the route down.
//!
//! # Fields
//!
//! - `input_bytes`: the raw request body length.
//! - `input_chars`, `messages_count`, `max_tokens`: the same meaning on every
//!   API, each read where the path's API keeps it (`shapes.rs`; the book's
//!   Request guards has the table). The first two are computed only if a
//!   rule asks, at most once per request; `max_tokens` is absent if the body
//!   sets no cap.
//! - `tools_count`: the length of `tools`, 0 when missing or not an array.
//! - `stream`: `true` only if the body says `"stream": true`.
//! - anything else is a dotted path into the body: `model`,
//!   `metadata.user_id`, `messages.0.role`. An all-digit segment indexes an
//!   array, or is an ordinary key on an object. The names above take
//!   precedence over body keys of the same name.
//!
//! # Ops and missing values
//!
//! `gt ge lt le` (numbers), `eq ne` (JSON equality, except that numbers
//! compare by value at any depth, so `1 == 1.0`), `in nin` (value is a list),
//! `match` (regex, compiled at load, unanchored: use `^`/`$`), `prefix`
//! (strings), `contains` (substring of a string, or element of an array),
//! `exists`, `absent`. A field of the wrong type for the op does not match.
//!
//! A missing field and a JSON `null` are both *absent*, as OpenAI clients send
//! `null` for "unset". On an absent field every op is false except `absent`;
//! in particular `ne` and `nin` do not match, so "model ne X" means "has a
//! model and it is not X". For the same reason `null` is refused as a value
//! to compare with: use `exists`/`absent`.
//!
//! # What makes a rule invalid
//!
//! Unknown keys (in the rule or a condition), a missing or blank or duplicate
//! `name`, a missing `when`, an unknown op, a value of the wrong type for the
//! op (`gt "100"`), a value on `exists`/`absent`, a bad regex, a status that is
//! not an integer in 400..=599, an empty `all`/`any`, a condition mixing
//! `all`/`any`/`field`, nesting deeper than [`MAX_CONDITION_DEPTH`], and an op
//! that can never be meaningful on a computed field (`match` on
//! `input_bytes`, `exists` on `stream` — those are always present).

mod compile;
mod eval;
mod rule;
mod shapes;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::atomic::Ordering as AtomicOrdering;

use serde_json::{json, Value};

use compile::{compile_rule, json_type};
use eval::Evaluation;
pub use rule::{CompiledRule, RequestFacts, DEFAULT_STATUS, MAX_CONDITION_DEPTH};

/// A route's compiled reject rules, in configured order.
#[derive(Debug, Default)]
pub struct RuleSet {
    rules: Vec<CompiledRule>,
    /// The rules as written, null when the route has none.
    source: Value,
}

/// Two rule sets are the same configuration when they were compiled from
/// the same text (hit counters are runtime state, not configuration).
impl PartialEq for RuleSet {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl RuleSet {
    /// Compiles a route's `reject_rules` value. `null` (the route has none)
    /// gives an empty set. Each invalid rule is dropped and reported as one
    /// error naming its index and, when it has one, its name. Logging the
    /// errors is the caller's job.
    pub fn compile(rules: &Value) -> (RuleSet, Vec<String>) {
        let items = match rules {
            Value::Null => return (RuleSet::default(), Vec::new()),
            Value::Array(items) => items,
            other => {
                let error = format!(
                    "reject_rules must be a list of rules, got {}; no rules loaded",
                    json_type(other)
                );
                return (RuleSet::default(), vec![error]);
            }
        };
        let mut compiled = Vec::with_capacity(items.len());
        let mut errors = Vec::new();
        let mut names_in_use = HashSet::new();
        for (index, item) in items.iter().enumerate() {
            match compile_rule(item, &names_in_use) {
                Ok(rule) => {
                    names_in_use.insert(rule.name.clone());
                    compiled.push(rule);
                }
                Err(reason) => {
                    let label = match item.get("name").and_then(Value::as_str) {
                        Some(name) => format!("reject_rules[{index}] ({name:?})"),
                        None => format!("reject_rules[{index}]"),
                    };
                    errors.push(format!("{label}: {reason}; rule dropped"));
                }
            }
        }
        let set = RuleSet {
            rules: compiled,
            source: rules.clone(),
        };
        (set, errors)
    }

    /// The first rule whose condition matches, with its hit counted.
    pub fn evaluate(&self, facts: &RequestFacts) -> Option<&CompiledRule> {
        let evaluation = Evaluation::new(facts);
        let rule = self
            .rules
            .iter()
            .find(|rule| rule.condition.matches(&evaluation))?;
        rule.hits.fetch_add(1, AtomicOrdering::Relaxed);
        Some(rule)
    }

    /// `[{name, status, message, when, hits}]` for `/_reject_rules_status`.
    pub fn status_json(&self) -> Value {
        self.rules
            .iter()
            .map(|rule| {
                json!({
                    "name": rule.name,
                    "status": rule.status,
                    "message": rule.message,
                    "when": rule.configured_when,
                    "hits": rule.hits.load(AtomicOrdering::Relaxed),
                })
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Rules written in the route file, valid or not.
    pub fn configured(&self) -> usize {
        self.source.as_array().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The JSON body of a rejection response.
pub fn rejection_body(rule: &CompiledRule, route: &str) -> Value {
    json!({
        "error": {
            "type": "rejected_by_rule",
            "rule": rule.name,
            "message": rule.message,
            "route": route,
        }
    })
}
