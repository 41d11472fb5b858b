//! A completion request as the token loop sees it ([`Plan`]), the frames
//! it writes, and what a finished request leaves behind.

use std::time::Duration;

use serde_json::{json, Value};

use crate::kv::{self, Kind};

/// The text of every generated token.
pub(super) const TOKEN: &str = "tok ";

pub(super) fn error_body(kind: &str, message: &str) -> Vec<u8> {
    json!({"error": {"type": kind, "message": message}})
        .to_string()
        .into_bytes()
}

pub(super) fn sse_frame(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

/// Everything about a completion request the token loop needs.
pub(super) struct Plan {
    pub(super) kind: Kind,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) prompt: Vec<u8>,
    pub(super) prompt_tokens: usize,
    pub(super) max_tokens: usize,
    pub(super) finish_reason: &'static str,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) frame_delay: Duration,
    /// `frame_delay` came from the request (`x-sim-frame-delay-ms`): the
    /// batch profiles, whose token times the steps decide, then space this
    /// request's frames at least that far apart.
    pub(super) paced: bool,
    /// Added to the prefill, so a test sets a stream's TTFT directly.
    pub(super) extra_ttft: Duration,
    /// A usage frame with this `completion_tokens` right after the first
    /// content frame: the decoy a meter must not take for the final count.
    pub(super) decoy_usage: Option<u64>,
    pub(super) gate: Option<String>,
    /// Held before the first token until this gate opens: a prompt the
    /// engine has not finished prefilling, for as long as a test wants.
    pub(super) prefill_gate: Option<String>,
    /// Responses: the turn this one continues (`previous_response_id`).
    pub(super) previous_response_id: Option<String>,
    /// Responses: keep this turn for a later `previous_response_id`.
    pub(super) store: bool,
}

impl Plan {
    pub(super) fn object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Text => "text_completion",
            Kind::Messages => "message",
            Kind::Responses => "response",
        }
    }

    pub(super) fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text | Kind::Messages | Kind::Responses => self.object(),
        }
    }

    /// What the stream sends for token `index`: an OpenAI chunk, or the
    /// typed APIs' delta event (after their opening events, for the first).
    pub(super) fn token_frame(&self, index: usize, cached: usize) -> Vec<u8> {
        match self.kind {
            Kind::Chat | Kind::Text => self.content_frame(index),
            Kind::Messages => self.messages_token(index, cached),
            Kind::Responses => self.responses_token(index),
        }
    }

    /// The whole generated text.
    pub(super) fn text(&self) -> String {
        TOKEN.repeat(self.max_tokens)
    }

    pub(super) fn usage(&self, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.max_tokens,
            "total_tokens": self.prompt_tokens + self.max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    pub(super) fn decoy_usage_frame(&self, completion_tokens: u64) -> Vec<u8> {
        sse_frame(&json!({
            "id": self.id,
            "object": self.chunk_object(),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens},
        }))
    }

    pub(super) fn content_frame(&self, index: usize) -> Vec<u8> {
        let finish = if index + 1 == self.max_tokens {
            Value::from(self.finish_reason)
        } else {
            Value::Null
        };
        let choice = match self.kind {
            Kind::Chat => {
                let delta = if index == 0 {
                    json!({"role": "assistant", "content": TOKEN})
                } else {
                    json!({"content": TOKEN})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Text | Kind::Messages | Kind::Responses => {
                json!({"index": 0, "text": TOKEN, "logprobs": null, "finish_reason": finish})
            }
        };
        sse_frame(&json!({
            "id": self.id,
            "object": self.chunk_object(),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }))
    }
}

pub(super) enum Generated {
    Done {
        cached_tokens: usize,
    },
    /// `die_after_frames` cut the stream; the connection must be dropped.
    Died,
}

/// The conversation a request leaves behind: its prompt and its reply, as
/// the next turn's prompt starts (`kv::prompt_bytes`).
pub(super) fn conversation(plan: &Plan) -> Vec<u8> {
    let mut bytes = plan.prompt.clone();
    kv::turn_text(&mut bytes, "assistant", &plan.text());
    bytes
}
