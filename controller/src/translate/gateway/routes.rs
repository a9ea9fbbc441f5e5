//! HTTPRoutes into the routing table (pure): every rule of an accepted route, on the host
//! names it attached with, becomes routes beside the Ingresses' in the same [`RouteTable`].
//!
//! - Host names: the route's `hostnames` intersected with each listener's
//!   (`hostname::effective`); an exact name is an exact virtual host, a wildcard `*.suffix` a
//!   [`HostMatch::Suffix`] one (any number of labels), none at all the any-host entry.
//! - Precedence across host names (`HTTPRouteSpec.hostnames`: "Characters in a matching
//!   non-wildcard hostname", then "Characters in a matching hostname", then the matches): the
//!   router picks the most specific virtual host for a request; its own routes are tried first,
//!   then the routes of each less specific name that covers it and whose listener the request
//!   still belongs to (listener isolation), longest name first, as [`Fallback`] tiers. So a
//!   request that `foo.example.com`'s rules do not match is served by `*.example.com`'s, and
//!   `foo.example.com`'s `/` beats `*.example.com`'s `/longer`.
//! - Matches (`HTTPRouteMatch`): `path` `Exact`, `PathPrefix` (element-wise, a trailing `/`
//!   ignored) or `RegularExpression` (the whole path must match); method, headers and query
//!   parameters become [`RequestConditions`]. No match: `PathPrefix /`.
//! - Precedence (`HTTPRouteRule.matches`): "Exact" path, then "Prefix" path with the largest
//!   number of characters (the router's order), then method match, largest number of header
//!   matches, largest number of query param matches, then the oldest route, then
//!   `{namespace}/{name}`, then the first rule and match in list order: routes sharing a path
//!   are emitted in that order, which the router keeps. RegularExpression paths (whose
//!   precedence is implementation-specific) come after Exact and before PathPrefix, as Ingress
//!   regex paths do.
//! - Backends (`HTTPRouteRule.backendRefs`): a [`RouteAction::Split`] by `weight` (0 excluded);
//!   a reference that does not resolve (a missing Service or port, another namespace without a
//!   ReferenceGrant, a kind other than Service) keeps its share, which answers 500; a rule
//!   without backends answers 500. Each such reference makes the route's `ResolvedRefs` false.
//! - Coexistence with Ingress: routes of both for one host live in one virtual host. At one
//!   path an HTTPRoute match with conditions is tried before the Ingress's route; one without
//!   conditions (the same path, nothing more specific) loses to the Ingress, and the HTTPRoute
//!   gets a warning (`ConflictLost`). A `*.suffix` HTTPRoute host also joins an Ingress
//!   wildcard `*.suffix` host, which answers one-label names first.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use weir_dataplane::model::{
    Backend, BackendId, Fallback, HostMatch, Mirror, ObjectRef, PathMatch, RequestConditions, Route,
    RouteAction, ServicePort, StringMatch, UpstreamProtocol, ValueMatch, VirtualHost, WeightedBackend,
};

use super::attach::ParentOut;
use super::conditions::{Cond, reasons, types};
use super::hostname::Hostname;
use super::isolation::{self, Isolation, Socket};
use super::listeners::GatewayOut;
use super::refs::Grants;
use super::{GatewayAttachments, RouteKind};
use crate::gateway::{BackendRef, HttpRouteMatch, HttpRouteRule};
use crate::snapshot::Snapshot;
use crate::translate::backend::{self, Resolver};
use crate::translate::warnings::{ObjectKind, Reason, Warnings};

/// What the HTTPRoutes added: per route, its `ResolvedRefs` condition and whether its rules
/// were all usable (for the status writer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutesOut {
    /// `ResolvedRefs` of each HTTPRoute with a parent of ours that accepted it.
    pub resolved_refs: BTreeMap<ObjectRef, Cond>,
    /// Rules that cannot be served as written (an invalid match, an unsupported filter), with
    /// why; the route's `Accepted` stays true (the rest serves) unless every rule is here.
    pub invalid_rules: BTreeMap<ObjectRef, Vec<String>>,
}

/// Precedence between HTTPRoutes: the oldest (`creationTimestamp`; none counts as the newest),
/// then `{namespace}/{name}`. Smaller wins.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Age {
    pub(super) undated: bool,
    pub(super) created: Option<Timestamp>,
    pub(super) object: ObjectRef,
}

