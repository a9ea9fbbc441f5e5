//! The `weir` binary as a user runs it: `check`, `dump`, and `serve` with hot reload, against
//! `weir echo` backends, over real sockets on loopback.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support_app;
mod support_proc;

use support_proc::{Log, Proc, WEIR, serve_args, spawn, spawn_logged, spawn_wrapped};

fn quickstart() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart/manifests")
}

#[test]
fn check_accepts_the_quickstart() {
    let out = Command::new(WEIR).args(["check", "--manifests"]).arg(quickstart()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("2 ingresses"), "{stdout}");
    assert!(stdout.contains("0 errors"), "{stdout}");
}

#[test]
fn check_reports_file_line_and_fails_on_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Service\nmetadata: [oops\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("ing.yaml"),
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: default}
spec:
  ingressClassName: weir
  rules:
  - host: a.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: missing, port: {number: 80}}}}
"#,
    )
    .unwrap();
    let out = Command::new(WEIR).args(["check", "--manifests"]).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "errors must fail the check:\n{stdout}");
    let bad = dir.path().join("bad.yaml");
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!("error: {}:", bad.display()))),
        "the broken file is named with a line:\n{stdout}"
    );
    assert!(stdout.contains("default/web") && stdout.contains("missing"), "{stdout}");
}

#[test]
fn dump_prints_the_table() {
    let out = Command::new(WEIR).args(["dump", "--manifests"]).arg(quickstart()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table: weir_dataplane::model::RouteTable = serde_saphyr::from_str(&stdout).unwrap();
    let hosts: Vec<String> = table.hosts.iter().map(|h| h.host.to_string()).collect();
    assert_eq!(hosts, ["demo.example.com", "*.apps.example.com"], "{stdout}");
    assert_eq!(table.default_backend.map(|b| b.to_string()).as_deref(), Some("demo/web:80"));
}

/// `weir check` and `weir dump` read ListenerSets (GEP-1713): the listener of one the Gateway
/// allows serves its route's host; one the Gateway does not allow (`allowedListeners` defaults
/// to none) is an error naming it and the reason (`NotAllowed`).
#[test]
fn check_and_dump_read_listenersets() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = |name: &str, allowed: &str, host: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: infra}}\n\
             spec:\n  gatewayClassName: weir\n{allowed}  listeners: [{{name: http, port: 80, protocol: HTTP, hostname: {host}}}]\n---\n"
        )
    };
    let set = |name: &str, parent: &str, host: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{name: {name}, namespace: apps}}\n\
             spec:\n  parentRef: {{name: {parent}, namespace: infra}}\n  listeners: [{{name: app, port: 80, protocol: HTTP, hostname: {host}}}]\n---\n"
        )
    };
    let text = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: weir}}\nspec: {{controllerName: weir.dev/gateway-controller}}\n---\n\
         {}{}{}{}\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: app, namespace: apps}}\n\
         spec:\n  parentRefs: [{{kind: ListenerSet, name: team}}]\n  rules: [{{backendRefs: [{{name: app, port: 80}}]}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: app, namespace: apps}}\nspec: {{ports: [{{port: 80}}]}}\n",
        gateway("edge", "  allowedListeners: {namespaces: {from: All}}\n", "gw.example.com"),
        gateway("closed", "", "closed.example.com"),
        set("team", "edge", "app.example.com"),
        set("refused", "closed", "refused.example.com"),
    );
    std::fs::write(dir.path().join("gateway.yaml"), text).unwrap();

    let out = Command::new(WEIR).args(["check", "--manifests"]).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "a ListenerSet not attached is an error:\n{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with(
            "error: ListenerSet apps/refused: not attached to Gateway infra/closed (NotAllowed)"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("apps/team"), "{stdout}");

    let out = Command::new(WEIR).args(["dump", "--manifests"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table: weir_dataplane::model::RouteTable = serde_saphyr::from_str(&stdout).unwrap();
    let hosts: Vec<String> = table.hosts.iter().map(|h| h.host.to_string()).collect();
    assert!(hosts.contains(&"app.example.com".to_string()), "{stdout}");
    assert!(!hosts.contains(&"refused.example.com".to_string()), "{stdout}");
}

#[test]
fn missing_manifest_dir_is_a_clear_error() {
    let out = Command::new(WEIR).args(["check", "--manifests", "/nonexistent/weir"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/weir"), "{stderr}");
}

/// `weir node` on a machine without the kernel tool its mode needs stops at once and names
/// the package, before touching anything (its PATH here holds no tool at all).
#[test]
fn node_without_its_kernel_tools_says_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().to_str().unwrap();
    // nftables mode needs no program (it speaks netlink): only the modes that run
    // iptables-restore can miss theirs. ipvs without ipset falls back to iptables mode first.
    for (mode, needs) in [
        ("iptables", "iptables-restore is not installed (Debian package iptables)"),
        ("ipvs", "iptables-restore is not installed (Debian package iptables)"),
    ] {
        let out = Command::new(WEIR)
            .args(["node", "--mode", mode, "--manifests", manifests, "--listen-admin", "127.0.0.1:0"])
            .env("PATH", dir.path())
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{mode}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needs), "{mode}: {stderr}");
    }
}

