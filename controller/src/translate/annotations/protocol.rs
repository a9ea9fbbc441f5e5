//! The TLS and protocol annotations read outside the route policy (`ssl-redirect`,
//! `force-ssl-redirect`, `backend-protocol`). An unparsable value is reported on its Ingress and
//! the annotation's default applies.

use k8s_openapi::api::networking::v1::Ingress;
use weir_dataplane::model::{
    ClientAuth, ClientVerify, HostMatch, HostTls, ObjectRef, UpstreamProtocol, UpstreamTls,
};

use crate::snapshot::Snapshot;

use super::{NGINX_PREFIX, WEIR_PREFIX};
use crate::translate::warnings::{Reason, Warnings};

/// Redirect plain HTTP to HTTPS for hosts with TLS (default true).
pub(crate) const SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/ssl-redirect";
/// Redirect plain HTTP to HTTPS even for hosts without TLS (default false).
pub(crate) const FORCE_SSL_REDIRECT: &str = "nginx.ingress.kubernetes.io/force-ssl-redirect";

/// The protocol spoken to the Ingress's backends: HTTP (default), HTTP2/GRPC (h2c), HTTPS/GRPCS.
pub(crate) const BACKEND_PROTOCOL: &str = "nginx.ingress.kubernetes.io/backend-protocol";

/// Pass TLS connections for the Ingress's hosts to the backend of its `/` path, undecrypted.
pub(crate) const SSL_PASSTHROUGH: &str = "nginx.ingress.kubernetes.io/ssl-passthrough";

/// `namespace/name` of a Secret whose `ca.crt` verifies TLS backends.
pub(crate) const PROXY_SSL_SECRET: &str = "nginx.ingress.kubernetes.io/proxy-ssl-secret";
/// `on` (weir's default) or `off`: verify TLS backends' certificates.
pub(crate) const PROXY_SSL_VERIFY: &str = "nginx.ingress.kubernetes.io/proxy-ssl-verify";
/// The name TLS backends' certificates are verified against (default: the request's host).
pub(crate) const PROXY_SSL_NAME: &str = "nginx.ingress.kubernetes.io/proxy-ssl-name";
/// `on` (default) or `off`: send SNI to TLS backends.
pub(crate) const PROXY_SSL_SERVER_NAME: &str = "nginx.ingress.kubernetes.io/proxy-ssl-server-name";

/// OpenSSL cipher string choosing the TLS 1.2 suites offered to TLS backends.
pub(crate) const PROXY_SSL_CIPHERS: &str = "nginx.ingress.kubernetes.io/proxy-ssl-ciphers";
/// TLS versions offered to TLS backends (`TLSv1.2 TLSv1.3`).
pub(crate) const PROXY_SSL_PROTOCOLS: &str = "nginx.ingress.kubernetes.io/proxy-ssl-protocols";
/// Longest chain accepted from TLS backends.
pub(crate) const PROXY_SSL_VERIFY_DEPTH: &str = "nginx.ingress.kubernetes.io/proxy-ssl-verify-depth";

/// OpenSSL cipher string choosing the TLS 1.2 suites offered to clients of the Ingress's hosts.
pub(crate) const SSL_CIPHERS: &str = "nginx.ingress.kubernetes.io/ssl-ciphers";
/// `true`: the server's order of suites wins over the client's, for the Ingress's hosts.
pub(crate) const SSL_PREFER_SERVER_CIPHERS: &str = "nginx.ingress.kubernetes.io/ssl-prefer-server-ciphers";

/// The handshake options of an Ingress's hosts (`ssl-ciphers`, `ssl-prefer-server-ciphers`),
/// if it sets some, for host [`HostMatch::Any`] (the caller sets each host). As nginx's
/// server-level `ssl_ciphers`: a string selecting none of weir's suites is an error and the
/// table's suites stay offered.
pub(crate) fn host_tls(ingress: &Ingress, object: &ObjectRef, warnings: &mut Warnings) -> Option<HostTls> {
    let fallback = "the suites of the ConfigMap's ssl-ciphers stay offered";
    let ciphers = cipher_suites(ingress, object, SSL_CIPHERS, fallback, warnings);
    let prefer = get(ingress, SSL_PREFER_SERVER_CIPHERS)
        .map(|_| flag(ingress, object, SSL_PREFER_SERVER_CIPHERS, false, warnings));
    if ciphers.is_none() && prefer.is_none() {
        return None;
    }
    Some(HostTls { host: HostMatch::Any, ciphers, prefer_server_ciphers: prefer })
}

