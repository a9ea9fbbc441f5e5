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
