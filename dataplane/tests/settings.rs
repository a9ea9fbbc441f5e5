//! Global settings (the controller ConfigMap) through the real proxy: the client address behind
//! trusted proxies, HSTS, TLS versions, the default body limit, client and upstream keep-alive,
//! headers with underscores and the JSON access log. Settings travel in the table, so each
//! test also shows that a publish changes them without a restart.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use support::tls::*;
use support::*;
use tokio::net::TcpStream;
use weir_dataplane::model::{
    Forwarded, Hsts, LogField, RoutePolicy, RouteTable, Settings, SourceFilter, TlsVersion,
};
use weir_dataplane::proxy::ProxyConfig;
use weir_dataplane::proxy::accesslog::Output;

fn forwarded(trusted: &[&str], full_chain: bool) -> Settings {
    Settings {
        forwarded: Some(Forwarded {
            trust_headers: true,
            client_header: "x-forwarded-for".into(),
            trusted: trusted.iter().map(|n| n.parse().unwrap()).collect(),
            full_chain,
        }),
        ..Settings::default()
    }
}

fn with_settings(mut table: RouteTable, settings: Settings) -> RouteTable {
    table.settings = settings;
    table
}

/// `GET /` on a.test with `headers`; what the echo backend saw.
async fn seen(p: &TestProxy, headers: &[(&str, &str)]) -> weir_dataplane::echo::EchoResponse {
    let mut req = p.req("a.test", "/");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    p.send(req.body(empty()).unwrap()).await.echo()
}

const CHAIN: (&str, &str) = ("x-forwarded-for", "203.0.113.7, 10.0.0.5");

#[tokio::test]
async fn the_client_address_comes_from_trusted_proxies_only() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p = proxy(base.clone()).await;

    // Default: the peer, whatever the client claims.
    let s = seen(&p, &[CHAIN, ("x-forwarded-proto", "https")]).await;
    assert_eq!(s.headers["x-real-ip"], "127.0.0.1");
    assert_eq!(s.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(s.headers["x-forwarded-proto"], "http");

    // The peer is trusted, 10.0.0.5 is not: it is the client.
    p.proxy.publish(with_settings(base.clone(), forwarded(&["127.0.0.0/8"], false))).unwrap();
    let s = seen(&p, &[CHAIN, ("x-forwarded-proto", "https"), ("x-forwarded-host", "public.test, x")]).await;
    assert_eq!(s.headers["x-real-ip"], "10.0.0.5");
    assert_eq!(s.headers["x-forwarded-for"], "10.0.0.5");
    assert_eq!(s.headers["x-forwarded-proto"], "https");
    assert_eq!(s.headers["x-forwarded-host"], "public.test");

    // Both proxies trusted: the original client, past them from the right.
    p.proxy.publish(with_settings(base.clone(), forwarded(&["127.0.0.0/8", "10.0.0.0/8"], false))).unwrap();
    assert_eq!(seen(&p, &[CHAIN]).await.headers["x-real-ip"], "203.0.113.7");

    // compute-full-forwarded-for: the incoming chain with the peer appended.
    p.proxy.publish(with_settings(base.clone(), forwarded(&["127.0.0.0/8", "10.0.0.0/8"], true))).unwrap();
    let s = seen(&p, &[CHAIN]).await;
    assert_eq!(s.headers["x-forwarded-for"], "203.0.113.7, 10.0.0.5, 127.0.0.1");
    assert_eq!(s.headers["x-real-ip"], "203.0.113.7");

    // A peer outside proxy-real-ip-cidr is believed in nothing.
    p.proxy.publish(with_settings(base, forwarded(&["192.0.2.0/24"], true))).unwrap();
    let s = seen(&p, &[CHAIN, ("x-forwarded-proto", "https")]).await;
    assert_eq!(s.headers["x-real-ip"], "127.0.0.1");
    assert_eq!(s.headers["x-forwarded-proto"], "https", "use-forwarded-headers trusts the proto header");
}

