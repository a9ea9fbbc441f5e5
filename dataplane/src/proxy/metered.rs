//! The request metrics' and the access log's hooks on the request path: a [`Meter`] on the
//! request's stack that the phases fill in (route, canary, upstream time, whether the route
//! logs), and a [`Metered`] response body that records the request and writes its access-log
//! line when its last byte has gone out, or when the client goes away: one end-of-request point
//! for both.
//!
//! Nothing here allocates or locks: the meter is plain atomics owned by one request (written
//! with relaxed stores, never shared), the body carries the request's table (moved in, not
//! cloned), and [`crate::metrics::RouteStats::record`] writes the calling thread's shard. The one
//! exception is a request body of undeclared length (chunked): its bytes are counted, as they are
//! read, in a counter the meter shares with the body sent upstream.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};

use super::Compiled;
use super::accesslog::{End, Ending, Entry};
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
    /// The route's `enable-access-log: "false"`.
    quiet: std::sync::atomic::AtomicBool,
    /// A HEAD request: its response never has a body.
    head: bool,
    /// The request's OpenTelemetry span, when traced (boxed: most requests have none).
    span: OnceLock<Box<ActiveSpan>>,
    /// Body bytes read from the client, for a body of undeclared length (chunked): counted by
    /// the body sent upstream, added to `request_bytes` at the end. Requests with no body or a
    /// declared length have none.
    body_read: Option<Arc<AtomicU64>>,
}

impl Meter {
    /// The request's method and size (its head as sent, and the declared body); nothing is
    /// measured unless `enabled` (metrics) or `logged` (the access log).
    pub(super) fn of<B: Body>(req: &Request<B>, enabled: bool, logged: bool) -> Meter {
        let head = req.method() == http::Method::HEAD;
        if !enabled && !logged {
            return Meter {
                route: AtomicU32::new(NONE),
                canary: AtomicU32::new(NONE),
                upstream_ns: AtomicU64::new(NO_TIME),
                method: DISABLED,
                request_bytes: 0,
                quiet: Default::default(),
                head,
                span: OnceLock::new(),
                body_read: None,
            };
        }
        let head_bytes = req.method().as_str().len()
            + req.uri().path_and_query().map_or(1, |pq| pq.as_str().len())
            + header_bytes(req.headers())
            // The request line's two spaces, `HTTP/1.1` and its CRLF.
            + 12;
        // The declared length, as the server read it from `content-length` (no second lookup
        // of the header); none for an empty body.
        let declared = if req.body().is_end_stream() { Some(0) } else { req.body().size_hint().exact() };
        let body = declared.unwrap_or(0);
        // A body without a declared length (chunked, or h2 without `content-length`) is
        // counted as it is read.
        let body_read = declared.is_none().then(Arc::default);
        Meter {
            route: AtomicU32::new(NONE),
            canary: AtomicU32::new(NONE),
            upstream_ns: AtomicU64::new(NO_TIME),
            method: if enabled { method_slot(req.method()) } else { DISABLED },
            request_bytes: head_bytes as u64 + body,
            quiet: Default::default(),
            head,
            span: OnceLock::new(),
            body_read,
        }
    }

    /// Where the body sent upstream counts the bytes it reads from the client, when the request
    /// declares no length.
    pub(super) fn body_counter(&self) -> Option<&Arc<AtomicU64>> {
        self.body_read.as_ref()
    }

    /// The route does not log its requests (`enable-access-log: "false"`).
    pub(super) fn quiet(&self) {
        self.quiet.store(true, Ordering::Relaxed);
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

    /// The response whose body records the request at its end (when metrics are on), ends its
    /// span (when traced) and writes `log`, its access-log line (unless the route is quiet, or no route took the request and
    /// the default backend is not logged).
    pub(super) fn finish<B: Body>(
        self,
        resp: Response<B>,
        state: Arc<Compiled>,
        start: Instant,
        log: Option<Box<Entry>>,
    ) -> Response<Metered<B>> {
        super::h2_stall::responded();
        let span = self.span.into_inner().map(|span| (span, resp.status().as_u16()));
        let route = self.route.load(Ordering::Relaxed);
        let log = log.filter(|entry| {
            !self.quiet.load(Ordering::Relaxed) && (route != NONE || entry.logs_default_backend())
        });
        let metrics = state.config.metrics.enabled && self.method != DISABLED;
        if !metrics && log.is_none() {
            return resp.map(|inner| Metered { inner, pending: None, span });
        }
        let upstream = self.upstream_ns.load(Ordering::Relaxed);
        let head = header_bytes(resp.headers()) + 17;
        let status = resp.status();
        let bodiless = self.head
            || status.is_informational()
            || status == http::StatusCode::NO_CONTENT
            || status == http::StatusCode::NOT_MODIFIED
            || resp.body().is_end_stream();
        let pending = Pending {
            state,
            route: if route == NONE { 0 } else { route },
            start,
            metrics,
            record: Record {
                method: self.method,
                status: status.as_u16(),
                duration: Duration::ZERO,
                upstream: (upstream != NO_TIME).then(|| Duration::from_nanos(upstream)),
                request_bytes: self.request_bytes,
                response_bytes: head as u64,
            },
            head_bytes: head as u64,
            bodiless,
            log,
            body_read: self.body_read,
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
    /// Record the request's metrics.
    metrics: bool,
    record: Record,
    head_bytes: u64,
    /// The response has no body to send (HEAD, 1xx, 204, 304).
    bodiless: bool,
    log: Option<Box<Entry>>,
    /// [`Meter::body_counter`].
    body_read: Option<Arc<AtomicU64>>,
}

impl Pending {
    fn record(mut self, how: Ending) {
        self.record.duration = self.start.elapsed();
        if let Some(read) = &self.body_read {
            self.record.request_bytes += read.load(Ordering::Relaxed);
        }
        if self.metrics
            && let Some(stats) = self.state.metrics.route(self.route)
        {
            stats.record(&self.record);
        }
        if let Some(entry) = self.log {
            let end = End {
                elapsed: self.record.duration,
                head_bytes: self.head_bytes,
                body_bytes: self.record.response_bytes.saturating_sub(self.head_bytes),
                request_length: self.record.request_bytes,
                how,
            };
            entry.write(&end, &self.state.log);
        }
    }
}

/// A response body that records its request's metrics and writes its access-log line when it
/// ends or is dropped.
pub(crate) struct Metered<B> {
    inner: B,
    pending: Option<Pending>,
    /// The request's span and the response status, ended with the body.
    span: Option<(Box<ActiveSpan>, u16)>,
}

impl<B> Metered<B> {
    fn done(&mut self, how: Ending) {
        if let Some(pending) = self.pending.take() {
            pending.record(how);
        }
        if let Some((span, status)) = self.span.take() {
            span.finish(status);
        }
    }
}

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        // Dropped before its end: the client went away, unless there was nothing to send.
        let how = match &self.pending {
            Some(pending) if !pending.bodiless => Ending::ClientGone,
            _ => Ending::Complete,
        };
        self.done(how);
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
        super::h2_stall::body_polled(&polled);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(pending)) = (frame.data_ref(), this.pending.as_mut()) {
                    pending.record.response_bytes += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.done(Ending::Complete);
                }
            }
            Poll::Ready(Some(Err(_))) => this.done(Ending::UpstreamError),
            Poll::Ready(None) => this.done(Ending::Complete),
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
