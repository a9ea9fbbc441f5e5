//! Overload limits, observed as a client sees them over real loopback sockets: connection limits
//! (in all and per client, also behind the PROXY protocol), the listen backlog, the send timeout
//! of a client that stops reading, `client-body-timeout`, `client-header-timeout`, and the
//! HTTP/2 floods (rapid reset, CONTINUATION, PING, SETTINGS) that must stay bounded, and HTTP/2
//! streams whose client grants no flow-control window.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use weir_dataplane::proxy::ProxyConfig;
use weir_dataplane::proxy::limits::{self, ConnLimitConfig};

/// A keep-alive connection that has been served once (so it is admitted and open).
async fn served_conn(addr: SocketAddr, from: Option<&str>) -> TcpStream {
    let mut conn = connect_from(addr, from).await;
    assert_eq!(exchange(&mut conn).await.as_deref(), Some("200"), "an admitted connection is served");
    conn
}

async fn connect_from(addr: SocketAddr, from: Option<&str>) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(ip) = from {
        socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    }
    socket.connect(addr).await.unwrap()
}

/// One `GET /` on `conn`; the status code, or `None` when the connection was closed or reset
/// without an answer.
async fn exchange(conn: &mut TcpStream) -> Option<String> {
    let sent = conn.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    if sent.is_err() {
        return None;
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&head);
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if head.len() >= end + 4 + length {
                    return Some(text[9..12].to_string());
                }
            }
        }
    })
    .await;
    read.expect("the proxy neither answered nor closed the connection")
}

async fn echo_proxy(config: ProxyConfig) -> (TestProxy, Echo) {
    let echo = echo("e").await;
    let p = proxy_with(config, table().host("a.test").prefix("/", &to(&echo)).build()).await;
    (p, echo)
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn max_connections_resets_the_connection_past_it_and_admits_again_when_one_closes() {
    let config =
        ProxyConfig { connection_limits: ConnLimitConfig { max: 3, per_client: 0 }, ..test_config() };
    let (p, _echo) = echo_proxy(config).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(served_conn(p.addr, None).await);
    }
    let mut fourth = connect_from(p.addr, None).await;
    assert_eq!(exchange(&mut fourth).await, None, "the fourth connection is refused");
    assert_eq!(p.proxy.connection_stats().refused_total, 1);
    assert_eq!(p.proxy.connection_stats().open, 3);
    // The open ones are still served.
    assert_eq!(exchange(&mut open[0]).await.as_deref(), Some("200"));

    drop(open.pop());
    until("the closed connection's place is given back", || p.proxy.connection_stats().open == 2).await;
    served_conn(p.addr, None).await;
}

#[tokio::test]
async fn max_connections_per_client_counts_each_client_address_apart() {
    let config =
        ProxyConfig { connection_limits: ConnLimitConfig { max: 100, per_client: 2 }, ..test_config() };
    let (p, _echo) = echo_proxy(config).await;
    let _a1 = served_conn(p.addr, Some("127.0.0.2")).await;
    let _a2 = served_conn(p.addr, Some("127.0.0.2")).await;
    let mut a3 = connect_from(p.addr, Some("127.0.0.2")).await;
    assert_eq!(exchange(&mut a3).await, None, "a third connection from 127.0.0.2 is refused");
    let _b1 = served_conn(p.addr, Some("127.0.0.3")).await;
    let stats = p.proxy.connection_stats();
    assert_eq!((stats.refused_per_client, stats.refused_total, stats.open), (1, 0, 3));
}

#[tokio::test]
async fn behind_the_proxy_protocol_the_per_client_limit_counts_the_client_it_names() {
    let config = ProxyConfig {
        proxy_protocol: true,
        connection_limits: ConnLimitConfig { max: 100, per_client: 1 },
        ..test_config()
    };
    let (p, _echo) = echo_proxy(config).await;
    async fn via_balancer(addr: SocketAddr, client: &str) -> TcpStream {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let header = format!("PROXY TCP4 {client} 127.0.0.1 40000 80\r\n");
        conn.write_all(header.as_bytes()).await.unwrap();
        conn
    }
    let mut first = via_balancer(p.addr, "10.1.0.1").await;
    assert_eq!(exchange(&mut first).await.as_deref(), Some("200"));
    let mut again = via_balancer(p.addr, "10.1.0.1").await;
    assert_eq!(exchange(&mut again).await, None, "the same client behind the balancer is refused");
    let mut other = via_balancer(p.addr, "10.1.0.2").await;
    assert_eq!(
        exchange(&mut other).await.as_deref(),
        Some("200"),
        "another client behind the same balancer is not"
    );
}

