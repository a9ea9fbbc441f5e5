//! TCP services: accept, admit, read the client's PROXY header, connect an endpoint (retrying
//! others), send the PROXY header, then relay both ways (a bounded copy, splice(2) once a
//! direction's reads fill the buffer) until both sides are done or the connection has been idle
//! for `proxy-stream-timeout`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::Poll;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Sleep;

use super::header;
use super::heartbeat::Heartbeat;
use super::log::Session;
use super::service::{Service, stopped};
use super::stats::Stats;
use crate::proxy::limits::{AcceptBackoff, ConnGuard, ConnLimits};
use crate::proxy::proxy_protocol;
use crate::relay;
use crate::state::balance::EndpointKey;

/// Time a client has to send its PROXY protocol header (ingress-nginx's
/// `proxy-protocol-header-timeout` default).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The client's PROXY protocol header was missing or invalid.
    #[error("{0}")]
    Header(#[from] proxy_protocol::Error),
    /// The client sent no PROXY protocol header in time.
    #[error("no PROXY protocol header within {HEADER_TIMEOUT:?}")]
    HeaderTimeout,
    /// The service has no ready endpoint.
    #[error("no ready endpoint")]
    NoEndpoint,
    /// Every endpoint tried failed.
    #[error("connecting {endpoint} failed after {tries} tries: {error}")]
    Connect {
        /// The last endpoint tried.
        endpoint: String,
        /// Endpoints tried.
        tries: usize,
        /// The last error.
        error: io::Error,
    },
    /// Reading or writing failed, or the connection went idle.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// What woke the accept loop.
enum Next {
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    Stop,
    Beat,
}

/// Accepts in a row after which the accept loop polls its stop before the listener.
const STOP_CHECK: u32 = 32;

/// Accepts connections on `listener` until `stop`, each served with the live service.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    live: Arc<ArcSwap<Service>>,
    stats: Arc<Stats>,
    conns: Arc<ConnLimits>,
    relay: Relay,
    mut stop: watch::Receiver<bool>,
) {
    let local = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let inherit = nodelay_inherited(&listener);
    let mut backoff = AcceptBackoff::default();
    let mut heartbeat = Heartbeat::default();
    // One stop future for the loop's life: made anew per accept it cost a lock of the watch.
    let stop = stopped(&mut stop);
    tokio::pin!(stop);
    let mut in_a_row = 0u32;
    loop {
        // The accept first: while connections are ready the stop and the heartbeat are not
        // polled at all. But the stop first every STOP_CHECK accepts: both are cooperative
        // (tokio's task budget), so under a flood that never drains the backlog a stop polled
        // after the accept only would see an exhausted budget, every time.
        let stop_first = in_a_row >= STOP_CHECK;
        let next = std::future::poll_fn(|cx| {
            if stop_first && stop.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Next::Stop);
            }
            if let Poll::Ready(accepted) = listener.poll_accept(cx) {
                return Poll::Ready(Next::Accepted(accepted));
            }
            if !stop_first && stop.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Next::Stop);
            }
            heartbeat.poll_beat(cx).map(|()| Next::Beat)
        })
        .await;
        let (stream, peer) = match next {
            Next::Stop => return,
            Next::Beat => {
                in_a_row = 0;
                continue;
            }
            Next::Accepted(Ok(pair)) => pair,
            Next::Accepted(Err(error)) => {
                in_a_row = 0;
                let wait = backoff.failed(local, &error);
                if !wait.is_zero() {
                    tokio::select! {
                        () = &mut stop => return,
                        () = super::runtime::sleep(wait) => {}
                    }
                }
                continue;
            }
        };
        in_a_row = if stop_first { 0 } else { in_a_row + 1 };
        backoff.reset();
        // Before the connection's task sets its timers.
        heartbeat.accepted();
        // The connection limits first: a refused connection costs no task and no buffer.
        let admission = match conns.admit() {
            Ok(guard) => guard,
            Err(_) => {
                let _ = stream.set_zero_linger();
                tracing::debug!(%peer, port = local.port(), "L4 connection refused: connection limit reached");
                continue;
            }
        };
        let service = live.load_full();
        let (stats, conns) = (stats.clone(), conns.clone());
        // Boxed: the task then moves a pointer where it moved the whole connection future (its
        // largest state) on spawn and at each stage change.
        tokio::spawn(Box::pin(async move {
            let _open = stats.open();
            let port = local.port();
            // Only the access log needs the clocks.
            let clocks = service.log.as_ref().map(|_| (std::time::SystemTime::now(), Instant::now()));
            let conn = Conn::default();
            if !inherit {
                let _ = stream.set_nodelay(true);
            }
            let result = serve(stream, peer, &service, admission, &conns, &stats, relay, &conn).await;
            if let Err(error) = &result {
                tracing::debug!(%peer, port, backend = %service.spec.backend, %error, "L4 connection ended");
            }
            if let (Some(log), Some((time, started))) = (&service.log, clocks) {
                log.write(&Session {
                    time,
                    duration: started.elapsed(),
                    client: conn.client.get().copied().unwrap_or(peer),
                    protocol: crate::model::L4Protocol::Tcp,
                    port,
                    status: status(&result, &conn),
                    sent: conn.sent.load(Relaxed),
                    received: conn.received.load(Relaxed),
                    upstream: conn.upstream.get().cloned(),
                });
            }
        }));
    }
}

