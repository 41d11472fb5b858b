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
    /// The ids of a request with head `headers`, under `mode`; a trace
    /// started here is sampled as `sampler` says.
    pub fn of(headers: &HeaderMap, mode: TraceMode, sampler: Sampler) -> Self {
        let (request_id, client_request_id) = request_id(headers);
        let (trace, traceparent_sent) = TraceContext::read(headers, mode, sampler);
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
/// the engine is told about. The span exporter (`otlp/`) reports the gateway's
/// span as `span_id` with parent `parent_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// The client's span (the incoming `traceparent`'s parent id); `None`
    /// for a trace the gateway started.
    pub parent_id: Option<u64>,
    /// The gateway's span for this request: the engine's parent.
    pub span_id: u64,
    /// The incoming flags (the known ones, see [`RANDOM`]), or for a trace
    /// started here [`SAMPLED`] when the [`Sampler`] samples it (always,
    /// without a span exporter), so that an engine that samples by its
    /// parent (vLLM's and SGLang's default) records exactly the traces
    /// whose gateway span is recorded too.
    pub flags: u8,
}

impl TraceContext {
    /// The trace of a request with head `headers`: the client's when it
    /// sent exactly one valid `traceparent`, else a new one (`start`), or
    /// none (`continue` without a valid one, `off`). The request path
    /// reads it with `traceparent_sent` ([`RequestIds::of`]).
    #[cfg(test)]
    pub fn of(headers: &HeaderMap, mode: TraceMode) -> Option<TraceContext> {
        Self::read(headers, mode, Sampler::ALWAYS).0
    }

    /// [`Self::of`], and whether the client sent any `traceparent` (always
    /// `false` under `off`, which reads none); a trace started here is
    /// marked sampled when `sampler` says so.
    pub fn read(
        headers: &HeaderMap,
        mode: TraceMode,
        sampler: Sampler,
    ) -> (Option<TraceContext>, bool) {
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
        (
            Self::continue_or_start(incoming, mode, sampler),
            first.is_some(),
        )
    }

    /// The client's trace continued, or under `start` a new one.
    fn continue_or_start(
        incoming: Option<Traceparent>,
        mode: TraceMode,
        sampler: Sampler,
    ) -> Option<TraceContext> {
        match incoming {
            Some(tp) => Some(TraceContext {
                trace_id: tp.trace_id,
                parent_id: Some(tp.parent_id),
                span_id: fastrand::u64(1..),
                flags: tp.flags,
            }),
            None if mode == TraceMode::Start => {
                let trace_id = fastrand::u128(1..);
                Some(TraceContext {
                    trace_id,
                    parent_id: None,
                    span_id: fastrand::u64(1..),
                    flags: if sampler.samples(trace_id) {
                        SAMPLED
                    } else {
                        0
                    },
                })
            }
            None => None,
        }
    }

    /// Whether this request's span is recorded: the client's decision for
    /// a trace it sent, the [`Sampler`]'s for one started here
    /// (OpenTelemetry's `ParentBased(TraceIdRatioBased)`).
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
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

/// The sampling decision for a trace the gateway starts: OpenTelemetry's
/// `TraceIdRatioBased`, computed as its SDKs do (the trace id's low 63
/// bits against the ratio's share of 2^63), so that every participant
/// that samples by the same ratio decides the same for the same trace.
/// A continued trace is not asked: its client's sampled flag decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    /// Sampled when the trace id's 63 bits are below this; `None`: always.
    below: Option<u64>,
}

impl Sampler {
    /// Every trace started here is sampled (the only choice without an
    /// exporter: the engine's spans are then kept).
    pub const ALWAYS: Sampler = Sampler { below: None };

    /// A share `ratio` (0.0 to 1.0; outside, the nearest) of traces.
    pub fn ratio(ratio: f64) -> Sampler {
        if ratio >= 1.0 {
            return Sampler::ALWAYS;
        }
        Sampler {
            below: Some((ratio.max(0.0) * (1u64 << 63) as f64) as u64),
        }
    }

    pub fn samples(&self, trace_id: u128) -> bool {
        match self.below {
            None => true,
            Some(below) => ((trace_id as u64) >> 1) < below,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_decides_by_the_trace_id_as_opentelemetry_does() {
        let all = Sampler::ratio(1.0);
        let none = Sampler::ratio(0.0);
        let half = Sampler::ratio(0.5);
        // The low 64 bits decide; the high ones do not.
        let low = 0x0000_0000_0000_0000_0000_0000_0000_0002u128;
        let high = 0x0000_0000_0000_0000_ffff_ffff_ffff_fffeu128;
        for id in [low, high, u128::MAX << 64 | 2] {
            assert!(all.samples(id) && !none.samples(id), "{id:x}");
        }
        assert!(half.samples(low) && !half.samples(high));
        assert!(half.samples(u128::MAX << 64 | 2), "the high bits ignored");
        // The edge: 2^62 (the ratio's bound) out, one below in.
        let bound = 1u128 << 63;
        assert!(!half.samples(bound) && half.samples(bound - 2));
        // Over many random ids the share is the ratio's.
        let tenth = Sampler::ratio(0.1);
        let n = 100_000;
        let kept = (0..n)
            .filter(|_| tenth.samples(fastrand::u128(1..)))
            .count();
        assert!((9_000..11_000).contains(&kept), "{kept} of {n}");
        // Out of range: the nearest.
        assert_eq!(Sampler::ratio(7.0), Sampler::ALWAYS);
        assert!(!Sampler::ratio(-1.0).samples(low));
    }

    #[test]
    fn a_started_trace_is_marked_as_sampled_and_a_continued_one_keeps_its_flag() {
        let (started, _) =
            TraceContext::read(&HeaderMap::new(), TraceMode::Start, Sampler::ratio(0.0));
        let started = started.expect("started");
        assert_eq!(started.flags, 0);
        assert!(!started.sampled());
        let (kept, _) = TraceContext::read(&HeaderMap::new(), TraceMode::Start, Sampler::ALWAYS);
        assert!(kept.expect("started").sampled());
        // A client's decision holds, whatever the ratio.
        let sampled = head(&[("traceparent", VALID)]);
        let (c, _) = TraceContext::read(&sampled, TraceMode::Start, Sampler::ratio(0.0));
        assert!(c.expect("continued").sampled());
        let unsampled = head(&[("traceparent", &format!("{}00", &VALID[..53]))]);
        let (c, _) = TraceContext::read(&unsampled, TraceMode::Start, Sampler::ALWAYS);
        assert!(!c.expect("continued").sampled());
    }

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
