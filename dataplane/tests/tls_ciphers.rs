//! TLS cipher suites and versions through a real proxy: `ssl-ciphers` (the suites offered to
//! clients), `proxy-ssl-ciphers`, `proxy-ssl-protocols` and `proxy-ssl-verify-depth` (towards
//! TLS backends).
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::tls::*;
use support::*;
use tokio::net::{TcpListener, TcpStream};
use weir_dataplane::model::{Certificate, TlsVersion, UpstreamProtocol, UpstreamTls};

const ECDSA_AES128: &str = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256";
const ECDSA_AES256: &str = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384";

fn versions(v: &[TlsVersion]) -> Vec<&'static rustls::SupportedProtocolVersion> {
    v.iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect()
}

/// A handshake with the proxy from a client offering only `suite` over `version`, trusting `ca`.
async fn handshake(addr: SocketAddr, ca: &Ca, version: TlsVersion, suite: &str) -> std::io::Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(CertificateDer::pem_slice_iter(ca.pem.as_bytes()).map(|c| c.unwrap()));
    let config =
        rustls::ClientConfig::builder_with_provider(weir_dataplane::tls::ciphers::provider(&[suite.into()]))
            .with_protocol_versions(&versions(&[version]))
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector.connect(ServerName::try_from("app.test").unwrap(), tcp).await.map(|_| ())
}

#[tokio::test]
async fn ssl_ciphers_choose_the_tls12_suites_offered() {
    let ca = Ca::new();
    let e = echo("e").await;
    let mut t = with_cert(
        table().host("app.test").prefix("/", &to(&e)).build(),
        "app",
        &["app.test"],
        &ca.leaf(&["app.test"]),
    );
    t.settings.tls_ciphers = Some(vec![ECDSA_AES128.into()]);
    let p = tls_proxy(t).await;
    handshake(p.https, &ca, TlsVersion::Tls12, ECDSA_AES128).await.unwrap();
    let refused = handshake(p.https, &ca, TlsVersion::Tls12, ECDSA_AES256).await;
    assert!(refused.is_err(), "a suite ssl-ciphers leaves out is not negotiated");
    // TLS 1.3 suites are not chosen by ssl-ciphers (as with nginx): they stay on.
    handshake(p.https, &ca, TlsVersion::Tls13, "TLS13_AES_128_GCM_SHA256").await.unwrap();
    // Without the setting, both TLS 1.2 suites are offered.
    let t = with_cert(
        table().host("app.test").prefix("/", &to(&e)).build(),
        "app",
        &["app.test"],
        &ca.leaf(&["app.test"]),
    );
    let p = tls_proxy(t).await;
    handshake(p.https, &ca, TlsVersion::Tls12, ECDSA_AES256).await.unwrap();
}

/// An HTTPS backend serving `chain_pem`/`key_pem` with only these versions and TLS 1.2 suites;
/// answers `ok`.
async fn restricted_backend(cert: &Certificate, v: &[TlsVersion], tls12: &[&str]) -> SocketAddr {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes()).map(|c| c.unwrap()).collect();
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
    let suites: Vec<String> = tls12.iter().map(|s| s.to_string()).collect();
    let config = rustls::ServerConfig::builder_with_provider(weir_dataplane::tls::ciphers::provider(&suites))
        .with_protocol_versions(&versions(v))
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service =
                    hyper::service::service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

async fn through(backend: SocketAddr, tls: UpstreamTls) -> Resp {
    let mut be = support::backend("secure", &[backend]);
    be.backend.protocol = UpstreamProtocol::Https;
    be.backend.tls = Some(tls);
    let p = proxy(table().host("secure.test").prefix("/", &be).build()).await;
    p.get("secure.test", "/").await
}

#[tokio::test]
async fn proxy_ssl_protocols_and_ciphers_must_meet_the_backend() {
    let ca = Ca::new();
    let leaf = ca.leaf(&["secure.test"]);
    let tls12_only = restricted_backend(&leaf.cert, &[TlsVersion::Tls12], &[ECDSA_AES256]).await;
    let base = UpstreamTls { ca_pem: Some(ca.pem.clone()), ..UpstreamTls::default() };
    assert_eq!(through(tls12_only, base.clone()).await.text(), "ok");
    // TLSv1.3 only towards a TLS 1.2 backend: no handshake, 502.
    let tls13 = UpstreamTls { versions: Some(vec![TlsVersion::Tls13]), ..base.clone() };
    through(tls12_only, tls13).await.assert_local(502);
    let tls12 = UpstreamTls { versions: Some(vec![TlsVersion::Tls12]), ..base.clone() };
    assert_eq!(through(tls12_only, tls12).await.text(), "ok");
    // A suite the backend does not have: 502; the one it has: through.
    let other = UpstreamTls { ciphers: Some(vec![ECDSA_AES128.into()]), ..base.clone() };
    through(tls12_only, other).await.assert_local(502);
    let same = UpstreamTls { ciphers: Some(vec![ECDSA_AES256.into()]), ..base };
    assert_eq!(through(tls12_only, same).await.text(), "ok");
}

#[tokio::test]
async fn proxy_ssl_verify_depth_bounds_the_chain() {
    let root = Ca::new();
    let leaf = root.intermediate("weir test intermediate").leaf(&["secure.test"]);
    // The backend sends its certificate and the intermediate (not the root).
    let blocks: Vec<&str> = leaf.cert.chain_pem.split_inclusive("-----END CERTIFICATE-----\n").collect();
    let sent = Certificate { chain_pem: blocks[..2].concat(), key_pem: leaf.cert.key_pem.clone() };
    let backend = restricted_backend(&sent, &[TlsVersion::Tls12, TlsVersion::Tls13], &[]).await;
    // Trust the root only (the last block of the intermediate's chain).
    let base = UpstreamTls { ca_pem: Some(root.pem.clone()), ..UpstreamTls::default() };
    assert_eq!(through(backend, base.clone()).await.text(), "ok");
    let shallow = UpstreamTls { verify_depth: Some(1), ..base.clone() };
    through(backend, shallow).await.assert_local(502);
    let deep = UpstreamTls { verify_depth: Some(2), ..base };
    assert_eq!(through(backend, deep).await.text(), "ok");
}
