//! Backend resolution: a Service port named by an Ingress → ready endpoints (or a DNS name).
//!
//! Endpoints come from the Service's EndpointSlices (`kubernetes.io/service-name` label); only
//! when a Service has no EndpointSlice at all are the core v1 Endpoints read. A problem with the
//! Service (missing, no such port) still yields a backend with no endpoints, so the route exists
//! and answers 503, as ingress-nginx does, rather than falling through to another route.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use weir_dataplane::fast::HashMap;

use k8s_openapi::api::core::v1::{Endpoints, Service, ServicePort as K8sServicePort};
use weir_dataplane::model::{Backend, BackendId, Endpoint, ObjectRef, ServicePort, Target, UpstreamProtocol};

use super::Snapshot;
use super::warnings::Reason;
use crate::snapshot::Slice;

/// Why a backend cannot reach its Service as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Error {
    /// No such Service.
    #[error("Service {service} not found")]
    ServiceNotFound {
        /// The Service.
        service: ObjectRef,
    },
    /// The Service has no such port.
    #[error("Service {service} has no port {port}")]
    PortNotFound {
        /// The Service.
        service: ObjectRef,
        /// The port as the Ingress names it.
        port: ServicePort,
    },
    /// An ExternalName Service without `spec.externalName`.
    #[error("Service {service} is of type ExternalName but has no spec.externalName")]
    NoExternalName {
        /// The Service.
        service: ObjectRef,
    },
}

impl Error {
    /// The warning reason for this error.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            Error::ServiceNotFound { .. } => Reason::ServiceNotFound,
            Error::PortNotFound { .. } => Reason::ServicePortNotFound,
            Error::NoExternalName { .. } => Reason::InvalidService,
        }
    }
}

/// The EndpointSlices of each Service (by the `kubernetes.io/service-name` label). A slice is in
/// its Service's namespace: names are enough.
#[derive(Clone, Debug, Default)]
pub(crate) struct SliceIndex {
    /// Slices (their names and the objects, shared with the snapshot) by Service.
    by_service: HashMap<ObjectRef, Vec<(String, Arc<Slice>)>>,
    /// The Service name of each indexed slice, made on the first [`SliceIndex::update`] (only
    /// updates need it).
    service_of: Option<HashMap<ObjectRef, String>>,
}

impl SliceIndex {
    /// The index of every slice of `snapshot`.
    pub(crate) fn new(snapshot: &Snapshot) -> Self {
        let mut index = SliceIndex::default();
        for (key, slice) in snapshot.endpoint_slices.shared() {
            index.insert(key, slice);
        }
        index
    }

    /// Indexes `slice`; returns its Service.
    fn insert(&mut self, key: &ObjectRef, slice: &Arc<Slice>) -> Option<ObjectRef> {
        let service = ObjectRef::new(key.namespace.clone(), slice.service.clone()?);
        if let Some(reverse) = &mut self.service_of {
            reverse.insert(key.clone(), service.name.clone());
        }
        let entry = (key.name.clone(), slice.clone());
        match self.by_service.get_mut(&service) {
            Some(slices) => {
                slices.push(entry);
                slices.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            }
            None => {
                self.by_service.insert(service.clone(), vec![entry]);
            }
        }
        Some(service)
    }

    /// Makes the slice → Service map, if it is not made yet.
    pub(crate) fn prepare(&mut self) {
        if self.service_of.is_none() {
            let reverse = self
                .by_service
                .iter()
                .flat_map(|(service, slices)| {
                    slices.iter().map(|(n, _)| {
                        (ObjectRef::new(service.namespace.clone(), n.clone()), service.name.clone())
                    })
                })
                .collect();
            self.service_of = Some(reverse);
        }
    }

    /// Re-indexes the slice `key` as it is in `snapshot` (or drops it if it is gone); returns the
    /// Services whose slices changed (its old and its new one).
    pub(crate) fn update(&mut self, key: &ObjectRef, snapshot: &Snapshot) -> Vec<ObjectRef> {
        self.prepare();
        let mut touched = Vec::new();
        if let Some(old) = self.service_of.as_mut().and_then(|r| r.remove(key)) {
            let old = ObjectRef::new(key.namespace.clone(), old);
            if let Some(slices) = self.by_service.get_mut(&old) {
                slices.retain(|(n, _)| *n != key.name);
                if slices.is_empty() {
                    self.by_service.remove(&old);
                }
            }
            touched.push(old);
        }
        if let Some(new) = snapshot.endpoint_slices.get_shared(key).and_then(|slice| self.insert(key, slice))
            && !touched.contains(&new)
        {
            touched.push(new);
        }
        touched
    }

    fn slices(&self, service: &ObjectRef) -> Option<Vec<&Slice>> {
        Some(self.by_service.get(service)?.iter().map(|(_, slice)| &**slice).collect())
    }
}

/// Resolves backends against a snapshot.
pub(crate) struct Resolver<'a> {
    snapshot: &'a Snapshot,
    slices: &'a SliceIndex,
}

impl<'a> Resolver<'a> {
    pub(crate) fn new(snapshot: &'a Snapshot, slices: &'a SliceIndex) -> Self {
        Resolver { snapshot, slices }
    }

    /// The backend for `id` (one that answers 503 if the Service cannot serve it, and why).
    pub(crate) fn resolve(&self, id: &BackendId) -> (Backend, Option<Error>) {
        match self.resolve_uncached(id) {
            Ok(backend) => (backend, None),
            Err(error) => (empty(), Some(error)),
        }
    }

    /// [`Resolver::resolve`] for a Service port of transport `protocol` (`TCP` or `UDP`).
    pub(crate) fn resolve_protocol(&self, id: &BackendId, protocol: &str) -> (Backend, Option<Error>) {
        match self.resolve_uncached_of(id, protocol) {
            Ok(backend) => (backend, None),
            Err(error) => (empty(), Some(error)),
        }
    }

