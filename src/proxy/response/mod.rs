//! The response side: headers and the stream pipeline for proxied responses
//! (`headers`), the answers the gateway writes itself (`local`), and the
//! metrics of a finished request (`record`).
//!
//! Where new response work goes: body logging tees the raw upstream bytes
//! here, before the pipeline rewrites them; per-frame measurements go into
//! `crate::stream`.

pub mod headers;
pub mod local;
pub mod record;
