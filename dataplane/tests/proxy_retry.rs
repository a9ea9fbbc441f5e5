//! `proxy-next-upstream` (conditions, tries, timeout, `retry-non-idempotent`) and
//! `proxy-send-timeout`, through the real proxy to real upstreams on loopback.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_dataplane::model::{LogField, RetryOn, RoutePolicy, RouteTable, Settings};
use weir_dataplane::proxy::ProxyConfig;
use weir_dataplane::proxy::accesslog::Output;

/// What the upstreams saw, in order: `(upstream name, x-request-id, body length)`.
type Log = Arc<Mutex<Vec<(String, String, usize)>>>;

/// An HTTP/1.1 upstream named `name` that answers every request `status` with the body
/// `"<name> <body length>"`, after `delay`, and logs it to `log`.
async fn answering(name: &str, status: u16, delay: Duration, log: &Log) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (name, log) = (name.to_string(), log.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (name, log) = (name.clone(), log.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (name, log) = (name.clone(), log.clone());
                    async move {
                        let id = req.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_string());
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        log.lock().unwrap().push((name.clone(), id.unwrap_or_default(), body.len()));
                        tokio::time::sleep(delay).await;
                        let mut resp =
                            http::Response::new(Full::new(Bytes::from(format!("{name} {}", body.len()))));
                        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}

fn log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

/// Who saw request `id`, in order.
fn seen_by(log: &Log, id: &str) -> Vec<String> {
    log.lock().unwrap().iter().filter(|(_, i, _)| i == id).map(|(n, _, _)| n.clone()).collect()
}

fn on(conditions: &[RetryOn]) -> RoutePolicy {
    RoutePolicy { next_upstream: Some(conditions.to_vec()), ..RoutePolicy::default() }
}

fn routed(addrs: &[SocketAddr], policy: RoutePolicy) -> RouteTable {
    table().host("a.test").prefix("/", &backend("up", addrs)).policy(policy).build()
}

/// Sends `method` with `body` and request id `id`; the status and body text.
async fn send(p: &TestProxy, method: &str, id: &str, body: Vec<u8>) -> (u16, String) {
    let req = p.req("a.test", "/").method(method).header("x-request-id", id).body(full(body)).unwrap();
    let r = p.send(req).await;
    (r.status.as_u16(), r.text())
}

/// `http_502`: a GET the first endpoint fails goes to the other, which answers; no endpoint sees
/// one request twice. Round robin starts half of them on the failing endpoint.
#[tokio::test]
async fn a_listed_status_sends_get_to_the_next_endpoint() {
    let log = log();
    let bad = answering("bad", 502, Duration::ZERO, &log).await;
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let p = proxy(routed(&[bad, good], on(&[RetryOn::Error, RetryOn::Timeout, RetryOn::Http502]))).await;
    let mut retried = 0;
    for i in 0..6 {
        let id = format!("get-{i}");
        assert_eq!(send(&p, "GET", &id, Vec::new()).await, (200, "good 0".into()));
        let seen = seen_by(&log, &id);
        match seen.as_slice() {
            [good] if good == "good" => {}
            [bad, good] if bad == "bad" && good == "good" => retried += 1,
            other => panic!("{id}: seen by {other:?}"),
        }
    }
    assert!(retried >= 1, "round robin started some requests on the failing endpoint");
}

/// Without `http_502` listed (the default `error timeout`), the 502 is the answer.
#[tokio::test]
async fn an_unlisted_status_is_the_answer() {
    let log = log();
    let bad = answering("bad", 502, Duration::ZERO, &log).await;
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let p = proxy(routed(&[bad, good], RoutePolicy::default())).await;
    let mut answers = Vec::new();
    for i in 0..4 {
        answers.push(send(&p, "GET", &format!("d-{i}"), Vec::new()).await.0);
    }
    assert!(answers.contains(&502) && answers.contains(&200), "{answers:?}");
    assert_eq!(log.lock().unwrap().len(), 4, "each request went to one endpoint");
}

/// A POST that was sent is not sent again (502 stands), unless `non_idempotent` is listed or
/// the table says `retry-non-idempotent`; a small body goes again whole.
#[tokio::test]
async fn post_is_retried_only_with_non_idempotent() {
    let log = log();
    let bad = answering("bad", 502, Duration::ZERO, &log).await;
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let p = proxy(routed(&[bad, good], on(&[RetryOn::Http502]))).await;
    let mut answers = Vec::new();
    for i in 0..4 {
        let id = format!("post-{i}");
        let (status, body) = send(&p, "POST", &id, vec![b'x'; 1000]).await;
        assert_eq!(seen_by(&log, &id).len(), 1, "{id} sent once");
        answers.push((status, body));
    }
    assert!(answers.contains(&(502, "bad 1000".into())), "{answers:?}");

    // Listed on the route: every POST ends at the good endpoint, its body whole.
    p.proxy.publish(routed(&[bad, good], on(&[RetryOn::Http502, RetryOn::NonIdempotent]))).unwrap();
    for i in 0..4 {
        let id = format!("ni-{i}");
        assert_eq!(send(&p, "POST", &id, vec![b'x'; 1000]).await, (200, "good 1000".into()));
        assert_eq!(seen_by(&log, &id).last().unwrap(), "good");
    }
    // From the table: `retry-non-idempotent` adds it to the route's own list.
    let mut t = routed(&[bad, good], on(&[RetryOn::Http502]));
    t.settings = Settings { retry_non_idempotent: Some(true), ..Settings::default() };
    p.proxy.publish(t).unwrap();
    for i in 0..4 {
        assert_eq!(send(&p, "PATCH", &format!("rni-{i}"), b"{}".to_vec()).await, (200, "good 2".into()));
    }
}

/// A PUT (idempotent) with a small body is retried with its body; one larger than the retry
/// buffer was streamed and cannot be sent again: the 502 stands.
#[tokio::test]
async fn only_small_bodies_are_sent_again() {
    let log = log();
    let bad = answering("bad", 502, Duration::ZERO, &log).await;
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let p = proxy(routed(&[bad, good], on(&[RetryOn::Http502]))).await;
    for i in 0..4 {
        assert_eq!(
            send(&p, "PUT", &format!("small-{i}"), vec![b'y'; 60_000]).await,
            (200, "good 60000".into())
        );
    }
    let mut answers = Vec::new();
    for i in 0..4 {
        let id = format!("big-{i}");
        answers.push(send(&p, "PUT", &id, vec![b'y'; 200_000]).await);
        assert_eq!(seen_by(&log, &id).len(), 1, "{id} sent once");
    }
    assert!(answers.contains(&(502, "bad 200000".into())), "{answers:?}");
}

/// `off`: no retry at all, not even after a connect error.
#[tokio::test]
async fn off_disables_retries_even_on_connect_errors() {
    let log = log();
    let dead = dead_addr().await;
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let p = proxy(routed(&[dead, good], RoutePolicy::default())).await;
    for i in 0..4 {
        assert_eq!(
            send(&p, "GET", &format!("on-{i}"), Vec::new()).await.0,
            200,
            "connect errors are retried"
        );
    }
    p.proxy.publish(routed(&[dead, good], on(&[]))).unwrap();
    let mut answers = Vec::new();
    for i in 0..4 {
        answers.push(send(&p, "GET", &format!("off-{i}"), Vec::new()).await.0);
    }
    assert!(answers.contains(&502) && answers.contains(&200), "{answers:?}");

    let bad = answering("bad", 502, Duration::ZERO, &log).await;
    let mut t = routed(&[bad, good], RoutePolicy::default());
    t.settings = Settings { next_upstream: Some(vec![]), ..Settings::default() };
    p.proxy.publish(t).unwrap();
    let mut answers = Vec::new();
    for i in 0..4 {
        answers.push(send(&p, "GET", &format!("table-off-{i}"), Vec::new()).await.0);
    }
    assert!(answers.contains(&502), "the table's off: {answers:?}");
}

/// `proxy-next-upstream-tries: 2` over three failing endpoints: two are asked, the second's
/// answer stands. The table's list (`proxy-next-upstream` in the ConfigMap) applies.
#[tokio::test]
async fn tries_bound_the_endpoints_asked_and_the_last_answer_stands() {
    let log = log();
    let mut addrs = Vec::new();
    for name in ["one", "two", "three"] {
        addrs.push(answering(name, 503, Duration::ZERO, &log).await);
    }
    let mut t = routed(&addrs, RoutePolicy { connect_tries: Some(2), ..RoutePolicy::default() });
    t.settings = Settings { next_upstream: Some(vec![RetryOn::Http503]), ..Settings::default() };
    let p = proxy(t).await;
    for i in 0..3 {
        let id = format!("t-{i}");
        let (status, body) = send(&p, "GET", &id, Vec::new()).await;
        let seen = seen_by(&log, &id);
        assert_eq!(seen.len(), 2, "{id}: {seen:?}");
        assert_ne!(seen[0], seen[1]);
        assert_eq!((status, body), (503, format!("{} 0", seen[1])));
    }
}

/// `proxy-next-upstream-timeout`: once it has passed, no further try starts, and the answer in
/// hand stands (each endpoint here takes longer than the limit to fail).
#[tokio::test]
async fn next_upstream_timeout_stops_further_tries() {
    let log = log();
    let mut addrs = Vec::new();
    for name in ["one", "two", "three"] {
        addrs.push(answering(name, 502, Duration::from_millis(300), &log).await);
    }
    let policy =
        RoutePolicy { next_upstream_timeout_ms: Some(100), ..on(&[RetryOn::Error, RetryOn::Http502]) };
    let p = proxy(routed(&addrs, policy)).await;
    let (status, body) = send(&p, "GET", "late", Vec::new()).await;
    let seen = seen_by(&log, "late");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((status, body), (502, format!("{} 0", seen[0])));
    // Without it, all three are asked.
    p.proxy.publish(routed(&addrs, on(&[RetryOn::Http502]))).unwrap();
    assert_eq!(send(&p, "GET", "all", Vec::new()).await.0, 502);
    assert_eq!(seen_by(&log, "all").len(), 3);
}

/// `timeout` covers the response head: a slow endpoint's GET goes to the next one.
#[tokio::test]
async fn a_response_timeout_is_retried_when_timeout_is_listed() {
    let log = log();
    let slow = answering("slow", 200, Duration::from_secs(5), &log).await;
    let fast = answering("fast", 200, Duration::ZERO, &log).await;
    let policy = RoutePolicy { read_timeout_ms: Some(200), ..RoutePolicy::default() };
    let p = proxy(routed(&[slow, fast], policy.clone())).await;
    for i in 0..4 {
        assert_eq!(send(&p, "GET", &format!("rt-{i}"), Vec::new()).await, (200, "fast 0".into()));
    }
    p.proxy
        .publish(routed(&[slow, fast], RoutePolicy { next_upstream: Some(vec![RetryOn::Error]), ..policy }))
        .unwrap();
    let mut answers = Vec::new();
    for i in 0..4 {
        answers.push(send(&p, "GET", &format!("nt-{i}"), Vec::new()).await.0);
    }
    assert!(answers.contains(&504), "{answers:?}");
}

/// An upstream that answers with something that is not HTTP: retried with `invalid_header`,
/// 502 without it.
#[tokio::test]
async fn invalid_header_is_its_own_condition() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp.write_all(b"NOT HTTP AT ALL\r\n\r\n").await;
            });
        }
    });
    let log = log();
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let p = proxy(routed(&[garbage, good], on(&[RetryOn::InvalidHeader]))).await;
    for i in 0..4 {
        assert_eq!(send(&p, "GET", &format!("ih-{i}"), Vec::new()).await, (200, "good 0".into()));
    }
    p.proxy.publish(routed(&[garbage, good], on(&[RetryOn::Error]))).unwrap();
    let mut answers = Vec::new();
    for i in 0..4 {
        answers.push(send(&p, "GET", &format!("e-{i}"), Vec::new()).await.0);
    }
    assert!(answers.contains(&502), "{answers:?}");
}

