//! OpenTelemetry traces: one span per request (`span.rs`), sent over
//! OTLP/HTTP with protobuf bodies (`proto.rs`) to the collector that
//! gateway.yaml's `tracing:` names, off the request path.
//!
//! The request path only calls [`Exporter::enqueue`], which never waits:
//! spans go through a bounded channel (`queue_spans`) and a full one drops
//! the span, counted in `llm_gateway_trace_spans_total{result="dropped"}`,
//! as the access log (`accesslog/`) does with its lines. The background
//! service ([`ExportService`]) takes them in batches of up to
//! `batch_spans`, or what came within `export_interval`, and POSTs each as
//! one `ExportTraceServiceRequest`, bounded by `timeout`; a collector that
//! is down, slow or stalled costs the requests nothing but the spans that
//! do not fit while it holds the exporter. Each queued span holds a
//! `lifecycle::PendingOutput`, so the drain waits for the last ones
//! (bounded) before the process exits, and while draining a batch goes
//! without waiting for the interval.
//!
//! Which requests have a span is decided when the request arrives
//! (`trace_context.rs` `Sampler`): the client's sampled flag for a trace
//! it continues, the sampling ratio for one the gateway starts.

pub mod proto;
pub mod span;

use crate::config::{CollectorEndpoint, TracingConfig};
use crate::lifecycle::PendingOutput;
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::IntCounter;
use proto::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TryRecvError, error::TrySendError};

/// How spans ended.
struct SpanCounters {
    exported: IntCounter,
    dropped: IntCounter,
    failed: IntCounter,
}

impl SpanCounters {
    fn new() -> Self {
        let spans = &crate::metrics::metrics().trace_spans;
        SpanCounters {
            exported: spans.with_label_values(&["exported"]),
            dropped: spans.with_label_values(&["dropped"]),
            failed: spans.with_label_values(&["failed"]),
        }
    }
}

/// A span in the channel, keeping the process from exiting before it is
/// sent (`lifecycle::wait_for_output`).
struct Queued {
    span: proto::Span,
    _pending: PendingOutput,
}

/// The span exporter of the process: one, made by `server::run` when
/// gateway.yaml has `tracing:`.
pub struct Exporter {
    config: TracingConfig,
    tx: mpsc::Sender<Queued>,
    rx: parking_lot::Mutex<Option<mpsc::Receiver<Queued>>>,
    counters: SpanCounters,
}

impl Exporter {
    pub fn new(config: TracingConfig) -> Arc<Exporter> {
        let (tx, rx) = mpsc::channel(config.queue_spans);
        Arc::new(Exporter {
            config,
            tx,
            rx: parking_lot::Mutex::new(Some(rx)),
            counters: SpanCounters::new(),
        })
    }

