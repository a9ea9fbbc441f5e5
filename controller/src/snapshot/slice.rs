//! weir's own EndpointSlice: what translation and `weir node` read of a `discovery.k8s.io/v1`
//! EndpointSlice, and nothing else.
//!
//! Endpoints are most of what a large cluster holds, and the API type spends 352 bytes on each
//! (plus a list and a string per address, and a whole B-tree node for the one label that names
//! the Service), where weir reads an address, three conditions and a node name. Both sources
//! convert a slice into a [`Slice`] as soon as it is parsed or received (the file source when it
//! shares a parsed object, the Kubernetes source before its reflector stores it), so a snapshot
//! and the API stores hold about 40 bytes per endpoint; at 100,000 endpoints that is ~45 MB less
//! resident memory (bench/RESULTS.md).
//!
//! The conversion applies the API's defaults and the rules every reader followed anyway: only the
//! first address of an endpoint counts (the API says consumers may use the first one only), an
//! address that does not parse for the slice's address type is dropped (the API server validates
//! them), `ready` defaults to true, `serving` to `ready`, `terminating` to false, and a slice of
//! any other address type than IPv4 or IPv6 (FQDN, deprecated) has no endpoints.

use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// An EndpointSlice as weir keeps it (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slice {
    /// Name, namespace, uid and resourceVersion of the slice (labels, annotations and the rest
    /// are dropped: the one label read is [`Slice::service`]).
    pub metadata: ObjectMeta,
    /// The Service the slice belongs to (label `kubernetes.io/service-name`); `None` when the
    /// label is missing or empty.
    pub service: Option<String>,
    /// The slice's address type.
    pub address_type: AddressType,
    /// The slice's ports, as the API gives them.
    pub ports: Vec<EndpointPort>,
    /// Its endpoints whose first address parses, in the API's order.
    pub endpoints: Vec<SliceEndpoint>,
}

/// The address type of a slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AddressType {
    /// `IPv4`.
    #[default]
    Ipv4,
    /// `IPv6`.
    Ipv6,
    /// `FQDN` (deprecated) or a type weir does not know: such slices have no endpoints.
    Other,
}

/// One endpoint of a [`Slice`].
#[derive(Clone, Debug, PartialEq)]
pub struct SliceEndpoint {
    /// Its first address.
    pub address: IpAddr,
    /// `conditions.ready` (unset: true).
    pub ready: bool,
    /// `conditions.serving` (unset: as `ready`).
    pub serving: bool,
    /// `conditions.terminating` (unset: false).
    pub terminating: bool,
    /// The node it runs on, if the slice says.
    pub node_name: Option<Box<str>>,
}

impl From<EndpointSlice> for Slice {
    fn from(slice: EndpointSlice) -> Slice {
        let EndpointSlice { address_type, endpoints, metadata, ports } = slice;
        let service = metadata
            .labels
            .and_then(|mut labels| labels.remove(SERVICE_NAME_LABEL))
            .filter(|name| !name.is_empty());
        let metadata = ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            ..ObjectMeta::default()
        };
        let address_type = match address_type.as_str() {
            "IPv4" => AddressType::Ipv4,
            "IPv6" => AddressType::Ipv6,
            _ => AddressType::Other,
        };
        let parse: fn(&str) -> Option<IpAddr> = match address_type {
            AddressType::Ipv4 => |a| a.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
            AddressType::Ipv6 => |a| a.parse::<IpAddr>().ok(),
            AddressType::Other => |_| None,
        };
        // A new list, not `collect` from `into_iter`: that would keep the API list's allocation
        // (352 bytes per endpoint) for 40-byte endpoints.
        let mut kept = Vec::with_capacity(endpoints.len());
        kept.extend(endpoints.into_iter().filter_map(|endpoint| {
            let address = endpoint.addresses.first().and_then(|a| parse(a))?;
            let conditions = endpoint.conditions.unwrap_or_default();
            let ready = conditions.ready.unwrap_or(true);
            Some(SliceEndpoint {
                address,
                ready,
                serving: conditions.serving.unwrap_or(ready),
                terminating: conditions.terminating.unwrap_or(false),
                node_name: endpoint.node_name.map(String::into_boxed_str),
            })
        }));
        Slice { metadata, service, address_type, ports: ports.unwrap_or_default(), endpoints: kept }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The slice of a manifest whose `apiVersion` and `kind` lines are left out.
    fn parse(body: &str) -> Slice {
        let yaml = format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n{body}");
        Slice::from(serde_saphyr::from_str::<EndpointSlice>(&yaml).unwrap())
    }

    #[test]
    fn keeps_what_readers_use_and_applies_the_api_defaults() {
        let slice = parse(
            r#"
metadata:
  name: web-abc
  namespace: shop
  uid: u-1
  resourceVersion: "7"
  labels: {kubernetes.io/service-name: web, other: x}
  annotations: {a: b}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.0.0.1, 10.0.0.9]
  nodeName: node-a
- addresses: [10.0.0.2]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: ["not-an-ip"]
- addresses: ["fd00::1"]
"#,
        );
        assert_eq!(slice.metadata.name.as_deref(), Some("web-abc"));
        assert_eq!(slice.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(slice.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(slice.metadata.labels, None);
        assert_eq!(slice.metadata.annotations, None);
        assert_eq!(slice.service.as_deref(), Some("web"));
        assert_eq!(slice.address_type, AddressType::Ipv4);
        assert_eq!(slice.ports.len(), 1);
        assert_eq!(slice.ports[0].port, Some(8080));
        // The list is allocated for the endpoints kept, not reused from the API's (which holds
        // four 352-byte endpoints: room for 35 of these).
        assert!(slice.endpoints.capacity() <= 4, "{}", slice.endpoints.capacity());
        // The unparsable address and the IPv6 address in an IPv4 slice are dropped.
        assert_eq!(
            slice.endpoints,
            vec![
                SliceEndpoint {
                    address: "10.0.0.1".parse().unwrap(),
                    ready: true,
                    serving: true,
                    terminating: false,
                    node_name: Some("node-a".into()),
                },
                SliceEndpoint {
                    address: "10.0.0.2".parse().unwrap(),
                    ready: false,
                    serving: true,
                    terminating: true,
                    node_name: None,
                },
            ]
        );
    }

    #[test]
    fn serving_defaults_to_ready_and_fqdn_slices_have_no_endpoints() {
        let slice = parse(
            r#"
metadata: {name: s, labels: {kubernetes.io/service-name: ""}}
addressType: IPv6
endpoints:
- addresses: ["fd00::1"]
  conditions: {ready: false}
- addresses: ["10.0.0.3"]
"#,
        );
        assert_eq!(slice.service, None, "an empty service-name label names no Service");
        assert_eq!(slice.address_type, AddressType::Ipv6);
        assert_eq!(slice.endpoints.len(), 2, "IPv6 slices accept what parses as an address");
        assert!(!slice.endpoints[0].ready && !slice.endpoints[0].serving);
        assert!(slice.endpoints[1].ready && slice.endpoints[1].serving);
        let fqdn = parse(
            r#"
metadata: {name: s, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
endpoints: [{addresses: [db.example.com]}]
"#,
        );
        assert_eq!(fqdn.address_type, AddressType::Other);
        assert!(fqdn.endpoints.is_empty());
    }
}
