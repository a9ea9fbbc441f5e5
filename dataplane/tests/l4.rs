//! The L4 proxy in process: publishes diff its listener set and keep balancer state; a taken
//! port is reported and the others serve; the TCP relay (copied, then spliced once a
//! direction's reads fill the buffer, counted by `spliced`; copied throughout where splicing is
//! off) carries bytes intact, passes half-closes both ways, counts bytes and cuts idle
//! connections. Real sockets on loopback.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use weir_dataplane::l4::{L4Config, L4Proxy, StatsSnapshot};
use weir_dataplane::model::{Endpoint, L4Protocol, L4Service, RouteTable, Target};
use weir_dataplane::proxy::{Proxy, ProxyConfig};

/// A backend that writes `name` and closes.
async fn named(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let _ = s.write_all(name.as_bytes()).await;
        }
    });
    addr
}

fn table(services: &[(u16, &[SocketAddr])]) -> RouteTable {
    let mut table = RouteTable::default();
    for (port, endpoints) in services {
        table.l4.push(L4Service {
            port: *port,
            protocol: L4Protocol::Tcp,
            backend: "default/svc:9000".parse().unwrap(),
            target: Target::Endpoints(endpoints.iter().map(|a| Endpoint::new(*a)).collect()),
            proxy_protocol_in: false,
            proxy_protocol_out: false,
            client_ip_affinity_s: None,
        });
    }
    table
}

async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port()
}

async fn answer(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn l4() -> L4Proxy {
    l4_with(true)
}

/// An L4 proxy on loopback relaying with splice(2) (`zero_copy`) or through copy buffers.
fn l4_with(zero_copy: bool) -> L4Proxy {
    let config = L4Config { listen: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), zero_copy, ..L4Config::default() };
    L4Proxy::new(config, &Proxy::new(ProxyConfig::default()))
}

/// `table` with a `proxy-stream-timeout` of `ms`.
fn idle_after(mut table: RouteTable, ms: u64) -> RouteTable {
    table.settings.stream_timeout_ms = Some(ms);
    table
}

/// Round robin continues across publishes (the cursor is carried over), and the endpoints of
/// the new table serve without a new listener.
#[tokio::test]
async fn round_robin_state_survives_a_publish() {
    let (a, b) = (named("a").await, named("b").await);
    let port = free_port().await;
    let l4 = l4();
    assert!(l4.publish(&table(&[(port, &[a, b])])).is_empty());
    let local = l4.local_addr(L4Protocol::Tcp, port).unwrap();
    assert_eq!(answer(port).await, "a");
    // The same service again (a new table version): the next pick is b, not a again.
    assert!(l4.publish(&table(&[(port, &[a, b])])).is_empty());
    assert_eq!(answer(port).await, "b");
    assert_eq!(answer(port).await, "a");
    assert_eq!(l4.local_addr(L4Protocol::Tcp, port), Some(local), "the listener stayed");
    let c = named("c").await;
    assert!(l4.publish(&table(&[(port, &[c])])).is_empty());
    assert_eq!(answer(port).await, "c", "new endpoints serve at once");
    let stats = l4.stats();
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].stats.opened, 4);
}

/// A port held by another socket is reported with a clear error; the others serve, and the
/// port is bound by a later publish once it is free.
#[tokio::test]
async fn a_taken_port_is_reported_and_the_rest_serve() {
    let a = named("a").await;
    let holder = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taken = holder.local_addr().unwrap().port();
    let free = free_port().await;
    let l4 = l4();
    let failed = l4.publish(&table(&[(free, &[a]), (taken, &[a])]));
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].port, taken);
    let message = failed[0].to_string();
    assert!(message.contains("the port is taken by another process"), "{message}");
    assert_eq!(answer(free).await, "a");
    drop(holder);
    assert!(l4.publish(&table(&[(free, &[a]), (taken, &[a])])).is_empty());
    assert_eq!(answer(taken).await, "a");
    // Removed: the port is released.
    assert!(l4.publish(&table(&[(free, &[a])])).is_empty());
    assert!(l4.local_addr(L4Protocol::Tcp, taken).is_none());
    // Its accept loop ends at its next turn, closing the socket.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while TcpListener::bind(("127.0.0.1", taken)).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the removed port stays bound");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The answer to a connection from `client` (a loopback address) to `port`.
