//! The Kubernetes source against a protocol-level fake API server (an in-process tower service
//! speaking the API's JSON), for what the 1.20 API server of the end-to-end tests cannot show:
//! discovery choosing `discovery.k8s.io/v1` EndpointSlices, routes built from slices, and
//! nothing synced before every list has answered.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use kube::Client;
use serde_json::{Value, json};
use tokio::sync::watch;
use weir::source::kube::{EndpointsApi, KubeOptions, KubeSource, discover_endpoints_api};
use weir::translate::{TranslateConfig, translate};

/// What the fake serves.
#[derive(Clone)]
struct Fake {
    /// Whether `discovery.k8s.io/v1` lists EndpointSlices.
    slices: bool,
    /// Paths requested (without query).
    seen: Arc<Mutex<BTreeSet<String>>>,
    /// Lists of Secrets wait until this turns true.
    release_secrets: watch::Receiver<bool>,
    /// Ingress lists served so far; with `expire`, the first watch answers 410 Gone and later
    /// lists show a different Ingress.
    ingress_lists: Arc<std::sync::atomic::AtomicUsize>,
    expire: bool,
}

type Body = BoxBody<Bytes, Infallible>;

fn json_response(status: StatusCode, value: Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

fn list(kind: &str, items: Value) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items})
}

impl Fake {
    /// The Ingress of the next list: `web`, then `relisted` when the watch expires.
    fn next_ingress_name(&self) -> &'static str {
        let n = self.ingress_lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.expire && n > 0 { "relisted" } else { "web" }
    }

    async fn answer(self, req: Request<kube::client::Body>) -> Result<Response<Body>, Infallible> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        self.seen.lock().unwrap().insert(path.clone());
        let ingress_path = path == "/apis/networking.k8s.io/v1/ingresses";
        let lists = self.ingress_lists.load(std::sync::atomic::Ordering::SeqCst);
        if query.contains("watch=true") && ingress_path && self.expire && lists == 1 {
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Expired", "code": 410, "message": "too old resource version: 1 (5)"}});
            return Ok(json_response(StatusCode::OK, Value::String(String::new()))
                .map(|_| Full::new(Bytes::from(format!("{gone}\n"))).boxed()));
        }
        if query.contains("watch=true") {
            // A watch that stays open without events.
            let pending = futures_util::stream::pending::<Result<Frame<Bytes>, Infallible>>();
            return Ok(Response::new(BodyExt::boxed(StreamBody::new(pending))));
        }
        let not_found = || {
            json_response(
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
            )
        };
        let response = match path.as_str() {
            "/apis/discovery.k8s.io/v1" if self.slices => json_response(
                StatusCode::OK,
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "discovery.k8s.io/v1", "resources": [
                    {"name": "endpointslices", "singularName": "endpointslice", "namespaced": true, "kind": "EndpointSlice", "verbs": ["list", "watch"]}
                ]}),
            ),
            "/apis/discovery.k8s.io/v1" => not_found(),
            "/apis/networking.k8s.io/v1/ingressclasses" => json_response(
                StatusCode::OK,
                list(
                    "IngressClass",
                    json!([{"metadata": {"name": "weir", "resourceVersion": "1"}, "spec": {"controller": "weir.dev/ingress-controller"}}]),
                ),
            ),
            "/apis/networking.k8s.io/v1/ingresses" => json_response(
                StatusCode::OK,
                list(
                    "Ingress",
                    json!([{
                        "metadata": {"name": self.next_ingress_name(), "namespace": "shop", "resourceVersion": "1",
                                     "annotations": {"nginx.ingress.kubernetes.io/auth-type": "basic", "nginx.ingress.kubernetes.io/auth-secret": "basic-auth"}},
                        "spec": {"ingressClassName": "weir", "rules": [{"host": "web.example", "http": {"paths": [
                            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "http"}}}}
                        ]}}]}
                    }]),
                ),
            ),
            "/api/v1/services" => json_response(
                StatusCode::OK,
                list(
                    "Service",
                    json!([{
                        "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "1"},
                        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
                    }]),
                ),
            ),
            "/apis/discovery.k8s.io/v1/endpointslices" => json_response(
                StatusCode::OK,
                list(
                    "EndpointSlice",
                    json!([{
                        "metadata": {"name": "web-x1", "namespace": "shop", "resourceVersion": "1",
                                     "labels": {"kubernetes.io/service-name": "web"}},
                        "addressType": "IPv4",
                        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                        "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": true}}]
                    }]),
                ),
            ),
            "/api/v1/endpoints" => json_response(
                StatusCode::OK,
                list(
                    "Endpoints",
                    json!([{
                        "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "1"},
                        "subsets": [{"addresses": [{"ip": "10.0.0.8"}], "ports": [{"name": "http", "port": 8080}]}]
                    }]),
                ),
            ),
            "/api/v1/namespaces/shop/secrets"
                if query.contains("metadata.name%3Dbasic-auth")
                    || query.contains("metadata.name=basic-auth") =>
            {
                json_response(
                    StatusCode::OK,
                    list(
                        "Secret",
                        json!([{
                            "metadata": {"name": "basic-auth", "namespace": "shop", "resourceVersion": "1"},
                            "type": "Opaque", "data": {"auth": "Zm9vOntQTEFJTn1iYXI="}
                        }]),
                    ),
                )
            }
            "/api/v1/secrets" => {
                let mut release = self.release_secrets.clone();
                let _ = release.wait_for(|r| *r).await;
                json_response(StatusCode::OK, list("Secret", json!([])))
            }
            _ => not_found(),
        };
        Ok(response)
    }
}

