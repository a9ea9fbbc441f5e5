//! TLS termination with real clients: SNI certificate selection, ALPN h2/http1.1, key types,
//! unusable certificates, plain HTTP on the TLS port, handshake timeout; curl and openssl.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::tls::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_dataplane::model::RouteTable;
use weir_dataplane::proxy::ProxyConfig;

/// Two echo backends on `a.test` and `b.test` (and any other host → `a`).
async fn two_hosts() -> RouteTable {
    let a = echo("a").await;
    let b = echo("b").await;
    table()
        .host("a.test")
        .prefix("/", &to(&a))
        .host("b.test")
        .prefix("/", &to(&b))
        .host("*.wild.test")
        .prefix("/", &to(&b))
        .build()
}

/// Gateway API `Listener.hostname` (citing RFC 7540 §9.1.2), on one connection per SNI (HTTP/1.1
/// keep-alive and HTTP/2, the connection-reuse case): a host of the SNI's own listener is
/// routed; a host another listener of the socket takes is answered 421, whether that listener is
/// less specific ("If the current Listener does not match the Host: if another Listener does
/// match the Host, SHOULD return a 421") or more specific ("If another Listener has an exact
/// match or more specific wildcard entry, SHOULD return a 421"); a host no listener takes gets
/// 404 ("MUST return a 404"), even when an Ingress route has it. A connection whose SNI chose an
/// Ingress's certificate is routed by `Host` alone, as before.
#[tokio::test]
async fn gateway_listener_hostname_misdirected_requests_get_421_and_other_names_404() {
    let ca = Ca::new();
    let (a, wild, ing) = (echo("a").await, echo("wild").await, echo("ing").await);
    let table = table()
        .host("a.example.com")
        .prefix("/", &to(&a))
        .host("*.example.com")
        .prefix("/", &to(&wild))
        .host("ing.test")
        .prefix("/", &to(&ing))
        .build();
    let table = with_listener(table, "default/gw/a", "a.example.com", &ca.leaf(&["a.example.com"]));
    let table = with_listener(table, "default/gw/wild", "*.example.com", &ca.leaf(&["*.example.com"]));
    let table = with_cert(table, "ing", &["ing.test"], &ca.leaf(&["ing.test"]));
    let p = tls_proxy(table).await;
    for h2 in [false, true] {
        let got = https_get_each(
            p.https,
            "a.example.com",
            &["a.example.com", "b.example.com", "ing.test", "a.example.com:443"],
            h2,
        )
        .await;
        assert_eq!(got[0].name(), "a", "h2={h2}: the SNI's own listener");
        got[1].assert_local(421);
        got[2].assert_local(404);
        assert_eq!(got[3].name(), "a", "h2={h2}: the port is not part of the name");

        let got = https_get_each(p.https, "b.example.com", &["c.example.com", "a.example.com"], h2).await;
        assert_eq!(got[0].name(), "wild", "h2={h2}: the same wildcard listener");
        got[1].assert_local(421);

        // An Ingress's connection: routed by Host, as ingress-nginx does.
        let got = https_get_each(p.https, "ing.test", &["ing.test", "a.example.com"], h2).await;
        assert_eq!((got[0].name(), got[1].name()), ("ing".into(), "a".into()), "h2={h2}");
    }
}

#[tokio::test]
async fn sni_picks_exact_then_wildcard_then_default() {
    let ca = Ca::new();
    let a = ca.leaf(&["a.test"]);
    let wild = ca.leaf(&["*.wild.test"]);
    let table =
        with_cert(with_cert(two_hosts().await, "a", &["a.test"], &a), "wild", &["*.wild.test"], &wild);
    let p = tls_proxy(table).await;

    assert_eq!(presented(p.https, "a.test").await, a.der, "exact name");
    assert_eq!(presented(p.https, "A.Test").await, a.der, "SNI is case-insensitive");
    assert_eq!(presented(p.https, "x.wild.test").await, wild.der, "wildcard covers one label");
    let deeper = presented(p.https, "y.x.wild.test").await;
    let other = presented(p.https, "other.test").await;
    for (what, cert) in [("two labels", &deeper), ("unknown name", &other)] {
        assert_ne!(cert, &a.der, "{what}");
        assert_ne!(cert, &wild.der, "{what}");
    }
    assert_eq!(deeper, other, "both get the one default certificate");
}

