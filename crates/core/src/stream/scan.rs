//! Byte-level scans over JSON text that the stream path uses instead of
//! parsing: finding a key and its value. Searches go through memchr.

use memchr::memmem::{Finder, FinderRev};

use crate::json_bytes::{quote_is_unescaped, skip_ws};

/// A JSON key (its quotes included) with its searchers built once: building
/// a memmem searcher costs more than running it over an SSE frame, and the
/// stream path looks for the same few keys in every frame.
pub(crate) struct Key(Finder<'static>, FinderRev<'static>);

impl Key {
    pub(crate) fn new(name: &str) -> Self {
        let quoted = format!("\"{name}\"");
        Key(
            Finder::new(quoted.as_bytes()).into_owned(),
            FinderRev::new(quoted.as_bytes()).into_owned(),
        )
    }
}

/// Where the value of the last member `key` starts (as [`key_values`]
/// reads members), searched from the end.
pub(crate) fn last_key_value(data: &[u8], key: &Key) -> Option<usize> {
    let len = key.1.needle().len();
    let mut end = data.len();
    while let Some(at) = key.1.rfind(&data[..end]) {
        if quote_is_unescaped(data, at) {
            let i = skip_ws(data, at + len);
            if data.get(i) == Some(&b':') {
                return Some(skip_ws(data, i + 1));
            }
        }
        // Overlapping matches too, as forwards.
        end = at + len - 1;
    }
    None
}

/// For every occurrence of `key` that is a key, where it is and where its
/// value starts (past the colon and any whitespace): a match whose opening
/// quote is escaped is inside a string, and one not followed by a colon is
/// a value. Does not know which object a key belongs to.
pub(crate) fn key_values<'a>(
    data: &'a [u8],
    key: &'a Key,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    // Overlapping matches too (the key's quotes are its own prefix and
    // suffix), so a malformed frame reads as it always has.
    let mut from = 0;
    std::iter::from_fn(move || {
        let at = from + key.0.find(data.get(from..)?)?;
        from = at + 1;
        Some(at)
    })
    .filter_map(move |at| Some((at, value_after_key(data, at, key)?)))
}

/// Where the value starts when the match of `key` at `at` is a key.
fn value_after_key(data: &[u8], at: usize, key: &Key) -> Option<usize> {
    if !quote_is_unescaped(data, at) {
        return None;
    }
    let i = skip_ws(data, at + key.0.needle().len());
    (data.get(i) == Some(&b':')).then(|| skip_ws(data, i + 1))
}

fn is_nonempty_string(data: &[u8], i: usize) -> bool {
    data.get(i) == Some(&b'"') && data.get(i + 1).is_some_and(|&b| b != b'"')
}

/// Where the first member `key` whose value is a non-empty string is.
pub(crate) fn first_nonempty_string(data: &[u8], key: &Key) -> Option<usize> {
    key_values(data, key)
        .find(|&(_, i)| is_nonempty_string(data, i))
        .map(|(at, _)| at)
}

/// Whether the bytes at `at` are member `key` with a non-empty string
/// value: the check [`first_nonempty_string`] makes, at one place.
pub(crate) fn nonempty_string_at(data: &[u8], at: usize, key: &Key) -> bool {
    data.get(at..)
        .is_some_and(|rest| rest.starts_with(key.0.needle()))
        && value_after_key(data, at, key).is_some_and(|i| is_nonempty_string(data, i))
}

/// Is there a member `key` whose value is an object?
pub(crate) fn key_has_object(data: &[u8], key: &Key) -> bool {
    key_values(data, key).any(|(_, i)| data.get(i) == Some(&b'{'))
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

    fn has_nonempty_string(data: &[u8], key: &Key) -> bool {
        first_nonempty_string(data, key).is_some()
    }

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

    #[test]
    fn keys_are_found_only_as_keys() {
        let usage = Key::new("usage");
        assert!(key_has_object(br#"{"usage" : {"a":1}}"#, &usage));
        assert!(key_has_object(br#"{"usage":null,"usage":{}}"#, &usage));
        assert!(!key_has_object(br#"{"usage":null}"#, &usage));
        assert!(!key_has_object(br#"{"x":"\"usage\":{"}"#, &usage));
        assert!(!key_has_object(br#"["usage",{}]"#, &usage));
        let content = Key::new("content");
        assert!(has_nonempty_string(br#"{"content":"x"}"#, &content));
        assert!(!has_nonempty_string(br#"{"content":""}"#, &content));
        assert!(!has_nonempty_string(
            br#"{"a":"\"content\":\"y"}"#,
            &content
        ));
    }
}
