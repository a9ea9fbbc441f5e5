//! The Gateway API objects weir reads (`gateway.networking.k8s.io`, standard channel v1.6):
//! GatewayClass, Gateway, ListenerSet, HTTPRoute, GRPCRoute, TLSRoute and ReferenceGrant.
//!
//! Hand-written serde types of the wire format, as the API server stores them, for the fields
//! weir reads and the status it writes; unknown fields are ignored, as the k8s-openapi types
//! do. The field documentation of the upstream Go types (`apis/v1/*_types.go`) is the
//! specification. Defaults the CRD schema applies (`weight: 1`, a parentRef's `kind: Gateway`,
//! a path match `PathPrefix /`…) are left unset here: objects from `--manifests` never pass
//! through the API server, so translation applies them, with the helpers below.
//!
//! Values with a closed set of spellings (protocols, match types, filter types) stay strings:
//! an object with a value weir does not know still parses, and translation gives it the
//! condition the specification asks for (`UnsupportedValue`, `InvalidKind`…) instead of failing
//! the whole manifest file.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The version weir watches (and writes status to) for all kinds but ReferenceGrant.
pub const VERSION: &str = "v1";
/// The version weir watches ReferenceGrants in (served by every release since v0.6; v1 only
/// since v1.5).
pub const REFERENCE_GRANT_VERSION: &str = "v1beta1";

/// The `apiVersion`s a manifest may give each kind: `v1`, and the older versions the API
/// serves with the same schema (they differ only in name).
pub fn accepted_version(api_version: &str, kind: &str) -> bool {
    let Some(version) = api_version.strip_prefix("gateway.networking.k8s.io/") else {
        return false;
    };
    match kind {
        "GatewayClass" | "Gateway" | "HTTPRoute" | "ReferenceGrant" => matches!(version, "v1" | "v1beta1"),
        "GRPCRoute" | "TLSRoute" | "ListenerSet" => version == "v1",
        _ => false,
    }
}

// === GatewayClass ===

/// `GatewayClass` (cluster-scoped): a class of Gateways and the controller implementing it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClass {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The controller and its parameters.
    pub spec: GatewayClassSpec,
    /// Written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<GatewayClassStatus>,
}

/// `GatewayClass.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    /// The controller that manages Gateways of this class (`weir.dev/gateway-controller`).
    pub controller_name: String,
    /// Implementation-specific parameters (weir has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<ParametersReference>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `GatewayClass.spec.parametersRef`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParametersReference {
    /// API group of the referent.
    #[serde(default)]
    pub group: String,
    /// Kind of the referent.
    #[serde(default)]
    pub kind: String,
    /// Name of the referent.
    #[serde(default)]
    pub name: String,
    /// Namespace of a namespaced referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `GatewayClass.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    /// `Accepted`, `SupportedVersion`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

// === Gateway ===

/// `Gateway`: listeners (port, protocol, hostname) that routes attach to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gateway {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The class and the listeners.
    pub spec: GatewaySpec,
    /// Written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<GatewayStatus>,
}

/// `Gateway.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The GatewayClass.
    pub gateway_class_name: String,
    /// Logical endpoints bound on this Gateway's addresses (at least one).
    pub listeners: Vec<Listener>,
    /// Addresses requested for the Gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<GatewayAddress>,
    /// TLS of the whole Gateway: client certificate validation of its HTTPS listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTlsConfig>,
    /// Which ListenerSets may add listeners to this Gateway (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_listeners: Option<AllowedListeners>,
}

/// `Gateway.spec.allowedListeners`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedListeners {
    /// From which namespaces (default `from: None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<ListenerNamespaces>,
}

/// `AllowedListeners.namespaces` (`ListenerNamespaces`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerNamespaces {
    /// `None` (the default), `Same`, `All` or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The labels of the namespaces allowed, with `from: Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// `Gateway.spec.tls` (`GatewayTLSConfig`). `backend` (the Gateway's own client certificate
/// towards backends) is not read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTlsConfig {
    /// TLS towards clients: their certificates' validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend: Option<FrontendTlsConfig>,
}

/// `GatewayTLSConfig.frontend` (`FrontendTLSConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendTlsConfig {
    /// For every HTTPS listener whose port has no `perPort` entry.
    pub default: TlsConfig,
    /// Overrides of `default` for the HTTPS listeners of one port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_port: Vec<TlsPortConfig>,
}

/// `TLSConfig`: client certificate validation, or none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Setting it makes the listeners ask clients for certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<FrontendTlsValidation>,
}

/// `FrontendTLSConfig.perPort[]` (`TLSPortConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsPortConfig {
    /// The listener port it applies to.
    pub port: i32,
    /// What applies there instead of `default`.
    pub tls: TlsConfig,
}

