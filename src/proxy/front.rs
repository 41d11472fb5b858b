//! The proxy service's application: each accepted connection wrapped in a
//! [`ClientStream`] (the head deadline, the idle wait, the engine's silence:
//! `conn/`) before Pingora's own HTTP loop serves it with the [`Gateway`].

use crate::proxy::conn::ClientStream;
use crate::proxy::Gateway;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use std::sync::Arc;
use std::time::Duration;

/// The proxy service's application: every accepted connection is wrapped
/// in a [`ClientStream`] and handed to Pingora's own HTTP loop unchanged.
pub struct Front {
    proxy: Arc<HttpProxy<Gateway>>,
    header_timeout: Duration,
}

impl Front {
    pub fn new(proxy: HttpProxy<Gateway>, header_timeout: Duration) -> Self {
        Front {
            proxy: Arc::new(proxy),
            header_timeout,
        }
    }
}

#[async_trait]
impl ServerApp for Front {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let guarded: Stream = Box::new(ClientStream::new(stream, self.header_timeout));
        self.proxy.process_new(guarded, shutdown).await
    }

    async fn cleanup(&self) {
        // Pingora's own shutdown: wakes keep-alive connections waiting for
        // a next request so they close.
        ServerApp::cleanup(&*self.proxy).await
    }
}
