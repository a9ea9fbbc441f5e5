//! TLS to backends (`backend-protocol: HTTPS|GRPCS`): verification against a configured CA or
//! the system roots, the verified name, verification off only when asked; HTTP/2 by ALPN.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;

use support::tls::*;
use support::*;
use weir_dataplane::model::{UpstreamProtocol, UpstreamTls};

fn tls_route(
    host: &str,
    backend: SocketAddr,
    protocol: UpstreamProtocol,
    tls: UpstreamTls,
) -> weir_dataplane::model::RouteTable {
    let mut be = support::backend("secure", &[backend]);
    be.backend.protocol = protocol;
    be.backend.tls = Some(tls);
    table().host(host).prefix("/", &be).build()
}

/// A plain GET through a proxy serving one table.
async fn through(table: weir_dataplane::model::RouteTable, host: &str) -> Resp {
    let p = proxy(table).await;
    p.get(host, "/").await
}

#[tokio::test]
async fn https_and_h2_upstreams_verified_against_the_configured_ca() {
    let ca = Ca::new();
    let backend = tls_backend("b1", &ca.leaf(&["secure.test"])).await;
    let with_ca = UpstreamTls { ca_pem: Some(ca.pem.clone()), ..UpstreamTls::default() };
    for (protocol, want) in [
        (UpstreamProtocol::Https, "tls-backend b1 HTTP/1.1"),
        (UpstreamProtocol::H2, "tls-backend b1 HTTP/2.0"),
    ] {
        let r = through(tls_route("secure.test", backend, protocol, with_ca.clone()), "secure.test").await;
        assert_eq!((r.status.as_u16(), r.text().as_str()), (200, want), "{protocol:?}");
        // Several requests on the pooled h2 connection, and new ones for HTTPS.
        let p = proxy(tls_route("secure.test", backend, protocol, with_ca.clone())).await;
        for _ in 0..5 {
            assert_eq!(p.get("secure.test", "/").await.text(), want);
        }
    }
}

#[tokio::test]
async fn unverifiable_upstreams_get_502() {
    let ca = Ca::new();
    let backend = tls_backend("b1", &ca.leaf(&["secure.test"])).await;
    for protocol in [UpstreamProtocol::Https, UpstreamProtocol::H2] {
        // Another CA.
        let other = UpstreamTls { ca_pem: Some(Ca::new().pem), ..UpstreamTls::default() };
        through(tls_route("secure.test", backend, protocol, other), "secure.test").await.assert_local(502);
        // No CA configured: the system roots, which do not know the test CA.
        through(tls_route("secure.test", backend, protocol, UpstreamTls::default()), "secure.test")
            .await
            .assert_local(502);
        // The right CA but the request's host is not the certificate's name...
        let with_ca = UpstreamTls { ca_pem: Some(ca.pem.clone()), ..UpstreamTls::default() };
        through(tls_route("other.test", backend, protocol, with_ca.clone()), "other.test")
            .await
            .assert_local(502);
        // ...unless the backend names the one to verify (proxy-ssl-name).
        let named = UpstreamTls { server_name: Some("secure.test".into()), ..with_ca };
        assert_eq!(
            through(tls_route("other.test", backend, protocol, named), "other.test").await.status,
            200
        );
        // A CA bundle without certificates is unusable: 502, never an unverified connection.
        let broken = UpstreamTls { ca_pem: Some("garbage".into()), ..UpstreamTls::default() };
        through(tls_route("secure.test", backend, protocol, broken), "secure.test").await.assert_local(502);
    }
}

#[tokio::test]
async fn verification_off_only_when_asked() {
    let backend = tls_backend("b1", &Ca::new().leaf(&["whatever.test"])).await;
    let off = UpstreamTls { insecure_skip_verify: true, ..UpstreamTls::default() };
    for protocol in [UpstreamProtocol::Https, UpstreamProtocol::H2] {
        let r = through(tls_route("secure.test", backend, protocol, off.clone()), "secure.test").await;
        assert_eq!(r.status, 200, "{protocol:?}: {}", r.text());
    }
}

#[tokio::test]
async fn https_upstream_connections_are_reused() {
    let ca = Ca::new();
    let (backend, accepted) = tls_backend_counted("b1", &ca.leaf(&["secure.test"])).await;
    let with_ca = UpstreamTls { ca_pem: Some(ca.pem.clone()), ..UpstreamTls::default() };
    let p = proxy(tls_route("secure.test", backend, UpstreamProtocol::Https, with_ca)).await;
    for _ in 0..10 {
        assert_eq!(p.get("secure.test", "/").await.text(), "tls-backend b1 HTTP/1.1");
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one TLS connection for 10 sequential requests"
    );
    // Concurrent requests open more, all of which answer.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let req = p.req("secure.test", "/").body(empty()).unwrap();
        let client = client();
        tasks.push(tokio::spawn(async move { client.request(req).await.unwrap().status() }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
}