fn get(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let status = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn manifests(dir: &Path, backend: SocketAddr, path: &str) {
    let yaml = support_app::app_yaml(backend, path);
    // Write then rename, as editors and ConfigMap updates do.
    let tmp = dir.join(".app.yaml.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join("app.yaml")).unwrap();
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_routes_and_hot_reloads() {
    routes_and_hot_reloads("2");
}

/// `--threads 1` runs everything on one thread (a current-thread runtime, as the benchmarks run
/// weir): the same behaviour.
#[test]
fn serve_on_one_thread_routes_and_hot_reloads() {
    routes_and_hot_reloads("1");
}

fn routes_and_hot_reloads(threads: &str) {
    let (_echo, echo_addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "backend-a"], &["listen"]);
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), echo_addrs[0], "/v1");
    let manifests_dir = dir.path().to_str().unwrap();
    let (_weir, addrs) = spawn(&serve_args(manifests_dir, &["--threads", threads]), &["http", "admin"]);
    let (http, admin) = (addrs[0], addrs[1]);
    assert_eq!(get(admin, "x", "/healthz").0, 200);
    assert_eq!(get(admin, "x", "/readyz").0, 200);

    let (status, body) = get(http, "app.test", "/v1/users");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"name\":\"backend-a\""), "{body}");
    assert!(body.contains("\"path\":\"/v1/users\""), "{body}");
    assert_eq!(get(http, "app.test", "/v2").0, 404);

    // Edit the Ingress: /v1 disappears, /v2 appears.
    manifests(dir.path(), echo_addrs[0], "/v2");
    wait_until("the edited route to serve", || get(http, "app.test", "/v2").0 == 200);
    assert_eq!(get(http, "app.test", "/v1").0, 404);

    // A broken file is reported and the last good table keeps serving.
    std::fs::write(dir.path().join("app.yaml"), "kind: Ingress\nmetadata: [\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(http, "app.test", "/v2").0, 200, "last good table must keep serving");
    let metrics = get(admin, "x", "/metrics").1;
    assert!(metrics.contains("weir_manifest_errors 1"), "{metrics}");

    // Deleting the file removes its routes.
    std::fs::remove_file(dir.path().join("app.yaml")).unwrap();
    wait_until("the deleted route to go", || get(http, "app.test", "/v2").0 == 404);
}

/// `THP_enabled` of a process, from `/proc/PID/status` (Linux 5.0 and later; `None` before).
fn thp_enabled(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("THP_enabled:"))?;
    Some(line.split_whitespace().nth(1)? == "1")
}

