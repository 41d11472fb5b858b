//! A tenant's budgets: token and request rate limits per minute over
//! sliding windows ([`window::SlidingWindow`]), pure and clock-injected.
//!
//! A request is charged when it is admitted, one request and its prompt's
//! estimate of input tokens ([`Budget::admit`]); when it ends it is
//! reconciled with what it really cost ([`Budget::settle`], with [`spent`]):
//! the engine's usage when it reported one; for a stream cut before its
//! usage frame, the prompt (the engine computed it) and the content frames
//! it sent; nothing but the request for one that never reached an engine.
//!
//! What the windows count, as OpenAI's usage says it: input is every prompt
//! token (`prompt_tokens`, the cached ones included), cached input the part
//! of them the engine served from its prefix cache, output the completion
//! tokens. The windows count whether or not a limit is set, so that what a
//! tenant was served per minute can be shown; an unlimited tenant is charged
//! nothing at admission and everything when it ends.

pub mod window;

use window::SlidingWindow;

/// The four things a minute's budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    InputTokens,
    OutputTokens,
    CachedInputTokens,
    Requests,
}

impl Dimension {
    pub const ALL: [Dimension; 4] = [
        Dimension::InputTokens,
        Dimension::OutputTokens,
        Dimension::CachedInputTokens,
        Dimension::Requests,
    ];

    /// As limits are written and refusals are labelled.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::CachedInputTokens => "cached_input_tokens",
            Dimension::Requests => "requests",
        }
    }

    pub fn is_tokens(self) -> bool {
        self != Dimension::Requests
    }

    /// Its place in [`Dimension::ALL`] (and in an [`Elsewhere`]).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What the other replicas' windows hold per dimension, in
/// [`Dimension::ALL`]'s order, as they last published it (all zero with
/// one replica, or with the shared store away).
pub type Elsewhere = [u64; 4];

/// Limits per minute; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cached_input_tokens: Option<u64>,
    pub requests: Option<u64>,
}

impl Limits {
    pub fn of(&self, d: Dimension) -> Option<u64> {
        match d {
            Dimension::InputTokens => self.input_tokens,
            Dimension::OutputTokens => self.output_tokens,
            Dimension::CachedInputTokens => self.cached_input_tokens,
            Dimension::Requests => self.requests,
        }
    }

    /// No limit at all: admission has nothing to check.
    pub fn is_unlimited(&self) -> bool {
        Dimension::ALL.iter().all(|d| self.of(*d).is_none())
    }
}

/// What a request was charged at admission, to be reconciled when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub at_ms: u64,
    /// Input tokens charged (the prompt's estimate; 0 for an unlimited tenant).
    pub input_tokens: u64,
    /// Whether the request itself was counted (1) or is still to be (0).
    pub requests: u64,
    /// The prompt's estimate, whatever was charged: what a cut stream pays.
    pub estimate: u64,
}

/// What a request really cost, known when it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
}

/// The engine's usage as the response reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

/// What a request that ended cost: the engine's `usage` when there is one;
/// else, when the request `reached_engine` (its head went upstream), the
/// prompt's `estimate` and the `content_frames` it streamed (one token a
/// frame, as the decode-rate gate counts a stream without usage): a stream
/// cut early pays what it used; else nothing (refused or failed before an
/// engine saw it).
pub fn spent(
    usage: Option<Reported>,
    reached_engine: bool,
    estimate: u64,
    content_frames: u64,
) -> Spent {
    match usage {
        Some(u) => Spent {
            input_tokens: u.prompt_tokens,
            output_tokens: u.completion_tokens,
            cached_input_tokens: u.cached_tokens.min(u.prompt_tokens),
        },
        None if reached_engine => Spent {
            input_tokens: estimate,
            output_tokens: content_frames,
            cached_input_tokens: 0,
        },
        None => Spent::default(),
    }
}

/// Why a request was refused, and what the client is told about the
/// limit it hit (OpenAI's `x-ratelimit-*` headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub dimension: Dimension,
    pub limit: u64,
    pub remaining: u64,
    /// Milliseconds until enough of the window has slid out for the
    /// request to pass.
    pub reset_ms: u64,
}

/// How a dimension stands: its limit, what the window holds, what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub dimension: Dimension,
    pub used: u64,
    pub limit: Option<u64>,
    /// `limit - used`, 0 when over; `None` when unlimited.
    pub remaining: Option<u64>,
    /// Milliseconds until the window is empty of what it holds now.
    pub reset_ms: u64,
}

/// One tenant's four windows.
#[derive(Debug, Clone, Default)]
pub struct Budget {
    input: SlidingWindow,
    output: SlidingWindow,
    cached: SlidingWindow,
    requests: SlidingWindow,
}

