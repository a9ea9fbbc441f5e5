//! Upstream HTTP/1.1 keep-alive: connections are reused, capped, closed when idle too long, and
//! never reused after the upstream closed them or before their response was read to its end.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use support::*;
use tokio::net::TcpListener;
use weir_dataplane::model::Settings;
use weir_dataplane::proxy::ProxyConfig;

/// An HTTP/1.1 upstream that counts the connections it accepted and those still open. Each
/// response names the connection it came on (`conn N`); `?size=N` answers `N` bytes, `?delay=MS`
/// waits first. With `idle_close`, it closes a connection idle that long.
struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

async fn upstream(idle_close: Option<Duration>) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, o) = (accepted.clone(), open.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let conn = a.fetch_add(1, SeqCst) + 1;
            o.fetch_add(1, SeqCst);
            let open = o.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| async move {
                    let query = req.uri().query().unwrap_or_default().to_string();
                    let param = |name: &str| {
                        query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                    };
                    if let Some(ms) = param("delay") {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    let _ = req.into_body().collect().await;
                    let body = match param("size") {
                        Some(n) => Bytes::from(vec![b'x'; n as usize]),
                        None => Bytes::from(format!("conn {conn}")),
                    };
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                if let Some(idle) = idle_close {
                    builder.timer(TokioTimer::new()).header_read_timeout(idle);
                }
                let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                open.fetch_sub(1, SeqCst);
            });
        }
    });
    Upstream { addr, accepted, open }
}

