//! Adaptive concurrency: the AIMD step a pool's limit takes each tick, as a
//! pure function of what the tick saw. The OpenResty gateway's rules, in order:
//!
//! 1. no decode-rate EWMA yet → no step (nothing to judge by);
//! 2. overloaded (decode rate below its floor, or TTFT above its limit,
//!    when TTFT is used) → shrink (`× dec`);
//! 3. requests were refused for concurrency since the last tick → grow
//!    (`× inc`): that is demand the limit turned away;
//! 4. under pressure (in-flight ≥ `pressure_frac × cur`, or fewer than `abs`
//!    slots left) → grow, but not past what the load needs (`desired`);
//! 5. light load (some traffic, under `slack_frac × cur`, more than `abs`
//!    slots spare, above `init`) and not holding when idle → shrink toward
//!    `desired`, not below `init`;
//! 6. below `init` otherwise → climb back `× inc`;
//!
//! then clamp to `[min, max]`. `desired = max(conc / mid, conc + abs)`,
//! `mid` halfway between `slack_frac` and `pressure_frac` (0.8 by default),
//! as the OpenResty gateway has it.

/// The coefficients of the rules above that a route may set
/// (`protection.adaptive.*`, which `/_route_opts` serves under `advanced`),
/// with the OpenResty gateway's values as defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coefficients {
    /// Growth factor per step (> 1).
    pub inc: f64,
    /// Shrink factor per step (in (0, 1)).
    pub dec: f64,
    /// In-flight at this fraction of the limit is pressure (in (0, 1]).
    pub pressure_frac: f64,
    /// In-flight under this fraction of the limit is slack (in (0, pressure_frac)).
    pub slack_frac: f64,
    /// Slots kept free above in-flight whatever the fractions say (>= 0).
    pub abs: f64,
    /// The default floor as a fraction of the static limit (in (0, 1]).
    pub min_frac: f64,
}

impl Default for Coefficients {
    fn default() -> Self {
        Coefficients {
            inc: 1.02,
            dec: 0.97,
            pressure_frac: 0.9,
            slack_frac: 0.7,
            abs: 5.0,
            min_frac: 0.4,
        }
    }
}

/// The parameters of one pool's step: its bounds and the coefficients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AimdParams {
    /// The static limit (the pool's summed `max_concurrency`): the ceiling.
    pub max: f64,
    /// The floor; at least 1.
    pub min: f64,
    /// Where a fresh or expired limit starts, and where low traffic stops
    /// shrinking it; `min` when not configured.
    pub init: f64,
    pub inc: f64,
    pub dec: f64,
    pub pressure_frac: f64,
    pub slack_frac: f64,
    pub abs: f64,
    /// Low or absent traffic never lowers the limit.
    pub hold_when_idle: bool,
    /// TTFT above its limit counts as overload.
    pub use_ttft: bool,
}

impl AimdParams {
    /// The OpenResty gateway's defaults for a pool whose static limit is `max`:
    /// `min = max(1, floor(0.4 × max))`, `init = min`.
    pub fn for_max(max: f64) -> Self {
        Self::with(max, &Coefficients::default())
    }

    /// The parameters for a pool whose static limit is `max` under the
    /// coefficients `c`: `min = max(1, floor(min_frac × max))`, `init = min`.
    pub fn with(max: f64, c: &Coefficients) -> Self {
        let min = (c.min_frac * max).floor().max(1.0);
        AimdParams {
            max,
            min,
            init: min,
            inc: c.inc,
            dec: c.dec,
            pressure_frac: c.pressure_frac,
            slack_frac: c.slack_frac,
            abs: c.abs,
            hold_when_idle: true,
            use_ttft: true,
        }
    }
}

