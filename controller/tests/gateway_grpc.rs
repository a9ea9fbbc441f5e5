//! GRPCRoutes routing real gRPC calls: `weir serve --manifests` with a GatewayClass, a Gateway
//! and GRPCRoutes in front of tonic backends on loopback that say who they are; a tonic client
//! calls through weir's HTTP listener (h2c prior knowledge) and each call asserts which backend
//! answered. One behaviour per test, each citing the Gateway API `apis/v1` field documentation
//! (`grpcroute_types.go`, `httproute_types.go`) it checks.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

mod support_gateway;
mod support_proc;

use support_gateway::Ca;
use support_proc::{Proc, serve_args, spawn_serve, spawn_wrapped};

/// The one message type: the backend answers with its name, the path called and the request
/// header `x-added` (when sent).
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
}

// === backends ===

/// A gRPC backend (HTTP/2 only, as gRPC servers are: an HTTP/1.1 request never reaches it)
/// answering every unary call with `NAME PATH [x-added=VALUE]`; counts calls.
async fn grpc_backend(name: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let counted = counted.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async move { Ok::<_, Infallible>(answer(name, req).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http2_only();
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (addr, calls)
}

async fn answer(
    name: &'static str,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<tonic::body::Body> {
    let path = req.uri().path().to_string();
    let added = req.headers().get("x-added").and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
    let svc = tower::service_fn(move |_: Request<Msg>| {
        let text = match &added {
            Some(v) => format!("{name} {path} x-added={v}"),
            None => format!("{name} {path}"),
        };
        async move { Ok::<_, Status>(Response::new(Msg { text })) }
    });
    grpc.unary(svc, req).await
}

/// The manifests of a Service `name` (port 80, with `app_protocol` if given) whose one endpoint
/// is `addr`.
fn service(name: &str, addr: SocketAddr, app_protocol: Option<&str>) -> String {
    let app = app_protocol.map(|a| format!(", appProtocol: {a}")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{ports: [{{name: grpc, port: 80{app}}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: grpc, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n---\n",
        port = addr.port(),
        ip = addr.ip(),
    )
}

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: weir}\n\
spec: {controllerName: weir.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: default}\n\
spec: {gatewayClassName: weir, listeners: [{name: http, port: 80, protocol: HTTP}]}\n---\n";

/// A GRPCRoute `name` on the Gateway, created at `created`, with `spec` (YAML lines indented
/// by two spaces, after `parentRefs`).
fn grpc_route(name: &str, created: &str, spec: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: {name}, namespace: default, creationTimestamp: \"{created}\"}}\n\
         spec:\n  parentRefs: [{{name: edge}}]\n{spec}---\n"
    )
}

/// Starts gRPC backends `names`; their Services (and the Gateway) go to `dir/services.yaml`.
async fn backends(dir: &Path, names: &[&'static str]) -> BTreeMap<&'static str, Arc<AtomicUsize>> {
    let mut yaml = GATEWAY.to_string();
    let mut counts = BTreeMap::new();
    for n in names {
        let (addr, calls) = grpc_backend(n).await;
        yaml.push_str(&service(n, addr, None));
        counts.insert(*n, calls);
    }
    write(dir, "services.yaml", &yaml);
    counts
}

/// Writes `yaml` as `dir/file` (write then rename, as editors do).
fn write(dir: &Path, file: &str, yaml: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

fn weir(dir: &Path) -> (Proc, SocketAddr) {
    let (proc, addrs) = spawn_serve(dir, &[], &["http"]);
    (proc, addrs[0])
}

// === the client ===

/// A channel to weir's HTTP listener (h2c prior knowledge) whose calls carry `:authority`
/// `authority`.
async fn channel(weir: SocketAddr, authority: &'static str) -> tonic::transport::Channel {
    let connector = tower::service_fn(move |_: http::Uri| async move {
        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::TcpStream::connect(weir).await?))
    });
    tonic::transport::Endpoint::from_shared(format!("http://{authority}"))
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap()
}

/// A unary call to `path` with request metadata `headers`: the answer's text and metadata.
async fn call(
    ch: &tonic::transport::Channel,
    path: &str,
    headers: &[(&'static str, &'static str)],
) -> Result<(String, tonic::metadata::MetadataMap), Status> {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let mut req = Request::new(Msg { text: "hi".into() });
    for (n, v) in headers {
        req.metadata_mut().insert(*n, v.parse().unwrap());
    }
    let path = PathAndQuery::try_from(path.to_string()).unwrap();
    let resp = grpc.unary(req, path, ProstCodec::<Msg, Msg>::default()).await?;
    let meta = resp.metadata().clone();
    Ok((resp.into_inner().text, meta))
}

/// The backend that answered a call (the first word of its answer), or the gRPC code weir
/// answered with.
async fn who(ch: &tonic::transport::Channel, path: &str, headers: &[(&'static str, &'static str)]) -> String {
    match call(ch, path, headers).await {
        Ok((text, _)) => text.split(' ').next().unwrap_or_default().to_string(),
        Err(status) => format!("{:?}", status.code()),
    }
}

/// Calls until the answer for `path` is `expected` (the manifests were read), for 30 seconds.
async fn wait_for(ch: &tonic::transport::Channel, path: &str, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = who(ch, path, &[]).await;
        if got == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{path}: still {got}, waiting for {expected}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// === tests ===

/// A precedence step: its name, the path called, the request metadata and who must answer.
type Case = (&'static str, &'static str, &'static [(&'static str, &'static str)], &'static str);

/// `GRPCRouteRule.matches`: "Precedence MUST be given to the rule with the largest number of:
/// Characters in a matching service. Characters in a matching method. Header matches.", then
/// "The oldest Route based on creation timestamp", then "the first matching rule";
/// `GRPCMethodMatch`: service and method `Exact` (either omitted: "will match any service" /
/// "all services"), `RegularExpression`; "If no matches are specified, the implementation MUST
/// match every gRPC request". One call per step, decided by which backend answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_method_matching_and_precedence() {
    let dir = tempfile::tempdir().unwrap();
    backends(
        dir.path(),
        &["exact", "header", "service", "method", "regex", "any", "older", "newer", "first", "second"],
    )
    .await;
    let routes = [
        grpc_route(
            "main",
            "2026-01-01T00:00:00Z",
            "  rules:\n\
             \x20 - matches: [{method: {service: any.Catch}}]\n    backendRefs: [{name: first, port: 80}]\n\
             \x20 - backendRefs: [{name: any, port: 80}]\n\
             \x20 - matches: [{method: {service: t.Test, method: Echo}}]\n    backendRefs: [{name: exact, port: 80}]\n\
             \x20 - matches: [{method: {service: t.Test, method: Echo}, headers: [{name: x-env, value: canary}]}]\n    backendRefs: [{name: header, port: 80}]\n\
             \x20 - matches: [{method: {service: t.Test}}]\n    backendRefs: [{name: service, port: 80}]\n\
             \x20 - matches: [{method: {method: Echo}}]\n    backendRefs: [{name: method, port: 80}]\n\
             \x20 - matches: [{method: {type: RegularExpression, service: 'r\\.[a-z]+', method: 'Get.*'}}]\n    backendRefs: [{name: regex, port: 80}]\n\
             \x20 - matches: [{method: {service: t.Age}}]\n    backendRefs: [{name: older, port: 80}]\n\
             \x20 - matches: [{method: {service: any.Catch}}]\n    backendRefs: [{name: second, port: 80}]\n",
        ),
        grpc_route(
            "later",
            "2026-02-01T00:00:00Z",
            "  rules:\n\
             \x20 - matches: [{method: {service: t.Age}}]\n    backendRefs: [{name: newer, port: 80}]\n",
        ),
    ];
    write(dir.path(), "routes.yaml", &routes.concat());
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    wait_for(&ch, "/t.Test/Echo", "exact").await;
    let cases: [Case; 9] = [
        ("service and method, exact", "/t.Test/Echo", &[], "exact"),
        ("one header match more", "/t.Test/Echo", &[("x-env", "canary")], "header"),
        ("a header value that differs", "/t.Test/Echo", &[("x-env", "prod")], "exact"),
        ("service only: more service characters than a method", "/t.Test/Other", &[], "service"),
        ("method only, any service", "/other.Svc/Echo", &[], "method"),
        ("regular expressions", "/r.abc/GetThing", &[], "regex"),
        ("no matches: every call", "/z.Z/Z", &[], "any"),
        ("oldest route on a tie", "/t.Age/Call", &[], "older"),
        ("first matching rule within a route on a tie", "/any.Catch/Call", &[], "first"),
    ];
    for (step, path, headers, expected) in cases {
        assert_eq!(who(&ch, path, headers).await, expected, "{step}: {path} {headers:?}");
    }
    // A regex service that does not match the whole service falls to the catch-all.
    assert_eq!(who(&ch, "/r.abc1/GetThing", &[]).await, "any");
}

/// `GRPCRouteSpec.hostnames`: matched against the `:authority`; a call for another host is not
/// routed (weir answers `UNIMPLEMENTED`, the gRPC form of 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_hostnames() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["exact", "wild"]).await;
    let routes = [
        grpc_route(
            "a",
            "2026-01-01T00:00:00Z",
            "  hostnames: [grpc.test]\n  rules:\n  - backendRefs: [{name: exact, port: 80}]\n",
        ),
        grpc_route(
            "b",
            "2026-01-01T00:00:00Z",
            "  hostnames: ['*.example.com']\n  rules:\n  - backendRefs: [{name: wild, port: 80}]\n",
        ),
    ];
    write(dir.path(), "routes.yaml", &routes.concat());
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    wait_for(&ch, "/t.Test/Echo", "exact").await;
    let wild = channel(addr, "a.b.example.com").await;
    assert_eq!(who(&wild, "/t.Test/Echo", &[]).await, "wild", "a wildcard is a suffix match");
    let other = channel(addr, "other.test").await;
    assert_eq!(who(&other, "/t.Test/Echo", &[]).await, "Unimplemented");
}

/// A GRPCRoute `*.example.com` beside an Ingress `*.example.com` (one label, ingress-nginx's
/// wildcard): one-label names are answered by the Ingress's wildcard host, which takes the
/// GRPCRoute's routes too, as it takes an HTTPRoute's (docs/gateway-api.md, "Ingress and Gateway
/// API together"); the Ingress keeps its own path. Deeper names reach the GRPCRoute alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_wildcard_beside_an_ingress_wildcard() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["wild", "legacy"]).await;
    let ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: ing, namespace: default, \
        annotations: {nginx.ingress.kubernetes.io/backend-protocol: GRPC}}\n\
        spec:\n  ingressClassName: weir\n  rules:\n  - host: '*.example.com'\n    http: {paths: [{path: /legacy.Old, pathType: Prefix, backend: {service: {name: legacy, port: {number: 80}}}}]}\n";
    write(dir.path(), "ingress.yaml", ingress);
    let route = grpc_route(
        "w",
        "2026-01-01T00:00:00Z",
        "  hostnames: ['*.example.com']\n  rules:\n  - backendRefs: [{name: wild, port: 80}]\n",
    );
    write(dir.path(), "routes.yaml", &route);
    let (_weir, addr) = weir(dir.path());
    let deep = channel(addr, "a.b.example.com").await;
    wait_for(&deep, "/t.Test/Echo", "wild").await;
    let one = channel(addr, "a.example.com").await;
    assert_eq!(who(&one, "/t.Test/Echo", &[]).await, "wild", "a one-label name reaches the GRPCRoute");
    assert_eq!(who(&one, "/legacy.Old/Echo", &[]).await, "legacy", "the Ingress keeps its path");
}

/// A GRPCRoute and an Ingress on one host: a GRPCRoute rule without matches (every call, path
/// `/`) does not take over the Ingress's `/` (existing traffic keeps its backend, the
/// GRPCRoute gets a `ConflictLost` warning, as for HTTPRoutes); a rule matching a method does
/// get that method's calls. The route's listener socket is not a match condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_without_matches_does_not_take_an_ingress_path() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["grpc", "method", "legacy"]).await;
    let ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: ing, namespace: default, \
        annotations: {nginx.ingress.kubernetes.io/backend-protocol: GRPC}}\n\
        spec:\n  ingressClassName: weir\n  rules:\n  - host: grpc.test\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: legacy, port: {number: 80}}}}]}\n";
    write(dir.path(), "ingress.yaml", ingress);
    let route = grpc_route(
        "g",
        "2026-01-01T00:00:00Z",
        "  hostnames: [grpc.test]\n  rules:\n  - matches: [{method: {service: t.Test, method: Echo}}]\n    backendRefs: [{name: method, port: 80}]\n  - backendRefs: [{name: grpc, port: 80}]\n",
    );
    write(dir.path(), "routes.yaml", &route);
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    wait_for(&ch, "/t.Test/Echo", "method").await;
    assert_eq!(who(&ch, "/t.Test/Other", &[]).await, "legacy", "the Ingress keeps its path");
}

