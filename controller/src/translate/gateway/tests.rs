//! Classes, listeners and attachment, one behaviour per test, each citing the field
//! documentation of `apis/v1` it checks.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use weir_dataplane::model::ObjectRef;

use super::conditions::{Cond, reasons, types};
use super::hostname::Hostname;
use super::listeners::Protocol;
use super::{GatewayAttachments, GatewayConfig, RouteKind, attach_all};
use crate::snapshot::Snapshot;

const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: weir}\nspec: {controllerName: weir.dev/gateway-controller}\n---\n";

fn run(yaml: &str) -> GatewayAttachments {
    let text = format!("{CLASS}{yaml}");
    let snapshot: Snapshot = crate::source::manifest::parse_manifests(&text).unwrap().into_iter().collect();
    attach_all(&snapshot, &GatewayConfig::default())
}

fn cond<'a>(conds: &'a [Cond], type_: &str) -> &'a Cond {
    conds.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_} in {conds:?}"))
}

fn gateway(listeners: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: infra}}\n\
         spec:\n  gatewayClassName: weir\n  listeners:\n{listeners}---\n"
    )
}

fn route(namespace: &str, name: &str, parent: &str, hostnames: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec:\n  parentRefs: [{parent}]\n  hostnames: [{hostnames}]\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n---\n"
    )
}

fn http_route<'a>(a: &'a GatewayAttachments, ns: &str, name: &str) -> &'a [super::attach::ParentOut] {
    &a.routes[&(RouteKind::Http, ObjectRef::new(ns, name))]
}

const HTTP: &str = "  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}\n";

/// `GatewayClassSpec.controllerName`: only classes naming weir's controller are ours; a class
/// with `parametersRef` is not accepted (weir takes none: `InvalidParameters`).
#[test]
fn gateway_class_controller_name_selects_ours() {
    let a = run(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: other}\nspec: {controllerName: example.com/else}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: params}\n\
         spec: {controllerName: weir.dev/gateway-controller, parametersRef: {group: example.com, kind: Config, name: x}}\n",
    );
    assert_eq!(a.classes.keys().collect::<Vec<_>>(), ["params", "weir"]);
    assert!(a.classes["weir"].accepted);
    assert_eq!(cond(&a.classes["weir"].conditions, types::ACCEPTED).reason, reasons::ACCEPTED);
    assert!(!a.classes["params"].accepted);
    assert_eq!(cond(&a.classes["params"].conditions, types::ACCEPTED).reason, reasons::INVALID_PARAMETERS);
}

/// Gateways of other classes, or of a class not accepted, are not ours.
#[test]
fn gateway_of_another_class_is_left_alone() {
    let a = run("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: theirs}\n\
         spec: {gatewayClassName: other, listeners: [{name: http, port: 80, protocol: HTTP}]}\n");
    assert!(a.gateways.is_empty());
}

/// `ListenerReasonPortUnavailable`: "The port is not supported by the implementation";
/// `ListenerReasonUnsupportedProtocol`. The Gateway is accepted with `ListenersNotValid` while
/// one listener is served.
#[test]
fn listener_on_another_port_is_port_unavailable() {
    let a = run(&gateway(
        "  - {name: http, port: 80, protocol: HTTP}\n  - {name: alt, port: 8080, protocol: HTTP}\n  - {name: tcp, port: 80, protocol: TCP}\n",
    ));
    let gw = &a.gateways[&ObjectRef::new("infra", "edge")];
    let [http, alt, tcp] = &gw.listeners[..] else { panic!() };
    assert!(http.ready);
    assert_eq!(http.protocol, Some(Protocol::Http));
    assert!(!alt.ready);
    assert_eq!(cond(&alt.conditions, types::ACCEPTED).reason, reasons::PORT_UNAVAILABLE);
    assert!(!cond(&alt.conditions, types::PROGRAMMED).status);
    assert_eq!(cond(&tcp.conditions, types::ACCEPTED).reason, reasons::UNSUPPORTED_PROTOCOL);
    let accepted = cond(&gw.conditions, types::ACCEPTED);
    assert_eq!((accepted.status, accepted.reason), (true, reasons::LISTENERS_NOT_VALID));
    assert!(cond(&gw.conditions, types::PROGRAMMED).status);

    let none = run(&gateway("  - {name: alt, port: 8080, protocol: HTTP}\n"));
    let gw = &none.gateways[&ObjectRef::new("infra", "edge")];
    assert!(!cond(&gw.conditions, types::ACCEPTED).status);
    assert!(!cond(&gw.conditions, types::PROGRAMMED).status);
}