#[tokio::test]
async fn the_listen_backlog_defaults_to_somaxconn_and_can_be_set() {
    if !tls::have("ss") {
        return;
    }
    let default = limits::bind("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let set = limits::bind("127.0.0.1:0".parse().unwrap(), Some(777)).unwrap();
    // For a listening socket, `ss` reports the backlog in the Send-Q column.
    let backlog = |l: &TcpListener| {
        let port = l.local_addr().unwrap().port();
        let out =
            std::process::Command::new("ss").args(["-ltnH", &format!("sport = :{port}")]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let columns: Vec<&str> = text.split_whitespace().collect();
        assert!(columns.len() >= 3, "unexpected ss output: {text:?}");
        columns[2].parse::<u32>().unwrap()
    };
    assert_eq!(backlog(&default), limits::somaxconn());
    assert_eq!(backlog(&set), 777);
}

/// An upstream answering every request with `size` bytes, writing as fast as it is taken;
/// counts what it managed to write and whether the proxy closed its connection.
async fn firehose(size: u64) -> (SocketAddr, Arc<AtomicU64>, tokio::sync::watch::Receiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let (closed_tx, closed) = tokio::sync::watch::channel(false);
    let count = written.clone();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = [0u8; 4096];
        let _ = conn.read(&mut head).await;
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n");
        conn.write_all(answer.as_bytes()).await.unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0u64;
        while sent < size {
            match conn.write(&chunk).await {
                Ok(n) => {
                    sent += n as u64;
                    count.store(sent, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
        let _ = closed_tx.send(true);
    });
    (addr, written, closed)
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_after_the_send_timeout_with_bounded_buffering() {
    const BODY: u64 = 1 << 30;
    let (upstream, written, mut closed) = firehose(BODY).await;
    let config = ProxyConfig { client_send_timeout: Duration::from_secs(1), ..test_config() };
    let be = backend("fire", &[upstream]);
    let p = proxy_with(config, table().host("a.test").prefix("/", &be).build()).await;

    let mut client = TcpStream::connect(p.addr).await.unwrap();
    client.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await.unwrap();
    // The client reads nothing. The proxy stops reading the upstream once its buffers are full,
    // then gives up on the client and closes both sides.
    tokio::time::timeout(Duration::from_secs(60), closed.wait_for(|c| *c))
        .await
        .expect("the proxy closed the upstream connection after the send timeout")
        .unwrap();
    let taken = written.load(Ordering::Relaxed);
    assert!(taken < 64 << 20, "the proxy buffered {taken} bytes for a client that reads nothing");

    // What the client gets now is what was in flight, then the end: never the whole body.
    let mut received = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    let end = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => received += n as u64,
                Err(e) => return Err(e.kind()),
            }
        }
    })
    .await
    .expect("the client's connection was closed");
    assert!(matches!(end, Ok(()) | Err(ErrorKind::ConnectionReset)), "{end:?}");
    assert!(received < BODY, "the client got {received} bytes");
}

#[tokio::test]
async fn client_body_timeout_answers_408_to_a_body_that_stops_arriving() {
    let (p, echo) = echo_proxy(test_config()).await;
    let mut t = table().host("a.test").prefix("/", &to(&echo)).build();
    t.settings.client_body_timeout_ms = Some(1000);
    p.proxy.publish(t).unwrap();

    let mut conn = TcpStream::connect(p.addr).await.unwrap();
    // Chunked: streamed to the upstream as it comes (a small body of known length is read
    // whole first, under the upstream timeout).
    conn.write_all(b"POST /up HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut answer))
        .await
        .expect("an answer after client-body-timeout")
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test]
async fn client_header_timeout_closes_a_connection_whose_head_does_not_arrive() {
    let (p, echo) = echo_proxy(test_config()).await;
    let mut t = table().host("a.test").prefix("/", &to(&echo)).build();
    t.settings.client_header_timeout_ms = Some(1000);
    p.proxy.publish(t).unwrap();

    served_conn(p.addr, None).await;
    let mut slow = TcpStream::connect(p.addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: a.te").await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(30), slow.read(&mut buf))
        .await
        .expect("the proxy closes a connection whose head stalls");
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before the timeout");
    match read {
        Ok(0) | Err(_) => {}
        Ok(n) => {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        }
    }
}

// === HTTP/2 floods (h2c prior knowledge on the plain listener) ===

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

/// `GET http://a.test/` in HPACK, from the static table without indexing.
fn get_block() -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x84, 0x01, 6];
    block.extend_from_slice(b"a.test");
    block
}

/// Reads frames until a GOAWAY (its error code) or the end of the connection (`None`).
async fn goaway(conn: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<u32> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        while buf.len() >= 9 {
            let len = (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            if buf[3] == GOAWAY && len >= 8 {
                return Some(u32::from_be_bytes([buf[13], buf[14], buf[15], buf[16]]));
            }
            buf.drain(..9 + len);
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A counting upstream: every request it answers bumps the counter.
async fn counting_proxy(config: ProxyConfig) -> (TestProxy, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicU64::new(0));
    let count = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else { return };
            let count = count.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    count.fetch_add(1, Ordering::Relaxed);
                    async { Ok::<_, std::convert::Infallible>(http::Response::new(full("ok"))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                    .await;
            });
        }
    });
    let p = proxy_with(config, table().host("a.test").prefix("/", &backend("count", &[addr])).build()).await;
    (p, hits)
}

