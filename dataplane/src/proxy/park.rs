//! Parking: idle keep-alive connections of the plain listener held by no task
//! (`--http1-server weir`).
//!
//! `h1_idle` frees hyper's state between requests, but an idle connection still has its task
//! (the accept path's future around the driver: ~1.4 KB), its `ConnCtx` and its registration
//! with tokio's reactor: ~3 KB where nginx keeps under 1 KB (bench/RESULTS.md). Once a
//! connection has been idle for a short grace ([`super::ProxyConfig::http1_park_after`], so
//! that busy keep-alive connections do not pay the moves), its task ends and the listener's
//! parking keeps it:
//!
//! - the socket leaves tokio's reactor (`into_std`) and joins the parking's own epoll set,
//!   level-triggered, so bytes that arrived while it moved are reported at once: nothing sent
//!   at the parking moment is lost;
//! - a compact record in the listener's [`lot::Lot`] keeps what the next request needs (the
//!   client address, the request count for `keep-alive-requests`, the keep-alive deadline); the
//!   lot itself holds what must outlive the task: the connection's place under
//!   `--max-connections` (and per client) and its count in the open-connection gauge. 40 bytes
//!   per connection in all (`lot.rs` says how);
//! - one task per listener watches the epoll set (through [`AsyncFd`] on its descriptor) and the
//!   lot's deadlines (no timer per connection; a table swap may change the keep-alive timeout,
//!   which the lot's deadline lists allow for). A readable socket (a request, or the client's
//!   close) goes back to tokio and to a new serving task; at its deadline it is closed (closing
//!   its only descriptor also takes it out of the epoll set);
//! - on drain the parking task closes every parked connection at once, as idle connections
//!   are; it holds a watcher of the listener's graceful shutdown, as resumed connections do
//!   through it, so the drain waits for them.
//!
//! Records move to the parking task through a channel, so the task owns its lot and nothing is
//! locked. TLS connections are not parked: their session state lives in the process.

mod lot;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::HeaderValue;
use hyper_util::server::graceful::Watcher;
use rustix::event::epoll;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use self::lot::{Kept, Lot, Parked};
use super::Proxy;
use super::forward::ConnCtx;
use super::h1_idle::{self, Park, Served};
use super::limits::{ConnGuard, SendTimeout};
use crate::metrics::Listener;

/// Events read from the epoll set per `epoll_wait`.
const EVENTS: usize = 256;

/// A listener's parking, shared by its connections' tasks and its parking task.
pub(super) struct Parking {
    proxy: Proxy,
    listener_port: HeaderValue,
    grace: Duration,
    drain: watch::Receiver<bool>,
    to_park: mpsc::UnboundedSender<Parked>,
    /// Keeps the listener's drain waiting for the parking task and resumed connections.
    _watcher: Watcher,
}

// === impl Parking ===

