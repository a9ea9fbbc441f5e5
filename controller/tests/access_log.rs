//! The access log as a user sees it: `weir serve` writes one JSON line per request on standard
//! output by default, with ingress-nginx's default fields, when the response ends or the client
//! goes away; the ConfigMap's logging keys change it without a restart; a slow destination
//! drops lines (counted on `/metrics`) rather than slowing requests down.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support_app;
mod support_proc;

use support_proc::{Log, Proc, serve_args, spawn_logged, spawn_with_stdout};

const HOST: &str = "app.test";
/// The streamed response's size.
const BIG: usize = 1024 * 1024;

/// A plain HTTP/1.1 backend answering by path, one thread per connection:
/// `/ok` 200 `hello`; `/big` 1 MiB chunked, in two halves 300 ms apart; `/missing` 404;
/// `/slow` a chunk every 50 ms for 5 s.
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
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
        }
        let chunked =
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        let chunk = |stream: &mut TcpStream, data: &[u8]| {
            stream.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
            stream.write_all(data)?;
            stream.write_all(b"\r\n")
        };
        let result = match path.as_str() {
            "/big" => (|| {
                stream.write_all(chunked.as_bytes())?;
                chunk(&mut stream, &vec![b'a'; BIG / 2])?;
                std::thread::sleep(Duration::from_millis(300));
                chunk(&mut stream, &vec![b'b'; BIG / 2])?;
                stream.write_all(b"0\r\n\r\n")
            })(),
            "/slow" => (|| {
                stream.write_all(chunked.as_bytes())?;
                for _ in 0..100 {
                    chunk(&mut stream, &[b'x'; 1000])?;
                    std::thread::sleep(Duration::from_millis(50));
                }
                stream.write_all(b"0\r\n\r\n")
            })(),
            "/missing" => stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found"),
            _ => stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"),
        };
        if result.is_err() {
            return;
        }
    }
}

/// Writes the app's manifests (and the settings ConfigMap `data`, when given) into `dir`.
fn manifests(dir: &Path, backend: SocketAddr, settings: &[(&str, &str)]) {
    std::fs::write(dir.join("app.yaml"), support_app::app_yaml(backend, "/")).unwrap();
    configmap(dir, settings);
}

/// Writes `default/weir-settings` with `data` (an empty one without keys).
fn configmap(dir: &Path, data: &[(&str, &str)]) {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: weir-settings, namespace: default}\ndata:\n",
    );
    if data.is_empty() {
        yaml = yaml.replace("data:\n", "data: {}\n");
    }
    for (k, v) in data {
        yaml.push_str(&format!("  {k}: {}\n", serde_json::to_string(v).unwrap()));
    }
    let tmp = dir.join("settings.yaml.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(tmp, dir.join("settings.yaml")).unwrap();
}

/// Sends one HTTP/1.1 request (`Connection: close`) and reads the whole response.
fn request(addr: SocketAddr, host: &str, path: &str, id: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: probe/1\r\nReferer: http://r.test/\r\nX-Request-ID: {id}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let status = std::str::from_utf8(&out[9..12]).unwrap().parse().unwrap();
    let body =
        out.windows(4).position(|w| w == b"\r\n\r\n").map(|i| out[i + 4..].to_vec()).unwrap_or_default();
    (status, body)
}

/// The request line and headers [`request`] sends, as `$request_length` counts them.
fn request_length(host: &str, path: &str, id: &str) -> u64 {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: probe/1\r\nReferer: http://r.test/\r\nX-Request-ID: {id}\r\nConnection: close\r\n\r\n"
    )
    .len() as u64
}

