//! One route's protection, owned in one place: what it has measured (TTFT
//! and decode rate per pool and peer), what it has refused and let through,
//! its adaptive limits, session priority's counters and hold, and the
//! runtime limit overrides. Four verbs touch it: `judge` (do the gates let
//! this request in), `count` (a refusal or a trip let through, a turn, a
//! sample), `tick` (one AIMD step per pool) and `snapshot` (what the status
//! endpoints and the dashboard read). The settings come in as
//! [`Protection`], the clock and the pools' loads as arguments, so this
//! stays pure; `registry` holds one per route across reloads.

use super::aimd::{self, Step, TickInput};
use super::classes::ClassPresence;
use super::config::Protection;
use super::gate::{Gate, GateCounts, ProbeBudget};
use super::limits::{Direction, Judged, Override};
use super::meter::{Meter, MeterConfig, ScopeRef, StreamTiming};
use super::prio::{grade, releases_turn1_hold, Grade, PrioState, Turn};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// One pool's adaptive concurrency limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct AdaptivePool {
    /// `None`: fresh or expired (the next tick starts at init).
    pub current: Option<f64>,
    pub updated_ms: u64,
    /// Concurrency refusals since the last tick.
    pub rejected: u64,
    pub last_step: Option<Step>,
}

/// The runtime overrides of a route's TTFT limit and decode-rate floor
/// (`/_ttft_limit?ms=`, `/_tps_limit?tps=`), until they expire.
#[derive(Debug, Default)]
pub struct LimitOverrides {
    pub ttft_ms: Override,
    pub tps: Override,
}

/// A request's place in the session-priority turn table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnBucket {
    pub turn: Turn,
    pub bucket: usize,
    /// The bucket's share of the concurrency limit.
    pub share: f64,
}

/// The gates' runtime switches as they stand for one request: a gate that
/// is off is not judged; one that measures but does not shed is judged by
/// nobody either (its EWMA keeps being measured all the same).
#[derive(Debug, Clone, Copy)]
pub struct Switches {
    pub ttft_sheds: bool,
    pub tps_sheds: bool,
}

/// A pool as the adaptive tick sees it.
#[derive(Debug, Clone, Copy)]
pub struct PoolLoad<'a> {
    pub label: &'a str,
    /// The pool's summed `max_concurrency`.
    pub max: f64,
    pub in_flight: f64,
}

/// What the gates are asked about one request.
#[derive(Debug, Clone, Copy)]
pub struct GateRequest<'a> {
    pub pool: &'a str,
    pub model: Option<&'a str>,
    pub turn: Option<TurnBucket>,
    /// Its priority class's rank (0 the highest), if it has one: a gate
    /// refuses the lowest class present first (`classes`).
    pub class: Option<usize>,
    pub switches: Switches,
    pub now_ms: u64,
}

/// Read-only views of the state, for the status endpoints and the dashboard.
pub struct Snapshot<'a> {
    pub meter: &'a Meter,
    pub refusals: &'a GateCounts,
    pub trips_while_off: &'a GateCounts,
    pub prio: &'a PrioState,
    pub overrides: &'a LimitOverrides,
}

#[derive(Default)]
pub struct RouteProtection {
    meter: Meter,
    /// 429s by gate.
    refusals: GateCounts,
    /// Trips the rate-limit switch let through, by gate.
    trips_while_off: GateCounts,
    prio: PrioState,
    /// The adaptive limit of each pool (`"_"` without pools).
    adaptive: Mutex<HashMap<String, AdaptivePool>>,
    overrides: LimitOverrides,
    /// When each priority class was last seen at the gates.
    classes: ClassPresence,
}

impl RouteProtection {
    /// The gate that refuses `req`, with what it judged; `None` when every
    /// gate lets it in (untripped, or through a probe or its turn's grade).
    pub fn judge(&self, cfg: &Protection, req: &GateRequest) -> Option<(Gate, Judged)> {
        if let Some(rank) = req.class {
            self.classes.seen(rank, req.now_ms);
        }
        let (gate, judged) = self.tripped(cfg, req)?;
        (!self.admitted_past_trip(cfg, req, gate, &judged)).then_some((gate, judged))
    }

