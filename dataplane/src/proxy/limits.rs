//! Overload limits of the listeners: how many client connections are admitted (in all and per
//! client address), the listen backlog, what the accept loop does when the process runs out of
//! file descriptors, and the send timeout that cuts a client which stops reading.
//!
//! Every limit refuses cleanly and early: a connection past [`ConnLimits`] is reset at once
//! (`SO_LINGER` 0: no `TIME_WAIT`, no task, no buffer), before weir has read a byte of it, and
//! logged at most a few lines a second. The descriptor budget comes first: by default the
//! connection limit is derived from `RLIMIT_NOFILE` (two descriptors per proxied connection:
//! the client's and the upstream's), so that weir refuses connections before `accept` fails with
//! `EMFILE`. The limit counts descriptor pairs held, not only connections: an L4 connection
//! relayed with splice(2) holds a pipe per spliced direction besides its two sockets (up to six
//! descriptors) and counts a pair more per pipe while it holds it (`ConnGuard::hold_pipe`;
//! without room that direction copies instead). If it
//! fails anyway (a limit set too high, descriptors held elsewhere), the accept loop backs off
//! exponentially instead of spinning on a listener that stays readable, and existing
//! connections keep being served.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket};

use crate::stall::Stall;

/// Descriptors kept out of the connection budget: listeners, the manifest watcher, log files,
/// the API server's connections, DNS lookups.
const RESERVED_FDS: u64 = 128;

/// The listen backlog when the kernel's `somaxconn` cannot be read (Linux's default since 5.4).
const FALLBACK_BACKLOG: u32 = 4096;

/// The kernel's `net.core.somaxconn`: the largest listen backlog it grants.
pub fn somaxconn() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(FALLBACK_BACKLOG)
}

/// Binds a listener on `addr` with a listen backlog of `backlog` connections (`None`: the
/// kernel's `somaxconn`, the most it grants; nginx uses 511 and tokio, as std, 128, which a
/// burst of connects overflows, and an overflowing backlog drops SYNs: the client retries after
/// a second). Must run inside a tokio runtime.
pub fn bind(addr: SocketAddr, backlog: Option<u32>) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // A restarted weir can bind while connections of the old one linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.filter(|n| *n > 0).unwrap_or_else(somaxconn))
}

/// The connection limit that fits `nofile` open files: two descriptors per connection (the
/// client's and its upstream's) after a reserve, at least one.
pub fn connections_for_fd_limit(nofile: u64) -> usize {
    let budget = nofile.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(budget).unwrap_or(usize::MAX).max(1)
}

/// How many client connections the listeners admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimitConfig {
    /// Client connections open at once over every listener (plain, TLS, passthrough), in pairs
    /// of descriptors: a connection counts one, an L4 connection relayed with splice(2) one
    /// more per pipe (one per spliced direction).
    pub max: usize,
    /// Client connections open at once from one client address (after the PROXY protocol
    /// header, where one is expected); `0`: no per-client limit.
    pub per_client: u32,
}

impl Default for ConnLimitConfig {
    fn default() -> Self {
        ConnLimitConfig { max: 16_384, per_client: 0 }
    }
}

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `--max-connections` reached.
    Total,
    /// `--max-connections-per-client` reached for this address.
    PerClient,
}

/// Connections open, in the high 32 bits of [`ConnLimits::held`].
const ONE_CONN: u64 = 1 << 32;
/// Descriptor pairs held, in the low 32 bits of [`ConnLimits::held`].
const PAIRS: u64 = (1 << 32) - 1;

/// The admitted connections, counted; shared by every listener of a proxy.
#[derive(Debug)]
pub struct ConnLimits {
    config: ConnLimitConfig,
    /// `max`, as the descriptor pairs [`ConnLimits::held`] may reach (at most `PAIRS`).
    max_pairs: u64,
    /// Connections open (high 32 bits) and the descriptor pairs they hold (low 32 bits: one per
    /// connection, one more per pipe of a spliced L4 connection): one atomic, so admitting or
    /// closing a connection is one read-modify-write.
    held: AtomicU64,
    /// Open connections per client address, only with a per-client limit.
    clients: Mutex<HashMap<IpAddr, u32>>,
    refused_total: AtomicU64,
    refused_per_client: AtomicU64,
}