/// What one connection's log line needs.
#[derive(Default)]
struct Conn {
    /// The client the PROXY header named.
    client: std::sync::OnceLock<SocketAddr>,
    /// The endpoint connected.
    upstream: std::sync::OnceLock<String>,
    /// Refused by the per-client limit.
    refused: std::sync::atomic::AtomicBool,
    /// Bytes to and from the client.
    sent: AtomicU64,
    received: AtomicU64,
}

/// nginx's stream `$status` of a connection that ended with `result`.
fn status(result: &Result<(), Error>, conn: &Conn) -> u16 {
    match result {
        _ if conn.refused.load(Relaxed) => 503,
        Ok(()) => 200,
        Err(Error::Header(_) | Error::HeaderTimeout) => 400,
        Err(Error::NoEndpoint | Error::Connect { .. }) => 502,
        // Established, then ended by a side or by the idle timeout.
        Err(Error::Io(_)) => 200,
    }
}

/// Serves one connection.
#[allow(clippy::too_many_arguments)]
async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    service: &Service,
    mut admission: ConnGuard,
    conns: &ConnLimits,
    stats: &Stats,
    relay: Relay,
    conn: &Conn,
) -> Result<(), Error> {
    // The connection's one timer: the PROXY header's deadline, then each connect's, then the
    // idle timeout (one timer registered and removed per connection, not one per phase).
    let first = if service.spec.proxy_protocol_in { HEADER_TIMEOUT } else { service.stream.connect_timeout };
    let timer = super::runtime::sleep(first);
    tokio::pin!(timer);
    let source = if service.spec.proxy_protocol_in {
        let header = tokio::select! {
            biased;
            header = proxy_protocol::read_header(&mut client) => header,
            () = timer.as_mut() => return Err(Error::HeaderTimeout),
        };
        timer.as_mut().reset(tokio::time::Instant::now() + service.stream.connect_timeout);
        header?.unwrap_or(peer)
    } else {
        peer
    };
    // Only the access log names the client (the `OnceLock`'s initialisation saved otherwise).
    if service.log.is_some() {
        let _ = conn.client.set(source);
    }
    if conns.per_client() && conns.admit_client(&mut admission, source.ip()).is_err() {
        conn.refused.store(true, Relaxed);
        let _ = client.set_zero_linger();
        return Ok(());
    }
    let mut upstream = connect(service, stats, source.ip(), timer.as_mut()).await?;
    // Only the access log names the endpoint (a system call and a string saved otherwise).
    if service.log.is_some()
        && let Ok(addr) = upstream.peer_addr()
    {
        let _ = conn.upstream.set(addr.to_string());
    }
    if service.spec.proxy_protocol_out {
        let local = client.local_addr()?;
        upstream.write_all(&header::encode(source, local, service.stream.v2)).await?;
    }
    relay_both(client, upstream, service.stream.idle, relay, stats, conn, &mut admission, timer).await?;
    Ok(())
}

