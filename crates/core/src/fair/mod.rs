//! Which waiting request a saturated pool releases next: by priority class,
//! then by tenant, the tenant with the smallest virtual token counter
//! (VTC, "Fairness in Serving Large Language Models", OSDI 2024).
//!
//! - A tenant's counter grows by the weighted tokens it is served divided
//!   by its weight ([`FairOrder::charge`]); the backlogged tenant (one with
//!   a request waiting) with the smallest counter goes first. Nothing is
//!   reserved for a tenant that does not wait: the order only decides
//!   among waiters, so a tenant alone gets everything (work-conserving).
//! - A tenant that becomes backlogged after idling has its counter lifted
//!   to the smallest counter of the tenants backlogged now (to that of the
//!   last tenant served, when none is), so an idle spell banks no credit.
//! - Classes: the highest class with a waiter goes first, but each lower
//!   class with a waiter earns `min_share / (1 - min_share)` of a turn for
//!   every release it watches go to another class, and takes its turn when
//!   it has earned a whole one: it gets at least `min_share` of the
//!   releases while it waits, so it cannot starve. Earnings are dropped
//!   when the class stops waiting (no credit banked there either).
//!
//! Groups are (class rank, tenant): within one the gateway keeps its own
//! order (warm turns first for a bounded time, new sessions by arrival).
//! [`FairOrder::next`] skips the groups the caller says tried and could not
//! be placed (a warm turn whose engine is busy, a pool other than the one
//! that freed), so a group that cannot use the room never holds it from
//! one that can.
//!
//! Pure and clock-free: counters move with tokens and releases, not time.

use std::collections::HashMap;
use std::hash::Hash;

/// What one token of each kind costs a tenant's counter, before its
/// weight. Output costs twice an input token, as in the VTC paper (a
/// decode step is dearer than a prefill token); a cached input token costs
/// a tenth (the engine skips its prefill).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenWeights {
    pub input: f64,
    pub cached_input: f64,
    pub output: f64,
}

pub const TOKEN_WEIGHTS: TokenWeights = TokenWeights {
    input: 1.0,
    cached_input: 0.1,
    output: 2.0,
};

/// Tokens served to one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Prompt tokens the engine computed (not from its cache).
    pub uncached_input: u64,
    pub cached_input: u64,
    pub output: u64,
}

impl Served {
    /// The tokens' cost, before the tenant's weight.
    pub fn cost(&self, w: &TokenWeights) -> f64 {
        w.input * self.uncached_input as f64
            + w.cached_input * self.cached_input as f64
            + w.output * self.output as f64
    }
}

/// How many idle tenants' counters are kept at most. Past it, idle tenants
/// whose counter the lift would reach anyway are forgotten first (nothing
/// lost), then every idle one (each forgiven what it was served above the
/// others: a bounded error, where tenant names from headers are not).
pub const MAX_IDLE_TENANTS: usize = 4096;

/// A whole turn earned, less the rounding of adding up fractions (nine
/// ninths must make one).
const WHOLE_TURN: f64 = 1.0 - 1e-9;

#[derive(Debug, Clone, Default)]
struct Tenant {
    counter: f64,
    /// Its weighted tokens served (before its weight, without the lifts):
    /// what its share is measured by.
    served: f64,
    /// Waiters by class rank.
    waiting: Vec<u32>,
    /// When it became backlogged (a sequence number): ties go to the
    /// earlier one.
    since: u64,
}

impl Tenant {
    fn waits(&self) -> bool {
        self.waiting.iter().any(|n| *n > 0)
    }
}

/// One tenant's standing in a queue's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub counter: f64,
    pub waiting: u32,
    /// Weighted tokens served (before its weight).
    pub served: f64,
}

/// The counters and the classes' earned turns of one pool's queue.
#[derive(Debug, Clone)]
pub struct FairOrder<K> {
    tenants: HashMap<K, Tenant>,
    /// Waiters and earned turns by class rank (0 the highest).
    class_waiting: Vec<u32>,
    class_credit: Vec<f64>,
    min_share: f64,
    /// Tenants with a waiter: with none (the rule when nothing is
    /// saturated), a request's charge at its end reads no other tenant.
    backlogged: usize,
    /// The counter of the last tenant to leave the backlog or be served
    /// while nobody waited: where a tenant arriving at an empty backlog is
    /// lifted to.
    floor: f64,
    sequence: u64,
}

impl<K: Eq + Hash + Clone> FairOrder<K> {
    /// `min_share`: each lower class's guaranteed share of the releases
    /// while it waits (clamped to 0..=0.5).
    pub fn new(min_share: f64) -> Self {
        FairOrder {
            tenants: HashMap::new(),
            class_waiting: Vec::new(),
            class_credit: Vec::new(),
            min_share: clamp_share(min_share),
            backlogged: 0,
            floor: 0.0,
            sequence: 0,
        }
    }

    pub fn set_min_share(&mut self, min_share: f64) {
        self.min_share = clamp_share(min_share);
    }

    /// Where a tenant that starts waiting now is lifted to: the smallest
    /// counter among those waiting, else the last one served.
    fn lift_target(&self) -> f64 {
        if self.backlogged == 0 {
            return self.floor;
        }
        self.tenants
            .values()
            .filter(|t| t.waits())
            .map(|t| t.counter)
            .min_by(f64::total_cmp)
            .unwrap_or(self.floor)
    }

