//! End-to-end tests of `weir node`'s iptables and nftables modes in network namespaces (root
//! only; skipped with a reason otherwise, failed instead when `WEIR_REQUIRE_ALL=1`).
//!
//! A "node" namespace runs the rules, three "pod" namespaces on its bridge run responders that
//! answer with their name, and a "client" namespace connects through the node.

#![allow(clippy::unwrap_used)]

mod support_netns;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use support_netns::{NODE_IP, POD_PORT, Testbed, iptables_state, need_tools, pod_ip, pod_name, skip};
use weir::node::exec::Runner;
use weir::node::plan::{PlanConfig, Ruleset, plan};
use weir::node::{iptables, ipvs, nftables};
use weir::snapshot::Snapshot;
use weir::source::manifest::parse_manifests;

/// Entry point of the helper processes (responders, clients); a no-op in a normal run.
#[test]
fn netns_helper() {
    support_netns::helper_main();
}

/// Where each pod runs.
const NODES: [&str; 3] = ["node-a", "node-a", "node-b"];

/// An endpoint of a slice: pod index and readiness.
#[derive(Clone, Copy)]
struct Ep {
    pod: usize,
    ready: bool,
}

fn service(name: &str, ip: &str, extra: &str, ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  clusterIP: {ip}\n{extra}  ports:\n{ports}---\n"
    )
}

fn slice(service: &str, eps: &[Ep], ports: &str) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-1\n  namespace: default\n  \
         labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports:\n{ports}endpoints:\n"
    );
    for ep in eps {
        let _ = writeln!(
            s,
            "- addresses: [{}]\n  nodeName: {}\n  conditions: {{ready: {}}}",
            pod_ip(ep.pod),
            NODES[ep.pod],
            ep.ready
        );
    }
    s.push_str("---\n");
    s
}

/// The test's Services; `web` has the given endpoints, the others all three pods.
fn manifests(web: &[Ep]) -> String {
    let all = [Ep { pod: 0, ready: true }, Ep { pod: 1, ready: true }, Ep { pod: 2, ready: true }];
    let web_ports = format!(
        "  - {{name: http, port: 80, targetPort: {POD_PORT}, nodePort: 30080}}\n  \
         - {{name: dns, port: 53, protocol: UDP, targetPort: {POD_PORT}}}\n"
    );
    let slice_ports =
        format!("- {{name: http, port: {POD_PORT}}}\n- {{name: dns, port: {POD_PORT}, protocol: UDP}}\n");
    let one_port = format!("  - {{port: 80, targetPort: {POD_PORT}, nodePort: 30081}}\n");
    let one_slice_port = format!("- {{port: {POD_PORT}}}\n");
    let mut m = String::new();
    m += &service("web", "10.96.0.10", "  type: NodePort\n", &web_ports);
    m += &slice("web", web, &slice_ports);
    m += &service(
        "sticky",
        "10.96.0.11",
        "  sessionAffinity: ClientIP\n",
        &format!("  - {{port: 80, targetPort: {POD_PORT}}}\n"),
    );
    m += &slice("sticky", &all, &one_slice_port);
    m += &service("empty", "10.96.0.12", "", &web_ports.replace(", nodePort: 30080", ""));
    m += &service("local", "10.96.0.13", "  type: NodePort\n  externalTrafficPolicy: Local\n", &one_port);
    m += &slice("local", &all, &one_slice_port);
    m
}

fn ruleset(yaml: &str) -> Ruleset {
    let snapshot: Snapshot = parse_manifests(yaml).unwrap().into_iter().collect();
    let r = plan(&snapshot, &PlanConfig { node_name: Some("node-a".into()) });
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    r
}

/// The backend under test, with what the test checks of a sync.
enum Under {
    Iptables(iptables::Iptables),
    Nftables(nftables::Nftables),
}

/// What a sync did: written anything, how much (commands or rules) of how much, conntrack.
#[derive(Debug)]
struct Synced {
    written: bool,
    amount: usize,
    total: usize,
    conntrack_flushes: usize,
}

