//! OpenTelemetry tracing as a user sees it: `weir serve --manifests` with the ConfigMap's
//! `enable-opentelemetry`, `otlp-collector-*` and `otel-*` keys and the tracing annotations,
//! exporting to a real OTLP/gRPC receiver (`otlp/receiver.py`: grpcio serving the
//! `opentelemetry-proto` package's TraceService, which prints each span it gets), in front of a
//! backend that reports the `traceparent` it received.
//!
//! The receiver's Python environment is made by `scripts/test.sh install`
//! (`/var/cache/weir/otlp-receiver`); without it the tests skip with the reason, or fail under
//! `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support_app;
mod support_proc;

/// The receiver's virtual environment (`scripts/test.sh install`).
const VENV: &str = "/var/cache/weir/otlp-receiver";
const RECEIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp/receiver.py");

// === the OTLP receiver ===

/// The Python receiver; killed on drop.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    /// Starts it (`None`, with the reason printed, when its environment is missing).
    fn start(extra: &[&str]) -> Option<Receiver> {
        let python = format!("{VENV}/bin/python");
        let ok = Command::new(&python)
            .args(["-c", "import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            let why = format!("{VENV} with grpcio and opentelemetry-proto (scripts/test.sh install)");
            if std::env::var("WEIR_REQUIRE_ALL").as_deref() == Ok("1") {
                panic!("{why} is required (WEIR_REQUIRE_ALL=1)");
            }
            eprintln!("skipping: needs {why}");
            return None;
        }
        let mut child =
            Command::new(&python).arg(RECEIVER).args(extra).stdout(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let port = first.strip_prefix("listening port=").unwrap().parse().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(serde_json::from_str::<Value>(&line).unwrap());
            }
        });
        Some(Receiver { child, port, spans })
    }

    /// The spans received so far.
    fn spans(&self) -> Vec<Value> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits for the span of `trace_id`.
    fn span_of(&self, trace_id: &str) -> Value {
        self.wait_for("trace_id", trace_id)
    }

    /// Waits for the span `span_id`.
    fn span_of_span(&self, span_id: &str) -> Value {
        self.wait_for("span_id", span_id)
    }

    fn wait_for(&self, field: &str, id: &str) -> Value {
        let mut found = None;
        wait_until(&format!("the span with {field} {id}"), || {
            found = self.spans().into_iter().find(|s| s[field] == id);
            found.is_some()
        });
        found.unwrap()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// === the backend ===

/// The `traceparent`s the authentication service (`/auth` on the backend) received.
static AUTH_SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// An HTTP/1.1 backend answering `traceparent` and `tracestate` as it got them (one line each,
/// `-` when absent); `/fail` answers 503; `/auth` is an `auth-url` service that lets everyone
/// in and keeps the `traceparent` it got in [`AUTH_SEEN`].
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || answer(stream));
        }
    });
    addr
}

fn answer(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let (mut parent, mut state) = ("-".to_string(), "-".to_string());
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "traceparent" => parent = value.trim().to_string(),
                    "tracestate" => state = value.trim().to_string(),
                    _ => {}
                }
            }
        }
        if path.starts_with("/auth") {
            AUTH_SEEN.lock().unwrap().push(parent.clone());
        }
        let status = if path.starts_with("/fail") { "503 Service Unavailable" } else { "200 OK" };
        let body = format!("{parent}\n{state}\n");
        let out = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        if stream.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

// === weir and requests ===

/// An Ingress for `host` to the Service `echo`, with `annotations` (`nginx.ingress.kubernetes.io/`).
fn ingress(name: &str, host: &str, annotations: &[(&str, &str)]) -> String {
    let annotations: String =
        annotations.iter().map(|(k, v)| format!("    nginx.ingress.kubernetes.io/{k}: {v:?}\n")).collect();
    format!(
        r#"---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: default
  annotations:
{annotations}spec:
  ingressClassName: weir
  rules:
  - host: {host}
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 80}}}}}}}}
"#
    )
}

