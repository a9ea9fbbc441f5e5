//! One object as a source parsed or received it: the kinds weir reads, in their k8s-openapi
//! types, and a mark for every other kind (so a source can say what it skipped).
//!
//! Sources hand objects over as the API server stores them (namespace defaulted, a Secret's
//! `stringData` merged into `data`), trimmed of what nothing reads (`source/trim.rs`).

use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TlsRoute};

/// One Kubernetes object, as a source hands it over (a snapshot shares it as a
/// [`SharedObject`](super::SharedObject)).
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A `networking.k8s.io/v1` Ingress.
    Ingress(Box<Ingress>),
    /// A `networking.k8s.io/v1` IngressClass (cluster-scoped).
    IngressClass(Box<IngressClass>),
    /// A core `v1` Service.
    Service(Box<Service>),
    /// A `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice(Box<EndpointSlice>),
    /// A core `v1` Endpoints.
    Endpoints(Box<Endpoints>),
    /// A core `v1` Secret, with `stringData` already merged into `data`.
    Secret(Box<Secret>),
    /// A core `v1` ConfigMap (the settings ConfigMap in standalone mode).
    ConfigMap(Box<ConfigMap>),
    /// A Gateway API `GatewayClass` (cluster-scoped).
    GatewayClass(Box<GatewayClass>),
    /// A Gateway API `Gateway`.
    Gateway(Box<Gateway>),
    /// A Gateway API `HTTPRoute`.
    HttpRoute(Box<HttpRoute>),
    /// A Gateway API `GRPCRoute`.
    GrpcRoute(Box<GrpcRoute>),
    /// A Gateway API `TLSRoute`.
    TlsRoute(Box<TlsRoute>),
    /// A Gateway API `ListenerSet`.
    ListenerSet(Box<ListenerSet>),
    /// A Gateway API `ReferenceGrant`.
    ReferenceGrant(Box<ReferenceGrant>),
    /// A core `v1` Namespace (cluster-scoped; Gateway listeners select routes' namespaces by
    /// label).
    Namespace(Box<Namespace>),
    /// Any other kind: weir does not read it.
    Other {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
}

impl Object {
    /// The object's kind, as in its manifest.
    pub fn kind(&self) -> &str {
        match self {
            Object::Ingress(_) => "Ingress",
            Object::IngressClass(_) => "IngressClass",
            Object::Service(_) => "Service",
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::Endpoints(_) => "Endpoints",
            Object::Secret(_) => "Secret",
            Object::ConfigMap(_) => "ConfigMap",
            Object::GatewayClass(_) => "GatewayClass",
            Object::Gateway(_) => "Gateway",
            Object::HttpRoute(_) => "HTTPRoute",
            Object::GrpcRoute(_) => "GRPCRoute",
            Object::TlsRoute(_) => "TLSRoute",
            Object::ListenerSet(_) => "ListenerSet",
            Object::ReferenceGrant(_) => "ReferenceGrant",
            Object::Namespace(_) => "Namespace",
            Object::Other { kind, .. } => kind,
        }
    }

    /// The object's metadata (`None` for [`Object::Other`]).
    pub fn metadata(&self) -> Option<&ObjectMeta> {
        match self {
            Object::Ingress(o) => Some(&o.metadata),
            Object::IngressClass(o) => Some(&o.metadata),
            Object::Service(o) => Some(&o.metadata),
            Object::EndpointSlice(o) => Some(&o.metadata),
            Object::Endpoints(o) => Some(&o.metadata),
            Object::Secret(o) => Some(&o.metadata),
            Object::ConfigMap(o) => Some(&o.metadata),
            Object::GatewayClass(o) => Some(&o.metadata),
            Object::Gateway(o) => Some(&o.metadata),
            Object::HttpRoute(o) => Some(&o.metadata),
            Object::GrpcRoute(o) => Some(&o.metadata),
            Object::TlsRoute(o) => Some(&o.metadata),
            Object::ListenerSet(o) => Some(&o.metadata),
            Object::ReferenceGrant(o) => Some(&o.metadata),
            Object::Namespace(o) => Some(&o.metadata),
            Object::Other { .. } => None,
        }
    }

    /// A short description for messages: `Ingress default/web`, `IngressClass weir`, or
    /// `apps/v1 Deployment` for kinds weir does not read.
    pub fn describe(&self) -> String {
        match self {
            Object::Other { api_version, kind } => format!("{api_version} {kind}"),
            other => {
                let meta = other.metadata();
                let name = meta.and_then(|m| m.name.as_deref()).unwrap_or("");
                match meta.and_then(|m| m.namespace.as_deref()) {
                    Some(ns) => format!("{} {ns}/{name}", other.kind()),
                    None => format!("{} {name}", other.kind()),
                }
            }
        }
    }
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}
