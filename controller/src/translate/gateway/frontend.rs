//! Client certificate validation of HTTPS listeners (pure): `Gateway.spec.tls.frontend`
//! (`FrontendTLSConfig`).
//!
//! An HTTPS listener takes the `perPort` entry of its port, else `default`
//! (`FrontendTLSConfig.perPort`: "this configuration overrides the default configuration for
//! all Listeners handling HTTPS traffic that match this port"). `HTTP` and `TLS` listeners take
//! none. Its `caCertificateRefs` must be core ConfigMaps with a PEM CA bundle in `ca.crt` (core
//! support: one; weir takes up to the schema's 16 and trusts every CA of those that resolve).
//! Each that does not resolve makes the listener's `ResolvedRefs` false
//! (`FrontendTLSValidation.caCertificateRefs`): another kind is `InvalidCACertificateKind`, a
//! ConfigMap in another namespace without a ReferenceGrant `RefNotPermitted`, a missing one or
//! one without a usable `ca.crt` `InvalidCACertificateRef`; when none resolves the listener is
//! not accepted (`NoValidCACertificate`) and not served, so it never serves without the check
//! its author asked for.
//!
//! `mode: AllowValidOnly` (the default) asks for a certificate in the handshake and fails the
//! handshake without a valid one; `AllowInsecureFallback` asks, serves every client, and passes
//! the verification result to the backend (`ssl-client-verify`, as ingress-nginx's
//! `optional_no_ca`). Either configured sets the Gateway's `InsecureFrontendValidationMode`
//! condition (`ConfigurationChanged`).

use weir_dataplane::model::{ClientVerify, ObjectRef};

use super::conditions::{Cond, reasons, types};
use super::refs::Grants;
use crate::gateway::{FrontendTlsConfig, FrontendTlsValidation, ObjectReference};
use crate::snapshot::Snapshot;

/// The `mode` value that lets clients without a valid certificate through.
pub const INSECURE_FALLBACK: &str = "AllowInsecureFallback";

/// The key of a CA ConfigMap that holds the bundle.
pub const CA_KEY: &str = "ca.crt";

/// The longest client chain accepted: no limit of weir's own ("The maximum depth of a
/// certificate chain accepted in verification is Implementation specific", `TLSConfig`); the
/// verifier's own path-building limit applies.
pub const VERIFY_DEPTH: u8 = u8::MAX;

/// The client certificate validation of one HTTPS listener, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientValidation {
    /// The CA bundles of the references that resolved, one after the other (PEM).
    pub ca_pem: String,
    /// [`ClientVerify::Handshake`] (`AllowValidOnly`) or [`ClientVerify::OptionalNoCa`]
    /// (`AllowInsecureFallback`).
    pub verify: ClientVerify,
}

/// Why a listener's validation cannot be served: its `ResolvedRefs` and `Accepted` conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `ResolvedRefs` false, when a reference is the cause.
    pub resolved_refs: Option<Cond>,
    /// `Accepted` false: `NoValidCACertificate`, or `UnsupportedValue` for an unknown mode.
    pub accepted: Cond,
}

/// The validation that applies to an HTTPS listener on `port`: its port's `perPort` entry,
/// else `default`; `None` when that sets none.
pub fn applies(frontend: Option<&FrontendTlsConfig>, port: i32) -> Option<&FrontendTlsValidation> {
    let frontend = frontend?;
    match frontend.per_port.iter().find(|p| p.port == port) {
        Some(per_port) => per_port.tls.validation.as_ref(),
        None => frontend.default.validation.as_ref(),
    }
}

/// Whether `default` or a `perPort` entry asks for `AllowInsecureFallback`
/// (`GatewayConditionInsecureFrontendValidationMode`: "either at the Gateway level or via a
/// per-port override").
pub fn insecure_fallback(frontend: Option<&FrontendTlsConfig>) -> bool {
    let Some(frontend) = frontend else { return false };
    std::iter::once(&frontend.default)
        .chain(frontend.per_port.iter().map(|p| &p.tls))
        .filter_map(|t| t.validation.as_ref())
        .any(|v| v.mode.as_deref() == Some(INSECURE_FALLBACK))
}