/// `GRPCRouteRule.backendRefs` ("Support for weight: Core"): a 3:1 split over 400 calls, each
/// answered by one of the two backends (loose bounds: the split is random).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_weights() {
    let dir = tempfile::tempdir().unwrap();
    let counts = backends(dir.path(), &["three", "one", "zero"]).await;
    let route = grpc_route(
        "w",
        "2026-01-01T00:00:00Z",
        "  rules:\n  - backendRefs: [{name: three, port: 80, weight: 3}, {name: one, port: 80, weight: 1}, {name: zero, port: 80, weight: 0}]\n",
    );
    write(dir.path(), "routes.yaml", &route);
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while who(&ch, "/t.Test/Echo", &[]).await == "Unimplemented" {
        assert!(Instant::now() < deadline, "the route never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..400 {
        *seen.entry(who(&ch, "/t.Test/Echo", &[]).await).or_default() += 1;
    }
    let three = seen.get("three").copied().unwrap_or(0);
    let one = seen.get("one").copied().unwrap_or(0);
    assert_eq!(three + one, 400, "every call answered by a weighted backend: {seen:?}");
    assert!((240..=360).contains(&three), "3:1 expected, got {seen:?}");
    assert_eq!(counts["zero"].load(Ordering::SeqCst), 0, "weight 0 gets nothing");
}

