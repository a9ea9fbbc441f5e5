//! Per-request limits and response rewrites through the real proxy: `limit-connections`,
//! `limit-rate`/`limit-rate-after`, `proxy-redirect-*`, `proxy-cookie-*` and
//! `preserve-trailing-slash`.

#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::TcpListener;
use weir_dataplane::echo::{BODY_SIZE_HEADER, DELAY_HEADER};
use weir_dataplane::model::{ConnLimit, Replace, ResponseRate, RoutePolicy};

/// A client whose connections come from `ip` (another loopback address is another client).
fn client_from(ip: &str) -> Client<HttpConnector, TestBody> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(ip.parse::<IpAddr>().unwrap()));
    Client::builder(TokioExecutor::new()).build(connector)
}

fn get(p: &TestProxy, host: &str, path: &str, headers: &[(&str, &str)]) -> Request<TestBody> {
    let mut req = p.req(host, path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(empty()).unwrap()
}

async fn status(client: &Client<HttpConnector, TestBody>, req: Request<TestBody>) -> StatusCode {
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    status
}

/// Retries `req()` from `client` until it is not refused with 503, for up to five seconds.
async fn passes_soon(
    client: &Client<HttpConnector, TestBody>,
    req: impl Fn() -> Request<TestBody>,
) -> StatusCode {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = status(client, req()).await;
        if s != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn conn_limited(max: u32) -> RoutePolicy {
    RoutePolicy {
        conn_limit: Some(Box::new(ConnLimit { max, exempt: Vec::new(), status: 503 })),
        ..RoutePolicy::default()
    }
}

#[tokio::test]
async fn limit_connections_counts_requests_in_flight_per_client() {
    let e = echo("e").await;
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&e))
            .policy(conn_limited(2))
            .host("b.test")
            .prefix("/", &to(&e))
            .policy(RoutePolicy {
                conn_limit: Some(Box::new(ConnLimit {
                    max: 1,
                    exempt: vec!["127.0.0.0/8".parse().unwrap()],
                    status: 429,
                })),
                ..RoutePolicy::default()
            })
            .build(),
    )
    .await;
    let one = client_from("127.0.0.1");
    let two = client_from("127.0.0.2");

    // Two slow requests from 127.0.0.1 are in flight: a third is refused at once.
    let slow = || get(&p, "a.test", "/slow", &[(DELAY_HEADER, "1500")]);
    let (c1, c2) = (one.clone(), one.clone());
    let (r1, r2) = (slow(), slow());
    let first = tokio::spawn(async move { status(&c1, r1).await });
    let second = tokio::spawn(async move { status(&c2, r2).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = one.request(get(&p, "a.test", "/", &[])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("x-request-id"));
    // Another client has its own count.
    assert_eq!(status(&two, get(&p, "a.test", "/", &[])).await, StatusCode::OK);
    // The slots free when the responses complete.
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(second.await.unwrap(), StatusCode::OK);
    assert_eq!(status(&one, get(&p, "a.test", "/", &[])).await, StatusCode::OK);

    // Exempt clients are never counted (b.test allows one, and exempts loopback).
    let held = one.request(get(&p, "b.test", "/", &[(BODY_SIZE_HEADER, "536870912")])).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(status(&one, get(&p, "b.test", "/", &[])).await, StatusCode::OK);
    drop(held);
}

#[tokio::test]
async fn limit_connections_frees_the_slot_of_a_client_that_goes_away_mid_response() {
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).policy(conn_limited(2)).build()).await;
    let one = client_from("127.0.0.1");
    // Two large responses whose heads arrived and whose bodies are not read: in flight.
    let big = || get(&p, "a.test", "/big", &[(BODY_SIZE_HEADER, "536870912")]);
    let a: Response<Incoming> = one.request(big()).await.unwrap();
    let b: Response<Incoming> = one.request(big()).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(status(&one, get(&p, "a.test", "/", &[])).await, StatusCode::SERVICE_UNAVAILABLE);
    // The client drops one response mid-body: its connection closes and its slot frees.
    drop(a);
    assert_eq!(passes_soon(&one, || get(&p, "a.test", "/", &[])).await, StatusCode::OK);
    // Still one held: with it and one more, the limit is reached again.
    let c = one.request(big()).await.unwrap();
    assert_eq!(status(&one, get(&p, "a.test", "/", &[])).await, StatusCode::SERVICE_UNAVAILABLE);
    drop((b, c));
    assert_eq!(passes_soon(&one, || get(&p, "a.test", "/", &[])).await, StatusCode::OK);
}

#[tokio::test]
async fn limit_rate_paces_the_response_body() {
    let e = echo("e").await;
    let rate = |bytes_per_sec: u64, after_bytes: u64| RoutePolicy {
        response_rate: Some(Box::new(ResponseRate { bytes_per_sec, after_bytes })),
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("slow.test")
            .prefix("/", &to(&e))
            .policy(rate(64 * 1024, 0))
            .host("after.test")
            .prefix("/", &to(&e))
            .policy(rate(64 * 1024, 256 * 1024))
            .build(),
    )
    .await;
    let size = (256 * 1024).to_string();
    // 256 KiB at 64 KiB/s: about four seconds; at least two, whatever the machine.
    let started = Instant::now();
    let r = p.send(get(&p, "slow.test", "/", &[(BODY_SIZE_HEADER, &size)])).await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.len(), 256 * 1024, "every byte arrives");
    assert!(took >= Duration::from_secs(2), "256 KiB at 64 KiB/s took {took:?}");
    // Within `limit-rate-after` the body is not paced: all of it is there (no timing asserted).
    let r = p.send(get(&p, "after.test", "/", &[(BODY_SIZE_HEADER, &size)])).await;
    assert_eq!(r.body.len(), 256 * 1024);
}

