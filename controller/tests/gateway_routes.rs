//! HTTPRoutes routing real traffic: `weir serve --manifests` with a GatewayClass, a Gateway and
//! HTTPRoutes in front of backends on loopback that say who they are; each request asserts
//! which backend answered. One behaviour per test, each citing the field documentation of
//! Gateway API `apis/v1` it checks.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

mod support_gateway;
mod support_proc;

use support_gateway::{service, write};
use support_proc::{Proc, spawn_serve};

// === backends ===

/// A backend answering every request `200` with a body of its name, the request line and the
/// request headers (one per line, names lower case); keeps connections open.
fn backend(name: &'static str) -> SocketAddr {
    recording_backend(name, Seen::default())
}

/// The request lines a backend received.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// [`backend`], noting each request line in `seen` when it arrives and then, once the request
/// is read, what it answers (request line and headers) followed by `body=` and the request's
/// body; a path containing `/slow` is answered after two seconds.
fn recording_backend(name: &'static str, seen: Seen) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let seen = seen.clone();
            std::thread::spawn(move || answer(stream, name, &seen));
        }
    });
    addr
}

fn answer(mut stream: TcpStream, name: &str, seen: &Seen) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        seen.lock().unwrap().push(line.trim_end().to_string());
        if line.contains("/slow") {
            std::thread::sleep(Duration::from_secs(2));
        }
        let mut body = format!("backend={name}\nrequest={}\n", line.trim_end());
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            let h = h.trim_end();
            if let Some((n, v)) = h.split_once(':') {
                let n = n.to_ascii_lowercase();
                if n == "content-length" {
                    length = v.trim().parse().unwrap_or(0);
                }
                body.push_str(&format!("{n}: {}\n", v.trim()));
            }
        }
        let mut request_body = vec![0u8; length];
        if reader.read_exact(&mut request_body).is_err() {
            return;
        }
        seen.lock().unwrap().push(format!("{body}body={}", String::from_utf8_lossy(&request_body)));
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nX-Backend: {name}\r\n\r\n",
            body.len()
        );
        if stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).is_err() {
            return;
        }
    }
}

/// Tries per request id a [`flaky_backend`] got.
type Tries = std::sync::Arc<std::sync::Mutex<BTreeMap<String, usize>>>;

/// A backend simulating failures as the conformance suite's does (`responseCode`,
/// `succeedAfter`): a request `?id=ID&code=CODE&fail=N` is answered `CODE` the first `N` times
/// that `ID` comes, then `200`, after `sleep=MS` when the query has it; counts the tries per
/// id as they arrive. One request per connection, each connection in a thread of its own.
fn flaky_backend() -> (SocketAddr, Tries) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let tries = Tries::default();
    let counted = tries.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                let query =
                    line.split_whitespace().nth(1).and_then(|t| t.split_once('?')).map_or("", |(_, q)| q);
                let param = |name: &str| {
                    query
                        .split('&')
                        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                        .unwrap_or("")
                };
                let n = {
                    let mut tries = counted.lock().unwrap();
                    let n = tries.entry(param("id").to_string()).or_default();
                    *n += 1;
                    *n
                };
                let fail: usize = param("fail").parse().unwrap_or(0);
                let code = if n <= fail { param("code") } else { "200" };
                if let Ok(ms) = param("sleep").parse() {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
                let head = format!(
                    "HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\nX-Backend: flaky\r\n\r\n"
                );
                let _ = stream.write_all(head.as_bytes());
            });
        }
    });
    (addr, tries)
}

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: weir}\n\
spec: {controllerName: weir.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: default}\n\
spec: {gatewayClassName: weir, listeners: [{name: http, port: 80, protocol: HTTP}]}\n---\n";

/// An HTTPRoute `name` on the Gateway, created at `created`, with `spec` (YAML lines indented
/// by two spaces, after `parentRefs`).
fn http_route(name: &str, created: &str, spec: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default, creationTimestamp: \"{created}\"}}\n\
         spec:\n  parentRefs: [{{name: edge}}]\n{spec}---\n"
    )
}

