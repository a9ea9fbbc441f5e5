//! Routes to listeners: `parentRefs`, `allowedRoutes` and hostnames (pure).
//!
//! For each parent of a route that is a Gateway of ours, or a ListenerSet attached to one, the
//! listeners it names (`ParentReference.sectionName`, `port`; none: every listener) are tried:
//! of the Gateway its own `spec.listeners` only, of the ListenerSet its own (GEP-1713, "Gateway
//! Parents and sectionName": a route attached to the Gateway "MUST NOT attach to any listeners
//! in the child `ListenerSets`"). The route attaches to those whose `allowedRoutes` admit its
//! kind and namespace (`Same`: the namespace of the Gateway, or of the ListenerSet) and whose
//! hostname intersects its hostnames. The outcome is the route's `Accepted` condition for that
//! parent, and the listeners' `attachedRoutes`.

use std::collections::BTreeMap;

use weir_dataplane::model::ObjectRef;

use super::conditions::{Cond, reasons, types};
use super::hostname::{self, Hostname};
use super::listener_sets::ListenerSetOut;
use super::listeners::GatewayOut;
use crate::gateway::ParentReference;
use crate::snapshot::Snapshot;

/// The parts of a route (HTTPRoute, GRPCRoute, TLSRoute) attachment reads.
#[derive(Clone, Copy, Debug)]
pub struct RouteParts<'a> {
    /// `HTTPRoute`, `GRPCRoute` or `TLSRoute`.
    pub kind: &'static str,
    /// Its namespace/name.
    pub key: &'a ObjectRef,
    /// `spec.parentRefs`.
    pub parent_refs: &'a [ParentReference],
    /// `spec.hostnames`.
    pub hostnames: &'a [String],
}

/// A listener a route attached to, and the host names it serves there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// The Gateway.
    pub gateway: ObjectRef,
    /// The listener's index in the Gateway's spec.
    pub listener: usize,
    /// The host names served on it; `None`: any.
    pub hostnames: Option<Vec<Hostname>>,
}

/// A route's outcome for one of its parents that is ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentOut {
    /// The parent as the route names it.
    pub parent_ref: ParentReference,
    /// `Accepted`.
    pub accepted: Cond,
    /// Where it attached (empty when not accepted).
    pub attached: Vec<Attachment>,
}

/// Attaches `route` to the Gateways (and ListenerSets) of ours it names; counts
/// `attachedRoutes` on `gateways`. Parents that are not ours are left out (their controllers
/// report on them).
pub fn attach(
    route: RouteParts<'_>,
    (gateways, listener_sets): (&BTreeMap<ObjectRef, GatewayOut>, &BTreeMap<ObjectRef, ListenerSetOut>),
    attached_routes: &mut BTreeMap<(ObjectRef, usize), i32>,
    snapshot: &Snapshot,
) -> Vec<ParentOut> {
    let mut out = Vec::new();
    let mut names = Vec::new();
    let mut bad_names = Vec::new();
    for h in route.hostnames {
        match Hostname::parse(h) {
            Ok(h) => names.push(h),
            Err(e) => bad_names.push(e.to_string()),
        }
    }
    for parent in route.parent_refs {
        let group = parent.group.as_deref().unwrap_or(crate::gateway::GROUP);
        let kind = parent.kind.as_deref().unwrap_or("Gateway");
        if group != crate::gateway::GROUP {
            continue;
        }
        let named_key =
            ObjectRef::new(parent.namespace.as_deref().unwrap_or(&route.key.namespace), &parent.name);
        // The Gateway, and the ListenerSet when the parent is one.
        let (key, set) = match kind {
            "Gateway" => (named_key, None),
            "ListenerSet" => match listener_sets.get(&named_key) {
                Some(s) => (s.gateway.clone(), Some(s)),
                None => continue,
            },
            _ => continue,
        };
        let Some(gateway) = gateways.get(&key) else { continue };
        let parent_name = match set {
            Some(s) => format!("ListenerSet {}", s.key),
            None => format!("Gateway {key}"),
        };
        let mut parent_out =
            ParentOut { parent_ref: parent.clone(), accepted: accepted(), attached: Vec::new() };
        if !bad_names.is_empty() {
            parent_out.accepted = Cond::no(types::ACCEPTED, reasons::UNSUPPORTED_VALUE, bad_names.join("; "));
            out.push(parent_out);
            continue;
        }
        // Which listeners the reference names: the parent's own.
        let set_key = set.map(|s| &s.key);
        let named: Vec<usize> = (0..gateway.listeners.len())
            .filter(|&i| {
                let l = &gateway.listeners[i];
                l.set.as_ref() == set_key
                    && parent.section_name.as_deref().is_none_or(|s| s == l.name)
                    && parent.port.is_none_or(|p| p == l.port)
            })
            .collect();
        if named.is_empty() {
            parent_out.accepted = Cond::no(
                types::ACCEPTED,
                reasons::NO_MATCHING_PARENT,
                match (&parent.section_name, parent.port) {
                    _ if set.is_some_and(|s| !s.attached) => {
                        format!("{parent_name} is not attached to Gateway {key} (see its conditions)")
                    }
                    (Some(s), _) => format!("{parent_name} has no listener {s:?} (with that port)"),
                    (None, Some(p)) => format!("{parent_name} has no listener on port {p}"),
                    (None, None) => format!("{parent_name} has no listeners"),
                },
            );
            out.push(parent_out);
            continue;
        }
        let mut allowed_somewhere = false;
        for i in named {
            let l = &gateway.listeners[i];
            let kind_ok = l.kinds.iter().any(|k| k.kind == route.kind);
            if !l.ready || !kind_ok || !l.namespaces.allows(&route.key.namespace, l.home(&key), snapshot) {
                continue;
            }
            allowed_somewhere = true;
            match hostname::effective(l.hostname.as_ref(), &names) {
                Some(h) if h.is_empty() => {}
                hostnames => {
                    parent_out.attached.push(Attachment { gateway: key.clone(), listener: i, hostnames });
                    *attached_routes.entry((key.clone(), i)).or_default() += 1;
                }
            }
        }
        if parent_out.attached.is_empty() {
            parent_out.accepted = if allowed_somewhere {
                Cond::no(
                    types::ACCEPTED,
                    reasons::NO_MATCHING_LISTENER_HOSTNAME,
                    "no hostname of the route intersects the listeners' hostnames",
                )
            } else {
                Cond::no(
                    types::ACCEPTED,
                    reasons::NOT_ALLOWED_BY_LISTENERS,
                    format!(
                        "no listener of {parent_name} named by this parentRef admits {} from namespace {}",
                        route.kind, route.key.namespace
                    ),
                )
            };
        }
        out.push(parent_out);
    }
    out
}

fn accepted() -> Cond {
    Cond::yes(types::ACCEPTED, reasons::ACCEPTED, "attached")
}
