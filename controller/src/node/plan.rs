//! The node plan (pure): Services and their endpoints → a [`Ruleset`] every backend renders.
//!
//! One [`ServicePort`] per Service port, protocol and IP family, with the virtual addresses that
//! lead to it (ClusterIPs, NodePort, LoadBalancer ingress IPs, externalIPs), its session affinity
//! and traffic policies, and the endpoints chosen the way kube-proxy chooses them: ready endpoints
//! only; serving-and-terminating ones only when no ready one remains; for a `Local` policy, the
//! endpoints on this node. Headless and ExternalName Services have no virtual IP and are skipped.
//!
//! Endpoints come from EndpointSlices (label `kubernetes.io/service-name`); a Service without any
//! slice falls back to its core v1 Endpoints (hand-written endpoints of a selector-less Service).
//! No I/O, no clocks; the output is sorted and does not depend on the order objects arrived in.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Endpoints, Service, ServicePort as K8sServicePort};
use serde::{Deserialize, Serialize};
use weir_dataplane::model::ObjectRef;

use crate::snapshot::slice::SERVICE_NAME_LABEL;
use crate::snapshot::{Slice, Snapshot};

/// Default ClientIP affinity timeout (3 hours), as in the Service API.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// The annotation older clients use for `spec.loadBalancerSourceRanges` (comma-separated CIDRs;
/// the field wins when both are set).
pub const SOURCE_RANGES_ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// What the plan needs to know about the node it runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// This node's name: endpoints whose `nodeName` equals it are local.
    #[serde(default)]
    pub node_name: Option<String>,
}

/// An L4 protocol of a Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Parses a Kubernetes protocol name (`None` is TCP).
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The lower-case name used by iptables and nft.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum IpFamily {
    /// IPv4.
    IPv4,
    /// IPv6.
    IPv6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() { IpFamily::IPv4 } else { IpFamily::IPv6 }
    }
}

/// `externalTrafficPolicy` / `internalTrafficPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TrafficPolicy {
    /// Any ready endpoint in the cluster (the default).
    #[default]
    Cluster,
    /// Only endpoints on this node.
    Local,
}

/// The identity of one service port: kube-proxy's `ServicePortName` plus protocol and family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServicePortKey {
    /// The Service.
    pub service: ObjectRef,
    /// The port's name (empty for a single unnamed port).
    pub port_name: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// The IP family of this entry (a dual-stack Service has one entry per family).
    pub family: IpFamily,
}

impl fmt::Display for ServicePortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.service)?;
        if !self.port_name.is_empty() {
            write!(f, ":{}", self.port_name)?;
        }
        write!(f, "/{}", self.protocol.as_str())?;
        if self.family == IpFamily::IPv6 {
            f.write_str("/ipv6")?;
        }
        Ok(())
    }
}

/// One endpoint a service port may send traffic to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// Its address.
    pub ip: IpAddr,
    /// Its (target) port.
    pub port: u16,
    /// The node it runs on, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Whether it is terminating (chosen only because no ready endpoint remains).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminating: bool,
}

/// ClientIP session affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Affinity {
    /// How long a client sticks to its endpoint after its last packet.
    pub timeout_seconds: u32,
}

/// Everything a backend needs to program one service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    /// Its identity.
    #[serde(flatten)]
    pub key: ServicePortKey,
    /// The service port number.
    pub port: u16,
    /// The ClusterIPs of this family (usually one).
    pub cluster_ips: Vec<IpAddr>,
    /// The node port, for NodePort and LoadBalancer Services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family (not those with `ipMode: Proxy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` (or its annotation) of this family: when set, traffic to
    /// the LoadBalancer IPs from other sources is dropped (an empty list admits no one: a
    /// family the Service lists no range of, or ranges none of which parses, is closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<Cidr>>,
    /// ClientIP session affinity, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Policy for traffic to the ClusterIPs.
    pub internal_policy: TrafficPolicy,
    /// Policy for traffic to the node port, LoadBalancer IPs and externalIPs.
    pub external_policy: TrafficPolicy,
    /// Endpoints for `Cluster` policies (empty when no policy is `Cluster`).
    pub cluster_endpoints: Vec<Endpoint>,
    /// Endpoints on this node for `Local` policies (empty when no policy is `Local`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_endpoints: Vec<Endpoint>,
    /// No usable endpoint on any node: traffic is rejected. (When endpoints exist only on other
    /// nodes, traffic under a `Local` policy is dropped instead, as kube-proxy does.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_endpoints: bool,
}

