//! The access log's upstream side as a user reads it: `$upstream_connect_time` (a number for a
//! new connection, `0.000` for a reused one, one value per endpoint tried), `$request_length` of
//! a chunked upload (its body counted as read), and the auth-url subrequest's own line with
//! `enable-auth-access-log` (none by default). Real `weir serve` and `weir echo` processes, and
//! an authentication service, on loopback.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support_proc;

use support_proc::{Log, Proc, serve_args, spawn, spawn_with_stdout};

const HOST: &str = "app.test";

const FORMAT: &str = r#"{"id": "$req_id", "status": $status, "addr": "$upstream_addr", "connect": "$upstream_connect_time", "len": $request_length, "end": "$request_end", "ingress": "$ingress_name", "upstream_status": "$upstream_status"}"#;

/// A Service `echo` with these endpoints, an Ingress for `app.test` `/`, and the ConfigMap with
/// [`FORMAT`].
fn manifests(dir: &Path, endpoints: &[SocketAddr]) {
    manifests_with(dir, endpoints, "{}", &[]);
}

/// [`manifests`] with the Ingress's `annotations` (a YAML flow map) and more ConfigMap keys.
fn manifests_with(dir: &Path, endpoints: &[SocketAddr], annotations: &str, settings: &[(&str, &str)]) {
    // Each endpoint its own slice (their ports differ).
    let slices: String = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: echo-{i}\n  namespace: default\n  labels: {{kubernetes.io/service-name: echo}}\naddressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints:\n- addresses: [\"{ip}\"]\n",
                port = e.port(),
                ip = e.ip()
            )
        })
        .collect();
    let yaml = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
{slices}---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: web, namespace: default, annotations: {annotations}}}
spec:
  ingressClassName: weir
  rules:
  - host: {HOST}
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 80}}}}}}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: weir-settings, namespace: default}}
data:
  log-format-upstream: {format}
{more}"#,
        format = serde_json::to_string(FORMAT).unwrap(),
        more = settings
            .iter()
            .map(|(k, v)| format!("  {k}: {}\n", serde_json::to_string(v).unwrap()))
            .collect::<String>(),
    );
    let tmp = dir.join("app.yaml.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(tmp, dir.join("app.yaml")).unwrap();
}

/// A `weir echo` backend.
fn echo() -> (Proc, SocketAddr) {
    let (proc, addrs) = spawn(&["echo", "--listen", "127.0.0.1:0"], &["listen"]);
    (proc, addrs[0])
}

/// A loopback address nothing listens on (connections are refused).
fn dead() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Sends `head` (and `body`) on a new connection and reads the response to its end (the request
/// says `Connection: close`); its status.
fn exchange(addr: SocketAddr, head: &str, body: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    std::str::from_utf8(&out[9..12]).unwrap().parse().unwrap()
}

fn get(addr: SocketAddr, id: &str) -> u16 {
    get_as(addr, id, "good")
}

/// [`get`] with `Authorization: Bearer TOKEN`.
fn get_as(addr: SocketAddr, id: &str, token: &str) -> u16 {
    let head = format!(
        "GET / HTTP/1.1\r\nHost: {HOST}\r\nX-Request-ID: {id}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    exchange(addr, &head, b"")
}

/// The access-log line whose `id` is `id`, waited for.
fn line(out: &Log, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = find(out, id) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no access-log line with id={id}; stdout: {:?}",
            out.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn find(out: &Log, id: &str) -> Option<Value> {
    all(out, id).into_iter().next()
}

/// Every access-log line whose `id` is `id`, in order.
fn all(out: &Log, id: &str) -> Vec<Value> {
    let lines = out.lock().unwrap().clone();
    lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|v| v["id"] == id).collect()
}

/// `weir serve` with the manifests of `dir`, its HTTP address and standard output.
fn serve(dir: &Path) -> (Proc, SocketAddr, Log) {
    let (weir, addrs, _log, out) = spawn_with_stdout(&serve_args(dir, &[]), &["http"], None);
    (weir, addrs[0], out)
}

/// Waits until a request with id `id` (numbered) is answered 200; the id that was.
fn first_ok(http: SocketAddr, id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        let id = format!("{id}-{i}");
        if get(http, &id) == 200 {
            return id;
        }
        assert!(Instant::now() < deadline, "the route never answered 200");
        std::thread::sleep(Duration::from_millis(50));
    }
    unreachable!()
}

/// A value of `$upstream_connect_time`: seconds with milliseconds.
fn seconds(v: &str) -> f64 {
    let (int, frac) = v.split_once('.').unwrap_or_else(|| panic!("{v:?} is not seconds.millis"));
    assert!(frac.len() == 3 && int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()), "{v:?}");
    v.parse().unwrap()
}

