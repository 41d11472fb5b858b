//! The response on its way to the client, as pure byte processing: SSE
//! framing (`sse`), byte scans (`scan`), what the gateway observes
//! (`observe`, `usage`, with `usage_object` for the usual shape of a usage
//! object, of OpenAI chunks; `typed` of Anthropic Messages and OpenAI
//! Responses events), what it rewrites (`postprocess`), and the one
//! per-response engine that runs them in order (`pipeline`). Nothing here
//! knows about Pingora; the proxy feeds it chunks.
//!
//! Where new stream work goes: per-frame measurements (TTFT, decode rate)
//! are fed from `pipeline`'s observe step; per-frame rewrites are handlers
//! in `postprocess`.

pub mod observe;
pub mod pipeline;
pub mod postprocess;
pub mod scan;
pub mod sse;
mod typed;
pub mod usage;
mod usage_object;

pub use pipeline::{BodyKind, ResponsePipeline};

/// Token counts as reported by the engine, in OpenAI's meaning (Messages
/// and Responses counts are mapped to it: `typed`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`; 0 when absent or null.
    pub cached_tokens: u64,
}
