//! Stable 64-bit hashing for session ids and rendezvous placement.
//!
//! `stable_hash64` is part of the gateway's external contract: its output is
//! sent to clients in `X-Routed-Session`, appears in logs and debug endpoints,
//! and decides where a session lands when the session table is full. Operators
//! correlate those values across gateway replicas, restarts and upgrades, so the
//! function must give the same answer on every platform, in every process and
//! in every future version. **Never change it.** That is why it is written out
//! here instead of borrowing `std`'s or `ahash`'s hashers, which are randomly
//! keyed per process and free to change between releases.

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The murmur3 64-bit finalizer: a bijection that spreads every input bit
/// over every output bit. FNV-1a alone leaves short inputs weak in the high
/// bits and rendezvous hashing compares whole 64-bit values.
#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// FNV-1a 64 over `bytes`, followed by the murmur3 finalizer.
///
/// Stable forever (see the module docs). Not keyed, so not collision-resistant
/// against an adversary: callers that index in-memory tables by it must hash it
/// again with a per-process random key.
pub fn stable_hash64(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET_BASIS;
    for &byte in bytes {
        h ^= u64::from(byte);
        h = h.wrapping_mul(FNV_PRIME);
    }
    fmix64(h)
}

/// Exactly 16 lowercase hex digits, zero padded: the form used in headers.
pub fn hex16(h: u64) -> String {
    format!("{h:016x}")
}

/// [`hex16`] as bytes on the stack, for a response header built per request.
pub fn hex16_bytes(h: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = DIGITS[((h >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Combines two 64-bit values into one well-mixed value; order matters.
///
/// Used for rendezvous (highest random weight) hashing, where `a` is the
/// session hash and `b` a peer's stable identity. Also stable forever, since it
/// decides a session's hash home.
#[inline]
pub fn mix64(a: u64, b: u64) -> u64 {
    // Mixing `b` first and offsetting it by the golden ratio keeps
    // mix64(x, 0) from collapsing onto fmix64(x), and the second round makes
    // every bit of both inputs matter to every output bit.
    fmix64(a ^ fmix64(b.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned outputs, cross-checked against an independent implementation.
    /// If one of these changes, X-Routed-Session values and hash homes change
    /// for every deployed session: do not "fix" the expectations.
    #[test]
    fn stable_hash64_is_pinned() {
        assert_eq!(stable_hash64(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(stable_hash64(b"a"), 0x82a2_a958_a9be_ce5b);
        assert_eq!(hex16(stable_hash64(b"session-1")), "f267abb32d450b1f");
        assert_eq!(mix64(1, 2), 0x25ab_cb5c_468f_3099);
    }

    #[test]
    fn fnv1a_core_matches_the_reference_vector() {
        // 0xaf63dc4c8601ec8c is FNV-1a 64 of "a" in the FNV reference vectors.
        assert_eq!(stable_hash64(b"a"), fmix64(0xaf63_dc4c_8601_ec8c));
    }

    #[test]
    fn hex16_is_fixed_width_lowercase() {
        assert_eq!(hex16(0), "0000000000000000");
        for h in [
            0,
            1,
            0xdead_beef,
            u64::MAX,
            0x0123_4567_89ab_cdef,
            stable_hash64(b"x"),
        ] {
            assert_eq!(&hex16_bytes(h)[..], hex16(h).as_bytes());
        }
        assert_eq!(hex16(0xABCDEF), "0000000000abcdef");
        assert_eq!(hex16(u64::MAX), "ffffffffffffffff");
    }

    #[test]
    fn mix64_depends_on_order_and_both_inputs() {
        assert_ne!(mix64(1, 2), mix64(2, 1));
        assert_ne!(mix64(1, 2), mix64(1, 3));
        assert_ne!(mix64(1, 2), mix64(0, 2));
        assert_ne!(mix64(7, 0), fmix64(7));
    }

    #[test]
    fn single_bit_changes_flip_about_half_the_output() {
        let base = stable_hash64(b"conversation-42");
        let flipped = stable_hash64(b"conversation-43");
        let distance = (base ^ flipped).count_ones();
        assert!((16..=48).contains(&distance), "distance {distance}");
    }
}
