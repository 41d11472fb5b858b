//! Tenants at run time: the tenants file in force, and per tenant its
//! budget windows, requests in flight and refusals. One per process
//! (`Registry::tenants`): tenants are gateway-wide, not per route.
//!
//! Who writes what: `Registry::reload` swaps the file in ([`Tenants::reload`]);
//! the request path admits ([`Tenants::admit`], from `proxy/guards/tenant.rs`)
//! and settles ([`Admission::settle`], at the stream's end or in `logging`);
//! with a Redis session store, the cluster sync sets what the other
//! replicas' windows hold (`shared.rs`, [`Tenants::set_elsewhere`]);
//! `/_tenants` and `/metrics` read.
//!
//! Without a tenants file nothing is tracked ([`Tenants::tracked`]): a
//! request then costs one atomic load here, no lock and no allocation,
//! since there is no limit to enforce and no tenant the metrics would name.
//!
//! A tenant's state is made the first time it sends and kept while the
//! tenant is named in the file, has a request in flight or anything in its
//! windows; past [`MAX_TRACKED`] tenants (names come from request headers
//! when keys are off) the idle ones are forgotten, and when none is, a new
//! name shares the `other` state.

pub mod shared;
mod state;
mod status;

pub use state::{Reason, TenantState};
pub use status::{FairStanding, RouteQueue};

use state::{label_of, Handles};

use crate::budget::{self, Budget, Charge, Refusal, Spent, Standing};
use crate::config::tenants::{TenantsConfig, OTHER_LABEL};
use crate::config::ConfigError;
use arc_swap::ArcSwap;
use parking_lot::RwLock;
use prometheus::IntGauge;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

/// Tenants whose state is kept at most.
pub const MAX_TRACKED: usize = 10_000;

/// The tenant of a request that names none (no key, no header).
pub static DEFAULT_TENANT: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("default"));

/// A request's tenant as a saturated pool's queue orders it
/// (`registry/room.rs`): its name, the rank of its priority class (0 the
/// highest) and its weight.
#[derive(Debug, Clone)]
pub struct Tag {
    pub name: Arc<str>,
    pub class: usize,
    pub weight: f64,
}

/// A class a request asked for and may not have: not one of the classes,
/// or not among its tenant's `allowed_classes`.
#[derive(Debug, Clone)]
pub struct ClassRefusal {
    pub tenant: Arc<str>,
    pub asked: String,
    pub known: bool,
    pub allowed: Vec<String>,
}

/// A request refused for its tenant.
#[derive(Debug, Clone)]
pub struct TenantRefusal {
    pub tenant: Arc<str>,
    pub reason: Reason,
    /// For a budget: the limit it hit and when it has room again.
    pub budget: Option<Refusal>,
    /// For the cap: the cap.
    pub max_in_flight: Option<u64>,
    /// Every dimension's standing, for the `x-ratelimit-*` headers.
    pub standing: [Standing; 4],
}

/// A request admitted for its tenant: holds its place among the tenant's
/// requests in flight until dropped (on every path, as the context is),
/// and its charge until [`Admission::settle`] consumes it (so it cannot be
/// settled twice). Dropped unsettled (a task cancelled), the charge stays
/// as admitted.
pub struct Admission {
    state: Arc<TenantState>,
    charge: Charge,
    /// The gauge it raised, lowered on drop even if a reload relabelled
    /// the tenant meanwhile.
    gauge: IntGauge,
}

impl Admission {
    pub fn tenant(&self) -> &Arc<str> {
        &self.state.name
    }

    /// Reconciles the charge with what the request `spent`, and gives its
    /// place in flight back.
    pub fn settle(self, spent: Spent, now_ms: u64) {
        self.state.budget.lock().settle(&self.charge, spent, now_ms);
        let tokens = &self.state.handles.load().tokens;
        tokens[0].inc_by(spent.input_tokens);
        tokens[1].inc_by(spent.output_tokens);
        tokens[2].inc_by(spent.cached_input_tokens);
    }

    /// The prompt's estimate it was admitted with.
    pub fn estimate(&self) -> u64 {
        self.charge.estimate
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.gauge.dec();
    }
}