#[test]
fn upstream_connect_time_is_a_number_zero_when_reused_and_one_per_endpoint_tried() {
    let (_echo, backend) = echo();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &[backend]);
    let (_weir, http, out) = serve(dir.path());

    // The first proxied request opens the upstream connection: its connect time, >= 0.
    let first = first_ok(http, "first");
    let v = line(&out, &first);
    assert_eq!(v["addr"], backend.to_string(), "{v}");
    assert!(seconds(v["connect"].as_str().unwrap()) >= 0.0, "{v}");
    // The next ones reuse it (weir echo keeps connections open): nginx's 0.000.
    for id in ["reused-1", "reused-2"] {
        assert_eq!(get(http, id), 200);
        let v = line(&out, id);
        assert_eq!(v["connect"], "0.000", "a reused connection: {v}");
    }
}

#[test]
fn a_retried_request_logs_a_connect_time_per_endpoint() {
    let (_echo, backend) = echo();
    let refused = dead();
    let dir = tempfile::tempdir().unwrap();
    // The dead endpoint refuses: the request goes on to the live one (proxy-next-upstream
    // `error`, the default), and both are logged.
    manifests(dir.path(), &[refused, backend]);
    let (_weir, http, out) = serve(dir.path());
    first_ok(http, "warm");
    let deadline = Instant::now() + Duration::from_secs(20);
    let retried = (0..)
        .find_map(|i| {
            assert!(Instant::now() < deadline, "no request was retried: {:?}", out.lock().unwrap());
            let id = format!("try-{i}");
            assert_eq!(get(http, &id), 200);
            let v = line(&out, &id);
            v["addr"].as_str().unwrap().contains(", ").then_some(v)
        })
        .unwrap();
    assert_eq!(retried["addr"], format!("{refused}, {backend}"), "{retried}");
    let connect = retried["connect"].as_str().unwrap();
    let values: Vec<&str> = connect.split(", ").collect();
    assert_eq!(values.len(), 2, "one value per endpoint tried: {retried}");
    assert_eq!(values[0], "-", "no connection was made to the refusing endpoint: {retried}");
    assert!(seconds(values[1]) >= 0.0, "{retried}");
}

#[test]
fn a_chunked_upload_counts_its_body_in_request_length() {
    let (_echo, backend) = echo();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &[backend]);
    let (_weir, http, out) = serve(dir.path());
    first_ok(http, "warm");

    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Request-ID: chunked\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let chunks: [&[u8]; 3] = [&[b'a'; 1000], &[b'b'; 3000], &[b'c'; 96]];
    let mut body = Vec::new();
    for chunk in chunks {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(exchange(http, &head, &body), 200);
    let v = line(&out, "chunked");
    // The head as sent and the body's 4,096 bytes as read (the chunk framing is not counted).
    assert_eq!(v["len"], head.len() as u64 + 4096, "{v}");

    // A declared length counts as before.
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: {HOST}\r\nX-Request-ID: sized\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(exchange(http, &head, &[b'x'; 4096]), 200);
    assert_eq!(line(&out, "sized")["len"], head.len() as u64 + 4096);
}

/// An authentication service on loopback, one thread per connection, connections kept open:
/// `Authorization: Bearer good` gets 200, anything else 401.
fn auth_service() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || listener.incoming().map_while(Result::ok).for_each(decide));
    addr
}

