//! One request's facts against compiled conditions.

use super::rule::{Condition, Field, OrderOp, RequestFacts, Test};
use super::shapes;
use serde_json::{Number, Value};
use std::borrow::Cow;
use std::cell::OnceCell;
use std::cmp::Ordering;

/// One request's view for one `evaluate` call: facts that are costly to
/// compute are filled in on first use and shared by every rule after that.
pub(super) struct Evaluation<'f, 'a> {
    facts: &'f RequestFacts<'a>,
    input_chars: OnceCell<u64>,
    messages_count: OnceCell<u64>,
}

impl<'f, 'a> Evaluation<'f, 'a> {
    pub(super) fn new(facts: &'f RequestFacts<'a>) -> Self {
        Evaluation {
            facts,
            input_chars: OnceCell::new(),
            messages_count: OnceCell::new(),
        }
    }

    /// The field's value, or `None` when it is absent (missing or `null`).
    fn resolve(&self, field: &Field) -> Option<Cow<'a, Value>> {
        let body: &'a Value = self.facts.body;
        let api = self.facts.api;
        let count = |n: usize| Some(Cow::Owned(Value::from(n)));
        let computed = |n: u64| Some(Cow::Owned(Value::from(n)));
        let resolved = match field {
            Field::InputBytes => return count(self.facts.raw_len),
            Field::InputChars => {
                return computed(*self.input_chars.get_or_init(|| {
                    #[cfg(test)]
                    super::tests::INPUT_CHARS_COMPUTATIONS
                        .with(|computations| computations.set(computations.get() + 1));
                    shapes::input_chars(api, body)
                }))
            }
            Field::MessagesCount => {
                return computed(
                    *self
                        .messages_count
                        .get_or_init(|| shapes::messages_count(api, body)),
                )
            }
            Field::ToolsCount => {
                return count(
                    body.get("tools")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len),
                )
            }
            Field::Stream => {
                let streaming = body.get("stream") == Some(&Value::Bool(true));
                return Some(Cow::Owned(Value::Bool(streaming)));
            }
            Field::MaxTokens => shapes::max_tokens(api, body),
            Field::Path(segments) => segments.iter().try_fold(body, |node, segment| match node {
                Value::Object(map) => map.get(&segment.key),
                Value::Array(items) => segment.index.and_then(|index| items.get(index)),
                _ => None,
            }),
        };
        resolved.filter(|value| !value.is_null()).map(Cow::Borrowed)
    }
}

impl Condition {
    pub(super) fn matches(&self, evaluation: &Evaluation) -> bool {
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