fn fake(slices: bool, secrets_released: bool) -> (Client, Arc<Mutex<BTreeSet<String>>>, watch::Sender<bool>) {
    fake_with(slices, secrets_released, false)
}

fn fake_with(
    slices: bool,
    secrets_released: bool,
    expire: bool,
) -> (Client, Arc<Mutex<BTreeSet<String>>>, watch::Sender<bool>) {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let (release, release_secrets) = watch::channel(secrets_released);
    let fake = Fake { slices, seen: seen.clone(), release_secrets, ingress_lists: Arc::default(), expire };
    let service = tower::service_fn(move |req| fake.clone().answer(req));
    (Client::new(service, "default"), seen, release)
}

fn table_json(source: &KubeSource) -> String {
    let translation = translate(&source.snapshot(), &TranslateConfig::default());
    assert!(translation.warnings.is_empty(), "{:?}", translation.warnings);
    serde_json::to_string(&translation.table).unwrap()
}

#[tokio::test]
async fn discovery_prefers_endpointslices_and_routes_use_them() {
    let (client, seen, _release) = fake(true, true);
    let api = discover_endpoints_api(&client).await.unwrap();
    assert_eq!(api, EndpointsApi::EndpointSlices);
    let mut source = KubeSource::start(&client, &KubeOptions::default(), api);
    tokio::time::timeout(Duration::from_secs(10), source.wait_until_synced()).await.unwrap();
    source.track_referenced_secrets(Duration::from_secs(5)).await;
    let table = table_json(&source);
    assert!(table.contains("10.0.0.7:8080"), "the slice's endpoint serves: {table}");
    let seen = seen.lock().unwrap();
    assert!(seen.contains("/apis/discovery.k8s.io/v1/endpointslices"), "{seen:?}");
    assert!(
        !seen.contains("/api/v1/endpoints"),
        "core Endpoints are not watched when slices are served: {seen:?}"
    );
}

#[tokio::test]
async fn without_endpointslice_v1_core_endpoints_are_watched() {
    let (client, seen, _release) = fake(false, true);
    let api = discover_endpoints_api(&client).await.unwrap();
    assert_eq!(api, EndpointsApi::Endpoints);
    let mut source = KubeSource::start(&client, &KubeOptions::default(), api);
    tokio::time::timeout(Duration::from_secs(10), source.wait_until_synced()).await.unwrap();
    source.track_referenced_secrets(Duration::from_secs(5)).await;
    let table = table_json(&source);
    assert!(table.contains("10.0.0.8:8080"), "the Endpoints' address serves: {table}");
    let seen = seen.lock().unwrap();
    assert!(!seen.contains("/apis/discovery.k8s.io/v1/endpointslices"), "{seen:?}");
}

#[tokio::test]
async fn not_synced_until_every_list_answered() {
    let (client, _seen, release) = fake(true, false);
    let source = KubeSource::start(&client, &KubeOptions::default(), EndpointsApi::EndpointSlices);
    let early = tokio::time::timeout(Duration::from_millis(500), source.wait_until_synced()).await;
    assert!(early.is_err(), "synced although the Secrets list has not answered");
    release.send(true).unwrap();
    let synced = tokio::time::timeout(Duration::from_secs(10), source.wait_until_synced()).await;
    assert_eq!(synced.ok(), Some(true));
}

#[tokio::test]
async fn an_expired_watch_is_relisted() {
    let (client, _seen, _release) = fake_with(true, true, true);
    let source = KubeSource::start(&client, &KubeOptions::default(), EndpointsApi::EndpointSlices);
    tokio::time::timeout(Duration::from_secs(10), source.wait_until_synced()).await.unwrap();
    // The watch answers 410 Gone; the source lists again and sees the new state.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let names: Vec<String> = source.stores.snapshot().ingresses.keys().map(|k| k.name.clone()).collect();
        if names == ["relisted"] {
            break;
        }
        assert!(names == ["web"] || names == ["relisted"], "the store is never empty or mixed: {names:?}");
        assert!(tokio::time::Instant::now() < deadline, "not relisted after 410 Gone: {names:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn opaque_secrets_named_by_annotations_are_read() {
    let (client, seen, _release) = fake(true, true);
    let mut source = KubeSource::start(&client, &KubeOptions::default(), EndpointsApi::EndpointSlices);
    tokio::time::timeout(Duration::from_secs(10), source.wait_until_synced()).await.unwrap();
    assert!(source.snapshot().secrets.is_empty(), "only kubernetes.io/tls Secrets are listed by type");
    source.track_referenced_secrets(Duration::from_secs(5)).await;
    let snapshot = source.snapshot();
    let names: Vec<String> = snapshot.secrets.keys().map(|k| k.to_string()).collect();
    assert_eq!(names, ["shop/basic-auth"]);
    assert!(seen.lock().unwrap().contains("/api/v1/namespaces/shop/secrets"));
}