/// Sends `flood` on a new h2c connection while reading what comes back; returns the GOAWAY code
/// (or `None` if the connection just ended) and whether the whole flood was taken.
async fn flood(addr: SocketAddr, flood: Vec<u8>) -> (Option<u32>, bool) {
    let conn = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = conn.into_split();
    let sender = tokio::spawn(async move {
        let taken = writer.write_all(&flood).await.is_ok();
        (taken, writer)
    });
    let code = tokio::time::timeout(Duration::from_secs(60), goaway(&mut reader))
        .await
        .expect("the proxy answered the flood with a GOAWAY or closed the connection");
    drop(reader);
    let taken = match tokio::time::timeout(Duration::from_secs(60), sender).await {
        Ok(Ok((taken, _writer))) => taken,
        _ => panic!("the flood's writer neither finished nor failed"),
    };
    (code, taken)
}

fn preface() -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[]));
    bytes
}

const ENHANCE_YOUR_CALM: u32 = 0xb;

// CVE-2023-44487: streams opened and reset at once, each costing the server a request.
#[tokio::test]
async fn h2_rapid_reset_is_cut_off_with_a_goaway() {
    let (p, hits) = counting_proxy(test_config()).await;
    let mut bytes = preface();
    const STREAMS: u32 = 20_000;
    for i in 0..STREAMS {
        let id = 2 * i + 1;
        bytes.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &get_block()));
        bytes.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes())); // CANCEL
    }
    let (code, _) = flood(p.addr, bytes).await;
    assert_eq!(code, Some(ENHANCE_YOUR_CALM));
    let reached = hits.load(Ordering::Relaxed);
    assert!(reached < u64::from(STREAMS) / 10, "{reached} of {STREAMS} reset streams reached the upstream");
    assert_eq!(p.get("a.test", "/").await.status, 200, "everyone else is still served");
}

