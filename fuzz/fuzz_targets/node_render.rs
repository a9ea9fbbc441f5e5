//! The node module from arbitrary Services and EndpointSlices (arbitrary names, ports, types,
//! policies, endpoints): `weir::node::plan::plan`, then the iptables (`render`, `restore_text`),
//! nftables (`render`, `transaction`) and ipvs (`render`, `ipset_text`, `tables`, the netlink
//! messages) renderings. No panic, and rule text is never injectable: no name puts a line of its
//! own (`INJ` stands for a payload; a valid name, lower case, cannot hold it), an unbalanced quote
//! or an nft statement into it.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use weir::node::plan::{IpFamily, PlanConfig, plan};
use weir::node::{iptables, ipvs, netlink, nftables};
use weir::snapshot::Snapshot;
use weir::source::manifest::parse_manifests;

#[derive(Arbitrary, Debug)]
struct Svc<'a> {
    namespace: &'a str,
    name: &'a str,
    kind: u8,
    ip: u8,
    local: bool,
    affinity: bool,
    ports: Vec<Port<'a>>,
    endpoints: Vec<Ep<'a>>,
}

#[derive(Arbitrary, Debug)]
struct Port<'a> {
    name: &'a str,
    port: u16,
    target: u16,
    node_port: u16,
    udp: bool,
}

#[derive(Arbitrary, Debug)]
struct Ep<'a> {
    ip: u8,
    node: Option<&'a str>,
    ready: bool,
    serving: bool,
    terminating: bool,
}

fn objects(i: usize, s: &Svc<'_>) -> [serde_json::Value; 2] {
    let kind = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"][usize::from(s.kind % 4)];
    let cluster_ip = if s.ip == 0 { "None".to_string() } else { format!("10.96.{i}.{}", s.ip) };
    let ports = s.ports.iter().take(3);
    let protocol = |p: &Port<'_>| if p.udp { "UDP" } else { "TCP" };
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": s.name, "namespace": s.namespace},
        "spec": {
            "type": kind, "clusterIP": cluster_ip, "externalName": "db.example.com",
            "externalIPs": if s.kind & 8 != 0 { vec!["192.0.2.7"] } else { vec![] },
            "externalTrafficPolicy": if s.local { "Local" } else { "Cluster" },
            "sessionAffinity": if s.affinity { "ClientIP" } else { "None" },
            "ports": ports.clone().map(|p| json!({
                "name": p.name, "port": p.port, "targetPort": p.target,
                "nodePort": p.node_port, "protocol": protocol(p),
            })).collect::<Vec<_>>(),
        }
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("s-{i}"), "namespace": s.namespace,
                     "labels": {"kubernetes.io/service-name": s.name}},
        "addressType": "IPv4",
        "ports": ports.map(|p| json!({"name": p.name, "port": p.target, "protocol": protocol(p)})).collect::<Vec<_>>(),
        "endpoints": s.endpoints.iter().take(4).map(|e| json!({
            "addresses": [format!("10.244.{i}.{}", e.ip)], "nodeName": e.node,
            "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
        })).collect::<Vec<_>>(),
    });
    [service, slice]
}

/// Every line of `text` is weir's own: no payload starts a line or follows a `;`, no quote is
/// left open.
fn check(what: &str, text: &str) {
    for line in text.lines() {
        let injected =
            line.trim_start().starts_with("INJ") || line.contains(";INJ") || line.contains("; INJ");
        assert!(!injected, "a name reached the {what} text: {line:?}");
        assert!(line.matches('"').count() % 2 == 0, "an open quote in the {what} text: {line:?}");
    }
}

fuzz_target!(|input: (Option<&str>, Vec<Svc<'_>>)| {
    let (node, services) = input;
    let text: String = services
        .iter()
        .take(4)
        .enumerate()
        .flat_map(|(i, s)| objects(i, s))
        .map(|o| format!("---\n{o}\n"))
        .collect();
    let Ok(objects) = parse_manifests(&text) else { return };
    let snapshot: Snapshot = objects.into_iter().collect();
    let ruleset = plan(&snapshot, &PlanConfig { node_name: node.map(str::to_string) });
    let cidr = "10.244.0.0/16".parse().ok();

    let config = iptables::Config { cluster_cidr: cidr, ..Default::default() };
    let tables = iptables::render(&ruleset, &config);
    if let Some(text) = iptables::restore_text(None, &tables, &iptables::Tables::default()) {
        check("iptables", &text);
    }

    let config = nftables::Config { cluster_cidr: cidr, ..Default::default() };
    let state = nftables::render(&ruleset, &config);
    if let Some(text) = nftables::transaction(IpFamily::IPv4, None, &state) {
        check("nftables", &text);
    }

    let config = ipvs::Config { scheduler: ipvs::Scheduler::Rr, cluster_cidr: cidr, masquerade_all: false };
    let node_ips = ["192.0.2.1".parse().expect("an address"), "2001:db8::1".parse().expect("an address")];
    let state = ipvs::render(&ruleset, &config, &node_ips);
    for (seq, msg) in (1..).zip(ipvs::messages(&Default::default(), &state.services)) {
        let bytes = netlink::encode(&msg, 0x1d, seq);
        let frames = netlink::decode(&bytes, &ipvs::schema).expect("our own message decodes");
        assert!(matches!(frames.as_slice(), [netlink::Frame::Message(m)] if m.message == msg));
    }
    check("ipset", &ipvs::ipset_text(None, &state.sets));
    if let Some(text) =
        iptables::restore_text(None, &ipvs::tables(&ruleset, &config), &iptables::Tables::default())
    {
        check("ipvs iptables", &text);
    }
});
