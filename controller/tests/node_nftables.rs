//! nftables mode writes over nf_tables netlink what its `nft -f` text says: for every node
//! fixture, in both families, a full sync and then partial syncs (to the next fixture, and one
//! endpoint removed) are applied over netlink in one namespace and through `nft -f` in another,
//! and `nft -j list table` must show the same table in both (root only; skipped with a reason
//! otherwise, failed instead when `WEIR_REQUIRE_ALL=1`).

#![allow(clippy::unwrap_used)]

mod support_diff;
mod support_netns;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use support_netns::{Testbed, skip};
use weir::node::exec::Runner;
use weir::node::nftables;
use weir::node::plan::{IpFamily, PlanConfig, Ruleset, plan};
use weir::snapshot::Snapshot;
use weir::source::manifest::parse_manifests;

fn fixtures() -> Vec<(String, Ruleset)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node_fixtures");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("input.yaml").is_file())
        .collect();
    cases.sort();
    cases
        .iter()
        .map(|case| {
            let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
            let snapshot: Snapshot = parse_manifests(&input).unwrap().into_iter().collect();
            let name = case.file_name().unwrap().to_string_lossy().into_owned();
            (name, plan(&snapshot, &PlanConfig { node_name: Some("node-a".into()) }))
        })
        .collect()
}

/// `nft -j list table`, without handles, with set elements sorted (hash sets list in hash
/// order, which differs between namespaces).
fn listing(ns: &support_netns::Netns, family: &str) -> serde_json::Value {
    let text = ns.exec("nft", &["-j", "list", "table", family, "weir"]).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    fn clean(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("handle");
                if let Some(serde_json::Value::Array(elems)) = map.get_mut("elem") {
                    elems.sort_by_key(|e| e.to_string());
                }
                map.values_mut().for_each(clean);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(clean),
            _ => {}
        }
    }
    clean(&mut v);
    v
}

/// The ruleset with the last endpoint of every service port removed (ports left without
/// endpoints, and slots freed, included).
fn one_endpoint_less(r: &Ruleset) -> Ruleset {
    let mut r = r.clone();
    for sp in &mut r.services {
        sp.cluster_endpoints.pop();
        sp.local_endpoints.pop();
    }
    r
}

#[test]
fn netlink_and_nft_write_the_same_table() {
    let (a, b) = match (Testbed::new(0), Testbed::new(0)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(reason), _) | (_, Err(reason)) => return skip(&reason),
    };
    let cases = fixtures();
    assert!(cases.len() >= 12);
    for (family, word, cidr) in
        [(IpFamily::IPv4, "ip", "10.244.0.0/16"), (IpFamily::IPv6, "ip6", "fd00:10:244::/56")]
    {
        let config = nftables::Config {
            family: Some(family),
            cluster_cidr: Some(cidr.parse().unwrap()),
            masquerade_all: false,
        };
        let mut netlink = nftables::Nftables::new(Runner::netns(&a.node.name), config.clone());
        let mut nft = nftables::Nftables::with_nft(Runner::netns(&b.node.name), config);
        let mut steps: Vec<(String, Ruleset, bool)> = Vec::new();
        for (name, ruleset) in &cases {
            steps.push((format!("{name} (full sync)"), ruleset.clone(), true));
            steps.push((format!("{name} (one endpoint less)"), one_endpoint_less(ruleset), false));
            steps.push((format!("{name} (back)"), ruleset.clone(), false));
        }
        // Partial syncs from each fixture to the next (ports added and removed).
        for (name, ruleset) in &cases {
            steps.push((format!("{name} (partial, after the previous fixture)"), ruleset.clone(), false));
        }
        for (what, ruleset, full) in steps {
            let ruleset = Arc::new(ruleset);
            let s1 = netlink.sync(&ruleset, full).unwrap_or_else(|e| panic!("{word} {what}: netlink: {e}"));
            let s2 = nft.sync(&ruleset, full).unwrap_or_else(|e| panic!("{word} {what}: nft: {e}"));
            assert_eq!(s1, s2, "{word} {what}");
            let (l1, l2) = (listing(&a.node, word), listing(&b.node, word));
            if l1 != l2 {
                let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap();
                panic!(
                    "{word} {what}: the tables differ (- netlink, + nft):\n{}",
                    support_diff::diff(&pretty(&l1), &pretty(&l2))
                );
            }
        }
    }
}