impl Age {
    /// The age of the route `key` with metadata `meta`.
    pub(super) fn of(
        key: &ObjectRef,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Age {
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        Age { undated: created.is_none(), created, object: key.clone() }
    }
}

/// See [`Built::order`]: `S` is the match's specificity within a host name (HTTPRoute: method
/// match, header and query parameter counts; GRPCRoute: service and method characters, header
/// matches), more first.
pub(super) type Order<S> = (Option<Reverse<usize>>, Reverse<S>, Age, usize, usize);

/// An HTTPRoute match's specificity: method match, header and query parameter counts.
type HttpSpecificity = (bool, usize, usize);

/// One route built from a match (an HTTPRoute's or a GRPCRoute's), with its precedence among
/// routes sharing its path.
pub(super) struct Built<S> {
    pub(super) host: HostMatch,
    /// Inherited from a less specific host name (its length: the [`Fallback`] tier it goes
    /// into), the match's specificity `S` (more first), then age, rule and match index.
    pub(super) order: Order<S>,
    pub(super) route: Route,
    /// `host` as a Gateway API name (`None`: any host).
    pub(super) name: Option<Hostname>,
    /// The sockets it is served on, each with the hostname of the listener it attached to.
    pub(super) sockets: BTreeMap<Socket, Option<Hostname>>,
    /// For a copy of a less specific host name's route (`inherit`): that name, whose
    /// [`Fallback`] tier of `host` it goes into.
    pub(super) from: Option<HostMatch>,
}

/// A [`Built`] route without what listener isolation needed: its virtual host and its
/// precedence `O` among routes sharing its path.
pub(super) struct Plain<O> {
    pub(super) host: HostMatch,
    /// Its precedence ([`Order`]).
    pub(super) order: O,
    pub(super) route: Route,
}

/// The built routes by host, each host's in the router's path order, then precedence.
pub(super) fn by_host<O: Ord>(mut built: Vec<Plain<O>>) -> BTreeMap<HostMatch, Vec<Route>> {
    built.sort_by(|a, b| {
        (&a.host, crate::translate::routes::route_order(&a.route.path), &a.order).cmp(&(
            &b.host,
            crate::translate::routes::route_order(&b.route.path),
            &b.order,
        ))
    });
    let mut by_host: BTreeMap<HostMatch, Vec<Route>> = BTreeMap::new();
    for b in built {
        by_host.entry(b.host).or_default().push(b.route);
    }
    by_host
}

/// Adds the routes of every accepted HTTPRoute to `table`, resolving their backends with
/// `resolver`; findings go to `warnings` (about the HTTPRoute).
pub(crate) fn apply(
    table: &mut weir_dataplane::model::RouteTable,
    attachments: &GatewayAttachments,
    snapshot: &Snapshot,
    resolver: &Resolver<'_>,
    config: &super::GatewayConfig,
    warnings: &mut Warnings,
) -> RoutesOut {
    let grants = Grants::new(snapshot);
    let isolation = Isolation::new(attachments.gateways.values());
    let mut out = RoutesOut::default();
    let mut built: Vec<Built<HttpSpecificity>> = Vec::new();
    let mut backends: BTreeMap<BackendId, Backend> = BTreeMap::new();
    for ((kind, key), parents) in &attachments.routes {
        if *kind != RouteKind::Http {
            continue;
        }
        let Some(route) = snapshot.http_routes.get(key) else { continue };
        warn_not_accepted(ObjectKind::HttpRoute, key, parents, warnings);
        let Some(hosts) = hosts_of(parents, &attachments.gateways, &isolation) else { continue };
        let age = Age::of(key, &route.metadata);
        let mut ctx =
            RouteCtx::new(RouteKind::Http, key, &grants, snapshot, resolver, &mut backends, warnings);
        let rule_names = ctx.rule_names(route.spec.rules.iter().map(|r| r.name.as_deref()));
        for (ri, rule) in route.spec.rules.iter().enumerate() {
            let action = ctx.action(ri, rule);
            let rule_policy =
                super::filters::rule_policy(ri, rule, config, |field, r| ctx.mirror_target(field, r));
            for why in &rule_policy.refused {
                ctx.warnings.error_on(
                    ObjectKind::HttpRoute,
                    key,
                    Reason::UnsupportedFilter,
                    format!("{why}; the rule answers 500"),
                );
                ctx.invalid.push(why.clone());
            }
            for note in &rule_policy.notes {
                ctx.warnings.warn_on(ObjectKind::HttpRoute, key, Reason::ServedOtherwise, note.clone());
            }
            let policy = rule_policy.policy;
            for (mi, m) in matches_of(rule).iter().enumerate() {
                let Some((path, conditions)) = ctx.route_match(ri, mi, m) else { continue };
                let specificity = conditions
                    .as_deref()
                    .map_or((false, 0, 0), |c| (c.method.is_some(), c.headers.len(), c.query.len()));
                for (name, sockets) in &hosts {
                    built.push(Built {
                        host: isolation::host_match(name.as_ref()),
                        order: (None, Reverse(specificity), age.clone(), ri, mi),
                        route: Route {
                            path: path.clone(),
                            action: action.clone(),
                            policy: policy.clone(),
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
    let others = names_of(attachments, RouteKind::Grpc, &isolation);
    place(table, built, &isolation, &others, true, |table, own| merge(table, own, warnings));
    for (id, backend) in backends {
        table.backends.entry(id).or_insert(backend);
    }
    out
}

/// Warns about each parent of ours that did not accept the route `key` of `kind`.
pub(super) fn warn_not_accepted(
    kind: ObjectKind,
    key: &ObjectRef,
    parents: &[ParentOut],
    warnings: &mut Warnings,
) {
    for parent in parents.iter().filter(|p| !p.accepted.status) {
        warnings.error_on(
            kind,
            key,
            Reason::RouteNotAccepted,
            format!(
                "spec.parentRefs[{}]: not accepted ({}): {}",
                parent.parent_ref.name, parent.accepted.reason, parent.accepted.message
            ),
        );
    }
}

/// The host names (`None`: any) a route serves over all its accepted parents, each with the
/// sockets it serves it on and the hostname of the listener there; names a more specific
/// listener of the socket takes are left out (`isolation`). `None` when it attached nowhere.
pub(super) type Hosts = BTreeMap<Option<Hostname>, BTreeMap<Socket, Option<Hostname>>>;

pub(super) fn hosts_of(
    parents: &[ParentOut],
    gateways: &BTreeMap<ObjectRef, GatewayOut>,
    isolation: &Isolation,
) -> Option<Hosts> {
    let mut hosts = Hosts::new();
    let mut attached = false;
    for a in parents.iter().filter(|p| p.accepted.status).flat_map(|p| &p.attached) {
        attached = true;
        let Some(listener) = gateways.get(&a.gateway).and_then(|g| g.listeners.get(a.listener)) else {
            continue;
        };
        let Some(socket) = listener.protocol.as_ref().map(Socket::of) else { continue };
        let names: Vec<Option<&Hostname>> = match &a.hostnames {
            None => vec![None],
            Some(names) => names.iter().map(Some).collect(),
        };
        for name in names {
            if isolation.claimed(socket, listener.hostname.as_ref(), name) {
                continue;
            }
            let sockets = hosts.entry(name.cloned()).or_default();
            // Two listeners of one socket: the more specific one's hostname.
            let replace = match sockets.get(&socket) {
                None => true,
                Some(have) => {
                    listener.hostname.as_ref().is_some_and(|l| isolation::strictly_covers(have.as_ref(), l))
                }
            };
            if replace {
                sockets.insert(socket, listener.hostname.clone());
            }
        }
    }
    attached.then_some(hosts)
}

/// A match's conditions with the sockets it is served on.
pub(super) fn with_sockets(
    conditions: Option<Box<RequestConditions>>,
    sockets: &BTreeMap<Socket, Option<Hostname>>,
) -> Option<Box<RequestConditions>> {
    let tls = Socket::condition(&sockets.keys().copied().collect());
    match (conditions, tls) {
        (None, None) => None,
        (Some(mut c), tls) => {
            c.tls = tls;
            Some(c)
        }
        (None, tls) => Some(Box::new(RequestConditions { tls, ..RequestConditions::default() })),
    }
}

/// The host names the routes of `kind` serve (`hosts_of`), for the other kind's `inherit`.
pub(super) fn names_of(
    attachments: &GatewayAttachments,
    kind: RouteKind,
    isolation: &Isolation,
) -> BTreeSet<Hostname> {
    attachments
        .routes
        .iter()
        .filter(|((k, _), _)| *k == kind)
        .filter_map(|(_, parents)| hosts_of(parents, &attachments.gateways, isolation))
        .flat_map(|hosts| hosts.into_keys().flatten())
        .collect()
}

/// Puts one route kind's built routes into `table`: each host name's own routes (`merge`),
/// the routes of less specific names as its [`Fallback`] tiers (`inherit`, `fallbacks`), and
/// an empty virtual host for each listener host name that must not reach a less specific one.
/// `others`: the host names the other route kind serves, which take this kind's less specific
/// names' routes as fallbacks too (on the sockets where those answer: an HTTPRoute and a
/// GRPCRoute never share a name on one listener, `GRPCRouteSpec.hostnames`). `join`: whether
/// an Ingress wildcard that took this kind's `**.suffix` routes takes its tiers too.
pub(super) fn place<S: Clone + Ord>(
    table: &mut weir_dataplane::model::RouteTable,
    mut built: Vec<Built<S>>,
    isolation: &Isolation,
    others: &BTreeSet<Hostname>,
    join: bool,
    merge: impl FnOnce(&mut weir_dataplane::model::RouteTable, Vec<Plain<Order<S>>>),
) {
    let shields = inherit(&mut built, isolation, others);
    let (inherited, own): (Vec<Built<S>>, Vec<Built<S>>) = built.into_iter().partition(|b| b.from.is_some());
    let own = own.into_iter().map(|b| Plain { host: b.host, order: b.order, route: b.route }).collect();
    merge(table, own);
    fallbacks(table, inherited, join);
    for host in shields {
        if !table.hosts.iter().any(|vh| vh.host == host) {
            table.hosts.push(VirtualHost { host, routes: Vec::new(), fallback: Vec::new() });
        }
    }
    table.hosts.sort_by(|a, b| a.host.cmp(&b.host));
}

/// Whether a route answers every request at its path (on its sockets): no condition but the
/// socket's.
fn unconditional(r: &Route) -> bool {
    r.conditions
        .as_deref()
        .is_none_or(|c| c.method.is_none() && c.headers.is_empty() && c.query.is_empty() && c.path.is_none())
}

/// Listener isolation across virtual hosts (see `isolation`): the routes of a less specific
/// host name are copied into each more specific virtual host (of this kind's names, and of
/// `others`) whose requests still belong to their listener; returns the listener host names
/// that need a virtual host of their own (even without routes) so that their requests do not
/// reach a less specific one.
fn inherit<S: Clone>(
    built: &mut Vec<Built<S>>,
    isolation: &Isolation,
    others: &BTreeSet<Hostname>,
) -> BTreeSet<HostMatch> {
    let mut wide: Vec<usize> =
        (0..built.len()).filter(|&i| !matches!(built[i].name, Some(Hostname::Exact(_)))).collect();
    // The longest name first: of two copies at one path, the more specific name's is kept.
    wide.sort_by_key(|&i| Reverse(built[i].name.as_ref().map_or(0, Hostname::len)));
    if wide.is_empty() {
        return BTreeSet::new();
    }
    let mut targets: BTreeSet<Hostname> = built.iter().filter_map(|b| b.name.clone()).collect();
    targets.extend(others.iter().cloned());
    for &i in &wide {
        for socket in built[i].sockets.keys() {
            targets.extend(isolation.shields(*socket, built[i].name.as_ref()));
        }
    }
    let mut have: BTreeSet<(Hostname, ObjectRef, usize, usize)> = built
        .iter()
        .filter_map(|b| Some((b.name.clone()?, b.route.origin.clone(), b.order.3, b.order.4)))
        .collect();
    // Paths a target already answers for every request (on a socket, or both): a copy there
    // would never be reached.
    let plain = |b: &Built<S>| unconditional(&b.route);
    let tls_of = |r: &Route| r.conditions.as_deref().and_then(|c| c.tls);
    let mut taken: BTreeSet<(Hostname, PathMatch, Option<bool>)> = built
        .iter()
        .filter(|b| plain(b))
        .filter_map(|b| Some((b.name.clone()?, b.route.path.clone(), tls_of(&b.route))))
        .collect();
    let mut copies = Vec::new();
    for target in &targets {
        for &i in &wide {
            let b = &built[i];
            let sockets: BTreeMap<Socket, Option<Hostname>> = b
                .sockets
                .iter()
                .filter(|(s, l)| isolation.inherits(**s, l.as_ref(), b.name.as_ref(), target))
                .map(|(s, l)| (*s, l.clone()))
                .collect();
            if sockets.is_empty()
                || !have.insert((target.clone(), b.route.origin.clone(), b.order.3, b.order.4))
            {
                continue;
            }
            let mut route = b.route.clone();
            route.conditions = with_sockets(route.conditions.take(), &sockets);
            let tls = tls_of(&route);
            let path = (target.clone(), route.path.clone());
            if taken.contains(&(path.0.clone(), path.1.clone(), None))
                || taken.contains(&(path.0.clone(), path.1.clone(), tls))
            {
                continue;
            }
            if unconditional(&route) {
                taken.insert((path.0, path.1, tls));
            }
            let mut order = b.order.clone();
            order.0 = Some(Reverse(b.name.as_ref().map_or(0, Hostname::len)));
            copies.push(Built {
                host: isolation::host_match(Some(target)),
                order,
                route,
                name: Some(target.clone()),
                sockets,
                from: Some(isolation::host_match(b.name.as_ref())),
            });
        }
    }
    built.extend(copies);
    targets.iter().map(|t| isolation::host_match(Some(t))).collect()
}

/// Puts the copies `inherit` made into their virtual hosts' [`Fallback`] tiers, one tier per
/// less specific name, the longest first (`HTTPRouteSpec.hostnames`: "precedence must be given
/// to rules from the HTTPRoute with the largest number of: Characters in a matching
/// non-wildcard hostname. Characters in a matching hostname."; then, within a tier, the
/// `HTTPRouteRule.matches` order). A host's own routes (an exact name's, or a wildcard's) are
/// all tried before any tier, whatever their paths. An Ingress wildcard `*.suffix` that took the
/// HTTPRoute `**.suffix` routes (`merge`) takes its tiers too. Ingress hosts get none of their
/// own: they are targets only when an HTTPRoute (or GRPCRoute) names them too. GRPCRoutes'
/// tiers come the same way (`GRPCRouteRule.matches`: "Characters in a matching non-wildcard
/// hostname. Characters in a matching hostname." before service, method and headers); where a
/// virtual host has tiers of both kinds (on different sockets), they are ordered by name length
/// together, the HTTPRoutes' first on a tie.
fn fallbacks<S: Ord>(table: &mut weir_dataplane::model::RouteTable, inherited: Vec<Built<S>>, join: bool) {
    if inherited.is_empty() {
        return;
    }
    type Tier = (Reverse<usize>, HostMatch);
    type Tiers<S> = BTreeMap<Tier, Vec<Plain<Order<S>>>>;
    let mut by_target: BTreeMap<HostMatch, Tiers<S>> = BTreeMap::new();
    for b in inherited {
        let Some(from) = b.from else { continue };
        let len = b.order.0.map_or(0, |Reverse(len)| len);
        by_target.entry(b.host.clone()).or_default().entry((Reverse(len), from)).or_default().push(Plain {
            host: b.host,
            order: b.order,
            route: b.route,
        });
    }
    for (target, tiers) in by_target {
        let tiers: Vec<Fallback> = tiers
            .into_iter()
            .map(|((_, from), routes)| Fallback {
                from,
                routes: by_host(routes).into_values().flatten().collect(),
            })
            .collect();
        // An Ingress wildcard `*.suffix` that took this kind's `**.suffix` routes takes the
        // tiers this call adds to `**.suffix` too (not those of the other kind, already there).
        let joined = match &target {
            HostMatch::Suffix(s) if join => Some((HostMatch::Wildcard(s.clone()), tiers.clone())),
            _ => None,
        };
        for (host, tiers) in std::iter::once((target, tiers)).chain(joined) {
            match table.hosts.iter_mut().find(|vh| vh.host == host) {
                Some(vh) => {
                    vh.fallback.extend(tiers);
                    // Stable: tiers already there (the HTTPRoutes') stay first on a tie.
                    vh.fallback.sort_by_key(|t| (Reverse(name_len(&t.from)), t.from.clone()));
                }
                None if !matches!(host, HostMatch::Wildcard(_)) => {
                    table.hosts.push(VirtualHost { host, routes: Vec::new(), fallback: tiers })
                }
                None => {}
            }
        }
    }
    table.hosts.sort_by(|a, b| a.host.cmp(&b.host));
}

/// Characters of a Gateway API host name in the table (`*.` included; any host: 0), as
/// [`Hostname::len`] counts them.
fn name_len(h: &HostMatch) -> usize {
    match h {
        HostMatch::Any => 0,
        HostMatch::Exact(n) => n.len(),
        HostMatch::Wildcard(s) | HostMatch::Suffix(s) => s.len() + 2,
    }
}

/// `HTTPRouteRule.matches`, defaulted: "If no matches are specified, the default is a prefix
/// path match on "/"".
fn matches_of(rule: &HttpRouteRule) -> Vec<HttpRouteMatch> {
    if rule.matches.is_empty() { vec![HttpRouteMatch::default()] } else { rule.matches.clone() }
}

/// The state of one HTTPRoute's (or GRPCRoute's) translation.
pub(super) struct RouteCtx<'a, 'w> {
    /// The route's kind (`HTTPRoute` or `GRPCRoute`).
    pub(super) kind: RouteKind,
    pub(super) key: &'a ObjectRef,
    pub(super) grants: &'a Grants<'a>,
    pub(super) snapshot: &'a Snapshot,
    pub(super) resolver: &'a Resolver<'a>,
    pub(super) backends: &'w mut BTreeMap<BackendId, Backend>,
    pub(super) warnings: &'w mut Warnings,
    /// The first `ResolvedRefs` failure.
    pub(super) refs: Option<Cond>,
    /// Rules (or matches) that cannot be served as written.
    pub(super) invalid: Vec<String>,
}

impl<'a, 'w> RouteCtx<'a, 'w> {
    /// The context of the route `key` of `kind`, nothing found yet.
    pub(super) fn new(
        kind: RouteKind,
        key: &'a ObjectRef,
        grants: &'a Grants<'a>,
        snapshot: &'a Snapshot,
        resolver: &'a Resolver<'a>,
        backends: &'w mut BTreeMap<BackendId, Backend>,
        warnings: &'w mut Warnings,
    ) -> Self {
        RouteCtx {
            kind,
            key,
            grants,
            snapshot,
            resolver,
            backends,
            warnings,
            refs: None,
            invalid: Vec::new(),
        }
    }

    /// Puts the route's `ResolvedRefs` and unusable rules in `out`.
    pub(super) fn finish(&mut self, out: &mut RoutesOut) {
        let refs = self.refs.take().unwrap_or_else(|| {
            Cond::yes(types::RESOLVED_REFS, reasons::RESOLVED_REFS, "every backend reference resolved")
        });
        if !self.invalid.is_empty() {
            out.invalid_rules.insert(self.key.clone(), std::mem::take(&mut self.invalid));
        }
        out.resolved_refs.insert(self.key.clone(), refs);
    }

    /// The names of the route's rules ([`super::rule_name::rule_names`]); a refused one is a
    /// warning and makes the route not `Accepted`.
    pub(super) fn rule_names<'n>(
        &mut self,
        names: impl IntoIterator<Item = Option<&'n str>>,
    ) -> Vec<Option<String>> {
        let (names, refused) = super::rule_name::rule_names(names);
        for why in refused {
            self.warnings.error_on(
                self.object_kind(),
                self.key,
                Reason::InvalidRuleName,
                format!("{why}; the rule serves without a name"),
            );
            self.invalid.push(why);
        }
        names
    }

    /// The kind warnings are filed under.
    pub(super) fn object_kind(&self) -> ObjectKind {
        match self.kind {
            RouteKind::Grpc => ObjectKind::GrpcRoute,
            _ => ObjectKind::HttpRoute,
        }
    }

    /// Notes a reference that did not resolve: a warning, and `ResolvedRefs` false (the first
    /// reason wins).
    fn unresolved(&mut self, field: String, reason: &'static str, message: String) {
        self.unresolved_then(field, reason, message, "its share of the requests answers 500");
    }

    /// [`RouteCtx::unresolved`], saying what follows for the requests.
    fn unresolved_then(&mut self, field: String, reason: &'static str, message: String, then: &str) {
        self.warnings.error_on(
            self.object_kind(),
            self.key,
            Reason::BackendNotResolved,
            format!("{field}: {message}; {then}"),
        );
        if self.refs.is_none() {
            self.refs = Some(Cond::no(types::RESOLVED_REFS, reason, format!("{field}: {message}")));
        }
    }

    /// The backends of rule `ri`: a weighted split.
    pub(super) fn action(&mut self, ri: usize, rule: &HttpRouteRule) -> RouteAction {
        let mut shares = Vec::with_capacity(rule.backend_refs.len());
        for (bi, r) in rule.backend_refs.iter().enumerate() {
            let field = format!("spec.rules[{ri}].backendRefs[{bi}]");
            let weight = u32::try_from(r.backend.weight.unwrap_or(1)).unwrap_or(0);
            let backend = self.backend(&field, &r.backend);
            // A refused filter is reported by `filters::rule_policy` (the rule answers 500).
            let request_headers = super::filters::backend_edits(&r.filters).ok().flatten();
            shares.push(WeightedBackend { backend, weight, request_headers });
        }
        RouteAction::Split(shares)
    }

    /// The Service port a `backendRef` names ([`service_port`]).
    fn service_port(&self, r: &BackendRef) -> Result<BackendId, (&'static str, String)> {
        service_port(self.key, self.kind.name(), self.grants, self.snapshot, r)
    }

    /// Resolves one `backendRef` into the table's backends; `None` (with `ResolvedRefs` false)
    /// when it does not resolve.
    fn backend(&mut self, field: &str, r: &BackendRef) -> Option<BackendId> {
        let id = match self.service_port(r) {
            Ok(id) => id,
            Err((reason, why)) => {
                self.unresolved(field.to_string(), reason, why);
                return None;
            }
        };
        if !self.backends.contains_key(&id) {
            let (mut resolved, error) = self.resolver.resolve(&id);
            match super::app_protocol::of(self.snapshot, &id) {
                Ok(Some((protocol, tls))) => (resolved.protocol, resolved.tls) = (protocol, tls),
                Ok(None) => {}
                Err(why) => {
                    self.unresolved(field.to_string(), reasons::UNSUPPORTED_PROTOCOL_REF, why);
                    return None;
                }
            }
            match error {
                Some(e @ (backend::Error::ServiceNotFound { .. } | backend::Error::PortNotFound { .. })) => {
                    self.unresolved(field.to_string(), reasons::BACKEND_NOT_FOUND, e.to_string());
                    return None;
                }
                Some(e) => self.warnings.error_on(
                    self.object_kind(),
                    self.key,
                    e.reason(),
                    format!("{field}: {e}; requests routed to it answer 503"),
                ),
                None => {}
            }
            self.backends.insert(id.clone(), resolved);
        }
        Some(id)
    }

    /// Where a `RequestMirror` (at `field`) copies requests to: the ready endpoints of the
    /// Service port in turn (the first in the target, the others in `spread`), spoken to over h2c for a GRPCRoute or a port whose `appProtocol` says
    /// `kubernetes.io/h2c`, else HTTP/1.1 (the share is left to the caller). `None`: no ready
    /// endpoint (warned), or the reference does not resolve or names a protocol weir does not
    /// mirror over: `HTTPRequestMirrorFilter.backendRef` "is invalid and must be dropped from
    /// the Gateway. The controller must ensure the "ResolvedRefs" condition on the Route status
    /// is set to `status: False`" (`RefNotPermitted` across namespaces without a grant); the
    /// rule serves without that mirror.
    pub(super) fn mirror_target(&mut self, field: &str, r: &BackendRef) -> Option<Mirror> {
        let field = format!("{field}.requestMirror.backendRef");
        let id = match self.service_port(r) {
            Ok(id) => id,
            Err((reason, why)) => {
                self.unresolved_then(field, reason, why, "this mirror is dropped");
                return None;
            }
        };
        let (backend, error) = self.resolver.resolve(&id);
        if let Some(e) = error {
            self.unresolved_then(field, reasons::BACKEND_NOT_FOUND, e.to_string(), "this mirror is dropped");
            return None;
        }
        // `HTTPBackendRef`: "implementations SHOULD honor the appProtocol field"; without it a
        // GRPCRoute's backends speak HTTP/2, and so do its copies.
        let h2c = match super::app_protocol::of(self.snapshot, &id) {
            Ok(None) => self.kind == RouteKind::Grpc,
            Ok(Some((UpstreamProtocol::H2c, _))) => true,
            Ok(Some((UpstreamProtocol::Http1, _))) => false,
            Ok(Some((other, _))) => {
                let why = format!(
                    "Service port {id} speaks {other:?} by its appProtocol, which weir does not mirror over (HTTP/1.1 or h2c only)"
                );
                self.unresolved_then(field, reasons::UNSUPPORTED_PROTOCOL_REF, why, "this mirror is dropped");
                return None;
            }
            Err(why) => {
                self.unresolved_then(field, reasons::UNSUPPORTED_PROTOCOL_REF, why, "this mirror is dropped");
                return None;
            }
        };
        // Each copy goes to the next ready endpoint, round robin: the target names the first,
        // `spread` the others.
        let (target, spread) = match backend.target {
            weir_dataplane::model::Target::Endpoints(eps) => (
                eps.first().map(|e| format!("http://{}$request_uri", e.address)),
                eps.iter().skip(1).map(|e| e.address.to_string()).collect(),
            ),
            weir_dataplane::model::Target::Dns { host, port } => {
                (Some(format!("http://{host}:{port}$request_uri")), Vec::new())
            }
        };
        if target.is_none() {
            self.warnings.warn_on(
                self.object_kind(),
                self.key,
                Reason::UnsupportedFilter,
                format!("{field}: Service port {id} has no ready endpoint; not mirrored"),
            );
        }
        Some(Mirror { target: target?, host: None, request_body: true, share_ppm: None, h2c, spread })
    }

    /// One `HTTPRouteMatch`: its path and conditions; `None` (with a warning) when it cannot
    /// be served.
    fn route_match(
        &mut self,
        ri: usize,
        mi: usize,
        m: &HttpRouteMatch,
    ) -> Option<(PathMatch, Option<Box<RequestConditions>>)> {
        let field = format!("spec.rules[{ri}].matches[{mi}]");
        match match_parts(m) {
            Ok(parts) => Some(parts),
            Err(why) => {
                self.warnings.error_on(
                    ObjectKind::HttpRoute,
                    self.key,
                    Reason::InvalidPath,
                    format!("{field}: {why}; this match is not served"),
                );
                self.invalid.push(format!("{field}: {why}"));
                None
            }
        }
    }
}

/// The Service port a `backendRef` (`BackendObjectReference`) of the route `key` (of kind
/// `from_kind`) names, in the route's namespace or in another one that grants it; else the
/// `ResolvedRefs` reason and why.
pub(crate) fn service_port(
    key: &ObjectRef,
    from_kind: &str,
    grants: &Grants<'_>,
    snapshot: &Snapshot,
    r: &BackendRef,
) -> Result<BackendId, (&'static str, String)> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        let why = format!("kind {kind:?} of group {group:?} is not supported (only Services)");
        return Err((reasons::INVALID_KIND, why));
    }
    let namespace = r.namespace.as_deref().unwrap_or(&key.namespace);
    let service = ObjectRef::new(namespace, &r.name);
    // `BackendRef`: "a ReferenceGrant is required in the referent namespace to allow that
    // namespace's owner to accept the reference".
    if namespace != key.namespace
        && !grants.allows((crate::gateway::GROUP, from_kind, &key.namespace), ("", "Service", &service))
    {
        let why = format!("Service {service} is in another namespace and no ReferenceGrant there allows it");
        return Err((reasons::REF_NOT_PERMITTED, why));
    }
    let Some(port) = r.port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) else {
        return Err((reasons::BACKEND_NOT_FOUND, "a Service reference needs a port".to_string()));
    };
    if !snapshot.services.contains_key(&service) {
        return Err((reasons::BACKEND_NOT_FOUND, format!("Service {service} not found")));
    }
    Ok(BackendId { namespace: service.namespace, service: service.name, port: ServicePort::Number(port) })
}

/// The path and conditions of a match, validated as the router will compile them.
fn match_parts(m: &HttpRouteMatch) -> Result<(PathMatch, Option<Box<RequestConditions>>), String> {
    let (type_, value) = match &m.path {
        None => ("PathPrefix", "/"),
        Some(p) => (p.type_.as_deref().unwrap_or("PathPrefix"), p.value.as_deref().unwrap_or("/")),
    };
    let path = match type_ {
        "Exact" | "PathPrefix" if !value.starts_with('/') => {
            return Err(format!("path {value:?} must start with /"));
        }
        "Exact" => PathMatch::Exact(value.to_string()),
        "PathPrefix" => {
            // "When specified, a trailing `/` is ignored."
            let trimmed = value.trim_end_matches('/');
            PathMatch::Prefix(if trimmed.is_empty() { "/".to_string() } else { trimmed.to_string() })
        }
        "RegularExpression" => {
            // The whole path must match (the router anchors the start).
            let pattern = format!("(?:{value})$");
            weir_dataplane::route::router::compile_path_regex(&pattern)
                .map_err(|e| format!("path regular expression {value:?} is invalid: {e}"))?;
            PathMatch::Regex(pattern)
        }
        other => return Err(format!("path type {other:?} is not supported")),
    };
    let value_match = |kind: &str, t: Option<&str>, name: &str, value: &str| -> Result<ValueMatch, String> {
        let value = match t.unwrap_or("Exact") {
            "Exact" => StringMatch::Exact(value.to_string()),
            "RegularExpression" => StringMatch::Regex(value.to_string()),
            other => return Err(format!("{kind} match type {other:?} is not supported")),
        };
        Ok(ValueMatch { name: name.to_string(), value })
    };
    let mut conditions = RequestConditions { method: m.method.clone(), ..RequestConditions::default() };
    for h in &m.headers {
        conditions.headers.push(value_match("header", h.type_.as_deref(), &h.name, &h.value)?);
    }
    for q in &m.query_params {
        conditions.query.push(value_match("query parameter", q.type_.as_deref(), &q.name, &q.value)?);
    }
    if conditions == RequestConditions::default() {
        return Ok((path, None));
    }
    weir_dataplane::route::conditions::CompiledConditions::compile(&conditions).map_err(|e| e.to_string())?;
    Ok((path, Some(Box::new(conditions))))
}

/// Puts the built routes into the table's virtual hosts, beside the Ingresses' (see the module
/// documentation for who wins a tie).
fn merge<O: Ord>(
    table: &mut weir_dataplane::model::RouteTable,
    built: Vec<Plain<O>>,
    warnings: &mut Warnings,
) {
    if built.is_empty() {
        return;
    }
    let by_host = by_host(built);
    let ingress_wildcards = ingress_wildcards(table, &by_host);
    for (host, routes) in by_host.into_iter().chain(ingress_wildcards) {
        match table.hosts.iter_mut().find(|vh| vh.host == host) {
            None => table.hosts.push(VirtualHost { host, routes, fallback: Vec::new() }),
            Some(vh) => {
                let ingress_paths: BTreeMap<PathMatch, ObjectRef> = vh
                    .routes
                    .iter()
                    .filter(|r| r.conditions.is_none())
                    .map(|r| (r.path.clone(), r.origin.clone()))
                    .collect();
                for r in routes.iter().filter(|r| specificity(r) == (false, 0, 0)) {
                    if let Some(ingress) = ingress_paths.get(&r.path) {
                        warnings.warn_on(
                            ObjectKind::HttpRoute,
                            &r.origin,
                            Reason::ConflictLost,
                            format!(
                                "host {} path {}: Ingress {ingress} serves it; an HTTPRoute match without method, header or query conditions does not take over a path an Ingress has",
                                host, describe(&r.path)
                            ),
                        );
                    }
                }
                vh.routes.extend(routes);
                // Stable: at one path, conditions first (more specific), then the Ingress's
                // route, then the HTTPRoutes' in their precedence order.
                vh.routes.sort_by(|a, b| {
                    (crate::translate::routes::route_order(&a.path), Reverse(specificity(a)))
                        .cmp(&(crate::translate::routes::route_order(&b.path), Reverse(specificity(b))))
                });
            }
        }
    }
    table.hosts.sort_by(|a, b| a.host.cmp(&b.host));
}

/// An Ingress wildcard `*.suffix` answers one-label names before a Gateway API route's
/// `**.suffix`: each such Ingress host of `table` with the routes of `by_host`'s `**.suffix`,
/// which it gets too (HTTPRoutes and GRPCRoutes alike).
pub(super) fn ingress_wildcards(
    table: &weir_dataplane::model::RouteTable,
    by_host: &BTreeMap<HostMatch, Vec<Route>>,
) -> Vec<(HostMatch, Vec<Route>)> {
    by_host
        .iter()
        .filter_map(|(host, routes)| match host {
            HostMatch::Suffix(s) => {
                let w = HostMatch::Wildcard(s.clone());
                table.hosts.iter().any(|vh| vh.host == w).then(|| (w, routes.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Method match, header and query parameter counts of a route's conditions.
fn specificity(r: &Route) -> (bool, usize, usize) {
    r.conditions.as_deref().map_or((false, 0, 0), |c| (c.method.is_some(), c.headers.len(), c.query.len()))
}

fn describe(path: &PathMatch) -> String {
    match path {
        PathMatch::Exact(p) => format!("{p} (Exact)"),
        PathMatch::Prefix(p) => format!("{p} (PathPrefix)"),
        PathMatch::Regex(p) => format!("{p} (RegularExpression)"),
    }
}