/// `FrontendTLSValidation`: the CAs client certificates must chain to, and the mode.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendTlsValidation {
    /// ConfigMaps with the CA bundle in `ca.crt` (core: one).
    pub ca_certificate_refs: Vec<ObjectReference>,
    /// `AllowValidOnly` (the default) or `AllowInsecureFallback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// `ObjectReference`: an object of any kind, in the referrer's namespace unless named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// The API group; `""` (or unset) the core group.
    #[serde(default)]
    pub group: String,
    /// The kind (`ConfigMap`).
    pub kind: String,
    /// The name.
    pub name: String,
    /// Default: the referrer's namespace (another one needs a ReferenceGrant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `Gateway.spec.listeners[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// Unique within the Gateway; a route's `sectionName` names it.
    pub name: String,
    /// The host name (exact or `*.` wildcard) routes attached here must match; none: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The port clients reach.
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or a domain-prefixed protocol.
    pub protocol: String,
    /// TLS termination or passthrough (HTTPS and TLS listeners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Which routes may attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `Listener.tls`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (the default) or `Passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The certificates (Secrets of type `kubernetes.io/tls`) to terminate with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_refs: Vec<SecretObjectReference>,
    /// Implementation-specific options (weir has none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// `Listener.allowedRoutes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// From which namespaces (default: the Gateway's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    /// Which route kinds (default: those the protocol supports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<RouteGroupKind>,
}

/// `AllowedRoutes.namespaces`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The labels of the namespaces allowed, with `from: Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A route kind: `AllowedRoutes.kinds[]`, `ListenerStatus.supportedKinds[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// API group (default `gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `HTTPRoute`, `GRPCRoute`, `TLSRoute`…
    pub kind: String,
}

/// `Gateway.spec.addresses[]` and `Gateway.status.addresses[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// `IPAddress` (the default), `Hostname` or a domain-prefixed type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The address.
    #[serde(default)]
    pub value: String,
}

/// `Gateway.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Where clients reach the Gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<GatewayAddress>,
    /// `Accepted`, `Programmed`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// One per listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerStatus>,
    /// How many ListenerSets are attached (selected, naming this Gateway, and `Accepted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_listener_sets: Option<i32>,
}

/// `Gateway.status.listeners[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// The listener's name.
    pub name: String,
    /// Route kinds the listener supports (and allows).
    #[serde(default)]
    pub supported_kinds: Vec<RouteGroupKind>,
    /// Routes accepted on the listener.
    #[serde(default)]
    pub attached_routes: i32,
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

// === references ===

/// `ParentReference`: the Gateway (and listener) a route attaches to.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// Default `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Default: the route's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Gateway's name.
    pub name: String,
    /// A listener's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// A listener's port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `SecretObjectReference`: a listener's certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretObjectReference {
    /// Default `""` (core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Secret's name.
    pub name: String,
    /// Default: the Gateway's namespace (another one needs a ReferenceGrant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `BackendRef`: a Service (port) and its weight.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Default `""` (core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Service's name.
    pub name: String,
    /// Default: the route's namespace (another one needs a ReferenceGrant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Service port (required for a Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Share of the requests, relative to the other refs of the rule (default 1; 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// `HTTPBackendRef` and `GRPCBackendRef`: a [`BackendRef`] with filters of its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBackendRef {
    /// The backend.
    #[serde(flatten)]
    pub backend: BackendRef,
    /// Filters applied to requests sent to this backend only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
}

/// `LocalObjectReference` (an `extensionRef` filter).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// API group.
    #[serde(default)]
    pub group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
}

/// `RouteStatus.parents[]`: a route's conditions for one parent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent, as the route names it.
    pub parent_ref: ParentReference,
    /// The controller writing this entry.
    pub controller_name: String,
    /// `Accepted`, `ResolvedRefs`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// `RouteStatus`, shared by every route kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// One entry per parent and controller.
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

// === HTTPRoute ===

/// `HTTPRoute`: HTTP requests matched by host, path, headers, query and method, to backends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Parents, hostnames and rules.
    #[serde(default)]
    pub spec: HttpRouteSpec,
    /// Written by the controllers of its parents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RouteStatus>,
}

/// `HTTPRoute.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// The Gateways (listeners) to attach to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    /// Host names (exact or `*.` wildcard) matched against `Host`; none: the listener's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules (default: one rule matching `PathPrefix /` without backends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<HttpRouteRule>,
}

/// `HTTPRouteRule`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// Optional name of the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// ORed matches (default: `PathPrefix /`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpRouteMatch>,
    /// Filters applied to every request of the rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
    /// Where requests go (none: `500`, unless a filter answers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
    /// Timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HttpRouteTimeouts>,
    /// When a request is sent to the backend again (experimental channel in v1.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HttpRouteRetry>,
}