/// Connects an endpoint in round-robin order (first the one `client` sticks to, with ClientIP
/// affinity); a refused or timed-out connect moves to the next endpoint not tried yet, up to
/// the service's tries and next-upstream timeout. `timer` is due at the first try's connect
/// timeout; it is set again for each further try.
async fn connect(
    service: &Service,
    stats: &Stats,
    client: IpAddr,
    mut timer: Pin<&mut Sleep>,
) -> Result<TcpStream, Error> {
    let balancer = &service.balancer;
    let endpoints = balancer.endpoints();
    if endpoints.is_empty() {
        stats.connect_errors.fetch_add(1, Relaxed);
        return Err(Error::NoEndpoint);
    }
    let stream = &service.stream;
    let tries = if stream.tries == 0 { endpoints.len() } else { stream.tries.min(endpoints.len()) };
    let deadline = stream.next_upstream_timeout.map(|t| Instant::now() + t);
    // The endpoints tried, on the stack unless the service tries more than a few.
    let (mut inline, mut spilled) = ([0usize; 8], Vec::new());
    let tried: &mut [usize] = if tries <= inline.len() {
        &mut inline[..tries]
    } else {
        spilled.resize(tries, 0);
        &mut spilled
    };
    let mut count = 0;
    let mut last = None;
    while count < tries {
        if count > 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            timer.as_mut().reset(tokio::time::Instant::now() + stream.connect_timeout);
        }
        let Some(i) = service.pick_for(client, &tried[..count]) else { break };
        tried[count] = i;
        count += 1;
        let endpoint = &endpoints[i];
        let connected = tokio::select! {
            biased;
            connected = connect_to(endpoint.key()) => Some(connected),
            () = timer.as_mut() => None,
        };
        let error = match connected {
            Some(Ok(upstream)) => {
                service.reached(client, i);
                return Ok(upstream);
            }
            Some(Err(error)) => error,
            None => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection within {:?} (proxy-connect-timeout)", stream.connect_timeout),
            ),
        };
        endpoint.record_failure();
        stats.connect_errors.fetch_add(1, Relaxed);
        tracing::debug!(endpoint = %endpoint.key(), backend = %service.spec.backend, %error, "L4 connect failed");
        last = Some((endpoint.key().to_string(), error));
    }
    let (endpoint, error) = last.unwrap_or_else(|| (String::new(), io::Error::other("no endpoint tried")));
    Err(Error::Connect { endpoint, tries: count, error })
}

/// A connection to `key`, with `TCP_NODELAY` (both sides of a relay pass small writes on at
/// once, as nginx's `tcp_nodelay` and HAProxy do).
async fn connect_to(key: &EndpointKey) -> io::Result<TcpStream> {
    match key {
        EndpointKey::Addr(addr) => connect_addr(*addr).await,
        EndpointKey::Dns { host, port } => {
            let stream = TcpStream::connect((&**host, *port)).await?;
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
    }
}

/// Connects `addr` in three system calls before the wait: `socket` (non-blocking from the
/// start), `TCP_NODELAY`, `connect`. Success is read from the readiness event itself: a failed
/// connect is reported with `EPOLLERR`/`EPOLLHUP`, and only then is `SO_ERROR` asked for the
/// reason (tokio's `connect` asks it every time).
async fn connect_addr(addr: SocketAddr) -> io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    let socket = rustix::net::socket_with(family, SocketType::STREAM, flags, None)?;
    let _ = rustix::net::sockopt::set_tcp_nodelay(&socket, true);
    match rustix::net::connect(&socket, &addr) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(error) => return Err(error.into()),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    let ready = stream.ready(tokio::io::Interest::WRITABLE).await?;
    if ready.is_error() || ready.is_write_closed() {
        return Err(stream.take_error()?.unwrap_or_else(|| io::ErrorKind::ConnectionRefused.into()));
    }
    Ok(stream)
}

/// Sets `TCP_NODELAY` on `listener`, which the connections it accepts inherit on Linux (one
/// system call per listener instead of one per connection). `false`: set it per connection.
fn nodelay_inherited(listener: &TcpListener) -> bool {
    cfg!(target_os = "linux") && rustix::net::sockopt::set_tcp_nodelay(listener, true).is_ok()
}

/// How a TCP connection's bytes are relayed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Relay {
    /// The copy buffer per direction, and the pipe capacity asked for when splicing.
    pub(crate) buffer: usize,
    /// splice(2) for a direction whose reads fill the copy buffer.
    pub(crate) zero_copy: bool,
}

