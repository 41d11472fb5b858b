//! Rules as written (route YAML, as JSON values) → compiled conditions, or
//! one error per rule that names what is wrong.

use super::rule::{
    CompiledRule, Condition, Field, FieldKind, OrderOp, PathSegment, Test, DEFAULT_STATUS,
    LEAF_KEYS, MAX_CONDITION_DEPTH, RULE_KEYS,
};
use regex::Regex;
use serde_json::Map;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

pub(super) fn compile_rule(
    item: &Value,
    names_in_use: &HashSet<String>,
) -> Result<CompiledRule, String> {
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

pub(super) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}