/// `weir serve` keeps its heap off transparent huge pages unless `--transparent-huge-pages`
/// says otherwise: with them, an idle proxy's resident memory per connection doubled
/// (bench/RESULTS.md, issue 23).
#[test]
fn serve_disables_transparent_huge_pages_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let Some(this) = thp_enabled(std::process::id()) else {
        assert_ne!(
            std::env::var("WEIR_REQUIRE_ALL").as_deref(),
            Ok("1"),
            "no THP_enabled in /proc/self/status"
        );
        eprintln!("skipping: this kernel's /proc/PID/status has no THP_enabled (before Linux 5.0)");
        return;
    };
    assert!(this, "the test process itself has THP disabled: nothing to tell apart");
    let manifests = dir.path().to_str().unwrap();
    let (weir, _) = spawn(&serve_args(manifests, &[]), &["http"]);
    assert_eq!(thp_enabled(weir.0.id()), Some(false), "weir serve left transparent huge pages on");
    drop(weir);
    let (weir, _) = spawn(&serve_args(manifests, &["--transparent-huge-pages"]), &["http"]);
    assert_eq!(thp_enabled(weir.0.id()), Some(true), "--transparent-huge-pages did not keep them on");
}

/// `weir_runtime_alive_tasks` on a real `weir serve`'s `/metrics`: client connections are tasks
/// while open, and the count comes back down when they close (what the soak benchmark samples to
/// see task leaks).
#[test]
fn metrics_count_the_tasks_of_open_connections() {
    let (_echo, echo_addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "backend-a"], &["listen"]);
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), echo_addrs[0], "/");
    let (_weir, addrs) = spawn(&serve_args(dir.path().to_str().unwrap(), &[]), &["http", "admin"]);
    let (http, admin) = (addrs[0], addrs[1]);
    let tasks = || {
        let (status, text) = get(admin, "x", "/metrics");
        assert_eq!(status, 200, "{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("weir_runtime_alive_tasks "))
            .unwrap_or_else(|| panic!("{text}"));
        line.rsplit(' ').next().and_then(|v| v.parse::<i64>().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    assert_eq!(get(http, "app.test", "/").0, 200);
    let idle = tasks();
    assert!(idle > 0, "{idle}");
    let open: Vec<std::net::TcpStream> =
        (0..20).map(|_| std::net::TcpStream::connect(http).unwrap()).collect();
    // `idle` may still count a few short-lived tasks (the connection of the request above
    // while it closes, the scrape's own): allow five of them to end in between.
    let peak = std::cell::Cell::new(0);
    wait_until("a task per open connection", || {
        peak.set(peak.get().max(tasks()));
        peak.get() >= idle + 15
    });
    drop(open);
    wait_until("the connections' tasks to end", || tasks() <= peak.get() - 15);
}

/// A CA and a leaf for `app.test`, made now: (CA PEM, Secret manifest with the leaf).
fn tls_secret(name: &str) -> (String, String) {
    use base64::Engine as _;
    let (ca, leaf, key) = tls_pair(name);
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        b64(leaf),
        b64(key),
    );
    (ca, secret)
}

/// A CA and a leaf for `app.test`, made now: (CA PEM, leaf PEM, key PEM).
fn tls_pair(name: &str) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Distinct subjects: a leaf whose issuer equals its subject looks self-signed to clients.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} test CA"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["app.test".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca.pem(), leaf.pem(), key.serialize_pem())
}

fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `curl --cacert CA https://app.test:PORT/PATH`: (exit ok, body).
fn curl_https(https: SocketAddr, ca: &Path, path: &str) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--http2", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("app.test:{}:127.0.0.1", https.port())])
        .arg(format!("https://app.test:{}{path}", https.port()))
        .output()
        .unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

/// Whether curl is installed; without it the test is skipped with a reason, or fails when
/// `WEIR_REQUIRE_ALL=1` (CI).
fn have_curl() -> bool {
    have("curl")
}

