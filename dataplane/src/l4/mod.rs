//! L4 services: TCP and UDP ports forwarded as they are to a Service's endpoints
//! (ingress-nginx's `--tcp-services-configmap` and `--udp-services-configmap`).
//!
//! An [`L4Proxy`] keeps one listener per (protocol, port) of the table's [`RouteTable::l4`].
//! [`L4Proxy::publish`] diffs the listener set against a new table: new ports are bound (a port
//! that cannot be bound is reported, the others serve), ports that stay get the new service
//! (endpoints, flags, settings) in one atomic swap, removed ports stop accepting while their
//! open TCP connections finish. Each service's balancer ([`Balancer`], round robin as HTTP's)
//! carries its cursor and endpoint state over a swap while its backend stays.
//!
//! - `tcp`: a connection admitted under the proxy's connection limits, its PROXY header read
//!   (first `:PROXY`), an endpoint connected with retries, the PROXY header sent (second
//!   `:PROXY`), then bytes relayed both ways, half-close passed on, cut after the idle timeout.
//! - `pump`: a connection's two directions, each copied through a bounded buffer until a read
//!   fills it, then (`splice`) moved zero-copy with splice(2) through a pipe, pipes pooled per
//!   thread.
//! - `udp`: one flow per client address and port, each with its own connected upstream socket;
//!   replies go back to their client; a flow ends when idle or after its replies; the flow table
//!   is bounded (the oldest flow is evicted and counted); datagrams that find a full socket
//!   buffer are dropped, never queued.
//! - `header`: the PROXY protocol header sent upstream (v1 by default, as nginx; v2 on demand).
//! - `service`: a port's live service and the table's stream settings.
//! - `stats`: per-service counters, read by the controller's metrics.
//! - `log`: the L4 access log, a line per connection or flow when it ends.
//! - `runtime`: the threads the listeners and connections run on, an I/O-only tokio runtime
//!   whose timers a second runtime keeps (no timer wheel consulted at each park).
//! - `heartbeat`: a timer kept pending while a TCP listener accepts, so that connections'
//!   timers never wake the timer runtime's thread (a futex call per connection otherwise).

mod affinity;
mod header;
mod heartbeat;
mod log;
mod pump;
mod runtime;
mod service;
#[cfg(target_os = "linux")]
mod splice;
pub mod stats;
mod tcp;
mod udp;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::model::{Backend, BackendId, L4Protocol, L4Service, RouteTable, UpstreamProtocol};
use crate::proxy::Proxy;
use crate::proxy::limits::ConnLimits;
use crate::state::balance::Balancer;
pub use service::L4Config;
use service::{Service, Stream};
pub use stats::{Stats, StatsSnapshot};

/// A port that could not be bound.
#[derive(Debug)]
pub struct BindError {
    /// TCP or UDP.
    pub protocol: L4Protocol,
    /// The port.
    pub port: u16,
    /// The address tried.
    pub address: IpAddr,
    /// Why.
    pub error: io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.error.kind() {
            io::ErrorKind::AddrInUse => "the port is taken by another process".to_string(),
            io::ErrorKind::PermissionDenied => {
                "permission denied (a port below 1024 needs root or CAP_NET_BIND_SERVICE)".to_string()
            }
            _ => self.error.to_string(),
        };
        write!(f, "cannot listen on {} port {} ({}): {why}", self.protocol, self.port, self.address)
    }
}

/// The counters of one served port.
#[derive(Clone, Debug)]
pub struct ServiceStats {
    /// TCP or UDP.
    pub protocol: L4Protocol,
    /// The port.
    pub port: u16,
    /// The Service port it forwards to.
    pub backend: BackendId,
    /// The counts.
    pub stats: StatsSnapshot,
}

/// A bound port: its live service (swapped by publishes), its counters, and the sender whose
/// drop stops it.
struct Listener {
    live: Arc<ArcSwap<Service>>,
    stats: Arc<Stats>,
    local: SocketAddr,
    _stop: watch::Sender<bool>,
}

type Key = (L4Protocol, u16);

