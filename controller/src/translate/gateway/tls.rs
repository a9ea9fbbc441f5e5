//! TLS of Gateway listeners into the table (pure): the certificates of HTTPS listeners and of
//! `TLS` listeners with `tls.mode: Terminate` join the Ingresses' in the SNI resolver of the
//! HTTPS socket (a `TLS` listener's names are then relayed as TCP: [`super::tlsroutes`]).
//!
//! A listener's certificate serves its hostname: an exact name, a wildcard `*.suffix` (any
//! number of labels in front, [`HostMatch::Suffix`]), or, without hostname, every name no
//! other entry covers (before the default certificate). Of several `certificateRefs` (support
//! for more than one is implementation-specific) every one that resolves is offered: a
//! handshake gets the first whose key signs with a scheme the ClientHello offers, so an ECDSA
//! certificate listed before an RSA one for the same names serves ECDSA clients and RSA-only
//! clients alike (all of them are for the listener's hostname: SNI does not choose among them). The resolver uses the longest matching name ("The GatewayClass
//! MUST use the longest matching SNI out of all available certificates", `Listener.tls`):
//! exact names, then one-label Ingress wildcards, then Gateway wildcards longest first, then
//! an entry for any name. On the very same name an Ingress's `spec.tls` and a listener's
//! certificate cannot both serve: the Ingress's is kept (it was there first, as at one path
//! an Ingress route is kept over an HTTPRoute without conditions) and the Gateway gets a
//! `ConflictLost` warning (`weir check`).
//!
//! Each listener's entry names its listener (`namespace/gateway/listener`): on a connection
//! whose SNI chose it, a request whose host belongs to another listener of the socket is
//! answered 421 Misdirected Request, one whose host belongs to no listener 404 (`Listener.
//! hostname`, citing RFC 7540 §9.1.2; the dataplane's `tls::listeners`). Connections whose SNI
//! chose an Ingress's certificate (or the default) keep routing by `Host` alone.
//!
//! A listener that validates client certificates (`Gateway.spec.tls.frontend`,
//! [`super::frontend`]) adds a client certificate policy for its entry ([`ClientAuth`] with its
//! `listener`): the dataplane's mTLS machinery asks its connections for certificates.

use weir_dataplane::model::{ClientAuth, RouteTable, TlsEntry};

use super::GatewayAttachments;
use super::isolation::host_match;
use super::listeners::Protocol;
use crate::translate::warnings::{Reason, Warnings};

/// Adds a TLS entry and its certificate for each ready listener of `attachments` that
/// terminates TLS, after the Ingresses' entries already in `table`.
pub(crate) fn apply(table: &mut RouteTable, attachments: &GatewayAttachments, warnings: &mut Warnings) {
    for (key, gateway) in &attachments.gateways {
        // What keeps a listener from being served, for `weir check` (the status writer
        // reports the same conditions on the Gateway).
        for l in &gateway.listeners {
            let problems: Vec<String> = l
                .conditions
                .iter()
                .filter(|c| c.status == (c.type_ == super::conditions::types::CONFLICTED))
                .map(|c| {
                    format!(
                        "{} {} ({}): {}",
                        c.type_,
                        if c.status { "True" } else { "False" },
                        c.reason,
                        c.message
                    )
                })
                .collect();
            if problems.is_empty() {
                continue;
            }
            let message = format!("spec.listeners[{}]: {}", l.name, problems.join("; "));
            let (kind, object) = l.owner(key);
            if l.ready {
                // Served all the same (one certificate or CA reference of several does not
                // resolve): a warning, not an error.
                warnings.warn_on(kind, object, Reason::ListenerDegraded, message);
            } else {
                warnings.error_on(kind, object, Reason::ListenerNotServed, message);
            }
        }
        for l in gateway.listeners.iter().filter(|l| l.ready) {
            let Some(certificates) = l.protocol.as_ref().and_then(Protocol::certificates) else { continue };
            let Some((id, _)) = certificates.first() else { continue };
            let host = host_match(l.hostname.as_ref());
            if let Some(other) = table.tls.iter().find(|t| t.hosts.contains(&host)) {
                let holder = other
                    .certificate
                    .as_ref()
                    .map_or("the default certificate".to_string(), |c| format!("certificate {c}"));
                let (kind, object) = l.owner(key);
                warnings.warn_on(
                    kind,
                    object,
                    Reason::ConflictLost,
                    format!(
                        "spec.listeners[{}]: name {host} already has {holder} (an Ingress's spec.tls, or an earlier listener); the listener's certificate {id} is not served for it",
                        l.name
                    ),
                );
                continue;
            }
            // Every certificate that resolved: the handshake serves the first whose key signs
            // with a scheme the client offers (more than one is implementation-specific).
            for (id, certificate) in certificates {
                table.certificates.entry(id.clone()).or_insert_with(|| certificate.clone());
            }
            let alternatives: Vec<_> = certificates[1..].iter().map(|(id, _)| id.clone()).collect();
            // The entry names its listener: the dataplane answers 421 to a request on its
            // connections for another listener's name, 404 for a name of no listener
            // (`Listener.hostname`, RFC 7540 §9.1.2).
            let listener = l.id(key);
            if let Some(validation) = &l.client_validation {
                table.client_auth.push(ClientAuth {
                    host: host.clone(),
                    listener: Some(listener.clone()),
                    ca_pem: validation.ca_pem.clone(),
                    verify: validation.verify,
                    depth: super::frontend::VERIFY_DEPTH,
                    pass_certificate: false,
                    match_cn: None,
                    error_page: None,
                });
            }
            table.tls.push(TlsEntry {
                hosts: vec![host],
                certificate: Some(id.clone()),
                listener: Some(listener),
                alternatives,
            });
        }
    }
    table.client_auth.sort_by(|a, b| a.host.cmp(&b.host).then_with(|| a.listener.cmp(&b.listener)));
}
