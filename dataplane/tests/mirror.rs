//! Request mirroring (ingress-nginx `mirror-target`, `mirror-host`, `mirror-request-body`;
//! Gateway API `RequestMirror`, repeated) through a real proxy: the mirror target gets a copy of
//! each request (URL from the template, the request's headers and body), each of several mirrors
//! its own, over HTTP/1.1 or h2c; the client gets the route's own answer, and a mirror that
//! stalls, refuses connections or cannot be trusted changes nothing for the client.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::tls::{Ca, tls_backend_counted};
use support::*;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use weir_dataplane::model::{Mirror, RoutePolicy, SourceFilter};

/// What a mirror target saw of one request.
#[derive(Debug)]
struct Seen {
    version: http::Version,
    method: String,
    uri: String,
    headers: HeaderMap,
    /// The whole body, or why it could not be read (never read when the target stalls).
    body: Result<Bytes, String>,
}

/// A mirror target on loopback that reports every request it gets. When `stall` is set it
/// reports the request head, then neither reads the body nor answers.
async fn target(stall: bool) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    serve_target(stall, false).await
}

/// [`target`] speaking HTTP/2 only (prior knowledge), as gRPC servers do: an HTTP/1.1 request
/// is refused.
async fn h2_only_target() -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    serve_target(false, true).await
}

async fn serve_target(stall: bool, h2_only: bool) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let mut seen = Seen {
                            version: parts.version,
                            method: parts.method.to_string(),
                            uri: parts.uri.to_string(),
                            headers: parts.headers,
                            body: Err("not read".into()),
                        };
                        if stall {
                            let _ = tx.send(seen);
                            std::future::pending::<()>().await;
                            unreachable!();
                        }
                        seen.body = body.collect().await.map(|b| b.to_bytes()).map_err(|e| e.to_string());
                        let _ = tx.send(seen);
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"mirror's answer, dropped"),
                        )))
                    }
                });
                let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                if h2_only {
                    builder = builder.http2_only();
                }
                let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    (addr, rx)
}

fn mirror(target: String, host: Option<&str>, request_body: bool) -> RoutePolicy {
    mirrors(vec![Mirror {
        target,
        host: host.map(str::to_string),
        request_body,
        share_ppm: None,
        h2c: false,
        spread: Vec::new(),
    }])
}

fn mirrors(mirrors: Vec<Mirror>) -> RoutePolicy {
    RoutePolicy { mirrors: Some(Box::new(mirrors)), ..RoutePolicy::default() }
}

/// A Gateway API mirror (`RequestMirror`: the request's URI, the body) of `share_ppm` of the
/// requests (`None`: all), over h2c when `h2c`.
fn to_service(addr: SocketAddr, share_ppm: Option<u32>, h2c: bool) -> Mirror {
    Mirror {
        target: format!("http://{addr}$request_uri"),
        host: None,
        request_body: true,
        share_ppm,
        h2c,
        spread: Vec::new(),
    }
}

/// The next request the target reports; a test that waits too long fails instead of hanging.
async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the mirror target got no copy within 10 s")
        .expect("the mirror target is gone")
}

/// Bounds a step that must not hang.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f).await.unwrap_or_else(|_| panic!("{what}: hung"))
}

/// A streamed request body of `chunks` chunks of `size` bytes (chunked: no Content-Length).
fn streamed(chunks: usize, size: usize) -> TestBody {
    let frames = (0..chunks).map(move |i| Ok(Frame::data(Bytes::from(vec![b'a' + (i % 26) as u8; size]))));
    BodyExt::boxed(StreamBody::new(futures_util::stream::iter(frames)))
}

