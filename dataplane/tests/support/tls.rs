//! TLS test harness: a throw-away CA (rcgen, made at test time), a proxy with plain and TLS
//! listeners, a rustls client that reports what the server presented, and external-tool helpers.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Version};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SignatureAlgorithm};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use weir_dataplane::model::{Certificate, HostMatch, ObjectRef, RouteTable, TlsEntry};
use weir_dataplane::proxy::{Proxy, ProxyConfig};

use super::{Resp, TestBody, empty, test_config};

// === PKI ===

/// A CA made at test time.
pub struct Ca {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key.
pub struct Leaf {
    /// As the model carries it.
    pub cert: Certificate,
    /// The leaf, DER (to compare with what a server presented).
    pub der: CertificateDer<'static>,
}

impl Leaf {
    /// A copy.
    pub fn clone_leaf(&self) -> Leaf {
        Leaf { cert: self.cert.clone(), der: self.der.clone() }
    }
}

impl Ca {
    /// A new ECDSA P-256 CA.
    pub fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "weir test CA");
        let cert = params.self_signed(&key).unwrap();
        Ca { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// An intermediate CA signed by this one; its leaves' chains are leaf, intermediate, root.
    pub fn intermediate(&self, cn: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Ca { pem: format!("{}{}", cert.pem(), self.pem), issuer: Issuer::new(params, key) }
    }

    /// A leaf for `names` with an ECDSA P-256 key.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    /// A leaf for `names` with a new key of `alg` (PKCS#8 PEM).
    pub fn leaf_with(&self, names: &[&str], alg: &'static SignatureAlgorithm) -> Leaf {
        let key = KeyPair::generate_for(alg).unwrap();
        self.leaf_for_key(names, &key, key.serialize_pem())
    }

    /// A leaf for `names` over `key`, whose PEM (any encoding) is `key_pem`.
    pub fn leaf_for_key(&self, names: &[&str], key: &KeyPair, key_pem: String) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
        let cert = params.signed_by(key, &self.issuer).unwrap();
        Leaf {
            cert: Certificate { chain_pem: format!("{}{}", cert.pem(), self.pem), key_pem },
            der: cert.der().clone(),
        }
    }
}

/// Adds a TLS entry: `hosts` served by `leaf`, stored as certificate `test/<name>`.
pub fn with_cert(mut table: RouteTable, name: &str, hosts: &[&str], leaf: &Leaf) -> RouteTable {
    let id = ObjectRef::new("test", name);
    table.certificates.insert(id.clone(), leaf.cert.clone());
    table.tls.push(TlsEntry {
        hosts: hosts.iter().map(|h| HostMatch::parse(h).unwrap()).collect(),
        certificate: Some(id),
        listener: None,
        alternatives: Vec::new(),
    });
    table
}

/// Adds the TLS entry of a Gateway HTTPS listener (`listener`, one host, `*.` a Gateway
/// suffix wildcard) served by `leaf`, stored as certificate `test/<listener>`.
pub fn with_listener(mut table: RouteTable, listener: &str, host: &str, leaf: &Leaf) -> RouteTable {
    let id = ObjectRef::new("test", listener);
    table.certificates.insert(id.clone(), leaf.cert.clone());
    let host = match host.strip_prefix("*.") {
        Some(suffix) => HostMatch::Suffix(suffix.to_owned()),
        None => HostMatch::parse(host).unwrap(),
    };
    table.tls.push(weir_dataplane::tls::listeners::listener_entry(host, id, listener));
    table
}

// === proxy ===

/// A proxy with a plain and a TLS listener, stopped when dropped.
pub struct TlsProxy {
    /// The proxy.
    pub proxy: Proxy,
    /// The plain HTTP listener.
    pub http: SocketAddr,
    /// The HTTPS listener.
    pub https: SocketAddr,
    _stop: Vec<oneshot::Sender<()>>,
}

