//! A request's identity across systems: its `x-request-id`, and its place
//! in a W3C trace (<https://www.w3.org/TR/trace-context/>).
//!
//! Read once per request from the client's head (`proxy/request/mod.rs`
//! `identify`), kept on the request's context (`RequestCtx::ids`), written
//! to the engine's head (`proxy/upstream/mod.rs` `rewrite_head`), to every
//! response (`x-request-id`) and to the access log.
//!
//! The `traceparent` parser is written here rather than taken from the
//! OpenTelemetry crates: the header is one fixed 55-byte layout, and the
//! `opentelemetry` crate's propagator would bring its whole API (global
//! providers, a context stack) onto the request path for it. Its unit
//! tests below go through every invalid form the specification names.

use crate::config::TraceMode;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The longest client `x-request-id` kept. Long enough for any id scheme in
/// use (UUIDs are 36, ULIDs 26, AWS trace ids 40); short enough that an id
/// cannot make the access log's lines or the engine's heads large.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// What one request is known by.
#[derive(Debug, Clone)]
pub struct RequestIds {
    /// The client's `x-request-id` when it was sane, else one made here.
    /// A header value already: it goes out as is on the response and to
    /// the engine.
    pub request_id: HeaderValue,
    /// `request_id` is the client's own, already in the head as its only
    /// `x-request-id`: the engine's head needs no edit for it.
    pub client_request_id: bool,
    /// The request's trace, unless `trace_context: off`, or `continue`
    /// without a valid incoming one.
    pub trace: Option<TraceContext>,
    /// The client sent `traceparent` (valid or not). Read here, where the
    /// header is looked up anyway, so that the engine's head is searched
    /// for trace headers to take off only when there are some.
    pub traceparent_sent: bool,
}

impl RequestIds {
    /// The ids of a request with head `headers`, under `mode`.
    pub fn of(headers: &HeaderMap, mode: TraceMode) -> Self {
        let (request_id, client_request_id) = request_id(headers);
        let (trace, traceparent_sent) = TraceContext::read(headers, mode);
        RequestIds {
            request_id,
            client_request_id,
            trace,
            traceparent_sent,
        }
    }

    /// The request id as text (always visible ASCII, see [`sane_request_id`]).
    pub fn request_id_str(&self) -> &str {
        self.request_id.to_str().unwrap_or("-")
    }
}

/// The client's `x-request-id` if it sent exactly one and it is sane
/// (`true`), else a new one.
pub fn request_id(headers: &HeaderMap) -> (HeaderValue, bool) {
    let mut given = headers.get_all(&X_REQUEST_ID).iter();
    match (given.next(), given.next()) {
        (Some(id), None) if sane_request_id(id.as_bytes()) => (id.clone(), true),
        _ => (new_request_id(), false),
    }
}

/// 1 to [`MAX_REQUEST_ID_LEN`] bytes of visible ASCII (no space, no control
/// byte, nothing a JSON line or a log viewer would have to escape beyond
/// `"` and `\`).
pub fn sane_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len()) && id.iter().all(|b| b.is_ascii_graphic())
}

/// A random (version 4) UUID. Its bits come from `fastrand` (wyrand, seeded
/// per thread) rather than `Uuid::new_v4`, which asks the kernel
/// (`getrandom`, a system call) for every id: an id only has to be unique,
/// not unguessable, and this is on every request's path.
pub fn new_request_id() -> HeaderValue {
    let uuid = uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid.hyphenated().encode_lower(&mut text);
    // Owned by an array rather than copied into a `Vec`: the value is
    // cloned onto the engine's head and the response, and a `Vec`-backed
    // `Bytes` allocates again at its first clone.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text))
        .unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// The flag bit that says the caller may record the trace.
pub const SAMPLED: u8 = 0x01;

/// The flag bit that says the trace id is random (Trace Context Level 2).
/// Every other bit is reserved, and a participant "MUST set those to zero"
/// when it passes the trace on.
pub const RANDOM: u8 = 0x02;

/// A parsed `traceparent`: `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traceparent {
    pub trace_id: u128,
    pub parent_id: u64,
    pub flags: u8,
}

