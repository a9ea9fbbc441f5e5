//! A network-namespace test bed for `weir node`: a "node" namespace with a bridge, pods on it,
//! and a "client" namespace linked to the node. Namespaces have unique names (with the pid) and
//! are deleted on drop, also when a test panics; helper processes are killed first.
//!
//! Helpers (TCP/UDP responders in the pods, the client) are this very test binary, re-executed
//! in the namespace with `ip netns exec` and an environment variable naming the role; the test
//! binary's `netns_helper` test runs the role (and does nothing in a normal run).
//!
//! Addresses exist only inside these namespaces: pods 10.244.1.11.., bridge 10.244.1.1/24,
//! node–client link 192.0.2.1/24 – 192.0.2.2/24, services 10.96.0.0/16.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The node's address on the client link.
pub const NODE_IP: &str = "192.0.2.1";
/// The client's address.
pub const CLIENT_IP: &str = "192.0.2.2";
/// The port responders listen on (TCP and UDP).
pub const POD_PORT: u16 = 8080;

pub const ROLE_ENV: &str = "WEIR_NETNS_ROLE";

/// Whether the environment asks every test to run (never skip).
pub fn require_all() -> bool {
    std::env::var_os("WEIR_REQUIRE_ALL").is_some_and(|v| v == "1")
}

