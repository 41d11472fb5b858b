//! The JSON error contract: every error the gateway itself answers is
//! `{"error": {"type": …, "message": …, …}}`. Field names are public: add,
//! never rename.
//!
//! The one exception is not ours to answer: a request head that Pingora
//! 0.9.1's parser refuses (an invalid line or header name, obs-fold,
//! conflicting Content-Length, a Transfer-Encoding whose last coding is not
//! chunked or on HTTP/1.0, more than 256 headers, a head over 1,048,575
//! bytes) and a CONNECT (405). `HttpProxy::handle_new_request` answers those
//! itself with `respond_error` — `Content-Length: 0`, `Connection: close`,
//! no body — before any `ProxyHttp` hook runs; no hook (`fail_to_proxy`,
//! `error_while_proxy`) is called for them and no option adds a body. The
//! client gets the status line and a closed connection
//! (`tests/hostile.rs` pins it).

use bytes::Bytes;
use pingora::{Error, ErrorSource, ErrorType};
use serde_json::{json, Map, Value};

/// An error response the gateway answers locally.
#[derive(Debug, Clone)]
pub struct ErrorResponse {
    pub status: u16,
    pub error_type: &'static str,
    pub message: String,
    /// Extra fields merged into the `error` object (e.g. `limit`, `in_flight`).
    /// Boxed: errors travel in `Result`s on the request path, and most have none.
    pub extra: Option<Box<Map<String, Value>>>,
    pub retry_after: Option<u32>,
    /// The methods the target serves, for a 405's `Allow` header (RFC 9110
    /// §15.5.6 requires one).
    pub allow: Option<&'static str>,
    /// More response headers (a tenant's 429: OpenAI's `x-ratelimit-*`).
    /// Boxed for the same reason as `extra`.
    pub headers: Option<Box<Vec<(&'static str, String)>>>,
}

impl ErrorResponse {
    pub fn new(status: u16, error_type: &'static str, message: impl Into<String>) -> Self {
        ErrorResponse {
            status,
            error_type,
            message: message.into(),
            extra: None,
            retry_after: None,
            allow: None,
            headers: None,
        }
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers
            .get_or_insert_with(Default::default)
            .push((name, value.into()));
        self
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra
            .get_or_insert_with(Default::default)
            .insert(key.to_string(), value.into());
        self
    }

    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn body(&self) -> Bytes {
        let mut obj = Map::new();
        obj.insert("type".into(), json!(self.error_type));
        obj.insert("message".into(), json!(self.message));
        for (k, v) in self.extra.iter().flat_map(|m| m.iter()) {
            obj.insert(k.clone(), v.clone());
        }
        let mut out = serde_json::to_vec(&json!({ "error": obj })).unwrap_or_default();
        out.push(b'\n');
        Bytes::from(out)
    }

    pub fn not_found_route(route: &str) -> Self {
        Self::new(404, "route_not_found", format!("no route named {route:?}"))
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found", message)
    }

    pub fn body_too_large(limit: u64) -> Self {
        Self::new(
            413,
            "request_too_large",
            format!("request body exceeds {limit} bytes"),
        )
        .with("limit", limit)
    }

    /// A request head over `limit` bytes, the request line and headers
    /// counted as sent (`limit` field).
    pub fn head_too_large(limit: usize) -> Self {
        Self::new(
            431,
            "request_header_fields_too_large",
            format!("request head (request line and headers) exceeds {limit} bytes"),
        )
        .with("limit", limit)
    }

    /// 405 for a method the target does not serve; `allow` lists those it
    /// does, as its `Allow` header will.
    pub fn method_not_allowed(message: impl Into<String>, allow: &'static str) -> Self {
        let mut e = Self::new(405, "method_not_allowed", message);
        e.allow = Some(allow);
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request", message)
    }

    pub fn no_ready_peer(route: &str) -> Self {
        Self::new(
            503,
            "no_healthy_upstream",
            format!("route {route:?} has no ready peer"),
        )
        .retry_after(5)
    }

    /// A route with no peers at all (none listed, none found yet): the same
    /// 503 as a route whose peers are all down, saying why.
    pub fn no_peers(route: &str) -> Self {
        Self::new(
            503,
            "no_healthy_upstream",
            format!("route {route:?} has no peers (none listed, none found yet)"),
        )
        .retry_after(5)
    }

