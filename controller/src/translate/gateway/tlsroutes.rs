//! TLSRoutes into the table (pure): TLS connections passed through, undecrypted, by SNI.
//!
//! A TLSRoute attached to a `TLS` listener (`tls.mode: Passthrough`) on the HTTPS socket adds
//! a [`Passthrough`] entry for each of its host names (`TLSRouteSpec.hostnames` intersected
//! with the listener's hostname, as for HTTPRoutes: an exact name, or `*.suffix` with any
//! number of labels in front). The HTTPS socket reads the ClientHello's SNI: a passthrough name
//! is spliced to a backend, any other name is terminated (Ingress TLS and HTTPS listeners share
//! the socket). The backends are the rule's `backendRefs`, chosen per connection by `weight`
//! (0 excluded); a reference that does not resolve keeps its share, whose connections are
//! refused, and makes the route's `ResolvedRefs` false (`BackendNotFound`, `RefNotPermitted`,
//! `InvalidKind`). Passthrough needs an SNI name: a route that would take every name (no
//! hostname on the route or the listener) is not served, and said so. On a name an Ingress's
//! `ssl-passthrough` already has, the Ingress keeps it (`ConflictLost`).

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
        let mut hosts = BTreeSet::new();
        for a in parents.iter().filter(|p| p.accepted.status).flat_map(|p| &p.attached) {
            match &a.hostnames {
                Some(names) => hosts.extend(names.iter().map(|h| host_match(Some(h)))),
                None => warnings.error_on(
                    ObjectKind::TlsRoute,
                    key,
                    Reason::RouteNotAccepted,
                    "neither the route nor its listener names a hostname: passthrough is chosen by SNI name, and taking every name is not supported; not served".to_string(),
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
        let Some(first) = split.iter().find_map(|s| s.backend.clone()) else {
            if !hosts.is_empty() {
                warnings.error_on(
                    ObjectKind::TlsRoute,
                    key,
                    Reason::BackendNotResolved,
                    "no backendRef resolves: its names are not passed through".to_string(),
                );
            }
            continue;
        };
        for host in hosts {
            if let Some(other) = table.passthrough.iter().find(|p| p.host == host) {
                warnings.warn_on(
                    ObjectKind::TlsRoute,
                    key,
                    Reason::ConflictLost,
                    format!("SNI {host} is already passed through to {} (an Ingress's ssl-passthrough, or an older TLSRoute)", other.backend),
                );
                continue;
            }
            table.passthrough.push(Passthrough {
                host,
                backend: first.clone(),
                split: split.clone(),
                terminate: false,
            });
        }
    }
    exempt_https_names(table, attachments);
    table.passthrough.sort_by(|a, b| a.host.cmp(&b.host));
    out
}

/// Listener isolation on the HTTPS socket: an HTTPS listener's hostname under a TLS listener's
/// wildcard passthrough name is more specific, so its connections are terminated, not passed
/// through (a `terminate` entry the SNI lookup finds first).
fn exempt_https_names(table: &mut RouteTable, attachments: &GatewayAttachments) {
    let https = attachments
        .gateways
        .values()
        .flat_map(|g| &g.listeners)
        .filter(|l| l.ready && matches!(l.protocol, Some(Protocol::Https(_))))
        .filter_map(|l| l.hostname.as_ref());
    let mut exempt = Vec::new();
    for name in https {
        let host = host_match(Some(name));
        if table.passthrough.iter().chain(&exempt).any(|p: &Passthrough| p.host == host) {
            continue;
        }
        let covering = table.passthrough.iter().find(|p| match &p.host {
            HostMatch::Suffix(s) => strictly_covers(Some(&Hostname::Wildcard(s.clone())), name),
            _ => false,
        });
        if let Some(p) = covering {
            exempt.push(Passthrough { host, backend: p.backend.clone(), split: Vec::new(), terminate: true });
        }
    }
    table.passthrough.extend(exempt);
}
