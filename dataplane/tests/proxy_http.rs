//! End-to-end HTTP behaviour: errors and retries, header policy, streaming, h2c, upgrades,
//! malformed requests and graceful shutdown.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use weir_dataplane::model::UpstreamProtocol;
use weir_dataplane::proxy::ProxyConfig;

// === errors and retries ===

#[tokio::test]
async fn refused_upstream_is_502() {
    let dead = dead_addr().await;
    let p = proxy(table().host("a.test").prefix("/", &backend("dead", &[dead])).build()).await;
    p.get("a.test", "/").await.assert_local(502);
    let p = proxy(table().host("a.test").prefix("/", &backend("dead2", &[dead, dead_addr().await])).build())
        .await;
    p.get("a.test", "/").await.assert_local(502);
}

#[tokio::test]
async fn connect_errors_retry_on_another_endpoint() {
    let live = echo("live").await;
    let be = backend("half", &[dead_addr().await, live.addr, dead_addr().await]);
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    for i in 0..9 {
        assert_eq!(p.get("a.test", "/").await.name(), "live", "request {i}");
    }
    // A request with a body is retried too: the body was never sent to the dead endpoint.
    for i in 0..6 {
        let req = p.req("a.test", "/upload").method("POST").body(full(vec![7u8; 4096])).unwrap();
        let r = p.send(req).await.echo();
        assert_eq!((r.name.as_str(), r.body_bytes), ("live", 4096), "request {i}");
    }
}

#[tokio::test]
async fn slow_response_head_is_504() {
    let slow = echo("slow").await;
    let config = ProxyConfig { upstream_timeout: Duration::from_millis(300), ..test_config() };
    let p = proxy_with(config, table().host("a.test").prefix("/", &to(&slow)).build()).await;
    let started = Instant::now();
    let r = p.send(p.req("a.test", "/").header("x-echo-delay-ms", "3000").body(empty()).unwrap()).await;
    r.assert_local(504);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // A fast one on the same proxy is fine.
    assert_eq!(p.get("a.test", "/").await.name(), "slow");
}

