//! mTLS per host: required, optional and optional_no_ca client certificates, the verified
//! certificate and its result forwarded upstream, spoofing and SNI/Host mismatch refused;
//! rustls and curl clients.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::tls::*;
use support::*;
use weir_dataplane::echo::EchoResponse;
use weir_dataplane::model::{ClientAuth, ClientVerify, HostMatch};

struct Setup {
    p: TlsProxy,
    weir_ca: Ca,
    good: Leaf,
    other_ca_client: Leaf,
    client_ca: Ca,
}

async fn setup() -> Setup {
    let weir_ca = Ca::new();
    let client_ca = Ca::new();
    let e = echo("e").await;
    let mut t = table().host("a.test").prefix("/", &to(&e));
    let hosts = ["a.test", "m.test", "opt.test", "noca.test", "cn.test", "page.test"];
    for h in &hosts[1..] {
        t = t.host(h).prefix("/", &to(&e));
    }
    let mut t = with_cert(t.build(), "w", &hosts, &weir_ca.leaf(&hosts));
    for (host, verify) in [
        ("m.test", ClientVerify::On),
        ("opt.test", ClientVerify::Optional),
        ("noca.test", ClientVerify::OptionalNoCa),
        ("cn.test", ClientVerify::On),
        ("page.test", ClientVerify::On),
    ] {
        t.client_auth.push(ClientAuth {
            host: HostMatch::parse(host).unwrap(),
            listener: None,
            ca_pem: client_ca.pem.clone(),
            verify,
            depth: 1,
            pass_certificate: host == "m.test",
            // The value ingress-nginx's docs show.
            match_cn: (host == "cn.test").then(|| "CN=(client one|client two)$".to_string()),
            error_page: (host == "page.test").then(|| "https://login.example.com/cert-help".to_string()),
        });
    }
    Setup {
        p: tls_proxy(t).await,
        good: client_ca.leaf(&["client one"]),
        other_ca_client: Ca::new().leaf(&["intruder"]),
        weir_ca,
        client_ca,
    }
}

/// GET / with `Host: host` over TLS with `sni`, presenting `cert`; Err if the handshake fails.
async fn get(
    s: &Setup,
    sni: &str,
    host: &str,
    cert: Option<&Leaf>,
    extra: Option<(&str, &str)>,
) -> Result<Resp, std::io::Error> {
    let tcp = tokio::net::TcpStream::connect(s.p.https).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config_with(&[b"h2"], cert)));
    let tls = connector.connect(sni.to_string().try_into().unwrap(), tcp).await?;
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let mut req = http::Request::get(format!("https://{host}/"));
    if let Some((k, v)) = extra {
        req = req.header(k, v);
    }
    // With TLS 1.3 a rejected client certificate shows up on the first request.
    let resp = send.send_request(req.body(empty()).unwrap()).await.map_err(std::io::Error::other)?;
    let (parts, body) = resp.into_parts();
    Ok(Resp { status: parts.status, headers: parts.headers, body: body.collect().await.unwrap().to_bytes() })
}

fn echo_of(r: &Resp) -> EchoResponse {
    r.echo()
}

fn url_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn required_client_certificate() {
    let s = setup().await;
    let r = echo_of(&get(&s, "m.test", "m.test", Some(&s.good), None).await.unwrap());
    assert_eq!(r.headers["ssl-client-verify"], "SUCCESS");
    assert_eq!(r.headers["ssl-client-subject-dn"], "CN=client one");
    assert_eq!(r.headers["ssl-client-issuer-dn"], "CN=weir test CA");
    let pem = url_decode(&r.headers["ssl-client-cert"]);
    assert!(
        pem.starts_with("-----BEGIN CERTIFICATE-----\n") && pem.ends_with("-----END CERTIFICATE-----\n"),
        "{pem}"
    );
    assert!(s.good.cert.chain_pem.replace("\r\n", "\n").starts_with(&pem), "the client's own certificate");

    get(&s, "m.test", "m.test", None, None).await.unwrap().assert_local(400);
    assert!(
        get(&s, "m.test", "m.test", Some(&s.other_ca_client), None).await.is_err(),
        "an unknown CA fails the handshake"
    );
}