#[tokio::test]
async fn http1_and_h2_by_alpn_reach_the_route_of_the_host_header() {
    let ca = Ca::new();
    let p = tls_proxy(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"]))).await;
    for h2 in [false, true] {
        let r = https_get(p.https, "a.test", "a.test", "/x?y=1", h2).await.echo();
        assert_eq!((r.name.as_str(), r.path.as_str()), ("a", "/x"), "h2={h2}");
        assert_eq!(r.headers["x-forwarded-proto"], "https");
        assert_eq!(r.headers["x-forwarded-port"], p.https.port().to_string());
        assert_eq!(r.host.as_deref(), Some("a.test"));
        // SNI chose a.test's certificate; the Host header still picks the route (ingress-nginx does the same).
        let r = https_get(p.https, "a.test", "b.test", "/", h2).await;
        assert_eq!(r.name(), "b", "h2={h2}");
    }
    // The plain listener says http.
    let r = reqwest_plain(p.http, "a.test").await;
    assert_eq!(r.headers["x-forwarded-proto"], "http");
}

async fn reqwest_plain(addr: std::net::SocketAddr, host: &str) -> weir_dataplane::echo::EchoResponse {
    let req = http::Request::get(format!("http://{addr}/")).header("host", host).body(empty()).unwrap();
    let resp = client().request(req).await.unwrap();
    use http_body_util::BodyExt;
    serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

#[tokio::test]
async fn every_key_type_and_pem_encoding_serves() {
    let ca = Ca::new();
    let mut leaves = vec![
        ("p256-pkcs8", ca.leaf_with(&["k.test"], &rcgen::PKCS_ECDSA_P256_SHA256)),
        ("p384-pkcs8", ca.leaf_with(&["k.test"], &rcgen::PKCS_ECDSA_P384_SHA384)),
        ("ed25519-pkcs8", ca.leaf_with(&["k.test"], &rcgen::PKCS_ED25519)),
    ];
    if have("openssl") {
        let dir = tempfile::tempdir().unwrap();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(dir.path()).output().unwrap();
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        openssl(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "rsa8.pem"]);
        openssl(&["pkey", "-in", "rsa8.pem", "-traditional", "-out", "rsa1.pem"]);
        let rsa8 = std::fs::read_to_string(dir.path().join("rsa8.pem")).unwrap();
        let rsa1 = std::fs::read_to_string(dir.path().join("rsa1.pem")).unwrap();
        assert!(rsa1.starts_with("-----BEGIN RSA PRIVATE KEY"), "{rsa1}");
        let key = rcgen::KeyPair::from_pem(&rsa8).unwrap();
        leaves.push(("rsa-pkcs8", ca.leaf_for_key(&["k.test"], &key, rsa8)));
        leaves.push(("rsa-pkcs1", ca.leaf_for_key(&["k.test"], &key, rsa1)));
        let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        std::fs::write(dir.path().join("ec8.pem"), ec.serialize_pem()).unwrap();
        openssl(&["pkey", "-in", "ec8.pem", "-traditional", "-out", "sec1.pem"]);
        let sec1 = std::fs::read_to_string(dir.path().join("sec1.pem")).unwrap();
        assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY"), "{sec1}");
        leaves.push(("p384-sec1", ca.leaf_for_key(&["k.test"], &ec, sec1)));
    }
    let e = echo("k").await;
    for (what, leaf) in &leaves {
        let table = with_cert(table().host("k.test").prefix("/", &to(&e)).build(), what, &["k.test"], leaf);
        let p = tls_proxy(table).await;
        assert_eq!(&presented(p.https, "k.test").await, &leaf.der, "{what}");
        assert_eq!(https_get(p.https, "k.test", "k.test", "/", true).await.name(), "k", "{what}");
    }
}

#[tokio::test]
async fn clients_preferring_hybrid_post_quantum_key_exchange_get_it_and_classic_clients_still_connect() {
    use rustls::NamedGroup;
    let ca = Ca::new();
    let e = echo("k").await;
    let leaf = ca.leaf(&["k.test"]);
    let p =
        tls_proxy(with_cert(table().host("k.test").prefix("/", &to(&e)).build(), "k", &["k.test"], &leaf))
            .await;
    let addr = p.https;
    let group = |config: rustls::ClientConfig| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(rustls::pki_types::ServerName::try_from("k.test").unwrap(), tcp)
            .await
            .unwrap();
        tls.get_ref().1.negotiated_key_exchange_group().map(|g| g.name())
    };
    // A client listing X25519MLKEM768 first (as current browsers do) gets it, on TLS 1.3.
    let mut groups = weir_dataplane::tls::provider().kx_groups.clone();
    groups.sort_by_key(|g| g.name() != NamedGroup::X25519MLKEM768);
    assert_eq!(groups[0].name(), NamedGroup::X25519MLKEM768, "weir's provider has it");
    let listing = |groups: Vec<&'static dyn rustls::crypto::SupportedKxGroup>| {
        let mut provider = (*weir_dataplane::tls::provider()).clone();
        provider.kx_groups = groups;
        client_config_provider(provider)
    };
    assert_eq!(group(listing(groups.clone())).await, Some(NamedGroup::X25519MLKEM768));
    // One listing a classic group first gets that one; one with only classic groups (OpenSSL 3.0,
    // Go before 1.24) is served with them.
    groups.rotate_left(1);
    assert_eq!(group(listing(groups.clone())).await, Some(groups[0].name()));
    for only in [NamedGroup::X25519, NamedGroup::secp256r1] {
        let classic = groups.iter().copied().filter(|g| g.name() == only).collect();
        assert_eq!(group(listing(classic)).await, Some(only), "{only:?}");
    }
}