/// The TLS 1.2 suites an OpenSSL cipher-string annotation `key` chooses, in its order; names
/// weir does not offer are reported and left out. A string choosing none of weir's is an error
/// (`fallback` says what applies instead) and `None`.
fn cipher_suites(
    ingress: &Ingress,
    object: &ObjectRef,
    key: &str,
    fallback: &str,
    warnings: &mut Warnings,
) -> Option<Vec<String>> {
    let value = get(ingress, key)?;
    match weir_dataplane::tls::ciphers::parse(value) {
        Ok(selection) => {
            if !selection.unmatched.is_empty() {
                warnings.warn(
                    object,
                    Reason::InvalidAnnotation,
                    format!(
                        "metadata.annotations[{key}]: {} selects no cipher suite weir offers; left out",
                        selection.unmatched.join(":")
                    ),
                );
            }
            Some(selection.tls12)
        }
        Err(why) => {
            warnings.error(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{key}]: invalid value {value:?}: {why}; {fallback}"),
            );
            None
        }
    }
}

/// `namespace/name` of a Secret whose `ca.crt` verifies client certificates (mTLS).
pub(crate) const AUTH_TLS_SECRET: &str = "nginx.ingress.kubernetes.io/auth-tls-secret";
/// `on` (default), `optional`, `optional_no_ca` or `off`.
pub(crate) const AUTH_TLS_VERIFY_CLIENT: &str = "nginx.ingress.kubernetes.io/auth-tls-verify-client";
/// Longest client chain accepted (default 1).
pub(crate) const AUTH_TLS_VERIFY_DEPTH: &str = "nginx.ingress.kubernetes.io/auth-tls-verify-depth";
/// `"true"`: forward the client certificate upstream in `ssl-client-cert`.
pub(crate) const AUTH_TLS_PASS_CERTIFICATE: &str =
    "nginx.ingress.kubernetes.io/auth-tls-pass-certificate-to-upstream";

/// `auth-tls-match-cn`: a regex the client certificate's subject must match.
pub(crate) const AUTH_TLS_MATCH_CN: &str = "nginx.ingress.kubernetes.io/auth-tls-match-cn";
/// `auth-tls-error-page`: where certificate failures are redirected.
pub(crate) const AUTH_TLS_ERROR_PAGE: &str = "nginx.ingress.kubernetes.io/auth-tls-error-page";
/// `service-upstream`: the Service's ClusterIP is the backend's one endpoint.
pub(crate) const SERVICE_UPSTREAM: &str = "nginx.ingress.kubernetes.io/service-upstream";

/// The annotation's value, if set: `key` is the `nginx.ingress.kubernetes.io/` name, and the
/// same name under `weir.dev/` wins.
pub(crate) fn get<'a>(ingress: &'a Ingress, key: &str) -> Option<&'a str> {
    let annotations = ingress.metadata.annotations.as_ref()?;
    let weir = key.strip_prefix(NGINX_PREFIX).map(|name| format!("{WEIR_PREFIX}{name}"));
    weir.and_then(|k| annotations.get(&k)).or_else(|| annotations.get(key)).map(|v| v.trim())
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
        "HTTPS" => UpstreamProtocol::Https,
        "GRPCS" => UpstreamProtocol::H2,
        other => {
            let why = match other {
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
        UpstreamProtocol::Https => "HTTPS",
        UpstreamProtocol::H2 => "GRPCS",
    }
}

/// An `on`/`off` annotation; `default` when absent or invalid (with a warning).
fn on_off(ingress: &Ingress, object: &ObjectRef, key: &str, default: bool, warnings: &mut Warnings) -> bool {
    match get(ingress, key) {
        None => default,
        Some(v) if v.eq_ignore_ascii_case("on") || v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            let shown = if default { "on" } else { "off" };
            warnings.warn(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{key}]: {v:?} is not on or off; using {shown}"),
            );
            default
        }
    }
}

