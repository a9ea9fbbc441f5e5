//! The bare-metal Service load balancer's pure parts: address pools and their assignment.
//!
//! - [`pool`]: the `IPAddressPool` custom resource (`weir.dev/v1alpha1`) and its validation
//!   into [`pool::Pool`]s;
//! - [`ipam`]: which LoadBalancer Service gets which address ([`ipam::assign`]);
//! - [`announce`]: the trait behind which L2 (ARP/NDP) announcement, and later BGP, make the
//!   assigned addresses reachable, and the loop feeding it;
//! - [`elect`]: which node announces which address (pure); [`members`]: which nodes are alive
//!   (node Leases, or Node objects with `--manifests`);
//! - [`frame`] (pure) and [`l2`]: the ARP/NDP speaker.
//!
//! The impure edges (watching the API server, electing the one replica that assigns, writing
//! Service and pool status and Events) live in `crate::lb_agent`.

pub mod announce;
pub mod elect;
pub mod frame;
pub mod ipam;
pub mod l2;
pub mod members;
pub mod pool;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServiceStatus};

use crate::snapshot::Snapshot;

/// The status ingress list of `addresses`.
pub fn ingress_of(addresses: &[IpAddr]) -> Vec<LoadBalancerIngress> {
    addresses
        .iter()
        .map(|ip| LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() })
        .collect()
}

/// The IPs of `svc`'s `status.loadBalancer.ingress`.
pub fn status_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
        .collect()
}

/// `snapshot` with the LoadBalancer status of each Service in `addresses` replaced by its
/// addresses (what the node plan then programs). Used where no API server stores the status
/// (`--manifests`).
pub fn with_addresses(
    snapshot: &Snapshot,
    addresses: &BTreeMap<weir_dataplane::model::ObjectRef, Vec<IpAddr>>,
) -> Snapshot {
    let mut out = snapshot.clone();
    for (key, ips) in addresses {
        let Some(svc) = snapshot.services.get(key) else { continue };
        if status_ips(svc) == *ips {
            continue;
        }
        let mut svc = svc.clone();
        let status = svc.status.get_or_insert_with(ServiceStatus::default);
        status.load_balancer = Some(LoadBalancerStatus { ingress: Some(ingress_of(ips)) });
        out.services.insert(key.clone(), Arc::new(svc));
    }
    out
}
