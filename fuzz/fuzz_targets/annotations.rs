//! An Ingress with arbitrary annotations (names from the catalogue or not, under either prefix,
//! arbitrary values) translated with `weir::translate::translate`. No panic, and the table it
//! gives compiles in the dataplane (`Router::compile`): an annotation can cost its Ingress a
//! warning, never the whole table.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weir::translate::annotations::{CATALOGUE, NGINX_PREFIX, WEIR_PREFIX};

#[derive(Arbitrary, Debug)]
enum Name<'a> {
    Known(u16),
    Other(&'a str),
}

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    annotations: Vec<(bool, Name<'a>, &'a str)>,
}

fuzz_target!(|input: Input<'_>| {
    let mut annotations = BTreeMap::new();
    for (weir_prefix, name, value) in input.annotations.iter().take(16) {
        let prefix = if *weir_prefix { WEIR_PREFIX } else { NGINX_PREFIX };
        let name = match name {
            Name::Known(i) => CATALOGUE[usize::from(*i) % CATALOGUE.len()].0,
            Name::Other(name) => name,
        };
        annotations.insert(format!("{prefix}{name}"), value.to_string());
    }
    let ingress = serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "app", "namespace": "default", "annotations": annotations},
        "spec": {
            "ingressClassName": "weir",
            "tls": [{"hosts": ["app.example.com"], "secretName": "tls"}],
            "rules": [{"host": "app.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "/api(/|$)(.*)", "pathType": "ImplementationSpecific", "backend": {"service": {"name": "web", "port": {"name": "http"}}}}
            ]}}]
        }
    });
    weir_fuzz::translate_and_compile(&[ingress, weir_fuzz::web_service(), weir_fuzz::web_slice()]);
});
