//! Request-side steps before a peer is chosen: route lookup, body reading,
//! JSON parsing. Each returns a `Local` answer when the gateway itself must
//! respond.

use crate::errors::ErrorResponse;
use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;

/// A response the gateway writes itself instead of proxying.
#[derive(Debug)]
pub enum Local {
    Error(ErrorResponse),
    Json(u16, serde_json::Value),
}

impl From<ErrorResponse> for Local {
    fn from(e: ErrorResponse) -> Self {
        Local::Error(e)
    }
}

/// `/<route>/<rest>` → (route, rest). `rest` keeps the query string and is
/// "/" when empty.
pub fn split_route(path_and_query: &str) -> Option<(&str, String)> {
    let trimmed = path_and_query.strip_prefix('/')?;
    let end = trimmed.find(['/', '?']).unwrap_or(trimmed.len());
    let (name, rest) = trimmed.split_at(end);
    if name.is_empty() {
        return None;
    }
    let rest = if rest.is_empty() {
        "/".to_string()
    } else if rest.starts_with('?') {
        format!("/{rest}")
    } else {
        rest.to_string()
    };
    Some((name, rest))
}

/// Endpoints whose body must be an OpenAI-style JSON request.
pub fn is_llm_endpoint(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    matches!(path, "/v1/chat/completions" | "/v1/completions")
}

/// Whether the request carries a body at all (by its framing headers).
pub fn has_body(session: &Session) -> bool {
    let h = &session.req_header().headers;
    if h.contains_key(http::header::TRANSFER_ENCODING) {
        return true;
    }
    match h
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(n) => n > 0,
        None => false,
    }
}

/// Reads the whole body, refusing (before reading, when Content-Length says
/// so) anything over `limit`. A refused body is left unread, so the
/// connection cannot be reused afterwards.
pub async fn read_body(session: &mut Session, limit: u64) -> Result<Bytes, Local> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
    match declared {
        Some(None) => return Err(ErrorResponse::bad_request("invalid Content-Length").into()),
        Some(Some(n)) if n > limit => {
            session.set_keepalive(None);
            return Err(ErrorResponse::body_too_large(limit).into());
        }
        _ => {}
    }
    let expects_continue = session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        // Without this, curl waits ~1 s before sending a large body.
        session.write_continue_response().await.map_err(|e| {
            Local::Error(ErrorResponse::bad_request(format!(
                "client connection: {e}"
            )))
        })?;
    }
    let capacity = match declared {
        Some(Some(n)) => n as usize,
        _ => 16 * 1024,
    };
    let mut buf = BytesMut::with_capacity(capacity);
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if (buf.len() + chunk.len()) as u64 > limit {
                    session.set_keepalive(None);
                    return Err(ErrorResponse::body_too_large(limit).into());
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => {
                session.set_keepalive(None);
                return Err(ErrorResponse::bad_request(format!(
                    "cannot read request body: {}",
                    e.etype().as_str()
                ))
                .into());
            }
        }
    }
    Ok(buf.freeze())
}

/// Parses an LLM request body; anything but a JSON object is a client error.
pub fn parse_llm_body(body: &[u8]) -> Result<serde_json::Value, Local> {
    if body.is_empty() {
        return Err(ErrorResponse::bad_request("request body must be a JSON object").into());
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(ErrorResponse::bad_request("request body must be a JSON object").into()),
        Err(e) => {
            Err(ErrorResponse::bad_request(format!("request body is not valid JSON: {e}")).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_route_and_rest() {
        assert_eq!(
            split_route("/chat/v1/models"),
            Some(("chat", "/v1/models".into()))
        );
        assert_eq!(split_route("/chat"), Some(("chat", "/".into())));
        assert_eq!(split_route("/chat?x=1"), Some(("chat", "/?x=1".into())));
        assert_eq!(
            split_route("/chat/v1/x?a=b"),
            Some(("chat", "/v1/x?a=b".into()))
        );
        assert_eq!(split_route("/"), None);
        assert_eq!(split_route("//v1"), None);
        assert_eq!(split_route("chat"), None);
    }

    #[test]
    fn llm_endpoints() {
        assert!(is_llm_endpoint("/v1/chat/completions"));
        assert!(is_llm_endpoint("/v1/completions?x=1"));
        assert!(!is_llm_endpoint("/v1/models"));
        assert!(!is_llm_endpoint("/v1/embeddings"));
    }

    #[test]
    fn llm_body_must_be_an_object() {
        assert!(parse_llm_body(b"{\"model\":\"m\"}").is_ok());
        assert!(parse_llm_body(b"[1]").is_err());
        assert!(parse_llm_body(b"").is_err());
        assert!(parse_llm_body(b"{not json").is_err());
    }
}