    /// The first gate the pool's EWMAs trip (TTFT before decode rate). With
    /// session priority a gate starts grading at its first bucket's line,
    /// and a held turn 1 counts as a TTFT trip. A class above the lowest
    /// present trips only further past the line (`classes`).
    fn tripped(&self, cfg: &Protection, req: &GateRequest) -> Option<(Gate, Judged)> {
        let now = req.now_ms;
        let reading = self
            .meter
            .reading(ScopeRef::Pool(req.pool), cfg.meter.ttl_ms, now);
        let first_tol = match req.turn {
            Some(_) => cfg.session_prio.table.first().map_or(1.0, |b| b.tol),
            None => 1.0,
        };
        if req.switches.ttft_sheds {
            let ttft = cfg.judge_ttft(&reading, req.model, self.overrides.ttft_ms.get(now));
            let hold = &self.prio.hold_turn1;
            if req.turn.is_some()
                && releases_turn1_hold(ttft.ewma, ttft.limit, cfg.session_prio.release)
            {
                hold.store(false, Ordering::Relaxed);
            }
            let held = req.turn.is_some_and(|t| t.bucket == 0) && hold.load(Ordering::Relaxed);
            if held
                || (ttft.tripped(Direction::Above, first_tol)
                    && ttft.tripped(Direction::Above, first_tol * self.class_line(req)))
            {
                return Some((Gate::Ttft, ttft));
            }
        }
        // An adaptive route answers a slow decode rate with a lower limit,
        // not with decode-rate 429s.
        if req.switches.tps_sheds && cfg.adaptive_on().is_none() {
            let tps = cfg.judge_tps(&reading, self.overrides.tps.get(now))?;
            if tps.tripped(Direction::Below, first_tol)
                && tps.tripped(Direction::Below, first_tol * self.class_line(req))
            {
                return Some((Gate::Tps, tps));
            }
        }
        None
    }

    /// How far past its limit a gate must be to refuse `req`'s class.
    fn class_line(&self, req: &GateRequest) -> f64 {
        req.class
            .map_or(1.0, |rank| self.classes.line(rank, req.now_ms))
    }

    /// A tripped gate still lets a probe through; with session priority it
    /// grades by bucket instead.
    fn admitted_past_trip(
        &self,
        cfg: &Protection,
        req: &GateRequest,
        gate: Gate,
        judged: &Judged,
    ) -> bool {
        let budget = self.meter.probe_budget(req.pool, gate.as_str());
        match req.turn {
            Some(t) => self.graded(cfg, req.now_ms, &budget, gate, judged, t),
            None => budget.take(req.now_ms, cfg.probe_window.as_millis() as u64, cfg.probes),
        }
    }

    /// A gate with session priority: open under the bucket's soft line; in
    /// the soft zone or past the hard trip a warm turn needs a probe slot,
    /// turn 1 its own (smaller) budget, and only while the gate is really
    /// tripped, no warm turn has probed this window and no hold is set. A
    /// turn 1 the TTFT gate refuses sets the hold.
    fn graded(
        &self,
        cfg: &Protection,
        now: u64,
        budget: &ProbeBudget,
        gate: Gate,
        judged: &Judged,
        t: TurnBucket,
    ) -> bool {
        let prio = &cfg.session_prio;
        let state = &self.prio;
        let dir = match gate {
            Gate::Tps => Direction::Below,
            _ => Direction::Above,
        };
        let held = gate == Gate::Ttft && state.hold_turn1.load(Ordering::Relaxed);
        let pressure = judged.pressure(dir);
        if grade(pressure, &prio.table, t.bucket, prio.severe, held) == Grade::Open {
            return true;
        }
        let window = cfg.probe_window.as_millis() as u64;
        if t.bucket > 0 {
            return budget.take(now, window, cfg.probes);
        }
        let admitted = !held
            && judged.tripped(dir, 1.0)
            && budget.used(now, window) == 0
            && state.t1_probes.take(now, window, prio.t1_probes);
        if !admitted && gate == Gate::Ttft {
            state.hold_turn1.store(true, Ordering::Relaxed);
        }
        admitted
    }

