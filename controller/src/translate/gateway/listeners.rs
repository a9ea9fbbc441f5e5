//! GatewayClasses and Gateways: which are ours, and what each listener is (pure).
//!
//! weir serves Gateway listeners on its own two sockets: a listener on the HTTP port
//! (`GatewayConfig::http_port`, 80) with protocol `HTTP` is served by `--listen-http`; one on the
//! HTTPS port (443) with `HTTPS` (TLS terminated with its `certificateRefs`) or `TLS`
//! (`Passthrough`, or `Terminate` with its `certificateRefs`: TLSRouteModeTerminate) by
//! `--listen-https`. A listener on any other port is not accepted (`PortUnavailable`,
//! `Listener.port`: "The port is not supported by the implementation"); `TCP` and `UDP` are
//! `UnsupportedProtocol`. Every Gateway of our classes shares these sockets.
//! An HTTPS listener may validate client certificates (`Gateway.spec.tls.frontend`,
//! [`super::frontend`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use weir_dataplane::model::{Certificate, ObjectRef};

use super::GatewayConfig;
use super::conditions::{Cond, reasons, types};
use super::frontend::{self, ClientValidation};
use super::hostname::Hostname;
use super::refs::Grants;
use crate::gateway::{
    FrontendTlsConfig, Gateway, GatewayClass, Listener, RouteGroupKind, SecretObjectReference,
};
use crate::node::lb::pool::Selector;
use crate::snapshot::Snapshot;
use crate::translate::warnings::ObjectKind;

/// A GatewayClass of our controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassOut {
    /// Its name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Whether Gateways of this class are served.
    pub accepted: bool,
    /// `Accepted`.
    pub conditions: Vec<Cond>,
}

/// What a listener carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `HTTP` on the HTTP socket.
    Http,
    /// `HTTPS`: TLS terminated with these certificates (those that resolved), then HTTP.
    Https(Vec<(ObjectRef, Certificate)>),
    /// `TLS` with `mode: Passthrough`: connections spliced by SNI.
    TlsPassthrough,
    /// `TLS` with `mode: Terminate` (TLSRoute termination): TLS terminated with these
    /// certificates (those that resolved), then the bytes relayed over plain TCP by SNI.
    TlsTerminate(Vec<(ObjectRef, Certificate)>),
}

impl Protocol {
    /// The certificates of a listener that terminates TLS (`HTTPS`, or `TLS` with
    /// `Terminate`); `None` for the others.
    pub fn certificates(&self) -> Option<&[(ObjectRef, Certificate)]> {
        match self {
            Protocol::Https(c) | Protocol::TlsTerminate(c) => Some(c),
            Protocol::Http | Protocol::TlsPassthrough => None,
        }
    }
}

/// The namespaces routes may attach from (`AllowedRoutes.namespaces`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// `Same`: the Gateway's.
    Same,
    /// `All`.
    All,
    /// `Selector`: namespaces whose labels match.
    Selector(Selector),
}