/// Writes `support_app`'s Service `echo` (endpoint `backend`) and Ingress `web` for `app.test`,
/// three more Ingresses and the settings ConfigMap.
fn manifests(dir: &Path, backend: SocketAddr, settings: &[(&str, &str)]) {
    let ingresses = [
        support_app::app_yaml(backend, "/"),
        ingress(
            "untrusting",
            "untrusted.test",
            &[
                ("opentelemetry-trust-incoming-span", "false"),
                ("opentelemetry-operation-name", "HTTP $request_method $service_name $uri"),
            ],
        ),
        ingress("quiet", "off.test", &[("enable-opentelemetry", "false")]),
        ingress("guarded", "auth.test", &[("auth-url", &format!("http://{backend}/auth"))]),
    ]
    .concat();
    std::fs::write(dir.join("app.yaml"), ingresses).unwrap();
    write_settings(dir, settings);
}

/// The settings ConfigMap `default/weir-settings` (written whole, then renamed: one reload).
fn write_settings(dir: &Path, settings: &[(&str, &str)]) {
    let data: String = settings.iter().map(|(k, v)| format!("  {k}: {v:?}\n")).collect();
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: weir-settings, namespace: default}}\ndata:\n{data}"
    );
    let tmp = dir.join(".settings.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(tmp, dir.join("settings.yaml")).unwrap();
}

/// What a request got: its status and the backend's report (`traceparent`, `tracestate`).
struct Answer {
    status: u16,
    traceparent: String,
    tracestate: String,
}

/// `GET http://HOST{path}` through weir with `headers`.
fn get(http: SocketAddr, host: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut stream = TcpStream::connect(http).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let extra: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tracing-test\r\n{extra}Connection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let mut lines = body.lines();
    Answer {
        status,
        traceparent: lines.next().unwrap_or("").to_string(),
        tracestate: lines.next().unwrap_or("").to_string(),
    }
}

/// A sample of weir's `/metrics` (summed over labels).
fn metric(admin: SocketAddr, name: &str) -> u64 {
    let mut stream = TcpStream::connect(admin).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The parts of a `traceparent`: trace id, parent id, flags.
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "not a traceparent: {traceparent:?}");
    assert_eq!(p[0], "00", "{traceparent}");
    (p[1].to_string(), p[2].to_string(), p[3].to_string())
}

/// The ConfigMap for the receiver on `port`, with `extra` keys.
fn settings<'a>(port: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut s = vec![
        ("enable-opentelemetry", "true"),
        ("otlp-collector-host", "127.0.0.1"),
        ("otlp-collector-port", port),
        ("otel-service-name", "edge"),
        ("otel-schedule-delay-millis", "50"),
    ];
    s.extend_from_slice(extra);
    s
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

// === the tests ===