// CVE-2024-27316 and kin: a header block that never ends, in CONTINUATION frames.
#[tokio::test]
async fn h2_continuation_flood_is_cut_off_before_it_is_buffered() {
    let (p, hits) = counting_proxy(test_config()).await;
    let mut bytes = preface();
    bytes.extend(frame(HEADERS, END_STREAM, 1, &get_block()));
    // Literal header fields with new names, ~16 KiB per frame, 32 MiB in all.
    let mut block = Vec::new();
    while block.len() < 16_000 {
        block.extend_from_slice(&[0x00, 3]);
        block.extend_from_slice(b"x-a");
        block.push(100);
        block.extend_from_slice(&[b'v'; 100]);
    }
    for _ in 0..2000 {
        bytes.extend(frame(CONTINUATION, 0, 1, &block));
    }
    let (code, taken) = flood(p.addr, bytes).await;
    assert!(code.is_some() || !taken, "the flood was taken whole without an error: {code:?}");
    assert_eq!(hits.load(Ordering::Relaxed), 0, "the unfinished request never went upstream");
    assert_eq!(p.get("a.test", "/").await.status, 200, "everyone else is still served");
}

/// PING and SETTINGS each need an answer; a client that sends them without reading the answers
/// gets the proxy to stop reading (it answers before reading on), then cut by the send timeout.
async fn unanswered(kind: u8, payload: &[u8], count: usize) {
    let config = ProxyConfig { client_send_timeout: Duration::from_secs(1), ..test_config() };
    let (p, _hits) = counting_proxy(config).await;
    let conn = TcpStream::connect(p.addr).await.unwrap();
    let (reader, mut writer) = conn.into_split();
    let mut bytes = preface();
    let one = frame(kind, 0, 0, payload);
    for _ in 0..count {
        bytes.extend_from_slice(&one);
    }
    // Nothing is read: the answers pile up in the socket buffers, then the proxy must stop.
    let written = tokio::time::timeout(Duration::from_secs(60), writer.write_all(&bytes))
        .await
        .expect("the proxy neither took the flood nor closed the connection");
    assert!(written.is_err(), "{} bytes of frames taken while no answer was read", bytes.len());
    drop(reader);
    assert_eq!(p.get("a.test", "/").await.status, 200, "everyone else is still served");
}

#[tokio::test]
async fn h2_ping_flood_without_reading_is_bounded_and_cut() {
    // 2 M pings, 34 MB: more than every socket buffer on the way can hold.
    unanswered(PING, &[0; 8], 2_000_000).await;
}

#[tokio::test]
async fn h2_settings_flood_without_reading_is_bounded_and_cut() {
    unanswered(SETTINGS, &[], 4_000_000).await;
}

// === HTTP/2 flow control: a stream the client grants no window ===

/// An h2c client connection (the `h2` crate) with `window` as its streams' initial window and a
/// 16 MiB connection window; the returned sender changes `SETTINGS_INITIAL_WINDOW_SIZE` later.
async fn h2_client(
    addr: SocketAddr,
    window: u32,
) -> (h2::client::SendRequest<bytes::Bytes>, tokio::sync::mpsc::UnboundedSender<u32>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, mut conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(16 << 20)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let (settings, mut changes) = tokio::sync::mpsc::unbounded_channel::<u32>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut conn => return,
                Some(window) = changes.recv() => conn.set_initial_window_size(window).unwrap(),
            }
        }
    });
    (send, settings)
}

fn h2_get(host: &str, path: &str) -> http::Request<()> {
    http::Request::builder().uri(format!("http://{host}{path}")).body(()).unwrap()
}

/// Sends `req` on `client`; the response head (within a generous deadline).
async fn h2_send(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    req: http::Request<()>,
) -> http::Response<h2::RecvStream> {
    let mut ready = client.clone().ready().await.unwrap();
    let (resp, _) = ready.send_request(req, true).unwrap();
    *client = ready;
    tokio::time::timeout(Duration::from_secs(30), resp).await.expect("a response head").unwrap()
}

/// Reads `body` to its end, granting window as it goes; the bytes.
async fn h2_read_all(mut body: h2::RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(data) = body.data().await {
            let data = data.unwrap();
            let _ = body.flow_control().release_capacity(data.len());
            all.extend_from_slice(&data);
        }
    })
    .await
    .expect("the whole body");
    all
}

/// Reads `body` without granting window until the stream ends; the bytes taken and the
/// stream's error (its reset).
async fn h2_read_until_reset(mut body: h2::RecvStream) -> (usize, Option<h2::Error>) {
    let mut taken = 0;
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(data) = body.data().await {
            match data {
                Ok(data) => taken += data.len(),
                Err(e) => return (taken, Some(e)),
            }
        }
        (taken, None)
    })
    .await
    .expect("the stalled stream was reset after the send timeout")
}