/// `HTTPRouteRetry` (experimental channel in v1.6.1): the statuses whose answers are retried,
/// how many retries at most, the least wait before each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRetry {
    /// Statuses (400 to 599) whose answers are retried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<i32>,
    /// Retries at most (1 or more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// Least wait before a retry, a GEP-2257 duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// `HTTPRouteTimeouts`: Gateway API durations (`10s`, `1h2m`, `500ms`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    /// For the whole request, from the client's first byte to the response's last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// For one request to a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// `HTTPRouteMatch`: all of its conditions must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// The path (default `PathPrefix /`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathMatch>,
    /// Headers, all of which must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpValueMatch>,
    /// Query parameters, all of which must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<HttpValueMatch>,
    /// The method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `HTTPPathMatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathMatch {
    /// `Exact`, `PathPrefix` (the default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The path (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `HTTPHeaderMatch`, `HTTPQueryParamMatch`, `GRPCHeaderMatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpValueMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Header name (case-insensitive) or query parameter name (case-sensitive).
    pub name: String,
    /// The value.
    pub value: String,
}

/// `HTTPRouteFilter` (and `GRPCRouteFilter`, a subset): `type` says which field applies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    /// `RequestHeaderModifier`, `ResponseHeaderModifier`, `RequestMirror`, `RequestRedirect`,
    /// `URLRewrite`, `CORS`, `ExternalAuth`, `ExtensionRef`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Headers of the request set, added or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    /// Headers of the response set, added or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    /// A copy of requests to another backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<HttpRequestMirrorFilter>,
    /// A redirect answered by weir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HttpRequestRedirectFilter>,
    /// Host and path rewritten on the way to the backend.
    #[serde(default, rename = "urlRewrite", skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HttpUrlRewriteFilter>,
    /// CORS (kept as given; weir reads it field by field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<serde_json::Value>,
    /// External authorization (kept as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_auth: Option<serde_json::Value>,
    /// An implementation-specific filter object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<LocalObjectReference>,
}

/// `HTTPHeaderFilter`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderFilter {
    /// Replace (or add) these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HttpHeader>,
    /// Add these values (after any existing ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HttpHeader>,
    /// Remove these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// `HTTPHeader`: a name and a value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name.
    pub name: String,
    /// Header value.
    pub value: String,
}

/// `HTTPRequestMirrorFilter`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestMirrorFilter {
    /// The backend that receives the copies (its answers are dropped).
    pub backend_ref: BackendRef,
    /// Share of requests mirrored, 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// Share of requests mirrored, as a fraction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// `Fraction`: numerator / denominator (default 100).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    /// Numerator.
    pub numerator: i32,
    /// Denominator (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denominator: Option<i32>,
}

/// `HTTPRequestRedirectFilter`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestRedirectFilter {
    /// `http` or `https` (default: the request's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Host name (default: the request's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The path, replaced whole or by prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
    /// Port (default: the scheme's when the scheme is given, else the listener's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// `301`, `302` (default), `303`, `307` or `308`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i32>,
}

/// `HTTPURLRewriteFilter`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpUrlRewriteFilter {
    /// The `Host` sent to the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The path sent to the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
}

/// `HTTPPathModifier`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The new path, with `ReplaceFullPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    /// What replaces the matched prefix, with `ReplacePrefixMatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

// === GRPCRoute ===

/// `GRPCRoute`: gRPC requests matched by host, service/method and headers, to backends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRoute {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Parents, hostnames and rules.
    #[serde(default)]
    pub spec: GrpcRouteSpec,
    /// Written by the controllers of its parents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RouteStatus>,
}

/// `GRPCRoute.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    /// The Gateways (listeners) to attach to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    /// Host names, as for HTTPRoute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<GrpcRouteRule>,
}

/// `GRPCRouteRule`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteRule {
    /// Optional name of the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// ORed matches (default: every request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<GrpcRouteMatch>,
    /// Filters applied to every request of the rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
    /// Where requests go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
}

/// `GRPCRouteMatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteMatch {
    /// Service and method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    /// Headers, all of which must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpValueMatch>,
}

/// `GRPCMethodMatch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethodMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The service (`pkg.Service`); none: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The method; none: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

// === TLSRoute ===

/// `TLSRoute`: TLS connections matched by SNI, passed through to backends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRoute {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Parents, hostnames and rules.
    #[serde(default)]
    pub spec: TlsRouteSpec,
    /// Written by the controllers of its parents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RouteStatus>,
}

/// `TLSRoute.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteSpec {
    /// The Gateways (listeners) to attach to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    /// SNI host names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The rules (one, in v1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<TlsRouteRule>,
}

/// `TLSRouteRule`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteRule {
    /// Optional name of the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where connections go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<BackendRef>,
}

// === ListenerSet ===

