//! A route's engines from Kubernetes: the ready endpoints of the
//! EndpointSlices that match a label selector, listed once, then watched.
//!
//! The protocol is the API server's list-then-watch (API concepts, "Efficient
//! detection of changes"): a LIST gives the slices and a resourceVersion; a
//! WATCH from that version streams newline-delimited events. A watch that ends
//! or breaks resumes from the last version seen, so nothing is missed and
//! nothing is listed again; only a 410 Gone (the version fell out of the
//! server's history) costs a new LIST.
//!
//! This file is the watcher: its loop, its backoff and what it reads from a
//! list or a watch stream. `source.rs` says what it watches and what it
//! sends, `slices.rs` reads the EndpointSlices into ready endpoints,
//! `client.rs` talks to the API server.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use http_body_util::{BodyExt, Limited};
use tokio::sync::mpsc::Sender;

mod client;
mod slices;
mod source;

use client::{get, refusal, slices_path, Access, Failure, SERVICE_ACCOUNT};
use slices::{Applied, SliceList, Slices};
pub use source::{Endpoint, Found, KubernetesSource, PortRef};

/// Lists the matching EndpointSlices, then watches them, forever: sends
/// `Found::Endpoints` after the list and after every change that alters the
/// ready set (not on bookmarks or no-op changes), `Found::Error` when a
/// list/watch fails (then retries with backoff 1 s doubling to 30 s). After
/// an error, the first list or watch the server accepts sends the set again,
/// unchanged or not, so the owner knows the error is over (a quiet cluster may
/// send no change for hours). Ends when the receiver is dropped.
pub async fn watch(source: KubernetesSource, out: Sender<Found>) {
    let account = source
        .service_account_dir
        .as_deref()
        .unwrap_or(Path::new(SERVICE_ACCOUNT));
    let access = match Access::for_api(source.api.as_deref(), account) {
        Ok(access) => access,
        Err(e) => {
            log::error!("kubernetes discovery {}: {e}", describe(&source));
            // Nothing to retry: the environment or the URL will not change under us.
            let _ = out.send(Found::Error(e)).await;
            out.closed().await;
            return;
        }
    };
    watch_with(source, access, out).await
}

/// The LIST's body, after its head.
const LIST_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A LIST larger than this is refused rather than held in memory.
const MAX_LIST_BYTES: usize = 64 << 20;
/// Silence on a watch longer than the server's own timeout means the connection is dead.
const WATCH_IDLE: Duration = Duration::from_secs(300);
/// One watch event; a longer line is an error rather than unbounded memory.
const MAX_LINE_BYTES: usize = 4 << 20;
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A watch the server ends sooner than this (without a failure) is resumed
/// only once this much time has passed, so a server that ends every watch
/// at once is not asked again in a tight loop.
const MIN_WATCH: Duration = Duration::from_secs(1);

fn describe(source: &KubernetesSource) -> String {
    format!("{}/{}", source.namespace, source.selector)
}

// ---- the loop ----

/// How one list or watch ended.
enum Outcome {
    /// The watch ended without a failure: watch again from where it was.
    Resume,
    /// 410 Gone: list again.
    Relist,
    Failed(String),
    /// The receiver is gone.
    Closed,
}

struct Watcher {
    source: KubernetesSource,
    access: Access,
    out: Sender<Found>,
    slices: Slices,
    /// Where the next watch starts; None: the next request is a LIST.
    version: Option<String>,
    /// The set last sent, to send only changes.
    sent: Option<Vec<Endpoint>>,
    /// An error was sent and nothing has succeeded since.
    failing: bool,
    /// The last outcome was a 410 and no event came since: a second one
    /// waits its backoff, so a server that refuses every watch is not
    /// listed in a tight loop.
    gone_again: bool,
    backoff: Duration,
}

async fn watch_with(source: KubernetesSource, access: Access, out: Sender<Found>) {
    let closed = out.clone();
    let mut watcher = Watcher {
        source,
        access,
        out,
        slices: Slices::default(),
        version: None,
        sent: None,
        failing: false,
        gone_again: false,
        backoff: BACKOFF_FIRST,
    };
    // A watch can be silent for minutes; the receiver's drop ends it at once.
    tokio::select! {
        _ = closed.closed() => {}
        _ = watcher.run() => {}
    }
}

impl Watcher {
    async fn run(&mut self) {
        loop {
            let outcome = match self.version.clone() {
                None => self.list().await,
                Some(version) => self.watch_from(version).await,
            };
            match outcome {
                Outcome::Resume => {}
                Outcome::Relist => {
                    log::info!(
                        "kubernetes discovery {}: resourceVersion expired (410), listing again",
                        describe(&self.source)
                    );
                    self.version = None;
                    if self.gone_again {
                        tokio::time::sleep(self.next_backoff()).await;
                    }
                    self.gone_again = true;
                }
                Outcome::Failed(message) => {
                    log::warn!("kubernetes discovery {}: {message}", describe(&self.source));
                    self.failing = true;
                    if self.out.send(Found::Error(message)).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(self.next_backoff()).await;
                }
                Outcome::Closed => return,
            }
        }
    }

