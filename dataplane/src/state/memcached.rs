//! A small memcached client for the global rate limit's shared counters: the text protocol
//! (`incr`, `add`, `get`), pooled connections, and one timeout over each whole exchange (as
//! lua-resty-memcached's, which ingress-nginx used, applies to connect, send and read).
//!
//! Clients are shared process-wide by address and settings, so that a new routing table keeps
//! the pooled connections of the last one.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use crate::model::Memcached;

/// A pooled connection and when it was last put back.
struct Idle {
    conn: BufStream<TcpStream>,
    since: Instant,
}

/// One memcached server, with its idle connections.
pub struct Client {
    addr: String,
    timeout: Duration,
    idle_timeout: Duration,
    pool_size: usize,
    idle: Mutex<Vec<Idle>>,
}

/// The live clients by settings: a table swap finds its predecessor's.
fn registry() -> &'static Mutex<HashMap<Memcached, Weak<Client>>> {
    static CLIENTS: OnceLock<Mutex<HashMap<Memcached, Weak<Client>>>> = OnceLock::new();
    CLIENTS.get_or_init(Default::default)
}

impl Client {
    /// The live client for `settings`, or a new one.
    pub fn shared(settings: &Memcached) -> Arc<Client> {
        let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = map.get(settings).and_then(Weak::upgrade) {
            return client;
        }
        map.retain(|_, c| c.strong_count() > 0);
        let host = &settings.host;
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{}", settings.port)
        } else {
            format!("{host}:{}", settings.port)
        };
        let client = Arc::new(Client {
            addr,
            timeout: Duration::from_millis(settings.connect_timeout_ms.max(1)),
            idle_timeout: Duration::from_millis(settings.idle_timeout_ms),
            pool_size: settings.pool_size as usize,
            idle: Mutex::new(Vec::new()),
        });
        map.insert(settings.clone(), Arc::downgrade(&client));
        client
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Adds one to counter `current` (created with `ttl` if missing) and reads counter
    /// `previous` (0 if missing): the two samples of a sliding window.
    pub async fn sample(&self, current: &str, previous: &str, ttl: Duration) -> io::Result<(u64, u64)> {
        let mut conn = match tokio::time::timeout(self.timeout, self.checkout()).await {
            Ok(conn) => conn?,
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        };
        let exchange = async {
            let counts = exchange(&mut conn, current, previous, ttl).await?;
            Ok::<_, io::Error>((counts, conn))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok((counts, conn))) => {
                self.checkin(conn);
                Ok(counts)
            }
            // A failed or timed-out exchange leaves the connection in an unknown state: dropped.
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "memcached did not answer in time")),
        }
    }

    /// A pooled connection younger than the idle timeout, or a new one.
    async fn checkout(&self) -> io::Result<BufStream<TcpStream>> {
        let pooled = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            idle.retain(|i| now.duration_since(i.since) < self.idle_timeout);
            idle.pop()
        };
        match pooled {
            Some(i) => Ok(i.conn),
            None => {
                let stream = TcpStream::connect(&self.addr).await?;
                stream.set_nodelay(true)?;
                Ok(BufStream::new(stream))
            }
        }
    }

    fn checkin(&self, conn: BufStream<TcpStream>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.pool_size {
            idle.push(Idle { conn, since: Instant::now() });
        }
    }
}

/// `incr current 1` and `get previous`, pipelined; a missing `current` is created by `add`
/// (and incremented again if another replica created it first).
async fn exchange(
    conn: &mut BufStream<TcpStream>,
    current: &str,
    previous: &str,
    ttl: Duration,
) -> io::Result<(u64, u64)> {
    let mut line = String::new();
    conn.write_all(format!("incr {current} 1\r\nget {previous}\r\n").as_bytes()).await?;
    conn.flush().await?;
    let incremented = read_incr(conn, &mut line).await?;
    let prev = read_get(conn, &mut line).await?;
    if let Some(count) = incremented {
        return Ok((count, prev));
    }
    // memcached's exptime: seconds (up to 30 days); at least 1.
    let exptime = ttl.as_secs().clamp(1, 30 * 86_400);
    conn.write_all(format!("add {current} 0 {exptime} 1\r\n1\r\n").as_bytes()).await?;
    conn.flush().await?;
    match read_line(conn, &mut line).await? {
        "STORED" => Ok((1, prev)),
        "NOT_STORED" => {
            conn.write_all(format!("incr {current} 1\r\n").as_bytes()).await?;
            conn.flush().await?;
            let count = read_incr(conn, &mut line).await?;
            Ok((count.unwrap_or(1), prev))
        }
        other => Err(protocol(other)),
    }
}

fn protocol(answer: &str) -> io::Error {
    let answer: String = answer.chars().take(80).collect();
    io::Error::new(io::ErrorKind::InvalidData, format!("unexpected memcached answer {answer:?}"))
}

/// One line without its CRLF; memcached's lines are short, longer ones are refused.
async fn read_line<'l>(conn: &mut BufStream<TcpStream>, line: &'l mut String) -> io::Result<&'l str> {
    line.clear();
    let n = (&mut *conn).take(1024).read_line(line).await?;
    if n == 0 || !line.ends_with("\r\n") {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "memcached closed or sent a line too long"));
    }
    Ok(line.trim_end_matches("\r\n"))
}

/// The answer to `incr`: the new value, or `None` for `NOT_FOUND`.
async fn read_incr(conn: &mut BufStream<TcpStream>, line: &mut String) -> io::Result<Option<u64>> {
    match read_line(conn, line).await? {
        "NOT_FOUND" => Ok(None),
        n => n.parse().map(Some).map_err(|_| protocol(n)),
    }
}

/// The answer to `get` of one counter: its value, 0 when missing.
async fn read_get(conn: &mut BufStream<TcpStream>, line: &mut String) -> io::Result<u64> {
    let header = read_line(conn, line).await?;
    if header == "END" {
        return Ok(0);
    }
    // VALUE <key> <flags> <bytes>
    let bytes: usize = match header.split(' ').collect::<Vec<_>>()[..] {
        ["VALUE", _, _, bytes] => bytes.parse().map_err(|_| protocol(header))?,
        _ => return Err(protocol(header)),
    };
    if bytes > 32 {
        return Err(protocol(header));
    }
    let mut data = vec![0; bytes + 2];
    conn.read_exact(&mut data).await?;
    let value = std::str::from_utf8(&data[..bytes]).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    match read_line(conn, line).await? {
        "END" => Ok(value),
        other => Err(protocol(other)),
    }
}
