//! Gateway listeners over real sockets: `weir serve --manifests` with HTTPS listeners
//! (`tls.mode: Terminate`) and HTTPRoutes, `weir echo` backends on loopback, and curl as the
//! client (`--resolve` to weir's ports, `--cacert` with the CA of the certificate the listener
//! must serve: a handshake with any other certificate fails). Each test cites the Gateway API
//! field documentation (`apis/v1/gateway_types.go`) or conformance test it checks.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;

mod support_gateway;
mod support_proc;

use support_gateway::{CLASS, Ca, echo, have_curl, service, wait_until, write};
use support_proc::spawn_serve;

/// A CA and a `kubernetes.io/tls` Secret `namespace/name` with a leaf it signed for `names`:
/// (CA PEM, Secret YAML).
fn tls_secret(namespace: &str, name: &str, names: &[&str]) -> (String, String) {
    let ca = Ca::new(&format!("{namespace}/{name}"));
    let (cert, key) = ca.leaf(names);
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n---\n",
        b64(cert),
        b64(key),
    );
    (ca.pem, secret)
}

/// What curl saw: `Ok((status, echo name))` or `Err(curl's message)` (a failed handshake).
type Seen = Result<(u16, String), String>;

/// `curl` to `host` on weir's `addr`: over TLS verified against `ca` when given, else plain.
fn curl(addr: SocketAddr, host: &str, path: &str, ca: Option<&Path>) -> Seen {
    let scheme = if ca.is_some() { "https" } else { "http" };
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(["--resolve", &format!("{host}:{}:127.0.0.1", addr.port())]);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    let out = cmd.arg(format!("{scheme}://{host}:{}{path}", addr.port())).output().unwrap();
    answer(out)
}

/// Retries `probe` until it returns `want`, or fails after 20 s with the last answer.
fn wait_for(what: &str, want: &Seen, probe: impl Fn() -> Seen) {
    wait_until(&format!("{what}: want {want:?}"), probe, |got| got == want);
}

fn ok(name: &str) -> Seen {
    Ok((200, name.to_string()))
}

fn not_found() -> Seen {
    Ok((404, "-".to_string()))
}

/// The Gateway `default/name` of class `weir` with `listeners` (YAML list items).
fn gateway(name: &str, listeners: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  gatewayClassName: weir\n  listeners:\n{listeners}---\n"
    )
}

/// Writes the CA `pem` to `dir/name.pem`.
fn ca_file(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, pem).unwrap();
    path
}

/// `ListenerTLSConfig.certificateRefs` and port isolation: an HTTPS listener serves its
/// certificate for its hostname and routes its HTTPRoutes over TLS only; an HTTP listener's
/// routes answer plain HTTP only (conformance `HTTPRouteHTTPSListener`). A Secret in another
/// namespace is refused without a ReferenceGrant (`GatewaySecretMissingReferenceGrant`: `weir
/// check` reports `RefNotPermitted`) and served once one is written
/// (`GatewaySecretReferenceGrantSpecific`).
#[test]
fn https_listener_serves_its_certificate_and_routes_only_over_tls() {
    if !have_curl() {
        return;
    }
    let (_a, a) = echo("backend-a");
    let (_b, b) = echo("backend-b");
    let dir = tempfile::tempdir().unwrap();
    let cas = tempfile::tempdir().unwrap();
    let (site_ca, site) = tls_secret("default", "site-tls", &["secure.example.com"]);
    let (wild_ca, wild) = tls_secret("certs", "wild-tls", &["*.x.example.com", "deep.b.x.example.com"]);
    let site_ca = ca_file(cas.path(), "site", &site_ca);
    let wild_ca = ca_file(cas.path(), "wild", &wild_ca);
    let gateway = gateway(
        "edge",
        r#"  - {name: http, port: 80, protocol: HTTP}
  - {name: https, port: 443, protocol: HTTPS, hostname: secure.example.com, tls: {certificateRefs: [{name: site-tls}]}}
  - {name: https-x, port: 443, protocol: HTTPS, hostname: "*.x.example.com", tls: {certificateRefs: [{name: wild-tls, namespace: certs}]}}
"#,
    );
    let routes = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: secure, namespace: default}