#[tokio::test]
async fn optional_and_optional_no_ca() {
    let s = setup().await;
    let r = echo_of(&get(&s, "opt.test", "opt.test", None, None).await.unwrap());
    assert_eq!(r.headers["ssl-client-verify"], "NONE");
    assert!(!r.headers.contains_key("ssl-client-cert"), "not asked to pass it");
    let r = echo_of(&get(&s, "opt.test", "opt.test", Some(&s.good), None).await.unwrap());
    assert_eq!(r.headers["ssl-client-verify"], "SUCCESS");

    let r = echo_of(&get(&s, "noca.test", "noca.test", Some(&s.other_ca_client), None).await.unwrap());
    assert!(r.headers["ssl-client-verify"].starts_with("FAILED:"), "{:?}", r.headers);
    assert_eq!(r.headers["ssl-client-subject-dn"], "CN=intruder");
    let r = echo_of(&get(&s, "noca.test", "noca.test", Some(&s.good), None).await.unwrap());
    assert_eq!(r.headers["ssl-client-verify"], "SUCCESS");
}

/// `auth-tls-match-cn`: a verified certificate whose subject does not match gets 403;
/// `auth-tls-error-page`: a missing certificate is redirected there instead of 400.
#[tokio::test]
async fn match_cn_and_error_page() {
    let s = setup().await;
    let r = echo_of(&get(&s, "cn.test", "cn.test", Some(&s.good), None).await.unwrap());
    assert_eq!(r.headers["ssl-client-subject-dn"], "CN=client one");
    let stranger = s.client_ca.leaf(&["client three"]);
    get(&s, "cn.test", "cn.test", Some(&stranger), None).await.unwrap().assert_local(403);
    get(&s, "cn.test", "cn.test", None, None).await.unwrap().assert_local(400);

    let r = get(&s, "page.test", "page.test", None, None).await.unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(r.headers["location"], "https://login.example.com/cert-help");
    let r = echo_of(&get(&s, "page.test", "page.test", Some(&stranger), None).await.unwrap());
    assert_eq!(r.headers["ssl-client-verify"], "SUCCESS", "no match-cn on this host");
}

#[tokio::test]
async fn spoofed_headers_and_sni_host_mismatch_are_refused() {
    let s = setup().await;
    // A client cannot claim a verified certificate.
    let r =
        echo_of(&get(&s, "a.test", "a.test", None, Some(("ssl-client-verify", "SUCCESS"))).await.unwrap());
    assert!(!r.headers.contains_key("ssl-client-verify"), "{:?}", r.headers);
    // Nor reach an mTLS host over a connection made for another name.
    get(&s, "a.test", "m.test", None, None).await.unwrap().assert_local(421);
    // A connection made for the mTLS host may still ask other hosts.
    assert_eq!(echo_of(&get(&s, "m.test", "a.test", Some(&s.good), None).await.unwrap()).name, "e");
}

#[tokio::test]
async fn curl_with_a_client_certificate() {
    if !have("curl") {
        return;
    }
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) =
        (dir.path().join("ca.pem"), dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&ca, &s.weir_ca.pem).unwrap();
    std::fs::write(&cert, &s.good.cert.chain_pem).unwrap();
    std::fs::write(&key, &s.good.cert.key_pem).unwrap();
    let port = s.p.https.port();
    let run = |with_cert: bool| {
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", "--cacert"]).arg(&ca);
        if with_cert {
            cmd.arg("--cert").arg(&cert).arg("--key").arg(&key);
        }
        cmd.args(["--resolve", &format!("m.test:{port}:127.0.0.1"), &format!("https://m.test:{port}/")]);
        cmd
    };
    let out = run(true).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n200") && text.contains("\"ssl-client-verify\":\"SUCCESS\""), "{text}");
    let out = run(false).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n400"), "{text}");
}

