//! Small pieces of HTTP text handling shared by the proxy's features.

use http::header::{COOKIE, HeaderMap};

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// Percent-encodes everything but unreserved characters (RFC 3986), as nginx's
/// `$escaped_request_uri` and `$ssl_client_escaped_cert` do.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn cookies_and_escapes() {
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("a=1; sid=xyz"));
        h.append(COOKIE, HeaderValue::from_static("route=42"));
        assert_eq!(cookie(&h, "sid"), Some("xyz"));
        assert_eq!(cookie(&h, "route"), Some("42"));
        assert_eq!(cookie(&h, "x"), None);
        assert_eq!(percent_encode("a b\n+/=~"), "a%20b%0A%2B%2F%3D~");
    }
}
