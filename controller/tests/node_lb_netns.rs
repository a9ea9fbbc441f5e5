//! `weir node --manifests DIR --load-balancer` in network namespaces (root only; skipped with a
//! reason otherwise, failed instead when `WEIR_REQUIRE_ALL=1`): pools read from the directory
//! (an invalid one refused, the others used), addresses assigned and programmed so that a
//! client outside the node reaches the pods through them, and `loadBalancerSourceRanges` (the
//! field, then the annotation) dropping clients outside the ranges, in iptables and nftables
//! modes.
//!
//! The test bed of `support_netns`: a node namespace with three pods on its bridge, and a
//! client namespace (192.0.2.2) routing everything through the node.

#![allow(clippy::unwrap_used)]

mod support_netns;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use support_netns::{CLIENT_IP, POD_PORT, Testbed, need_tools, pod_ip, pod_name, skip};

/// Entry point of the helper processes (responders, clients, weir node); a no-op in a normal run.
#[test]
fn netns_helper() {
    support_netns::helper_main();
}

const ADMIN: &str = "127.0.0.1:10256";

const POOLS: &str = "apiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\nmetadata: {name: lan}\n\
spec: {addresses: [203.0.113.10-203.0.113.13]}\n---\n\
apiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\nmetadata: {name: inverted}\n\
spec: {addresses: [203.0.113.30-203.0.113.20]}\n";

/// A LoadBalancer Service `name` (port 80 to the pods) with `extra` metadata and spec lines,
/// and its EndpointSlice with every pod ready.
fn service(name: &str, cluster_ip: &str, annotations: &str, spec: &str) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{{annotations}}}\n\
         spec:\n  type: LoadBalancer\n  clusterIP: {cluster_ip}\n{spec}  ports:\n  - {{port: 80, targetPort: {POD_PORT}}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  \
         labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports:\n- {{port: {POD_PORT}}}\nendpoints:\n"
    );
    for i in 0..3 {
        let _ =
            writeln!(s, "- addresses: [{}]\n  nodeName: node-a\n  conditions: {{ready: true}}", pod_ip(i));
    }
    s.push_str("---\n");
    s
}

/// The two Services: `web` takes an address from the pool; `shielded` asks for 203.0.113.12
/// and admits `ranges` (in the field, or in the annotation when `annotation`).
fn services(ranges: &[&str], annotation: bool) -> String {
    let list = ranges.join(", ");
    let (annotations, spec) = if annotation {
        (format!("service.beta.kubernetes.io/load-balancer-source-ranges: \"{list}\", "), String::new())
    } else {
        (String::new(), format!("  loadBalancerSourceRanges: [{list}]\n"))
    };
    service("web", "10.96.0.20", "", "")
        + &service(
            "shielded",
            "10.96.0.21",
            &format!("{annotations}weir.dev/load-balancer-ips: 203.0.113.12"),
            &spec,
        )
}

fn answered(t: &BTreeMap<String, usize>) -> usize {
    (0..3).map(|i| t.get(&pod_name(i)).copied().unwrap_or(0)).sum()
}

/// Polls `check` every 100 ms for up to `secs` seconds.
fn eventually(secs: u64, mut check: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn manifests_load_balancer_iptables() {
    run("iptables");
}

#[test]
fn manifests_load_balancer_nftables() {
    run("nftables");
}

fn run(mode: &str) {
    let tools: &[&str] = if mode == "nftables" { &["nft"] } else { &["iptables-restore"] };
    if let Err(reason) = need_tools(tools) {
        return skip(&reason);
    }
    let mut bed = match Testbed::new(3) {
        Ok(bed) => bed,
        Err(reason) => return skip(&reason),
    };
    bed.start_responders().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("pools.yaml"), POOLS).unwrap();
    // The client is outside the admitted range.
    write(&manifests, &services(&["198.51.100.0/24"], false));
    let log = dir.path().join("node.log");
    let role = format!(
        "node --mode {mode} --manifests {} --load-balancer --node-name node-a --cluster-cidr 10.244.0.0/16 \
         --min-sync-interval 100ms --sync-period 1s --listen-admin {ADMIN}",
        manifests.display()
    );
    let weir_node = support_netns::spawn_logged(&bed.node.name, &role, &log).unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // The first address of the pool, reached from outside the node.
    let started = Instant::now();
    eventually(15, || {
        let t = bed.client("203.0.113.10:80", 6, "tcp")?;
        if answered(&t) == 6 && t.len() >= 2 { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("the assigned address never answered: {e}\nlog:\n{}", read_log()));
    println!(
        "MEASURED weir node start to the LoadBalancer address answering: {} ms",
        started.elapsed().as_millis()
    );
    let text = read_log();
    assert!(
        text.lines().any(|l| l.contains("IPAddressPool inverted: spec.addresses[0]")
            && l.contains("the first address is after the last")
            && l.contains("the other pools are used")),
        "the invalid pool is not reported:\n{text}"
    );

    // The requested address, with the client outside its source ranges: dropped (a timeout,
    // not a refusal).
    let t = bed.client("203.0.113.12:80", 2, "tcp").unwrap();
    assert_eq!(t.get("timeout"), Some(&2), "a client outside loadBalancerSourceRanges got through: {t:?}");
    // Its ClusterIP is not restricted.
    let t = bed.client_in(&bed.node, "10.96.0.21:80", 3, "tcp").unwrap();
    assert_eq!(answered(&t), 3, "{t:?}");

    // The client's network admitted: served.
    write(&manifests, &services(&["198.51.100.0/24", &format!("{CLIENT_IP}/32")], false));
    eventually(10, || {
        let t = bed.client("203.0.113.12:80", 3, "tcp")?;
        if answered(&t) == 3 { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("the admitted client is not served: {e}\nlog:\n{}", read_log()));

    // The annotation, without the field: the same.
    write(&manifests, &services(&["198.51.100.0/24"], true));
    eventually(10, || {
        let t = bed.client("203.0.113.12:80", 1, "tcp")?;
        if t.get("timeout") == Some(&1) { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("the annotation is not enforced: {e}\nlog:\n{}", read_log()));
    write(&manifests, &services(&["192.0.2.0/24"], true));
    eventually(10, || {
        let t = bed.client("203.0.113.12:80", 3, "tcp")?;
        if answered(&t) == 3 { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("the annotation's admitted client is not served: {e}\nlog:\n{}", read_log()));
    // The other Service kept its address throughout.
    let t = bed.client("203.0.113.10:80", 3, "tcp").unwrap();
    assert_eq!(answered(&t), 3, "{t:?}");

    drop(weir_node);
    weir::node::cleanup(&weir::node::exec::Runner::netns(&bed.node.name)).unwrap();
}

/// Replaces the Services' manifest at once (write, then rename).
fn write(dir: &Path, text: &str) {
    let tmp = dir.join(".services.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("services.yaml")).unwrap();
}