/// The access log's `$upstream_addr` lists every endpoint tried, nginx's way.
#[tokio::test]
async fn the_access_log_names_every_endpoint_tried() {
    let log = log();
    let bad = answering("bad", 502, Duration::ZERO, &log).await;
    let good = answering("good", 200, Duration::ZERO, &log).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let mut t = routed(&[bad, good], on(&[RetryOn::Http502]));
    t.settings = Settings {
        access_log: Some(vec![
            LogField { key: "id".into(), value: "$request_id".parse().unwrap(), bare: false },
            LogField { key: "upstream".into(), value: "$upstream_addr".parse().unwrap(), bare: false },
        ]),
        ..Settings::default()
    };
    let config = ProxyConfig { access_log_output: Output::File(path.clone()), ..test_config() };
    let p = proxy_with(config, t).await;
    for i in 0..4 {
        assert_eq!(send(&p, "GET", &format!("al-{i}"), Vec::new()).await.0, 200);
    }
    let text = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() >= 4 {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("four access-log lines");
    let mut retried = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = v["id"].as_str().unwrap();
        let want: Vec<String> = seen_by(&log, id)
            .iter()
            .map(|name| if name == "bad" { bad.to_string() } else { good.to_string() })
            .collect();
        assert_eq!(v["upstream"], want.join(", "), "{line}");
        retried += usize::from(want.len() == 2);
    }
    assert!(retried >= 1);
}

