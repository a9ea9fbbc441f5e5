//! UDP services: one flow per client address and port, each with a socket of its own connected
//! to the endpoint picked for it (round robin), so the endpoint's replies come back on that
//! socket and go to that client.
//!
//! A flow ends when nothing moved either way for `proxy-stream-timeout`, after
//! `proxy-stream-responses` replies, or when the port leaves the table. The flow table holds at
//! most `udp_max_flows` flows: a new client past it evicts the oldest flow (counted). Nothing is
//! queued: a datagram that finds the upstream socket's buffer full is dropped (counted), as the
//! network would.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::log::{Session, StreamLog};
use super::service::{Service, stopped};
use super::stats::{OpenGuard, Stats, millis};
use crate::state::balance::EndpointKey;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;

/// A UDP socket bound on `addr`, registered with the current runtime.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

/// One client's flow.
struct Flow {
    upstream: Arc<UdpSocket>,
    /// Its place in the eviction order.
    seq: u64,
    /// The last datagram either way, in ms after the table's `base`.
    activity: Arc<AtomicU64>,
    /// Bytes received from the client, for the L4 access log.
    received: Arc<AtomicU64>,
    task: AbortHandle,
}

/// The flows of one port, and their order of creation (the oldest is evicted first).
#[derive(Default)]
struct Flows {
    by_client: HashMap<SocketAddr, Flow>,
    order: BTreeMap<u64, SocketAddr>,
    next: u64,
}

impl Flows {
    /// Removes `client`'s flow if it is flow `seq`.
    fn remove(&mut self, client: SocketAddr, seq: u64) {
        if self.by_client.get(&client).is_some_and(|f| f.seq == seq) {
            self.by_client.remove(&client);
            self.order.remove(&seq);
        }
    }
}

/// Receives datagrams on `socket` until `stop`, forwarding each through its client's flow.
pub(crate) async fn serve(
    socket: UdpSocket,
    live: Arc<ArcSwap<Service>>,
    stats: Arc<Stats>,
    max_flows: usize,
    mut stop: watch::Receiver<bool>,
) {
    let socket = Arc::new(socket);
    let flows = Arc::new(Mutex::new(Flows::default()));
    let base = Instant::now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, client) = tokio::select! {
            () = stopped(&mut stop) => break,
            received = socket.recv_from(&mut buf) => match received {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::debug!(%error, "UDP receive failed");
                    continue;
                }
            },
        };
        let known = {
            let flows = flows.lock().unwrap_or_else(|p| p.into_inner());
            flows.by_client.get(&client).map(|f| (f.upstream.clone(), f.activity.clone(), f.received.clone()))
        };
        let fresh = known.is_none();
        let (upstream, activity, received) = match known {
            Some(known) => known,
            None => {
                let service = live.load_full();
                match open(&service, client).await {
                    Ok(upstream) => {
                        start(client, upstream, &service, &socket, &flows, &stats, base, max_flows)
                    }
                    Err(error) => {
                        stats.connect_errors.fetch_add(1, Relaxed);
                        tracing::debug!(%client, backend = %service.spec.backend, %error, "UDP flow not started");
                        continue;
                    }
                }
            }
        };
        activity.store(millis(base), Relaxed);
        // A new socket's write readiness is not known before the reactor saw it: its first
        // datagram waits for it (at once, in practice). Later ones never wait.
        if fresh {
            tokio::select! {
                biased;
                _ = upstream.writable() => {}
                () = super::runtime::sleep(Duration::from_millis(100)) => {}
            }
        }
        match upstream.try_send(&buf[..n]) {
            Ok(sent) => {
                stats.bytes_up.fetch_add(sent as u64, Relaxed);
                received.fetch_add(sent as u64, Relaxed);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                stats.dropped.fetch_add(1, Relaxed);
            }
            // An ICMP error from an earlier datagram (the endpoint's port is closed).
            Err(error) => {
                stats.dropped.fetch_add(1, Relaxed);
                tracing::debug!(%client, %error, "UDP send to the endpoint failed");
            }
        }
    }
    // The port left the table: its flows end with it.
    let mut flows = flows.lock().unwrap_or_else(|p| p.into_inner());
    for (_, flow) in flows.by_client.drain() {
        flow.task.abort();
    }
    flows.order.clear();
}

/// A socket connected to the next endpoint of `service` (with ClientIP affinity, the one
/// `client` sticks to).
async fn open(service: &Service, client: SocketAddr) -> io::Result<UdpSocket> {
    let balancer = &service.balancer;
    let i = service
        .pick_for(client.ip(), &[])
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no ready endpoint"))?;
    service.reached(client.ip(), i);
    let target = match balancer.endpoints()[i].key() {
        EndpointKey::Addr(addr) => *addr,
        EndpointKey::Dns { host, port } => tokio::net::lookup_host((&**host, *port))
            .await?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")))?,
    };
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(target).await?;
    Ok(socket)
}

