use super::*;
use crate::api::Api;
use proptest::prelude::*;
use std::cell::Cell;

thread_local! {
    pub(crate) static INPUT_CHARS_COMPUTATIONS: Cell<usize> = const { Cell::new(0) };
}

fn compile_clean(rules: Value) -> RuleSet {
    let (set, errors) = RuleSet::compile(&rules);
    assert!(errors.is_empty(), "unexpected errors: {errors:?}");
    set
}

/// A body on an endpoint of no known API (read as chat and completions).
fn facts(body: &Value) -> RequestFacts<'_> {
    RequestFacts {
        body,
        raw_len: body.to_string().len(),
        api: None,
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
            raw_len: 101,
            api: None,
        })
        .is_some());
    assert!(set
        .evaluate(&RequestFacts {
            body: &body,
            raw_len: 100,
            api: None,
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
            raw_len: 1000,
            api: None,
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
        leaf("input_chars", "eq", json!(5)),
        json!({"prompt": ["abc", "de"]})
    ));
    assert!(matches(
        leaf("input_chars", "eq", json!(0)),
        json!({"prompt": [1, 2, 3]})
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
        leaf("messages_count", "eq", json!(1)),
        json!({"prompt": "x"})
    ));
    assert!(matches(
        leaf("messages_count", "eq", json!(1)),
        json!({"prompt": [1, 2, 3]})
    ));
    assert!(matches(
        leaf("messages_count", "eq", json!(2)),
        json!({"prompt": ["x", "y"]})
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

// ---- the same conversation on every API --------------------------------
//
// The pieces of text of one conversation, each written once: what every
// shape below must add up to, whatever member it keeps them in.

const SYSTEM: &str = "You are terse.";
const ASK: &str = "Weather in Paris and in Zürich?";
const THINKING: &str = "Two cities: two calls.";
const CHECKING: &str = "Checking both.";
const ARGS_PARIS: &str = r#"{"city":"Paris"}"#;
const ARGS_ZURICH: &str = r#"{"city":"Zürich"}"#;
const RESULT_PARIS: &str = "18°C, clear";
const RESULT_ZURICH: &str = "12°C, rain 🌧";
const ANSWER: &str = "Paris: 18°C and clear; Zürich: 12°C and rain.";
const THANKS: &str = "Thanks! 😀";
const IMAGE: &str =
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk";

/// The conversation the text, the tool calls and results and the image are
/// (the image and the reasoning are no characters of it): a system prompt,
/// a question with an image, an assistant turn that thinks, says something
/// and calls two tools, the two results, the answer, and a last user turn.
fn conversation_in_three_shapes() -> Vec<(Api, Value)> {
    let chat = json!({"model": "m", "max_tokens": 256, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [
            {"type": "text", "text": ASK},
            {"type": "image_url", "image_url": {"url": IMAGE}}
        ]},
        {"role": "assistant", "reasoning_content": THINKING, "content": CHECKING, "tool_calls": [
            {"id": "call_p", "type": "function",
             "function": {"name": "weather", "arguments": ARGS_PARIS}},
            {"id": "call_z", "type": "function",
             "function": {"name": "weather", "arguments": ARGS_ZURICH}}
        ]},
        {"role": "tool", "tool_call_id": "call_p", "content": RESULT_PARIS},
        {"role": "tool", "tool_call_id": "call_z", "content": [{"type": "text", "text": RESULT_ZURICH}]},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": THANKS}
    ]});
    let messages = json!({"model": "m", "max_tokens": 256,
    "system": [{"type": "text", "text": SYSTEM}],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": ASK},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}
        ]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": THINKING, "signature": "sig"},
            {"type": "text", "text": CHECKING},
            {"type": "tool_use", "id": "call_p", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_z", "name": "weather", "input": {"city": "Zürich"}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_p", "content": RESULT_PARIS},
            {"type": "tool_result", "tool_use_id": "call_z",
             "content": [{"type": "text", "text": RESULT_ZURICH}]}
        ]},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": [{"type": "text", "text": THANKS}]}
    ]});
    let responses = json!({"model": "m", "max_output_tokens": 256,
    "instructions": SYSTEM,
    "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": ASK},
            {"type": "input_image", "image_url": IMAGE}
        ]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": THINKING}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": CHECKING}]},
        {"type": "function_call", "call_id": "call_p", "name": "weather", "arguments": ARGS_PARIS},
        {"type": "function_call", "call_id": "call_z", "name": "weather", "arguments": ARGS_ZURICH},
        {"type": "function_call_output", "call_id": "call_p", "output": RESULT_PARIS},
        {"type": "function_call_output", "call_id": "call_z",
         "output": [{"type": "input_text", "text": RESULT_ZURICH}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": ANSWER}]},
        {"role": "user", "content": THANKS}
    ]});
    vec![
        (Api::Chat, chat),
        (Api::Messages, messages),
        (Api::Responses, responses),
    ]
}

