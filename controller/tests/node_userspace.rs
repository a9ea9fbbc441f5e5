//! End-to-end tests of `weir node --mode userspace` in network namespaces (root only; skipped
//! with a reason otherwise, failed instead when `WEIR_REQUIRE_ALL=1`): `weir node` runs as a
//! process in the "node" namespace, its proxy ports bound there and its redirects in that
//! namespace's kernel; pods answer with their name; a client namespace connects through the
//! node.

#![allow(clippy::unwrap_used)]

mod support_netns;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use support_netns::{
    Helper, NODE_IP, POD_PORT, Testbed, eventually, iptables_state, need_tools, pod_ip, pod_name, skip,
};

/// Entry point of the helper processes (responders, clients, weir node); a no-op in a normal
/// run.
#[test]
fn netns_helper() {
    // This file's own role: an IPv6 responder (the shared ones listen on IPv4).
    if let Ok(role) = std::env::var(support_netns::ROLE_ENV)
        && let Some(args) = role.strip_prefix("responder6 ")
    {
        responder6(args);
        return;
    }
    support_netns::helper_main();
}

/// Answers each TCP connection to `ADDR` ([v6]:port) with `NAME`: `responder6 NAME ADDR`.
fn responder6(args: &str) {
    use std::io::Write as _;
    let (name, addr) = args.split_once(' ').unwrap();
    let listener = std::net::TcpListener::bind(addr).unwrap();
    let reply = format!("{name}\n");
    for mut s in listener.incoming().flatten() {
        let _ = s.write_all(reply.as_bytes());
    }
}

/// The admin listener inside the node namespace (its own loopback: no clash with the host).
const ADMIN: &str = "127.0.0.1:10256";

fn service(name: &str, ip: &str, extra: &str, ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  clusterIP: {ip}\n{extra}  ports:\n{ports}---\n"
    )
}

/// An EndpointSlice of `service` named `suffix`: `addresses` (ready) on `ports`.
fn slice(service: &str, suffix: &str, addresses: &[String], ports: &str) -> String {
    slice_of("IPv4", service, suffix, addresses, ports)
}

/// The same of `family` (`IPv4`, `IPv6`).
fn slice_of(family: &str, service: &str, suffix: &str, addresses: &[String], ports: &str) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{suffix}\n  \
         namespace: default\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\n\
         ports:\n{ports}endpoints:\n"
    );
    for a in addresses {
        let _ = writeln!(s, "- addresses: [{a}]\n  nodeName: node-a\n  conditions: {{ready: true}}");
    }
    s.push_str("---\n");
    s
}

/// The test's Services:
/// - `web` (NodePort 30080; TCP 80 and UDP 53) on the pods `web`;
/// - `flaky` on pod1's port 8081, where nothing listens (refused), an address no host has (the
///   connect times out), and pod2 and pod3;
/// - `sticky`, ClientIP affinity for 2 s, on every pod;
/// - `late`, only when `late` is set (a Service added while weir node runs).
fn manifests(web: &[usize], late: bool) -> String {
    let all: Vec<String> = (0..3).map(pod_ip).collect();
    let mut m = String::new();
    let web_ports = format!(
        "  - {{name: http, port: 80, targetPort: {POD_PORT}, nodePort: 30080}}\n  \
         - {{name: dns, port: 53, protocol: UDP, targetPort: {POD_PORT}}}\n"
    );
    let slice_ports =
        format!("- {{name: http, port: {POD_PORT}}}\n- {{name: dns, port: {POD_PORT}, protocol: UDP}}\n");
    m += &service("web", "10.96.0.10", "  type: NodePort\n", &web_ports);
    m += &slice("web", "1", &web.iter().map(|i| pod_ip(*i)).collect::<Vec<_>>(), &slice_ports);
    let one = format!("  - {{port: 80, targetPort: {POD_PORT}}}\n");
    let one_slice = format!("- {{port: {POD_PORT}}}\n");
    m += &service("flaky", "10.96.0.14", "", &one);
    m += &slice("flaky", "1", &[pod_ip(0)], "- {port: 8081}\n");
    m += &slice("flaky", "2", &[pod_ip(1), pod_ip(2), "10.244.1.99".to_string()], &one_slice);
    m += &service(
        "sticky",
        "10.96.0.11",
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 2}}\n",
        &one,
    );
    m += &slice("sticky", "1", &all, &one_slice);
    if late {
        m += &service("late", "10.96.0.15", "", &one);
        m += &slice("late", "1", &[pod_ip(2)], &one_slice);
    }
    m
}