/// Waits (up to 5 s) until `count` reads `want`; fails with what it read last.
async fn until(count: &AtomicUsize, want: usize, what: &str) {
    for _ in 0..500 {
        if count.load(SeqCst) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: {} instead of {want}", count.load(SeqCst));
}

fn route(up: &Upstream) -> weir_dataplane::model::RouteTable {
    table().host("a.test").prefix("/", &backend("up", &[up.addr])).build()
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection() {
    let up = upstream(None).await;
    let p = proxy(route(&up)).await;
    for i in 0..20 {
        let r = if i % 2 == 0 {
            p.get("a.test", "/").await
        } else {
            // Request bodies and larger responses leave the connection reusable too.
            p.send(p.req("a.test", "/?size=100000").method("POST").body(full(vec![1u8; 10_000])).unwrap())
                .await
        };
        assert_eq!(r.status, 200, "request {i}");
    }
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    assert_eq!(up.accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn idle_connections_beyond_the_cap_are_closed() {
    let up = upstream(None).await;
    let config = ProxyConfig { pool_max_idle_per_host: 2, ..test_config() };
    let p = proxy_with(config, route(&up)).await;
    // Five at once need five connections; once they are answered, two are kept.
    let burst = || futures_util::future::join_all((0..5).map(|_| p.get("a.test", "/?delay=200")));
    for r in burst().await {
        assert_eq!(r.status, 200);
    }
    assert_eq!(up.accepted.load(SeqCst), 5);
    until(&up.open, 2, "upstream connections still open").await;
    // The next burst reuses the two and opens three.
    for r in burst().await {
        assert_eq!(r.status, 200);
    }
    assert_eq!(up.accepted.load(SeqCst), 8);
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout() {
    let up = upstream(None).await;
    let config = ProxyConfig { pool_idle_timeout: Duration::from_millis(200), ..test_config() };
    let p = proxy_with(config, route(&up)).await;
    assert_eq!(p.get("a.test", "/").await.status, 200);
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    until(&up.open, 0, "upstream connections still open").await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_reused() {
    let up = upstream(Some(Duration::from_millis(100))).await;
    let p = proxy(route(&up)).await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    until(&up.open, 0, "upstream connections still open").await;
    // The pooled connection is gone: the next request still succeeds, on a new one.
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
}

#[tokio::test]
async fn a_response_not_read_to_its_end_does_not_return_its_connection() {
    let up = upstream(None).await;
    let p = proxy(route(&up)).await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    // The client reads a little of a large response and goes away.
    let mut resp = p.send_raw(p.req("a.test", "/?size=8000000").body(empty()).unwrap()).await;
    assert_eq!(resp.status(), 200);
    let first = resp.body_mut().frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(resp);
    // Its upstream connection is closed rather than reused with the rest of that body unread.
    until(&up.open, 0, "upstream connections still open").await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
}

#[tokio::test]
async fn idle_connections_outlive_a_table_swap_and_close_with_their_endpoint() {
    let (up, other) = (upstream(None).await, upstream(None).await);
    let p = proxy(route(&up)).await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    // A new table with the same endpoint keeps its connections...
    p.proxy.publish(route(&up)).unwrap();
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    assert_eq!(up.accepted.load(SeqCst), 1);
    // ...and one without it closes them.
    p.proxy.publish(route(&other)).unwrap();
    until(&up.open, 0, "connections to the removed endpoint still open").await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    assert_eq!(other.accepted.load(SeqCst), 1);
}

/// `route(up)` with the table's `settings` (the controller ConfigMap's keys).
fn route_with(up: &Upstream, settings: Settings) -> weir_dataplane::model::RouteTable {
    let mut t = route(up);
    t.settings = settings;
    t
}

/// `upstream-keepalive-connections` from the table caps the idle connections per endpoint (the
/// proxy's own cap here is 320).
#[tokio::test]
async fn the_tables_keepalive_connections_cap_idle_connections() {
    let up = upstream(None).await;
    let settings = Settings { upstream_idle_max: Some(2), ..Settings::default() };
    let p = proxy(route_with(&up, settings)).await;
    let burst = || futures_util::future::join_all((0..6).map(|_| p.get("a.test", "/?delay=200")));
    for r in burst().await {
        assert_eq!(r.status, 200);
    }
    assert_eq!(up.accepted.load(SeqCst), 6);
    until(&up.open, 2, "upstream connections still open").await;
    // The next burst reuses the two kept and opens four.
    for r in burst().await {
        assert_eq!(r.status, 200);
    }
    assert_eq!(up.accepted.load(SeqCst), 10);
}

/// `upstream-keepalive-timeout` from the table closes idle connections (the proxy's own idle
/// timeout here is 60 s).
#[tokio::test]
async fn the_tables_keepalive_timeout_closes_idle_connections() {
    let up = upstream(None).await;
    let settings = Settings { upstream_idle_timeout_ms: Some(500), ..Settings::default() };
    let p = proxy(route_with(&up, settings)).await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    until(&up.open, 0, "upstream connections still open").await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
}

/// `upstream-keepalive-requests`: a connection carries that many requests, then is closed.
#[tokio::test]
async fn keepalive_requests_retire_a_connection() {
    let up = upstream(None).await;
    let settings = Settings { upstream_conn_requests: Some(3), ..Settings::default() };
    let p = proxy(route_with(&up, settings)).await;
    let mut conns = Vec::new();
    for _ in 0..7 {
        conns.push(p.get("a.test", "/").await.text());
    }
    assert_eq!(conns, ["conn 1", "conn 1", "conn 1", "conn 2", "conn 2", "conn 2", "conn 3"]);
    until(&up.open, 1, "retired connections still open").await;
}

/// `upstream-keepalive-time`: a connection older than that is not reused.
#[tokio::test]
async fn keepalive_time_retires_an_old_connection() {
    let up = upstream(None).await;
    let settings = Settings { upstream_conn_lifetime_ms: Some(1_000), ..Settings::default() };
    let p = proxy(route_with(&up, settings)).await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
    assert_eq!(p.get("a.test", "/").await.text(), "conn 2");
}

/// An upstream on raw sockets: it reads one request head per connection (requests without a
/// body), writes `response` with `conn N` appended as its body's text where `{conn}` stands, then
/// closes the connection, announced or not. Counts the connections it closed.
async fn closing_upstream(response: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = Arc::new(AtomicUsize::new(0));
    let (c, accepted) = (closed.clone(), Arc::new(AtomicUsize::new(0)));
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let conn = accepted.fetch_add(1, SeqCst) + 1;
            let closed = c.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let response = response.replace("{conn}", &format!("conn {conn}"));
                let _ = tcp.write_all(response.as_bytes()).await;
                drop(tcp);
                closed.fetch_add(1, SeqCst);
            });
        }
    });
    (addr, closed)
}

#[tokio::test]
async fn an_upstream_closing_a_kept_alive_connection_between_requests_costs_no_request() {
    // The response says nothing of closing: the proxy keeps the connection, which the upstream
    // then closes. The next request goes on a new connection, unnoticed by the client.
    let (addr, closed) = closing_upstream("HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\n{conn}").await;
    let p = proxy(table().host("a.test").prefix("/", &backend("up", &[addr])).build()).await;
    for i in 1..=3 {
        let r = p.get("a.test", "/").await;
        assert_eq!((r.status.as_u16(), r.text()), (200, format!("conn {i}")));
        until(&closed, i, "connections the upstream closed").await;
    }
}

#[tokio::test]
async fn connection_close_and_chunked_responses_end_their_connection() {
    // `Connection: close` with a chunked body, then a body delimited by the close itself.
    let chunked =
        "HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n6\r\n{conn}\r\n0\r\n\r\n";
    let until_close = "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{conn}";
    for response in [chunked, until_close] {
        let (addr, _) = closing_upstream(response).await;
        let p = proxy(table().host("a.test").prefix("/", &backend("up", &[addr])).build()).await;
        // Back to back: each request needs a connection of its own.
        for i in 1..=3 {
            let r = p.get("a.test", "/").await;
            assert_eq!((r.status.as_u16(), r.text()), (200, format!("conn {i}")), "{response:?}");
        }
    }
}

#[tokio::test]
async fn expect_100_continue_goes_through_to_the_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = upstream(None).await;
    let p = proxy(route(&up)).await;
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let head = "POST / HTTP/1.1\r\nhost: a.test\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    // The body is sent only once the proxy has asked for it.
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("a 100 Continue")
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 100 Continue\r\n"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    s.write_all(b"hello").await.unwrap();
    let mut got = String::from_utf8_lossy(&buf[..n]).into_owned();
    while !got.ends_with("conn 1") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("a response")
            .unwrap();
        assert!(n > 0, "closed early: {got:?}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(got.contains("HTTP/1.1 200 OK\r\n"), "{got:?}");
    // And the connection is pooled for the next request.
    assert_eq!(p.get("a.test", "/").await.text(), "conn 1");
}
