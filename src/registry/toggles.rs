//! Runtime switches: a route file sets a value, a loopback `/_…_toggle`
//! call may override it until `?reset=1`; overrides outlive reloads.

use std::sync::atomic::Ordering;

/// A switch that the route config sets and a runtime toggle may override.
#[derive(Debug, Default)]
pub struct Toggle(std::sync::atomic::AtomicU8);

impl Toggle {
    const UNSET: u8 = 0;
    const OFF: u8 = 1;
    const ON: u8 = 2;

    /// The value in force and where it comes from ("config" or "runtime").
    pub fn effective(&self, configured: bool) -> (bool, &'static str) {
        match self.0.load(Ordering::Relaxed) {
            Self::OFF => (false, "runtime"),
            Self::ON => (true, "runtime"),
            _ => (configured, "config"),
        }
    }

    pub fn is_on(&self, configured: bool) -> bool {
        self.effective(configured).0
    }

    pub fn set(&self, on: bool) {
        self.0
            .store(if on { Self::ON } else { Self::OFF }, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        self.0.store(Self::UNSET, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
pub struct Toggles {
    pub reject_rules: Toggle,
    pub include_usage: Toggle,
    pub postprocess: Toggle,
    /// TTFT measurement and its gate / the gate alone (measure, never shed).
    pub ttft: Toggle,
    pub ttft_429: Toggle,
    pub tps: Toggle,
    pub tps_429: Toggle,
    /// The master switch over every load-based 429.
    pub rate_limit: Toggle,
    pub session_prio: Toggle,
    pub cch_strip: Toggle,
    pub kimi_normalize: Toggle,
}

/// Every toggle's name, as `/<route>/_<name>_toggle` spells it.
pub const TOGGLE_NAMES: [&str; 11] = [
    "reject_rules",
    "include_usage",
    "postprocess",
    "ttft",
    "ttft_429",
    "tps",
    "tps_429",
    "rate_limit",
    "session_prio",
    "cch_strip",
    "kimi_normalize",
];

impl Toggles {
    pub fn by_name(&self, name: &str) -> Option<&Toggle> {
        match name {
            "reject_rules" => Some(&self.reject_rules),
            "include_usage" => Some(&self.include_usage),
            "postprocess" => Some(&self.postprocess),
            "ttft" => Some(&self.ttft),
            "ttft_429" => Some(&self.ttft_429),
            "tps" => Some(&self.tps),
            "tps_429" => Some(&self.tps_429),
            "rate_limit" => Some(&self.rate_limit),
            "session_prio" => Some(&self.session_prio),
            "cch_strip" => Some(&self.cch_strip),
            "kimi_normalize" => Some(&self.kimi_normalize),
            _ => None,
        }
    }
}
