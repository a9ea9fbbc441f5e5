//! weir's own HTTP/1.1 upstream client against upstreams on raw sockets that write exact bytes:
//! response framing (chunked at every boundary, until close, bodiless statuses), interim
//! responses, invalid heads (502), connection reuse and its end (`Connection: close`, an idle
//! close, an early answer, bytes nobody asked for), and the request framing it sends.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the raw upstream answers to one request.
#[derive(Clone, Default)]
struct Reply {
    bytes: Vec<u8>,
    /// Written one byte at a time, each its own write.
    byte_by_byte: bool,
    /// The connection is closed after it.
    close: bool,
    /// Written as soon as the request head is in, before its body is read.
    early: bool,
    /// After it, everything read is echoed back (an upgraded connection).
    echo: bool,
}

fn reply(s: &str) -> Reply {
    Reply { bytes: s.as_bytes().to_vec(), ..Reply::default() }
}

/// An upstream on raw sockets: per request (head and body read per their framing) it writes
/// what `answer` says for the request head. Counts connections; keeps every request's bytes.
struct Raw {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

async fn raw(answer: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Raw {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (a, r, answer) = (accepted.clone(), requests.clone(), Arc::new(answer));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            a.fetch_add(1, SeqCst);
            tokio::spawn(serve(tcp, answer.clone(), r.clone()));
        }
    });
    Raw { addr, accepted, requests }
}

