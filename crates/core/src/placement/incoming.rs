//! What the caller knows about the request being placed, beyond the
//! session: its size, whether it may wait for room, and a prefix of it
//! cached somewhere.

use super::model::Prefix;

/// What the caller knows about the request being placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Incoming {
    /// Context tokens of this request, as far as the gateway can tell
    /// before the engine answers (prompt bytes / 4).
    pub tokens: u64,
    /// A new session that fits no peer's KV may wait for room (the route has
    /// an admission queue) instead of being placed anyway.
    pub may_wait: bool,
    /// A prefix of the request recently sent to some engines (a template
    /// it shares with other conversations).
    pub prefix: Option<Prefix>,
}