/// Whether `tool` is installed (see [`have_curl`]).
fn have(tool: &str) -> bool {
    support_proc::have(tool, "scripts/test.sh install")
}

#[test]
fn serve_terminates_tls_redirects_and_rotates_the_secret() {
    if !have_curl() {
        return;
    }
    let (_echo, echo_addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "backend-a"], &["listen"]);
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), echo_addrs[0], "/");
    // The same Ingress, now with TLS for app.test.
    let app = std::fs::read_to_string(dir.path().join("app.yaml")).unwrap();
    let app = app.replace("  rules:\n", "  tls:\n  - hosts: [app.test]\n    secretName: app-tls\n  rules:\n");
    write_atomic(&dir.path().join("app.yaml"), &app);
    let (ca1, secret1) = tls_secret("app-tls");
    let (ca2, secret2) = tls_secret("app-tls");
    write_atomic(&dir.path().join("secret.yaml"), &secret1);
    let cas = tempfile::tempdir().unwrap();
    let (ca1_path, ca2_path) = (cas.path().join("ca1.pem"), cas.path().join("ca2.pem"));
    std::fs::write(&ca1_path, ca1).unwrap();
    std::fs::write(&ca2_path, ca2).unwrap();

    let manifests_dir = dir.path().to_str().unwrap();
    let (_weir, addrs) = spawn(
        &serve_args(manifests_dir, &["--https-redirect-port", "8443", "--hsts-max-age", "600"]),
        &["http", "https"],
    );
    let (http, https) = (addrs[0], addrs[1]);

    let (ok, body) = curl_https(https, &ca1_path, "/secure");
    assert!(ok, "{body}");
    assert!(body.starts_with("HTTP/2 200"), "{body}");
    assert!(body.contains("strict-transport-security: max-age=600\r\n"), "{body}");
    assert!(
        body.contains("\"path\":\"/secure\"") && body.contains("\"x-forwarded-proto\":\"https\""),
        "{body}"
    );
    // Plain HTTP to a TLS host: 308 to HTTPS.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(http).unwrap();
    write!(s, "GET /x?y=1 HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 308"), "{raw}");
    assert!(raw.to_ascii_lowercase().contains("location: https://app.test:8443/x?y=1\r\n"), "{raw}");

    // Rotate the Secret: new handshakes get the new certificate, with no restart.
    assert!(!curl_https(https, &ca2_path, "/").0, "the second CA must not verify yet");
    write_atomic(&dir.path().join("secret.yaml"), &secret2);
    wait_until("the rotated certificate", || curl_https(https, &ca2_path, "/").0);
    let (ok, body) = curl_https(https, &ca1_path, "/");
    assert!(!ok, "the old certificate must be gone: {body}");
}

