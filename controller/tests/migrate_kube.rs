//! `weir migrate` output is valid Gateway API: every object it writes for a directory using
//! each conversion (TLS listeners, redirects, rewrites, regex paths, CORS, a mirror, a weighted
//! canary, a default backend, custom headers; `migrate_ingresses.yaml` and more) is accepted by the real API server with the repository's CRDs
//! (their OpenAPI schemas: required fields, enums, patterns, list limits; the CEL rules are
//! dropped for kube-apiserver 1.20, see docs/gateway-api.md). ReferenceGrants to Secrets cannot
//! be stored by that API server (`group: ""`), so they are checked from manifests only.

#![allow(clippy::unwrap_used, missing_docs)]

mod gateway_crds_support;
mod support_kube;

use gateway_crds_support::{create, install_gateway_crds};
use support_kube::{ApiServer, create_namespace, isolated};
use weir::snapshot::Snapshot;
use weir::source::manifest::parse_manifests;

/// More Ingresses, beside those of `migrate_ingresses.yaml`: TLS, CORS, a mirror, redirects.
const MORE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: api, namespace: apps}
spec: {ports: [{name: web, port: 8081}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: apps
  annotations:
    nginx.ingress.kubernetes.io/enable-cors: "true"
    nginx.ingress.kubernetes.io/cors-allow-origin: "https://app.example.com"
    nginx.ingress.kubernetes.io/cors-allow-credentials: "true"
    nginx.ingress.kubernetes.io/mirror-target: "http://shadow.apps:9000$request_uri"
    nginx.ingress.kubernetes.io/upstream-vhost: internal.example.com
    nginx.ingress.kubernetes.io/rewrite-target: /
spec:
  ingressClassName: weir
  tls: [{hosts: [shop.example.com, "*.shop.example.com"], secretName: shop-cert}]
  defaultBackend: {service: {name: api, port: {number: 8081}}}
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /cart, pathType: Prefix, backend: {service: {name: api, port: {name: web}}}}
          - {path: /exact, pathType: Exact, backend: {service: {name: api, port: {number: 8081}}}}
    - host: "*.shop.example.com"
      http:
        paths: [{path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 8081}}}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: moved
  namespace: apps
  annotations:
    nginx.ingress.kubernetes.io/permanent-redirect: "https://new.example.com:8443/landing"
    nginx.ingress.kubernetes.io/permanent-redirect-code: "308"
    nginx.ingress.kubernetes.io/force-ssl-redirect: "true"
spec:
  ingressClassName: weir
  rules:
    - host: old.example.com
      http:
        paths: [{path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 8081}}}}]
"#;

#[test]
fn migrated_objects_are_accepted_by_the_api_server() {
    isolated("migrated_objects_are_accepted_by_the_api_server", || async {
        let text = format!("{}\n---\n{MORE}", include_str!("migrate_ingresses.yaml"));
        let snapshot: Snapshot = parse_manifests(&text).unwrap().into_iter().collect();
        let migration = weir::migrate::migrate(&snapshot, &weir::translate::TranslateConfig::default());
        let kinds: Vec<&str> = migration.objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in ["GatewayClass", "Gateway", "HTTPRoute", "ReferenceGrant"] {
            assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
        }
        let filters = serde_json::to_string(&migration.objects).unwrap();
        for filter in ["CORS", "RequestMirror", "URLRewrite", "RequestRedirect"] {
            assert!(filters.contains(&format!("\"type\":\"{filter}\"")), "no {filter} filter: {filters}");
        }

        let api = ApiServer::start().await;
        let admin = api.client().await;
        install_gateway_crds(&admin).await;
        create_namespace(&admin, "apps").await;
        let mut created = 0;
        for object in &migration.objects {
            let kind = object["kind"].as_str().unwrap();
            if kind == "ReferenceGrant" {
                continue;
            }
            let (version, plural) = match kind {
                "GatewayClass" => ("v1", "gatewayclasses"),
                "Gateway" => ("v1", "gateways"),
                "HTTPRoute" => ("v1", "httproutes"),
                other => panic!("unexpected kind {other}"),
            };
            let namespace = object["metadata"]["namespace"].as_str();
            let result = create(&admin, namespace, version, kind, plural, object.clone()).await;
            if let Err(error) = result {
                panic!("the API server refused {kind} {}: {error}\n{object:#}", object["metadata"]["name"]);
            }
            created += 1;
        }
        assert!(created >= 7, "{created} objects created");
    });
}
