//! What the clients and the HTTP/1.1 codec share about upstream connections: how an exchange
//! uses them ([`Exchange`]), what the pool knows of one ([`ConnMeta`]), its write-progress
//! timeout ([`SendTimed`]), and the upstream side's boxed error.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A boxed error from the upstream side.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How one exchange uses upstream connections, from the table's settings and the route's policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exchange {
    /// A new connection (TCP, and TLS where used) must be up within it.
    pub(crate) connect_timeout: Duration,
    /// Longest wait for one write to the upstream to make progress (HTTP/1.1 connections).
    pub(crate) send_timeout: Duration,
    /// Idle connections kept per endpoint.
    pub(crate) max_idle: usize,
    /// Requests per connection before it is closed.
    pub(crate) max_requests: Option<u32>,
    /// A connection older than this is not reused.
    pub(crate) max_lifetime: Option<Duration>,
}

/// What the pool knows of one upstream HTTP/1.1 connection, shared with its I/O ([`SendTimed`]).
pub(crate) struct ConnMeta {
    created: Instant,
    /// Requests sent on it so far.
    pub(crate) requests: AtomicU32,
    /// The send timeout of the request it carries, in milliseconds (0: none).
    pub(crate) send_timeout_ms: AtomicU64,
}

impl ConnMeta {
    pub(crate) fn new() -> Self {
        ConnMeta { created: Instant::now(), requests: AtomicU32::new(0), send_timeout_ms: AtomicU64::new(0) }
    }

    /// Whether the connection may carry another request (its age as of `now`).
    pub(crate) fn reusable(&self, opts: &Exchange, now: Instant) -> bool {
        opts.max_requests.is_none_or(|max| self.requests.load(Relaxed) < max)
            && self.young(opts.max_lifetime, now)
    }

    /// Whether it is younger than `max_lifetime` as of `now`.
    pub(crate) fn young(&self, max_lifetime: Option<Duration>, now: Instant) -> bool {
        max_lifetime.is_none_or(|max| now.saturating_duration_since(self.created) < max)
    }
}

/// Locks `m`, ignoring poisoning (the data stays consistent: every critical section is a push,
/// pop or retain).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl SendTimed ===

/// No write to the upstream made progress within the send timeout (`proxy-send-timeout`).
#[derive(Debug, thiserror::Error)]
#[error("upstream send timed out")]
pub(crate) struct SendTimedOut;

/// Whether `error` (or one of its causes) is a [`SendTimedOut`].
pub(crate) fn is_send_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<SendTimedOut>()
            || e.downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .is_some_and(|i| i.is::<SendTimedOut>())
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// An upstream connection's I/O whose writes fail with [`SendTimedOut`] when one waits longer
/// than the send timeout of the request it carries (nginx's `proxy_send_timeout`: the time
/// between two successive writes, not the whole transfer). Reads are untouched.
pub(crate) struct SendTimed<T> {
    io: T,
    meta: Arc<ConnMeta>,
    /// Armed when a write is first refused, cleared when one makes progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> SendTimed<T> {
    pub(crate) fn new(io: T, meta: Arc<ConnMeta>) -> Self {
        SendTimed { io, meta, stalled: None }
    }

    /// Passes a write's outcome on; a write still waiting past the timeout fails.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let ms = self.meta.send_timeout_ms.load(Relaxed);
        if ms == 0 {
            return Poll::Pending;
        }
        let stalled =
            self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
        if stalled.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, SendTimedOut)));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimed<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