/// The L4 proxy: cheap to clone; its listeners and connections run on threads of its own
/// (`runtime`), started with its first port and stopped when the last clone is dropped.
#[derive(Clone)]
pub struct L4Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    config: L4Config,
    conns: Arc<ConnLimits>,
    /// Started with the first port bound.
    runtime: Mutex<Option<runtime::Runtime>>,
    listeners: Mutex<BTreeMap<Key, Listener>>,
    /// The L4 access log's writer, and the destination of `--access-log`.
    log: (Arc<crate::proxy::accesslog::Writer>, crate::proxy::accesslog::Output),
}

impl fmt::Debug for L4Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("L4Proxy").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl L4Proxy {
    /// An L4 proxy with no port, admitting its TCP connections under `proxy`'s connection limits.
    pub fn new(config: L4Config, proxy: &Proxy) -> L4Proxy {
        L4Proxy {
            inner: Arc::new(Inner {
                config,
                conns: proxy.connection_limits(),
                runtime: Mutex::new(None),
                listeners: Mutex::new(BTreeMap::new()),
                log: {
                    let output = proxy.config().access_log_output.clone();
                    let writer =
                        crate::proxy::accesslog::Writer::new(&output, proxy.config().access_log_queue);
                    (Arc::new(writer), output)
                },
            }),
        }
    }

    /// An L4 proxy with no port and connection limits of its own (`weir node --mode userspace`,
    /// which runs no HTTP proxy).
    pub fn with_limits(config: L4Config, limits: crate::proxy::limits::ConnLimitConfig) -> L4Proxy {
        L4Proxy {
            inner: Arc::new(Inner {
                config,
                conns: Arc::new(ConnLimits::new(limits)),
                runtime: Mutex::new(None),
                listeners: Mutex::new(BTreeMap::new()),
                // The node's proxy writes no access log: it carries every Service's traffic.
                log: {
                    let output = crate::proxy::accesslog::Output::Off;
                    let writer =
                        crate::proxy::accesslog::Writer::new(&output, crate::proxy::accesslog::QUEUE);
                    (Arc::new(writer), output)
                },
            }),
        }
    }

    /// Makes `table`'s L4 services the live ones: binds new ports, swaps the service of ports
    /// that stay, stops the ports that are gone (their open TCP connections finish). Returns
    /// the ports that could not be bound (tried again at the next publish); the others serve.
    pub fn publish(&self, table: &RouteTable) -> Vec<BindError> {
        let stream = Stream::of(&table.settings, &self.inner.config);
        let (writer, flag) = &self.inner.log;
        let logging = &table.settings.logging;
        let output = log::StreamLog::output(logging, flag);
        writer.retarget(&output);
        let stream_log = if output == crate::proxy::accesslog::Output::Off {
            None
        } else {
            log::StreamLog::of(logging, writer)
        };
        let mut listeners = self.inner.listeners.lock().unwrap_or_else(|p| p.into_inner());
        let wanted: BTreeMap<Key, &L4Service> = table.l4.iter().map(|s| ((s.protocol, s.port), s)).collect();
        let gone: Vec<Key> = listeners.keys().filter(|k| !wanted.contains_key(k)).copied().collect();
        for key in gone {
            if let Some(listener) = listeners.remove(&key) {
                tracing::info!(protocol = %key.0, port = key.1, "L4 port removed: no longer accepting; open connections finish");
                drop(listener);
            }
        }
        let mut failed = Vec::new();
        for (key, spec) in wanted {
            let previous = listeners.get(&key).map(|l| l.live.load_full());
            let same = previous.as_ref().filter(|p| p.spec.backend == spec.backend);
            let previous_balancer = same.map(|p| &*p.balancer);
            let backend =
                Backend { protocol: UpstreamProtocol::default(), target: spec.target.clone(), tls: None };
            let service = Arc::new(Service {
                spec: spec.clone(),
                balancer: Arc::new(Balancer::next(previous_balancer, &spec.backend, &backend)),
                stream,
                log: stream_log.clone(),
                affinity: same.map(|p| p.affinity.clone()).unwrap_or_default(),
            });
            if let Some(listener) = listeners.get(&key) {
                listener.live.store(service);
                continue;
            }
            match self.start(key, service) {
                Ok(listener) => {
                    tracing::info!(protocol = %key.0, port = key.1, local = %listener.local, backend = %spec.backend, "L4 port listening");
                    listeners.insert(key, listener);
                }
                Err(error) => failed.push(error),
            }
        }
        failed
    }