/// `GRPCRouteFilter`: `RequestHeaderModifier` ("Support in GRPCRouteRule: Core") and
/// `ResponseHeaderModifier`: the backend sees the header set, the client the one added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_header_modifiers() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["mod"]).await;
    let route = grpc_route(
        "m",
        "2026-01-01T00:00:00Z",
        "  rules:\n  - filters:\n    - type: RequestHeaderModifier\n      requestHeaderModifier: {set: [{name: x-added, value: by-weir}], remove: [x-secret]}\n\
         \x20   - type: ResponseHeaderModifier\n      responseHeaderModifier: {add: [{name: x-resp, value: from-weir}]}\n\
         \x20   backendRefs: [{name: mod, port: 80}]\n",
    );
    write(dir.path(), "routes.yaml", &route);
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (text, meta) = loop {
        match call(&ch, "/t.Test/Echo", &[("x-added", "by-client")]).await {
            Ok(answer) => break answer,
            Err(e) => assert!(Instant::now() < deadline, "never routed: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(text, "mod /t.Test/Echo x-added=by-weir", "set replaces the client's value");
    assert_eq!(meta.get("x-resp").map(|v| v.to_str().unwrap()), Some("from-weir"));
}

/// Makes `calls` calls through a GRPCRoute whose rule mirrors to one gRPC backend (HTTP/2 only,
/// as gRPC servers are; counting calls) per entry of `percents` (with that `percent`, if
/// given); every call must be answered by the route's backend. Returns the copies each mirror
/// got once each had at least `at_least[i]` and none came for two seconds (or after 30 seconds).
async fn mirrored_calls(percents: &[Option<u32>], calls: usize, at_least: &[usize]) -> Vec<usize> {
    let dir = tempfile::tempdir().unwrap();
    let mut counts = Vec::new();
    let mut filters = Vec::new();
    let mut yaml = String::new();
    for (i, percent) in percents.iter().enumerate() {
        let name: &'static str = ["mirror-a", "mirror-b", "mirror-c"][i];
        let (addr, count) = grpc_backend(name).await;
        counts.push(count);
        yaml.push_str(&service(name, addr, None));
        let percent = percent.map(|p| format!(", percent: {p}")).unwrap_or_default();
        filters.push(format!(
            "{{type: RequestMirror, requestMirror: {{backendRef: {{name: {name}, port: 80}}{percent}}}}}"
        ));
    }
    backends(dir.path(), &["main"]).await;
    let route = grpc_route(
        "m",
        "2026-01-01T00:00:00Z",
        &format!(
            "  rules:\n  - filters: [{}]\n    backendRefs: [{{name: main, port: 80}}]\n",
            filters.join(", ")
        ),
    );
    write(dir.path(), "routes.yaml", &format!("{yaml}{route}"));
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    wait_for(&ch, "/t.Test/Echo", "main").await;
    let now = || counts.iter().map(|c| c.load(Ordering::SeqCst)).collect::<Vec<_>>();
    let before = now();
    for _ in 0..calls {
        assert_eq!(who(&ch, "/t.Test/Echo", &[]).await, "main");
    }
    // The copies run beside the calls.
    let copied = |now: Vec<usize>| now.iter().zip(&before).map(|(n, b)| n - b).collect::<Vec<_>>();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (copied(now()), Instant::now());
    while (last.0.iter().zip(at_least).any(|(got, want)| got < want)
        || last.1.elapsed() < Duration::from_secs(2))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = copied(now());
        if got != last.0 {
            last = (got, Instant::now());
        }
    }
    last.0
}

/// `GRPCRouteFilter.requestMirror` ("responses from this backend MUST be ignored"): every call
/// is answered by the backend and copied to the mirror, a gRPC server that speaks HTTP/2 only:
/// the copies go over h2c, as the route's own backends do ("Implementations MUST support
/// HTTP/2 over cleartext TCP (h2c) for GRPCRoute backends", `GRPCRoute` doc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_request_mirror() {
    assert_eq!(mirrored_calls(&[None], 10, &[10]).await, [10]);
}

