//! Errors of the proxy, classified by where they came from (pingora-error style), and the small
//! plain responses the proxy answers with.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{Either, Full};

use super::compress::Encoded;
use super::headers::X_REQUEST_ID;
use super::upstream::client::ResponseBody;
use crate::state::throttle::Shaped;

pub use super::upstream::conn::BoxError;

/// The body of every response the proxy returns: the upstream's, streamed (paced by
/// `limit-rate` and holding its `limit-connections` place where the route says so), or a small
/// local one.
pub(crate) type ProxyBody = Either<Shaped<Encoded<ResponseBody>>, Full<Bytes>>;

/// Where an error came from: decides the status and whether a retry makes sense.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorSource {
    /// The client sent something unusable (4xx).
    Downstream,
    /// The upstream failed or is missing (5xx).
    Upstream,
    /// The proxy itself: routing outcome or a bug (404, 500).
    Internal,
}

/// A request the proxy answers itself instead of forwarding a response.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request has no usable `Host`/authority.
    #[error("request without a usable host")]
    NoHost,
    /// More than one `Host` header (RFC 9112 §3.2; nginx answers 400 too).
    #[error("duplicate Host header")]
    DuplicateHost,
    /// The request path cannot be normalized: a bad escape, a control character, `..` above
    /// the root, or a refused encoded slash (see [`crate::uri_path`]).
    #[error("invalid request path: {0}")]
    BadPath(#[from] crate::uri_path::PathError),
    /// No route and no default backend.
    #[error("no route")]
    NoRoute,
    /// The backend has no endpoint (no ready pod).
    #[error("backend has no endpoints")]
    NoEndpoints,
    /// The endpoint's address cannot form a request URI (a bad ExternalName).
    #[error("invalid upstream address")]
    BadUpstreamAddress,
    /// Connecting to the upstream failed (refused, unreachable, DNS).
    #[error("upstream connect failed: {0}")]
    Connect(#[source] BoxError),
    /// Connecting to the upstream took longer than `connect_timeout`.
    #[error("upstream connect timed out")]
    ConnectTimeout,
    /// The upstream response head took longer than `upstream_timeout`.
    #[error("upstream response timed out")]
    ResponseTimeout,
    /// No write to the upstream made progress within `proxy-send-timeout`.
    #[error("upstream send timed out")]
    SendTimeout,
    /// Reading the client's body (read whole so a retry can send it again) failed.
    #[error("reading the request body failed: {0}")]
    ClientBody(#[source] BoxError),
    /// The client did not send its body (read whole so a retry can send it again) in time.
    #[error("the request body did not arrive in time")]
    ClientBodyTimeout,
    /// The upstream answered `101 Switching Protocols` to a request that asked for no upgrade.
    #[error("upstream switched protocols unasked")]
    UnexpectedSwitch,
    /// The upstream reset the connection or sent a bad response.
    #[error("upstream request failed: {0}")]
    Upstream(#[source] BoxError),
    /// The route's source ranges do not admit the client.
    #[error("client address not allowed")]
    Forbidden,
    /// The request body is larger than the route allows.
    #[error("request body too large")]
    PayloadTooLarge,
    /// The client passed the route's rate limit; the status is 503 or 429.
    #[error("rate limited")]
    RateLimited(StatusCode),
    /// The client has as many requests in flight as `limit-connections` allows.
    #[error("too many requests in flight from this client")]
    ConnLimited(StatusCode),
    /// The route's rewrite produced a path that is not a valid request target.
    #[error("rewrite produced an invalid path")]
    BadRewrite,
    /// The host requires a client certificate and none was sent.
    #[error("no required client certificate was sent")]
    ClientCertRequired,
    /// The client certificate did not verify.
    #[error("the client certificate is invalid")]
    ClientCertInvalid,
    /// The client certificate's subject does not match the host's `auth-tls-match-cn`.
    #[error("client certificate unauthorized")]
    ClientCertUnauthorized,
    /// The host requires client certificates, but the connection was made for another name.
    #[error("the connection's TLS name does not cover this host's client certificate policy")]
    Misdirected,
    /// The request's host belongs to another Gateway HTTPS listener than the one the
    /// connection's SNI chose (`Listener.hostname`, RFC 7540 §9.1.2).
    #[error("the host belongs to another listener than the connection's TLS name")]
    OtherListener,
    /// The request line is longer than one `large-client-header-buffers` buffer.
    #[error("request line too long")]
    UriTooLong,
    /// A header line is longer than one `large-client-header-buffers` buffer (or HTTP/2's
    /// `http2-max-field-size`).
    #[error("request header too large")]
    HeaderTooLarge,
    /// The route's share chosen for the request has no backend (a Gateway API `backendRef`
    /// that did not resolve), or the route has no backend at all.
    #[error("the route's backend reference did not resolve")]
    UnresolvedBackend,
    /// The route's rule cannot be served as written (a Gateway API filter weir does not
    /// support): it answers this status.
    #[error("the route's rule cannot be served as written")]
    RuleRefused(StatusCode),
}

impl ProxyError {
    /// The gRPC status a gRPC client gets for this error: its HTTP status's ([`grpc_status`]),
    /// but `UNAVAILABLE` (14) for a backend reference that did not resolve, as Gateway API's
    /// `GRPCRouteRule.backendRefs` requires ("`UNAVAILABLE` statuses MUST be returned for
    /// requests that would have otherwise been routed to an invalid backend"), where an HTTP
    /// client gets 500 (`HTTPRouteRule.backendRefs`).
    pub fn grpc_code(&self) -> u8 {
        match self {
            ProxyError::UnresolvedBackend => 14,
            _ => grpc_status(self.status()),
        }
    }

    /// Where the error came from.
    pub fn source_kind(&self) -> ErrorSource {
        match self {
            ProxyError::NoHost
            | ProxyError::DuplicateHost
            | ProxyError::BadPath(_)
            | ProxyError::Forbidden
            | ProxyError::PayloadTooLarge
            | ProxyError::RateLimited(_)
            | ProxyError::ConnLimited(_)
            | ProxyError::ClientCertRequired
            | ProxyError::ClientCertInvalid
            | ProxyError::ClientCertUnauthorized
            | ProxyError::Misdirected
            | ProxyError::OtherListener
            | ProxyError::ClientBody(_)
            | ProxyError::ClientBodyTimeout
            | ProxyError::UriTooLong
            | ProxyError::HeaderTooLarge => ErrorSource::Downstream,
            ProxyError::NoRoute
            | ProxyError::BadUpstreamAddress
            | ProxyError::BadRewrite
            | ProxyError::UnresolvedBackend
            | ProxyError::RuleRefused(_) => ErrorSource::Internal,
            ProxyError::NoEndpoints
            | ProxyError::Connect(_)
            | ProxyError::ConnectTimeout
            | ProxyError::ResponseTimeout
            | ProxyError::SendTimeout
            | ProxyError::UnexpectedSwitch
            | ProxyError::Upstream(_) => ErrorSource::Upstream,
        }
    }

    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoHost
            | ProxyError::DuplicateHost
            | ProxyError::BadPath(_)
            | ProxyError::ClientCertRequired
            | ProxyError::ClientCertInvalid
            | ProxyError::ClientBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::Misdirected | ProxyError::OtherListener => StatusCode::MISDIRECTED_REQUEST,
            ProxyError::Forbidden | ProxyError::ClientCertUnauthorized => StatusCode::FORBIDDEN,
            ProxyError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::NoEndpoints => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BadRewrite | ProxyError::UnresolvedBackend => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::RateLimited(status)
            | ProxyError::ConnLimited(status)
            | ProxyError::RuleRefused(status) => *status,
            ProxyError::BadUpstreamAddress
            | ProxyError::Connect(_)
            | ProxyError::UnexpectedSwitch
            | ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout | ProxyError::ResponseTimeout | ProxyError::SendTimeout => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::ClientBodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::UriTooLong => StatusCode::URI_TOO_LONG,
            ProxyError::HeaderTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }
}

/// The one shape of every response the proxy makes itself: `text/plain`, body `"<code> <reason>\n"`,
/// and the request id.
pub(super) fn local_response(status: StatusCode, request_id: HeaderValue) -> Response<ProxyBody> {
    let body: &'static str = match status {
        StatusCode::MOVED_PERMANENTLY => "301 Moved Permanently\n",
        StatusCode::FOUND => "302 Found\n",
        StatusCode::SEE_OTHER => "303 See Other\n",
        StatusCode::TEMPORARY_REDIRECT => "307 Temporary Redirect\n",
        StatusCode::PERMANENT_REDIRECT => "308 Permanent Redirect\n",
        StatusCode::BAD_REQUEST => "400 Bad Request\n",
        StatusCode::UNAUTHORIZED => "401 Unauthorized\n",
        StatusCode::FORBIDDEN => "403 Forbidden\n",
        StatusCode::REQUEST_TIMEOUT => "408 Request Timeout\n",
        StatusCode::PAYLOAD_TOO_LARGE => "413 Payload Too Large\n",
        StatusCode::TOO_MANY_REQUESTS => "429 Too Many Requests\n",
        StatusCode::URI_TOO_LONG => "414 URI Too Long\n",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "431 Request Header Fields Too Large\n",
        StatusCode::NOT_FOUND => "404 Not Found\n",
        StatusCode::MISDIRECTED_REQUEST => "421 Misdirected Request\n",
        StatusCode::BAD_GATEWAY => "502 Bad Gateway\n",
        StatusCode::SERVICE_UNAVAILABLE => "503 Service Unavailable\n",
        StatusCode::GATEWAY_TIMEOUT => "504 Gateway Timeout\n",
        _ => "500 Internal Server Error\n",
    };
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from_static(body.as_bytes()))));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    headers.insert(X_REQUEST_ID, request_id);
    resp
}