/// A backend answering every request with `headers` and a short body.
async fn fixed(headers: &'static [(&'static str, &'static str)]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                    let mut resp = Response::new(Full::new(Bytes::from_static(b"moved\n")));
                    *resp.status_mut() = StatusCode::FOUND;
                    for (name, value) in headers {
                        resp.headers_mut().append(*name, value.parse().unwrap());
                    }
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn proxy_redirect_and_cookie_rewrites() {
    let upstream = fixed(&[
        ("location", "http://internal:8080/x?y=1"),
        ("refresh", "3; url=http://internal:8080/later"),
        ("set-cookie", "sid=1; Domain=internal.svc; Path=/app/inner; HttpOnly"),
        ("set-cookie", "other=2; Domain=elsewhere.org; Path=/"),
    ])
    .await;
    let be = backend("fixed", &[upstream]);
    let replace = |from: &str, to: &str| Some(Box::new(Replace { from: from.into(), to: to.into() }));
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &be)
            .policy(RoutePolicy {
                redirect_rewrite: replace("http://internal:8080/", "https://a.test/"),
                cookie_domain: replace("internal.svc", "a.test"),
                cookie_path: replace("/app/", "/"),
                ..RoutePolicy::default()
            })
            .host("plain.test")
            .prefix("/", &be)
            .build(),
    )
    .await;
    let r = p.get("a.test", "/").await;
    assert_eq!(r.status, StatusCode::FOUND);
    assert_eq!(r.headers["location"], "https://a.test/x?y=1");
    assert_eq!(r.headers["refresh"], "3; url=https://a.test/later");
    let cookies: Vec<_> = r.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(
        cookies,
        ["sid=1; Domain=a.test; Path=/inner; HttpOnly", "other=2; Domain=elsewhere.org; Path=/"]
    );
    // Without the annotations, the upstream's headers pass as they are.
    let r = p.get("plain.test", "/").await;
    assert_eq!(r.headers["location"], "http://internal:8080/x?y=1");
    assert_eq!(r.headers.get_all("set-cookie").iter().count(), 2);
    assert!(r.headers["set-cookie"].to_str().unwrap().contains("Domain=internal.svc"));
}

#[tokio::test]
async fn https_redirect_drops_a_trailing_slash_unless_preserved() {
    let e = echo("e").await;
    let ssl = |preserve: bool| RoutePolicy {
        ssl_redirect: true,
        preserve_trailing_slash: preserve,
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&e))
            .policy(ssl(false))
            .host("keep.test")
            .prefix("/", &to(&e))
            .policy(ssl(true))
            .build(),
    )
    .await;
    let location = |r: &Resp| r.headers["location"].to_str().unwrap().to_string();
    // ingress-nginx's default: the last `/` of the request URI goes.
    let r = p.get("a.test", "/dir/").await;
    assert_eq!((r.status.as_u16(), location(&r)), (308, "https://a.test/dir".to_string()));
    assert_eq!(location(&p.get("a.test", "/").await), "https://a.test");
    assert_eq!(location(&p.get("a.test", "/dir/?q=1").await), "https://a.test/dir/?q=1");
    assert_eq!(location(&p.get("a.test", "/file").await), "https://a.test/file");
    // `preserve-trailing-slash: "true"` keeps it.
    assert_eq!(location(&p.get("keep.test", "/dir/").await), "https://keep.test/dir/");
    assert_eq!(location(&p.get("keep.test", "/").await), "https://keep.test/");
}

#[tokio::test]
async fn limit_connections_counts_each_h2_stream_and_frees_a_reset_one() {
    let e = echo("e").await;
    // Any host: over h2 the authority is the proxy's address.
    let p = proxy(table().prefix("/", &to(&e)).policy(conn_limited(2)).build()).await;
    // One h2c connection carries every request: each stream counts.
    let h2: Client<HttpConnector, TestBody> =
        Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let uri = |path: &str| format!("http://{}{path}", p.addr);
    let req =
        |path: &str, delay: &str| Request::get(uri(path)).header(DELAY_HEADER, delay).body(empty()).unwrap();
    // Two streams whose upstream answers only in a minute: both in flight.
    let held = tokio::spawn({
        let (h2, r) = (h2.clone(), req("/held", "60000"));
        async move { status(&h2, r).await }
    });
    // A stream the client gives up on before the head (dropping it resets the stream).
    let abandoned = tokio::spawn({
        let (h2, r) = (h2.clone(), req("/abandoned", "60000"));
        async move { status(&h2, r).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = h2.request(req("/", "0")).await.unwrap();
    assert_eq!(refused.version(), http::Version::HTTP_2);
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    // The reset stream's place frees although its upstream would answer only in a minute
    // (the other is still held: one place left).
    assert_eq!(passes_soon(&h2, || req("/", "0")).await, StatusCode::OK);
    held.abort();
}

#[tokio::test]
async fn limit_connections_frees_the_slot_of_a_client_that_leaves_before_the_head() {
    use tokio::io::AsyncWriteExt;
    let e = echo("e").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).policy(conn_limited(1)).build()).await;
    let mut raw = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    raw.write_all(b"GET /x HTTP/1.1\r\nHost: a.test\r\nx-echo-delay-ms: 60000\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let one = client_from("127.0.0.1");
    assert_eq!(status(&one, get(&p, "a.test", "/", &[])).await, StatusCode::SERVICE_UNAVAILABLE);
    // The client closes its connection while the upstream still waits: the request ends.
    drop(raw);
    assert_eq!(passes_soon(&one, || get(&p, "a.test", "/", &[])).await, StatusCode::OK);
}
