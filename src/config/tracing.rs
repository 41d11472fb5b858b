//! `tracing:` in gateway.yaml → where the gateway sends its OpenTelemetry
//! spans (`otlp/`), how many it keeps, and how many it samples.

use super::file::TracingFile;
use super::spans::KeyLines;
use super::{ConfigError, TraceMode};
use std::path::Path;
use std::time::Duration;

/// The defaults of OpenTelemetry's batch span processor
/// (`OTEL_BSP_MAX_QUEUE_SIZE`, `…_MAX_EXPORT_BATCH_SIZE`,
/// `…_SCHEDULE_DELAY`) and of its OTLP exporter (`OTEL_EXPORTER_OTLP_TIMEOUT`),
/// so that an operator who knows those knows these.
pub const DEFAULT_QUEUE_SPANS: usize = 2048;
pub const DEFAULT_BATCH_SPANS: usize = 512;
pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_SERVICE_NAME: &str = "llm-gateway";

/// The collector, as the exporter connects to it: plain HTTP/1.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorEndpoint {
    /// To connect to: a host name or an IP address (no brackets).
    pub host: String,
    pub port: u16,
    /// The Host header: as written in the URL.
    pub authority: String,
    /// The path the spans are POSTed to (`/v1/traces`, OTLP's default).
    pub path: String,
}

impl std::fmt::Display for CollectorEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    pub endpoint: CollectorEndpoint,
    /// The share of traces the gateway starts that are recorded (and
    /// marked sampled for the engine); a continued trace follows its
    /// client's sampled flag (OpenTelemetry's `ParentBased(TraceIdRatio)`).
    pub sampling_ratio: f64,
    /// Finished spans waiting for the exporter at most; more are dropped
    /// (counted).
    pub queue_spans: usize,
    /// Spans sent in one request to the collector at most.
    pub batch_spans: usize,
    /// How long a span waits for its batch to fill before it goes anyway.
    pub export_interval: Duration,
    /// One export's limit, connect to the collector's answer.
    pub export_timeout: Duration,
    /// The resource's `service.name`.
    pub service_name: String,
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&TracingFile>,
    trace_mode: TraceMode,
) -> Result<Option<TracingConfig>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let lines = KeyLines::of(text);
    let err = |key: &str, message: String| ConfigError::new(path, lines.line(key), message);
    let Some(url) = file.endpoint.as_deref().filter(|u| !u.is_empty()) else {
        return Err(err(
            "tracing",
            "tracing needs endpoint, the collector's OTLP/HTTP URL (http://collector:4318/v1/traces)"
                .into(),
        ));
    };
    let endpoint = parse_endpoint(url).map_err(|why| err("tracing.endpoint", why))?;
    if trace_mode == TraceMode::Off {
        return Err(err(
            "trace_context",
            "trace_context: off reads no trace, so tracing: would export nothing; use start (the default with tracing:) or continue".into(),
        ));
    }
    let sampling_ratio = file.sampling_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sampling_ratio) {
        return Err(err(
            "tracing.sampling_ratio",
            format!("tracing.sampling_ratio must be between 0.0 and 1.0, not {sampling_ratio}"),
        ));
    }
    let queue_spans = file.queue_spans.unwrap_or(DEFAULT_QUEUE_SPANS);
    if !(1..=1 << 20).contains(&queue_spans) {
        return Err(err(
            "tracing.queue_spans",
            "tracing.queue_spans must be between 1 and 1048576".into(),
        ));
    }
    let batch_spans = file
        .batch_spans
        .unwrap_or(DEFAULT_BATCH_SPANS.min(queue_spans));
    if !(1..=queue_spans).contains(&batch_spans) {
        return Err(err(
            "tracing.batch_spans",
            format!("tracing.batch_spans must be between 1 and queue_spans ({queue_spans})"),
        ));
    }
    let export_interval = file
        .export_interval
        .map_or(DEFAULT_EXPORT_INTERVAL, |d| d.0);
    if !(Duration::from_millis(10)..=Duration::from_secs(600)).contains(&export_interval) {
        return Err(err(
            "tracing.export_interval",
            "tracing.export_interval must be between 10ms and 10m".into(),
        ));
    }
    let export_timeout = file.timeout.map_or(DEFAULT_EXPORT_TIMEOUT, |d| d.0);
    if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&export_timeout) {
        return Err(err(
            "tracing.timeout",
            "tracing.timeout must be between 100ms and 10m".into(),
        ));
    }
    let service_name = file
        .service_name
        .clone()
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
    if service_name.is_empty() || service_name.len() > 256 {
        return Err(err(
            "tracing.service_name",
            "tracing.service_name must be 1 to 256 bytes".into(),
        ));
    }
    Ok(Some(TracingConfig {
        endpoint,
        sampling_ratio,
        queue_spans,
        batch_spans,
        export_interval,
        export_timeout,
        service_name,
    }))
}

/// `http://host[:port][/path]`. HTTPS is refused rather than sent in clear
/// text: the collector is most often a sidecar or a node agent on a
/// private network, and TLS to it would need a CA option and a connector
/// for this one client; run the collector beside the gateway and let it
/// speak TLS onwards.
fn parse_endpoint(url: &str) -> Result<CollectorEndpoint, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("tracing.endpoint {url:?}: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "tracing.endpoint {url:?}: https is not supported; send to a collector over http (a sidecar or node agent), which can export onwards over TLS"
            ))
        }
        _ => return Err(format!("tracing.endpoint {url:?}: not an http:// URL")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("tracing.endpoint {url:?}: no host"))?;
    if authority.as_str().contains('@') {
        return Err(format!(
            "tracing.endpoint {url:?}: credentials in a URL are not used"
        ));
    }
    if uri.query().is_some() {
        return Err(format!("tracing.endpoint {url:?}: a query is not used"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err(format!("tracing.endpoint {url:?}: no host"));
    }
    // OTLP/HTTP's default port and path.
    let port = authority.port_u16().unwrap_or(4318);
    let path = match uri.path() {
        "" | "/" => "/v1/traces".to_string(),
        p => p.to_string(),
    };
    Ok(CollectorEndpoint {
        authority: authority.as_str().to_string(),
        host,
        port,
        path,
    })
}