impl Under {
    fn new(nft: bool, runner: Runner) -> Self {
        let cidr = Some("10.244.0.0/16".parse().unwrap());
        if nft {
            Under::Nftables(nftables::Nftables::new(
                runner,
                nftables::Config { cluster_cidr: cidr, ..Default::default() },
            ))
        } else {
            Under::Iptables(iptables::Iptables::new(
                runner,
                iptables::Config { cluster_cidr: cidr, ..Default::default() },
            ))
        }
    }

    fn sync(&mut self, ruleset: &Ruleset) -> Synced {
        match self {
            Under::Iptables(b) => {
                let s = b.sync(ruleset, false).unwrap();
                Synced {
                    written: s.written,
                    amount: s.rules_written,
                    total: s.rules_total,
                    conntrack_flushes: s.conntrack_flushes,
                }
            }
            Under::Nftables(b) => {
                let s = b.sync(&std::sync::Arc::new(ruleset.clone()), false).unwrap();
                Synced {
                    written: s.written,
                    amount: s.commands,
                    total: s.rules_total,
                    conntrack_flushes: s.conntrack_flushes,
                }
            }
        }
    }
}

/// The namespace's netfilter state as the mode's own tool shows it, without counters:
/// `iptables-save`, or `nft -s list ruleset`. (iptables-nft leaves the empty built-in base
/// chains it created on first use, so an nft listing after iptables mode differs by those,
/// which iptables shows as existing all along; they are not weir's to delete.)
fn tables_state(node: &support_netns::Netns, nft: bool) -> String {
    if nft { node.exec("nft", &["-s", "list", "ruleset"]).unwrap() } else { iptables_state(node) }
}

fn count(t: &BTreeMap<String, usize>, key: &str) -> usize {
    t.get(key).copied().unwrap_or(0)
}

#[test]
fn iptables_mode_end_to_end() {
    end_to_end(false);
}

#[test]
fn nftables_mode_end_to_end() {
    end_to_end(true);
}