/// `proxy-send-timeout`: an upstream that stops reading the request body fails the exchange
/// once no write made progress for that long: 504.
#[tokio::test]
async fn a_stalled_upstream_write_answers_504() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalled = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut tcp, _)) = listener.accept().await {
            // Reads a little, then never again (the connection stays open).
            let mut buf = [0u8; 1024];
            let _ = tcp.read(&mut buf).await;
            held.push(tcp);
        }
    });
    // The route's read timeout is long: only the send timeout can answer.
    let policy = RoutePolicy { send_timeout_ms: Some(300), read_timeout_ms: Some(60_000), ..on(&[]) };
    let p = proxy(routed(&[stalled], policy)).await;
    let body = vec![b'z'; 64 << 20];
    let req = p.req("a.test", "/").method("POST").body(full(body)).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), support::client().request(req))
        .await
        .expect("the send timeout answers well within 30 s")
        .expect("a response");
    assert_eq!(resp.status(), 504);

    // An upstream that reads along gets the same body whole under the same timeout.
    let log = log();
    let reading = answering("reading", 200, Duration::ZERO, &log).await;
    let policy = RoutePolicy { send_timeout_ms: Some(300), ..on(&[]) };
    p.proxy.publish(routed(&[reading], policy)).unwrap();
    let (status, body) = send(&p, "POST", "whole", vec![b'z'; 16 << 20]).await;
    assert_eq!((status, body), (200, format!("reading {}", 16 << 20)));
}
