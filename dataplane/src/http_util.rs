//! Small pieces every layer shares: HTTP text handling (cookies, percent-encoding, request host
//! names) and the stable hash behind affinity cookies and hash rings.

use std::borrow::Cow;

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

/// Lower-cases a request host and strips the port (also `[v6]:port`) and a trailing dot.
/// Borrows when nothing needs to change (the common case).
pub fn normalize_host(raw: &str) -> Cow<'_, str> {
    let host = if let Some(v6) = raw.strip_prefix('[') {
        // `[::1]:8080` → `[::1]`: keep the brackets, they never match a host name anyway.
        match v6.find(']') {
            Some(end) => &raw[..end + 2],
            None => raw,
        }
    } else {
        match raw.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => raw,
        }
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// FNV-1a over `bytes`, finished with splitmix64: stable across processes, builds and
/// machines (affinity cookies and hash rings must agree between replicas).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
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