impl Budget {
    fn window(&mut self, d: Dimension) -> &mut SlidingWindow {
        match d {
            Dimension::InputTokens => &mut self.input,
            Dimension::OutputTokens => &mut self.output,
            Dimension::CachedInputTokens => &mut self.cached,
            Dimension::Requests => &mut self.requests,
        }
    }

    /// Admits a request whose prompt is `estimate` tokens, charging it, or
    /// says which limit it is over. A request is over a limit when the
    /// window is already at it, or, for requests and input tokens (the two
    /// known before the engine answers), when it would take the window past
    /// it; except that an empty input window admits a prompt of any size,
    /// so that one larger than the limit is slowed to one a minute rather
    /// than refused forever. Output and cached input are known only at the
    /// end: a tenant over them is refused until they slide out.
    /// `elsewhere`: what the other replicas' windows hold, counted with
    /// this one's.
    pub fn admit(
        &mut self,
        limits: &Limits,
        estimate: u64,
        now_ms: u64,
        elsewhere: &Elsewhere,
    ) -> Result<Charge, Refusal> {
        for d in Dimension::ALL {
            let Some(limit) = limits.of(d) else {
                continue;
            };
            let there = elsewhere[d.index()];
            let used = self.window(d).used(now_ms).saturating_add(there);
            let need = match d {
                Dimension::Requests => 1,
                Dimension::InputTokens if used == 0 => 0,
                Dimension::InputTokens => estimate,
                _ => 0,
            };
            let over = used >= limit || used.saturating_add(need) > limit;
            if over {
                // Room for this request: `need` under the limit, or for the
                // ones known only at the end, anything under it.
                // What slides out elsewhere is not known here: this
                // window's own buckets tell the wait.
                let target = limit.saturating_sub(need.max(1)).saturating_sub(there);
                return Err(Refusal {
                    dimension: d,
                    limit,
                    remaining: limit.saturating_sub(used),
                    reset_ms: self.window(d).until_at_most(now_ms, target),
                });
            }
        }
        let input_tokens = if limits.input_tokens.is_some() {
            estimate
        } else {
            0
        };
        self.input.add(now_ms, input_tokens);
        self.requests.add(now_ms, 1);
        Ok(Charge {
            at_ms: now_ms,
            input_tokens,
            requests: 1,
            estimate,
        })
    }

    /// A charge for a request admitted without a look at the windows (its
    /// tenant has no limit): it is all counted at [`Budget::settle`].
    pub fn unchecked(estimate: u64, now_ms: u64) -> Charge {
        Charge {
            at_ms: now_ms,
            input_tokens: 0,
            requests: 0,
            estimate,
        }
    }

    /// Reconciles `charge` with what the request `spent`: the difference
    /// goes to the second it was charged in (while that is in the window).
    pub fn settle(&mut self, charge: &Charge, spent: Spent, now_ms: u64) {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let at = charge.at_ms;
        let more_input = signed(spent.input_tokens) - signed(charge.input_tokens);
        self.input.adjust(at, now_ms, more_input);
        self.requests
            .adjust(at, now_ms, 1 - signed(charge.requests.min(1)));
        self.output.adjust(at, now_ms, signed(spent.output_tokens));
        self.cached
            .adjust(at, now_ms, signed(spent.cached_input_tokens));
    }

    /// What each window holds now, in [`Dimension::ALL`]'s order: what
    /// this replica publishes for the others' [`Elsewhere`].
    pub fn used(&mut self, now_ms: u64) -> [u64; 4] {
        Dimension::ALL.map(|d| self.window(d).used(now_ms))
    }

    /// How each dimension stands now against `limits`, the other
    /// replicas' windows (`elsewhere`) counted.
    pub fn standing(
        &mut self,
        limits: &Limits,
        now_ms: u64,
        elsewhere: &Elsewhere,
    ) -> [Standing; 4] {
        Dimension::ALL.map(|d| {
            let window = self.window(d);
            let used = window.used(now_ms).saturating_add(elsewhere[d.index()]);
            let limit = limits.of(d);
            Standing {
                dimension: d,
                used,
                limit,
                remaining: limit.map(|l| l.saturating_sub(used)),
                reset_ms: window.until_at_most(now_ms, 0),
            }
        })
    }

    /// Nothing in any window: a tenant that can be forgotten.
    pub fn is_idle(&mut self, now_ms: u64) -> bool {
        Dimension::ALL
            .iter()
            .all(|d| self.window(*d).used(now_ms) == 0)
    }
}

#[cfg(test)]
mod tests;
