//! Which node announces which LoadBalancer address (pure).
//!
//! Every node computes the same answer from the same inputs, without talking to the others:
//! among the *eligible* nodes, the one with the highest rendezvous score (highest random weight
//! hashing) of (address, node name) announces the address. When a node leaves, only the
//! addresses it announced move (each to the node with the next highest score); the others stay
//! where they are. A node is eligible when it is live (its Lease is fresh, or its Node object
//! is Ready in `--manifests` mode), it is not labelled [`EXCLUDE_LABEL`], and, for an address of
//! a Service with `externalTrafficPolicy: Local`, it holds a ready endpoint of that Service.
//!
//! The score is a hash of our own (FNV-1a then a 64-bit finalizer), fixed here and tested with
//! golden values: nodes running different weir versions must still agree.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use serde::Serialize;
use weir_dataplane::model::ObjectRef;

use super::ipam::ClassConfig;
use super::status_ips;
use crate::snapshot::Snapshot;

/// Nodes with this label never announce (as for cloud load balancers).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// A node as the election sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Member {
    /// The node's name.
    pub name: String,
    /// Whether it is alive (fresh Lease, or Node Ready).
    pub live: bool,
    /// Whether it carries [`EXCLUDE_LABEL`].
    pub excluded: bool,
}

impl Member {
    /// Whether it may announce addresses of Services with the `Cluster` policy.
    pub fn eligible(&self) -> bool {
        self.live && !self.excluded
    }
}

/// An address to announce and what constrains its announcer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    /// The address.
    pub address: IpAddr,
    /// The Services using it (several when shared).
    pub services: Vec<ObjectRef>,
    /// With `externalTrafficPolicy: Local`: the only nodes allowed (those holding a ready
    /// endpoint of every `Local` Service using the address). `None`: any eligible node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_nodes: Option<BTreeSet<String>>,
}

/// The rendezvous score of `node` for `address`: the node with the highest score announces.
pub fn score(address: &IpAddr, node: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    match address {
        IpAddr::V4(a) => eat(&a.octets()),
        IpAddr::V6(a) => eat(&a.octets()),
    }
    // A separator no node name contains, so that (address, name) pairs never collide by
    // concatenation.
    eat(&[0xff]);
    eat(node.as_bytes());
    // splitmix64's finalizer: FNV's low bits alone spread poorly.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The candidate with the highest [`score`] for `address` (ties, which need a 64-bit
/// collision, go to the smaller name).
pub fn choose<'a>(address: &IpAddr, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates.into_iter().map(|n| (score(address, n), std::cmp::Reverse(n))).max().map(|(_, n)| n.0)
}

/// The announcer of every target (`None`: no eligible node, nobody announces).
pub fn elect(targets: &[Target], members: &[Member]) -> BTreeMap<IpAddr, Option<String>> {
    targets
        .iter()
        .map(|t| {
            let eligible = members
                .iter()
                .filter(|m| m.eligible())
                .map(|m| m.name.as_str())
                .filter(|n| t.local_nodes.as_ref().is_none_or(|nodes| nodes.contains(*n)));
            (t.address, choose(&t.address, eligible).map(str::to_string))
        })
        .collect()
}

/// The addresses to announce: the status addresses of the Services `class` handles, each with
/// the Services using it and, for `externalTrafficPolicy: Local`, the nodes holding a ready
/// endpoint. Sorted by address.
pub fn targets(snapshot: &Snapshot, class: &ClassConfig) -> Vec<Target> {
    let ready_nodes = ready_nodes_by_service(snapshot);
    let empty = BTreeSet::new();
    let mut out: BTreeMap<IpAddr, Target> = BTreeMap::new();
    for (key, svc) in &snapshot.services {
        if !class.handles(svc) {
            continue;
        }
        let local = is_local(svc).then(|| ready_nodes.get(key).unwrap_or(&empty));
        for address in status_ips(svc) {
            let target = out.entry(address).or_insert_with(|| Target {
                address,
                services: Vec::new(),
                local_nodes: None,
            });
            target.services.push(key.clone());
            if let Some(nodes) = local {
                target.local_nodes = Some(match target.local_nodes.take() {
                    None => nodes.clone(),
                    Some(before) => before.intersection(nodes).cloned().collect(),
                });
            }
        }
    }
    out.into_values().collect()
}

fn is_local(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local")
}