    /// Counts a gate's trip: a real refusal when the rate-limit switch is on
    /// (`shed`), a trip let through when it is off. Returns `shed`.
    pub fn count(&self, gate: Gate, shed: bool) -> bool {
        if shed {
            self.refusals.add(gate);
        } else {
            self.trips_while_off.add(gate);
        }
        shed
    }

    /// Counts a request of session priority's `turn`, admitted or refused.
    pub fn count_turn(&self, turn: TurnBucket, admitted: bool) {
        self.prio.count(turn.bucket, turn.turn, admitted);
    }

    /// Notes whether a request's turn header was usable; `Some((unusable,
    /// total))` once a minute when their share passed `warn_frac`.
    pub fn count_turn_header(&self, turn: Turn, now_ms: u64, warn_frac: f64) -> Option<(u64, u64)> {
        self.prio.no_header.lock().note(turn, now_ms, warn_frac)
    }

    /// Notes a concurrency refusal for the pool's next tick.
    pub fn count_adaptive_refusal(&self, cfg: &Protection, pool: &str) {
        if cfg.adaptive_on().is_some() {
            let mut pools = self.adaptive.lock();
            pools.entry(pool.to_string()).or_default().rejected += 1;
        }
    }

    /// A finished stream's TTFT and decode rate into the pool's and the
    /// peer's series; the decode-rate sample, if it made one.
    pub fn count_stream(
        &self,
        cfg: &MeterConfig,
        pool: &str,
        peer: &str,
        timing: &StreamTiming,
        now_ms: u64,
    ) -> Option<f64> {
        self.meter.record(cfg, pool, peer, timing, now_ms)
    }

    /// Zeroes the refusal and let-through counts (`/_429_status?reset=1`).
    pub fn reset_counts(&self) {
        self.refusals.reset();
        self.trips_while_off.reset();
    }

    /// The runtime limit overrides, which `/_ttft_limit` and `/_tps_limit`
    /// set and clear.
    pub fn overrides(&self) -> &LimitOverrides {
        &self.overrides
    }

    /// The adaptive limit in force for pool `label` whose static limit is
    /// `max`, when the route has one.
    pub fn adaptive_limit(&self, cfg: &Protection, label: &str, max: f64) -> Option<f64> {
        let params = cfg.adaptive_on()?.params(max);
        let state = self.adaptive.lock().get(label).copied();
        Some(state.and_then(|s| s.current).unwrap_or(params.init))
    }

    /// One AIMD step for every pool (the route's sweeper calls it every
    /// `protection.adaptive.interval`).
    pub fn tick(&self, cfg: &Protection, pools: &[PoolLoad], now_ms: u64) {
        let Some(adaptive) = cfg.adaptive_on() else {
            return;
        };
        for pool in pools {
            let params = adaptive.params(pool.max);
            let reading = self
                .meter
                .reading(ScopeRef::Pool(pool.label), cfg.meter.ttl_ms, now_ms);
            let mut states = self.adaptive.lock();
            let state = states.entry(pool.label.to_string()).or_default();
            let expired = !params.hold_when_idle
                && now_ms.saturating_sub(state.updated_ms) >= adaptive.ttl_ms;
            let model = (pool.label != "_").then_some(pool.label);
            let ttft = cfg.judge_ttft(&reading, model, self.overrides.ttft_ms.get(now_ms));
            let tps = cfg.judge_tps(&reading, self.overrides.tps.get(now_ms));
            let input = TickInput {
                current: state.current.filter(|_| !expired),
                in_flight: pool.in_flight,
                rejected: std::mem::take(&mut state.rejected),
                tps: tps.map_or(reading.tps, |j| j.ewma),
                tps_floor: tps.map(|j| j.limit),
                ttft: ttft.ewma,
                ttft_limit: Some(ttft.limit),
            };
            let (next, step) = aimd::step(&params, &input);
            if step != Step::NoSignal {
                state.updated_ms = now_ms;
            }
            state.current = next;
            state.last_step = Some(step);
        }
    }