/// The access-log line whose `req_id` (or `key`) is `id`, waited for.
fn line(out: &Log, key: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = find(out, key, id) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no access-log line with {key}={id}; stdout: {:?}",
            out.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn find(out: &Log, key: &str, id: &str) -> Option<Value> {
    let lines = out.lock().unwrap().clone();
    lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|v| v[key] == id)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(dir: &Path, extra: &[&str]) -> (Proc, SocketAddr, SocketAddr, Log, Log) {
    let (weir, addrs, log, out) = spawn_with_stdout(&serve_args(dir, extra), &["http", "admin"], None);
    (weir, addrs[0], addrs[1], log, out)
}

#[test]
fn every_default_field_on_a_normal_a_streamed_an_aborted_and_a_404_request() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), backend, &[]);
    let (_weir, http, _admin, _log, out) = start(dir.path(), &[]);
    wait_until("the route", || request(http, HOST, "/ok", "warm").0 == 200);

    // A normal request: every default field.
    let started = std::time::SystemTime::now();
    assert_eq!(request(http, HOST, "/ok?q=1", "normal"), (200, b"hello".to_vec()));
    let v = line(&out, "req_id", "normal");
    let fields = v.as_object().unwrap();
    let expected = [
        "time",
        "remote_addr",
        "remote_user",
        "request",
        "status",
        "body_bytes_sent",
        "bytes_sent",
        "http_referer",
        "http_user_agent",
        "request_length",
        "request_time",
        "host",
        "proxy_upstream_name",
        "upstream_addr",
        "upstream_response_time",
        "upstream_status",
        "req_id",
        "namespace",
        "ingress_name",
        "service_name",
        "service_port",
        "request_end",
    ];
    let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), expected.len(), "{v}");
    for key in expected {
        assert!(fields.contains_key(key), "{key} missing from {v}");
    }
    assert_eq!(v["remote_addr"], "127.0.0.1");
    assert_eq!(v["remote_user"], "");
    let time = v["time"].as_str().unwrap();
    assert!(time.len() == 25 && time.ends_with("+00:00") && time.as_bytes()[10] == b'T', "{time}");
    let year = started.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 31_556_952 + 1970;
    assert!(time.starts_with(&year.to_string()) || time.starts_with(&(year + 1).to_string()), "{time}");
    assert_eq!(v["request"], "GET /ok?q=1 HTTP/1.1");
    assert_eq!(v["status"], 200);
    assert_eq!(v["body_bytes_sent"], 5);
    let bytes_sent = v["bytes_sent"].as_u64().unwrap();
    assert!(bytes_sent > 5 + 17 && bytes_sent < 1000, "head and body: {v}");
    assert_eq!(v["http_referer"], "http://r.test/");
    assert_eq!(v["http_user_agent"], "probe/1");
    assert_eq!(v["request_length"], request_length(HOST, "/ok?q=1", "normal"));
    assert!(v["request_time"].as_f64().unwrap() >= v["upstream_response_time"].as_f64().unwrap());
    assert_eq!(v["host"], HOST);
    assert_eq!(v["proxy_upstream_name"], "default-echo-80");
    assert_eq!(v["upstream_addr"], backend.to_string());
    assert_eq!(v["upstream_status"], 200);
    assert_eq!(v["namespace"], "default");
    assert_eq!(v["ingress_name"], "web");
    assert_eq!(v["service_name"], "echo");
    assert_eq!(v["service_port"], 80);
    assert_eq!(v["request_end"], "complete");

    // Streamed 1 MiB, with a pause after the head: the time runs to the last byte.
    let (status, body) = request(http, HOST, "/big", "big");
    assert_eq!(status, 200);
    assert!(body.len() > BIG, "chunked framing around 1 MiB: {}", body.len());
    let v = line(&out, "req_id", "big");
    assert_eq!(v["body_bytes_sent"], BIG as u64, "{v}");
    assert_eq!(v["request_end"], "complete");
    let (total, head) = (v["request_time"].as_f64().unwrap(), v["upstream_response_time"].as_f64().unwrap());
    assert!(total >= 0.3 && head < 0.3, "request_time to the last byte, upstream time to the head: {v}");

    // A client that goes away part way.
    let mut s = TcpStream::connect(http).unwrap();
    write!(s, "GET /slow HTTP/1.1\r\nHost: {HOST}\r\nX-Request-ID: gone\r\n\r\n").unwrap();
    let mut first = [0u8; 2048];
    let n = s.read(&mut first).unwrap();
    assert!(std::str::from_utf8(&first[..n]).unwrap_or("").starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(200));
    drop(s);
    let v = line(&out, "req_id", "gone");
    assert_eq!(v["request_end"], "client_gone", "{v}");
    assert_eq!(v["status"], 200);
    let sent = v["body_bytes_sent"].as_u64().unwrap();
    assert!(sent > 0 && sent < 100_000, "part of the body: {v}");
    assert!(v["request_time"].as_f64().unwrap() < 4.0, "logged when the client left: {v}");

    // A 404 from the upstream is logged; one from no route (the default backend) is not.
    assert_eq!(request(http, HOST, "/missing", "missing").0, 404);
    assert_eq!(request(http, "nowhere.test", "/", "noroute").0, 404);
    let v = line(&out, "req_id", "missing");
    assert_eq!((v["status"].as_u64(), v["upstream_status"].as_u64()), (Some(404), Some(404)));
    assert_eq!(v["body_bytes_sent"], 9);
    assert_eq!(v["request_end"], "complete");
    assert_eq!(request(http, HOST, "/ok", "after").0, 200);
    line(&out, "req_id", "after");
    assert!(find(&out, "req_id", "noroute").is_none(), "the default backend is not logged by default");
}

