//! Where in a route file a value is, so that an error found after the YAML
//! layer names the key as the file wrote it and points at its line.

use crate::config::spans::KeyLines;
use crate::config::ConfigError;
use std::path::Path;

/// Errors found after the YAML layer point at the line of the key they are
/// about (from the parser's positions, `spans.rs`) and name it as the file
/// wrote it: a key written by its former name keeps that name and line.
pub(super) struct Locator<'a> {
    path: &'a Path,
    lines: KeyLines,
    /// The (old, new) keys this file wrote by their former names.
    pub(super) adopted: Vec<(&'static str, &'static str)>,
}

impl<'a> Locator<'a> {
    pub(super) fn new(path: &'a Path, lines: KeyLines) -> Self {
        Locator {
            path,
            lines,
            adopted: Vec::new(),
        }
    }

    pub(super) fn error(&self, line: Option<usize>, message: String) -> ConfigError {
        ConfigError::new(self.path, line, message)
    }

    /// `path` (dotted, as `protection.ttft.limit_ms`) as the file wrote it.
    pub(super) fn written(&self, path: &str) -> String {
        self.adopted
            .iter()
            .find(|(_, nested)| *nested == path)
            .map_or(path, |(flat, _)| flat)
            .to_string()
    }

    pub(super) fn line(&self, path: &str) -> Option<usize> {
        self.lines.line(&self.written(path))
    }

    pub(super) fn at_key(&self, path: &str, message: String) -> ConfigError {
        self.error(self.line(path), message)
    }
}
