//! The request metrics' hooks on the request path: a [`Meter`] on the request's stack that the
//! phases fill in (route, canary, upstream time), and a [`Metered`] response body that records
//! the request when its last byte has gone out, or when the client goes away.
//!
//! Nothing here allocates or locks: the meter is plain atomics owned by one request (written
//! with relaxed stores, never shared), the body carries the request's table (moved in, not
//! cloned), and [`crate::metrics::RouteStats::record`] writes the calling thread's shard.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};

use super::Compiled;
use crate::metrics::{Record, RouteHandle, method_slot};
use crate::trace::span::ActiveSpan;

/// No id / no duration.
const NONE: u32 = u32::MAX;
const NO_TIME: u64 = u64::MAX;
/// The method slot of a meter that measures nothing.
const DISABLED: u8 = u8::MAX;

/// What the phases learn about a request for its metrics.
pub(super) struct Meter {
    route: AtomicU32,
    canary: AtomicU32,
    upstream_ns: AtomicU64,
    method: u8,
    request_bytes: u64,
    /// The request's OpenTelemetry span, when traced (boxed: most requests have none).
    span: OnceLock<Box<ActiveSpan>>,
}

impl Meter {
    /// The request's method and size (its head as sent, and the declared body); nothing is
    /// measured unless `enabled`.
    pub(super) fn of<B>(req: &Request<B>, enabled: bool) -> Meter {
        if !enabled {
            return Meter {
                route: AtomicU32::new(NONE),
                canary: AtomicU32::new(NONE),
                upstream_ns: AtomicU64::new(NO_TIME),
                method: DISABLED,
                request_bytes: 0,
                span: OnceLock::new(),
            };
        }
        let head = req.method().as_str().len()
            + req.uri().path_and_query().map_or(1, |pq| pq.as_str().len())
            + header_bytes(req.headers())
            + 13;
        let body = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        Meter {
            route: AtomicU32::new(NONE),
            canary: AtomicU32::new(NONE),
            upstream_ns: AtomicU64::new(NO_TIME),
            method: method_slot(req.method()),
            request_bytes: head as u64 + body,
            span: OnceLock::new(),
        }
    }

    /// The request matched a route.
    pub(super) fn route(&self, handle: &RouteHandle) {
        self.route.store(handle.id, Ordering::Relaxed);
        self.canary.store(handle.canary.unwrap_or(NONE), Ordering::Relaxed);
    }

    /// The route's canary took the request.
    pub(super) fn canary_took_it(&self) {
        let canary = self.canary.load(Ordering::Relaxed);
        if canary != NONE {
            self.route.store(canary, Ordering::Relaxed);
        }
    }

    /// The upstream's response head came `elapsed` after the request was sent.
    pub(super) fn upstream(&self, elapsed: Duration) {
        self.upstream_ns.store(u64::try_from(elapsed.as_nanos()).unwrap_or(NO_TIME - 1), Ordering::Relaxed);
    }

    /// The request's span, ended with its response.
    pub(super) fn span(&self, span: ActiveSpan) {
        // Set once per request.
        if self.span.set(Box::new(span)).is_err() {
            tracing::debug!("a request's span was started twice; the second is not sent");
        }
    }

    /// The response whose body records the request at its end (when metrics are on) and ends
    /// its span (when traced).
    pub(super) fn finish<B>(
        self,
        resp: Response<B>,
        state: Arc<Compiled>,
        start: Instant,
    ) -> Response<Metered<B>> {
        let span = self.span.into_inner().map(|span| (span, resp.status().as_u16()));
        if !state.config.metrics.enabled || self.method == DISABLED {
            return resp.map(|inner| Metered { inner, pending: None, span });
        }
        let route = self.route.load(Ordering::Relaxed);
        let upstream = self.upstream_ns.load(Ordering::Relaxed);
        let head = header_bytes(resp.headers()) + 17;
        let pending = Pending {
            state,
            route: if route == NONE { 0 } else { route },
            start,
            record: Record {
                method: self.method,
                status: resp.status().as_u16(),
                duration: Duration::ZERO,
                upstream: (upstream != NO_TIME).then(|| Duration::from_nanos(upstream)),
                request_bytes: self.request_bytes,
                response_bytes: head as u64,
            },
        };
        resp.map(|inner| Metered { inner, pending: Some(pending), span })
    }
}

/// The bytes a header block takes on the wire (HTTP/1.1 framing: `name: value\r\n`).
fn header_bytes(headers: &HeaderMap) -> usize {
    headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum::<usize>() + 2
}

/// What the body records when it ends.
struct Pending {
    state: Arc<Compiled>,
    route: u32,
    start: Instant,
    record: Record,
}

impl Pending {
    fn record(mut self) {
        self.record.duration = self.start.elapsed();
        if let Some(stats) = self.state.metrics.route(self.route) {
            stats.record(&self.record);
        }
    }
}

/// A response body that records its request's metrics when it ends or is dropped.
pub(crate) struct Metered<B> {
    inner: B,
    pending: Option<Pending>,
    /// The request's span and the response status, ended with the body.
    span: Option<(Box<ActiveSpan>, u16)>,
}

impl<B> Metered<B> {
    fn done(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.record();
        }
        if let Some((span, status)) = self.span.take() {
            span.finish(status);
        }
    }
}

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(pending)) = (frame.data_ref(), this.pending.as_mut()) {
                    pending.record.response_bytes += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.done();
                }
            }
            Poll::Ready(_) => this.done(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
