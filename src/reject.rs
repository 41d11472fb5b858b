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
//! - `input_chars`: Unicode scalar values across `messages[].content` (string
//!   content, and the `text` of `{"type":"text"}` parts) plus `prompt` when it
//!   is a string. Computed only if a rule asks, at most once per request.
//! - `messages_count`, `tools_count`: array lengths, 0 when missing or not an
//!   array.
//! - `max_tokens`: `max_tokens`, else `max_completion_tokens` (absent if
//!   neither is set).
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

use std::borrow::Cow;
use std::cell::OnceCell;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use regex::Regex;
use serde_json::{json, Map, Number, Value};

pub const DEFAULT_STATUS: u16 = 429;

/// Deep enough for any hand-written rule, shallow enough that evaluation
/// recursion can never threaten the stack.
pub const MAX_CONDITION_DEPTH: usize = 32;

const RULE_KEYS: [&str; 4] = ["name", "status", "message", "when"];
const LEAF_KEYS: [&str; 3] = ["field", "op", "value"];

/// A route's compiled reject rules, in configured order.
#[derive(Debug, Default)]
pub struct RuleSet {
    rules: Vec<CompiledRule>,
}

#[derive(Debug)]
pub struct CompiledRule {
    pub name: String,
    pub status: u16,
    pub message: String,
    /// Requests this rule rejected since it was compiled.
    pub hits: AtomicU64,
    condition: Condition,
    /// Kept verbatim for the status endpoint, so operators see what they wrote.
    configured_when: Value,
}

/// What a rule can look at: the parsed body (`Value::Null` if it did not
/// parse — computed fields still work) and its raw length.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub body: &'a Value,
    pub raw_len: usize,
}

#[derive(Debug)]
enum Condition {
    All(Vec<Condition>),
    Any(Vec<Condition>),
    Test { field: Field, test: Test },
}

#[derive(Debug)]
enum Field {
    InputBytes,
    InputChars,
    MessagesCount,
    ToolsCount,
    MaxTokens,
    Stream,
    Path(Vec<PathSegment>),
}

/// The type a field is known to have before any request arrives; used only
/// to refuse rules that could never match.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldKind {
    AlwaysNumber,
    AlwaysBool,
    FromBody,
}

#[derive(Debug)]
struct PathSegment {
    key: String,
    index: Option<usize>,
}

#[derive(Debug)]
enum Test {
    Order(OrderOp, Number),
    Equal(Value),
    NotEqual(Value),
    In(Vec<Value>),
    NotIn(Vec<Value>),
    Matches(Regex),
    Contains(Value),
    Prefix(String),
    Exists,
    Absent,
}

