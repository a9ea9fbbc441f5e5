//! The Gateway API CRDs of examples/kubernetes/gateway-api/crds (v1.6.1 standard channel,
//! adapted for kube-apiserver 1.20 by scripts/gateway-api-crds.py) install on the real test API
//! server, serve every kind weir reads, and weir's types (`weir::gateway`) read back what the
//! API server stores, in `v1` and in the older `v1beta1` that differs only in name.

#![allow(clippy::unwrap_used, missing_docs)]

mod gateway_crds_support;
mod support_kube;

use gateway_crds_support::{create, install_gateway_crds};
use kube::api::Api;
use serde_json::json;
use support_kube::{ApiServer, create_namespace, isolated};
use weir::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ReferenceGrant, TlsRoute};

#[test]
fn gateway_api_crds_install_and_round_trip() {
    isolated("gateway_api_crds_install_and_round_trip", || async {
        let api = ApiServer::start().await;
        let admin = api.client().await;
        install_gateway_crds(&admin).await;
        create_namespace(&admin, "apps").await;

        create(
            &admin,
            None,
            "v1",
            "GatewayClass",
            "gatewayclasses",
            json!({"metadata": {"name": "weir"}, "spec": {"controllerName": "weir.dev/gateway-controller"}}),
        )
        .await
        .unwrap();
        create(
            &admin,
            Some("default"),
            "v1",
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"edge": "yes"}}}}},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                 "tls": {"certificateRefs": [{"name": "wildcard"}]}},
            ]}}),
        )
        .await
        .unwrap();
        // An older served version, differing only in name: the API server stores it as v1.
        create(
            &admin,
            Some("apps"),
            "v1beta1",
            "HTTPRoute",
            "httproutes",
            json!({"metadata": {"name": "web"}, "spec": {
                "parentRefs": [{"name": "edge", "namespace": "default", "sectionName": "http"}],
                "hostnames": ["www.example.com"],
                "rules": [{
                    "matches": [{"path": {"type": "Exact", "value": "/login"}, "method": "POST",
                                 "headers": [{"name": "x-env", "value": "canary"}]}],
                    "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x-a", "value": "1"}]}}],
                    "backendRefs": [{"name": "web", "port": 80, "weight": 3}, {"name": "web-v2", "port": 80}]
                }, {}]
            }}),
        )
        .await
        .unwrap();
        create(
            &admin,
            Some("apps"),
            "v1",
            "GRPCRoute",
            "grpcroutes",
            json!({"metadata": {"name": "grpc"}, "spec": {"parentRefs": [{"name": "edge", "namespace": "default"}],
                "rules": [{"matches": [{"method": {"service": "echo.Echo", "method": "Say"}}],
                           "backendRefs": [{"name": "grpc", "port": 9000}]}]}}),
        )
        .await
        .unwrap();
        create(
            &admin,
            Some("apps"),
            "v1",
            "TLSRoute",
            "tlsroutes",
            json!({"metadata": {"name": "db"}, "spec": {"parentRefs": [{"name": "edge", "namespace": "default"}],
                "hostnames": ["db.example.com"], "rules": [{"backendRefs": [{"name": "db", "port": 5432}]}]}}),
        )
        .await
        .unwrap();
        // kube-apiserver 1.20 stores an empty string (`group: ""`, the core group of Services and
        // Secrets) as null and then refuses it as not a string: this grant names a kind of a
        // named group. Grants to Services and Secrets are tested from manifests until the test
        // API server is newer.
        create(
            &admin,
            Some("default"),
            "v1beta1",
            "ReferenceGrant",
            "referencegrants",
            json!({"metadata": {"name": "routes-from-apps"}, "spec": {
                "from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "apps"}],
                "to": [{"group": "gateway.networking.k8s.io", "kind": "Gateway"}]}}),
        )
        .await
        .unwrap();

        // The schema (without its CEL rules) still refuses what it types: a port out of range.
        let refused = create(
            &admin,
            Some("default"),
            "v1",
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "bad"}, "spec": {"gatewayClassName": "weir",
                "listeners": [{"name": "http", "port": 70000, "protocol": "HTTP"}]}}),
        )
        .await;
        match refused {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 422, "{status:?}"),
            other => panic!("a listener on port 70000 was accepted: {other:?}"),
        }

        // weir's types read what the API server stores, its defaults applied.
        let class = Api::<GatewayClass>::all(admin.clone()).get("weir").await.unwrap();
        assert_eq!(class.spec.controller_name, "weir.dev/gateway-controller");
        let gateway = Api::<Gateway>::namespaced(admin.clone(), "default").get("edge").await.unwrap();
        assert_eq!(gateway.spec.listeners.len(), 2);
        let selector =
            gateway.spec.listeners[0].allowed_routes.as_ref().unwrap().namespaces.as_ref().unwrap();
        assert_eq!(selector.from.as_deref(), Some("Selector"));
        let tls = gateway.spec.listeners[1].tls.as_ref().unwrap();
        assert_eq!(tls.mode.as_deref(), Some("Terminate"), "the CRD defaults tls.mode");
        assert_eq!(tls.certificate_refs[0].name, "wildcard");

        let route = Api::<HttpRoute>::namespaced(admin.clone(), "apps").get("web").await.unwrap();
        let rules = &route.spec.rules;
        assert_eq!(rules.len(), 2);
        let m = &rules[0].matches[0];
        assert_eq!(m.path.as_ref().unwrap().type_.as_deref(), Some("Exact"));
        assert_eq!(m.method.as_deref(), Some("POST"));
        assert_eq!(m.headers[0].type_.as_deref(), Some("Exact"), "the CRD defaults the header match type");
        assert_eq!(rules[0].backend_refs[0].backend.weight, Some(3));
        assert_eq!(rules[0].backend_refs[1].backend.weight, Some(1), "the CRD defaults weight to 1");
        let defaulted = rules[1].matches[0].path.as_ref().unwrap();
        assert_eq!(
            (defaulted.type_.as_deref(), defaulted.value.as_deref()),
            (Some("PathPrefix"), Some("/")),
            "the CRD defaults an empty rule's match to PathPrefix /"
        );
        assert_eq!(route.spec.parent_refs[0].kind.as_deref(), Some("Gateway"));

        let grpc = Api::<GrpcRoute>::namespaced(admin.clone(), "apps").get("grpc").await.unwrap();
        let method = grpc.spec.rules[0].matches[0].method.as_ref().unwrap();
        assert_eq!((method.service.as_deref(), method.method.as_deref()), (Some("echo.Echo"), Some("Say")));
        let tls_route = Api::<TlsRoute>::namespaced(admin.clone(), "apps").get("db").await.unwrap();
        assert_eq!(tls_route.spec.rules[0].backend_refs[0].port, Some(5432));
        let grant = Api::<ReferenceGrant>::namespaced(admin.clone(), "default")
            .get("routes-from-apps")
            .await
            .unwrap();
        assert_eq!(grant.spec.from[0].namespace, "apps");
        assert_eq!(grant.spec.to[0].kind, "Gateway");
    });
}
