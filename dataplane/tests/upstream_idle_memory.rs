//! What an idle pooled upstream HTTP/1.1 connection keeps allocated, counted by a counting
//! global allocator (live heap bytes). While a connection serves requests it keeps its read
//! buffer (16 KiB reserved at its first read) between them; once it has waited in its pool for
//! a second, the pool's sweep gives its buffers back, so a pool of idle connections costs their
//! sockets, not 16 KiB each (bench/idle's 200 pooled connections held ~330 B per idle client
//! connection that way). The test fails if the buffers are kept, or if a connection whose
//! buffers went back cannot serve its next request.
#![allow(clippy::unwrap_used)]

#[path = "support/counting.rs"]
mod counting;
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use counting::{Counting, live};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_dataplane::model::Settings;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Upstream connections opened by the burst.
const CONNS: usize = 64;

/// An HTTP/1.1 upstream that answers each request (a head, no body) with `conn N` (the
/// connection's number) after 300 ms, so that concurrent requests each take a connection of
/// their own; it counts the connections accepted. Its connections allocate nothing after their
/// first request (a buffer on the task's stack), so the heap it holds stays the same while the
/// test watches the proxy's.
async fn slow_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let conn = a.fetch_add(1, SeqCst) + 1;
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let mut have = 0;
                loop {
                    match tcp.read(&mut buf[have..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have += n,
                    }
                    let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") else {
                        if have == buf.len() {
                            return;
                        }
                        continue;
                    };
                    buf.copy_within(end + 4..have, 0);
                    have -= end + 4;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let body = format!("conn {conn:03}");
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                    if tcp.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// `GET /` on a connection of its own that closes after the answer (`Connection: close`), so
/// that no client connection stays open on either side of the proxy.
async fn get_closing(p: &TestProxy) -> Resp {
    let req = p.req("a.test", "/").header(http::header::CONNECTION, "close").body(empty()).unwrap();
    p.send(req).await
}

#[tokio::test]
async fn idle_pooled_upstream_connections_give_their_buffers_back() {
    let (addr, accepted) = slow_upstream().await;
    let mut table = table().host("a.test").prefix("/", &backend("up", &[addr])).build();
    // Kept idle for 8 s; the sweep runs every 4 s (half the timeout), so a connection idle
    // since the burst is swept with its buffers given back within 5 s, and closed after 8 s.
    table.settings = Settings {
        upstream_idle_timeout_ms: Some(8_000),
        upstream_idle_max: Some(CONNS as u32 * 2),
        ..Settings::default()
    };
    let p = proxy(table).await;
    // Warm up: the table's lazy state, the client's pool.
    assert_eq!(get_closing(&p).await.status, 200);

    let before = live();
    let burst = futures_util::future::join_all((0..CONNS).map(|_| get_closing(&p)));
    for r in burst.await {
        assert_eq!(r.status, 200);
    }
    let opened = accepted.load(SeqCst);
    assert!(opened > CONNS / 2, "the burst opened {opened} upstream connections");
    // Just after the burst: the pooled connections still hold their buffers.
    let busy = (live() - before) / opened as isize;
    println!("{busy} bytes live per pooled upstream connection just after its response");
    assert!(
        busy > 16 * 1024,
        "{busy} bytes per pooled connection: the read buffer was not kept between requests"
    );

    let mut idle = isize::MAX;
    for _ in 0..70 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        idle = (live() - before) / opened as isize;
        if idle < 4 * 1024 {
            break;
        }
    }
    println!("{idle} bytes live per pooled upstream connection idle past a sweep");
    assert!(idle < 4 * 1024, "{idle} bytes per idle pooled connection: its buffers were kept");

    // The connections still serve: one more request reuses a pooled connection.
    let r = get_closing(&p).await;
    assert_eq!(r.status, 200);
    assert_eq!(accepted.load(SeqCst), opened, "a new upstream connection was opened: {}", r.text());
}
