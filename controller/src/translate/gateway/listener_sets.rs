//! ListenerSets (pure): listeners other objects add to a Gateway of ours (GEP-1713,
//! `apis/v1/listenerset_types.go`, standard channel since v1.5).
//!
//! A Gateway takes the listeners of the ListenerSets whose `parentRef` names it when its
//! `spec.allowedListeners.namespaces.from` admits their namespace (`None`, the default: none;
//! `Same`; `All`; `Selector` on the Namespace's labels). Each listener is resolved by the same
//! code as the Gateway's own ([`listeners::listener_out`]): ports, protocols, hostnames, TLS
//! certificates (relative to the ListenerSet's namespace, ReferenceGrants `from` a
//! ListenerSet), `allowedRoutes` (`Same`: the ListenerSet's namespace). They are appended to the
//! Gateway's list, which the rest of translation (attachment, routes, TLS, isolation, the
//! conflicts across Gateways) reads as one list, in the order `ListenerSetSpec.listeners`
//! gives: "1. "parent" Gateway 2. ListenerSet ordered by creation time (oldest first)
//! 3. ListenerSet ordered alphabetically by "{namespace}/{name}"".
//!
//! Conflicts ("the first Listener in the precedence list MUST be accepted … conflicting
//! listeners MUST have a `Conflicted` condition set to `True`"): a ListenerSet's listener on a
//! port an earlier listener uses with another protocol (HTTP, HTTPS or TLS, which share a
//! socket told apart by SNI, or any other protocol: `TCP` on port 80 conflicts with `HTTP`
//! there before it is found unsupported) is `ProtocolConflict`; one on the socket and hostname
//! of an earlier listener is `HostnameConflict`. Such a listener is `Accepted: False`,
//! `Programmed: False` and `Conflicted: True`, all with that reason (the conformance tests
//! `ListenerSetHostnameConflict`, `ListenerSetProtocolConflict`), and serves nothing; the
//! earlier one is untouched. Within one ListenerSet two listeners on one socket and hostname
//! are both conflicted, as within a Gateway.
//!
//! A ListenerSet whose Gateway is not ours, or does not exist, is left alone (no status: it is
//! not weir's to judge). Routes attach to a ListenerSet's listeners only through a `parentRef`
//! of kind `ListenerSet` (GEP-1713, "Gateway Parents and sectionName": a route attached to the
//! Gateway "MUST NOT attach to any listeners in the child `ListenerSets`"), in `attach`.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use weir_dataplane::model::ObjectRef;

use super::GatewayConfig;
use super::conditions::{Cond, reasons, types};
use super::isolation::Socket;
use super::listeners::{self, ClassOut, GatewayOut, ListenerOut, Namespaces};
use super::refs::Grants;
use crate::gateway::{Gateway, ListenerSet};
use crate::node::lb::pool::Selector;
use crate::snapshot::Snapshot;
use crate::translate::warnings::{ObjectKind, Reason, Warnings};

/// A ListenerSet whose `parentRef` names a Gateway of ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerSetOut {
    /// Its namespace/name.
    pub key: ObjectRef,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The Gateway it names.
    pub gateway: ObjectRef,
    /// Whether its listeners joined the Gateway's (allowed, and the Gateway's class accepted).
    pub attached: bool,
    /// `Accepted`, `Programmed`.
    pub conditions: Vec<Cond>,
}

impl ListenerSetOut {
    /// Whether it is `Accepted` (counted in the Gateway's `attachedListenerSets`).
    pub fn accepted(&self) -> bool {
        self.conditions.iter().any(|c| c.type_ == types::ACCEPTED && c.status)
    }
}

