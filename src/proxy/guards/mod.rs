//! Request guards that run before placement: API keys (`auth`), the
//! tenant and its budgets (`tenant`), content reject rules (`rules`), the load gates (`gates`, with the turn's
//! priority bucket from `prio`), and who counts as local for the toggles.
//! The body's rewrites are not guards: they are in
//! `proxy::request::rewrites`.
//!
//! Where new guards go: load-based refusals (TTFT/decode-rate shedding,
//! session turn priority, the rate-limit switch) are modules here, called
//! from `Gateway::place` after the content guards and the rewrites, before
//! placement.

pub mod auth;
pub mod gates;
pub mod prio;
pub mod rules;
pub mod tenant;

use pingora::proxy::Session;

/// Toggles answer only a caller on this machine: the socket's peer address
/// must be exactly 127.0.0.1 or ::1 (or `::ffff:127.0.0.1`, which is how a
/// dual-stack `[::]` listener sees 127.0.0.1; not the rest of 127/8 in any
/// form). Headers (X-Forwarded-For, X-Real-IP, Forwarded) are
/// deliberately never consulted.
pub fn is_loopback_peer(session: &Session) -> bool {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .is_some_and(|a| is_loopback_ip(a.ip()))
}

fn is_loopback_ip(ip: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match ip {
        IpAddr::V4(ip) => ip == Ipv4Addr::LOCALHOST,
        IpAddr::V6(ip) => {
            ip == Ipv6Addr::LOCALHOST || ip.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_loopback_ip;

    #[test]
    fn only_127_0_0_1_and_1_are_loopback_in_any_spelling() {
        for yes in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback_ip(yes.parse().unwrap()), "{yes}");
        }
        for no in [
            "127.0.0.2",
            "::ffff:127.0.0.2",
            "::127.0.0.1",
            "0.0.0.0",
            "::",
            "10.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_loopback_ip(no.parse().unwrap()), "{no}");
        }
    }
}