/// What one tick saw of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TickInput {
    /// The limit in force, `None` when fresh or expired.
    pub current: Option<f64>,
    /// Requests in flight now.
    pub in_flight: f64,
    /// Concurrency refusals since the last tick.
    pub rejected: u64,
    /// Decode-rate EWMA and its floor (tok/s); `None` without samples.
    pub tps: Option<f64>,
    pub tps_floor: Option<f64>,
    /// TTFT EWMA and its limit (ms).
    pub ttft: Option<f64>,
    pub ttft_limit: Option<f64>,
}

/// Why the limit moved (or did not), for `/_tps_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    NoSignal,
    Overload,
    Rejected,
    Pressure,
    Slack,
    ClimbToInit,
    Steady,
}

/// The limit after one tick, and why. `None` when the tick has nothing to
/// judge by (the limit is left as it is).
pub fn step(p: &AimdParams, t: &TickInput) -> (Option<f64>, Step) {
    let Some(tps) = t.tps else {
        return (t.current, Step::NoSignal);
    };
    let cur = t.current.unwrap_or(p.init);
    let conc = t.in_flight;
    let mid = (p.pressure_frac + p.slack_frac) / 2.0;
    let desired = (conc / mid).max(conc + p.abs);
    let slow = t.tps_floor.is_some_and(|floor| tps < floor);
    let late = p.use_ttft && matches!((t.ttft, t.ttft_limit), (Some(v), Some(limit)) if v > limit);
    let (next, why) = if slow || late {
        (cur * p.dec, Step::Overload)
    } else if t.rejected > 0 {
        (cur * p.inc, Step::Rejected)
    } else if conc >= p.pressure_frac * cur || cur - conc < p.abs {
        ((cur * p.inc).min(desired), Step::Pressure)
    } else if !p.hold_when_idle
        && conc > 0.0
        && conc < p.slack_frac * cur
        && cur - conc > p.abs
        && cur > p.init
    {
        ((cur * p.dec).max(desired).max(p.init), Step::Slack)
    } else if cur < p.init {
        (cur * p.inc, Step::ClimbToInit)
    } else {
        (cur, Step::Steady)
    };
    (Some(next.clamp(p.min, p.max)), why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &AimdParams, mut t: TickInput, ticks: usize) -> f64 {
        for _ in 0..ticks {
            t.current = step(p, &t).0;
        }
        t.current.expect("a limit")
    }

    fn healthy(in_flight: f64) -> TickInput {
        TickInput {
            in_flight,
            tps: Some(40.0),
            tps_floor: Some(20.0),
            ttft: Some(500.0),
            ttft_limit: Some(30_000.0),
            ..TickInput::default()
        }
    }

    #[test]
    fn defaults_follow_the_seed() {
        let p = AimdParams::for_max(64.0);
        assert_eq!((p.min, p.init), (25.0, 25.0));
        assert_eq!(AimdParams::for_max(2.0).min, 1.0);
        assert_eq!(
            (p.inc, p.dec, p.pressure_frac, p.slack_frac, p.abs),
            (1.02, 0.97, 0.9, 0.7, 5.0)
        );
    }

    #[test]
    fn the_coefficients_a_route_sets_replace_the_seeds() {
        let c = Coefficients {
            inc: 1.5,
            dec: 0.5,
            pressure_frac: 0.5,
            slack_frac: 0.25,
            abs: 0.0,
            min_frac: 0.25,
        };
        let p = AimdParams::with(64.0, &c);
        assert_eq!((p.min, p.init), (16.0, 16.0));
        let slow = TickInput {
            current: Some(40.0),
            tps: Some(5.0),
            ..healthy(10.0)
        };
        assert_eq!(step(&p, &slow), (Some(20.0), Step::Overload));
        // In flight at half the limit is pressure now (not at 0.9), and the
        // load needs 20 / 0.375 slots with no absolute headroom.
        let pressed = TickInput {
            current: Some(40.0),
            ..healthy(20.0)
        };
        assert_eq!(step(&p, &pressed), (Some(20.0 / 0.375), Step::Pressure));
        // Control: the seed's coefficients see no pressure in the same tick.
        assert_eq!(
            step(&AimdParams::for_max(64.0), &pressed),
            (Some(40.0), Step::Steady)
        );
    }

    #[test]
    fn no_decode_rate_no_step() {
        let p = AimdParams::for_max(64.0);
        let t = TickInput {
            current: Some(30.0),
            tps: None,
            ..healthy(30.0)
        };
        assert_eq!(step(&p, &t), (Some(30.0), Step::NoSignal));
        let fresh = TickInput {
            tps: None,
            ..healthy(3.0)
        };
        assert_eq!(step(&p, &fresh), (None, Step::NoSignal));
    }

    #[test]
    fn slow_decode_shrinks_to_min() {
        let p = AimdParams::for_max(64.0);
        let slow = TickInput {
            current: Some(64.0),
            tps: Some(5.0),
            ..healthy(60.0)
        };
        assert_eq!(run(&p, slow, 200), p.min);
        // Control: TTFT over its limit shrinks too, unless TTFT is not used.
        let late = TickInput {
            current: Some(64.0),
            ttft: Some(40_000.0),
            ..healthy(60.0)
        };
        assert_eq!(step(&p, &late).1, Step::Overload);
        let p_no_ttft = AimdParams {
            use_ttft: false,
            ..p
        };
        assert_ne!(step(&p_no_ttft, &late).1, Step::Overload);
    }

    #[test]
    fn a_fast_pool_under_pressure_grows_to_max() {
        let p = AimdParams::for_max(64.0);
        let mut t = healthy(0.0);
        t.current = Some(p.init);
        for _ in 0..400 {
            // The pool keeps every slot busy.
            t.in_flight = t.current.unwrap_or(p.init).floor();
            t.current = step(&p, &t).0;
        }
        assert_eq!(t.current, Some(64.0));
    }

    #[test]
    fn refusals_grow_the_limit() {
        let p = AimdParams::for_max(64.0);
        let t = TickInput {
            current: Some(30.0),
            rejected: 3,
            ..healthy(10.0)
        };
        assert_eq!(step(&p, &t), (Some(30.0 * 1.02), Step::Rejected));
    }

    #[test]
    fn low_concurrency_does_not_grow() {
        let p = AimdParams::for_max(64.0);
        let t = TickInput {
            current: Some(30.0),
            ..healthy(4.0)
        };
        assert_eq!(run(&p, t, 100), 30.0, "holds by default");
    }

    #[test]
    fn a_trickle_shrinks_with_hold_off_and_holds_with_hold_on() {
        let hold = AimdParams {
            init: 30.0,
            ..AimdParams::for_max(64.0)
        };
        let t = TickInput {
            current: Some(50.0),
            ..healthy(3.0)
        };
        assert_eq!(run(&hold, t, 300), 50.0);
        let shrink = AimdParams {
            hold_when_idle: false,
            ..hold
        };
        // Toward what the load needs, never below init.
        assert_eq!(run(&shrink, t, 300), 30.0);
    }

    #[test]
    fn overload_pushes_below_init_and_a_healthy_trickle_climbs_back() {
        let p = AimdParams {
            init: 40.0,
            ..AimdParams::for_max(64.0)
        };
        let slow = TickInput {
            current: Some(40.0),
            tps: Some(5.0),
            ..healthy(20.0)
        };
        let low = run(&p, slow, 30);
        assert!(low < 40.0 && low >= p.min, "{low}");
        let trickle = TickInput {
            current: Some(low),
            ..healthy(2.0)
        };
        assert_eq!(step(&p, &trickle).1, Step::ClimbToInit);
        let back = run(&p, trickle, 100);
        assert!((40.0..40.0 * 1.02).contains(&back), "{back}");
    }

    #[test]
    fn a_fresh_or_expired_limit_starts_at_init() {
        let p = AimdParams {
            init: 33.0,
            ..AimdParams::for_max(64.0)
        };
        let fresh = healthy(3.0);
        assert_eq!(step(&p, &fresh), (Some(33.0), Step::Steady));
    }
}
