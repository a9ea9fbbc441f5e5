//! Gateway API objects reach the snapshot from both sources: `--manifests` directories (v1, the
//! older v1beta1 that differs only in name, typed and untyped lists) and the real API server
//! (reflectors started only where the CRDs are served; without them weir says so once and
//! serves Ingresses).

#![allow(clippy::unwrap_used, missing_docs)]

mod gateway_crds_support;
mod support_kube;

use std::time::Duration;

use serde_json::json;
use support_kube::{
    ApiServer, Echo, Weir, apply, apply_class, endpoints, eventually, ingress, isolated, service,
};
use weir::gateway_source::{GatewayKinds, discover};
use weir::snapshot::SnapshotKey;
use weir::source::files::ManifestDir;
use weir::source::kube::{EndpointsApi, KubeOptions, KubeSource};
use weir::source::manifest::{ManifestError, parse_manifests};
use weir_dataplane::model::ObjectRef;

const MANIFESTS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: weir}
spec: {controllerName: weir.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {name: edge}
spec:
  gatewayClassName: weir
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: apps}
spec:
  parentRefs: [{name: edge, namespace: default}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRouteList
items:
- metadata: {name: grpc, namespace: apps}
  spec: {parentRefs: [{name: edge, namespace: default}]}
---
apiVersion: v1
kind: List
items:
- apiVersion: gateway.networking.k8s.io/v1
  kind: TLSRoute
  metadata: {name: db, namespace: apps}
  spec: {rules: [{backendRefs: [{name: db, port: 5432}]}]}
- apiVersion: gateway.networking.k8s.io/v1beta1
  kind: ReferenceGrant
  metadata: {name: from-apps}
  spec:
    from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps}]
    to: [{group: "", kind: Service}]
- apiVersion: v1
  kind: Namespace
  metadata: {name: apps, labels: {edge: "yes"}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {name: team, namespace: apps}
spec:
  parentRef: {name: edge, namespace: default}
  listeners: [{name: app, port: 80, protocol: HTTP, hostname: app.example.com}]
"#;

#[test]
fn manifests_carry_every_gateway_kind_in_v1_and_older_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), MANIFESTS).unwrap();
    let mut source = ManifestDir::new(dir.path());
    assert!(source.rescan(true).unwrap().changed);
    assert!(source.errors().is_empty(), "{:?}", source.errors());
    let snapshot = source.current();
    assert!(snapshot.gateway_classes.contains_key("weir"));
    let edge = snapshot.gateways.get(&ObjectRef::new("default", "edge")).unwrap();
    assert_eq!(edge.spec.listeners[0].port, 80);
    assert!(snapshot.http_routes.contains_key(&ObjectRef::new("apps", "web")));
    assert!(snapshot.grpc_routes.contains_key(&ObjectRef::new("apps", "grpc")));
    assert!(snapshot.tls_routes.contains_key(&ObjectRef::new("apps", "db")));
    let team = snapshot.listener_sets.get(&ObjectRef::new("apps", "team")).unwrap();
    assert_eq!(team.spec.parent_ref.name, "edge");
    assert_eq!(team.spec.listeners[0].hostname.as_deref(), Some("app.example.com"));
    // Namespaced kinds without a namespace get `default`, as the API server stores them.
    assert!(snapshot.reference_grants.contains_key(&ObjectRef::new("default", "from-apps")));
    let apps = snapshot.namespaces.get("apps").unwrap();
    assert_eq!(apps.metadata.labels.as_ref().unwrap()["edge"], "yes");
}