/// Starts a proxy serving `table` on a plain and a TLS listener.
pub async fn tls_proxy(table: RouteTable) -> TlsProxy {
    tls_proxy_with(test_config(), table).await
}

/// [`tls_proxy`] with `config`; an `https_redirect_port` of 0 means this proxy's HTTPS port.
pub async fn tls_proxy_with(mut config: ProxyConfig, table: RouteTable) -> TlsProxy {
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http, https) = (plain.local_addr().unwrap(), tls.local_addr().unwrap());
    if config.https_redirect_port == 0 {
        config.https_redirect_port = https.port();
    }
    let proxy = Proxy::new(config);
    proxy.publish(table).unwrap();
    let (tx1, rx1) = oneshot::channel::<()>();
    let (tx2, rx2) = oneshot::channel::<()>();
    let p = proxy.clone();
    tokio::spawn(async move { p.serve(plain, async move { drop(rx1.await) }).await });
    let p = proxy.clone();
    tokio::spawn(async move { p.serve_tls(tls, async move { drop(rx2.await) }).await });
    TlsProxy { proxy, http, https, _stop: vec![tx1, tx2] }
}

// === client ===

/// Accepts any server certificate: the tests check what was presented instead.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A client config that accepts any certificate and offers `alpn`.
pub fn client_config(alpn: &[&[u8]]) -> ClientConfig {
    client_config_with(alpn, None)
}

/// [`client_config`] presenting the first `n` certificates of `leaf`'s chain.
pub fn client_config_chain(alpn: &[&[u8]], leaf: &Leaf, n: usize) -> ClientConfig {
    let provider = weir_dataplane::tls::provider();
    let chain =
        CertificateDer::pem_slice_iter(leaf.cert.chain_pem.as_bytes()).map(|c| c.unwrap()).take(n).collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.cert.key_pem.as_bytes()).unwrap();
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// [`client_config`] (no ALPN) over `provider`: e.g. weir's with fewer key exchange groups.
pub fn client_config_provider(provider: rustls::crypto::CryptoProvider) -> ClientConfig {
    client_config_for(provider, rustls::DEFAULT_VERSIONS)
}

/// [`client_config`] (no ALPN) over `provider` offering only `versions`.
pub fn client_config_for(
    provider: rustls::crypto::CryptoProvider,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> ClientConfig {
    let provider = Arc::new(provider);
    ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth()
}

/// [`client_config`] presenting `cert` as the client certificate.
pub fn client_config_with(alpn: &[&[u8]], cert: Option<&Leaf>) -> ClientConfig {
    let provider = weir_dataplane::tls::provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)));
    let mut config = match cert {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            let chain = CertificateDer::pem_slice_iter(leaf.cert.chain_pem.as_bytes())
                .map(|c| c.unwrap())
                .take(1)
                .collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.cert.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A TLS connection made with `sni`; the error is the handshake's.
pub async fn tls_connect(
    addr: SocketAddr,
    sni: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = TlsConnector::from(Arc::new(client_config(alpn)));
    connector.connect(ServerName::try_from(sni.to_string()).unwrap(), tcp).await
}

/// The leaf certificate a server presents for `sni`.
pub async fn presented(addr: SocketAddr, sni: &str) -> CertificateDer<'static> {
    let tls = tls_connect(addr, sni, &[]).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned()
}

/// `GET path` with `Host: host` over TLS with `sni`, HTTP/2 when `h2` (by ALPN) else HTTP/1.1.
pub async fn https_get(addr: SocketAddr, sni: &str, host: &str, path: &str, h2: bool) -> Resp {
    let req = Request::get(format!("https://{host}{path}")).body(empty()).unwrap();
    https_send(addr, sni, req, h2).await
}