/// Each request on one keep-alive connection gets its own response-head deadline (the
/// connection's timer is re-armed lazily, not per request): requests that together outlast the
/// timeout pass, a slow one later on the same connection is 504 after its own timeout, and the
/// connection keeps serving.
#[tokio::test]
async fn each_request_on_a_connection_has_its_own_response_deadline() {
    let slow = echo("slow").await;
    let config = ProxyConfig { upstream_timeout: Duration::from_millis(400), ..test_config() };
    let p = proxy_with(config, table().host("a.test").prefix("/", &to(&slow)).build()).await;
    let tcp = TcpStream::connect(p.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    let get = |delay_ms: u64| {
        Request::get("/")
            .header("host", "a.test")
            .header("x-echo-delay-ms", delay_ms.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    // 4 x 250 ms: each under the timeout, together well over it.
    for _ in 0..4 {
        send.ready().await.unwrap();
        assert_eq!(send.send_request(get(250)).await.unwrap().status(), StatusCode::OK);
    }
    send.ready().await.unwrap();
    let started = Instant::now();
    let resp = send.send_request(get(3000)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(350) && took < Duration::from_secs(2), "504 after {took:?}");
    send.ready().await.unwrap();
    assert_eq!(send.send_request(get(0)).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn upstream_status_is_passed_through() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let r = p.send(p.req("a.test", "/").header("x-echo-status", "503").body(empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_ne!(r.headers.get("content-type").map(|v| v.as_bytes()), Some(&b"text/plain; charset=utf-8"[..]));
}

async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.expect("no hang").unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn malformed_request_is_400_not_a_hang() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let resp = raw_exchange(p.addr, b"GET / HTTP/1.1\r\nHost: a.test\r\nthis is not a header\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    // No host at all: our own 400.
    let resp = raw_exchange(p.addr, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(resp.ends_with("400 Bad Request\n"), "{resp}");
}

// === header policy ===

#[tokio::test]
async fn hop_by_hop_removed_and_forwarded_headers_set() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let req = p
        .req("a.test", "/h")
        .header("connection", "keep-alive, x-secret")
        .header("x-secret", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "keep-alive")
        .header("te", "gzip")
        .header("upgrade", "h2c")
        .header("proxy-authorization", "Basic Zm9v")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-real-ip", "6.6.6.6")
        .header("x-forwarded-proto", "https")
        .header("x-custom", "kept")
        .body(empty())
        .unwrap();
    let r = p.send(req).await.echo();
    for h in
        ["connection", "x-secret", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authorization"]
    {
        assert!(!r.headers.contains_key(h), "{h} leaked: {:?}", r.headers);
    }
    assert_eq!(r.headers["x-custom"], "kept");
    assert_eq!(r.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(r.headers["x-real-ip"], "127.0.0.1");
    assert_eq!(r.headers["x-forwarded-proto"], "http");
    assert_eq!(r.headers["x-forwarded-host"], "a.test");
    assert_eq!(r.headers["x-forwarded-port"], p.addr.port().to_string());
    let id = &r.headers["x-request-id"];
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_eq!(r.host.as_deref(), Some("a.test"));
    assert_eq!(r.protocol, "HTTP/1.1");
}

#[tokio::test]
async fn host_and_request_id_are_preserved() {
    let e = echo("e").await;
    let p = proxy(table().host("*.example.com").prefix("/", &to(&e)).build()).await;
    let req = p.req("Shop.Example.com:8443", "/").header("x-request-id", "abc-123").body(empty()).unwrap();
    let r = p.send(req).await.echo();
    assert_eq!(r.host.as_deref(), Some("Shop.Example.com:8443"));
    assert_eq!(r.headers["x-request-id"], "abc-123");
    assert_eq!(r.headers["x-forwarded-host"], "Shop.Example.com:8443");
}

#[tokio::test]
async fn local_responses_carry_the_request_id() {
    let p = proxy(table().build()).await;
    let r = p.send(p.req("a.test", "/").header("x-request-id", "given").body(empty()).unwrap()).await;
    r.assert_local(404);
    assert_eq!(r.headers["x-request-id"], "given");
    assert_eq!(r.text(), "404 Not Found\n");
}

// === streaming ===

const BIG: u64 = 64 << 20;

#[tokio::test]
async fn streams_a_64_mib_upload() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let chunk = Bytes::from(vec![b'x'; 1 << 20]);
    let frames = futures_util::stream::iter((0..BIG >> 20).map(move |_| Ok(Frame::data(chunk.clone()))));
    let req = p.req("a.test", "/up").method("POST").body(BodyExt::boxed(StreamBody::new(frames))).unwrap();
    let r = p.send(req).await.echo();
    assert_eq!(r.body_bytes, BIG);
}

#[tokio::test]
async fn streams_a_64_mib_download() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let req = p.req("a.test", "/down").header("x-echo-body-size", BIG.to_string()).body(empty()).unwrap();
    let resp = p.send_raw(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let (mut total, mut frames) = (0u64, 0u64);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            total += data.len() as u64;
            frames += 1;
        }
    }
    assert_eq!(total, BIG);
    assert!(frames > 1, "arrived in pieces, not as one buffer");
}

// === protocols ===

async fn h2c_get(addr: std::net::SocketAddr, uri: &str) -> support::Resp {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(Request::get(uri).body(Empty::<Bytes>::new()).unwrap()).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    support::Resp { status: parts.status, headers: parts.headers, body }
}

#[tokio::test]
async fn h2c_client_to_http1_upstream() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let r = h2c_get(p.addr, "http://a.test/h2?x=1").await.echo();
    assert_eq!(r.protocol, "HTTP/1.1");
    assert_eq!(r.host.as_deref(), Some("a.test"));
    assert_eq!(r.path, "/h2");
    assert_eq!(r.query.as_deref(), Some("x=1"));
    assert_eq!(r.headers["x-forwarded-host"], "a.test");
    h2c_get(p.addr, "http://b.test/").await.assert_local(404);
}

#[tokio::test]
async fn h2c_upstream() {
    let e = echo("e").await;
    let mut be = to(&e);
    be.backend.protocol = UpstreamProtocol::H2c;
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    for _ in 0..3 {
        let r = p.get("a.test:8080", "/grpc?x=1").await.echo();
        assert_eq!(r.protocol, "HTTP/2.0");
        assert_eq!((r.path.as_str(), r.query.as_deref()), ("/grpc", Some("x=1")));
        // The request host travels as `:authority`.
        assert_eq!(r.host.as_deref(), Some("a.test:8080"));
        assert!(!r.headers.contains_key("host"), "{:?}", r.headers);
    }
    let r = h2c_get(p.addr, "http://a.test/grpc").await.echo();
    assert_eq!(r.protocol, "HTTP/2.0");
    assert_eq!(r.host.as_deref(), Some("a.test"));
}

#[tokio::test]
async fn websocket_through_the_proxy() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let stream = TcpStream::connect(p.addr).await.unwrap();
    let req = "ws://a.test/ws".into_client_request().unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, stream).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..5 {
        let text = format!("hello {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), text);
    }
    ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(got.into_data().as_ref(), [1u8, 2, 3]);
    ws.close(None).await.unwrap();
}

// === lifecycle ===

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let e = echo("e").await;
    let mut p = proxy(table().host("a.test").prefix("/", &to(&e)).build()).await;
    let req = p.req("a.test", "/").header("x-echo-delay-ms", "400").body(empty()).unwrap();
    let client = client();
    let slow = tokio::spawn(async move { client.request(req).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    p.shutdown();
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let echoed: weir_dataplane::echo::EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(echoed.name, "e");
    let done = tokio::time::timeout(Duration::from_secs(5), p.task.take().unwrap()).await;
    done.expect("serve returns after draining").unwrap().unwrap();
    assert!(TcpStream::connect(p.addr).await.is_err(), "no longer accepting");
}

// === odd upstreams ===

/// An upstream that answers every connection with `response`, byte for byte.
async fn raw_upstream(response: &'static [u8]) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s.write_all(response).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn response_hop_by_hop_headers_are_removed() {
    let up = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, x-hop\r\nX-Hop: 1\r\n\
          Keep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nUpgrade: foo\r\nX-Kept: 1\r\n\r\nok",
    )
    .await;
    let p = proxy(table().host("a.test").prefix("/", &backend("raw", &[up])).build()).await;
    let r = p.get("a.test", "/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "ok");
    assert_eq!(r.headers["x-kept"], "1");
    for h in ["x-hop", "keep-alive", "proxy-authenticate", "upgrade"] {
        assert!(!r.headers.contains_key(h), "{h} leaked: {:?}", r.headers);
    }
}

#[tokio::test]
async fn garbage_from_upstream_is_502() {
    let up = raw_upstream(b"SSH-2.0-OpenSSH_9.6\r\n\r\n").await;
    let p = proxy(table().host("a.test").prefix("/", &backend("raw", &[up])).build()).await;
    p.get("a.test", "/").await.assert_local(502);
}

#[tokio::test]
async fn dns_target_resolves_at_connect() {
    let e = echo("e").await;
    let mut be = backend("external", &[]);
    be.backend.target = weir_dataplane::model::Target::Dns { host: "localhost".into(), port: e.addr.port() };
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    let r = p.get("a.test", "/").await.echo();
    assert_eq!(r.name, "e");
    assert_eq!(r.host.as_deref(), Some("a.test"));
}

#[tokio::test]
async fn h2c_upstream_connect_errors_retry() {
    let e = echo("live").await;
    let mut be = backend("h2", &[dead_addr().await, e.addr]);
    be.backend.protocol = UpstreamProtocol::H2c;
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    for _ in 0..4 {
        let req = p.req("a.test", "/").method("PUT").body(full("abc")).unwrap();
        let r = p.send(req).await.echo();
        assert_eq!((r.name.as_str(), r.protocol.as_str(), r.body_bytes), ("live", "HTTP/2.0", 3));
    }
}

// === backpressure: the proxy streams, it never holds a whole body ===

/// Bytes that may sit in socket and hyper buffers between a stalled reader and a writer.
const IN_FLIGHT_LIMIT: u64 = 64 << 20;

#[tokio::test]
async fn download_is_streamed_with_backpressure() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    // An upstream announcing 4 GiB and writing as fast as it is allowed to, counting.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let written = std::sync::Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await; // the request head (small)
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4294967296\r\n\r\n").await.unwrap();
        let chunk = vec![b'd'; 64 << 10];
        while s.write_all(&chunk).await.is_ok() {
            counter.fetch_add(chunk.len() as u64, Relaxed);
        }
    });
    let p = proxy(table().host("a.test").prefix("/", &backend("big", &[up])).build()).await;
    let resp = p.send_raw(p.req("a.test", "/").body(empty()).unwrap()).await;
    let mut body = resp.into_body();
    let mut read = 0u64;
    while read < 1 << 20 {
        read += body.frame().await.unwrap().unwrap().into_data().map_or(0, |d| d.len() as u64);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w = written.load(Relaxed);
    assert!(w < read + IN_FLIGHT_LIMIT, "upstream wrote {w} bytes while the client read {read}");
}

#[tokio::test]
async fn upload_is_streamed_with_backpressure() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    // An upstream that reads 1 MiB of the request and then stops reading.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0;
        while got < 1 << 20 {
            got += s.read(&mut buf).await.unwrap();
        }
        std::future::pending::<()>().await;
        drop(s);
    });
    let p = proxy(table().host("a.test").prefix("/", &backend("sink", &[up])).build()).await;
    let produced = std::sync::Arc::new(AtomicU64::new(0));
    let counter = produced.clone();
    let chunk = Bytes::from(vec![b'u'; 64 << 10]);
    let endless = futures_util::stream::repeat_with(move || {
        counter.fetch_add(chunk.len() as u64, Relaxed);
        Ok(Frame::data(chunk.clone()))
    });
    let req = p.req("a.test", "/").method("POST").body(BodyExt::boxed(StreamBody::new(endless))).unwrap();
    let client = client();
    let pending = tokio::spawn(async move { client.request(req).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = produced.load(Relaxed);
    assert!(n > 1 << 20, "the upload started ({n} bytes)");
    assert!(n < (1 << 20) + IN_FLIGHT_LIMIT, "the client produced {n} bytes while upstream read 1 MiB");
    pending.abort();
}

/// A listener whose accept queue is full and never drained: new connects hang (SYNs dropped).
async fn blackhole() -> (std::net::SocketAddr, Vec<TcpStream>, tokio::net::TcpListener) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => fillers.push(s),
            _ => break,
        }
    }
    (addr, fillers, listener)
}

#[tokio::test]
async fn connect_timeout_is_504_and_retried() {
    let (hole, _fillers, _listener) = blackhole().await;
    if tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(hole)).await.is_ok() {
        eprintln!("this kernel accepts past the backlog; cannot make a connect hang, skipping");
        return;
    }
    let config = ProxyConfig { connect_timeout: Duration::from_millis(200), ..test_config() };
    let p = proxy_with(config.clone(), table().host("a.test").prefix("/", &backend("hole", &[hole])).build())
        .await;
    let started = Instant::now();
    p.get("a.test", "/").await.assert_local(504);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());

    let live = echo("live").await;
    let be = backend("half", &[hole, live.addr]);
    let p = proxy_with(config, table().host("a.test").prefix("/", &be).build()).await;
    for _ in 0..4 {
        assert_eq!(p.get("a.test", "/").await.name(), "live");
    }
}

#[tokio::test]
async fn unasked_101_is_502() {
    let up =
        raw_upstream(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n").await;
    let p = proxy(table().host("a.test").prefix("/", &backend("raw", &[up])).build()).await;
    p.get("a.test", "/").await.assert_local(502);
}
