//! The process logger: env_logger, with two adjustments for Pingora's own
//! lines.
//!
//! - Pingora's debug and trace logs print whole request headers, which
//!   carry session ids and API keys: they stay capped at info unless
//!   `LLM_GATEWAY_UNSAFE_PINGORA_DEBUG=1`.
//! - Pingora logs an ERROR for every connection whose request head was cut
//!   short (the client closed or reset it, or `client_header_timeout`
//!   closed it, see `proxy/conn/`). Any client can cause one per
//!   connection, without a key, so they would flood the log and drown the
//!   errors someone should look at: they are logged at debug instead, with
//!   a fixed text (Pingora's has nothing the operator needs).

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Where the demoted lines are logged.
const CONN_TARGET: &str = "llm_gateway::proxy::conn";

pub fn init() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    builder.format_timestamp_millis();
    let unsafe_debug = std::env::var("LLM_GATEWAY_UNSAFE_PINGORA_DEBUG").ok();
    if !unsafe_debug_wanted(unsafe_debug.as_deref()) {
        for module in ["pingora_proxy", "pingora_core", "pingora_http"] {
            builder.filter_module(module, LevelFilter::Info);
        }
    }
    let inner = builder.build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Demote { inner })).is_ok() {
        log::set_max_level(max);
    }
}

/// Only an explicit yes turns the unsafe logs on: `0`, `false` or an empty
/// value must keep them off.
fn unsafe_debug_wanted(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

struct Demote {
    inner: env_logger::Logger,
}

impl Log for Demote {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.inner.matches(record) {
            return;
        }
        let Some(why) = cut_head(record.level(), record.target(), record) else {
            return self.inner.log(record);
        };
        let metadata = Metadata::builder()
            .level(Level::Debug)
            .target(CONN_TARGET)
            .build();
        if self.inner.enabled(&metadata) {
            self.inner.log(
                &Record::builder()
                    .metadata(metadata)
                    .args(format_args!(
                        "client connection ended inside a request head: {why}"
                    ))
                    .build(),
            );
        }
    }

    fn flush(&self) {
        self.inner.flush()
    }
}

/// Why, when `record` is Pingora's ERROR for a request head cut short
/// (`HttpProxy::handle_new_request`: "Fail to proxy: … while reading request
/// headers …"); None for every other line.
fn cut_head(level: Level, target: &str, record: &Record<'_>) -> Option<&'static str> {
    if level != Level::Error || !target.starts_with("pingora_proxy") {
        return None;
    }
    classify(&record.args().to_string())
}

fn classify(message: &str) -> Option<&'static str> {
    if !message.starts_with("Fail to proxy:") || !message.contains("while reading request headers")
    {
        return None;
    }
    Some(if message.contains(crate::proxy::conn::HEADER_TIMEOUT) {
        "client_header_timeout"
    } else if message.contains("ConnectionClosed") {
        "closed by the client"
    } else {
        "read error"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_or_true_turns_the_unsafe_pingora_logs_on() {
        for on in ["1", "true", "TRUE"] {
            assert!(unsafe_debug_wanted(Some(on)), "{on}");
        }
        for off in ["0", "false", "", "no", "yes please"] {
            assert!(!unsafe_debug_wanted(Some(off)), "{off:?}");
        }
        assert!(!unsafe_debug_wanted(None));
    }

    #[test]
    fn cut_heads_are_recognised_and_nothing_else() {
        // Pingora 0.9.1's texts, as `handle_new_request` formats them.
        let closed = " Fail to proxy: Downstream ConnectionClosed context: while reading request headers, bytes already read: 12, downstream session type: HTTP/1.1";
        assert_eq!(classify(closed.trim_start()), Some("closed by the client"));
        let timeout = format!("Fail to proxy: Downstream ReadError context: while reading request headers cause: {}, downstream session type: HTTP/1.1", crate::proxy::conn::HEADER_TIMEOUT);
        assert_eq!(classify(&timeout), Some("client_header_timeout"));
        let reset = "Fail to proxy: Downstream ReadError context: while reading request headers cause: Connection reset by peer (os error 104)";
        assert_eq!(classify(reset), Some("read error"));
        for other in [
            "Fail to proxy: Upstream ConnectRefused context: peer e0",
            "failed to send error response to downstream: x",
            "while reading request headers",
        ] {
            assert_eq!(classify(other), None, "{other}");
        }
    }
}