spec: {parentRefs: [{name: edge, sectionName: https}], rules: [{backendRefs: [{name: a, port: 80}]}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: plain, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [secure.example.com]
  rules: [{matches: [{path: {type: PathPrefix, value: /plain}}], backendRefs: [{name: b, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: x, namespace: default}
spec: {parentRefs: [{name: edge, sectionName: https-x}], rules: [{backendRefs: [{name: b, port: 80}]}]}
---
"#;
    let services = format!("{}{}", service("a", a), service("b", b));
    write(dir.path(), "gateway.yaml", &format!("{CLASS}{gateway}{routes}{services}{site}{wild}"));

    // Without a grant, `weir check` names the refused reference and its reason.
    let check = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "--manifests"])
        .arg(dir.path())
        .output()
        .unwrap();
    let report =
        format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(!check.status.success(), "{report}");
    assert!(report.contains("https-x") && report.contains("RefNotPermitted"), "{report}");

    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["http", "https"]);
    let (http, https) = (addrs[0], addrs[1]);
    // The listener's certificate, by SNI; its route over TLS.
    wait_for("HTTPS secure.example.com /", &ok("backend-a"), || {
        curl(https, "secure.example.com", "/", Some(&site_ca))
    });
    // Over TLS the HTTP listener's route (/plain) is not there: the HTTPS route's `/` answers.
    assert_eq!(curl(https, "secure.example.com", "/plain", Some(&site_ca)), ok("backend-a"));
    // Over plain HTTP, the HTTP listener's route only; the HTTPS route's `/` is not reachable.
    assert_eq!(curl(http, "secure.example.com", "/plain", None), ok("backend-b"));
    assert_eq!(curl(http, "secure.example.com", "/", None), not_found());
    // The refused certificate is not served: the handshake for *.x.example.com does not verify.
    let refused = curl(https, "a.x.example.com", "/", Some(&wild_ca));
    assert!(refused.is_err(), "{refused:?}");

    // A ReferenceGrant in the Secret's namespace: served, for one label and more.
    let grant = r#"apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways, namespace: certs}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]
  to: [{group: "", kind: Secret, name: wild-tls}]
"#;
    write(dir.path(), "grant.yaml", grant);
    wait_for("HTTPS a.x.example.com / after the grant", &ok("backend-b"), || {
        curl(https, "a.x.example.com", "/", Some(&wild_ca))
    });
    assert_eq!(curl(https, "deep.b.x.example.com", "/", Some(&wild_ca)), ok("backend-b"));
    // The site certificate still serves its own name (the longest matching SNI).
    assert_eq!(curl(https, "secure.example.com", "/", Some(&site_ca)), ok("backend-a"));
}

/// A ListenerSet's HTTPS listener (GEP-1713, conformance `ListenerSetReferenceGrant`): it serves
/// a certificate of the ListenerSet's own namespace without a ReferenceGrant, for its route
/// attached by `kind: ListenerSet`, over TLS only; a Secret of another namespace needs a grant
/// `from` kind ListenerSet: one for Gateways of that namespace does not count ("ReferenceGrants
/// applied to a Gateway are not inherited by child ListenerSets").
#[test]
fn listenerset_https_listener_serves_its_certificate_with_grants_of_its_own() {
    if !have_curl() {
        return;
    }
    let (_a, a) = echo("backend-a");
    let dir = tempfile::tempdir().unwrap();
    let cas = tempfile::tempdir().unwrap();
    let (app_ca, app) = tls_secret("apps", "app-tls", &["app.example.com"]);
    let (borrowed_ca, borrowed) = tls_secret("certs", "borrowed-tls", &["borrowed.example.com"]);
    let app_ca = ca_file(cas.path(), "app", &app_ca);
    let borrowed_ca = ca_file(cas.path(), "borrowed", &borrowed_ca);
    let gateway = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: default}
spec:
  gatewayClassName: weir
  allowedListeners: {namespaces: {from: All}}
  listeners: [{name: http, port: 80, protocol: HTTP, hostname: gw.example.com}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team, namespace: apps}
spec:
  parentRef: {name: edge, namespace: default}
  listeners:
  - {name: app, port: 443, protocol: HTTPS, hostname: app.example.com, tls: {certificateRefs: [{name: app-tls}]}}
  - {name: borrowed, port: 443, protocol: HTTPS, hostname: borrowed.example.com, tls: {certificateRefs: [{name: borrowed-tls, namespace: certs}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: app, namespace: apps}
spec: {parentRefs: [{kind: ListenerSet, name: team}], rules: [{backendRefs: [{name: a, port: 80}]}]}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways-of-apps, namespace: certs}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: apps}]
  to: [{group: "", kind: Secret}]