fn count(t: &BTreeMap<String, usize>, key: &str) -> usize {
    t.get(key).copied().unwrap_or(0)
}

fn answered(t: &BTreeMap<String, usize>) -> usize {
    (0..3).map(|i| count(t, &pod_name(i))).sum()
}

/// `weir node` in the node namespace with `mode_args`, logging to `log`.
struct Node<'a> {
    bed: &'a Testbed,
    dir: &'a Path,
}

impl Node<'_> {
    fn start(&self, mode_args: &str, log: &str) -> (Helper, std::path::PathBuf) {
        let log = self.dir.join(log);
        let role = format!(
            "node {mode_args} --manifests {} --node-name node-a --min-sync-interval 100ms --sync-period 1s \
             --listen-admin {ADMIN} --proxy-port-range 20000-20099",
            self.dir.join("manifests").display()
        );
        let helper = support_netns::spawn_logged(&self.bed.node.name, &role, &log).unwrap();
        (helper, log)
    }

    /// Waits until every connection to web's ClusterIP is answered.
    fn wait_serving(&self, log: &Path) {
        eventually(15, || {
            let t = self.bed.client("10.96.0.10:80", 5, "tcp")?;
            if answered(&t) == 5 { Ok(()) } else { Err(format!("{t:?}")) }
        })
        .unwrap_or_else(|e| panic!("never served: {e}\nlog:\n{}", read(log)));
    }

    /// `weir node --cleanup`, which must succeed.
    fn cleanup(&self) {
        let log = self.dir.join("cleanup.log");
        let mut cleanup = support_netns::spawn_logged(&self.bed.node.name, "node --cleanup", &log).unwrap();
        let status = cleanup.0.wait().unwrap();
        assert!(status.success(), "{}", read(&log));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A check of the rules in place, given weir node's log.
type Check<'a> = dyn Fn(&str) -> Result<(), String> + 'a;

/// The netfilter state: `iptables-save` and `nft list ruleset`, without counters.
fn state(bed: &Testbed) -> String {
    format!(
        "{}\n=== nft ===\n{}",
        iptables_state(&bed.node),
        bed.node.exec("nft", &["-s", "list", "ruleset"]).unwrap()
    )
}

/// Someone else's rules, which weir must leave alone, in every built-in chain weir jumps from.
/// (iptables-nft creates a built-in chain in nftables when it is first used and leaves it, empty,
/// when its last rule goes: `iptables-save` shows such chains before and after alike, `nft list
/// ruleset` only after. They are not weir's to delete, so the chains exist here beforehand.)
fn foreign_rules(node: &support_netns::Netns) {
    let ipt = |args: &[&str]| node.exec("iptables", args).unwrap();
    ipt(&["-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"]);
    ipt(&["-A", "FORWARD", "-s", "10.98.0.0/16", "-j", "ACCEPT"]);
    ipt(&["-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"]);
    for chain in ["PREROUTING", "OUTPUT", "POSTROUTING"] {
        ipt(&["-t", "nat", "-A", chain, "-s", "10.99.0.0/16", "-j", "RETURN"]);
    }
}

/// The lab: three pods answering, someone else's rules in place; `None` when it cannot be
/// built here (the reason printed, or a failure under `WEIR_REQUIRE_ALL=1`).
fn lab() -> Option<Testbed> {
    if let Err(reason) = need_tools(&["iptables-restore", "nft"]) {
        skip(&reason);
        return None;
    }
    let mut bed = match Testbed::new(3) {
        Ok(bed) => bed,
        Err(reason) => {
            skip(&reason);
            return None;
        }
    };
    bed.start_responders().unwrap();
    foreign_rules(&bed.node);
    Some(bed)
}

#[test]
fn userspace_mode_end_to_end() {
    let Some(bed) = lab() else { return };
    let node = &bed.node;
    node.exec(
        "nft",
        &["add table inet foreign; add chain inet foreign c { type filter hook input priority 0; }"],
    )
    .unwrap();
    let before = state(&bed);

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("manifests")).unwrap();
    // Written beside the directory, then renamed in: weir node never reads a half-written
    // file (an empty read is a valid manifest without Services: every proxy port would close,
    // and come back renumbered with fresh counters).
    let write = |m: String| {
        std::fs::write(dir.path().join("svc.yaml.new"), m).unwrap();
        std::fs::rename(dir.path().join("svc.yaml.new"), dir.path().join("manifests/svc.yaml")).unwrap();
    };
    write(manifests(&[0, 1, 2], false));
    let n = Node { bed: &bed, dir: dir.path() };
    let (weir_node, log) = n.start("--mode userspace", "userspace.log");
    n.wait_serving(&log);
    assert!(
        read(&log).contains("redirects written with iptables (nat chain WEIR-USERSPACE)"),
        "{}",
        read(&log)
    );
    let saved = node.exec("iptables-save", &["-t", "nat"]).unwrap();
    assert!(
        saved
            .lines()
            .any(|l| l.contains("-d 10.96.0.10/32 -p tcp")
                && l.contains("--dport 80 -j REDIRECT --to-ports 200")),
        "{saved}"
    );

    // The ClusterIP reaches every ready pod, in turn.
    let t = bed.client("10.96.0.10:80", 60, "tcp").unwrap();
    for i in 0..3 {
        assert!(count(&t, &pod_name(i)) >= 15, "ClusterIP does not reach every pod: {t:?}");
    }
    assert_eq!(answered(&t), 60, "{t:?}");
    // From the node itself (nat OUTPUT), and from a pod to its own Service.
    let t = bed.client_in(node, "10.96.0.10:80", 30, "tcp").unwrap();
    assert_eq!(answered(&t), 30, "{t:?}");
    let t = bed.client_in(&bed.pods[0], "10.96.0.10:80", 30, "tcp").unwrap();
    assert_eq!(answered(&t), 30, "{t:?}");
    assert!(count(&t, "pod1") > 0, "a pod does not reach itself through its Service: {t:?}");

    // A refusing endpoint and one whose connect times out are skipped: no client sees a failure.
    let t = bed.client("10.96.0.14:80", 40, "tcp").unwrap();
    assert_eq!(count(&t, "pod2") + count(&t, "pod3"), 40, "a client saw a failure: {t:?}");
    assert!(count(&t, "pod2") > 0 && count(&t, "pod3") > 0, "{t:?}");

    // UDP request and response.
    let t = bed.client("10.96.0.10:53", 30, "udp").unwrap();
    assert_eq!(answered(&t), 30, "{t:?}");
    assert!(t.len() >= 2, "UDP flows are not balanced: {t:?}");

    // NodePort from the client namespace.
    let t = bed.client(&format!("{NODE_IP}:30080"), 60, "tcp").unwrap();
    assert_eq!(answered(&t), 60, "{t:?}");
    assert!(t.len() >= 2, "NodePort reaches one endpoint only: {t:?}");

    // A proxy port is reached through the redirects only: straight to the node's address, the
    // connection is dropped (web:http's proxy port, the third TCP one).
    let t = bed.client(&format!("{NODE_IP}:20002"), 1, "tcp").unwrap();
    assert_eq!(count(&t, "timeout"), 1, "a proxy port is open to the outside: {t:?}");

    // ClientIP affinity holds, then expires (2 s after the last connection): the client is
    // balanced again (round robin: to another pod), and sticks to that one.
    let t = bed.client("10.96.0.11:80", 20, "tcp").unwrap();
    assert_eq!(t.len(), 1, "affinity does not hold: {t:?}");
    let first = t.keys().next().unwrap().clone();
    assert!(first.starts_with("pod"), "{t:?}");
    std::thread::sleep(Duration::from_millis(2500));
    let t = bed.client("10.96.0.11:80", 10, "tcp").unwrap();
    assert_eq!(t.len(), 1, "affinity does not hold after expiry: {t:?}");
    assert!(!t.contains_key(&first), "affinity did not expire (still {first}): {t:?}");

    // Endpoint and Service changes apply without a restart.
    write(manifests(&[0], true));
    eventually(10, || {
        let t = bed.client("10.96.0.10:80", 20, "tcp")?;
        let late = bed.client("10.96.0.15:80", 3, "tcp")?;
        if count(&t, "pod1") == 20 && count(&late, "pod3") == 3 {
            Ok(())
        } else {
            Err(format!("{t:?} {late:?}"))
        }
    })
    .unwrap_or_else(|e| panic!("change never applied: {e}\nlog:\n{}", read(&log)));

    // A file written in place is read once it is closed, not while it is truncated and still
    // open for writing: that empty read is a manifest without Services, and every redirect and
    // proxy port would go until the next write.
    {
        use std::io::Write as _;
        let path = dir.path().join("manifests/svc.yaml");
        let content = std::fs::read(&path).unwrap();
        let mut file = std::fs::OpenOptions::new().write(true).truncate(true).open(&path).unwrap();
        std::thread::sleep(Duration::from_millis(700));
        let t = bed.client("10.96.0.10:80", 5, "tcp").unwrap();
        file.write_all(&content).unwrap();
        drop(file);
        assert_eq!(count(&t, "pod1"), 5, "a truncated file still open was read: {t:?}\nlog:\n{}", read(&log));
    }

    // A jump deleted behind weir's back is restored by the periodic resync, once: there is one
    // jump before (no duplicate that would keep traffic redirected) and one after.
    let jumps = || {
        let saved = node.exec("iptables-save", &["-t", "nat"])?;
        Ok::<_, String>(
            saved
                .lines()
                .filter(|l| l.starts_with("-A PREROUTING ") && l.ends_with(" -j WEIR-USERSPACE"))
                .count(),
        )
    };
    assert_eq!(jumps(), Ok(1), "{}", node.exec("iptables-save", &["-t", "nat"]).unwrap_or_default());
    let jump = ["-m", "comment", "--comment", "weir userspace portals", "-j", "WEIR-USERSPACE"];
    node.exec("iptables", &[&["-w", "5", "-t", "nat", "-D", "PREROUTING"][..], &jump].concat()).unwrap();
    eventually(20, || {
        let restored = read(&log).contains("userspace mode's redirects were missing; restored");
        let t = bed.client("10.96.0.10:80", 3, "tcp")?;
        let n = jumps()?;
        if restored && n == 1 && answered(&t) == 3 { Ok(()) } else { Err(format!("{n} jumps, {t:?}")) }
    })
    .unwrap_or_else(|e| panic!("jump never restored: {e}\nlog:\n{}", read(&log)));

    let (status, body) = support_netns::http_get(node, ADMIN, "/healthz").unwrap();
    assert_eq!(status, 200, "{body}");
    // The proxy's metrics: connections per Service port, and the connects that failed.
    let (status, text) = support_netns::http_get(node, ADMIN, "/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    let metric = |name: &str, service: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("service=\"{service}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} of {service} missing:\n{text}"))
    };
    assert!(metric("weir_l4_connections_total", "default/flaky:80") >= 40.0, "{text}");
    assert!(metric("weir_l4_connect_errors_total", "default/flaky:80") >= 10.0, "{text}");
    // 30 exchanges, each from a new socket; two that got the same source port from the kernel
    // within the flow's idle time are one flow, so fewer than 30 flows is possible.
    assert!(metric("weir_l4_connections_total", "default/web:dns") >= 15.0, "{text}");
    assert!(text.contains("\nweir_node_syncs_total "), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    if std::env::var_os("WEIR_SHOW_LOG").is_some() {
        eprintln!("{}", read(&log));
    }

    // --cleanup restores the tables byte for byte (counters aside).
    drop(weir_node);
    n.cleanup();
    assert_eq!(before, state(&bed), "cleanup left differences");
    let t = bed.client("10.96.0.10:80", 2, "tcp").unwrap();
    assert_eq!(answered(&t), 0, "{t:?}");
}