impl Traceparent {
    /// The header's value, or `None` when the specification says to ignore
    /// it (and start a new trace): a version of `ff` or not two lowercase
    /// hex digits, a trace or parent id of the wrong length, not lowercase
    /// hex, or all zeros, flags not two lowercase hex digits, a version-00
    /// value longer than 55 bytes, a later version's value whose 56th byte
    /// is not `-`. Reserved flag bits are cleared.
    pub fn parse(value: &[u8]) -> Option<Traceparent> {
        let value = value.trim_ascii();
        if value.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = lower_hex(&value[0..2])? as u8;
        let dashes = [value[2], value[35], value[52]] == [b'-'; 3];
        let tail_ok = match version {
            0xff => false,
            // Version 00 is exactly this layout.
            0 => value.len() == TRACEPARENT_LEN,
            // A later version may append fields after a `-`; what precedes
            // them reads as version 00 (section 4.3).
            _ => value.len() == TRACEPARENT_LEN || value[TRACEPARENT_LEN] == b'-',
        };
        if !dashes || !tail_ok {
            return None;
        }
        let trace_id = lower_hex(&value[3..35])?;
        let parent_id = lower_hex(&value[36..52])? as u64;
        let flags = lower_hex(&value[53..55])? as u8;
        if trace_id == 0 || parent_id == 0 {
            return None;
        }
        // Reserved bits are not passed on. Of a later version's flags only
        // `sampled` is known to mean the same thing (section 4.3).
        let known = if version == 0 {
            SAMPLED | RANDOM
        } else {
            SAMPLED
        };
        let flags = flags & known;
        Some(Traceparent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The version-00 header text. Written digit by digit into a fixed
    /// buffer rather than with `format!`, whose padded hex of a `u128`
    /// goes through the formatting machinery: this runs for every request
    /// sent to an engine.
    pub fn encode(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [b'-'; TRACEPARENT_LEN];
        out[..2].copy_from_slice(b"00");
        hex_into(&mut out[3..35], self.trace_id);
        hex_into(&mut out[36..52], u128::from(self.parent_id));
        hex_into(&mut out[53..], u128::from(self.flags));
        out
    }
}

/// A version-00 `traceparent`'s length.
const TRACEPARENT_LEN: usize = 55;

/// `n` as lowercase hex filling `out`, zero-padded on the left.
fn hex_into(out: &mut [u8], mut n: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for digit in out.iter_mut().rev() {
        *digit = DIGITS[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// `digits` as a number, if they are all lowercase hex (the specification's
/// HEXDIGLC; `from_str_radix` alone would also take upper case and a sign).
fn lower_hex(digits: &[u8]) -> Option<u128> {
    if digits.is_empty()
        || !digits
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    u128::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// The request's place in a trace: the trace it belongs to, the client's
/// span (when it sent one) and the gateway's own span, which is the parent
/// the engine is told about. A future span exporter reports the gateway's
/// span as `span_id` with parent `parent_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// The client's span (the incoming `traceparent`'s parent id); `None`
    /// for a trace the gateway started.
    pub parent_id: Option<u64>,
    /// The gateway's span for this request: the engine's parent.
    pub span_id: u64,
    /// The incoming flags (the known ones, see [`RANDOM`]), or [`SAMPLED`]
    /// for a trace started here, so that
    /// an engine that samples by its parent (vLLM's and SGLang's default)
    /// records the spans the access log's trace id then finds.
    pub flags: u8,
}

impl TraceContext {
    /// The trace of a request with head `headers`: the client's when it
    /// sent exactly one valid `traceparent`, else a new one (`start`), or
    /// none (`continue` without a valid one, `off`). The request path
    /// reads it with `traceparent_sent` ([`RequestIds::of`]).
    #[cfg(test)]
    pub fn of(headers: &HeaderMap, mode: TraceMode) -> Option<TraceContext> {
        Self::read(headers, mode).0
    }

    /// [`Self::of`], and whether the client sent any `traceparent` (always
    /// `false` under `off`, which reads none).
    pub fn read(headers: &HeaderMap, mode: TraceMode) -> (Option<TraceContext>, bool) {
        if mode == TraceMode::Off {
            return (None, false);
        }
        let mut given = headers.get_all(&TRACEPARENT).iter();
        let (first, second) = (given.next(), given.next());
        let incoming = match (first, second) {
            (Some(v), None) => Traceparent::parse(v.as_bytes()),
            // Two `traceparent` headers: which one holds is unknowable.
            _ => None,
        };
        (Self::continue_or_start(incoming, mode), first.is_some())
    }

    /// The client's trace continued, or under `start` a new one.
    fn continue_or_start(incoming: Option<Traceparent>, mode: TraceMode) -> Option<TraceContext> {
        match incoming {
            Some(tp) => Some(TraceContext {
                trace_id: tp.trace_id,
                parent_id: Some(tp.parent_id),
                span_id: fastrand::u64(1..),
                flags: tp.flags,
            }),
            None if mode == TraceMode::Start => Some(TraceContext {
                trace_id: fastrand::u128(1..),
                parent_id: None,
                span_id: fastrand::u64(1..),
                flags: SAMPLED,
            }),
            None => None,
        }
    }

    /// Whether the client's trace goes on (its `tracestate` with it).
    pub fn continued(&self) -> bool {
        self.parent_id.is_some()
    }

    /// The `traceparent` the engine receives: this trace, the gateway's span.
    pub fn traceparent(&self) -> Traceparent {
        Traceparent {
            trace_id: self.trace_id,
            parent_id: self.span_id,
            flags: self.flags,
        }
    }

    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses() {
        let tp = Traceparent::parse(VALID.as_bytes()).expect("valid");
        assert_eq!(tp.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(tp.parent_id, 0x00f067aa0ba902b7);
        assert_eq!(tp.flags, 1);
        assert_eq!(
            &tp.encode()[..],
            VALID.as_bytes(),
            "it encodes back to itself"
        );
        // Reserved flags are cleared, sampled and random kept, and
        // surrounding spaces go.
        let other = Traceparent::parse(format!(" {}ff ", &VALID[..53]).as_bytes());
        assert_eq!(other.map(|t| t.flags), Some(SAMPLED | RANDOM));
        let unsampled = Traceparent::parse(format!("{}00", &VALID[..53]).as_bytes());
        assert_eq!(unsampled.map(|t| t.flags), Some(0));
    }

    #[test]
    fn each_invalid_form_is_refused() {
        let cases: &[(&str, String)] = &[
            ("version ff", format!("ff{}", &VALID[2..])),
            ("version upper case", format!("0A{}", &VALID[2..])),
            ("version not hex", format!("0g{}", &VALID[2..])),
            (
                "all-zero trace id",
                VALID.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
            ),
            (
                "all-zero parent id",
                VALID.replace("00f067aa0ba902b7", &"0".repeat(16)),
            ),
            (
                "trace id short",
                VALID.replace(
                    "4bf92f3577b34da6a3ce929d0e0e4736",
                    "4bf92f3577b34da6a3ce929d0e0e473",
                ),
            ),
            (
                "trace id long",
                VALID.replace(
                    "4bf92f3577b34da6a3ce929d0e0e4736",
                    "4bf92f3577b34da6a3ce929d0e0e47366",
                ),
            ),
            (
                "parent id short",
                VALID.replace("00f067aa0ba902b7", "00f067aa0ba902b"),
            ),
            ("trace id upper case", VALID.replace("4bf9", "4BF9")),
            ("parent id not hex", VALID.replace("00f0", "00z0")),
            ("flags not hex", format!("{}0x", &VALID[..53])),
            ("flags one digit", VALID[..54].to_string()),
            ("version 00 with more after it", format!("{VALID}-extra")),
            ("a dash missing", VALID.replacen('-', "_", 1)),
            (
                "a sign in an id",
                VALID.replace("00f067aa0ba902b7", "+0f067aa0ba902b7"),
            ),
            ("empty", String::new()),
            (
                "later version with no dash after",
                format!("01{}x", &VALID[2..]),
            ),
        ];
        for (what, value) in cases {
            assert_eq!(
                Traceparent::parse(value.as_bytes()),
                None,
                "{what}: {value}"
            );
        }
        // Control: a later version is read as far as version 00 goes, with
        // or without more fields, and keeps only its sampled flag.
        for later in [
            format!("cc{}", &VALID[2..]),
            format!("cc{}-what-next", &VALID[2..]),
        ] {
            let tp = Traceparent::parse(later.replace("-01", "-03").as_bytes());
            assert_eq!(
                tp.map(|t| (t.trace_id, t.flags)),
                Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 1)),
                "{later}"
            );
        }
    }

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn an_incoming_trace_is_continued_with_a_new_span() {
        let ctx = TraceContext::of(&head(&[("traceparent", VALID)]), TraceMode::Start).unwrap();
        assert_eq!(ctx.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(ctx.parent_id, Some(0x00f067aa0ba902b7));
        assert_ne!(ctx.span_id, 0x00f067aa0ba902b7);
        assert_ne!(ctx.span_id, 0);
        let out = String::from_utf8(ctx.traceparent().encode().to_vec()).unwrap();
        assert!(
            out.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{out}"
        );
        assert!(out.ends_with("-01"), "{out}");
        assert_eq!(
            Traceparent::parse(out.as_bytes()).map(|t| t.parent_id),
            Some(ctx.span_id)
        );
        assert!(ctx.continued());
        // `continue` continues it just the same.
        let again = TraceContext::of(&head(&[("traceparent", VALID)]), TraceMode::Continue);
        assert_eq!(again.map(|c| c.trace_id), Some(ctx.trace_id));
    }

    #[test]
    fn without_a_valid_traceparent_the_mode_decides() {
        let invalid = head(&[(
            "traceparent",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )]);
        let twice = head(&[("traceparent", VALID), ("traceparent", VALID)]);
        for h in [HeaderMap::new(), invalid, twice] {
            let fresh = TraceContext::of(&h, TraceMode::Start).expect("started");
            assert_ne!(fresh.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
            assert_ne!(fresh.trace_id, 0);
            assert_eq!((fresh.parent_id, fresh.flags), (None, SAMPLED));
            assert!(Traceparent::parse(&fresh.traceparent().encode()).is_some());
            assert_eq!(TraceContext::of(&h, TraceMode::Continue), None);
        }
        // Off: nothing, even for a valid one.
        assert_eq!(
            TraceContext::of(&head(&[("traceparent", VALID)]), TraceMode::Off),
            None
        );
        // Two fresh traces differ.
        let (a, b) = (
            TraceContext::of(&HeaderMap::new(), TraceMode::Start).unwrap(),
            TraceContext::of(&HeaderMap::new(), TraceMode::Start).unwrap(),
        );
        assert_ne!((a.trace_id, a.span_id), (b.trace_id, b.span_id));
    }

    #[test]
    fn a_sane_request_id_is_kept_and_any_other_replaced() {
        let kept = request_id(&head(&[("x-request-id", "req-42_abc.DEF:1")]));
        assert_eq!(kept, (HeaderValue::from_static("req-42_abc.DEF:1"), true));
        let long = "a".repeat(MAX_REQUEST_ID_LEN);
        let kept = request_id(&head(&[("x-request-id", &long)]));
        assert_eq!((kept.0.to_str().ok(), kept.1), (Some(long.as_str()), true));
        let mut insane: Vec<HeaderMap> = [
            "",
            "has space",
            "tab\there",
            &"a".repeat(MAX_REQUEST_ID_LEN + 1),
        ]
        .iter()
        .map(|v| head(&[("x-request-id", v)]))
        .collect();
        let mut non_ascii = HeaderMap::new();
        non_ascii.insert(
            X_REQUEST_ID,
            HeaderValue::from_bytes("café".as_bytes()).unwrap(),
        );
        insane.push(non_ascii);
        insane.push(head(&[("x-request-id", "one"), ("x-request-id", "two")]));
        insane.push(HeaderMap::new());
        for h in insane {
            let (id, from_client) = request_id(&h);
            assert!(!from_client);
            let text = id.to_str().unwrap();
            assert_eq!(text.len(), 36, "a generated UUID: {text} for {h:?}");
            assert!(
                uuid::Uuid::parse_str(text).is_ok_and(|u| u.get_version_num() == 4),
                "{text}"
            );
            assert!(sane_request_id(id.as_bytes()));
        }
        assert_ne!(new_request_id(), new_request_id());
    }
}
