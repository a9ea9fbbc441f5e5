//! Request mirroring (ingress-nginx `mirror-target`, `mirror-host`, `mirror-request-body`;
//! Gateway API `RequestMirror`): a copy of each request of a route goes to another URL too, as
//! nginx's `mirror` does; a route with several mirrors sends one copy to each, each drawn by its
//! own share. A copy's answer is read and dropped; it never delays or changes the client's answer.
//!
//! - A copy goes over HTTP/1.1 (over TLS to an `https://` target), or over h2c (HTTP/2 prior
//!   knowledge: a GRPCRoute's mirror, a Service port with `appProtocol: kubernetes.io/h2c`),
//!   its `:authority` the `Host` an HTTP/1.1 copy would carry.
//! - The copy is started once the request has passed the route's checks (redirects, address
//!   rules, authentication), just before the request goes upstream, and runs in a task of its own
//!   under the route's connect and read timeouts.
//! - Its body is the request's body, frame by frame as the upstream reads it: nothing is
//!   buffered. Several copies share the very frames (reference-counted), so a request holds at
//!   most [`LAG_FRAMES`] frames of its body for all of its copies together. A copy that falls more
//!   than [`LAG_FRAMES`] frames behind, or whose request body fails, passes the size limit or is
//!   cut short, is aborted (the other copies go on): it is never sent incomplete as if whole.
//! - At most [`MAX_IN_FLIGHT`] copies are under way in the process; past that, requests are not
//!   mirrored (logged at debug level), so that a slow mirror cannot pile up tasks and memory.
//!   Each copy takes its own place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, HeaderMap, HeaderValue, TRANSFER_ENCODING};
use http::uri::{Authority, Scheme};
use http::{Request, Uri, Version};
use http_body::Body;
use http_body_util::BodyExt;

use super::headers::expand;
use super::upstream::body::UpstreamBody;
use crate::route::mirror::CompiledMirror;

/// Frames a copy's body may lag behind the request's before the copy is aborted.
pub(crate) const LAG_FRAMES: usize = 16;
/// Copies under way at once, in the whole process.
pub(crate) const MAX_IN_FLIGHT: usize = 1024;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One copy under way; frees its place when dropped.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        IN_FLIGHT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_IN_FLIGHT).then_some(n + 1))
            .ok()
            .map(|_| Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the copy of a request for one mirror (called once per mirror of the route): `o` is
/// the request as the client sent it (its URI fills the target's template) but with `o.headers`
/// as they go upstream; `body` is the request's body as it goes upstream, which from now on
/// feeds the copy too. `timeout` bounds the copy's whole exchange.
pub(super) fn start(
    proxy: &super::Proxy,
    mirror: &CompiledMirror,
    o: &crate::vars::RequestView<'_>,
    body: &mut UpstreamBody,
    timeout: Duration,
) {
    // Gateway API `RequestMirror` `percent`/`fraction`: only that share of requests is copied.
    if !mirror.chosen() {
        return;
    }
    let Some(slot) = Slot::take() else {
        tracing::debug!(target = %mirror.target, "request not mirrored: {MAX_IN_FLIGHT} copies under way");
        return;
    };
    let url = expand(&mirror.template, o);
    let mut uri: Uri = match url.parse() {
        Ok(uri) => uri,
        Err(e) => {
            tracing::debug!(%url, "request not mirrored: invalid URL: {e}");
            return;
        }
    };
    // A Service's other endpoints take their turns.
    if let Some(authority) = mirror.next_authority() {
        let mut parts = uri.into_parts();
        parts.authority = Some(authority.clone());
        uri = match Uri::from_parts(parts) {
            Ok(uri) => uri,
            Err(e) => {
                tracing::debug!(%url, %authority, "request not mirrored: {e}");
                return;
            }
        };
    }
    let Some(host) = mirror.host.clone().or_else(|| {
        uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()).filter(|h| !h.is_empty())
    }) else {
        tracing::debug!(%url, "request not mirrored: the URL names no host");
        return;
    };
    let mut headers = HeaderMap::with_capacity(o.headers.len());
    for (name, value) in o.headers {
        if name != CONNECTION {
            headers.append(name, value.clone());
        }
    }
    headers.insert(HOST, host);
    // h2c: the connection goes to the URL's authority, `:authority` is the copy's host.
    let (uri, h2c_to) = if mirror.h2c {
        match (uri.authority().cloned(), h2_uri(&uri, headers.remove(HOST))) {
            (Some(to), Some(h2)) => (h2, Some(to)),
            _ => {
                tracing::debug!(%url, "request not mirrored: its host is not an HTTP/2 authority");
                return;
            }
        }
    } else {
        (uri, None)
    };
    let version = if h2c_to.is_some() { Version::HTTP_2 } else { Version::HTTP_11 };
    let copy_body = if mirror.request_body && !body.is_end_stream() {
        body.tee(LAG_FRAMES)
    } else {
        headers.remove(CONTENT_LENGTH);
        headers.remove(TRANSFER_ENCODING);
        UpstreamBody::empty()
    };
    let mut request =
        match Request::builder().method(o.method.clone()).uri(uri).version(version).body(copy_body) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(%url, "request not mirrored: {e}");
                return;
            }
        };
    *request.headers_mut() = headers;
    let proxy = proxy.clone();
    let tls = mirror.tls.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let exchange = async {
            let clients = &proxy.inner.clients;
            let sent = match &h2c_to {
                Some(to) => clients.send_url_h2c(to, request).await,
                None => clients.send_url(request, tls.as_ref()).await,
            };
            let response = sent.map_err(|e| e.to_string())?;
            let status = response.status();
            // Read to the end: the connection goes back to the pool.
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                frame.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(status)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(status)) => tracing::debug!(%url, status = status.as_u16(), "request mirrored"),
            Ok(Err(error)) => tracing::debug!(%url, %error, "mirrored request failed"),
            Err(_) => tracing::debug!(%url, ?timeout, "mirrored request timed out"),
        }
    });
}

/// The absolute URI of an h2c copy: `uri`'s path and query, its authority the copy's `host`.
fn h2_uri(uri: &Uri, host: Option<HeaderValue>) -> Option<Uri> {
    let authority = Authority::try_from(host?.as_bytes()).ok()?;
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(authority);
    parts.path_and_query =
        Some(uri.path_and_query().cloned().unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")));
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn h2c_copies_name_their_host_as_authority() {
        let uri: Uri = "http://127.0.0.1:9000/svc.A/Call?x=1".parse().unwrap();
        let h2 = h2_uri(&uri, Some(HeaderValue::from_static("shadow.test"))).unwrap();
        assert_eq!(h2.to_string(), "http://shadow.test/svc.A/Call?x=1");
        assert_eq!(h2_uri(&uri, Some(HeaderValue::from_static("bad host"))), None);
    }

    #[test]
    fn slots_are_bounded_and_returned() {
        let slots: Vec<Slot> = std::iter::from_fn(Slot::take).take(MAX_IN_FLIGHT + 5).collect();
        assert!(slots.len() <= MAX_IN_FLIGHT);
        assert!(Slot::take().is_none());
        drop(slots);
        assert!(Slot::take().is_some());
    }
}