#[test]
fn spans_continue_trusted_traces_carry_the_request_and_reach_the_upstream() {
    let Some(receiver) = Receiver::start(&[]) else { return };
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let port = receiver.port.to_string();
    manifests(dir.path(), backend, &settings(&port, &[("otel-sampler", "AlwaysOn")]));
    let (_weir, http, admin) = support_proc::serve_http_admin(dir.path());

    // A trusted incoming context is continued: same trace, the client's span as parent, its
    // tracestate passed on; the upstream sees weir's span as its parent.
    let incoming = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let got =
        get(http, "app.test", "/a/b?x=1", &[("traceparent", &incoming), ("tracestate", "rojo=1,congo=2")]);
    assert_eq!(got.status, 200);
    let (trace, upstream_parent, flags) = parts(&got.traceparent);
    assert_eq!((trace.as_str(), flags.as_str()), (CLIENT_TRACE, "01"));
    assert_ne!(upstream_parent, CLIENT_SPAN, "the upstream's parent is weir's span");
    assert_eq!(got.tracestate, "rojo=1,congo=2");
    let span = receiver.span_of(CLIENT_TRACE);
    assert_eq!(span["span_id"], upstream_parent.as_str(), "the exported span is the upstream's parent");
    assert_eq!(span["parent_span_id"], CLIENT_SPAN);
    assert_eq!(span["trace_state"], "rojo=1,congo=2");
    assert_eq!(span["name"], "GET /");
    assert_eq!(span["kind"], 2, "SPAN_KIND_SERVER");
    assert_eq!(span["status_code"], 0, "a 200 leaves the status unset");
    assert_eq!(span["flags"], 1);
    assert!(span["end"].as_u64() >= span["start"].as_u64() && span["start"].as_u64() > Some(0));
    assert_eq!(span["resource"]["service.name"], "edge");
    let a = &span["attributes"];
    let expected = [
        ("http.request.method", Value::from("GET")),
        ("url.path", "/a/b".into()),
        ("url.query", "x=1".into()),
        ("url.scheme", "http".into()),
        ("server.address", "app.test".into()),
        ("server.port", http.port().into()),
        ("client.address", "127.0.0.1".into()),
        ("network.protocol.version", "1.1".into()),
        ("user_agent.original", "tracing-test".into()),
        ("http.route", "/".into()),
        ("http.response.status_code", 200.into()),
        ("k8s.namespace.name", "default".into()),
        ("k8s.ingress.name", "web".into()),
        ("k8s.service.name", "echo".into()),
        ("k8s.service.port", "80".into()),
    ];
    for (key, value) in expected {
        assert_eq!(a[key], value, "{key} in {a}");
    }

    // Without an incoming context: a new trace, a root span.
    let got = get(http, "app.test", "/", &[]);
    let (trace, upstream_parent, flags) = parts(&got.traceparent);
    assert_eq!(flags, "01");
    assert_eq!(got.tracestate, "-");
    let span = receiver.span_of(&trace);
    assert_eq!(
        (span["span_id"].as_str(), span["parent_span_id"].as_str()),
        (Some(upstream_parent.as_str()), Some(""))
    );

    // `opentelemetry-trust-incoming-span: "false"`: the client's context starts nothing, its
    // tracestate is not passed on; the annotation's operation name names the span.
    let got = get(http, "untrusted.test", "/x", &[("traceparent", &incoming), ("tracestate", "rojo=1")]);
    let (trace, upstream_parent, _) = parts(&got.traceparent);
    assert_ne!(trace, CLIENT_TRACE);
    assert_eq!(got.tracestate, "-");
    let span = receiver.span_of(&trace);
    assert_eq!(span["parent_span_id"], "");
    assert_eq!(span["span_id"], upstream_parent.as_str());
    assert_eq!(span["name"], "HTTP GET echo /x");
    assert_eq!(span["attributes"]["k8s.ingress.name"], "untrusting");

    // The auth-url subrequest carries the same context as the upstream request: weir's span as
    // parent.
    let got = get(http, "auth.test", "/private", &[("traceparent", &incoming)]);
    assert_eq!(got.status, 200);
    let (trace, upstream_parent, _) = parts(&got.traceparent);
    assert_eq!(trace, CLIENT_TRACE);
    assert_eq!(AUTH_SEEN.lock().unwrap().clone(), vec![got.traceparent.clone()]);
    let span = receiver.span_of_span(&upstream_parent);
    assert_eq!(span["attributes"]["k8s.ingress.name"], "guarded");

    // A 5xx is an error span.
    let got = get(http, "app.test", "/fail", &[]);
    assert_eq!(got.status, 503);
    let span = receiver.span_of(&parts(&got.traceparent).0);
    assert_eq!(span["status_code"], 2, "STATUS_CODE_ERROR");
    assert_eq!(span["attributes"]["http.response.status_code"], 503);
    assert_eq!(span["attributes"]["error.type"], "503");

    // `enable-opentelemetry: "false"` on an Ingress: no span, the client's context untouched.
    let before = receiver.spans().len();
    let got = get(http, "off.test", "/", &[("traceparent", &incoming)]);
    assert_eq!(got.traceparent, incoming);

    // AlwaysOn: every request makes a span, each its own trace.
    let traces: Vec<String> =
        (0..20).map(|i| parts(&get(http, "app.test", &format!("/n{i}"), &[]).traceparent).0).collect();
    for trace in &traces {
        receiver.span_of(trace);
    }
    let spans = receiver.spans();
    assert_eq!(spans.len(), before + 20, "exactly the 20 traced requests, none for off.test");
    assert!(spans.iter().all(|s| s["attributes"]["server.address"] != "off.test"));
    wait_until("the exported counter", || {
        metric(admin, "weir_otel_spans_exported_total") == spans.len() as u64
    });
    assert_eq!(metric(admin, "weir_otel_spans_dropped_total"), 0);
}