/// One listener of a Gateway of ours: of its `spec.listeners`, or of a ListenerSet attached to
/// it (`super::listener_sets`: a listener is a listener, resolved by the same code).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerOut {
    /// Its name (a route's `sectionName`; unique within the Gateway or the ListenerSet only).
    pub name: String,
    /// The ListenerSet it comes from; `None`: the Gateway's own.
    pub set: Option<ObjectRef>,
    /// Its port.
    pub port: i32,
    /// What it serves, when it is usable.
    pub protocol: Option<Protocol>,
    /// Its hostname; `None`: any.
    pub hostname: Option<Hostname>,
    /// Where routes may come from.
    pub namespaces: Namespaces,
    /// The route kinds it supports and allows (`supportedKinds`).
    pub kinds: Vec<RouteGroupKind>,
    /// Whether routes attach: accepted, programmed, not conflicted.
    pub ready: bool,
    /// An HTTPS listener's client certificate validation (`Gateway.spec.tls.frontend`).
    pub client_validation: Option<ClientValidation>,
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`.
    pub conditions: Vec<Cond>,
}

impl ListenerOut {
    /// The namespace its `allowedRoutes` are relative to: its ListenerSet's, else its
    /// Gateway's (`gateway`).
    pub fn home<'a>(&'a self, gateway: &'a ObjectRef) -> &'a str {
        self.set.as_ref().map_or(&gateway.namespace, |s| &s.namespace)
    }

    /// The object it is written in, for `weir check`: its ListenerSet, else its Gateway.
    pub fn owner<'a>(&'a self, gateway: &'a ObjectRef) -> (ObjectKind, &'a ObjectRef) {
        match &self.set {
            Some(set) => (ObjectKind::ListenerSet, set),
            None => (ObjectKind::Gateway, gateway),
        }
    }

    /// Its identity on weir's sockets (`weir dump`'s `listener`): `namespace/gateway/name`, or
    /// `namespace/gateway/ListenerSet/namespace/set/name` (names are unique only within the
    /// Gateway or the ListenerSet).
    pub fn id(&self, gateway: &ObjectRef) -> String {
        match &self.set {
            Some(set) => format!("{gateway}/ListenerSet/{set}/{}", self.name),
            None => format!("{gateway}/{}", self.name),
        }
    }
}

/// A Gateway of one of our classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayOut {
    /// Its namespace/name.
    pub key: ObjectRef,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Its listeners, in spec order, then those of the ListenerSets attached to it in their
    /// precedence order (`ListenerSetSpec.listeners`).
    pub listeners: Vec<ListenerOut>,
    /// `Accepted`, `Programmed`.
    pub conditions: Vec<Cond>,
}

/// Our GatewayClasses, by name.
pub fn classes(snapshot: &Snapshot, config: &GatewayConfig) -> BTreeMap<String, ClassOut> {
    let mut out = BTreeMap::new();
    for (name, class) in &snapshot.gateway_classes {
        if class.spec.controller_name != config.controller_name {
            continue;
        }
        out.insert(name.clone(), class_out(name, class));
    }
    out
}

fn class_out(name: &str, class: &GatewayClass) -> ClassOut {
    // `GatewayClassSpec.parametersRef`: weir has no parameters, so a class naming some cannot
    // be what its author meant ("InvalidParameters").
    let (accepted, cond) = match &class.spec.parameters_ref {
        Some(p) => (
            false,
            Cond::no(
                types::ACCEPTED,
                reasons::INVALID_PARAMETERS,
                format!("weir takes no parameters; parametersRef {} {} is not supported", p.kind, p.name),
            ),
        ),
        None => (true, Cond::yes(types::ACCEPTED, reasons::ACCEPTED, "weir serves Gateways of this class")),
    };
    ClassOut {
        name: name.to_string(),
        generation: class.metadata.generation,
        accepted,
        conditions: vec![cond],
    }
}

/// The Gateways of our accepted classes, their listeners resolved and checked.
pub fn gateways(
    snapshot: &Snapshot,
    config: &GatewayConfig,
    classes: &BTreeMap<String, ClassOut>,
    grants: &Grants<'_>,
) -> BTreeMap<ObjectRef, GatewayOut> {
    let mut out = BTreeMap::new();
    for (key, gateway) in &snapshot.gateways {
        if !classes.get(&gateway.spec.gateway_class_name).is_some_and(|c| c.accepted) {
            continue;
        }
        out.insert(key.clone(), gateway_out(key, gateway, snapshot, config, grants));
    }
    out
}

fn gateway_out(
    key: &ObjectRef,
    gateway: &Gateway,
    snapshot: &Snapshot,
    config: &GatewayConfig,
    grants: &Grants<'_>,
) -> GatewayOut {
    let frontend = gateway.spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
    let mut listeners: Vec<ListenerOut> = gateway
        .spec
        .listeners
        .iter()
        .map(|l| listener_out((key, None), l, frontend, snapshot, config, grants))
        .collect();
    mark_conflicts(&mut listeners);
    let mut conditions = gateway_conditions(&listeners);
    // "This condition is true when the Gateway FrontendValidationModeType is configured to
    // allow insecure fallback behavior" (removed again with it: the status writer writes the
    // whole list).
    if frontend::insecure_fallback(frontend) {
        conditions.push(Cond::yes(
            types::INSECURE_FRONTEND_VALIDATION_MODE,
            reasons::CONFIGURATION_CHANGED,
            "tls.frontend sets mode AllowInsecureFallback: clients without a valid certificate are served",
        ));
    }
    GatewayOut { key: key.clone(), generation: gateway.metadata.generation, listeners, conditions }
}

/// A Gateway's `Accepted` and `Programmed`, from how many of its own listeners (not its
/// ListenerSets') are served.
pub fn gateway_conditions(listeners: &[ListenerOut]) -> Vec<Cond> {
    let listeners: Vec<&ListenerOut> = listeners.iter().filter(|l| l.set.is_none()).collect();
    served_conditions(&listeners, reasons::INVALID)
}

/// `Accepted` and `Programmed` of a Gateway or a ListenerSet from how many of `listeners` are
/// served: both true when all are, `Accepted` with `ListenersNotValid` when some are, both false
/// when none is (`Programmed` with `none_programmed`: the Gateway's `Invalid`, the ListenerSet's
/// `ListenersNotValid`).
pub(super) fn served_conditions(listeners: &[&ListenerOut], none_programmed: &'static str) -> Vec<Cond> {
    let valid = listeners.iter().filter(|l| l.ready).count();
    if valid == listeners.len() {
        vec![
            Cond::yes(types::ACCEPTED, reasons::ACCEPTED, "every listener is served"),
            Cond::yes(types::PROGRAMMED, reasons::PROGRAMMED, "served by weir's HTTP and HTTPS listeners"),
        ]
    } else if valid > 0 {
        vec![
            Cond::yes(
                types::ACCEPTED,
                reasons::LISTENERS_NOT_VALID,
                format!(
                    "{} of {} listeners are not served (see their conditions)",
                    listeners.len() - valid,
                    listeners.len()
                ),
            ),
            Cond::yes(types::PROGRAMMED, reasons::PROGRAMMED, "the valid listeners are served"),
        ]
    } else {
        vec![
            Cond::no(
                types::ACCEPTED,
                reasons::LISTENERS_NOT_VALID,
                "no listener can be served (see their conditions)",
            ),
            Cond::no(types::PROGRAMMED, none_programmed, "no listener can be served"),
        ]
    }
}

/// The route kinds a protocol supports.
fn supported(protocol: &str) -> &'static [&'static str] {
    match protocol {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TLS" => &["TLSRoute"],
        _ => &[],
    }
}

/// One listener resolved: of the Gateway `gateway`'s own spec, or of the ListenerSet `set`
/// attached to it (its namespace is then the one certificates and `allowedRoutes: Same` are
/// relative to, and ReferenceGrants must be `from` a ListenerSet: GEP-1713, "ReferenceGrants
/// applied to a Gateway are not inherited by child ListenerSets").
pub(super) fn listener_out(
    (gateway, set): (&ObjectRef, Option<&ObjectRef>),
    l: &Listener,
    frontend: Option<&FrontendTlsConfig>,
    snapshot: &Snapshot,
    config: &GatewayConfig,
    grants: &Grants<'_>,
) -> ListenerOut {
    let mut out = ListenerOut {
        name: l.name.clone(),
        set: set.cloned(),
        port: l.port,
        protocol: None,
        hostname: None,
        namespaces: Namespaces::Same,
        kinds: Vec::new(),
        ready: false,
        client_validation: None,
        conditions: Vec::new(),
    };
    // `AllowedRoutes.kinds`: each must be supported; the others are listed in the condition.
    let supported = supported(&l.protocol);
    let allowed = l.allowed_routes.as_ref().map(|a| a.kinds.as_slice()).unwrap_or_default();
    let mut invalid_kinds = Vec::new();
    if allowed.is_empty() {
        out.kinds = supported
            .iter()
            .map(|k| RouteGroupKind { group: Some(crate::gateway::GROUP.into()), kind: (*k).into() })
            .collect();
    } else {
        for k in allowed {
            let group_ok = k.group.as_deref().is_none_or(|g| g == crate::gateway::GROUP);
            if group_ok && supported.contains(&k.kind.as_str()) {
                let kind = RouteGroupKind { group: Some(crate::gateway::GROUP.into()), kind: k.kind.clone() };
                if !out.kinds.contains(&kind) {
                    out.kinds.push(kind);
                }
            } else {
                invalid_kinds.push(format!(
                    "{}/{}",
                    k.group.as_deref().unwrap_or(crate::gateway::GROUP),
                    k.kind
                ));
            }
        }
    }

    // Protocol and port.
    let accepted = match l.protocol.as_str() {
        "HTTP" | "HTTPS" | "TLS" => {
            let expected = if l.protocol == "HTTP" { config.http_port } else { config.https_port };
            if l.port == expected {
                Ok(())
            } else {
                Err(Cond::no(
                    types::ACCEPTED,
                    reasons::PORT_UNAVAILABLE,
                    format!(
                        "weir serves {} listeners on port {expected} only (its {} socket); port {} is not available",
                        l.protocol,
                        if l.protocol == "HTTP" { "--listen-http" } else { "--listen-https" },
                        l.port
                    ),
                ))
            }
        }
        other => Err(Cond::no(
            types::ACCEPTED,
            reasons::UNSUPPORTED_PROTOCOL,
            format!("protocol {other} is not supported (HTTP, HTTPS and TLS are)"),
        )),
    };
    let accepted = accepted.and_then(|()| match l.hostname.as_deref().map(Hostname::parse).transpose() {
        Ok(h) => {
            out.hostname = h;
            Ok(())
        }
        Err(e) => Err(Cond::no(types::ACCEPTED, reasons::UNSUPPORTED_VALUE, e.to_string())),
    });
    let accepted = accepted.and_then(|()| {
        out.namespaces = namespaces(l)?;
        Ok(())
    });

    // TLS, and with it ResolvedRefs.
    let mut resolved = if invalid_kinds.is_empty() {
        Ok(())
    } else {
        Err(Cond::no(
            types::RESOLVED_REFS,
            reasons::INVALID_ROUTE_KINDS,
            format!("route kinds not supported on a {} listener: {}", l.protocol, invalid_kinds.join(", ")),
        ))
    };
    let tls_mode = l.tls.as_ref().map(|t| t.mode.as_deref().unwrap_or("Terminate"));
    let accepted = accepted.and_then(|()| match (l.protocol.as_str(), tls_mode) {
        ("HTTP", None) => {
            out.protocol = Some(Protocol::Http);
            Ok(())
        }
        (protocol @ ("HTTPS" | "TLS"), Some("Terminate")) => {
            let https = protocol == "HTTPS";
            // Client certificates first: a listener whose validation cannot be served is not
            // accepted at all (`NoValidCACertificate`), never served without it. Only HTTPS
            // listeners validate them: `FrontendTLSConfig` applies to "Listeners handling HTTPS
            // traffic" (GEP-91: "a listener is considered targeted if and only if it serves
            // HTTPS"), not to a `TLS` listener's TLSRoutes.
            if let Some(validation) = frontend::applies(frontend, l.port).filter(|_| https) {
                match frontend::resolve(gateway, validation, snapshot, grants) {
                    Ok((validation, problem)) => {
                        if let Some(problem) = problem {
                            resolved = resolved.clone().and(Err(problem));
                        }
                        out.client_validation = Some(validation);
                    }
                    Err(refused) => {
                        if let Some(problem) = refused.resolved_refs {
                            resolved = resolved.clone().and(Err(problem));
                        }
                        return Err(refused.accepted);
                    }
                }
            }
            let refs = l.tls.as_ref().map(|t| t.certificate_refs.as_slice()).unwrap_or_default();
            let (certificates, problem) = certificates((gateway, set), refs, snapshot, grants);
            if let Some(problem) = problem {
                resolved = resolved.clone().and(Err(problem));
            }
            if certificates.is_empty() {
                Err(Cond::no(types::PROGRAMMED, reasons::INVALID, "no usable certificate"))
            } else {
                out.protocol = Some(match https {
                    true => Protocol::Https(certificates),
                    false => Protocol::TlsTerminate(certificates),
                });
                Ok(())
            }
        }
        ("TLS", Some("Passthrough")) => {
            out.protocol = Some(Protocol::TlsPassthrough);
            Ok(())
        }
        (protocol, mode) => Err(Cond::no(
            types::ACCEPTED,
            reasons::UNSUPPORTED_VALUE,
            match mode {
                None => format!("a {protocol} listener needs tls"),
                Some(mode) => format!("tls.mode {mode} is not supported on a {protocol} listener (HTTP: no tls; HTTPS: Terminate; TLS: Passthrough or Terminate)"),
            },
        )),
    });

    match accepted {
        Ok(()) => {
            out.conditions.push(Cond::yes(types::ACCEPTED, reasons::ACCEPTED, "listener accepted"));
            out.conditions.push(Cond::yes(types::PROGRAMMED, reasons::PROGRAMMED, "served"));
            out.ready = !out.kinds.is_empty();
        }
        Err(cond) if cond.type_ == types::PROGRAMMED => {
            out.conditions.push(Cond::yes(types::ACCEPTED, reasons::ACCEPTED, "listener accepted"));
            out.conditions.push(cond);
        }
        Err(cond) => {
            out.conditions.push(cond);
            out.conditions.push(Cond::no(types::PROGRAMMED, reasons::INVALID, "not served (see Accepted)"));
        }
    }
    out.conditions.push(match resolved {
        Ok(()) => Cond::yes(types::RESOLVED_REFS, reasons::RESOLVED_REFS, "every reference resolved"),
        Err(cond) => cond,
    });
    out
}

/// `AllowedRoutes.namespaces`.
fn namespaces(l: &Listener) -> Result<Namespaces, Cond> {
    let ns = l.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref());
    match ns.and_then(|n| n.from.as_deref()).unwrap_or("Same") {
        "Same" => Ok(Namespaces::Same),
        "All" => Ok(Namespaces::All),
        "Selector" => {
            let Some(selector) = ns.and_then(|n| n.selector.as_ref()) else {
                return Err(Cond::no(
                    types::ACCEPTED,
                    reasons::UNSUPPORTED_VALUE,
                    "allowedRoutes.namespaces.from: Selector needs a selector",
                ));
            };
            Selector::parse(selector).map(Namespaces::Selector).map_err(|e| {
                Cond::no(
                    types::ACCEPTED,
                    reasons::UNSUPPORTED_VALUE,
                    format!("allowedRoutes.namespaces.selector: {e}"),
                )
            })
        }
        other => Err(Cond::no(
            types::ACCEPTED,
            reasons::UNSUPPORTED_VALUE,
            format!("allowedRoutes.namespaces.from {other:?} (Same, All or Selector)"),
        )),
    }
}

impl Namespaces {
    /// Whether a route (or a ListenerSet) in `namespace` may attach to a listener (a Gateway)
    /// whose owner is in `gateway_ns`.
    pub fn allows(&self, namespace: &str, gateway_ns: &str, snapshot: &Snapshot) -> bool {
        match self {
            Namespaces::Same => namespace == gateway_ns,
            Namespaces::All => true,
            Namespaces::Selector(selector) => {
                snapshot.namespaces.get(namespace).is_some_and(|ns: &Namespace| {
                    selector.matches(ns.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
                })
            }
        }
    }
}

/// The certificates of `refs` that resolve, and the first problem
/// (`ListenerTLSConfig.certificateRefs`: "a reference to a Secret in a different namespace …
/// requires a ReferenceGrant"; an invalid ref gives `InvalidCertificateRef`).
fn certificates(
    (gateway, set): (&ObjectRef, Option<&ObjectRef>),
    refs: &[SecretObjectReference],
    snapshot: &Snapshot,
    grants: &Grants<'_>,
) -> (Vec<(ObjectRef, Certificate)>, Option<Cond>) {
    let mut out = Vec::new();
    let mut problem = None;
    let mut fail = |cond: Cond| {
        problem.get_or_insert(cond);
    };
    if refs.is_empty() {
        fail(Cond::no(
            types::RESOLVED_REFS,
            reasons::INVALID_CERTIFICATE_REF,
            "a listener that terminates TLS needs certificateRefs",
        ));
    }
    let (owner_kind, owner) = match set {
        Some(set) => ("ListenerSet", set),
        None => ("Gateway", gateway),
    };
    for r in refs {
        let group = r.group.as_deref().unwrap_or("");
        let kind = r.kind.as_deref().unwrap_or("Secret");
        if !group.is_empty() || kind != "Secret" {
            fail(Cond::no(
                types::RESOLVED_REFS,
                reasons::INVALID_CERTIFICATE_REF,
                format!("certificateRef {group}/{kind} {}: only core Secrets are supported", r.name),
            ));
            continue;
        }
        let secret = ObjectRef::new(r.namespace.as_deref().unwrap_or(&owner.namespace), &r.name);
        if secret.namespace != owner.namespace
            && !grants.allows((crate::gateway::GROUP, owner_kind, &owner.namespace), ("", "Secret", &secret))
        {
            fail(Cond::no(
                types::RESOLVED_REFS,
                reasons::REF_NOT_PERMITTED,
                format!(
                    "certificateRef Secret {secret}: no ReferenceGrant in {} allows it",
                    secret.namespace
                ),
            ));
            continue;
        }
        let Some(object) = snapshot.secrets.get(&secret) else {
            fail(Cond::no(
                types::RESOLVED_REFS,
                reasons::INVALID_CERTIFICATE_REF,
                format!("certificateRef Secret {secret} not found"),
            ));
            continue;
        };
        match crate::translate::tls::certificate(&secret, object) {
            Ok(cert) => out.push((secret, cert)),
            Err(e) => fail(Cond::no(types::RESOLVED_REFS, reasons::INVALID_CERTIFICATE_REF, e.to_string())),
        }
    }
    (out, problem)
}

/// `Conflicted` (`ListenerConditionConflicted`): listeners of one Gateway on one socket with
/// the same hostname ("multiple Listeners on the same port use `example.com` in the hostname
/// field"). HTTPS and TLS listeners (`Passthrough` and `Terminate` alike: TLSRouteModeMixed)
/// share the HTTPS socket, chosen by SNI. Every listener of a clash is conflicted and serves
/// nothing ("its network port should not be configured").
pub(super) fn mark_conflicts(listeners: &mut [ListenerOut]) {
    let socket = |l: &ListenerOut| match l.protocol {
        Some(Protocol::Http) => Some(0),
        Some(Protocol::Https(_) | Protocol::TlsPassthrough | Protocol::TlsTerminate(_)) => Some(1),
        None => None,
    };
    let mut seen: BTreeMap<(i32, Option<Hostname>), Vec<usize>> = BTreeMap::new();
    for (i, l) in listeners.iter().enumerate() {
        if let Some(s) = socket(l) {
            seen.entry((s, l.hostname.clone())).or_default().push(i);
        }
    }
    let mut conflicted = vec![false; listeners.len()];
    for group in seen.values().filter(|g| g.len() > 1) {
        for &i in group {
            conflicted[i] = true;
        }
    }
    for (l, conflicted) in listeners.iter_mut().zip(conflicted) {
        if conflicted {
            l.ready = false;
            l.conditions.push(Cond::yes(
                types::CONFLICTED,
                reasons::HOSTNAME_CONFLICT,
                "another listener of this Gateway serves the same hostname on the same port",
            ));
            for c in &mut l.conditions {
                if c.type_ == types::PROGRAMMED {
                    *c = Cond::no(types::PROGRAMMED, reasons::INVALID, "conflicted (see Conflicted)");
                }
            }
        } else {
            l.conditions.push(Cond::no(types::CONFLICTED, reasons::NO_CONFLICTS, "no conflicts"));
        }
    }
}