    /// Binds `key` and starts serving `service` on it.
    fn start(&self, key: Key, service: Arc<Service>) -> Result<Listener, BindError> {
        let (protocol, port) = key;
        let runtime = self.runtime().map_err(|error| BindError {
            protocol,
            port,
            address: self.inner.config.listen.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            error,
        })?;
        let _entered = runtime.enter();
        let live = Arc::new(ArcSwap::new(service));
        let stats = Arc::new(Stats::default());
        let (stop_tx, stop) = watch::channel(false);
        let addresses = match self.inner.config.listen {
            Some(ip) => vec![ip],
            None => vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED), IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
        };
        let mut last = None;
        for address in addresses {
            let addr = SocketAddr::new(address, port);
            let bound = match protocol {
                L4Protocol::Tcp => crate::proxy::limits::bind(addr, None).and_then(|listener| {
                    let local = listener.local_addr()?;
                    let task = tcp::accept_loop(
                        listener,
                        live.clone(),
                        stats.clone(),
                        self.inner.conns.clone(),
                        tcp::Relay {
                            buffer: self.inner.config.buffer,
                            zero_copy: self.inner.config.zero_copy,
                        },
                        stop.clone(),
                    );
                    runtime.spawn(task);
                    Ok(local)
                }),
                L4Protocol::Udp => udp::bind(addr).and_then(|socket| {
                    let local = socket.local_addr()?;
                    let task = udp::serve(
                        socket,
                        live.clone(),
                        stats.clone(),
                        self.inner.config.udp_max_flows.max(1),
                        stop.clone(),
                    );
                    runtime.spawn(task);
                    Ok(local)
                }),
            };
            match bound {
                Ok(local) => return Ok(Listener { live, stats, local, _stop: stop_tx }),
                // No IPv6 on this host: fall back to IPv4's any address.
                Err(error) if self.inner.config.listen.is_none() && address.is_ipv6() && no_ipv6(&error) => {
                    last = Some(BindError { protocol, port, address, error });
                }
                Err(error) => return Err(BindError { protocol, port, address, error }),
            }
        }
        Err(last.unwrap_or_else(|| BindError {
            protocol,
            port,
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            error: io::Error::other("no address to bind"),
        }))
    }

    /// The L4 runtime's handle, the runtime started if this is the first port.
    fn runtime(&self) -> io::Result<tokio::runtime::Handle> {
        let mut slot = self.inner.runtime.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(runtime) = &*slot {
            return Ok(runtime.handle().clone());
        }
        let runtime = runtime::Runtime::start(self.inner.config.threads)?;
        let handle = runtime.handle().clone();
        *slot = Some(runtime);
        Ok(handle)
    }

    /// Reopens the L4 access log's file (`SIGUSR1`).
    pub fn reopen_log(&self) {
        self.inner.log.0.reopen();
    }

    /// L4 access-log lines dropped so far.
    pub fn log_dropped(&self) -> u64 {
        self.inner.log.0.dropped()
    }

    /// Where the port `port` of `protocol` is bound, if it is served.
    pub fn local_addr(&self, protocol: L4Protocol, port: u16) -> Option<SocketAddr> {
        let listeners = self.inner.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.get(&(protocol, port)).map(|l| l.local)
    }

    /// The counters of every served port, by protocol and port.
    pub fn stats(&self) -> Vec<ServiceStats> {
        let listeners = self.inner.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners
            .iter()
            .map(|(&(protocol, port), l)| ServiceStats {
                protocol,
                port,
                backend: l.live.load().spec.backend.clone(),
                stats: l.stats.snapshot(),
            })
            .collect()
    }

    /// Stops every port (open TCP connections finish).
    pub fn shutdown(&self) {
        self.inner.listeners.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Binding `[::]` failed because the host has no IPv6.
fn no_ipv6(error: &io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    const EADDRNOTAVAIL: i32 = 99;
    matches!(error.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}
