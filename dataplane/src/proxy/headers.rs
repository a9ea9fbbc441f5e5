//! The proxy's own ground: what it does to the headers of every request, whatever the route.
//!
//! - Hop-by-hop headers never cross the proxy ([`strip_hop_by_hop`]).
//! - Each request has an `X-Request-ID`, the client's or a new one ([`request_id`]).
//! - The request as the client sent it ([`RequestView`]) fills the templates of `auth-url`,
//!   `auth-signin` and `mirror-target`, parsed with the table ([`expand`]).
//! - The proxy sets `X-Forwarded-For`, `X-Real-IP`, `X-Forwarded-Proto`, `X-Forwarded-Host` and
//!   `X-Forwarded-Port` on every request it forwards, replacing any the client sent
//!   ([`Forwarded`]).
//!
//! On the usual way, to an HTTP/1.1 upstream, the forwarded headers never enter the request's
//! `HeaderMap`: the HTTP/1.1 encoder skips the client's headers of these names and writes the
//! proxy's after the request's own. Five map insertions (each hashing the name, probing, and
//! growing the map once) were ~5 % of the proxy's instructions per HTTP/1.1 request and ~4 % per
//! HTTP/2 request (bench/RESULTS.md). Where the map itself is what goes out or is read — h2
//! upstreams, mirrored copies, `proxy-set-headers` (whose values win) — they are inserted into it
//! instead ([`Forwarded::insert_into`]), and the encoder gets none.

use bytes::{Bytes, BytesMut};
use http::header::{
    CONNECTION, Entry, HOST, HeaderMap, HeaderName, HeaderValue, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE,
    TRANSFER_ENCODING, UPGRADE,
};

use crate::http_util::percent_encode;
use crate::vars::{Part, RequestView, Template, Var};

/// `x-request-id`.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

// === forwarded headers ===

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

// === hop-by-hop headers ===

/// The tokens of the `Connection` headers.
pub(crate) fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Which hop-by-hop header `name` is (never crossing the proxy, those listed in a request's
/// `Connection` header aside): its bit for [`strip_hop_by_hop`], `Upgrade` and `TE` last.
fn hop_by_hop_bit(name: &HeaderName) -> u8 {
    // References to the constants: an array of the names themselves would be built and dropped
    // at each call. (A `match` on the name's string was measured slower: standard names compare
    // by a tag.)
    let names: [&HeaderName; 8] = [
        &CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &TRANSFER_ENCODING,
        &PROXY_AUTHORIZATION,
        &PROXY_AUTHENTICATE,
        &UPGRADE,
        &TE,
    ];
    names.iter().position(|h| *h == name).map_or(0, |i| 1 << i)
}

/// Whether `name` is a hop-by-hop header that never crosses the proxy (those listed in a
/// request's `Connection` header aside).
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    hop_by_hop_bit(name) != 0
}

/// Removes hop-by-hop headers; `keep_upgrade` keeps `Upgrade`, `keep_te_trailers` keeps
/// `te: trailers` (gRPC over h2).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool, keep_te_trailers: bool) {
    // Usually there is none, or only `Connection`: one pass over the names finds which are
    // there, and only those are looked up again to be removed.
    let present = headers.keys().fold(0u8, |bits, name| bits | hop_by_hop_bit(name));
    if present == 0 {
        return;
    }
    // Headers named by Connection, other than the ones removed below anyway. Rare, so the Vec
    // only allocates when a client actually lists something.
    // Almost always `Connection: keep-alive` (or `close`): nothing listed, no token parsing.
    let lists_names = || {
        headers.get_all(CONNECTION).iter().any(|v| {
            let v = v.as_bytes();
            !(v.eq_ignore_ascii_case(b"keep-alive")
                || v.eq_ignore_ascii_case(b"close")
                || v.eq_ignore_ascii_case(b"upgrade"))
        })
    };
    if present & 1 != 0 && lists_names() {
        let listed: Vec<HeaderName> = connection_tokens(headers)
            .filter(|t| {
                !t.eq_ignore_ascii_case("close")
                    && !t.eq_ignore_ascii_case("keep-alive")
                    && !t.eq_ignore_ascii_case("upgrade")
            })
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in listed {
            if name == X_FORWARDED_FOR || name == X_REAL_IP || name == X_REQUEST_ID || name == HOST {
                continue; // listing them must not strip what the proxy sets
            }
            headers.remove(name);
        }
    }
    let always = [
        &CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &TRANSFER_ENCODING,
        &PROXY_AUTHORIZATION,
        &PROXY_AUTHENTICATE,
    ];
    for (i, name) in always.into_iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if !keep_upgrade && present & (1 << 6) != 0 {
        headers.remove(UPGRADE);
    }
    if present & (1 << 7) != 0 {
        let trailers = keep_te_trailers
            && headers
                .get_all(TE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
        headers.remove(TE);
        if trailers {
            headers.insert(TE, HeaderValue::from_static("trailers"));
        }
    }
}