#[derive(Debug, Clone, Copy)]
enum OrderOp {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
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
        (RuleSet { rules: compiled }, errors)
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

// ---- compilation --------------------------------------------------------

fn compile_rule(item: &Value, names_in_use: &HashSet<String>) -> Result<CompiledRule, String> {
    let Value::Object(rule) = item else {
        return Err(format!("a rule must be a mapping, got {}", json_type(item)));
    };
    reject_unknown_keys(rule, &RULE_KEYS, "rule")?;

    let name = match rule.get("name") {
        None => return Err("missing name".to_string()),
        Some(Value::String(name)) if name.trim().is_empty() => {
            return Err("name is blank".to_string())
        }
        Some(Value::String(name)) => name.clone(),
        Some(other) => return Err(format!("name must be a string, got {}", json_type(other))),
    };
    if names_in_use.contains(&name) {
        return Err("an earlier rule has the same name".to_string());
    }

    let status = match rule.get("status") {
        None => DEFAULT_STATUS,
        Some(value) => value
            .as_u64()
            .filter(|code| (400..=599).contains(code))
            .and_then(|code| u16::try_from(code).ok())
            .ok_or_else(|| format!("status must be an integer in 400..=599, got {value}"))?,
    };

    let message = match rule.get("message") {
        None => format!("request rejected by rule {name}"),
        Some(Value::String(message)) => message.clone(),
        Some(other) => {
            return Err(format!(
                "message must be a string, got {}",
                json_type(other)
            ))
        }
    };

    let when = rule.get("when").ok_or("missing when")?;
    let condition = compile_condition(when, "when", 1)?;

    Ok(CompiledRule {
        name,
        status,
        message,
        hits: AtomicU64::new(0),
        condition,
        configured_when: when.clone(),
    })
}

/// `at` is where this condition sits inside the rule (`when.any[1].all[0]`),
/// so an error points at the offending part of a large tree.
fn compile_condition(value: &Value, at: &str, depth: usize) -> Result<Condition, String> {
    if depth > MAX_CONDITION_DEPTH {
        return Err(format!(
            "{at}: conditions nested deeper than {MAX_CONDITION_DEPTH} levels"
        ));
    }
    let Value::Object(condition) = value else {
        return Err(format!(
            "{at}: a condition must be a mapping, got {}",
            json_type(value)
        ));
    };

    if let Some(combinator) = ["all", "any"]
        .into_iter()
        .find(|key| condition.contains_key(*key))
    {
        if condition.len() != 1 {
            let others: Vec<&str> = condition
                .keys()
                .map(String::as_str)
                .filter(|key| *key != combinator)
                .collect();
            return Err(format!(
                "{at}: '{combinator}' cannot be combined with {others:?} in one condition; nest them"
            ));
        }
        let members = match condition.get(combinator) {
            Some(Value::Array(members)) if members.is_empty() => {
                // An empty `all` would match every request.
                return Err(format!("{at}.{combinator}: empty list"));
            }
            Some(Value::Array(members)) => members,
            other => {
                return Err(format!(
                    "{at}.{combinator}: must be a list of conditions, got {}",
                    other.map_or("nothing", json_type)
                ))
            }
        };
        let compiled = members
            .iter()
            .enumerate()
            .map(|(index, member)| {
                compile_condition(member, &format!("{at}.{combinator}[{index}]"), depth + 1)
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(if combinator == "all" {
            Condition::All(compiled)
        } else {
            Condition::Any(compiled)
        });
    }

    reject_unknown_keys(condition, &LEAF_KEYS, at)?;
    let field_name = match condition.get("field") {
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(format!(
                "{at}: field must be a string, got {}",
                json_type(other)
            ))
        }
        None => return Err(format!("{at}: needs 'field' and 'op', or 'all' / 'any'")),
    };
    let op = match condition.get("op") {
        Some(Value::String(op)) => op.as_str(),
        Some(other) => {
            return Err(format!(
                "{at}: op must be a string, got {}",
                json_type(other)
            ))
        }
        None => return Err(format!("{at}: missing op")),
    };
    let (field, kind) = compile_field(field_name).map_err(|reason| format!("{at}: {reason}"))?;
    let test =
        compile_test(op, condition.get("value")).map_err(|reason| format!("{at}: {reason}"))?;
    check_field_supports(field_name, kind, &test).map_err(|reason| format!("{at}: {reason}"))?;
    Ok(Condition::Test { field, test })
}

fn compile_field(name: &str) -> Result<(Field, FieldKind), String> {
    let named = match name {
        "input_bytes" => Some((Field::InputBytes, FieldKind::AlwaysNumber)),
        "input_chars" => Some((Field::InputChars, FieldKind::AlwaysNumber)),
        "messages_count" => Some((Field::MessagesCount, FieldKind::AlwaysNumber)),
        "tools_count" => Some((Field::ToolsCount, FieldKind::AlwaysNumber)),
        "max_tokens" => Some((Field::MaxTokens, FieldKind::FromBody)),
        "stream" => Some((Field::Stream, FieldKind::AlwaysBool)),
        _ => None,
    };
    if let Some(field) = named {
        return Ok(field);
    }
    if name.is_empty() {
        return Err("field is empty".to_string());
    }
    let segments = name
        .split('.')
        .map(|segment| {
            if segment.is_empty() {
                return Err(format!("field {name:?} has an empty path segment"));
            }
            let index = if segment.bytes().all(|byte| byte.is_ascii_digit()) {
                segment.parse().ok()
            } else {
                None
            };
            Ok(PathSegment {
                key: segment.to_string(),
                index,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((Field::Path(segments), FieldKind::FromBody))
}

fn compile_test(op: &str, value: Option<&Value>) -> Result<Test, String> {
    let needs_value = || -> Result<&Value, String> {
        match value {
            None => Err(format!("op {op} needs a value")),
            Some(Value::Null) => Err(format!(
                "op {op} with value null never matches (a null field counts as absent); use exists / absent"
            )),
            Some(value) => Ok(value),
        }
    };
    let order = |order_op: OrderOp| -> Result<Test, String> {
        match needs_value()? {
            Value::Number(bound) => Ok(Test::Order(order_op, bound.clone())),
            other => Err(format!("op {op} needs a number, got {}", json_type(other))),
        }
    };
    let list = || -> Result<Vec<Value>, String> {
        match needs_value()? {
            Value::Array(items) if items.iter().any(Value::is_null) => Err(format!(
                "op {op}: null in the list never matches (a null field counts as absent)"
            )),
            Value::Array(items) => Ok(items.clone()),
            other => Err(format!("op {op} needs a list, got {}", json_type(other))),
        }
    };
    let string = || -> Result<&String, String> {
        match needs_value()? {
            Value::String(text) => Ok(text),
            other => Err(format!("op {op} needs a string, got {}", json_type(other))),
        }
    };

    match op {
        "gt" => order(OrderOp::Greater),
        "ge" => order(OrderOp::GreaterOrEqual),
        "lt" => order(OrderOp::Less),
        "le" => order(OrderOp::LessOrEqual),
        "eq" => Ok(Test::Equal(needs_value()?.clone())),
        "ne" => Ok(Test::NotEqual(needs_value()?.clone())),
        "in" => Ok(Test::In(list()?)),
        "nin" => Ok(Test::NotIn(list()?)),
        "match" => Regex::new(string()?)
            .map(Test::Matches)
            .map_err(|error| format!("op match: invalid regex: {error}")),
        "contains" => Ok(Test::Contains(needs_value()?.clone())),
        "prefix" => Ok(Test::Prefix(string()?.clone())),
        "exists" | "absent" if value.is_some() => Err(format!("op {op} takes no value")),
        "exists" => Ok(Test::Exists),
        "absent" => Ok(Test::Absent),
        unknown => Err(format!(
            "unknown op {unknown:?} (expected gt ge lt le eq ne in nin match contains prefix exists absent)"
        )),
    }
}

/// Computed fields have a fixed type, so some rules on them are constant; such
/// a rule is almost certainly a mistake and is refused rather than silently
/// never (or always) firing.
fn check_field_supports(field_name: &str, kind: FieldKind, test: &Test) -> Result<(), String> {
    let operands: &[Value] = match test {
        Test::Equal(value) | Test::NotEqual(value) => std::slice::from_ref(value),
        Test::In(items) | Test::NotIn(items) => items,
        _ => &[],
    };
    let (type_name, operand_fits): (&str, fn(&Value) -> bool) = match kind {
        FieldKind::FromBody => return Ok(()),
        FieldKind::AlwaysNumber => ("a number", Value::is_number),
        FieldKind::AlwaysBool => ("true or false", Value::is_boolean),
    };
    let op_fits = match test {
        Test::Order(..) => kind == FieldKind::AlwaysNumber,
        Test::Equal(_) | Test::NotEqual(_) | Test::In(_) | Test::NotIn(_) => true,
        Test::Matches(_) | Test::Contains(_) | Test::Prefix(_) => false,
        Test::Exists | Test::Absent => {
            return Err(format!(
                "{field_name} is always present, so exists / absent is constant"
            ))
        }
    };
    if !op_fits {
        return Err(format!(
            "{field_name} is always {type_name}; this op never matches it"
        ));
    }
    if !operands.iter().all(operand_fits) {
        return Err(format!(
            "{field_name} is always {type_name}; compare it with {type_name}"
        ));
    }
    Ok(())
}

fn reject_unknown_keys(
    object: &Map<String, Value>,
    allowed: &[&str],
    at: &str,
) -> Result<(), String> {
    match object.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(unknown) => Err(format!(
            "{at}: unknown key {unknown:?} (allowed: {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

// ---- evaluation ---------------------------------------------------------

/// One request's view for one `evaluate` call: facts that are costly to
/// compute are filled in on first use and shared by every rule after that.
struct Evaluation<'f, 'a> {
    facts: &'f RequestFacts<'a>,
    input_chars: OnceCell<u64>,
}

impl<'f, 'a> Evaluation<'f, 'a> {
    fn new(facts: &'f RequestFacts<'a>) -> Self {
        Evaluation {
            facts,
            input_chars: OnceCell::new(),
        }
    }

    /// The field's value, or `None` when it is absent (missing or `null`).
    fn resolve(&self, field: &Field) -> Option<Cow<'a, Value>> {
        let body: &'a Value = self.facts.body;
        let count = |n: usize| Some(Cow::Owned(Value::from(n)));
        let resolved = match field {
            Field::InputBytes => return count(self.facts.raw_len),
            Field::InputChars => {
                let chars = *self.input_chars.get_or_init(|| count_input_chars(body));
                return Some(Cow::Owned(Value::from(chars)));
            }
            Field::MessagesCount => return count(array_len(body.get("messages"))),
            Field::ToolsCount => return count(array_len(body.get("tools"))),
            Field::Stream => {
                let streaming = body.get("stream") == Some(&Value::Bool(true));
                return Some(Cow::Owned(Value::Bool(streaming)));
            }
            Field::MaxTokens => ["max_tokens", "max_completion_tokens"]
                .iter()
                .filter_map(|key| body.get(key))
                .find(|value| !value.is_null()),
            Field::Path(segments) => segments.iter().try_fold(body, |node, segment| match node {
                Value::Object(map) => map.get(&segment.key),
                Value::Array(items) => segment.index.and_then(|index| items.get(index)),
                _ => None,
            }),
        };
        resolved.filter(|value| !value.is_null()).map(Cow::Borrowed)
    }
}

fn array_len(value: Option<&Value>) -> usize {
    value.and_then(Value::as_array).map_or(0, Vec::len)
}

fn count_input_chars(body: &Value) -> u64 {
    #[cfg(test)]
    tests::INPUT_CHARS_COMPUTATIONS.with(|count| count.set(count.get() + 1));

    let text_chars = |text: Option<&Value>| {
        text.and_then(Value::as_str)
            .map_or(0, |s| s.chars().count())
    };
    let mut total = 0usize;
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match message.get("content") {
            Some(Value::String(content)) => total += content.chars().count(),
            Some(Value::Array(parts)) => {
                for part in parts {
                    if part.get("type").and_then(Value::as_str) == Some("text") {
                        total += text_chars(part.get("text"));
                    }
                }
            }
            _ => {}
        }
    }
    total += text_chars(body.get("prompt"));
    u64::try_from(total).unwrap_or(u64::MAX)
}

impl Condition {
    fn matches(&self, evaluation: &Evaluation) -> bool {
        match self {
            Condition::All(members) => members.iter().all(|member| member.matches(evaluation)),
            Condition::Any(members) => members.iter().any(|member| member.matches(evaluation)),
            Condition::Test { field, test } => test.matches(evaluation.resolve(field).as_deref()),
        }
    }
}

impl Test {
    fn matches(&self, actual: Option<&Value>) -> bool {
        let Some(actual) = actual else {
            return matches!(self, Test::Absent);
        };
        match self {
            Test::Order(op, bound) => match actual {
                Value::Number(number) => {
                    compare_numbers(number, bound).is_some_and(|ordering| op.accepts(ordering))
                }
                _ => false,
            },
            Test::Equal(expected) => json_equal(actual, expected),
            Test::NotEqual(expected) => !json_equal(actual, expected),
            Test::In(candidates) => candidates
                .iter()
                .any(|candidate| json_equal(actual, candidate)),
            Test::NotIn(candidates) => !candidates
                .iter()
                .any(|candidate| json_equal(actual, candidate)),
            Test::Matches(regex) => actual.as_str().is_some_and(|text| regex.is_match(text)),
            Test::Contains(needle) => match actual {
                Value::String(text) => needle.as_str().is_some_and(|needle| text.contains(needle)),
                Value::Array(items) => items.iter().any(|item| json_equal(item, needle)),
                _ => false,
            },
            Test::Prefix(prefix) => actual
                .as_str()
                .is_some_and(|text| text.starts_with(prefix.as_str())),
            Test::Exists => true,
            Test::Absent => false,
        }
    }
}

impl OrderOp {
    fn accepts(self, ordering: Ordering) -> bool {
        match self {
            OrderOp::Greater => ordering == Ordering::Greater,
            OrderOp::GreaterOrEqual => ordering != Ordering::Less,
            OrderOp::Less => ordering == Ordering::Less,
            OrderOp::LessOrEqual => ordering != Ordering::Greater,
        }
    }
}

/// Integers compare exactly (an f64 cannot tell 2^53 from 2^53 + 1); anything
/// involving a float compares as f64.
fn compare_numbers(left: &Number, right: &Number) -> Option<Ordering> {
    let as_integer = |n: &Number| {
        n.as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
    };
    match (as_integer(left), as_integer(right)) {
        (Some(left), Some(right)) => Some(left.cmp(&right)),
        _ => left.as_f64()?.partial_cmp(&right.as_f64()?),
    }
}

/// JSON equality where numbers compare by value, at any depth: a rule
/// written with `1.0` must match a client that sends `1`, and vice versa.
fn json_equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(left), Value::Number(right)) => {
            compare_numbers(left, right) == Some(Ordering::Equal)
        }
        (Value::Array(left), Value::Array(right)) => {
            left.len() == right.len() && left.iter().zip(right).all(|(l, r)| json_equal(l, r))
        }
        (Value::Object(left), Value::Object(right)) => {
            left.len() == right.len()
                && left
                    .iter()
                    .all(|(key, l)| right.get(key).is_some_and(|r| json_equal(l, r)))
        }
        _ => left == right,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;

    thread_local! {
        pub(super) static INPUT_CHARS_COMPUTATIONS: Cell<usize> = const { Cell::new(0) };
    }

    fn compile_clean(rules: Value) -> RuleSet {
        let (set, errors) = RuleSet::compile(&rules);
        assert!(errors.is_empty(), "unexpected errors: {errors:?}");
        set
    }

    fn facts(body: &Value) -> RequestFacts<'_> {
        RequestFacts {
            body,
            raw_len: body.to_string().len(),
        }
    }

    /// Whether a single valid condition matches the body.
    fn matches(when: Value, body: Value) -> bool {
        let set = compile_clean(json!([{"name": "rule", "when": when}]));
        set.evaluate(&facts(&body)).is_some()
    }

    fn leaf(field: &str, op: &str, value: Value) -> Value {
        json!({"field": field, "op": op, "value": value})
    }

    fn compile_error(rule: Value) -> String {
        let (set, errors) = RuleSet::compile(&json!([rule]));
        assert!(set.is_empty(), "rule should have been dropped");
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors.into_iter().next().unwrap_or_default()
    }

    // ---- fields -----------------------------------------------------------

    #[test]
    fn field_input_bytes_is_the_raw_length() {
        let set =
            compile_clean(json!([{"name": "big", "when": leaf("input_bytes", "gt", json!(100))}]));
        let body = json!({});
        assert!(set
            .evaluate(&RequestFacts {
                body: &body,
                raw_len: 101
            })
            .is_some());
        assert!(set
            .evaluate(&RequestFacts {
                body: &body,
                raw_len: 100
            })
            .is_none());
    }

    #[test]
    fn named_fields_take_precedence_over_body_keys() {
        let set =
            compile_clean(json!([{"name": "big", "when": leaf("input_bytes", "gt", json!(100))}]));
        let body = json!({"input_bytes": 5});
        assert!(set
            .evaluate(&RequestFacts {
                body: &body,
                raw_len: 1000
            })
            .is_some());
    }

    #[test]
    fn field_input_chars_counts_string_content_and_text_parts() {
        let body = json!({"messages": [
            {"role": "system", "content": "héllo"},
            {"role": "user", "content": [
                {"type": "text", "text": "ab😀"},
                {"type": "image_url", "image_url": {"url": "data:aaaaaaaaaaaaaaa"}},
                {"type": "text"},
                {"text": "no type, not counted"}
            ]},
            {"role": "assistant", "content": null, "tool_calls": []}
        ]});
        assert!(matches(leaf("input_chars", "eq", json!(8)), body.clone()));
        assert!(!matches(leaf("input_chars", "eq", json!(9)), body));
    }

    #[test]
    fn field_input_chars_counts_a_string_prompt() {
        assert!(matches(
            leaf("input_chars", "eq", json!(3)),
            json!({"prompt": "abc"})
        ));
        assert!(matches(
            leaf("input_chars", "eq", json!(0)),
            json!({"prompt": ["abc"]})
        ));
        assert!(matches(
            leaf("input_chars", "eq", json!(0)),
            json!("not an object")
        ));
    }

    #[test]
    fn field_input_chars_is_computed_at_most_once_and_only_when_used() {
        let set = compile_clean(json!([
            {"name": "a", "when": {"all": [
                leaf("input_chars", "gt", json!(1)),
                leaf("input_chars", "lt", json!(2))
            ]}},
            {"name": "b", "when": {"any": [
                leaf("input_chars", "eq", json!(100)),
                leaf("input_chars", "eq", json!(200))
            ]}}
        ]));
        let body = json!({"messages": [{"role": "user", "content": "hello"}]});
        INPUT_CHARS_COMPUTATIONS.with(|count| count.set(0));
        assert!(set.evaluate(&facts(&body)).is_none());
        assert_eq!(INPUT_CHARS_COMPUTATIONS.with(Cell::get), 1);

        let without_chars =
            compile_clean(json!([{"name": "a", "when": leaf("model", "eq", json!("m"))}]));
        INPUT_CHARS_COMPUTATIONS.with(|count| count.set(0));
        assert!(without_chars.evaluate(&facts(&body)).is_none());
        assert_eq!(INPUT_CHARS_COMPUTATIONS.with(Cell::get), 0);
    }

    #[test]
    fn field_messages_count() {
        let body = json!({"messages": [{"role": "user"}, {"role": "user"}, {"role": "user"}]});
        assert!(matches(
            leaf("messages_count", "eq", json!(3)),
            body.clone()
        ));
        assert!(!matches(leaf("messages_count", "gt", json!(3)), body));
        assert!(matches(
            leaf("messages_count", "eq", json!(0)),
            json!({"prompt": "x"})
        ));
        assert!(matches(
            leaf("messages_count", "eq", json!(0)),
            json!({"messages": "x"})
        ));
    }

    #[test]
    fn field_tools_count() {
        let body = json!({"tools": [{"type": "function"}, {"type": "function"}]});
        assert!(matches(leaf("tools_count", "ge", json!(2)), body.clone()));
        assert!(!matches(leaf("tools_count", "gt", json!(2)), body));
        assert!(matches(leaf("tools_count", "eq", json!(0)), json!({})));
    }

    #[test]
    fn field_max_tokens_falls_back_to_max_completion_tokens() {
        let over = leaf("max_tokens", "gt", json!(1000));
        assert!(matches(over.clone(), json!({"max_tokens": 2000})));
        assert!(!matches(
            over.clone(),
            json!({"max_tokens": 500, "max_completion_tokens": 2000})
        ));
        assert!(matches(
            over.clone(),
            json!({"max_completion_tokens": 2000})
        ));
        assert!(matches(
            over.clone(),
            json!({"max_tokens": null, "max_completion_tokens": 2000})
        ));
        assert!(!matches(over, json!({})));
        assert!(matches(
            json!({"field": "max_tokens", "op": "absent"}),
            json!({"max_tokens": null})
        ));
    }

    #[test]
    fn field_stream_defaults_to_false() {
        assert!(matches(
            leaf("stream", "eq", json!(true)),
            json!({"stream": true})
        ));
        assert!(!matches(
            leaf("stream", "eq", json!(true)),
            json!({"stream": false})
        ));
        assert!(matches(leaf("stream", "eq", json!(false)), json!({})));
        assert!(matches(
            leaf("stream", "eq", json!(false)),
            json!({"stream": "true"})
        ));
    }

    #[test]
    fn field_model() {
        assert!(matches(
            leaf("model", "eq", json!("gpt-4o")),
            json!({"model": "gpt-4o"})
        ));
        assert!(!matches(
            leaf("model", "eq", json!("gpt-4o")),
            json!({"model": "gpt-4o-mini"})
        ));
    }

    #[test]
    fn field_dotted_paths_walk_objects_and_arrays() {
        let body = json!({
            "metadata": {"user_id": "u-1", "0": "zero-key"},
            "messages": [{"role": "system"}, {"role": "user"}]
        });
        assert!(matches(
            leaf("metadata.user_id", "eq", json!("u-1")),
            body.clone()
        ));
        assert!(!matches(
            leaf("metadata.user_id", "eq", json!("u-2")),
            body.clone()
        ));
        assert!(matches(
            leaf("messages.0.role", "eq", json!("system")),
            body.clone()
        ));
        assert!(matches(
            leaf("messages.1.role", "eq", json!("user")),
            body.clone()
        ));
        assert!(matches(
            json!({"field": "messages.2.role", "op": "absent"}),
            body.clone()
        ));
        assert!(matches(
            leaf("metadata.0", "eq", json!("zero-key")),
            body.clone()
        ));
        assert!(matches(
            json!({"field": "messages.role", "op": "absent"}),
            body.clone()
        ));
        assert!(matches(
            json!({"field": "metadata.user_id.x", "op": "absent"}),
            body.clone()
        ));
        assert!(matches(
            json!({"field": "messages.99999999999999999999999.role", "op": "absent"}),
            body
        ));
    }

    // ---- ops --------------------------------------------------------------

    #[test]
    fn op_gt_ge_lt_le_at_the_boundary() {
        let body = json!({"n": 10});
        assert!(matches(leaf("n", "gt", json!(9)), body.clone()));
        assert!(!matches(leaf("n", "gt", json!(10)), body.clone()));
        assert!(matches(leaf("n", "ge", json!(10)), body.clone()));
        assert!(!matches(leaf("n", "ge", json!(11)), body.clone()));
        assert!(matches(leaf("n", "lt", json!(11)), body.clone()));
        assert!(!matches(leaf("n", "lt", json!(10)), body.clone()));
        assert!(matches(leaf("n", "le", json!(10)), body.clone()));
        assert!(!matches(leaf("n", "le", json!(9)), body));
    }

    #[test]
    fn ordering_ops_compare_ints_and_floats_by_value() {
        assert!(matches(leaf("n", "gt", json!(1)), json!({"n": 1.5})));
        assert!(matches(leaf("n", "ge", json!(2.0)), json!({"n": 2})));
        assert!(matches(leaf("n", "lt", json!(-0.5)), json!({"n": -1})));
        assert!(matches(
            leaf("n", "gt", json!(i64::MAX)),
            json!({"n": u64::MAX})
        ));
        assert!(matches(
            leaf("n", "gt", json!(9_007_199_254_740_992_u64)),
            json!({"n": 9_007_199_254_740_993_u64})
        ));
    }

    #[test]
    fn ordering_ops_never_match_non_numbers() {
        for op in ["gt", "ge", "lt", "le"] {
            for value in [json!("500"), json!(true), json!([500]), json!({"n": 500})] {
                assert!(
                    !matches(leaf("n", op, json!(0)), json!({"n": value})),
                    "{op} {value}"
                );
            }
            assert!(
                !matches(leaf("n", op, json!(0)), json!({})),
                "{op} on missing"
            );
        }
    }

    #[test]
    fn op_eq_is_json_equality_with_numeric_numbers() {
        assert!(matches(leaf("x", "eq", json!("a")), json!({"x": "a"})));
        assert!(!matches(leaf("x", "eq", json!("a")), json!({"x": "A"})));
        assert!(matches(leaf("x", "eq", json!(1)), json!({"x": 1.0})));
        assert!(!matches(leaf("x", "eq", json!(1)), json!({"x": "1"})));
        assert!(matches(leaf("x", "eq", json!(true)), json!({"x": true})));
        assert!(matches(
            leaf("x", "eq", json!({"a": [1, {"b": 2.0}], "c": "d"})),
            json!({"x": {"c": "d", "a": [1.0, {"b": 2}]}})
        ));
        assert!(!matches(
            leaf("x", "eq", json!({"a": 1})),
            json!({"x": {"a": 1, "b": 2}})
        ));
        assert!(!matches(
            leaf("x", "eq", json!([1, 2])),
            json!({"x": [2, 1]})
        ));
    }

    #[test]
    fn op_ne() {
        assert!(matches(
            leaf("model", "ne", json!("a")),
            json!({"model": "b"})
        ));
        assert!(!matches(
            leaf("model", "ne", json!("a")),
            json!({"model": "a"})
        ));
        assert!(!matches(leaf("n", "ne", json!(1)), json!({"n": 1.0})));
        assert!(
            !matches(leaf("model", "ne", json!("a")), json!({})),
            "absent never matches ne"
        );
        assert!(!matches(
            leaf("model", "ne", json!("a")),
            json!({"model": null})
        ));
    }

    #[test]
    fn op_in_and_nin() {
        let allowed = json!(["small", "medium", 2.0]);
        assert!(matches(
            leaf("model", "in", allowed.clone()),
            json!({"model": "small"})
        ));
        assert!(!matches(
            leaf("model", "in", allowed.clone()),
            json!({"model": "large"})
        ));
        assert!(matches(
            leaf("model", "in", allowed.clone()),
            json!({"model": 2})
        ));
        assert!(matches(
            leaf("model", "nin", allowed.clone()),
            json!({"model": "large"})
        ));
        assert!(!matches(
            leaf("model", "nin", allowed.clone()),
            json!({"model": "medium"})
        ));
        assert!(!matches(leaf("model", "in", allowed.clone()), json!({})));
        assert!(
            !matches(leaf("model", "nin", allowed), json!({})),
            "absent never matches nin"
        );
        assert!(matches(
            leaf("model", "nin", json!([])),
            json!({"model": "x"})
        ));
    }

    #[test]
    fn op_match_is_an_unanchored_regex_on_strings() {
        assert!(matches(
            leaf("model", "match", json!("^llama-3\\.\\d")),
            json!({"model": "llama-3.1-70b"})
        ));
        assert!(!matches(
            leaf("model", "match", json!("^llama-3\\.\\d")),
            json!({"model": "my-llama-3.1"})
        ));
        assert!(matches(
            leaf("model", "match", json!("70b")),
            json!({"model": "llama-3.1-70b"})
        ));
        assert!(!matches(leaf("n", "match", json!("1")), json!({"n": 1})));
    }

    #[test]
    fn op_contains_on_strings_and_arrays() {
        assert!(matches(
            leaf("s", "contains", json!("needle")),
            json!({"s": "haystack needle hay"})
        ));
        assert!(!matches(
            leaf("s", "contains", json!("needle")),
            json!({"s": "haystack"})
        ));
        assert!(matches(
            leaf("a", "contains", json!(2)),
            json!({"a": [1, 2.0, 3]})
        ));
        assert!(matches(
            leaf("a", "contains", json!({"k": "v"})),
            json!({"a": [{"k": "v"}]})
        ));
        assert!(!matches(
            leaf("a", "contains", json!("x")),
            json!({"a": ["xy"]})
        ));
        assert!(!matches(leaf("s", "contains", json!(1)), json!({"s": "1"})));
        assert!(!matches(
            leaf("o", "contains", json!("k")),
            json!({"o": {"k": 1}})
        ));
    }

    #[test]
    fn op_prefix() {
        assert!(matches(
            leaf("model", "prefix", json!("gpt-")),
            json!({"model": "gpt-4o"})
        ));
        assert!(!matches(
            leaf("model", "prefix", json!("gpt-")),
            json!({"model": "chatgpt-4o"})
        ));
        assert!(!matches(leaf("n", "prefix", json!("1")), json!({"n": 12})));
    }

    #[test]
    fn op_exists_and_absent_treat_null_as_absent() {
        let exists = json!({"field": "metadata.user_id", "op": "exists"});
        let absent = json!({"field": "metadata.user_id", "op": "absent"});
        let present = json!({"metadata": {"user_id": ""}});
        assert!(matches(exists.clone(), present.clone()));
        assert!(!matches(absent.clone(), present));
        for missing in [
            json!({}),
            json!({"metadata": {}}),
            json!({"metadata": {"user_id": null}}),
        ] {
            assert!(!matches(exists.clone(), missing.clone()));
            assert!(matches(absent.clone(), missing));
        }
    }

    // ---- combinators ------------------------------------------------------

    #[test]
    fn all_and_any_nest_at_least_three_levels() {
        let when = json!({"all": [
            leaf("stream", "eq", json!(true)),
            {"any": [
                leaf("model", "prefix", json!("big-")),
                {"all": [
                    leaf("max_tokens", "gt", json!(4096)),
                    {"any": [
                        leaf("metadata.tier", "eq", json!("free")),
                        {"field": "metadata.tier", "op": "absent"}
                    ]}
                ]}
            ]}
        ]});
        let cases = [
            (json!({"stream": true, "model": "big-1"}), true),
            (json!({"stream": false, "model": "big-1"}), false),
            (
                json!({"stream": true, "model": "small", "max_tokens": 8000}),
                true,
            ),
            (
                json!({"stream": true, "model": "small", "max_tokens": 8000, "metadata": {"tier": "free"}}),
                true,
            ),
            (
                json!({"stream": true, "model": "small", "max_tokens": 8000, "metadata": {"tier": "paid"}}),
                false,
            ),
            (
                json!({"stream": true, "model": "small", "max_tokens": 100}),
                false,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(matches(when.clone(), body.clone()), expected, "{body}");
        }
    }

    // ---- rule set behaviour ----------------------------------------------

    #[test]
    fn first_matching_rule_wins_and_only_it_counts_a_hit() {
        let set = compile_clean(json!([
            {"name": "no-streaming", "when": leaf("stream", "eq", json!(true))},
            {"name": "streaming-gpt", "status": 403, "when": leaf("model", "prefix", json!("gpt"))},
            {"name": "anything-gpt", "when": leaf("model", "prefix", json!("gpt"))}
        ]));
        let body = json!({"model": "gpt-4o", "stream": false});
        let rule = set.evaluate(&facts(&body)).map(|rule| rule.name.as_str());
        assert_eq!(rule, Some("streaming-gpt"));
        let body = json!({"model": "gpt-4o", "stream": true});
        assert_eq!(
            set.evaluate(&facts(&body)).map(|r| r.name.as_str()),
            Some("no-streaming")
        );
        assert!(set.evaluate(&facts(&json!({"model": "llama"}))).is_none());

        let hits: Vec<u64> = set
            .rules
            .iter()
            .map(|r| r.hits.load(AtomicOrdering::Relaxed))
            .collect();
        assert_eq!(hits, [1, 1, 0]);
    }

    #[test]
    fn hits_accumulate_and_show_in_status_json() {
        let when = leaf("model", "eq", json!("m"));
        let set = compile_clean(json!([{"name": "m", "message": "no m", "when": when}]));
        let body = json!({"model": "m"});
        for _ in 0..3 {
            assert!(set.evaluate(&facts(&body)).is_some());
        }
        assert!(set.evaluate(&facts(&json!({"model": "n"}))).is_none());
        assert_eq!(
            set.status_json(),
            json!([{"name": "m", "status": 429, "message": "no m", "when": when, "hits": 3}])
        );
    }

    #[test]
    fn status_defaults_to_429_and_accepts_400_to_599() {
        let always = json!({"field": "messages", "op": "absent"});
        let set = compile_clean(json!([
            {"name": "default", "when": always},
            {"name": "low", "status": 400, "when": always},
            {"name": "high", "status": 599, "when": always},
        ]));
        let statuses: Vec<u16> = set.rules.iter().map(|rule| rule.status).collect();
        assert_eq!(statuses, [429, 400, 599]);
        assert_eq!(set.rules[0].message, "request rejected by rule default");
    }

    #[test]
    fn status_outside_400_to_599_or_not_an_integer_drops_the_rule() {
        for status in [
            json!(399),
            json!(600),
            json!(0),
            json!(-429),
            json!(429.5),
            json!("429"),
            json!(70000),
        ] {
            let error = compile_error(
                json!({"name": "r", "status": status, "when": {"field": "a", "op": "exists"}}),
            );
            assert!(error.contains("status"), "{error}");
        }
    }

    #[test]
    fn invalid_rules_are_dropped_and_the_rest_still_work() {
        let rules = json!([
            {"name": "ok-1", "when": leaf("model", "eq", json!("one"))},
            {"name": "bad-op", "when": leaf("model", "equals", json!("x"))},
            {"name": "bad-key", "when": leaf("model", "eq", json!("x")), "enabled": true},
            {"name": "bad-regex", "when": leaf("model", "match", json!("(unclosed"))},
            {"name": "bad-value", "when": leaf("n", "gt", json!("100"))},
            {"name": "bad-status", "status": 200, "when": leaf("model", "eq", json!("x"))},
            {"when": leaf("model", "eq", json!("x"))},
            {"name": "ok-2", "when": leaf("model", "eq", json!("two"))},
            "not a mapping"
        ]);
        let (set, errors) = RuleSet::compile(&rules);
        assert_eq!(set.len(), 2);
        assert_eq!(errors.len(), 7, "{errors:?}");
        for (error, index) in errors.iter().zip([1, 2, 3, 4, 5, 6, 8]) {
            assert!(
                error.starts_with(&format!("reject_rules[{index}]")),
                "{error}"
            );
        }
        assert!(errors[0].contains("\"bad-op\"") && errors[0].contains("unknown op"));
        assert!(errors[1].contains("\"enabled\""));
        assert!(errors[2].contains("regex"));
        assert!(errors[5].contains("missing name"));
        assert_eq!(
            set.evaluate(&facts(&json!({"model": "one"})))
                .map(|r| r.name.as_str()),
            Some("ok-1")
        );
        assert_eq!(
            set.evaluate(&facts(&json!({"model": "two"})))
                .map(|r| r.name.as_str()),
            Some("ok-2")
        );
        assert!(set.evaluate(&facts(&json!({"model": "x"}))).is_none());
    }

    #[test]
    fn malformed_conditions_are_reported_with_their_location() {
        let cases = [
            (
                json!({"any": [leaf("a", "eq", json!(1)), {"all": [{"field": "b", "op": "eq", "valu": 1}]}]}),
                "when.any[1].all[0]: unknown key \"valu\"",
            ),
            (json!({"all": []}), "when.all: empty list"),
            (json!({"any": {"field": "a"}}), "when.any: must be a list"),
            (
                json!({"all": [leaf("a", "eq", json!(1))], "any": [leaf("a", "eq", json!(1))]}),
                "nest them",
            ),
            (
                json!({"all": [leaf("a", "eq", json!(1))], "field": "a"}),
                "nest them",
            ),
            (json!({"field": "a"}), "missing op"),
            (json!({"op": "eq", "value": 1}), "needs 'field' and 'op'"),
            (
                json!({"field": 3, "op": "eq", "value": 1}),
                "field must be a string",
            ),
            (
                json!({"field": "a..b", "op": "exists"}),
                "empty path segment",
            ),
            (json!({"field": "", "op": "exists"}), "field is empty"),
            (json!({"field": "a", "op": "eq"}), "needs a value"),
            (
                json!({"field": "a", "op": "eq", "value": null}),
                "use exists / absent",
            ),
            (
                json!({"field": "a", "op": "in", "value": "x"}),
                "needs a list",
            ),
            (
                json!({"field": "a", "op": "in", "value": ["x", null]}),
                "null in the list",
            ),
            (
                json!({"field": "a", "op": "prefix", "value": 1}),
                "needs a string",
            ),
            (
                json!({"field": "a", "op": "match", "value": ["x"]}),
                "needs a string",
            ),
            (
                json!({"field": "a", "op": "exists", "value": true}),
                "takes no value",
            ),
            (
                json!({"field": "input_bytes", "op": "match", "value": "1"}),
                "never matches",
            ),
            (
                json!({"field": "stream", "op": "gt", "value": 0}),
                "never matches",
            ),
            (
                json!({"field": "stream", "op": "eq", "value": "true"}),
                "compare it with true or false",
            ),
            (
                json!({"field": "messages_count", "op": "in", "value": [1, "2"]}),
                "compare it with a number",
            ),
            (
                json!({"field": "input_chars", "op": "absent"}),
                "always present",
            ),
            (json!("model eq x"), "a condition must be a mapping"),
        ];
        for (when, expected) in cases {
            let error = compile_error(json!({"name": "r", "when": when}));
            assert!(
                error.contains(expected),
                "expected {expected:?} in {error:?}"
            );
        }
    }

    #[test]
    fn rule_level_problems_are_reported() {
        let when = json!({"field": "a", "op": "exists"});
        assert!(compile_error(json!({"name": "r"})).contains("missing when"));
        assert!(compile_error(json!({"name": " ", "when": when})).contains("blank"));
        assert!(compile_error(json!({"name": 5, "when": when})).contains("name must be a string"));
        assert!(
            compile_error(json!({"name": "r", "message": 5, "when": when}))
                .contains("message must be a string")
        );

        let (set, errors) =
            RuleSet::compile(&json!([{"name": "r", "when": when}, {"name": "r", "when": when}]));
        assert_eq!(set.len(), 1);
        assert!(errors[0].contains("same name"), "{errors:?}");
    }

    #[test]
    fn nesting_beyond_the_limit_is_dropped_without_overflowing() {
        let mut when = json!({"field": "a", "op": "exists"});
        for _ in 0..MAX_CONDITION_DEPTH {
            when = json!({"all": [when]});
        }
        assert!(compile_error(json!({"name": "deep", "when": when})).contains("nested deeper"));

        let mut when = json!({"field": "a", "op": "exists"});
        for _ in 1..MAX_CONDITION_DEPTH {
            when = json!({"any": [when]});
        }
        assert!(matches(when, json!({"a": 1})));
    }

    #[test]
    fn compile_of_null_and_non_lists() {
        let (set, errors) = RuleSet::compile(&Value::Null);
        assert!(set.is_empty() && errors.is_empty());
        let (set, errors) = RuleSet::compile(&json!({"name": "r"}));
        assert!(set.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("must be a list"));
        assert!(RuleSet::compile(&json!([])).0.is_empty());
    }

    #[test]
    fn rule_sets_can_be_shared_across_worker_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<RuleSet>();
    }

    #[test]
    fn rejection_body_shape() {
        let set = compile_clean(
            json!([{"name": "too-long", "status": 413, "message": "prompt too long",
            "when": leaf("input_chars", "gt", json!(0))}]),
        );
        let body = json!({"prompt": "x"});
        let rule = set.evaluate(&facts(&body)).expect("rule matches");
        assert_eq!(rule.status, 413);
        assert_eq!(
            rejection_body(rule, "chat"),
            json!({"error": {"type": "rejected_by_rule", "rule": "too-long",
                             "message": "prompt too long", "route": "chat"}})
        );
    }

    #[test]
    fn rules_compile_from_yaml() {
        let yaml = r#"
- name: huge-prompt
  status: 413
  when:
    any:
      - {field: input_chars, op: gt, value: 10}
      - all:
          - {field: model, op: prefix, value: "llama-"}
          - {field: max_tokens, op: gt, value: 8192}
- name: no-anon
  message: set metadata.user_id
  when: {field: metadata.user_id, op: absent}
"#;
        let rules: Value = serde_yaml::from_str(yaml).expect("yaml");
        let set = compile_clean(rules);
        let hit = |body: Value| set.evaluate(&facts(&body)).map(|rule| rule.name.clone());
        assert_eq!(
            hit(json!({"prompt": "0123456789ab"})),
            Some("huge-prompt".into())
        );
        assert_eq!(
            hit(json!({"model": "llama-3", "max_tokens": 9000, "metadata": {"user_id": "u"}})),
            Some("huge-prompt".into())
        );
        assert_eq!(
            hit(json!({"model": "llama-3", "max_tokens": 100})),
            Some("no-anon".into())
        );
        assert_eq!(
            hit(json!({"model": "llama-3", "metadata": {"user_id": "u"}})),
            None
        );
    }

    // ---- properties -------------------------------------------------------
    //
    // Two families of generators: "wide" ones (odd types, unicode, huge
    // numbers, deep junk) look for panics; "dense" ones draw fields and values
    // from a handful of keys and values so that random conditions actually hit
    // the body often enough for the logical properties to mean something.

    const WIDE_KEYS: [&str; 14] = [
        "model",
        "messages",
        "content",
        "role",
        "type",
        "text",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "tools",
        "metadata",
        "prompt",
        "0",
        "1",
    ];
    const DENSE_KEYS: [&str; 6] = ["a", "b", "0", "model", "stream", "max_tokens"];
    const NAMED_FIELDS: [&str; 7] = [
        "input_bytes",
        "input_chars",
        "messages_count",
        "tools_count",
        "max_tokens",
        "stream",
        "model",
    ];

    fn wide_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-3i64..20).prop_map(Value::from),
            any::<f64>().prop_map(Value::from), // NaN/inf become null
            Just(Value::from(u64::MAX)),
            ".{0,6}".prop_map(Value::String),
            prop::sample::select(WIDE_KEYS.to_vec()).prop_map(Value::from),
        ]
    }

    fn wide_json() -> impl Strategy<Value = Value> {
        wide_leaf().prop_recursive(5, 48, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                object_of(prop::sample::select(WIDE_KEYS.to_vec()), inner),
            ]
        })
    }

    fn dense_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            1 => Just(Value::Null),
            1 => any::<bool>().prop_map(Value::Bool),
            2 => (0i64..3).prop_map(Value::from),
            1 => Just(Value::from(1.0)),
            3 => prop::sample::select(vec!["", "a", "b", "ab"]).prop_map(Value::from),
        ]
    }

    fn dense_json() -> impl Strategy<Value = Value> {
        dense_leaf().prop_recursive(3, 16, 3, |inner| {
            prop_oneof![
                2 => inner.clone(),
                1 => prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                1 => object_of(prop::sample::select(DENSE_KEYS.to_vec()), inner),
            ]
        })
    }

    /// Mostly scalars, so that equality with a body value is common.
    fn dense_operand() -> impl Strategy<Value = Value> {
        prop_oneof![3 => dense_leaf(), 1 => dense_json()].prop_filter("null is refused", not_null)
    }

    fn not_null(value: &Value) -> bool {
        !value.is_null()
    }

    fn object_of(
        keys: impl Strategy<Value = &'static str>,
        values: impl Strategy<Value = Value>,
    ) -> impl Strategy<Value = Value> {
        prop::collection::vec((keys, values), 0..8).prop_map(|pairs| {
            Value::Object(
                pairs
                    .into_iter()
                    .map(|(key, value)| (key.to_string(), value))
                    .collect(),
            )
        })
    }

    fn chat_body(pieces: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
        let content = prop_oneof![
            pieces.clone(),
            "[ab😀]{0,6}".prop_map(Value::String),
            prop::collection::vec(
                ("[ab]{0,4}", prop::sample::select(vec!["text", "image_url"]))
                    .prop_map(|(text, kind)| json!({"type": kind, "text": text})),
                0..3
            )
            .prop_map(Value::Array),
        ];
        let message = (
            prop::sample::select(vec!["system", "user", "assistant"]),
            content,
        )
            .prop_map(|(role, content)| json!({"role": role, "content": content}));
        (
            prop::collection::vec(message, 0..4),
            [pieces.clone(), pieces.clone(), pieces.clone(), pieces],
        )
            .prop_map(|(messages, [model, stream, max_tokens, a])| {
                json!({"model": model, "messages": messages, "stream": stream,
                       "max_tokens": max_tokens, "a": a})
            })
    }

    fn wide_body() -> impl Strategy<Value = Value> {
        prop_oneof![wide_json(), chat_body(wide_json().boxed())]
    }

    fn dense_body() -> impl Strategy<Value = Value> {
        prop_oneof![
            object_of(prop::sample::select(DENSE_KEYS.to_vec()), dense_json()),
            chat_body(dense_json().boxed()),
        ]
    }

    fn field_name(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop_oneof![
            1 => prop::sample::select(NAMED_FIELDS.to_vec()).prop_map(String::from),
            3 => prop::sample::select(keys).prop_map(String::from),
            1 => prop::collection::vec(prop::sample::select(keys), 2..4)
                .prop_map(|segments| segments.join(".")),
        ]
    }

    fn leaf_condition(
        keys: &'static [&'static str],
        operands: BoxedStrategy<Value>,
    ) -> impl Strategy<Value = Value> {
        let op_and_value = prop_oneof![
            (
                prop::sample::select(vec!["gt", "ge", "lt", "le"]),
                prop_oneof![0i64..3, 0i64..200].prop_map(|n| Some(Value::from(n)))
            ),
            (
                prop::sample::select(vec!["eq", "ne", "contains"]),
                operands.clone().prop_map(Some)
            ),
            (
                prop::sample::select(vec!["in", "nin"]),
                prop::collection::vec(operands, 0..4).prop_map(|v| Some(Value::Array(v)))
            ),
            (
                Just("match"),
                prop::sample::select(vec!["^a", "b$", "a|😀", ".*", "\\d+", "^$"])
                    .prop_map(|re| Some(Value::from(re)))
            ),
            (
                Just("prefix"),
                prop::sample::select(vec!["", "a", "b"]).prop_map(|p| Some(Value::from(p)))
            ),
            (prop::sample::select(vec!["exists", "absent"]), Just(None)),
        ];
        (field_name(keys), op_and_value).prop_map(|(field, (op, value))| {
            let mut condition = json!({"field": field, "op": op});
            if let (Some(value), Value::Object(map)) = (value, &mut condition) {
                map.insert("value".to_string(), value);
            }
            condition
        })
    }

    fn condition_tree(
        keys: &'static [&'static str],
        operands: BoxedStrategy<Value>,
    ) -> impl Strategy<Value = Value> {
        leaf_condition(keys, operands).prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 1..4)
                    .prop_map(|members| json!({"all": members})),
                prop::collection::vec(inner, 1..4).prop_map(|members| json!({"any": members})),
            ]
        })
    }

    fn dense_tree() -> impl Strategy<Value = Value> {
        condition_tree(&DENSE_KEYS, dense_operand().boxed())
    }

    /// `None` when the condition does not compile (random trees often pair a
    /// computed field with an op it refuses).
    fn evaluate_alone(when: &Value, body: &Value) -> Option<bool> {
        let (set, errors) = RuleSet::compile(&json!([{"name": "alone", "when": when}]));
        errors
            .is_empty()
            .then(|| set.evaluate(&facts(body)).is_some())
    }

    /// The members that compile on their own, with their outcome on `body`.
    fn compiling_members(members: Vec<Value>, body: &Value) -> Vec<(Value, bool)> {
        members
            .into_iter()
            .filter_map(|member| evaluate_alone(&member, body).map(|outcome| (member, outcome)))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn evaluation_never_panics(
            rules in prop::collection::vec(
                prop_oneof![
                    condition_tree(&WIDE_KEYS, wide_json().prop_filter("null", not_null).boxed())
                        .prop_map(|when| json!({"name": "tree", "when": when})),
                    dense_tree().prop_map(|when| json!({"name": "dense", "when": when})),
                    wide_json().prop_map(|when| json!({"name": "junk", "when": when})),
                    wide_json(),
                ],
                0..5,
            ),
            body in prop_oneof![wide_body(), dense_body()],
            raw_len in any::<usize>(),
        ) {
            let (set, _errors) = RuleSet::compile(&Value::Array(rules));
            let _ = set.evaluate(&RequestFacts { body: &body, raw_len });
            let _ = set.status_json();
        }

        #[test]
        fn all_is_the_and_of_its_members(
            members in prop::collection::vec(dense_tree(), 1..5),
            body in dense_body(),
        ) {
            let members = compiling_members(members, &body);
            prop_assume!(!members.is_empty());
            let expected = members.iter().all(|(_, outcome)| *outcome);
            let all: Vec<Value> = members.into_iter().map(|(member, _)| member).collect();
            prop_assert_eq!(evaluate_alone(&json!({"all": all}), &body), Some(expected));
        }

        #[test]
        fn any_is_the_or_of_its_members(
            members in prop::collection::vec(dense_tree(), 1..5),
            body in dense_body(),
        ) {
            let members = compiling_members(members, &body);
            prop_assume!(!members.is_empty());
            let expected = members.iter().any(|(_, outcome)| *outcome);
            let any: Vec<Value> = members.into_iter().map(|(member, _)| member).collect();
            prop_assert_eq!(evaluate_alone(&json!({"any": any}), &body), Some(expected));
        }

        #[test]
        fn ne_is_not_eq_when_the_field_exists(
            field in field_name(&DENSE_KEYS),
            value in dense_operand(),
            body in dense_body(),
        ) {
            let eq = evaluate_alone(&leaf(&field, "eq", value.clone()), &body);
            let ne = evaluate_alone(&leaf(&field, "ne", value), &body);
            prop_assume!(eq.is_some() && ne.is_some());
            // Computed fields refuse `exists` because they always exist.
            let exists = evaluate_alone(&json!({"field": field, "op": "exists"}), &body)
                .unwrap_or(true);
            if exists {
                prop_assert_eq!(ne, eq.map(|eq| !eq));
            } else {
                prop_assert_eq!((eq, ne), (Some(false), Some(false)));
            }
        }

        #[test]
        fn nin_is_not_in_when_the_field_exists(
            field in field_name(&DENSE_KEYS),
            candidates in prop::collection::vec(dense_operand(), 0..4),
            body in dense_body(),
        ) {
            let is_in = evaluate_alone(&leaf(&field, "in", Value::Array(candidates.clone())), &body);
            let not_in = evaluate_alone(&leaf(&field, "nin", Value::Array(candidates)), &body);
            prop_assume!(is_in.is_some() && not_in.is_some());
            let exists = evaluate_alone(&json!({"field": field, "op": "exists"}), &body)
                .unwrap_or(true);
            if exists {
                prop_assert_eq!(not_in, is_in.map(|is_in| !is_in));
            } else {
                prop_assert_eq!((is_in, not_in), (Some(false), Some(false)));
            }
        }
    }
}
