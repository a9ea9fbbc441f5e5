//! Echo replicas for a scenario, each on its own loopback IP, sharing one port per backend.
//!
//! An EndpointSlice has one port for all its endpoints, so the replicas of a backend listen on
//! distinct loopback addresses (127.0.0.2, 127.0.0.3, ...) with the same port. Addresses are
//! handed out from a process-wide counter so scenarios running in parallel never share one.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::scenario::Addresses;

/// How often to retry a backend when its port is taken on one of the addresses.
const BIND_ATTEMPTS: usize = 20;

/// The next loopback address to hand out, as an offset in 127.0.0.0/8.
static NEXT_IP: AtomicU32 = AtomicU32::new(2);

/// The first octet of the /8 the replicas' addresses come from (127 unless changed).
static BLOCK: AtomicU8 = AtomicU8::new(127);

/// Hands out replica addresses from `first_octet`.0.0.0/8 instead of 127.0.0.0/8, for runs
/// through an API server (which refuses loopback Endpoints). That block must be local: for
/// example `ip addr add 10.0.0.1/8 dev lo` in a private network namespace.
pub fn use_address_block(first_octet: u8) {
    BLOCK.store(first_octet, Ordering::Relaxed);
}

/// Running echo replicas. Dropping this stops them.
#[derive(Debug)]
pub struct Backends {
    ips: BTreeMap<String, Ipv4Addr>,
    ports: BTreeMap<String, u16>,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<io::Result<()>>>,
    /// A memcached for the scenario (`memcached: true`): where it listens, and its process.
    memcached: Option<(SocketAddr, std::process::Child)>,
}

impl Backends {
    /// Starts `replicas[backend]` echo servers for every backend.
    pub async fn start(replicas: &BTreeMap<&str, Vec<String>>) -> io::Result<Backends> {
        let mut backends = Backends {
            ips: BTreeMap::new(),
            ports: BTreeMap::new(),
            stops: Vec::new(),
            tasks: Vec::new(),
            memcached: None,
        };
        for (backend, names) in replicas {
            let ips: Vec<Ipv4Addr> = names.iter().map(|_| next_ip()).collect();
            let (port, listeners) = bind_shared_port(&ips).await?;
            backends.ports.insert((*backend).to_owned(), port);
            for ((name, ip), listener) in names.iter().zip(ips).zip(listeners) {
                backends.ips.insert(name.clone(), ip);
                let (stop, stopped) = oneshot::channel::<()>();
                let shutdown = async move {
                    // Sent or dropped: either way, stop.
                    let _stopped = stopped.await;
                };
                backends.stops.push(stop);
                backends.tasks.push(tokio::spawn(weir_dataplane::echo::serve(
                    listener,
                    name.clone(),
                    shutdown,
                )));
            }
        }
        Ok(backends)
    }

    /// The address replica `name` listens on.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        let ip = self.ips.get(name)?;
        let backend = name.rsplit_once('-')?.0;
        let port = self.ports.get(backend)?;
        Some(SocketAddr::new(IpAddr::V4(*ip), *port))
    }

    /// Starts Debian's `memcached` on an address of its own, for `{{ip:memcached}}` and
    /// `{{port:memcached}}`; it is killed with the replicas. `NotFound` when it is not installed.
    pub async fn start_memcached(&mut self) -> io::Result<()> {
        let ip = next_ip();
        // A free port on that address: bound and released, then given to memcached.
        let port = TcpListener::bind((ip, 0)).await?.local_addr()?.port();
        let child = std::process::Command::new("memcached")
            .args(["-l", &ip.to_string(), "-p", &port.to_string(), "-U", "0", "-u", "root", "-m", "16"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|error| {
                io::Error::new(
                    error.kind(),
                    format!("cannot start memcached ({error}); `scripts/test.sh install` installs it"),
                )
            })?;
        let addr = SocketAddr::new(IpAddr::V4(ip), port);
        self.memcached = Some((addr, child));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(io::Error::other(format!("memcached does not accept connections on {addr}")));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stops every replica (and memcached) and waits for their listeners to close.
    pub async fn stop(mut self) {
        if let Some((_, mut child)) = self.memcached.take() {
            kill(&mut child);
        }
        self.stops.clear();
        for task in self.tasks.drain(..) {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(%error, "echo replica failed"),
                Err(error) => tracing::warn!(%error, "echo replica task failed"),
            }
        }
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        if let Some((_, mut child)) = self.memcached.take() {
            kill(&mut child);
        }
    }
}

fn kill(child: &mut std::process::Child) {
    if let Err(error) = child.kill() {
        tracing::warn!(%error, "cannot stop memcached");
    }
    // Reaped, so that no zombie is left behind.
    let _status = child.wait();
}

impl Addresses for Backends {
    fn ip(&self, replica: &str) -> Option<String> {
        match (&self.memcached, self.ips.get(replica)) {
            (_, Some(ip)) => Some(ip.to_string()),
            (Some((addr, _)), None) if replica == "memcached" => Some(addr.ip().to_string()),
            _ => None,
        }
    }

    fn port(&self, backend: &str) -> Option<u16> {
        match (&self.memcached, self.ports.get(backend)) {
            (_, Some(port)) => Some(*port),
            (Some((addr, _)), None) if backend == "memcached" => Some(addr.port()),
            _ => None,
        }
    }
}

/// A loopback address not handed out before in this process (never 127.0.0.1, nor .0/.255).
fn next_ip() -> Ipv4Addr {
    loop {
        let n = NEXT_IP.fetch_add(1, Ordering::Relaxed) % (1 << 24);
        let [_, b, c, d] = n.to_be_bytes();
        if d != 0 && d != 255 && n > 1 {
            return Ipv4Addr::new(BLOCK.load(Ordering::Relaxed), b, c, d);
        }
    }
}

/// Binds every address on one port: the first on an ephemeral port, the others on the same
/// port, starting over on a collision.
async fn bind_shared_port(ips: &[Ipv4Addr]) -> io::Result<(u16, Vec<TcpListener>)> {
    let Some((first, others)) = ips.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a backend needs at least one replica"));
    };
    let mut last_error = None;
    'attempt: for _ in 0..BIND_ATTEMPTS {
        let listener = TcpListener::bind((*first, 0)).await.map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot bind {first}:0 (is 127.0.0.0/8 routed to loopback?): {error}"),
            )
        })?;
        let port = listener.local_addr()?.port();
        let mut listeners = vec![listener];
        for ip in others {
            match TcpListener::bind((*ip, port)).await {
                Ok(listener) => listeners.push(listener),
                Err(error) if error.kind() == io::ErrorKind::AddrInUse => {
                    last_error = Some(error);
                    continue 'attempt;
                }
                Err(error) => {
                    return Err(io::Error::new(error.kind(), format!("cannot bind {ip}:{port}: {error}")));
                }
            }
        }
        return Ok((port, listeners));
    }
    Err(last_error.unwrap_or_else(|| io::Error::other("no attempt made")))
}