    /// What the status endpoints and the dashboard read.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            meter: &self.meter,
            refusals: &self.refusals,
            trips_while_off: &self.trips_while_off,
            prio: &self.prio,
            overrides: &self.overrides,
        }
    }

    /// Each pool's adaptive limit as it stands (a copy: the tick moves it).
    pub fn adaptive_pools(&self) -> HashMap<String, AdaptivePool> {
        self.adaptive.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protect::config::SessionPrio;
    use std::time::Duration;

    fn protection(ttft_limit_ms: f64) -> Protection {
        Protection {
            meter: MeterConfig {
                ttft_window_ms: 1_000,
                ..MeterConfig::default()
            },
            ttft_limit_ms,
            ttft_limit_by_model: Vec::new(),
            tps_limit_tps: None,
            ttft_metrics: None,
            tps_metrics: None,
            load_rate_limit: None,
            adaptive: Default::default(),
            session_prio: SessionPrio {
                enabled: false,
                table: crate::protect::prio::default_table(0.85, 32, 1.5),
                rt_limit_factor: 1.0,
                severe: 1.5,
                release: 0.9,
                t1_probes: 1,
                warn_frac: 0.2,
            },
            probes: 1,
            probe_window: Duration::from_secs(10),
        }
    }

    fn request(now_ms: u64) -> GateRequest<'static> {
        GateRequest {
            pool: "_",
            model: None,
            turn: None,
            class: None,
            switches: Switches {
                ttft_sheds: true,
                tps_sheds: true,
            },
            now_ms,
        }
    }

    /// One closed TTFT window of `ms` samples in pool `_`.
    fn measured(p: &RouteProtection, cfg: &Protection, ms: u64) -> u64 {
        let timing = StreamTiming {
            ttft: Some(Duration::from_millis(ms)),
            decode: None,
            completion_tokens: None,
            content_frames: 1,
        };
        p.count_stream(&cfg.meter, "_", "e0", &timing, 0);
        cfg.meter.ttft_window_ms + 1
    }

    #[test]
    fn a_pool_over_its_ttft_limit_is_refused_after_its_probes() {
        let cfg = protection(100.0);
        let p = RouteProtection::default();
        assert!(p.judge(&cfg, &request(0)).is_none(), "no EWMA yet");
        let now = measured(&p, &cfg, 300);
        assert!(p.judge(&cfg, &request(now)).is_none(), "the probe");
        let (gate, judged) = p.judge(&cfg, &request(now)).expect("refused");
        assert_eq!((gate, judged.limit), (Gate::Ttft, 100.0));
        // Control: the same samples under a higher limit pass.
        let cfg = protection(1_000.0);
        let p = RouteProtection::default();
        let now = measured(&p, &cfg, 300);
        for _ in 0..3 {
            assert!(p.judge(&cfg, &request(now)).is_none());
        }
    }

    #[test]
    fn the_lowest_class_present_is_refused_first() {
        let cfg = protection(100.0);
        let p = RouteProtection::default();
        // 120 ms against 100: past the limit, short of 1.25 times it.
        let now = measured(&p, &cfg, 120);
        let in_class = |rank| GateRequest {
            class: Some(rank),
            ..request(now)
        };
        assert!(p.judge(&cfg, &in_class(2)).is_none(), "batch's probe");
        assert!(p.judge(&cfg, &in_class(2)).is_some(), "batch refused");
        for _ in 0..3 {
            assert!(
                p.judge(&cfg, &in_class(0)).is_none(),
                "interactive passes while batch is present"
            );
        }
        // Control: with no lower class present, interactive is the lowest
        // and is refused at the limit itself.
        let p = RouteProtection::default();
        let now = measured(&p, &cfg, 120);
        let interactive = GateRequest {
            class: Some(0),
            ..request(now)
        };
        assert!(p.judge(&cfg, &interactive).is_none(), "the probe");
        assert!(p.judge(&cfg, &interactive).is_some());
    }

    #[test]
    fn a_trip_counts_as_a_refusal_or_as_let_through_and_resets() {
        let p = RouteProtection::default();
        assert!(p.count(Gate::Ttft, true));
        assert!(!p.count(Gate::Ttft, false));
        let s = p.snapshot();
        assert_eq!(
            (
                s.refusals.get(Gate::Ttft),
                s.trips_while_off.get(Gate::Ttft)
            ),
            (1, 1)
        );
        p.reset_counts();
        let s = p.snapshot();
        assert_eq!((s.refusals.total(), s.trips_while_off.total()), (0, 0));
    }
}
