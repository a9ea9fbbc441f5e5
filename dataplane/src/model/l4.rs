//! L4 services: TCP and UDP ports weir listens on and forwards as they are to a Service's
//! endpoints (ingress-nginx's `--tcp-services-configmap` and `--udp-services-configmap`).
//!
//! The stream settings (`proxy-stream-*`) are global and live in [`super::Settings`]; a service
//! names its port, its protocol, its backend and whether PROXY protocol is spoken on either side.

use serde::{Deserialize, Serialize};

use super::{BackendId, Target};

/// The transport of an L4 service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum L4Protocol {
    /// A TCP listener; each connection is spliced to one endpoint.
    Tcp,
    /// A UDP socket; each client address and port is a flow to one endpoint.
    Udp,
}

impl std::fmt::Display for L4Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            L4Protocol::Tcp => "TCP",
            L4Protocol::Udp => "UDP",
        })
    }
}

/// One listening port forwarded to a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L4Service {
    /// The port weir listens on (the ConfigMap key).
    pub port: u16,
    /// TCP or UDP.
    pub protocol: L4Protocol,
    /// The Service port forwarded to: the identity its balancer state is kept by.
    pub backend: BackendId,
    /// Its ready endpoints (or DNS name); no endpoint: connections are closed, datagrams
    /// dropped.
    pub target: Target,
    /// Clients start each connection with a PROXY protocol header (the first `:PROXY`; TCP).
    #[serde(default, skip_serializing_if = "is_false")]
    pub proxy_protocol_in: bool,
    /// weir starts each upstream connection with a PROXY protocol header naming the client
    /// (the second `:PROXY`; TCP), of the version [`super::Settings::stream_proxy_protocol_v2`]
    /// says (v1 by default, as nginx's `proxy_protocol on`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub proxy_protocol_out: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}
