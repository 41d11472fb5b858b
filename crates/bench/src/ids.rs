//! How the bench tells the gateway which session a request belongs to
//! (`--session-id`): today's `x-session-id` header, nothing at all (the
//! gateway must recognise the conversation by its content), OpenAI's
//! `prompt_cache_key` body field, or a seeded mix of header and nothing.
//! Pure, so the mix is a function of (seed, session) that every mode shares.

use crate::text::Rng;

/// The header every session sends in `header` mode.
pub const SESSION_HEADER: &str = "x-session-id";

/// `--session-id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum SessionIdMode {
    /// Every request carries `x-session-id: <session>` (today's behaviour).
    #[default]
    Header,
    /// No session id at all.
    None,
    /// The session in the body's `prompt_cache_key` field, no header.
    PromptCacheKey,
    /// A share of sessions (`--id-share`, seeded per session) send the
    /// header, the rest nothing.
    Mixed,
}

impl SessionIdMode {
    pub fn name(self) -> &'static str {
        match self {
            SessionIdMode::Header => "header",
            SessionIdMode::None => "none",
            SessionIdMode::PromptCacheKey => "prompt-cache-key",
            SessionIdMode::Mixed => "mixed",
        }
    }
}

impl std::fmt::Display for SessionIdMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How one request carries its session id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdVia {
    Header,
    PromptCacheKey,
    /// Not at all (and every request of the reference cell).
    #[default]
    Nothing,
}

impl IdVia {
    /// As in the records file: `header`, `prompt_cache_key` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            IdVia::Header => "header",
            IdVia::PromptCacheKey => "prompt_cache_key",
            IdVia::Nothing => "none",
        }
    }
}

/// The run's session-id policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionIds {
    pub mode: SessionIdMode,
    /// `mixed`: the share of sessions that send the header.
    pub share: f64,
    pub seed: u64,
}

impl SessionIds {
    /// How every request of `session` (its name) carries its id.
    pub fn via(&self, session: &str) -> IdVia {
        match self.mode {
            SessionIdMode::Header => IdVia::Header,
            SessionIdMode::None => IdVia::Nothing,
            SessionIdMode::PromptCacheKey => IdVia::PromptCacheKey,
            SessionIdMode::Mixed if mixed_sends_id(self.seed, session, self.share) => IdVia::Header,
            SessionIdMode::Mixed => IdVia::Nothing,
        }
    }
}

/// `mixed`: whether `session` sends its id. A uniform draw in [0, 1) from
/// (seed, the session's name), below `share`: the same session decides the
/// same way in every cell and every run with the seed.
pub fn mixed_sends_id(seed: u64, session: &str, share: f64) -> bool {
    let mut rng = Rng::derive(seed, &[0x4944_5348, fnv1a(session.as_bytes())]);
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    unit < share
}

/// FNV-1a, 64-bit: a stable hash of a session's name.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> impl Iterator<Item = String> {
        (0..2_000).map(|i| format!("bench-1-{}-{}", i % 64, i / 64))
    }

    #[test]
    fn the_mixed_choice_is_deterministic_and_near_the_share() {
        let chosen = |seed: u64, share: f64| -> Vec<bool> {
            names().map(|n| mixed_sends_id(seed, &n, share)).collect()
        };
        // The same (seed, session) decides the same way every time.
        assert_eq!(chosen(1, 0.5), chosen(1, 0.5));
        // Another seed, another choice.
        assert_ne!(chosen(1, 0.5), chosen(2, 0.5));
        let share = |v: Vec<bool>| v.iter().filter(|b| **b).count() as f64 / v.len() as f64;
        let half = share(chosen(1, 0.5));
        assert!((0.45..0.55).contains(&half), "{half}");
        let fifth = share(chosen(3, 0.2));
        assert!((0.16..0.24).contains(&fifth), "{fifth}");
        assert_eq!(share(chosen(1, 0.0)), 0.0);
        assert_eq!(share(chosen(1, 1.0)), 1.0);
        // A session sending at a share sends at every larger share.
        for n in names() {
            assert!(!mixed_sends_id(5, &n, 0.3) || mixed_sends_id(5, &n, 0.7));
        }
    }

    #[test]
    fn each_mode_carries_the_id_its_way() {
        let ids = |mode| SessionIds {
            mode,
            share: 0.5,
            seed: 1,
        };
        assert_eq!(ids(SessionIdMode::Header).via("s"), IdVia::Header);
        assert_eq!(ids(SessionIdMode::None).via("s"), IdVia::Nothing);
        assert_eq!(
            ids(SessionIdMode::PromptCacheKey).via("s"),
            IdVia::PromptCacheKey
        );
        let mixed = ids(SessionIdMode::Mixed);
        let vias: Vec<IdVia> = names().map(|n| mixed.via(&n)).collect();
        assert!(vias.contains(&IdVia::Header) && vias.contains(&IdVia::Nothing));
        assert!(!vias.contains(&IdVia::PromptCacheKey));
        assert_eq!(
            names()
                .map(|n| mixed.via(&n) == IdVia::Header)
                .collect::<Vec<_>>(),
            names()
                .map(|n| mixed_sends_id(1, &n, 0.5))
                .collect::<Vec<_>>()
        );
    }
}
