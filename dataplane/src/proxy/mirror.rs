//! Request mirroring (ingress-nginx `mirror-target`, `mirror-host`, `mirror-request-body`): a
//! copy of each request of a route goes to another URL too, as nginx's `mirror` does. The copy's
//! answer is read and dropped; it never delays or changes the client's answer.
//!
//! - The copy is started once the request has passed the route's checks (redirects, address
//!   rules, authentication), just before the request goes upstream, and runs in a task of its own
//!   under the route's connect and read timeouts.
//! - Its body is the request's body, frame by frame as the upstream reads it: nothing is
//!   buffered. A copy that falls more than [`LAG_FRAMES`] frames behind, or whose request body
//!   fails, passes the size limit or is cut short, is aborted: it is never sent incomplete as if
//!   whole.
//! - At most [`MAX_IN_FLIGHT`] copies are under way in the process; past that, requests are not
//!   mirrored (logged at debug level), so that a slow mirror cannot pile up tasks and memory.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, HeaderMap, HeaderValue, TRANSFER_ENCODING};
use http::{Request, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use super::extauth::{Original, expand};
use super::upstream::client::UpstreamBody;
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

/// Starts the copy of a request: `o` is the request as the client sent it (its URI fills the
/// target's template) but with `o.headers` as they go upstream; `body` is the request's body
/// as it goes upstream, which from now on feeds the copy too. `timeout` bounds the copy's whole
/// exchange.
pub(super) fn start(
    proxy: &super::Proxy,
    mirror: &CompiledMirror,
    o: &Original<'_>,
    body: &mut UpstreamBody,
    timeout: Duration,
) {
    let Some(slot) = Slot::take() else {
        tracing::debug!(target = %mirror.target, "request not mirrored: {MAX_IN_FLIGHT} copies under way");
        return;
    };
    let url = expand(&mirror.target, o);
    let uri: Uri = match url.parse() {
        Ok(uri) => uri,
        Err(e) => {
            tracing::debug!(%url, "request not mirrored: invalid URL: {e}");
            return;
        }
    };
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
    let copy_body = if mirror.request_body && !body.is_end_stream() {
        body.tee(LAG_FRAMES)
    } else {
        headers.remove(CONTENT_LENGTH);
        headers.remove(TRANSFER_ENCODING);
        UpstreamBody::empty()
    };
    let mut request = match Request::builder().method(o.method.clone()).uri(uri).body(copy_body) {
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
            let response =
                proxy.inner.clients.send_url(request, tls.as_ref()).await.map_err(|e| e.to_string())?;
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

/// The copy's side of a request body: the request's body hands each data frame to its copy.
pub(crate) enum Side {
    /// On the request's body: where its frames are offered.
    Tee(Tee),
    /// The copy's body, fed by the request's.
    Feed(Feed),
}

/// Hands frames to a copy's [`Feed`]; dropped without [`Tee::finish`], the copy is aborted.
pub(crate) struct Tee {
    tx: mpsc::Sender<Bytes>,
    complete: Arc<AtomicBool>,
}

/// A copy's body: the frames of the request's body, then its end (or an error if the request's
/// body did not end properly).
pub(crate) struct Feed {
    rx: mpsc::Receiver<Bytes>,
    complete: Arc<AtomicBool>,
    hint: SizeHint,
}

/// A tee and the feed it fills, with room for `lag` frames; `hint` is the request body's size.
pub(crate) fn channel(lag: usize, hint: SizeHint) -> (Tee, Feed) {
    let (tx, rx) = mpsc::channel(lag.max(1));
    let complete = Arc::new(AtomicBool::new(false));
    (Tee { tx, complete: complete.clone() }, Feed { rx, complete, hint })
}

impl Tee {
    /// Offers a data frame; `false` when the copy fell behind or is gone (drop the tee).
    pub(crate) fn offer(&self, data: &Bytes) -> bool {
        self.tx.try_send(data.clone()).is_ok()
    }

    /// The request's body ended properly: the copy's ends too.
    pub(crate) fn finish(self) {
        self.complete.store(true, Ordering::Release);
    }
}

/// The request's body failed or stopped before its end, or the copy fell behind.
#[derive(Debug, thiserror::Error)]
#[error("the mirrored request's body did not end properly")]
pub(crate) struct CutShort;

impl Feed {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, super::error::BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            // The sender is gone: the request's body ended, or was abandoned.
            Poll::Ready(None) if self.complete.load(Ordering::Acquire) => Poll::Ready(None),
            Poll::Ready(None) => Poll::Ready(Some(Err(Box::new(CutShort)))),
            Poll::Pending => Poll::Pending,
        }
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    #[tokio::test]
    async fn a_finished_tee_ends_the_feed_and_a_dropped_one_cuts_it_short() {
        let (tee, mut feed) = channel(2, SizeHint::with_exact(3));
        assert!(tee.offer(&Bytes::from_static(b"ab")));
        assert!(tee.offer(&Bytes::from_static(b"c")));
        assert!(!tee.offer(&Bytes::from_static(b"d")), "a third frame overflows a lag of 2");
        tee.finish();
        let mut got = Vec::new();
        while let Some(frame) = poll_fn(|cx| feed.poll_frame(cx)).await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(got, b"abc");

        let (tee, mut feed) = channel(2, SizeHint::default());
        assert!(tee.offer(&Bytes::from_static(b"ab")));
        drop(tee);
        assert!(poll_fn(|cx| feed.poll_frame(cx)).await.unwrap().is_ok());
        assert!(poll_fn(|cx| feed.poll_frame(cx)).await.unwrap().is_err(), "an abandoned body is an error");
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