/// TLS towards the Ingress's backends (`proxy-ssl-*`). Verification is on unless
/// `proxy-ssl-verify: "off"`: against `proxy-ssl-secret`'s `ca.crt`, else the system roots. A
/// Secret that is missing or has no `ca.crt` is an error and verification stays on (with the
/// system roots), so a mistake never turns verification off.
pub(crate) fn upstream_tls(
    ingress: &Ingress,
    object: &ObjectRef,
    snapshot: &Snapshot,
    guards: &super::risk::Guards,
    warnings: &mut Warnings,
) -> UpstreamTls {
    let verify = on_off(ingress, object, PROXY_SSL_VERIFY, true, warnings);
    let sni = on_off(ingress, object, PROXY_SSL_SERVER_NAME, true, warnings);
    let server_name = get(ingress, PROXY_SSL_NAME).filter(|n| !n.is_empty()).map(str::to_string);
    let ca_pem = get(ingress, PROXY_SSL_SECRET).and_then(|value| {
        let secret_ref = match value.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => ObjectRef::new(ns, name),
            _ if !value.contains('/') && !value.is_empty() => ObjectRef::new(object.namespace.clone(), value),
            _ => {
                warnings.error(
                    object,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{PROXY_SSL_SECRET}]: {value:?} is not namespace/name; the system roots verify backends"),
                );
                return None;
            }
        };
        if !guards.may_reach(&object.namespace, &secret_ref.namespace) {
            warnings.error(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{PROXY_SSL_SECRET}]: Secret {secret_ref} is in another namespace and allow-cross-namespace-resources is off; the system roots verify backends"),
            );
            return None;
        }
        secret_ca(snapshot, &secret_ref)
            .map_err(|(reason, why)| {
                warnings.error(
                    object,
                    reason,
                    format!("metadata.annotations[{PROXY_SSL_SECRET}]: Secret {secret_ref} {why}; the system roots verify backends"),
                );
            })
            .ok()
    });
    let invalid = |warnings: &mut Warnings, key: &str, value: &str, why: &str, fallback: &str| {
        warnings.error(
            object,
            Reason::InvalidAnnotation,
            format!("metadata.annotations[{key}]: invalid value {value:?}: {why}; {fallback}"),
        );
    };
    let ciphers = cipher_suites(
        ingress,
        object,
        PROXY_SSL_CIPHERS,
        "every cipher suite weir has stays offered",
        warnings,
    );
    let versions = get(ingress, PROXY_SSL_PROTOCOLS).and_then(|value| match super::values::tls_versions(value) {
        Ok((versions, old)) => {
            if !old.is_empty() {
                warnings.warn(
                    object,
                    Reason::InvalidAnnotation,
                    format!(
                        "metadata.annotations[{PROXY_SSL_PROTOCOLS}]: {} not offered: weir supports TLSv1.2 and TLSv1.3 only",
                        old.join(" ")
                    ),
                );
            }
            Some(versions)
        }
        Err(why) => {
            invalid(warnings, PROXY_SSL_PROTOCOLS, value, &why, "TLSv1.2 and TLSv1.3 stay offered");
            None
        }
    });
    let verify_depth = get(ingress, PROXY_SSL_VERIFY_DEPTH).and_then(|value| match value.parse::<u32>() {
        Ok(depth @ 1..=100) => Some(depth),
        _ => {
            let why = "expected a whole number from 1 to 100";
            invalid(warnings, PROXY_SSL_VERIFY_DEPTH, value, why, "the chain length is not limited");
            None
        }
    });
    UpstreamTls {
        ca_pem,
        server_name,
        insecure_skip_verify: !verify,
        no_sni: !sni,
        ciphers,
        versions,
        verify_depth,
    }
}