impl ServicePort {
    /// Whether traffic can reach it from outside the cluster (node port, LB or external IPs).
    pub fn is_external(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// The endpoints traffic to a ClusterIP uses.
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        match self.internal_policy {
            TrafficPolicy::Cluster => &self.cluster_endpoints,
            TrafficPolicy::Local => &self.local_endpoints,
        }
    }

    /// The endpoints external traffic uses.
    pub fn external_endpoints(&self) -> &[Endpoint] {
        match self.external_policy {
            TrafficPolicy::Cluster => &self.cluster_endpoints,
            TrafficPolicy::Local => &self.local_endpoints,
        }
    }

    /// Every endpoint either list names, sorted, without duplicates.
    pub fn all_endpoints(&self) -> BTreeSet<&Endpoint> {
        self.cluster_endpoints.iter().chain(&self.local_endpoints).collect()
    }

    /// Every virtual IP of this port: ClusterIPs, externalIPs and LoadBalancer IPs.
    pub fn virtual_ips(&self) -> impl Iterator<Item = &IpAddr> {
        self.cluster_ips.iter().chain(&self.external_ips).chain(&self.load_balancer_ips)
    }
}

/// The service ports of `family` that differ between `old` and `new` (both sorted by key), as
/// (before, after) pairs.
pub fn changed_ports<'a>(
    old: &'a Ruleset,
    new: &'a Ruleset,
    family: IpFamily,
) -> Vec<(Option<&'a ServicePort>, Option<&'a ServicePort>)> {
    let mut a = old.services.iter().filter(|sp| sp.key.family == family).peekable();
    let mut b = new.services.iter().filter(|sp| sp.key.family == family).peekable();
    let mut out = Vec::new();
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => return out,
            (Some(x), Some(y)) if x.key == y.key => {
                if x != y {
                    out.push((Some(*x), Some(*y)));
                }
                a.next();
                b.next();
            }
            (Some(x), Some(y)) if x.key < y.key => {
                out.push((Some(*x), None));
                a.next();
            }
            (Some(_), Some(y)) => {
                out.push((None, Some(*y)));
                b.next();
            }
            (Some(x), None) => {
                out.push((Some(*x), None));
                a.next();
            }
            (None, Some(y)) => {
                out.push((None, Some(*y)));
                b.next();
            }
        }
    }
}

/// Something the plan skipped or could not read, with the object it concerns.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PlanWarning {
    /// The Service (or EndpointSlice / Endpoints) concerned.
    pub object: ObjectRef,
    /// What happened.
    pub reason: String,
}

/// The output of [`plan`]: every service port, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruleset {
    /// Service ports, sorted by [`ServicePortKey`].
    pub services: Vec<ServicePort>,
    /// What was skipped, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<PlanWarning>,
}

/// An IP prefix such as `10.244.0.0/16` (`--cluster-cidr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// The network address (host bits as given).
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

/// Why a string is not a [`Cidr`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {0:?}: expected ADDRESS/PREFIX such as 10.244.0.0/16")]
pub struct CidrError(String);

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CidrError(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(err)?;
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let prefix: u8 = prefix.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(err());
        }
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Cidr {
    /// Whether `ip` is in the prefix.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(*ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(*ip) & mask
            }
            _ => false,
        }
    }

    /// The family of the prefix.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }
}

/// An endpoint as read from a slice or Endpoints object, before selection.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Candidate {
    ip: IpAddr,
    port: u16,
    node: Option<String>,
    ready: bool,
    serving: bool,
    terminating: bool,
}

impl Candidate {
    fn endpoint(&self) -> Endpoint {
        Endpoint { ip: self.ip, port: self.port, node: self.node.clone(), terminating: false }
    }

    /// Conditions for merging duplicates: the "most usable" copy wins.
    fn rank(&self) -> (bool, bool, bool) {
        (self.ready, self.serving, !self.terminating)
    }
}

/// Port identity within endpoints: name (empty when unnamed) and protocol.
type PortId = (String, Protocol);

