//! Helpers shared by weir's fuzz targets (`fuzz_targets/`): turning fuzzer input into the
//! types the parsers take. Each target stays small so it can be re-pointed when a parser moves.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{HeaderMap, HeaderName, HeaderValue};

/// Polls `fut` once: the fuzz targets feed futures from an in-memory `&[u8]`, which is always
/// ready, so one poll finishes them. `None` if it did not (a hang the target reports).
pub fn ready<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// A header map of the pairs whose name and value are valid (the others are what no HTTP
/// parser would hand the proxy).
pub fn headers<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value))
        {
            map.append(name, value);
        }
    }
    map
}

/// Translates `snapshot` and compiles the table in the dataplane; panics when it does not
/// compile (translation must turn bad input into warnings, never into a table the proxy refuses).
pub fn compile_translation(snapshot: &weir::snapshot::Snapshot) {
    let translation = weir::translate::translate(snapshot, &weir::translate::TranslateConfig::default());
    if let Err(e) = weir_dataplane::route::router::Router::compile(&translation.table) {
        panic!("the translated table does not compile: {e}\nwarnings: {:?}", translation.warnings);
    }
}

/// Parses `objects` (JSON documents, which are YAML) as one manifest, then translates and
/// compiles it ([`compile_translation`]).
pub fn translate_and_compile(objects: &[serde_json::Value]) {
    let text: String = objects.iter().map(|o| format!("---\n{o}\n")).collect();
    let Ok(objects) = weir::source::manifest::parse_manifests(&text) else { return };
    let snapshot: weir::snapshot::Snapshot = objects.into_iter().collect();
    compile_translation(&snapshot);
}

/// The Service `default/web` (port 80, named `http`, to 8080).
pub fn web_service() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    })
}

/// An EndpointSlice of `default/web` with one ready endpoint.
pub fn web_slice() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": true}}]
    })
}
