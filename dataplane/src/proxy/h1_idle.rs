//! HTTP/1 client connections that hold no hyper state while idle (`--http1-server weir`).
//!
//! hyper's HTTP/1 server keeps its read buffer (grown to 16 KiB), its 8 KiB buffer for response
//! heads and the dispatcher's box for a request's future for a connection's whole life: ~34 KB
//! per idle keep-alive connection, where nginx keeps under 1 KB. hyper has no setting to free
//! them, and turning its keep-alive off to take the socket back between requests makes it send
//! `connection: close`.
//!
//! This driver runs one hyper connection per *busy period* instead of one per client
//! connection, and tears it down once it has been idle for a grace (`http1_idle_grace`, 500 ms:
//! a client whose next request comes sooner keeps its hyper connection, which costs less than
//! taking it apart and building another, about 11,000 instructions per request):
//!
//! - idle, the task holds the socket and nothing else: it waits for the next request's first
//!   byte with a one-byte read into the stack (no buffer), for the keep-alive timeout, or for the
//!   listener's drain;
//! - the first byte starts a hyper connection ([`hyper::server::conn::http1`], with upgrades,
//!   the same settings as the default server) over the socket with that byte put back in front
//!   ([`Rewound`]); hyper does everything HTTP/1 (pipelining, `Expect: 100-continue`, chunked
//!   bodies and trailers, HTTP/1.0, upgrades, the head timeout);
//! - it is idle again when hyper waits for a new request head and has read nothing of it, no
//!   request is in flight (no response body alive) and every byte written was flushed
//!   ([`Activity`]). The hyper connection is then taken apart (`into_parts`): the socket comes
//!   back with any bytes hyper had read ahead (a pipelined request's start), which go in front
//!   of the next busy period; hyper's buffers and boxes are freed.
//!
//! "Waits for a head" is learnt from hyper's head-read timer: hyper arms it each time it starts
//! reading a request head (`Conn::poll_read_head`), after the previous exchange, request body
//! included, is over; [`IdleTimer`] records that, and a read that returns bytes clears it.
//!
//! The plain listener's first bytes are checked for the HTTP/2 preface (h2c prior knowledge),
//! which is served as before.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use hyper::rt::Timer;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::deadline::ConnTimer;
use super::forward::ConnCtx;
use super::{HttpBuilder, ProxyConfig};

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the current hyper connection is doing, as seen from its socket, timer and service.
#[derive(Debug, Default)]
struct Activity {
    /// Requests whose response has not ended (its body is alive).
    in_flight: AtomicU32,
    /// hyper started reading a request head and has read no byte since.
    head_wait: AtomicBool,
    /// hyper's last read found nothing to read.
    read_blocked: AtomicBool,
    /// Bytes were written (or offered) since the last completed flush.
    unflushed: AtomicBool,
}

impl Activity {
    fn idle(&self) -> bool {
        self.head_wait.load(Ordering::Relaxed)
            && self.read_blocked.load(Ordering::Relaxed)
            && !self.unflushed.load(Ordering::Relaxed)
            && self.in_flight.load(Ordering::Relaxed) == 0
    }
}

/// When an idle connection is handed back to be parked (`park`).
pub(super) struct Park {
    /// How long the connection must have been idle.
    pub(super) grace: Duration,
    /// Set on a connection resumed from parking: its keep-alive deadline (it is past its first
    /// request: no sniff, no head timeout).
    pub(super) resumed: Option<tokio::time::Instant>,
}

/// How [`serve`] ended.
pub(super) enum Served<S> {
    /// The connection is over (closed by either side, failed, or drained).
    Closed,
    /// Idle for [`Park::grace`], nothing read of a next request: the socket, and when the
    /// keep-alive timeout closes it.
    Idle { io: S, deadline: tokio::time::Instant },
}