---
"#;
    let service = service("a", a).replace("namespace: default", "namespace: apps");
    write(dir.path(), "gateway.yaml", &format!("{CLASS}{gateway}{service}{app}{borrowed}"));

    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["http", "https"]);
    let (http, https) = (addrs[0], addrs[1]);
    wait_for("HTTPS app.example.com / through the ListenerSet", &ok("backend-a"), || {
        curl(https, "app.example.com", "/", Some(&app_ca))
    });
    // The route is on the HTTPS listeners only: over plain HTTP no listener takes the name.
    assert_eq!(curl(http, "app.example.com", "/", None), not_found());
    // The grant is for Gateways of apps, not its ListenerSets: the handshake does not verify.
    let refused = curl(https, "borrowed.example.com", "/", Some(&borrowed_ca));
    assert!(refused.is_err(), "{refused:?}");

    let grant = r#"apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: listenersets-of-apps, namespace: certs}
spec:
  from: [{group: gateway.networking.k8s.io, kind: ListenerSet, namespace: apps}]
  to: [{group: "", kind: Secret, name: borrowed-tls}]
"#;
    write(dir.path(), "grant.yaml", grant);
    wait_for("HTTPS borrowed.example.com / after the ListenerSet's grant", &ok("backend-a"), || {
        curl(https, "borrowed.example.com", "/", Some(&borrowed_ca))
    });
    assert_eq!(curl(https, "app.example.com", "/", Some(&app_ca)), ok("backend-a"));
}

/// Listener isolation (`Listener` doc, "Listeners that are distinct only by Hostname";
/// conformance `GatewayHTTPListenerIsolation`): a request is served by the routes of the most
/// specific listener whose hostname matches it, and by no other listener's, even when a route
/// of a less specific listener names its host; a more specific listener without routes
/// answers 404.
#[test]
fn http_listener_isolation_most_specific_listener_only() {
    if !have_curl() {
        return;
    }
    let (_a, a) = echo("backend-a");
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::from(CLASS);
    yaml.push_str(&gateway(
        "iso",
        r#"  - {name: empty-hostname, port: 80, protocol: HTTP}
  - {name: wildcard-example-com, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - {name: wildcard-foo-example-com, port: 80, protocol: HTTP, hostname: "*.foo.example.com"}
  - {name: abc-foo-example-com, port: 80, protocol: HTTP, hostname: abc.foo.example.com}
  - {name: quiet, port: 80, protocol: HTTP, hostname: quiet.example.com}
"#,
    ));
    // As in the conformance manifest: every route names every host; isolation keeps each to
    // its own listener's.
    for listener in
        ["empty-hostname", "wildcard-example-com", "wildcard-foo-example-com", "abc-foo-example-com"]
    {
        yaml.push_str(&format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {listener}, namespace: default}}
spec:
  parentRefs: [{{name: iso, sectionName: {listener}}}]
  hostnames: [bar.com, "*.example.com", "*.foo.example.com", abc.foo.example.com]
  rules: [{{matches: [{{path: {{type: PathPrefix, value: /{listener}}}}}], backendRefs: [{{name: a, port: 80}}]}}]
---
"#
        ));
    }
    yaml.push_str(&service("a", a));
    write(dir.path(), "iso.yaml", &yaml);
    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["http"]);
    let http = addrs[0];
    wait_for("bar.com /empty-hostname", &ok("backend-a"), || curl(http, "bar.com", "/empty-hostname", None));
    let paths = ["empty-hostname", "wildcard-example-com", "wildcard-foo-example-com", "abc-foo-example-com"];
    for (host, served) in [
        ("bar.com", "empty-hostname"),
        ("bar.example.com", "wildcard-example-com"),
        ("bar.foo.example.com", "wildcard-foo-example-com"),
        ("abc.foo.example.com", "abc-foo-example-com"),
    ] {
        for path in paths {
            let want = if path == served { ok("backend-a") } else { not_found() };
            assert_eq!(curl(http, host, &format!("/{path}"), None), want, "{host} /{path}");
        }
    }
    // The listener quiet.example.com has no routes: its requests reach no other listener's.
    for path in paths {
        assert_eq!(curl(http, "quiet.example.com", &format!("/{path}"), None), not_found(), "/{path}");
    }
}

