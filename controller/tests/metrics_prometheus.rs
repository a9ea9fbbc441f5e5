//! weir's `/metrics` read by the real tools: `promtool check metrics` lints it, a real
//! Prometheus (Debian's `prometheus`) scrapes two `weir serve` processes every second while
//! traffic goes through two Ingresses (200s, 503s, slow answers), and PromQL over its HTTP API
//! gives the request counts and rates per Ingress and status, and a p99 from the histogram. With
//! `--metrics-compat ingress-nginx`, the queries of ingress-nginx's dashboard panels return data;
//! every metric the shipped Grafana dashboard names is exposed.
//!
//! Without `prometheus`/`promtool` the tests skip with the reason; under `WEIR_REQUIRE_ALL=1`
//! (CI, where `scripts/test.sh install` installs them) they fail instead.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support_proc;

use support_proc::{Proc, WEIR};

/// Whether `tool` is installed; without it the test skips with the reason, or fails under
/// `WEIR_REQUIRE_ALL=1`.
fn have(tool: &str) -> bool {
    support_proc::have(tool, "scripts/test.sh install installs Debian's prometheus")
}

/// A backend on loopback: `200 ok` to every request, after 300 ms for paths under `/slow`.
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut head = Vec::new();
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                    if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    if head.starts_with(b"GET /slow") {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    head.clear();
                    if conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Two Ingresses: `shop` (`shop.test`: `/` to the backend, `/down` to a Service without
/// endpoints: 503) and `blog` (`blog.test`, TLS with the Secret `blog-tls`, plain HTTP served
/// too).
fn manifests(dir: &Path, backend: SocketAddr) {
    use base64::Engine as _;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(vec!["blog.test".to_string()]).unwrap().self_signed(&key).unwrap();
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    let yaml = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: app, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: app-1
  namespace: default
  labels: {{kubernetes.io/service-name: app}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints:
- addresses: ["{ip}"]
---
apiVersion: v1
kind: Service
metadata: {{name: down, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: v1
kind: Secret
metadata: {{name: blog-tls, namespace: default}}
type: kubernetes.io/tls
data:
  tls.crt: {crt}
  tls.key: {key}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: shop, namespace: default}}
spec:
  ingressClassName: weir
  rules:
  - host: shop.test
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}
      - {{path: /down, pathType: Prefix, backend: {{service: {{name: down, port: {{number: 80}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: blog
  namespace: default
  annotations: {{nginx.ingress.kubernetes.io/ssl-redirect: "false"}}
spec:
  ingressClassName: weir
  tls:
  - hosts: [blog.test]
    secretName: blog-tls
  rules:
  - host: blog.test
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: app, port: {{number: 80}}}}}}}}
"#,
        port = backend.port(),
        ip = backend.ip(),
        crt = b64(cert.pem()),
        key = b64(key.serialize_pem()),
    );
    std::fs::write(dir.join("app.yaml"), yaml).unwrap();
}

/// `weir serve --manifests DIR EXTRA...` on ephemeral loopback ports: (process, HTTP, admin).
fn serve(dir: &Path, extra: &[&str]) -> (Proc, SocketAddr, SocketAddr) {
    let mut child = Command::new(WEIR)
        .args(["serve", "--manifests"])
        .arg(dir)
        .args([
            "--listen-http",
            "127.0.0.1:0",
            "--listen-https",
            "127.0.0.1:0",
            "--listen-admin",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let proc = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in stderr.lines().map_while(Result::ok) {
            if !sent && line.contains("weir is serving") {
                sent = tx.send(line).is_ok();
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(20)).expect("weir did not start");
    let plain = strip_ansi(&line);
    let field = |key: &str| -> SocketAddr {
        let start = plain.find(&format!("{key}=")).unwrap_or_else(|| panic!("{plain}")) + key.len() + 1;
        plain[start..].split_whitespace().next().unwrap().parse().unwrap()
    };
    (proc, field("http"), field("admin"))
}

/// `line` without its terminal escape sequences.
fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

/// `GET path` with `Host: host` (and `Accept`, if given): (status, body).
fn get(addr: SocketAddr, host: &str, path: &str, accept: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{accept}Connection: close\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let buf = String::from_utf8_lossy(&buf).into_owned();
    let status = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A Prometheus scraping `targets` every second, its data in `dir`.
struct Prometheus {
    _proc: Proc,
    addr: SocketAddr,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[(&str, SocketAddr)]) -> Prometheus {
        let jobs: String = targets
            .iter()
            .map(|(job, addr)| format!("- job_name: {job}\n  static_configs: [{{targets: ['{addr}']}}]\n"))
            .collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!("global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n{jobs}"),
        )
        .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let prometheus = Prometheus { _proc: Proc(child), addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).is_err() || get(addr, "prometheus", "/-/ready", None).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }

    /// The result vector of an instant query: (labels, value) per series.
    fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let (status, body) =
            get(self.addr, "prometheus", &format!("/api/v1/query?query={}", encode(promql)), None);
        assert_eq!(status, 200, "{promql}: {body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["status"], "success", "{promql}: {body}");
        json["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse::<f64>().unwrap()))
            .collect()
    }

    /// Waits until every target has been scraped after `since`.
    fn wait_scraped(&self, since: Instant) {
        std::thread::sleep(Duration::from_millis(2500).saturating_sub(since.elapsed()));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, body) = get(self.addr, "prometheus", "/api/v1/targets", None);
            let json: serde_json::Value = serde_json::from_str(&body).unwrap();
            let targets = json["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
            if !targets.is_empty() && targets.iter().all(|t| t["health"] == "up") {
                return;
            }
            assert!(Instant::now() < deadline, "targets not up: {body}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Percent-encodes a query string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the one series of `result` whose labels hold every `(name, value)` of `want`.
fn value(result: &[(serde_json::Value, f64)], want: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = result
        .iter()
        // Prometheus drops empty labels: a missing one is "".
        .filter(|(labels, _)| want.iter().all(|(k, v)| labels[*k].as_str().unwrap_or_default() == *v))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "{want:?} in {result:?}");
    found[0]
}

/// Traffic through both Ingresses of every weir in `http`: per round, on `shop.test` two fast
/// 200s, one slow 200 (300 ms) and one 503; on `blog.test` one 200.
fn traffic(http: &[SocketAddr], rounds: usize) {
    for _ in 0..rounds {
        for &addr in http {
            assert_eq!(get(addr, "shop.test", "/", None).0, 200);
            assert_eq!(get(addr, "shop.test", "/a", None).0, 200);
            assert_eq!(get(addr, "shop.test", "/slow", None).0, 200);
            assert_eq!(get(addr, "shop.test", "/down", None).0, 503);
            assert_eq!(get(addr, "blog.test", "/", None).0, 200);
        }
    }
}

/// Runs `promtool check metrics` on `text`: (success, its report).
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

/// Sample names of an exposition (`name{...} value` lines).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn prometheus_scrapes_weir_and_promql_reads_rates_and_p99() {
    if !have("prometheus") || !have("promtool") {
        return;
    }
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), backend);
    let (_weir, http, admin) = serve(dir.path(), &[]);
    let (_compat, compat_http, compat_admin) =
        serve(dir.path(), &["--metrics-compat", "ingress-nginx", "--election-identity", "weir-0"]);
    let prom_dir = tempfile::tempdir().unwrap();
    let prometheus = Prometheus::start(prom_dir.path(), &[("weir", admin), ("weir-compat", compat_admin)]);

    let rounds = 20;
    traffic(&[http, compat_http], rounds);
    let done = Instant::now();
    assert_eq!(get(http, "nowhere.test", "/", None).0, 404);

    // weir's own names pass promtool's lint (Prometheus text, the default without `Accept`).
    let (status, text) = get(admin, "x", "/metrics", None);
    assert_eq!(status, 200);
    let (ok, report) = promtool(&text);
    assert!(ok, "promtool check metrics: {report}\n{text}");
    // With ingress-nginx's names, the only lint is theirs: counters without `_total`.
    let (_, compat_text) = get(compat_admin, "x", "/metrics", None);
    let (_, report) = promtool(&compat_text);
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.starts_with("nginx_ingress_controller_")
                && line.ends_with("counter metrics should have \"_total\" suffix"),
            "unexpected promtool report: {line}"
        );
    }
    // OpenMetrics when asked for, ending with `# EOF`.
    let (_, om) = get(admin, "x", "/metrics", Some("application/openmetrics-text;version=1.0.0"));
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE weir_requests counter\n"), "{om}");

    prometheus.wait_scraped(done);
    std::thread::sleep(Duration::from_secs(2));

    // Exact counts per Ingress and status, as Prometheus stored them.
    let counts = prometheus.query(r#"sum by (ingress, status) (weir_requests_total{job="weir"})"#);
    let n = rounds as f64;
    assert_eq!(value(&counts, &[("ingress", "shop"), ("status", "200")]), 3.0 * n, "{counts:?}");
    assert_eq!(value(&counts, &[("ingress", "shop"), ("status", "503")]), n, "{counts:?}");
    assert_eq!(value(&counts, &[("ingress", "blog"), ("status", "200")]), n, "{counts:?}");
    assert_eq!(value(&counts, &[("ingress", ""), ("status", "404")]), 1.0, "{counts:?}");
    // Rates over the traffic: shop's 200s three times its 503s, blog's 200s as many as shop's
    // 503s (rounds interleave them, so any window sees the same proportions, give or take one
    // round).
    let rates = prometheus
        .query(r#"sum by (ingress, status) (rate(weir_requests_total{job="weir",ingress!=""}[30s]))"#);
    let shop_ok = value(&rates, &[("ingress", "shop"), ("status", "200")]);
    let shop_503 = value(&rates, &[("ingress", "shop"), ("status", "503")]);
    let blog_ok = value(&rates, &[("ingress", "blog"), ("status", "200")]);
    assert!(shop_503 > 0.0, "{rates:?}");
    assert!((2.5..=3.5).contains(&(shop_ok / shop_503)), "{rates:?}");
    assert!((0.8..=1.25).contains(&(blog_ok / shop_503)), "{rates:?}");
    // p99 of shop: a quarter of its requests take 300 ms, so the 99th percentile lies in the
    // (0.25 s, 0.5 s] bucket; blog's requests are all fast.
    let p99 = prometheus.query(
        r#"histogram_quantile(0.99, sum by (le, ingress) (rate(weir_request_duration_seconds_bucket{job="weir"}[30s])))"#,
    );
    let shop_p99 = value(&p99, &[("ingress", "shop")]);
    assert!(shop_p99 > 0.25 && shop_p99 <= 0.5, "shop p99 {shop_p99}: {p99:?}");
    assert!(value(&p99, &[("ingress", "blog")]) < 0.25, "{p99:?}");
    let upstream_p99 = prometheus.query(
        r#"histogram_quantile(0.99, sum by (le) (rate(weir_upstream_response_duration_seconds_bucket{job="weir",ingress="shop"}[30s])))"#,
    );
    assert!(
        upstream_p99.len() == 1 && upstream_p99[0].1 > 0.25 && upstream_p99[0].1 <= 0.5,
        "{upstream_p99:?}"
    );
    // The 503s had no upstream: no upstream time in the 5xx class.
    let upstream_5xx =
        prometheus.query(r#"weir_upstream_response_duration_seconds_count{job="weir",status_class="5xx"}"#);
    assert!(upstream_5xx.is_empty(), "{upstream_5xx:?}");

    // ingress-nginx's dashboard panels (deploy/grafana/dashboards/nginx.json), variables set to
    // match all: request volume, success rate, p99 by Ingress.
    let all = |q: &str| {
        q.replace("$controller_class", ".*")
            .replace("$controller", ".*")
            .replace("$namespace", ".*")
            .replace("$ingress", ".*")
    };
    let volume = prometheus.query(&all(
        r#"round(sum(irate(nginx_ingress_controller_requests{controller_pod=~"$controller",controller_class=~"$controller_class",namespace=~"$namespace"}[2m])), 0.001)"#,
    ));
    assert_eq!(volume.len(), 1, "{volume:?}");
    let success = prometheus.query(&all(
        r#"sum(rate(nginx_ingress_controller_requests{controller_pod=~"$controller",controller_class=~"$controller_class",namespace=~"$namespace",status!~"[4-5].*"}[2m])) / sum(rate(nginx_ingress_controller_requests{controller_pod=~"$controller",controller_class=~"$controller_class",namespace=~"$namespace"}[2m]))"#,
    ));
    assert!(success.len() == 1 && success[0].1 > 0.7 && success[0].1 < 0.9, "{success:?}");
    let p99 = prometheus.query(&all(
        r#"histogram_quantile(0.99, sum(rate(nginx_ingress_controller_request_duration_seconds_bucket{ingress!="",controller_pod=~"$controller",controller_class=~"$controller_class",controller_namespace=~"$namespace",ingress=~"$ingress"}[2m])) by (le, ingress))"#,
    ));
    let shop = value(&p99, &[("ingress", "shop")]);
    assert!(shop > 0.25 && shop <= 0.5, "{p99:?}");
    let pods = prometheus
        .query(r#"count by (controller_pod, controller_class) (nginx_ingress_controller_requests)"#);
    assert_eq!(value(&pods, &[("controller_pod", "weir-0"), ("controller_class", "weir")]), 3.0, "{pods:?}");
    let reload = prometheus.query(r#"nginx_ingress_controller_config_last_reload_successful"#);
    assert_eq!(reload.len(), 1, "{reload:?}");
    assert_eq!(reload[0].1, 1.0);
    let expiry =
        prometheus.query(r#"nginx_ingress_controller_ssl_expire_time_seconds{host="blog.test"} - time()"#);
    assert!(expiry.len() == 1 && expiry[0].1 > 86_400.0, "{expiry:?}");

    // The shipped dashboard: every metric its queries name is exposed, and Prometheus accepts
    // every query.
    let dashboard = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/weir/dashboards/weir.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard).unwrap()).unwrap();
    let exposed = sample_names(&text);
    let mut named = BTreeSet::new();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"].as_str().filter(|q| q.starts_with("label_values(")) {
            exprs.push(
                q.trim_start_matches("label_values(").split([',', ')', '{']).next().unwrap().to_string(),
            );
        }
    }
    for expr in &exprs {
        let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        named.extend(words.filter(|w| w.starts_with("weir_") || w.starts_with("process_")).map(String::from));
        prometheus.query(&expr.replace("$namespace", ".*").replace("$ingress", ".*").replace("$job", ".*"));
    }
    assert!(named.len() >= 15, "{named:?}");
    let missing: Vec<&String> = named.iter().filter(|n| !exposed.contains(*n)).collect();
    assert!(missing.is_empty(), "the dashboard names metrics weir does not expose: {missing:?}\n{text}");
}
