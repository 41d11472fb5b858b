//! Pure helpers: percentiles, `/proc/<pid>/stat`.

/// The `p`-th percentile (0..=100) of `values` by linear interpolation
/// between closest ranks (numpy's default). None for no values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// What the bench reads of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// The process group.
    pub pgrp: u32,
    /// User + system CPU time in clock ticks.
    pub ticks: u64,
}

/// The fields of `/proc/<pid>/stat` the bench reads, from its text.
pub fn parse_stat(stat: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may contain spaces
    // or parentheses, so fields are counted after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': field 3 (state) is index 0, so the group (5) is index 2,
    // utime (14) and stime (15) are indices 11 and 12.
    let state = fields.first()?.chars().next()?;
    let pgrp: u32 = fields.get(2)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(ProcStat {
        state,
        pgrp,
        ticks: utime + stime,
    })
}

/// User + system CPU time in clock ticks from the text of `/proc/<pid>/stat`.
pub fn parse_proc_stat(stat: &str) -> Option<u64> {
    parse_stat(stat).map(|s| s.ticks)
}

/// Clock ticks per second for `/proc` times. Linux fixes USER_HZ at 100 on
/// every architecture the gateway runs on; there is no libc here to ask.
pub const CLOCK_TICKS_PER_SEC: f64 = 100.0;

/// CPU seconds used so far by process `pid`, if readable.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&stat).map(|ticks| ticks as f64 / CLOCK_TICKS_PER_SEC)
}

/// The live (not zombie) processes of process group `pgrp` and their
/// `/proc` stats: an external router started in a group of its own, with
/// whatever it started.
pub fn group_members(pgrp: u32) -> Vec<(u32, ProcStat)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let s = parse_stat(&stat)?;
            (s.pgrp == pgrp && s.state != 'Z').then_some((pid, s))
        })
        .collect()
}

/// CPU seconds used so far by the live processes of group `pgrp`, if any.
pub fn group_cpu_seconds(pgrp: u32) -> Option<f64> {
    let members = group_members(pgrp);
    (!members.is_empty())
        .then(|| members.iter().map(|(_, s)| s.ticks).sum::<u64>() as f64 / CLOCK_TICKS_PER_SEC)
}

/// Whose CPU a cell's window measures: the gateway replica's process, or
/// an external router's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuOf {
    Process(u32),
    Group(u32),
}

impl CpuOf {
    pub fn seconds(self) -> Option<f64> {
        match self {
            CpuOf::Process(pid) => cpu_seconds(pid),
            CpuOf::Group(pgrp) => group_cpu_seconds(pgrp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert!((percentile(&v, 50.0).unwrap() - 50.5).abs() < 1e-9);
        assert!((percentile(&v, 95.0).unwrap() - 95.05).abs() < 1e-9);
        assert!((percentile(&v, 5.0).unwrap() - 5.95).abs() < 1e-9);
        // Order of input does not matter; NaN is ignored.
        let shuffled = [3.0, f64::NAN, 1.0, 2.0];
        assert_eq!(percentile(&shuffled, 50.0), Some(2.0));
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[f64::NAN], 50.0), None);
    }

    #[test]
    fn proc_stat_cpu_ticks_survive_odd_command_names() {
        let stat = "1234 (llm (gw) x) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 9 0 100 1000 200";
        assert_eq!(parse_proc_stat(stat), Some(325));
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                state: 'S',
                pgrp: 1234,
                ticks: 325
            })
        );
        assert_eq!(parse_proc_stat("garbage"), None);
        // Our own process is always readable, and in its own group.
        assert!(cpu_seconds(std::process::id()).is_some());
        let own = std::fs::read_to_string(format!("/proc/{}/stat", std::process::id())).unwrap();
        let pgrp = parse_stat(&own).unwrap().pgrp;
        assert!(group_members(pgrp)
            .iter()
            .any(|(pid, _)| *pid == std::process::id()));
        assert!(CpuOf::Group(pgrp).seconds().is_some());
    }
}
