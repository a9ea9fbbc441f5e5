//! userspace mode: every Service port (TCP, UDP) gets a proxy port on this node, served by the
//! dataplane's L4 proxy ([`weir_dataplane::l4::L4Proxy`]: round robin, a refused or timed-out
//! connect retried on another endpoint, UDP flows, ClientIP affinity), and NAT rules redirect
//! the port's ClusterIPs, externalIPs, LoadBalancer IPs and node port to it.
//!
//! - [`Ports`] gives each (service port, scope) a proxy port from `--proxy-port-range`, kept
//!   while the service port exists; a port another process holds is skipped.
//! - [`table`] (pure) builds the proxy's table: one [`L4Service`] per proxy port. A service
//!   port whose external traffic policy selects other endpoints than its internal one (`Local`)
//!   gets a second proxy port for its external traffic.
//! - [`render_iptables`] and [`render_nft`] (pure) write the redirects: iptables chain
//!   `WEIR-USERSPACE` in the nat table (jumped to from PREROUTING and OUTPUT), or the nftables
//!   table `weir_userspace`; traffic that reaches a proxy port without having been redirected
//!   (straight to the node's address) is dropped (filter chain `WEIR-USERSPACE-GUARD` from
//!   INPUT, or the table's `input` chain), so a proxy port opens no ClusterIP-only Service to
//!   the outside. Every value in them is typed (addresses, ports, protocols) and the
//!   names in comments are DNS names checked by the plan: nothing from an object is spliced in
//!   as text.
//! - [`UserspaceBackend`] applies both in the node's sync loop; [`cleanup`] removes the rules
//!   (the other modes' cleanups call it, and it theirs, so that switching modes leaves nothing).
//!
//! Unlike the kernel modes, the endpoints see the node's address as the client (the proxy
//! connects), so `externalTrafficPolicy: Local` keeps traffic on local endpoints but cannot
//! keep the client's address; traffic to a LoadBalancer IP from outside its
//! `loadBalancerSourceRanges` is not redirected (it is not proxied).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use weir_dataplane::l4::{L4Config, L4Proxy};
use weir_dataplane::model::{
    BackendId, Endpoint as L4Endpoint, L4Protocol, L4Service, RouteTable, ServicePort as BackendPort, Target,
};

use super::exec::{self, Runner};
use super::plan::{Cidr, IpFamily, Protocol, Ruleset, ServicePort, ServicePortKey};
use super::sync;

/// The nat chain of the redirects (iptables).
pub const CHAIN: &str = "WEIR-USERSPACE";
/// The filter chain (jumped to from INPUT) that drops traffic reaching a proxy port without
/// having been redirected: a proxy port must not open ClusterIP-only Services, nor bypass
/// `loadBalancerSourceRanges`, to whoever can reach the node's addresses.
pub const GUARD: &str = "WEIR-USERSPACE-GUARD";
/// The nftables table of the redirects (families `ip` and `ip6`).
pub const NFT_TABLE: &str = "weir_userspace";
/// The default `--proxy-port-range`: below the Linux ephemeral ports and Kubernetes' node
/// ports.
pub const DEFAULT_PORT_RANGE: &str = "20000-29999";