/// Sends `req` over a new TLS connection (see [`https_get`]); the whole response is read.
pub async fn https_send(addr: SocketAddr, sni: &str, mut req: Request<TestBody>, h2: bool) -> Resp {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let tls = tls_connect(addr, sni, alpn).await.unwrap();
    let negotiated = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    assert_eq!(negotiated.as_deref(), Some(alpn[0]), "ALPN");
    let io = TokioIo::new(tls);
    let resp = if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake::<_, _, TestBody>(TokioExecutor::new(), io).await.unwrap();
        tokio::spawn(conn);
        *req.version_mut() = Version::HTTP_2;
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, TestBody>(io).await.unwrap();
        tokio::spawn(conn.with_upgrades());
        let host = req.uri().authority().unwrap().to_string();
        req.headers_mut().entry(http::header::HOST).or_insert(host.parse().unwrap());
        *req.uri_mut() = req.uri().path_and_query().unwrap().as_str().parse().unwrap();
        send.send_request(req).await.unwrap()
    };
    let (parts, body) = resp.into_parts();
    let body: Bytes = body.collect().await.unwrap().to_bytes();
    Resp { status: parts.status, headers: parts.headers, body }
}

/// `GET /` for each of `hosts` in turn over ONE TLS connection made with `sni` (HTTP/2 when
/// `h2`, else HTTP/1.1 keep-alive): the connection reuse of RFC 7540 §9.1.1.
pub async fn https_get_each(addr: SocketAddr, sni: &str, hosts: &[&str], h2: bool) -> Vec<Resp> {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let tls = tls_connect(addr, sni, alpn).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn[0]), "ALPN");
    let io = TokioIo::new(tls);
    let mut out = Vec::new();
    if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake::<_, _, TestBody>(TokioExecutor::new(), io).await.unwrap();
        tokio::spawn(conn);
        for host in hosts {
            let mut req = Request::get(format!("https://{host}/")).body(empty()).unwrap();
            *req.version_mut() = Version::HTTP_2;
            out.push(read(send.send_request(req).await.unwrap()).await);
        }
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, TestBody>(io).await.unwrap();
        tokio::spawn(conn);
        for host in hosts {
            let req = Request::get("/").header(http::header::HOST, *host).body(empty()).unwrap();
            send.ready().await.unwrap();
            out.push(read(send.send_request(req).await.unwrap()).await);
        }
    }
    out
}

/// A response read whole.
async fn read(resp: http::Response<hyper::body::Incoming>) -> Resp {
    let (parts, body) = resp.into_parts();
    let body: Bytes = body.collect().await.unwrap().to_bytes();
    Resp { status: parts.status, headers: parts.headers, body }
}

// === external tools ===

/// Whether `tool` is on PATH; if not, says why the test is skipped, and fails the test when
/// `WEIR_REQUIRE_ALL=1` (CI).
pub fn have(tool: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        if std::env::var("WEIR_REQUIRE_ALL").as_deref() == Ok("1") {
            panic!("{tool} is required (WEIR_REQUIRE_ALL=1) but not installed");
        }
        eprintln!("skipping: {tool} is not installed");
    }
    found
}

/// Marks every route of `host` for the HTTPS redirect.
pub fn redirect(mut table: RouteTable, host: &str) -> RouteTable {
    let host = HostMatch::parse(host).unwrap();
    for vh in table.hosts.iter_mut().filter(|v| v.host == host) {
        for route in &mut vh.routes {
            route.policy.ssl_redirect = true;
        }
    }
    table
}

// === a backend that terminates TLS itself ===

/// An HTTPS backend serving `leaf` (ALPN h2/http1.1); answers `tls-backend <name> <version>`.
pub async fn tls_backend(name: &'static str, leaf: &Leaf) -> SocketAddr {
    tls_backend_counted(name, leaf).await.0
}

/// [`tls_backend`], also counting the TLS connections it accepted.
pub async fn tls_backend_counted(
    name: &'static str,
    leaf: &Leaf,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let key = weir_dataplane::tls::certified_key(&leaf.cert).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(weir_dataplane::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            key.cert.clone(),
            rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.cert.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| async move {
                        let body = format!("tls-backend {name} {:?}", req.version());
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                            Bytes::from(body),
                        )))
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}