/// `curl` over TLS with SNI `sni` (verified against `ca`) sending `Host: host` (`:authority` on
/// HTTP/2), HTTP/1.1 or HTTP/2: a client whose connection's name is not the request's.
fn curl_sni(https: SocketAddr, sni: &str, host: &str, h2: bool, ca: &Path) -> Seen {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .arg(if h2 { "--http2" } else { "--http1.1" })
        .args(["--resolve", &format!("{sni}:{}:127.0.0.1", https.port())])
        .arg("--cacert")
        .arg(ca)
        .args(["-H", &format!("Host: {host}")])
        .arg(format!("https://{sni}:{}/", https.port()))
        .output()
        .unwrap();
    answer(out)
}

/// Misdirected requests (`Listener.hostname`, citing RFC 7540 §9.1.2), through `weir serve`
/// and curl over HTTP/1.1 and HTTP/2: with SNI `a.example.com` (listener `a`), `Host:
/// b.example.com` belongs to listener `*.example.com` and gets 421 ("If another Listener does
/// match the Host, the Gateway SHOULD return a 421"); `Host: b.other.test` belongs to no
/// listener and gets 404 ("MUST return a 404"); with SNI `x.example.com` (listener
/// `*.example.com`), `Host: a.example.com` has a more specific listener and gets 421.
#[test]
fn https_listener_misdirected_requests_get_421_and_hosts_of_no_listener_404() {
    if !have_curl() {
        return;
    }
    let (_a, a) = echo("backend-a");
    let (_w, w) = echo("backend-wild");
    let dir = tempfile::tempdir().unwrap();
    let cas = tempfile::tempdir().unwrap();
    let (a_ca, a_secret) = tls_secret("default", "a-tls", &["a.example.com"]);
    let (wild_ca, wild_secret) = tls_secret("default", "wild-tls", &["*.example.com"]);
    let a_ca = ca_file(cas.path(), "a", &a_ca);
    let wild_ca = ca_file(cas.path(), "wild", &wild_ca);
    let gateway = gateway(
        "edge",
        r#"  - {name: a, port: 443, protocol: HTTPS, hostname: a.example.com, tls: {certificateRefs: [{name: a-tls}]}}
  - {name: wild, port: 443, protocol: HTTPS, hostname: "*.example.com", tls: {certificateRefs: [{name: wild-tls}]}}
"#,
    );
    let routes = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: a, namespace: default}
spec: {parentRefs: [{name: edge, sectionName: a}], rules: [{backendRefs: [{name: a, port: 80}]}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: wild, namespace: default}
spec: {parentRefs: [{name: edge, sectionName: wild}], rules: [{backendRefs: [{name: w, port: 80}]}]}
---
"#;
    let services = format!("{}{}", service("a", a), service("w", w));
    write(dir.path(), "gateway.yaml", &format!("{CLASS}{gateway}{routes}{services}{a_secret}{wild_secret}"));
    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["http", "https"]);
    let https = addrs[1];
    wait_for("HTTPS a.example.com", &ok("backend-a"), || {
        curl_sni(https, "a.example.com", "a.example.com", false, &a_ca)
    });
    for h2 in [false, true] {
        let misdirected = Ok((421, "-".to_string()));
        assert_eq!(curl_sni(https, "a.example.com", "a.example.com", h2, &a_ca), ok("backend-a"), "h2={h2}");
        assert_eq!(curl_sni(https, "a.example.com", "b.example.com", h2, &a_ca), misdirected, "h2={h2}");
        assert_eq!(curl_sni(https, "a.example.com", "b.other.test", h2, &a_ca), not_found(), "h2={h2}");
        assert_eq!(
            curl_sni(https, "x.example.com", "y.example.com", h2, &wild_ca),
            ok("backend-wild"),
            "h2={h2}"
        );
        assert_eq!(curl_sni(https, "x.example.com", "a.example.com", h2, &wild_ca), misdirected, "h2={h2}");
    }
}

