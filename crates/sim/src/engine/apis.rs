//! The shapes of the two typed APIs the engine serves beside OpenAI chat
//! and completions, as vLLM and SGLang serve them: Anthropic Messages
//! (`POST /v1/messages`) and OpenAI Responses (`POST /v1/responses`). The
//! engine model is chat's (prompt tokens, prefix cache, KV, decode pacing,
//! the `x-sim-*` headers); only the request's reading (`kv::prompt_bytes`)
//! and the answer's shape differ. Streams send the opening events with the
//! first token, one delta event per token, and the closing events (with
//! the final usage) at the end; no `[DONE]`.
//!
//! Usage as each API reports it: Anthropic's `input_tokens` leaves out the
//! tokens read from the prefix cache (`cache_read_input_tokens`; the
//! engine writes no explicit cache, so `cache_creation_input_tokens` is
//! 0); Responses' `input_tokens` includes them
//! (`input_tokens_details.cached_tokens`).
//!
//! Responses is stateful: each answered turn (unless `store: false`) is
//! kept, its conversation and reply, in a [`ResponseStore`], and a request
//! naming it in `previous_response_id` continues it; an unknown id answers
//! 404 as OpenAI does.

use std::collections::VecDeque;
use std::sync::Arc;

use ahash::AHashMap;
use serde_json::{json, Value};

use super::plan::{error_body, Plan, TOKEN};
use crate::kv::Kind;

/// The most turns the store keeps, and the most bytes of conversation:
/// past either, the oldest go.
const MAX_KEPT_TURNS: usize = 10_000;
const MAX_KEPT_BYTES: usize = 256 << 20;

/// Responses turns by id, for `previous_response_id`: each one's
/// conversation (prompt bytes, then `assistant` and the reply), bounded,
/// oldest out first.
pub(super) struct ResponseStore {
    turns: AHashMap<String, Arc<[u8]>>,
    order: VecDeque<String>,
    bytes: usize,
    max_turns: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::bounded(MAX_KEPT_TURNS, MAX_KEPT_BYTES)
    }
}

