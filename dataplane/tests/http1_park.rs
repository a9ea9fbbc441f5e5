//! Parked keep-alive connections (`--http1-server weir`, `proxy/park.rs`): an idle connection
//! leaves its task after a grace and is resumed by its next request; the keep-alive timeout,
//! the drain, the connection limit and the open-connection gauge still see it.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_dataplane::proxy::{Http1Server, ProxyConfig};

/// Generous: the machine may be loaded.
const PATIENCE: Duration = Duration::from_secs(30);

fn config() -> ProxyConfig {
    ProxyConfig {
        http1_server: Http1Server::Weir,
        http1_park_after: Some(Duration::from_millis(50)),
        ..test_config()
    }
}

async fn started(config: ProxyConfig) -> TestProxy {
    let e = echo("e").await;
    proxy_with(config, table().host("a.test").prefix("/", &to(&e)).build()).await
}

/// Waits until `cond` holds, failing after [`PATIENCE`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n\r\n").into_bytes()
}

/// Reads one response (with a `content-length`) from `conn`; its head and body.
async fn response(conn: &mut TcpStream, buffered: &mut Vec<u8>) -> (String, String) {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffered[..end]).to_string();
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                    })
                    .map_or(0, |v| v.parse::<usize>().unwrap());
                if buffered.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&buffered[end + 4..end + 4 + length]).to_string();
                    buffered.drain(..end + 4 + length);
                    return (head, body);
                }
            }
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(buffered));
            buffered.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("an answer")
}

/// Asserts the answer is the echo's, to `path`.
async fn answered(conn: &mut TcpStream, buffered: &mut Vec<u8>, path: &str) {
    let (head, body) = response(conn, buffered).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["path"], path, "{body}");
}

/// Waits for the server to close `conn` (EOF or reset), failing after [`PATIENCE`].
async fn closed_by_server(conn: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(PATIENCE, conn.read(&mut buf)).await.expect("closed by the proxy");
    assert!(matches!(read, Ok(0) | Err(_)), "bytes instead of a close: {read:?}");
}

/// A new connection with `path` answered on it, left open.
async fn served(p: &TestProxy, path: &str) -> TcpStream {
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    conn.write_all(&get(path)).await.unwrap();
    answered(&mut conn, &mut Vec::new(), path).await;
    conn
}

fn open_plain(p: &TestProxy) -> u64 {
    p.proxy.metrics().collect().conns.open[0]
}

#[tokio::test]
async fn a_parked_connection_serves_its_next_requests() {
    let p = started(config()).await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buffered = Vec::new();
    conn.write_all(&get("/one")).await.unwrap();
    answered(&mut conn, &mut buffered, "/one").await;
    until("the idle connection is parked", || p.proxy.parked_connections() == 1).await;
    assert_eq!(open_plain(&p), 1, "a parked connection is open");

    conn.write_all(&get("/two")).await.unwrap();
    answered(&mut conn, &mut buffered, "/two").await;
    until("parked again", || p.proxy.parked_connections() == 1).await;

    // Pipelined requests wake it together.
    conn.write_all(&[get("/three"), get("/four")].concat()).await.unwrap();
    answered(&mut conn, &mut buffered, "/three").await;
    answered(&mut conn, &mut buffered, "/four").await;
    until("parked again", || p.proxy.parked_connections() == 1).await;

    // A request head split by a pause: its first bytes wake the connection.
    conn.write_all(b"GET /fi").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    conn.write_all(b"ve HTTP/1.1\r\nHost: a.test\r\n\r\n").await.unwrap();
    answered(&mut conn, &mut buffered, "/five").await;

    // The client's close frees its place.
    until("parked again", || p.proxy.parked_connections() == 1).await;
    drop(conn);
    until("the closed connection left the lot", || p.proxy.parked_connections() == 0).await;
    until("the gauge counts it closed", || open_plain(&p) == 0).await;
}