/// A proxy with `client_send_timeout`: `a.test` streams 1 GiB from a firehose upstream (one
/// connection), `b.test` goes to an echo backend named `small`.
async fn stall_proxy(
    send_timeout: Duration,
) -> (TestProxy, Arc<AtomicU64>, tokio::sync::watch::Receiver<bool>, Echo) {
    let (upstream, written, closed) = firehose(1 << 30).await;
    let small = echo("small").await;
    let config = ProxyConfig { client_send_timeout: send_timeout, ..test_config() };
    let t = table()
        .host("a.test")
        .prefix("/", &backend("fire", &[upstream]))
        .host("b.test")
        .prefix("/", &to(&small))
        .build();
    (proxy_with(config, t).await, written, closed, small)
}

#[tokio::test]
async fn h2_stream_with_a_zero_window_is_reset_after_the_send_timeout_and_its_upstream_released() {
    let (p, written, mut closed, _small) = stall_proxy(Duration::from_secs(1)).await;
    // SETTINGS_INITIAL_WINDOW_SIZE 0: the response head comes (HEADERS take no window), no data.
    let (mut client, window) = h2_client(p.addr, 0).await;
    let resp = h2_send(&mut client, h2_get("a.test", "/big")).await;
    assert_eq!(resp.status(), 200);
    let (taken, reset) = h2_read_until_reset(resp.into_body()).await;
    assert_eq!(taken, 0, "no window, no data");
    let reset = reset.expect("the stream ended with an error, not a clean end");
    assert_eq!(reset.reason(), Some(h2::Reason::CANCEL), "{reset}");

    // The upstream exchange is released: the upstream sees its connection closed, early.
    tokio::time::timeout(Duration::from_secs(30), closed.wait_for(|c| *c))
        .await
        .expect("the proxy closed the upstream connection of the reset stream")
        .unwrap();
    let sent = written.load(Ordering::Relaxed);
    assert!(sent < 64 << 20, "the upstream wrote {sent} bytes for a stream that took none");

    // The connection itself is still served: with a window, the next stream gets its answer.
    window.send(65_535).unwrap();
    let resp = h2_send(&mut client, h2_get("b.test", "/next")).await;
    assert_eq!(resp.status(), 200);
    let body = String::from_utf8(h2_read_all(resp.into_body()).await).unwrap();
    assert!(body.contains("\"small\""), "{body}");
    // And other clients are.
    assert_eq!(p.get("b.test", "/").await.status, 200);
}

#[tokio::test]
async fn h2_stream_whose_window_is_never_updated_is_reset_while_the_others_are_served() {
    let (p, _written, mut closed, _small) = stall_proxy(Duration::from_secs(2)).await;
    // The default 64 KiB stream window, never given back: the stream stalls once it is full.
    let (mut client, _window) = h2_client(p.addr, 65_535).await;
    let stalled = h2_send(&mut client, h2_get("a.test", "/big")).await;
    assert_eq!(stalled.status(), 200);
    let stalled = tokio::spawn(h2_read_until_reset(stalled.into_body()));

    // Another stream on the same connection is served meanwhile (or after: no timing here).
    let resp = h2_send(&mut client, h2_get("b.test", "/other")).await;
    assert_eq!(resp.status(), 200);
    let body = String::from_utf8(h2_read_all(resp.into_body()).await).unwrap();
    assert!(body.contains("\"small\""), "{body}");

    let (taken, reset) = stalled.await.unwrap();
    assert!(taken <= 65_535, "{taken} bytes taken past the window");
    let reset = reset.expect("the stalled stream was reset");
    assert_eq!(reset.reason(), Some(h2::Reason::CANCEL), "{reset}");
    tokio::time::timeout(Duration::from_secs(30), closed.wait_for(|c| *c))
        .await
        .expect("the proxy closed the upstream connection of the reset stream")
        .unwrap();
    // The connection still serves new streams after the reset.
    let resp = h2_send(&mut client, h2_get("b.test", "/after")).await;
    assert_eq!(resp.status(), 200);
    h2_read_all(resp.into_body()).await;
}