#[tokio::test]
async fn the_target_gets_a_copy_with_headers_and_body() {
    let e = echo("e").await;
    let (mirror_addr, mut copies) = target(false).await;
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(mirror(format!("http://{mirror_addr}/shadow$request_uri"), None, true))
            .build(),
    )
    .await;

    // A body with a length.
    let r = p
        .send(
            p.req("app.test", "/api/x?y=1")
                .method("POST")
                .header("x-test", "one")
                .body(full(&b"hello"[..]))
                .unwrap(),
        )
        .await;
    let seen_upstream = r.echo();
    assert_eq!((seen_upstream.name.as_str(), seen_upstream.body_bytes), ("e", 5));
    let copy = next(&mut copies).await;
    assert_eq!(copy.method, "POST");
    assert_eq!(copy.uri, "/shadow/api/x?y=1");
    assert_eq!(copy.headers["host"], mirror_addr.to_string().as_str());
    assert_eq!(copy.headers["x-test"], "one");
    assert_eq!(copy.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(copy.headers["x-forwarded-host"], "app.test");
    assert_eq!(copy.body.as_deref().unwrap(), b"hello");
    // The copy and the proxied request carry the same request id.
    assert_eq!(copy.headers["x-request-id"], seen_upstream.headers["x-request-id"].as_str());

    // A chunked body of 40 frames: the copy gets all of it.
    let r = p.send(p.req("app.test", "/upload").method("PUT").body(streamed(40, 1000)).unwrap()).await;
    assert_eq!(r.echo().body_bytes, 40_000);
    let copy = next(&mut copies).await;
    assert_eq!((copy.method.as_str(), copy.uri.as_str()), ("PUT", "/shadow/upload"));
    let body = copy.body.unwrap();
    assert_eq!(body.len(), 40_000);
    assert_eq!((body[0], body[39_999]), (b'a', b'a' + 13));

    // A GET without a body.
    p.get("app.test", "/page").await.echo();
    let copy = next(&mut copies).await;
    assert_eq!((copy.method.as_str(), copy.uri.as_str()), ("GET", "/shadow/page"));
    assert!(copy.body.unwrap().is_empty());
}

/// Gateway API `HTTPRouteFilter.requestMirror`: "This filter can be used multiple times within
/// the same rule" (conformance `HTTPRouteRequestMultipleMirrors`). Each mirror gets its own copy,
/// body included (a streamed one of 40 frames too), and each is drawn by its own share: one at
/// 0 % gets none.
#[tokio::test]
async fn each_of_several_mirrors_gets_its_own_copy_with_the_body() {
    let e = echo("e").await;
    let (a, mut copies_a) = target(false).await;
    let (b, mut copies_b) = target(false).await;
    let (never, mut copies_never) = target(false).await;
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(mirrors(vec![
                to_service(a, None, false),
                to_service(never, Some(0), false),
                to_service(b, None, false),
            ]))
            .build(),
    )
    .await;
    let r = p
        .send(p.req("app.test", "/multi-mirror?x=1").method("POST").body(full(&b"hello"[..])).unwrap())
        .await;
    assert_eq!(r.echo().body_bytes, 5);
    for copies in [&mut copies_a, &mut copies_b] {
        let copy = next(copies).await;
        assert_eq!((copy.method.as_str(), copy.uri.as_str()), ("POST", "/multi-mirror?x=1"));
        assert_eq!(copy.body.as_deref().unwrap(), b"hello");
    }
    let r = p.send(p.req("app.test", "/upload").method("PUT").body(streamed(40, 1000)).unwrap()).await;
    assert_eq!(r.echo().body_bytes, 40_000);
    for copies in [&mut copies_a, &mut copies_b] {
        let copy = next(copies).await;
        assert_eq!(copy.uri, "/upload");
        let body = copy.body.unwrap();
        assert_eq!((body.len(), body[0], body[39_999]), (40_000, b'a', b'a' + 13));
    }
    // Copies go in the order of the requests: a later request's copy at the others shows the
    // 0 % mirror had its chance at the first two.
    p.get("app.test", "/last").await.echo();
    assert_eq!(next(&mut copies_a).await.uri, "/last");
    assert_eq!(next(&mut copies_b).await.uri, "/last");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(copies_never.try_recv().is_err(), "a mirror whose share is 0 got a copy");
}