/// A conversation completions can write too: one user turn.
fn one_turn_in_four_shapes() -> Vec<(Api, Value)> {
    let user = json!([{"role": "user", "content": ASK}]);
    vec![
        (
            Api::Chat,
            json!({"model": "m", "max_completion_tokens": 64, "messages": user}),
        ),
        (
            Api::Completions,
            json!({"model": "m", "max_tokens": 64, "prompt": ASK}),
        ),
        (
            Api::Messages,
            json!({"model": "m", "max_tokens": 64, "messages": user}),
        ),
        (
            Api::Responses,
            json!({"model": "m", "max_output_tokens": 64, "input": ASK}),
        ),
        (
            Api::Responses,
            json!({"model": "m", "max_output_tokens": 64, "input": [
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": ASK}]}
            ]}),
        ),
    ]
}

fn chars(texts: &[&str]) -> u64 {
    texts.iter().map(|text| text.chars().count() as u64).sum()
}

/// `input_chars`, `messages_count` and `max_tokens` of a body on an API.
fn computed(api: Option<Api>, body: &Value) -> (u64, u64, Option<Value>) {
    (
        super::shapes::input_chars(api, body),
        super::shapes::messages_count(api, body),
        super::shapes::max_tokens(api, body).cloned(),
    )
}

#[test]
fn the_same_conversation_gives_the_same_fields_on_every_api() {
    let cases = [
        (
            conversation_in_three_shapes(),
            chars(&[
                SYSTEM,
                ASK,
                CHECKING,
                ARGS_PARIS,
                ARGS_ZURICH,
                RESULT_PARIS,
                RESULT_ZURICH,
                ANSWER,
                THANKS,
            ]),
            7,
            256,
        ),
        (one_turn_in_four_shapes(), chars(&[ASK]), 1, 64),
    ];
    for (shapes, input_chars, messages_count, max_tokens) in cases {
        for (api, body) in shapes {
            assert_eq!(
                computed(Some(api), &body),
                (input_chars, messages_count, Some(json!(max_tokens))),
                "{} (input_chars, messages_count, max_tokens) of {body}",
                api.as_str()
            );
            // And through a rule, as the gateway asks for them.
            let set = compile_clean(json!([{"name": "all-three", "when": {"all": [
                leaf("input_chars", "eq", json!(input_chars)),
                leaf("messages_count", "eq", json!(messages_count)),
                leaf("max_tokens", "eq", json!(max_tokens)),
            ]}}]));
            let facts = RequestFacts {
                body: &body,
                raw_len: 0,
                api: Some(api),
            };
            assert!(set.evaluate(&facts).is_some(), "{}", api.as_str());
        }
    }
}

/// A member of another API's shape counts for nothing; the control is the
/// same body on that member's own API, where it does.
#[test]
fn each_api_reads_its_own_members_only() {
    let body = json!({
        "messages": [{"role": "user", "content": "abc"}],
        "prompt": "pq",
        "system": "xyz",
        "instructions": "defg",
        "input": "hi",
        "max_tokens": 10,
        "max_output_tokens": 20
    });
    let ten = Some(json!(10));
    assert_eq!(computed(Some(Api::Chat), &body), (3, 1, ten.clone()));
    assert_eq!(computed(Some(Api::Completions), &body), (2, 1, ten.clone()));
    assert_eq!(
        computed(Some(Api::Messages), &body),
        (3 + 3, 2, ten.clone())
    );
    assert_eq!(
        computed(Some(Api::Responses), &body),
        (4 + 2, 2, Some(json!(20)))
    );
    // No API: chat's and completions' members, as before the APIs were told apart.
    assert_eq!(computed(None, &body), (3 + 2, 1 + 1, ten));
}