/// A node switched between modes (userspace with iptables → iptables → nftables → userspace
/// with nftables → userspace with iptables) keeps serving and keeps only the rules of the mode
/// running; `--cleanup` then restores the tables.
#[test]
fn switching_modes_leaves_no_stale_rules() {
    let Some(bed) = lab() else { return };
    let node = &bed.node;
    let before = state(&bed);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("manifests")).unwrap();
    std::fs::write(dir.path().join("manifests/svc.yaml"), manifests(&[0, 1, 2], false)).unwrap();
    let n = Node { bed: &bed, dir: dir.path() };

    let nft_tables = || node.exec("nft", &["list", "tables"]).unwrap();
    let nat = || node.exec("iptables-save", &["-t", "nat"]).unwrap();
    let steps: [(&str, &Check); 5] = [
        ("--mode userspace", &|log| {
            let nat = nat();
            if !nat.contains(":WEIR-USERSPACE") || nat.contains("WEIR-SVC-") {
                return Err(format!("{nat}\n{log}"));
            }
            Ok(())
        }),
        ("--mode iptables", &|log| {
            let nat = nat();
            if nat.contains("USERSPACE") || nat.contains("REDIRECT") || !nat.contains("WEIR-SVC-") {
                return Err(format!("userspace rules left in iptables mode:\n{nat}\n{log}"));
            }
            Ok(())
        }),
        ("--mode nftables", &|log| {
            let (nat, tables) = (nat(), nft_tables());
            if nat.contains("WEIR-") || !tables.contains("table ip weir\n") {
                return Err(format!("iptables rules left in nftables mode:\n{nat}\n{tables}\n{log}"));
            }
            Ok(())
        }),
        ("--mode userspace --userspace-nat nftables", &|log| {
            let (nat, tables) = (nat(), nft_tables());
            if !log.contains("redirects written with nftables")
                || nat.contains("WEIR-")
                || tables.contains("table ip weir\n")
                || !tables.contains("table ip weir_userspace")
            {
                return Err(format!("stale rules in userspace mode (nftables):\n{nat}\n{tables}\n{log}"));
            }
            Ok(())
        }),
        ("--mode userspace", &|log| {
            let (nat, tables) = (nat(), nft_tables());
            if tables.contains("weir_userspace") || !nat.contains(":WEIR-USERSPACE") {
                return Err(format!("stale rules in userspace mode (iptables):\n{nat}\n{tables}\n{log}"));
            }
            Ok(())
        }),
    ];
    for (i, (mode, check)) in steps.iter().enumerate() {
        let (weir_node, log) = n.start(mode, &format!("step{i}.log"));
        // Only this mode's rules once it has synced (until then, the last mode's may serve).
        eventually(15, || check(&read(&log))).unwrap_or_else(|e| panic!("{mode}: {e}"));
        n.wait_serving(&log);
        let t = bed.client("10.96.0.10:80", 30, "tcp").unwrap();
        assert_eq!(answered(&t), 30, "{mode}: {t:?}");
        // A client that keeps its source port has one conntrack entry through every mode: it is
        // answered once this mode has flushed what the last mode's rules NATed (userspace mode's
        // redirect to a proxy port that died with its process).
        eventually(15, || {
            let t = bed.client("10.96.0.10:53", 1, "udp-fixed")?;
            if answered(&t) == 1 { Ok(()) } else { Err(format!("{t:?}\n{}", udp_conntrack(&bed))) }
        })
        .unwrap_or_else(|e| panic!("{mode}: a UDP client keeping its source port is not answered: {e}"));
        let t = bed.client("10.96.0.10:53", 10, "udp").unwrap();
        assert_eq!(answered(&t), 10, "{mode}: {t:?}\n{}", udp_conntrack(&bed));
        if mode.contains("userspace") {
            // web:dns's proxy port, straight: dropped (no answer).
            let t = bed.client(&format!("{NODE_IP}:20000"), 1, "udp").unwrap();
            assert_eq!(count(&t, "timeout"), 1, "{mode}: a proxy port is open to the outside: {t:?}");
        }
        drop(weir_node);
    }
    n.cleanup();
    assert_eq!(before, state(&bed), "cleanup left differences");
}