    /// Queues `span` for the exporter without waiting; a full queue drops it.
    pub fn enqueue(&self, span: proto::Span) {
        let queued = Queued {
            span,
            _pending: PendingOutput::new(),
        };
        match self.tx.try_send(queued) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.counters.dropped.inc(),
            Err(TrySendError::Closed(_)) => self.counters.failed.inc(),
        }
    }

    /// The resource and scope every batch is sent under.
    fn request(&self, spans: Vec<proto::Span>) -> proto::ExportTraceServiceRequest {
        let resource = proto::Resource {
            attributes: vec![
                proto::text("service.name", self.config.service_name.as_str()),
                proto::text("service.version", env!("CARGO_PKG_VERSION")),
            ],
            ..Default::default()
        };
        let scope = proto::InstrumentationScope {
            name: "llm-gateway".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        proto::ExportTraceServiceRequest {
            resource_spans: vec![proto::ResourceSpans {
                resource: Some(resource),
                scope_spans: vec![proto::ScopeSpans {
                    scope: Some(scope),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }
}

/// The background service that sends the queued spans. It keeps running
/// through SIGTERM, so the spans of requests that finish during the drain
/// still go out.
pub struct ExportService(pub Arc<Exporter>);

#[async_trait]
impl BackgroundService for ExportService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let Some(rx) = self.0.rx.lock().take() else {
            return;
        };
        log::info!(
            "tracing: spans to {} (sampling ratio {})",
            self.0.config.endpoint,
            self.0.config.sampling_ratio
        );
        run(&self.0, rx).await;
    }
}

/// How often a batch that waits for its interval looks at the queue (full
/// enough: it goes) and whether the drain has begun (it then goes at once).
const DRAIN_CHECK: Duration = Duration::from_millis(50);

/// Batches and sends until every sender is gone.
async fn run(exporter: &Exporter, mut rx: mpsc::Receiver<Queued>) {
    let config = &exporter.config;
    let mut link: Option<Link> = None;
    let mut failing = false;
    let mut batch: Vec<Queued> = Vec::with_capacity(config.batch_spans);
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        batch.push(first);
        // The rest of the batch is collected by looking at the queue every
        // `DRAIN_CHECK`, not by awaiting each span: a task that awaits the
        // queue is woken by every span sent, a wake-up (and a timer) per
        // request; one that sleeps is woken per batch.
        let deadline = tokio::time::Instant::now() + config.export_interval;
        loop {
            let mut closed = false;
            while batch.len() < config.batch_spans {
                match rx.try_recv() {
                    Ok(queued) => batch.push(queued),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            let now = tokio::time::Instant::now();
            if closed
                || batch.len() >= config.batch_spans
                || now >= deadline
                || crate::lifecycle::is_draining()
            {
                break;
            }
            tokio::time::sleep((deadline - now).min(DRAIN_CHECK)).await;
        }
        let count = batch.len() as u64;
        let spans = batch
            .iter_mut()
            .map(|q| std::mem::take(&mut q.span))
            .collect();
        let body = Bytes::from(exporter.request(spans).encode_to_vec());
        let sent = tokio::time::timeout(
            config.export_timeout,
            post(&mut link, &config.endpoint, body),
        )
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", config.export_timeout)));
        match sent {
            Ok(()) => {
                exporter.counters.exported.inc_by(count);
                if failing {
                    log::info!("tracing: the collector takes spans again");
                }
                failing = false;
            }
            Err(why) => {
                // A broken or stalled connection is not used again.
                link = None;
                exporter.counters.failed.inc_by(count);
                if !failing {
                    log::warn!(
                        "tracing: export to {} failed ({why}); spans are counted as failed until one succeeds",
                        config.endpoint
                    );
                }
                failing = true;
            }
        }
        // The spans' `PendingOutput`s go only now that they are out.
        batch.clear();
    }
}

/// One kept-alive HTTP/1.1 connection to the collector. hyper's client
/// (already the gateway's, for the Kubernetes API) rather than Pingora's
/// connector, which is made for proxying a downstream session, not for a
/// background POST; its connection task is aborted with the link, so a
/// collector that stalls holds no socket once its export timed out.
struct Link {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The collector's answer body, read for its end only.
const MAX_ANSWER_BYTES: usize = 64 << 10;

async fn connect(endpoint: &CollectorEndpoint) -> Result<Link, String> {
    let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream.set_nodelay(true).ok();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Link { sender, task })
}

/// POSTs one batch on the kept connection, connecting first if there is
/// none (or it was closed); `Ok` when the collector answered 2xx.
async fn post(
    link: &mut Option<Link>,
    endpoint: &CollectorEndpoint,
    body: Bytes,
) -> Result<(), String> {
    if link.as_ref().is_none_or(|l| l.sender.is_closed()) {
        *link = Some(connect(endpoint).await?);
    }
    let Some(open) = link.as_mut() else {
        return Err("no connection".into());
    };
    open.sender
        .ready()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let request = http::Request::post(endpoint.path.as_str())
        .header(http::header::HOST, endpoint.authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .header(http::header::USER_AGENT, "llm-gateway")
        .body(Full::new(body))
        .map_err(|e| format!("building the request: {e}"))?;
    let answer = open
        .sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = answer.status();
    // Read to its end, so that the connection can carry the next batch.
    let read = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await;
    if !status.is_success() {
        let text: String = read
            .map(|b| {
                String::from_utf8_lossy(&b.to_bytes())
                    .chars()
                    .take(200)
                    .collect()
            })
            .unwrap_or_default();
        return Err(format!("collector answered {status}: {text}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(queue_spans: usize) -> TracingConfig {
        TracingConfig {
            endpoint: CollectorEndpoint {
                host: "127.0.0.1".into(),
                port: 9,
                authority: "127.0.0.1:9".into(),
                path: "/v1/traces".into(),
            },
            sampling_ratio: 1.0,
            queue_spans,
            batch_spans: 1,
            export_interval: Duration::from_millis(10),
            export_timeout: Duration::from_secs(1),
            service_name: "svc".into(),
        }
    }

    /// An exporter that does not keep up: the request path never waits,
    /// the spans past the queue's bound are dropped and counted.
    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let exporter = Exporter::new(config(2));
        let dropped = exporter.counters.dropped.get();
        let started = std::time::Instant::now();
        for _ in 0..5 {
            exporter.enqueue(proto::Span::default());
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(exporter.counters.dropped.get() - dropped, 3);
        // Control: the two that fitted are there for the service.
        let mut rx = exporter.rx.lock().take().expect("the receiver");
        assert!(rx.try_recv().is_ok() && rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_batch_is_one_request_under_the_service_name() {
        let exporter = Exporter::new(config(4));
        let span = proto::Span {
            name: "POST chat".into(),
            ..Default::default()
        };
        let bytes = exporter.request(vec![span.clone(), span]).encode_to_vec();
        let back = proto::ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
        let [resource_spans] = back.resource_spans.as_slice() else {
            panic!("one resource: {back:?}");
        };
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .and_then(|kv| kv.value.clone()?.value);
        assert_eq!(
            service,
            Some(proto::any_value::Value::StringValue("svc".into()))
        );
        assert_eq!(resource_spans.scope_spans[0].spans.len(), 2);
    }
}
