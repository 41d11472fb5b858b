//! How a session's binding is written in the shared store, pure: the key
//! (the route and the session's 64-bit hash, never the raw id) and the
//! value (the peer's `host:port` identity and the binding's times).

/// One binding as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBinding {
    /// `host:port` as the route file names the peer: the identity every
    /// replica resolves the same way, whatever its local peer ids.
    pub peer: String,
    pub bound_at_ms: u64,
    /// 0 when the session never moved.
    pub moved_at_ms: u64,
    pub last_seen_ms: u64,
}

const VERSION: &str = "v1";

impl StoredBinding {
    pub fn encode(&self) -> String {
        format!(
            "{VERSION}|{}|{}|{}|{}",
            self.peer, self.bound_at_ms, self.moved_at_ms, self.last_seen_ms
        )
    }

    /// `None` for anything this version did not write (another version, or
    /// garbage): the caller then treats the session as unknown.
    pub fn decode(text: &str) -> Option<StoredBinding> {
        let mut parts = text.split('|');
        if parts.next()? != VERSION {
            return None;
        }
        let peer = parts.next().filter(|p| !p.is_empty())?.to_string();
        let mut number = || parts.next()?.parse::<u64>().ok();
        let (bound_at_ms, moved_at_ms, last_seen_ms) = (number()?, number()?, number()?);
        if parts.next().is_some() {
            return None;
        }
        Some(StoredBinding {
            peer,
            bound_at_ms,
            moved_at_ms,
            last_seen_ms,
        })
    }

    /// How long ago the session moved, as the session table counts it.
    pub fn moved_ago_ms(&self, now_ms: u64) -> Option<u64> {
        (self.moved_at_ms > 0).then(|| now_ms.saturating_sub(self.moved_at_ms))
    }
}

/// The key of `sid`'s binding on `route`.
pub fn binding_key(prefix: &str, route: &str, sid: u64) -> String {
    format!("{prefix}s:{route}:{sid:016x}")
}

/// The key of a content-index node of `route` (a keyed hash already).
pub fn content_key(prefix: &str, route: &str, node: u64) -> String {
    format!("{prefix}c:{route}:{node:016x}")
}

/// The key of a Responses API response id (its hash) of `route`, whose
/// value is the session that response answered (16 hex digits).
pub fn response_key(prefix: &str, route: &str, response: u64) -> String {
    format!("{prefix}r:{route}:{response:016x}")
}

/// A content-index node's value: the session whose latest request it
/// ends, at what depth, and whether it is that request's stem (the last
/// full chunk of a string still growing) rather than its end.
pub fn encode_content(session: u64, depth: usize, stem: bool) -> String {
    format!("{session:016x}:{depth}{}", if stem { ":s" } else { "" })
}

/// [`encode_content`] read back; `None` for anything else.
pub fn decode_content(text: &str) -> Option<(u64, usize, bool)> {
    let mut parts = text.split(':');
    let session = u64::from_str_radix(parts.next()?, 16).ok()?;
    let depth = parts.next()?.parse().ok()?;
    let stem = match parts.next() {
        None => false,
        Some("s") => true,
        Some(_) => return None,
    };
    parts.next().is_none().then_some((session, depth, stem))
}

/// The hash where a replica publishes its in-flight per peer of `route`.
pub fn load_key(prefix: &str, route: &str, replica: &str) -> String {
    format!("{prefix}load:{route}:{replica}")
}

/// The live sessions a replica publishes for `route` (hashes only).
pub fn live_key(prefix: &str, route: &str, replica: &str) -> String {
    format!("{prefix}live:{route}:{replica}")
}

/// The sorted set of replicas that published `route`'s load, by time.
pub fn replicas_key(prefix: &str, route: &str) -> String {
    format!("{prefix}replicas:{route}")
}

/// The sorted set of `route`'s recent first placements, by claim time.
pub fn claims_key(prefix: &str, route: &str) -> String {
    format!("{prefix}claims:{route}")
}

/// A first placement as the other replicas read it back: who claimed it,
/// on which peer (`host:port`), for how many prompt tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub replica: String,
    pub peer: String,
    pub tokens: u64,
}

impl Claim {
    /// The member in [`claims_key`]'s set: the session's hash keeps two
    /// claims of one replica on one peer apart.
    pub fn encode(&self, sid: u64) -> String {
        format!("{} {sid:016x} {} {}", self.replica, self.peer, self.tokens)
    }

    /// `None` for anything [`encode`](Self::encode) did not write.
    pub fn decode(text: &str) -> Option<Claim> {
        let mut parts = text.split(' ');
        let replica = parts.next().filter(|r| !r.is_empty())?.to_string();
        u64::from_str_radix(parts.next()?, 16).ok()?;
        let peer = parts.next().filter(|p| !p.is_empty())?.to_string();
        let tokens = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Claim {
            replica,
            peer,
            tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_round_trips_and_foreign_members_are_refused() {
        let c = Claim {
            replica: "00000000000000aa".into(),
            peer: "10.0.0.7:8000".into(),
            tokens: 12_000,
        };
        let member = c.encode(0xbeef);
        assert_eq!(
            member,
            "00000000000000aa 000000000000beef 10.0.0.7:8000 12000"
        );
        assert_eq!(Claim::decode(&member), Some(c));
        for bad in [
            "",
            "r 00ff h:1",
            "r zz h:1 5",
            "r 00ff  5",
            "r 00ff h:1 x",
            "r 00ff h:1 5 6",
        ] {
            assert_eq!(Claim::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_binding_round_trips_and_foreign_values_are_refused() {
        let b = StoredBinding {
            peer: "10.0.0.7:8000".into(),
            bound_at_ms: 1_700_000_000_000,
            moved_at_ms: 0,
            last_seen_ms: 1_700_000_000_500,
        };
        assert_eq!(StoredBinding::decode(&b.encode()), Some(b.clone()));
        assert_eq!(b.moved_ago_ms(1_700_000_001_000), None, "never moved");
        let moved = StoredBinding {
            moved_at_ms: 1_700_000_000_400,
            ..b
        };
        assert_eq!(moved.moved_ago_ms(1_700_000_001_000), Some(600));
        for bad in [
            "",
            "v2|h:1|1|2|3",
            "v1||1|2|3",
            "v1|h:1|x|2|3",
            "v1|h:1|1|2",
            "v1|h:1|1|2|3|4",
        ] {
            assert_eq!(StoredBinding::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn content_values_round_trip() {
        for (session, depth, stem) in [(1u64, 3usize, false), (u64::MAX, 1024, true)] {
            let text = encode_content(session, depth, stem);
            assert_eq!(decode_content(&text), Some((session, depth, stem)));
        }
        for bad in ["", "zz:1", "01:x", "01:2:q", "01:2:s:extra"] {
            assert_eq!(decode_content(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_carry_the_hash_not_the_id() {
        assert_eq!(
            binding_key("llmgw:", "chat", 0xdead_beef),
            "llmgw:s:chat:00000000deadbeef"
        );
        assert_eq!(load_key("p:", "chat", "r1"), "p:load:chat:r1");
        assert_eq!(replicas_key("p:", "chat"), "p:replicas:chat");
    }
}
