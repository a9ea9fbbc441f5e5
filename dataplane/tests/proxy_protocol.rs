//! PROXY protocol v1/v2 on both listeners: the announced client reaches X-Forwarded-For, a
//! connection without the header is refused; curl's --haproxy-protocol as a real client.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use support::tls::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_dataplane::echo::EchoResponse;
use weir_dataplane::proxy::ProxyConfig;

async fn pp_proxy() -> TlsProxy {
    let e = echo("e").await;
    let ca = Ca::new();
    let table = with_cert(
        table().host("a.test").prefix("/", &to(&e)).build(),
        "a",
        &["a.test"],
        &ca.leaf(&["a.test"]),
    );
    tls_proxy_with(ProxyConfig { proxy_protocol: true, ..test_config() }, table).await
}

fn v2_ipv4(src: [u8; 4], port: u16) -> Vec<u8> {
    let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    out.extend([0x21, 0x11, 0, 12]);
    out.extend(src);
    out.extend([127, 0, 0, 1]);
    out.extend(port.to_be_bytes());
    out.extend(443u16.to_be_bytes());
    out
}

/// Writes `preamble` then an HTTP/1.1 request on a fresh connection; the raw answer.
async fn plain_exchange(addr: SocketAddr, preamble: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(preamble).await.unwrap();
    s.write_all(b"GET /pp HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("answer or close in time");
    String::from_utf8_lossy(&out).into_owned()
}

fn echo_of(raw: &str) -> EchoResponse {
    let body = raw.split_once("\r\n\r\n").unwrap().1;
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {raw}"))
}

#[tokio::test]
async fn plain_listener_takes_the_client_from_v1_and_v2() {
    let p = pp_proxy().await;
    let r = echo_of(&plain_exchange(p.http, b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\n").await);
    assert_eq!(
        (r.headers["x-forwarded-for"].as_str(), r.headers["x-real-ip"].as_str()),
        ("203.0.113.7", "203.0.113.7")
    );
    let r = echo_of(&plain_exchange(p.http, b"PROXY TCP6 2001:db8::5 ::1 4000 80\r\n").await);
    assert_eq!(r.headers["x-forwarded-for"], "2001:db8::5");
    let r = echo_of(&plain_exchange(p.http, &v2_ipv4([198, 51, 100, 9], 8080)).await);
    assert_eq!(r.headers["x-forwarded-for"], "198.51.100.9");
    // UNKNOWN (a balancer health check): the socket peer is the client.
    let r = echo_of(&plain_exchange(p.http, b"PROXY UNKNOWN\r\n").await);
    assert_eq!(r.headers["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test]
async fn connections_without_the_header_are_refused() {
    let p = pp_proxy().await;
    assert_eq!(plain_exchange(p.http, b"").await, "", "plain: closed without an answer");
    assert_eq!(plain_exchange(p.http, b"PROXY TCP4 bogus\r\n").await, "");
    assert!(tls_connect(p.https, "a.test", &[]).await.is_err(), "TLS without the header");
    // The listeners keep serving.
    let r = echo_of(&plain_exchange(p.http, b"PROXY TCP4 203.0.113.8 10.0.0.1 1 80\r\n").await);
    assert_eq!(r.headers["x-forwarded-for"], "203.0.113.8");
}

#[tokio::test]
async fn tls_listener_reads_the_header_before_the_handshake() {
    let p = pp_proxy().await;
    let mut tcp = TcpStream::connect(p.https).await.unwrap();
    tcp.write_all(&v2_ipv4([192, 0, 2, 44], 1234)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(&[b"h2"])));
    let tls = connector.connect("a.test".try_into().unwrap(), tcp).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = send.send_request(http::Request::get("https://a.test/").body(empty()).unwrap()).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let r: EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (r.headers["x-forwarded-for"].as_str(), r.headers["x-forwarded-proto"].as_str()),
        ("192.0.2.44", "https")
    );
}

#[tokio::test]
async fn curl_haproxy_protocol() {
    if !have("curl") {
        return;
    }
    let p = pp_proxy().await;
    let out = tokio::process::Command::new("curl")
        // From 127.0.0.2: the v1 line curl writes names that address.
        .args(["-sS", "--haproxy-protocol", "--interface", "127.0.0.2", "-H", "Host: a.test"])
        .arg(format!("http://{}/curl", p.http))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: EchoResponse = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r.headers["x-forwarded-for"], "127.0.0.2");
    // And plain curl (no header) is refused.
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-H", "Host: a.test"])
        .arg(format!("http://{}/curl", p.http))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
}
