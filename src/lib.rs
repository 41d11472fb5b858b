//! llm-gateway: a session-affine, load-aware gateway for OpenAI-compatible
//! inference engines, built on Pingora.
//!
//! Where things live (ARCHITECTURE.md is the map; README.md "Code map" the
//! table):
//! - `config`     gateway.yaml and route files → validated values
//! - `registry`   the live route table, reload, runtime state kept across reloads
//! - `proxy`      the Pingora `ProxyHttp` implementation, one file per phase group
//! - `balance`    peer choice on live state: pools, tiers, the queue, Redis agreement
//! - `auth`       API keys; `query` the `/_…` endpoints' query-string parameters
//! - `health`     active probes and engine metric scraping
//! - `admin`      /healthz, /metrics, /_routes and the dashboard (the admin listener)
//! - `route_endpoints` the per-route `/_…` endpoints of the main listener
//! - `controller`, `watch`, `lifecycle`  signals, reloads, the drain
//! - `accesslog`  the access log: a JSON line per request, written off the request path
//! - `trace_context` request ids and W3C trace context
//! - `otlp`       OpenTelemetry spans, one per request, exported over OTLP/HTTP off the request path
//! - `bodylog`    body-log frames, their sender, and the `bodylog-listen` listener/exporter
//! - `store`      the shared session store (Redis)
//! - `tls`        the main listener's certificate: loaded, served, reloaded
//! - `engine_tls` TLS to engines: a peer's `tls:` for its requests, probes and scrapes
//! - `tenants`    who sends: the tenants file in force, budgets, in-flight caps, `/_tenants`
//! - `discovery`  engines found while running: host names looked up again, `peers_from` (DNS, Kubernetes EndpointSlices)
//!
//! The pure core (`crates/core`: `budget`, `fair`, `placement`, `protect`, `reject`, `rewrite`,
//! `stream`, `request_view`, `session`, `hash`, `json_bytes`) is re-exported
//! at the end of this file under the same names.

pub mod accesslog;
pub mod admin;
pub mod auth;
pub mod balance;
pub mod bodylog;
pub mod clock;
pub mod config;
pub mod controller;
pub mod discovery;
pub mod engine_tls;
pub mod errors;
pub mod health;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod otlp;
pub mod proxy;
pub mod query;
pub mod registry;
pub mod route_endpoints;
pub mod server;
pub mod store;
pub mod tenants;
pub mod tls;
pub mod trace_context;
pub mod watch;

// The pure core, a crate of its own so that the compiler keeps it free of
// pingora, tokio and the rest of the gateway; re-exported so that every
// `crate::placement::…` path reads as before.
pub use llm_gateway_core::{
    api, budget, fair, hash, json_bytes, placement, protect, reject, request_view, rewrite,
    session, stream,
};
