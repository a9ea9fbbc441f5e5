//! Request metrics through a real proxy on loopback: what a scrape ([`Proxy::metrics`]) reads
//! after requests that stream, stall, fail to connect, or whose route leaves the table.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_dataplane::metrics::{RouteSample, Sample, status_label};

/// A backend that sends its head and a first chunk at once, and the last chunk after `pause`
/// (`None`: never).
async fn slow_body(pause: Option<Duration>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n) = conn.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                let first = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
                if conn.write_all(first).await.is_err() {
                    return;
                }
                match pause {
                    Some(pause) => {
                        tokio::time::sleep(pause).await;
                        let _ = conn.write_all(b"4\r\nlast\r\n0\r\n\r\n").await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    addr
}

fn route<'a>(sample: &'a Sample, ingress: &str) -> Option<&'a RouteSample> {
    sample.routes.iter().find(|r| r.labels.ingress == ingress && !r.requests.is_empty())
}

fn statuses(route: &RouteSample) -> Vec<(String, u64)> {
    route.requests.iter().map(|&(_, slot, n)| (status_label(slot), n)).collect()
}

/// The duration runs to the last byte of the body, the upstream time to the response head.
#[tokio::test]
async fn duration_runs_to_the_last_byte() {
    let be = backend("slow", &[slow_body(Some(Duration::from_millis(300))).await]);
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    let resp = p.get("a.test", "/").await;
    assert_eq!(resp.body.as_ref(), b"firstlast");
    let sample = p.proxy.metrics().collect();
    let r = route(&sample, "slow").unwrap_or_else(|| panic!("{sample:?}"));
    assert_eq!(statuses(r), [("200".to_string(), 1)]);
    assert_eq!(
        (r.labels.host.as_str(), r.labels.path.as_str(), r.labels.service.as_str()),
        ("a.test", "/", "slow")
    );
    let ok = &r.classes[1];
    assert_eq!(ok.duration.count(), 1);
    assert!(ok.duration.sum >= 300_000_000, "duration {} ns", ok.duration.sum);
    assert!(ok.upstream.sum < 200_000_000, "upstream head time {} ns", ok.upstream.sum);
    assert!(ok.response_size.sum > 9, "{}", ok.response_size.sum);
}

/// A client that goes away mid-body still counts, with the status it was sent.
#[tokio::test]
async fn a_client_going_away_is_counted() {
    let be = backend("stall", &[slow_body(None).await]);
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    let resp = p.send_raw(p.req("a.test", "/").body(empty()).unwrap()).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.data_ref().map(|d| d.as_ref()), Some(&b"first"[..]));
    drop(body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sample = p.proxy.metrics().collect();
        if let Some(r) = route(&sample, "stall") {
            assert_eq!(statuses(r), [("200".to_string(), 1)]);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the aborted request was never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connect errors and the retries they cause are counted per backend; requests that no route
/// takes count under empty labels.
#[tokio::test]
async fn upstream_failures_per_backend() {
    let e = echo("good").await;
    let be = backend("half", &[dead_addr().await, e.addr]);
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    for _ in 0..4 {
        assert_eq!(p.get("a.test", "/").await.status, 200);
    }
    assert_eq!(p.get("nowhere.test", "/").await.status, 404);
    let sample = p.proxy.metrics().collect();
    let half = sample.backends.iter().find(|b| b.id.service == "half").unwrap();
    assert!(half.connect_errors >= 1, "{half:?}");
    assert_eq!(half.retries, half.connect_errors, "{half:?}");
    let r = route(&sample, "half").unwrap();
    assert_eq!(statuses(r), [("200".to_string(), 4)]);
    let unrouted = sample.routes.iter().find(|r| r.labels.ingress.is_empty()).unwrap();
    assert_eq!(statuses(unrouted), [("404".to_string(), 1)]);
}

/// A route that leaves the table keeps its counts for one scrape.
#[tokio::test]
async fn counts_outlive_their_route_until_scraped() {
    let a = echo("a").await;
    let b = echo("b").await;
    let p =
        proxy(table().host("a.test").prefix("/", &to(&a)).host("b.test").prefix("/", &to(&b)).build()).await;
    assert_eq!(p.get("a.test", "/").await.status, 200);
    p.proxy.publish(table().host("b.test").prefix("/", &to(&b)).build()).unwrap();
    assert_eq!(p.get("a.test", "/").await.status, 404);
    let first = p.proxy.metrics().collect();
    assert_eq!(statuses(route(&first, "a").unwrap()), [("200".to_string(), 1)]);
    let second = p.proxy.metrics().collect();
    assert!(route(&second, "a").is_none(), "{second:?}");
}

/// `--metrics=false`: nothing is recorded.
#[tokio::test]
async fn metrics_off_records_nothing() {
    let e = echo("quiet").await;
    let mut config = test_config();
    config.metrics.enabled = false;
    let p = proxy_with(config, table().host("a.test").prefix("/", &to(&e)).build()).await;
    assert_eq!(p.get("a.test", "/").await.status, 200);
    let sample = p.proxy.metrics().collect();
    assert!(sample.routes.iter().all(|r| r.requests.is_empty()), "{sample:?}");
}