/// Builds the ruleset for `snapshot` on the node described by `config`.
pub fn plan(snapshot: &Snapshot, config: &PlanConfig) -> Ruleset {
    let mut warnings = Vec::new();
    let slices = slices_by_service(snapshot, &mut warnings);
    let mut services = Vec::new();
    for (key, service) in &snapshot.services {
        let endpoints = match slices.get(key) {
            Some(list) => from_slices(list),
            None => snapshot.endpoints.get(key).map(from_endpoints).unwrap_or_default(),
        };
        service_ports(key, service, &endpoints, config, &mut services, &mut warnings);
    }
    services.sort_by(|a, b| a.key.cmp(&b.key));
    warnings.sort();
    warnings.dedup();
    Ruleset { services, warnings }
}

/// EndpointSlices grouped by the Service they belong to.
fn slices_by_service<'a>(
    snapshot: &'a Snapshot,
    warnings: &mut Vec<PlanWarning>,
) -> BTreeMap<ObjectRef, Vec<&'a Slice>> {
    let mut out: BTreeMap<ObjectRef, Vec<&Slice>> = BTreeMap::new();
    for (key, slice) in &snapshot.endpoint_slices {
        match &slice.service {
            Some(name) => {
                out.entry(ObjectRef::new(key.namespace.clone(), name.clone())).or_default().push(slice);
            }
            None => warnings.push(PlanWarning {
                object: key.clone(),
                reason: format!("EndpointSlice without label {SERVICE_NAME_LABEL}; ignored"),
            }),
        }
    }
    out
}

fn port_u16(port: i32) -> Option<u16> {
    u16::try_from(port).ok().filter(|p| *p != 0)
}

/// Candidates per port identity, from a Service's slices.
fn from_slices(slices: &[&Slice]) -> BTreeMap<PortId, Vec<Candidate>> {
    let mut out: BTreeMap<PortId, Vec<Candidate>> = BTreeMap::new();
    for slice in slices {
        // FQDN slices are not proxied: they have no endpoints here.
        for port in &slice.ports {
            let (Some(number), Some(protocol)) =
                (port.port.and_then(port_u16), Protocol::parse(port.protocol.as_deref()))
            else {
                continue;
            };
            let id = (port.name.clone().unwrap_or_default(), protocol);
            let list = out.entry(id).or_default();
            // Only the first address of each endpoint is in a `Slice` (the API says consumers
            // use the first one).
            list.extend(slice.endpoints.iter().map(|ep| Candidate {
                ip: ep.address,
                port: number,
                node: ep.node_name.as_deref().map(String::from),
                ready: ep.ready,
                serving: ep.serving,
                terminating: ep.terminating,
            }));
        }
    }
    out
}

/// Candidates per port identity, from core v1 Endpoints.
fn from_endpoints(endpoints: &Endpoints) -> BTreeMap<PortId, Vec<Candidate>> {
    let mut out: BTreeMap<PortId, Vec<Candidate>> = BTreeMap::new();
    for subset in endpoints.subsets.iter().flatten() {
        for port in subset.ports.iter().flatten() {
            let (Some(number), Some(protocol)) =
                (port_u16(port.port), Protocol::parse(port.protocol.as_deref()))
            else {
                continue;
            };
            let list = out.entry((port.name.clone().unwrap_or_default(), protocol)).or_default();
            let ready = subset.addresses.iter().flatten().map(|a| (a, true));
            let not_ready = subset.not_ready_addresses.iter().flatten().map(|a| (a, false));
            for (addr, ready) in ready.chain(not_ready) {
                let Ok(ip) = addr.ip.parse::<IpAddr>() else { continue };
                list.push(Candidate {
                    ip,
                    port: number,
                    node: addr.node_name.clone(),
                    ready,
                    serving: ready,
                    terminating: false,
                });
            }
        }
    }
    out
}

fn parse_ips<'a>(ips: impl IntoIterator<Item = &'a String>) -> (Vec<IpAddr>, Vec<&'a String>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for s in ips {
        match s.parse::<IpAddr>() {
            Ok(ip) => good.push(ip),
            Err(_) => bad.push(s),
        }
    }
    good.sort();
    good.dedup();
    (good, bad)
}

fn policy(s: Option<&str>) -> TrafficPolicy {
    // "Local" (and the pre-1.22 spelling "Local" only) selects node-local endpoints.
    if s == Some("Local") { TrafficPolicy::Local } else { TrafficPolicy::Cluster }
}

