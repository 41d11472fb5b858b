//! The results printed: a markdown table per scenario (`markdown.rs`) or
//! JSON (`json.rs`).

pub mod family;
mod json;
mod markdown;

pub use json::json;
pub use markdown::{markdown, progress_line};

#[cfg(test)]
mod tests;
