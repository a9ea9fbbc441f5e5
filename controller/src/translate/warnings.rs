//! What translation has to say about the objects it read: rejected parts and notable choices.
//!
//! Warnings become Ingress status conditions and Kubernetes Events, so their `reason` follows the
//! Event convention (a CamelCase word) and their `message` is a sentence naming the field.

use std::fmt;

use serde::Serialize;
use weir_dataplane::model::ObjectRef;

/// The kind of object a warning is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ObjectKind {
    /// A `networking.k8s.io/v1` Ingress.
    Ingress,
    /// A `networking.k8s.io/v1` IngressClass (cluster-scoped: the namespace is empty).
    IngressClass,
    /// A core `v1` Service.
    Service,
    /// A `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// A core `v1` Endpoints.
    Endpoints,
    /// A core `v1` Secret.
    Secret,
    /// A core `v1` ConfigMap (the settings ConfigMap).
    ConfigMap,
    /// A `gateway.networking.k8s.io/v1` HTTPRoute.
    HttpRoute,
    /// A `gateway.networking.k8s.io/v1` Gateway.
    Gateway,
    /// A `gateway.networking.k8s.io` TLSRoute.
    TlsRoute,
    /// A `gateway.networking.k8s.io/v1` GRPCRoute.
    GrpcRoute,
    /// A `gateway.networking.k8s.io/v1` ListenerSet.
    ListenerSet,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// How bad it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Severity {
    /// The object, or part of it, was rejected or cannot serve as written.
    Error,
    /// Accepted, but worth knowing (deprecated syntax, an ambiguous choice).
    Warning,
}

/// Why: a stable, machine-readable word, like a Kubernetes Event reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Reason {
    /// Another Ingress (or another part of this one) claims the same host and path, the same
    /// default backend, or the same TLS host, and takes precedence.
    ConflictLost,
    /// A backend names a Service that does not exist; the route answers 503.
    ServiceNotFound,
    /// A backend names a port its Service does not have; the route answers 503.
    ServicePortNotFound,
    /// A Service cannot serve as a backend as written (an ExternalName without a name).
    InvalidService,
    /// A backend's service port is neither a valid number nor a name.
    InvalidBackend,
    /// A backend is not a Service (a `resource` backend); weir does not serve those.
    UnsupportedBackend,
    /// A path or path type is not valid; the path is ignored.
    InvalidPath,
    /// A host is not a valid host name; the rule or TLS host is ignored.
    InvalidHost,
    /// A TLS secret does not exist; the default certificate is used.
    SecretNotFound,
    /// A TLS secret lacks `tls.crt`/`tls.key` (or they are not text); the default certificate is used.
    InvalidSecret,
    /// The Ingress selects its class with the deprecated `kubernetes.io/ingress.class` annotation.
    DeprecatedClassAnnotation,
    /// An annotation's value is invalid; the annotation is ignored (or fails closed).
    InvalidAnnotation,
    /// An annotation weir refuses on principle (configuration snippets, Lua).
    RefusedAnnotation,
    /// A known ingress-nginx annotation weir does not support yet.
    UnsupportedAnnotation,
    /// An annotation under weir's or ingress-nginx's prefix that neither knows (a typo?).
    UnknownAnnotation,
    /// A canary Ingress's path has no main Ingress to shadow (or the part cannot be a canary).
    CanaryWithoutMain,
    /// A settings ConfigMap key's value is invalid; the key keeps its default.
    InvalidSetting,
    /// A settings ConfigMap key weir refuses on principle (snippets, Lua).
    RefusedSetting,
    /// A known ingress-nginx ConfigMap key weir does not support (yet).
    UnsupportedSetting,
    /// A settings ConfigMap key neither weir nor ingress-nginx knows (a typo?).
    UnknownSetting,
    /// A TCP or UDP services ConfigMap entry is malformed (or its ConfigMap is missing); the
    /// entry is not served.
    InvalidL4Entry,
    /// A TCP services port is one of weir's own listeners; the entry is not served.
    L4PortConflict,
    /// weir could not listen on a TCP or UDP services port (taken, or privileged); the other
    /// ports serve.
    L4BindFailed,
    /// A Gateway API route is not accepted by a parent of ours (see its `Accepted` condition).
    RouteNotAccepted,
    /// A Gateway API `backendRef` does not resolve (missing Service or port, another namespace
    /// without a ReferenceGrant, an unsupported kind); its share of the requests answers 500.
    BackendNotResolved,
    /// A Gateway API filter weir does not support; the rule answers 500.
    UnsupportedFilter,
    /// A Gateway API rule `name` that is not a `SectionName` or not unique within its route;
    /// the rule serves without it.
    InvalidRuleName,
    /// A Gateway listener is not served (not accepted, a certificate that does not resolve,
    /// a conflict with another listener).
    ListenerNotServed,
    /// A Gateway API field is served otherwise than written, at a limit of weir's (an
    /// HTTPRoute `retry.attempts` above the most retries weir makes).
    ServedOtherwise,
    /// A Gateway listener is served, but a condition says part of it is not (a certificate or
    /// CA reference that does not resolve beside one that does).
    ListenerDegraded,
    /// A ListenerSet's listeners are not added to its Gateway (the Gateway's `allowedListeners`
    /// does not take it, or its class is not accepted).
    ListenerSetNotAttached,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One finding about one object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Warning {
    /// The kind of the object concerned.
    pub kind: ObjectKind,
    /// The object concerned (namespace empty for cluster-scoped objects).
    pub object: ObjectRef,
    /// Whether something was rejected.
    pub severity: Severity,
    /// Machine-readable reason.
    pub reason: Reason,
    /// A sentence naming the offending field and value.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.object.namespace.is_empty() {
            write!(f, "{} {}: {}", self.kind, self.object.name, self.message)
        } else {
            write!(f, "{} {}: {}", self.kind, self.object, self.message)
        }
    }
}

/// Collects warnings during one translation.
#[derive(Debug, Default)]
pub(crate) struct Warnings(Vec<Warning>);

impl Warnings {
    /// An [`Severity::Error`] about an Ingress.
    pub(crate) fn error(&mut self, ingress: &ObjectRef, reason: Reason, message: String) {
        self.push(ingress, Severity::Error, reason, message);
    }

    /// A [`Severity::Warning`] about an Ingress.
    pub(crate) fn warn(&mut self, ingress: &ObjectRef, reason: Reason, message: String) {
        self.push(ingress, Severity::Warning, reason, message);
    }

    /// An error about an object that is not an Ingress (a configured default certificate).
    pub(crate) fn error_on(&mut self, kind: ObjectKind, object: &ObjectRef, reason: Reason, message: String) {
        self.0.push(Warning { kind, object: object.clone(), severity: Severity::Error, reason, message });
    }

    /// A [`Severity::Warning`] about an object that is not an Ingress.
    pub(crate) fn warn_on(&mut self, kind: ObjectKind, object: &ObjectRef, reason: Reason, message: String) {
        self.0.push(Warning { kind, object: object.clone(), severity: Severity::Warning, reason, message });
    }

    fn push(&mut self, ingress: &ObjectRef, severity: Severity, reason: Reason, message: String) {
        self.0.push(Warning {
            kind: ObjectKind::Ingress,
            object: ingress.clone(),
            severity,
            reason,
            message,
        });
    }

    /// Sorted and deduplicated.
    pub(crate) fn finish(mut self) -> Vec<Warning> {
        self.0.sort();
        self.0.dedup();
        self.0
    }
}
