//! Client-side limits of the settings ([`ClientLimits`]): how large a request head may be
//! (nginx's `large_client_header_buffers`: the request line and each header line within one
//! buffer, the whole head within all of them), HTTP/2's field and header list sizes and
//! concurrent streams, and the time a connection has to send its PROXY protocol header.
//!
//! hyper refuses a head larger than its read buffer (431) itself; the per-line limits are
//! checked here, before routing: a request line over one buffer gets 414 as in nginx, a header
//! line over it 431 (nginx answers 400, "Request Header Or Cookie Too Large").

use std::time::Duration;

use http::Request;

use super::error::ProxyError;
use crate::model::ClientLimits;

/// hyper's smallest HTTP/1 read buffer.
const MIN_H1_BUFFER: usize = 8192;

/// ingress-nginx's `proxy-protocol-header-timeout` default.
const PROXY_PROTOCOL_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The time a connection has to send its PROXY protocol header.
pub(super) fn proxy_protocol_header_timeout(limits: &ClientLimits) -> Duration {
    limits.proxy_protocol_header_timeout_ms.map_or(PROXY_PROTOCOL_HEADER_TIMEOUT, Duration::from_millis)
}

/// The HTTP/1 read buffer (the largest request head), when the settings bound it.
pub(super) fn h1_max_head(limits: &ClientLimits) -> Option<usize> {
    let (number, size) = limits.header_buffers?;
    Some((number as usize * size as usize).max(MIN_H1_BUFFER))
}

/// The largest HTTP/2 header list, when the settings bound it: `http2-max-header-size`, else
/// all the large buffers (nginx 1.19.7 and later read HTTP/2 headers into them too).
pub(super) fn h2_max_header_list(limits: &ClientLimits) -> Option<u32> {
    limits.h2_max_header_bytes.or_else(|| limits.header_buffers.map(|(n, size)| n.saturating_mul(size)))
}

/// Checks the request line and each header line against one buffer (HTTP/2: against
/// `http2-max-field-size` when set).
pub(super) fn check<B>(limits: &ClientLimits, req: &Request<B>) -> Result<(), ProxyError> {
    let h2 = req.version() == http::Version::HTTP_2;
    let line = match (h2, limits.h2_max_field_bytes, limits.header_buffers) {
        (true, Some(field), _) => field,
        (_, _, Some((_, size))) => size,
        _ => return Ok(()),
    } as usize;
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    // `GET /target HTTP/1.1\r\n` (HTTP/2: the `:path` field).
    let request_line = if h2 { target } else { req.method().as_str().len() + target + 12 };
    if request_line > line {
        return Err(ProxyError::UriTooLong);
    }
    // `name: value\r\n` (HTTP/2: name and value).
    let overhead = if h2 { 0 } else { 4 };
    if req.headers().iter().any(|(name, value)| name.as_str().len() + value.len() + overhead > line) {
        return Err(ProxyError::HeaderTooLarge);
    }
    Ok(())
}

/// Drops request headers whose names nginx calls invalid: anything but letters, digits and `-`,
/// and `_` unless `underscores` (`enable-underscores-in-headers`). hyper has lower-cased them.
pub(super) fn drop_invalid(headers: &mut http::HeaderMap, underscores: bool) {
    let valid = |name: &http::HeaderName| {
        name.as_str().bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || (underscores && b == b'_'))
    };
    if headers.keys().all(valid) {
        return;
    }
    let invalid: Vec<http::HeaderName> = headers.keys().filter(|n| !valid(n)).cloned().collect();
    for name in invalid {
        headers.remove(name);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits(buffers: Option<(u32, u32)>, field: Option<u32>) -> ClientLimits {
        ClientLimits { header_buffers: buffers, h2_max_field_bytes: field, ..ClientLimits::default() }
    }

    fn request(version: http::Version, path: &str, header: usize) -> Request<()> {
        Request::get(path).version(version).header("x-big", "a".repeat(header)).body(()).unwrap()
    }

    #[test]
    fn lines_fit_in_one_buffer() {
        let l = limits(Some((4, 100)), None);
        let v1 = http::Version::HTTP_11;
        assert!(check(&l, &request(v1, "/short", 10)).is_ok());
        // "GET " + path + " HTTP/1.1\r\n" in 100 bytes exactly passes, one more is 414.
        let fits = format!("/{}", "p".repeat(100 - 3 - 12 - 1));
        assert!(check(&l, &request(v1, &fits, 10)).is_ok());
        assert!(matches!(check(&l, &request(v1, &format!("{fits}x"), 10)), Err(ProxyError::UriTooLong)));
        // "x-big: " + value + "\r\n".
        assert!(check(&l, &request(v1, "/", 100 - 5 - 4)).is_ok());
        assert!(matches!(check(&l, &request(v1, "/", 100 - 5 - 3)), Err(ProxyError::HeaderTooLarge)));
        // HTTP/2 counts fields without framing, against http2-max-field-size when set.
        let h2 = http::Version::HTTP_2;
        assert!(check(&l, &request(h2, "/", 95)).is_ok());
        let l = limits(Some((4, 100)), Some(200));
        assert!(check(&l, &request(h2, "/", 195)).is_ok());
        assert!(matches!(check(&l, &request(h2, "/", 196)), Err(ProxyError::HeaderTooLarge)));
        assert!(check(&limits(None, None), &request(v1, "/", 100_000)).is_ok(), "unset: no check");
    }

    #[test]
    fn invalid_names_are_dropped() {
        let mut headers = http::HeaderMap::new();
        for name in ["x-ok", "x_under", "x.dot", "x~tilde", "Digits-123"] {
            headers.insert(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), "1".parse().unwrap());
        }
        let mut strict = headers.clone();
        drop_invalid(&mut strict, false);
        assert_eq!(strict.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-ok", "digits-123"]);
        drop_invalid(&mut headers, true);
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-ok", "x_under", "digits-123"]);
    }

    #[test]
    fn heads_and_header_lists() {
        assert_eq!(h1_max_head(&limits(Some((4, 8192)), None)), Some(32768));
        assert_eq!(h1_max_head(&limits(Some((1, 1024)), None)), Some(MIN_H1_BUFFER), "hyper's minimum");
        assert_eq!(h1_max_head(&ClientLimits::default()), None);
        assert_eq!(h2_max_header_list(&limits(Some((4, 8192)), None)), Some(32768));
        let sized = ClientLimits { h2_max_header_bytes: Some(1000), ..limits(Some((4, 8192)), None) };
        assert_eq!(h2_max_header_list(&sized), Some(1000));
        assert_eq!(proxy_protocol_header_timeout(&ClientLimits::default()), Duration::from_secs(5));
    }
}