impl ResponseStore {
    fn bounded(max_turns: usize, max_bytes: usize) -> Self {
        ResponseStore {
            turns: AHashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            max_turns,
            max_bytes,
        }
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<[u8]>> {
        self.turns.get(id).cloned()
    }

    pub(super) fn put(&mut self, id: String, conversation: Vec<u8>) {
        self.bytes += conversation.len();
        if let Some(old) = self.turns.insert(id.clone(), conversation.into()) {
            self.bytes -= old.len();
            self.order.retain(|kept| *kept != id);
        }
        self.order.push_back(id);
        while self.order.len() > self.max_turns || self.bytes > self.max_bytes {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.turns.remove(&oldest) {
                self.bytes -= gone.len();
            }
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.turns.len()
    }
}

/// A request the engine answers with an error instead of a completion.
pub(super) struct Refusal {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Refusal {
    /// 400, in the API's own error shape.
    pub(super) fn invalid(kind: Kind, message: &str) -> Refusal {
        let body = match kind {
            Kind::Messages => json!({
                "type": "error",
                "error": {"type": "invalid_request_error", "message": message},
            })
            .to_string()
            .into_bytes(),
            Kind::Chat | Kind::Text | Kind::Responses => error_body("invalid_request", message),
        };
        Refusal { status: 400, body }
    }

    /// 404 for a `previous_response_id` the engine does not hold, as
    /// OpenAI answers it.
    pub(super) fn unknown_response(id: &str) -> Refusal {
        let body = json!({"error": {
            "message": format!("Previous response with id '{id}' not found."),
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }});
        Refusal {
            status: 404,
            body: body.to_string().into_bytes(),
        }
    }
}

/// One typed SSE event: its `event:` line, then its data.
fn event(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(format!("event: {name}\ndata: {data}\n\n").as_bytes());
}

impl Plan {
    /// A limit cut the reply short (else the model ended on its own).
    fn was_cut(&self) -> bool {
        self.finish_reason == "length"
    }

    // ---- Anthropic Messages

    /// Anthropic's `usage`: `input_tokens` without the cached ones.
    fn anthropic_usage(&self, cached: usize, output: usize) -> Value {
        json!({
            "input_tokens": self.prompt_tokens - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": output,
        })
    }

    fn stop_reason(&self) -> &'static str {
        if self.was_cut() {
            "max_tokens"
        } else {
            "end_turn"
        }
    }

    pub(super) fn messages_answer(&self, cached: usize) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": self.text()}],
            "stop_reason": self.stop_reason(),
            "stop_sequence": null,
            "usage": self.anthropic_usage(cached, self.max_tokens),
        })
    }

    /// Token `index`'s `content_block_delta`; the first comes after
    /// `message_start` (with the input counts), the text block's start and
    /// a `ping`.
    pub(super) fn messages_token(&self, index: usize, cached: usize) -> Vec<u8> {
        let mut out = Vec::new();
        if index == 0 {
            let message = json!({
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": self.anthropic_usage(cached, 1),
            });
            event(
                &mut out,
                "message_start",
                &json!({"type": "message_start", "message": message}),
            );
            event(
                &mut out,
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
            );
            event(&mut out, "ping", &json!({"type": "ping"}));
        }
        event(
            &mut out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": TOKEN}}),
        );
        out
    }

    /// The block's stop, `message_delta` with the output count, `message_stop`.
    pub(super) fn messages_end(&self) -> Vec<u8> {
        let mut out = Vec::new();
        event(
            &mut out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        );
        event(
            &mut out,
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                    "usage": {"output_tokens": self.max_tokens}}),
        );
        event(&mut out, "message_stop", &json!({"type": "message_stop"}));
        out
    }

    // ---- OpenAI Responses

    /// Responses' `usage`: `input_tokens` with the cached ones.
    fn responses_usage(&self, cached: usize) -> Value {
        json!({
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": self.max_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.max_tokens,
        })
    }

    /// The reply's message item id.
    fn item_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    /// `completed`, or `incomplete` when `max_output_tokens` cut it.
    fn response_status(&self) -> &'static str {
        if self.was_cut() {
            "incomplete"
        } else {
            "completed"
        }
    }

    fn response_object(&self, status: &str, output: Value, usage: Value) -> Value {
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "error": null,
            "incomplete_details": incomplete,
            "usage": usage,
        })
    }

    fn output_part(&self) -> Value {
        json!({"type": "output_text", "text": self.text(), "annotations": []})
    }

    fn output_message(&self) -> Value {
        json!({
            "id": self.item_id(),
            "type": "message",
            "status": self.response_status(),
            "role": "assistant",
            "content": [self.output_part()],
        })
    }

    pub(super) fn responses_answer(&self, cached: usize) -> Value {
        self.response_object(
            self.response_status(),
            json!([self.output_message()]),
            self.responses_usage(cached),
        )
    }

    /// Token `index`'s `response.output_text.delta`; the first comes after
    /// `response.created`, `response.in_progress` and the message item's
    /// and its text part's `added` events.
    pub(super) fn responses_token(&self, index: usize) -> Vec<u8> {
        let mut out = Vec::new();
        if index == 0 {
            let response = self.response_object("in_progress", json!([]), Value::Null);
            event(
                &mut out,
                "response.created",
                &json!({"type": "response.created", "sequence_number": 0, "response": response}),
            );
            event(
                &mut out,
                "response.in_progress",
                &json!({"type": "response.in_progress", "sequence_number": 1, "response": response}),
            );
            event(
                &mut out,
                "response.output_item.added",
                &json!({"type": "response.output_item.added", "sequence_number": 2,
                        "output_index": 0,
                        "item": {"id": self.item_id(), "type": "message", "status": "in_progress",
                                 "role": "assistant", "content": []}}),
            );
            event(
                &mut out,
                "response.content_part.added",
                &json!({"type": "response.content_part.added", "sequence_number": 3,
                        "item_id": self.item_id(), "output_index": 0, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
        }
        event(
            &mut out,
            "response.output_text.delta",
            &json!({"type": "response.output_text.delta", "sequence_number": 4 + index,
                    "item_id": self.item_id(), "output_index": 0, "content_index": 0,
                    "delta": TOKEN}),
        );
        out
    }

    /// The text's, the part's and the item's `done` events, then
    /// `response.completed` (or `response.incomplete`) with the usage.
    pub(super) fn responses_end(&self, cached: usize) -> Vec<u8> {
        let seq = 4 + self.max_tokens;
        let item = self.item_id();
        let mut out = Vec::new();
        event(
            &mut out,
            "response.output_text.done",
            &json!({"type": "response.output_text.done", "sequence_number": seq,
                    "item_id": item, "output_index": 0, "content_index": 0,
                    "text": self.text()}),
        );
        event(
            &mut out,
            "response.content_part.done",
            &json!({"type": "response.content_part.done", "sequence_number": seq + 1,
                    "item_id": item, "output_index": 0, "content_index": 0,
                    "part": self.output_part()}),
        );
        event(
            &mut out,
            "response.output_item.done",
            &json!({"type": "response.output_item.done", "sequence_number": seq + 2,
                    "output_index": 0, "item": self.output_message()}),
        );
        let status = self.response_status();
        let name = format!("response.{status}");
        event(
            &mut out,
            &name,
            &json!({"type": name, "sequence_number": seq + 3,
                    "response": self.responses_answer(cached)}),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_newest_turns() {
        let mut store = ResponseStore::bounded(100, 1000);
        for i in 0..105 {
            store.put(format!("resp_{i}"), vec![b'x'; 3]);
        }
        assert_eq!(store.len(), 100);
        assert!(store.get("resp_4").is_none());
        assert_eq!(store.get("resp_5").as_deref(), Some(&b"xxx"[..]));
        assert_eq!(store.bytes, 300);
        // And the newest within the byte bound.
        store.put("big".into(), vec![0; 990]);
        assert!(store.get("big").is_some());
        assert_eq!(store.len(), 4, "three small turns fit beside it");
        assert_eq!(store.bytes, 999);
        // The default bounds are the documented ones.
        let kept = ResponseStore::default();
        assert_eq!((kept.max_turns, kept.max_bytes), (10_000, 256 << 20));
    }
}