    /// A request of `tenant` in class `class` starts waiting.
    pub fn arrive(&mut self, tenant: &K, class: usize) {
        let target = self.lift_target();
        self.sequence += 1;
        let sequence = self.sequence;
        let t = self.tenants.entry(tenant.clone()).or_default();
        if !t.waits() {
            t.counter = t.counter.max(target);
            t.since = sequence;
            self.backlogged += 1;
        }
        grow(&mut t.waiting, class);
        t.waiting[class] += 1;
        grow(&mut self.class_waiting, class);
        grow(&mut self.class_credit, class);
        self.class_waiting[class] += 1;
    }

    /// A waiter leaves (placed, timed out or gone). Call [`Self::released`]
    /// first when it was placed.
    pub fn leave(&mut self, tenant: &K, class: usize) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            let waited = t.waits();
            if let Some(n) = t.waiting.get_mut(class) {
                *n = n.saturating_sub(1);
            }
            if waited && !t.waits() {
                self.floor = self.floor.max(t.counter);
                self.backlogged = self.backlogged.saturating_sub(1);
            }
        }
        if let Some(n) = self.class_waiting.get_mut(class) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.class_credit[class] = 0.0;
            }
        }
        self.bound();
    }

    /// A waiter of `tenant` in `class` was placed, `cost` (its prompt's, as
    /// estimated) charged now so that the tenant's next waiter sees it; the
    /// lower classes watching earn their share.
    pub fn released(&mut self, tenant: &K, class: usize, cost: f64, weight: f64) {
        let earn = self.min_share / (1.0 - self.min_share);
        for (rank, credit) in self.class_credit.iter_mut().enumerate() {
            if rank == class {
                if *credit >= WHOLE_TURN {
                    *credit -= 1.0;
                }
            } else if rank > class && self.class_waiting[rank] > 0 {
                *credit += earn;
            }
        }
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.counter += cost / weight;
            t.served += cost;
        }
    }

    /// `tenant` was served `cost` more (at a request's end: what it used,
    /// less what [`Self::released`] charged). Not lifted first: the lift
    /// belongs to the tenant's next arrival ([`Self::arrive`]), which
    /// already keeps idle time from banking credit. Lifted here too, a
    /// tenant sending one turn at a time paid each turn on top of the
    /// others' counters (the review's case: 690 against 500 where the
    /// paper has a tie). A tenant not waiting becomes the floor.
    pub fn charge(&mut self, tenant: &K, cost: f64, weight: f64) {
        let waits = self.tenants.get(tenant).is_some_and(Tenant::waits);
        let t = self.tenants.entry(tenant.clone()).or_default();
        t.counter += cost / weight;
        t.served += cost;
        if !waits {
            self.floor = self.floor.max(t.counter);
            self.bound();
        }
    }

    /// The group (class rank, tenant) to release next, passing over those
    /// `tried` says could not use the room; `None` when none is left.
    pub fn next(&self, tried: impl Fn(usize, &K) -> bool) -> Option<(usize, K)> {
        let mut open: Vec<(usize, &K, &Tenant)> = Vec::new();
        for (key, t) in &self.tenants {
            for (class, n) in t.waiting.iter().enumerate() {
                if *n > 0 && !tried(class, key) {
                    open.push((class, key, t));
                }
            }
        }
        let highest = open.iter().map(|g| g.0).min()?;
        // A lower class that has earned a turn takes it; the one that has
        // earned most, the lowest on a tie.
        let class = open
            .iter()
            .map(|g| g.0)
            .filter(|c| *c > highest && self.class_credit[*c] >= WHOLE_TURN)
            .max_by(|a, b| {
                self.class_credit[*a]
                    .total_cmp(&self.class_credit[*b])
                    .then(a.cmp(b))
            })
            .unwrap_or(highest);
        open.into_iter()
            .filter(|g| g.0 == class)
            .min_by(|a, b| {
                a.2.counter
                    .total_cmp(&b.2.counter)
                    .then(a.2.since.cmp(&b.2.since))
            })
            .map(|(c, k, _)| (c, k.clone()))
    }

    /// `tenant`'s counter, and its waiters over every class.
    pub fn standing(&self, tenant: &K) -> Option<(f64, u32)> {
        self.tenants
            .get(tenant)
            .map(|t| (t.counter, t.waiting.iter().sum()))
    }

    /// Every tenant known: its counter, waiters and weighted tokens served.
    pub fn each(&self) -> impl Iterator<Item = (&K, Standing)> {
        self.tenants.iter().map(|(k, t)| {
            (
                k,
                Standing {
                    counter: t.counter,
                    waiting: t.waiting.iter().sum(),
                    served: t.served,
                },
            )
        })
    }

    /// Keeps the table bounded (see [`MAX_IDLE_TENANTS`]).
    fn bound(&mut self) {
        if self.tenants.len() <= MAX_IDLE_TENANTS {
            return;
        }
        let target = self.lift_target();
        self.tenants.retain(|_, t| t.waits() || t.counter > target);
        if self.tenants.len() > MAX_IDLE_TENANTS {
            self.tenants.retain(|_, t| t.waits());
        }
    }
}

fn clamp_share(share: f64) -> f64 {
    if share.is_finite() {
        share.clamp(0.0, 0.5)
    } else {
        0.0
    }
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, index: usize) {
    if v.len() <= index {
        v.resize(index + 1, T::default());
    }
}

#[cfg(test)]
mod tests;
