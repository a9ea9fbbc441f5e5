//! The echo backend over real sockets: HTTP/1.1, h2c, control headers and WebSocket.

#![allow(missing_docs)]
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use weir_dataplane::echo::{self, EchoResponse};

/// A running echo backend; stops it when dropped.
struct Echo {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn start(name: &str) -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(echo::serve(listener, name.to_owned(), async move {
        let _ = stopped.await;
    }));
    Echo { addr, _stop: stop }
}

fn http1() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let response = client.request(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

#[tokio::test]
async fn get_reports_request_fields() {
    let echo = start("alpha").await;
    let req = Request::get(format!("http://{}/some/path?a=1&b=two", echo.addr))
        .header("host", "example.test")
        .header("x-one", "1")
        .header("X-Repeated", "a")
        .header("x-repeated", "b")
        .body(Full::default())
        .unwrap();
    let (status, headers, body) = send(&http1(), req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let seen: EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen.name, "alpha");
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path, "/some/path");
    assert_eq!(seen.query.as_deref(), Some("a=1&b=two"));
    assert_eq!(seen.host.as_deref(), Some("example.test"));
    assert_eq!(seen.headers["x-one"], "1");
    assert_eq!(seen.headers["x-repeated"], "a, b");
    assert_eq!(seen.protocol, "HTTP/1.1");
    assert_eq!(seen.body_bytes, 0);
    assert!(seen.remote_addr.starts_with("127.0.0.1:"), "{}", seen.remote_addr);
}

#[tokio::test]
async fn h2c_prior_knowledge_reports_http2() {
    let echo = start("h2").await;
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let req = Request::get(format!("http://{}/h2", echo.addr)).body(Empty::new()).unwrap();
    let response = client.request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let seen: EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen.protocol, "HTTP/2.0");
    assert_eq!(seen.path, "/h2");
    assert_eq!(seen.host, Some(echo.addr.to_string()));
}

#[tokio::test]
async fn large_post_is_counted() {
    let echo = start("big").await;
    let size = 10 * 1024 * 1024;
    let req = Request::post(format!("http://{}/upload", echo.addr))
        .body(Full::new(Bytes::from(vec![7u8; size])))
        .unwrap();
    let (status, _, body) = send(&http1(), req).await;
    assert_eq!(status, StatusCode::OK);
    let seen: EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.body_bytes, 10_485_760);
}

#[tokio::test]
async fn status_control_header() {
    let echo = start("status").await;
    let req = Request::get(format!("http://{}/", echo.addr))
        .header("x-echo-status", "503")
        .body(Full::default())
        .unwrap();
    let (status, headers, body) = send(&http1(), req).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["content-type"], "application/json");
    let seen: EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen.name, "status");
}

#[tokio::test]
async fn body_size_control_header() {
    let echo = start("sized").await;
    for size in [0usize, 1, 16 * 1024, 100_000] {
        let req = Request::post(format!("http://{}/", echo.addr))
            .header("x-echo-body-size", size.to_string())
            .header("x-echo-status", "201")
            .body(Full::new(Bytes::from_static(b"request body")))
            .unwrap();
        let (status, headers, body) = send(&http1(), req).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers["content-length"], size.to_string().as_str());
        assert_eq!(body.len(), size);
        assert!(body.iter().all(|b| *b == b'x'));
    }
}

#[tokio::test]
async fn delay_control_header() {
    let echo = start("slow").await;
    let req = Request::get(format!("http://{}/", echo.addr))
        .header("x-echo-delay-ms", "200")
        .body(Full::default())
        .unwrap();
    let started = std::time::Instant::now();
    let (status, _, _) = send(&http1(), req).await;
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
}

#[tokio::test]
async fn bad_control_values_give_400() {
    let echo = start("bad").await;
    for (name, value) in [
        ("x-echo-status", "abc"),
        ("x-echo-status", "42"),
        ("x-echo-status", "600"),
        ("x-echo-delay-ms", "-1"),
        ("x-echo-delay-ms", "99999999999"),
        ("x-echo-body-size", "lots"),
    ] {
        let req =
            Request::get(format!("http://{}/", echo.addr)).header(name, value).body(Full::default()).unwrap();
        let (status, headers, body) = send(&http1(), req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {value}");
        assert!(headers["content-type"].to_str().unwrap().starts_with("text/plain"));
        let message = String::from_utf8(body.to_vec()).unwrap();
        assert!(message.contains(name), "{message}");
    }
}

#[tokio::test]
async fn websocket_round_trip() {
    let echo = start("ws").await;
    let stream = tokio::net::TcpStream::connect(echo.addr).await.unwrap();
    let url = format!("ws://{}/socket", echo.addr);
    let (mut ws, response) = tokio_tungstenite::client_async(url, stream).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);

    let messages = [
        Message::text("hello"),
        Message::binary(vec![0u8, 1, 2, 255]),
        Message::text("x".repeat(100_000)),
        Message::text("last"),
    ];
    for message in &messages {
        ws.send(message.clone()).await.unwrap();
        let answer = ws.next().await.unwrap().unwrap();
        assert_eq!(&answer, message);
    }

    ws.send(Message::Ping(Bytes::from_static(b"p"))).await.unwrap();
    let pong = ws.next().await.unwrap().unwrap();
    assert_eq!(pong, Message::Pong(Bytes::from_static(b"p")));

    ws.close(None).await.unwrap();
    // The server completes the close handshake; the stream then ends.
    while let Some(message) = ws.next().await {
        match message {
            Ok(Message::Close(_)) => {}
            Ok(other) => panic!("unexpected message after close: {other:?}"),
            Err(error) => panic!("close did not complete cleanly: {error}"),
        }
    }
}

#[tokio::test]
async fn stops_accepting_on_shutdown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(echo::serve(listener, "gone".to_owned(), async move {
        let _ = stopped.await;
    }));
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
