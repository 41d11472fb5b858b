//! Samples of the Prometheus text exposition format, read where they lie.
//!
//! One reader for the gateway's engine scrapes (`src/health/prom.rs`, every
//! second per engine), the bench's counters and the tests' asserts. A crate
//! of its own because the gateway library may not use the simulator or the
//! bench crates, and the bench cannot use the gateway's (the gateway
//! carries the bench). Hand-written rather than a crates.io parser: those
//! build an owned map of every sample with its labels (and pull in regex or
//! a parser combinator), while an engine scrape wants three or four
//! series out of a few hundred lines; here a line costs a scan for the end
//! of its name, and labels and value are read only for the series asked for.

use std::borrow::Cow;

/// One sample line: its name, and its labels and value read on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRef<'a> {
    pub name: &'a str,
    /// The rest of the line: `{labels} value [timestamp]` or ` value [timestamp]`.
    rest: &'a str,
}

/// The sample lines of `text`: blank lines and comments (`# HELP`,
/// `# TYPE`, others) left out.
pub fn samples(text: &str) -> impl Iterator<Item = SampleRef<'_>> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let end = line
            .find(|c: char| c == '{' || c.is_ascii_whitespace())
            .unwrap_or(line.len());
        Some(SampleRef {
            name: &line[..end],
            rest: &line[end..],
        })
    })
}

impl<'a> SampleRef<'a> {
    /// The text between the braces (empty without labels) and what follows
    /// them; None when the braces do not close. A `}` inside a quoted value
    /// does not close them.
    fn split(&self) -> Option<(&'a str, &'a str)> {
        let Some(inner) = self.rest.strip_prefix('{') else {
            return Some(("", self.rest));
        };
        let bytes = inner.as_bytes();
        let mut quoted = false;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b'}' if !quoted => return Some((&inner[..i], &inner[i + 1..])),
                _ => {}
            }
            i += 1;
        }
        None
    }

    /// The sample's value (`NaN` and `±Inf` included); None for a line that
    /// does not parse. A timestamp after it is ignored.
    pub fn value(&self) -> Option<f64> {
        let (_, after) = self.split()?;
        after.split_whitespace().next()?.parse().ok()
    }

    /// Every label with its value unescaped (`\"`, `\\`, `\n`); None when
    /// the label text does not parse.
    pub fn labels(&self) -> Option<Vec<(&'a str, Cow<'a, str>)>> {
        let (mut inner, _) = self.split()?;
        let mut out = Vec::new();
        while let Some(next) = next_label(&mut inner) {
            let (name, raw) = next?;
            out.push((name, unescape(raw)));
        }
        Some(out)
    }

    /// The value of label `name`, unescaped; None if absent or the label
    /// text does not parse up to it.
    pub fn label(&self, name: &str) -> Option<Cow<'a, str>> {
        let (mut inner, _) = self.split()?;
        while let Some(next) = next_label(&mut inner) {
            let (n, raw) = next?;
            if n == name {
                return Some(unescape(raw));
            }
        }
        None
    }
}

/// The next `name="raw value"` of `s`, advancing past it: None at the end,
/// Some(None) for text that is not a label.
fn next_label<'a>(s: &mut &'a str) -> Option<Option<(&'a str, &'a str)>> {
    let rest = s.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
    if rest.is_empty() {
        *s = rest;
        return None;
    }
    let Some((name, after)) = rest.split_once('=') else {
        *s = "";
        return Some(None);
    };
    let Some(value) = after.strip_prefix('"') else {
        *s = "";
        return Some(None);
    };
    let bytes = value.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => {
                *s = &value[i + 1..];
                return Some(Some((name.trim(), &value[..i])));
            }
            _ => i += 1,
        }
    }
    *s = "";
    Some(None)
}

fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    Cow::Owned(out)
}

/// One sample, owned: for a reader that keeps samples from two scrapes to
/// subtract them, or adds labels of its own.
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

/// Every sample of `text`, owned; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    samples(text)
        .filter_map(|s| {
            let labels = s.labels()?;
            Some(Sample {
                name: s.name.to_string(),
                labels: labels
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.into_owned()))
                    .collect(),
                value: s.value()?,
            })
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_samples_with_and_without_labels() {
        let text = "# HELP x y\n# TYPE x counter\n\
            llm_gateway_placements_total{kind=\"spill\",peer=\"e0\",reason=\"waiting\",route=\"bench\"} 3\n\
            llm_gateway_placements_total{kind=\"new\",peer=\"e1\",reason=\"none\",route=\"bench\"} 12\n\
            vllm:num_requests_waiting{model_name=\"a \\\"q\\\" b\"} 2.5\n\
            plain_metric 4e3\n\
            garbage{ 1\n";
        let s = parse(text);
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
    fn lines_are_read_lazily_and_a_bad_one_is_told() {
        let text = "plain_metric 4e3\ngarbage{ 1\nm{a=x} 1\n";
        let s: Vec<SampleRef> = samples(text).collect();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].labels(), Some(Vec::new()));
        assert_eq!(
            (s[1].name, s[1].value(), s[1].labels()),
            ("garbage", None, None)
        );
        assert_eq!(
            (s[2].value(), s[2].labels(), s[2].label("a")),
            (Some(1.0), None, None)
        );
    }

    #[test]
    fn braces_in_values_timestamps_and_special_values() {
        let text = "sglang:num_queue_reqs{a=\"b,c}\"} 2\n\
                    sglang:num_running_reqs 4 1700000000\n\
                    \tindented_metric{x=\"1\"}\t7\n\
                    nan_metric NaN\ninf_metric +Inf\n";
        let s: Vec<SampleRef> = samples(text).collect();
        assert_eq!(s[0].label("a").as_deref(), Some("b,c}"));
        assert_eq!(s[0].value(), Some(2.0));
        assert_eq!(s[1].value(), Some(4.0));
        assert_eq!((s[2].name, s[2].value()), ("indented_metric", Some(7.0)));
        assert!(s[3].value().unwrap().is_nan());
        assert_eq!(s[4].value(), Some(f64::INFINITY));
    }

    #[test]
    fn escapes_in_label_values() {
        let s = samples("m{a=\"x\\\\y\\nz\",b=\"\"} 1\n").next().unwrap();
        assert_eq!(s.label("a").as_deref(), Some("x\\y\nz"));
        assert_eq!(s.label("b").as_deref(), Some(""));
        assert_eq!(s.label("c"), None);
    }
}
