//! llm-gateway's pure core: everything the gateway decides that needs no
//! network, no runtime and no clock of its own. Time comes in as
//! milliseconds or `Instant`s the caller read; peers' loads as snapshots.
//! So every rule here is unit-tested without a gateway, and the compiler
//! keeps pingora and tokio out (they are not dependencies).
//!
//! - `api`        which LLM API a path is (chat, completions, messages, responses)
//! - `budget`     a tenant's token and request budgets: sliding windows, charge, reconcile
//! - `placement`  load_aware / hash / least_conn peer choice and the session table
//! - `protect`    the load gates: one owner per route (`RouteProtection`) and its pure cores
//! - `reject`     content reject rules, compiled and evaluated
//! - `rewrite`    request-body rewrites (include_usage, prefix stability) as `Edit`s
//! - `stream`     the response pipeline: SSE, usage, first token, post-processing
//! - `request_view` what a request body says (model, stream, session), skimmed
//! - `session`    session id extraction; `hash` the hashes of ids and keys
//! - `json_bytes` byte-level JSON primitives the hand-written walkers share

pub mod api;
pub mod budget;
pub mod hash;
pub mod json_bytes;
pub mod placement;
pub mod protect;
pub mod reject;
pub mod request_view;
pub mod rewrite;
pub mod session;
pub mod stream;
