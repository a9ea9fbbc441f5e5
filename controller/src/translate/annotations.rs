//! ingress-nginx annotations read by translation, parsed into types. An unparsable value is
//! reported on its Ingress and the annotation's default applies.

use k8s_openapi::api::networking::v1::Ingress;
use weir_dataplane::model::{ObjectRef, UpstreamProtocol};

use super::warnings::{Reason, Warnings};

/// Redirect plain HTTP to HTTPS for hosts with TLS (default true).
pub(crate) const SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/ssl-redirect";
/// Redirect plain HTTP to HTTPS even for hosts without TLS (default false).
pub(crate) const FORCE_SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/force-ssl-redirect";

/// The protocol spoken to the Ingress's backends: HTTP (default), HTTP2/GRPC (h2c), HTTPS/GRPCS.
pub(crate) const BACKEND_PROTOCOL: &str = "nginx.ingress.kubernetes.io/backend-protocol";

/// Pass TLS connections for the Ingress's hosts to the backend of its `/` path, undecrypted.
pub(crate) const SSL_PASSTHROUGH: &str = "nginx.ingress.kubernetes.io/ssl-passthrough";

/// The annotation's value, if set.
pub(crate) fn get<'a>(ingress: &'a Ingress, key: &str) -> Option<&'a str> {
    ingress.metadata.annotations.as_ref()?.get(key).map(|v| v.trim())
}

/// A boolean annotation (`"true"`/`"false"`, any case); `default` when absent or invalid.
pub(crate) fn flag(
    ingress: &Ingress,
    object: &ObjectRef,
    key: &str,
    default: bool,
    warnings: &mut Warnings,
) -> bool {
    match get(ingress, key) {
        None => default,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            warnings.warn(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{key}]: {v:?} is not true or false; using {default}"),
            );
            default
        }
    }
}

/// The upstream protocol of an Ingress's backends (`backend-protocol`, case-insensitive).
pub(crate) fn backend_protocol(
    ingress: &Ingress,
    object: &ObjectRef,
    warnings: &mut Warnings,
) -> UpstreamProtocol {
    let Some(value) = get(ingress, BACKEND_PROTOCOL) else { return UpstreamProtocol::Http1 };
    match value.to_ascii_uppercase().as_str() {
        "HTTP" | "" => UpstreamProtocol::Http1,
        "HTTP2" | "GRPC" => UpstreamProtocol::H2c,
        other => {
            let why = match other {
                "HTTPS" | "GRPCS" => "TLS to backends is not supported yet",
                "AUTO_HTTP" | "FCGI" => "weir does not support this protocol",
                _ => "expected HTTP, HTTPS, GRPC, GRPCS or HTTP2",
            };
            warnings.warn(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{BACKEND_PROTOCOL}]: {value:?}: {why}; using HTTP"),
            );
            UpstreamProtocol::Http1
        }
    }
}

/// How `backend-protocol` names a protocol, for messages.
pub(crate) fn protocol_name(protocol: UpstreamProtocol) -> &'static str {
    match protocol {
        UpstreamProtocol::Http1 => "HTTP",
        UpstreamProtocol::H2c => "HTTP2/GRPC",
    }
}