/// rustls warns once per connection about what a client sent; a client naming an IP address
/// in SNI (wrk, some scripts and scanners do) must not get a log line per connection at the
/// default level. Naming rustls in the filter brings its warnings back.
#[test]
fn clients_cannot_fill_the_log_with_rustls_warnings() {
    if !have("openssl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let manifests_dir = dir.path().to_str().unwrap();
    let args = serve_args(manifests_dir, &[]);
    let handshake_with_ip_sni = |https: SocketAddr| {
        for _ in 0..3 {
            let _ = Command::new("openssl")
                .args(["s_client", "-connect", &https.to_string(), "-servername", "127.0.0.1"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    };
    let sni_warnings = |log: &Log| log.lock().unwrap().iter().filter(|l| l.contains("Illegal SNI")).count();
    for (filter, loud) in [
        (None, false),
        (Some("info"), false),
        (Some("warn,weir=info"), false),
        (Some("info,rustls=warn"), true),
    ] {
        let (_weir, addrs, log) = spawn_logged(&args, &["https", "admin"], filter);
        handshake_with_ip_sni(addrs[0]);
        if loud {
            wait_until("rustls's warnings", || sni_warnings(&log) == 3);
        } else {
            // The handshakes were answered; give a stray line time to arrive.
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(sni_warnings(&log), 0, "RUST_LOG={filter:?}: {:?}", log.lock().unwrap());
        }
    }
}

#[test]
fn serve_with_an_unreadable_kubeconfig_is_a_clear_error() {
    let out = Command::new(WEIR)
        .args(["serve", "--kubeconfig", "/nonexistent/kubeconfig", "--listen-http", "127.0.0.1:0"])
        .args(["--listen-https", "127.0.0.1:0", "--listen-admin", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
}

#[test]
fn serve_default_certificate_from_files_is_reloaded() {
    if !have_curl() {
        return;
    }
    let (_echo, echo_addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "backend-a"], &["listen"]);
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), echo_addrs[0], "/");
    let certs = tempfile::tempdir().unwrap();
    let (crt, key) = (certs.path().join("tls.crt"), certs.path().join("tls.key"));
    let (ca1, leaf1, key1) = tls_pair("one");
    let (ca2, leaf2, key2) = tls_pair("two");
    write_atomic(&crt, &leaf1);
    write_atomic(&key, &key1);
    let (ca1_path, ca2_path) = (certs.path().join("ca1.pem"), certs.path().join("ca2.pem"));
    std::fs::write(&ca1_path, ca1).unwrap();
    std::fs::write(&ca2_path, ca2).unwrap();
    let extra =
        ["--default-certificate-file", crt.to_str().unwrap(), "--default-key-file", key.to_str().unwrap()];
    let (_weir, addrs) = spawn(&serve_args(dir.path().to_str().unwrap(), &extra), &["http", "https"]);
    let https = addrs[1];
    // app.test has no TLS entry: the default certificate serves it.
    let (ok, body) = curl_https(https, &ca1_path, "/");
    assert!(ok && body.contains("backend-a"), "{body}");
    // A broken key file keeps the last good certificate.
    write_atomic(&key, "not a key");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(curl_https(https, &ca1_path, "/").0, "the last good certificate keeps serving");
    write_atomic(&crt, &leaf2);
    write_atomic(&key, &key2);
    wait_until("the reloaded default certificate", || curl_https(https, &ca2_path, "/").0);
}

// === overload: running out of descriptors ===

/// A keep-alive backend on loopback (a thread per connection) answering `200 ok` to every
/// request.
fn plain_backend() -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A keep-alive client connection; `request` sends one `GET` on it and returns the status
/// (`None`: closed or reset without an answer).
struct KeepAlive(std::net::TcpStream);

impl KeepAlive {
    fn open(addr: SocketAddr) -> KeepAlive {
        let conn = std::net::TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        KeepAlive(conn)
    }

    fn request(&mut self) -> Option<u16> {
        use std::io::{Read, Write};
        self.0.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n").ok()?;
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = self.0.read(&mut buf).ok().filter(|n| *n > 0)?;
            head.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&head);
            if text.contains("\r\n\r\n") && text.ends_with("ok") || text.contains("content-length: 0") {
                return text.split_whitespace().nth(1).and_then(|c| c.parse().ok());
            }
        }
    }
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `weir serve` under `prlimit --nofile=NOFILE` with `extra` flags, routing `app.test` to a
/// [`plain_backend`]: (process, HTTP and admin addresses, log, the manifest directory); `None`
/// (test skipped) without `prlimit`.
fn serve_limited(
    nofile: u32,
    extra: &[&str],
) -> Option<(Proc, SocketAddr, SocketAddr, Log, tempfile::TempDir)> {
    if !have("prlimit") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), plain_backend(), "/");
    let limit = format!("--nofile={nofile}:{nofile}");
    let (weir, addrs, log) = spawn_wrapped(
        &["prlimit", &limit],
        &serve_args(dir.path().to_str().unwrap(), extra),
        &["http", "admin"],
        Some("info"),
    );
    Some((weir, addrs[0], addrs[1], log, dir))
}