/// Serves HTTP/1 (or, sniffed, h2c prior knowledge) on `io` until the client or the server
/// ends it, or (with `park`) until it has been idle for the grace; `drain` turns true when the
/// listener drains. `watcher` is held to be counted by the listener's drain (a resumed
/// connection has none: its parking holds one for it).
pub(super) async fn serve<S>(
    builder: Arc<HttpBuilder>,
    mut io: S,
    ctx: Arc<ConnCtx>,
    watcher: Option<Watcher>,
    mut drain: tokio::sync::watch::Receiver<bool>,
    park: Option<Park>,
) -> Served<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = ctx.peer;
    let mut ahead = Bytes::new();
    let mut resumed = park.as_ref().and_then(|p| p.resumed);
    let mut first = resumed.is_none();
    let grace = park.map(|p| p.grace);
    // How long the connection was already idle when its hyper connection was taken apart.
    let mut idle_for = Duration::ZERO;
    loop {
        // The live table's settings, read once per busy period (not cloned: a guard, dropped).
        let (idle_timeout, keep_alive, head_timeout, max_head) = {
            let state = ctx.proxy.inner.state.load();
            let (idle, keep_alive) = keep_alive(&state.config);
            let max_head = super::client_limits::h1_max_head(&state.config.client_limits);
            (idle, keep_alive, state.config.header_read_timeout, max_head)
        };
        if ahead.is_empty() {
            // Idle: no buffer, no hyper state; the next request's first byte, or the end.
            let mut byte = [0u8; 1];
            let wait = if first { head_timeout } else { idle_timeout.saturating_sub(idle_for) };
            let deadline = resumed.take().unwrap_or_else(|| tokio::time::Instant::now() + wait);
            // Parked after the grace (counted from the last request, hyper's hold included):
            // not before the first request (its sniff), not past the deadline.
            let grace = grace.filter(|_| !first).map(|g| g.saturating_sub(idle_for));
            let read = tokio::select! {
                read = io.read(&mut byte) => read,
                () = tokio::time::sleep_until(deadline) => return Served::Closed,
                () = tokio::time::sleep(grace.unwrap_or_default()), if grace.is_some() => {
                    return Served::Idle { io, deadline };
                }
                _ = drain.wait_for(|d| *d) => return Served::Closed,
            };
            match read {
                Ok(1) => ahead = Bytes::copy_from_slice(&byte),
                Ok(_) => return Served::Closed,
                Err(error) => return closed(peer, &error),
            }
        }
        if first {
            first = false;
            let (h2, read) = match tokio::time::timeout(head_timeout, sniff_h2(&mut io, ahead.clone())).await
            {
                Ok(Ok(sniffed)) => sniffed,
                Ok(Err(error)) => return closed(peer, &error),
                Err(_) => return Served::Closed,
            };
            ahead = read;
            // A first request has its listener's watcher (only resumed connections have none).
            if h2 && let Some(watcher) = watcher {
                serve_h2c(builder, Rewound::new(ahead, io, Arc::default()), ctx, watcher).await;
                return Served::Closed;
            }
        }

        let activity = Arc::new(Activity::default());
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(IdleTimer { inner: ConnTimer::default(), activity: activity.clone() })
            .header_read_timeout(idle_timeout)
            .keep_alive(keep_alive);
        if let Some(max) = max_head {
            http1.max_buf_size(max);
        }
        let service = {
            let ctx = ctx.clone();
            let activity = activity.clone();
            hyper::service::service_fn(move |req| {
                let ctx = ctx.clone();
                let guard = InFlight::new(activity.clone());
                async move {
                    Ok::<_, Infallible>(ctx.handle(req).await.map(|inner| Tracked { inner, _guard: guard }))
                }
            })
        };
        let io_ahead = Rewound::new(std::mem::take(&mut ahead), io, activity.clone());
        // Boxed: the task keeps only a pointer while idle.
        let mut conn = Box::new(http1.serve_connection(TokioIo::new(io_ahead), service).with_upgrades());
        let mut shutting_down = false;
        let mut drained = std::pin::pin!(drain.wait_for(|d| *d));
        // Idle, the connection is taken apart once it has stayed idle for the grace: the timer
        // is made at the period's first idle moment (boxed: one allocation per busy period, not
        // per request) and re-armed at each later one.
        let hold = ctx.proxy.inner.config.http1_idle_grace;
        let mut idle_since: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let mut armed = false;
        let ended = std::future::poll_fn(|cx| {
            if !shutting_down && drained.as_mut().poll(cx).is_ready() {
                shutting_down = true;
                Pin::new(&mut *conn).graceful_shutdown();
            }
            match Pin::new(&mut *conn).poll(cx) {
                Poll::Ready(result) => Poll::Ready(Some(result)),
                Poll::Pending if !shutting_down && activity.idle() => {
                    if hold.is_zero() {
                        return Poll::Ready(None);
                    }
                    if !armed {
                        armed = true;
                        let deadline = tokio::time::Instant::now() + hold;
                        match idle_since.as_mut() {
                            Some(timer) => timer.as_mut().reset(deadline),
                            None => idle_since = Some(Box::pin(tokio::time::sleep_until(deadline))),
                        }
                    }
                    let Some(timer) = idle_since.as_mut() else { return Poll::Pending };
                    match timer.as_mut().poll(cx) {
                        Poll::Ready(()) => Poll::Ready(None),
                        Poll::Pending => Poll::Pending,
                    }
                }
                Poll::Pending => {
                    armed = false;
                    Poll::Pending
                }
            }
        })
        .await;
        match ended {
            Some(Ok(())) => return Served::Closed,
            Some(Err(error)) => return closed(peer, &error),
            None => {}
        }
        // Idle for the hold: take the socket back (with what hyper read ahead) and free the rest.
        idle_for = hold;
        let Some(parts) = conn.into_parts() else { return Served::Closed };
        let Rewound { ahead: unread, io: inner, .. } = parts.io.into_inner();
        io = inner;
        // Copied, not kept: a slice of hyper's read buffer (even an empty one) would keep the
        // whole buffer alive.
        ahead = match (unread.is_empty(), parts.read_buf.is_empty()) {
            (true, true) => Bytes::new(),
            _ => [&unread[..], &parts.read_buf[..]].concat().into(),
        };
    }
}

