//! Pure helpers: percentiles, Prometheus text, `/proc/<pid>/stat`.

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

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the samples of a Prometheus text exposition; comments and lines
/// that do not parse are skipped.
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_sample).collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].find('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, Vec::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample {
        name: name.trim().to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"` with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let mut name = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            name.push(c);
        }
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                c => value.push(c),
            }
        }
        out.push((name.trim().to_string(), value));
    }
}

/// Sum of the samples named `name` whose labels include every `(k, v)` of
/// `filter`.
pub fn sum(samples: &[Sample], name: &str, filter: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| filter.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

/// User + system CPU time in clock ticks from the text of `/proc/<pid>/stat`.
pub fn parse_proc_stat(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces
    // or parentheses, so fields are counted after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': field 3 (state) is index 0, so utime (14) and stime (15)
    // are indices 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second for `/proc` times. Linux fixes USER_HZ at 100 on
/// every architecture the gateway runs on; there is no libc here to ask.
pub const CLOCK_TICKS_PER_SEC: f64 = 100.0;

/// CPU seconds used so far by process `pid`, if readable.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&stat).map(|ticks| ticks as f64 / CLOCK_TICKS_PER_SEC)
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
    fn prometheus_samples_with_and_without_labels() {
        let text = "# HELP x y\n# TYPE x counter\n\
            llm_gateway_placements_total{kind=\"spill\",peer=\"e0\",reason=\"waiting\",route=\"bench\"} 3\n\
            llm_gateway_placements_total{kind=\"new\",peer=\"e1\",reason=\"none\",route=\"bench\"} 12\n\
            vllm:num_requests_waiting{model_name=\"a \\\"q\\\" b\"} 2.5\n\
            plain_metric 4e3\n\
            garbage{ 1\n";
        let s = parse_prometheus(text);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].label("reason"), Some("waiting"));
        assert_eq!(s[2].label("model_name"), Some("a \"q\" b"));
        assert_eq!(s[2].value, 2.5);
        assert_eq!(s[3].value, 4000.0);
        assert_eq!(
            sum(&s, "llm_gateway_placements_total", &[("route", "bench")]),
            15.0
        );
        assert_eq!(
            sum(&s, "llm_gateway_placements_total", &[("kind", "spill")]),
            3.0
        );
    }

    #[test]
    fn proc_stat_cpu_ticks_survive_odd_command_names() {
        let stat = "1234 (llm (gw) x) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 9 0 100 1000 200";
        assert_eq!(parse_proc_stat(stat), Some(325));
        assert_eq!(parse_proc_stat("garbage"), None);
        // Our own process is always readable.
        assert!(cpu_seconds(std::process::id()).is_some());
    }
}
