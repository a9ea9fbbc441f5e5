//! Which Gateway API kinds the Kubernetes source can watch: asked once at start-up.
//!
//! A cluster without the Gateway API CRDs (or with an older release lacking GRPCRoute or
//! TLSRoute v1, or ListenerSet v1 before v1.5), or a ServiceAccount without the rights to list
//! them, is normal: weir says so once in its log and goes on serving Ingresses, watching
//! whatever of the Gateway API it can.
//! Namespaces are watched with the Gateway API (listeners select routes' namespaces by label).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::gateway::{
    Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, REFERENCE_GRANT_VERSION, ReferenceGrant,
    TlsRoute, VERSION,
};

/// The Gateway API kinds the API server serves and weir may list (all false: Ingress only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatewayKinds {
    /// GatewayClasses, Gateways, HTTPRoutes and Namespaces: the Gateway API is on.
    pub http: bool,
    /// GRPCRoutes (v1 since Gateway API v1.1).
    pub grpc: bool,
    /// TLSRoutes (v1 since Gateway API v1.5).
    pub tls: bool,
    /// ReferenceGrants (v1beta1).
    pub reference_grants: bool,
    /// ListenerSets (v1 since Gateway API v1.5).
    pub listener_sets: bool,
}

/// Errors of the discovery (the API server did not answer; retried by the caller).
#[derive(Debug, thiserror::Error)]
#[error("Gateway API discovery of {group_version} failed: {source}")]
pub struct Error {
    group_version: String,
    #[source]
    source: kube::Error,
}

/// Asks the API server which Gateway API kinds it serves, and whether weir may list each
/// (`limit=1`).
pub async fn discover(client: &Client) -> Result<GatewayKinds, Error> {
    let v1 = served(client, VERSION).await?;
    let beta = served(client, REFERENCE_GRANT_VERSION).await?;
    let has = |list: &[String], name: &str| list.iter().any(|r| r == name);
    let mut kinds = GatewayKinds::default();
    if has(&v1, "gatewayclasses") && has(&v1, "gateways") && has(&v1, "httproutes") {
        kinds.http = may_list::<GatewayClass>(client).await
            && may_list::<Gateway>(client).await
            && may_list::<HttpRoute>(client).await
            && may_list::<Namespace>(client).await;
    }
    kinds.grpc = kinds.http && has(&v1, "grpcroutes") && may_list::<GrpcRoute>(client).await;
    kinds.tls = kinds.http && has(&v1, "tlsroutes") && may_list::<TlsRoute>(client).await;
    kinds.listener_sets = kinds.http && has(&v1, "listenersets") && may_list::<ListenerSet>(client).await;
    kinds.reference_grants =
        kinds.http && has(&beta, "referencegrants") && may_list::<ReferenceGrant>(client).await;
    Ok(kinds)
}

/// [`discover`], retried with backoff until the API server answers; logs once what is watched.
pub async fn discover_retrying(client: &Client) -> GatewayKinds {
    let mut retry = std::time::Duration::from_millis(250);
    let kinds = loop {
        match discover(client).await {
            Ok(kinds) => break kinds,
            Err(error) => {
                tracing::warn!(%error, "cannot reach the Kubernetes API; retrying");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(std::time::Duration::from_secs(5));
            }
        }
    };
    if kinds.http {
        tracing::info!(
            grpc_routes = kinds.grpc,
            tls_routes = kinds.tls,
            reference_grants = kinds.reference_grants,
            listener_sets = kinds.listener_sets,
            "watching the Gateway API (gateway.networking.k8s.io/v1)"
        );
    } else {
        tracing::info!(
            "the Gateway API (gateway.networking.k8s.io/v1 GatewayClass, Gateway, HTTPRoute) is not served or not readable; serving Ingresses only"
        );
    }
    kinds
}

/// The resource names `gateway.networking.k8s.io/VERSION` serves (none when the group is
/// unknown).
async fn served(client: &Client, version: &str) -> Result<Vec<String>, Error> {
    let group_version = format!("{}/{version}", crate::gateway::GROUP);
    match client.list_api_group_resources(&group_version).await {
        Ok(list) => Ok(list.resources.into_iter().map(|r| r.name).collect()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(source) => Err(Error { group_version, source }),
    }
}

/// Whether weir may list `K` in every namespace; a refusal is logged with what to grant.
async fn may_list<K>(client: &Client) -> bool
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(
                kind = %K::kind(&()),
                %error,
                "cannot list {} (grant list and watch on them, see examples/kubernetes/rbac.yaml)",
                K::plural(&())
            );
            false
        }
    }
}
