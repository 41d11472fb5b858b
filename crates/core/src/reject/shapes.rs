//! Where the computed fields `input_chars`, `messages_count` and
//! `max_tokens` find the conversation in each API's body, so that one rule
//! judges the same conversation alike on chat, completions, Anthropic
//! Messages and OpenAI Responses. The definitions, a line per API, are the
//! book's (Request guards, "Computed fields per API").
//!
//! Each reader is one pass over the parsed body and allocates nothing; the
//! caller runs it only when a rule asks for its field.

use std::io;

use serde_json::Value;

use crate::api::Api;

/// Characters of the text the model reads as input: system prompt, every
/// message's text, tool results and tool-call arguments. Images, files,
/// audio, reasoning and tool definitions are not text of the conversation.
pub(super) fn input_chars(api: Option<Api>, body: &Value) -> u64 {
    let chars = match api {
        Some(Api::Chat) => chat_chars(body),
        Some(Api::Completions) => prompt_chars(body),
        Some(Api::Messages) => anthropic_chars(body),
        Some(Api::Responses) => responses_chars(body),
        None => chat_chars(body) + prompt_chars(body),
    };
    u64::try_from(chars).unwrap_or(u64::MAX)
}

/// The conversation's messages as chat writes them: the system prompt is
/// one, each tool result is one, and an assistant's reasoning, text and tool
/// calls together are one (vLLM turns a Messages or Responses request into
/// chat messages this way before its chat template reads them).
pub(super) fn messages_count(api: Option<Api>, body: &Value) -> u64 {
    let count = match api {
        Some(Api::Chat) => items(body.get("messages")).len(),
        Some(Api::Completions) => prompt_count(body),
        Some(Api::Messages) => anthropic_count(body),
        Some(Api::Responses) => responses_count(body),
        None => items(body.get("messages")).len() + prompt_count(body),
    };
    u64::try_from(count).unwrap_or(u64::MAX)
}

/// The cap on generated tokens, in the member the API names it by.
pub(super) fn max_tokens(api: Option<Api>, body: &Value) -> Option<&Value> {
    let members: &[&str] = match api {
        // OpenAI renamed chat's `max_tokens`; clients send either.
        Some(Api::Chat) | None => &["max_tokens", "max_completion_tokens"],
        Some(Api::Completions | Api::Messages) => &["max_tokens"],
        Some(Api::Responses) => &["max_output_tokens"],
    };
    members
        .iter()
        .filter_map(|member| body.get(member))
        .find(|value| !value.is_null())
}

// ---------------------------------------------------------------- chat

fn chat_chars(body: &Value) -> usize {
    items(body.get("messages"))
        .iter()
        .map(|message| {
            let calls: usize = items(message.get("tool_calls"))
                .iter()
                .map(|call| {
                    // A function tool's arguments are JSON text, a custom
                    // tool's input free text.
                    str_chars(call.get("function").and_then(|f| f.get("arguments")))
                        + str_chars(call.get("custom").and_then(|c| c.get("input")))
                })
                .sum();
            text_chars(message.get("content"), &["text"]) + calls
        })
        .sum()
}

// ---------------------------------------------------------------- completions

fn prompt_chars(body: &Value) -> usize {
    match body.get("prompt") {
        Some(Value::String(prompt)) => prompt.chars().count(),
        // A batch of strings; token ids are no characters.
        Some(Value::Array(prompts)) => prompts.iter().map(|prompt| str_chars(Some(prompt))).sum(),
        _ => 0,
    }
}

/// A prompt is one message: a string or a list of token ids is one, a list
/// of strings or of token lists a batch of that many.
fn prompt_count(body: &Value) -> usize {
    match body.get("prompt") {
        Some(Value::String(_)) => 1,
        Some(Value::Array(prompts)) if prompts.first().is_some_and(Value::is_number) => 1,
        Some(Value::Array(prompts)) => prompts.len(),
        _ => 0,
    }
}

// ---------------------------------------------------------------- Anthropic Messages

