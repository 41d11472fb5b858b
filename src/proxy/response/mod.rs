//! The response side: headers and the stream pipeline for proxied responses
//! (`headers`), the answers the gateway writes itself (`local`), the
//! metrics of a finished request (`record`), its access-log line
//! (`access`), and the body log's capture
//! (`bodylog`: raw upstream bytes, teed before the pipeline rewrites them).
//!
//! Where new response work goes: per-frame measurements go into
//! `crate::stream`.

pub mod access;
pub mod bodylog;
pub mod headers;
pub mod local;
pub mod record;