    fn next_backoff(&mut self) -> Duration {
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        delay
    }

    /// The server answered: backoff starts over, and an error outstanding is
    /// ended by the set sent again.
    async fn answered(&mut self) -> bool {
        self.backoff = BACKOFF_FIRST;
        if self.failing {
            return self.publish(true).await;
        }
        true
    }

    /// Sends the ready set if `always` or if it changed; false once the receiver is gone.
    async fn publish(&mut self, always: bool) -> bool {
        let set = self.slices.ready_set();
        if !always && self.sent.as_ref() == Some(&set) {
            return true;
        }
        self.failing = false;
        self.sent = Some(set.clone());
        self.out.send(Found::Endpoints(set)).await.is_ok()
    }

    async fn list(&mut self) -> Outcome {
        let path = slices_path(&self.access, &self.source, None);
        let exchange = match get(&self.access, &path).await {
            Ok(e) => e,
            Err(e) => return Outcome::Failed(format!("list: {e}")),
        };
        if exchange.status != http::StatusCode::OK {
            return match refusal(exchange).await {
                Failure::Gone => Outcome::Failed("list: HTTP 410 Gone".to_string()),
                Failure::Other(e) => Outcome::Failed(format!("list: {e}")),
            };
        }
        let body = tokio::time::timeout(
            LIST_BODY_TIMEOUT,
            Limited::new(exchange.body, MAX_LIST_BYTES).collect(),
        )
        .await;
        let body = match body {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => return Outcome::Failed(format!("list: reading the body: {e}")),
            Err(_) => {
                return Outcome::Failed(format!(
                    "list: the body took over {} s",
                    LIST_BODY_TIMEOUT.as_secs()
                ))
            }
        };
        let list: SliceList = match serde_json::from_slice(&body) {
            Ok(list) => list,
            Err(e) => return Outcome::Failed(format!("list: not an EndpointSliceList: {e}")),
        };
        let items = list.items.unwrap_or_default();
        self.slices = Slices::from_list(&items, &self.source.port);
        self.version = Some(list.metadata.resource_version);
        self.backoff = BACKOFF_FIRST;
        let set_len = self.slices.ready_set().len();
        log::info!(
            "kubernetes discovery {}: {} slices, {set_len} ready endpoints",
            describe(&self.source),
            items.len()
        );
        if !self.publish(true).await {
            return Outcome::Closed;
        }
        Outcome::Resume
    }

    async fn watch_from(&mut self, version: String) -> Outcome {
        let path = slices_path(&self.access, &self.source, Some(&version));
        let started = Instant::now();
        let exchange = match get(&self.access, &path).await {
            Ok(e) => e,
            Err(e) => return Outcome::Failed(format!("watch: {e}")),
        };
        if exchange.status != http::StatusCode::OK {
            return match refusal(exchange).await {
                Failure::Gone => Outcome::Relist,
                Failure::Other(e) => Outcome::Failed(format!("watch: {e}")),
            };
        }
        if !self.answered().await {
            return Outcome::Closed;
        }
        let mut body = exchange.body;
        let mut pending = BytesMut::new();
        // Bytes of `pending` already known to hold no newline.
        let mut scanned = 0;
        loop {
            let frame = match tokio::time::timeout(WATCH_IDLE, body.frame()).await {
                Err(_) => {
                    return Outcome::Failed(format!(
                        "watch: nothing for {} s",
                        WATCH_IDLE.as_secs()
                    ))
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Outcome::Failed(format!("watch broke: {e}")),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(at) = memchr::memchr(b'\n', &pending[scanned..]) {
                let line = pending.split_to(scanned + at + 1);
                scanned = 0;
                match self.event(&line[..line.len() - 1]).await {
                    Some(outcome) => return outcome,
                    None => continue,
                }
            }
            scanned = pending.len();
            if pending.len() > MAX_LINE_BYTES {
                return Outcome::Failed(format!(
                    "watch: an event over {} MiB",
                    MAX_LINE_BYTES >> 20
                ));
            }
        }
        // A last line without its newline is cut, not complete: dropped.
        if started.elapsed() < MIN_WATCH {
            tokio::time::sleep(MIN_WATCH - started.elapsed()).await;
        }
        Outcome::Resume
    }

    /// Applies one line of a watch; Some when the watch must end.
    async fn event(&mut self, line: &[u8]) -> Option<Outcome> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        match self.slices.apply(line, &self.source.port) {
            Applied::At(version) => {
                self.gone_again = false;
                if let Some(version) = version {
                    self.version = Some(version);
                }
                if !self.publish(false).await {
                    return Some(Outcome::Closed);
                }
                None
            }
            Applied::Gone => Some(Outcome::Relist),
            Applied::Failed(e) => Some(Outcome::Failed(format!("watch: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests;
