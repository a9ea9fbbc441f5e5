//! The TCP relay of L4 services over real loopback sockets: splice(2) is the path taken where it
//! can be (counted by `spliced`), the copy path where splicing is off; both carry the bytes
//! intact, pass half-closes both ways, count bytes and cut idle connections.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use weir_dataplane::l4::{L4Config, L4Proxy, StatsSnapshot};
use weir_dataplane::model::{Endpoint, L4Protocol, L4Service, RouteTable, Target};
use weir_dataplane::proxy::{Proxy, ProxyConfig};

const SIZE: usize = 16 << 20;

/// Bytes no two offsets of which repeat within a 251-byte window (a shifted or lost chunk shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// A backend that first sends `greeting` and shuts its write side, then reads to the end of the
/// stream and reports what it read.
async fn greet_then_read(greeting: Vec<u8>) -> (SocketAddr, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let (tx, greeting) = (tx.clone(), greeting.clone());
            tokio::spawn(async move {
                s.write_all(&greeting).await.unwrap();
                s.shutdown().await.unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).await.unwrap();
                let _ = tx.send(got).await;
            });
        }
    });
    (addr, rx)
}

/// A backend that echoes until the client's end of stream, then ends its own side.
async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
        }
    });
    addr
}

fn table(port: u16, endpoint: SocketAddr, idle_ms: Option<u64>) -> RouteTable {
    let mut table = RouteTable::default();
    table.settings.stream_timeout_ms = idle_ms;
    table.l4.push(L4Service {
        port,
        protocol: L4Protocol::Tcp,
        backend: "default/svc:9000".parse().unwrap(),
        target: Target::Endpoints(vec![Endpoint::new(endpoint)]),
        proxy_protocol_in: false,
        proxy_protocol_out: false,
        client_ip_affinity_s: None,
    });
    table
}

async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port()
}

fn l4(zero_copy: bool) -> L4Proxy {
    let config = L4Config { listen: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), zero_copy, ..L4Config::default() };
    L4Proxy::new(config, &Proxy::new(ProxyConfig::default()))
}

/// Waits (15 s at most) until the port's counters satisfy `done`, and returns them.
async fn stats_when(l4: &L4Proxy, done: impl Fn(&StatsSnapshot) -> bool) -> StatsSnapshot {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let stats = l4.stats()[0].stats;
        if done(&stats) || tokio::time::Instant::now() > deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 16 MiB up and back through an echo backend: the client shuts its write side after sending
/// and still reads the whole echo (the half-close reached the backend, and the backend's came
/// back); what came back is what went out, byte for byte; both directions are counted.
async fn echo_round_trip(zero_copy: bool) -> StatsSnapshot {
    let backend = echo().await;
    let port = free_port().await;
    let l4 = l4(zero_copy);
    assert!(l4.publish(&table(port, backend, None)).is_empty());
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let out = pattern(SIZE, 7);
    let sent = out.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
        w
    });
    let mut back = Vec::with_capacity(SIZE);
    tokio::time::timeout(Duration::from_secs(60), r.read_to_end(&mut back)).await.unwrap().unwrap();
    let _w = writer.await.unwrap();
    assert_eq!(back.len(), SIZE, "the whole echo came back, then end of stream");
    assert!(back == out, "the echo is byte for byte what was sent");
    let stats = stats_when(&l4, |s| s.open == 0).await;
    assert_eq!((stats.bytes_up, stats.bytes_down), (SIZE as u64, SIZE as u64));
    assert_eq!((stats.opened, stats.open), (1, 0));
    stats
}

/// On Linux the connection is spliced (the counter says so), and the bytes are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_spliced_and_intact() {
    let stats = echo_round_trip(true).await;
    assert_eq!(stats.spliced, u64::from(cfg!(target_os = "linux")), "the splice path was taken");
}

/// With splicing off the copy path relays the same stream, just as intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_fallback_relays_the_same() {
    let stats = echo_round_trip(false).await;
    assert_eq!(stats.spliced, 0, "the copy path was taken");
}

/// The upstream ends its side first (a greeting, then end of stream): the client reads the
/// greeting and the end, and can still send; the upstream reads all of it. Both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_half_close_is_passed_on() {
    for zero_copy in [true, false] {
        let greeting = pattern(3 << 20, 1);
        let (backend, mut seen) = greet_then_read(greeting.clone()).await;
        let port = free_port().await;
        let l4 = l4(zero_copy);
        assert!(l4.publish(&table(port, backend, None)).is_empty());
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got)).await.unwrap().unwrap();
        assert!(got == greeting, "zero_copy={zero_copy}: the greeting, then end of stream");
        let after = pattern(1 << 20, 2);
        s.write_all(&after).await.unwrap();
        s.shutdown().await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(30), seen.recv()).await.unwrap().unwrap();
        assert!(read == after, "zero_copy={zero_copy}: the upstream read what the client sent after");
        let stats = stats_when(&l4, |s| s.open == 0).await;
        assert_eq!((stats.bytes_up, stats.bytes_down), (1 << 20, 3 << 20), "zero_copy={zero_copy}");
        assert_eq!(stats.spliced, u64::from(zero_copy && cfg!(target_os = "linux")));
    }
}

/// A spliced connection on which nothing moves is closed after `proxy-stream-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_spliced_connection_is_closed() {
    let (backend, _seen) = greet_then_read(b"hi".to_vec()).await;
    let port = free_port().await;
    let l4 = l4(true);
    assert!(l4.publish(&table(port, backend, Some(500))).is_empty());
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut got = Vec::new();
    // The greeting and the upstream's end arrive; the client never ends its side, so only the
    // idle timeout can end the connection, which the client sees as end of stream or a reset.
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got)).await.unwrap().unwrap();
    assert_eq!(got, b"hi");
    let stats = stats_when(&l4, |s| s.open == 0).await;
    assert_eq!(stats.open, 0, "the idle connection was closed");
    assert_eq!(stats.spliced, u64::from(cfg!(target_os = "linux")));
}
