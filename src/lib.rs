//! llm-gateway: a session-affine, load-aware gateway for OpenAI-compatible
//! inference engines, built on Pingora.
//!
//! Where things live (see README.md "Code map" for the longer version):
//! - `config`     gateway.yaml and route files → validated values
//! - `registry`   the live route table, reload, runtime state kept across reloads
//! - `proxy`      the Pingora `ProxyHttp` implementation, one file per phase group
//! - `session`    session id extraction and the per-route session table
//! - `placement`  load_aware / hash / least_conn peer choice (pure, clock-injected)
//! - `health`     active probes and engine metric scraping
//! - `admin`      /healthz, /metrics, /_routes and the per-route /_ endpoints
//! - `controller`, `watch`  signals, reload on SIGHUP or on a file change, per-route tasks
//! - `auth`, `reject`, `sse`, `postprocess`, `usage`: request guards and response rewriting
//! - `bodylog`    body-log frames, their sender, and the `bodylog-listen` listener/exporter
//! - `rewrite`    prefix-stability transforms of request bodies (cch_strip, kimi_normalize)

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
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod placement;
pub mod protect;
pub mod proxy;
pub mod registry;
pub mod reject;
pub mod request_view;
pub mod rewrite;
pub mod server;
pub mod session;
pub mod store;
pub mod stream;
pub mod watch;
