//! What the sources drop from objects right after parsing: fields neither translation nor
//! `weir node` reads, which can be most of an object's memory in a real cluster (the
//! `kubectl apply` annotation repeats the whole object; `managedFields` lists every field's
//! owner; every endpoint of a slice names its Pod). Both sources trim the same way (the manifest
//! files after parsing, the API's reflectors before storing), so a table does not depend on
//! where its objects came from. EndpointSlices go further: snapshots and the API's stores hold
//! them as [`crate::snapshot::Slice`]s (what is trimmed here is what a parsed manifest keeps until
//! it is shared).
//!
//! Kept on purpose: everything in Service specs (`weir node` reads most of it), endpoint
//! addresses, conditions and `nodeName` (`weir node` prefers local endpoints), labels (slices
//! name their Service by label) and every other annotation.

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation `kubectl apply` writes: the whole object as last applied, in JSON.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An object the sources trim after parsing.
pub trait Trim {
    /// Drops what nothing reads (and, for lists kept as they are, their spare capacity).
    fn trim(&mut self);
}

fn trim_metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
    }
}

macro_rules! metadata_only {
    ($($kind:ty),*) => {
        $(impl Trim for $kind {
            fn trim(&mut self) {
                trim_metadata(&mut self.metadata);
            }
        })*
    };
}

metadata_only!(Ingress, IngressClass, Service, Secret, ConfigMap);

// The Gateway API objects, and the Namespaces their listeners select by label.
metadata_only!(
    crate::gateway::GatewayClass,
    crate::gateway::Gateway,
    crate::gateway::HttpRoute,
    crate::gateway::GrpcRoute,
    crate::gateway::TlsRoute,
    crate::gateway::ListenerSet,
    crate::gateway::ReferenceGrant,
    k8s_openapi::api::core::v1::Namespace
);

impl Trim for EndpointSlice {
    fn trim(&mut self) {
        trim_metadata(&mut self.metadata);
        // What names the Pod behind an address, its hostname and topology hints go
        // (translation reads addresses and conditions, `weir node` the node name too). The
        // lists keep their spare room: a slice is converted into a `Slice` right after (see the
        // module documentation), which allocates exactly, so shrinking them first would copy
        // every list for nothing.
        for endpoint in &mut self.endpoints {
            endpoint.target_ref = None;
            endpoint.hostname = None;
            endpoint.hints = None;
            endpoint.zone = None;
            endpoint.deprecated_topology = None;
        }
    }
}

impl Trim for Endpoints {
    fn trim(&mut self) {
        trim_metadata(&mut self.metadata);
        for subset in self.subsets.iter_mut().flatten() {
            for list in [&mut subset.addresses, &mut subset.not_ready_addresses].into_iter().flatten() {
                list.shrink_to_fit();
                for address in list {
                    address.target_ref = None;
                    address.hostname = None;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::snapshot::{Object, Snapshot};
    use crate::source::manifest::parse_manifests;
    use crate::translate::{TranslateConfig, translate};

    /// An Ingress, its Service and slice as `kubectl apply` and the API server leave them.
    const APPLIED: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: '{"apiVersion":"networking.k8s.io/v1","kind":"Ingress"}'
    nginx.ingress.kubernetes.io/proxy-body-size: 1m
  managedFields: [{manager: kubectl, operation: Apply, apiVersion: networking.k8s.io/v1}]
spec:
  ingressClassName: weir
  rules:
  - host: shop.example
    http:
      paths:
      - path: /
        pathType: Prefix
        backend: {service: {name: web, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: weir}
spec: {controller: weir.dev/ingress-controller}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  managedFields: [{manager: kube-controller-manager, operation: Update}]
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ["10.0.0.1"]
  conditions: {ready: true}
  nodeName: node-a
  zone: zone-1
  hostname: web-0
  hints: {forZones: [{name: zone-1}]}
  targetRef: {kind: Pod, namespace: shop, name: web-0, uid: 0b6d2d0e-1}
- addresses: ["10.0.0.2"]
  conditions: {ready: false}
  nodeName: node-b
"#;

    #[test]
    fn parsed_objects_lose_what_nothing_reads_and_keep_the_rest() {
        let objects = parse_manifests(APPLIED).unwrap();
        let Object::Ingress(ingress) = &objects[0] else { panic!("{:?}", objects[0]) };
        assert_eq!(ingress.metadata.managed_fields, None);
        let annotations = ingress.metadata.annotations.as_ref().unwrap();
        assert!(!annotations.contains_key(super::LAST_APPLIED), "{annotations:?}");
        assert_eq!(
            annotations.get("nginx.ingress.kubernetes.io/proxy-body-size").map(String::as_str),
            Some("1m")
        );
        let Object::Service(service) = &objects[2] else { panic!("{:?}", objects[2]) };
        assert_eq!(service.metadata.managed_fields, None);
        assert_eq!(service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 80);
        let Object::EndpointSlice(slice) = &objects[3] else { panic!("{:?}", objects[3]) };
        let first = &slice.endpoints[0];
        assert_eq!((&first.target_ref, &first.hostname, &first.zone), (&None, &None, &None));
        assert!(first.hints.is_none());
        // Kept: what translation and `weir node` read.
        assert_eq!(first.addresses, ["10.0.0.1"]);
        assert_eq!(first.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.endpoints[1].conditions.as_ref().and_then(|c| c.ready), Some(false));
        assert_eq!(slice.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"], "web");
    }

    #[test]
    fn trimming_does_not_change_the_table() {
        // The same objects without the trimmed fields translate to the same table: nothing the
        // translation reads was dropped.
        let bare: String = APPLIED
            .lines()
            .filter(|l| {
                !l.contains(super::LAST_APPLIED)
                    && !["managedFields", "zone:", "hostname:", "hints:", "targetRef:"]
                        .iter()
                        .any(|p| l.trim_start().starts_with(p))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        for gone in ["last-applied", "managedFields", "targetRef", "zone"] {
            assert!(!bare.contains(gone), "{bare}");
        }
        let config = TranslateConfig::default();
        let table = |text: &str| {
            let snapshot: Snapshot = parse_manifests(text).unwrap().into_iter().collect();
            translate(&snapshot, &config)
        };
        let (applied, bare) = (table(APPLIED), table(&bare));
        assert_eq!(applied.table, bare.table);
        assert!(applied.warnings.is_empty(), "{:?}", applied.warnings);
        assert_eq!(applied.table.hosts.len(), 1);
        assert_eq!(applied.table.hosts[0].routes[0].policy.max_body_bytes, Some(1 << 20));
    }
}
