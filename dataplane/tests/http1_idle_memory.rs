//! What an idle keep-alive connection keeps allocated under `--http1-server weir`, counted by a
//! counting global allocator (live heap bytes, not RSS: bench/idle measures RSS against nginx
//! and HAProxy). hyper's server keeps ~34 KB per connection after its first request (its read
//! and write buffers and the request future's box, bench/RESULTS.md); weir's driver frees them
//! once the connection has been idle for a grace (`http1_idle_grace`), so the bound below (8 KiB)
//! fails on hyper's server, and within the grace the buffers are kept. Once parked (the
//! connection's task ended, `proxy/park.rs`), a connection keeps a 40-byte record: the bound
//! there (96 B besides the test's own client socket) fails if it grows back to a task, a
//! registration with tokio or an allocation per connection.
#![allow(clippy::unwrap_used)]

#[path = "support/counting.rs"]
mod counting;
mod support;

use std::time::Duration;

use counting::{Counting, live};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_dataplane::proxy::{Http1Server, ProxyConfig};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One `GET /` on a new connection, answered; the connection, left open.
async fn served(p: &TestProxy) -> TcpStream {
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                    })
                    .map_or(0, |v| v.parse::<usize>().unwrap());
                if got.len() >= end + 4 + length {
                    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                    return;
                }
            }
        }
    })
    .await
    .expect("an answer");
    conn
}

/// Bytes live per connection after `CONNS` connections were each served one request and left
/// open, `wait` later (the proxy was warmed up first).
async fn live_per_conn(p: &TestProxy, wait: Duration) -> (isize, Vec<TcpStream>) {
    let before = live();
    let mut open = Vec::new();
    for _ in 0..CONNS {
        open.push(served(p).await);
    }
    tokio::time::sleep(wait).await;
    ((live() - before) / CONNS, open)
}

const CONNS: isize = 200;

/// Parked connections counted (client and proxy sockets in this process: under 1024
/// descriptors, the usual soft limit, with the proxy's own).
const PARKED: isize = 480;

/// Bytes live per connection for `PARKED` connections to a bare listener that holds the
/// accepted sockets and allocates nothing for them: what the test's client side costs.
async fn client_side_per_conn() -> isize {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut accepted = Vec::with_capacity(PARKED as usize);
    let mut open = Vec::new();
    let before = live();
    for _ in 0..PARKED {
        open.push(TcpStream::connect(addr).await.unwrap());
        accepted.push(listener.accept().unwrap().0);
    }
    (live() - before) / PARKED
}

/// One test (the counter is global): a connection keeps its hyper connection while idle for
/// less than the grace, and past it keeps under 8 KiB.
#[tokio::test]
async fn an_idle_keep_alive_connection_keeps_under_8_kib_allocated_past_the_grace() {
    let e = echo("e").await;
    let table = || table().host("a.test").prefix("/", &to(&e)).build();

    // Within the grace (an hour here), hyper's buffers are kept: the next request reuses them.
    let config = ProxyConfig {
        http1_server: Http1Server::Weir,
        http1_idle_grace: Duration::from_secs(3600),
        ..test_config()
    };
    let p = proxy_with(config, table()).await;
    drop(served(&p).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (held, open) = live_per_conn(&p, Duration::from_millis(500)).await;
    println!("{held} bytes live per connection idle within the grace");
    assert!(held > 16 * 1024, "{held} bytes live per connection: hyper's state was not kept in the grace");
    drop(open);
    drop(p);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The default grace: past it, the connection holds the socket and little else.
    let config = ProxyConfig { http1_server: Http1Server::Weir, ..test_config() };
    assert!(config.http1_idle_grace < Duration::from_secs(5), "{:?}", config.http1_idle_grace);
    let p = proxy_with(config, table()).await;
    // Warm up: the upstream connection pooled, the table's lazy state built.
    drop(served(&p).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = live();
    let mut open = Vec::new();
    for _ in 0..CONNS {
        open.push(served(&p).await);
    }
    // The connections are taken apart once idle for the grace; let every task get there.
    let mut per_conn = isize::MAX;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        per_conn = (live() - before) / CONNS;
        if per_conn < 8 * 1024 {
            break;
        }
    }
    println!("{per_conn} bytes live per idle connection past the grace");
    assert!(per_conn < 8 * 1024, "{per_conn} bytes live per idle connection (client side included)");
    drop(open);
    drop(p);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Parked: the task is gone, the lot keeps a record.
    let client_side = client_side_per_conn().await;
    let config = ProxyConfig {
        http1_server: Http1Server::Weir,
        http1_park_after: Some(Duration::from_millis(50)),
        ..test_config()
    };
    let p = proxy_with(config, table()).await;
    // Warm up, and let the lot make its first chunk and the parking channel its first block.
    drop(served(&p).await);
    let conn = served(&p).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while p.proxy.parked_connections() != 1 {
        assert!(tokio::time::Instant::now() < deadline, "never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(conn);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = live();
    let mut open = Vec::new();
    for _ in 0..PARKED {
        open.push(served(&p).await);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while p.proxy.parked_connections() != PARKED as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {PARKED} parked",
            p.proxy.parked_connections()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Tasks end as their connections park: let the last ones finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let per_conn = (live() - before) / PARKED;
    println!("{per_conn} bytes live per parked connection, {client_side} of them the test's client socket");
    assert!(
        per_conn - client_side <= 96,
        "{} bytes live per parked connection besides the client ({per_conn} in all)",
        per_conn - client_side
    );
    drop(open);
}