/// `HTTPRequestMirrorFilter.percent`: "the percentage of requests that should be mirrored to
/// BackendRef", and the filter "can be used multiple times within the same rule" (feature
/// `HTTPRouteRequestMultipleMirrors`, here on a GRPCRoute): of 400 calls, one mirror gets every
/// one and the other, at 25 percent, its own share (loose bounds: each call is drawn at
/// random); every call is still answered by the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_request_multiple_mirrors_each_with_its_percent() {
    let copies = mirrored_calls(&[None, Some(25)], 400, &[400, 50]).await;
    assert_eq!(copies[0], 400, "{copies:?}");
    assert!((50..=160).contains(&copies[1]), "25% of 400 expected: {copies:?}");
}

/// `GRPCBackendRef`: "If a Route is not able to send traffic to the backend ... the backend is
/// considered invalid"; `GRPCRouteRule.backendRefs`: "the proportion of requests that would
/// otherwise have been routed to an invalid backend MUST receive an `UNAVAILABLE` status" (a
/// missing Service here): a rule whose only backend is gone, and the gone half of a 1:1 split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_invalid_backend_answers_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    backends(dir.path(), &["ok"]).await;
    let route = grpc_route(
        "m",
        "2026-01-01T00:00:00Z",
        "  rules:\n  - matches: [{method: {service: t.Gone}}]\n    backendRefs: [{name: gone, port: 80}]\n  - matches: [{method: {service: t.Half}}]\n    backendRefs: [{name: gone, port: 80}, {name: ok, port: 80}]\n  - backendRefs: [{name: ok, port: 80}]\n",
    );
    write(dir.path(), "routes.yaml", &route);
    let (_weir, addr) = weir(dir.path());
    let ch = channel(addr, "grpc.test").await;
    wait_for(&ch, "/t.Test/Echo", "ok").await;
    let err = call(&ch, "/t.Gone/Call", &[]).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // "For example, if two backends are specified with equal weights, and one is invalid, 50
    // percent of traffic MUST receive an `UNAVAILABLE` status."
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..200 {
        *seen.entry(who(&ch, "/t.Half/Call", &[]).await).or_default() += 1;
    }
    assert_eq!(seen.keys().map(String::as_str).collect::<Vec<_>>(), ["Unavailable", "ok"], "{seen:?}");
    assert!(seen.values().all(|n| *n >= 60), "each share about half of 200 calls: {seen:?}");
}

