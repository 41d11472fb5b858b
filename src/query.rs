//! Query-string parameters, read with form_urlencoded.

use std::borrow::Cow;

/// The first value of parameter `key` in `query` (the text after `?`),
/// decoded.
pub fn param<'a>(query: &'a str, key: &str) -> Option<Cow<'a, str>> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// Whether `query` has `key=1`.
pub fn flag(query: &str, key: &str) -> bool {
    form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == key && v == "1")
}

/// The `name=value` pieces of `query` as written, not decoded. Split by
/// hand for the readers that must keep the bytes form_urlencoded would
/// change (it decodes to UTF-8 lossily, reads `+` as a space and writes a
/// bare `b` back as `b=`): the URI as logged, and a session id hashed byte
/// for byte as its header would be.
pub fn raw_pieces(query: &str) -> impl Iterator<Item = &str> {
    query.split('&')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_value_decoded_flags_and_raw_pieces() {
        let q = "on=1&ms=100&ttl=1s&sid=a%20b&on=0&all=1&b";
        assert_eq!(param(q, "on").as_deref(), Some("1"));
        assert_eq!(param(q, "ttl").as_deref(), Some("1s"));
        assert_eq!(param(q, "sid").as_deref(), Some("a b"));
        assert_eq!(param(q, "reset"), None);
        assert!(flag(q, "all") && !flag(q, "ms") && !flag("", "all"));
        assert_eq!(raw_pieces(q).nth(3), Some("sid=a%20b"));
        assert_eq!(raw_pieces(q).last(), Some("b"));
    }
}