/// Appends the listeners of the ListenerSets each Gateway of `gateways` allows to its list,
/// marking those that conflict with an earlier listener; returns every ListenerSet naming a
/// Gateway of ours (its conditions are made by [`conclude`], once the conflicts across
/// Gateways are known).
pub fn merge(
    snapshot: &Snapshot,
    config: &GatewayConfig,
    classes: &BTreeMap<String, ClassOut>,
    gateways: &mut BTreeMap<ObjectRef, GatewayOut>,
    grants: &Grants<'_>,
) -> BTreeMap<ObjectRef, ListenerSetOut> {
    let mut out = BTreeMap::new();
    if snapshot.listener_sets.is_empty() {
        return out;
    }
    // `ListenerSetSpec.listeners`: oldest first, then "{namespace}/{name}".
    let mut order: Vec<(bool, Option<Timestamp>, ObjectRef)> = snapshot
        .listener_sets
        .iter()
        .map(|(k, s)| {
            let created = s.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (created.is_none(), created, k.clone())
        })
        .collect();
    order.sort();
    // Per Gateway, the ports taken so far and by which protocol family.
    let mut ports: BTreeMap<ObjectRef, Vec<(i32, &str)>> = BTreeMap::new();
    for (_, _, key) in order {
        let Some(set) = snapshot.listener_sets.get(&key) else { continue };
        let Some(parent) = parent_of(&key, set) else { continue };
        let Some(spec) = snapshot.gateways.get(&parent) else { continue };
        let mut set_out = ListenerSetOut {
            key: key.clone(),
            generation: set.metadata.generation,
            gateway: parent.clone(),
            attached: false,
            conditions: Vec::new(),
        };
        let Some(gateway) = gateways.get_mut(&parent) else {
            // A Gateway of a class of ours that is not accepted: ours to report on.
            if classes.contains_key(&spec.spec.gateway_class_name) {
                let why =
                    format!("the class {} of Gateway {parent} is not accepted", spec.spec.gateway_class_name);
                set_out.conditions = refused(reasons::PARENT_NOT_ACCEPTED, why);
                out.insert(key, set_out);
            }
            continue;
        };
        if let Err(why) = allowed(spec, &parent, &key.namespace, snapshot) {
            set_out.conditions = refused(reasons::NOT_ALLOWED, why);
            out.insert(key, set_out);
            continue;
        }
        // `ListenerSetReasonParentNotAccepted`: "the parent Gateway is not accepted" (none of
        // its own listeners can be served).
        if !gateway.conditions.iter().any(|c| c.type_ == types::ACCEPTED && c.status) {
            let why = format!("Gateway {parent} is not accepted (see its conditions)");
            set_out.conditions = refused(reasons::PARENT_NOT_ACCEPTED, why);
            out.insert(key, set_out);
            continue;
        }
        set_out.attached = true;
        let frontend = spec.spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
        let mut added: Vec<ListenerOut> = set
            .spec
            .listeners
            .iter()
            .map(|l| listeners::listener_out((&parent, Some(&key)), l, frontend, snapshot, config, grants))
            .collect();
        listeners::mark_conflicts(&mut added);
        let taken = ports
            .entry(parent.clone())
            .or_insert_with(|| spec.spec.listeners.iter().map(|l| (l.port, family(&l.protocol))).collect());
        for (l, spec_l) in added.iter_mut().zip(&set.spec.listeners) {
            let family = family(&spec_l.protocol);
            if let Some((port, other)) = taken.iter().find(|(p, f)| *p == l.port && *f != family) {
                let why = format!(
                    "port {port} already serves {other} listeners of Gateway {parent} or of an earlier ListenerSet"
                );
                refuse(l, reasons::PROTOCOL_CONFLICT, why);
                continue;
            }
            if let Some(socket) = l.protocol.as_ref().map(Socket::of) {
                let earlier = gateway.listeners.iter().find(|e| {
                    e.protocol.as_ref().map(Socket::of) == Some(socket)
                        && e.hostname == l.hostname
                        && e.conditions.iter().any(|c| c.type_ == types::ACCEPTED && c.status)
                });
                if earlier.is_some() {
                    let why = format!(
                        "an earlier listener of Gateway {parent} (its own or an older ListenerSet's) serves {} on the same port",
                        l.hostname.as_ref().map_or("every hostname".to_string(), |h| format!("hostname {h}"))
                    );
                    refuse(l, reasons::HOSTNAME_CONFLICT, why);
                    continue;
                }
            }
            taken.push((l.port, family));
        }
        gateway.listeners.extend(added);
        out.insert(key, set_out);
    }
    out
}