#[test]
fn a_gateway_object_missing_a_required_field_is_an_error_with_its_line() {
    let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge}\nspec:\n  listeners: []\n";
    let err = parse_manifests(text).unwrap_err();
    assert!(matches!(err, ManifestError::Invalid { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("Gateway default/edge") && message.contains("gatewayClassName"), "{message}");
    // An unknown version of a Gateway API kind is not read (as any unknown kind).
    let other = parse_manifests(
        "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {name: x}\n",
    )
    .unwrap();
    assert_eq!(other[0].kind(), "TLSRoute");
    assert!(other[0].metadata().is_none(), "v1alpha2 is kept as Other");
}

/// Without the CRDs: discovery finds nothing, the log says so once, Ingresses are served.
#[test]
fn without_the_gateway_api_weir_says_so_once_and_serves_ingresses() {
    isolated("without_the_gateway_api_weir_says_so_once_and_serves_ingresses", || async {
        let api = ApiServer::start().await;
        let admin = api.client().await;
        assert_eq!(discover(&admin).await.unwrap(), GatewayKinds::default());

        let echo = Echo::start(&["web"]).await;
        apply_class(&admin, "weir", "weir.dev/ingress-controller").await;
        apply::<k8s_openapi::api::core::v1::Service>(&admin, "default", service("web")).await;
        apply::<k8s_openapi::api::core::v1::Endpoints>(&admin, "default", endpoints("web", &echo.ports))
            .await;
        apply::<k8s_openapi::api::networking::v1::Ingress>(
            &admin,
            "default",
            ingress("web", "weir", "web.test", "web"),
        )
        .await;
        let weir = Weir::start(&api.kubeconfig, &[]);
        weir.wait_route("web.test", "web", Duration::from_secs(30)).await;
        let log = weir.log();
        let said = log.matches("is not served or not readable; serving Ingresses only").count();
        assert_eq!(said, 1, "{log}");
    });
}

/// With the CRDs: every kind is discovered, watched, and its objects are in the snapshot; a
/// change reaches the next snapshot.
#[test]
fn with_the_gateway_api_the_kube_source_watches_every_kind() {
    isolated("with_the_gateway_api_the_kube_source_watches_every_kind", || async {
        let api = ApiServer::start().await;
        let admin = api.client().await;
        gateway_crds_support::install_gateway_crds(&admin).await;
        let kinds = discover(&admin).await.unwrap();
        assert_eq!(
            kinds,
            GatewayKinds { http: true, grpc: true, tls: true, reference_grants: true, listener_sets: true }
        );

        gateway_crds_support::create(
            &admin,
            None,
            "v1",
            "GatewayClass",
            "gatewayclasses",
            json!({"metadata": {"name": "weir"}, "spec": {"controllerName": "weir.dev/gateway-controller"}}),
        )
        .await
        .unwrap();
        gateway_crds_support::create(
            &admin,
            Some("default"),
            "v1",
            "HTTPRoute",
            "httproutes",
            json!({"metadata": {"name": "web"}, "spec": {"rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}),
        )
        .await
        .unwrap();
        gateway_crds_support::create(
            &admin,
            Some("default"),
            "v1",
            "ListenerSet",
            "listenersets",
            json!({"metadata": {"name": "team"}, "spec": {"parentRef": {"name": "edge"},
                "listeners": [{"name": "app", "port": 80, "protocol": "HTTP"}]}}),
        )
        .await
        .unwrap();

        let options = KubeOptions { gateway: kinds, ..KubeOptions::default() };
        let source = KubeSource::start(&admin, &options, EndpointsApi::Endpoints);
        assert!(source.wait_until_synced().await);
        let snapshot = source.snapshot();
        assert!(snapshot.gateway_classes.contains_key("weir"));
        assert!(snapshot.http_routes.contains_key(&ObjectRef::new("default", "web")));
        assert!(snapshot.listener_sets.contains_key(&ObjectRef::new("default", "team")));
        assert!(snapshot.namespaces.contains_key("default"), "Namespaces are watched with the Gateway API");

        gateway_crds_support::create(
            &admin,
            Some("default"),
            "v1",
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir",
                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
        )
        .await
        .unwrap();
        let before = snapshot;
        let after =
            eventually("the new Gateway in the snapshot", Duration::from_secs(10), || {
                let snapshot = source.snapshot();
                async move {
                    snapshot.gateways.contains_key(&ObjectRef::new("default", "edge")).then_some(snapshot)
                }
            })
            .await;
        let changes = after.changes_since(&before);
        assert!(changes.contains(&SnapshotKey::Gateway(ObjectRef::new("default", "edge"))), "{changes:?}");
    });
}
