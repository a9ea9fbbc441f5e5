//! Gateway API test helpers: the repository's CRDs installed on the test API server, objects
//! created through the dynamic API in any served version.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use weir::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TlsRoute};

use crate::support_kube::eventually;

/// Installs the CRDs of the repository as a user would, and waits until every kind is served.
pub async fn install_gateway_crds(admin: &kube::Client) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes/gateway-api/crds");
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for name in [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "grpcroutes",
        "tlsroutes",
        "referencegrants",
        "listenersets",
    ] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.yaml"))).unwrap();
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    }
    eventually("the Gateway API kinds are served", Duration::from_secs(60), || {
        let admin = admin.clone();
        async move {
            Api::<GatewayClass>::all(admin.clone()).list(&ListParams::default()).await.ok()?;
            Api::<Gateway>::all(admin.clone()).list(&ListParams::default()).await.ok()?;
            Api::<HttpRoute>::all(admin.clone()).list(&ListParams::default()).await.ok()?;
            Api::<GrpcRoute>::all(admin.clone()).list(&ListParams::default()).await.ok()?;
            Api::<TlsRoute>::all(admin.clone()).list(&ListParams::default()).await.ok()?;
            Api::<ListenerSet>::all(admin.clone()).list(&ListParams::default()).await.ok()?;
            Api::<ReferenceGrant>::all(admin).list(&ListParams::default()).await.ok()
        }
    })
    .await;
}

/// Creates `value` through the dynamic API of `group/version kind` (plural `plural`).
pub async fn create(
    admin: &kube::Client,
    namespace: Option<&str>,
    version: &str,
    kind: &str,
    plural: &str,
    value: serde_json::Value,
) -> kube::Result<DynamicObject> {
    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", version, kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &resource),
        None => Api::all_with(admin.clone(), &resource),
    };
    let mut value = value;
    value["apiVersion"] = format!("gateway.networking.k8s.io/{version}").into();
    value["kind"] = kind.into();
    api.create(&PostParams::default(), &serde_json::from_value(value).unwrap()).await
}
