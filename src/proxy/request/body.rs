//! The request body: whether there is one (its framing headers read once),
//! reading it whole (413 over the route's `max_body_size`) in the pieces it
//! arrives in (`pieces.rs`), and one pass over it for everything the
//! request path needs: the API the path names (`api.rs`; other endpoints
//! pass unread), the model, whether it streams, the session the client
//! named, the conversation's blocks when it named none (`session/content/`),
//! and the include_usage edit the route may ask for. The skim
//! (`request_view/skim.rs`) reads an ordinary body across its pieces;
//! serde_json reads, joined, whatever the skim is unsure of, and words the
//! 400.

use super::pieces::{Gather, RequestBody};
use super::rewrites;
use super::Local;
use crate::errors::ErrorResponse;
use crate::proxy::ctx::Admitted;
use crate::registry::Route;
use crate::request_view::RequestView;
use crate::session::extract_session;
use bytes::Bytes;
use pingora::proxy::Session;
use std::borrow::Cow;

/// Reads the body, if any, and what the gateway needs from it (see
/// [`inspect`]).
pub async fn read(
    session: &mut Session,
    route: &Route,
    rest: &str,
    req: &mut Admitted,
) -> Result<(), Local> {
    let mut framing = Framing::of(session);
    if framing.length.is_none()
        && session.as_downstream().is_http2()
        && !session.as_downstream_mut().is_body_empty()
    {
        // An h2 body needs no Content-Length: its DATA frames run to the
        // stream's end, read as a chunked one is.
        framing.chunked = true;
    }
    if framing.has_body() {
        // Pingora keeps a copy of a body up to 64 KiB as it is read; such a
        // body then goes upstream from that buffer, without the replay
        // (`super::forward`). Not for a body declared larger: it would copy
        // its first 64 KiB for nothing.
        if framing
            .length
            .flatten()
            .is_none_or(|n| n <= RETRY_BUFFER_BYTES)
        {
            session.as_downstream_mut().enable_retry_buffering();
            req.retry_buffered = true;
        }
        req.body = read_framed(session, framing, route.config.max_body_size).await?;
        req.body_read = true;
    }
    inspect(session, route, rest, req)
}

/// One pass over the body's view: an LLM endpoint's body must be a JSON
/// object; other endpoints are looked at only when the route picks a pool by
/// model. The session comes from the headers first, then the body, then
/// the conversation's content (whose blocks the same pass gathers).
fn inspect(session: &Session, route: &Route, rest: &str, req: &mut Admitted) -> Result<(), Local> {
    req.api = crate::api::Api::of_path(rest);
    let llm = req.api.is_some();
    let viewed = llm || !(route.config.peers_by_model.is_empty() || req.body.is_empty());
    let headers = &session.req_header().headers;
    let named = extract_session(headers, &route.config.balancing.session_headers, None);
    let mut sink = super::session::sink_for(route, req.api, named.is_some());
    // The skim reads most bodies in their pieces; the few it cannot (an
    // invalid body, a key cut by a piece boundary) are joined and read
    // whole, which also words the error.
    let in_pieces = viewed
        .then(|| RequestView::parse_pieces_into(req.body.pieces(), sink.as_mut()))
        .flatten();
    let view = match (viewed, in_pieces) {
        (false, _) => None,
        (true, Some(view)) => Some(view),
        (true, None) => {
            req.body.make_whole();
            let whole = req.body.first_piece();
            if let Some(sink) = sink.as_mut() {
                *sink = Default::default();
            }
            if llm {
                Some(parse_llm_body(whole, sink.as_mut())?)
            } else {
                RequestView::parse(whole).ok()
            }
        }
    };
    req.json_object = view.is_some();
    req.streamed = view.as_ref().is_some_and(|v| v.is_stream());
    req.model = view.and_then(|v| v.model()).map(Cow::into_owned);
    req.session = super::session::named(named, view.as_ref());
    if req.session.is_none() {
        req.blocks = sink.map(crate::session::content::BlockSink::finish);
    }
    // Anthropic's and the Responses API's streams report usage unasked.
    let asks_usage = matches!(
        req.api,
        Some(crate::api::Api::Chat | crate::api::Api::Completions)
    );
    req.usage_rewrite = view
        .filter(|_| asks_usage)
        .and_then(|v| rewrites::with_include_usage(route, &req.body, &v));
    Ok(())
}

/// What Pingora's retry buffer holds (pingora-core 0.9.1's crate-private
/// `BODY_BUF_LIMIT`); `tests/proxy.rs` checks both sides of it.
pub const RETRY_BUFFER_BYTES: u64 = 64 * 1024;

/// What the request head says of its body, read once per request.
#[derive(Debug, Clone, Copy)]
struct Framing {
    /// Content-Length: `None` when absent, `Some(None)` when not a number.
    length: Option<Option<u64>>,
    chunked: bool,
}

impl Framing {
    fn of(session: &Session) -> Self {
        let h = &session.req_header().headers;
        Framing {
            length: h
                .get(http::header::CONTENT_LENGTH)
                .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok())),
            chunked: h.contains_key(http::header::TRANSFER_ENCODING),
        }
    }

    fn has_body(&self) -> bool {
        self.chunked || self.length.flatten().is_some_and(|n| n > 0)
    }
}

/// Tokens a body's prompt is likely to be, before the engine counts them
/// (about 4 bytes a token, as BPE tokenizers give on English and code).
pub fn estimated_tokens(body: &RequestBody) -> u64 {
    estimated_len(body.len())
}

/// [`estimated_tokens`] of a body of `bytes`.
pub fn estimated_len(bytes: usize) -> u64 {
    (bytes / 4) as u64
}

/// Whether the request carries a body at all (by its framing headers).
pub fn has_body(session: &Session) -> bool {
    Framing::of(session).has_body()
}

/// Reads the whole body, refusing (before reading, when Content-Length says
/// so) anything over `limit`. A refused body is left unread, so the
/// connection cannot be reused afterwards.
pub async fn read_body(session: &mut Session, limit: u64) -> Result<Bytes, Local> {
    let framing = Framing::of(session);
    Ok(read_framed(session, framing, limit).await?.whole_bytes())
}

async fn read_framed(
    session: &mut Session,
    framing: Framing,
    limit: u64,
) -> Result<RequestBody, Local> {
    let declared = framing.length;
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
    let mut gather = Gather::default();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if (gather.read() + chunk.len()) as u64 > limit {
                    session.set_keepalive(None);
                    return Err(ErrorResponse::body_too_large(limit).into());
                }
                gather.add(chunk);
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
    Ok(gather.finish())
}

/// Views an LLM request body, its conversation's blocks into `sink`;
/// anything but a JSON object is a client error.
pub fn parse_llm_body<'a>(
    body: &'a [u8],
    sink: Option<&mut crate::session::content::BlockSink>,
) -> Result<RequestView<'a>, Local> {
    if body.is_empty() {
        return Err(ErrorResponse::bad_request("request body must be a JSON object").into());
    }
    RequestView::parse_into(body, sink).map_err(|e| {
        let message = if e.is_data() {
            "request body must be a JSON object".to_string()
        } else {
            format!("request body is not valid JSON: {e}")
        };
        Local::Error(ErrorResponse::bad_request(message))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llm_body_must_be_an_object() {
        assert!(parse_llm_body(b"{\"model\":\"m\"}", None).is_ok());
        assert!(parse_llm_body(b"[1]", None).is_err());
        assert!(parse_llm_body(b"", None).is_err());
        assert!(parse_llm_body(b"{not json", None).is_err());
    }
}