/// Resolves a listener's validation for the Gateway `gateway`: the usable CAs and the first
/// reference that did not resolve (for `ResolvedRefs`), or why it cannot be served.
pub fn resolve(
    gateway: &ObjectRef,
    validation: &FrontendTlsValidation,
    snapshot: &Snapshot,
    grants: &Grants<'_>,
) -> Result<(ClientValidation, Option<Cond>), Box<Refused>> {
    let verify = match validation.mode.as_deref() {
        None | Some("AllowValidOnly") => ClientVerify::Handshake,
        Some(INSECURE_FALLBACK) => ClientVerify::OptionalNoCa,
        Some(other) => {
            return Err(Box::new(Refused {
                resolved_refs: None,
                accepted: Cond::no(
                    types::ACCEPTED,
                    reasons::UNSUPPORTED_VALUE,
                    format!(
                        "tls.frontend validation mode {other:?} is not supported (AllowValidOnly or AllowInsecureFallback)"
                    ),
                ),
            }));
        }
    };
    let mut bundles = Vec::new();
    let mut problem = None;
    for r in &validation.ca_certificate_refs {
        match ca_bundle(gateway, r, snapshot, grants) {
            Ok(pem) => bundles.push(pem),
            Err(cond) => {
                problem.get_or_insert(cond);
            }
        }
    }
    if bundles.is_empty() {
        let why = problem.as_ref().map_or("no caCertificateRefs".to_string(), |c| c.message.clone());
        return Err(Box::new(Refused {
            accepted: Cond::no(
                types::ACCEPTED,
                reasons::NO_VALID_CA_CERTIFICATE,
                format!("client certificate validation has no usable CA certificate: {why}"),
            ),
            resolved_refs: Some(problem.unwrap_or_else(|| {
                Cond::no(types::RESOLVED_REFS, reasons::INVALID_CA_CERTIFICATE_REF, "no caCertificateRefs")
            })),
        }));
    }
    let ca_pem = match bundles.as_slice() {
        [one] => one.clone(),
        many => many.iter().map(|pem| pem.trim_end()).collect::<Vec<_>>().join("\n") + "\n",
    };
    Ok((ClientValidation { ca_pem, verify }, problem))
}