/// Relays both ways until both directions reached end of stream (each end passed on as a
/// half-close), a side failed, or nothing moved for `idle` (`timer`, the connection's, keeps
/// it): each direction copies through a buffer of `relay.buffer` bytes and, when `relay`
/// allows it, turns to splice(2) after a read that fills it, its pipe's descriptors counted in
/// `admission` while it holds it ([`pump`](super::pump)).
#[allow(clippy::too_many_arguments)]
async fn relay_both(
    client: TcpStream,
    upstream: TcpStream,
    idle: Duration,
    relay: Relay,
    stats: &Stats,
    conn: &Conn,
    admission: &mut ConnGuard,
    timer: Pin<&mut Sleep>,
) -> io::Result<()> {
    let base = Instant::now();
    let activity = AtomicU64::new(0);
    let meter = |bytes| super::stats::Meter { activity: &activity, base, bytes };
    let splicing = relay.zero_copy.then(|| super::pump::Splicing::new(admission, &stats.spliced));
    let relayed = super::pump::relay(
        &client,
        &upstream,
        relay.buffer,
        splicing.as_ref(),
        meter([&stats.bytes_up, &conn.received]),
        meter([&stats.bytes_down, &conn.sent]),
    );
    tokio::select! {
        biased;
        done = relayed => done,
        () = relay::idle_for(idle, &activity, base, timer) => Err(relay::idle_error(idle)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A port removed while its backlog stays full still stops: the accept loop polls its stop
    /// before the listener every `STOP_CHECK` accepts. (Both are cooperative: with the accept
    /// always polled first, a stop never got a task budget while connections kept coming, and
    /// here all 300 queued connections were taken before the stop was seen.) The connection
    /// limit is full, so each accepted connection is refused and counted, not served.
    #[test]
    fn a_stop_is_seen_while_connections_keep_coming() {
        use crate::model::{Endpoint, L4Protocol, L4Service, Settings, Target};
        use crate::proxy::limits::{ConnLimitConfig, ConnLimits};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let listener = crate::proxy::limits::bind("127.0.0.1:0".parse().unwrap(), Some(1024)).unwrap();
            let addr = listener.local_addr().unwrap();
            // More than tokio's task budget (128) queued before the loop runs.
            let clients: Vec<std::net::TcpStream> =
                (0..300).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
            let spec = L4Service {
                port: addr.port(),
                protocol: L4Protocol::Tcp,
                backend: "default/svc:9000".parse().unwrap(),
                target: Target::Endpoints(vec![Endpoint::new("127.0.0.1:9".parse().unwrap())]),
                proxy_protocol_in: false,
                proxy_protocol_out: false,
                client_ip_affinity_s: None,
            };
            let backend = crate::model::Backend {
                protocol: Default::default(),
                target: spec.target.clone(),
                tls: None,
            };
            let service = Service {
                balancer: Arc::new(crate::state::balance::Balancer::next(None, &spec.backend, &backend)),
                spec,
                stream: super::super::service::Stream::of(&Settings::default(), &Default::default()),
                log: None,
                affinity: Default::default(),
            };
            let conns = Arc::new(ConnLimits::new(ConnLimitConfig { max: 1, ..Default::default() }));
            let _full = conns.admit().unwrap();
            let (stop_tx, stop) = watch::channel(false);
            let relay = Relay { buffer: 16 * 1024, zero_copy: false };
            let live = Arc::new(ArcSwap::from_pointee(service));
            let run = tokio::spawn(accept_loop(
                listener,
                live,
                Arc::new(Stats::default()),
                conns.clone(),
                relay,
                stop,
            ));
            // The loop's first turn: it takes connections until its task budget runs out.
            while conns.stats().refused_total == 0 {
                tokio::task::yield_now().await;
            }
            let before = conns.stats().refused_total;
            stop_tx.send(true).unwrap();
            tokio::time::timeout(Duration::from_secs(10), run)
                .await
                .expect("the accept loop did not stop")
                .unwrap();
            let after = conns.stats().refused_total;
            assert!(
                before < 300,
                "the first turn took every queued connection ({before}): no backlog left to test"
            );
            assert!(
                after - before <= u64::from(STOP_CHECK),
                "{} connections accepted after the stop ({before} before it)",
                after - before
            );
            drop(clients);
        });
    }

    /// The listener's `TCP_NODELAY` reaches the connections it accepts (so no connection sets
    /// it), and an upstream connection has it too.
    #[tokio::test]
    async fn both_sides_have_nodelay() {
        let listener = crate::proxy::limits::bind("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(nodelay_inherited(&listener) || !cfg!(target_os = "linux"));
        let upstream = connect_addr(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap(), "accepted without TCP_NODELAY");
        assert!(upstream.nodelay().unwrap(), "upstream without TCP_NODELAY");
        // The connection works both ways.
        let (mut a, mut u) = (accepted, upstream);
        u.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        a.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }

    /// A port nobody listens on: the connect fails as refused (so the caller tries the next
    /// endpoint), read from the readiness event.
    #[tokio::test]
    async fn a_refused_connect_is_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let error = connect_addr(addr).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    }
}
