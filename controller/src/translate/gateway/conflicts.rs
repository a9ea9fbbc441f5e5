//! `Conflicted` listeners across the Gateways weir serves (pure).
//!
//! Every Gateway of weir's classes shares weir's two sockets, so two listeners of different
//! Gateways on one port can clash as two listeners of one Gateway do (`Listener` doc,
//! "Handling indistinct Listeners"):
//!
//! - `ProtocolConflict` ("multiple Listeners are specified with the same Listener port number,
//!   but have conflicting protocol specifications"): on one port, HTTP against HTTPS or TLS
//!   (HTTPS and TLS share a port: SNI tells them apart). Within one Gateway every such listener
//!   is conflicted; across Gateways the older Gateway's protocol keeps the port
//!   (`creationTimestamp`, then namespace/name, as for routes).
//! - `HostnameConflict` ("Listeners that share the same port and protocol but have
//!   conflicting hostnames"): one hostname (or none) on one socket. Within one Gateway
//!   `listeners::mark_conflicts` already marks them all; across Gateways the older Gateway's
//!   listener keeps it.
//!
//! A conflicted listener is not served and no route attaches to it; the Gateway's `Accepted`
//! says `ListenersNotValid`.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use weir_dataplane::model::ObjectRef;

use super::conditions::{Cond, reasons, types};
use super::hostname::Hostname;
use super::isolation::Socket;
use super::listeners::{GatewayOut, ListenerOut, gateway_conditions};
use crate::snapshot::Snapshot;

/// Marks the listeners of `gateways` that clash with another Gateway's, or (protocols) with
/// their own Gateway's.
pub fn mark(gateways: &mut BTreeMap<ObjectRef, GatewayOut>, snapshot: &Snapshot) {
    if gateways.is_empty() {
        return;
    }
    // Oldest first.
    let mut order: Vec<(bool, Option<Timestamp>, ObjectRef)> = gateways
        .keys()
        .map(|k| {
            let created =
                snapshot.gateways.get(k).and_then(|g| g.metadata.creation_timestamp.as_ref()).map(|t| t.0);
            (created.is_none(), created, k.clone())
        })
        .collect();
    order.sort();

    let mut ports: BTreeMap<i32, (bool, ObjectRef)> = BTreeMap::new();
    let mut names: BTreeMap<(Socket, Option<Hostname>), (ObjectRef, String)> = BTreeMap::new();
    for (_, _, key) in order {
        let protocols: Vec<Option<bool>> = snapshot
            .gateways
            .get(&key)
            .map(|g| g.spec.listeners.iter().map(|l| tls_family(&l.protocol)).collect())
            .unwrap_or_default();
        let Some(gateway) = gateways.get_mut(&key) else { continue };
        let mut changed = false;
        // Protocols on one port, within this Gateway, then against older Gateways.
        let mut own: BTreeMap<i32, Vec<bool>> = BTreeMap::new();
        for (l, family) in gateway.listeners.iter().zip(&protocols) {
            if let Some(f) = family {
                own.entry(l.port).or_default().push(*f);
            }
        }
        for (l, family) in gateway.listeners.iter_mut().zip(&protocols) {
            let Some(family) = *family else { continue };
            let mixed = own.get(&l.port).is_some_and(|f| f.iter().any(|g| *g != family));
            let older = ports.get(&l.port).filter(|(f, _)| *f != family).map(|(_, gw)| gw.clone());
            if mixed || older.is_some() {
                let why = match older {
                    Some(gw) => format!(
                        "port {} serves {} listeners of the older Gateway {gw}",
                        l.port,
                        if family { "HTTP" } else { "HTTPS or TLS" }
                    ),
                    None => format!("this Gateway has HTTP and HTTPS or TLS listeners on port {}", l.port),
                };
                conflict(l, reasons::PROTOCOL_CONFLICT, why);
                changed = true;
            }
        }
        for (l, family) in gateway.listeners.iter().zip(&protocols) {
            if let Some(f) = family {
                ports.entry(l.port).or_insert((*f, key.clone()));
            }
        }
        // Hostnames on one socket, against older Gateways.
        for l in gateway.listeners.iter_mut().filter(|l| l.ready) {
            let Some(socket) = l.protocol.as_ref().map(Socket::of) else { continue };
            match names.get(&(socket, l.hostname.clone())) {
                Some((gw, name)) if *gw != key => {
                    let why = format!(
                        "listener {name} of the older Gateway {gw} serves {} on the same port",
                        l.hostname.as_ref().map_or("every hostname".to_string(), |h| format!("hostname {h}"))
                    );
                    conflict(l, reasons::HOSTNAME_CONFLICT, why);
                    changed = true;
                }
                Some(_) => {}
                None => {
                    names.insert((socket, l.hostname.clone()), (key.clone(), l.name.clone()));
                }
            }
        }
        if changed {
            gateway.conditions = gateway_conditions(&gateway.listeners);
        }
    }
}

