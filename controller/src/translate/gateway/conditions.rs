//! Status conditions as translation decides them (pure): type, status, reason and message.
//! The status writer adds `observedGeneration` and `lastTransitionTime`.

use serde::Serialize;

/// One condition of a Gateway API object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Cond {
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`…
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// The reason, from the specification's list for this type.
    pub reason: &'static str,
    /// What a user reads.
    pub message: String,
}

impl Cond {
    /// A `True` condition.
    pub fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Cond {
        Cond { type_, status: true, reason, message: message.into() }
    }

    /// A `False` condition.
    pub fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Cond {
        Cond { type_, status: false, reason, message: message.into() }
    }
}

/// Condition types.
pub mod types {
    /// `Accepted`.
    pub const ACCEPTED: &str = "Accepted";
    /// `Programmed`.
    pub const PROGRAMMED: &str = "Programmed";
    /// `ResolvedRefs`.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// `Conflicted`.
    pub const CONFLICTED: &str = "Conflicted";
    /// `InsecureFrontendValidationMode` (Gateway): `AllowInsecureFallback` is configured.
    pub const INSECURE_FRONTEND_VALIDATION_MODE: &str = "InsecureFrontendValidationMode";
}

/// Condition reasons (`apis/v1/gateway_types.go`, `gatewayclass_types.go`, `shared_types.go`).
pub mod reasons {
    /// `Accepted`.
    pub const ACCEPTED: &str = "Accepted";
    /// `Programmed`.
    pub const PROGRAMMED: &str = "Programmed";
    /// `Invalid`.
    pub const INVALID: &str = "Invalid";
    /// `ResolvedRefs`.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// `ListenersNotValid` (Gateway `Accepted`).
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    /// `InvalidParameters` (GatewayClass `Accepted`).
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    /// `PortUnavailable` (listener `Accepted`).
    pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
    /// `UnsupportedProtocol` (listener `Accepted`).
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    /// `UnsupportedValue` (listener and route `Accepted`).
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    /// `HostnameConflict` (listener `Conflicted`).
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    /// `ProtocolConflict` (listener `Conflicted`).
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    /// `NoConflicts` (listener `Conflicted` false).
    pub const NO_CONFLICTS: &str = "NoConflicts";
    /// `InvalidCertificateRef` (listener `ResolvedRefs`).
    pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
    /// `InvalidRouteKinds` (listener `ResolvedRefs`).
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    /// `RefNotPermitted` (listener and route `ResolvedRefs`).
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// `InvalidCACertificateRef` (listener `ResolvedRefs`: a `caCertificateRef` that does not
    /// resolve).
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    /// `InvalidCACertificateKind` (listener `ResolvedRefs`: a `caCertificateRef` of a kind
    /// weir does not read).
    pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
    /// `NoValidCACertificate` (listener `Accepted`: no `caCertificateRef` resolves).
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
    /// `ConfigurationChanged` (Gateway `InsecureFrontendValidationMode`).
    pub const CONFIGURATION_CHANGED: &str = "ConfigurationChanged";
    /// `NotAllowed` (ListenerSet `Accepted`, `Programmed`: its Gateway's `allowedListeners`
    /// does not take it).
    pub const NOT_ALLOWED: &str = "NotAllowed";
    /// `ParentNotAccepted` (ListenerSet `Accepted`, `Programmed`).
    pub const PARENT_NOT_ACCEPTED: &str = "ParentNotAccepted";
    /// `NotAllowedByListeners` (route `Accepted`).
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    /// `NoMatchingListenerHostname` (route `Accepted`).
    pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    /// `NoMatchingParent` (route `Accepted`).
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    /// `BackendNotFound` (route `ResolvedRefs`).
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    /// `InvalidKind` (route `ResolvedRefs`).
    pub const INVALID_KIND: &str = "InvalidKind";
    /// `UnsupportedProtocol` (route `ResolvedRefs`: a backend's `appProtocol`).
    pub const UNSUPPORTED_PROTOCOL_REF: &str = "UnsupportedProtocol";
    /// `UnsupportedAddress` (Gateway `Accepted`: a `spec.addresses` type weir does not take).
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    /// `AddressNotUsable` (Gateway `Programmed`: a `spec.addresses` value weir cannot use).
    pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
    /// `AddressNotAssigned` (Gateway `Programmed`: no address to assign for an entry without a
    /// value).
    pub const ADDRESS_NOT_ASSIGNED: &str = "AddressNotAssigned";
}
