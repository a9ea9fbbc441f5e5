//! GRPCRoute status written by the leader, against the real API server (kube-apiserver with the
//! repository's CRDs): per parent `Accepted` and `ResolvedRefs` with their reasons and
//! `observedGeneration`, the listener's `attachedRoutes`, and the HTTPRoute/GRPCRoute hostname
//! conflict of `GRPCRouteSpec.hostnames` ("The rejected Route MUST raise an 'Accepted'
//! condition with a status of 'False'").

#![allow(clippy::unwrap_used, missing_docs)]

mod gateway_crds_support;
mod support_kube;

use std::time::Duration;

use gateway_crds_support::{create, install_gateway_crds};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::Api;
use serde_json::{Value, json};
use support_kube::{ApiServer, Echo, Weir, apply, endpoints, eventually, isolated, service};
use weir::gateway::{Gateway, GrpcRoute};

const CONTROLLER: &str = "weir.dev/gateway-controller";

/// The condition `type_` of a list (`Value::Null` when absent).
fn cond<'a>(conditions: &'a Value, type_: &str) -> &'a Value {
    conditions.as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

/// `(status, reason, observedGeneration)` of a condition.
fn summary(c: &Value) -> (String, String, i64) {
    (
        c["status"].as_str().unwrap_or("").to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
        c["observedGeneration"].as_i64().unwrap_or(-1),
    )
}

fn s(status: &str, reason: &str, generation: i64) -> (String, String, i64) {
    (status.to_string(), reason.to_string(), generation)
}

#[test]
fn grpcroute_status_written_by_the_leader() {
    isolated("grpcroute_status_written_by_the_leader", || async {
        let api = ApiServer::start().await;
        let admin = api.client().await;
        install_gateway_crds(&admin).await;
        let ns = "default";
        let echo = Echo::start(&["a"]).await;
        apply::<Service>(&admin, ns, service("web")).await;
        apply::<Endpoints>(&admin, ns, endpoints("web", &echo.ports)).await;
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        create(
            &admin,
            None,
            "v1",
            "GatewayClass",
            "gatewayclasses",
            json!({"metadata": {"name": "weir"}, "spec": {"controllerName": CONTROLLER}}),
        )
        .await
        .unwrap();
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
            ]}}),
        )
        .await
        .unwrap();
        let rule = |backend: &str, filters: Value| json!({"backendRefs": [{"name": backend, "port": 80}], "filters": filters});
        let route = |name: &str, host: &str, rule: Value| {
            json!({"metadata": {"name": name}, "spec": {
                "parentRefs": [{"name": "edge"}], "hostnames": [host], "rules": [rule]}})
        };
        // The HTTPRoute is created first, and its name comes first too: it wins even if both
        // were created within one second.
        gw("HTTPRoute", "httproutes", route("a-http", "shared.example", rule("web", json!([]))))
            .await
            .unwrap();
        gw("GRPCRoute", "grpcroutes", route("z-grpc", "shared.example", rule("web", json!([]))))
            .await
            .unwrap();
        gw("GRPCRoute", "grpcroutes", route("ok", "ok.example", rule("web", json!([])))).await.unwrap();
        gw("GRPCRoute", "grpcroutes", route("bad", "bad.example", rule("missing", json!([])))).await.unwrap();
        let extension = json!([{"type": "ExtensionRef", "extensionRef": {"group": "example.com", "kind": "Plugin", "name": "p"}}]);
        gw("GRPCRoute", "grpcroutes", route("ext", "ext.example", rule("web", extension))).await.unwrap();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("shared.example", "a", Duration::from_secs(15)).await;

        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let routes: Api<GrpcRoute> = Api::namespaced(admin.clone(), ns);
        let parent = |name: &'static str| {
            let routes = routes.clone();
            async move {
                let r = routes.get(name).await.ok()?;
                let status = serde_json::to_value(r.status?).ok()?;
                status["parents"].as_array()?.iter().find(|p| p["controllerName"] == CONTROLLER).cloned()
            }
        };
        let ok = eventually("ok's status", Duration::from_secs(15), || parent("ok")).await;
        assert_eq!(summary(cond(&ok["conditions"], "Accepted")), s("True", "Accepted", 1), "{ok}");
        assert_eq!(summary(cond(&ok["conditions"], "ResolvedRefs")), s("True", "ResolvedRefs", 1), "{ok}");
        let bad = eventually("bad's status", Duration::from_secs(15), || parent("bad")).await;
        assert_eq!(summary(cond(&bad["conditions"], "Accepted")), s("True", "Accepted", 1), "{bad}");
        assert_eq!(
            summary(cond(&bad["conditions"], "ResolvedRefs")),
            s("False", "BackendNotFound", 1),
            "{bad}"
        );
        // `GRPCRouteFilter.type`: an ExtensionRef weir has none of is not skipped.
        let ext = eventually("ext's status", Duration::from_secs(15), || parent("ext")).await;
        assert_eq!(summary(cond(&ext["conditions"], "Accepted")), s("False", "UnsupportedValue", 1), "{ext}");
        let lost = eventually("z-grpc's status", Duration::from_secs(15), || parent("z-grpc")).await;
        assert_eq!(
            summary(cond(&lost["conditions"], "Accepted")),
            s("False", "NotAllowedByListeners", 1),
            "{lost}"
        );
        assert!(lost["conditions"].to_string().contains("default/a-http"), "{lost}");

        // `ListenerStatus.attachedRoutes`: "Routes with any other value for the Accepted
        // condition MUST NOT be included in this count": a-http, ok and bad, not z-grpc (the
        // conflict) nor ext (its filter).
        let status = eventually("the Gateway status", Duration::from_secs(15), || async {
            let g = gateways.get("edge").await.ok()?;
            let status = serde_json::to_value(g.status?).ok()?;
            (status["listeners"][0]["attachedRoutes"] == 3).then_some(status)
        })
        .await;
        assert_eq!(
            status["listeners"][0]["supportedKinds"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}, {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}])
        );
        // The HTTPRoute still serves the shared host.
        assert_eq!(weir.get("shared.example", "/").map(|r| r.0), Some(200));
    });
}
