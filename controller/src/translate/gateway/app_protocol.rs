//! The protocol weir speaks to a Gateway API backend, from its Service port's `appProtocol`
//! (pure).
//!
//! `HTTPBackendRef`/`GRPCBackendRef`: "When the BackendRef points to a Kubernetes Service,
//! implementations SHOULD honor the appProtocol field if it is set for the target Service Port.
//! Implementations supporting appProtocol SHOULD recognize the Kubernetes Standard Application
//! Protocols defined in KEP-3726"; "If a Route is not able to send traffic to the backend using
//! the specified protocol then the backend is considered invalid. Implementations MUST set the
//! "ResolvedRefs" condition to "False" with the "UnsupportedProtocol" reason."
//!
//! | `appProtocol` | weir speaks |
//! |---|---|
//! | none | HTTP/1.1 (HTTPRoute), h2c (GRPCRoute: inferred from the route type) |
//! | `kubernetes.io/h2c`, `h2c` | HTTP/2 prior knowledge (h2c) |
//! | `kubernetes.io/ws`, `http` | HTTP/1.1; WebSocket upgrades pass through |
//! | `kubernetes.io/wss`, `https` | HTTP/1.1 over TLS (WebSocket upgrades too), the certificate verified against the system's roots for the request's host |
//! | anything else | nothing: the reference is invalid (`UnsupportedProtocol`), its share answers 500 |
//!
//! Ingress backends keep `backend-protocol` (an annotation) and do not read `appProtocol`.

use weir_dataplane::model::{BackendId, ServicePort, UpstreamProtocol, UpstreamTls};

use crate::snapshot::Snapshot;

/// The protocol (and TLS) a backend's `appProtocol` asks for: `Ok(None)` when the port has none
/// (or the Service or port is not found: resolving says so); `Err` with why when weir cannot
/// speak it.
pub fn of(
    snapshot: &Snapshot,
    id: &BackendId,
) -> Result<Option<(UpstreamProtocol, Option<UpstreamTls>)>, String> {
    let ServicePort::Number(number) = id.port else { return Ok(None) };
    let service = snapshot.services.get(&weir_dataplane::model::ObjectRef::new(&id.namespace, &id.service));
    let ports = service.and_then(|s| s.spec.as_ref()).and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let Some(app) =
        ports.iter().find(|p| p.port == i32::from(number)).and_then(|p| p.app_protocol.as_deref())
    else {
        return Ok(None);
    };
    parse(app).map(Some).ok_or_else(|| {
        format!(
            "Service port {id} has appProtocol {app:?}, which weir does not speak (kubernetes.io/h2c, kubernetes.io/ws, kubernetes.io/wss, http, https, h2c)"
        )
    })
}

/// One `appProtocol` value.
fn parse(app: &str) -> Option<(UpstreamProtocol, Option<UpstreamTls>)> {
    Some(match app {
        "kubernetes.io/h2c" | "h2c" => (UpstreamProtocol::H2c, None),
        "kubernetes.io/ws" | "http" => (UpstreamProtocol::Http1, None),
        "kubernetes.io/wss" | "https" => (UpstreamProtocol::Https, Some(UpstreamTls::default())),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KEP-3726 standard application protocols and the two IANA names weir speaks.
    #[test]
    fn app_protocol_values() {
        assert_eq!(parse("kubernetes.io/h2c"), Some((UpstreamProtocol::H2c, None)));
        assert_eq!(parse("kubernetes.io/ws"), Some((UpstreamProtocol::Http1, None)));
        assert_eq!(parse("kubernetes.io/wss"), Some((UpstreamProtocol::Https, Some(UpstreamTls::default()))));
        assert_eq!(parse("https").map(|p| p.0), Some(UpstreamProtocol::Https));
        assert_eq!(parse("kubernetes.io/grpc"), None);
        assert_eq!(parse("mysql"), None);
    }
}
