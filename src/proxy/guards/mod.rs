//! Request guards that run before placement: API keys (`auth`), content
//! reject rules (`rules`), the include_usage rewrite (`usage`), the
//! prefix-stability transforms (`prefix`), and who counts as local for the
//! toggles.
//!
//! Where new guards go: load-based refusals (TTFT/decode-rate shedding,
//! session turn priority, the rate-limit switch) are modules here, called
//! from `Gateway::admit` between the content guards and placement.

pub mod auth;
pub mod load;
pub mod prefix;
pub mod prio;
pub mod rules;
pub mod usage;

use pingora::proxy::Session;

/// Toggles answer only a caller on this machine: the socket's peer address
/// must be exactly 127.0.0.1 or ::1. Headers (X-Forwarded-For, X-Real-IP,
/// Forwarded) are deliberately never consulted.
pub fn is_loopback_peer(session: &Session) -> bool {
    let Some(addr) = session.client_addr().and_then(|a| a.as_inet()) else {
        return false;
    };
    match addr.ip() {
        std::net::IpAddr::V4(ip) => ip == std::net::Ipv4Addr::LOCALHOST,
        std::net::IpAddr::V6(ip) => ip == std::net::Ipv6Addr::LOCALHOST,
    }
}