/// Starts the backends `names` and writes their Services to `dir/services.yaml`.
fn backends(dir: &Path, names: &[&'static str]) {
    let yaml: String = names.iter().map(|n| service(n, backend(n))).collect();
    write(dir, "services.yaml", &format!("{GATEWAY}{yaml}"));
}

fn weir(dir: &Path) -> (Proc, SocketAddr) {
    let (proc, addrs) = spawn_serve(dir, &[], &["http"]);
    (proc, addrs[0])
}

// === requests ===

/// One answer: status, headers (names lower case) and body.
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    /// The backend that answered (`-` when weir answered itself).
    fn backend(&self) -> &str {
        self.headers.get("x-backend").map_or("-", String::as_str)
    }
}

/// `METHOD target` for `host` with `headers`, over a new connection.
fn send(addr: SocketAddr, method: &str, host: &str, target: &str, headers: &[(&str, &str)]) -> Answer {
    send_body(addr, method, host, target, headers, "")
}

/// [`send`] with a request body.
fn send_body(
    addr: SocketAddr,
    method: &str,
    host: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer { status, headers, body: body.to_string() }
}

fn get(addr: SocketAddr, host: &str, target: &str) -> Answer {
    send(addr, "GET", host, target, &[])
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// === tests ===

/// A precedence step: its name, method, target, headers and the backend that must answer.
type Case = (&'static str, &'static str, &'static str, &'static [(&'static str, &'static str)], &'static str);

/// `HTTPRouteRule.matches`: "precedence must be given to the match having: "Exact" path match;
/// "Prefix" path match with largest number of characters; Method match; Largest number of
/// header matches; Largest number of query param matches"; then "The oldest Route based on
/// creation timestamp", "The Route appearing first in alphabetical order by
/// {namespace}/{name}", then "the FIRST matching rule (in list order)". One request per step.
#[test]
fn httproute_match_precedence_each_step() {
    let dir = tempfile::tempdir().unwrap();
    backends(
        dir.path(),
        &[
            "exact", "prefix", "method", "method2", "header1", "header2", "query", "older", "newer", "alpha",
            "zeta",
        ],
    );
    let routes = [
        http_route(
            "newer",
            "2024-02-01T00:00:00Z",
            "  hostnames: [p.test]\n  rules:\n  - backendRefs: [{name: newer, port: 80}]\n",
        ),
        http_route(
            "older",
            "2024-01-01T00:00:00Z",
            "  hostnames: [p.test]\n  rules:\n\
             \x20 - backendRefs: [{name: older, port: 80}]\n\
             \x20 - matches: [{queryParams: [{name: v, value: \"1\"}]}]\n    backendRefs: [{name: query, port: 80}]\n\
             \x20 - matches: [{headers: [{name: x-a, value: \"1\"}]}]\n    backendRefs: [{name: header1, port: 80}]\n\
             \x20 - matches: [{headers: [{name: x-a, value: \"1\"}, {name: x-b, type: RegularExpression, value: \"b+\"}]}]\n    backendRefs: [{name: header2, port: 80}]\n\
             \x20 - matches: [{method: POST}]\n    backendRefs: [{name: method, port: 80}]\n\
             \x20 - matches: [{method: POST}]\n    backendRefs: [{name: method2, port: 80}]\n\
             \x20 - matches: [{path: {type: PathPrefix, value: /long}}]\n    backendRefs: [{name: prefix, port: 80}]\n\
             \x20 - matches: [{path: {type: Exact, value: /long}}]\n    backendRefs: [{name: exact, port: 80}]\n",
        ),
        // Same age: by namespace/name.
        http_route(
            "zeta",
            "2024-03-01T00:00:00Z",
            "  hostnames: [n.test]\n  rules: [{backendRefs: [{name: zeta, port: 80}]}]\n",
        ),
        http_route(
            "alpha",
            "2024-03-01T00:00:00Z",
            "  hostnames: [n.test]\n  rules: [{backendRefs: [{name: alpha, port: 80}]}]\n",
        ),
    ];
    write(dir.path(), "routes.yaml", &routes.concat());
    let (_weir, http) = weir(dir.path());
    let cases: &[Case] = &[
        ("Exact path", "GET", "/long", &[("x-a", "1")], "exact"),
        ("longest PathPrefix", "POST", "/long/x", &[("x-a", "1")], "prefix"),
        ("method, first rule", "POST", "/", &[("x-a", "1"), ("x-b", "bb")], "method"),
        ("most headers", "GET", "/?v=1", &[("x-a", "1"), ("x-b", "bb")], "header2"),
        ("headers", "GET", "/?v=1", &[("x-a", "1"), ("x-b", "no")], "header1"),
        ("query params", "GET", "/?v=1", &[], "query"),
        ("query value must match", "GET", "/?v=2", &[], "older"),
        ("oldest route", "GET", "/other", &[], "older"),
    ];
    for (step, method, target, headers, want) in cases {
        let a = send(http, method, "p.test", target, headers);
        assert_eq!(
            (a.status, a.backend()),
            (200, *want),
            "{step}: {method} {target} {headers:?}\n{}",
            a.body
        );
    }
    let a = get(http, "n.test", "/");
    assert_eq!(a.backend(), "alpha", "same creationTimestamp: default/alpha before default/zeta");
    assert_eq!(get(http, "nothing.test", "/").status, 404);
}

/// `HTTPBackendRef.weight` ("proportion of requests forwarded to the referenced backend"; 0:
/// none) and `HTTPRouteRule.backendRefs` ("the proportion of requests that would otherwise have
/// been routed to an invalid backend MUST receive a 500 status code"; all invalid: all 500).
#[test]
fn httproute_weights_and_500_for_unresolved_refs() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["a", "b", "z"]);
    let routes = [
        http_route(
            "split",
            "2024-01-01T00:00:00Z",
            "  hostnames: [w.test]\n  rules:\n  - backendRefs: [{name: a, port: 80, weight: 3}, {name: b, port: 80, weight: 1}, {name: z, port: 80, weight: 0}]\n",
        ),
        http_route(
            "half",
            "2024-01-01T00:00:00Z",
            "  hostnames: [u.test]\n  rules:\n  - backendRefs: [{name: a, port: 80}, {name: missing, port: 80}]\n",
        ),
        http_route(
            "none",
            "2024-01-01T00:00:00Z",
            "  hostnames: [x.test]\n  rules:\n  - backendRefs: [{name: other, namespace: elsewhere, port: 80}, {group: example.com, kind: Bucket, name: b}]\n",
        ),
    ];
    write(dir.path(), "routes.yaml", &routes.concat());
    let (_weir, http) = weir(dir.path());
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..400 {
        let a = get(http, "w.test", "/");
        *seen.entry(format!("{} {}", a.status, a.backend())).or_default() += 1;
    }
    let (a, b) = (seen.get("200 a").copied().unwrap_or(0), seen.get("200 b").copied().unwrap_or(0));
    assert_eq!(a + b, 400, "only a and b answer (weight 0 excluded): {seen:?}");
    assert!((240..=360).contains(&a), "3:1 split, about 300 of 400 to a: {seen:?}");

    let mut errors = 0;
    for _ in 0..400 {
        let r = get(http, "u.test", "/");
        match (r.status, r.backend()) {
            (200, "a") => {}
            (500, "-") => errors += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!((140..=260).contains(&errors), "about half of 400 answer 500: {errors}");
    for _ in 0..20 {
        assert_eq!(get(http, "x.test", "/").status, 500, "every ref refused or unsupported");
    }
}

/// Hostnames (`HTTPRouteSpec.hostnames`: a wildcard is a suffix match, `*.example.com` matches
/// `foo.test.example.com`), Ingress and HTTPRoute on one host (docs/gateway-api.md: a match
/// with conditions goes first, a match without loses to the Ingress's path), and hot reload of
/// an edited HTTPRoute file.
#[test]
fn httproute_beside_ingress_wildcards_and_hot_reload() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["ing", "gw", "canary", "deep", "next"]);
    let ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: ing, namespace: default}\n\
        spec:\n  ingressClassName: weir\n  rules:\n  - host: both.test\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: ing, port: {number: 80}}}}]}\n";
    write(dir.path(), "ingress.yaml", ingress);
    let route = |backend: &str| {
        http_route(
            "gw",
            "2024-01-01T00:00:00Z",
            &format!(
                "  hostnames: [both.test]\n  rules:\n  - matches: [{{path: {{value: /}}}}, {{path: {{value: /gateway-only}}}}]\n    backendRefs: [{{name: {backend}, port: 80}}]\n\
                 \x20 - matches: [{{headers: [{{name: x-canary, value: \"yes\"}}]}}]\n    backendRefs: [{{name: canary, port: 80}}]\n"
            ),
        ) + &http_route(
            "deep",
            "2024-01-01T00:00:00Z",
            "  hostnames: [\"*.wild.test\"]\n  rules: [{backendRefs: [{name: deep, port: 80}]}]\n",
        )
    };
    write(dir.path(), "routes.yaml", &route("gw"));
    let (_weir, http) = weir(dir.path());
    assert_eq!(get(http, "both.test", "/").backend(), "ing", "the Ingress keeps its path");
    assert_eq!(send(http, "GET", "both.test", "/", &[("x-canary", "yes")]).backend(), "canary");
    assert_eq!(get(http, "both.test", "/gateway-only/x").backend(), "gw");
    assert_eq!(get(http, "a.b.wild.test", "/").backend(), "deep", "suffix match over two labels");
    assert_eq!(get(http, "a.wild.test", "/").backend(), "deep");
    assert_eq!(get(http, "wild.test", "/").status, 404, "not the suffix itself");

    write(dir.path(), "routes.yaml", &route("next"));
    wait_until("the edited HTTPRoute to serve", || {
        get(http, "both.test", "/gateway-only").backend() == "next"
    });
    std::fs::remove_file(dir.path().join("ingress.yaml")).unwrap();
    wait_until("the HTTPRoute to take the path over", || get(http, "both.test", "/").backend() == "next");
    std::fs::remove_file(dir.path().join("routes.yaml")).unwrap();
    wait_until("the routes to go", || get(http, "both.test", "/").status == 404);
}