/// The ServicePorts of one Service.
fn service_ports(
    key: &ObjectRef,
    service: &Service,
    endpoints: &BTreeMap<PortId, Vec<Candidate>>,
    config: &PlanConfig,
    out: &mut Vec<ServicePort>,
    warnings: &mut Vec<PlanWarning>,
) {
    let warn = |warnings: &mut Vec<PlanWarning>, reason: String| {
        warnings.push(PlanWarning { object: key.clone(), reason });
    };
    // Names end up in chain names, rule comments and nft identifiers: the API server admits
    // only DNS names, and manifests from a directory must not smuggle in quotes or spaces.
    if !is_dns_subdomain(&key.namespace) || !is_dns_subdomain(&key.name) {
        warn(warnings, "namespace or name is not a valid DNS-1123 name; skipped".into());
        return;
    }
    let Some(spec) = &service.spec else {
        warn(warnings, "Service without spec; skipped".into());
        return;
    };
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    if kind == "ExternalName" {
        return; // a DNS alias: nothing to proxy
    }
    let mut raw_cluster_ips: Vec<&String> = spec.cluster_ips.iter().flatten().collect();
    if raw_cluster_ips.is_empty() {
        raw_cluster_ips.extend(spec.cluster_ip.as_ref());
    }
    if raw_cluster_ips.iter().any(|ip| ip.as_str() == "None") {
        return; // headless: DNS returns the endpoints directly
    }
    let (cluster_ips, bad) = parse_ips(raw_cluster_ips.iter().copied().filter(|s| !s.is_empty()));
    for b in bad {
        warn(warnings, format!("invalid clusterIP {b:?} ignored"));
    }
    if cluster_ips.is_empty() {
        warn(warnings, "Service without clusterIP (the API server allocates one); skipped".into());
        return;
    }
    let (external_ips, bad) = parse_ips(spec.external_ips.iter().flatten());
    for b in bad {
        warn(warnings, format!("invalid externalIP {b:?} ignored"));
    }
    let mut load_balancer_ips = Vec::new();
    if kind == "LoadBalancer" {
        let ingress =
            service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        let ips = ingress.into_iter().flatten().filter(|i| i.ip_mode.as_deref() != Some("Proxy"));
        let (ips, bad) = parse_ips(ips.filter_map(|i| i.ip.as_ref()));
        for b in bad {
            warn(warnings, format!("invalid load balancer ingress IP {b:?} ignored"));
        }
        load_balancer_ips = ips;
    }
    let source_ranges =
        if kind == "LoadBalancer" { source_ranges(service, &mut |r| warn(warnings, r)) } else { None };
    let has_node_ports = matches!(kind, "NodePort" | "LoadBalancer");
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| Affinity {
        timeout_seconds: spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT),
    });
    let internal_policy = policy(spec.internal_traffic_policy.as_deref());
    let families: BTreeSet<IpFamily> = cluster_ips.iter().map(IpFamily::of).collect();

    let mut seen = BTreeSet::new();
    for port in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
            warn(warnings, format!("port {}: unknown protocol {:?}; skipped", port.port, port.protocol));
            continue;
        };
        let Some(number) = port_u16(port.port) else {
            warn(warnings, format!("invalid port {}; skipped", port.port));
            continue;
        };
        let port_name = port.name.clone().unwrap_or_default();
        if !port_name.is_empty() && !is_dns_label(&port_name) {
            warn(warnings, format!("port name {port_name:?} is not a valid DNS-1123 label; skipped"));
            continue;
        }
        if !seen.insert((port_name.clone(), protocol)) {
            warn(warnings, format!("port {port_name:?}/{} listed twice; the first wins", protocol.as_str()));
            continue;
        }
        let node_port = if has_node_ports { node_port(port) } else { None };
        let candidates = endpoints.get(&(port_name.clone(), protocol)).map(Vec::as_slice).unwrap_or_default();
        for &family in &families {
            let of_family =
                |ips: &[IpAddr]| ips.iter().filter(|ip| IpFamily::of(ip) == family).copied().collect();
            let mut sp = ServicePort {
                key: ServicePortKey { service: key.clone(), port_name: port_name.clone(), protocol, family },
                port: number,
                cluster_ips: of_family(&cluster_ips),
                node_port,
                external_ips: of_family(&external_ips),
                load_balancer_ips: of_family(&load_balancer_ips),
                source_ranges: source_ranges
                    .as_ref()
                    .map(|r| r.iter().filter(|c| c.family() == family).copied().collect()),
                affinity,
                internal_policy,
                external_policy: TrafficPolicy::Cluster,
                cluster_endpoints: Vec::new(),
                local_endpoints: Vec::new(),
                no_endpoints: false,
            };
            // externalTrafficPolicy only means something for externally reachable services.
            if sp.is_external() {
                sp.external_policy = policy(spec.external_traffic_policy.as_deref());
            }
            let family_candidates: Vec<&Candidate> =
                candidates.iter().filter(|c| IpFamily::of(&c.ip) == family).collect();
            select(&mut sp, &dedup(&family_candidates), config.node_name.as_deref());
            out.push(sp);
        }
    }
}

