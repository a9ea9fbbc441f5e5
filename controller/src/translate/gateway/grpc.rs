//! GRPCRoutes into the routing table (pure), beside the HTTPRoutes and Ingresses.
//!
//! - Host names: as for HTTPRoute (`GRPCRouteSpec.hostnames`, intersected with the listener's).
//! - HTTPRoute and GRPCRoute on one listener with intersecting host names: "the implementation
//!   MUST accept exactly one of these two routes": the oldest, then `{namespace}/{name}`; the
//!   other is not `Accepted` on that listener ([`resolve_kind_conflicts`]).
//! - Matches (`GRPCMethodMatch`): a gRPC call is `POST /{service}/{method}`. `Exact` with both
//!   service and method is an Exact path (`/pkg.Service/Method`); any other method match (a
//!   service alone, a method alone, `RegularExpression`) is a condition on the whole path at
//!   `PathPrefix /`; no method match: every call. Header matches (`GRPCHeaderMatch`, `Exact` or
//!   `RegularExpression`; a repeated name counts once, the first) are conditions.
//! - Precedence (`GRPCRouteRule.matches`): characters of the matching host name ("Characters
//!   in a matching non-wildcard hostname", then "Characters in a matching hostname": the
//!   router picks the most specific virtual host, whose own routes are tried first, then the
//!   routes of each less specific name covering it as fallback tiers, longest first, exactly as
//!   for HTTPRoutes), then characters in the service, in the method, number of header matches,
//!   then the oldest route, `{namespace}/{name}`, then the first rule and match. Exact
//!   service-and-method matches are looked up first (no other `Exact` match of the same call
//!   has more characters); the others are tried at `/` in that order. A `RegularExpression`
//!   counts the characters of its pattern.
//! - Backends (`GRPCRouteRule.backendRefs`): a weighted split as for HTTPRoute, spoken to over
//!   HTTP/2 prior knowledge (h2c) unless the Service port's `appProtocol` says otherwise; a
//!   reference that does not resolve makes its share answer an error (`UNAVAILABLE` for a
//!   gRPC client) and `ResolvedRefs` false.
//! - Filters (`GRPCRouteFilter`): `RequestHeaderModifier`, `ResponseHeaderModifier`,
//!   `RequestMirror` (with `percent`/`fraction`, repeatable; the copies go over h2c, as the
//!   backends do, unless the port's `appProtocol` says otherwise), as for HTTPRoute; any other
//!   type makes the rule answer an error and the route not `Accepted` (`UnsupportedValue`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use weir_dataplane::model::{
    Backend, BackendId, ObjectRef, PathMatch, RequestConditions, Route, RouteTable, StringMatch,
    UpstreamProtocol, ValueMatch, VirtualHost,
};

use super::conditions::{Cond, reasons, types};
use super::hostname::Hostname;
use super::isolation::{self, Isolation};
use super::refs::Grants;
use super::routes::{
    Age, Built, Order, Plain, RouteCtx, RoutesOut, by_host, hosts_of, ingress_wildcards, names_of, place,
    with_sockets,
};
use super::{GatewayAttachments, GatewayConfig, RouteKind};
use crate::gateway::{GrpcMethodMatch, GrpcRouteMatch, GrpcRouteRule, HttpRouteRule};
use crate::snapshot::Snapshot;
use crate::translate::backend::Resolver;
use crate::translate::warnings::{ObjectKind, Reason, Warnings};

/// The filter types a GRPCRoute may use (`GRPCRouteFilterType`, without `ExtensionRef`, which
/// weir has none of).
const FILTERS: [&str; 3] = ["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror"];

/// A GRPCRoute match's specificity within a host name: service and method characters, header
/// matches (more first; then age, rule, match: [`Order`]).
type Specificity = (usize, usize, usize);

// === HTTPRoute / GRPCRoute conflicts ===