/// A TLS backend: `openssl s_server -WWW` serving the file `who` (its name) with a certificate
/// for `names` signed by `ca`; killed on drop.
struct TlsBackend {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        let _ = self.child.kill(); // best effort: it may have exited
        let _ = self.child.wait();
    }
}

fn tls_backend(name: &str, ca: &Ca, names: &[&str]) -> TlsBackend {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.leaf(names);
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), key).unwrap();
    std::fs::write(dir.path().join("who"), name).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-WWW", "-cert", "cert.pem", "-key", "key.pem", "-accept"])
        .arg(addr.to_string())
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "openssl s_server {name} did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
    TlsBackend { child, addr, _dir: dir }
}

/// `curl --cacert CA https://host/who` to weir's HTTPS socket: the backend's name, or curl's
/// error (a certificate the CA did not sign fails the handshake).
fn who(https: SocketAddr, host: &str, ca: &Path) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("{host}:{}:127.0.0.1", https.port())])
        .arg(format!("https://{host}:{}/who", https.port()))
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// TLSRoute on a TLS listener (`tls.mode: Passthrough`; conformance
/// `TLSRouteSimpleSameNamespace`): connections whose SNI is one of the route's names
/// (intersected with the listener's `*.pass.example.com`, a suffix) reach the backends
/// undecrypted, so the client sees the backend's certificate; `backendRefs` weights 3:1 split
/// the connections. On the same socket, HTTPS listeners' names are terminated by weir, also one
/// under the TLS listener's wildcard (the more specific listener).
#[test]
fn tlsroute_passthrough_reaches_weighted_backends_with_their_certificates() {
    if !have_curl() || !support_proc::have("openssl", "scripts/test.sh install") {
        return;
    }
    let ca = Ca::new("passthrough backends");
    let names = ["a.pass.example.com", "x.deep.pass.example.com"];
    let one = tls_backend("one", &ca, &names);
    let two = tls_backend("two", &ca, &names);
    let (_web, web) = echo("backend-web");
    let dir = tempfile::tempdir().unwrap();
    let cas = tempfile::tempdir().unwrap();
    let backends_ca = ca_file(cas.path(), "backends", &ca.pem);
    let (web_ca, web_secret) = tls_secret("default", "web-tls", &["web.example.com"]);
    let web_ca = ca_file(cas.path(), "web", &web_ca);
    let (inner_ca, inner_secret) = tls_secret("default", "inner-tls", &["inner.deep.pass.example.com"]);
    let inner_ca = ca_file(cas.path(), "inner", &inner_ca);
    let listeners = r#"  - {name: tls, port: 443, protocol: TLS, hostname: "*.pass.example.com", tls: {mode: Passthrough}}
  - {name: https, port: 443, protocol: HTTPS, hostname: web.example.com, tls: {certificateRefs: [{name: web-tls}]}}
  - {name: inner, port: 443, protocol: HTTPS, hostname: inner.deep.pass.example.com, tls: {certificateRefs: [{name: inner-tls}]}}
"#;
    let routes = r#"apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: pass, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: tls}]
  hostnames: [a.pass.example.com, "*.deep.pass.example.com"]
  rules: [{backendRefs: [{name: one, port: 80, weight: 3}, {name: two, port: 80, weight: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: gone, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: tls}]
  hostnames: [b.pass.example.com]
  rules: [{backendRefs: [{name: missing, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: default}
spec: {parentRefs: [{name: edge, sectionName: https}, {name: edge, sectionName: inner}], rules: [{backendRefs: [{name: web, port: 80}]}]}
---
"#;
    let services = format!("{}{}{}", service("one", one.addr), service("two", two.addr), service("web", web));
    let gateway = gateway("edge", listeners);
    write(
        dir.path(),
        "gateway.yaml",
        &format!("{CLASS}{gateway}{routes}{services}{web_secret}{inner_secret}"),
    );
    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["https"]);
    let https = addrs[0];

    let deadline = Instant::now() + Duration::from_secs(20);
    while who(https, "a.pass.example.com", &backends_ca).is_err() {
        assert!(Instant::now() < deadline, "{:?}", who(https, "a.pass.example.com", &backends_ca));
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    for i in 0..80 {
        let host = if i % 2 == 0 { "a.pass.example.com" } else { "x.deep.pass.example.com" };
        let name = who(https, host, &backends_ca).unwrap_or_else(|e| panic!("{host}: {e}"));
        *seen.entry(name).or_default() += 1;
    }
    let (n1, n2) = (seen.get("one").copied().unwrap_or(0), seen.get("two").copied().unwrap_or(0));
    assert_eq!(n1 + n2, 80, "{seen:?}");
    // 3:1 over 80 connections: both get some, and `one` more (the chance of either failing by
    // luck is below one in a million).
    assert!(n2 > 0 && n1 > n2, "{seen:?}");
    // The HTTPS listener's name on the same socket is terminated by weir with its certificate.
    assert_eq!(curl(https, "web.example.com", "/", Some(&web_ca)), ok("backend-web"));
    // An HTTPS listener's name under the TLS listener's wildcard is more specific: terminated
    // (`Listener` doc: the most specific hostname chooses the listener).
    assert_eq!(curl(https, "inner.deep.pass.example.com", "/", Some(&inner_ca)), ok("backend-web"));
    // A name neither listener has is terminated too (the default certificate): the backends'
    // CA does not verify it.
    assert!(who(https, "b.other.example.com", &backends_ca).is_err());
    // A TLSRoute whose only backendRef does not resolve: its connections are refused, not
    // terminated by weir (which, unverified, would answer an HTTP 404).
    let insecure = |host: &str| {
        let out = Command::new("curl")
            .args(["-sSk", "--max-time", "10", "-w", "\n%{http_code}"])
            .args(["--resolve", &format!("{host}:{}:127.0.0.1", https.port())])
            .arg(format!("https://{host}:{}/", https.port()))
            .output()
            .unwrap();
        answer(out)
    };
    assert_eq!(insecure("b.other.example.com").map(|(status, _)| status), Ok(404), "terminated by weir");
    assert!(insecure("b.pass.example.com").is_err(), "{:?}", insecure("b.pass.example.com"));
}

/// A plain TCP backend on loopback: answers each connection with `{name}:` and echoes every
/// byte it gets (threads that end with the test process).
fn tcp_echo(name: &'static str) -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                if conn.write_all(format!("{name}:").as_bytes()).is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// `openssl s_client` to weir's HTTPS socket with SNI `sni`, verifying the server's certificate
/// against `ca` (a failed verification fails the handshake): sends `send` over TLS and returns
/// what came back once it contains `want`, or openssl's errors (and what did come) when the
/// connection ends first or after 10 s.
fn tls_exchange(https: SocketAddr, sni: &str, ca: &Path, send: &str, want: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-verify_return_error",
            "-connect",
            &https.to_string(),
            "-servername",
            sni,
        ])
        .arg("-CAfile")
        .arg(ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(send.as_bytes()); // openssl may be gone already: its errors say why
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains(want) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(bytes) => got.extend(bytes),
            Err(_) => break, // the connection ended, or the time is up
        }
    }
    drop(stdin);
    let _ = child.kill(); // best effort: it may have exited
    let out = child.wait_with_output().unwrap();
    let got = String::from_utf8_lossy(&got).into_owned();
    if got.contains(want) { Ok(got) } else { Err(format!("{}{got}", String::from_utf8_lossy(&out.stderr))) }
}

/// TLSRoute termination (`TLSRouteModeTerminate`, conformance
/// `TLSRouteTerminateSimpleSameNamespace`) beside passthrough and HTTPS on one port
/// (`TLSRouteModeMixed`, `TLSRouteMixedTerminationSameNamespace`): a TLS client (openssl
/// s_client) verifying the `Terminate` listener's certificate reaches a plain TCP echo backend
/// through weir and gets its bytes back ("the reverse proxy passes unencrypted TCP packets",
/// GEP-2643); a `Passthrough` listener's name on the same socket still reaches its backend
/// undecrypted (the backend's certificate), an HTTPS listener's name is still served as HTTP;
/// a name of the `Terminate` listener that no route serves is refused. A `Terminate` listener
/// whose Secret does not exist serves nothing (its name gets the default certificate) while
/// the rest keeps serving.
#[test]
fn tlsroute_terminate_relays_plain_tcp_beside_passthrough_and_https() {
    if !have_curl() || !support_proc::have("openssl", "scripts/test.sh install") {
        return;
    }
    let tcp = tcp_echo("tcp-echo");
    let ca = Ca::new("passthrough backend");
    let pass_backend = tls_backend("one", &ca, &["pass.example.com"]);
    let (_web, web) = echo("backend-web");
    let dir = tempfile::tempdir().unwrap();
    let cas = tempfile::tempdir().unwrap();
    let backend_ca = ca_file(cas.path(), "backend", &ca.pem);
    let (tcp_ca, tcp_secret) = tls_secret("default", "tcp-tls", &["*.tcp.example.com", "broken.example.com"]);
    let tcp_ca = ca_file(cas.path(), "tcp", &tcp_ca);
    let (web_ca, web_secret) = tls_secret("default", "web-tls", &["web.example.com"]);
    let web_ca = ca_file(cas.path(), "web", &web_ca);
    let listeners = r#"  - {name: tls-terminate, port: 443, protocol: TLS, hostname: "*.tcp.example.com", tls: {mode: Terminate, certificateRefs: [{name: tcp-tls}]}}
  - {name: tls-passthrough, port: 443, protocol: TLS, hostname: pass.example.com, tls: {mode: Passthrough}}
  - {name: https, port: 443, protocol: HTTPS, hostname: web.example.com, tls: {certificateRefs: [{name: web-tls}]}}
  - {name: broken, port: 443, protocol: TLS, hostname: broken.example.com, tls: {mode: Terminate, certificateRefs: [{name: nope}]}}
"#;
    let routes = r#"apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: terminated, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: tls-terminate}, {name: edge, sectionName: broken}]
  hostnames: [a.tcp.example.com, broken.example.com]
  rules: [{backendRefs: [{name: tcp, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: passed, namespace: default}
spec:
  parentRefs: [{name: edge, sectionName: tls-passthrough}]
  hostnames: [pass.example.com]
  rules: [{backendRefs: [{name: one, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: default}
spec: {parentRefs: [{name: edge, sectionName: https}], rules: [{backendRefs: [{name: web, port: 80}]}]}
---
"#;
    let services =
        format!("{}{}{}", service("tcp", tcp), service("one", pass_backend.addr), service("web", web));
    let gateway = gateway("edge", listeners);
    write(dir.path(), "gateway.yaml", &format!("{CLASS}{gateway}{routes}{services}{tcp_secret}{web_secret}"));
    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["https"]);
    let https = addrs[0];

    let relayed =
        |sni: &str, send: &str| tls_exchange(https, sni, &tcp_ca, send, &format!("tcp-echo:{send}"));
    wait_until(
        "a.tcp.example.com relayed to the TCP echo",
        || relayed("a.tcp.example.com", "hello\n"),
        Result::is_ok,
    );
    assert_eq!(relayed("a.tcp.example.com", "second line\n"), Ok("tcp-echo:second line\n".to_string()));
    // Mixed on one socket: passthrough keeps the backend's own certificate and HTTP behind it;
    // the HTTPS listener's name is served by weir as HTTP.
    assert_eq!(who(https, "pass.example.com", &backend_ca), Ok("one".to_string()));
    assert_eq!(curl(https, "web.example.com", "/", Some(&web_ca)), ok("backend-web"));
    // A name of the Terminate listener no route has: refused, though its certificate covers it.
    let unrouted = relayed("b.tcp.example.com", "hello\n");
    assert!(unrouted.is_err(), "{unrouted:?}");
    // The listener whose certificate does not resolve is not served: its name gets the default
    // certificate, which the CA does not verify; the others above kept serving.
    let broken = relayed("broken.example.com", "hello\n");
    assert!(broken.is_err(), "{broken:?}");
}

/// curl's answer (run with `-w "\n%{http_code}"`): the status and the echo backend's name (`-`
/// for a body that is not the echo's), or curl's error.
fn answer(out: std::process::Output) -> Result<(u16, String), String> {
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    let name = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string))
        .unwrap_or_else(|| "-".to_string());
    Ok((code.parse().unwrap(), name))
}
