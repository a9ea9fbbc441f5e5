//! weir's HTTP/1 server driver (`--http1-server weir`): hyper per busy period, nothing held while
//! a connection is idle. Each test crosses idle periods on one client connection, where the
//! driver takes the socket back from hyper and gives it to a new hyper connection: requests
//! after an idle wait, pipelined and split heads, `Expect: 100-continue`, chunked bodies with
//! trailers, HTTP/1.0, a WebSocket after a plain request, h2c prior knowledge, the keep-alive
//! timeout and the listener's drain. (It is the default: the whole suite runs on it; the
//! dataplane's tests run on hyper's with `WEIR_HTTP1_SERVER=hyper`.)
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use weir_dataplane::proxy::{Http1Server, ProxyConfig};

async fn weir_proxy() -> (TestProxy, Echo) {
    let e = echo("e").await;
    // No grace: every idle moment takes the hyper connection apart, as the tests want to cross.
    let config =
        ProxyConfig { http1_server: Http1Server::Weir, http1_idle_grace: Duration::ZERO, ..test_config() };
    let p = proxy_with(config, table().host("a.test").prefix("/", &to(&e)).build()).await;
    (p, e)
}

/// Reads one response (its head and a `content-length` or chunked body) from `conn`, keeping
/// what comes after it in `buf`; the head and the body.
async fn response(conn: &mut TcpStream, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let lower = head.to_ascii_lowercase();
                let body_start = end + 4;
                if lower.contains("transfer-encoding: chunked") {
                    if let Some(body_end) = buf[body_start..].windows(5).position(|w| w == b"0\r\n\r\n") {
                        let body = buf[body_start..body_start + body_end + 5].to_vec();
                        buf.drain(..body_start + body_end + 5);
                        return (head, body);
                    }
                } else {
                    let length = lower
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    if head.starts_with("HTTP/1.1 1") || buf.len() >= body_start + length {
                        let length = if head.starts_with("HTTP/1.1 1") { 0 } else { length };
                        let body = buf[body_start..body_start + length].to_vec();
                        buf.drain(..body_start + length);
                        return (head, body);
                    }
                }
            }
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "the connection closed before a whole response: {:?}",
                String::from_utf8_lossy(buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("a response")
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n\r\n")
}

/// The path the echo backend saw.
fn echoed_path(body: &[u8]) -> String {
    let echoed: weir_dataplane::echo::EchoResponse = serde_json::from_slice(body).unwrap();
    echoed.path
}

#[tokio::test]
async fn requests_after_idle_waits_pipelined_and_split_heads_are_served_in_order() {
    let (p, _e) = weir_proxy().await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buf = Vec::new();
    for i in 0..3 {
        conn.write_all(get(&format!("/idle/{i}")).as_bytes()).await.unwrap();
        let (head, body) = response(&mut conn, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(echoed_path(&body), format!("/idle/{i}"));
        // Idle: the driver gives the connection up to its one-byte wait.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Three pipelined requests in one write.
    conn.write_all(format!("{}{}{}", get("/p/1"), get("/p/2"), get("/p/3")).as_bytes()).await.unwrap();
    for i in 1..=3 {
        let (head, body) = response(&mut conn, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(echoed_path(&body), format!("/p/{i}"));
    }
    // A request with the start of the next one, which then arrives in pieces across waits.
    let next = get("/split/2");
    conn.write_all(format!("{}{}", get("/split/1"), &next[..7]).as_bytes()).await.unwrap();
    let (_, body) = response(&mut conn, &mut buf).await;
    assert_eq!(echoed_path(&body), "/split/1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    conn.write_all(&next.as_bytes()[7..20]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    conn.write_all(&next.as_bytes()[20..]).await.unwrap();
    let (head, body) = response(&mut conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(echoed_path(&body), "/split/2");
    assert!(!head.to_ascii_lowercase().contains("connection: close"), "{head}");
}

#[tokio::test]
async fn expect_continue_chunked_bodies_with_trailers_and_http_1_0() {
    let (p, _e) = weir_proxy().await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(get("/first").as_bytes()).await.unwrap();
    response(&mut conn, &mut buf).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Expect: 100-continue, after an idle wait: the 100 comes before the body is sent.
    conn.write_all(
        b"POST /upload HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, _) = response(&mut conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 100"), "{head}");
    conn.write_all(b"hello").await.unwrap();
    let (head, body) = response(&mut conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let echoed: weir_dataplane::echo::EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(echoed.body_bytes, 5);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A chunked upload with trailers, in pieces.
    conn.write_all(
        b"POST /chunked HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.write_all(b"2\r\nde\r\n0\r\nx-trailer: t\r\n\r\n").await.unwrap();
    let (head, body) = response(&mut conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let echoed: weir_dataplane::echo::EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(echoed.body_bytes, 5);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // HTTP/1.0 without keep-alive: answered, then closed.
    conn.write_all(b"GET /old HTTP/1.0\r\nHost: a.test\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut rest)).await.unwrap().unwrap();
    buf.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("/old"), "{text}");
}

#[tokio::test]
async fn a_websocket_upgrade_after_an_idle_wait_is_spliced() {
    let (p, _e) = weir_proxy().await;
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(get("/before").as_bytes()).await.unwrap();
    let (head, _) = response(&mut conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let req = "ws://a.test/ws".into_client_request().unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, conn).await.unwrap();
    assert_eq!(resp.status(), 101);
    for i in 0..3 {
        let text = format!("hello {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(30), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), text);
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn h2c_prior_knowledge_is_still_served_on_the_plain_listener() {
    let (p, _e) = weir_proxy().await;
    let tcp = TcpStream::connect(p.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::builder().uri("http://a.test/h2").body(()).unwrap();
    let (resp, _) = client.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        let _ = body.flow_control().release_capacity(data.len());
        bytes.extend_from_slice(&data);
    }
    assert_eq!(echoed_path(&bytes), "/h2");
}

#[tokio::test]
async fn the_keep_alive_timeout_closes_an_idle_connection() {
    let (p, e) = weir_proxy().await;
    let mut t = table().host("a.test").prefix("/", &to(&e)).build();
    t.settings.keepalive_secs = Some(1);
    p.proxy.publish(t).unwrap();
    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(get("/").as_bytes()).await.unwrap();
    response(&mut conn, &mut buf).await;
    let started = std::time::Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
    assert!(started.elapsed() >= Duration::from_millis(900), "not before the keep-alive timeout");
}

#[tokio::test]
async fn draining_closes_idle_connections_and_finishes_requests_in_flight() {
    let (mut p, _e) = weir_proxy().await;
    let mut idle = TcpStream::connect(p.addr).await.unwrap();
    let mut buf = Vec::new();
    idle.write_all(get("/").as_bytes()).await.unwrap();
    response(&mut idle, &mut buf).await;

    let mut busy = TcpStream::connect(p.addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: a.test\r\nx-echo-delay-ms: 500\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    p.shutdown();
    let mut busy_buf = Vec::new();
    let (head, body) = response(&mut busy, &mut busy_buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "the request in flight finished: {head}");
    assert_eq!(echoed_path(&body), "/slow");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), idle.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the idle connection was closed: {read:?}");
    let done = tokio::time::timeout(Duration::from_secs(30), p.task.take().unwrap()).await;
    done.expect("serve returns after draining").unwrap().unwrap();
}