// === X-Request-ID ===

/// Keeps a non-empty incoming `X-Request-ID`, else generates and sets one; returns it.
pub(crate) fn request_id(headers: &mut HeaderMap) -> HeaderValue {
    // One lookup (the name hashed once) whether it is kept or set.
    match headers.entry(X_REQUEST_ID) {
        Entry::Occupied(e) if !e.get().is_empty() => e.get().clone(),
        Entry::Occupied(mut e) => {
            let id = new_request_id();
            e.insert(id.clone());
            id
        }
        Entry::Vacant(e) => e.insert(new_request_id()).clone(),
    }
}

/// 32 lower-case hex characters from 128 random bits, from a fast generator per thread (seeded
/// from the OS): request IDs must not repeat, they need not be unguessable.
fn new_request_id() -> HeaderValue {
    use rand::{Rng, SeedableRng};
    thread_local! {
        static IDS: std::cell::RefCell<rand::rngs::SmallRng> =
            std::cell::RefCell::new(rand::rngs::SmallRng::from_rng(&mut rand::rng()));
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = IDS.with(|rng| rng.borrow_mut().random());
    let mut buf = [0u8; 32];
    for (pair, byte) in buf.chunks_exact_mut(2).zip(bits.to_be_bytes()) {
        pair[0] = HEX[(byte >> 4) as usize];
        pair[1] = HEX[(byte & 0xf) as usize];
    }
    HeaderValue::from_maybe_shared(Bytes::copy_from_slice(&buf))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

// === URL templates ===

/// Renders a URL template (`auth-url`, `auth-signin`, `mirror-target`, parsed with the table in
/// the [`Dialect::Url`](crate::vars::Dialect::Url)) for the request `o` as the client sent it:
/// `$scheme`, `$host` (also `$http_host`, `$best_http_host`), `$request_uri`,
/// `$escaped_request_uri`, `$uri` and `$remote_addr`; an unknown `$name` was kept as written
/// (translation rejects them).
pub(crate) fn expand(template: &Template, o: &RequestView<'_>) -> String {
    let mut out = String::with_capacity(url_len(template, o));
    for part in template.parts() {
        let var = match part {
            Part::Text(t) => {
                out.push_str(t);
                continue;
            }
            Part::Var(var) => var,
        };
        match var {
            Var::Scheme => out.push_str(o.scheme),
            Var::Host => out.push_str(o.host),
            Var::RequestUri => out.push_str(o.request_uri),
            Var::EscapedRequestUri => out.push_str(&percent_encode(o.request_uri)),
            Var::Uri => out.push_str(o.path()),
            Var::RemoteAddr => out.push_str(&o.client.to_string()),
            // Not in the dialect: never parsed into a URL.
            _ => {}
        }
    }
    out
}

/// The most a rendered URL can take, so that it is allocated once.
fn url_len(template: &Template, o: &RequestView<'_>) -> usize {
    let part = |p: &Part| match p {
        Part::Text(t) => t.len(),
        Part::Var(Var::Scheme) => o.scheme.len(),
        Part::Var(Var::Host) => o.host.len(),
        Part::Var(Var::RequestUri | Var::Uri) => o.request_uri.len(),
        Part::Var(Var::EscapedRequestUri) => 3 * o.request_uri.len(),
        Part::Var(Var::RemoteAddr) => 39, // the longest IPv6 address
        Part::Var(_) => 0,
    };
    template.parts().iter().map(part).sum()
}

/// Removes `hidden` from an upstream response's headers: one pass over the names (usually
/// none is there), lookups only when one is.
pub(crate) fn hide_headers(headers: &mut HeaderMap, hidden: &[HeaderName]) {
    if headers.keys().any(|name| hidden.contains(name)) {
        for name in hidden {
            headers.remove(name);
        }
    }
}

/// The upstream response headers nginx hides by default (`proxy_hide_header`'s built-in list:
/// instructions to nginx, and its own `Server`), unless `allow_server`
/// (`allow-backend-server-header`).
pub(crate) fn hidden_by_default(allow_server: bool) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = [
        "x-pad",
        "x-accel-expires",
        "x-accel-redirect",
        "x-accel-limit-rate",
        "x-accel-buffering",
        "x-accel-charset",
    ]
    .into_iter()
    .map(HeaderName::from_static)
    .collect();
    if !allow_server {
        names.push(http::header::SERVER);
    }
    names
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

    #[test]
    fn strips_hop_by_hop_and_listed_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers, deflate"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("x-keep", "1"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let mut h1 = h.clone();
        strip_hop_by_hop(&mut h1, false, false);
        assert_eq!(h1.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-keep"]);
        strip_hop_by_hop(&mut h, true, true);
        let mut keys: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["te", "upgrade", "x-keep"]);
        assert_eq!(h[TE], "trailers");
        // Some of them alone.
        for (k, v, keep, left) in [
            ("upgrade", "websocket", false, None),
            ("upgrade", "websocket", true, Some("websocket")),
            ("te", "trailers", true, Some("trailers")),
            ("te", "gzip", true, None),
            ("keep-alive", "timeout=5", true, None),
        ] {
            let name = HeaderName::from_static(k);
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static(v));
            h.insert(HeaderName::from_static("x-keep"), HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h, keep, keep);
            assert_eq!(h.get(&name).map(|v| v.to_str().unwrap()), left, "{k}: {v}");
            assert_eq!(h["x-keep"], "1");
        }
    }

    #[test]
    fn hop_by_hop_bits_follow_the_removal_order() {
        // `strip_hop_by_hop` removes bit i's header by this order; the rest are not hop-by-hop,
        // among them names as long as hop-by-hop ones (`user-agent`, `x-forwarded-proto`).
        let order = [
            CONNECTION,
            KEEP_ALIVE,
            PROXY_CONNECTION,
            TRANSFER_ENCODING,
            PROXY_AUTHORIZATION,
            PROXY_AUTHENTICATE,
            UPGRADE,
            TE,
        ];
        for (i, name) in order.iter().enumerate() {
            assert_eq!(hop_by_hop_bit(name), 1 << i, "{name}");
        }
        for name in ["user-agent", "x-forwarded-proto", "content-length", "host", "trailer", "tes"] {
            assert_eq!(hop_by_hop_bit(&HeaderName::from_static(name)), 0, "{name}");
        }
    }

    #[test]
    fn request_ids_are_32_hex() {
        let id = new_request_id();
        assert_eq!(id.len(), 32);
        assert!(id.as_bytes().iter().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, new_request_id());
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static("abc"));
        assert_eq!(request_id(&mut h), "abc");
        // An empty one is replaced, a missing one set; the map holds what is returned.
        for mut h in [HeaderMap::new(), HeaderMap::from_iter([(X_REQUEST_ID, HeaderValue::from_static(""))])]
        {
            let id = request_id(&mut h);
            assert_eq!(id.len(), 32);
            assert_eq!(h.get_all(X_REQUEST_ID).iter().collect::<Vec<_>>(), [&id]);
        }
    }
}