#[test]
fn sampling_follows_the_sampler_and_reloads() {
    let Some(receiver) = Receiver::start(&[]) else { return };
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let port = receiver.port.to_string();
    let ratio_zero = settings(&port, &[("otel-sampler", "TraceIdRatioBased"), ("otel-sampler-ratio", "0")]);
    manifests(dir.path(), backend, &ratio_zero);
    let (_weir, http, admin) = support_proc::serve_http_admin(dir.path());

    // Ratio 0: nothing is recorded; the context still goes upstream, not sampled.
    for i in 0..10 {
        let got = get(http, "app.test", &format!("/r{i}"), &[]);
        assert_eq!((got.status, parts(&got.traceparent).2.as_str()), (200, "00"));
    }

    // Parent-based with AlwaysOff: the caller's sampled flag decides (hot-reloaded).
    let parent_based =
        settings(&port, &[("otel-sampler", "AlwaysOff"), ("otel-sampler-parent-based", "true")]);
    write_settings(dir.path(), &parent_based);
    let sampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    wait_until("the parent-based sampler", || {
        parts(&get(http, "app.test", "/probe", &[("traceparent", &sampled)]).traceparent).2 == "01"
    });
    let span = receiver.span_of(CLIENT_TRACE);
    assert_eq!(span["parent_span_id"], CLIENT_SPAN);
    let unsampled_trace = "0af7651916cd43dd8448eb211c80319c";
    let unsampled = format!("00-{unsampled_trace}-b7ad6b7169203331-00");
    let (trace, _, flags) = parts(&get(http, "app.test", "/u", &[("traceparent", &unsampled)]).traceparent);
    assert_eq!((trace.as_str(), flags.as_str()), (unsampled_trace, "00"), "continued, not sampled");
    let root = get(http, "app.test", "/root", &[]);
    assert_eq!(parts(&root.traceparent).2, "00", "AlwaysOff for new traces");

    // A marker on a later, sampled request: once it is in, the earlier ones would be too.
    let marker = "11111111111111111111111111111111";
    get(http, "app.test", "/marker", &[("traceparent", &format!("00-{marker}-{CLIENT_SPAN}-01"))]);
    receiver.span_of(marker);
    let spans = receiver.spans();
    let traces: Vec<&str> = spans.iter().filter_map(|s| s["trace_id"].as_str()).collect();
    assert!(!traces.contains(&unsampled_trace), "an unsampled parent is not recorded");
    assert!(spans.iter().all(|s| s["trace_id"] == CLIENT_TRACE || s["trace_id"] == marker), "{traces:?}");
    assert_eq!(metric(admin, "weir_otel_spans_dropped_total"), 0);
}

#[test]
fn a_dead_or_slow_collector_costs_requests_nothing_and_drops_are_counted() {
    let Some(receiver) = Receiver::start(&[]) else { return };
    let Some(slow) = Receiver::start(&["--stall", "30"]) else { return };
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let port = receiver.port.to_string();
    manifests(dir.path(), backend, &settings(&port, &[("otel-sampler", "AlwaysOn")]));
    let (_weir, http, admin) = support_proc::serve_http_admin(dir.path());
    let trace = parts(&get(http, "app.test", "/", &[]).traceparent).0;
    receiver.span_of(&trace);

    // The collector dies: requests go on; the spans are dropped and counted.
    drop(receiver);
    for i in 0..20 {
        assert_eq!(get(http, "app.test", &format!("/dead{i}"), &[]).status, 200);
    }
    wait_until("drops counted", || metric(admin, "weir_otel_spans_dropped_total") >= 20);

    // A collector that never answers, and a small queue: it fills and the rest is dropped.
    let slow_port = slow.port.to_string();
    let small = settings(
        &slow_port,
        &[("otel-sampler", "AlwaysOn"), ("otel-max-queuesize", "4"), ("otel-max-export-batch-size", "2")],
    );
    write_settings(dir.path(), &small);
    let full = "weir_otel_spans_dropped_total{reason=\"queue_full\"}";
    assert_eq!(metric(admin, full), 0, "a dead collector fails fast: its queue never filled");
    wait_until("the slow collector's queue full", || {
        assert_eq!(get(http, "app.test", "/probe", &[]).status, 200);
        metric(admin, full) > 0
    });
    let before = metric(admin, full);
    for i in 0..50 {
        assert_eq!(get(http, "app.test", &format!("/slow{i}"), &[]).status, 200);
    }
    // The stalled export holds 2 spans and the queue 4: at most a few of the 50 find room.
    assert!(metric(admin, full) >= before + 40, "{} dropped of 50", metric(admin, full) - before);
}