/// Per Service: the nodes holding one of its ready endpoints (EndpointSlices, else Endpoints).
fn ready_nodes_by_service(snapshot: &Snapshot) -> BTreeMap<ObjectRef, BTreeSet<String>> {
    let mut out: BTreeMap<ObjectRef, BTreeSet<String>> = BTreeMap::new();
    for (key, slice) in &snapshot.endpoint_slices {
        let Some(service) = &slice.service else { continue };
        let nodes = out.entry(ObjectRef::new(key.namespace.clone(), service.clone())).or_default();
        nodes.extend(
            slice
                .endpoints
                .iter()
                .filter(|e| e.ready)
                .filter_map(|e| e.node_name.as_deref().map(String::from)),
        );
    }
    for (key, endpoints) in &snapshot.endpoints {
        if out.contains_key(key) {
            continue;
        }
        let nodes: BTreeSet<String> = endpoints
            .subsets
            .iter()
            .flatten()
            .flat_map(|s| s.addresses.iter().flatten())
            .filter_map(|a| a.node_name.clone())
            .collect();
        out.insert(key.clone(), nodes);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn member(name: &str) -> Member {
        Member { name: name.to_string(), live: true, excluded: false }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn target(address: &str) -> Target {
        Target { address: ip(address), services: vec![ObjectRef::new("default", "web")], local_nodes: None }
    }

    #[test]
    fn the_score_is_fixed_across_versions() {
        // Golden values (computed independently): a change here makes nodes running different
        // versions disagree.
        assert_eq!(score(&ip("203.0.113.10"), "node-a"), 0x10ee_4900_3bfa_2cbb);
        assert_eq!(score(&ip("2001:db8::10"), "node-b"), 0x595a_14c1_34fd_a9f4);
        // Address and name are not concatenated ambiguously.
        assert_ne!(score(&ip("10.0.0.1"), "1"), score(&ip("10.0.0.11"), ""));
    }

    #[test]
    fn every_node_reaches_the_same_answer_whatever_the_order() {
        let members = [member("node-a"), member("node-b"), member("node-c")];
        let mut reversed = members.clone();
        reversed.reverse();
        let targets: Vec<Target> = (0..50).map(|i| target(&format!("203.0.113.{i}"))).collect();
        let one = elect(&targets, &members);
        assert_eq!(one, elect(&targets, &reversed));
        // The addresses are spread: every node announces some.
        for m in &members {
            let count = one.values().filter(|n| n.as_deref() == Some(m.name.as_str())).count();
            assert!(count >= 5, "{} announces {count} of 50: {one:?}", m.name);
        }
    }

    #[test]
    fn only_the_addresses_of_a_node_that_leaves_move() {
        let members: Vec<Member> = (0..5).map(|i| member(&format!("node-{i}"))).collect();
        let targets: Vec<Target> = (0..100).map(|i| target(&format!("198.51.100.{i}"))).collect();
        let before = elect(&targets, &members);
        let mut after_members = members.clone();
        after_members[2].live = false;
        let after = elect(&targets, &after_members);
        let mut moved = 0;
        for (address, node) in &before {
            if node.as_deref() == Some("node-2") {
                moved += 1;
                assert_ne!(after[address].as_deref(), Some("node-2"));
                assert!(after[address].is_some());
            } else {
                assert_eq!(&after[address], node, "{address} moved though its node stayed");
            }
        }
        assert!(moved > 0, "node-2 announced nothing: {before:?}");
        // It comes back: everything returns where it was.
        assert_eq!(elect(&targets, &members), before);
    }

    #[test]
    fn excluded_dead_and_endpointless_nodes_are_not_eligible() {
        let a = ip("203.0.113.7");
        let mut members = vec![member("node-a"), member("node-b"), member("node-c")];
        let all = elect(&[target("203.0.113.7")], &members)[&a].clone().unwrap();
        // The winner excluded by label: another node.
        let winner = members.iter_mut().find(|m| m.name == all).unwrap();
        winner.excluded = true;
        let second = elect(&[target("203.0.113.7")], &members)[&a].clone().unwrap();
        assert_ne!(second, all);
        // The second dead too: the third.
        members.iter_mut().find(|m| m.name == second).unwrap().live = false;
        let third = elect(&[target("203.0.113.7")], &members)[&a].clone().unwrap();
        assert!(third != all && third != second);
        // Nobody left: nobody announces.
        members.iter_mut().for_each(|m| m.live = false);
        assert_eq!(elect(&[target("203.0.113.7")], &members)[&a], None);

        // Local policy: only nodes with a ready endpoint, even if another would score higher.
        let members = vec![member("node-a"), member("node-b"), member("node-c")];
        for only in ["node-a", "node-b", "node-c"] {
            let mut t = target("203.0.113.7");
            t.local_nodes = Some([only.to_string()].into());
            assert_eq!(elect(&[t], &members)[&a].as_deref(), Some(only));
        }
        let mut t = target("203.0.113.7");
        t.local_nodes = Some(BTreeSet::new());
        assert_eq!(elect(&[t], &members)[&a], None);
    }

    #[test]
    fn targets_come_from_handled_services_with_local_endpoint_nodes() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
            spec: {type: LoadBalancer, externalTrafficPolicy: Local, ports: [{port: 80}]}\n\
            status: {loadBalancer: {ingress: [{ip: 203.0.113.10}, {ip: '2001:db8::10'}]}}\n---\n\
            apiVersion: v1\nkind: Service\nmetadata: {name: other-class, namespace: default}\n\
            spec: {type: LoadBalancer, loadBalancerClass: example.com/lb, ports: [{port: 80}]}\n\
            status: {loadBalancer: {ingress: [{ip: 203.0.113.11}]}}\n---\n\
            apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: default}\n\
            spec: {type: LoadBalancer, ports: [{port: 81}]}\n\
            status: {loadBalancer: {ingress: [{ip: 203.0.113.10}]}}\n---\n\
            apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
            metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\n\
            addressType: IPv4\nports: [{port: 8080}]\nendpoints:\n\
            - {addresses: [10.244.1.11], nodeName: node-b, conditions: {ready: true}}\n\
            - {addresses: [10.244.1.12], nodeName: node-c, conditions: {ready: false}}\n";
        let snapshot: Snapshot =
            crate::source::manifest::parse_manifests(text).unwrap().into_iter().collect();
        let targets = targets(&snapshot, &ClassConfig::default());
        assert_eq!(targets.len(), 2, "{targets:?}");
        assert_eq!(targets[0].address, ip("203.0.113.10"));
        assert_eq!(targets[0].services, [ObjectRef::new("default", "api"), ObjectRef::new("default", "web")]);
        assert_eq!(targets[0].local_nodes, Some(["node-b".to_string()].into()));
        assert_eq!(targets[1].address, ip("2001:db8::10"));
        let members = vec![member("node-a"), member("node-b"), member("node-c")];
        let chosen = elect(&targets, &members);
        assert!(chosen.values().all(|n| n.as_deref() == Some("node-b")), "{chosen:?}");
    }
}
