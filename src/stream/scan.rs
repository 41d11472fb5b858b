//! Byte-level scans over JSON text that the stream path uses instead of
//! parsing: finding a key, skipping whitespace. Searches go through memchr.

/// Is there a member `key` (given with its quotes) whose value is a string
/// of at least one character?
pub(crate) fn key_has_nonempty_string(data: &[u8], key: &[u8]) -> bool {
    let mut from = 0;
    while let Some(off) = find(&data[from..], key) {
        let at = from + off;
        from = at + 1;
        if !quote_is_unescaped(data, at) {
            continue;
        }
        let mut i = skip_json_ws(data, at + key.len());
        if data.get(i) != Some(&b':') {
            continue;
        }
        i = skip_json_ws(data, i + 1);
        if data.get(i) == Some(&b'"') && data.get(i + 1).is_some_and(|&b| b != b'"') {
            return true;
        }
    }
    false
}

/// A `"` preceded by an odd number of backslashes is inside a string.
fn quote_is_unescaped(data: &[u8], at: usize) -> bool {
    let backslashes = data[..at].iter().rev().take_while(|&&b| b == b'\\').count();
    backslashes % 2 == 0
}
pub(crate) fn skip_json_ws(data: &[u8], mut i: usize) -> usize {
    while matches!(data.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Position of the first `needle` byte.
pub(crate) fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    memchr::memchr(needle, hay)
}

/// Position of the first occurrence of `needle` (non-empty) in `hay`.
pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    memchr::memmem::find(hay, needle)
}

pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_helpers_match_naive() {
        let hay = b"abcdefghij\nklmnopqrstuvwxyz\n0123456789";
        for n in 0u8..=255 {
            for start in 0..hay.len() {
                assert_eq!(
                    find_byte(&hay[start..], n),
                    hay[start..].iter().position(|&b| b == n)
                );
            }
        }
        assert_eq!(find(hay, b"xyz\n0"), Some(24));
        assert_eq!(find(hay, b"xyz\n1"), None);
        assert_eq!(find(b"ab", b"abc"), None);
        assert_eq!(find(b"ab", b""), None);
    }
}
