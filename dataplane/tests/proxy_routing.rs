//! End-to-end routing and balancing through a real proxy and echo backends.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;

use support::*;
use weir_dataplane::model::changes::TableChanges;

#[tokio::test]
async fn host_exact_wildcard_any() {
    let (exact, wild, any) = (echo("exact").await, echo("wild").await, echo("any").await);
    let p = proxy(
        table()
            .host("a.example.com")
            .prefix("/", &to(&exact))
            .host("*.example.com")
            .prefix("/", &to(&wild))
            .host("*")
            .prefix("/", &to(&any))
            .build(),
    )
    .await;
    assert_eq!(p.get("a.example.com", "/").await.name(), "exact");
    assert_eq!(p.get("A.Example.com:8080", "/").await.name(), "exact");
    assert_eq!(p.get("a.example.com.", "/").await.name(), "exact");
    assert_eq!(p.get("b.example.com", "/").await.name(), "wild");
    assert_eq!(p.get("x.b.example.com", "/").await.name(), "any");
    assert_eq!(p.get("example.com", "/").await.name(), "any");
    assert_eq!(p.get("other.test", "/x").await.name(), "any");
}

#[tokio::test]
async fn path_precedence() {
    let names = ["exact", "regex", "long", "short", "root"];
    let mut e = BTreeMap::new();
    for n in names {
        e.insert(n, echo(n).await);
    }
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&e["root"]))
            .prefix("/api", &to(&e["short"]))
            .prefix("/api/v1", &to(&e["long"]))
            .regex("/api/v[0-9]+/items/[0-9]+", &to(&e["regex"]))
            .exact("/api/v1/items/7", &to(&e["exact"]))
            .build(),
    )
    .await;
    for (path, want) in [
        ("/api/v1/items/7", "exact"),
        ("/api/v1/items/8", "regex"),
        ("/api/v1/items/8?q=1", "regex"),
        ("/api/v1/other", "long"),
        ("/api/v1", "long"),
        ("/api/v2", "short"),
        ("/api/", "short"),
        ("/apix", "root"),
        ("/", "root"),
    ] {
        assert_eq!(p.get("a.test", path).await.name(), want, "{path}");
    }
    let r = p.get("a.test", "/api/v1/items/8?q=1").await.echo();
    assert_eq!(r.path, "/api/v1/items/8");
    assert_eq!(r.query.as_deref(), Some("q=1"));
}

#[tokio::test]
async fn default_backend_and_404() {
    let (a, d) = (echo("a").await, echo("default").await);
    let p = proxy(table().host("a.test").prefix("/api", &to(&a)).default_backend(&to(&d)).build()).await;
    assert_eq!(p.get("a.test", "/api/x").await.name(), "a");
    assert_eq!(p.get("a.test", "/other").await.name(), "default");
    assert_eq!(p.get("b.test", "/").await.name(), "default");

    let p = proxy(table().host("a.test").prefix("/api", &to(&a)).build()).await;
    p.get("a.test", "/other").await.assert_local(404);
    p.get("b.test", "/api").await.assert_local(404);
}

#[tokio::test]
async fn empty_proxy_answers_404() {
    let p = proxy(table().build()).await;
    p.get("a.test", "/").await.assert_local(404);
    assert_eq!(p.proxy.version(), 1);
    let fresh = weir_dataplane::proxy::Proxy::new(Default::default());
    assert_eq!(fresh.version(), 0);
}

async fn spread(p: &TestProxy, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        *seen.entry(p.get("a.test", "/").await.name()).or_default() += 1;
    }
    seen
}

#[tokio::test]
async fn round_robin_reaches_all_endpoints_evenly() {
    let eps = [echo("e0").await, echo("e1").await, echo("e2").await];
    let be = backend("rr", &eps.iter().map(|e| e.addr).collect::<Vec<_>>());
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    let seen = spread(&p, 30).await;
    assert_eq!(seen, BTreeMap::from([("e0".into(), 10), ("e1".into(), 10), ("e2".into(), 10)]));
}