#[tokio::test]
async fn requests_sent_around_the_parking_moment_are_not_lost() {
    // Pauses below, at and above the grace: some requests arrive while the connection moves
    // between its task and the parking; each must be answered, in order.
    let p = started(config()).await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buffered = Vec::new();
    for i in 0..60u64 {
        let path = format!("/r{i}");
        conn.write_all(&get(&path)).await.unwrap();
        answered(&mut conn, &mut buffered, &path).await;
        tokio::time::sleep(Duration::from_millis(30 + i % 40)).await;
    }
    // Several connections at once, each pausing about the grace.
    let mut tasks = Vec::new();
    for c in 0..8u64 {
        let addr = p.addr;
        tasks.push(tokio::spawn(async move {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            let mut buffered = Vec::new();
            for i in 0..20u64 {
                let path = format!("/c{c}/{i}");
                conn.write_all(&get(&path)).await.unwrap();
                answered(&mut conn, &mut buffered, &path).await;
                tokio::time::sleep(Duration::from_millis(40 + (i * 7 + c * 3) % 25)).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn a_parked_connection_is_closed_at_the_keep_alive_timeout() {
    let p = started(ProxyConfig { keepalive: Some(Duration::from_secs(2)), ..config() }).await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buffered = Vec::new();
    conn.write_all(&get("/")).await.unwrap();
    answered(&mut conn, &mut buffered, "/").await;
    until("the idle connection is parked", || p.proxy.parked_connections() == 1).await;
    closed_by_server(&mut conn).await;
    until("closed at its deadline: gone from the lot", || p.proxy.parked_connections() == 0).await;
    until("the gauge counts it closed", || open_plain(&p) == 0).await;
}

#[tokio::test]
async fn parked_connections_are_closed_at_once_on_drain() {
    // A drain that waited for parked connections would last this long.
    let mut p = started(ProxyConfig { drain_timeout: Duration::from_secs(600), ..config() }).await;
    let mut conns = Vec::new();
    for i in 0..3 {
        conns.push(served(&p, &format!("/{i}")).await);
    }
    until("all three parked", || p.proxy.parked_connections() == 3).await;
    p.shutdown();
    for conn in &mut conns {
        closed_by_server(conn).await;
    }
    let served = tokio::time::timeout(PATIENCE, p.task.take().unwrap()).await.expect("the drain ended");
    served.unwrap().unwrap();
    assert_eq!(p.proxy.parked_connections(), 0);
}

#[tokio::test]
async fn parked_connections_count_under_max_connections() {
    let mut config = config();
    config.connection_limits.max = 2;
    let p = started(config).await;
    let mut parked = Vec::new();
    for i in 0..2 {
        parked.push(served(&p, &format!("/{i}")).await);
    }
    until("both parked", || p.proxy.parked_connections() == 2).await;
    assert_eq!(open_plain(&p), 2, "the gauge counts parked connections");

    // The third is refused: the parked two hold their places.
    let mut third = TcpStream::connect(p.addr).await.unwrap();
    let _ = third.write_all(&get("/third")).await;
    closed_by_server(&mut third).await;
    assert_eq!(p.proxy.parked_connections(), 2);

    // One leaves: its place is given back, and a new connection is served.
    drop(parked.pop());
    until("the closed one left the lot", || p.proxy.parked_connections() == 1).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut conn = TcpStream::connect(p.addr).await.unwrap();
        let mut buffered = Vec::new();
        if conn.write_all(&get("/again")).await.is_ok() {
            let mut buf = [0u8; 4096];
            if let Ok(Ok(n)) = tokio::time::timeout(PATIENCE, conn.read(&mut buf)).await
                && n > 0
            {
                buffered.extend_from_slice(&buf[..n]);
                answered(&mut conn, &mut buffered, "/again").await;
                break;
            }
        }
        // The refused place may still be held by the closing connection's task.
        assert!(tokio::time::Instant::now() < deadline, "the freed place was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The remaining parked connection still works.
    let mut conn = parked.pop().unwrap();
    let mut buffered = Vec::new();
    conn.write_all(&get("/kept")).await.unwrap();
    answered(&mut conn, &mut buffered, "/kept").await;
}

#[tokio::test]
async fn a_parked_connection_keeps_its_proxy_protocol_client() {
    let p = started(ProxyConfig { proxy_protocol: true, ..config() }).await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buffered = Vec::new();
    conn.write_all(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n").await.unwrap();
    for i in 0..3 {
        let path = format!("/pp{i}");
        conn.write_all(&get(&path)).await.unwrap();
        let (head, body) = response(&mut conn, &mut buffered).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(echo["path"], path.as_str(), "{body}");
        assert_eq!(
            echo["headers"]["x-forwarded-for"], "203.0.113.7",
            "request {i}, parked before it: {body}"
        );
        until("parked", || p.proxy.parked_connections() == 1).await;
    }
}

#[tokio::test]
async fn a_parked_connection_holds_its_place_under_the_per_client_limit() {
    let mut config = config();
    config.connection_limits.per_client = 1;
    let p = started(config).await;
    let mut first = served(&p, "/first").await;
    until("parked", || p.proxy.parked_connections() == 1).await;

    // The client's one place is the parked connection's.
    let mut second = TcpStream::connect(p.addr).await.unwrap();
    let _ = second.write_all(&get("/second")).await;
    closed_by_server(&mut second).await;
    first.write_all(&get("/again")).await.unwrap();
    answered(&mut first, &mut Vec::new(), "/again").await;

    // Closed, it gives the place back.
    until("parked again", || p.proxy.parked_connections() == 1).await;
    drop(first);
    until("gone from the lot", || p.proxy.parked_connections() == 0).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut conn = TcpStream::connect(p.addr).await.unwrap();
        if conn.write_all(&get("/third")).await.is_ok() {
            let mut buf = [0u8; 4096];
            if let Ok(Ok(n)) = tokio::time::timeout(PATIENCE, conn.read(&mut buf)).await
                && n > 0
            {
                let mut buffered = buf[..n].to_vec();
                answered(&mut conn, &mut buffered, "/third").await;
                break;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "the place was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