    fn resolve_uncached(&self, id: &BackendId) -> Result<Backend, Error> {
        self.resolve_uncached_of(id, "TCP")
    }

    fn resolve_uncached_of(&self, id: &BackendId, protocol: &str) -> Result<Backend, Error> {
        let service_ref = ObjectRef::new(id.namespace.clone(), id.service.clone());
        let service = self
            .snapshot
            .services
            .get(&service_ref)
            .ok_or_else(|| Error::ServiceNotFound { service: service_ref.clone() })?;
        let spec = service.spec.as_ref();
        let port = find_port_of(service, &id.port, protocol);
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            let host = spec
                .and_then(|s| s.external_name.as_deref())
                .filter(|h| !h.is_empty())
                .ok_or_else(|| Error::NoExternalName { service: service_ref.clone() })?;
            let number = match (&id.port, port) {
                (ServicePort::Number(n), _) => *n,
                (ServicePort::Name(_), Some(p)) => {
                    u16::try_from(p.port).ok().filter(|n| *n != 0).ok_or_else(|| Error::PortNotFound {
                        service: service_ref.clone(),
                        port: id.port.clone(),
                    })?
                }
                (ServicePort::Name(_), None) => {
                    return Err(Error::PortNotFound { service: service_ref, port: id.port.clone() });
                }
            };
            return Ok(Backend {
                protocol: UpstreamProtocol::default(),
                target: Target::Dns { host: host.to_string(), port: number },
                tls: None,
            });
        }
        let port =
            port.ok_or_else(|| Error::PortNotFound { service: service_ref.clone(), port: id.port.clone() })?;
        let port_name = port.name.as_deref().unwrap_or("");
        let endpoints = match self.slices.slices(&service_ref) {
            Some(slices) => from_slices(&slices, port_name),
            None => self
                .snapshot
                .endpoints
                .get(&service_ref)
                .map(|e| from_endpoints(e, port_name))
                .unwrap_or_default(),
        };
        Ok(Backend {
            protocol: UpstreamProtocol::default(),
            target: Target::Endpoints(endpoints.into_iter().map(Endpoint::new).collect()),
            tls: None,
        })
    }
}

impl Resolver<'_> {
    /// `service-upstream`: the Service's ClusterIP and port (the port the Ingress names, not its
    /// target port) as the one endpoint, so kube-proxy (or `weir node`) picks the pod.
    /// `Ok(None)` for an ExternalName Service, which has no ClusterIP and keeps its DNS name.
    pub(crate) fn cluster_ip(&self, id: &BackendId) -> Result<Option<SocketAddr>, String> {
        let service_ref = ObjectRef::new(id.namespace.clone(), id.service.clone());
        let Some(service) = self.snapshot.services.get(&service_ref) else {
            return Err(format!("Service {service_ref} not found"));
        };
        let spec = service.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            return Ok(None);
        }
        let ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or_default();
        if ip.is_empty() || ip.eq_ignore_ascii_case("none") {
            return Err(format!("Service {service_ref} is headless (no ClusterIP)"));
        }
        let ip: IpAddr =
            ip.parse().map_err(|_| format!("Service {service_ref} has an invalid ClusterIP {ip:?}"))?;
        let port = find_port(service, &id.port)
            .and_then(|p| u16::try_from(p.port).ok())
            .ok_or_else(|| format!("Service {service_ref} has no port {}", id.port))?;
        Ok(Some(SocketAddr::new(ip, port)))
    }
}

/// A backend that answers 503.
fn empty() -> Backend {
    Backend { protocol: UpstreamProtocol::default(), target: Target::Endpoints(Vec::new()), tls: None }
}

/// The Service port an Ingress names: by `port` number (TCP ports only) or by `name`.
fn find_port<'s>(service: &'s Service, port: &ServicePort) -> Option<&'s K8sServicePort> {
    find_port_of(service, port, "TCP")
}

/// The Service port `port` of transport `protocol` (`TCP`, the default, or `UDP`).
fn find_port_of<'s>(service: &'s Service, port: &ServicePort, protocol: &str) -> Option<&'s K8sServicePort> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let of_protocol = |p: &&K8sServicePort| p.protocol.as_deref().unwrap_or("TCP") == protocol;
    match port {
        ServicePort::Number(n) => ports.iter().filter(of_protocol).find(|p| p.port == i32::from(*n)),
        ServicePort::Name(name) => {
            ports.iter().filter(of_protocol).find(|p| p.name.as_deref() == Some(name.as_str()))
        }
    }
}

/// Ready, non-terminating endpoints of a Service's slices, on the slice port named like the
/// Service port (an unnamed port is named ""), sorted and without duplicates.
fn from_slices(slices: &[&Slice], port_name: &str) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
        else {
            continue;
        };
        // FQDN slices (deprecated) name hosts, not addresses: they have no endpoints here.
        out.extend(
            slice
                .endpoints
                .iter()
                .filter(|e| e.ready && !e.terminating)
                .map(|e| SocketAddr::new(e.address, port)),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Ready addresses of a core v1 Endpoints object (never `notReadyAddresses`), on the subset port
/// named like the Service port.
fn from_endpoints(endpoints: &Endpoints, port_name: &str) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for subset in endpoints.subsets.as_deref().unwrap_or_default() {
        let Some(port) = subset
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| u16::try_from(p.port).ok())
            .filter(|p| *p != 0)
        else {
            continue;
        };
        for address in subset.addresses.as_deref().unwrap_or_default() {
            if let Ok(ip) = address.ip.parse::<IpAddr>() {
                out.push(SocketAddr::new(ip, port));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
