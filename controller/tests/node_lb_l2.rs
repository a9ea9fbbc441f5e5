//! L2 announcement of LoadBalancer addresses by `weir node --load-balancer` (root only: skipped
//! with a reason otherwise, failed instead when `WEIR_REQUIRE_ALL=1`), with the manifest source
//! (liveness: the Node objects' `Ready` condition).
//!
//! The lab: a `lan` namespace holding a bridge; a client (192.0.2.2, 2001:db8::2) and three
//! nodes (192.0.2.11-13, 2001:db8::11-13) on it; behind each node, on its own link, one pod
//! (10.244.N.11, fd00:N::11) answering its name on port 8080. Each node runs `weir node` in
//! iptables mode, announcing on its `eth0`. The pool's addresses are on the LAN's subnet, so
//! the client finds them by ARP / NDP, and nothing routes them otherwise.
//!
//! The second test runs the same lab against the real kube-apiserver of `support_kube` (in the
//! private network namespace of `support_kube::isolated`, linked to the LAN as 192.0.2.1 and
//! reached through a relay there), each node with a token of exactly the ServiceAccount of
//! `node-rbac.yaml` + `node-lb-rbac.yaml`: liveness from the nodes' Leases.
//!
//! Checked: the client resolves each Service's address to the MAC of the elected node (the one
//! every node's `/lb` names) and is served through it (IPv4 and IPv6); failover when the
//! announcing node dies (link down, process killed, Node not Ready), timed from the client's
//! request loop over 10 runs (`MEASURED` lines); `externalTrafficPolicy: Local` announced only by
//! the node with the ready endpoint, following it; a restart of every `weir node` keeping the
//! addresses, the client served again.

#![allow(clippy::unwrap_used)]

mod support_kube;
mod support_netns;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support_netns::{Helper, Netns, http_get, need_tools, sh, skip, spawn_logged};

const ROLE_ENV: &str = "WEIR_NETNS_ROLE";
const ADMIN: &str = "127.0.0.1:10256";
const PORT: u16 = 8080;

/// Entry point of the helper processes; a no-op in a normal run.
#[test]
fn netns_helper() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let words: Vec<&str> = role.split_whitespace().collect();
    match words.as_slice() {
        ["l2-responder", name] => responder(name),
        ["l2-probe", addr] => probe(addr.parse().unwrap()),
        _ => support_netns::helper_main(),
    }
}

/// Answers its name on [::]:8080 (IPv4 too).
fn responder(name: &str) {
    let listener = std::net::TcpListener::bind(("::", PORT)).unwrap();
    println!("READY");
    let _ = std::io::stdout().flush();
    for mut s in listener.incoming().flatten() {
        let _ = s.write_all(format!("{name}\n").as_bytes());
    }
}