#[tokio::test]
async fn verify_depth_limits_the_chain() {
    let weir_ca = Ca::new();
    let root = Ca::new();
    let intermediate = root.intermediate("client intermediate");
    let client = intermediate.leaf(&["deep client"]);
    let e = echo("e").await;
    let base = with_cert(
        table().host("m.test").prefix("/", &to(&e)).build(),
        "w",
        &["m.test"],
        &weir_ca.leaf(&["m.test"]),
    );
    for (depth, ok) in [(1u8, false), (2, true)] {
        let mut t = base.clone();
        t.client_auth.push(ClientAuth {
            host: HostMatch::parse("m.test").unwrap(),
            listener: None,
            ca_pem: root.pem.clone(),
            verify: ClientVerify::OptionalNoCa,
            depth,
            pass_certificate: false,
            match_cn: None,
            error_page: None,
        });
        let p = tls_proxy(t).await;
        let s = Setup {
            p,
            weir_ca: Ca::new(),
            good: client.clone_leaf(),
            other_ca_client: client.clone_leaf(),
            client_ca: Ca::new(),
        };
        let r = echo_of(&get_chain(&s, "m.test", &client).await);
        assert_eq!(r.headers["ssl-client-verify"] == "SUCCESS", ok, "depth {depth}: {:?}", r.headers);
    }
}

/// Like [`get`], presenting the leaf with its intermediate.
async fn get_chain(s: &Setup, host: &str, leaf: &Leaf) -> Resp {
    let tcp = tokio::net::TcpStream::connect(s.p.https).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config_chain(&[b"h2"], leaf, 2)));
    let tls = connector.connect(host.to_string().try_into().unwrap(), tcp).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(http::Request::get(format!("https://{host}/")).body(empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    Resp { status: parts.status, headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
}

#[tokio::test]
async fn an_unusable_client_ca_refuses_every_request() {
    let weir_ca = Ca::new();
    let e = echo("e").await;
    let mut t = with_cert(
        table().host("m.test").prefix("/", &to(&e)).build(),
        "w",
        &["m.test"],
        &weir_ca.leaf(&["m.test"]),
    );
    t.client_auth.push(ClientAuth {
        host: HostMatch::parse("m.test").unwrap(),
        listener: None,
        ca_pem: String::new(),
        verify: ClientVerify::OptionalNoCa,
        depth: 1,
        pass_certificate: false,
        match_cn: None,
        error_page: None,
    });
    let s = Setup {
        p: tls_proxy(t).await,
        weir_ca: Ca::new(),
        good: Ca::new().leaf(&["c"]),
        other_ca_client: Ca::new().leaf(&["d"]),
        client_ca: Ca::new(),
    };
    get(&s, "m.test", "m.test", None, None).await.unwrap().assert_local(400);
    get(&s, "m.test", "m.test", Some(&s.good), None).await.unwrap().assert_local(400);
}

// === Gateway API listeners (`FrontendTLSValidation`) ===

/// GET / with `Host: host` over TLS with `sni`, presenting `cert`, over HTTP/2 or HTTP/1.1; Err
/// if the handshake or the request fails (with TLS 1.3 a refused client certificate shows up
/// on the first request).
async fn get_over(
    addr: std::net::SocketAddr,
    sni: &str,
    host: &str,
    cert: Option<&Leaf>,
    h2: bool,
) -> Result<Resp, std::io::Error> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config_with(alpn, cert)));
    let tls = connector.connect(sni.to_string().try_into().unwrap(), tcp).await?;
    let req = http::Request::get(format!("https://{host}/")).header("host", host).body(empty()).unwrap();
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        send.send_request(req).await.map_err(std::io::Error::other)?
    } else {
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        send.send_request(req).await.map_err(std::io::Error::other)?
    };
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    Ok(Resp { status: parts.status, headers: parts.headers, body })
}

/// A Gateway listener's policy (`FrontendTLSValidation`) for `host` (`*.` a Gateway suffix).
fn listener_auth(listener: &str, host: &str, ca: &Ca, verify: ClientVerify) -> ClientAuth {
    let host = match host.strip_prefix("*.") {
        Some(suffix) => HostMatch::Suffix(suffix.to_owned()),
        None => HostMatch::parse(host).unwrap(),
    };
    ClientAuth {
        host,
        listener: Some(listener.to_owned()),
        ca_pem: ca.pem.clone(),
        verify,
        depth: u8::MAX,
        pass_certificate: false,
        match_cn: None,
        error_page: None,
    }
}