/// The tenants file in force and every tenant's state.
pub struct Tenants {
    config: ArcSwap<TenantsConfig>,
    /// A tenants file is in force (`config.file` is set): read on every
    /// request, so a bare atomic rather than the config's `ArcSwap`.
    tracked: AtomicBool,
    states: RwLock<HashMap<Arc<str>, Arc<TenantState>>>,
    /// When the idle tenants were last swept (`state`): at most once a
    /// second, so that a full table of busy tenants is not scanned again
    /// under the write lock for every request of a newcomer.
    last_sweep_ms: AtomicU64,
}

/// How often a full table of tenants is swept for idle ones at most.
const SWEEP_EVERY_MS: u64 = 1_000;

impl Default for Tenants {
    fn default() -> Self {
        Tenants {
            config: ArcSwap::from_pointee(TenantsConfig::default()),
            tracked: AtomicBool::new(false),
            states: RwLock::new(HashMap::new()),
            last_sweep_ms: AtomicU64::new(0),
        }
    }
}

impl Tenants {
    /// The file in force (one `Arc` load, no lock).
    pub fn config(&self) -> Arc<TenantsConfig> {
        self.config.load_full()
    }

    /// Each lower class's guaranteed share of a queue's releases. Read on
    /// every placement on a fair route: a guard, not the `Arc` that
    /// [`Self::config`] counts a reference of on every call.
    pub fn class_min_share(&self) -> f64 {
        self.config.load().class_min_share
    }

    /// Whether requests are admitted and counted per tenant: only with a
    /// tenants file in force. Without one there are no budgets or caps to
    /// enforce; the tenant is still named on every request, for the fair
    /// order of a saturated pool's queue.
    pub fn tracked(&self) -> bool {
        self.tracked.load(Ordering::Relaxed)
    }

    /// Reads `file` again (`None`: no tenants file, the defaults) and swaps
    /// it in; a file that fails keeps the version in force. `Ok(true)` when
    /// what is in force changed.
    pub fn reload(&self, file: Option<&Path>) -> Result<bool, ConfigError> {
        let next = match file {
            None => TenantsConfig::default(),
            Some(path) => TenantsConfig::load(path)?,
        };
        if *self.config.load_full() == next {
            return Ok(false);
        }
        // Under the states' lock, so a state made meanwhile has the new labels.
        let states = self.states.write();
        for state in states.values() {
            state
                .handles
                .store(Arc::new(Handles::of(label_of(&next, &state.name))));
        }
        self.tracked.store(next.file.is_some(), Ordering::Relaxed);
        self.config.store(Arc::new(next));
        Ok(true)
    }

    /// `name`'s state, made the first time it is asked for.
    fn state(&self, name: &Arc<str>, now_ms: u64) -> Arc<TenantState> {
        if let Some(state) = self.states.read().get(name) {
            return Arc::clone(state);
        }
        let mut states = self.states.write();
        let config = self.config.load();
        if let Some(state) = states.get(name) {
            return Arc::clone(state);
        }
        // Under the write lock: no other sweep runs meanwhile.
        let last_sweep = self.last_sweep_ms.load(Ordering::Relaxed);
        if states.len() >= MAX_TRACKED && now_ms.saturating_sub(last_sweep) >= SWEEP_EVERY_MS {
            self.last_sweep_ms.store(now_ms, Ordering::Relaxed);
            // Held outside the table (an admission, or a request between
            // this lookup and its count in flight): kept, so that no
            // request counts against a state the table no longer has.
            states.retain(|n, s| {
                config.names(n) || Arc::strong_count(s) > 1 || !s.budget.lock().is_idle(now_ms)
            });
        }
        let key = if states.len() >= MAX_TRACKED && !config.names(name) {
            Arc::from(OTHER_LABEL)
        } else {
            Arc::clone(name)
        };
        Arc::clone(
            states
                .entry(Arc::clone(&key))
                .or_insert_with(|| Arc::new(TenantState::new(key, &config))),
        )
    }