/// The source ranges of a LoadBalancer Service: `spec.loadBalancerSourceRanges`, else the
/// annotation; `None` when neither lists any. Entries that are not CIDRs are warned about and
/// left out (what remains may be nothing, which admits no one).
fn source_ranges(service: &Service, warn: &mut dyn FnMut(String)) -> Option<Vec<Cidr>> {
    let field: Vec<&str> = service
        .spec
        .iter()
        .flat_map(|s| s.load_balancer_source_ranges.iter().flatten())
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    let (raw, from) = if !field.is_empty() {
        (field, "loadBalancerSourceRanges")
    } else {
        let annotation = service.metadata.annotations.as_ref().and_then(|a| a.get(SOURCE_RANGES_ANNOTATION));
        let raw: Vec<&str> = annotation
            .into_iter()
            .flat_map(|a| a.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        (raw, SOURCE_RANGES_ANNOTATION)
    };
    if raw.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for entry in raw {
        match entry.parse::<Cidr>() {
            Ok(cidr) => out.push(cidr),
            Err(e) => warn(format!("{from}: {e}; left out")),
        }
    }
    if out.is_empty() {
        warn(format!("{from}: no valid range; traffic to the LoadBalancer IPs is dropped"));
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// A DNS-1123 label: at most 63 of `[a-z0-9-]`, starting and ending alphanumeric.
fn is_dns_label(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && alnum(s.chars().next())
        && alnum(s.chars().last())
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn node_port(port: &K8sServicePort) -> Option<u16> {
    port.node_port.and_then(port_u16)
}

/// One candidate per address and port, keeping the most usable copy; sorted.
fn dedup(candidates: &[&Candidate]) -> Vec<Candidate> {
    let mut best: BTreeMap<(IpAddr, u16), Candidate> = BTreeMap::new();
    for c in candidates {
        match best.get(&(c.ip, c.port)) {
            Some(old) if old.rank() >= c.rank() => {}
            _ => {
                best.insert((c.ip, c.port), (*c).clone());
            }
        }
    }
    best.into_values().collect()
}

/// Fills the cluster and local endpoint lists as kube-proxy's `CategorizeEndpoints` does.
fn select(sp: &mut ServicePort, candidates: &[Candidate], node_name: Option<&str>) {
    let uses_cluster = sp.internal_policy == TrafficPolicy::Cluster
        || (sp.is_external() && sp.external_policy == TrafficPolicy::Cluster);
    let uses_local = sp.internal_policy == TrafficPolicy::Local
        || (sp.is_external() && sp.external_policy == TrafficPolicy::Local);
    let is_local = |c: &Candidate| node_name.is_some() && c.node.as_deref() == node_name;
    let pick = |filter: &dyn Fn(&Candidate) -> bool| -> Vec<Endpoint> {
        let ready: Vec<Endpoint> =
            candidates.iter().filter(|c| c.ready && filter(c)).map(Candidate::endpoint).collect();
        if !ready.is_empty() {
            return ready;
        }
        candidates
            .iter()
            .filter(|c| c.serving && c.terminating && filter(c))
            .map(|c| Endpoint { terminating: true, ..c.endpoint() })
            .collect()
    };
    let anywhere = pick(&|_| true);
    sp.no_endpoints = anywhere.is_empty();
    if uses_cluster {
        sp.cluster_endpoints = anywhere;
    }
    if uses_local {
        sp.local_endpoints = pick(&is_local);
    }
}

/// The ruleset node `node-a` plans for manifests `yaml` (for the backends' unit tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn test_ruleset(yaml: &str) -> Ruleset {
    let snapshot: crate::snapshot::Snapshot =
        crate::source::manifest::parse_manifests(yaml).unwrap().into_iter().collect();
    plan(&snapshot, &PlanConfig { node_name: Some("node-a".into()) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::source::manifest::parse_manifests;

    fn run(yaml: &str, node: Option<&str>) -> Ruleset {
        let snapshot: Snapshot = parse_manifests(yaml).unwrap().into_iter().collect();
        plan(&snapshot, &PlanConfig { node_name: node.map(str::to_string) })
    }

    #[test]
    fn load_balancer_source_ranges() {
        let svc = |extra: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: lb\n{extra}spec:\n  type: LoadBalancer\n  \
                 clusterIPs: [10.96.0.10, 'fd00::10']\n  ipFamilies: [IPv4, IPv6]\n  ports: [{{port: 80, nodePort: 30080}}]\n\
                 status: {{loadBalancer: {{ingress: [{{ip: 192.0.2.10}}, {{ip: '2001:db8::10'}}]}}}}\n"
            )
        };
        let ranges = |r: &Ruleset| -> Vec<Option<Vec<String>>> {
            r.services
                .iter()
                .map(|sp| sp.source_ranges.as_ref().map(|v| v.iter().map(ToString::to_string).collect()))
                .collect()
        };
        // None: open.
        let r = run(&svc(""), None);
        assert_eq!(ranges(&r), [None, None]);
        // The field, split by family; a family without a range admits no one.
        let field = svc("")
            .replace("  ports:", "  loadBalancerSourceRanges: [198.51.100.0/24, 10.0.0.0/8]\n  ports:");
        let r = run(&field, None);
        assert_eq!(
            ranges(&r),
            [Some(vec!["10.0.0.0/8".to_string(), "198.51.100.0/24".to_string()]), Some(vec![])]
        );
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // The annotation, when the field is empty; bad entries are left out with a warning.
        let annotated = svc(
            "  annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: \"2001:db8::/32 , nope, 192.0.2.0/24\"}\n",
        );
        let r = run(&annotated, None);
        assert_eq!(
            ranges(&r),
            [Some(vec!["192.0.2.0/24".to_string()]), Some(vec!["2001:db8::/32".to_string()])]
        );
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(r.warnings[0].reason.contains("invalid CIDR \"nope\""), "{:?}", r.warnings);
        // The field wins over the annotation.
        let both = field.replace("metadata:\n  name: lb\n", "metadata:\n  name: lb\n  annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: 192.0.2.0/24}\n");
        assert_eq!(
            ranges(&run(&both, None))[0],
            Some(vec!["10.0.0.0/8".to_string(), "198.51.100.0/24".to_string()])
        );
        // Nothing valid: closed, and said.
        let bad = svc("  annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: \"x, y\"}\n");
        let r = run(&bad, None);
        assert_eq!(ranges(&r), [Some(vec![]), Some(vec![])]);
        assert!(r.warnings.iter().any(|w| w.reason.contains("no valid range")), "{:?}", r.warnings);
        // Only LoadBalancer Services have them.
        let node_port = field.replace("type: LoadBalancer", "type: NodePort");
        assert_eq!(ranges(&run(&node_port, None)), [None, None]);
        // Cidr::contains.
        let cidr: Cidr = "198.51.100.0/24".parse().unwrap();
        assert!(
            cidr.contains(&"198.51.100.7".parse().unwrap())
                && !cidr.contains(&"198.51.101.7".parse().unwrap())
        );
        assert!("::/0".parse::<Cidr>().unwrap().contains(&"2001:db8::1".parse().unwrap()));
        assert!(!"::/0".parse::<Cidr>().unwrap().contains(&"192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn ready_nil_means_ready_and_terminating_only_as_fallback() {
        let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.0.1]
- addresses: [10.244.0.2]
  conditions: {ready: false, serving: true, terminating: true}
"#;
        let r = run(yaml, None);
        assert_eq!(r.services.len(), 1);
        let eps = &r.services[0].cluster_endpoints;
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].ip.to_string(), "10.244.0.1");
        assert_eq!(eps[0].port, 8080);
    }
}