/// Prints why the test is skipped, or fails when `WEIR_REQUIRE_ALL=1`.
pub fn skip(reason: &str) {
    if require_all() {
        panic!("cannot run netns tests and WEIR_REQUIRE_ALL=1: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// `Err` naming the programs of `tools` that are not installed (`scripts/test.sh` installs
/// them), as a reason to skip.
pub fn need_tools(tools: &[&str]) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !weir::node::in_path(t, &path)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{} not installed (scripts/test.sh installs them)", missing.join(", ")))
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Runs a command, returning its stdout or an error with its stderr.
pub fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{program} {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    /// Its name.
    pub name: String,
}

impl Netns {
    fn new(name: String) -> Result<Self, String> {
        sh("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n NAME args...`.
    pub fn ip(&self, args: &[&str]) -> Result<String, String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend(args);
        sh("ip", &full)
    }

    /// `ip netns exec NAME program args...`.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend(args);
        sh("ip", &full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh("ip", &["netns", "del", &self.name]);
    }
}

/// The node, client and pod namespaces with their links, and the helper processes.
pub struct Testbed {
    helpers: Vec<Child>,
    /// Runs weir node's rules.
    pub node: Netns,
    /// Connects from outside the node.
    pub client: Netns,
    /// Pods on the node's bridge: `pods[i]` has address `pod_ip(i)` and answers `pod_name(i)`.
    pub pods: Vec<Netns>,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The address of pod `i`.
pub fn pod_ip(i: usize) -> String {
    format!("10.244.1.{}", 11 + i)
}

/// The name pod `i` answers with.
pub fn pod_name(i: usize) -> String {
    format!("pod{}", i + 1)
}

impl Testbed {
    /// Builds the namespaces, or says why it cannot (not root, no `ip netns`). A failure after
    /// the namespaces exist is a test failure (panic), not a reason to skip.
    pub fn new(pods: usize) -> Result<Self, String> {
        if !is_root() {
            return Err("not root".into());
        }
        let id = format!("w{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let node = Netns::new(format!("{id}-node"))?;
        let client = Netns::new(format!("{id}-client"))?;
        let mut bed = Testbed { helpers: Vec::new(), node, client, pods: Vec::new() };
        if let Err(e) = bed.wire(&id, pods) {
            panic!("test bed setup failed: {e}");
        }
        Ok(bed)
    }

    fn wire(&mut self, id: &str, pods: usize) -> Result<(), String> {
        let node = &self.node;
        node.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        node.ip(&["link", "add", "br0", "type", "bridge"])?;
        node.ip(&["addr", "add", "10.244.1.1/24", "dev", "br0"])?;
        node.ip(&["link", "set", "br0", "up"])?;
        // A default route, as every node has: traffic to a service IP without rules is routed
        // (into a veth pair that leads nowhere; no dummy module needed) rather than failing at
        // the routing step.
        node.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
        node.ip(&["link", "set", "up0", "up"])?;
        node.ip(&["link", "set", "up1", "up"])?;
        node.ip(&["route", "add", "default", "dev", "up0"])?;
        // Node ↔ client.
        node.ip(&["link", "add", "vc", "type", "veth", "peer", "name", "eth0", "netns", &self.client.name])?;
        node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "vc"])?;
        node.ip(&["link", "set", "vc", "up"])?;
        self.client.ip(&["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"])?;
        self.client.ip(&["link", "set", "eth0", "up"])?;
        self.client.ip(&["route", "add", "default", "via", NODE_IP])?;
        for i in 0..pods {
            let pod = Netns::new(format!("{id}-pod{}", i + 1))?;
            let veth = format!("vp{}", i + 1);
            node.ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &pod.name])?;
            node.ip(&["link", "set", &veth, "master", "br0"])?;
            // As the bridge CNI plugin does (`hairpinMode`): with br_netfilter, a pod's packet
            // DNATed back to itself is bridged out of the port it came in on.
            node.ip(&["link", "set", &veth, "type", "bridge_slave", "hairpin", "on"])?;
            node.ip(&["link", "set", &veth, "up"])?;
            pod.ip(&["addr", "add", &format!("{}/24", pod_ip(i)), "dev", "eth0"])?;
            pod.ip(&["link", "set", "eth0", "up"])?;
            pod.ip(&["route", "add", "default", "via", "10.244.1.1"])?;
            self.pods.push(pod);
        }
        Ok(())
    }

    /// Starts a responder in every pod (TCP and UDP on [`POD_PORT`]) and waits until each
    /// answers from the node namespace.
    pub fn start_responders(&mut self) -> Result<(), String> {
        for i in 0..self.pods.len() {
            let child = helper(&self.pods[i].name, &format!("responder {}", pod_name(i)))?;
            self.helpers.push(child);
        }
        for i in 0..self.pods.len() {
            let addr = format!("{}:{POD_PORT}", pod_ip(i));
            let mut last = String::new();
            let ok = (0..100).any(|_| {
                match self.client_in(&self.node, &addr, 1, "tcp") {
                    Ok(t) if t.get(&pod_name(i)) == Some(&1) => return true,
                    Ok(t) => last = format!("{t:?}"),
                    Err(e) => last = e,
                }
                std::thread::sleep(Duration::from_millis(50));
                false
            });
            if !ok {
                return Err(format!("responder {} did not come up: {last}", pod_name(i)));
            }
        }
        Ok(())
    }

    /// Makes `count` connections (or UDP exchanges) to `addr` from the client namespace and
    /// tallies the answers by pod name, plus `refused`, `timeout` and `error`.
    pub fn client(&self, addr: &str, count: usize, proto: &str) -> Result<BTreeMap<String, usize>, String> {
        self.client_in(&self.client, addr, count, proto)
    }

    /// The same from any namespace of the test bed.
    pub fn client_in(
        &self,
        ns: &Netns,
        addr: &str,
        count: usize,
        proto: &str,
    ) -> Result<BTreeMap<String, usize>, String> {
        let mut child = helper(&ns.name, &format!("client {proto} {addr} {count}"))?;
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).map_err(|e| e.to_string())?;
        let _ = child.wait();
        let line =
            out.lines().find_map(|l| l.strip_prefix("RESULT ")).ok_or_else(|| format!("client: {out}"))?;
        Ok(line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
            .collect())
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for child in &mut self.helpers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts this test binary in `netns` in the given role; waits for its `READY` line if it
/// is a responder.
fn helper(netns: &str, role: &str) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(exe)
        .args(["--exact", "netns_helper", "--nocapture", "--test-threads=1", "--quiet"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start helper: {e}"))?;
    if role.starts_with("responder") {
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l == "READY" => break,
                Some(Ok(_)) => {}
                _ => {
                    let _ = child.kill();
                    return Err(format!("helper {role} in {netns} exited early"));
                }
            }
        }
    }
    Ok(child)
}

/// The helper roles; call from a `#[test] fn netns_helper()`. Does nothing without the role
/// variable (a normal test run).
pub fn helper_main() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let words: Vec<&str> = role.split_whitespace().collect();
    match words.as_slice() {
        ["responder", name] => responder(name),
        ["client", proto, addr, count] => client(proto, addr.parse().unwrap(), count.parse().unwrap()),
        ["node", args @ ..] => node(args),
        ["get", addr, path] => get(addr, path),
        _ => panic!("unknown helper role {role:?}"),
    }
}

/// One HTTP/1.1 GET of `path` from `addr`, run inside `ns`: the status code and the body.
pub fn http_get(ns: &Netns, addr: &str, path: &str) -> Result<(u16, String), String> {
    let mut child = helper(&ns.name, &format!("get {addr} {path}"))?;
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).map_err(|e| e.to_string())?;
    let _ = child.wait();
    // The helper is a test binary: the harness prints around the answer.
    let answer = out
        .split_once("HTTP-BEGIN\n")
        .and_then(|(_, rest)| rest.split_once("\nHTTP-END"))
        .map(|(answer, _)| answer)
        .ok_or_else(|| format!("no HTTP answer: {out:?}"))?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP answer: {out:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:?}"))?;
    Ok((status, body.to_string()))
}