/// Makes the conditions of the attached ListenerSets from their listeners (after the conflicts
/// across Gateways, `super::conflicts`); returns `attachedListenerSets` of every Gateway that
/// allows ListenerSets.
pub fn conclude(
    sets: &mut BTreeMap<ObjectRef, ListenerSetOut>,
    gateways: &BTreeMap<ObjectRef, GatewayOut>,
    snapshot: &Snapshot,
) -> BTreeMap<ObjectRef, i32> {
    for set in sets.values_mut().filter(|s| s.attached) {
        let listeners: Vec<&ListenerOut> = gateways
            .get(&set.gateway)
            .map(|g| g.listeners.iter().filter(|l| l.set.as_ref() == Some(&set.key)).collect())
            .unwrap_or_default();
        set.conditions = set_conditions(&listeners);
    }
    let mut counts = BTreeMap::new();
    for key in gateways.keys() {
        let allows = snapshot
            .gateways
            .get(key)
            .and_then(|g| g.spec.allowed_listeners.as_ref())
            .and_then(|a| a.namespaces.as_ref())
            .and_then(|n| n.from.as_deref())
            .is_some_and(|from| from != "None");
        if allows {
            counts.insert(key.clone(), 0);
        }
    }
    for set in sets.values().filter(|s| s.attached && s.accepted()) {
        *counts.entry(set.gateway.clone()).or_default() += 1;
    }
    counts
}

/// Reports the ListenerSets whose listeners are not added to their Gateway (`weir check`; the
/// status writer reports the same condition). Their listeners' problems are reported with the
/// Gateway's (`super::tls`).
pub(crate) fn warn(sets: &BTreeMap<ObjectRef, ListenerSetOut>, warnings: &mut Warnings) {
    for set in sets.values().filter(|s| !s.attached) {
        if let Some(c) = set.conditions.iter().find(|c| c.type_ == types::ACCEPTED) {
            warnings.error_on(
                ObjectKind::ListenerSet,
                &set.key,
                Reason::ListenerSetNotAttached,
                format!("not attached to Gateway {} ({}): {}", set.gateway, c.reason, c.message),
            );
        }
    }
}

/// `Accepted` and `Programmed` of an attached ListenerSet: accepted when at least one of its
/// listeners is served (`ListenersNotValid` when some are not), as the conformance tests
/// (`ListenerSetHostnameConflict`) expect.
fn set_conditions(listeners: &[&ListenerOut]) -> Vec<Cond> {
    listeners::served_conditions(listeners, reasons::LISTENERS_NOT_VALID)
}

/// The Gateway a ListenerSet names, when it names one (`ParentGatewayReference`: group
/// `gateway.networking.k8s.io` and kind `Gateway` by default, its own namespace by default).
fn parent_of(key: &ObjectRef, set: &ListenerSet) -> Option<ObjectRef> {
    let p = &set.spec.parent_ref;
    let group = p.group.as_deref().unwrap_or(crate::gateway::GROUP);
    let kind = p.kind.as_deref().unwrap_or("Gateway");
    (group == crate::gateway::GROUP && kind == "Gateway")
        .then(|| ObjectRef::new(p.namespace.as_deref().unwrap_or(&key.namespace), &p.name))
}

/// Whether `gateway` (`spec.allowedListeners`) takes ListenerSets from `namespace`; else why
/// not.
fn allowed(gateway: &Gateway, key: &ObjectRef, namespace: &str, snapshot: &Snapshot) -> Result<(), String> {
    let ns = gateway.spec.allowed_listeners.as_ref().and_then(|a| a.namespaces.as_ref());
    let namespaces = match ns.and_then(|n| n.from.as_deref()).unwrap_or("None") {
        "None" => {
            return Err(format!(
                "Gateway {key} takes no ListenerSets (its spec.allowedListeners.namespaces.from is None, the default)"
            ));
        }
        "Same" => Namespaces::Same,
        "All" => Namespaces::All,
        "Selector" => {
            let selector = ns.and_then(|n| n.selector.as_ref()).ok_or_else(|| {
                format!(
                    "Gateway {key}: allowedListeners.namespaces.from Selector without a selector takes none"
                )
            })?;
            Namespaces::Selector(
                Selector::parse(selector)
                    .map_err(|e| format!("Gateway {key}: allowedListeners.namespaces.selector: {e}"))?,
            )
        }
        other => {
            return Err(format!("Gateway {key}: allowedListeners.namespaces.from {other:?} is not known"));
        }
    };
    if namespaces.allows(namespace, &key.namespace, snapshot) {
        Ok(())
    } else {
        Err(format!(
            "Gateway {key} does not take ListenerSets from namespace {namespace} (spec.allowedListeners)"
        ))
    }
}