/// A connection that failed, logged.
fn closed<S>(peer: std::net::SocketAddr, error: &dyn std::fmt::Display) -> Served<S> {
    tracing::debug!(%peer, %error, "connection error");
    Served::Closed
}

/// The idle wait (keep-alive timeout) and whether keep-alive is on, as `http_builder` sets them.
fn keep_alive(config: &ProxyConfig) -> (Duration, bool) {
    match config.keepalive {
        Some(idle) if idle.is_zero() => (config.header_read_timeout, false),
        Some(idle) => (idle, true),
        None => (config.header_read_timeout, true),
    }
}

/// Reads until `ahead` holds 24 bytes or stops being a prefix of the HTTP/2 preface; whether it
/// is the preface, and the bytes read.
async fn sniff_h2<S: AsyncRead + Unpin>(io: &mut S, ahead: Bytes) -> io::Result<(bool, Bytes)> {
    let mut buf = [0u8; 24];
    let mut len = ahead.len().min(24);
    buf[..len].copy_from_slice(&ahead[..len]);
    while len < 24 && buf[..len] == H2_PREFACE[..len] {
        match io.read(&mut buf[len..]).await? {
            0 => break,
            n => len += n,
        }
    }
    let h2 = len == 24 && buf == *H2_PREFACE;
    let mut read = bytes::BytesMut::from(&buf[..len]);
    read.extend_from_slice(&ahead[ahead.len().min(24)..]);
    Ok((h2, read.freeze()))
}

/// h2c prior knowledge on the plain listener, as the default server serves it.
async fn serve_h2c<S>(builder: Arc<HttpBuilder>, io: Rewound<S>, ctx: Arc<ConnCtx>, watcher: Watcher)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = ctx.peer;
    let service = hyper::service::service_fn(move |req| {
        let handled = Box::pin(ctx.clone().handle(req));
        async move { Ok::<_, Infallible>(handled.await) }
    });
    let served = Box::pin(
        watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned()),
    )
    .await;
    if let Err(error) = served {
        tracing::debug!(%peer, %error, "connection error");
    }
}