/// Filters (`HTTPRouteFilter`): `RequestHeaderModifier` and `ResponseHeaderModifier` (set, add,
/// remove), `RequestRedirect` (scheme, hostname, port, `ReplacePrefixMatch`, statusCode),
/// `URLRewrite` (hostname, `ReplacePrefixMatch`, `ReplaceFullPath`), `RequestMirror`, an
/// unsupported type ("requests that would have been processed by that filter MUST receive a
/// HTTP error response": 500), and `timeouts.backendRequest`.
#[test]
fn httproute_filters_and_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let mirrored = Seen::default();
    let mirror = recording_backend("mirror", mirrored.clone());
    let yaml: String = ["app"].iter().map(|n| service(n, backend(n))).collect();
    write(dir.path(), "services.yaml", &format!("{GATEWAY}{yaml}{}", service("mirror", mirror)));
    let rule = |path: &str, filters: &str| {
        format!(
            "  - matches: [{{path: {{value: {path}}}}}]\n    filters: {filters}\n    backendRefs: [{{name: app, port: 80}}]\n"
        )
    };
    let spec = [
        "  hostnames: [f.test]\n  rules:\n".to_string(),
        rule(
            "/headers",
            "[{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Set, value: a}], add: [{name: x-add, value: b}], remove: [x-remove]}},\
             {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-resp, value: r}]}}]",
        ),
        rule("/redirect", "[{type: RequestRedirect, requestRedirect: {scheme: https, hostname: other.test, statusCode: 301}}]"),
        rule(
            "/old",
            "[{type: RequestRedirect, requestRedirect: {port: 8443, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]",
        ),
        rule(
            "/rewrite",
            "[{type: URLRewrite, urlRewrite: {hostname: up.test, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}]",
        ),
        rule("/full", "[{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /only}}}]"),
        rule("/mirror", "[{type: RequestMirror, requestMirror: {backendRef: {name: mirror, port: 80}}}]"),
        rule("/cors", "[{type: CORS, cors: {allowOrigins: [\"https://a.test\"]}}]"),
        rule("/ext", "[{type: ExtensionRef, extensionRef: {group: example.com, kind: Plugin, name: p}}]"),
        "  - matches: [{path: {value: /slow}}]\n    timeouts: {backendRequest: 300ms}\n    backendRefs: [{name: app, port: 80}]\n".to_string(),
    ]
    .concat();
    write(dir.path(), "routes.yaml", &http_route("filters", "2024-01-01T00:00:00Z", &spec));
    let (_weir, http) = weir(dir.path());

    let a =
        send(http, "GET", "f.test", "/headers", &[("x-add", "orig"), ("x-remove", "1"), ("x-set", "old")]);
    assert_eq!((a.status, a.backend()), (200, "app"), "{}", a.body);
    assert!(a.body.contains("x-set: a\n"), "{}", a.body);
    assert!(a.body.contains("x-add: orig\n") && a.body.contains("x-add: b\n"), "{}", a.body);
    assert!(!a.body.contains("x-remove"), "{}", a.body);
    assert_eq!(a.headers.get("x-resp").map(String::as_str), Some("r"));

    let a = get(http, "f.test", "/redirect/x?q=1");
    assert_eq!(
        (a.status, a.headers.get("location").map(String::as_str)),
        (301, Some("https://other.test/redirect/x?q=1"))
    );
    let a = get(http, "f.test", "/old/x");
    assert_eq!(
        (a.status, a.headers.get("location").map(String::as_str)),
        (302, Some("http://f.test:8443/new/x"))
    );

    let a = get(http, "f.test", "/rewrite/x?y=1");
    assert!(a.body.contains("request=GET /v2/x?y=1 HTTP/1.1\n"), "{}", a.body);
    assert!(a.body.contains("host: up.test\n"), "{}", a.body);
    let a = get(http, "f.test", "/full/deep/path");
    assert!(a.body.contains("request=GET /only HTTP/1.1\n"), "{}", a.body);

    assert_eq!(get(http, "f.test", "/mirror/m1").backend(), "app");
    wait_until("the mirror to get its copy", || {
        mirrored.lock().unwrap().iter().any(|l| l.starts_with("GET /mirror/m1 "))
    });

    assert_eq!(get(http, "f.test", "/ext").status, 500, "an unsupported filter's rule answers 500");
    // `HTTPCORSFilter`: a preflight from an allowed origin is answered; a request from it gets
    // the CORS headers on the backend's answer; another origin gets none.
    let origin = [("origin", "https://a.test"), ("access-control-request-method", "GET")];
    let a = send(http, "OPTIONS", "f.test", "/cors", &origin);
    assert_eq!(a.status, 204, "{}", a.body);
    assert_eq!(a.headers.get("access-control-allow-origin").map(String::as_str), Some("https://a.test"));
    let a = send(http, "GET", "f.test", "/cors", &[("origin", "https://a.test")]);
    assert_eq!((a.status, a.backend()), (200, "app"));
    assert_eq!(a.headers.get("access-control-allow-origin").map(String::as_str), Some("https://a.test"));
    let a = send(http, "GET", "f.test", "/cors", &[("origin", "https://b.test")]);
    assert_eq!((a.status, a.headers.get("access-control-allow-origin")), (200, None));
    assert_eq!(get(http, "f.test", "/headers").status, 200, "the other rules still serve");

    // The backend answers after 2 s; without the rule's timeout weir would wait 60 s.
    assert_eq!(get(http, "f.test", "/slow").status, 504, "timeouts.backendRequest: 300ms");
}