// === appProtocol ===

/// An HTTP/2-only backend (as an h2c server is: no HTTP/1.1 at all) answering `NAME VERSION`.
async fn h2_only_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| async move {
                        let body = format!("{name} {:?}", req.version());
                        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(body),
                        )))
                    });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http2_only();
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// A WebSocket-style backend: answers an `Upgrade: websocket` request `101` (only if the
/// request carries `Upgrade`), then echoes the bytes that follow.
async fn upgrade_echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(upgrade_echo(stream));
        }
    });
    addr
}

/// [`upgrade_echo_backend`] over TLS with the certificate `cert_pem` (and its key).
async fn tls_upgrade_echo_backend(cert_pem: &str, key_pem: &str) -> SocketAddr {
    use rustls::pki_types::pem::PemObject as _;
    let certs =
        rustls::pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs.unwrap(), key)
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    upgrade_echo(tls).await;
                }
            });
        }
    });
    addr
}

/// One connection of [`upgrade_echo_backend`].
async fn upgrade_echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    {
        {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                    return;
                }
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            if !head.contains("upgrade: websocket") {
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
                return;
            }
            let _ = stream
                .write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                )
                .await;
            let mut buf = [0u8; 1024];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).await.is_err() || stream.flush().await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// `GET /` for `host` over HTTP/1.1: status and body.
