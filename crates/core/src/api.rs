//! The LLM APIs the gateway reads the body of, told apart by the path the
//! client called. Each has its own request shape (where the conversation
//! is: `messages`, `prompt`, `input`) and its own response stream (OpenAI
//! chunks, Anthropic's typed events, the Responses API's typed events).

/// An endpoint whose body is a JSON request to an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// `POST /v1/chat/completions`: OpenAI chat, `messages`.
    Chat,
    /// `POST /v1/completions`: OpenAI text completion, `prompt`.
    Completions,
    /// `POST /v1/messages`: Anthropic Messages (vLLM and SGLang serve it),
    /// `system` and `messages`; streams `message_start`,
    /// `content_block_delta`, `message_delta`.
    Messages,
    /// `POST /v1/responses`: OpenAI Responses, `instructions` and `input`;
    /// streams `response.output_text.delta`, `response.completed`.
    Responses,
}

impl Api {
    /// The API of a route-relative path (its query string ignored); `None`
    /// for every other endpoint (`/v1/embeddings`, `/v1/models`, …), which
    /// passes through unread.
    pub fn of_path(path: &str) -> Option<Api> {
        let path = path.split('?').next().unwrap_or(path);
        match path {
            "/v1/chat/completions" => Some(Api::Chat),
            "/v1/completions" => Some(Api::Completions),
            "/v1/messages" => Some(Api::Messages),
            "/v1/responses" => Some(Api::Responses),
            _ => None,
        }
    }

    /// The label in logs and the body log.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Api;

    #[test]
    fn paths() {
        assert_eq!(Api::of_path("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(Api::of_path("/v1/completions?x=1"), Some(Api::Completions));
        assert_eq!(Api::of_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(Api::of_path("/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::of_path("/v1/messages/count_tokens"), None);
        assert_eq!(Api::of_path("/v1/models"), None);
        assert_eq!(Api::of_path("/v1/embeddings"), None);
    }
}