/// `ListenerConditionConflicted` / `HostnameConflict`: "multiple Listeners on the same port use
/// `example.com` in the hostname field"; HTTPS and TLS share port 443.
#[test]
fn listeners_with_one_hostname_on_one_port_conflict() {
    let a = run(&gateway(
        "  - {name: a, port: 80, protocol: HTTP, hostname: a.example.com}\n  - {name: b, port: 80, protocol: HTTP, hostname: a.example.com}\n  - {name: c, port: 80, protocol: HTTP, hostname: c.example.com}\n",
    ));
    let gw = &a.gateways[&ObjectRef::new("infra", "edge")];
    for l in &gw.listeners[..2] {
        let c = cond(&l.conditions, types::CONFLICTED);
        assert_eq!((c.status, c.reason), (true, reasons::HOSTNAME_CONFLICT), "{}", l.name);
        assert!(!l.ready);
    }
    let c = cond(&gw.listeners[2].conditions, types::CONFLICTED);
    assert_eq!((c.status, c.reason), (false, reasons::NO_CONFLICTS));
    assert!(gw.listeners[2].ready);
}

/// `AllowedRoutes.kinds`: kinds the protocol does not support are `InvalidRouteKinds`
/// (`ResolvedRefs` false); `supportedKinds` lists the valid ones.
#[test]
fn allowed_route_kinds_are_checked_against_the_protocol() {
    let a = run(&gateway(
        "  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: TLSRoute}]}}\n  - {name: only-tls, port: 80, protocol: HTTP, hostname: x.example, allowedRoutes: {kinds: [{kind: TLSRoute}]}}\n",
    ));
    let gw = &a.gateways[&ObjectRef::new("infra", "edge")];
    let kinds: Vec<&str> = gw.listeners[0].kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(kinds, ["HTTPRoute"]);
    let resolved = cond(&gw.listeners[0].conditions, types::RESOLVED_REFS);
    assert_eq!((resolved.status, resolved.reason), (false, reasons::INVALID_ROUTE_KINDS));
    assert!(gw.listeners[0].ready, "the valid kinds are still served");
    assert!(gw.listeners[1].kinds.is_empty());
    assert!(!gw.listeners[1].ready);
    // Default: what the protocol supports.
    let a = run(&gateway(HTTP));
    let kinds: Vec<&str> = a.gateways[&ObjectRef::new("infra", "edge")].listeners[0]
        .kinds
        .iter()
        .map(|k| k.kind.as_str())
        .collect();
    assert_eq!(kinds, ["HTTPRoute", "GRPCRoute"]);
}