/// `HTTPRouteFilter.requestMirror`: "This filter can be used multiple times within the same
/// rule" (conformance `HTTPRouteRequestMultipleMirrors`, its two rules): the client is answered
/// by infra-backend-v1, and infra-backend-v2 and infra-backend-v3 each get their own copy of the
/// request, body included; with `RequestHeaderModifier` in the rule the copies carry the
/// modified headers, as the backend does.
#[test]
fn httproute_request_multiple_mirrors() {
    let dir = tempfile::tempdir().unwrap();
    let (v2_seen, v3_seen) = (Seen::default(), Seen::default());
    let services = [
        service("infra-backend-v1", backend("infra-backend-v1")),
        service("infra-backend-v2", recording_backend("infra-backend-v2", v2_seen.clone())),
        service("infra-backend-v3", recording_backend("infra-backend-v3", v3_seen.clone())),
    ];
    write(dir.path(), "services.yaml", &format!("{GATEWAY}{}", services.concat()));
    let mirrors = "    - {type: RequestMirror, requestMirror: {backendRef: {name: infra-backend-v2, port: 80}}}\n\
                   \x20   - {type: RequestMirror, requestMirror: {backendRef: {name: infra-backend-v3, port: 80}}}\n";
    let spec = format!(
        "  hostnames: [m.test]\n  rules:\n\
         \x20 - matches: [{{path: {{type: PathPrefix, value: /multi-mirror}}}}]\n    filters:\n{mirrors}\
         \x20   backendRefs: [{{name: infra-backend-v1, port: 80}}]\n\
         \x20 - matches: [{{path: {{type: PathPrefix, value: /multi-mirror-and-modify-request-headers}}}}]\n    filters:\n\
         \x20   - {{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: X-Header-Set, value: set-overwrites-values}}], \
         add: [{{name: X-Header-Add, value: header-val-1}}, {{name: X-Header-Add-Append, value: header-val-2}}], remove: [X-Header-Remove]}}}}\n\
         {mirrors}\
         \x20   backendRefs: [{{name: infra-backend-v1, port: 80}}]\n"
    );
    write(dir.path(), "routes.yaml", &http_route("request-multiple-mirrors", "2024-01-01T00:00:00Z", &spec));
    let (_weir, http) = weir(dir.path());

    let copied = |seen: &Seen, line: &str, body: &str| {
        seen.lock().unwrap().iter().any(|l| l.contains(&format!("request={line}\n")) && l.ends_with(body))
    };
    let a = send_body(http, "POST", "m.test", "/multi-mirror?id=1", &[], "hello");
    assert_eq!((a.status, a.backend()), (200, "infra-backend-v1"), "{}", a.body);
    for (name, seen) in [("v2", &v2_seen), ("v3", &v3_seen)] {
        wait_until(&format!("infra-backend-{name} to get its copy"), || {
            copied(seen, "POST /multi-mirror?id=1 HTTP/1.1", "body=hello")
        });
    }

    let headers = [("X-Header-Remove", "remove-val"), ("X-Header-Add-Append", "append-val-1")];
    let a =
        send_body(http, "PUT", "m.test", "/multi-mirror-and-modify-request-headers?id=2", &headers, "data");
    assert_eq!((a.status, a.backend()), (200, "infra-backend-v1"), "{}", a.body);
    for want in [
        "x-header-set: set-overwrites-values\n",
        "x-header-add: header-val-1\n",
        "x-header-add-append: append-val-1\n",
        "x-header-add-append: header-val-2\n",
    ] {
        assert!(a.body.contains(want), "{want}: {}", a.body);
    }
    assert!(!a.body.contains("x-header-remove"), "{}", a.body);
    for (name, seen) in [("v2", &v2_seen), ("v3", &v3_seen)] {
        let line = "PUT /multi-mirror-and-modify-request-headers?id=2 HTTP/1.1";
        wait_until(&format!("infra-backend-{name} to get its copy"), || copied(seen, line, "body=data"));
        let seen = seen.lock().unwrap();
        let copy = seen.iter().find(|l| l.contains(line) && l.contains("body=")).unwrap();
        assert!(copy.contains("x-header-set: set-overwrites-values\n"), "{copy}");
        assert!(copy.contains("x-header-add: header-val-1\n"), "{copy}");
        assert!(!copy.contains("x-header-remove"), "{copy}");
    }
}

