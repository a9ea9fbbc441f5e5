//! `weir serve`'s side of the TCP and UDP services: which ports are weir's own, and the bind
//! errors of a publish turned into errors on the services' ConfigMaps.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use weir_dataplane::l4::L4Proxy;
use weir_dataplane::model::{L4Protocol, RouteTable};

use crate::translate::{ObjectKind, Reason, Severity, TranslateConfig, Warning};

/// The TCP ports of weir's own listeners, by name: a TCP service on one is refused.
pub fn listener_ports(
    http: SocketAddr,
    https: Option<SocketAddr>,
    admin: SocketAddr,
) -> BTreeMap<u16, String> {
    let mut ports = BTreeMap::new();
    ports.insert(admin.port(), "admin".to_string());
    if let Some(https) = https {
        ports.insert(https.port(), "HTTPS".to_string());
    }
    ports.insert(http.port(), "HTTP".to_string());
    ports
}

/// Publishes `table`'s L4 services on `l4`; returns the ports that could not be bound as
/// errors on their ConfigMap, logging those not in `reported` (which becomes this publish's).
pub fn publish(
    l4: &L4Proxy,
    table: &RouteTable,
    config: &TranslateConfig,
    reported: &mut BTreeSet<String>,
) -> Vec<Warning> {
    let mut warnings = Vec::new();
    for failed in l4.publish(table) {
        let configmap = match failed.protocol {
            L4Protocol::Tcp => &config.tcp_services,
            L4Protocol::Udp => &config.udp_services,
        };
        let Some(object) = configmap.clone() else { continue };
        warnings.push(Warning {
            kind: ObjectKind::ConfigMap,
            object,
            severity: Severity::Error,
            reason: Reason::L4BindFailed,
            message: format!("data[{}]: {failed}; the other ports serve", failed.port),
        });
    }
    let now: BTreeSet<String> = warnings.iter().map(|w| w.to_string()).collect();
    for line in now.difference(reported) {
        tracing::error!("{line}");
    }
    *reported = now;
    warnings
}