async fn http1_get(weir: SocketAddr, host: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(weir).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// `HTTPBackendRef`: "implementations SHOULD honor the appProtocol field if it is set for the
/// target Service Port" (KEP-3726 `kubernetes.io/h2c`: HTTP/2 prior knowledge; `kubernetes.io/ws`:
/// WebSocket over HTTP/1.1). An HTTP/1.1 client reaches an HTTP/2-only backend through an
/// HTTPRoute when the port says `kubernetes.io/h2c`, and not when it says nothing; a WebSocket
/// upgrade reaches a `kubernetes.io/ws` backend and data flows both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httproute_backend_app_protocol_h2c_and_ws() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let h2 = h2_only_backend("h2").await;
    let ws = upgrade_echo_backend().await;
    let route = |name: &str, backend: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  parentRefs: [{{name: edge}}]\n  hostnames: [{name}.test]\n  rules:\n  - backendRefs: [{{name: {backend}, port: 80}}]\n---\n"
        )
    };
    let yaml = [
        GATEWAY.to_string(),
        service("h2c", h2, Some("kubernetes.io/h2c")),
        service("plain", h2, None),
        service("ws", ws, Some("kubernetes.io/ws")),
        route("h2c", "h2c"),
        route("plain", "plain"),
        route("ws", "ws"),
    ]
    .concat();
    write(dir.path(), "all.yaml", &yaml);
    let (_weir, addr) = weir(dir.path());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http1_get(addr, "h2c.test").await;
        if status == 200 {
            assert_eq!(body, "h2 HTTP/2.0", "spoken to over HTTP/2");
            break;
        }
        assert!(Instant::now() < deadline, "h2c.test never answered 200: {status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = http1_get(addr, "plain.test").await;
    assert_eq!(status, 502, "without appProtocol weir speaks HTTP/1.1, which the backend refuses");

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"GET /chat HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).await.unwrap(),
            1,
            "closed before the 101: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    s.write_all(b"ping through weir").await.unwrap();
    let mut echoed = [0u8; 17];
    tokio::time::timeout(Duration::from_secs(15), s.read_exact(&mut echoed)).await.unwrap().unwrap();
    assert_eq!(&echoed, b"ping through weir");
}