/// `HTTPRouteRule.retry` (`HTTPRouteRetry`, experimental channel in v1.6; conformance
/// `HTTPRouteRetry`, its manifest and cases): an answer with a listed code is retried up to
/// `attempts` times ("If the maximum number of retries has been attempted without a successful
/// response from the backend, the Gateway MUST return an error": the last answer), an unlisted
/// code is not; the backend counts the tries. A non-idempotent request that went out is not sent
/// again (weir's rule, as for `proxy-next-upstream`); `backoff` delays the retries.
#[test]
fn httproute_retry_codes_and_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (flaky, tries) = flaky_backend();
    write(dir.path(), "services.yaml", &format!("{GATEWAY}{}", service("infra-backend-v3", flaky)));
    let rule = |path: &str, retry: &str| {
        format!(
            "  - matches: [{{path: {{type: PathPrefix, value: {path}}}}}]\n    retry: {retry}\n    backendRefs: [{{name: infra-backend-v3, port: 80}}]\n"
        )
    };
    let spec = [
        "  hostnames: [r.test]\n  rules:\n".to_string(),
        rule("/retry/code-500-attempts-3", "{codes: [500], attempts: 3}"),
        rule("/retry/code-all-attempts-2", "{codes: [500, 502, 503, 504], attempts: 2}"),
        rule("/retry/backoff", "{codes: [500], attempts: 1, backoff: 300ms}"),
        rule(
            "/retry/bounded",
            "{codes: [500], attempts: 7}\n    timeouts: {request: 1500ms, backendRequest: 300ms}",
        ),
    ]
    .concat();
    write(dir.path(), "routes.yaml", &http_route("retries", "2024-01-01T00:00:00Z", &spec));
    let (_weir, http) = weir(dir.path());
    wait_until("the route to serve", || get(http, "r.test", "/retry/backoff?id=warm").status == 200);
    // (method, path, code, failures before success, expected status, expected tries)
    let cases: &[(&str, &str, u16, usize, u16, usize)] = &[
        ("GET", "/retry/code-500-attempts-3", 500, 2, 200, 3),
        ("GET", "/retry/code-500-attempts-3", 500, 4, 500, 4),
        ("GET", "/retry/code-500-attempts-3", 503, 2, 503, 1),
        ("GET", "/retry/code-all-attempts-2", 500, 1, 200, 2),
        ("GET", "/retry/code-all-attempts-2", 500, 3, 500, 3),
        ("GET", "/retry/code-all-attempts-2", 502, 1, 200, 2),
        ("GET", "/retry/code-all-attempts-2", 502, 3, 502, 3),
        ("GET", "/retry/code-all-attempts-2", 503, 1, 200, 2),
        ("GET", "/retry/code-all-attempts-2", 503, 3, 503, 3),
        ("GET", "/retry/code-all-attempts-2", 504, 1, 200, 2),
        ("GET", "/retry/code-all-attempts-2", 504, 3, 504, 3),
        ("HEAD", "/retry/code-500-attempts-3", 500, 1, 200, 2),
        ("POST", "/retry/code-500-attempts-3", 500, 1, 500, 1),
        ("GET", "/retry/backoff", 500, 1, 200, 2),
    ];
    for (i, (method, path, code, fail, want, want_tries)) in cases.iter().enumerate() {
        let target = format!("{path}?id={i}&code={code}&fail={fail}");
        let a = send(http, method, "r.test", &target, &[]);
        let got = tries.lock().unwrap().get(&i.to_string()).copied().unwrap_or(0);
        assert_eq!((a.status, got), (*want, *want_tries), "case {i}: {method} {target}");
    }

    // `timeouts.request` bounds the tries together ("may result in more than one call from the
    // gateway to the destination backend, for example, if automatic retries are supported"):
    // each try waits 300 ms (backendRequest) for an answer that takes 2 s, and no try starts or
    // waits past 1.5 s. Without the bound all 8 tries (7 attempts) would go, 2.4 s in all.
    let a = send(http, "GET", "r.test", "/retry/bounded?id=bounded&sleep=2000", &[]);
    let got = tries.lock().unwrap().get("bounded").copied().unwrap_or(0);
    assert_eq!(a.status, 504, "the request timed out");
    assert!((2..=5).contains(&got), "{got} tries in 1.5 s of 300 ms each");
}
