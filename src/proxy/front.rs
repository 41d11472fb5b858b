//! The proxy service's application: each accepted connection wrapped in a
//! [`ClientStream`] (the head deadline, the idle wait, the engine's silence:
//! `conn/`) before Pingora's own HTTP loop serves it with the [`Gateway`].

use crate::proxy::conn::ClientStream;
use crate::proxy::Gateway;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{Stream, ALPN};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use std::sync::Arc;
use std::time::Duration;

/// The proxy service's application: every accepted connection is wrapped
/// in a [`ClientStream`] and handed to Pingora's own HTTP loop unchanged.
pub struct Front {
    proxy: Arc<HttpProxy<Gateway>>,
    header_timeout: Duration,
    /// Cleartext h2 with prior knowledge is served (gateway.yaml `h2c`).
    h2c: bool,
}

impl Front {
    pub fn new(proxy: HttpProxy<Gateway>, header_timeout: Duration, h2c: bool) -> Self {
        Front {
            proxy: Arc::new(proxy),
            header_timeout,
            h2c,
        }
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the connection speaks HTTP/2: h2 chosen by ALPN, or, with h2c
/// on, the client's first bytes are the h2 preface (peeked, as Pingora
/// peeks them again to choose its own loop). `None`: the client sent too
/// little to tell within `header_timeout`, and the connection is closed.
/// The peek reads under no wrapper, so unbounded it held a client that
/// sent a few bytes and stalled for ever (the review of issue 44).
async fn speaks_h2(stream: &mut Stream, h2c: bool, header_timeout: Duration) -> Option<bool> {
    if matches!(stream.selected_alpn_proto(), Some(ALPN::H2)) {
        return Some(true);
    }
    if !h2c {
        return Some(false);
    }
    let mut preface = [0u8; H2_PREFACE.len()];
    let peeked = tokio::time::timeout(header_timeout, stream.try_peek(&mut preface))
        .await
        .ok()?;
    Some(matches!(peeked, Ok(true)) && preface == H2_PREFACE)
}

#[async_trait]
impl ServerApp for Front {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let mut stream = stream;
        if speaks_h2(&mut stream, self.h2c, self.header_timeout).await? {
            // The wrapper's deadlines are per HTTP/1 head, one request at a
            // time; an h2 connection carries many streams at once, each
            // head a HEADERS frame the h2 codec bounds itself.
            return self.proxy.process_new(stream, shutdown).await;
        }
        let guarded: Stream = Box::new(ClientStream::new(stream, self.header_timeout));
        self.proxy.process_new(guarded, shutdown).await
    }

    async fn cleanup(&self) {
        // Pingora's own shutdown: wakes keep-alive connections waiting for
        // a next request so they close.
        ServerApp::cleanup(&*self.proxy).await
    }
}