#[tokio::test]
async fn allow_lists_and_redirects_use_what_trusted_proxies_say() {
    let e = echo("e").await;
    let allow = RoutePolicy {
        source: SourceFilter { allow: vec!["203.0.113.0/24".parse().unwrap()], deny: vec![] },
        ..RoutePolicy::default()
    };
    let base = redirect(
        table().host("a.test").prefix("/", &to(&e)).policy(allow).host("r.test").prefix("/", &to(&e)).build(),
        "r.test",
    );
    let p = proxy(base.clone()).await;
    let get = |host: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let mut req = p.req(host, "/");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        p.send(req.body(empty()).unwrap())
    };
    get("a.test", vec![CHAIN]).await.assert_local(403);
    assert_eq!(
        get("r.test", vec![("x-forwarded-proto", "https")]).await.status,
        StatusCode::PERMANENT_REDIRECT
    );

    p.proxy.publish(with_settings(base, forwarded(&["127.0.0.0/8", "10.0.0.0/8"], false))).unwrap();
    assert_eq!(get("a.test", vec![CHAIN]).await.name(), "e");
    get("a.test", vec![("x-forwarded-for", "198.51.100.1")]).await.assert_local(403);
    // TLS ended at the trusted balancer: no redirect loop.
    let r = get("r.test", vec![("x-forwarded-proto", "https")]).await;
    assert_eq!(r.echo().headers["x-forwarded-proto"], "https");
    assert_eq!(get("r.test", vec![]).await.status, StatusCode::PERMANENT_REDIRECT);
}

/// A table routing a.test to an echo, with a certificate for it from a new CA.
async fn a_test_with_tls() -> (Ca, RouteTable) {
    let e = echo("e").await;
    let ca = Ca::new();
    let leaf = ca.leaf(&["a.test"]);
    (ca, with_cert(table().host("a.test").prefix("/", &to(&e)).build(), "a", &["a.test"], &leaf))
}

#[tokio::test]
async fn hsts_is_sent_on_https_as_configured() {
    let (_ca, base) = a_test_with_tls().await;
    let config = ProxyConfig { hsts: Some(http::HeaderValue::from_static("max-age=5")), ..test_config() };
    let p = tls_proxy_with(config, base.clone()).await;
    let hsts = |r: &Resp| r.headers.get("strict-transport-security").map(|v| v.to_str().unwrap().to_string());
    // The flag's value until the ConfigMap says otherwise.
    assert_eq!(hsts(&https_get(p.https, "a.test", "a.test", "/", false).await).as_deref(), Some("max-age=5"));

    let on = Hsts { enabled: true, max_age: 600, include_subdomains: true, preload: true };
    p.proxy.publish(with_settings(base.clone(), Settings { hsts: Some(on), ..Settings::default() })).unwrap();
    let r = https_get(p.https, "a.test", "a.test", "/", true).await;
    assert_eq!(hsts(&r).as_deref(), Some("max-age=600; includeSubDomains; preload"));
    // Never on plain HTTP.
    let plain = client()
        .request(Request::get(format!("http://{}/", p.http)).header("host", "a.test").body(empty()).unwrap())
        .await
        .unwrap();
    assert!(!plain.headers().contains_key("strict-transport-security"));

    let off = Hsts { enabled: false, max_age: 600, include_subdomains: true, preload: false };
    p.proxy.publish(with_settings(base, Settings { hsts: Some(off), ..Settings::default() })).unwrap();
    assert_eq!(hsts(&https_get(p.https, "a.test", "a.test", "/", false).await), None);
}

/// A TLS handshake offering only `version`; the negotiated version, or the handshake error.
async fn handshake_with(
    addr: std::net::SocketAddr,
    ca: &Ca,
    version: &'static rustls::SupportedProtocolVersion,
) -> Result<rustls::ProtocolVersion, std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(weir_dataplane::tls::provider())
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("a.test").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    Ok(tls.get_ref().1.protocol_version().unwrap())
}