    /// `name`'s tag for a request that asked for class `asked` (the
    /// priority header's value; `None`: the tenant's own class).
    pub fn tag(&self, name: Arc<str>, asked: Option<&str>) -> Result<Tag, Box<ClassRefusal>> {
        let config = self.config.load();
        let policy = config.policy(&name);
        let class = asked.unwrap_or(&policy.class);
        let rank = config
            .class_rank(class)
            .filter(|_| policy.allowed_classes.iter().any(|c| c == class));
        match rank {
            Some(class) => Ok(Tag {
                weight: policy.weight,
                class,
                name,
            }),
            None => Err(Box::new(ClassRefusal {
                known: config.class_rank(class).is_some(),
                asked: class.to_string(),
                allowed: policy.allowed_classes.clone(),
                tenant: name,
            })),
        }
    }

    /// Admits a request of tenant `name` whose prompt is `estimate` tokens,
    /// or refuses it: over its cap on requests in flight, or over a budget.
    /// A tenant with no limit and no cap is only counted.
    pub fn admit(
        &self,
        name: &Arc<str>,
        estimate: u64,
        now_ms: u64,
    ) -> Result<Admission, Box<TenantRefusal>> {
        let config = self.config.load();
        let policy = config.policy(name);
        let state = self.state(name, now_ms);
        let before = state.in_flight.fetch_add(1, Ordering::Relaxed);
        let refuse = |reason: Reason, budget: Option<Refusal>| {
            state.in_flight.fetch_sub(1, Ordering::Relaxed);
            state.refused(reason);
            Box::new(TenantRefusal {
                tenant: Arc::clone(&state.name),
                reason,
                budget,
                max_in_flight: policy.max_in_flight,
                standing: state.standing(policy, now_ms),
            })
        };
        if policy.max_in_flight.is_some_and(|cap| before >= cap) {
            return Err(refuse(Reason::InFlight, None));
        }
        let charge = if policy.limits.is_unlimited() {
            Budget::unchecked(estimate, now_ms)
        } else {
            let elsewhere = state.elsewhere();
            let admitted = state
                .budget
                .lock()
                .admit(&policy.limits, estimate, now_ms, &elsewhere);
            match admitted {
                Ok(charge) => charge,
                Err(r) => return Err(refuse(Reason::Budget(r.dimension), Some(r))),
            }
        };
        let gauge = state.handles.load().in_flight.clone();
        gauge.inc();
        Ok(Admission {
            state,
            charge,
            gauge,
        })
    }

    /// What this replica's windows hold, per tenant with anything in them,
    /// for the other replicas (`tenants/shared.rs`); nothing when no tenant
    /// has a budget, so that a gateway without limits shares nothing.
    pub fn published(&self, now_ms: u64) -> Vec<(Arc<str>, [u64; 4])> {
        if self.config.load().is_unlimited() {
            return Vec::new();
        }
        let states: Vec<Arc<TenantState>> = self.states.read().values().cloned().collect();
        states
            .into_iter()
            .filter_map(|s| {
                let used = s.budget.lock().used(now_ms);
                (used != [0; 4]).then(|| (Arc::clone(&s.name), used))
            })
            .collect()
    }

    /// Sets what the other replicas' windows hold (`others`, summed over
    /// them, by tenant); a tenant they do not name holds nothing there.
    pub fn set_elsewhere(&self, others: &HashMap<String, [u64; 4]>, now_ms: u64) {
        for name in others.keys() {
            // Made here if new, so its first request here counts them.
            self.state(&Arc::from(name.as_str()), now_ms);
        }
        for state in self.states.read().values() {
            state.set_elsewhere(others.get(&*state.name).copied().unwrap_or([0; 4]));
        }
    }

    /// `/_tenants`: every tenant named or seen, as it stands at `now_ms`,
    /// and where it waits in the routes' `queues`.
    pub fn status_json(&self, now_ms: u64, queues: &[RouteQueue]) -> serde_json::Value {
        let states: Vec<Arc<TenantState>> = self.states.read().values().cloned().collect();
        status::json(&self.config(), &states, queues, now_ms)
    }
}

/// What a request that ended cost its tenant, from what the response
/// pipeline saw (`budget::spent`).
pub fn spent(
    usage: Option<crate::stream::Usage>,
    reached_engine: bool,
    estimate: u64,
    content_frames: u64,
) -> Spent {
    let reported = usage.map(|u| budget::Reported {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cached_tokens: u.cached_tokens,
    });
    budget::spent(reported, reached_engine, estimate, content_frames)
}

#[cfg(test)]
mod tests;