#[test]
fn logging_keys_apply_without_a_restart() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), backend, &[("disable-access-log", "true")]);
    let (_weir, http, _admin, log, out) = start(dir.path(), &[]);
    wait_until("the route", || request(http, HOST, "/ok", "warm").0 == 200);
    assert_eq!(request(http, HOST, "/ok", "off").0, 200);

    // A format of one's own, skipped URLs, the default backend logged, the error log at debug.
    configmap(
        dir.path(),
        &[
            (
                "log-format-upstream",
                r#"{"id": "$req_id", "s": $status, "tls": "$ssl_protocol", "done": "$request_completion", "len": $request_length}"#,
            ),
            ("skip-access-log-urls", "/healthz,/ok?skip"),
            ("enable-access-log-for-default-backend", "true"),
            ("error-log-level", "debug"),
        ],
    );
    wait_until("the new format", || {
        request(http, HOST, "/ok", "probe").0 == 200 && find(&out, "id", "probe").is_some()
    });
    assert!(find(&out, "req_id", "off").is_none() && find(&out, "id", "off").is_none(), "disable-access-log");
    assert_eq!(request(http, HOST, "/ok?skip", "skipped").0, 200);
    assert_eq!(request(http, "nowhere.test", "/", "noroute").0, 404);
    assert_eq!(request(http, HOST, "/ok", "custom").0, 200);
    let v = line(&out, "id", "custom");
    assert_eq!(v.as_object().unwrap().len(), 5, "only the format's fields: {v}");
    assert_eq!((v["s"].as_u64(), v["tls"].as_str(), v["done"].as_str()), (Some(200), Some(""), Some("OK")));
    assert_eq!(v["len"], request_length(HOST, "/ok", "custom"));
    assert_eq!(line(&out, "id", "noroute")["s"], 404);
    assert!(find(&out, "id", "skipped").is_none(), "skip-access-log-urls");
    // error-log-level: debug shows the proxy's per-request debug events on standard error.
    wait_until("a debug event", || {
        log.lock().unwrap().iter().any(|l| l.contains("DEBUG") && l.contains("proxied"))
    });

    // Back to the defaults: the default fields, and no debug events any more.
    configmap(dir.path(), &[]);
    wait_until("the default format", || {
        request(http, HOST, "/ok", "back").0 == 200 && find(&out, "req_id", "back").is_some()
    });
    let debug_lines = || log.lock().unwrap().iter().filter(|l| l.contains("DEBUG")).count();
    let before = debug_lines();
    assert_eq!(request(http, HOST, "/ok", "quiet").0, 200);
    line(&out, "req_id", "quiet");
    assert_eq!(debug_lines(), before, "error-log-level gone: back to --log-level info");
}

#[test]
fn the_enable_access_log_annotation_silences_an_ingress() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), backend, &[]);
    let quiet = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: quiet
  namespace: default
  annotations: {nginx.ingress.kubernetes.io/enable-access-log: "false"}
spec:
  ingressClassName: weir
  rules:
  - host: app.test
    http:
      paths:
      - {path: /quiet, pathType: Prefix, backend: {service: {name: echo, port: {number: 80}}}}
"#;
    std::fs::write(dir.path().join("quiet.yaml"), quiet).unwrap();
    let (_weir, http, _admin, _log, out) = start(dir.path(), &[]);
    wait_until("both routes", || {
        request(http, HOST, "/quiet", "w1").0 == 200 && request(http, HOST, "/", "w2").0 == 200
    });
    assert_eq!(request(http, HOST, "/quiet/x", "silenced").0, 200);
    assert_eq!(request(http, HOST, "/loud", "loud").0, 200);
    assert_eq!(line(&out, "req_id", "loud")["ingress_name"], "web");
    assert!(find(&out, "req_id", "silenced").is_none());
}