impl Parking {
    /// Starts the parking of a plain listener; `None` (logged) when its epoll set cannot be
    /// made: connections then stay with their tasks.
    pub(super) fn start(
        proxy: &Proxy,
        grace: Duration,
        listener_port: HeaderValue,
        drain: watch::Receiver<bool>,
        watcher: Watcher,
    ) -> Option<Arc<Parking>> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(std::io::Error::from).and_then(|fd| {
            // SAFETY: `register` requires that `fd.as_raw_fd()` be an open descriptor that keeps
            // referring to the same open file description for the `AsyncFd`'s whole life. An
            // `OwnedFd` is an open descriptor that only its owner closes, and only on drop;
            // the `AsyncFd` takes ownership of it, never gives it out mutably (we only read it
            // through `get_ref`), and drops it only after deregistering it. `as_raw_fd` of an
            // `OwnedFd` always returns the descriptor it owns.
            #[allow(unsafe_code)]
            let registered = unsafe { AsyncFd::register(fd) };
            registered.map_err(std::io::Error::from)
        });
        let epoll = match epoll {
            Ok(epoll) => epoll,
            Err(error) => {
                tracing::warn!(%error, "idle connections cannot be parked: no epoll set");
                return None;
            }
        };
        let (to_park, parked) = mpsc::unbounded_channel();
        let parking = Arc::new(Parking {
            proxy: proxy.clone(),
            listener_port,
            grace,
            drain,
            to_park,
            _watcher: watcher,
        });
        tokio::spawn(parking.clone().run(epoll, parked));
        Some(parking)
    }

    /// Serves a new plain connection (after its PROXY protocol header) until it closes or is
    /// parked.
    pub(super) async fn serve(
        self: Arc<Self>,
        builder: Arc<super::HttpBuilder>,
        stream: TcpStream,
        ctx: Arc<ConnCtx>,
        watcher: Watcher,
        admission: ConnGuard,
    ) {
        let kept = Kept { _admission: admission, _open: ctx.proxy.metrics().open_conn(Listener::Http) };
        self.serve_until_idle(builder, stream, ctx, Some(watcher), kept, None).await;
    }

    /// Serves a connection resumed from parking.
    async fn resume(self: Arc<Self>, parked: Parked) {
        let Parked { socket, client, requests, deadline, kept } = parked;
        let stream = match TcpStream::from_std(socket) {
            Ok(stream) => stream,
            Err(error) => {
                return tracing::debug!(peer = %client, %error, "resuming a parked connection failed");
            }
        };
        let ctx = Arc::new(ConnCtx {
            proxy: self.proxy.clone(),
            peer: client,
            client_ip: HeaderValue::from_str(&client.ip().to_canonical().to_string())
                .unwrap_or_else(|_| HeaderValue::from_static("unknown")),
            listener_port: self.listener_port.clone(),
            https: false,
            client_cert: None,
            requests: AtomicU32::new(requests),
            upstream_deadline: Default::default(),
            stream_deadlines: Default::default(),
            ssl: None,
            sni: None,
        });
        // h2c is sniffed before the first request only: the builder is not used on HTTP/1.
        let builder = self.proxy.inner.state.load().http.clone();
        self.serve_until_idle(builder, stream, ctx, None, kept, Some(deadline)).await;
    }

    async fn serve_until_idle(
        self: Arc<Self>,
        builder: Arc<super::HttpBuilder>,
        stream: TcpStream,
        ctx: Arc<ConnCtx>,
        watcher: Option<Watcher>,
        kept: Kept,
        resumed: Option<Instant>,
    ) {
        let send_timeout = self.proxy.inner.state.load().config.client_send_timeout;
        let stream = SendTimeout::new(stream, send_timeout);
        let park = Park { grace: self.grace, resumed };
        let served =
            h1_idle::serve(builder, stream, ctx.clone(), watcher, self.drain.clone(), Some(park)).await;
        let Served::Idle { io, deadline } = served else { return };
        let client = ctx.peer;
        let socket = match io.into_inner().into_std() {
            Ok(socket) => socket,
            Err(error) => return tracing::debug!(peer = %client, %error, "parking a connection failed"),
        };
        let requests = ctx.requests.load(Ordering::Relaxed);
        // Refused once the listener drains (the parking task is gone): the connection closes.
        let _ = self.to_park.send(Parked { socket, client, requests, deadline, kept });
    }

    /// Moves the proxy's count of parked connections from this lot's `was` to `now`; `now`.
    fn count(&self, was: usize, now: usize) -> usize {
        let parked = &self.proxy.inner.parked;
        match now.cmp(&was) {
            std::cmp::Ordering::Greater => parked.fetch_add(now - was, Ordering::Relaxed),
            std::cmp::Ordering::Less => parked.fetch_sub(was - now, Ordering::Relaxed),
            std::cmp::Ordering::Equal => 0,
        };
        now
    }

    /// The parking task: parks what it is sent, resumes what becomes readable, closes what
    /// reaches its deadline, closes everything on drain.
    async fn run(self: Arc<Self>, epoll: AsyncFd<OwnedFd>, mut to_park: mpsc::UnboundedReceiver<Parked>) {
        let mut drain = self.drain.clone();
        let mut parked = Lot::new(self.proxy.inner.conns.clone(), self.proxy.metrics().clone());
        let mut counted = 0;
        loop {
            // The proxy's count follows this lot's (other listeners add theirs).
            counted = self.count(counted, parked.len());
            let next = parked.next_deadline();
            tokio::select! {
                _ = drain.wait_for(|d| *d) => break,
                Some(conn) = to_park.recv() => {
                    if let Err(conn) = park(&mut parked, epoll.get_ref(), conn) {
                        // Not watched (the epoll set is full): served by a task instead.
                        tokio::spawn(self.clone().resume(conn));
                    }
                }
                ready = epoll.readable() => {
                    let mut guard = match ready {
                        Ok(guard) => guard,
                        Err(error) => {
                            tracing::error!(%error, "the parking's epoll set failed: parked connections closed");
                            break;
                        }
                    };
                    match take_ready(&mut parked, guard.get_inner(), |conn| {
                        tokio::spawn(self.clone().resume(conn));
                    }) {
                        // Cleared unless the reactor saw new events since `readable`.
                        Ok(()) => guard.clear_ready(),
                        Err(error) => {
                            tracing::error!(%error, "the parking's epoll set failed: parked connections closed");
                            break;
                        }
                    }
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    parked.expire(Instant::now());
                }
            }
        }
        let closed = parked.len();
        drop(parked);
        self.count(counted, 0);
        tracing::debug!(closed, "the listener drains: parked connections closed");
    }
}

// === the epoll set ===

/// Parks `conn`: into the lot, its socket into the epoll set; gives it back if epoll refuses it.
fn park(lot: &mut Lot, epoll: &OwnedFd, conn: Parked) -> Result<(), Parked> {
    let Some(key) = lot.insert(conn) else { return Ok(()) };
    let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
    let added = match lot.socket(key) {
        Some(socket) => epoll::add(epoll, socket, epoll::EventData::new_u64(key), flags),
        None => return Ok(()),
    };
    match added {
        Ok(()) => Ok(()),
        Err(error) => {
            tracing::debug!(%error, "a connection could not be parked");
            lot.remove(key).map_or(Ok(()), Err)
        }
    }
}

/// Takes every connection the epoll set reports readable (a request, or the client's close)
/// out of the lot and hands it to `resume`, until the set reports none.
fn take_ready(lot: &mut Lot, epoll: &OwnedFd, mut resume: impl FnMut(Parked)) -> rustix::io::Result<()> {
    let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); EVENTS];
    let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        let (ready, _) = match epoll::wait(epoll, &mut events, Some(&now)) {
            Ok(ready) => ready,
            Err(rustix::io::Errno::INTR) => continue,
            Err(error) => return Err(error),
        };
        let n = ready.len();
        for event in ready.iter() {
            let key = event.data.u64();
            let Some(socket) = lot.socket(key) else { continue };
            if let Err(error) = epoll::delete(epoll, socket) {
                // Not fatal: closing the socket later takes it out anyway; until then its
                // events carry a key no record has any more.
                tracing::debug!(%error, "epoll_ctl(DEL) of a parked connection failed");
            }
            if let Some(conn) = lot.remove(key) {
                resume(conn);
            }
        }
        if n < EVENTS {
            return Ok(());
        }
    }
}