#[tokio::test]
async fn ssl_protocols_limit_the_versions_of_new_handshakes() {
    let (ca, base) = a_test_with_tls().await;
    let p = tls_proxy(base.clone()).await;
    let (v12, v13) = (&rustls::version::TLS12, &rustls::version::TLS13);
    assert_eq!(handshake_with(p.https, &ca, v12).await.unwrap(), rustls::ProtocolVersion::TLSv1_2);

    let only13 = Settings { tls_versions: Some(vec![TlsVersion::Tls13]), ..Settings::default() };
    p.proxy.publish(with_settings(base.clone(), only13.clone())).unwrap();
    let refused = handshake_with(p.https, &ca, v12).await.unwrap_err();
    assert!(refused.to_string().to_lowercase().contains("version"), "{refused}");
    assert_eq!(handshake_with(p.https, &ca, v13).await.unwrap(), rustls::ProtocolVersion::TLSv1_3);
    // Another publish with the same versions keeps serving them.
    p.proxy.publish(with_settings(base.clone(), only13)).unwrap();
    assert!(handshake_with(p.https, &ca, v12).await.is_err());

    let only12 = Settings { tls_versions: Some(vec![TlsVersion::Tls12]), ..Settings::default() };
    p.proxy.publish(with_settings(base, only12)).unwrap();
    assert!(handshake_with(p.https, &ca, v13).await.is_err());
    assert_eq!(handshake_with(p.https, &ca, v12).await.unwrap(), rustls::ProtocolVersion::TLSv1_2);
}

#[tokio::test]
async fn proxy_body_size_is_the_default_limit() {
    let e = echo("e").await;
    let big = RoutePolicy { max_body_bytes: Some(4096), ..RoutePolicy::default() };
    let base = table().host("a.test").prefix("/", &to(&e)).prefix("/upload", &to(&e)).policy(big).build();
    let settings = Settings { max_body_bytes: Some(1024), ..Settings::default() };
    let p = proxy(with_settings(base.clone(), settings)).await;
    let post = |path: &str, n: usize| {
        p.send(p.req("a.test", path).method("POST").body(full(vec![b'x'; n])).unwrap())
    };
    assert_eq!(post("/", 1000).await.echo().body_bytes, 1000);
    post("/", 2000).await.assert_local(413);
    // A route's own limit wins.
    assert_eq!(post("/upload", 2000).await.echo().body_bytes, 2000);
    // 0: no limit.
    p.proxy
        .publish(with_settings(base, Settings { max_body_bytes: Some(0), ..Settings::default() }))
        .unwrap();
    assert_eq!(post("/", 100_000).await.echo().body_bytes, 100_000);
}

