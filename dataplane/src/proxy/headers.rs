//! The headers the proxy sets on every request it forwards: `X-Forwarded-For`, `X-Real-IP`,
//! `X-Forwarded-Proto`, `X-Forwarded-Host` and `X-Forwarded-Port`, replacing any the client sent.
//!
//! On the usual way, to an HTTP/1.1 upstream, they never enter the request's `HeaderMap`: the
//! HTTP/1.1 encoder skips the client's headers of these names and writes the proxy's after the
//! request's own. Five map insertions (each hashing the name, probing, and growing the map once)
//! were ~5 % of the proxy's instructions per HTTP/1.1 request and ~4 % per HTTP/2 request
//! (bench/RESULTS.md). Where the map itself is what goes out or is read — h2 upstreams, mirrored
//! copies, `proxy-set-headers` (whose values win) — they are inserted into it instead
//! ([`Forwarded::insert_into`]), and the encoder gets none.

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The names, in the order they are written (that of [`Forwarded`]'s values).
const NAMES: [&str; 5] =
    ["x-forwarded-for", "x-real-ip", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port"];

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static(NAMES[0]);
pub(crate) const X_REAL_IP: HeaderName = HeaderName::from_static(NAMES[1]);
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static(NAMES[2]);
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static(NAMES[3]);
pub(crate) const X_FORWARDED_PORT: HeaderName = HeaderName::from_static(NAMES[4]);

/// A bit per name length among [`NAMES`]: most names are ruled out by their length alone.
const LENGTHS: u64 = {
    let mut bits = 0u64;
    let mut i = 0;
    while i < NAMES.len() {
        bits |= 1 << NAMES[i].len();
        i += 1;
    }
    bits
};

/// The values of one request's forwarded headers (borrowed: the request's future holds this
/// while it waits, and five values would add 200 bytes to what is copied per request).
pub(crate) struct Forwarded<'a> {
    pub(crate) r#for: &'a HeaderValue,
    pub(crate) real_ip: &'a HeaderValue,
    pub(crate) proto: &'a HeaderValue,
    pub(crate) host: &'a HeaderValue,
    pub(crate) port: &'a HeaderValue,
}

impl Forwarded<'_> {
    fn values(&self) -> [&HeaderValue; 5] {
        [self.r#for, self.real_ip, self.proto, self.host, self.port]
    }

    /// Sets them in `headers`, replacing any of the same names.
    pub(crate) fn insert_into(&self, headers: &mut HeaderMap) {
        let names = [X_FORWARDED_FOR, X_REAL_IP, X_FORWARDED_PROTO, X_FORWARDED_HOST, X_FORWARDED_PORT];
        for (name, value) in names.into_iter().zip(self.values()) {
            headers.insert(name, value.clone());
        }
    }

    /// Writes them as HTTP/1.1 header lines.
    pub(crate) fn write(&self, dst: &mut BytesMut) {
        for (name, value) in NAMES.iter().zip(self.values()) {
            dst.extend_from_slice(name.as_bytes());
            dst.extend_from_slice(b": ");
            dst.extend_from_slice(value.as_bytes());
            dst.extend_from_slice(b"\r\n");
        }
    }
}

/// Whether `name` is one of the forwarded headers (which [`Forwarded::write`] replaces).
pub(crate) fn is_forwarded(name: &HeaderName) -> bool {
    let name = name.as_str();
    name.len() < 64 && LENGTHS & (1 << name.len()) != 0 && NAMES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    static IP: HeaderValue = HeaderValue::from_static("192.0.2.1");
    static HTTPS: HeaderValue = HeaderValue::from_static("https");
    static HOST: HeaderValue = HeaderValue::from_static("example.com");
    static PORT: HeaderValue = HeaderValue::from_static("443");

    fn sample() -> Forwarded<'static> {
        Forwarded { r#for: &IP, real_ip: &IP, proto: &HTTPS, host: &HOST, port: &PORT }
    }

    #[test]
    fn the_names_are_recognised_in_any_case_as_parsed() {
        for name in [X_FORWARDED_FOR, X_REAL_IP, X_FORWARDED_PROTO, X_FORWARDED_HOST, X_FORWARDED_PORT] {
            assert!(is_forwarded(&name), "{name}");
            // Header names are lower-cased when parsed: a client's `X-Real-IP` is this name.
            let upper = name.as_str().to_ascii_uppercase();
            assert!(is_forwarded(&HeaderName::from_bytes(upper.as_bytes()).unwrap()), "{upper}");
        }
        for name in ["x-forwarded-prefix", "x-request-id", "host", "x-forwarded", "x-real-ipx", "forwarded"] {
            assert!(!is_forwarded(&HeaderName::from_static(name)), "{name}");
        }
        let long = "x".repeat(100);
        assert!(!is_forwarded(&HeaderName::from_bytes(long.as_bytes()).unwrap()));
    }

    #[test]
    fn the_written_names_are_the_names() {
        let mut dst = BytesMut::new();
        sample().write(&mut dst);
        let written: Vec<&str> =
            std::str::from_utf8(&dst).unwrap().lines().map(|l| l.split_once(": ").unwrap().0).collect();
        assert_eq!(written, NAMES);
    }

    #[test]
    fn written_and_inserted_alike() {
        let mut dst = BytesMut::new();
        sample().write(&mut dst);
        assert_eq!(
            &dst[..],
            b"x-forwarded-for: 192.0.2.1\r\nx-real-ip: 192.0.2.1\r\nx-forwarded-proto: https\r\n\
              x-forwarded-host: example.com\r\nx-forwarded-port: 443\r\n"
        );
        let mut map = HeaderMap::new();
        map.append(X_FORWARDED_FOR, HeaderValue::from_static("1.2.3.4"));
        map.append(X_FORWARDED_FOR, HeaderValue::from_static("5.6.7.8"));
        map.insert(X_REAL_IP, HeaderValue::from_static("1.2.3.4"));
        sample().insert_into(&mut map);
        assert_eq!(map.get_all(X_FORWARDED_FOR).iter().collect::<Vec<_>>(), ["192.0.2.1"]);
        assert_eq!(map[X_REAL_IP], "192.0.2.1");
        assert_eq!(map[X_FORWARDED_PROTO], "https");
        assert_eq!(map[X_FORWARDED_HOST], "example.com");
        assert_eq!(map[X_FORWARDED_PORT], "443");
        assert_eq!(map.len(), 5);
    }
}