fn get(addr: &str, path: &str) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        println!("connect failed");
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    println!("HTTP-BEGIN\n{out}\nHTTP-END");
    let _ = std::io::stdout().flush();
}

/// `weir node` itself, with the given command-line options, logging to stderr.
fn node(args: &[&str]) {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        node: weir::node::NodeArgs,
    }
    let cli = Cli::parse_from(std::iter::once("weir").chain(args.iter().copied()));
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).init();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if let Err(e) = runtime.block_on(weir::node_agent::run(cli.node)) {
        eprintln!("weir node failed: {e:#}");
        std::process::exit(1);
    }
}

/// A helper process killed on drop.
pub struct Helper(pub Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this test binary in `netns` in `role`, its stderr going to `log`.
pub fn spawn_logged(netns: &str, role: &str, log: &std::path::Path) -> Result<Helper, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let log = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let child = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(exe)
        .args(["--exact", "netns_helper", "--nocapture", "--test-threads=1", "--quiet"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start helper: {e}"))?;
    Ok(Helper(child))
}

fn responder(name: &str) {
    let tcp = std::net::TcpListener::bind(("0.0.0.0", POD_PORT)).unwrap();
    let udp = UdpSocket::bind(("0.0.0.0", POD_PORT)).unwrap();
    let reply = format!("{name}\n");
    let udp_reply = reply.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(udp_reply.as_bytes(), from);
        }
    });
    println!("READY");
    let _ = std::io::stdout().flush();
    // A failed accept (the client gave up) is not the responder's problem: keep serving.
    for mut s in tcp.incoming().flatten() {
        let _ = s.write_all(reply.as_bytes());
    }
}

fn client(proto: &str, addr: SocketAddr, count: usize) {
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..count {
        let key = match proto {
            "udp" => udp_once(addr, 0),
            // A fixed source port: the same conntrack entry every time.
            "udp-fixed" => udp_once(addr, 40000),
            _ => tcp_once(addr),
        };
        *tally.entry(key).or_default() += 1;
    }
    let line: Vec<String> = tally.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", line.join(" "));
}

fn tcp_once(addr: SocketAddr) -> String {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(mut s) => {
            // Generous: an answer behind a 1 s connect timeout and a retry (userspace mode's
            // black-holed endpoint) on a loaded machine is still an answer.
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut out = String::new();
            match s.read_to_string(&mut out) {
                Ok(_) if !out.trim().is_empty() => out.trim().to_string(),
                _ => "error".into(),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "refused".into(),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "timeout".into(),
        Err(_) => "error".into(),
    }
}

fn udp_once(addr: SocketAddr, port: u16) -> String {
    let Ok(sock) = UdpSocket::bind(("0.0.0.0", port)) else { return "error".into() };
    // Generous (a loaded machine, a debug build): only a datagram that is dropped waits it out.
    let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
    // Connected, so that an ICMP port unreachable surfaces as ECONNREFUSED.
    if sock.connect(addr).is_err() || sock.send(b"hi").is_err() {
        return "error".into();
    }
    let mut buf = [0u8; 512];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "refused".into(),
        Err(_) => "timeout".into(),
    }
}

/// `iptables-save` of a namespace without counters and generated comments, for comparisons.
pub fn iptables_state(ns: &Netns) -> String {
    let out = ns.exec("iptables-save", &[]).unwrap();
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            // Chain declarations carry counters: `:INPUT ACCEPT [12:345]`.
            if l.starts_with(':') {
                l.rsplit_once(' ').map_or(l, |(head, _)| head).to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `check` every 100 ms for up to `secs` seconds; its last error when it never passed.
pub fn eventually(secs: u64, mut check: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