/// An HTTP/1.1 client connection to `addr`; its task ends when the connection closes.
async fn h1_conn(
    addr: std::net::SocketAddr,
) -> (hyper::client::conn::http1::SendRequest<TestBody>, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake::<_, TestBody>(TokioIo::new(tcp)).await.unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

fn get_a() -> Request<TestBody> {
    Request::get("/").header("host", "a.test").body(empty()).unwrap()
}

#[tokio::test]
async fn keep_alive_requests_closes_the_connection_after_n() {
    let e = echo("e").await;
    let settings = Settings { keepalive_requests: Some(3), ..Settings::default() };
    let p = proxy(with_settings(table().host("a.test").prefix("/", &to(&e)).build(), settings)).await;
    let (mut send, task) = h1_conn(p.addr).await;
    for n in 1..=3 {
        send.ready().await.unwrap();
        let resp = send.send_request(get_a()).await.unwrap();
        assert_eq!(resp.status(), 200);
        let close = resp.headers().get("connection").is_some_and(|v| v == "close");
        assert_eq!(close, n == 3, "request {n}");
    }
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    // Each new connection gets its own count.
    let (mut send, _task) = h1_conn(p.addr).await;
    let resp = send.send_request(get_a()).await.unwrap();
    assert!(!resp.headers().contains_key("connection"));
}

#[tokio::test]
async fn keep_alive_bounds_idle_client_connections() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p =
        proxy(with_settings(base.clone(), Settings { keepalive_secs: Some(1), ..Settings::default() })).await;
    let (mut send, task) = h1_conn(p.addr).await;
    assert_eq!(send.send_request(get_a()).await.unwrap().status(), 200);
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("an idle connection is closed").unwrap();

    // 0: one request per connection.
    p.proxy
        .publish(with_settings(base.clone(), Settings { keepalive_secs: Some(0), ..Settings::default() }))
        .unwrap();
    let (mut send, task) = h1_conn(p.addr).await;
    let resp = send.send_request(get_a()).await.unwrap();
    assert_eq!(resp.headers()["connection"], "close");
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("closed after one request").unwrap();

    // A long keep-alive leaves the connection open across a pause.
    p.proxy
        .publish(with_settings(base, Settings { keepalive_secs: Some(60), ..Settings::default() }))
        .unwrap();
    let (mut send, task) = h1_conn(p.addr).await;
    assert_eq!(send.send_request(get_a()).await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!task.is_finished());
    send.ready().await.unwrap();
    assert_eq!(send.send_request(get_a()).await.unwrap().status(), 200);
}

/// The idle deadline restarts with every request on a connection (each connection keeps one
/// lazily re-armed timer): requests spaced closer than the keep-alive timeout keep it open well
/// past that timeout, and it closes once it has idled for the timeout.
#[tokio::test]
async fn keep_alive_deadline_restarts_with_each_request() {
    let e = echo("e").await;
    let settings = Settings { keepalive_secs: Some(1), ..Settings::default() };
    let p = proxy(with_settings(table().host("a.test").prefix("/", &to(&e)).build(), settings)).await;
    let (mut send, task) = h1_conn(p.addr).await;
    let opened = Instant::now();
    for _ in 0..6 {
        send.ready().await.expect("the connection is still open");
        assert_eq!(send.send_request(get_a()).await.unwrap().status(), 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!task.is_finished(), "open after {:?} of requests every 500 ms", opened.elapsed());
    let idle = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("an idle connection is closed").unwrap();
    assert!(idle.elapsed() >= Duration::from_millis(400), "closed too early: {:?}", idle.elapsed());
}

#[tokio::test]
async fn upstream_keepalive_off_opens_a_connection_per_request() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p = proxy(base.clone()).await;
    // The echo reports the proxy's side of the upstream connection: one port means one connection.
    let mut ports = BTreeSet::new();
    for _ in 0..4 {
        ports.insert(p.get("a.test", "/").await.echo().remote_addr);
    }
    assert_eq!(ports.len(), 1, "pooled: {ports:?}");

    p.proxy
        .publish(with_settings(base, Settings { upstream_keepalive: Some(false), ..Settings::default() }))
        .unwrap();
    let mut ports = BTreeSet::new();
    for _ in 0..4 {
        let s = p.get("a.test", "/").await.echo();
        assert_eq!(s.headers.get("connection").map(String::as_str), Some("close"));
        ports.insert(s.remote_addr);
    }
    assert_eq!(ports.len(), 4, "one connection per request: {ports:?}");
}

#[tokio::test]
async fn headers_with_underscores_are_dropped_unless_enabled() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p = proxy(base.clone()).await;
    let headers = [("x_user", "mallory"), ("x-user", "alice")];
    let s = seen(&p, &headers).await;
    assert!(!s.headers.contains_key("x_user"), "{:?}", s.headers);
    assert_eq!(s.headers["x-user"], "alice");

    let on = Settings { underscores_in_headers: Some(true), ..Settings::default() };
    p.proxy.publish(with_settings(base, on)).unwrap();
    assert_eq!(seen(&p, &headers).await.headers["x_user"], "mallory");
}