/// Counts of [`ConnLimits`], for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Client connections open now.
    pub open: usize,
    /// Connections refused because `max` was reached, since start.
    pub refused_total: u64,
    /// Connections refused because their client had `per_client` open, since start.
    pub refused_per_client: u64,
}

impl ConnLimits {
    /// Limits per `config`.
    pub fn new(config: ConnLimitConfig) -> Self {
        ConnLimits {
            config: ConnLimitConfig { max: config.max.max(1), ..config },
            max_pairs: u64::try_from(config.max.max(1)).unwrap_or(PAIRS).min(PAIRS),
            held: AtomicU64::new(0),
            clients: Mutex::new(HashMap::new()),
            refused_total: AtomicU64::new(0),
            refused_per_client: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn config(&self) -> ConnLimitConfig {
        self.config
    }

    /// The counts now.
    pub fn stats(&self) -> ConnStats {
        ConnStats {
            open: usize::try_from(self.held.load(Ordering::Relaxed) >> 32).unwrap_or(usize::MAX),
            refused_total: self.refused_total.load(Ordering::Relaxed),
            refused_per_client: self.refused_per_client.load(Ordering::Relaxed),
        }
    }

    /// Admits one more connection under the total limit; `None` (counted) past it.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<ConnGuard, Refusal> {
        let admitted = self.held.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
            (n & PAIRS < self.max_pairs).then_some(n + ONE_CONN + 1)
        });
        if admitted.is_err() {
            self.refused_total.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Total);
        }
        Ok(ConnGuard { limits: self.clone(), client: None, pipes: 0, parked: false })
    }

    /// Counts `guard`'s connection against `client`'s share; `Err` (counted) when the client
    /// already has its limit open.
    pub(crate) fn admit_client(&self, guard: &mut ConnGuard, client: IpAddr) -> Result<(), Refusal> {
        if self.config.per_client == 0 || guard.client.is_some() {
            return Ok(());
        }
        let client = client.to_canonical();
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let open = clients.entry(client).or_insert(0);
        if *open >= self.config.per_client {
            drop(clients);
            self.refused_per_client.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::PerClient);
        }
        *open += 1;
        guard.client = Some(client);
        Ok(())
    }

    /// Whether a per-client limit is set.
    pub(crate) fn per_client(&self) -> bool {
        self.config.per_client > 0
    }

    /// The guard of a parked connection resumed: its place, still held since
    /// [`ConnGuard::into_parked`], counted against `client` if it was.
    pub(crate) fn resume_parked(self: &Arc<Self>, client: Option<IpAddr>) -> ConnGuard {
        ConnGuard { limits: self.clone(), client, pipes: 0, parked: false }
    }

    /// Gives back the place of a parked connection closed ([`ConnGuard::into_parked`]).
    pub(crate) fn release_parked(&self, client: Option<IpAddr>) {
        self.give_back(client, 0);
    }

    /// Gives back one connection's place (with its `pipes`), and its client's.
    fn give_back(&self, client: Option<IpAddr>, pipes: u8) {
        self.held.fetch_sub(ONE_CONN + 1 + u64::from(pipes), Ordering::AcqRel);
        if let Some(client) = client {
            let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(open) = clients.get_mut(&client) {
                *open = open.saturating_sub(1);
                if *open == 0 {
                    clients.remove(&client);
                }
            }
        }
    }
}

/// One admitted connection: its place is given back when it is dropped.
#[derive(Debug)]
pub(crate) struct ConnGuard {
    limits: Arc<ConnLimits>,
    client: Option<IpAddr>,
    /// The pipes it also holds (a descriptor pair each).
    pipes: u8,
    /// Its place was handed over to a parked connection's record (`into_parked`).
    parked: bool,
}