/// `RouteNamespaces.from`: `Same` (the default) admits routes of the Gateway's namespace only;
/// `All` any; `Selector` namespaces whose labels match.
#[test]
fn allowed_routes_namespaces_same_all_selector() {
    let parent = "{name: edge, namespace: infra}";
    let routes = format!("{}{}", route("infra", "local", parent, ""), route("apps", "far", parent, ""));
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps, labels: {edge: \"yes\"}}\n---\n";

    let same = run(&format!("{}{routes}", gateway("  - {name: http, port: 80, protocol: HTTP}\n")));
    assert!(http_route(&same, "infra", "local")[0].accepted.status);
    let far = &http_route(&same, "apps", "far")[0].accepted;
    assert_eq!((far.status, far.reason), (false, reasons::NOT_ALLOWED_BY_LISTENERS));

    let all = run(&format!("{}{routes}", gateway(HTTP)));
    assert!(http_route(&all, "apps", "far")[0].accepted.status);
    assert_eq!(all.attached_routes[&(ObjectRef::new("infra", "edge"), 0)], 2);

    let selector = "  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {edge: \"yes\"}}}}}\n";
    let selected = run(&format!("{ns}{}{routes}", gateway(selector)));
    assert!(http_route(&selected, "apps", "far")[0].accepted.status);
    assert!(!http_route(&selected, "infra", "local")[0].accepted.status, "infra has no label");
}

/// `HTTPRouteSpec.hostnames`: "If both the Listener and HTTPRoute have specified hostnames,
/// and none match … the HTTPRoute is not accepted" (`NoMatchingListenerHostname`); those that
/// match are served, the others ignored.
#[test]
fn route_hostnames_intersect_the_listeners() {
    let l = "  - {name: http, port: 80, protocol: HTTP, hostname: \"*.example.com\", allowedRoutes: {namespaces: {from: All}}}\n";
    let parent = "{name: edge, namespace: infra}";
    let a = run(&format!(
        "{}{}{}",
        gateway(l),
        route("apps", "miss", parent, "example.com, test.example.net"),
        route("apps", "hit", parent, "test.example.com, test.example.net")
    ));
    let miss = &http_route(&a, "apps", "miss")[0].accepted;
    assert_eq!((miss.status, miss.reason), (false, reasons::NO_MATCHING_LISTENER_HOSTNAME));
    let hit = &http_route(&a, "apps", "hit")[0];
    assert!(hit.accepted.status);
    assert_eq!(hit.attached[0].hostnames, Some(vec![Hostname::Exact("test.example.com".into())]));
}

/// `ParentReference.sectionName` and `port`: a route attaches only to the listener named;
/// naming none that exists is `NoMatchingParent`.
#[test]
fn parent_ref_section_name_and_port_select_listeners() {
    let l = "  - {name: a, port: 80, protocol: HTTP, hostname: a.example, allowedRoutes: {namespaces: {from: All}}}\n  - {name: b, port: 80, protocol: HTTP, hostname: b.example, allowedRoutes: {namespaces: {from: All}}}\n";
    let a = run(&format!(
        "{}{}{}{}",
        gateway(l),
        route("apps", "to-b", "{name: edge, namespace: infra, sectionName: b}", ""),
        route("apps", "to-none", "{name: edge, namespace: infra, sectionName: c}", ""),
        route("apps", "by-port", "{name: edge, namespace: infra, port: 8080}", "")
    ));
    let to_b = &http_route(&a, "apps", "to-b")[0];
    assert_eq!(to_b.attached.iter().map(|x| x.listener).collect::<Vec<_>>(), [1]);
    assert_eq!(to_b.attached[0].hostnames, Some(vec![Hostname::Exact("b.example".into())]));
    for name in ["to-none", "by-port"] {
        let c = &http_route(&a, "apps", name)[0].accepted;
        assert_eq!((c.status, c.reason), (false, reasons::NO_MATCHING_PARENT), "{name}");
    }
    let counts: BTreeMap<usize, i32> = a.attached_routes.iter().map(|((_, i), n)| (*i, *n)).collect();
    assert_eq!(counts, BTreeMap::from([(1, 1)]));
}

/// Parents that are not Gateways of ours get no entry: their controllers report on them.
#[test]
fn parents_of_other_controllers_are_not_reported() {
    let a = run(&format!(
        "{}{}",
        gateway(HTTP),
        route(
            "apps",
            "mesh",
            "{kind: Service, group: \"\", name: web}, {name: elsewhere, namespace: infra}",
            ""
        )
    ));
    assert!(a.routes.is_empty());
}

fn tls_secret(namespace: &str, name: &str) -> String {
    let cert = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    let indent = |pem: String| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n",
        indent(cert.cert.pem()),
        indent(cert.signing_key.serialize_pem())
    )
}