fn end_to_end(nft: bool) {
    let tools: &[&str] = if nft { &["nft", "conntrack"] } else { &["iptables-restore", "conntrack"] };
    if let Err(reason) = need_tools(tools) {
        return skip(&reason);
    }
    let mut bed = match Testbed::new(3) {
        Ok(bed) => bed,
        Err(reason) => return skip(&reason),
    };
    bed.start_responders().unwrap();
    let node = &bed.node;

    // Someone else's rules, which weir must leave alone.
    node.exec("iptables", &["-t", "nat", "-N", "FOREIGN"]).unwrap();
    node.exec("iptables", &["-t", "nat", "-A", "FOREIGN", "-j", "RETURN"]).unwrap();
    node.exec("iptables", &["-t", "nat", "-A", "PREROUTING", "-s", "10.99.0.0/16", "-j", "FOREIGN"]).unwrap();
    node.exec("iptables", &["-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"]).unwrap();
    node.exec(
        "nft",
        &["add table inet foreign; add chain inet foreign c { type filter hook input priority 0; }"],
    )
    .unwrap();
    node.exec("nft", &["add rule inet foreign c tcp dport 9 accept"]).unwrap();
    let before = tables_state(node, nft);

    let runner = Runner::netns(&node.name);
    let mut ipt = Under::new(nft, runner.clone());
    let all = [Ep { pod: 0, ready: true }, Ep { pod: 1, ready: true }, Ep { pod: 2, ready: true }];
    let stats = ipt.sync(&ruleset(&manifests(&all)));
    assert!(stats.written);

    // The ClusterIP reaches every endpoint, roughly uniformly.
    let t = bed.client("10.96.0.10:80", 600, "tcp").unwrap();
    for i in 0..3 {
        assert!(count(&t, &pod_name(i)) >= 120, "ClusterIP split is not uniform: {t:?}");
    }
    // From the node itself (nat OUTPUT) too.
    let t = bed.client_in(&bed.node, "10.96.0.10:80", 30, "tcp").unwrap();
    assert_eq!((0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>(), 30, "{t:?}");
    // From a pod to its own service: hairpin traffic (to itself) is masqueraded, or it fails.
    let t = bed.client_in(&bed.pods[0], "10.96.0.10:80", 30, "tcp").unwrap();
    assert_eq!((0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>(), 30, "{t:?}");
    assert!(count(&t, "pod1") > 0, "no hairpin connection made (pod1 to itself): {t:?}");
    // UDP.
    let t = bed.client("10.96.0.10:53", 30, "udp").unwrap();
    assert_eq!((0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>(), 30, "{t:?}");

    // ClientIP affinity sticks.
    let t = bed.client("10.96.0.11:80", 40, "tcp").unwrap();
    assert_eq!(t.len(), 1, "affinity does not stick: {t:?}");
    assert!(t.keys().all(|k| k.starts_with("pod")), "{t:?}");

    // NodePort from the client namespace.
    let t = bed.client(&format!("{NODE_IP}:30080"), 60, "tcp").unwrap();
    assert_eq!((0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>(), 60, "{t:?}");
    assert!(t.len() >= 2, "NodePort reaches one endpoint only: {t:?}");

    // No endpoints: rejected at once (an ICMP port unreachable makes `refused`; a silent drop
    // would end in `timeout` after the client's 2 s connect timeout).
    let t = bed.client("10.96.0.12:80", 3, "tcp").unwrap();
    assert_eq!(count(&t, "refused"), 3, "{t:?}");
    let t = bed.client("10.96.0.12:53", 2, "udp").unwrap();
    assert_eq!(count(&t, "refused"), 2, "{t:?}");

    // externalTrafficPolicy Local: the node port uses node-a's pods only; the ClusterIP all.
    let t = bed.client(&format!("{NODE_IP}:30081"), 100, "tcp").unwrap();
    assert_eq!(count(&t, "pod1") + count(&t, "pod2"), 100, "eTP Local used a remote endpoint: {t:?}");
    assert!(count(&t, "pod1") > 0 && count(&t, "pod2") > 0, "{t:?}");
    let t = bed.client("10.96.0.13:80", 60, "tcp").unwrap();
    assert!(count(&t, "pod3") > 0, "internal traffic is Cluster: {t:?}");

    // Nothing changed: nothing is written.
    let stats = ipt.sync(&ruleset(&manifests(&all)));
    assert!(!stats.written, "{stats:?}");

    // A UDP flow from a fixed port sticks to its conntrack entry...
    let t = bed.client("10.96.0.10:53", 1, "udp-fixed").unwrap();
    let hit = (0..3).find(|i| count(&t, &pod_name(*i)) == 1).unwrap_or_else(|| panic!("{t:?}"));
    // ...until its endpoint goes away. Another endpoint turns not ready.
    let (gone, not_ready, left) = (hit, (hit + 1) % 3, (hit + 2) % 3);
    let web = [Ep { pod: not_ready, ready: false }, Ep { pod: left, ready: true }];
    let stats = ipt.sync(&ruleset(&manifests(&web)));
    assert!(stats.written && stats.conntrack_flushes > 0, "{stats:?}");
    assert!(stats.amount < stats.total / 2, "a partial sync rewrites little: {stats:?}");
    let t = bed.client("10.96.0.10:80", 200, "tcp").unwrap();
    assert_eq!(count(&t, &pod_name(left)), 200, "removed or not-ready endpoints got connections: {t:?}");
    let t = bed.client("10.96.0.10:53", 1, "udp-fixed").unwrap();
    assert_eq!(
        count(&t, &pod_name(left)),
        1,
        "stale UDP conntrack entry kept (was {}): {t:?}",
        pod_name(gone)
    );

    // --cleanup leaves the tables as they were.
    weir::node::cleanup(&runner).unwrap();
    let after = tables_state(node, nft);
    assert_eq!(before, after, "cleanup left differences");
    let t = bed.client("10.96.0.10:80", 3, "tcp").unwrap();
    assert_eq!((0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>(), 0, "{t:?}");
}

/// The admin listener inside the node namespace (its own loopback: no clash with the host).
const ADMIN: &str = "127.0.0.1:10256";

/// Polls `check` every 100 ms for up to `secs` seconds.
fn eventually(secs: u64, mut check: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// `weir node --mode ipvs --manifests DIR` on a kernel without IPVS: logs the fallback, programs
/// iptables, follows manifest changes, repairs a deleted jump; `--cleanup` restores the tables.
#[test]
fn weir_node_follows_manifests_and_falls_back_from_ipvs() {
    weir_node("ipvs");
}

/// The same with `--mode nftables`; the deleted object is the whole table.
#[test]
fn weir_node_nftables_follows_manifests() {
    weir_node("nftables");
}

fn weir_node(mode: &str) {
    let nft = mode == "nftables";
    let mut bed = match Testbed::new(3) {
        Ok(bed) => bed,
        Err(reason) => return skip(&reason),
    };
    bed.start_responders().unwrap();
    let node = &bed.node;
    node.exec("iptables", &["-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"]).unwrap();
    node.exec("iptables", &["-t", "nat", "-A", "POSTROUTING", "-s", "10.99.0.0/16", "-j", "RETURN"]).unwrap();
    let before = tables_state(node, nft);

    let dir = tempfile::tempdir().unwrap();
    let manifests_dir = dir.path().join("manifests");
    std::fs::create_dir(&manifests_dir).unwrap();
    let all = [Ep { pod: 0, ready: true }, Ep { pod: 1, ready: true }, Ep { pod: 2, ready: true }];
    std::fs::write(manifests_dir.join("svc.yaml"), manifests(&all)).unwrap();
    let log = dir.path().join("node.log");
    let role = format!(
        "node --mode {mode} --manifests {} --node-name node-a --cluster-cidr 10.244.0.0/16 \
         --min-sync-interval 100ms --sync-period 1s --listen-admin {ADMIN}",
        manifests_dir.display()
    );
    let weir_node = support_netns::spawn_logged(&node.name, &role, &log).unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    let all_answer = |n: usize| -> Result<BTreeMap<String, usize>, String> {
        let t = bed.client("10.96.0.10:80", n, "tcp")?;
        let answered = (0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>();
        if answered == n { Ok(t) } else { Err(format!("{t:?}")) }
    };
    eventually(10, || all_answer(5).map(drop))
        .unwrap_or_else(|e| panic!("rules never applied: {e}\nlog:\n{}", read_log()));
    if mode == "ipvs" && !std::path::Path::new("/proc/net/ip_vs").exists() {
        assert!(read_log().contains("IPVS is unavailable"), "fallback not logged:\n{}", read_log());
    }

    // The admin listener: healthy once rules are synced, and the sync metrics.
    let metric = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
    };
    let (status, body) = support_netns::http_get(node, ADMIN, "/healthz").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"healthy\":true"), "{body}");
    let (status, text) = support_netns::http_get(node, ADMIN, "/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(metric(&text, "weir_node_syncs_total") >= 1.0, "{text}");
    assert!(metric(&text, "weir_node_sync_duration_seconds_count") >= 1.0, "{text}");
    assert!(metric(&text, "weir_node_rules") > 10.0, "{text}");
    assert!(metric(&text, "weir_node_rules_written_total") > 10.0, "{text}");
    assert_eq!(metric(&text, "weir_node_sync_failures_total"), 0.0, "{text}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let last = metric(&text, "weir_node_last_sync_timestamp_seconds");
    assert!(last > now - 3600.0 && last <= now + 1.0, "last sync {last}, now {now}");

    // A manifest change is applied.
    std::fs::write(manifests_dir.join("svc.yaml"), manifests(&[Ep { pod: 0, ready: true }])).unwrap();
    eventually(10, || {
        let t = all_answer(20)?;
        if count(&t, "pod1") == 20 { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("change never applied: {e}\nlog:\n{}", read_log()));

    // A jump (iptables) or the table (nftables) deleted behind weir's back is restored by the
    // periodic resync.
    if nft {
        node.exec("nft", &["delete", "table", "ip", "weir"]).unwrap();
    } else {
        let jump = ["-m", "comment", "--comment", "weir service portals", "-j", "WEIR-SERVICES"];
        node.exec("iptables", &[&["-t", "nat", "-D", "PREROUTING"][..], &jump].concat()).unwrap();
    }
    eventually(10, || {
        all_answer(3)?;
        if read_log().contains("missing; restored") { Ok(()) } else { Err("no repair logged".into()) }
    })
    .unwrap_or_else(|e| panic!("jump never restored: {e}\nlog:\n{}", read_log()));
    if std::env::var_os("WEIR_SHOW_LOG").is_some() {
        eprintln!("{}", read_log());
    }

    drop(weir_node);
    let cleanup_log = dir.path().join("cleanup.log");
    let mut cleanup = support_netns::spawn_logged(&node.name, "node --cleanup", &cleanup_log).unwrap();
    let status = cleanup.0.wait().unwrap();
    assert!(status.success(), "{}", std::fs::read_to_string(&cleanup_log).unwrap_or_default());
    assert_eq!(before, tables_state(node, nft), "cleanup left differences");
}

/// ipvs mode's ipsets and iptables rules load into a real kernel and follow changes
/// incrementally, and `--cleanup` removes them. (The IPVS table itself cannot be tested on a
/// kernel without IPVS: its netlink messages are checked against `node_fixtures/*/ipvs.expected`.)
#[test]
fn ipvs_mode_sets_and_rules_load_and_clean_up() {
    if let Err(reason) = need_tools(&["iptables-restore", "ipset"]) {
        return skip(&reason);
    }
    let bed = match Testbed::new(0) {
        Ok(bed) => bed,
        Err(reason) => return skip(&reason),
    };
    let node = &bed.node;
    // Someone else's rules and set, which weir must leave alone (and tables that exist before
    // weir: iptables-nft leaves the base chains it creates).
    node.exec("iptables", &["-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"]).unwrap();
    node.exec("iptables", &["-t", "nat", "-A", "POSTROUTING", "-s", "10.99.0.0/16", "-j", "RETURN"]).unwrap();
    node.exec("ipset", &["create", "FOREIGN", "hash:ip"]).unwrap();
    let state = || format!("{}\n{}", iptables_state(node), node.exec("ipset", &["list", "-n"]).unwrap());
    let before = state();
    let runner = Runner::netns(&node.name);
    let config = ipvs::Config { cluster_cidr: Some("10.244.0.0/16".parse().unwrap()), ..Default::default() };
    let node_ips = [NODE_IP.parse().unwrap()];
    let all = [Ep { pod: 0, ready: true }, Ep { pod: 1, ready: true }, Ep { pod: 2, ready: true }];
    let r1 = ruleset(&manifests(&all));
    let s1 = ipvs::render(&r1, &config, &node_ips);

    // IPVS is programmed over weir node's own netlink socket: never through another namespace.
    let mut backend = ipvs::Ipvs::new(runner.clone(), config.clone());
    assert!(matches!(backend.sync(&r1, true), Err(ipvs::Error::ForeignNamespace)));
    assert_eq!(before, state(), "a refused sync changed something");

    // A full sync's sets, twice (as after a restart), then the rules that use them.
    let full = ipvs::ipset_text(None, &s1.sets);
    runner.run("ipset", &["restore", "-exist"], Some(&full)).unwrap();
    runner.run("ipset", &["restore", "-exist"], Some(&full)).unwrap();
    let mut ipt = iptables::Iptables::new(
        runner.clone(),
        iptables::Config { family: None, cluster_cidr: config.cluster_cidr, masquerade_all: false },
    );
    ipt.apply(ipvs::tables(&r1, &config), true).unwrap();
    let saved = node.exec("iptables-save", &["-t", "nat"]).unwrap();
    assert!(saved.contains("--match-set WEIR-CLUSTER-IP dst,dst"), "{saved}");
    let test = |set: &str, entry: &str| node.exec("ipset", &["test", set, entry]).is_ok();
    assert!(test("WEIR-CLUSTER-IP", "10.96.0.10,tcp:80"));
    assert!(test("WEIR-CLUSTER-IP", "10.96.0.10,udp:53"));
    assert!(!test("WEIR-CLUSTER-IP", "10.96.0.12,tcp:80"), "a service without endpoints is masqueraded");
    assert!(test("WEIR-NODE-PORT-TCP", "30080"));
    assert!(!test("WEIR-NODE-PORT-TCP", "30081"), "externalTrafficPolicy Local is masqueraded");
    let loop2 = format!("{0},tcp:{POD_PORT},{0}", pod_ip(1));
    assert!(test("WEIR-LOOP-BACK", &loop2));

    // The last endpoints of `web` gone: its entries leave the sets; endpoints that other
    // services still use stay; its ClusterIP is now rejected by the filter table.
    let r2 = ruleset(&manifests(&[]));
    let s2 = ipvs::render(&r2, &config, &node_ips);
    let partial = ipvs::ipset_text(Some(&s1.sets), &s2.sets);
    let expected = [
        "del WEIR-CLUSTER-IP 10.96.0.10,tcp:80",
        "del WEIR-CLUSTER-IP 10.96.0.10,udp:53",
        "del WEIR-LOOP-BACK 10.244.1.11,udp:8080,10.244.1.11",
        "del WEIR-LOOP-BACK 10.244.1.12,udp:8080,10.244.1.12",
        "del WEIR-LOOP-BACK 10.244.1.13,udp:8080,10.244.1.13",
        "del WEIR-NODE-PORT-TCP 30080",
        "",
    ]
    .join("\n");
    assert_eq!(partial, expected);
    runner.run("ipset", &["restore", "-exist"], Some(&partial)).unwrap();
    assert!(!test("WEIR-CLUSTER-IP", "10.96.0.10,tcp:80"));
    assert!(!test("WEIR-NODE-PORT-TCP", "30080"));
    assert!(test("WEIR-LOOP-BACK", &loop2));
    let stats = ipt.apply(ipvs::tables(&r2, &config), false).unwrap();
    assert_eq!(stats.chains_written, 2, "only the filter chains that reject change: {stats:?}");
    let saved = node.exec("iptables-save", &["-t", "filter"]).unwrap();
    assert!(
        saved.lines().any(|l| l.contains("-d 10.96.0.10/32 -p tcp")
            && l.ends_with("-j REJECT --reject-with icmp-port-unreachable")),
        "{saved}"
    );

    // --cleanup: iptables first (its rules refer to the sets), then the sets.
    weir::node::cleanup(&runner).unwrap();
    assert_eq!(before, state(), "cleanup left differences");
}

/// A failed apply leaves the rules as they were (iptables-restore commits a table or nothing)
/// and the next sync, once the obstacle is gone, rewrites everything.
#[test]
fn iptables_failed_apply_keeps_the_previous_rules() {
    let mut bed = match Testbed::new(3) {
        Ok(bed) => bed,
        Err(reason) => return skip(&reason),
    };
    bed.start_responders().unwrap();
    let node = &bed.node;
    let runner = Runner::netns(&node.name);
    let mut ipt = iptables::Iptables::new(
        runner.clone(),
        iptables::Config { cluster_cidr: Some("10.244.0.0/16".parse().unwrap()), ..Default::default() },
    );
    let all = [Ep { pod: 0, ready: true }, Ep { pod: 1, ready: true }, Ep { pod: 2, ready: true }];
    let r1 = ruleset(&manifests(&all));
    ipt.sync(&r1, false).unwrap();

    // Someone else's chain jumps to the endpoint chain of pod3: deleting that chain fails.
    let web = r1.services.iter().find(|sp| sp.key.service.name == "web" && sp.port == 80).unwrap();
    let pod3 = web.cluster_endpoints.iter().find(|e| e.ip.to_string() == pod_ip(2)).unwrap();
    let sep = iptables::sep_chain(&web.key, pod3);
    node.exec("iptables", &["-t", "nat", "-N", "FOREIGN"]).unwrap();
    node.exec("iptables", &["-t", "nat", "-A", "FOREIGN", "-j", &sep]).unwrap();
    let nat_before = node.exec("iptables-save", &["-t", "nat"]).unwrap();
    let strip = |s: &str| s.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");

    let r2 = ruleset(&manifests(&all[..2]));
    let error = ipt.sync(&r2, false).unwrap_err();
    assert!(error.to_string().contains("iptables-restore"), "{error}");
    let nat_after = node.exec("iptables-save", &["-t", "nat"]).unwrap();
    assert_eq!(strip(&nat_before), strip(&nat_after), "a failed apply changed the nat table");
    let t = bed.client("10.96.0.10:80", 60, "tcp").unwrap();
    assert!(count(&t, "pod3") > 0, "the previous rules no longer work: {t:?}");

    // The obstacle gone, the retry (a full sync) applies the change.
    node.exec("iptables", &["-t", "nat", "-F", "FOREIGN"]).unwrap();
    ipt.sync(&r2, false).unwrap();
    let t = bed.client("10.96.0.10:80", 60, "tcp").unwrap();
    assert_eq!(count(&t, "pod1") + count(&t, "pod2"), 60, "{t:?}");
    weir::node::cleanup(&runner).unwrap();
}

/// nftables mode: a refused transaction leaves the table as it was (the kernel applies a batch
/// whole or not at all) and the next sync, once the obstacle is gone, recreates the table.
#[test]
fn nftables_failed_apply_keeps_the_previous_rules() {
    let mut bed = match Testbed::new(3) {
        Ok(bed) => bed,
        Err(reason) => return skip(&reason),
    };
    bed.start_responders().unwrap();
    let node = &bed.node;
    let runner = Runner::netns(&node.name);
    let mut nft = nftables::Nftables::new(
        runner.clone(),
        nftables::Config { cluster_cidr: Some("10.244.0.0/16".parse().unwrap()), ..Default::default() },
    );
    let all = [Ep { pod: 0, ready: true }, Ep { pod: 1, ready: true }, Ep { pod: 2, ready: true }];
    let r1 = std::sync::Arc::new(ruleset(&manifests(&all)));
    nft.sync(&r1, false).unwrap();

    // Someone else's chain in weir's table jumps to web's service chain: deleting it fails.
    let web = r1.services.iter().find(|sp| sp.key.service.name == "web" && sp.port == 80).unwrap();
    let chain = nftables::service_chain(&web.key);
    node.exec("nft", &["add chain ip weir foreign"]).unwrap();
    node.exec("nft", &[&format!("add rule ip weir foreign goto {chain}")]).unwrap();
    let before = node.exec("nft", &["-s", "list", "table", "ip", "weir"]).unwrap();

    // web loses every endpoint (its chain goes), and sticky one: the batch is refused whole.
    let r2 = std::sync::Arc::new(ruleset(&manifests(&[])));
    let error = nft.sync(&r2, false).unwrap_err();
    assert!(error.to_string().contains("delete chain"), "{error}");
    let after = node.exec("nft", &["-s", "list", "table", "ip", "weir"]).unwrap();
    assert_eq!(before, after, "a refused transaction changed the table");
    let t = bed.client("10.96.0.10:80", 60, "tcp").unwrap();
    assert_eq!(
        (0..3).map(|i| count(&t, &pod_name(i))).sum::<usize>(),
        60,
        "the previous rules no longer work: {t:?}"
    );

    // The next sync recreates the table (the foreign chain goes with it) and applies r2.
    let stats = nft.sync(&r2, false).unwrap();
    assert!(stats.written);
    let t = bed.client("10.96.0.10:80", 3, "tcp").unwrap();
    assert_eq!(count(&t, "refused"), 3, "{t:?}");
    weir::node::cleanup(&runner).unwrap();
}