/// The client certificate policy of an Ingress's hosts (`auth-tls-*`), if it asks for one, for
/// host [`HostMatch::Any`] (the caller sets each host). A Secret that is missing or has no `ca.crt`
/// is an error and the policy still applies with no usable CA (every request refused), so a
/// mistake never opens a protected host.
pub(crate) fn client_auth(
    ingress: &Ingress,
    object: &ObjectRef,
    snapshot: &Snapshot,
    guards: &super::risk::Guards,
    warnings: &mut Warnings,
) -> Option<ClientAuth> {
    let Some(value) = get(ingress, AUTH_TLS_SECRET).filter(|v| !v.is_empty()) else {
        let dependent = [
            AUTH_TLS_VERIFY_CLIENT,
            AUTH_TLS_VERIFY_DEPTH,
            AUTH_TLS_PASS_CERTIFICATE,
            AUTH_TLS_MATCH_CN,
            AUTH_TLS_ERROR_PAGE,
        ];
        for key in dependent.into_iter().filter(|key| get(ingress, key).is_some()) {
            warnings.warn(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{key}]: has no effect without {AUTH_TLS_SECRET}"),
            );
        }
        return None;
    };
    let verify = match get(ingress, AUTH_TLS_VERIFY_CLIENT).map(str::to_ascii_lowercase).as_deref() {
        None | Some("on") => ClientVerify::On,
        Some("optional") => ClientVerify::Optional,
        Some("optional_no_ca") => ClientVerify::OptionalNoCa,
        Some("off") => return None,
        Some(other) => {
            warnings.warn(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{AUTH_TLS_VERIFY_CLIENT}]: {other:?} is not on, optional, optional_no_ca or off; using on"),
            );
            ClientVerify::On
        }
    };
    let depth = match get(ingress, AUTH_TLS_VERIFY_DEPTH) {
        None => 1,
        Some(v) => match v.parse::<u8>() {
            Ok(d) if d >= 1 => d,
            _ => {
                warnings.warn(
                    object,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{AUTH_TLS_VERIFY_DEPTH}]: {v:?} is not a depth from 1 to 255; using 1"),
                );
                1
            }
        },
    };
    let pass = flag(ingress, object, AUTH_TLS_PASS_CERTIFICATE, false, warnings);
    let secret_ref = match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => ObjectRef::new(ns, name),
        _ => ObjectRef::new(object.namespace.clone(), value),
    };
    let reachable = if guards.may_reach(&object.namespace, &secret_ref.namespace) {
        Ok(())
    } else {
        Err((Reason::InvalidAnnotation, "is in another namespace and allow-cross-namespace-resources is off"))
    };
    let ca = match reachable.and_then(|()| secret_ca(snapshot, &secret_ref)) {
        Ok(ca) => ca,
        Err((reason, why)) => {
            warnings.error(
                object,
                reason,
                format!("metadata.annotations[{AUTH_TLS_SECRET}]: Secret {secret_ref} {why}; its hosts refuse every request until it is fixed"),
            );
            String::new()
        }
    };
    // `auth-tls-match-cn` protects: a value that cannot be used matches no client (403 for
    // all), never every client.
    let match_cn = get(ingress, AUTH_TLS_MATCH_CN).map(|value| match super::values::regex(value) {
        Ok(re) => {
            if !re.contains("CN=") {
                warnings.warn(
                    object,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{AUTH_TLS_MATCH_CN}]: {value:?} does not mention CN=; it is matched against the whole subject DN"),
                );
            }
            re
        }
        Err(why) => {
            warnings.error(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{AUTH_TLS_MATCH_CN}]: invalid value {value:?}: {why}; no client certificate matches (403) until it is fixed"),
            );
            NO_MATCH.to_string()
        }
    });
    let error_page = get(ingress, AUTH_TLS_ERROR_PAGE).and_then(|value| match super::values::redirect_url(value) {
        Ok(url) => Some(url),
        Err(why) => {
            warnings.error(
                object,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{AUTH_TLS_ERROR_PAGE}]: invalid value {value:?}: {why}; ignored (certificate failures answer 400)"),
            );
            None
        }
    });
    Some(ClientAuth {
        host: HostMatch::Any,
        listener: None,
        ca_pem: ca,
        verify,
        depth,
        pass_certificate: pass,
        match_cn,
        error_page,
    })
}

/// The PEM `ca.crt` of a Secret, or why there is none (the warning's reason and wording).
fn secret_ca(snapshot: &Snapshot, secret: &ObjectRef) -> Result<String, (Reason, &'static str)> {
    let Some(found) = snapshot.secrets.get(secret) else { return Err((Reason::SecretNotFound, "not found")) };
    found
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"))
        .ok_or((Reason::InvalidSecret, "has no PEM ca.crt"))
}

/// A regex no string matches.
const NO_MATCH: &str = r"[^\s\S]";
