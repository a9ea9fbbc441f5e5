//! TLSRoutes into the table (pure): TLS connections passed through, undecrypted, by SNI, or
//! terminated and relayed as plain TCP.
//!
//! A TLSRoute attached to a `TLS` listener on the HTTPS socket adds a [`Passthrough`] entry
//! for each of its host names (`TLSRouteSpec.hostnames` intersected with the listener's
//! hostname, as for HTTPRoutes: an exact name, or `*.suffix` with any number of labels in
//! front). The HTTPS socket reads the ClientHello's SNI: on a `tls.mode: Passthrough` listener
//! the name is spliced to a backend undecrypted; on a `tls.mode: Terminate` listener
//! (TLSRouteModeTerminate, extended) weir terminates TLS with the listener's certificate (its
//! TLS entry, [`super::tls`]) and relays the decrypted bytes over plain TCP ([`Passthrough::
//! relay`]: "It is not valid to make any assumptions about the content of the traffic in this
//! case, it MUST be treated as _only_ TCP traffic", GEP-2643). Both modes share the socket,
//! told apart by SNI (TLSRouteModeMixed); any other name is terminated as HTTPS (Ingress TLS
//! and HTTPS listeners share the socket). The backends are the rule's `backendRefs`, chosen per
//! connection by `weight` (0 excluded); a reference that does not resolve keeps its share,
//! whose connections are refused, and makes the route's `ResolvedRefs` false
//! (`BackendNotFound`, `RefNotPermitted`, `InvalidKind`). SNI chooses: a route that would take
//! every name (no hostname on the route or the listener) is not served, and said so. On a name
//! an Ingress's `ssl-passthrough` already has, the Ingress keeps it (`ConflictLost`).
//!
//! A `Terminate` listener's own hostname is a relay entry too, without backends when no route
//! claims it: a connection for a name of the listener that no route serves is refused rather
//! than served as HTTPS. (The listener validates no client certificates: `Gateway.spec.tls.
//! frontend` applies to listeners serving HTTPS only, [`super::listeners`].)

use std::collections::{BTreeMap, BTreeSet};

use weir_dataplane::model::{HostMatch, ObjectRef, Passthrough, RouteTable, WeightedBackend};

use super::conditions::{Cond, reasons, types};
use super::hostname::Hostname;
use super::isolation::{host_match, strictly_covers};
use super::listeners::Protocol;
use super::refs::Grants;
use super::routes::service_port;
use super::{GatewayAttachments, RouteKind};
use crate::snapshot::Snapshot;
use crate::translate::backend::{self, Resolver};
use crate::translate::warnings::{ObjectKind, Reason, Warnings};

/// What the TLSRoutes resolved to, for the status writer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsRoutesOut {
    /// `ResolvedRefs` of each TLSRoute with a parent of ours.
    pub resolved_refs: BTreeMap<ObjectRef, Cond>,
}

/// Adds the passthrough entries (and backends) of every accepted TLSRoute to `table`.
pub(crate) fn apply(
    table: &mut RouteTable,
    attachments: &GatewayAttachments,
    snapshot: &Snapshot,
    resolver: &Resolver<'_>,
    warnings: &mut Warnings,
) -> TlsRoutesOut {
    let grants = Grants::new(snapshot);
    let mut out = TlsRoutesOut::default();
    for ((kind, key), parents) in &attachments.routes {
        if *kind != RouteKind::Tls {
            continue;
        }
        let Some(route) = snapshot.tls_routes.get(key) else { continue };
        for parent in parents.iter().filter(|p| !p.accepted.status) {
            warnings.error_on(
                ObjectKind::TlsRoute,
                key,
                Reason::RouteNotAccepted,
                format!(
                    "spec.parentRefs[{}]: not accepted ({}): {}",
                    parent.parent_ref.name, parent.accepted.reason, parent.accepted.message
                ),
            );
        }
        // Each name, and whether it is relayed (a `Terminate` listener's) or passed through.
        let mut hosts = BTreeSet::new();
        for a in parents.iter().filter(|p| p.accepted.status).flat_map(|p| &p.attached) {
            let listener = attachments.gateways.get(&a.gateway).and_then(|g| g.listeners.get(a.listener));
            let relay = listener.is_some_and(|l| matches!(l.protocol, Some(Protocol::TlsTerminate(_))));
            if relay
                && let Some(l) = listener
                && !serves_certificate(table, &a.gateway, &l.name)
            {
                warnings.error_on(
                    ObjectKind::TlsRoute,
                    key,
                    Reason::RouteNotAccepted,
                    format!("listener {}/{}: its certificate is not served (see the Gateway's warnings); its names are not relayed", a.gateway, l.name),
                );
                continue;
            }
            match &a.hostnames {
                Some(names) => hosts.extend(names.iter().map(|h| (host_match(Some(h)), relay))),
                None => warnings.error_on(
                    ObjectKind::TlsRoute,
                    key,
                    Reason::RouteNotAccepted,
                    "neither the route nor its listener names a hostname: a TLSRoute is chosen by SNI name, and taking every name is not supported; not served".to_string(),
                ),
            }
        }
        // `TLSRouteRule.backendRefs`; TLSRoute v1 has one rule.
        if route.spec.rules.len() > 1 {
            warnings.warn_on(
                ObjectKind::TlsRoute,
                key,
                Reason::UnsupportedFilter,
                format!("spec.rules: {} rules; only the first is served", route.spec.rules.len()),
            );
        }
        let mut refs: Option<Cond> = None;
        let mut split = Vec::new();
        for (bi, r) in
            route.spec.rules.first().map(|r| r.backend_refs.as_slice()).unwrap_or_default().iter().enumerate()
        {
            let field = format!("spec.rules[0].backendRefs[{bi}]");
            let weight = u32::try_from(r.weight.unwrap_or(1)).unwrap_or(0);
            let resolved = service_port(key, "TLSRoute", &grants, snapshot, r).and_then(|id| {
                if table.backends.contains_key(&id) {
                    return Ok(id);
                }
                let (backend, error) = resolver.resolve(&id);
                match error {
                    Some(
                        e @ (backend::Error::ServiceNotFound { .. } | backend::Error::PortNotFound { .. }),
                    ) => Err((reasons::BACKEND_NOT_FOUND, e.to_string())),
                    other => {
                        if let Some(e) = other {
                            warnings.error_on(ObjectKind::TlsRoute, key, e.reason(), format!("{field}: {e}"));
                        }
                        table.backends.insert(id.clone(), backend);
                        Ok(id)
                    }
                }
            });
            match resolved {
                Ok(id) => split.push(WeightedBackend { backend: Some(id), weight, request_headers: None }),
                Err((reason, why)) => {
                    warnings.error_on(
                        ObjectKind::TlsRoute,
                        key,
                        Reason::BackendNotResolved,
                        format!("{field}: {why}; its share of the connections is refused"),
                    );
                    refs.get_or_insert_with(|| {
                        Cond::no(types::RESOLVED_REFS, reason, format!("{field}: {why}"))
                    });
                    split.push(WeightedBackend { backend: None, weight, request_headers: None });
                }
            }
        }
        out.resolved_refs.insert(
            key.clone(),
            refs.unwrap_or_else(|| {
                Cond::yes(types::RESOLVED_REFS, reasons::RESOLVED_REFS, "every backend reference resolved")
            }),
        );
        let first = split.iter().find_map(|s| s.backend.clone());
        if first.is_none() && !hosts.is_empty() {
            // Its names keep their entries, without backend: their connections are refused
            // ("connections that would have been routed to" an invalid backend), never
            // terminated with another certificate instead.
            warnings.error_on(
                ObjectKind::TlsRoute,
                key,
                Reason::BackendNotResolved,
                "no backendRef resolves: the connections to its names are refused".to_string(),
            );
        }
        for (host, relay) in hosts {
            if let Some(other) = table.passthrough.iter().find(|p| p.host == host) {
                let to = other.backend.as_ref().map_or("another backend".to_string(), |b| b.to_string());
                warnings.warn_on(
                    ObjectKind::TlsRoute,
                    key,
                    Reason::ConflictLost,
                    format!(
                        "SNI {host} already goes to {to} (an Ingress's ssl-passthrough, or an older TLSRoute)"
                    ),
                );
                continue;
            }
            table.passthrough.push(Passthrough {
                host,
                backend: first.clone(),
                split: split.clone(),
                terminate: false,
                relay,
            });
        }
    }
    refuse_unrouted_names(table, attachments);
    exempt_https_names(table);
    table.passthrough.sort_by(|a, b| a.host.cmp(&b.host));
    out
}

