//! One tenant's run-time state: its budget windows, requests in flight,
//! refusals by reason, and its series in `/metrics`.

use crate::budget::{Budget, Dimension, Elsewhere, Standing};
use crate::config::tenants::{TenantPolicy, TenantsConfig, OTHER_LABEL};
use crate::metrics::metrics;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use prometheus::{IntCounter, IntGauge};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why a tenant's request was refused: a budget's dimension, or its cap
/// on requests in flight. The `reason` label of the refusals metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Budget(Dimension),
    InFlight,
}

impl Reason {
    pub(super) const ALL: [Reason; 5] = [
        Reason::Budget(Dimension::InputTokens),
        Reason::Budget(Dimension::OutputTokens),
        Reason::Budget(Dimension::CachedInputTokens),
        Reason::Budget(Dimension::Requests),
        Reason::InFlight,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Budget(d) => d.as_str(),
            Reason::InFlight => "in_flight",
        }
    }

    pub(super) fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// The token kinds served, as the `kind` label of the tokens metric.
const TOKEN_KINDS: [&str; 3] = ["input", "output", "cached_input"];

/// One tenant's series in `/metrics`, under its label (its name when the
/// file names it, else `other`).
pub(super) struct Handles {
    pub(super) in_flight: IntGauge,
    pub(super) refusals: [IntCounter; 5],
    pub(super) tokens: [IntCounter; 3],
}

impl Handles {
    pub(super) fn of(label: &str) -> Handles {
        let m = metrics();
        Handles {
            in_flight: m.tenant_in_flight.with_label_values(&[label]),
            refusals: Reason::ALL
                .map(|r| m.tenant_refusals.with_label_values(&[label, r.as_str()])),
            tokens: TOKEN_KINDS.map(|k| m.tenant_tokens.with_label_values(&[label, k])),
        }
    }
}

/// One tenant's run-time state.
pub struct TenantState {
    pub name: Arc<str>,
    pub(super) budget: Mutex<Budget>,
    pub(super) in_flight: AtomicU64,
    pub(super) refusals: [AtomicU64; 5],
    /// Swapped when a reload names or stops naming this tenant.
    pub(super) handles: ArcSwap<Handles>,
    /// What the other replicas' windows hold, by dimension, as last read
    /// from the shared store (`tenants/shared.rs`); zeros without one.
    pub(super) elsewhere: [AtomicU64; 4],
}

impl TenantState {
    pub(super) fn new(name: Arc<str>, config: &TenantsConfig) -> Self {
        let label = label_of(config, &name);
        TenantState {
            budget: Mutex::new(Budget::default()),
            in_flight: AtomicU64::new(0),
            refusals: Default::default(),
            handles: ArcSwap::from_pointee(Handles::of(label)),
            elsewhere: Default::default(),
            name,
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(super) fn refused(&self, reason: Reason) {
        self.refusals[reason.index()].fetch_add(1, Ordering::Relaxed);
        self.handles.load().refusals[reason.index()].inc();
    }

    pub(super) fn standing(&self, policy: &TenantPolicy, now_ms: u64) -> [Standing; 4] {
        let elsewhere = self.elsewhere();
        self.budget
            .lock()
            .standing(&policy.limits, now_ms, &elsewhere)
    }

    pub(super) fn elsewhere(&self) -> Elsewhere {
        self.elsewhere.each_ref().map(|n| n.load(Ordering::Relaxed))
    }

    pub(super) fn set_elsewhere(&self, counts: Elsewhere) {
        for (slot, n) in self.elsewhere.iter().zip(counts) {
            slot.store(n, Ordering::Relaxed);
        }
    }
}

pub(super) fn label_of<'a>(config: &TenantsConfig, name: &'a str) -> &'a str {
    if config.names(name) {
        name
    } else {
        OTHER_LABEL
    }
}
