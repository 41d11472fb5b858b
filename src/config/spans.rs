//! Where each key of a YAML file is written, from the YAML parser's own
//! positions. serde_yaml gives a line only for errors found while it
//! deserializes; the checks that run after it (ranges, cross-field rules,
//! unknown peers) need the line of a key by its place in the document, and
//! searching the text for `key:` finds the wrong one as soon as two sections
//! share a field name (`health.interval`, `engine_metrics.interval`).
//! saphyr-parser is a maintained YAML 1.2 parser whose events carry spans;
//! it reads the file a second time only to learn these positions, so the
//! values keep coming from serde_yaml, as they always did.

use saphyr_parser::{Event, Parser};
use std::collections::HashMap;

/// The line of every key and every sequence item, by its path: mapping keys
/// joined with `.`, items as `[i]` (`peers[1]`, `peers[1].port`,
/// `protection.ttft.limit_ms`). A key written twice keeps its first line.
#[derive(Debug, Default)]
pub(crate) struct KeyLines {
    lines: HashMap<String, usize>,
}

/// The path of what has none: a complex key, an alias used as a key, and
/// their values. No lookup ever names it.
const NO_PATH: &str = "\u{0}";

enum Frame {
    Map {
        path: String,
        /// The key whose value comes next; `None` while a key is awaited.
        key: Option<String>,
        /// This mapping is itself a (complex) key: its content has no path.
        is_key: bool,
    },
    Seq {
        path: String,
        next: usize,
        is_key: bool,
    },
}

impl KeyLines {
    /// The positions in `text`; empty where the parser gives up (the file's
    /// own error then comes from serde_yaml, with its line).
    pub(crate) fn of(text: &str) -> KeyLines {
        let mut out = KeyLines::default();
        let mut stack: Vec<Frame> = Vec::new();
        for event in Parser::new_from_str(text) {
            let Ok((event, span)) = event else {
                break;
            };
            let line = span.start.line();
            match event {
                Event::Scalar(value, ..) => {
                    out.node(&mut stack, line, Some(&value), false);
                }
                Event::Alias(_) => {
                    out.node(&mut stack, line, None, false);
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let (path, is_key) = out.node(&mut stack, line, None, true);
                    stack.push(if matches!(event, Event::MappingStart(..)) {
                        Frame::Map {
                            path,
                            key: None,
                            is_key,
                        }
                    } else {
                        Frame::Seq {
                            path,
                            next: 0,
                            is_key,
                        }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    let was_key = match stack.pop() {
                        Some(Frame::Map { is_key, .. } | Frame::Seq { is_key, .. }) => is_key,
                        None => false,
                    };
                    // A complex key leaves its mapping awaiting the value,
                    // which has no path of its own.
                    if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                        *key = was_key.then(|| NO_PATH.to_string());
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// Records a node that starts at `line` in the frame on top of `stack`
    /// and returns its path and whether it stands as a mapping's key.
    /// `scalar` is the text of a scalar node, which may name a key; `opens`
    /// says the node is a mapping or a sequence, whose end comes later.
    fn node(
        &mut self,
        stack: &mut [Frame],
        line: usize,
        scalar: Option<&str>,
        opens: bool,
    ) -> (String, bool) {
        match stack.last_mut() {
            None => (String::new(), false),
            Some(Frame::Seq { path, next, .. }) => {
                let item = format!("{path}[{next}]");
                *next += 1;
                self.lines.entry(item.clone()).or_insert(line);
                (item, false)
            }
            Some(Frame::Map { path, key, .. }) => match key.take() {
                None => {
                    let Some(name) = scalar else {
                        // A complex key or an alias as a key: neither it
                        // nor its value has a path. A complex key's value
                        // is awaited once the key ends.
                        if !opens {
                            *key = Some(NO_PATH.to_string());
                        }
                        return (NO_PATH.to_string(), true);
                    };
                    let full = if path.is_empty() {
                        name.to_string()
                    } else {
                        format!("{path}.{name}")
                    };
                    self.lines.entry(full.clone()).or_insert(line);
                    *key = Some(full);
                    (String::new(), true)
                }
                // The value of the key just read; the mapping then awaits
                // its next key.
                Some(full) => (full, false),
            },
        }
    }

    /// The line `path` is written on, if the file writes it.
    pub(crate) fn line(&self, path: &str) -> Option<usize> {
        self.lines.get(path).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::KeyLines;

    #[test]
    fn keys_are_found_by_their_place_not_by_their_name() {
        let text = "\
peers:
  - {name: a, host: h, port: 1}
  - name: b
    host: h
    port: 2
health:
  interval: 5s
engine_metrics:
  interval: 1s
protection:
  ttft:
    limit_ms: 100
  tps: {window: 5s}
";
        let at = KeyLines::of(text);
        assert_eq!(at.line("peers"), Some(1));
        assert_eq!(at.line("peers[0]"), Some(2));
        assert_eq!(at.line("peers[1]"), Some(3));
        assert_eq!(at.line("peers[1].port"), Some(5));
        assert_eq!(at.line("health.interval"), Some(7));
        assert_eq!(at.line("engine_metrics.interval"), Some(9));
        assert_eq!(at.line("protection.ttft.limit_ms"), Some(12));
        assert_eq!(at.line("protection.tps.window"), Some(13));
        assert_eq!(at.line("interval"), None);
    }

    #[test]
    fn a_complex_key_or_a_broken_file_gives_no_lines_rather_than_wrong_ones() {
        let at = KeyLines::of("? [a, b]\n: {x: 1}\nc: 2\n");
        assert_eq!(at.line("c"), Some(3));
        assert_eq!((at.line("a"), at.line("x")), (None, None));
        let at = KeyLines::of("k: &k key\n*k : {x: 1}\nc: 2\n");
        assert_eq!(
            (at.line("c"), at.line("x"), at.line("1")),
            (Some(3), None, None)
        );
        let at = KeyLines::of("a: [1, 2\nb: 3\n");
        assert_eq!(at.line("b"), None);
    }
}