/// Whether the TLS entry of the listener `name` of `gateway` is in `table` (not lost to an
/// Ingress's `spec.tls` on the same name, [`super::tls`]).
fn serves_certificate(table: &RouteTable, gateway: &ObjectRef, name: &str) -> bool {
    let listener = format!("{gateway}/{name}");
    table.tls.iter().any(|t| t.listener.as_deref() == Some(listener.as_str()))
}

/// A `Terminate` listener's hostname that no route serves (a name under it no route claims, or
/// its routes' backends gone) refuses its connections: a relay entry without backends, which
/// the routes' more specific names come before in the SNI lookup.
fn refuse_unrouted_names(table: &mut RouteTable, attachments: &GatewayAttachments) {
    let mut refused = Vec::new();
    for (key, gateway) in &attachments.gateways {
        for l in gateway.listeners.iter().filter(|l| l.ready) {
            let Some(Protocol::TlsTerminate(_)) = l.protocol else { continue };
            let Some(name) = &l.hostname else { continue };
            let host = host_match(Some(name));
            if !serves_certificate(table, key, &l.name)
                || table.passthrough.iter().chain(&refused).any(|p: &Passthrough| p.host == host)
            {
                continue;
            }
            refused.push(Passthrough {
                host,
                backend: None,
                split: Vec::new(),
                terminate: false,
                relay: true,
            });
        }
    }
    table.passthrough.extend(refused);
}

/// Listener isolation on the HTTPS socket: a name with a certificate of its own under a TLS
/// listener's wildcard name (passthrough or relayed) is more specific ("The GatewayClass MUST
/// use the longest matching SNI"), so its connections are terminated and served as HTTPS (a
/// `terminate` entry the SNI lookup finds first): an HTTPS listener's hostname, or an Ingress's
/// `spec.tls` name. (A `Terminate` listener's own names have relay entries already.)
fn exempt_https_names(table: &mut RouteTable) {
    let mut exempt = Vec::new();
    for host in table.tls.iter().flat_map(|t| &t.hosts) {
        let name = match host {
            HostMatch::Exact(n) => Hostname::Exact(n.clone()),
            HostMatch::Suffix(s) | HostMatch::Wildcard(s) => Hostname::Wildcard(s.clone()),
            HostMatch::Any => continue,
        };
        if table.passthrough.iter().chain(&exempt).any(|p: &Passthrough| p.host == *host) {
            continue;
        }
        let covering = table.passthrough.iter().find(|p| match &p.host {
            HostMatch::Suffix(s) => strictly_covers(Some(&Hostname::Wildcard(s.clone())), &name),
            _ => false,
        });
        if let Some(p) = covering {
            exempt.push(Passthrough {
                host: host.clone(),
                backend: p.backend.clone(),
                split: Vec::new(),
                terminate: true,
                relay: false,
            });
        }
    }
    table.passthrough.extend(exempt);
}