/// A Gateway API mirror to a Service with several ready endpoints (`spread`): the copies take
/// turns over them, round robin, each carrying its endpoint as `Host` (HTTP/1.1) or as the
/// connection and `:authority` (h2c).
#[tokio::test]
async fn copies_take_turns_over_the_services_endpoints() {
    let e = echo("e").await;
    let mut targets = Vec::new();
    for _ in 0..3 {
        targets.push(target(false).await);
    }
    let mut h2_targets = Vec::new();
    for _ in 0..2 {
        h2_targets.push(h2_only_target().await);
    }
    let spread = |addrs: &[SocketAddr]| addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let h1_addrs: Vec<SocketAddr> = targets.iter().map(|t| t.0).collect();
    let h2_addrs: Vec<SocketAddr> = h2_targets.iter().map(|t| t.0).collect();
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(mirrors(vec![
                Mirror { spread: spread(&h1_addrs[1..]), ..to_service(h1_addrs[0], None, false) },
                Mirror { spread: spread(&h2_addrs[1..]), ..to_service(h2_addrs[0], None, true) },
            ]))
            .build(),
    )
    .await;
    for i in 0..6 {
        p.get("app.test", &format!("/turn/{i}")).await.echo();
        let (addr, copies) = &mut targets[i % 3];
        let copy = next(copies).await;
        assert_eq!(copy.uri, format!("/turn/{i}"), "copy {i} goes to endpoint {}", i % 3);
        assert_eq!(copy.headers["host"], addr.to_string().as_str());
        let (addr, copies) = &mut h2_targets[i % 2];
        let copy = next(copies).await;
        assert_eq!((copy.version, copy.uri), (http::Version::HTTP_2, format!("http://{addr}/turn/{i}")));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (addr, copies) in targets.iter_mut().chain(h2_targets.iter_mut()) {
        assert!(copies.try_recv().is_err(), "{addr} got more than its turns");
    }
}

/// A mirror spoken to over h2c (a GRPCRoute's, or `appProtocol: kubernetes.io/h2c`): the copy
/// reaches a target that speaks HTTP/2 only, as HTTP/2, with its body and the target's address
/// as `:authority`; beside it an HTTP/1.1 mirror gets the same request as HTTP/1.1.
#[tokio::test]
async fn an_h2c_mirror_sends_its_copy_over_http2() {
    let e = echo("e").await;
    let (h2, mut copies_h2) = h2_only_target().await;
    let (h1, mut copies_h1) = target(false).await;
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(mirrors(vec![to_service(h2, None, true), to_service(h1, None, false)]))
            .build(),
    )
    .await;
    for i in 0..3 {
        let r = p
            .send(
                p.req("app.test", &format!("/t.Svc/Call{i}")).method("POST").body(streamed(8, 100)).unwrap(),
            )
            .await;
        assert_eq!(r.echo().body_bytes, 800);
        let copy = next(&mut copies_h2).await;
        assert_eq!(copy.version, http::Version::HTTP_2);
        assert_eq!(
            (copy.method.as_str(), copy.uri.as_str()),
            ("POST", format!("http://{h2}/t.Svc/Call{i}").as_str())
        );
        assert_eq!(copy.body.unwrap().len(), 800);
        let copy = next(&mut copies_h1).await;
        assert_eq!((copy.version, copy.uri), (http::Version::HTTP_11, format!("/t.Svc/Call{i}")));
        assert_eq!(copy.body.unwrap().len(), 800);
    }
}

#[tokio::test]
async fn mirror_host_and_no_body() {
    let e = echo("e").await;
    let (mirror_addr, mut copies) = target(false).await;
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(mirror(format!("http://{mirror_addr}$uri?from=$host"), Some("shadow.test"), false))
            .build(),
    )
    .await;
    let r = p.send(p.req("app.test", "/form?q=1").method("POST").body(full(&b"secret=1"[..])).unwrap()).await;
    assert_eq!(r.echo().body_bytes, 8, "the route's upstream still gets the body");
    let copy = next(&mut copies).await;
    assert_eq!(copy.uri, "/form?from=app.test");
    assert_eq!(copy.headers["host"], "shadow.test");
    assert!(copy.body.unwrap().is_empty());
    assert!(!copy.headers.contains_key("content-length") || copy.headers["content-length"] == "0");
}