/// Errors of userspace mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tool failed.
    #[error(transparent)]
    Exec(#[from] exec::Error),
    /// Neither iptables nor nftables is installed.
    #[error(
        "neither iptables-restore (Debian package iptables) nor nft (package nftables) is installed: userspace mode cannot redirect traffic"
    )]
    NoNatTool,
    /// Every port of the range is in use.
    #[error("--proxy-port-range {range} has no free {protocol} port left for {key}")]
    Exhausted {
        /// The range.
        range: PortRange,
        /// The protocol.
        protocol: L4Protocol,
        /// The service port left without a proxy port.
        key: String,
    },
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How userspace mode writes its redirects (`--userspace-nat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NatTool {
    /// iptables where `iptables-restore` is installed, else nftables.
    #[default]
    Auto,
    /// iptables (`iptables-restore`), chain `WEIR-USERSPACE`.
    Iptables,
    /// nftables (`nft`), table `weir_userspace`.
    Nftables,
}

impl NatTool {
    /// The tool to use given the programs in `path` (a `PATH`): `Auto` picks iptables, else
    /// nftables; an explicit choice stands.
    pub fn resolve(self, path: &std::ffi::OsStr) -> Result<NatTool> {
        match self {
            NatTool::Auto if super::in_path("iptables-restore", path) => Ok(NatTool::Iptables),
            NatTool::Auto if super::in_path("nft", path) => Ok(NatTool::Nftables),
            NatTool::Auto => Err(Error::NoNatTool),
            chosen => Ok(chosen),
        }
    }
}

/// An inclusive range of proxy ports (`--proxy-port-range 20000-29999`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    /// The first port.
    pub first: u16,
    /// The last port.
    pub last: u16,
}

impl std::str::FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid port range {s:?}: expected FIRST-LAST such as {DEFAULT_PORT_RANGE}");
        let (a, b) = s.trim().split_once('-').ok_or_else(bad)?;
        let first: u16 = a.trim().parse().map_err(|_| bad())?;
        let last: u16 = b.trim().parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(PortRange { first, last })
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange { first: 20000, last: 29999 }
    }
}

// === proxy ports ===

/// Which traffic of a service port a proxy port takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Traffic to the ClusterIPs (and everything, when both policies pick the same endpoints).
    Internal,
    /// Traffic to the node port, externalIPs and LoadBalancer IPs, when the external policy
    /// picks other endpoints than the internal one.
    External,
}

/// The L4 protocol of a service port; SCTP has none (the L4 proxy does not speak it).
pub fn l4_protocol(protocol: Protocol) -> Option<L4Protocol> {
    match protocol {
        Protocol::Tcp => Some(L4Protocol::Tcp),
        Protocol::Udp => Some(L4Protocol::Udp),
        Protocol::Sctp => None,
    }
}

/// The scopes a service port needs a proxy port for.
pub fn scopes(sp: &ServicePort) -> &'static [Scope] {
    if sp.is_external() && sp.external_endpoints() != sp.internal_endpoints() {
        &[Scope::Internal, Scope::External]
    } else {
        &[Scope::Internal]
    }
}

/// The proxy port of each (service port, scope), kept while the service port exists.
#[derive(Clone, Debug, Default)]
pub struct Ports {
    range: PortRange,
    assigned: BTreeMap<(ServicePortKey, Scope), u16>,
    /// Ports found held by another process (not offered again).
    avoid: BTreeSet<(L4Protocol, u16)>,
}

impl Ports {
    /// No port assigned yet; new ones come from `range`.
    pub fn new(range: PortRange) -> Self {
        Ports { range, ..Ports::default() }
    }

    /// The proxy port of `key`'s `scope`, if assigned.
    pub fn get(&self, key: &ServicePortKey, scope: Scope) -> Option<u16> {
        self.assigned.get(&(key.clone(), scope)).copied()
    }

    /// Gives every (service port, scope) of `ruleset` a port (those that had one keep it) and
    /// frees the ports of those that are gone. New ones take the lowest free port of their
    /// protocol, in key order, so the same ruleset gets the same ports on every node.
    pub fn assign(&mut self, ruleset: &Ruleset) -> Result<()> {
        let wanted: BTreeMap<(ServicePortKey, Scope), L4Protocol> = ruleset
            .services
            .iter()
            .filter_map(|sp| l4_protocol(sp.key.protocol).map(|p| (sp, p)))
            .flat_map(|(sp, p)| scopes(sp).iter().map(move |s| ((sp.key.clone(), *s), p)))
            .collect();
        self.assigned.retain(|k, _| wanted.contains_key(k));
        let mut used: BTreeSet<(L4Protocol, u16)> =
            self.assigned.iter().map(|((key, _), port)| (protocol_of(key), *port)).collect();
        let mut next: BTreeMap<L4Protocol, u16> = BTreeMap::new();
        for (k, protocol) in wanted {
            if self.assigned.contains_key(&k) {
                continue;
            }
            let start = next.get(&protocol).copied().unwrap_or(self.range.first);
            let free = (start..=self.range.last)
                .find(|p| !used.contains(&(protocol, *p)) && !self.avoid.contains(&(protocol, *p)));
            let Some(port) = free else {
                return Err(Error::Exhausted { range: self.range, protocol, key: k.0.to_string() });
            };
            used.insert((protocol, port));
            next.insert(protocol, port);
            self.assigned.insert(k, port);
        }
        Ok(())
    }

    /// `port` is held by another process: whoever had it gets another at the next
    /// [`Ports::assign`].
    pub fn avoid(&mut self, protocol: L4Protocol, port: u16) {
        self.avoid.insert((protocol, port));
        self.assigned.retain(|(key, _), p| !(*p == port && protocol_of(key) == protocol));
    }
}

fn protocol_of(key: &ServicePortKey) -> L4Protocol {
    l4_protocol(key.protocol).unwrap_or(L4Protocol::Tcp)
}

// === the proxy's table ===

/// The L4 proxy's table for `ruleset`: one service per assigned proxy port, with the endpoints
/// of its scope, ClientIP affinity, connect retries and UDP flows without a reply limit.
pub fn table(ruleset: &Ruleset, ports: &Ports) -> RouteTable {
    let mut table = RouteTable::default();
    // A refused or timed-out connect moves on (up to 4 endpoints), after 1 s at most each.
    table.settings.connect_timeout_ms = Some(1000);
    table.settings.stream_next_upstream_tries = Some(4);
    // A UDP flow carries any number of replies, until idle.
    table.settings.stream_responses = Some(0);
    for sp in &ruleset.services {
        let Some(protocol) = l4_protocol(sp.key.protocol) else { continue };
        for &scope in scopes(sp) {
            let Some(port) = ports.get(&sp.key, scope) else { continue };
            let endpoints = match scope {
                Scope::Internal => sp.internal_endpoints(),
                Scope::External => sp.external_endpoints(),
            };
            let backend_port = match sp.key.port_name.as_str() {
                "" => BackendPort::Number(sp.port),
                name => BackendPort::Name(name.to_string()),
            };
            table.l4.push(L4Service {
                port,
                protocol,
                backend: BackendId {
                    namespace: sp.key.service.namespace.clone(),
                    service: sp.key.service.name.clone(),
                    port: backend_port,
                },
                target: Target::Endpoints(
                    endpoints.iter().map(|e| L4Endpoint::new(SocketAddr::new(e.ip, e.port))).collect(),
                ),
                proxy_protocol_in: false,
                proxy_protocol_out: false,
                client_ip_affinity_s: sp.affinity.map(|a| a.timeout_seconds),
            });
        }
    }
    table.l4.sort_by_key(|s| (s.protocol, s.port));
    table
}

// === redirects ===

/// One redirect: traffic of `protocol` to `dest` (an address, or any local address) and `port`,
/// from `sources` (any when empty), goes to proxy port `to`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Redirect {
    /// The service port it serves, for the comment.
    pub name: String,
    /// What is redirected (`cluster IP`, `external IP`, `loadbalancer IP`, `node port`).
    pub what: &'static str,
    /// The destination address; `None`: any local address (the node port).
    pub dest: Option<IpAddr>,
    /// The protocol.
    pub protocol: Protocol,
    /// The destination port.
    pub port: u16,
    /// Admitted sources (`loadBalancerSourceRanges`); empty: any.
    pub sources: Vec<Cidr>,
    /// The proxy port.
    pub to: u16,
}

/// The redirects of `family`, node ports last (they match any local address), for the proxy
/// ports `bound` (those the proxy serves).
pub fn redirects(
    ruleset: &Ruleset,
    ports: &Ports,
    family: IpFamily,
    bound: &dyn Fn(L4Protocol, u16) -> bool,
) -> Vec<Redirect> {
    let mut by_ip = Vec::new();
    let mut node_ports = Vec::new();
    for sp in ruleset.services.iter().filter(|sp| sp.key.family == family) {
        let Some(protocol) = l4_protocol(sp.key.protocol) else { continue };
        let port_of = |scope: Scope| ports.get(&sp.key, scope).filter(|p| bound(protocol, *p));
        let internal = port_of(Scope::Internal);
        let external = if scopes(sp).len() == 2 { port_of(Scope::External) } else { internal };
        let name = match sp.key.port_name.as_str() {
            "" => sp.key.service.to_string(),
            port => format!("{}:{port}", sp.key.service),
        };
        let redirect = |what, dest, sources: Vec<Cidr>, to| Redirect {
            name: name.clone(),
            what,
            dest,
            protocol: sp.key.protocol,
            port: sp.port,
            sources,
            to,
        };
        if let Some(to) = internal {
            by_ip.extend(sp.cluster_ips.iter().map(|ip| redirect("cluster IP", Some(*ip), Vec::new(), to)));
        }
        let Some(to) = external else { continue };
        by_ip.extend(sp.external_ips.iter().map(|ip| redirect("external IP", Some(*ip), Vec::new(), to)));
        for ip in &sp.load_balancer_ips {
            match &sp.source_ranges {
                // No range admitted: not redirected.
                Some(ranges) if ranges.is_empty() => {}
                Some(ranges) => by_ip.push(redirect("loadbalancer IP", Some(*ip), ranges.clone(), to)),
                None => by_ip.push(redirect("loadbalancer IP", Some(*ip), Vec::new(), to)),
            }
        }
        if let Some(np) = sp.node_port {
            node_ports.push(Redirect { port: np, ..redirect("node port", None, Vec::new(), to) });
        }
    }
    by_ip.append(&mut node_ports);
    by_ip
}

fn host(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// The rules of chain [`CHAIN`] (the arguments after `-A CHAIN`).
pub fn render_iptables(redirects: &[Redirect]) -> Vec<String> {
    let mut rules = Vec::new();
    for r in redirects {
        let p = r.protocol.as_str();
        let dest = match &r.dest {
            Some(ip) => format!("-d {}", host(ip)),
            None => "-m addrtype --dst-type LOCAL".to_string(),
        };
        let comment = format!(r#"-m comment --comment "{} {}""#, r.name, r.what);
        let target = format!("-p {p} -m {p} --dport {} -j REDIRECT --to-ports {}", r.port, r.to);
        if r.sources.is_empty() {
            rules.push(format!("{comment} {dest} {target}"));
        } else {
            rules.extend(r.sources.iter().map(|cidr| format!("{comment} -s {cidr} {dest} {target}")));
        }
    }
    rules
}

/// The proxy ports the redirects lead to, by protocol.
pub fn proxy_ports(redirects: &[Redirect]) -> BTreeSet<(Protocol, u16)> {
    redirects.iter().map(|r| (r.protocol, r.to)).collect()
}

/// The rules of chain [`GUARD`]: traffic to a proxy port that was not redirected there is
/// dropped.
pub fn render_guard(ports: &BTreeSet<(Protocol, u16)>) -> Vec<String> {
    ports
        .iter()
        .map(|(protocol, port)| {
            let p = protocol.as_str();
            format!(
                r#"-m comment --comment "weir userspace proxy port: redirected traffic only" -p {p} -m {p} --dport {port} -m conntrack ! --ctstate DNAT -j DROP"#
            )
        })
        .collect()
}

/// The `iptables-restore --noflush` input that makes [`CHAIN`] (nat) hold `rules` and
/// [`GUARD`] (filter) hold `guard` (declaring a chain flushes it; each table commits at once).
pub fn restore_text(rules: &[String], guard: &[String]) -> String {
    let mut out = String::new();
    for (table, chain, rules) in [("nat", CHAIN, rules), ("filter", GUARD, guard)] {
        let _ = writeln!(out, "*{table}\n:{chain} - [0:0]");
        for rule in rules {
            let _ = writeln!(out, "-A {chain} {rule}");
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// The nft family word of `family`.
fn nft_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::IPv4 => "ip",
        IpFamily::IPv6 => "ip6",
    }
}

/// The `nft -f` script that replaces table [`NFT_TABLE`] of `family` with `redirects`, in one
/// transaction (the table is created if missing, deleted, and made again).
pub fn render_nft(redirects: &[Redirect], family: IpFamily) -> String {
    let fam = nft_family(family);
    let mut out =
        format!("table {fam} {NFT_TABLE}\ndelete table {fam} {NFT_TABLE}\ntable {fam} {NFT_TABLE} {{\n");
    out.push_str("\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump portals\n\t}\n");
    out.push_str(
        "\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump portals\n\t}\n",
    );
    out.push_str("\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n");
    for (protocol, port) in proxy_ports(redirects) {
        let _ = writeln!(
            out,
            "\t\t{} dport {port} ct status & dnat != dnat drop comment \"weir userspace proxy port: redirected traffic only\"",
            protocol.as_str()
        );
    }
    out.push_str("\t}\n");
    out.push_str("\tchain portals {\n");
    for r in redirects {
        let mut rule = String::new();
        if !r.sources.is_empty() {
            let list: Vec<String> = r.sources.iter().map(ToString::to_string).collect();
            let _ = write!(rule, "{fam} saddr {{ {} }} ", list.join(", "));
        }
        match &r.dest {
            Some(ip) => {
                let _ = write!(rule, "{fam} daddr {ip} ");
            }
            None => rule.push_str("fib daddr type local "),
        }
        let _ = write!(
            rule,
            "{} dport {} redirect to :{} comment \"{} {}\"",
            r.protocol.as_str(),
            r.port,
            r.to,
            r.name,
            r.what
        );
        let _ = writeln!(out, "\t\t{rule}");
    }
    out.push_str("\t}\n}\n");
    out
}

// === applying ===

/// The jumps into [`CHAIN`] and [`GUARD`]: table, built-in chain, rule.
const JUMPS: [(&str, &str, [&str; 6]); 3] = [
    ("nat", "PREROUTING", ["-m", "comment", "--comment", "weir userspace portals", "-j", CHAIN]),
    ("nat", "OUTPUT", ["-m", "comment", "--comment", "weir userspace portals", "-j", CHAIN]),
    ("filter", "INPUT", ["-m", "comment", "--comment", "weir userspace proxy ports", "-j", GUARD]),
];

fn iptables_program(base: &str, family: IpFamily) -> String {
    match family {
        IpFamily::IPv4 => base.to_string(),
        IpFamily::IPv6 => base.replacen("iptables", "ip6tables", 1),
    }
}

/// Which of [`CHAIN`] (nat) and [`GUARD`] (filter) exist in `family`'s tables, as (table,
/// chain) pairs; `None` when the tool is not installed.
fn chains_present(runner: &Runner, family: IpFamily) -> Result<Option<Vec<(&'static str, &'static str)>>> {
    let mut present = Vec::new();
    for (table, chain) in [("nat", CHAIN), ("filter", GUARD)] {
        match runner.run(&iptables_program("iptables-save", family), &["-t", table], None) {
            Ok(out) => {
                let declared = format!(":{chain}");
                if out.stdout.lines().any(|l| l.split_whitespace().next() == Some(&declared)) {
                    present.push((table, chain));
                }
            }
            Err(exec::Error::Spawn { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(present))
}

/// Adds the jumps into [`CHAIN`] that are missing; returns how many were.
fn ensure_jumps(runner: &Runner, family: IpFamily) -> Result<usize> {
    let iptables = iptables_program("iptables", family);
    let mut added = 0;
    for (table, chain, args) in &JUMPS {
        added += usize::from(super::iptables::ensure_rule(runner, &iptables, table, chain, args)?);
    }
    Ok(added)
}

/// Removes userspace mode's redirects: the jumps into [`CHAIN`] and the chain (both families),
/// and the nftables tables [`NFT_TABLE`]. Touches nothing where they do not exist (it creates
/// no table on the way).
///
/// Then the UDP conntrack entries its redirects made go too: they would keep sending a client
/// that reuses its source port to a proxy port that died with the last process (the mode that
/// starts next flushes its Service ports as well, [`super::conntrack::at_start`]; this covers
/// `--cleanup`, after which no mode of weir runs).
pub fn cleanup(runner: &Runner) -> Result<()> {
    let mut udp = BTreeMap::<IpFamily, BTreeSet<(u16, u16)>>::new();
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let present = chains_present(runner, family)?.unwrap_or_default();
        if present.is_empty() {
            continue;
        }
        if present.iter().any(|(table, _)| *table == "nat")
            && let Ok(out) = runner.run(&iptables_program("iptables-save", family), &["-t", "nat"], None)
        {
            udp.entry(family).or_default().extend(udp_redirects(&out.stdout));
        }
        let iptables = iptables_program("iptables", family);
        for (table, chain, args) in JUMPS.iter().filter(|(_, _, args)| present.iter().any(|p| p.1 == args[5]))
        {
            let mut delete = vec!["-w", "5", "-t", table, "-D", chain];
            delete.extend(args);
            for _ in 0..16 {
                let (status, _) = runner.status(&iptables, &delete, None)?;
                if !status.success() {
                    break;
                }
            }
        }
        let mut text = String::new();
        for (table, chain) in present {
            let _ = write!(text, "*{table}\n:{chain} - [0:0]\n-X {chain}\nCOMMIT\n");
        }
        runner.run(&iptables_program("iptables-restore", family), &["-w", "5", "--noflush"], Some(&text))?;
    }
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let fam = nft_family(family);
        if let Ok((status, out)) = runner.status("nft", &["list", "table", fam, NFT_TABLE], None)
            && status.success()
        {
            udp.entry(family).or_default().extend(udp_redirects(&out.stdout));
        }
        // Exit status 1 when the table does not exist; a missing `nft` is nothing to clean.
        if let Err(e) = runner.status("nft", &["delete", "table", fam, NFT_TABLE], None) {
            tracing::debug!(error = %e, "nft unavailable; no userspace table to remove");
        }
    }
    for (family, pairs) in udp {
        let flushes: Vec<Vec<String>> = pairs
            .into_iter()
            .map(|(port, to)| {
                let [port, to] = [port, to].map(|p| p.to_string());
                vec!["--orig-port-dst".into(), port, "--reply-port-src".into(), to, "--dst-nat".into()]
            })
            .collect();
        super::conntrack::flush(runner, family, &flushes);
    }
    Ok(())
}

/// The UDP redirects in `text` (`iptables-save -t nat` or `nft list table` of userspace mode's
/// rules) as (destination port, proxy port) pairs: the entries to flush once they are gone.
fn udp_redirects(text: &str) -> BTreeSet<(u16, u16)> {
    let after = |line: &str, word: &str| -> Option<u16> {
        let mut words = line.split_whitespace().skip_while(|w| *w != word).skip(1);
        words.next()?.trim_start_matches(':').parse().ok()
    };
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with(&format!("-A {CHAIN} ")) && line.contains(" -p udp ") {
                Some((after(line, "--dport")?, after(line, "--to-ports")?))
            } else if line.contains("udp dport ") && line.contains(" redirect to :") {
                Some((after(line, "dport")?, after(line, "to")?))
            } else {
                None
            }
        })
        .collect()
}

/// Options of userspace mode (from the command line).
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Where proxy ports come from.
    pub port_range: PortRange,
    /// iptables or nftables (resolved: not `Auto`).
    pub nat: NatTool,
}

/// userspace mode: the L4 proxy and its redirects.
pub struct UserspaceBackend {
    proxy: L4Proxy,
    ports: Ports,
    nat: NatTool,
    runner: Runner,
    /// What was applied last, per family (iptables rules, or the nft script).
    applied: BTreeMap<IpFamily, String>,
    /// Service ports the proxy cannot serve (SCTP), last logged.
    unserved: Vec<String>,
    /// `ip6tables-restore` is missing (logged once).
    no_ipv6: bool,
    /// The UDP conntrack entries of the Service ports were flushed after the first redirects
    /// ([`super::conntrack::at_start`]).
    start_flushed: bool,
}

impl std::fmt::Debug for UserspaceBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserspaceBackend").field("nat", &self.nat).finish_non_exhaustive()
    }
}

impl UserspaceBackend {
    /// A backend whose proxy listens on every address; must be called on the runtime that is
    /// to run the proxy.
    pub fn new(runner: Runner, config: Config) -> Self {
        let proxy = L4Proxy::with_limits(L4Config::default(), Default::default());
        UserspaceBackend {
            proxy,
            ports: Ports::new(config.port_range),
            nat: config.nat,
            runner,
            applied: BTreeMap::new(),
            unserved: Vec::new(),
            no_ipv6: false,
            start_flushed: false,
        }
    }

    /// The proxy (its ports and counters).
    pub fn proxy(&self) -> &L4Proxy {
        &self.proxy
    }

    /// Publishes `ruleset` to the proxy; a proxy port another process holds is replaced by
    /// another (a few rounds), and what still cannot be bound is logged and left out of the
    /// redirects.
    fn publish(&mut self, ruleset: &Ruleset) -> Result<()> {
        self.ports.assign(ruleset)?;
        for _ in 0..8 {
            let failed = self.proxy.publish(&table(ruleset, &self.ports));
            if failed.is_empty() {
                return Ok(());
            }
            for error in failed {
                tracing::warn!("{error}; trying another proxy port");
                self.ports.avoid(error.protocol, error.port);
            }
            self.ports.assign(ruleset)?;
        }
        Ok(())
    }

    fn apply(&mut self, ruleset: &Ruleset, full: bool) -> Result<sync::Report> {
        let proxy = &self.proxy;
        let bound = |protocol, port| proxy.local_addr(protocol, port).is_some();
        let mut report = sync::Report::default();
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let has = ruleset.services.iter().any(|sp| sp.key.family == family);
            if family == IpFamily::IPv6 && !has && !self.applied.contains_key(&family) {
                continue;
            }
            let redirects = redirects(ruleset, &self.ports, family, &bound);
            report.rules_total += redirects.len();
            let text = match self.nat {
                NatTool::Nftables => render_nft(&redirects, family),
                _ => restore_text(&render_iptables(&redirects), &render_guard(&proxy_ports(&redirects))),
            };
            if !full && self.applied.get(&family) == Some(&text) {
                continue;
            }
            self.applied.remove(&family);
            match self.nat {
                NatTool::Nftables => {
                    self.runner.run("nft", &["-f", "-"], Some(&text))?;
                }
                _ => {
                    let restore = iptables_program("iptables-restore", family);
                    match self.runner.run(&restore, &["-w", "5", "--noflush"], Some(&text)) {
                        Ok(_) => {}
                        // No ip6tables: IPv4 still works, as in iptables mode (said once).
                        Err(exec::Error::Spawn { program, .. }) if family == IpFamily::IPv6 => {
                            if !self.no_ipv6 {
                                tracing::error!(%program, "not installed: IPv6 Services are not redirected");
                                self.no_ipv6 = true;
                            }
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    ensure_jumps(&self.runner, family)?;
                }
            }
            report.written = true;
            report.rules_written += redirects.len();
            self.applied.insert(family, text);
        }
        Ok(report)
    }
}

impl sync::Backend for UserspaceBackend {
    fn name(&self) -> &'static str {
        "userspace"
    }

    fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<sync::Report> {
        let unserved: Vec<String> = ruleset
            .services
            .iter()
            .filter(|sp| l4_protocol(sp.key.protocol).is_none())
            .map(|sp| sp.key.to_string())
            .collect();
        if unserved != self.unserved {
            for key in &unserved {
                tracing::warn!(service_port = %key, "userspace mode proxies TCP and UDP only; this SCTP port is not served");
            }
            self.unserved = unserved;
        }
        self.publish(ruleset)?;
        let report = self.apply(ruleset, full);
        if report.is_err() {
            // Unknown state in the kernel: the retry rewrites everything.
            self.applied.clear();
        }
        let report = report?;
        // Once the redirects are in place: entries another mode's rules (or the last process's
        // proxy ports) NATed go, so each flow's next datagram is redirected to this proxy. The
        // proxy's own flows follow endpoint changes after that: no flush at later syncs.
        if !self.start_flushed {
            for family in [IpFamily::IPv4, IpFamily::IPv6] {
                let flushes = super::conntrack::at_start(family, ruleset);
                super::conntrack::flush(&self.runner, family, &flushes);
            }
            self.start_flushed = true;
        }
        Ok(report)
    }

    fn repair(&mut self) -> anyhow::Result<bool> {
        let mut missing = false;
        for family in self.applied.keys().copied().collect::<Vec<_>>() {
            let gone = match self.nat {
                NatTool::Nftables => {
                    let (status, _) =
                        self.runner.status("nft", &["list", "table", nft_family(family), NFT_TABLE], None)?;
                    !status.success()
                }
                _ => {
                    chains_present(&self.runner, family)?.is_none_or(|p| p.len() < 2)
                        || ensure_jumps(&self.runner, family)? > 0
                }
            };
            if gone {
                missing = true;
                self.applied.remove(&family);
            }
        }
        if missing {
            tracing::warn!("userspace mode's redirects were missing; restored");
        }
        Ok(missing)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node::plan::test_ruleset as ruleset;

    const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.7]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{name: http, port: 80, nodePort: 30080}, {name: dns, port: 53, protocol: UDP}, {name: sctp, port: 9, protocol: SCTP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}, {name: sctp, port: 9, protocol: SCTP}]
endpoints:
- addresses: [10.244.0.1]
  nodeName: node-a
- addresses: [10.244.0.2]
  nodeName: node-b
"#;

    #[test]
    fn ports_are_kept_and_freed() {
        let r = ruleset(WEB);
        let mut ports = Ports::new("20000-20001".parse().unwrap());
        ports.assign(&r).unwrap();
        let http = &r.services.iter().find(|sp| sp.key.port_name == "http").unwrap().key;
        let dns = &r.services.iter().find(|sp| sp.key.port_name == "dns").unwrap().key;
        // TCP and UDP ports are numbered apart; SCTP gets none.
        assert_eq!(ports.get(http, Scope::Internal), Some(20000));
        assert_eq!(ports.get(dns, Scope::Internal), Some(20000));
        assert_eq!(ports.assigned.len(), 2);
        // A port held by another process: the next assignment moves the service port.
        ports.avoid(L4Protocol::Tcp, 20000);
        ports.assign(&r).unwrap();
        assert_eq!(ports.get(http, Scope::Internal), Some(20001));
        assert_eq!(ports.get(dns, Scope::Internal), Some(20000), "UDP untouched");
        // externalTrafficPolicy Local: a second port for external traffic, and the range is
        // then too small.
        let local = WEB.replace("  type: NodePort\n", "  type: NodePort\n  externalTrafficPolicy: Local\n");
        let r2 = ruleset(&local);
        let error = ports.assign(&r2).unwrap_err();
        assert!(error.to_string().contains("has no free TCP port left for default/web:http/tcp"), "{error}");
        let mut ports = Ports::new(PortRange::default());
        ports.assign(&r2).unwrap();
        assert_eq!(ports.get(http, Scope::External), Some(20001));
        // Gone from the ruleset: freed.
        ports.assign(&Ruleset::default()).unwrap();
        assert!(ports.assigned.is_empty());
        // Ranges parse strictly.
        assert!("20000".parse::<PortRange>().is_err());
        assert!("2-1".parse::<PortRange>().is_err());
        assert!("0-10".parse::<PortRange>().is_err());
        assert!("1-x".parse::<PortRange>().is_err());
    }

    #[test]
    fn the_table_and_redirects() {
        let local = WEB.replace("  type: NodePort\n", "  type: NodePort\n  externalTrafficPolicy: Local\n");
        let r = ruleset(&local);
        let mut ports = Ports::new(PortRange::default());
        ports.assign(&r).unwrap();
        let t = table(&r, &ports);
        let summary: Vec<(L4Protocol, u16, usize, Option<u32>)> =
            t.l4.iter()
                .map(|s| {
                    let Target::Endpoints(eps) = &s.target else { panic!() };
                    (s.protocol, s.port, eps.len(), s.client_ip_affinity_s)
                })
                .collect();
        // http: internal (both endpoints) and external (node-a's); dns: one port (ClusterIP
        // only, no external destination... it has the externalIP: two ports too).
        assert_eq!(
            summary,
            [
                (L4Protocol::Tcp, 20000, 2, Some(60)),
                (L4Protocol::Tcp, 20001, 1, Some(60)),
                (L4Protocol::Udp, 20000, 2, Some(60)),
                (L4Protocol::Udp, 20001, 1, Some(60)),
            ]
        );
        let all = |_: L4Protocol, _: u16| true;
        let rules = render_iptables(&redirects(&r, &ports, IpFamily::IPv4, &all));
        let expected = [
            r#"-m comment --comment "default/web:dns cluster IP" -d 10.96.0.10/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 20000"#,
            r#"-m comment --comment "default/web:dns external IP" -d 198.51.100.7/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 20001"#,
            r#"-m comment --comment "default/web:http cluster IP" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 20000"#,
            r#"-m comment --comment "default/web:http external IP" -d 198.51.100.7/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 20001"#,
            r#"-m comment --comment "default/web:http node port" -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 20001"#,
        ];
        assert_eq!(rules, expected);
        let guard = render_guard(&proxy_ports(&redirects(&r, &ports, IpFamily::IPv4, &all)));
        assert_eq!(guard.len(), 4, "{guard:?}");
        assert!(
            guard[0].ends_with("-p tcp -m tcp --dport 20000 -m conntrack ! --ctstate DNAT -j DROP"),
            "{guard:?}"
        );
        // Ports the proxy could not bind get no redirect.
        let some = |p: L4Protocol, _: u16| p == L4Protocol::Tcp;
        assert_eq!(redirects(&r, &ports, IpFamily::IPv4, &some).len(), 3);
        let nft = render_nft(&redirects(&r, &ports, IpFamily::IPv4, &all), IpFamily::IPv4);
        assert!(nft.starts_with("table ip weir_userspace\ndelete table ip weir_userspace\n"), "{nft}");
        assert!(
            nft.contains("\t\tfib daddr type local tcp dport 30080 redirect to :20001 comment \"default/web:http node port\"\n"),
            "{nft}"
        );
        assert!(nft.contains("\t\tip daddr 10.96.0.10 udp dport 53 redirect to :20000 comment"), "{nft}");
        assert!(nft.contains("\t\tudp dport 20001 ct status & dnat != dnat drop comment"), "{nft}");

        // What --cleanup flushes: the UDP redirects, read back from either tool's listing
        // (iptables-save puts the match options in its own order).
        let udp = BTreeSet::from([(53, 20000), (53, 20001)]);
        assert_eq!(udp_redirects(&nft), udp);
        let saved: String = rules.iter().map(|r| format!("-A {CHAIN} {r}\n")).collect();
        assert_eq!(udp_redirects(&saved), udp);
        let reordered = "-A WEIR-USERSPACE -d 10.96.0.10/32 -p udp -m comment --comment \"default/web:dns cluster IP\" -m udp --dport 53 -j REDIRECT --to-ports 20000\n";
        assert_eq!(udp_redirects(reordered), BTreeSet::from([(53, 20000)]));
    }

    #[test]
    fn source_ranges_limit_the_redirect() {
        let lb = r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [198.51.100.0/24]
  ports: [{port: 80, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.7}]}}
"#;
        let r = ruleset(lb);
        let mut ports = Ports::new(PortRange::default());
        ports.assign(&r).unwrap();
        let rules = render_iptables(&redirects(&r, &ports, IpFamily::IPv4, &|_, _| true));
        assert!(rules[1].contains("-s 198.51.100.0/24 -d 203.0.113.7/32"), "{rules:?}");
        let nft = render_nft(&redirects(&r, &ports, IpFamily::IPv4, &|_, _| true), IpFamily::IPv4);
        assert!(nft.contains("ip saddr { 198.51.100.0/24 } ip daddr 203.0.113.7 tcp dport 80"), "{nft}");
    }

    #[test]
    fn the_nat_tool_is_chosen_by_what_is_installed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().as_os_str().to_owned();
        assert!(matches!(NatTool::Auto.resolve(&path), Err(Error::NoNatTool)));
        let exe = |name: &str| {
            let file = dir.path().join(name);
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        exe("nft");
        assert_eq!(NatTool::Auto.resolve(&path).unwrap(), NatTool::Nftables);
        exe("iptables-restore");
        assert_eq!(NatTool::Auto.resolve(&path).unwrap(), NatTool::Iptables);
        assert_eq!(NatTool::Nftables.resolve(&path).unwrap(), NatTool::Nftables);
    }
}