/// `Accepted` and `Programmed` false with `reason`.
fn refused(reason: &'static str, why: String) -> Vec<Cond> {
    vec![Cond::no(types::ACCEPTED, reason, why.clone()), Cond::no(types::PROGRAMMED, reason, why)]
}

/// A listener conflicting with an earlier one: not served, `Accepted`, `Programmed` false and
/// `Conflicted` true, all with `reason`.
fn refuse(l: &mut ListenerOut, reason: &'static str, why: String) {
    l.ready = false;
    l.conditions.retain(|c| ![types::ACCEPTED, types::PROGRAMMED, types::CONFLICTED].contains(&c.type_));
    l.conditions.insert(0, Cond::no(types::ACCEPTED, reason, why.clone()));
    l.conditions.insert(1, Cond::no(types::PROGRAMMED, reason, "conflicted (see Conflicted)"));
    l.conditions.push(Cond::yes(types::CONFLICTED, reason, why));
}

/// The protocols that may share a port: `HTTPS` and `TLS` (one socket, told apart by SNI);
/// every other protocol only with itself.
fn family(protocol: &str) -> &str {
    match protocol {
        "HTTPS" | "TLS" => "HTTPS or TLS",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::translate::gateway::{GatewayAttachments, RouteKind, attach_all};

    const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: weir}\nspec: {controllerName: weir.dev/gateway-controller}\n---\n";

    fn run(yaml: &str) -> GatewayAttachments {
        let text = format!("{CLASS}{yaml}");
        let snapshot: Snapshot =
            crate::source::manifest::parse_manifests(&text).unwrap().into_iter().collect();
        attach_all(&snapshot, &GatewayConfig::default())
    }

    /// A Gateway `infra/edge` with one HTTP listener for `gw.example.com` and `allowed` as its
    /// `spec.allowedListeners` (empty: none given).
    fn gateway(allowed: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: infra, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\n\
             spec:\n  gatewayClassName: weir\n{allowed}  listeners:\n  - {{name: http, port: 80, protocol: HTTP, hostname: gw.example.com}}\n---\n"
        )
    }

    fn set(namespace: &str, name: &str, created: &str, listeners: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{name: {name}, namespace: {namespace}, creationTimestamp: \"{created}\"}}\n\
             spec:\n  parentRef: {{name: edge, namespace: infra}}\n  listeners:\n{listeners}---\n"
        )
    }

    fn namespace(name: &str, labels: &str) -> String {
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}, labels: {{{labels}}}}}\n---\n")
    }

    const APP: &str = "  - {name: app, port: 80, protocol: HTTP, hostname: app.example.com}\n";

    fn reason(conds: &[Cond], type_: &str) -> (bool, &'static str) {
        let c = conds.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_} in {conds:?}"));
        (c.status, c.reason)
    }

    fn set_out<'a>(a: &'a GatewayAttachments, ns: &str, name: &str) -> &'a ListenerSetOut {
        &a.listener_sets[&ObjectRef::new(ns, name)]
    }

    /// The listeners of ListenerSet `ns/name` in the Gateway's list: (name, ready, Accepted
    /// reason, Conflicted reason or `-`).
    fn merged(
        a: &GatewayAttachments,
        ns: &str,
        name: &str,
    ) -> Vec<(String, bool, &'static str, &'static str)> {
        let key = ObjectRef::new(ns, name);
        a.gateways[&ObjectRef::new("infra", "edge")]
            .listeners
            .iter()
            .filter(|l| l.set.as_ref() == Some(&key))
            .map(|l| {
                let conflicted = reason(&l.conditions, types::CONFLICTED);
                (
                    l.name.clone(),
                    l.ready,
                    reason(&l.conditions, types::ACCEPTED).1,
                    if conflicted.0 { conflicted.1 } else { "-" },
                )
            })
            .collect()
    }

    /// `AllowedListeners.namespaces.from`: `None` (the default) takes no ListenerSet
    /// (`ListenerSetReasonNotAllowed`, conformance `ListenerSetDefaultNotAllowed`,
    /// `ListenerSetAllowedNamespaceNone`), `Same` the Gateway's namespace only, `All` any,
    /// `Selector` those whose Namespace's labels match. A refused ListenerSet adds no listener.
    #[test]
    fn listenerset_allowed_listeners_namespaces_from() {
        let sets = format!(
            "{}{}{}{}",
            set("infra", "own", "2024-02-01T00:00:00Z", APP),
            set(
                "apps",
                "team",
                "2024-02-01T00:00:00Z",
                "  - {name: app, port: 80, protocol: HTTP, hostname: team.example.com}\n"
            ),
            namespace("apps", "team: yes"),
            namespace("infra", "")
        );
        let outcome = |allowed: &str| {
            let a = run(&format!("{}{sets}", gateway(allowed)));
            let own = set_out(&a, "infra", "own");
            let team = set_out(&a, "apps", "team");
            let listeners = a.gateways[&ObjectRef::new("infra", "edge")].listeners.len();
            (
                reason(&own.conditions, types::ACCEPTED),
                reason(&team.conditions, types::ACCEPTED),
                listeners,
                a.attached_listener_sets.get(&ObjectRef::new("infra", "edge")).copied(),
            )
        };
        let not_allowed = (false, reasons::NOT_ALLOWED);
        let accepted = (true, reasons::ACCEPTED);
        assert_eq!(outcome(""), (not_allowed, not_allowed, 1, None));
        assert_eq!(
            outcome("  allowedListeners: {namespaces: {from: None}}\n"),
            (not_allowed, not_allowed, 1, None)
        );
        assert_eq!(
            outcome("  allowedListeners: {namespaces: {from: Same}}\n"),
            (accepted, not_allowed, 2, Some(1))
        );
        assert_eq!(
            outcome("  allowedListeners: {namespaces: {from: All}}\n"),
            (accepted, accepted, 3, Some(2))
        );
        assert_eq!(
            outcome(
                "  allowedListeners: {namespaces: {from: Selector, selector: {matchLabels: {team: \"yes\"}}}}\n"
            ),
            (not_allowed, accepted, 2, Some(1))
        );
        // A refused ListenerSet's Programmed says the same.
        let a = run(&format!("{}{sets}", gateway("")));
        assert_eq!(reason(&set_out(&a, "apps", "team").conditions, types::PROGRAMMED), not_allowed);
    }

    /// `ListenerSetSpec.listeners` precedence: the Gateway's listeners, then ListenerSets oldest
    /// first, then by "{namespace}/{name}"; the first listener for a socket and hostname keeps
    /// it, a later one is `Accepted: False, HostnameConflict` and `Conflicted` (conformance
    /// `ListenerSetHostnameConflict`). A ListenerSet with one valid listener stays accepted
    /// (`ListenersNotValid`), one with none is not.
    #[test]
    fn listenerset_hostname_conflict_follows_precedence() {
        let clash_gw = "  - {name: clash, port: 80, protocol: HTTP, hostname: gw.example.com}\n";
        let a = run(&format!(
            "{}{}{}{}{}",
            gateway("  allowedListeners: {namespaces: {from: All}}\n"),
            // Same creation time as b/one: a/one comes first by namespace.
            set("b", "one", "2024-02-01T00:00:00Z", APP),
            set("a", "one", "2024-02-01T00:00:00Z", &format!("{APP}{clash_gw}")),
            // Older than both: its app is kept.
            set(
                "z",
                "old",
                "2024-01-15T00:00:00Z",
                "  - {name: mine, port: 80, protocol: HTTP, hostname: old.example.com}\n"
            ),
            set("c", "late", "2024-03-01T00:00:00Z", clash_gw),
        ));
        assert_eq!(merged(&a, "z", "old"), [("mine".into(), true, reasons::ACCEPTED, "-")]);
        assert_eq!(
            merged(&a, "a", "one"),
            [
                ("app".into(), true, reasons::ACCEPTED, "-"),
                ("clash".into(), false, reasons::HOSTNAME_CONFLICT, reasons::HOSTNAME_CONFLICT)
            ]
        );
        assert_eq!(
            merged(&a, "b", "one"),
            [("app".into(), false, reasons::HOSTNAME_CONFLICT, reasons::HOSTNAME_CONFLICT)]
        );
        // The Gateway's own listener is untouched.
        let gw = &a.gateways[&ObjectRef::new("infra", "edge")];
        assert!(gw.listeners[0].ready);
        assert_eq!(reason(&gw.conditions, types::ACCEPTED), (true, reasons::ACCEPTED));
        assert_eq!(
            reason(&set_out(&a, "a", "one").conditions, types::ACCEPTED),
            (true, reasons::LISTENERS_NOT_VALID)
        );
        assert_eq!(
            reason(&set_out(&a, "a", "one").conditions, types::PROGRAMMED),
            (true, reasons::PROGRAMMED)
        );
        assert_eq!(
            reason(&set_out(&a, "b", "one").conditions, types::ACCEPTED),
            (false, reasons::LISTENERS_NOT_VALID)
        );
        assert_eq!(
            reason(&set_out(&a, "b", "one").conditions, types::PROGRAMMED),
            (false, reasons::LISTENERS_NOT_VALID)
        );
        // `attachedListenerSets`: the accepted ones (z/old, a/one).
        assert_eq!(a.attached_listener_sets[&ObjectRef::new("infra", "edge")], 2);
    }

    /// `ListenerEntryReasonProtocolConflict` (conformance `ListenerSetProtocolConflict`): a
    /// `TCP` listener on port 80, where the Gateway serves `HTTP`, is conflicted before it is
    /// found unsupported; `HTTPS` and `TLS` share port 443.
    #[test]
    fn listenerset_protocol_conflict() {
        let a = run(&format!(
            "{}{}",
            gateway("  allowedListeners: {namespaces: {from: Same}}\n"),
            set(
                "infra",
                "mixed",
                "2024-02-01T00:00:00Z",
                "  - {name: raw, port: 80, protocol: TCP}\n  - {name: pass, port: 443, protocol: TLS, hostname: t.example.com, tls: {mode: Passthrough}}\n"
            ),
        ));
        assert_eq!(
            merged(&a, "infra", "mixed"),
            [
                ("raw".into(), false, reasons::PROTOCOL_CONFLICT, reasons::PROTOCOL_CONFLICT),
                ("pass".into(), true, reasons::ACCEPTED, "-")
            ]
        );
    }

    /// Route attachment (GEP-1713 "Gateway Parents and sectionName"): a `parentRef` of kind
    /// ListenerSet reaches its listeners (all, or the one its `sectionName` names), a Gateway
    /// parent only the Gateway's own; `allowedRoutes: Same` is the ListenerSet's namespace. A
    /// `sectionName` the ListenerSet has not is `NoMatchingParent` for that parent only
    /// (conformance `ListenerSetGatewayParentSectionNameNotFound`,
    /// `ListenerSetDualParentRefIndependence`).
    #[test]
    fn listenerset_route_parent_refs() {
        let route = |ns: &str, name: &str, parents: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec:\n  parentRefs: {parents}\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n---\n"
            )
        };
        let a = run(&format!(
            "{}{}{}{}{}{}",
            gateway("  allowedListeners: {namespaces: {from: All}}\n"),
            set("apps", "team", "2024-02-01T00:00:00Z", APP),
            route("apps", "via-set", "[{kind: ListenerSet, name: team}]"),
            route(
                "infra",
                "via-gateway",
                "[{name: edge, sectionName: app}, {name: edge, sectionName: http}]"
            ),
            route("infra", "from-infra", "[{kind: ListenerSet, name: team, namespace: apps}]"),
            route("apps", "wrong-section", "[{kind: ListenerSet, name: team, sectionName: nope}]"),
        ));
        let parents = |ns: &str, name: &str| {
            a.routes[&(RouteKind::Http, ObjectRef::new(ns, name))]
                .iter()
                .map(|p| {
                    (
                        p.accepted.status,
                        p.accepted.reason,
                        p.attached.iter().map(|x| x.listener).collect::<Vec<_>>(),
                    )
                })
                .collect::<Vec<_>>()
        };
        // Listener 0 is the Gateway's http, 1 team's app.
        assert_eq!(parents("apps", "via-set"), [(true, reasons::ACCEPTED, vec![1])]);
        assert_eq!(
            parents("infra", "via-gateway"),
            [(false, reasons::NO_MATCHING_PARENT, vec![]), (true, reasons::ACCEPTED, vec![0])]
        );
        assert_eq!(parents("infra", "from-infra"), [(false, reasons::NOT_ALLOWED_BY_LISTENERS, vec![])]);
        assert_eq!(parents("apps", "wrong-section"), [(false, reasons::NO_MATCHING_PARENT, vec![])]);
        let edge = ObjectRef::new("infra", "edge");
        assert_eq!(a.attached_routes.get(&(edge.clone(), 1)), Some(&1));
        assert_eq!(a.attached_routes.get(&(edge, 0)), Some(&1));
    }

    /// Whose ListenerSets are ours: one naming a Gateway of another controller, or a Gateway
    /// that does not exist, is left alone (no status); one naming a Gateway of a class of ours
    /// that is not accepted is `ParentNotAccepted`.
    #[test]
    fn listenerset_parent_not_ours_or_not_accepted() {
        let other = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: other}\nspec: {controllerName: example.com/else}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: params}\n\
             spec: {controllerName: weir.dev/gateway-controller, parametersRef: {group: example.com, kind: Config, name: x}}\n---\n";
        let gw = |name: &str, class: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: infra}}\n\
                 spec:\n  gatewayClassName: {class}\n  allowedListeners: {{namespaces: {{from: All}}}}\n  listeners:\n  - {{name: http, port: 80, protocol: HTTP}}\n---\n"
            )
        };
        let named = |name: &str, parent: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{name: {name}, namespace: apps}}\n\
                 spec:\n  parentRef: {{name: {parent}, namespace: infra}}\n  listeners:\n{APP}---\n"
            )
        };
        let a = run(&format!(
            "{other}{}{}{}{}{}",
            gw("theirs", "other"),
            gw("unaccepted", "params"),
            named("to-theirs", "theirs"),
            named("to-missing", "missing"),
            named("to-unaccepted", "unaccepted"),
        ));
        assert_eq!(a.listener_sets.keys().collect::<Vec<_>>(), [&ObjectRef::new("apps", "to-unaccepted")]);
        let s = set_out(&a, "apps", "to-unaccepted");
        assert!(!s.attached);
        assert_eq!(reason(&s.conditions, types::ACCEPTED), (false, reasons::PARENT_NOT_ACCEPTED));
    }

    /// `ListenerSetReasonParentNotAccepted` for a Gateway of ours that is not accepted: none of
    /// its own listeners can be served (here an unsupported protocol); the ListenerSet adds
    /// nothing.
    #[test]
    fn listenerset_parent_gateway_not_accepted() {
        let a = run(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: infra}}\n\
             spec:\n  gatewayClassName: weir\n  allowedListeners: {{namespaces: {{from: All}}}}\n  listeners:\n  - {{name: raw, port: 9000, protocol: TCP}}\n---\n{}",
            set("apps", "team", "2024-02-01T00:00:00Z", APP)
        ));
        let s = set_out(&a, "apps", "team");
        assert!(!s.attached);
        assert_eq!(reason(&s.conditions, types::ACCEPTED), (false, reasons::PARENT_NOT_ACCEPTED));
        assert_eq!(reason(&s.conditions, types::PROGRAMMED), (false, reasons::PARENT_NOT_ACCEPTED));
        assert_eq!(a.gateways[&ObjectRef::new("infra", "edge")].listeners.len(), 1);
        assert_eq!(a.attached_listener_sets[&ObjectRef::new("infra", "edge")], 0);
    }
}