/// `ListenerSet`: listeners added to a Gateway that allows it (`spec.allowedListeners`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSet {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The parent Gateway and the listeners.
    pub spec: ListenerSetSpec,
    /// Written by the parent Gateway's controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ListenerSetStatus>,
}

/// `ListenerSet.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetSpec {
    /// The Gateway the listeners are added to.
    pub parent_ref: ParentGatewayReference,
    /// The listeners (`ListenerEntry`: the fields of a Gateway's [`Listener`]).
    pub listeners: Vec<Listener>,
}

/// `ParentGatewayReference`: a ListenerSet's Gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentGatewayReference {
    /// Default `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Gateway's name.
    pub name: String,
    /// Default: the ListenerSet's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `ListenerSet.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetStatus {
    /// `Accepted`, `Programmed`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// One per listener (`ListenerEntryStatus`: the fields of a [`ListenerStatus`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerStatus>,
}

// === ReferenceGrant ===

/// `ReferenceGrant`: lets objects of other namespaces refer to objects of this one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrant {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Who may refer to what.
    pub spec: ReferenceGrantSpec,
}

/// `ReferenceGrant.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// The referring objects, by group, kind and namespace.
    pub from: Vec<ReferenceGrantFrom>,
    /// The objects of this namespace they may refer to.
    pub to: Vec<ReferenceGrantTo>,
}

/// `ReferenceGrantFrom`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    /// API group (`gateway.networking.k8s.io`).
    pub group: String,
    /// Kind (`HTTPRoute`, `Gateway`…).
    pub kind: String,
    /// Namespace of the referring objects.
    pub namespace: String,
}

/// `ReferenceGrantTo`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    /// API group (`""` for Services and Secrets).
    pub group: String,
    /// Kind (`Service`, `Secret`).
    pub kind: String,
    /// One object; none: every object of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

// === impl kube::Resource ===

macro_rules! resource {
    ($ty:ty, $kind:literal, $plural:literal, $version:expr, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(GROUP)
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }

            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource!(GatewayClass, "GatewayClass", "gatewayclasses", VERSION, k8s_openapi::ClusterResourceScope);
resource!(Gateway, "Gateway", "gateways", VERSION, k8s_openapi::NamespaceResourceScope);
resource!(HttpRoute, "HTTPRoute", "httproutes", VERSION, k8s_openapi::NamespaceResourceScope);
resource!(GrpcRoute, "GRPCRoute", "grpcroutes", VERSION, k8s_openapi::NamespaceResourceScope);
resource!(TlsRoute, "TLSRoute", "tlsroutes", VERSION, k8s_openapi::NamespaceResourceScope);
resource!(ListenerSet, "ListenerSet", "listenersets", VERSION, k8s_openapi::NamespaceResourceScope);
resource!(
    ReferenceGrant,
    "ReferenceGrant",
    "referencegrants",
    REFERENCE_GRANT_VERSION,
    k8s_openapi::NamespaceResourceScope
);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The example of the HTTPRoute documentation round-trips, defaults left unset.
    #[test]
    fn http_route_parses_and_round_trips() {
        let text = r#"
metadata: {name: web, namespace: apps}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: ["*.example.com"]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /api}
      headers: [{name: x-env, value: canary}]
      queryParams: [{type: RegularExpression, name: v, value: "^2"}]
      method: GET
    filters:
    - type: URLRewrite
      urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}
    - type: SomethingNew
    backendRefs:
    - {name: api, port: 8080, weight: 3}
    - name: api-v2
      port: 8080
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-v, value: "2"}]}}]
    timeouts: {request: 10s}
"#;
        let route: HttpRoute = serde_saphyr::from_str(text).unwrap();
        let rule = &route.spec.rules[0];
        assert_eq!(rule.matches[0].headers[0].type_, None);
        assert_eq!(rule.matches[0].query_params[0].type_.as_deref(), Some("RegularExpression"));
        assert_eq!(rule.filters[1].type_, "SomethingNew");
        assert_eq!(rule.backend_refs[0].backend.weight, Some(3));
        assert_eq!(
            rule.backend_refs[1].filters[0].request_header_modifier.as_ref().unwrap().set[0].value,
            "2"
        );
        let again: HttpRoute = serde_json::from_value(serde_json::to_value(&route).unwrap()).unwrap();
        assert_eq!(again, route);
    }

    #[test]
    fn older_versions_are_accepted_by_name() {
        assert!(accepted_version("gateway.networking.k8s.io/v1beta1", "HTTPRoute"));
        assert!(accepted_version("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"));
        assert!(accepted_version("gateway.networking.k8s.io/v1", "TLSRoute"));
        assert!(!accepted_version("gateway.networking.k8s.io/v1alpha2", "TLSRoute"));
        assert!(!accepted_version("networking.k8s.io/v1", "HTTPRoute"));
    }
}