fn unix_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// Connects to `addr` in a loop (150 ms timeout, 20 ms apart), printing `OK <start> <end>
/// <pod>` or `FAIL <start> <end>` for each attempt (milliseconds since the epoch).
fn probe(addr: SocketAddr) {
    loop {
        let start = unix_ms();
        let answer = TcpStream::connect_timeout(&addr, Duration::from_millis(150)).ok().and_then(|mut s| {
            let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            Some(out.trim().to_string()).filter(|o| !o.is_empty())
        });
        let line = match answer {
            Some(pod) => format!("OK {start} {} {pod}", unix_ms()),
            None => format!("FAIL {start} {}", unix_ms()),
        };
        if writeln!(std::io::stdout(), "{line}").is_err() {
            return;
        }
        let _ = std::io::stdout().flush();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts this test binary in `netns` in `role`, its stdout piped.
fn helper(netns: &str, role: &str) -> Child {
    Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "netns_helper", "--nocapture", "--test-threads=1", "--quiet"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// An attempt of a [`Probe`]: whether it was served, when it started and ended.
struct Attempt {
    ok: bool,
    start: u128,
    end: u128,
}

/// A request loop running in the client namespace, its attempts collected.
struct Probe {
    child: Child,
    lines: Arc<Mutex<Vec<Attempt>>>,
}

impl Probe {
    fn start(client: &Netns, addr: &str) -> Probe {
        let mut child = helper(&client.name, &format!("l2-probe {addr}"));
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let w: Vec<&str> = line.split_whitespace().collect();
                let ok = match w.first() {
                    Some(&"OK") => true,
                    Some(&"FAIL") => false,
                    _ => continue,
                };
                let time = |i: usize| w.get(i).and_then(|t| t.parse().ok()).unwrap_or(0);
                sink.lock().unwrap().push(Attempt { ok, start: time(1), end: time(2) });
            }
        });
        Probe { child, lines }
    }

    /// When the first attempt started after `since` (ms since the epoch) was served.
    fn served_after(&self, since: u128) -> Option<u128> {
        self.lines.lock().unwrap().iter().find(|a| a.ok && a.start >= since).map(|a| a.end)
    }

    /// Whether the last `n` attempts all succeeded.
    fn steady(&self, n: usize) -> bool {
        let lines = self.lines.lock().unwrap();
        lines.len() >= n && lines[lines.len() - n..].iter().all(|a| a.ok)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lab's namespaces (deleted on drop, after the processes).
struct Lab {
    dir: tempfile::TempDir,
    manifests: PathBuf,
    nodes: Vec<Option<Helper>>,
    starts: usize,
    responders: Vec<Helper>,
    client: Netns,
    node_ns: Vec<Netns>,
    pod_ns: Vec<Netns>,
    lan: Netns,
}

fn netns(name: String) -> Netns {
    sh("ip", &["netns", "add", &name]).unwrap();
    let ns = Netns { name };
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    ns
}

fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

const NODES: usize = 3;

impl Lab {
    fn new() -> Lab {
        let id = format!("l2{}", std::process::id());
        let lan = netns(format!("{id}-lan"));
        let client = netns(format!("{id}-client"));
        let node_ns: Vec<Netns> = (0..NODES).map(|i| netns(format!("{id}-n{}", i + 1))).collect();
        let pod_ns: Vec<Netns> = (0..NODES).map(|i| netns(format!("{id}-p{}", i + 1))).collect();
        lan.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        lan.ip(&["link", "set", "br0", "up"]).unwrap();
        let plug = |ns: &Netns, port: &str| {
            lan.ip(&["link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name])
                .unwrap();
            lan.ip(&["link", "set", port, "master", "br0"]).unwrap();
            lan.ip(&["link", "set", port, "up"]).unwrap();
        };
        plug(&client, "c");
        client.ip(&["addr", "add", "192.0.2.2/24", "dev", "eth0"]).unwrap();
        client.ip(&["addr", "add", "2001:db8::2/64", "dev", "eth0", "nodad"]).unwrap();
        client.ip(&["link", "set", "eth0", "up"]).unwrap();
        for (i, node) in node_ns.iter().enumerate() {
            let n = i + 1;
            plug(node, &format!("n{n}"));
            for sysctl in [
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
                "net.ipv6.conf.all.keep_addr_on_down=1",
                "net.ipv6.conf.default.keep_addr_on_down=1",
            ] {
                node.exec("sysctl", &["-qw", sysctl]).unwrap();
            }
            node.ip(&["addr", "add", &format!("192.0.2.1{n}/24"), "dev", "eth0"]).unwrap();
            node.ip(&["addr", "add", &format!("2001:db8::1{n}/64"), "dev", "eth0", "nodad"]).unwrap();
            node.ip(&["link", "set", "eth0", "up"]).unwrap();
            let pod = &pod_ns[i];
            node.ip(&["link", "add", "vp", "type", "veth", "peer", "name", "eth0", "netns", &pod.name])
                .unwrap();
            node.ip(&["addr", "add", &format!("10.244.{n}.1/24"), "dev", "vp"]).unwrap();
            node.ip(&["addr", "add", &format!("fd00:{n}::1/64"), "dev", "vp", "nodad"]).unwrap();
            node.ip(&["link", "set", "vp", "up"]).unwrap();
            pod.ip(&["addr", "add", &format!("10.244.{n}.11/24"), "dev", "eth0"]).unwrap();
            pod.ip(&["addr", "add", &format!("fd00:{n}::11/64"), "dev", "eth0", "nodad"]).unwrap();
            pod.ip(&["link", "set", "eth0", "up"]).unwrap();
            pod.ip(&["route", "add", "default", "via", &format!("10.244.{n}.1")]).unwrap();
            pod.ip(&["-6", "route", "add", "default", "via", &format!("fd00:{n}::1")]).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        let lab = Lab {
            dir,
            manifests,
            nodes: Vec::new(),
            starts: 0,
            responders: Vec::new(),
            client,
            node_ns,
            pod_ns,
            lan,
        };
        for i in 0..NODES {
            lab.routes(i);
        }
        lab
    }

    /// Node `i`'s routes to the other nodes' pods (lost when its link goes down).
    fn routes(&self, i: usize) {
        for j in (0..NODES).filter(|j| *j != i) {
            let m = j + 1;
            let _ = self.node_ns[i].ip(&[
                "route",
                "replace",
                &format!("10.244.{m}.0/24"),
                "via",
                &format!("192.0.2.1{m}"),
            ]);
            let _ = self.node_ns[i].ip(&[
                "-6",
                "route",
                "replace",
                &format!("fd00:{m}::/64"),
                "via",
                &format!("2001:db8::1{m}"),
            ]);
        }
    }

    fn start_responders(&mut self) {
        for (i, pod) in self.pod_ns.iter().enumerate() {
            let mut child = helper(&pod.name, &format!("l2-responder pod-{}", i + 1));
            // The test harness prints around the helper's own lines.
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            assert!(lines.any(|l| l.is_ok_and(|l| l == "READY")), "responder {i} did not start");
            self.responders.push(Helper(child));
        }
    }

    fn logs(&self) -> String {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| format!("--- {}\n{}", f.display(), std::fs::read_to_string(f).unwrap_or_default()))
            .collect()
    }

    fn start_node(&mut self, i: usize) {
        let role = format!(
            "node --mode iptables --manifests {} --load-balancer --node-name {} --cluster-cidr 10.244.0.0/16 \
             --lb-interface eth0 --min-sync-interval 100ms --sync-period 1s --listen-admin {ADMIN}",
            self.manifests.display(),
            node_name(i)
        );
        self.starts += 1;
        let log = self.dir.path().join(format!("{}.{:03}.log", node_name(i), self.starts));
        let helper = spawn_logged(&self.node_ns[i].name, &role, &log).unwrap();
        while self.nodes.len() <= i {
            self.nodes.push(None);
        }
        self.nodes[i] = Some(helper);
    }

    /// Node `i`'s `weir node` reading the API server through `kubeconfig`.
    fn start_kube_node(&mut self, i: usize, kubeconfig: &std::path::Path) {
        let role = format!(
            "node --mode iptables --kubeconfig {} --load-balancer --node-name {} --cluster-cidr 10.244.0.0/16 \
             --lb-interface eth0 --min-sync-interval 100ms --sync-period 1s --listen-admin {ADMIN} \
             --election-namespace weir-system --election-lease-duration 4 --election-identity {}",
            kubeconfig.display(),
            node_name(i),
            node_name(i)
        );
        self.starts += 1;
        let log = self.dir.path().join(format!("{}.{:03}.log", node_name(i), self.starts));
        let helper = spawn_logged(&self.node_ns[i].name, &role, &log).unwrap();
        while self.nodes.len() <= i {
            self.nodes.push(None);
        }
        self.nodes[i] = Some(helper);
    }

    fn stop_node(&mut self, i: usize) {
        if let Some(helper) = self.nodes.get_mut(i).and_then(Option::take) {
            drop(helper);
        }
    }

    fn mac(&self, i: usize) -> String {
        let out = self.node_ns[i].ip(&["-o", "link", "show", "eth0"]).unwrap();
        out.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap().to_string()
    }

    /// The client's neighbour entry for `address`: its MAC, if resolved.
    fn neighbour(&self, address: &str) -> Option<String> {
        let out = self.client.ip(&["neigh", "show", address]).unwrap_or_default();
        let w: Vec<&str> = out.split_whitespace().collect();
        w.iter().position(|x| *x == "lladdr").and_then(|p| w.get(p + 1)).map(|s| s.to_string())
    }

    /// Node `i`'s `/lb` document.
    fn lb(&self, i: usize) -> Option<serde_json::Value> {
        let (status, body) = http_get(&self.node_ns[i], ADMIN, "/lb").ok()?;
        (status == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    /// The announcer of `address` if every running node names the same one.
    fn announcer(&self, address: &str) -> Result<String, String> {
        let mut seen = Vec::new();
        for i in (0..NODES).filter(|i| self.nodes.get(*i).is_some_and(Option::is_some)) {
            let doc = self.lb(i).ok_or_else(|| format!("{} has no /lb yet", node_name(i)))?;
            let assignments = doc["assignments"].as_array().cloned().unwrap_or_default();
            let a = assignments
                .iter()
                .find(|a| a["address"] == address)
                .ok_or_else(|| format!("{}: {address} not in /lb: {doc}", node_name(i)))?;
            seen.push(a["announcer"].as_str().unwrap_or("").to_string());
        }
        seen.dedup();
        match seen.as_slice() {
            [one] if !one.is_empty() => Ok(one.clone()),
            _ => Err(format!("nodes disagree or nobody announces {address}: {seen:?}")),
        }
    }

    fn write(&self, file: &str, text: &str) {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    /// Writes the Node objects, `ready[i]` being node i's Ready condition.
    fn set_nodes(&self, ready: [bool; NODES]) {
        let mut text = String::new();
        for (i, r) in ready.iter().enumerate() {
            text += &format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {}}}\nstatus: {{conditions: [{{type: Ready, status: '{}'}}]}}\n---\n",
                node_name(i),
                if *r { "True" } else { "False" }
            );
        }
        self.write("nodes.yaml", &text);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for i in 0..NODES {
            self.stop_node(i);
        }
        self.responders.clear();
        for ns in &self.node_ns {
            let _ = weir::node::cleanup(&weir::node::exec::Runner::netns(&ns.name));
        }
        let _ = &self.lan;
    }
}

/// A one-shot client request: the answering pod's name, via a `client` helper of
/// `support_netns` (tallies by answer).
fn served_by(ns: &Netns, addr: &str) -> Result<String, String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "netns_helper", "--nocapture", "--test-threads=1", "--quiet"])
        .env(ROLE_ENV, format!("client tcp {addr} 1"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).map_err(|e| e.to_string())?;
    let _ = child.wait();
    let line = out.lines().find_map(|l| l.strip_prefix("RESULT ")).ok_or_else(|| format!("client: {out}"))?;
    let (answer, _) = line.split_once('=').ok_or_else(|| line.to_string())?;
    if answer.starts_with("pod-") { Ok(answer.to_string()) } else { Err(answer.to_string()) }
}

fn eventually<T>(secs: u64, mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match check() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

const POOLS: &str = "apiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\nmetadata: {name: lan}\n\
spec: {addresses: [192.0.2.200-192.0.2.203, '2001:db8::200-2001:db8::203']}\n";

/// Service `name` (port 80 to 8080) asking for address `ip`, of `ip`'s family, with the
/// `Local` policy when `local`, its endpoints on `nodes`.
fn service(name: &str, ip: &str, cluster_ip: &str, local: bool, nodes: &[usize]) -> String {
    let v6 = ip.contains(':');
    let family = if v6 { "IPv6" } else { "IPv4" };
    let policy = if local { "Local" } else { "Cluster" };
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default, annotations: {{weir.dev/load-balancer-ips: '{ip}'}}}}\n\
         spec:\n  type: LoadBalancer\n  clusterIP: '{cluster_ip}'\n  ipFamilies: [{family}]\n  \
         externalTrafficPolicy: {policy}\n  ports: [{{port: 80, targetPort: {PORT}}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  \
         labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports: [{{port: {PORT}}}]\nendpoints:\n"
    );
    for i in nodes {
        let n = i + 1;
        let ip = if v6 { format!("'fd00:{n}::11'") } else { format!("10.244.{n}.11") };
        s += &format!("- {{addresses: [{ip}], nodeName: {}, conditions: {{ready: true}}}}\n", node_name(*i));
    }
    s + "---\n"
}

fn services(local_on: usize) -> String {
    service("web", "192.0.2.200", "10.96.0.10", false, &[0, 1, 2])
        + &service("web6", "2001:db8::200", "fd00:96::10", false, &[0, 1, 2])
        + &service("local", "192.0.2.202", "10.96.0.11", true, &[local_on])
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The two labs run one after the other (their timings are what the docs report).
static LABS: Mutex<()> = Mutex::new(());

#[test]
fn l2_announcement_with_manifests() {
    let _serial = LABS.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(reason) = need_tools(&["iptables-restore", "ip6tables-restore"]) {
        return skip(&reason);
    }
    if !is_root() {
        return skip("not root");
    }
    let mut lab = Lab::new();
    lab.start_responders();
    lab.write("pools.yaml", POOLS);
    lab.set_nodes([true; NODES]);
    // The Local Service's endpoint is on node-3 at first.
    lab.write("services.yaml", &services(2));
    for i in 0..NODES {
        lab.start_node(i);
    }
    let fail = |what: &str, e: String, lab: &Lab| -> ! { panic!("{what}: {e}\n{}", lab.logs()) };

    // IPv4 and IPv6: the elected node's MAC, and served through it.
    for (address, target) in [("192.0.2.200", "192.0.2.200:80"), ("2001:db8::200", "[2001:db8::200]:80")] {
        let started = Instant::now();
        let winner =
            eventually(20, || lab.announcer(address)).unwrap_or_else(|e| fail("no announcer", e, &lab));
        let w = (0..NODES).find(|i| node_name(*i) == winner).unwrap();
        let pod = eventually(15, || served_by(&lab.client, target))
            .unwrap_or_else(|e| fail(&format!("{target} not served"), e, &lab));
        println!("MEASURED {address}: served ({pod}) {} ms after start", started.elapsed().as_millis());
        let mac = lab.neighbour(address);
        assert_eq!(
            mac.as_deref(),
            Some(lab.mac(w).as_str()),
            "{address} resolved to another MAC than {winner}'s"
        );
        // The other nodes' neighbour tables know nothing of it: they do not own it.
        assert!(
            lab.node_ns[w].ip(&["addr", "show"]).unwrap().find(address).is_none(),
            "address added to an interface"
        );
    }

    // externalTrafficPolicy: Local: announced by node-3 only, then by node-1 when the endpoint
    // moves there.
    for (on, file_on) in [(2usize, 2usize), (0, 0)] {
        lab.write("services.yaml", &services(file_on));
        let winner = eventually(10, || {
            let w = lab.announcer("192.0.2.202")?;
            if w == node_name(on) { Ok(w) } else { Err(format!("announced by {w}")) }
        })
        .unwrap_or_else(|e| fail("Local policy", e, &lab));
        eventually(10, || {
            let pod = served_by(&lab.client, "192.0.2.202:80")?;
            let mac = lab.neighbour("192.0.2.202");
            if pod == format!("pod-{}", on + 1) && mac.as_deref() == Some(lab.mac(on).as_str()) {
                Ok(())
            } else {
                Err(format!("{pod} via {mac:?}"))
            }
        })
        .unwrap_or_else(|e| fail(&format!("Local not served through {winner}"), e, &lab));
    }

    // Failover: the announcing node dies (its link goes down, weir node is killed, and its Node
    // turns not Ready, as the node lifecycle controller would say), while the client loops.
    let probe = Probe::start(&lab.client, "192.0.2.200:80");
    eventually(10, || if probe.steady(5) { Ok(()) } else { Err("the loop is not served".into()) })
        .unwrap_or_else(|e| fail("before failover", e, &lab));
    let mut times = Vec::new();
    for run in 0..10 {
        let winner =
            eventually(10, || lab.announcer("192.0.2.200")).unwrap_or_else(|e| fail("announcer", e, &lab));
        let w = (0..NODES).find(|i| node_name(*i) == winner).unwrap();
        lab.node_ns[w].ip(&["link", "set", "eth0", "down"]).unwrap();
        // Timed from when the link is down (the command has returned).
        let t0 = unix_ms();
        lab.stop_node(w);
        let mut ready = [true; NODES];
        ready[w] = false;
        lab.set_nodes(ready);
        let served = eventually(15, || probe.served_after(t0).ok_or_else(|| "not served".to_string()))
            .unwrap_or_else(|e| fail(&format!("failover run {run} from {winner}"), e, &lab));
        times.push(served - t0);
        let after =
            eventually(5, || lab.announcer("192.0.2.200")).unwrap_or_else(|e| fail("new announcer", e, &lab));
        assert_ne!(after, winner);
        let mac = lab.neighbour("192.0.2.200");
        let a = (0..NODES).find(|i| node_name(*i) == after).unwrap();
        assert_eq!(mac.as_deref(), Some(lab.mac(a).as_str()), "run {run}: the client's entry did not move");
        // The node comes back, Ready: the address returns to it.
        lab.node_ns[w].ip(&["link", "set", "eth0", "up"]).unwrap();
        lab.routes(w);
        for i in 0..NODES {
            lab.routes(i);
        }
        lab.start_node(w);
        lab.set_nodes([true; NODES]);
        eventually(15, || {
            let now = lab.announcer("192.0.2.200")?;
            let mac = lab.neighbour("192.0.2.200");
            // The client's entry moved back too (every node's rules serve the address: only the
            // entry says through which node).
            if now == winner && mac.as_deref() == Some(lab.mac(w).as_str()) && probe.steady(5) {
                Ok(())
            } else {
                Err(format!("announced by {now}, client at {mac:?}"))
            }
        })
        .unwrap_or_else(|e| fail(&format!("run {run}: back to {winner}"), e, &lab));
    }
    times.sort_unstable();
    println!(
        "MEASURED L2 failover (manifests, link down + Node not Ready), 10 runs: p50 {} ms, max {} ms ({times:?})",
        percentile(&times, 0.5),
        times[times.len() - 1]
    );
    drop(probe);

    // Restart of every weir node: the addresses stay, the client is served again.
    for i in 0..NODES {
        lab.stop_node(i);
    }
    let probe = Probe::start(&lab.client, "192.0.2.200:80");
    let t0 = unix_ms();
    for i in 0..NODES {
        lab.start_node(i);
    }
    eventually(20, || if probe.steady(5) { Ok(()) } else { Err("not served after the restart".into()) })
        .unwrap_or_else(|e| fail("restart", e, &lab));
    for (address, target) in [("192.0.2.200", "192.0.2.200:80"), ("2001:db8::200", "[2001:db8::200]:80")] {
        eventually(15, || lab.announcer(address)).unwrap_or_else(|e| fail("after restart", e, &lab));
        eventually(15, || served_by(&lab.client, target)).unwrap_or_else(|e| fail("after restart", e, &lab));
    }
    println!(
        "MEASURED restart of every weir node: served again {} ms after",
        probe.served_after(t0).map_or(0, |t| t - t0)
    );

    // The metric and the document.
    let (status, metrics) = http_get(&lab.node_ns[0], ADMIN, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("weir_node_lb_announced_addresses{"), "{metrics}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

// === against the API server ===

/// Relays TCP connections from `listen` to `to` (threads; for the life of the process).
fn relay(listen: &str, to: SocketAddr) -> SocketAddr {
    let listener = std::net::TcpListener::bind(listen).unwrap();
    let local = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for inbound in listener.incoming().flatten() {
            let Ok(outbound) = TcpStream::connect(to) else { continue };
            let (mut a, mut b) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Write);
            });
            let (mut a, mut b) = (outbound, inbound);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    local
}

#[test]
fn l2_announcement_with_the_api_server() {
    let _serial = LABS.lock().unwrap_or_else(|e| e.into_inner());
    support_kube::isolated("l2_announcement_with_the_api_server", || async {
        use k8s_openapi::api::core::v1::{Endpoints, Service};
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::Api;
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
        use serde_json::json;

        let api = support_kube::ApiServer::start().await;
        let admin = api.client().await;
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes");
        let text = std::fs::read_to_string(examples.join("ipaddresspool-crd.yaml")).unwrap();
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        Api::<CustomResourceDefinition>::all(admin.clone())
            .create(&PostParams::default(), &crd)
            .await
            .unwrap();
        support_kube::apply_file(&admin, &examples.join("node-rbac.yaml")).await;
        support_kube::apply_file(&admin, &examples.join("node-lb-rbac.yaml")).await;
        let token = support_kube::service_account_token(&admin, "weir-system", "weir-node").await;

        let mut lab = Lab::new();
        lab.start_responders();
        // This namespace on the LAN, the API server reached through a relay.
        let pid = std::process::id().to_string();
        lab.lan.ip(&["link", "add", "api", "type", "veth", "peer", "name", "lab0", "netns", &pid]).unwrap();
        lab.lan.ip(&["link", "set", "api", "master", "br0"]).unwrap();
        lab.lan.ip(&["link", "set", "api", "up"]).unwrap();
        sh("ip", &["addr", "add", "192.0.2.1/24", "dev", "lab0"]).unwrap();
        sh("ip", &["link", "set", "lab0", "up"]).unwrap();
        let relayed = relay("192.0.2.1:0", SocketAddr::from(([127, 0, 0, 1], api.port)));
        let local = std::fs::read_to_string(api.kubeconfig_for(&token)).unwrap();
        let kubeconfig = lab.dir.path().join("kubeconfig");
        // The API server's certificate names `kubernetes`, not the relay's address.
        let text = local.replace(
            &format!("    server: https://127.0.0.1:{}\n", api.port),
            &format!("    server: https://{relayed}\n    tls-server-name: kubernetes\n"),
        );
        assert_ne!(text, local, "kubeconfig layout changed");
        std::fs::write(&kubeconfig, text).unwrap();

        let gvk = GroupVersionKind::gvk("weir.dev", "v1alpha1", "IPAddressPool");
        let pools: Api<DynamicObject> =
            Api::all_with(admin.clone(), &ApiResource::from_gvk_with_plural(&gvk, "ipaddresspools"));
        let pool = json!({"apiVersion": "weir.dev/v1alpha1", "kind": "IPAddressPool", "metadata": {"name": "lan"},
            "spec": {"addresses": ["192.0.2.200-192.0.2.203"]}});
        support_kube::eventually("the pool is created", Duration::from_secs(30), || {
            let (pools, pool) = (pools.clone(), pool.clone());
            async move { pools.create(&PostParams::default(), &serde_json::from_value(pool).unwrap()).await.ok() }
        })
        .await;
        support_kube::create_namespace(&admin, "shop").await;
        let svc = json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer",
            "ports": [{"name": "http", "port": 80, "targetPort": PORT, "protocol": "TCP"}]}});
        let created: Service = support_kube::apply(&admin, "shop", svc).await;
        let addresses: Vec<_> = (0..NODES)
            .map(|i| json!({"ip": format!("10.244.{}.11", i + 1), "nodeName": node_name(i)}))
            .collect();
        let endpoints = json!({"metadata": {"name": "web"},
            "subsets": [{"addresses": addresses, "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}]}]});
        let _: Endpoints = support_kube::apply(&admin, "shop", endpoints).await;

        for i in 0..NODES {
            lab.start_kube_node(i, &kubeconfig);
        }
        let fail = |what: &str, e: String, lab: &Lab| -> ! {
            panic!("{what}: {e}\n{}\n{}", lab.logs(), api.log("apiserver.log"))
        };
        let services: Api<Service> = Api::namespaced(admin.clone(), "shop");
        let started = Instant::now();
        let address = support_kube::eventually("web gets an address", Duration::from_secs(30), || {
            let services = services.clone();
            async move {
                let svc = services.get("web").await.ok()?;
                svc.status?.load_balancer?.ingress?.first()?.ip.clone()
            }
        })
        .await;
        assert_eq!(address, "192.0.2.200");
        let target = format!("{address}:80");
        let winner =
            eventually(20, || lab.announcer(&address)).unwrap_or_else(|e| fail("no announcer", e, &lab));
        let w = (0..NODES).find(|i| node_name(*i) == winner).unwrap();
        eventually(15, || served_by(&lab.client, &target)).unwrap_or_else(|e| fail("not served", e, &lab));
        support_kube::measured("API server: Service created to served through L2", started.elapsed());
        assert_eq!(lab.neighbour(&address).as_deref(), Some(lab.mac(w).as_str()));

        // The Event naming the announcing node.
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), "shop");
        let uid = created.metadata.uid.clone();
        let note = format!("node {winner} announces {address}");
        let found = support_kube::eventually("the AnnouncingAddress Event", Duration::from_secs(15), || {
            let (events, note, uid) = (events.clone(), note.clone(), uid.clone());
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some("AnnouncingAddress")
                        && e.note.as_deref().is_some_and(|n| n.starts_with(&note))
                        && e.regarding.as_ref().and_then(|r| r.uid.clone()) == uid
                })
            }
        })
        .await;
        assert!(found.reporting_instance.as_deref() == Some(winner.as_str()), "{found:?}");

        // The winner's Node labelled exclude-from-external-load-balancers: another node takes
        // over; the label removed, the address comes back.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
        let label = "node.kubernetes.io/exclude-from-external-load-balancers";
        for i in 0..NODES {
            let node = json!({"metadata": {"name": node_name(i)}});
            nodes.create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await.unwrap();
        }
        let patch = |value: serde_json::Value| {
            let nodes = nodes.clone();
            let winner = winner.clone();
            async move {
                let params = kube::api::PatchParams::default();
                nodes.patch(&winner, &params, &kube::api::Patch::Merge(&value)).await.unwrap();
            }
        };
        patch(json!({"metadata": {"labels": {label: ""}}})).await;
        let moved = eventually(15, || {
            let now = lab.announcer(&address)?;
            let mac = lab.neighbour(&address);
            let at = (0..NODES).find(|i| node_name(*i) == now).unwrap();
            if now != winner && mac.as_deref() == Some(lab.mac(at).as_str()) {
                Ok(now)
            } else {
                Err(format!("announced by {now}, client at {mac:?}"))
            }
        })
        .unwrap_or_else(|e| fail("exclusion label", e, &lab));
        served_by(&lab.client, &target).unwrap_or_else(|e| fail(&format!("served through {moved}"), e, &lab));
        patch(json!({"metadata": {"labels": {label: null}}})).await;
        eventually(15, || {
            let now = lab.announcer(&address)?;
            if now == winner && lab.neighbour(&address).as_deref() == Some(lab.mac(w).as_str()) {
                Ok(())
            } else {
                Err(format!("announced by {now}"))
            }
        })
        .unwrap_or_else(|e| fail("label removed", e, &lab));

        // Failover: the announcing node loses its link (and so the API server), then dies.
        let probe = Probe::start(&lab.client, &target);
        eventually(10, || if probe.steady(5) { Ok(()) } else { Err("the loop is not served".into()) })
            .unwrap_or_else(|e| fail("before failover", e, &lab));
        let mut times = Vec::new();
        for run in 0..10 {
            let winner =
                eventually(10, || lab.announcer(&address)).unwrap_or_else(|e| fail("announcer", e, &lab));
            let w = (0..NODES).find(|i| node_name(*i) == winner).unwrap();
            lab.node_ns[w].ip(&["link", "set", "eth0", "down"]).unwrap();
            // Timed from when the link is down (the command has returned).
            let t0 = unix_ms();
            if run == 0 {
                // Cut off from the API server, it stops announcing on its own once its Lease
                // would have expired (what bounds a split brain).
                let stopped = eventually(10, || {
                    let doc = lab.lb(w).ok_or("no /lb")?;
                    if doc["mayAnnounce"] == false
                        && doc["announcing"].as_array().is_some_and(|a| a.is_empty())
                    {
                        Ok(unix_ms())
                    } else {
                        Err(format!("{doc}"))
                    }
                })
                .unwrap_or_else(|e| fail("the isolated node keeps announcing", e, &lab));
                println!("MEASURED isolated node stops announcing after {} ms", stopped - t0);
                // Its last renewal left at most a second before the link went down: it may announce
                // until that renewal's Lease expires (1 to 2 s), not much longer.
                assert!(
                    (500..5000).contains(&(stopped - t0)),
                    "stopped {} ms after losing its link",
                    stopped - t0
                );
            }
            lab.stop_node(w);
            let served = eventually(15, || probe.served_after(t0).ok_or_else(|| "not served".to_string()))
                .unwrap_or_else(|e| fail(&format!("failover run {run} from {winner}"), e, &lab));
            times.push(served - t0);
            let after =
                eventually(5, || lab.announcer(&address)).unwrap_or_else(|e| fail("new announcer", e, &lab));
            assert_ne!(after, winner);
            let a = (0..NODES).find(|i| node_name(*i) == after).unwrap();
            assert_eq!(lab.neighbour(&address).as_deref(), Some(lab.mac(a).as_str()), "run {run}");
            lab.node_ns[w].ip(&["link", "set", "eth0", "up"]).unwrap();
            for i in 0..NODES {
                lab.routes(i);
            }
            lab.start_kube_node(w, &kubeconfig);
            eventually(20, || {
                let now = lab.announcer(&address)?;
                let mac = lab.neighbour(&address);
                if now == winner && mac.as_deref() == Some(lab.mac(w).as_str()) && probe.steady(5) {
                    Ok(())
                } else {
                    Err(format!("announced by {now}, client at {mac:?}"))
                }
            })
            .unwrap_or_else(|e| fail(&format!("run {run}: back to {winner}"), e, &lab));
        }
        times.sort_unstable();
        println!(
            "MEASURED L2 failover (API server, node Leases of 2 s; link down then killed), 10 runs: p50 {} ms, max {} ms ({times:?})",
            percentile(&times, 0.5),
            times[times.len() - 1]
        );
        drop(probe);

        // A clean stop (SIGINT) of the announcing node: it deletes its Lease, and another node
        // takes over at once instead of when the Lease would lapse.
        let winner =
            eventually(10, || lab.announcer(&address)).unwrap_or_else(|e| fail("announcer", e, &lab));
        let w = (0..NODES).find(|i| node_name(*i) == winner).unwrap();
        let pid = lab.nodes[w].as_ref().unwrap().0.id().to_string();
        let t0 = Instant::now();
        sh("kill", &["-INT", &pid]).unwrap();
        let moved = eventually(15, || {
            let mac = lab.neighbour(&address);
            let other = (0..NODES).filter(|i| *i != w).find(|i| mac.as_deref() == Some(lab.mac(*i).as_str()));
            other.map(|_| t0.elapsed()).ok_or_else(|| format!("client still at {mac:?}"))
        })
        .unwrap_or_else(|e| fail("clean stop", e, &lab));
        support_kube::measured("clean stop of the announcing node: the client's entry moved after", moved);
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(admin.clone(), "weir-system");
        assert!(
            leases.get_opt(&format!("weir-node-{winner}")).await.unwrap().is_none(),
            "the Lease of {winner} stays"
        );
        let exited = lab.nodes[w].as_mut().unwrap().0.wait().unwrap();
        assert!(exited.success(), "{winner} exited with {exited}\n{}", lab.logs());

        // Restart of every weir node: the address stays, the client is served again.
        for i in 0..NODES {
            lab.stop_node(i);
        }
        let probe = Probe::start(&lab.client, &target);
        for i in 0..NODES {
            lab.start_kube_node(i, &kubeconfig);
        }
        eventually(30, || lab.announcer(&address)).unwrap_or_else(|e| fail("after restart", e, &lab));
        eventually(20, || if probe.steady(5) { Ok(()) } else { Err("not served after the restart".into()) })
            .unwrap_or_else(|e| fail("restart", e, &lab));
        let svc = services.get("web").await.unwrap();
        let ips: Vec<String> = svc
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip)
            .collect();
        assert_eq!(ips, std::slice::from_ref(&address));
        drop(lab);
    });
}