/// Gateway API `FrontendValidationModeType`, over HTTP/1.1 and HTTP/2: `AllowValidOnly`
/// (`Handshake`) fails the handshake without a certificate of the listener's CA and serves a
/// valid one; `AllowInsecureFallback` (`optional_no_ca`) serves any client and tells the backend
/// the result in `ssl-client-verify`. A listener without validation asks nothing, even under an
/// Ingress's wildcard policy that would cover its name: the name is the listener's. A
/// connection made for another name cannot reach a validating listener's routes (421).
#[tokio::test]
async fn gateway_listener_client_certificate_validation_modes() {
    let weir_ca = Ca::new();
    let client_ca = Ca::new();
    let good = client_ca.leaf(&["client one"]);
    let stranger = Ca::new().leaf(&["intruder"]);
    let e = echo("e").await;
    let names = ["valid.example.com", "a.fallback.test", "plain.example.com", "ing.example.com"];
    let mut t = table();
    for name in names {
        t = t.host(name).prefix("/", &to(&e));
    }
    let server =
        weir_ca.leaf(&["valid.example.com", "*.fallback.test", "plain.example.com", "ing.example.com"]);
    let t = with_listener(t.build(), "default/gw/valid", "valid.example.com", &server);
    let t = with_listener(t, "default/gw/fallback", "*.fallback.test", &server);
    let t = with_listener(t, "default/gw/plain", "plain.example.com", &server);
    let mut t = with_cert(t, "ingress", &["ing.example.com"], &server);
    t.client_auth.push(listener_auth(
        "default/gw/valid",
        "valid.example.com",
        &client_ca,
        ClientVerify::Handshake,
    ));
    t.client_auth.push(listener_auth(
        "default/gw/fallback",
        "*.fallback.test",
        &client_ca,
        ClientVerify::OptionalNoCa,
    ));
    // An Ingress's `auth-tls-*` on `*.example.com` (one label): covers plain.example.com by
    // name, but that name belongs to its listener, which validates nothing.
    t.client_auth.push(ClientAuth {
        host: HostMatch::parse("*.example.com").unwrap(),
        listener: None,
        ca_pem: client_ca.pem.clone(),
        verify: ClientVerify::On,
        depth: 1,
        pass_certificate: false,
        match_cn: None,
        error_page: None,
    });
    let p = tls_proxy(t).await;
    for h2 in [false, true] {
        let v = if h2 { "h2" } else { "http/1.1" };
        // AllowValidOnly.
        let r = get_over(p.https, "valid.example.com", "valid.example.com", Some(&good), h2).await.unwrap();
        assert_eq!(r.echo().headers["ssl-client-verify"], "SUCCESS", "{v}");
        let none = get_over(p.https, "valid.example.com", "valid.example.com", None, h2).await;
        assert!(none.is_err(), "{v}: no certificate must fail the handshake: {:?}", none.map(|r| r.status));
        let other = get_over(p.https, "valid.example.com", "valid.example.com", Some(&stranger), h2).await;
        assert!(other.is_err(), "{v}: another CA's certificate must fail: {:?}", other.map(|r| r.status));
        // AllowInsecureFallback: every client served, the backend told what was presented.
        for (cert, verdict) in [(Some(&good), "SUCCESS"), (None, "NONE"), (Some(&stranger), "FAILED:")] {
            let r = get_over(p.https, "a.fallback.test", "a.fallback.test", cert, h2).await.unwrap();
            let seen = &r.echo().headers["ssl-client-verify"];
            assert!(seen.starts_with(verdict), "{v}: {verdict} wanted, {seen}");
        }
        // No validation on the listener: no certificate asked, none reported.
        let r = get_over(p.https, "plain.example.com", "plain.example.com", None, h2).await.unwrap();
        assert!(!r.echo().headers.contains_key("ssl-client-verify"), "{v}: {:?}", r.headers);
        // The Ingress's policy still holds for its own name (400 without a certificate).
        get_over(p.https, "ing.example.com", "ing.example.com", None, h2).await.unwrap().assert_local(400);
        // A connection made for the Ingress's name asks for the validating listener's name: it
        // was not validated by that listener, so it is misdirected.
        let r = get_over(p.https, "ing.example.com", "valid.example.com", Some(&good), h2).await.unwrap();
        r.assert_local(421);
    }
}
