//! The `reference` cell's router, inside the bench client: no proxy, and
//! what an ideal sticky router would do with what a client can know. A
//! session's first turn goes to the engine with the fewest of this client's
//! requests in flight (ties: the fewest sessions bound there, then the lowest
//! index), and every later turn to the same engine; a sub-agent (`forks`)
//! starts on its parent's engine, which holds their shared history; a
//! tenant's conversation (`shared-prefix`) on its tenant's engine, one per
//! tenant, where the tenant's prefix is cached. An engine that refuses a connection is avoided for [`DOWN_FOR`] (about what
//! a health check takes to notice), and the session that met the refusal is
//! placed again.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long an engine that refused a connection gets no new sessions.
pub const DOWN_FOR: Duration = Duration::from_secs(1);

/// The engine to place a session on: the least loaded among `usable`, or
/// among all of them when none is usable (the attempt will fail and say so).
/// None only without engines.
pub fn choose(in_flight: &[u32], sessions: &[u32], usable: &[bool]) -> Option<usize> {
    let any_usable = usable.iter().any(|u| *u);
    (0..in_flight.len())
        .filter(|&i| !any_usable || usable.get(i).copied().unwrap_or(false))
        .min_by_key(|&i| (in_flight[i], sessions.get(i).copied().unwrap_or(0), i))
}

#[derive(Debug)]
struct State {
    in_flight: Vec<u32>,
    sessions: Vec<u32>,
    down_until: Vec<Option<Instant>>,
}

/// Shared by every session task of the cell.
#[derive(Debug)]
pub struct Placer {
    state: Mutex<State>,
}

impl Placer {
    pub fn new(engines: usize) -> Placer {
        Placer {
            state: Mutex::new(State {
                in_flight: vec![0; engines],
                sessions: vec![0; engines],
                down_until: vec![None; engines],
            }),
        }
    }

    /// Places a session and binds it there: on engine `affinity` modulo
    /// the engines when given and usable (a tenant's conversations share
    /// its prefix there), else the least loaded. None only without engines.
    pub fn place(&self, now: Instant, affinity: Option<usize>) -> Option<usize> {
        let mut s = self.state.lock();
        let usable: Vec<bool> = s
            .down_until
            .iter()
            .map(|d| d.is_none_or(|until| until <= now))
            .collect();
        let preferred = affinity
            .map(|k| k % usable.len().max(1))
            .filter(|&e| usable.get(e).copied().unwrap_or(false));
        let e = match preferred {
            Some(e) => e,
            None => choose(&s.in_flight, &s.sessions, &usable)?,
        };
        s.sessions[e] += 1;
        Some(e)
    }

    /// Binds a session to `engine` without placing it (a sub-agent starts
    /// where its parent is, which holds their shared history).
    pub fn bind(&self, engine: usize) {
        if let Some(n) = self.state.lock().sessions.get_mut(engine) {
            *n += 1;
        }
    }

    /// The session bound to `engine` ended or moves.
    pub fn unbind(&self, engine: usize) {
        if let Some(n) = self.state.lock().sessions.get_mut(engine) {
            *n = n.saturating_sub(1);
        }
    }

    /// `engine` refused a connection at `now`.
    pub fn refused(&self, engine: usize, now: Instant) {
        if let Some(d) = self.state.lock().down_until.get_mut(engine) {
            *d = Some(now + DOWN_FOR);
        }
    }

    /// Counts a request to `engine` as in flight until the guard drops
    /// (also when the request is cancelled by its timeout).
    pub fn start(&self, engine: usize) -> InFlight<'_> {
        if let Some(n) = self.state.lock().in_flight.get_mut(engine) {
            *n += 1;
        }
        InFlight {
            placer: self,
            engine,
        }
    }

    #[cfg(test)]
    fn counts(&self) -> (Vec<u32>, Vec<u32>) {
        let s = self.state.lock();
        (s.in_flight.clone(), s.sessions.clone())
    }
}

pub struct InFlight<'a> {
    placer: &'a Placer,
    engine: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.placer.state.lock().in_flight.get_mut(self.engine) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewest_in_flight_then_fewest_sessions_then_lowest_index() {
        let all = [true; 3];
        assert_eq!(choose(&[2, 1, 1], &[0, 5, 4], &all), Some(2));
        assert_eq!(choose(&[0, 0, 0], &[1, 1, 1], &all), Some(0));
        assert_eq!(choose(&[3, 0, 0], &[0, 2, 1], &all), Some(2));
        // Unusable engines are skipped, unless nothing is usable.
        assert_eq!(
            choose(&[0, 5, 5], &[0, 0, 0], &[false, true, true]),
            Some(1)
        );
        assert_eq!(choose(&[4, 1], &[0, 0], &[false, false]), Some(1));
        assert_eq!(choose(&[], &[], &[]), None);
    }

    #[tokio::test]
    async fn placement_binds_and_a_refusing_engine_is_avoided_for_a_while() {
        let p = Placer::new(2);
        let now = Instant::now();
        assert_eq!(p.place(now, None), Some(0));
        // Equal in flight: e1 has fewer sessions.
        assert_eq!(p.place(now, None), Some(1));
        {
            let _busy = p.start(0);
            assert_eq!(p.counts(), (vec![1, 0], vec![1, 1]));
            assert_eq!(p.place(now, None), Some(1));
        }
        assert_eq!(p.counts(), (vec![0, 0], vec![1, 2]));
        p.refused(0, now);
        p.unbind(1);
        // e0 is emptier but down.
        assert_eq!(p.place(now, None), Some(1));
        assert_eq!(p.place(now + DOWN_FOR, None), Some(0));
        assert_eq!(p.counts(), (vec![0, 0], vec![2, 2]));
        p.unbind(7);
        p.bind(1);
        assert_eq!(p.counts(), (vec![0, 0], vec![2, 3]));
        p.bind(7);
        assert_eq!(Placer::new(0).place(now, None), None);
    }

    #[tokio::test]
    async fn a_tenant_goes_to_its_engine_while_that_is_usable() {
        let p = Placer::new(4);
        let now = Instant::now();
        assert_eq!(p.place(now, Some(6)), Some(2));
        assert_eq!(p.place(now, Some(6)), Some(2), "however loaded");
        p.refused(2, now);
        // Control: down, it is the least loaded instead.
        assert_eq!(p.place(now, Some(6)), Some(0));
    }
}