#[tokio::test]
async fn a_stalled_or_missing_mirror_changes_nothing_for_the_client() {
    let e = echo("e").await;
    let (stalled, mut heads) = target(true).await;
    let dead = dead_addr().await;
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/stalled", &to(&e))
            .policy(mirror(format!("http://{stalled}$request_uri"), None, true))
            .prefix("/dead", &to(&e))
            .policy(mirror(format!("http://{dead}$request_uri"), None, true))
            .build(),
    )
    .await;
    // 1 MiB streamed to a route whose mirror reads none of it: the copy falls behind and is
    // dropped; the route's upstream gets every byte.
    let r = within(
        "a big body beside a stalled mirror",
        p.send(p.req("app.test", "/stalled/upload").method("POST").body(streamed(64, 16 * 1024)).unwrap()),
    )
    .await;
    assert_eq!(r.echo().body_bytes, 64 * 16 * 1024);
    assert_eq!(next(&mut heads).await.uri, "/stalled/upload");
    // More requests, with and without bodies, while copies are stuck.
    for i in 0..5 {
        let r = within("requests beside a stalled mirror", p.get("app.test", &format!("/stalled/{i}"))).await;
        assert_eq!(r.name(), "e");
        let r = within(
            "a small body beside a stalled mirror",
            p.send(p.req("app.test", "/stalled/post").method("POST").body(full(vec![b'x'; 100])).unwrap()),
        )
        .await;
        assert_eq!(r.echo().body_bytes, 100);
    }
    // A mirror that refuses connections.
    let r = within(
        "a dead mirror",
        p.send(p.req("app.test", "/dead").method("POST").body(full(&b"x"[..])).unwrap()),
    )
    .await;
    assert_eq!(r.echo().body_bytes, 1);
}

#[tokio::test]
async fn requests_refused_by_the_route_are_not_mirrored() {
    let e = echo("e").await;
    let (mirror_addr, mut copies) = target(false).await;
    let mut denied = mirror(format!("http://{mirror_addr}$request_uri"), None, true);
    denied.source = SourceFilter { allow: Vec::new(), deny: vec!["127.0.0.0/8".parse().unwrap()] };
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/denied", &to(&e))
            .policy(denied)
            .prefix("/", &to(&e))
            .policy(mirror(format!("http://{mirror_addr}$request_uri"), None, true))
            .build(),
    )
    .await;
    p.get("app.test", "/denied").await.assert_local(403);
    p.get("app.test", "/allowed").await.echo();
    // Copies are sent in order of the requests' starts; the refused one made none.
    assert_eq!(next(&mut copies).await.uri, "/allowed");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(copies.try_recv().is_err(), "a refused request was mirrored");
}

/// An `https://` target is verified against the system's trust roots. The roots are read
/// once per process, from `SSL_CERT_FILE` when it is set: this test runs [`https_child`] in a
/// child process of this test binary, with `SSL_CERT_FILE` naming a file the child fills with
/// its test CA before anything reads the roots.
#[test]
fn https_targets_are_verified_against_the_system_roots() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "https_child", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env("SSL_CERT_FILE", dir.path().join("ca.pem"))
        .env_remove("SSL_CERT_DIR")
        .env("WEIR_MIRROR_HTTPS_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
}

#[tokio::test]
#[ignore = "run by https_targets_are_verified_against_the_system_roots, in a child process"]
async fn https_child() {
    assert!(
        std::env::var_os("WEIR_MIRROR_HTTPS_CHILD").is_some(),
        "run through https_targets_are_verified_against_the_system_roots"
    );
    let trusted = Ca::new();
    std::fs::write(std::env::var_os("SSL_CERT_FILE").unwrap(), &trusted.pem).unwrap();
    let (good, good_handshakes) = tls_backend_counted("good", &trusted.leaf(&["127.0.0.1"])).await;
    let (bad, bad_handshakes) = tls_backend_counted("bad", &Ca::new().leaf(&["127.0.0.1"])).await;
    let e = echo("e").await;
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/good", &to(&e))
            .policy(mirror(format!("https://{good}$request_uri"), None, true))
            .prefix("/bad", &to(&e))
            .policy(mirror(format!("https://{bad}$request_uri"), None, true))
            .build(),
    )
    .await;
    use std::sync::atomic::Ordering::SeqCst;
    // The untrusted target first: the client is served, the copy's handshake fails.
    assert_eq!(p.get("app.test", "/bad").await.name(), "e");
    assert_eq!(p.get("app.test", "/good").await.name(), "e");
    within("the trusted target's copy", async {
        while good_handshakes.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(bad_handshakes.load(SeqCst), 0, "a copy went to a target whose certificate is not trusted");
}