fn anthropic_chars(body: &Value) -> usize {
    let system = text_chars(body.get("system"), &["text"]);
    let messages: usize = items(body.get("messages"))
        .iter()
        .map(|message| match message.get("content") {
            Some(Value::String(text)) => text.chars().count(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .map(|block| match block_type(block) {
                    Some("text") => str_chars(block.get("text")),
                    // An object, where chat and Responses have JSON text.
                    Some("tool_use") => block
                        .get("input")
                        .filter(|input| !input.is_null())
                        .map_or(0, compact_json_chars),
                    Some("tool_result") => text_chars(block.get("content"), &["text"]),
                    _ => 0,
                })
                .sum(),
            _ => 0,
        })
        .sum();
    system + messages
}

fn anthropic_count(body: &Value) -> usize {
    let system = match body.get("system") {
        Some(Value::String(text)) => !text.is_empty(),
        Some(Value::Array(blocks)) => !blocks.is_empty(),
        _ => false,
    };
    let messages: usize = items(body.get("messages"))
        .iter()
        .map(|message| match message.get("content") {
            // Chat gives each tool result a `tool` message of its own, and
            // the rest of the message (text, images) one more.
            Some(Value::Array(blocks)) => {
                let results = blocks
                    .iter()
                    .filter(|block| block_type(block) == Some("tool_result"))
                    .count();
                (results + usize::from(results < blocks.len())).max(1)
            }
            _ => 1,
        })
        .sum();
    usize::from(system) + messages
}

// ---------------------------------------------------------------- OpenAI Responses

const RESPONSES_TEXT: &[&str] = &["input_text", "output_text"];

fn responses_chars(body: &Value) -> usize {
    let instructions = str_chars(body.get("instructions"));
    let input = match body.get("input") {
        Some(Value::String(text)) => text.chars().count(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match block_type(item) {
                None | Some("message") => text_chars(item.get("content"), RESPONSES_TEXT),
                Some("function_call") => str_chars(item.get("arguments")),
                Some("custom_tool_call") => str_chars(item.get("input")),
                Some("function_call_output" | "custom_tool_call_output") => {
                    text_chars(item.get("output"), RESPONSES_TEXT)
                }
                _ => 0,
            })
            .sum(),
        _ => 0,
    };
    instructions + input
}

/// A part of an assistant's turn, which Responses writes as items of their
/// own and chat as members of one message.
#[derive(Clone, Copy)]
enum AssistantPart {
    Text,
    Reasoning,
    ToolCall,
}

fn responses_count(body: &Value) -> usize {
    let instructions = body
        .get("instructions")
        .and_then(Value::as_str)
        .is_some_and(|text| !text.is_empty());
    let input = match body.get("input") {
        Some(Value::String(_)) => 1,
        Some(Value::Array(items)) => responses_items_count(items),
        _ => 0,
    };
    usize::from(instructions) + input
}

/// An item that is part of an assistant's turn joins the assistant message
/// the item before it opened, unless that message has its text (or its
/// reasoning) already and the item brings another: then it opens the next.
fn responses_items_count(items: &[Value]) -> usize {
    // The open assistant message: whether it has its text, its reasoning.
    let mut open: Option<(bool, bool)> = None;
    let mut count = 0;
    for item in items {
        let part = match block_type(item) {
            Some("reasoning") => Some(AssistantPart::Reasoning),
            Some("function_call" | "custom_tool_call") => Some(AssistantPart::ToolCall),
            None | Some("message")
                if item.get("role").and_then(Value::as_str) == Some("assistant") =>
            {
                Some(AssistantPart::Text)
            }
            _ => None,
        };
        let Some(part) = part else {
            count += 1;
            open = None;
            continue;
        };
        let joins = |(text, reasoning): (bool, bool)| match part {
            AssistantPart::Text => !text,
            AssistantPart::Reasoning => !reasoning,
            AssistantPart::ToolCall => true,
        };
        let (text, reasoning) = match open {
            Some(message) if joins(message) => message,
            _ => {
                count += 1;
                (false, false)
            }
        };
        open = Some(match part {
            AssistantPart::Text => (true, reasoning),
            AssistantPart::Reasoning => (text, true),
            AssistantPart::ToolCall => (text, reasoning),
        });
    }
    count
}

// ---------------------------------------------------------------- shared

fn items(value: Option<&Value>) -> &[Value] {
    value.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

fn str_chars(value: Option<&Value>) -> usize {
    value
        .and_then(Value::as_str)
        .map_or(0, |text| text.chars().count())
}

/// A string, or the `text` of the parts whose `type` is one of `text_types`.
fn text_chars(content: Option<&Value>, text_types: &[&str]) -> usize {
    match content {
        Some(Value::String(text)) => text.chars().count(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|part| block_type(part).is_some_and(|kind| text_types.contains(&kind)))
            .map(|part| str_chars(part.get("text")))
            .sum(),
        _ => 0,
    }
}

/// Characters of `value` written as compact JSON, counted as serde_json
/// writes them rather than built into a string first (a tool call's input
/// can be a whole file). Hand-written because it is the four-line sink of a
/// writer, not plumbing a crate would save.
fn compact_json_chars(value: &Value) -> usize {
    struct CharCounter(usize);
    impl io::Write for CharCounter {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            // One character per byte that does not continue a UTF-8
            // sequence (10xxxxxx), however the writes split the text.
            self.0 += bytes.iter().filter(|&&byte| byte & 0xC0 != 0x80).count();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = CharCounter(0);
    // A `Value` always serializes, and the counter never fails a write.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}