/// Enters `client`'s new flow in the table (evicting the oldest past `max_flows`) and starts
/// the task that returns its replies.
#[allow(clippy::too_many_arguments)]
fn start(
    client: SocketAddr,
    upstream: UdpSocket,
    service: &Service,
    socket: &Arc<UdpSocket>,
    flows: &Arc<Mutex<Flows>>,
    stats: &Arc<Stats>,
    base: Instant,
    max_flows: usize,
) -> (Arc<UdpSocket>, Arc<AtomicU64>, Arc<AtomicU64>) {
    let upstream = Arc::new(upstream);
    let activity = Arc::new(AtomicU64::new(millis(base)));
    let received = Arc::new(AtomicU64::new(0));
    let mut table = flows.lock().unwrap_or_else(|p| p.into_inner());
    while table.by_client.len() >= max_flows {
        let Some((_, oldest)) = table.order.pop_first() else { break };
        if let Some(flow) = table.by_client.remove(&oldest) {
            flow.task.abort();
            stats.evicted.fetch_add(1, Relaxed);
        }
    }
    let seq = table.next;
    table.next += 1;
    let reply = Replies {
        client,
        upstream: upstream.clone(),
        socket: socket.clone(),
        activity: activity.clone(),
        base,
        idle: service.stream.idle,
        responses: service.stream.responses,
        stats: stats.clone(),
        _open: stats.open(),
        log: service.log.clone().map(|log| FlowLog {
            log,
            time: std::time::SystemTime::now(),
            started: Instant::now(),
            port: socket.local_addr().map_or(service.spec.port, |a| a.port()),
            upstream: upstream.peer_addr().ok(),
            received: received.clone(),
            sent: 0,
        }),
    };
    let flows_weak = Arc::downgrade(flows);
    let task = tokio::spawn(async move {
        reply.run().await;
        if let Some(flows) = flows_weak.upgrade() {
            flows.lock().unwrap_or_else(|p| p.into_inner()).remove(client, seq);
        }
    });
    table.by_client.insert(
        client,
        Flow {
            upstream: upstream.clone(),
            seq,
            activity: activity.clone(),
            received: received.clone(),
            task: task.abort_handle(),
        },
    );
    table.order.insert(seq, client);
    (upstream, activity, received)
}

/// The reply side of a flow.
struct Replies {
    client: SocketAddr,
    upstream: Arc<UdpSocket>,
    socket: Arc<UdpSocket>,
    activity: Arc<AtomicU64>,
    base: Instant,
    idle: Duration,
    responses: u32,
    stats: Arc<Stats>,
    _open: OpenGuard,
    /// The flow's L4 access-log line, written when the flow ends (however it ends: idle, its
    /// replies, evicted, or the port gone).
    log: Option<FlowLog>,
}

/// What a flow's L4 access-log line needs.
struct FlowLog {
    log: Arc<StreamLog>,
    time: std::time::SystemTime,
    started: Instant,
    port: u16,
    upstream: Option<SocketAddr>,
    received: Arc<AtomicU64>,
    sent: u64,
}

impl Drop for Replies {
    fn drop(&mut self) {
        if let Some(flow) = &self.log {
            flow.log.write(&Session {
                time: flow.time,
                duration: flow.started.elapsed(),
                client: self.client,
                protocol: crate::model::L4Protocol::Udp,
                port: flow.port,
                status: 200,
                sent: flow.sent,
                received: flow.received.load(Relaxed),
                upstream: flow.upstream.map(|a| a.to_string()),
            });
        }
    }
}

impl Replies {
    /// Sends the endpoint's replies to the client until the flow is idle or has its replies.
    async fn run(mut self) {
        let mut replies = 0u32;
        loop {
            let since =
                self.base.elapsed().saturating_sub(Duration::from_millis(self.activity.load(Relaxed)));
            if since >= self.idle {
                return;
            }
            let readable = tokio::select! {
                readable = self.upstream.readable() => readable,
                () = super::runtime::sleep(self.idle - since) => continue,
            };
            if let Err(error) = readable {
                tracing::debug!(client = %self.client, %error, "UDP flow ended");
                return;
            }
            // The datagram is copied out of a buffer that lives only until then: an idle flow
            // holds no buffer.
            let datagram = {
                let mut buf = [0u8; MAX_DATAGRAM];
                match self.upstream.try_recv(&mut buf) {
                    Ok(n) => buf[..n].to_vec(),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(error) => {
                        // ICMP port unreachable: the endpoint is not listening.
                        self.stats.connect_errors.fetch_add(1, Relaxed);
                        tracing::debug!(client = %self.client, %error, "UDP flow ended");
                        return;
                    }
                }
            };
            self.activity.store(millis(self.base), Relaxed);
            match self.socket.send_to(&datagram, self.client).await {
                Ok(n) => {
                    self.stats.bytes_down.fetch_add(n as u64, Relaxed);
                    if let Some(flow) = &mut self.log {
                        flow.sent += n as u64;
                    }
                }
                Err(error) => {
                    tracing::debug!(client = %self.client, %error, "UDP reply not delivered");
                }
            }
            replies += 1;
            if self.responses > 0 && replies >= self.responses {
                return;
            }
        }
    }
}