#[tokio::test]
async fn the_access_log_has_one_json_line_per_request_with_the_selected_fields() {
    let e = echo("e").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let field = |key: &str, template: &str, bare: bool| LogField {
        key: key.into(),
        value: template.parse().unwrap(),
        bare,
    };
    let settings = Settings {
        access_log: Some(vec![
            field("client", "$remote_addr", false),
            field("request", "$request", false),
            field("status", "$status", true),
            field("upstream", "$upstream_addr", false),
            field("ua", "$http_user_agent", false),
            field("ingress", "$namespace/$ingress_name", false),
            field("took", "$request_time", true),
        ]),
        // Requests no route took are logged only with `enable-access-log-for-default-backend`.
        logging: weir_dataplane::model::logging::LogSettings { default_backend: true, ..Default::default() },
        ..forwarded(&["127.0.0.0/8"], false)
    };
    let config = ProxyConfig { access_log_output: Output::File(path.clone()), ..test_config() };
    let p = proxy_with(config, with_settings(table().host("a.test").prefix("/", &to(&e)).build(), settings))
        .await;
    let req =
        p.req("a.test", "/x?y=1").header("user-agent", "probe/1").header("x-forwarded-for", "203.0.113.9");
    assert_eq!(p.send(req.body(empty()).unwrap()).await.status, 200);
    p.get("nowhere.test", "/").await.assert_local(404);

    let lines = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() >= 2 {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("two access-log lines");
    let lines: Vec<serde_json::Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let first = &lines[0];
    assert_eq!(first["client"], "203.0.113.9");
    assert_eq!(first["request"], "GET /x?y=1 HTTP/1.1");
    assert_eq!(first["status"], 200);
    assert_eq!(first["upstream"], e.addr.to_string());
    assert_eq!(first["ua"], "probe/1");
    assert_eq!(first["ingress"], "test/e");
    assert!(first["took"].as_f64().unwrap() >= 0.0);
    assert_eq!(first.as_object().unwrap().len(), 7, "only the selected fields: {first}");
    // Answered by the proxy: no upstream.
    assert_eq!(lines[1]["status"], 404);
    assert_eq!(lines[1]["upstream"], "");
}

#[tokio::test]
async fn use_proxy_protocol_from_the_settings_applies_to_new_connections() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p = proxy(base.clone()).await;
    assert_eq!(p.get("a.test", "/").await.status, 200);
    p.proxy
        .publish(with_settings(base, Settings { proxy_protocol: Some(true), ..Settings::default() }))
        .unwrap();
    // A connection without the header is closed; one with it is served as the client it names.
    let (mut send, _task) = h1_conn(p.addr).await;
    assert!(send.send_request(get_a()).await.is_err());
    let mut tcp = TcpStream::connect(p.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tcp, b"PROXY TCP4 198.51.100.4 127.0.0.1 4000 80\r\n")
        .await
        .unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, TestBody>(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    let resp = send.send_request(get_a()).await.unwrap();
    let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    let seen: weir_dataplane::echo::EchoResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen.headers["x-real-ip"], "198.51.100.4");
}

