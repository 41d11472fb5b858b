//! A session's history as the client keeps it and re-sends it each turn:
//! its messages and tool calls, its size in tokens, and the request body.

use serde::Serialize;

use crate::text::{BYTES_PER_TOKEN, SIM_TOKEN};

/// The history of one session, as the client re-sends it each turn.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub id: String,
    pub generation: u32,
    /// Index of the next turn to send.
    pub next_turn: u32,
    messages: Vec<(&'static str, String)>,
    /// The tool call a message made or answers, by message index: the
    /// parent's reply that spawned sub-agents (`spawn_agents`) and its
    /// results (the `tool` message), as an agent framework sends them.
    calls: Vec<(usize, String)>,
    /// Bytes of role + content, which the engine turns into tokens.
    bytes: usize,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCall<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct ToolCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: Function,
}

#[derive(Serialize)]
struct Function {
    name: &'static str,
    arguments: &'static str,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    stream: bool,
    stream_options: StreamOptions,
    max_tokens: u32,
    /// OpenAI's routing key, here the session id (`--session-id
    /// prompt-cache-key`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
    messages: Vec<Message<'a>>,
}

impl Conversation {
    /// A session with no message yet.
    pub fn new(id: String, generation: u32) -> Conversation {
        Conversation {
            id,
            generation,
            next_turn: 0,
            messages: Vec::new(),
            calls: Vec::new(),
            bytes: 0,
        }
    }

    /// Another session that starts from this one's history.
    pub fn fork(&self, id: String, generation: u32) -> Conversation {
        Conversation {
            id,
            generation,
            next_turn: 0,
            ..self.clone()
        }
    }

    pub fn push(&mut self, role: &'static str, content: String) {
        self.bytes += role.len() + content.len();
        self.messages.push((role, content));
    }

    /// Drops the last message (a user message whose request failed).
    pub fn pop(&mut self) {
        if let Some((role, content)) = self.messages.pop() {
            self.bytes -= role.len() + content.len();
            let gone = self.messages.len();
            self.calls.retain(|(at, _)| *at != gone);
        }
    }

    /// The last message (the reply) made tool call `id`.
    pub fn mark_call(&mut self, id: String) {
        if let Some(last) = self.messages.len().checked_sub(1) {
            self.calls.push((last, id));
        }
    }

    /// A `tool` message answering call `id`.
    pub fn push_result(&mut self, id: String, content: String) {
        self.push("tool", content);
        self.calls.push((self.messages.len() - 1, id));
    }

    /// The content of the last message (after a turn: its reply).
    pub fn last_content(&self) -> Option<&str> {
        self.messages.last().map(|(_, content)| content.as_str())
    }

    #[cfg(test)]
    pub fn messages(&self) -> usize {
        self.messages.len()
    }

    /// Prompt tokens as the simulated engine counts them.
    pub fn tokens(&self) -> usize {
        self.bytes.div_ceil(BYTES_PER_TOKEN)
    }

    pub fn tokens_with(&self, role: &str, content: &str) -> usize {
        (self.bytes + role.len() + content.len()).div_ceil(BYTES_PER_TOKEN)
    }

    /// Prompt tokens after a reply of `reply_tokens` (the simulated engine
    /// generates exactly `max_tokens`) and one more message.
    pub fn tokens_after_reply(&self, reply_tokens: usize, role: &str, content: &str) -> usize {
        (self.bytes
            + "assistant".len()
            + reply_tokens * SIM_TOKEN.len()
            + role.len()
            + content.len())
        .div_ceil(BYTES_PER_TOKEN)
    }

    /// The streaming chat completion request body for the history as it
    /// is, with `prompt_cache_key` when given.
    pub fn body(&self, model: &str, max_tokens: u32, prompt_cache_key: Option<&str>) -> Vec<u8> {
        let body = Body {
            model,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            max_tokens,
            prompt_cache_key,
            messages: self
                .messages
                .iter()
                .enumerate()
                .map(|(i, (role, content))| {
                    let call = self
                        .calls
                        .iter()
                        .find(|(at, _)| *at == i)
                        .map(|(_, id)| id.as_str());
                    let call_made = call.filter(|_| *role == "assistant");
                    Message {
                        role,
                        content,
                        tool_calls: call_made.map(|id| {
                            [ToolCall {
                                id,
                                r#type: "function",
                                function: Function {
                                    name: "spawn_agents",
                                    arguments: "{}",
                                },
                            }]
                        }),
                        tool_call_id: call.filter(|_| *role == "tool"),
                    }
                })
                .collect(),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }
}