#[tokio::test]
async fn returning_clients_resume_their_session_across_new_tables_unless_resumption_is_off() {
    use rustls::HandshakeKind::{Full, Resumed};
    use weir_dataplane::model::{Settings, TlsVersion};
    let ca = Ca::new();
    let e = echo("k").await;
    let leaf = ca.leaf(&["k.test"]);
    let build = |extra: &str, settings: Settings| {
        let mut t = table().host("k.test").prefix("/", &to(&e)).host(extra).prefix("/", &to(&e)).build();
        t.settings = settings;
        with_cert(t, "k", &["k.test"], &leaf)
    };
    let p = tls_proxy(build("a.test", Settings::default())).await;
    // A request over a new connection made with `client`, which keeps the sessions it was given
    // (TLS 1.3 tickets arrive after the handshake: reading the response reads them).
    let addr = p.https;
    let handshake = |client: std::sync::Arc<rustls::ClientConfig>| async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("k.test").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client).connect(name, tcp).await.unwrap();
        tls.write_all(b"GET / HTTP/1.1\r\nhost: k.test\r\n\r\n").await.unwrap();
        let mut head = [0; 12];
        tls.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        tls.get_ref().1.handshake_kind().unwrap()
    };
    for (version, name) in [(&rustls::version::TLS13, "TLS 1.3"), (&rustls::version::TLS12, "TLS 1.2")] {
        let provider = (*weir_dataplane::tls::provider()).clone();
        let client = std::sync::Arc::new(client_config_for(provider, &[version]));
        assert_eq!(handshake(client.clone()).await, Full, "{name}: first visit");
        assert_eq!(handshake(client.clone()).await, Resumed, "{name}: returning");
        // A new routing table keeps the sessions.
        p.proxy.publish(build("b.test", Settings::default())).unwrap();
        assert_eq!(handshake(client.clone()).await, Resumed, "{name}: after a new table");
        // So does one with `ssl-protocols` (another server config, the same sessions).
        let both = Settings {
            tls_versions: Some(vec![TlsVersion::Tls12, TlsVersion::Tls13]),
            ..Settings::default()
        };
        p.proxy.publish(build("c.test", both)).unwrap();
        assert_eq!(handshake(client.clone()).await, Resumed, "{name}: ssl-protocols");
        p.proxy.publish(build("a.test", Settings::default())).unwrap();
    }
    // `ssl-session-cache: "false"`: every handshake is a full one.
    p.proxy.publish(build("a.test", Settings { tls_sessions: Some(0), ..Settings::default() })).unwrap();
    let client = std::sync::Arc::new(client_config(&[]));
    for visit in 0..3 {
        assert_eq!(handshake(client.clone()).await, Full, "resumption off, visit {visit}");
    }
    // Back on: sessions made from now on resume.
    p.proxy.publish(build("a.test", Settings::default())).unwrap();
    assert_eq!(handshake(client.clone()).await, Full);
    assert_eq!(handshake(client.clone()).await, Resumed);
}