async fn serve(
    mut tcp: TcpStream,
    answer: Arc<impl Fn(&str) -> Reply + Send + Sync + 'static>,
    requests: Arc<Mutex<Vec<String>>>,
) {
    let mut buf = Vec::new();
    loop {
        // The head.
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !read_more(&mut tcp, &mut buf).await {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        let reply = answer(&head);
        let lower = head.to_ascii_lowercase();
        if reply.early {
            write(&mut tcp, &reply).await;
            // Drains whatever else comes, without answering.
            while read_more(&mut tcp, &mut buf).await {
                buf.clear();
            }
            return;
        }
        // The body.
        let length = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        let body_end = if lower.contains("transfer-encoding: chunked") {
            loop {
                // The last chunk, then trailers (if any) up to an empty line.
                let last = buf.windows(5).position(|w| w == b"\r\n0\r\n").map(|i| i + 2);
                let last = last.or_else(|| buf.starts_with(b"0\r\n").then_some(0));
                if let Some(i) = last
                    && let Some(j) = buf[i + 1..].windows(4).position(|w| w == b"\r\n\r\n")
                {
                    break i + 1 + j + 4;
                }
                if !read_more(&mut tcp, &mut buf).await {
                    return;
                }
            }
        } else {
            let n = length.unwrap_or(0);
            while buf.len() < n {
                if !read_more(&mut tcp, &mut buf).await {
                    return;
                }
            }
            n
        };
        let body = String::from_utf8_lossy(&buf[..body_end]).into_owned();
        buf.drain(..body_end);
        requests.lock().unwrap().push(head + &body);
        write(&mut tcp, &reply).await;
        if reply.echo {
            let _ = tcp.write_all(&buf).await;
            let (mut rd, mut wr) = tcp.split();
            let _ = tokio::io::copy(&mut rd, &mut wr).await;
            return;
        }
        if reply.close {
            return;
        }
    }
}

async fn read_more(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    match tcp.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

async fn write(tcp: &mut TcpStream, reply: &Reply) {
    if reply.byte_by_byte {
        tcp.set_nodelay(true).unwrap();
        for b in &reply.bytes {
            if tcp.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    } else {
        let _ = tcp.write_all(&reply.bytes).await;
    }
}

async fn proxy_to(up: &Raw) -> TestProxy {
    proxy(table().host("a.test").prefix("/", &backend("up", &[up.addr])).build()).await
}

#[tokio::test]
async fn a_chunked_response_written_byte_by_byte_arrives_whole_and_its_connection_is_reused() {
    let up = raw(|_| Reply {
        bytes: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-up: 1\r\n\r\n5;ext=x\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: t\r\n\r\n"
            .to_vec(),
        byte_by_byte: true,
        ..Reply::default()
    })
    .await;
    let p = proxy_to(&up).await;
    for _ in 0..2 {
        let r = p.get("a.test", "/").await;
        assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "hello, world"));
        assert_eq!(r.headers["x-up"], "1");
    }
    assert_eq!(up.accepted.load(SeqCst), 1, "the connection was reused");
}

#[tokio::test]
async fn a_response_delimited_by_the_close_arrives_whole_on_a_connection_of_its_own() {
    let up =
        raw(|_| Reply { close: true, byte_by_byte: true, ..reply("HTTP/1.1 200 OK\r\n\r\nuntil the end") })
            .await;
    let p = proxy_to(&up).await;
    for _ in 0..2 {
        let r = p.get("a.test", "/").await;
        assert_eq!((r.status.as_u16(), r.text().as_str()), (200, "until the end"));
    }
    assert_eq!(up.accepted.load(SeqCst), 2);
}

#[tokio::test]
async fn head_204_and_304_responses_have_no_body_whatever_their_content_length() {
    let up = raw(|head| {
        let status = if head.starts_with("HEAD") {
            "200 OK"
        } else if head.contains("GET /nc") {
            "204 No Content"
        } else {
            "304 Not Modified"
        };
        reply(&format!("HTTP/1.1 {status}\r\ncontent-length: 5\r\n\r\n"))
    })
    .await;
    let p = proxy_to(&up).await;
    let r = p.send(p.req("a.test", "/").method("HEAD").body(empty()).unwrap()).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));
    assert_eq!(r.headers["content-length"], "5");
    assert_eq!(p.get("a.test", "/nc").await.status, 204);
    assert_eq!(p.get("a.test", "/nm").await.status, 304);
    // Had the client waited for 5 body bytes, the next request would hang or go elsewhere.
    assert_eq!(p.get("a.test", "/nc").await.status, 204);
    assert_eq!(up.accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn interim_responses_before_the_answer_are_skipped() {
    let up = raw(|_| {
        reply(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s.css>\r\n\r\n\
             HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone",
        )
    })
    .await;
    let p = proxy_to(&up).await;
    let r = p.send(p.req("a.test", "/").method("POST").body(full("x")).unwrap()).await;
    assert_eq!((r.status.as_u16(), r.text().as_str()), (201, "done"));
    assert!(!r.headers.contains_key("link"));
}

#[tokio::test]
async fn invalid_response_heads_are_502() {
    let many: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let huge = format!("x-big: {}\r\n", "a".repeat(500 * 1024));
    let cases = [
        "HTTP/1.1 2000 OK\r\ncontent-length: 0\r\n\r\n".to_string(),
        "NOTHTTP 200 OK\r\n\r\n".to_string(),
        "HTTP/1.1 200 OK\r\nbad header\r\n\r\n".to_string(),
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc".to_string(),
        "HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n".to_string(),
        format!("HTTP/1.1 200 OK\r\n{many}content-length: 0\r\n\r\n"),
        format!("HTTP/1.1 200 OK\r\n{huge}content-length: 0\r\n\r\n"),
    ];
    for case in cases {
        let up = raw(move |_| reply(&case)).await;
        let p = proxy_to(&up).await;
        let r = p.get("a.test", "/").await;
        r.assert_local(502);
    }
}

#[tokio::test]
async fn a_response_cut_short_fails_the_request() {
    // The head promises 10 bytes; the upstream closes after 3: the client must not see a
    // complete response.
    let up =
        raw(|_| Reply { close: true, ..reply("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc") }).await;
    let p = proxy_to(&up).await;
    let whole = match client().request(p.req("a.test", "/").body(empty()).unwrap()).await {
        Ok(resp) => resp.into_body().collect().await.is_ok(),
        Err(_) => false,
    };
    assert!(!whole, "a truncated body ends in an error");
    // And a close before any response at all is a 502.
    let up = raw(|_| Reply { close: true, ..Reply::default() }).await;
    let p = proxy_to(&up).await;
    p.get("a.test", "/").await.assert_local(502);
}

#[tokio::test]
async fn connection_close_from_the_upstream_sends_the_next_request_on_a_new_connection() {
    // The upstream says close but keeps the connection open: the proxy must not reuse it.
    let up = raw(|_| reply("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok")).await;
    let p = proxy_to(&up).await;
    for i in 1..=3 {
        assert_eq!(p.get("a.test", "/").await.text(), "ok");
        assert_eq!(up.accepted.load(SeqCst), i);
    }
    // HTTP/1.0 without keep-alive, likewise; with keep-alive, reused.
    let up = raw(|_| reply("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
    let p = proxy_to(&up).await;
    for _ in 0..2 {
        assert_eq!(p.get("a.test", "/").await.text(), "ok");
    }
    assert_eq!(up.accepted.load(SeqCst), 2);
    let up = raw(|_| reply("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok")).await;
    let p = proxy_to(&up).await;
    for _ in 0..2 {
        assert_eq!(p.get("a.test", "/").await.text(), "ok");
    }
    assert_eq!(up.accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_is_replaced_unnoticed() {
    // Each connection answers one request (without saying so) and is then closed.
    let up = raw(|_| Reply { close: true, ..reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok") }).await;
    let p = proxy_to(&up).await;
    for i in 1..=3 {
        assert_eq!(p.get("a.test", "/").await.text(), "ok");
        // Let the close arrive while the connection idles in the pool.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(up.accepted.load(SeqCst), i);
    }
}

#[tokio::test]
async fn an_early_answer_while_the_body_is_sent_reaches_the_client_and_ends_the_connection() {
    let up = raw(|head| {
        if head.starts_with("POST") {
            Reply { early: true, ..reply("HTTP/1.1 413 Payload Too Large\r\ncontent-length: 3\r\n\r\nbig") }
        } else {
            reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        }
    })
    .await;
    let p = proxy_to(&up).await;
    // A raw client that declares 64 MiB and sends it slowly in the background.
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    let total = 64 * 1024 * 1024;
    s.write_all(format!("POST / HTTP/1.1\r\nhost: a.test\r\ncontent-length: {total}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (mut rd, mut wr) = s.into_split();
    let sender = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..(total / chunk.len()) {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\nbig") {
        let n = tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed without an answer: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 413 "), "{:?}", String::from_utf8_lossy(&got));
    sender.abort();
    // The connection that answered early is not reused.
    assert_eq!(p.get("a.test", "/").await.text(), "ok");
    assert_eq!(up.accepted.load(SeqCst), 2);
}

#[tokio::test]
async fn bytes_after_a_response_keep_its_connection_out_of_the_pool() {
    let up = raw(|_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")).await;
    let p = proxy_to(&up).await;
    for i in 1..=2 {
        assert_eq!(p.get("a.test", "/").await.text(), "ok");
        assert_eq!(up.accepted.load(SeqCst), i);
    }
}

#[tokio::test]
async fn request_bodies_are_framed_as_declared_or_chunked() {
    let up = raw(|_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
    let p = proxy_to(&up).await;
    // A declared length is kept.
    let r = p.send(p.req("a.test", "/len").method("POST").body(full("hello")).unwrap()).await;
    assert_eq!(r.text(), "ok");
    // A body of unknown length is chunked.
    let frames: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"abc"))),
        Ok(http_body::Frame::data(Bytes::from_static(b"de"))),
    ];
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let r = p.send(p.req("a.test", "/chunked").method("PUT").body(body).unwrap()).await;
    assert_eq!(r.text(), "ok");
    // No body, no framing.
    assert_eq!(p.get("a.test", "/none").await.text(), "ok");
    let seen = up.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].starts_with("POST /len HTTP/1.1\r\n"), "{}", seen[0]);
    assert!(seen[0].contains("content-length: 5\r\n") && seen[0].ends_with("\r\n\r\nhello"), "{}", seen[0]);
    assert!(!seen[0].contains("transfer-encoding"), "{}", seen[0]);
    assert!(seen[1].contains("transfer-encoding: chunked\r\n"), "{}", seen[1]);
    assert!(!seen[1].contains("content-length"), "{}", seen[1]);
    let body = &seen[1][seen[1].find("\r\n\r\n").unwrap() + 4..];
    let data: String =
        body.split("\r\n").collect::<Vec<_>>().chunks(2).filter_map(|c| c.get(1).copied()).collect();
    assert_eq!(data, "abcde", "{body:?}");
    assert!(body.ends_with("0\r\n\r\n"), "{body:?}");
    assert!(seen[2].starts_with("GET /none HTTP/1.1\r\n") && seen[2].ends_with("\r\n\r\n"), "{}", seen[2]);
    assert!(!seen[2].contains("content-length") && !seen[2].contains("transfer-encoding"), "{}", seen[2]);
    assert!(seen[2].contains("host: a.test\r\n"), "{}", seen[2]);
    assert_eq!(up.accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn an_upgrade_hands_the_connection_and_the_bytes_past_the_101_to_the_client() {
    // The upstream's first bytes after its 101 arrive with the head: they must reach the client.
    let up = raw(|_| Reply {
        echo: true,
        ..reply("HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: x-test\r\n\r\nHELLO")
    })
    .await;
    let p = proxy_to(&up).await;
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    s.write_all(b"GET /up HTTP/1.1\r\nhost: a.test\r\nconnection: upgrade\r\nupgrade: x-test\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    read_until(&mut s, &mut got, "\r\n\r\nHELLO").await;
    assert!(got.starts_with(b"HTTP/1.1 101 "), "{:?}", String::from_utf8_lossy(&got));
    s.write_all(b"ping").await.unwrap();
    read_until(&mut s, &mut got, "HELLOping").await;
}

/// Reads from `s` into `got` until it holds `want` (5 s at most).
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: &str) {
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(got).contains(want) {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect(want).unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(got));
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn request_trailers_named_by_the_trailer_header_go_upstream() {
    let up = raw(|_| reply("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")).await;
    let p = proxy_to(&up).await;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-sum", http::HeaderValue::from_static("6"));
    trailers.insert("x-unnamed", http::HeaderValue::from_static("no"));
    let frames: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"abc"))),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = p.req("a.test", "/t").method("POST").header("trailer", "x-sum").body(body).unwrap();
    assert_eq!(p.send(req).await.text(), "ok");
    let seen = up.requests.lock().unwrap().clone();
    let body = &seen[0][seen[0].find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "3\r\nabc\r\n0\r\nx-sum: 6\r\n\r\n", "{}", seen[0]);
}