async fn answer_from(client: [u8; 4], port: u16) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((client, 0))).unwrap();
    let mut s = socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// ClientIP affinity: each client address sticks to its endpoint, across publishes; a client
/// whose endpoint left, or refuses, moves to another and sticks to that one.
#[tokio::test]
async fn client_ip_affinity_sticks_across_publishes() {
    let (a, b, c) = (named("a").await, named("b").await, named("c").await);
    let port = free_port().await;
    let sticky = |endpoints: &[SocketAddr]| {
        let mut t = table(&[(port, endpoints)]);
        t.l4[0].client_ip_affinity_s = Some(60);
        t
    };
    let l4 = l4();
    assert!(l4.publish(&sticky(&[a, b, c])).is_empty());
    let (one, two) = ([127, 0, 0, 2], [127, 0, 0, 3]);
    assert_eq!(answer_from(one, port).await, "a");
    assert_eq!(answer_from(two, port).await, "b");
    for _ in 0..3 {
        assert_eq!(answer_from(one, port).await, "a");
        assert_eq!(answer_from(two, port).await, "b");
    }
    // A new table with the same endpoints: nobody moves.
    assert!(l4.publish(&sticky(&[c, b, a])).is_empty());
    assert_eq!(answer_from(one, port).await, "a");
    assert_eq!(answer_from(two, port).await, "b");
    // a gone: its client is balanced again and sticks; the other client stays.
    assert!(l4.publish(&sticky(&[b, c])).is_empty());
    let moved = answer_from(one, port).await;
    assert_ne!(moved, "a");
    for _ in 0..3 {
        assert_eq!(answer_from(one, port).await, moved);
        assert_eq!(answer_from(two, port).await, "b");
    }
    // b stops listening (the table still lists it): its client is served by another endpoint
    // (the refused connect retried) and sticks to that one.
    let (d, d_task) = stoppable("d").await;
    assert!(l4.publish(&sticky(&[b, c, d])).is_empty());
    let three = [127, 0, 0, 4];
    let mut on_d = None;
    for client in [three, [127, 0, 0, 5], [127, 0, 0, 6]] {
        if answer_from(client, port).await == "d" {
            on_d = Some(client);
        }
    }
    let on_d = on_d.expect("round robin over three new clients reaches d");
    d_task.abort();
    let _ = d_task.await;
    let now = answer_from(on_d, port).await;
    assert!(now == "b" || now == "c", "{now}");
    for _ in 0..3 {
        assert_eq!(answer_from(on_d, port).await, now);
    }
    // Without affinity, the same client is balanced round robin again.
    assert!(l4.publish(&table(&[(port, &[b, c])])).is_empty());
    let mut answers = std::collections::BTreeSet::new();
    for _ in 0..4 {
        answers.insert(answer_from(two, port).await);
    }
    assert_eq!(answers.len(), 2, "{answers:?}");
}

/// A backend that writes `name` and closes, until its task is aborted (then its port refuses).
async fn stoppable(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let _ = s.write_all(name.as_bytes()).await;
        }
    });
    (addr, task)
}

