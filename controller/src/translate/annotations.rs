//! ingress-nginx annotations read by translation, parsed into types. An unparsable value is
//! reported on its Ingress and the annotation's default applies.

use k8s_openapi::api::networking::v1::Ingress;
use weir_dataplane::model::ObjectRef;

use super::warnings::{Reason, Warnings};

/// Redirect plain HTTP to HTTPS for hosts with TLS (default true).
pub(crate) const SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/ssl-redirect";
/// Redirect plain HTTP to HTTPS even for hosts without TLS (default false).
pub(crate) const FORCE_SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/force-ssl-redirect";

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