// === impl Rewound ===

/// The client's socket with bytes already read put back in front, reporting reads, writes and
/// flushes to its [`Activity`].
struct Rewound<S> {
    ahead: Bytes,
    io: S,
    activity: Arc<Activity>,
}

impl<S> Rewound<S> {
    fn new(ahead: Bytes, io: S, activity: Arc<Activity>) -> Self {
        Rewound { ahead, io, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.ahead.is_empty() {
            let n = this.ahead.len().min(buf.remaining());
            buf.put_slice(&this.ahead[..n]);
            this.ahead.advance(n);
            this.activity.head_wait.store(false, Ordering::Relaxed);
            this.activity.read_blocked.store(false, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        match &polled {
            Poll::Pending => this.activity.read_blocked.store(true, Ordering::Relaxed),
            Poll::Ready(_) => {
                this.activity.read_blocked.store(false, Ordering::Relaxed);
                if buf.filled().len() > before {
                    this.activity.head_wait.store(false, Ordering::Relaxed);
                }
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.activity.unflushed.store(true, Ordering::Relaxed);
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.activity.unflushed.store(true, Ordering::Relaxed);
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        if let Poll::Ready(Ok(())) = polled {
            self.activity.unflushed.store(false, Ordering::Relaxed);
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

// === impl IdleTimer ===

/// The connection's head-read timer ([`ConnTimer`]); each time hyper arms it, hyper has begun
/// reading a new request head.
#[derive(Clone)]
struct IdleTimer {
    inner: ConnTimer,
    activity: Arc<Activity>,
}

impl Timer for IdleTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.activity.head_wait.store(true, Ordering::Relaxed);
        self.inner.sleep(duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.activity.head_wait.store(true, Ordering::Relaxed);
        self.inner.sleep_until(deadline)
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        self.activity.head_wait.store(true, Ordering::Relaxed);
        self.inner.reset(sleep, new_deadline);
    }

    fn now(&self) -> std::time::Instant {
        self.inner.now()
    }
}

// === impl InFlight, Tracked ===

/// One request in flight, from its head until its response body is dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in flight while alive.
struct Tracked<B> {
    inner: B,
    _guard: InFlight,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_preface_is_sniffed_across_short_reads_and_other_bytes_are_kept() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            client.write_all(&H2_PREFACE[1..10]).await.unwrap();
            client.write_all(&H2_PREFACE[10..]).await.unwrap();
            client.write_all(b"rest").await.unwrap();
            client
        });
        let (h2, read) = sniff_h2(&mut server, Bytes::from_static(b"P")).await.unwrap();
        assert!(h2);
        assert_eq!(&read[..], &H2_PREFACE[..]);
        drop(writer.await.unwrap());

        let (h2, read) =
            sniff_h2(&mut tokio::io::empty(), Bytes::from_static(b"GET / HTTP/1.1\r\n")).await.unwrap();
        assert!(!h2);
        assert_eq!(&read[..], b"GET / HTTP/1.1\r\n", "nothing lost, nothing read past a mismatch");
        let (h2, read) = sniff_h2(&mut &b"RI * HTTP/1.1\r\n"[..], Bytes::from_static(b"P")).await.unwrap();
        assert!(!h2);
        assert_eq!(&read[..], b"PRI * HTTP/1.1\r\n", "what the read brought, then no more reads");
    }

    #[test]
    fn idle_needs_a_head_wait_a_blocked_read_no_request_and_everything_flushed() {
        let a = Activity::default();
        assert!(!a.idle());
        a.head_wait.store(true, Ordering::Relaxed);
        a.read_blocked.store(true, Ordering::Relaxed);
        assert!(a.idle());
        let guard = InFlight::new(Arc::new(Activity::default()));
        drop(guard);
        a.unflushed.store(true, Ordering::Relaxed);
        assert!(!a.idle(), "unflushed bytes");
        a.unflushed.store(false, Ordering::Relaxed);
        a.in_flight.store(1, Ordering::Relaxed);
        assert!(!a.idle(), "a request in flight");
    }
}