#[tokio::test]
async fn worker_shutdown_timeout_is_the_drain_time() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let config = ProxyConfig {
        drain_timeout: Duration::from_secs(60),
        upstream_timeout: Duration::from_secs(60),
        ..test_config()
    };
    let short = Settings { drain_secs: Some(1), ..Settings::default() };
    let mut p = proxy_with(config, with_settings(base, short)).await;
    let slow = p.req("a.test", "/").header("x-echo-delay-ms", "30000").body(empty()).unwrap();
    let in_flight = tokio::spawn(async move { client().request(slow).await.map(|r| r.status()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.shutdown();
    // The flag says a minute and the request takes 30 s: the table's setting ends the drain
    // after a second.
    let task = p.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("drained by the setting")
        .unwrap()
        .unwrap();
    in_flight.abort();
}

/// Settings travel with the table through an incremental publish too
/// ([`weir_dataplane::proxy::Proxy::publish_changes`] naming no host nor backend): the
/// effective configuration is built again from the new table's settings.
#[tokio::test]
async fn an_incremental_publish_applies_changed_settings() {
    use weir_dataplane::model::changes::TableChanges;
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p = proxy(base.clone()).await;
    assert_eq!(seen(&p, &[CHAIN]).await.headers["x-real-ip"], "127.0.0.1");

    let trusted = with_settings(base.clone(), forwarded(&["127.0.0.0/8"], false));
    p.proxy.publish_changes(&trusted, Some(&TableChanges::default())).unwrap();
    assert_eq!(seen(&p, &[CHAIN]).await.headers["x-real-ip"], "10.0.0.5");

    p.proxy.publish_changes(&base, Some(&TableChanges::default())).unwrap();
    assert_eq!(seen(&p, &[CHAIN]).await.headers["x-real-ip"], "127.0.0.1", "back to the defaults");
}

/// A backend whose answers carry what nginx hides by default and what `hide-headers` names.
async fn chatty_backend() -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = service_fn(|_req: http::Request<hyper::body::Incoming>| async move {
                    http::Response::builder()
                        .header("server", "Apache/2.4.1 (Unix)")
                        .header("x-powered-by", "PHP/5.3")
                        .header("x-accel-redirect", "/internal/file")
                        .header("x-kept", "yes")
                        .body(Full::new(bytes::Bytes::from_static(b"ok")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn upstream_server_and_nginx_instructions_are_hidden_as_nginx_does() {
    let addr = chatty_backend().await;
    let base = table().host("a.test").prefix("/", &backend("chatty", &[addr])).build();
    let p = proxy(base.clone()).await;
    let names = |r: &Resp| {
        ["server", "x-powered-by", "x-accel-redirect", "x-kept"]
            .into_iter()
            .filter(|n| r.headers.contains_key(*n))
            .collect::<Vec<_>>()
    };
    // nginx's defaults (`allow-backend-server-header: false`).
    let r = p.get("a.test", "/").await;
    assert_eq!((r.status, names(&r)), (StatusCode::OK, vec!["x-powered-by", "x-kept"]));
    // `hide-headers` and `allow-backend-server-header`, published without a restart.
    let settings = Settings {
        hide_headers: vec!["x-powered-by".into()],
        allow_backend_server_header: Some(true),
        ..Settings::default()
    };
    p.proxy.publish(with_settings(base, settings)).unwrap();
    let r = p.get("a.test", "/").await;
    assert_eq!(names(&r), ["server", "x-kept"]);
    assert_eq!(r.headers["server"], "Apache/2.4.1 (Unix)");
}

#[tokio::test]
async fn the_original_uri_goes_upstream_when_asked() {
    let e = echo("e").await;
    let base = table().host("a.test").prefix("/", &to(&e)).build();
    let p = proxy(base.clone()).await;
    let seen = p.get("a.test", "/shop/items?page=2&q=a%20b").await.echo();
    assert!(!seen.headers.contains_key("x-original-uri"), "off by default, as ingress-nginx");
    let on = Settings { original_uri_header: Some(true), ..Settings::default() };
    p.proxy.publish(with_settings(base, on)).unwrap();
    let seen = p.get("a.test", "/shop/items?page=2&q=a%20b").await.echo();
    assert_eq!(seen.headers["x-original-uri"], "/shop/items?page=2&q=a%20b");
    // A client cannot choose it.
    let req = p.req("a.test", "/real").header("x-original-uri", "/forged").body(empty()).unwrap();
    assert_eq!(p.send(req).await.echo().headers["x-original-uri"], "/real");
}
