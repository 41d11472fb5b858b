//! One finished request as the session tasks record it, and the
//! `--records` file that keeps them.

use std::path::Path;
use std::time::Duration;

use crate::client::Usage;
use crate::ids::IdVia;

/// One finished (or failed, or cut) request.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub slot: u32,
    /// The slot's session: (slot, generation) names it.
    pub generation: u32,
    pub turn: u32,
    /// The session's id (the ground truth: what `x-session-id` would say).
    pub session: String,
    /// A sub-agent's parent session, as (slot, generation).
    pub parent: Option<(u32, u32)>,
    /// A sub-agent's: the tokens of the parent's history it starts from
    /// (the parent's last prompt + completion), which a perfect prefix
    /// cache already holds.
    pub inherited_tokens: Option<u64>,
    /// `shared-prefix`: the tenant whose prefix the conversation starts
    /// with, so that a run's records show where each prefix went.
    pub tenant: Option<u32>,
    /// The session's planned last turn (sub-agents end; a parent's session
    /// ends when its slot starts the next).
    pub ends_session: bool,
    /// How the request carried its session id.
    pub id_via: IdVia,
    /// Offsets from the start of the cell.
    pub start: Duration,
    pub end: Duration,
    pub ok: bool,
    /// Still running when the drain ended; neither success nor error.
    pub cut: bool,
    pub error: Option<String>,
    pub ttft: Option<Duration>,
    pub decode_tok_per_s: Option<f64>,
    pub usage: Option<Usage>,
    pub peer: Option<String>,
    /// The engine that served it: from `x-routed-peer` through the gateway,
    /// from the engine's response id through a router (`--router-cmd`), the
    /// client's own choice in the reference cell.
    pub engine: Option<usize>,
    pub routed_mode: Option<String>,
    /// Time the gateway held it in its admission queue (`x-routed-queued-ms`).
    pub queued_ms: Option<u64>,
    /// The session the gateway attached it to (`x-routed-session`, 16 hex
    /// digits), and where it found it (`x-routed-source`).
    pub routed_session: Option<String>,
    pub routed_source: Option<String>,
    /// The first request of its session: a new-session placement.
    pub first_of_session: bool,
    /// For a later request: whether it landed on another peer than the
    /// session's previous successful one.
    pub switched_peer: Option<bool>,
}

impl Record {
    /// The ground-truth session: (slot, generation).
    pub fn session_key(&self) -> (u32, u32) {
        (self.slot, self.generation)
    }
}

/// Appends the cell's requests to `path`, one JSON object per line.
pub(crate) fn write_records(
    path: &Path,
    scenario: &str,
    mode: &str,
    records: &[Record],
) -> std::io::Result<()> {
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    for r in records {
        let line = serde_json::json!({
            "scenario": scenario,
            "mode": mode,
            "slot": r.slot,
            "generation": r.generation,
            "turn": r.turn,
            "session": r.session,
            "parent_slot": r.parent.map(|p| p.0),
            "parent_generation": r.parent.map(|p| p.1),
            "inherited_tokens": r.inherited_tokens,
            "tenant": r.tenant,
            "ends_session": r.ends_session,
            "id_via": r.id_via.name(),
            "start_s": r.start.as_secs_f64(),
            "end_s": r.end.as_secs_f64(),
            "ok": r.ok,
            "cut": r.cut,
            "error": r.error,
            "ttft_s": r.ttft.map(|d| d.as_secs_f64()),
            "decode_tok_s": r.decode_tok_per_s,
            "prompt_tokens": r.usage.map(|u| u.prompt_tokens),
            "cached_tokens": r.usage.map(|u| u.cached_tokens),
            "completion_tokens": r.usage.map(|u| u.completion_tokens),
            "peer": r.peer,
            "engine": r.engine,
            "routed_mode": r.routed_mode,
            "queued_ms": r.queued_ms,
            "routed_session": r.routed_session,
            "routed_source": r.routed_source,
            "first_of_session": r.first_of_session,
            "switched_peer": r.switched_peer,
        });
        writeln!(out, "{line}")?;
    }
    out.flush()
}