// === the relay: splice(2) and the copy path ===

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
    let l4 = l4_with(zero_copy);
    assert!(l4.publish(&table(&[(port, &[backend])])).is_empty());
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
        let l4 = l4_with(zero_copy);
        assert!(l4.publish(&table(&[(port, &[backend])])).is_empty());
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
    // A greeting large enough to fill reads: its direction turns to splice.
    let greeting: Vec<u8> = (0..4u32 << 20).map(|i| (i % 239) as u8).collect();
    let (backend, _seen) = greet_then_read(greeting.clone()).await;
    let port = free_port().await;
    let l4 = l4_with(true);
    assert!(l4.publish(&idle_after(table(&[(port, &[backend])]), 500)).is_empty());
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut got = Vec::new();
    // The greeting and the upstream's end arrive; the client never ends its side, so only the
    // idle timeout can end the connection, which the client sees as end of stream or a reset.
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got)).await.unwrap().unwrap();
    assert!(got == greeting, "the greeting differs ({} of {} bytes came)", got.len(), greeting.len());
    let stats = stats_when(&l4, |s| s.open == 0).await;
    assert_eq!(stats.open, 0, "the idle connection was closed");
    assert_eq!(stats.spliced, u64::from(cfg!(target_os = "linux")));
}

// === the connection's one timer: connect timeout, then idle timeout ===

/// A connection that keeps moving outlives `proxy-stream-timeout` (nginx's `proxy_timeout`,
/// "between two successive read or write operations") twice over, each transfer moving the
/// deadline; once it goes quiet the timeout ends it. Both relay paths: the round trips are
/// large enough to fill reads, so with splicing on both directions splice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_defer_the_idle_timeout_and_silence_ends_the_connection() {
    const TRIP: usize = 256 * 1024;
    for zero_copy in [true, false] {
        let backend = echo().await;
        let port = free_port().await;
        let l4 = l4_with(zero_copy);
        assert!(l4.publish(&idle_after(table(&[(port, &[backend])]), 2_000)).is_empty());
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (mut reader, mut writer) = s.into_split();
        // 16 round trips 250 ms apart: 4 s, two idle timeouts.
        for i in 0..16u8 {
            let send = async { writer.write_all(&vec![i; TRIP]).await.unwrap() };
            let mut back = vec![0u8; TRIP];
            let receive = async {
                reader
                    .read_exact(&mut back)
                    .await
                    .unwrap_or_else(|e| panic!("round trip {i} (zero_copy={zero_copy}): {e}"))
            };
            tokio::join!(send, receive);
            assert!(back.iter().all(|b| *b == i), "round trip {i} (zero_copy={zero_copy}) differs");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut s = reader.reunite(writer).unwrap();
        // Then nothing: the idle timeout ends the connection (end of stream or a reset).
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest)).await.unwrap();
        assert!(rest.is_empty(), "zero_copy={zero_copy}");
        let stats = stats_when(&l4, |s| s.open == 0).await;
        assert_eq!(stats.open, 0, "zero_copy={zero_copy}: the quiet connection was closed");
        let trips = 16 * TRIP as u64;
        assert_eq!((stats.bytes_up, stats.bytes_down), (trips, trips), "zero_copy={zero_copy}");
        assert_eq!(stats.spliced, u64::from(zero_copy && cfg!(target_os = "linux")), "zero_copy={zero_copy}");
    }
}

/// An endpoint whose connect never completes (its listener's accept queue is full: the kernel
/// drops the SYN) is given up after `proxy-connect-timeout` and the next endpoint is tried
/// (ingress-nginx's `proxy_next_upstream on`): every connection is answered, and the timed-out
/// connects are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_timeout_moves_on_to_the_next_endpoint() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let silent = socket.listen(0).unwrap();
    let silent_addr = silent.local_addr().unwrap();
    // Fills the accept queue (never accepted): later SYNs are dropped.
    let _filler = TcpStream::connect(silent_addr).await.unwrap();
    let good = named("good").await;
    let port = free_port().await;
    let l4 = l4();
    let mut table = table(&[(port, &[silent_addr, good])]);
    table.settings.connect_timeout_ms = Some(200);
    assert!(l4.publish(&table).is_empty());
    for _ in 0..4 {
        let answered = tokio::time::timeout(Duration::from_secs(30), answer(port)).await;
        assert_eq!(answered.expect("no answer: the silent endpoint's connect was never given up"), "good");
    }
    let stats = stats_when(&l4, |s| s.open == 0).await;
    assert!(stats.connect_errors >= 1, "no connect timed out: {stats:?}");
    drop(silent);
}