/// `GRPCRouteSpec.hostnames`: "If a Route (A) of type HTTPRoute or GRPCRoute is attached to a
/// Listener and that listener already has another Route (B) of the other type attached and the
/// intersection of the hostnames of A and B is non-empty, then the implementation MUST accept
/// exactly one of these two routes": the oldest (creation timestamp), then the first by
/// `{namespace}/{name}`. "The rejected Route MUST raise an 'Accepted' condition with a status
/// of 'False'": here on the parent whose every listener rejected it (`NotAllowedByListeners`).
pub fn resolve_kind_conflicts(out: &mut GatewayAttachments, snapshot: &Snapshot) {
    // Per listener: (age, kind, route, parent index, attachment index, hostnames).
    type Entry = (Age, RouteKind, ObjectRef, usize, usize, Option<Vec<Hostname>>);
    let mut by_listener: BTreeMap<(ObjectRef, usize), Vec<Entry>> = BTreeMap::new();
    for ((kind, key), parents) in &out.routes {
        if !matches!(kind, RouteKind::Http | RouteKind::Grpc) {
            continue;
        }
        let Some(age) = age_of(snapshot, *kind, key) else { continue };
        for (pi, p) in parents.iter().enumerate() {
            for (ai, a) in p.attached.iter().enumerate() {
                by_listener.entry((a.gateway.clone(), a.listener)).or_default().push((
                    age.clone(),
                    *kind,
                    key.clone(),
                    pi,
                    ai,
                    a.hostnames.clone(),
                ));
            }
        }
    }
    // The attachments to drop: (kind, route) -> (parent, attachment, the winner).
    type Drop = (usize, usize, ObjectRef, RouteKind);
    let mut rejected: BTreeMap<(RouteKind, ObjectRef), Vec<Drop>> = BTreeMap::new();
    for ((gateway, listener), mut entries) in by_listener {
        if !entries.iter().any(|e| e.1 == RouteKind::Grpc) || !entries.iter().any(|e| e.1 == RouteKind::Http)
        {
            continue;
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<&Entry> = Vec::new();
        for e in &entries {
            match kept.iter().find(|k| k.1 != e.1 && intersects(k.5.as_deref(), e.5.as_deref())) {
                Some(winner) => {
                    rejected.entry((e.1, e.2.clone())).or_default().push((
                        e.3,
                        e.4,
                        winner.2.clone(),
                        winner.1,
                    ));
                    if let Some(n) = out.attached_routes.get_mut(&(gateway.clone(), listener)) {
                        *n -= 1;
                    }
                }
                None => kept.push(e),
            }
        }
    }
    for ((kind, key), drops) in rejected {
        let Some(parents) = out.routes.get_mut(&(kind, key)) else { continue };
        for (pi, p) in parents.iter_mut().enumerate() {
            let mine: Vec<&Drop> = drops.iter().filter(|d| d.0 == pi).collect();
            if mine.is_empty() {
                continue;
            }
            let drop: BTreeSet<usize> = mine.iter().map(|d| d.1).collect();
            let mut ai = 0;
            p.attached.retain(|_| {
                let keep = !drop.contains(&ai);
                ai += 1;
                keep
            });
            if p.attached.is_empty() {
                let (_, _, winner, winner_kind) = mine[0];
                p.accepted = Cond::no(
                    types::ACCEPTED,
                    reasons::NOT_ALLOWED_BY_LISTENERS,
                    format!(
                        "{} {winner} is older (or first by namespace/name) and has host names in common with this {} on the same listener; only one of an HTTPRoute and a GRPCRoute is accepted",
                        winner_kind.name(),
                        kind.name()
                    ),
                );
            }
        }
    }
}

/// The precedence of an HTTPRoute or GRPCRoute among routes: oldest, then namespace/name.
fn age_of(snapshot: &Snapshot, kind: RouteKind, key: &ObjectRef) -> Option<Age> {
    let meta = match kind {
        RouteKind::Http => &snapshot.http_routes.get(key)?.metadata,
        RouteKind::Grpc => &snapshot.grpc_routes.get(key)?.metadata,
        RouteKind::Tls => return None,
    };
    Some(Age::of(key, meta))
}

/// Whether two routes' host names on one listener share a name (`None`: any).
fn intersects(a: Option<&[Hostname]>, b: Option<&[Hostname]>) -> bool {
    match (a, b) {
        (None, _) | (_, None) => true,
        (Some(a), Some(b)) => a.iter().any(|x| b.iter().any(|y| x.intersect(y).is_some())),
    }
}

// === routes ===

/// Adds the routes of every accepted GRPCRoute to `table`; findings go to `warnings`.
pub(crate) fn apply(
    table: &mut RouteTable,
    attachments: &GatewayAttachments,
    snapshot: &Snapshot,
    resolver: &Resolver<'_>,
    config: &GatewayConfig,
    warnings: &mut Warnings,
) -> RoutesOut {
    let grants = Grants::new(snapshot);
    let mut out = RoutesOut::default();
    let isolation = Isolation::new(attachments.gateways.values());
    let mut built: Vec<Built<Specificity>> = Vec::new();
    let mut backends: BTreeMap<BackendId, Backend> = BTreeMap::new();
    for ((kind, key), parents) in &attachments.routes {
        if *kind != RouteKind::Grpc {
            continue;
        }
        let Some(route) = snapshot.grpc_routes.get(key) else { continue };
        super::routes::warn_not_accepted(ObjectKind::GrpcRoute, key, parents, warnings);
        let Some(hosts) = hosts_of(parents, &attachments.gateways, &isolation) else { continue };
        let Some(age) = age_of(snapshot, RouteKind::Grpc, key) else { continue };
        let mut ctx =
            RouteCtx::new(RouteKind::Grpc, key, &grants, snapshot, resolver, &mut backends, warnings);
        let rule_names = ctx.rule_names(route.spec.rules.iter().map(|r| r.name.as_deref()));
        for (ri, rule) in route.spec.rules.iter().enumerate() {
            let as_http = http_rule(rule);
            let action = ctx.action(ri, &as_http);
            let mut refused = Vec::new();
            for (fi, f) in rule.filters.iter().enumerate() {
                if !FILTERS.contains(&f.type_.as_str()) {
                    refused.push(format!(
                        "spec.rules[{ri}].filters[{fi}]: GRPCRoute filter type {:?} is not supported",
                        f.type_
                    ));
                }
            }
            let mut rule_policy = if refused.is_empty() {
                super::filters::rule_policy(ri, &as_http, config, |field, r| ctx.mirror_target(field, r))
            } else {
                let mut p = super::filters::RulePolicy::default();
                p.policy.filters = Some(Box::new(weir_dataplane::model::filters::RouteFilters {
                    respond: Some(500),
                    ..Default::default()
                }));
                p
            };
            rule_policy.refused.extend(refused);
            for why in &rule_policy.refused {
                ctx.warnings.error_on(
                    ObjectKind::GrpcRoute,
                    key,
                    Reason::UnsupportedFilter,
                    format!("{why}; the rule answers an error"),
                );
                ctx.invalid.push(why.clone());
            }
            let matches =
                if rule.matches.is_empty() { vec![GrpcRouteMatch::default()] } else { rule.matches.clone() };
            for (mi, m) in matches.iter().enumerate() {
                let (path, conditions, chars) = match match_parts(m) {
                    Ok(parts) => parts,
                    Err(why) => {
                        let field = format!("spec.rules[{ri}].matches[{mi}]");
                        ctx.warnings.error_on(
                            ObjectKind::GrpcRoute,
                            key,
                            Reason::InvalidPath,
                            format!("{field}: {why}; this match is not served"),
                        );
                        ctx.invalid.push(format!("{field}: {why}"));
                        continue;
                    }
                };
                let headers = conditions.as_deref().map_or(0, |c| c.headers.len());
                // Listener isolation as for HTTPRoutes: each name on the sockets it attached to.
                for (name, sockets) in &hosts {
                    built.push(Built {
                        host: isolation::host_match(name.as_ref()),
                        order: (None, Reverse((chars.0, chars.1, headers)), age.clone(), ri, mi),
                        route: Route {
                            path: path.clone(),
                            action: action.clone(),
                            policy: rule_policy.policy.clone(),
                            origin: key.clone(),
                            conditions: with_sockets(conditions.clone(), sockets),
                            rule: rule_names.get(ri).cloned().flatten().map(String::into_boxed_str),
                        },
                        name: name.clone(),
                        sockets: sockets.clone(),
                        from: None,
                    });
                }
            }
        }
        ctx.finish(&mut out);
    }
    // The first GRPCRoute using each backend, for warnings about it.
    let mut users: BTreeMap<BackendId, ObjectRef> = BTreeMap::new();
    for b in &built {
        if let weir_dataplane::model::RouteAction::Split(shares) = &b.route.action {
            for id in shares.iter().filter_map(|s| s.backend.as_ref()) {
                users.entry(id.clone()).or_insert_with(|| b.route.origin.clone());
            }
        }
    }
    // Precedence across host names (`GRPCRouteRule.matches`: "Characters in a matching
    // non-wildcard hostname", then "Characters in a matching hostname", before service, method
    // and headers): a host name's own routes first, then the less specific names' as fallback
    // tiers, as for HTTPRoutes.
    let others = names_of(attachments, RouteKind::Http, &isolation);
    place(table, built, &isolation, &others, true, |table, own| merge(table, own, warnings));
    for (id, mut backend) in backends {
        if matches!(super::app_protocol::of(snapshot, &id), Ok(None)) {
            // "Implementations MAY infer the protocol from the Route type referring to the
            // backend Service" (`GRPCBackendRef`): gRPC is HTTP/2.
            backend.protocol = UpstreamProtocol::H2c;
        }
        match table.backends.get(&id) {
            None => {
                table.backends.insert(id, backend);
            }
            Some(existing) if !existing.protocol.is_h2() && backend.protocol.is_h2() => warnings.error_on(
                ObjectKind::GrpcRoute,
                users.get(&id).unwrap_or(&ObjectRef::new(&id.namespace, &id.service)),
                Reason::ConflictLost,
                format!(
                    "Service port {id} is used by GRPCRoutes (HTTP/2) and by routes that speak HTTP/1.1 to it; HTTP/1.1 is kept and gRPC calls to it fail: set the port's appProtocol to kubernetes.io/h2c"
                ),
            ),
            Some(_) => {}
        }
    }
    out
}

/// A GRPCRoute rule as the HTTPRoute code reads its backends and filters.
fn http_rule(rule: &GrpcRouteRule) -> HttpRouteRule {
    HttpRouteRule {
        name: rule.name.clone(),
        matches: Vec::new(),
        filters: rule.filters.clone(),
        backend_refs: rule.backend_refs.clone(),
        timeouts: None,
        retry: None,
    }
}

/// The path, conditions and (service, method) characters of a `GRPCRouteMatch`.
type MatchParts = (PathMatch, Option<Box<RequestConditions>>, (usize, usize));

/// One `GRPCRouteMatch`, validated as the CRD's (dropped) validation rules would.
fn match_parts(m: &GrpcRouteMatch) -> Result<MatchParts, String> {
    let mut conditions = RequestConditions::default();
    let mut seen = BTreeSet::new();
    for h in &m.headers {
        // "If multiple entries specify equivalent header names, only the first entry with an
        // equivalent name MUST be considered for a match."
        if !seen.insert(h.name.to_ascii_lowercase()) {
            continue;
        }
        let value = match h.type_.as_deref().unwrap_or("Exact") {
            "Exact" => StringMatch::Exact(h.value.clone()),
            "RegularExpression" => StringMatch::Regex(h.value.clone()),
            other => return Err(format!("header match type {other:?} is not supported")),
        };
        conditions.headers.push(ValueMatch { name: h.name.clone(), value });
    }
    let (path, chars) = method_path(m.method.as_ref())?;
    let path = match path {
        MethodPath::Exact(p) => PathMatch::Exact(p),
        MethodPath::Any => PathMatch::Prefix("/".into()),
        MethodPath::Regex(re) => {
            conditions.path = Some(StringMatch::Regex(re));
            PathMatch::Prefix("/".into())
        }
    };
    if conditions == RequestConditions::default() {
        return Ok((path, None, chars));
    }
    weir_dataplane::route::conditions::CompiledConditions::compile(&conditions).map_err(|e| e.to_string())?;
    Ok((path, Some(Box::new(conditions)), chars))
}

/// How a `GRPCMethodMatch` matches the request path.
#[derive(Debug, PartialEq, Eq)]
enum MethodPath {
    /// `/service/method`.
    Exact(String),
    /// A regular expression for the whole path.
    Regex(String),
    /// Every path.
    Any,
}

/// A `GRPCMethodMatch` as a path match, with its (service, method) characters.
fn method_path(m: Option<&GrpcMethodMatch>) -> Result<(MethodPath, (usize, usize)), String> {
    let Some(m) = m else { return Ok((MethodPath::Any, (0, 0))) };
    // "If left empty or omitted, will match any service" (and method).
    let service = m.service.as_deref().filter(|s| !s.is_empty());
    let method = m.method.as_deref().filter(|s| !s.is_empty());
    let chars = (service.map_or(0, str::len), method.map_or(0, str::len));
    match m.type_.as_deref().unwrap_or("Exact") {
        "Exact" => {
            if let Some(s) = service
                && !valid_service(s)
            {
                return Err(format!("service {s:?} is not a gRPC service name"));
            }
            if let Some(x) = method
                && !valid_method(x)
            {
                return Err(format!("method {x:?} is not a gRPC method name"));
            }
            Ok((
                match (service, method) {
                    (Some(s), Some(x)) => MethodPath::Exact(format!("/{s}/{x}")),
                    (Some(s), None) => MethodPath::Regex(format!("/{}/[^/]+", s.replace('.', "\\."))),
                    (None, Some(x)) => MethodPath::Regex(format!("/[^/]+/{x}")),
                    (None, None) => {
                        return Err("a method match needs a service or a method".to_string());
                    }
                },
                chars,
            ))
        }
        "RegularExpression" => {
            if service.is_none() && method.is_none() {
                return Err("a method match needs a service or a method".to_string());
            }
            let part = |p: Option<&str>| p.map_or_else(|| "[^/]+".to_string(), |p| format!("(?:{p})"));
            Ok((MethodPath::Regex(format!("/{}/{}", part(service), part(method))), chars))
        }
        other => Err(format!("method match type {other:?} is not supported")),
    }
}

/// `GRPCMethodMatch.service` of type Exact: `^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$`.
fn valid_service(s: &str) -> bool {
    let s = s.strip_prefix('.').unwrap_or(s);
    s.split('.').all(valid_method)
}

/// `GRPCMethodMatch.method` of type Exact: `^[A-Za-z_][A-Za-z_0-9]*$`.
fn valid_method(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Puts the built routes into the table's virtual hosts. At one path, GRPCRoute matches with
/// conditions go before the routes already there without conditions (an Ingress's); one without
/// conditions at a path an Ingress has loses to it (`ConflictLost`). As for HTTPRoutes, an
/// Ingress wildcard `*.suffix` answers one-label names before the GRPCRoute's `**.suffix`: it
/// gets the GRPCRoute's routes too.
fn merge(table: &mut RouteTable, built: Vec<Plain<Order<Specificity>>>, warnings: &mut Warnings) {
    if built.is_empty() {
        return;
    }
    let by_host = by_host(built);
    let ingress_wildcards = ingress_wildcards(table, &by_host);
    for (host, routes) in by_host.into_iter().chain(ingress_wildcards) {
        match table.hosts.iter_mut().find(|vh| vh.host == host) {
            None => table.hosts.push(VirtualHost { host, routes, fallback: Vec::new() }),
            Some(vh) => {
                for r in routes.iter().filter(|r| !has_match(r)) {
                    // An Ingress's route: no conditions at all (a Gateway route's socket is one).
                    if let Some(other) = vh.routes.iter().find(|o| o.conditions.is_none() && o.path == r.path)
                    {
                        warnings.warn_on(
                            ObjectKind::GrpcRoute,
                            &r.origin,
                            Reason::ConflictLost,
                            format!(
                                "host {host}: {} already serves this path without conditions; a GRPCRoute match without method or header conditions does not take it over",
                                other.origin
                            ),
                        );
                    }
                }
                vh.routes.extend(routes);
                // Stable: at one path, the routes with a match condition (a service or header
                // match) first, in their precedence order, then the Ingress's, then the routes
                // without one.
                let rank = |r: &Route| match (has_match(r), r.conditions.is_none()) {
                    (true, _) => 0,
                    (false, true) => 1,
                    (false, false) => 2,
                };
                vh.routes.sort_by(|a, b| {
                    (crate::translate::routes::route_order(&a.path), rank(a))
                        .cmp(&(crate::translate::routes::route_order(&b.path), rank(b)))
                });
            }
        }
    }
    table.hosts.sort_by(|a, b| a.host.cmp(&b.host));
}

/// Whether a route has a match condition: anything but the socket a listener's route is kept
/// to (`tls`), which is not a match.
fn has_match(r: &Route) -> bool {
    r.conditions
        .as_deref()
        .is_some_and(|c| *c != RequestConditions { tls: c.tls, ..RequestConditions::default() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn method(type_: Option<&str>, service: Option<&str>, method: Option<&str>) -> GrpcMethodMatch {
        GrpcMethodMatch {
            type_: type_.map(str::to_string),
            service: service.map(str::to_string),
            method: method.map(str::to_string),
        }
    }

    /// `GRPCMethodMatch`: "At least one of Service and Method MUST be a non-empty string"; Exact
    /// service and method are validated by the CRD's patterns (dropped for the test API server,
    /// checked here).
    #[test]
    fn grpc_method_match_paths_and_validation() {
        let p = |t, s, m| method_path(Some(&method(t, s, m)));
        assert_eq!(
            p(None, Some("t.Test"), Some("Echo")).unwrap(),
            (MethodPath::Exact("/t.Test/Echo".into()), (6, 4))
        );
        assert_eq!(
            p(Some("Exact"), Some("t.Test"), None).unwrap().0,
            MethodPath::Regex("/t\\.Test/[^/]+".into())
        );
        assert_eq!(p(None, None, Some("Echo")).unwrap().0, MethodPath::Regex("/[^/]+/Echo".into()));
        assert_eq!(
            p(Some("RegularExpression"), Some("t\\..*"), None).unwrap().0,
            MethodPath::Regex("/(?:t\\..*)/[^/]+".into())
        );
        assert!(p(None, None, None).is_err());
        assert!(p(None, Some(""), Some("")).is_err(), "empty is omitted");
        assert!(p(None, Some("t/Test"), Some("Echo")).is_err());
        assert!(p(None, Some("t.Test"), Some("Ec ho")).is_err());
        assert!(p(Some("Prefix"), Some("t.Test"), None).is_err());
        assert_eq!(method_path(None).unwrap(), (MethodPath::Any, (0, 0)));
        assert!(valid_service(".pkg.v1.Svc_2"));
        assert!(!valid_service("pkg..Svc"));
    }

    /// `GRPCRouteRule.matches`: "Precedence MUST be given to the rule with the largest number
    /// of: Characters in a matching non-wildcard hostname. Characters in a matching hostname.
    /// Characters in a matching service. Characters in a matching method. Header matches."
    /// Translated and compiled into the router: a host name's own rules win over every rule of
    /// a less specific name, even one with more service and method characters; a call they do
    /// not match goes to the next less specific name that matches it (`*.example.com`, then the
    /// route without hostnames), never to a 404 while one does.
    #[test]
    fn grpc_route_rule_matches_precedence_across_hostnames() {
        let svc = |name: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{ports: [{{port: 80}}]}}\n---\n"
            )
        };
        let route = |name: &str, created: &str, hostnames: &str, rules: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{name: {name}, namespace: default, creationTimestamp: \"{created}\"}}\n\
                 spec:\n  parentRefs: [{{name: edge}}]\n  hostnames: [{hostnames}]\n  rules:\n{rules}---\n"
            )
        };
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: weir}}\nspec: {{controllerName: weir.dev/gateway-controller}}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: default}}\n\
             spec: {{gatewayClassName: weir, listeners: [{{name: http, port: 80, protocol: HTTP}}]}}\n---\n{}{}{}{}{}{}",
            svc("exact"),
            svc("wild"),
            svc("any"),
            route(
                "exact",
                "2026-03-01T00:00:00Z",
                "foo.example.com",
                "  - {matches: [{method: {service: pkg.Own}}], backendRefs: [{name: exact, port: 80}]}\n\
                 \x20 - {matches: [{headers: [{name: x-own, value: \"yes\"}]}], backendRefs: [{name: exact, port: 80}]}\n"
            ),
            route(
                "wild",
                "2026-02-01T00:00:00Z",
                "\"*.example.com\"",
                "  - {matches: [{method: {service: pkg.Own, method: Longest}}, {method: {service: pkg.Wild}}], backendRefs: [{name: wild, port: 80}]}\n"
            ),
            route("any", "2026-01-01T00:00:00Z", "", "  - {backendRefs: [{name: any, port: 80}]}\n"),
        );
        let snapshot: Snapshot =
            crate::source::manifest::parse_manifests(&text).unwrap().into_iter().collect();
        let translation =
            crate::translate::translate(&snapshot, &crate::translate::TranslateConfig::default());
        let router = weir_dataplane::route::router::Router::compile(&translation.table).unwrap();
        let call = |host: &str, path: &str, own: bool| -> Option<String> {
            let mut headers = http::HeaderMap::new();
            headers.insert("content-type", http::HeaderValue::from_static("application/grpc"));
            if own {
                headers.insert("x-own", http::HeaderValue::from_static("yes"));
            }
            let view = weir_dataplane::route::conditions::RequestView {
                method: &http::Method::POST,
                headers: &headers,
                query: None,
                tls: false,
                path,
            };
            let route = router.lookup_request(host, path, Some(&view))?;
            Some(router.backend_ids()[route.backend.0 as usize].service.clone())
        };
        // The exact name's service match beats the wildcard's longer service-and-method match.
        assert_eq!(call("foo.example.com", "/pkg.Own/Longest", false).as_deref(), Some("exact"));
        // Its header match beats them too.
        assert_eq!(call("foo.example.com", "/pkg.Wild/Get", true).as_deref(), Some("exact"));
        // Nothing of foo.example.com matches: *.example.com's rules, then the host-less route's.
        assert_eq!(call("foo.example.com", "/pkg.Wild/Get", false).as_deref(), Some("wild"));
        assert_eq!(call("foo.example.com", "/pkg.Other/Get", false).as_deref(), Some("any"));
        // Deeper names and other names: the wildcard's, then the host-less route's.
        assert_eq!(call("a.b.example.com", "/pkg.Own/Longest", false).as_deref(), Some("wild"));
        assert_eq!(call("a.b.example.com", "/pkg.Own/Get", false).as_deref(), Some("any"));
        assert_eq!(call("example.org", "/pkg.Wild/Get", false).as_deref(), Some("any"));
    }
}
