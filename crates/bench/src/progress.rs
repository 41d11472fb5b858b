//! Where a run is and how long it has left, for the lines the bench prints
//! while it runs. Cells take about `--duration` each plus start-up and
//! drain; once some have finished, their mean wall time is the estimate.

use std::time::{Duration, Instant};

/// Start-up (engines, gateway, first metrics scrape) and a short drain,
/// on top of `--duration`, before any cell has finished.
const CELL_OVERHEAD_S: f64 = 3.0;

#[derive(Debug, Clone, Copy)]
pub struct Progress {
    run_start: Instant,
    total: usize,
    done: usize,
    done_s: f64,
    planned_cell_s: f64,
}

/// A copy handed to the cell's progress printer.
pub type View = Progress;

impl Progress {
    pub fn new(total: usize, duration: Duration) -> Progress {
        Progress {
            run_start: Instant::now(),
            total,
            done: 0,
            done_s: 0.0,
            planned_cell_s: duration.as_secs_f64() + CELL_OVERHEAD_S,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn cell_done(&mut self, took: Duration) {
        self.done += 1;
        self.done_s += took.as_secs_f64();
    }

    pub fn view(&self) -> View {
        *self
    }

    /// "3/10": the cell in progress, of all.
    pub fn position(&self) -> String {
        format!("{}/{}", (self.done + 1).min(self.total), self.total)
    }

    pub fn run_elapsed(&self) -> Duration {
        self.run_start.elapsed()
    }

    fn cell_estimate_s(&self) -> f64 {
        if self.done > 0 {
            self.done_s / self.done as f64
        } else {
            self.planned_cell_s
        }
    }

    /// Seconds the run has left when the cell in progress has run
    /// `in_cell` seconds (0 before it starts).
    pub fn remaining_s(&self, in_cell: f64) -> f64 {
        if self.done >= self.total {
            return 0.0;
        }
        let cell = self.cell_estimate_s();
        let after = (self.total - self.done - 1) as f64 * cell;
        (cell - in_cell).max(0.0) + after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_time_uses_the_plan_then_what_cells_took() {
        let mut p = Progress::new(4, Duration::from_secs(10));
        assert_eq!(p.position(), "1/4");
        // 13 s per cell planned: 4 cells, nothing run yet.
        assert_eq!(p.remaining_s(0.0), 52.0);
        assert_eq!(p.remaining_s(5.0), 47.0);
        // A cell running over its estimate counts as about to finish.
        assert_eq!(p.remaining_s(20.0), 39.0);
        p.cell_done(Duration::from_secs(15));
        assert_eq!(p.position(), "2/4");
        assert_eq!(p.remaining_s(0.0), 45.0);
        for _ in 0..3 {
            p.cell_done(Duration::from_secs(15));
        }
        assert_eq!((p.position(), p.remaining_s(0.0)), ("4/4".to_string(), 0.0));
        assert_eq!(p.view().total(), 4);
    }
}