#[tokio::test]
async fn unusable_certificate_falls_back_to_default_for_its_hosts_only() {
    let ca = Ca::new();
    let a = ca.leaf(&["a.test"]);
    let b = ca.leaf(&["b.test"]);
    let mut mismatched = ca.leaf(&["b.test"]);
    mismatched.cert.key_pem = ca.leaf(&["b.test"]).cert.key_pem; // another key
    assert!(matches!(
        weir_dataplane::tls::certified_key(&mismatched.cert),
        Err(weir_dataplane::tls::Error::KeyMismatch)
    ));
    let mut garbage = b.cert.clone();
    garbage.chain_pem = "not a certificate".into();
    assert!(weir_dataplane::tls::certified_key(&garbage).is_err());

    let table = with_cert(with_cert(two_hosts().await, "a", &["a.test"], &a), "b", &["b.test"], &mismatched);
    let p = tls_proxy(table).await;
    assert_eq!(presented(p.https, "a.test").await, a.der);
    let got = presented(p.https, "b.test").await;
    assert_ne!(got, mismatched.der);
    assert_eq!(got, presented(p.https, "nothing.test").await, "b.test gets the default certificate");
    assert_eq!(https_get(p.https, "b.test", "b.test", "/", false).await.name(), "b", "still served");
}

#[tokio::test]
async fn plain_http_on_the_tls_port_gets_400_and_is_closed() {
    let p = tls_proxy(two_hosts().await).await;
    let mut s = TcpStream::connect(p.https).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.unwrap().unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
    assert!(out.ends_with("400 The plain HTTP request was sent to HTTPS port"), "{out}");
}

#[tokio::test]
async fn stalled_handshake_is_closed_after_the_timeout() {
    let config = ProxyConfig { handshake_timeout: Duration::from_millis(300), ..test_config() };
    let p = tls_proxy_with(config, two_hosts().await).await;
    let mut s = TcpStream::connect(p.https).await.unwrap();
    s.write_all(&[0x16, 0x03, 0x01]).await.unwrap(); // a record header, then nothing
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // The listener still serves.
    assert_eq!(https_get(p.https, "a.test", "a.test", "/", false).await.name(), "a");
}

#[tokio::test]
async fn concurrent_handshakes_are_bounded() {
    let config = ProxyConfig {
        max_concurrent_handshakes: 2,
        handshake_timeout: Duration::from_secs(3),
        ..test_config()
    };
    let p = tls_proxy_with(config, two_hosts().await).await;
    // Two stalled handshakes take both slots; a third connection is closed at once.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(p.https).await.unwrap();
        s.write_all(&[0x16]).await.unwrap();
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = tls_connect(p.https, "a.test", &[]).await;
    assert!(err.is_err(), "third handshake must be refused");
    drop(stalled);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(https_get(p.https, "a.test", "a.test", "/", true).await.name(), "a");
}

// === real clients ===

fn write_ca(ca: &Ca) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &ca.pem).unwrap();
    f
}

