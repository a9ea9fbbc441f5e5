//! The settings' client-side limits through a real proxy and curl: `large-client-header-buffers`
//! (414 for a request line over one buffer, 431 for a header line over it or a head over all of
//! them), `http2-max-field-size`, `http2-max-header-size` and `http2-max-concurrent-streams` over
//! h2c (`curl --http2-prior-knowledge`), and `proxy-protocol-header-timeout`.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use support::tls::have;
use support::*;
use tokio::io::AsyncReadExt;
use weir_dataplane::model::ClientLimits;

async fn limited(limits: ClientLimits) -> (TestProxy, Echo) {
    let e = echo("app").await;
    let mut t = table().host("app.test").prefix("/", &to(&e)).build();
    t.settings.client_limits = limits;
    (proxy(t).await, e)
}

/// curl through the proxy (in a blocking thread): the status, and what `-v` said.
async fn curl(addr: SocketAddr, path: String, headers: Vec<String>, h2: bool) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new("curl");
        cmd.args(["-sv", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: app.test"]);
        if h2 {
            cmd.arg("--http2-prior-knowledge");
        }
        for h in &headers {
            cmd.args(["-H", h]);
        }
        let out = cmd.arg(format!("http://{addr}{path}")).output().unwrap();
        let code = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
        (code, String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .await
    .unwrap()
}

fn header(name: &str, len: usize) -> String {
    format!("{name}: {}", "v".repeat(len))
}

#[tokio::test]
async fn large_client_header_buffers_bound_lines_and_the_head() {
    if !have("curl") {
        return;
    }
    let (p, _e) = limited(ClientLimits { header_buffers: Some((2, 1024)), ..ClientLimits::default() }).await;
    let a = p.addr;
    assert_eq!(curl(a, "/ok".into(), vec![header("x-a", 900)], false).await.0, 200);
    // A request line over one buffer: 414, as nginx.
    assert_eq!(curl(a, format!("/{}", "p".repeat(1100)), vec![], false).await.0, 414);
    // A header line over one buffer: 431.
    assert_eq!(curl(a, "/".into(), vec![header("x-a", 1100)], false).await.0, 431);
    // Lines that each fit, in a head over hyper's smallest buffer (8 KiB): 431.
    let many: Vec<String> = (0..12).map(|i| header(&format!("x-{i}"), 900)).collect();
    assert_eq!(curl(a, "/".into(), many, false).await.0, 431);
    // HTTP/2 fields are held to the same buffer.
    assert_eq!(curl(a, "/".into(), vec![header("x-a", 900)], true).await.0, 200);
    assert_eq!(curl(a, "/".into(), vec![header("x-a", 1100)], true).await.0, 431);
    assert_eq!(curl(a, format!("/{}", "p".repeat(1100)), vec![], true).await.0, 414);
    // Without the setting, the same requests pass.
    let (p, _e) = limited(ClientLimits::default()).await;
    assert_eq!(curl(p.addr, "/".into(), vec![header("x-a", 1100)], false).await.0, 200);
    assert_eq!(curl(p.addr, format!("/{}", "p".repeat(1100)), vec![], true).await.0, 200);
}

#[tokio::test]
async fn http2_field_and_header_list_sizes() {
    if !have("curl") {
        return;
    }
    let limits = ClientLimits {
        h2_max_field_bytes: Some(2000),
        h2_max_header_bytes: Some(4096),
        ..ClientLimits::default()
    };
    let (p, _e) = limited(limits).await;
    let a = p.addr;
    assert_eq!(curl(a, "/".into(), vec![header("x-a", 1900)], true).await.0, 200);
    assert_eq!(curl(a, "/".into(), vec![header("x-a", 2100)], true).await.0, 431);
    // Fields that each fit, in a list over http2-max-header-size.
    let many: Vec<String> = (0..4).map(|i| header(&format!("x-{i}"), 1500)).collect();
    assert_eq!(curl(a, "/".into(), many, true).await.0, 431);
}

/// The server's first SETTINGS frame on an h2c connection: (identifier, value) pairs.
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The preface, then an empty SETTINGS frame (length 0, type 4, no flags, stream 0).
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await.unwrap();
    let mut head = [0u8; 9];
    conn.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 4, "the server starts with SETTINGS");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload).await.unwrap();
    payload
        .chunks_exact(6)
        .map(|e| (u16::from_be_bytes([e[0], e[1]]), u32::from_be_bytes([e[2], e[3], e[4], e[5]])))
        .collect()
}

#[tokio::test]
async fn http2_max_concurrent_streams_is_announced() {
    const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    let limits = ClientLimits {
        h2_max_concurrent_streams: Some(7),
        h2_max_header_bytes: Some(4096),
        ..ClientLimits::default()
    };
    let (p, _e) = limited(limits).await;
    let settings = server_settings(p.addr).await;
    assert!(settings.contains(&(MAX_CONCURRENT_STREAMS, 7)), "{settings:?}");
    assert!(settings.contains(&(MAX_HEADER_LIST_SIZE, 4096)), "{settings:?}");
    // And curl, told so, still gets its answer.
    if have("curl") {
        assert_eq!(curl(p.addr, "/".into(), vec![], true).await.0, 200);
    }
}

#[tokio::test]
async fn a_connection_without_its_proxy_header_is_closed_after_the_timeout() {
    let e = echo("app").await;
    let mut t = table().host("app.test").prefix("/", &to(&e)).build();
    t.settings.proxy_protocol = Some(true);
    t.settings.client_limits.proxy_protocol_header_timeout_ms = Some(300);
    let p = proxy(t).await;
    let mut silent = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "the proxy closed the silent connection: {read:?}");
}

/// What the echo saw of a curl request with these extra headers.
async fn echoed_headers(addr: SocketAddr, headers: &[&str]) -> String {
    let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-H", "Host: app.test"]);
        for h in &headers {
            cmd.args(["-H", h]);
        }
        let out = cmd.arg(format!("http://{addr}/")).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn invalid_header_names_are_dropped_unless_told_otherwise() {
    if !have("curl") {
        return;
    }
    let sent = ["X-Ok: 1", "X.Dot: 2", "X_Under: 3"];
    // By default (nginx's `ignore_invalid_headers on`): only letters, digits and `-` pass.
    let (p, _e) = limited(ClientLimits::default()).await;
    let seen = echoed_headers(p.addr, &sent).await;
    assert!(seen.contains("x-ok"), "{seen}");
    assert!(!seen.contains("x.dot") && !seen.contains("x_under"), "{seen}");
    // `ignore-invalid-headers: "false"`: passed as sent.
    let keep = ClientLimits { ignore_invalid_headers: Some(false), ..ClientLimits::default() };
    let (p, _e) = limited(keep).await;
    let seen = echoed_headers(p.addr, &sent).await;
    assert!(seen.contains("x-ok") && seen.contains("x.dot") && seen.contains("x_under"), "{seen}");
}
