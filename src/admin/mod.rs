//! The admin listener: `/healthz`, `/metrics`, `/_routes`, and the live
//! dashboard `/dashboard` with its `/dashboard.json` (`dashboard.rs`).
//! It serves until the process exits, through a drain (`server::UntilExit`),
//! while the main listener stops accepting at SIGTERM: `/healthz` answers
//! 503 with the requests still in flight, and `/metrics` can be scraped.
//! (Per-route `/_…` endpoints live on the main listener, see
//! `route_endpoints.rs`.)

pub mod dashboard;
pub mod history;

use crate::clock::now_ms;
use crate::lifecycle::{active_requests, is_draining};
use crate::metrics::metrics;
use crate::registry::Registry;
use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;
use std::sync::Arc;

pub struct AdminApp {
    registry: Arc<Registry>,
    dashboard: Arc<dashboard::Dashboard>,
}

impl AdminApp {
    pub fn new(registry: Arc<Registry>, dashboard: Arc<dashboard::Dashboard>) -> Self {
        AdminApp {
            registry,
            dashboard,
        }
    }
}

fn respond(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .body(body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

/// The dashboard page. Its policy lets it load nothing but its own inline
/// code and fetch nothing but this listener, so a page that grew an
/// external asset would break visibly rather than phone out.
fn dashboard_page() -> Response<Vec<u8>> {
    let body = dashboard::HTML.as_bytes().to_vec();
    Response::builder()
        .status(200)
        .header("content-type", "text/html; charset=utf-8")
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .header(
            "content-security-policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
        )
        .body(body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

pub fn json_response(status: u16, value: &serde_json::Value) -> Response<Vec<u8>> {
    let mut body = serde_json::to_vec_pretty(value).unwrap_or_default();
    body.push(b'\n');
    respond(status, "application/json", body)
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        let bearer = crate::auth::bearer(&session.req_header().headers);
        if !self.registry.gateway().admin.admits(&path, bearer) {
            return unauthorized();
        }
        if let Some(refused) = read_method(session, &path) {
            return refused;
        }
        match path.as_str() {
            "/healthz" => health(),
            "/metrics" => {
                refresh_state_gauges(&self.registry);
                respond(200, "text/plain; version=0.0.4", metrics().encode())
            }
            "/_routes" => json_response(200, &routes_json(&self.registry)),
            "/dashboard" => dashboard_page(),
            "/dashboard.json" => {
                let mut r = json_response(200, &self.dashboard.json(&self.registry));
                r.headers_mut()
                    .insert("cache-control", http::HeaderValue::from_static("no-store"));
                r
            }
            _ => json_response(
                404,
                &json!({"error": {"type": "not_found", "message": "admin endpoints: /healthz, /metrics, /_routes, /dashboard, /dashboard.json"}}),
            ),
        }
    }
}

/// A request without the admin token (`admin: {token_file}`), or with
/// another: 401, whatever the path, so that a caller without it learns
/// nothing of what is there.
fn unauthorized() -> Response<Vec<u8>> {
    let mut r = json_response(
        401,
        &json!({"error": {"type": "unauthorized",
                          "message": "the admin listener needs its token: send Authorization: Bearer <token>"}}),
    );
    r.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer realm=\"llm-gateway admin\""),
    );
    r
}

/// Every admin endpoint is read with GET (or HEAD), as the main listener's
/// status endpoints are: a 405 naming what it serves, not a read answered
/// to a DELETE. An unknown path stays a 404 whatever the method.
fn read_method(session: &ServerSession, path: &str) -> Option<Response<Vec<u8>>> {
    let method = &session.req_header().method;
    if *method == http::Method::GET
        || *method == http::Method::HEAD
        || !crate::config::ADMIN_PATHS.contains(&path)
    {
        return None;
    }
    let mut r = json_response(
        405,
        &json!({"error": {"type": "method_not_allowed",
                          "message": format!("{path} is read with GET (or HEAD), not {method}")}}),
    );
    r.headers_mut().insert(
        http::header::ALLOW,
        http::HeaderValue::from_static(crate::route_endpoints::READ_METHODS),
    );
    Some(r)
}

/// 200 while serving, 503 while draining (load balancers stop sending),
/// with the requests still in flight: during a drain, what it waits for.
/// The listener answers until the process exits (`server.rs` `UntilExit`).
fn health() -> Response<Vec<u8>> {
    let in_flight = active_requests();
    if is_draining() {
        json_response(503, &json!({"status": "draining", "in_flight": in_flight}))
    } else {
        json_response(200, &json!({"status": "ok", "in_flight": in_flight}))
    }
}

/// Mirrors runtime state into the gauges just before a scrape.
pub fn refresh_state_gauges(registry: &Registry) {
    let m = metrics();
    m.in_flight.reset();
    m.peer_ready.reset();
    m.session_bindings.reset();
    let now = now_ms();
    for (name, route) in registry.snapshot().iter() {
        let sessions = route.sessions_per_peer();
        for (p, bound) in route.peers.iter().zip(sessions) {
            let labels = [name.as_str(), p.config.name.as_str()];
            m.in_flight
                .with_label_values(&labels)
                .set(p.state.in_flight() as i64);
            m.peer_ready
                .with_label_values(&labels)
                .set(p.is_usable(now) as i64);
            m.session_bindings
                .with_label_values(&labels)
                .set(bound as i64);
        }
    }
}

pub fn routes_json(registry: &Registry) -> serde_json::Value {
    let now = now_ms();
    let snapshot = registry.snapshot();
    let mut names: Vec<&String> = snapshot.keys().collect();
    names.sort();
    let routes: Vec<serde_json::Value> = names
        .into_iter()
        .filter_map(|name| snapshot.get(name))
        .map(|route| {
            let c = &route.config;
            json!({
                "name": c.name,
                "file": c.file.display().to_string(),
                "mode": c.balancing.mode.as_str(),
                "max_body_size": c.max_body_size,
                "peers": route.peers.iter().map(|p| json!({
                    "name": p.config.name,
                    "address": p.config.address(),
                    "priority": p.config.priority,
                    "max_concurrency": p.config.max_concurrency,
                    "ready": p.is_usable(now),
                    "in_flight": p.state.in_flight(),
                })).collect::<Vec<_>>(),
                "models": c.peers_by_model.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "routes": routes })
}