/// Whether a request is gRPC (`content-type: application/grpc`, `+proto`, ...).
pub(super) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.len() >= 16 && v[..16].eq_ignore_ascii_case("application/grpc"))
}

/// The gRPC status for a proxy error status, as the gRPC HTTP mapping has it: 400 INTERNAL,
/// 404 UNIMPLEMENTED, 502/503/504 UNAVAILABLE, anything else UNKNOWN.
pub fn grpc_status(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 13,
        421 => 14,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}

/// A gRPC "trailers-only" answer for a request the proxy answers itself: HTTP 200, the status in
/// `grpc-status` (`code`) and the reason in `grpc-message`, so gRPC clients see a gRPC error,
/// not a protocol error.
pub(super) fn grpc_local_response(
    status: StatusCode,
    code: u8,
    request_id: HeaderValue,
) -> Response<ProxyBody> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    let message = format!("{} {} (weir)", status.as_u16(), status.canonical_reason().unwrap_or("error"));
    if let Ok(message) = HeaderValue::from_str(&message.replace(' ', "%20")) {
        headers.insert("grpc-message", message);
    }
    headers.insert(X_REQUEST_ID, request_id);
    resp
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// A gRPC client gets the gRPC HTTP mapping of the error's status, except `UNAVAILABLE` for
    /// an unresolved backend reference (Gateway API `GRPCRouteRule.backendRefs`), which an HTTP
    /// client gets as 500.
    #[test]
    fn grpc_codes_of_errors() {
        assert_eq!(ProxyError::UnresolvedBackend.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(ProxyError::UnresolvedBackend.grpc_code(), 14);
        assert_eq!(ProxyError::NoRoute.grpc_code(), 12);
        assert_eq!(ProxyError::BadRewrite.grpc_code(), 2);
    }

    #[test]
    fn errors_map_to_status_and_source() {
        let cases = [
            (ProxyError::NoHost, 400, ErrorSource::Downstream),
            (ProxyError::DuplicateHost, 400, ErrorSource::Downstream),
            (ProxyError::BadPath(crate::uri_path::PathError::AboveRoot), 400, ErrorSource::Downstream),
            (ProxyError::NoRoute, 404, ErrorSource::Internal),
            (ProxyError::Forbidden, 403, ErrorSource::Downstream),
            (ProxyError::PayloadTooLarge, 413, ErrorSource::Downstream),
            (ProxyError::RateLimited(StatusCode::TOO_MANY_REQUESTS), 429, ErrorSource::Downstream),
            (ProxyError::NoEndpoints, 503, ErrorSource::Upstream),
            (ProxyError::Connect("refused".into()), 502, ErrorSource::Upstream),
            (ProxyError::Upstream("reset".into()), 502, ErrorSource::Upstream),
            (ProxyError::UnexpectedSwitch, 502, ErrorSource::Upstream),
            (ProxyError::ConnectTimeout, 504, ErrorSource::Upstream),
            (ProxyError::ResponseTimeout, 504, ErrorSource::Upstream),
            (ProxyError::UnresolvedBackend, 500, ErrorSource::Internal),
            (ProxyError::OtherListener, 421, ErrorSource::Downstream),
        ];
        for (err, status, source) in cases {
            assert_eq!((err.status().as_u16(), err.source_kind()), (status, source), "{err}");
        }
    }

    #[tokio::test]
    async fn local_responses_have_one_shape() {
        for status in [301, 302, 303, 307, 308, 400, 401, 403, 404, 413, 429, 502, 503, 504] {
            let status = StatusCode::from_u16(status).unwrap();
            let resp = local_response(status, HeaderValue::from_static("id-1"));
            assert_eq!(resp.status(), status);
            assert_eq!(resp.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
            assert_eq!(resp.headers()[X_REQUEST_ID], "id-1");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let want = format!("{} {}\n", status.as_u16(), status.canonical_reason().unwrap());
            assert_eq!(body, want.as_bytes());
        }
    }
}