#[tokio::test]
async fn curl_http2_and_http1_with_sni() {
    if !have("curl") {
        return;
    }
    let ca = Ca::new();
    let p = tls_proxy(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"]))).await;
    let ca_file = write_ca(&ca);
    for (flag, want) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let port = p.https.port();
        let out = tokio::process::Command::new("curl")
            .args(["-sS", flag, "--cacert"])
            .arg(ca_file.path())
            .args(["--resolve", &format!("a.test:{port}:127.0.0.1")])
            .args(["-w", "\n%{http_version}", &format!("https://a.test:{port}/curl")])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "curl {flag}: {}", String::from_utf8_lossy(&out.stderr));
        let (body, version) = stdout.rsplit_once('\n').unwrap();
        assert_eq!(version, want, "{stdout}");
        let echo: weir_dataplane::echo::EchoResponse = serde_json::from_str(body).unwrap();
        assert_eq!((echo.name.as_str(), echo.path.as_str()), ("a", "/curl"));
    }
}

async fn s_client(addr: std::net::SocketAddr, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test]
async fn openssl_s_client_sni_alpn_and_versions() {
    if !have("openssl") {
        return;
    }
    let ca = Ca::new();
    let p = tls_proxy(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"]))).await;
    let ca_file = write_ca(&ca);
    let ca_path = ca_file.path().to_str().unwrap();
    for (version, name) in [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")] {
        let (ok, out) = s_client(
            p.https,
            &[
                "-servername",
                "a.test",
                "-alpn",
                "h2,http/1.1",
                version,
                "-CAfile",
                ca_path,
                "-verify_return_error",
            ],
        )
        .await;
        assert!(ok, "{out}");
        assert!(out.contains("ALPN protocol: h2"), "{out}");
        assert!(
            out.contains(&format!("Protocol  : {name}")) || out.contains(&format!("New, {name}")),
            "{out}"
        );
        assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
        assert!(out.contains("subject=CN = a.test") || out.contains("subject=CN=a.test"), "{out}");
    }
    let (_, out) =
        s_client(p.https, &["-servername", "a.test", "-alpn", "http/1.1", "-CAfile", ca_path]).await;
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    // TLS 1.1 and older are refused by the server (the client is told to allow them).
    let (ok, out) =
        s_client(p.https, &["-servername", "a.test", "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]).await;
    assert!(!ok, "{out}");
    assert!(out.contains("Cipher is (NONE)"), "{out}");
    assert!(out.contains("alert handshake failure") || out.contains("alert protocol version"), "{out}");
    // An unknown name gets the self-signed default certificate.
    let (_, out) = s_client(p.https, &["-servername", "nope.test", "-CAfile", ca_path]).await;
    assert!(out.contains("weir.invalid") || out.contains("rcgen self signed cert"), "{out}");
}

// === redirects and HSTS ===

#[tokio::test]
async fn plain_http_to_a_redirecting_route_gets_308_to_https() {
    let ca = Ca::new();
    let table = redirect(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"])), "a.test");
    let config = ProxyConfig { https_redirect_port: 0, ..test_config() };
    let p = tls_proxy_with(config, table).await;
    let req = http::Request::post(format!("http://{}/x/y?q=1", p.http))
        .header("host", "a.test:8080")
        .body(full("b"))
        .unwrap();
    let r = send_plain(req).await;
    assert_eq!(r.status, 308);
    assert_eq!(r.headers["location"], format!("https://a.test:{}/x/y?q=1", p.https.port()));
    // Over HTTPS the same route is served; other hosts are not redirected.
    assert_eq!(https_get(p.https, "a.test", "a.test", "/", false).await.name(), "a");
    let r = send_plain(
        http::Request::get(format!("http://{}/", p.http)).header("host", "b.test").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);

    // Port 443 is left out of the URL, and so is the trailing `/` (ingress-nginx drops it unless
    // `preserve-trailing-slash`).
    let ca = Ca::new();
    let table = redirect(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"])), "a.test");
    let p = tls_proxy(table).await;
    let r = send_plain(
        http::Request::get(format!("http://{}/", p.http)).header("host", "a.test").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), &r.headers["location"]),
        (308, &http::HeaderValue::from_static("https://a.test"))
    );
}

async fn send_plain(req: http::Request<TestBody>) -> Resp {
    use http_body_util::BodyExt;
    let resp = client().request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    Resp { status: parts.status, headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
}

#[tokio::test]
async fn curl_follows_the_redirect_to_https() {
    if !have("curl") {
        return;
    }
    let ca = Ca::new();
    let table = redirect(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"])), "a.test");
    let p = tls_proxy_with(ProxyConfig { https_redirect_port: 0, ..test_config() }, table).await;
    let ca_file = write_ca(&ca);
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-L", "--cacert"])
        .arg(ca_file.path())
        .args(["--resolve", &format!("a.test:{}:127.0.0.1", p.http.port())])
        .args(["--resolve", &format!("a.test:{}:127.0.0.1", p.https.port())])
        .args(["-w", "\n%{num_redirects} %{scheme}", &format!("http://a.test:{}/follow", p.http.port())])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (body, tail) = stdout.rsplit_once('\n').unwrap();
    assert_eq!(tail.to_ascii_lowercase(), "1 https");
    let echo: weir_dataplane::echo::EchoResponse = serde_json::from_str(body).unwrap();
    assert_eq!((echo.path.as_str(), echo.headers["x-forwarded-proto"].as_str()), ("/follow", "https"));
}

#[tokio::test]
async fn hsts_is_sent_on_https_only_when_configured() {
    let ca = Ca::new();
    let table = with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"]));
    let hsts = http::HeaderValue::from_static("max-age=31536000; includeSubDomains");
    let p = tls_proxy_with(ProxyConfig { hsts: Some(hsts.clone()), ..test_config() }, table.clone()).await;
    for h2 in [false, true] {
        let r = https_get(p.https, "a.test", "a.test", "/", h2).await;
        assert_eq!(r.headers.get("strict-transport-security"), Some(&hsts), "h2={h2}");
        let r = https_get(p.https, "a.test", "nowhere.test", "/", h2).await;
        r.assert_local(404);
        assert_eq!(r.headers.get("strict-transport-security"), Some(&hsts), "local answers too");
    }
    let r = send_plain(
        http::Request::get(format!("http://{}/", p.http)).header("host", "a.test").body(empty()).unwrap(),
    )
    .await;
    assert!(!r.headers.contains_key("strict-transport-security"), "never over plain HTTP");
    let p = tls_proxy(table).await;
    assert!(
        !https_get(p.https, "a.test", "a.test", "/", true)
            .await
            .headers
            .contains_key("strict-transport-security")
    );
}

// === rotation ===

#[tokio::test]
async fn rotated_certificate_serves_new_handshakes_and_keeps_open_connections() {
    let ca = Ca::new();
    let (old, new) = (ca.leaf(&["a.test"]), ca.leaf(&["a.test"]));
    let base = two_hosts().await;
    let p = tls_proxy(with_cert(base.clone(), "a", &["a.test"], &old)).await;

    // An established HTTP/2 connection made with the old certificate.
    let tls = tls_connect(p.https, "a.test", &[b"h2"]).await.unwrap();
    assert_eq!(tls.get_ref().1.peer_certificates().unwrap()[0], old.der);
    let (mut open, conn) = hyper::client::conn::http2::handshake::<_, _, TestBody>(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);

    // Under load: new connections every few milliseconds while the certificate changes 20 times.
    let https = p.https;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let stop = stop.clone();
        load.push(tokio::spawn(async move {
            let mut served = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = https_get(https, "a.test", "a.test", "/", served.is_multiple_of(2)).await;
                assert_eq!(r.status, 200, "{}", r.text());
                served += 1;
            }
            served
        }));
    }
    let mut current = &old;
    for i in 0..20 {
        current = if i % 2 == 0 { &new } else { &old };
        p.proxy.publish(with_cert(base.clone(), "a", &["a.test"], current)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(presented(p.https, "a.test").await, current.der, "a new handshake sees the last publish");
    p.proxy.publish(with_cert(base.clone(), "a", &["a.test"], &new)).unwrap();
    assert_eq!(presented(p.https, "a.test").await, new.der);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for task in load {
        total += task.await.unwrap();
    }
    assert!(total > 20, "only {total} requests under load");

    // The old connection still works.
    let req = http::Request::get("https://a.test/still").body(empty()).unwrap();
    let resp = open.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn h2load_over_tls_has_no_failures() {
    if !have("h2load") {
        return;
    }
    let e = echo("any").await;
    let p = tls_proxy(table().prefix("/", &to(&e)).build()).await;
    let out = tokio::process::Command::new("h2load")
        .args(["-n", "400", "-c", "4", "-m", "8", &format!("https://127.0.0.1:{}/load", p.https.port())])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Application protocol: h2"), "{text}");
    assert!(text.contains("400 succeeded, 0 failed, 0 errored"), "{text}");
    assert!(text.contains("status codes: 400 2xx"), "{text}");
    eprintln!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("finished in") || l.starts_with("TLS Protocol"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// === WebSocket over TLS ===

#[tokio::test]
async fn websocket_over_tls() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let ca = Ca::new();
    let p = tls_proxy(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"]))).await;
    let tls = tls_connect(p.https, "a.test", &[b"http/1.1"]).await.unwrap();
    let req = "wss://a.test/ws".into_client_request().unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tls).await.unwrap();
    assert_eq!(resp.status(), 101);
    for i in 0..3 {
        let text = format!("over tls {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), text);
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn websocket_over_http2_extended_connect() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::Role;

    let ca = Ca::new();
    let p = tls_proxy(with_cert(two_hosts().await, "a", &["a.test"], &ca.leaf(&["a.test"]))).await;
    let tls = tls_connect(p.https, "a.test", &[b"h2"]).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .handshake::<_, TestBody>(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    // An ordinary request first, so the server's SETTINGS (ENABLE_CONNECT_PROTOCOL) are in.
    let warm = send.send_request(http::Request::get("https://a.test/").body(empty()).unwrap()).await.unwrap();
    assert_eq!(warm.status(), 200);
    let mut req = http::Request::connect("https://a.test/ws")
        .header("sec-websocket-version", "13")
        .body(empty())
        .unwrap();
    req.extensions_mut().insert(hyper::ext::Protocol::from_static("websocket"));
    let mut resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "RFC 8441: 200, not 101");
    let upgraded = hyper::upgrade::on(&mut resp).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(upgraded),
        Role::Client,
        None,
    )
    .await;
    for i in 0..3 {
        let text = format!("over h2 {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), text);
    }
    // The same HTTP/2 connection keeps serving ordinary requests meanwhile.
    let r =
        send.send_request(http::Request::get("https://a.test/after").body(empty()).unwrap()).await.unwrap();
    assert_eq!(r.status(), 200);
    ws.close(None).await.unwrap();
}

/// Several certificates for one Gateway listener (`ListenerTLSConfig.certificateRefs`, more
/// than one: implementation-specific): the handshake serves the first whose key signs with a
/// scheme the client offers. A client that verifies ECDSA gets the ECDSA certificate (the
/// first); one that verifies only Ed25519 gets the Ed25519 one and completes a request.
#[tokio::test]
async fn several_listener_certificates_the_client_signature_schemes_choose() {
    let ca = Ca::new();
    let e = echo("k").await;
    let ecdsa = ca.leaf(&["k.test"]);
    let ed25519 = ca.leaf_with(&["k.test"], &rcgen::PKCS_ED25519);
    let t = table().host("k.test").prefix("/", &to(&e)).build();
    let mut t = with_listener(t, "default/gw/https", "k.test", &ecdsa);
    let alternative = weir_dataplane::model::ObjectRef::new("test", "ed25519");
    t.certificates.insert(alternative.clone(), ed25519.cert.clone());
    t.tls[0].alternatives.push(alternative);
    let p = tls_proxy(t).await;
    assert_eq!(presented(p.https, "k.test").await, ecdsa.der, "a client verifying every scheme");

    // The client offers (signature_algorithms) what its verifier supports: Ed25519 only.
    let mut provider = (*weir_dataplane::tls::provider()).clone();
    let ed_only: Vec<_> = provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .filter(|(scheme, _)| *scheme == rustls::SignatureScheme::ED25519)
        .cloned()
        .collect();
    provider.signature_verification_algorithms.mapping = Box::leak(ed_only.into_boxed_slice());
    let mut config = client_config_provider(provider);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(p.https).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect("k.test".try_into().unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.peer_certificates().unwrap()[0], ed25519.der, "an Ed25519-only client");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/").header("host", "k.test").body(empty()).unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);
}