/// Requests no route takes get a server span too, as nginx's module traces every request of a
/// server with tracing on: weir's 404 and a 400 from path normalization, each continuing the
/// client's trusted context, with the request's attributes and no route, Ingress or Service.
#[test]
fn requests_no_route_takes_get_a_span() {
    let Some(receiver) = Receiver::start(&[]) else { return };
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let port = receiver.port.to_string();
    manifests(dir.path(), backend, &settings(&port, &[("otel-sampler", "AlwaysOn")]));
    let (_weir, http, _admin) = support_proc::serve_http_admin(dir.path());
    wait_until("the routes", || get(http, "app.test", "/", &[]).status == 200);

    // No rule for the host: weir's 404.
    let lost = "22222222222222222222222222222222";
    let got =
        get(http, "nowhere.test", "/lost?q=1", &[("traceparent", &format!("00-{lost}-{CLIENT_SPAN}-01"))]);
    assert_eq!(got.status, 404);
    let span = receiver.span_of(lost);
    assert_eq!((span["parent_span_id"].as_str(), span["kind"].as_u64()), (Some(CLIENT_SPAN), Some(2)));
    assert_eq!(span["name"], "GET", "no route to name it after");
    assert_eq!(span["status_code"], 0, "a 4xx is the client's, not an error of the server");
    let a = &span["attributes"];
    for (key, value) in [
        ("http.response.status_code", Value::from(404)),
        ("http.request.method", "GET".into()),
        ("url.path", "/lost".into()),
        ("url.query", "q=1".into()),
        ("server.address", "nowhere.test".into()),
        ("server.port", http.port().into()),
        ("user_agent.original", "tracing-test".into()),
    ] {
        assert_eq!(a[key], value, "{key} in {a}");
    }
    for absent in ["http.route", "k8s.ingress.name", "k8s.service.name", "k8s.namespace.name"] {
        assert!(a[absent].is_null(), "{absent} in {a}");
    }

    // A path above the root: 400 before any route is looked up.
    let bad = "33333333333333333333333333333333";
    let got =
        get(http, "app.test", "/a/../../etc", &[("traceparent", &format!("00-{bad}-{CLIENT_SPAN}-01"))]);
    assert_eq!(got.status, 400);
    let span = receiver.span_of(bad);
    assert_eq!(span["attributes"]["http.response.status_code"], 400);
    assert_eq!(span["attributes"]["url.path"], "/a/../../etc", "the path as sent");
    assert_eq!(span["attributes"]["server.address"], "app.test");
    assert!(span["attributes"]["http.route"].is_null());

    // Tracing off in the ConfigMap: a 404 makes no span (an annotation cannot turn it on: no
    // Ingress took the request).
    let mut off = settings(&port, &[("otel-sampler", "AlwaysOn")]);
    off[0] = ("enable-opentelemetry", "false");
    write_settings(dir.path(), &off);
    let untraced = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    wait_until("tracing off", || {
        get(http, "app.test", "/", &[("traceparent", &untraced)]).traceparent == untraced
    });
    let quiet = "44444444444444444444444444444444";
    assert_eq!(
        get(http, "nowhere.test", "/", &[("traceparent", &format!("00-{quiet}-{CLIENT_SPAN}-01"))]).status,
        404
    );
    // A marker traced through an Ingress that turns tracing on by annotation comes later: once it
    // is in, the 404's span would be too.
    let marker = "55555555555555555555555555555555";
    let on = ingress("traced", "on.test", &[("enable-opentelemetry", "true")]);
    std::fs::write(dir.path().join("on.yaml"), on).unwrap();
    wait_until("the traced Ingress", || {
        get(http, "on.test", "/", &[("traceparent", &format!("00-{marker}-{CLIENT_SPAN}-01"))]).status == 200
    });
    assert_eq!(
        get(http, "nowhere.test", "/", &[("traceparent", &format!("00-{quiet}-{CLIENT_SPAN}-01"))]).status,
        404
    );
    let marker2 = "66666666666666666666666666666666";
    get(http, "on.test", "/", &[("traceparent", &format!("00-{marker2}-{CLIENT_SPAN}-01"))]);
    receiver.span_of(marker2);
    assert!(receiver.spans().iter().all(|s| s["trace_id"] != quiet), "no span for a 404 with tracing off");
}