/// Answers the requests of one connection to [`auth_service`].
fn decide(stream: TcpStream) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut stream = stream;
        loop {
            // The request line, then headers up to the blank line; only the token matters.
            let (mut ok, mut read) = (false, 0);
            let mut text = String::new();
            while read == 0 || text != "\r\n" {
                text.clear();
                if reader.read_line(&mut text).unwrap_or(0) == 0 {
                    return;
                }
                read += 1;
                ok |= text.eq_ignore_ascii_case("authorization: bearer good\r\n");
            }
            let status = if ok { "200 OK" } else { "401 Unauthorized" };
            let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
            if stream.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    });
}

/// Waits until `id` has `n` access-log lines; them, in order.
fn lines(out: &Log, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let lines = all(out, id);
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "{n} lines with id={id} expected: {lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn auth_subrequests_get_a_line_of_their_own_with_enable_auth_access_log() {
    let (_echo, backend) = echo();
    let auth = auth_service();
    let dir = tempfile::tempdir().unwrap();
    let annotations = format!("{{nginx.ingress.kubernetes.io/auth-url: \"http://{auth}/check\"}}");
    manifests_with(dir.path(), &[backend], &annotations, &[]);
    let (_weir, http, out) = serve(dir.path());

    // By default, as in ingress-nginx: the request's line only.
    let first = first_ok(http, "default");
    assert_eq!(get_as(http, "denied-quietly", "bad"), 401);
    let denied = line(&out, "denied-quietly");
    assert_eq!(
        (denied["status"].as_u64(), denied["end"].as_str()),
        (Some(401), Some("complete")),
        "{denied}"
    );
    // Lines are written in order: a subrequest line of the first request would be there by now.
    assert_eq!(all(&out, &first).len(), 1, "no subrequest line by default: {:?}", all(&out, &first));
    assert_eq!(all(&out, "denied-quietly").len(), 1);

    // `enable-auth-access-log: "true"`, applied without a restart: the subrequest's line, then
    // the request's.
    manifests_with(dir.path(), &[backend], &annotations, &[("enable-auth-access-log", "true")]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = (0..)
        .map(|i| format!("allowed-{i}"))
        .find(|id| {
            assert!(Instant::now() < deadline, "no subrequest line: {:?}", out.lock().unwrap());
            assert_eq!(get(http, id), 200);
            // The request's own line comes last (the log keeps the order lines are written
            // in): once it is there, so is the subrequest's, if there is one.
            let deadline = Instant::now() + Duration::from_secs(15);
            while !all(&out, id).iter().any(|v| v["end"] == "complete") {
                assert!(Instant::now() < deadline, "no line for {id}: {:?}", all(&out, id));
                std::thread::sleep(Duration::from_millis(20));
            }
            all(&out, id).len() == 2
        })
        .unwrap();
    let both = all(&out, &id);
    let (sub, main) = (&both[0], &both[1]);
    assert_eq!(sub["end"], "auth_subrequest", "{sub}");
    assert_eq!((sub["status"].as_u64(), sub["upstream_status"].as_str()), (Some(200), Some("200")), "{sub}");
    assert_eq!(sub["addr"], auth.to_string(), "the authentication service is the upstream: {sub}");
    assert_eq!(sub["ingress"], "web", "{sub}");
    assert_eq!(sub["len"], 0, "{sub}");
    assert!(seconds(sub["connect"].as_str().unwrap()) >= 0.0, "{sub}");
    assert_eq!(
        (main["end"].as_str(), main["addr"].as_str()),
        (Some("complete"), Some(&*backend.to_string()))
    );

    // A denied request: the subrequest's 401, then the request's.
    assert_eq!(get_as(http, "denied", "bad"), 401);
    let denied = lines(&out, "denied", 2);
    assert_eq!(
        (denied[0]["end"].as_str(), denied[0]["status"].as_u64()),
        (Some("auth_subrequest"), Some(401))
    );
    assert_eq!((denied[1]["end"].as_str(), denied[1]["status"].as_u64()), (Some("complete"), Some(401)));
}