/// `HTTPBackendRef`'s appProtocol on a `RequestMirror`'s `backendRef` (KEP-3726
/// `kubernetes.io/h2c`): an HTTPRoute's copies to such a port go over HTTP/2 prior knowledge,
/// and reach a server that speaks nothing else (a gRPC server counting what it got).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httproute_request_mirror_to_app_protocol_h2c() {
    let dir = tempfile::tempdir().unwrap();
    let h2 = h2_only_backend("h2").await;
    let (mirror, copies) = grpc_backend("mirror").await;
    let yaml = [
        GATEWAY.to_string(),
        service("app", h2, Some("kubernetes.io/h2c")),
        service("shadow", mirror, Some("kubernetes.io/h2c")),
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: m, namespace: default}\n\
         spec:\n  parentRefs: [{name: edge}]\n  hostnames: [m.test]\n  rules:\n\
         \x20 - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}}}]\n\
         \x20   backendRefs: [{name: app, port: 80}]\n---\n"
            .to_string(),
    ]
    .concat();
    write(dir.path(), "all.yaml", &yaml);
    let (_weir, addr) = weir(dir.path());
    let deadline = Instant::now() + Duration::from_secs(30);
    while http1_get(addr, "m.test").await.0 != 200 {
        assert!(Instant::now() < deadline, "m.test never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        assert_eq!(http1_get(addr, "m.test").await, (200, "h2 HTTP/2.0".to_string()));
    }
    // Six requests answered by the backend, each copied.
    let deadline = Instant::now() + Duration::from_secs(30);
    while copies.load(Ordering::SeqCst) < 6 {
        assert!(Instant::now() < deadline, "the mirror got {} copies of 6", copies.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `appProtocol: kubernetes.io/wss` (KEP-3726: WebSocket over TLS): the upgrade reaches a TLS
/// backend whose certificate a CA the system trusts (`SSL_CERT_FILE` here, as weir's upstream
/// TLS reads the system's roots) signed for the request's host, and data flows both ways; a
/// backend whose certificate another CA signed is refused (502), never spoken to unverified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httproute_backend_app_protocol_wss() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (trusted, other) = (Ca::new("trusted"), Ca::new("other"));
    let (cert, key) = trusted.leaf(&["wss.test"]);
    let good = tls_upgrade_echo_backend(&cert, &key).await;
    let (cert, key) = other.leaf(&["forged.test"]);
    let forged = tls_upgrade_echo_backend(&cert, &key).await;
    let route = |name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  parentRefs: [{{name: edge}}]\n  hostnames: [{name}.test]\n  rules:\n  - backendRefs: [{{name: {name}, port: 80}}]\n---\n"
        )
    };
    let yaml = [
        GATEWAY.to_string(),
        service("wss", good, Some("kubernetes.io/wss")),
        service("forged", forged, Some("kubernetes.io/wss")),
        route("wss"),
        route("forged"),
    ]
    .concat();
    let roots = dir.path().join("roots");
    std::fs::create_dir(&roots).unwrap();
    let ca_file = roots.join("ca.pem");
    std::fs::write(&ca_file, &trusted.pem).unwrap();
    write(dir.path(), "all.yaml", &yaml);
    let env = format!("SSL_CERT_FILE={}", ca_file.display());
    let args = serve_args(dir.path(), &[]);
    let (_weir, addrs, _log) = spawn_wrapped(&["env", &env], &args, &["http"], Some("info"));
    let addr = addrs[0];

    let upgrade = |host: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET /chat HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match tokio::time::timeout(Duration::from_secs(15), s.read(&mut byte)).await {
                Ok(Ok(1)) => head.push(byte[0]),
                _ => break,
            }
        }
        (String::from_utf8_lossy(&head).to_string(), s)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (head, mut s) = loop {
        let (head, s) = upgrade("wss.test").await;
        if head.starts_with("HTTP/1.1 101") || Instant::now() > deadline {
            break (head, s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"over tls").await.unwrap();
    let mut buf = [0u8; 8];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf, b"over tls", "echoed by the TLS backend through weir");

    let (head, _) = upgrade("forged.test").await;
    assert!(head.starts_with("HTTP/1.1 502"), "a certificate the system does not trust: {head}");
}