/// A destination that takes nothing (a FIFO nobody reads): the writer holds one line, the queue
/// four more, the rest are dropped and counted; requests are not held up.
#[test]
fn a_full_queue_drops_and_counts_lines() {
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), backend, &[]);
    let fifo = dir.path().join("access.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let (_weir, addrs, _log) = spawn_logged(
        &serve_args(dir.path(), &["--access-log", fifo.to_str().unwrap(), "--access-log-queue", "4"]),
        &["http", "admin"],
        None,
    );
    let (http, admin) = (addrs[0], addrs[1]);
    wait_until("the route", || request(http, HOST, "/ok", "warm").0 == 200);
    let started = Instant::now();
    for i in 0..19 {
        assert_eq!(request(http, HOST, "/ok", &format!("r{i}")).0, 200);
    }
    assert!(started.elapsed() < Duration::from_secs(10), "requests did not wait for the log");
    let dropped = || {
        let (_, body) = request(admin, "x", "/metrics", "m");
        let text = String::from_utf8(body).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("weir_access_log_dropped_total{log=\"http\"} "))
            .map(|n| n.trim().parse::<u64>().unwrap())
    };
    // The writer waits for a reader before it takes lines off the queue: four are kept.
    wait_until("16 dropped lines", || dropped() == Some(16));
    // The reader comes: the four kept lines arrive, in order.
    let reader = std::fs::File::open(&fifo).unwrap();
    let mut lines = BufReader::new(reader).lines();
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let v: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
            v["req_id"].as_str().unwrap().to_string()
        })
        .collect();
    // Four lines, in the order of their requests. Which requests keep a place is timing: a line
    // is queued when its response has ended (possibly just after the next request's), and the
    // writer takes lines off the queue as it tries the destination.
    assert_eq!(ids[0], "warm", "{ids:?}");
    let numbers: Vec<u32> = ids[1..].iter().map(|id| id.trim_start_matches('r').parse().unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

/// `$ssl_protocol` and `$ssl_cipher` on HTTPS, with curl as the client.
#[test]
fn https_requests_log_their_tls_version_and_cipher() {
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        let why = "curl (scripts/test.sh install)";
        assert!(
            std::env::var("WEIR_REQUIRE_ALL").as_deref() != Ok("1"),
            "{why} is required (WEIR_REQUIRE_ALL=1)"
        );
        eprintln!("skipping: needs {why}");
        return;
    }
    let backend = backend();
    let dir = tempfile::tempdir().unwrap();
    let format = r#"{"id": "$req_id", "scheme": "$scheme", "tls": "$ssl_protocol", "cipher": "$ssl_cipher"}"#;
    manifests(dir.path(), backend, &[("log-format-upstream", format)]);
    let (_weir, addrs, _log, out) = spawn_with_stdout(&serve_args(dir.path(), &[]), &["https"], None);
    let https = addrs[0];
    let curl = |id: &str, tls: &[&str]| {
        let resolve = format!("{HOST}:{}:127.0.0.1", https.port());
        let url = format!("https://{HOST}:{}/ok", https.port());
        let status = std::process::Command::new("curl")
            .args(["-sk", "--resolve", &resolve, "-H", &format!("X-Request-ID: {id}"), "-o", "/dev/null"])
            .args(tls)
            .args(["-w", "%{http_code}", &url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&status.stdout).to_string()
    };
    wait_until("the route over HTTPS", || curl("warm", &["--tlsv1.3"]) == "200");
    assert_eq!(curl("tls13", &["--tlsv1.3"]), "200");
    assert_eq!(curl("tls12", &["--tlsv1.2", "--tls-max", "1.2"]), "200");
    let v = line(&out, "id", "tls13");
    assert_eq!((v["scheme"].as_str(), v["tls"].as_str()), (Some("https"), Some("TLSv1.3")), "{v}");
    assert!(v["cipher"].as_str().unwrap().starts_with("TLS_"), "OpenSSL's TLS 1.3 names: {v}");
    let v = line(&out, "id", "tls12");
    assert_eq!(v["tls"], "TLSv1.2", "{v}");
    assert!(v["cipher"].as_str().unwrap().starts_with("ECDHE-"), "OpenSSL's TLS 1.2 names: {v}");
}
