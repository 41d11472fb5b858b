//! A config error: the file and, where it can be told, the line.

use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub(crate) fn new(file: &Path, line: Option<usize>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    /// serde_yaml reports "... at line L column C"; keep its line, drop the
    /// duplicate location from the message.
    pub(crate) fn from_yaml(file: &Path, err: serde_yaml::Error) -> Self {
        let line = err.location().map(|l| l.line());
        let mut message = err.to_string();
        if let Some(idx) = message.find(" at line ") {
            message.truncate(idx);
        }
        ConfigError::new(file, line, message)
    }
}