    pub fn upstream_failed(message: impl Into<String>) -> Self {
        Self::new(502, "upstream_error", message)
    }

    /// The gateway itself could not open a connection (`what`: which of
    /// its limits), so no engine was tried.
    pub fn gateway_overloaded(what: &str) -> Self {
        Self::new(
            503,
            "gateway_overloaded",
            format!("the gateway is out of {what}; retry shortly"),
        )
        .retry_after(1)
    }
}

/// Which of the gateway's own limits an I/O error is: out of file
/// descriptors (the process's or the system's), socket buffers or memory,
/// or local ports. None for anything the other side did.
pub fn local_shortage_io(e: &std::io::Error) -> Option<&'static str> {
    match e.raw_os_error()? {
        // EMFILE, ENFILE
        24 | 23 => Some("file descriptors"),
        // ENOBUFS, ENOMEM
        105 | 12 => Some("socket memory"),
        // EADDRNOTAVAIL: no local port left to connect from.
        99 => Some("local ports"),
        _ => None,
    }
}

/// [`local_shortage_io`] for a Pingora error, read from its root cause
/// (a connect wraps the socket's own error).
pub fn local_shortage(e: &Error) -> Option<&'static str> {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .and_then(local_shortage_io)
}

/// The status for a request whose proxying failed: the engine's fault
/// (502), the client's (400, or 0 when the client just went away), or ours
/// (500). `attempted`: an upstream attempt had started.
pub fn proxy_failure_status(e: &Error, attempted: bool) -> u16 {
    match e.etype() {
        ErrorType::HTTPStatus(code) => *code,
        _ => match e.esource() {
            ErrorSource::Downstream => match e.etype() {
                ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed => 0,
                _ => 400,
            },
            ErrorSource::Upstream => 502,
            _ if attempted => 502,
            _ => 500,
        },
    }
}

/// The client's body for a failed proxy attempt with `status`. It names
/// the peer and the kind of failure only: the engine's own bytes and its
/// address are for the log, not for the client.
pub fn proxy_failure(
    status: u16,
    e: &Error,
    peer: &str,
    tried: &[usize],
    last_upstream_error: Option<&str>,
) -> ErrorResponse {
    match status {
        502 => {
            let detail = last_upstream_error
                .map(str::to_string)
                .unwrap_or_else(|| format!("peer {peer}: {}", e.etype().as_str()));
            ErrorResponse::upstream_failed(format!(
                "upstream failed after {} attempt(s): {detail}",
                tried.len()
            ))
            .with("attempts", tried.len())
        }
        400 => ErrorResponse::bad_request(format!("bad request: {}", e.etype().as_str())),
        c => ErrorResponse::new(c, "internal_error", e.etype().as_str().to_string()),
    }
}

/// A client that hangs up is routine (a cancelled completion, a load
/// generator ending its run), not a gateway error.
pub fn is_client_gone(e: &Error) -> bool {
    *e.esource() == ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_own_limits_are_told_from_the_peers_failures() {
        let emfile = std::io::Error::from_raw_os_error(24);
        assert_eq!(local_shortage_io(&emfile), Some("file descriptors"));
        let wrapped = Error::because(
            ErrorType::InternalError,
            "connect",
            Error::because(ErrorType::SocketError, "socket", emfile),
        );
        assert_eq!(local_shortage(&wrapped), Some("file descriptors"));
        // Control: a refused connection is the peer's, not ours.
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(local_shortage_io(&refused), None);
        let refused = Error::because(ErrorType::ConnectRefused, "connect", refused);
        assert_eq!(local_shortage(&refused), None);
    }

    #[test]
    fn body_is_the_contract_shape() {
        let e = ErrorResponse::new(429, "concurrency_limit", "busy")
            .with("limit", 8)
            .retry_after(1);
        let v: Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["type"], "concurrency_limit");
        assert_eq!(v["error"]["message"], "busy");
        assert_eq!(v["error"]["limit"], 8);
        assert_eq!(e.retry_after, Some(1));
    }
}