impl ConnGuard {
    /// Counts the pipe (two descriptors) a direction of a spliced relay is about to take, if the
    /// limit has room for it; `false`: it has not, and the direction copies instead (the
    /// connection is never refused for it). Counted until the guard is dropped.
    pub(crate) fn hold_pipe(&mut self) -> bool {
        let max = self.limits.max_pairs;
        let held = self
            .limits
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| ((n & PAIRS) < max).then_some(n + 1))
            .is_ok();
        self.pipes += u8::from(held);
        held
    }

    /// The pipes counted now.
    pub(crate) fn pipes(&self) -> u8 {
        self.pipes
    }

    /// Gives back one pipe [`ConnGuard::hold_pipe`] counted (it was not taken after all).
    pub(crate) fn release_pipe(&mut self) {
        if self.pipes > 0 {
            self.pipes -= 1;
            self.limits.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Gives back every pipe counted.
    fn release_pipes(&mut self) {
        let pipes = std::mem::take(&mut self.pipes);
        self.limits.held.fetch_sub(u64::from(pipes), Ordering::AcqRel);
    }

    /// Ends the guard with its place still held, for a parked connection's record, which holds
    /// no guard (`proxy::park`): [`ConnLimits::resume_parked`] makes a guard of it again,
    /// [`ConnLimits::release_parked`] gives it back. The client it counts against, if any.
    pub(crate) fn into_parked(mut self) -> Option<IpAddr> {
        self.release_pipes();
        self.parked = true;
        self.client
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if !self.parked {
            self.limits.give_back(self.client, self.pipes);
        }
    }
}

// === impl AcceptBackoff ===

/// What the accept loop does after `accept` failed: errors that mean the process or the system
/// is out of a resource (descriptors, socket buffers, memory) wait, doubling from 10 ms up to
/// 1 s, because the listener stays readable and retrying at once would spin a core; any other
/// error (a connection reset before it was accepted) is retried at once. The first successful
/// accept resets the wait.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    wait: Option<Duration>,
    /// Failures since the last log line, and when that was.
    unlogged: u64,
    logged_at: Option<std::time::Instant>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

impl AcceptBackoff {
    /// A connection was accepted.
    pub(crate) fn reset(&mut self) {
        self.wait = None;
    }

    /// How long to wait after `error` (zero: retry now); logs resource exhaustion at most once
    /// a second, with the number of failures in between.
    pub(crate) fn failed(&mut self, local: SocketAddr, error: &io::Error) -> Duration {
        if !is_resource_exhaustion(error) {
            tracing::debug!(%local, %error, "accept failed");
            return Duration::ZERO;
        }
        let wait = self.wait.map_or(BACKOFF_MIN, |w| (w * 2).min(BACKOFF_MAX));
        self.wait = Some(wait);
        self.unlogged += 1;
        let due = self.logged_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
        if due {
            tracing::warn!(
                %local,
                %error,
                failures = self.unlogged,
                backoff_ms = wait.as_millis() as u64,
                "accept failed: out of descriptors or buffers; new connections wait in the backlog, open ones are still served (raise the open-file limit or lower --max-connections)"
            );
            self.unlogged = 0;
            self.logged_at = Some(std::time::Instant::now());
        }
        wait
    }
}

/// `EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`: the accept failed for want of a resource, and will
/// fail again until something is freed.
fn is_resource_exhaustion(error: &io::Error) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(error.raw_os_error(), Some(EMFILE | ENFILE | ENOBUFS | ENOMEM))
        || error.kind() == io::ErrorKind::OutOfMemory
}

// === impl SendTimeout ===

/// A client connection whose writes must make progress within `timeout` (nginx's
/// `send_timeout`): a client that stops reading a response (or a WebSocket's messages) blocks
/// weir's writes once the socket buffers are full; after `timeout` without a byte taken, the
/// write fails with `TimedOut` and the connection is closed. What weir holds for the client
/// meanwhile is bounded by the socket buffer and one body frame: the upstream is not read
/// further while the client does not read.
///
/// A connection whose writes never wait pays nothing for it ([`Stall`]).
pub(crate) struct SendTimeout<S> {
    io: S,
    timeout: Duration,
    stall: Stall,
}