/// `ListenerTLSConfig.certificateRefs`: a Secret in another namespace needs a ReferenceGrant
/// there (`RefNotPermitted` without); a missing Secret is `InvalidCertificateRef`; an HTTPS
/// listener without a usable certificate is not programmed.
#[test]
fn listener_certificate_refs_cross_namespace_need_a_grant() {
    let https = |refs: &str| {
        gateway(&format!(
            "  - {{name: https, port: 443, protocol: HTTPS, hostname: a.example.com, tls: {{certificateRefs: [{refs}]}}}}\n"
        ))
    };
    let secret = tls_secret("certs", "wildcard");
    let listener = |a: &GatewayAttachments| a.gateways[&ObjectRef::new("infra", "edge")].listeners[0].clone();

    let refused = listener(&run(&format!("{secret}{}", https("{name: wildcard, namespace: certs}"))));
    let c = cond(&refused.conditions, types::RESOLVED_REFS);
    assert_eq!((c.status, c.reason), (false, reasons::REF_NOT_PERMITTED));
    assert!(!cond(&refused.conditions, types::PROGRAMMED).status);
    assert!(!refused.ready);

    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: certs}\n\
                 spec: {from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}], to: [{group: \"\", kind: Secret}]}\n---\n";
    let granted = listener(&run(&format!("{secret}{grant}{}", https("{name: wildcard, namespace: certs}"))));
    assert!(granted.ready);
    assert!(cond(&granted.conditions, types::RESOLVED_REFS).status);
    let Some(Protocol::Https(certs)) = &granted.protocol else { panic!("{:?}", granted.protocol) };
    assert_eq!(certs[0].0, ObjectRef::new("certs", "wildcard"));

    let missing = listener(&run(&https("{name: nothing}")));
    assert_eq!(cond(&missing.conditions, types::RESOLVED_REFS).reason, reasons::INVALID_CERTIFICATE_REF);
}

/// `TLSModeType` on `TLS` listeners: `Passthrough` (core) and `Terminate` (extended,
/// `TLSRouteModeTerminate`; conformance `TLSRouteListenerTerminateSupportedKinds`: accepted,
/// `supportedKinds` TLSRoute) are both served, on one port (`TLSRouteModeMixed`: neither is
/// `Conflicted`). A `Terminate` listener resolves its `certificateRefs` as an HTTPS listener
/// does: a missing Secret is `InvalidCertificateRef` and not `Programmed`.
#[test]
fn tls_listener_passthrough_and_terminate_are_served() {
    let a = run(&format!(
        "{}{}",
        tls_secret("infra", "x"),
        gateway(concat!(
            "  - {name: pass, port: 443, protocol: TLS, hostname: db.example, tls: {mode: Passthrough}}\n",
            "  - {name: term, port: 443, protocol: TLS, hostname: x.example, tls: {mode: Terminate, certificateRefs: [{name: x}]}}\n",
            "  - {name: nocert, port: 443, protocol: TLS, hostname: y.example, tls: {mode: Terminate, certificateRefs: [{name: y}]}}\n",
        ),)
    ));
    let gw = &a.gateways[&ObjectRef::new("infra", "edge")];
    assert_eq!(gw.listeners[0].protocol, Some(Protocol::TlsPassthrough));
    let Some(Protocol::TlsTerminate(certs)) = &gw.listeners[1].protocol else {
        panic!("{:?}", gw.listeners[1])
    };
    assert_eq!(certs[0].0, ObjectRef::new("infra", "x"));
    for l in &gw.listeners[..2] {
        let kinds: Vec<&str> = l.kinds.iter().map(|k| k.kind.as_str()).collect();
        assert_eq!(kinds, ["TLSRoute"], "{}", l.name);
        assert!(l.ready, "{}", l.name);
        assert_eq!(cond(&l.conditions, types::ACCEPTED).reason, reasons::ACCEPTED, "{}", l.name);
        assert!(cond(&l.conditions, types::PROGRAMMED).status, "{}", l.name);
        assert!(!cond(&l.conditions, types::CONFLICTED).status, "{}", l.name);
    }
    let nocert = &gw.listeners[2];
    assert!(!nocert.ready);
    assert_eq!(cond(&nocert.conditions, types::RESOLVED_REFS).reason, reasons::INVALID_CERTIFICATE_REF);
    assert!(!cond(&nocert.conditions, types::PROGRAMMED).status);
    assert!(cond(&nocert.conditions, types::ACCEPTED).status);
}

/// With Gateways every change translates everything (`incremental::rebuilds_all`); the update
/// still reports only the hosts that differ, so the dataplane recompiles one route's host, not
/// 5,000 (bench/scale `MODE=gateway`), and the table is the one a full translation gives.
#[test]
fn a_route_edit_with_gateways_reports_only_the_hosts_that_differ() {
    use crate::snapshot::SnapshotKey;
    use crate::translate::{TranslateConfig, Translator, translate};
    use weir_dataplane::model::HostMatch;
    use weir_dataplane::model::changes::TableChanges;

    let parse = |yaml: String| -> Snapshot {
        let text = format!("{CLASS}{}", gateway(HTTP));
        crate::source::manifest::parse_manifests(&(text + &yaml)).unwrap().into_iter().collect()
    };
    let routes = |edited: &str| {
        (0..20)
            .map(|i| match i {
                7 => route("apps", "r7", "{name: edge, namespace: infra}", edited),
                _ => route(
                    "apps",
                    &format!("r{i}"),
                    "{name: edge, namespace: infra}",
                    &format!("r{i}.example"),
                ),
            })
            .collect::<String>()
    };
    let config = TranslateConfig::default();
    let mut translator = Translator::new();
    let before = parse(routes("r7.example"));
    assert!(translator.update(&before, None, &config).changes.is_none(), "the first update is full");
    let old = translator.translation().table.clone();
    assert_eq!(old.hosts.len(), 20);

    let after = parse(routes("seven.example"));
    let key = SnapshotKey::HttpRoute(ObjectRef::new("apps", "r7"));
    let update = translator.update(&after, Some(std::slice::from_ref(&key)), &config);
    assert_eq!(*translator.translation(), translate(&after, &config));
    let changes = update.changes.expect("the changes of a route edit are known");
    assert_eq!(changes, TableChanges::between(&old, &translator.translation().table));
    let hosts: Vec<HostMatch> = changes.hosts.into_iter().collect();
    assert_eq!(hosts, [HostMatch::Exact("r7.example".into()), HostMatch::Exact("seven.example".into())]);
}
