//! A compiled rule: what it looks at in a request ([`Field`]), the test it
//! applies ([`Test`]) and how conditions combine; what `compile.rs` makes of
//! a rule as written and `eval.rs` checks a request against.

use std::sync::atomic::AtomicU64;

use regex::Regex;
use serde_json::{Number, Value};

use crate::api::Api;

pub const DEFAULT_STATUS: u16 = 429;

/// Deep enough for any hand-written rule, shallow enough that evaluation
/// recursion can never threaten the stack.
pub const MAX_CONDITION_DEPTH: usize = 32;

pub(super) const RULE_KEYS: [&str; 4] = ["name", "status", "message", "when"];
pub(super) const LEAF_KEYS: [&str; 3] = ["field", "op", "value"];

#[derive(Debug)]
pub struct CompiledRule {
    pub name: String,
    pub status: u16,
    pub message: String,
    /// Requests this rule rejected since it was compiled.
    pub hits: AtomicU64,
    pub(super) condition: Condition,
    /// Kept verbatim for the status endpoint, so operators see what they wrote.
    pub(super) configured_when: Value,
}

/// What a rule can look at: the parsed body (`Value::Null` if it did not
/// parse — computed fields still work), its raw length, and the API the path
/// names, which says where the computed fields read the conversation.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub body: &'a Value,
    pub raw_len: usize,
    /// `None`: a JSON body on another endpoint (one whose model picks the
    /// pool), read as chat and completions both are.
    pub api: Option<Api>,
}

#[derive(Debug)]
pub(super) enum Condition {
    All(Vec<Condition>),
    Any(Vec<Condition>),
    Test { field: Field, test: Test },
}

#[derive(Debug)]
pub(super) enum Field {
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
pub(super) enum FieldKind {
    AlwaysNumber,
    AlwaysBool,
    FromBody,
}

#[derive(Debug)]
pub(super) struct PathSegment {
    pub(super) key: String,
    pub(super) index: Option<usize>,
}

#[derive(Debug)]
pub(super) enum Test {
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
pub(super) enum OrderOp {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}