/// With `--max-connections` above what the open-file limit allows, `accept` fails with EMFILE:
/// weir says so at start, backs off instead of spinning on the readable listener, logs the
/// failures at most about once a second, keeps serving the connections it has, and accepts
/// again once descriptors are free.
#[test]
fn out_of_descriptors_the_accept_loop_backs_off_and_open_connections_are_served() {
    let Some((weir, http, _admin, log, _dir)) =
        serve_limited(160, &["--threads", "2", "--max-connections", "1000"])
    else {
        return;
    };
    wait_until("the app to serve", || get(http, "app.test", "/").0 == 200);
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("--max-connections is more than the open-file limit allows")),
        "weir warns at start that the limit does not fit"
    );
    // A keep-alive connection served once: its upstream connection waits in the pool.
    let mut first = KeepAlive::open(http);
    assert_eq!(first.request(), Some(200));

    // More idle connections than descriptors: the last ones wait in the listen backlog.
    let idle: Vec<KeepAlive> = (0..200).map(|_| KeepAlive::open(http)).collect();
    wait_until("accept to fail with EMFILE", || {
        log.lock().unwrap().iter().any(|l| l.contains("accept failed"))
    });

    // No spinning: over two seconds weir uses a fraction of one core, and logs the failures a
    // few times, not thousands.
    let pid = weir.0.id();
    let (ticks, lines) = (cpu_ticks(pid), log.lock().unwrap().len());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - ticks;
    let logged = log.lock().unwrap()[lines..].iter().filter(|l| l.contains("accept failed")).count();
    assert!(used < 100, "weir used {used} ticks (1/100 s) of CPU in 2 s while out of descriptors");
    assert!(logged <= 4, "{logged} accept failures logged in 2 s");

    // The open connection is still served.
    assert_eq!(first.request(), Some(200), "an open connection is served while accept fails");

    // Descriptors come back: weir accepts again.
    drop(idle);
    wait_until("a new connection to be served", || KeepAlive::open(http).request() == Some(200));
}

/// Without `--max-connections`, the limit follows the open-file limit: past it connections are
/// reset at once and `accept` never fails.
#[test]
fn by_default_the_connection_limit_fits_the_open_file_limit() {
    // 256 open files: 128 reserved, 2 per connection, so 64 connections.
    let Some((_weir, http, admin, log, _dir)) = serve_limited(256, &[]) else { return };
    wait_until("the app to serve", || get(http, "app.test", "/").0 == 200);
    assert!(
        log.lock().unwrap().iter().any(|l| l.contains("max_connections=64")),
        "the limit is logged at start"
    );
    let mut open: Vec<KeepAlive> = (0..64).map(|_| KeepAlive::open(http)).collect();
    for conn in &mut open {
        assert_eq!(conn.request(), Some(200));
    }
    let mut refused = KeepAlive::open(http);
    assert_eq!(refused.request(), None, "the 65th connection is refused");
    wait_until("the refusal to be logged", || {
        log.lock().unwrap().iter().any(|l| l.contains("connection limit reached"))
    });
    assert!(!log.lock().unwrap().iter().any(|l| l.contains("accept failed")), "no EMFILE");
    // The admin listener is not a client listener: its scrape counts nowhere.
    let metrics = get(admin, "x", "/metrics").1;
    assert!(metrics.contains("weir_connections_open 64"), "{metrics}");
    assert!(metrics.contains("weir_connections_refused_total{limit=\"total\"} 1"), "{metrics}");
    assert!(metrics.contains("weir_connections_refused_total{limit=\"per_client\"} 0"), "{metrics}");
    drop(open.pop());
    wait_until("a place to free up", || KeepAlive::open(http).request() == Some(200));
}