#[test]
fn messages_count_is_the_conversation_in_chat_form() {
    let count = |api, body: Value| super::shapes::messages_count(Some(api), &body);
    // Anthropic: each tool result is a message, the rest of the message one
    // more; an empty message still one; an empty system prompt none.
    let result = json!({"type": "tool_result", "tool_use_id": "t", "content": "r"});
    let text = json!({"type": "text", "text": "t"});
    assert_eq!(
        count(
            Api::Messages,
            json!({"messages": [{"role": "user", "content": [result, result]}]})
        ),
        2
    );
    assert_eq!(
        count(
            Api::Messages,
            json!({"messages": [{"role": "user", "content": [result, text]}]})
        ),
        2
    );
    assert_eq!(
        count(
            Api::Messages,
            json!({"messages": [{"role": "user", "content": []}]})
        ),
        1
    );
    assert_eq!(
        count(
            Api::Messages,
            json!({"system": "", "messages": [{"role": "user", "content": "a"}]})
        ),
        1
    );
    assert_eq!(
        count(
            Api::Messages,
            json!({"system": "s", "messages": [{"role": "user", "content": "a"}]})
        ),
        2
    );
    // Responses: an assistant's parts join the message before them until it
    // has a second text or reasoning; anything else closes it.
    let assistant = json!({"type": "message", "role": "assistant", "content": "a"});
    let call = json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"});
    let reasoning = json!({"type": "reasoning", "summary": []});
    let output = json!({"type": "function_call_output", "call_id": "c", "output": "o"});
    let input = |items: Value| json!({"input": items});
    assert_eq!(
        count(
            Api::Responses,
            input(json!([reasoning, assistant, call, call]))
        ),
        1
    );
    assert_eq!(
        count(Api::Responses, input(json!([assistant, assistant]))),
        2
    );
    assert_eq!(
        count(Api::Responses, input(json!([reasoning, reasoning]))),
        2
    );
    assert_eq!(count(Api::Responses, input(json!([call, output, call]))), 3);
    assert_eq!(
        count(
            Api::Responses,
            input(json!([{"type": "item_reference", "id": "x"}]))
        ),
        1
    );
    assert_eq!(
        count(Api::Responses, json!({"instructions": "", "input": "a"})),
        1
    );
    assert_eq!(
        count(Api::Responses, json!({"instructions": "i", "input": "a"})),
        2
    );
}

#[test]
fn input_chars_counts_tool_arguments_as_json_text() {
    let chars = |api, body: Value| super::shapes::input_chars(Some(api), &body);
    // An Anthropic input is an object: counted as compact JSON, so the same
    // arguments written compactly count alike on the three APIs.
    let arguments = r#"{"path":"é.txt","lines":[1,2],"dry":null}"#;
    let arguments_chars = arguments.chars().count() as u64;
    let object: Value = serde_json::from_str(arguments).unwrap_or_default();
    let anthropic = json!({"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "edit", "input": object}
    ]}]});
    let chat = json!({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "edit", "arguments": arguments}}
    ]}]});
    let responses = json!({"input": [
        {"type": "function_call", "call_id": "t", "name": "edit", "arguments": arguments}
    ]});
    assert_eq!(chars(Api::Messages, anthropic), arguments_chars);
    assert_eq!(chars(Api::Chat, chat), arguments_chars);
    assert_eq!(chars(Api::Responses, responses), arguments_chars);
    // Free-text tools (chat `custom`, Responses `custom_tool_call`) by their input.
    let chat_custom = json!({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "t", "type": "custom", "custom": {"name": "sh", "input": "ls -l"}}
    ]}]});
    let responses_custom = json!({"input": [
        {"type": "custom_tool_call", "call_id": "t", "name": "sh", "input": "ls -l"},
        {"type": "custom_tool_call_output", "call_id": "t", "output": "ok"}
    ]});
    assert_eq!(chars(Api::Chat, chat_custom), 5);
    assert_eq!(chars(Api::Responses, responses_custom), 5 + 2);
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

const WIDE_KEYS: [&str; 29] = [
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
    // The other APIs' members, and the part and item types they read.
    "system",
    "instructions",
    "input",
    "output",
    "arguments",
    "tool_calls",
    "function",
    "max_output_tokens",
    "tool_result",
    "tool_use",
    "function_call",
    "function_call_output",
    "reasoning",
    "input_text",
    "assistant",
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
            prop::collection::vec(inner.clone(), 1..4).prop_map(|members| json!({"all": members})),
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
        api in prop::sample::select(vec![
            None,
            Some(Api::Chat),
            Some(Api::Completions),
            Some(Api::Messages),
            Some(Api::Responses),
        ]),
    ) {
        let (set, _errors) = RuleSet::compile(&Value::Array(rules));
        let _ = set.evaluate(&RequestFacts { body: &body, raw_len, api });
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
