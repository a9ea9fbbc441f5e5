//! External authentication over HTTPS (`auth-url: https://…`) through a real proxy and a real
//! TLS authentication service on loopback: the certificate verified against the configured CA
//! (or the system's roots), the name in the URL's host (variables expanded) or `proxy-ssl-name`,
//! connections pooled per verification profile, and a failed verification failing closed (500).
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use support::tls::*;
use support::*;
use weir_dataplane::model::{ExternalAuth, RoutePolicy, UpstreamTls};

/// A TLS authentication service serving `leaf`: `Authorization: Bearer good` → 200 with
/// `X-Auth-User: good` and the SNI it saw in `X-Auth-Sni`, else 401. Counts the TLS connections it
/// accepted.
async fn tls_auth_service(leaf: &Leaf) -> (SocketAddr, Arc<AtomicUsize>) {
    let key = weir_dataplane::tls::certified_key(&leaf.cert).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(weir_dataplane::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            key.cert.clone(),
            PrivateKeyDer::from_pem_slice(leaf.cert.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, counter) = (acceptor.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                counter.fetch_add(1, Ordering::SeqCst);
                let sni = tls.get_ref().1.server_name().unwrap_or("").to_string();
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let sni = sni.clone();
                    async move {
                        let good = req.headers().get("authorization").is_some_and(|v| v == "Bearer good");
                        let resp = if good {
                            http::Response::builder().status(200).header("x-auth-user", "good")
                        } else {
                            http::Response::builder().status(401)
                        };
                        let resp =
                            resp.header("x-auth-sni", sni).body(http_body_util::Full::new(Bytes::new()));
                        Ok::<_, std::convert::Infallible>(resp.unwrap())
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}

/// A proxy routing `host` to an echo behind external authentication at `url`.
async fn proxy_for(host: &str, url: String, tls: Option<UpstreamTls>) -> (TestProxy, Echo) {
    let auth = ExternalAuth {
        url,
        method: "GET".into(),
        response_headers: vec!["X-Auth-User".into(), "X-Auth-Sni".into()],
        tls,
        ..ExternalAuth::default()
    };
    let policy = RoutePolicy { external_auth: Some(Box::new(auth)), ..RoutePolicy::default() };
    let e = echo("app").await;
    let p = proxy(table().host(host).prefix("/", &to(&e)).policy(policy).build()).await;
    (p, e)
}

async fn bearer(p: &TestProxy, host: &str, token: &str) -> Resp {
    p.send(p.req(host, "/").header("authorization", format!("Bearer {token}")).body(empty()).unwrap()).await
}

#[tokio::test]
async fn https_service_with_the_host_variable_verified_against_the_given_ca() {
    let ca = Ca::new();
    let (addr, accepted) = tls_auth_service(&ca.leaf(&["localhost"])).await;
    // As oauth2-proxy's example writes it, with the test service's port.
    let url = format!("https://$host:{}/oauth2/auth", addr.port());
    let trust = UpstreamTls { ca_pem: Some(ca.pem.clone()), ..UpstreamTls::default() };
    let (p, _e) = proxy_for("localhost", url, Some(trust)).await;
    let echo = bearer(&p, "localhost", "good").await.echo();
    assert_eq!(echo.headers["x-auth-user"], "good");
    assert_eq!(echo.headers["x-auth-sni"], "localhost", "the expanded host is the SNI sent");
    assert_eq!(bearer(&p, "localhost", "bad").await.status, 401);
    // Pooled as the HTTP ones: the next subrequests reuse the TLS connection.
    for _ in 0..5 {
        assert_eq!(bearer(&p, "localhost", "good").await.status, 200);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one TLS connection for 7 subrequests");
}

#[tokio::test]
async fn proxy_ssl_name_is_the_name_verified() {
    let ca = Ca::new();
    let (addr, _) = tls_auth_service(&ca.leaf(&["auth.internal"])).await;
    let url = format!("https://{addr}/check");
    let named = UpstreamTls {
        ca_pem: Some(ca.pem.clone()),
        server_name: Some("auth.internal".into()),
        ..UpstreamTls::default()
    };
    let (p, _e) = proxy_for("app.test", url.clone(), Some(named)).await;
    let echo = bearer(&p, "app.test", "good").await.echo();
    assert_eq!(echo.headers["x-auth-sni"], "auth.internal");
    // Without the name, the address is what is verified: the certificate does not cover it.
    let trust = UpstreamTls { ca_pem: Some(ca.pem.clone()), ..UpstreamTls::default() };
    let (p, _e) = proxy_for("app.test", url, Some(trust)).await;
    bearer(&p, "app.test", "good").await.assert_local(500);
}

#[tokio::test]
async fn an_unverifiable_service_fails_closed() {
    let ca = Ca::new();
    let (addr, _) = tls_auth_service(&ca.leaf(&["localhost"])).await;
    let url = format!("https://localhost:{}/check", addr.port());
    // The system's roots by default: they do not know the test CA.
    let (p, _e) = proxy_for("app.test", url.clone(), None).await;
    bearer(&p, "app.test", "good").await.assert_local(500);
    // Another CA.
    let other = UpstreamTls { ca_pem: Some(Ca::new().pem), ..UpstreamTls::default() };
    let (p2, _e2) = proxy_for("app.test", url.clone(), Some(other)).await;
    bearer(&p2, "app.test", "good").await.assert_local(500);
    // A CA that cannot be read: closed too, never unverified.
    let unusable = UpstreamTls { ca_pem: Some("not a certificate".into()), ..UpstreamTls::default() };
    let (p3, _e3) = proxy_for("app.test", url.clone(), Some(unusable)).await;
    bearer(&p3, "app.test", "good").await.assert_local(500);
    // Verification off (`proxy-ssl-verify: "off"`), only when asked.
    let off = UpstreamTls { insecure_skip_verify: true, ..UpstreamTls::default() };
    let (p4, _e4) = proxy_for("app.test", url, Some(off)).await;
    assert_eq!(bearer(&p4, "app.test", "good").await.echo().headers["x-auth-user"], "good");
}

#[tokio::test]
async fn lax_and_strict_profiles_never_share_a_connection() {
    let ca = Ca::new();
    let (addr, accepted) = tls_auth_service(&ca.leaf(&["localhost"])).await;
    let url = format!("https://localhost:{}/check", addr.port());
    let off = UpstreamTls { insecure_skip_verify: true, ..UpstreamTls::default() };
    let lax =
        ExternalAuth { url: url.clone(), method: "GET".into(), tls: Some(off), ..ExternalAuth::default() };
    let strict = ExternalAuth { tls: None, ..lax.clone() };
    let policy =
        |auth: ExternalAuth| RoutePolicy { external_auth: Some(Box::new(auth)), ..RoutePolicy::default() };
    let e = echo("app").await;
    let p = proxy(
        table()
            .host("lax.test")
            .prefix("/", &to(&e))
            .policy(policy(lax))
            .host("strict.test")
            .prefix("/", &to(&e))
            .policy(policy(strict))
            .build(),
    )
    .await;
    assert_eq!(bearer(&p, "lax.test", "good").await.status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // The lax route's pooled connection to the same service is not reused by the strict one.
    bearer(&p, "strict.test", "good").await.assert_local(500);
    assert_eq!(bearer(&p, "lax.test", "good").await.status, 200);
}