/// The PEM bundle of one `caCertificateRef`, or its `ResolvedRefs` condition.
fn ca_bundle(
    gateway: &ObjectRef,
    r: &ObjectReference,
    snapshot: &Snapshot,
    grants: &Grants<'_>,
) -> Result<String, Cond> {
    let refused = |reason, message: String| Err(Cond::no(types::RESOLVED_REFS, reason, message));
    if !r.group.is_empty() || r.kind != "ConfigMap" {
        let kind = if r.group.is_empty() { r.kind.clone() } else { format!("{}.{}", r.kind, r.group) };
        return refused(
            reasons::INVALID_CA_CERTIFICATE_KIND,
            format!("caCertificateRef {kind} {}: only core ConfigMaps (with ca.crt) are supported", r.name),
        );
    }
    let target = ObjectRef::new(r.namespace.as_deref().unwrap_or(&gateway.namespace), &r.name);
    if target.namespace != gateway.namespace
        && !grants
            .allows(("gateway.networking.k8s.io", "Gateway", &gateway.namespace), ("", "ConfigMap", &target))
    {
        return refused(
            reasons::REF_NOT_PERMITTED,
            format!(
                "caCertificateRef ConfigMap {target}: no ReferenceGrant in {} allows it",
                target.namespace
            ),
        );
    }
    let Some(config_map) = snapshot.config_maps.get(&target) else {
        return refused(
            reasons::INVALID_CA_CERTIFICATE_REF,
            format!("caCertificateRef ConfigMap {target} not found"),
        );
    };
    let Some(pem) = config_map.data.as_ref().and_then(|d| d.get(CA_KEY)) else {
        return refused(
            reasons::INVALID_CA_CERTIFICATE_REF,
            format!("caCertificateRef ConfigMap {target} has no {CA_KEY}"),
        );
    };
    match weir_dataplane::tls::mtls::ca_roots(pem) {
        Ok(_) => Ok(pem.clone()),
        Err(e) => {
            refused(reasons::INVALID_CA_CERTIFICATE_REF, format!("caCertificateRef ConfigMap {target}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::gateway::Gateway;

    fn snapshot(yaml: &str) -> Snapshot {
        crate::source::manifest::parse_manifests(yaml).unwrap().into_iter().collect::<Snapshot>()
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn gateway(s: &Snapshot) -> &Gateway {
        s.gateways.get(&ObjectRef::new("infra", "gw")).unwrap()
    }

    /// `FrontendTLSConfig.perPort` overrides `default` for its port; `caCertificateRefs`
    /// conditions as `FrontendTLSValidation` lists them: each refused reference with its reason,
    /// `NoValidCACertificate` when none resolves; the usable CAs of several references are all
    /// trusted.
    #[test]
    fn frontend_tls_validation_per_port_and_ca_certificate_ref_reasons() {
        let ca = serde_json::to_string(&ca_pem()).unwrap();
        let s = snapshot(&format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: ca, namespace: infra}}
data: {{ca.crt: {ca}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: other-ca, namespace: web}}
data: {{ca.crt: {ca}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: not-pem, namespace: infra}}
data: {{ca.crt: "hello"}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: infra}}
spec:
  gatewayClassName: weir
  tls:
    frontend:
      default:
        validation:
          caCertificateRefs: [{{kind: ConfigMap, group: "", name: ca}}]
      perPort:
      - port: 8443
        tls:
          validation:
            mode: AllowInsecureFallback
            caCertificateRefs: [{{kind: ConfigMap, group: "", name: missing}}, {{kind: ConfigMap, group: "", name: ca}}]
      - port: 9443
        tls: {{}}
  listeners: [{{name: https, port: 443, protocol: HTTPS}}]
"#
        ));
        let grants = Grants::new(&s);
        let key = ObjectRef::new("infra", "gw");
        let frontend = gateway(&s).spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
        assert!(insecure_fallback(frontend), "a perPort entry asks for it");
        let default = applies(frontend, 443).unwrap();
        let (v, problem) = resolve(&key, default, &s, &grants).unwrap();
        assert_eq!((v.verify, problem), (ClientVerify::Handshake, None));
        let per_port = applies(frontend, 8443).unwrap();
        let (v, problem) = resolve(&key, per_port, &s, &grants).unwrap();
        assert_eq!(v.verify, ClientVerify::OptionalNoCa);
        assert_eq!(problem.unwrap().reason, reasons::INVALID_CA_CERTIFICATE_REF, "one of two refused");
        assert!(applies(frontend, 9443).is_none(), "the port's entry sets no validation");

        let refused = |r: ObjectReference| {
            let v = FrontendTlsValidation { ca_certificate_refs: vec![r], mode: None };
            let e = resolve(&key, &v, &s, &grants).unwrap_err();
            assert_eq!(e.accepted.reason, reasons::NO_VALID_CA_CERTIFICATE);
            let r = e.resolved_refs.unwrap();
            (r.reason, r.message)
        };
        let cm = |name: &str, namespace: Option<&str>| ObjectReference {
            group: String::new(),
            kind: "ConfigMap".into(),
            name: name.into(),
            namespace: namespace.map(str::to_string),
        };
        let (reason, message) = refused(cm("missing", None));
        assert_eq!(reason, reasons::INVALID_CA_CERTIFICATE_REF);
        assert!(message.contains("infra/missing not found"), "{message}");
        let (reason, message) = refused(cm("not-pem", None));
        assert_eq!(reason, reasons::INVALID_CA_CERTIFICATE_REF);
        assert!(message.contains("ca.crt"), "{message}");
        let (reason, message) = refused(ObjectReference { kind: "Service".into(), ..cm("web", None) });
        assert_eq!(reason, reasons::INVALID_CA_CERTIFICATE_KIND);
        assert!(message.contains("Service web"), "{message}");
        let (reason, _) = refused(ObjectReference { group: "example.com".into(), ..cm("ca", None) });
        assert_eq!(reason, reasons::INVALID_CA_CERTIFICATE_KIND, "a ConfigMap of another group");
        let (reason, message) = refused(cm("other-ca", Some("web")));
        assert_eq!(reason, reasons::REF_NOT_PERMITTED);
        assert!(message.contains("web/other-ca"), "{message}");
        let v = FrontendTlsValidation {
            ca_certificate_refs: vec![cm("ca", None)],
            mode: Some("Sometimes".into()),
        };
        let e = resolve(&key, &v, &s, &grants).unwrap_err();
        assert_eq!((e.accepted.reason, e.resolved_refs), (reasons::UNSUPPORTED_VALUE, None));
    }

    /// A ReferenceGrant from Gateways in the Gateway's namespace to ConfigMaps admits a CA in
    /// another namespace.
    #[test]
    fn a_reference_grant_admits_a_ca_config_map_in_another_namespace() {
        let ca = serde_json::to_string(&ca_pem()).unwrap();
        let s = snapshot(&format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: other-ca, namespace: web}}
data: {{ca.crt: {ca}}}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: gateways, namespace: web}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}}]
  to: [{{group: "", kind: ConfigMap}}]
"#
        ));
        let grants = Grants::new(&s);
        let r = ObjectReference {
            group: String::new(),
            kind: "ConfigMap".into(),
            name: "other-ca".into(),
            namespace: Some("web".into()),
        };
        let v = FrontendTlsValidation { ca_certificate_refs: vec![r], mode: None };
        let (v, problem) = resolve(&ObjectRef::new("infra", "gw"), &v, &s, &grants).unwrap();
        assert_eq!((v.verify, problem), (ClientVerify::Handshake, None));
    }
}