/// `Some(false)` for HTTP, `Some(true)` for HTTPS and TLS (one port, told apart by SNI); `None`
/// for the protocols weir does not serve (`UnsupportedProtocol` already).
fn tls_family(protocol: &str) -> Option<bool> {
    match protocol {
        "HTTP" => Some(false),
        "HTTPS" | "TLS" => Some(true),
        _ => None,
    }
}

/// Marks `l` conflicted: not served, `Conflicted` true with `reason`, `Programmed` false.
fn conflict(l: &mut ListenerOut, reason: &'static str, why: String) {
    l.ready = false;
    l.conditions.retain(|c| c.type_ != types::CONFLICTED);
    l.conditions.push(Cond::yes(types::CONFLICTED, reason, why));
    for c in &mut l.conditions {
        if c.type_ == types::PROGRAMMED {
            *c = Cond::no(types::PROGRAMMED, reasons::INVALID, "conflicted (see Conflicted)");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::translate::gateway::{GatewayConfig, attach_all};

    fn run(yaml: &str) -> crate::translate::gateway::GatewayAttachments {
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: weir}}\nspec: {{controllerName: weir.dev/gateway-controller}}\n---\n{yaml}"
        );
        let snapshot: Snapshot =
            crate::source::manifest::parse_manifests(&text).unwrap().into_iter().collect();
        attach_all(&snapshot, &GatewayConfig::default())
    }

    fn gateway(name: &str, created: &str, listeners: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: infra, creationTimestamp: \"{created}\"}}\n\
             spec:\n  gatewayClassName: weir\n  listeners:\n{listeners}---\n"
        )
    }

    /// (ready, Conflicted reason) of each listener of `infra/name`.
    fn listeners(a: &crate::translate::gateway::GatewayAttachments, name: &str) -> Vec<(bool, &'static str)> {
        a.gateways[&ObjectRef::new("infra", name)]
            .listeners
            .iter()
            .map(|l| {
                let c = l.conditions.iter().find(|c| c.type_ == types::CONFLICTED).unwrap();
                (l.ready, if c.status { c.reason } else { "-" })
            })
            .collect()
    }

    /// `ListenerReasonHostnameConflict` across the Gateways weir serves on its shared sockets:
    /// the older Gateway's listener keeps the name; the newer one's is conflicted and not
    /// programmed; other names and the other socket are not affected.
    #[test]
    fn listener_conflicted_hostname_across_gateways_older_wins() {
        let http = "  - {name: web, port: 80, protocol: HTTP, hostname: a.example.com}\n  - {name: other, port: 80, protocol: HTTP, hostname: b.example.com}\n";
        let newer = "  - {name: web, port: 80, protocol: HTTP, hostname: a.example.com}\n  - {name: any, port: 80, protocol: HTTP}\n";
        let a = run(&format!(
            "{}{}",
            gateway("newer", "2024-02-01T00:00:00Z", newer),
            gateway("older", "2024-01-01T00:00:00Z", http)
        ));
        assert_eq!(listeners(&a, "older"), [(true, "-"), (true, "-")]);
        assert_eq!(listeners(&a, "newer"), [(false, reasons::HOSTNAME_CONFLICT), (true, "-")]);
        let gw = &a.gateways[&ObjectRef::new("infra", "newer")];
        let accepted = gw.conditions.iter().find(|c| c.type_ == types::ACCEPTED).unwrap();
        assert_eq!(accepted.reason, reasons::LISTENERS_NOT_VALID);
        let programmed = gw.listeners[0].conditions.iter().find(|c| c.type_ == types::PROGRAMMED).unwrap();
        assert!(!programmed.status);
    }

    /// `ListenerReasonProtocolConflict`: HTTP and HTTPS on one port within one Gateway
    /// conflict both; across Gateways the older Gateway's protocol keeps the port. HTTPS and
    /// TLS share a port (SNI tells them apart).
    #[test]
    fn listener_conflicted_protocol_on_one_port() {
        let tls = "tls: {mode: Passthrough}";
        let mixed = format!(
            "  - {{name: web, port: 80, protocol: HTTP}}\n  - {{name: clash, port: 80, protocol: TLS, hostname: t.example.com, {tls}}}\n"
        );
        let a = run(&gateway("mixed", "2024-01-01T00:00:00Z", &mixed));
        assert_eq!(
            listeners(&a, "mixed"),
            [(false, reasons::PROTOCOL_CONFLICT), (false, reasons::PROTOCOL_CONFLICT)]
        );

        let older = "  - {name: web, port: 80, protocol: HTTP}\n";
        let newer = format!(
            "  - {{name: t, port: 80, protocol: TLS, hostname: t.example.com, {tls}}}\n  - {{name: s, port: 443, protocol: TLS, hostname: t.example.com, {tls}}}\n"
        );
        let a = run(&format!(
            "{}{}",
            gateway("older", "2024-01-01T00:00:00Z", older),
            gateway("newer", "2024-02-01T00:00:00Z", &newer)
        ));
        assert_eq!(listeners(&a, "older"), [(true, "-")]);
        assert_eq!(listeners(&a, "newer"), [(false, reasons::PROTOCOL_CONFLICT), (true, "-")]);
    }
}