#[tokio::test]
async fn weights_are_honoured() {
    let (a, b) = (echo("heavy").await, echo("light").await);
    let be = weighted("w", &[(a.addr, 3), (b.addr, 1)]);
    let p = proxy(table().host("a.test").prefix("/", &be).build()).await;
    let seen = spread(&p, 40).await;
    assert_eq!(seen, BTreeMap::from([("heavy".into(), 30), ("light".into(), 10)]));
}

#[tokio::test]
async fn round_robin_state_survives_table_swaps() {
    let (a, b) = (echo("a").await, echo("b").await);
    let be = backend("rr", &[a.addr, b.addr]);
    let t = || table().host("a.test").prefix("/", &be).build();
    let p = proxy(t()).await;
    // Republishing between every request must not reset the cursor to the first endpoint.
    let mut seen = BTreeMap::<String, usize>::new();
    for _ in 0..10 {
        p.proxy.publish(t()).unwrap();
        *seen.entry(p.get("a.test", "/").await.name()).or_default() += 1;
    }
    assert_eq!(seen, BTreeMap::from([("a".into(), 5), ("b".into(), 5)]));
    assert_eq!(p.proxy.version(), 11);
}

/// The same through incremental publishes ([`Proxy::publish_changes`]) where the backend itself
/// changes every other time (a drained endpoint comes and goes) and another host every time.
#[tokio::test]
async fn round_robin_state_survives_incremental_swaps() {
    let (a, b, c) = (echo("a").await, echo("b").await, echo("c").await);
    let t = |k: usize| {
        let drained = if k.is_multiple_of(2) {
            vec![(a.addr, 1), (b.addr, 1)]
        } else {
            vec![(a.addr, 1), (b.addr, 1), (c.addr, 0)]
        };
        let (be, other) = (weighted("rr", &drained), backend("other", &[c.addr]));
        table().host("a.test").prefix("/", &be).host(&format!("x{k}.test")).prefix("/", &other).build()
    };
    let p = proxy(t(0)).await;
    let mut seen = BTreeMap::<String, usize>::new();
    for k in 1..=10 {
        let changes = TableChanges::between(&t(k - 1), &t(k));
        assert!(!changes.hosts.is_empty() && !changes.backends.is_empty());
        p.proxy.publish_changes(&t(k), Some(&changes)).unwrap();
        *seen.entry(p.get("a.test", "/").await.name()).or_default() += 1;
        assert_eq!(p.get(&format!("x{k}.test"), "/").await.status, 200);
        assert_eq!(p.get(&format!("x{}.test", k - 1), "/").await.status, 404, "the old host is gone");
    }
    assert_eq!(seen, BTreeMap::from([("a".into(), 5), ("b".into(), 5)]));
}

#[tokio::test]
async fn no_endpoints_is_503() {
    let p = proxy(table().host("a.test").prefix("/", &backend("empty", &[])).build()).await;
    p.get("a.test", "/").await.assert_local(503);
}

#[tokio::test]
async fn bad_table_is_rejected_and_live_table_kept() {
    let a = echo("a").await;
    let p = proxy(table().host("a.test").prefix("/", &to(&a)).build()).await;
    let bad = table().host("a.test").regex("(", &to(&a)).build();
    assert!(p.proxy.publish(bad).is_err());
    assert_eq!(p.proxy.version(), 1);
    assert_eq!(p.get("a.test", "/").await.name(), "a");
}

#[tokio::test]
async fn http_1_0_without_host_uses_host_less_rules() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (named, any) = (echo("named").await, echo("any").await);
    let p =
        proxy(table().host("a.test").prefix("/", &to(&named)).host("*").prefix("/", &to(&any)).build()).await;
    let mut stream = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    stream.write_all(b"GET /old HTTP/1.0\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"name\":\"any\""), "{answer}");
    // HTTP/1.1 still needs a Host.
    let mut stream = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}
