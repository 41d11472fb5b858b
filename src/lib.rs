//! llm-gateway: a session-affine, load-aware gateway for OpenAI-compatible
//! inference engines, built on Pingora.
//!
//! Where things live (ARCHITECTURE.md is the map; README.md "Code map" the
//! table):
//! - `config`     gateway.yaml and route files → validated values
//! - `registry`   the live route table, reload, runtime state kept across reloads
//! - `proxy`      the Pingora `ProxyHttp` implementation, one file per phase group
//! - `balance`    peer choice on live state: pools, tiers, the queue, Redis agreement
//! - `placement`  the pure rules of peer choice and the session table
//! - `session`    session id extraction; `hash` the hashes of ids and keys
//! - `request_view` what a request body says (model, stream, session), skimmed
//! - `json_bytes` byte-level JSON primitives the hand-written walkers share
//! - `protect`    the load gates: one owner per route (`RouteProtection`) and its pure cores
//! - `reject`, `rewrite`  content rules; request-body rewrites (include_usage, prefix stability)
//! - `stream`     the response pipeline: SSE, usage, first token, post-processing
//! - `auth`       API keys; `query` the `/_…` endpoints' query-string parameters
//! - `health`     active probes and engine metric scraping
//! - `admin`      /healthz, /metrics, /_routes and the dashboard (the admin listener)
//! - `route_endpoints` the per-route `/_…` endpoints of the main listener
//! - `controller`, `watch`, `lifecycle`  signals, reloads, the drain
//! - `bodylog`    body-log frames, their sender, and the `bodylog-listen` listener/exporter
//! - `store`      the shared session store (Redis)

pub mod admin;
pub mod auth;
pub mod balance;
pub mod bodylog;
pub mod clock;
pub mod config;
pub mod controller;
pub mod errors;
pub mod hash;
pub mod health;
pub(crate) mod json_bytes;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod placement;
pub mod protect;
pub mod proxy;
pub mod query;
pub mod registry;
pub mod reject;
pub mod request_view;
pub mod rewrite;
pub mod route_endpoints;
pub mod server;
pub mod session;
pub mod store;
pub mod stream;
pub mod watch;