/// The node's UDP conntrack entries, for failure messages.
fn udp_conntrack(bed: &Testbed) -> String {
    bed.node.exec("conntrack", &["-L", "-p", "udp"]).unwrap_or_else(|e| e)
}

// === IPv6 ===

/// The node's IPv6 address on the client link, the client's, and pod `i`'s (ULA addresses,
/// inside the lab's namespaces only).
const NODE_IP6: &str = "fd00:192::1";
const CLIENT_IP6: &str = "fd00:192::2";
fn pod_ip6(i: usize) -> String {
    format!("fd00:10:244:1::{}", 11 + i)
}

/// Gives the lab IPv6 beside its IPv4: the bridge, the pods and the client link (`nodad`: the
/// addresses are usable at once), the pods' and the client's routes through the node.
fn wire_ipv6(bed: &Testbed) -> Result<(), String> {
    let node = &bed.node;
    node.exec("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
    node.ip(&["-6", "addr", "add", "fd00:10:244:1::1/64", "dev", "br0", "nodad"])?;
    node.ip(&["-6", "addr", "add", &format!("{NODE_IP6}/64"), "dev", "vc", "nodad"])?;
    bed.client.ip(&["-6", "addr", "add", &format!("{CLIENT_IP6}/64"), "dev", "eth0", "nodad"])?;
    bed.client.ip(&["-6", "route", "add", "default", "via", NODE_IP6])?;
    for (i, pod) in bed.pods.iter().enumerate() {
        pod.ip(&["-6", "addr", "add", &format!("{}/64", pod_ip6(i)), "dev", "eth0", "nodad"])?;
        pod.ip(&["-6", "route", "add", "default", "via", "fd00:10:244:1::1"])?;
    }
    Ok(())
}

/// A Service of family IPv6 (ClusterIP `fd00:96::10`) on the three pods' IPv6 addresses, in
/// userspace mode: while pod1 refuses on IPv6 (no responder there yet), retry sends every
/// connection to pod2 or pod3 and no client sees a failure; once pod1 answers, the ClusterIP
/// reaches every pod.
#[test]
fn userspace_mode_ipv6() {
    if let Err(reason) = need_tools(&["ip6tables-restore"]) {
        skip(&reason);
        return;
    }
    let Some(bed) = lab() else { return };
    wire_ipv6(&bed).unwrap_or_else(|e| panic!("IPv6 lab setup failed: {e}"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("manifests")).unwrap();
    let addr = |i: usize| format!("[{}]:{POD_PORT}", pod_ip6(i));
    let start = |i: usize| {
        let log = dir.path().join(format!("responder6-{i}.log"));
        let role = format!("responder6 {} {}", pod_name(i), addr(i));
        let responder = support_netns::spawn_logged(&bed.pods[i].name, &role, &log).unwrap();
        eventually(15, || {
            let t = bed.client_in(&bed.node, &addr(i), 1, "tcp")?;
            if count(&t, &pod_name(i)) == 1 { Ok(()) } else { Err(format!("{t:?}")) }
        })
        .unwrap_or_else(|e| panic!("IPv6 responder {} never answered: {e}\n{}", pod_name(i), read(&log)));
        responder
    };
    let _responders = [start(1), start(2)];

    let pods: Vec<String> = (0..3).map(pod_ip6).collect();
    let manifests =
        service(
            "web6",
            "fd00:96::10",
            "  ipFamilies: [IPv6]\n",
            &format!("  - {{name: http, port: 80, targetPort: {POD_PORT}}}\n"),
        ) + &slice_of("IPv6", "web6", "1", &pods, &format!("- {{name: http, port: {POD_PORT}}}\n"));
    std::fs::write(dir.path().join("manifests/svc.yaml"), manifests).unwrap();
    let n = Node { bed: &bed, dir: dir.path() };
    let (_weir_node, log) = n.start("--mode userspace --userspace-nat iptables", "userspace6.log");
    let cluster_ip = "[fd00:96::10]:80";
    eventually(20, || {
        let t = bed.client(cluster_ip, 5, "tcp")?;
        if answered(&t) == 5 { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("the IPv6 ClusterIP never served: {e}\nlog:\n{}", read(&log)));
    let saved = bed.node.exec("ip6tables-save", &["-t", "nat"]).unwrap();
    assert!(saved.lines().any(|l| l.contains("-d fd00:96::10/128") && l.contains("REDIRECT")), "{saved}");

    // pod1 refuses: every connection is still answered, by pod2 and pod3.
    let t = bed.client(cluster_ip, 40, "tcp").unwrap();
    assert_eq!(count(&t, "pod2") + count(&t, "pod3"), 40, "a client saw a failure: {t:?}");
    assert!(count(&t, "pod2") > 0 && count(&t, "pod3") > 0, "{t:?}");

    // pod1 answers too: the ClusterIP reaches every pod (round robin; pod1's failures are
    // behind it once it answers).
    let _pod1 = start(0);
    eventually(20, || {
        let t = bed.client(cluster_ip, 30, "tcp")?;
        let all = (0..3).all(|i| count(&t, &pod_name(i)) > 0);
        if all && answered(&t) == 30 { Ok(()) } else { Err(format!("{t:?}")) }
    })
    .unwrap_or_else(|e| panic!("the IPv6 ClusterIP does not reach every pod: {e}\nlog:\n{}", read(&log)));
}