impl<S> SendTimeout<S> {
    pub(crate) fn new(io: S, timeout: Duration) -> Self {
        SendTimeout { io, timeout, stall: Stall::default() }
    }

    /// The connection, without its send timeout.
    pub(crate) fn into_inner(self) -> S {
        self.io
    }

    /// Called with the result of a write-side poll: progress ends the wait; `Pending` starts
    /// one (or continues it) and fails once it has lasted `timeout`.
    fn track<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stall.progressed();
            return polled;
        }
        ready!(self.stall.poll_expired(cx, self.timeout));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took nothing for {:?} (send timeout)", self.timeout),
        )))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.track(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.track(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.track(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.track(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_budget_leaves_a_reserve_and_two_descriptors_per_connection() {
        assert_eq!(connections_for_fd_limit(1024), 448);
        assert_eq!(connections_for_fd_limit(1_048_576), 524_224);
        assert_eq!(connections_for_fd_limit(64), 1, "never zero");
    }

    #[test]
    fn limits_count_and_give_back_places() {
        let limits = Arc::new(ConnLimits::new(ConnLimitConfig { max: 3, per_client: 2 }));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let mut first = limits.admit().unwrap();
        limits.admit_client(&mut first, a).unwrap();
        let mut second = limits.admit().unwrap();
        limits.admit_client(&mut second, mapped).unwrap();
        let mut third = limits.admit().unwrap();
        assert_eq!(
            limits.admit_client(&mut third, a),
            Err(Refusal::PerClient),
            "v4-mapped is the same client"
        );
        assert_eq!(limits.admit().err(), Some(Refusal::Total));
        drop(third);
        drop(first);
        let mut again = limits.admit().unwrap();
        limits.admit_client(&mut again, a).unwrap();
        assert_eq!(limits.stats(), ConnStats { open: 2, refused_total: 1, refused_per_client: 1 });
        drop((second, again));
        assert!(limits.clients.lock().unwrap().is_empty(), "no entry left for a gone client");
    }

    /// A spliced connection's pipes are counted while it holds them (a pair of descriptors
    /// each, three pairs with both directions spliced); a pipe that does not fit is refused,
    /// never the connection that asked; the open-connections count stays a count of connections.
    #[test]
    fn pipes_count_as_the_descriptors_they_hold() {
        let limits = Arc::new(ConnLimits::new(ConnLimitConfig { max: 4, per_client: 0 }));
        let mut spliced = limits.admit().unwrap();
        assert!(spliced.hold_pipe(), "1 + 1 pairs of 4");
        assert!(spliced.hold_pipe(), "1 + 2 pairs of 4");
        let mut copied = limits.admit().unwrap();
        assert!(!copied.hold_pipe(), "4 + 1 pairs of 4: no room, the direction copies");
        assert_eq!(limits.stats().open, 2, "two connections");
        assert_eq!(limits.admit().err(), Some(Refusal::Total), "6 descriptors + 2 of 8 held");
        spliced.release_pipe();
        assert!(copied.hold_pipe(), "a pipe given back makes room");
        assert!(!copied.hold_pipe(), "and only for one");
        drop(spliced);
        assert!(copied.hold_pipe(), "the pipes given back make room");
        assert_eq!(limits.stats().open, 1);
        let third = limits.admit().unwrap();
        assert_eq!(limits.admit().err(), Some(Refusal::Total));
        drop((copied, third));
        assert_eq!(limits.held.load(Ordering::Relaxed), 0, "everything given back");
        let _fresh: Vec<_> = (0..4).map(|_| limits.admit().unwrap()).collect();
    }

    #[test]
    fn backoff_doubles_on_exhaustion_only_and_resets() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut backoff = AcceptBackoff::default();
        let emfile = io::Error::from_raw_os_error(24);
        let reset = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(backoff.failed(local, &reset), Duration::ZERO);
        let waits: Vec<_> = (0..9).map(|_| backoff.failed(local, &emfile).as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.failed(local, &io::Error::from_raw_os_error(23)), BACKOFF_MIN);
    }
}
