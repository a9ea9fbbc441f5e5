//! iptables mode: a [`Ruleset`] rendered in kube-proxy's chain layout under weir's names and
//! applied with `iptables-restore --noflush`.
//!
//! nat table:
//! - `WEIR-SERVICES` (jumped to from PREROUTING and OUTPUT): one rule per virtual IP and port,
//!   to the port's internal chain (ClusterIPs) or external chain (externalIPs, LoadBalancer IPs);
//!   its last rule sends traffic to a local address to `WEIR-NODEPORTS`.
//! - `WEIR-SVC-<hash>` per service port: the cluster endpoints, chosen with `statistic --mode
//!   random --probability 1/(n−i)` (uniform), after ClientIP affinity checks (`recent --rcheck`).
//! - `WEIR-SVL-<hash>`: the same over this node's endpoints, for `Local` traffic policies.
//! - `WEIR-EXT-<hash>`: external traffic; marks it for masquerade under the `Cluster` policy.
//! - `WEIR-FW-<hash>`: for LoadBalancer IPs with `loadBalancerSourceRanges`, the admitted
//!   sources go on to `WEIR-EXT-<hash>`; the others are not DNATed, and filter's
//!   `WEIR-EXTERNAL-SERVICES` drops them (as kube-proxy's firewall chains do; ipvs mode,
//!   whose filter table this is, relies on those rules alone).
//! - `WEIR-SEP-<hash>` per endpoint: hairpin masquerade mark, affinity `recent --set`, DNAT.
//! - `WEIR-MARK-MASQ` sets mark bit 0x4000; `WEIR-POSTROUTING` (from POSTROUTING) masquerades
//!   marked packets.
//!
//! filter table: `WEIR-SERVICES` (from OUTPUT and FORWARD, new connections) rejects ClusterIP
//! traffic of ports without endpoints; `WEIR-EXTERNAL-SERVICES` (from INPUT and FORWARD) does the
//! same for external destinations (DROP when only a `Local` policy leaves none);
//! `WEIR-FORWARD` accepts forwarded service traffic when the FORWARD policy is DROP.
//!
//! Chain names are hashed from typed identities (stable, ≤ 28 characters). A sync writes only
//! the chains whose content changed (nothing when nothing changed), deletes chains no longer
//! needed, and flushes stale UDP conntrack entries of endpoints that went away.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use super::conntrack;
use super::exec::{self, Runner};
use super::plan::{Cidr, Endpoint, IpFamily, Protocol, Ruleset, ServicePort, ServicePortKey, TrafficPolicy};

/// Prefix of every chain weir creates.
pub const CHAIN_PREFIX: &str = "WEIR-";
/// The services chain (nat and filter).
pub const SERVICES: &str = "WEIR-SERVICES";
/// The external services chain (filter).
pub const EXTERNAL_SERVICES: &str = "WEIR-EXTERNAL-SERVICES";
/// The node ports chain (nat).
pub const NODEPORTS: &str = "WEIR-NODEPORTS";
/// The mark-for-masquerade chain (nat).
pub const MARK_MASQ: &str = "WEIR-MARK-MASQ";
/// The masquerade chain (nat), jumped to from POSTROUTING.
pub const POSTROUTING: &str = "WEIR-POSTROUTING";
/// The forward-accept chain (filter).
pub const FORWARD: &str = "WEIR-FORWARD";
/// The packet mark bit that asks for masquerade.
pub const MASQ_MARK: &str = "0x4000";

/// Errors of iptables mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tool failed.
    #[error(transparent)]
    Exec(#[from] exec::Error),
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Options of iptables and nftables modes (from the command line).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The IP family this instance programs (`iptables` or `ip6tables`; nftables table `ip
    /// weir` or `ip6 weir`).
    pub family: Option<IpFamily>,
    /// Pod CIDR: ClusterIP traffic from outside it is masqueraded.
    pub cluster_cidr: Option<Cidr>,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
}

impl Config {
    fn family(&self) -> IpFamily {
        self.family.unwrap_or(IpFamily::IPv4)
    }
}

/// A table: chain name → its rules (the arguments after `-A CHAIN`).
pub type Chains = BTreeMap<String, Vec<String>>;

/// The rendered state of weir's chains in the two tables it uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    /// The nat table.
    pub nat: Chains,
    /// The filter table.
    pub filter: Chains,
}

impl Tables {
    /// Number of rules over every chain.
    pub fn rule_count(&self) -> usize {
        self.nat.values().chain(self.filter.values()).map(Vec::len).sum()
    }
}

// === chain names ===

/// FNV-1a, 128 bits: stable across versions and platforms (unlike `DefaultHasher`).
fn fnv1a128(data: &[u8]) -> u128 {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in data {
        h ^= u128::from(*b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    // FNV mixes the last bytes poorly into the high bits; a multiply-xorshift finalizer
    // spreads them so that endpoints differing in one digit get unrelated names.
    for _ in 0..2 {
        h ^= h >> 67;
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        h ^= h >> 59;
    }
    h
}

/// 16 base32 characters (80 bits) of the hash of `identity`.
pub(crate) fn hash_name(identity: &str) -> String {
    hash16(identity)
}

fn hash16(identity: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let h = fnv1a128(identity.as_bytes());
    (0..16).map(|i| char::from(ALPHABET[((h >> (123 - 5 * i)) & 31) as usize])).collect()
}

fn port_identity(key: &ServicePortKey) -> String {
    // The Display of the key is namespace/name[:port]/protocol[/ipv6]: unambiguous since
    // Kubernetes names cannot contain ':' or '/'.
    key.to_string()
}

/// `WEIR-SVC-<hash>`: the cluster endpoints of a service port.
pub fn svc_chain(key: &ServicePortKey) -> String {
    format!("WEIR-SVC-{}", hash16(&port_identity(key)))
}

/// `WEIR-SVL-<hash>`: the local endpoints of a service port.
pub fn svl_chain(key: &ServicePortKey) -> String {
    format!("WEIR-SVL-{}", hash16(&port_identity(key)))
}

/// `WEIR-EXT-<hash>`: external traffic of a service port.
pub fn ext_chain(key: &ServicePortKey) -> String {
    format!("WEIR-EXT-{}", hash16(&port_identity(key)))
}

/// `WEIR-FW-<hash>`: the source ranges admitted to a service port's LoadBalancer IPs.
pub fn fw_chain(key: &ServicePortKey) -> String {
    format!("WEIR-FW-{}", hash16(&port_identity(key)))
}

/// `WEIR-SEP-<hash>`: one endpoint of a service port.
pub fn sep_chain(key: &ServicePortKey, ep: &Endpoint) -> String {
    let addr = match ep.ip {
        IpAddr::V4(ip) => format!("{ip}:{}", ep.port),
        IpAddr::V6(ip) => format!("[{ip}]:{}", ep.port),
    };
    format!("WEIR-SEP-{}", hash16(&format!("{}>{addr}", port_identity(key))))
}

// === rendering ===

fn host(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

fn dest(ep: &Endpoint) -> String {
    match ep.ip {
        IpAddr::V4(ip) => format!("{ip}:{}", ep.port),
        IpAddr::V6(ip) => format!("[{ip}]:{}", ep.port),
    }
}

fn proto(p: Protocol) -> String {
    let p = p.as_str();
    format!("-p {p} -m {p}")
}

/// Renders `ruleset` (the entries of `config`'s family) into weir's chains.
pub fn render(ruleset: &Ruleset, config: &Config) -> Tables {
    let family = config.family();
    let reject = reject_target(family);
    let mut t = Tables::default();
    for name in [SERVICES, NODEPORTS, MARK_MASQ, POSTROUTING] {
        t.nat.insert(name.to_string(), Vec::new());
    }
    for name in [SERVICES, EXTERNAL_SERVICES, FORWARD] {
        t.filter.insert(name.to_string(), Vec::new());
    }
    t.nat.insert(MARK_MASQ.into(), vec![format!("-j MARK --or-mark {MASQ_MARK}")]);
    t.nat.insert(
        POSTROUTING.into(),
        vec![
            format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-j MARK --xor-mark {MASQ_MARK}"),
            r#"-m comment --comment "weir service traffic requiring SNAT" -j MASQUERADE --random-fully"#
                .into(),
        ],
    );
    t.filter.insert(
        FORWARD.into(),
        vec![
            format!(r#"-m comment --comment "weir forwarding rules" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"#),
            r#"-m comment --comment "weir forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"#
                .into(),
        ],
    );

    let mut nat_services = Vec::new();
    let mut nodeports = Vec::new();
    for sp in ruleset.services.iter().filter(|sp| sp.key.family == family) {
        render_port(sp, config, reject, &mut t, &mut nat_services, &mut nodeports);
    }
    nat_services.push(
        r#"-m comment --comment "weir service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j WEIR-NODEPORTS"#
            .into(),
    );
    t.nat.insert(SERVICES.into(), nat_services);
    t.nat.insert(NODEPORTS.into(), nodeports);
    t
}

fn reject_target(family: IpFamily) -> &'static str {
    match family {
        IpFamily::IPv4 => "REJECT --reject-with icmp-port-unreachable",
        IpFamily::IPv6 => "REJECT --reject-with icmp6-port-unreachable",
    }
}

/// One port's own nat chains, and its rules in the shared chains (each prefixed with its chain).
fn piece(sp: &ServicePort, config: &Config) -> (Chains, Vec<String>) {
    let mut t = Tables::default();
    let (mut services, mut nodeports) = (Vec::new(), Vec::new());
    render_port(sp, config, reject_target(config.family()), &mut t, &mut services, &mut nodeports);
    let mut shared: Vec<String> = t
        .filter
        .into_iter()
        .flat_map(|(c, rules)| rules.into_iter().map(move |r| format!("{c} {r}")))
        .collect();
    shared.extend(services.into_iter().map(|r| format!("{SERVICES} {r}")));
    shared.extend(nodeports.into_iter().map(|r| format!("{NODEPORTS} {r}")));
    (t.nat, shared)
}

fn render_port(
    sp: &ServicePort,
    config: &Config,
    reject: &str,
    t: &mut Tables,
    nat_services: &mut Vec<String>,
    nodeports: &mut Vec<String>,
) {
    let key = &sp.key;
    // kube-proxy's ServicePortName: namespace/name, then `:port` when the port is named.
    let name = match key.port_name.as_str() {
        "" => key.service.to_string(),
        port => format!("{}:{port}", key.service),
    };
    let p = proto(key.protocol);
    let svc = svc_chain(key);
    let svl = svl_chain(key);
    let ext = ext_chain(key);
    let fw = fw_chain(key);
    let chain_of = |policy: TrafficPolicy| match policy {
        TrafficPolicy::Cluster => svc.clone(),
        TrafficPolicy::Local => svl.clone(),
    };
    let internal_chain = chain_of(sp.internal_policy);
    let has_internal = !sp.internal_endpoints().is_empty();
    let has_external = !sp.external_endpoints().is_empty();
    // No endpoint anywhere: reject. Endpoints on other nodes only (a `Local` policy): drop.
    let (filter_target, why) = if sp.no_endpoints {
        (reject.to_string(), "has no endpoints")
    } else {
        ("DROP".to_string(), "has no local endpoints")
    };

    // ClusterIPs.
    for ip in &sp.cluster_ips {
        let m = format!("-d {} {p} --dport {}", host(ip), sp.port);
        if has_internal {
            nat_services.push(format!(r#"-m comment --comment "{name} cluster IP" {m} -j {internal_chain}"#));
        } else {
            t.filter
                .entry(SERVICES.into())
                .or_default()
                .push(format!(r#"-m comment --comment "{name} {why}" {m} -j {filter_target}"#));
        }
    }
    // External destinations: externalIPs, LoadBalancer IPs, the node port.
    for (ip, what) in sp
        .external_ips
        .iter()
        .map(|ip| (ip, "external IP"))
        .chain(sp.load_balancer_ips.iter().map(|ip| (ip, "loadbalancer IP")))
    {
        let m = format!("-d {} {p} --dport {}", host(ip), sp.port);
        let firewalled = sp.source_ranges.is_some() && what == "loadbalancer IP";
        if has_external && firewalled {
            // Admitted sources go on to the external chain; the others are not DNATed, and the
            // filter table drops them. (ipvs mode, which shares this filter table, sees every
            // packet still addressed to the LoadBalancer IP there: the admitted ones return.)
            nat_services.push(format!(r#"-m comment --comment "{name} {what}" {m} -j {fw}"#));
            let filter = t.filter.entry(EXTERNAL_SERVICES.into()).or_default();
            for cidr in sp.source_ranges.iter().flatten() {
                filter.push(format!(
                    r#"-m comment --comment "{name} loadBalancerSourceRanges" -s {cidr} {m} -j RETURN"#
                ));
            }
            filter.push(format!(
                r#"-m comment --comment "{name} traffic not admitted by loadBalancerSourceRanges" {m} -j DROP"#
            ));
        } else if has_external {
            nat_services.push(format!(r#"-m comment --comment "{name} {what}" {m} -j {ext}"#));
        } else {
            t.filter
                .entry(EXTERNAL_SERVICES.into())
                .or_default()
                .push(format!(r#"-m comment --comment "{name} {why}" {m} -j {filter_target}"#));
        }
    }
    if let Some(np) = sp.node_port {
        if has_external {
            nodeports.push(format!(r#"-m comment --comment "{name}" {p} --dport {np} -j {ext}"#));
        } else {
            t.filter.entry(EXTERNAL_SERVICES.into()).or_default().push(format!(
                r#"-m comment --comment "{name} {why}" -m addrtype --dst-type LOCAL {p} --dport {np} -j {filter_target}"#
            ));
        }
    }

    // The firewall chain: the admitted source ranges.
    if let Some(ranges) =
        sp.source_ranges.as_ref().filter(|_| has_external && !sp.load_balancer_ips.is_empty())
    {
        let rules = ranges
            .iter()
            .map(|cidr| format!(r#"-m comment --comment "{name} loadbalancer IP" -s {cidr} -j {ext}"#))
            .collect();
        t.nat.insert(fw, rules);
    }

    // The external chain.
    if sp.is_external() && has_external {
        let mut rules = Vec::new();
        match sp.external_policy {
            TrafficPolicy::Cluster => {
                rules.push(format!(r#"-m comment --comment "masquerade traffic for {name} external destinations" -j {MARK_MASQ}"#));
                rules.push(format!("-j {svc}"));
            }
            TrafficPolicy::Local => {
                if !sp.cluster_endpoints.is_empty() {
                    if let Some(cidr) = &config.cluster_cidr {
                        rules.push(format!(
                            r#"-s {cidr} -m comment --comment "pod traffic for {name} external destinations" -j {svc}"#
                        ));
                    }
                    rules.push(format!(
                        r#"-m comment --comment "masquerade LOCAL traffic for {name} external destinations" -m addrtype --src-type LOCAL -j {MARK_MASQ}"#
                    ));
                    rules.push(format!(
                        r#"-m comment --comment "route LOCAL traffic for {name} external destinations" -m addrtype --src-type LOCAL -j {svc}"#
                    ));
                }
                rules.push(format!("-j {svl}"));
            }
        }
        t.nat.insert(ext, rules);
    }

    // Endpoint-choosing chains.
    // The plan fills each list only when some policy uses it.
    let uses_cluster = !sp.cluster_endpoints.is_empty();
    let uses_local = !sp.local_endpoints.is_empty();
    let masq_rules = |chain: &str| -> Vec<String> {
        if chain != internal_chain || !has_internal {
            return Vec::new();
        }
        sp.cluster_ips
            .iter()
            .filter_map(|ip| {
                let m = format!("-d {} {p} --dport {}", host(ip), sp.port);
                if config.masquerade_all {
                    Some(format!(r#"-m comment --comment "{name} cluster IP" {m} -j {MARK_MASQ}"#))
                } else {
                    config.cluster_cidr.as_ref().filter(|c| c.family() == IpFamily::of(ip)).map(|cidr| {
                        format!(r#"-m comment --comment "{name} cluster IP" ! -s {cidr} {m} -j {MARK_MASQ}"#)
                    })
                }
            })
            .collect()
    };
    if uses_cluster {
        let mut rules = masq_rules(&svc);
        rules.extend(choose(sp, &name, &sp.cluster_endpoints));
        t.nat.insert(svc.clone(), rules);
    }
    if uses_local {
        let mut rules = masq_rules(&svl);
        rules.extend(choose(sp, &name, &sp.local_endpoints));
        t.nat.insert(svl.clone(), rules);
    }
    for ep in sp.all_endpoints() {
        let sep = sep_chain(key, ep);
        let recent = match sp.affinity {
            Some(_) => format!("-m recent --name {sep} --set "),
            None => String::new(),
        };
        let rules = vec![
            format!(r#"-m comment --comment "{name}" -s {} -j {MARK_MASQ}"#, host(&ep.ip)),
            format!(r#"-m comment --comment "{name}" {p} {recent}-j DNAT --to-destination {}"#, dest(ep)),
        ];
        t.nat.insert(sep, rules);
    }
}

/// Affinity checks, then a uniform random choice among `endpoints`.
fn choose(sp: &ServicePort, name: &str, endpoints: &[Endpoint]) -> Vec<String> {
    let mut rules = Vec::new();
    if let Some(affinity) = sp.affinity {
        for ep in endpoints {
            let sep = sep_chain(&sp.key, ep);
            rules.push(format!(
                r#"-m comment --comment "{name} -> {}" -m recent --name {sep} --rcheck --seconds {} --reap -j {sep}"#,
                dest(ep),
                affinity.timeout_seconds
            ));
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let sep = sep_chain(&sp.key, ep);
        if i + 1 < n {
            let probability = 1.0 / (n - i) as f64;
            rules.push(format!(
                r#"-m comment --comment "{name} -> {}" -m statistic --mode random --probability {probability:.10} -j {sep}"#,
                dest(ep)
            ));
        } else {
            rules.push(format!(r#"-m comment --comment "{name} -> {}" -j {sep}"#, dest(ep)));
        }
    }
    rules
}

/// Most chains declared in one `iptables-restore` run. iptables-nft (1.8.9) takes time
/// quadratic in the chains of one run (measured in a namespace: 10,000 chains 1 s, 20,000 6 s,
/// 110,000 11 min), and linear over several runs; see [`restore_batches`].
pub const BATCH_CHAINS: usize = 4096;

/// The order in which chains are written in a sync split into several runs: a chain is
/// written after every chain it jumps to.
fn tier(name: &str) -> u8 {
    if name == MARK_MASQ {
        0
    } else if name.starts_with("WEIR-SEP-") {
        1
    } else if name.starts_with("WEIR-SVC-") || name.starts_with("WEIR-SVL-") {
        2
    } else if name.starts_with("WEIR-EXT-") {
        3
    } else if name.starts_with("WEIR-FW-") {
        4
    } else {
        5
    }
}

/// [`restore_text`], split into runs that declare at most `max` chains each (`max / 16` for
/// chains that jump to weir's service and endpoint chains). A small change is
/// one run (each table commits atomically). A bigger one is written in dependency order, each
/// chain whole in one run: endpoint chains, then service chains, then external chains, then
/// firewall chains, then the entry chains (`WEIR-SERVICES`, ...) and the filter table; only then are vanished chains
/// flushed (all of them, so that none refers to another) and deleted. A run that fails leaves
/// every reachable chain complete, and the retry is a full sync.
pub fn restore_batches(old: Option<&Tables>, new: &Tables, stale: &Tables, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut changed: Vec<(u8, &'static str, &String, &Vec<String>)> = Vec::new();
    let mut removed: Vec<(&'static str, &String)> = Vec::new();
    for (table, old_chains, new_chains, stale_chains) in [
        ("filter", old.map(|o| &o.filter), &new.filter, &stale.filter),
        ("nat", old.map(|o| &o.nat), &new.nat, &stale.nat),
    ] {
        for (name, rules) in new_chains {
            if old_chains.and_then(|o| o.get(name)) != Some(rules) {
                changed.push((tier(name), table, name, rules));
            }
        }
        let gone: BTreeSet<&String> = old_chains
            .into_iter()
            .flat_map(|o| o.keys())
            .chain(stale_chains.keys())
            .filter(|c| !new_chains.contains_key(*c))
            .collect();
        removed.extend(gone.into_iter().map(|c| (table, c)));
    }
    if changed.len() + removed.len() <= max {
        return restore_text(old, new, stale).into_iter().collect();
    }
    changed.sort();
    let mut batches = Vec::new();
    // One run: `*table`, declarations, rules and `-X` lines per table, in table order.
    let run = |items: &[(&'static str, &String, Option<&Vec<String>>, bool)]| {
        let mut out = String::new();
        for table in ["filter", "nat"] {
            let mine: Vec<_> = items.iter().filter(|i| i.0 == table).collect();
            if mine.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{table}");
            for (_, name, _, _) in &mine {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for (_, name, rules, _) in &mine {
                for rule in rules.iter().flat_map(|r| r.iter()) {
                    let _ = writeln!(out, "-A {name} {rule}");
                }
            }
            for (_, name, _, delete) in &mine {
                if *delete {
                    let _ = writeln!(out, "-X {name}");
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    };
    // Chains that jump to other weir chains go in much smaller runs: iptables-nft's time grows
    // with jumps × chains declared in the run (2,700 service chains with 24,000 jumps in one
    // run: 17 s; in runs of 256: about 0.15 s each).
    for tier_items in changed.chunk_by(|a, b| a.0 == b.0) {
        let size = if tier_items[0].0 <= 1 { max } else { (max / 16).max(1) };
        for chunk in tier_items.chunks(size) {
            let items: Vec<_> = chunk.iter().map(|(_, t, n, r)| (*t, *n, Some(*r), false)).collect();
            batches.push(run(&items));
        }
    }
    for chunk in removed.chunks(max) {
        let items: Vec<_> = chunk.iter().map(|(t, n)| (*t, *n, None, false)).collect();
        batches.push(run(&items));
    }
    for chunk in removed.chunks(max) {
        let items: Vec<_> = chunk.iter().map(|(t, n)| (*t, *n, None, true)).collect();
        batches.push(run(&items));
    }
    batches
}

/// The `iptables-restore --noflush` input that turns `old` into `new`: changed and new chains
/// are declared (which flushes them) and rewritten, vanished ones flushed and deleted. With
/// `old == None` every chain is written. `None` when there is nothing to write.
pub fn restore_text(old: Option<&Tables>, new: &Tables, stale: &Tables) -> Option<String> {
    let mut out = String::new();
    for (table, old_chains, new_chains, stale_chains) in [
        ("filter", old.map(|o| &o.filter), &new.filter, &stale.filter),
        ("nat", old.map(|o| &o.nat), &new.nat, &stale.nat),
    ] {
        let changed: Vec<(&String, &Vec<String>)> = new_chains
            .iter()
            .filter(|(name, rules)| old_chains.and_then(|o| o.get(*name)) != Some(*rules))
            .collect();
        let mut removed: BTreeSet<&String> =
            old_chains.into_iter().flat_map(|o| o.keys()).filter(|c| !new_chains.contains_key(*c)).collect();
        removed.extend(stale_chains.keys().filter(|c| !new_chains.contains_key(*c)));
        if changed.is_empty() && removed.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{table}");
        for name in changed.iter().map(|(n, _)| *n).chain(removed.iter().copied()) {
            let _ = writeln!(out, ":{name} - [0:0]");
        }
        for (name, rules) in &changed {
            for rule in *rules {
                let _ = writeln!(out, "-A {name} {rule}");
            }
        }
        for name in &removed {
            let _ = writeln!(out, "-X {name}");
        }
        out.push_str("COMMIT\n");
    }
    (!out.is_empty()).then_some(out)
}

// === applying ===

/// A jump from a built-in chain into one of weir's.
/// `iptables -C`'s exit status when the rule is not in the chain. Others mean the check itself
/// failed: 4 (resource problem: the xtables lock still held after `-w`, a netlink error under
/// load), 2 (bad arguments, a missing target chain).
const CHECK_MISSING: i32 = 1;

/// Checks made of a rule before giving up (the first and the retries), and the pause after a
/// failed check (doubling).
const CHECK_TRIES: u32 = 4;
const CHECK_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Makes sure the rule `args` is in `table`'s `chain` (inserted first when missing) with
/// `iptables` (or `ip6tables`); returns whether it was missing. Only `-C`'s exit status 1 means
/// missing: a check that failed for another reason is retried a few times, then returned as an
/// error (the next resync checks again) and nothing is inserted, since inserting on it would
/// add a second copy of a rule that is there.
pub(crate) fn ensure_rule(
    runner: &Runner,
    iptables: &str,
    table: &str,
    chain: &str,
    args: &[&str],
) -> exec::Result<bool> {
    let mut check = vec!["-w", "5", "-t", table, "-C", chain];
    check.extend(args);
    let mut pause = CHECK_PAUSE;
    for attempt in 1..=CHECK_TRIES {
        let (status, out) = runner.status(iptables, &check, None)?;
        match status.code() {
            Some(0) => return Ok(false),
            Some(CHECK_MISSING) => {
                let mut insert = vec!["-w", "5", "-t", table, "-I", chain];
                insert.extend(args);
                runner.run(iptables, &insert, None)?;
                return Ok(true);
            }
            _ if attempt < CHECK_TRIES => {
                tracing::debug!(%status, stderr = out.stderr.trim(), table, chain, attempt, "{iptables} -C failed; checking again");
                std::thread::sleep(pause);
                pause *= 2;
            }
            _ => {
                return Err(exec::Error::Failed {
                    program: format!("{iptables} {}", check.join(" ")),
                    status,
                    stderr: out.stderr.trim().to_string(),
                });
            }
        }
    }
    Ok(false)
}

struct Jump {
    table: &'static str,
    chain: &'static str,
    args: &'static [&'static str],
}

const JUMPS: &[Jump] = &[
    Jump {
        table: "nat",
        chain: "PREROUTING",
        args: &["-m", "comment", "--comment", "weir service portals", "-j", SERVICES],
    },
    Jump {
        table: "nat",
        chain: "OUTPUT",
        args: &["-m", "comment", "--comment", "weir service portals", "-j", SERVICES],
    },
    Jump {
        table: "nat",
        chain: "POSTROUTING",
        args: &["-m", "comment", "--comment", "weir postrouting rules", "-j", POSTROUTING],
    },
    Jump {
        table: "filter",
        chain: "INPUT",
        args: &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "weir externally-visible service portals",
            "-j",
            EXTERNAL_SERVICES,
        ],
    },
    Jump {
        table: "filter",
        chain: "FORWARD",
        args: &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "weir externally-visible service portals",
            "-j",
            EXTERNAL_SERVICES,
        ],
    },
    Jump {
        table: "filter",
        chain: "FORWARD",
        args: &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "weir service portals",
            "-j",
            SERVICES,
        ],
    },
    Jump {
        table: "filter",
        chain: "OUTPUT",
        args: &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "weir service portals",
            "-j",
            SERVICES,
        ],
    },
    Jump {
        table: "filter",
        chain: "FORWARD",
        args: &["-m", "comment", "--comment", "weir forwarding rules", "-j", FORWARD],
    },
];

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether anything was written.
    pub written: bool,
    /// Chains declared (written or deleted).
    pub chains_written: usize,
    /// Rules written.
    pub rules_written: usize,
    /// Rules in weir's chains after the sync.
    pub rules_total: usize,
    /// conntrack deletions run.
    pub conntrack_flushes: usize,
}

/// The iptables backend: renders, diffs against what it applied last, applies.
#[derive(Debug)]
pub struct Iptables {
    runner: Runner,
    config: Config,
    applied: Option<Tables>,
    applied_ruleset: Option<Ruleset>,
}

impl Iptables {
    /// A backend running its tools through `runner`.
    pub fn new(runner: Runner, config: Config) -> Self {
        Iptables { runner, config, applied: None, applied_ruleset: None }
    }

    fn program(&self, base: &str) -> String {
        match self.config.family() {
            IpFamily::IPv4 => base.to_string(),
            IpFamily::IPv6 => base.replacen("iptables", "ip6tables", 1),
        }
    }

    /// The last successfully applied tables, if any.
    pub fn applied(&self) -> Option<&Tables> {
        self.applied.as_ref()
    }

    /// Forgets what was applied, so the next sync rewrites every chain.
    pub fn invalidate(&mut self) {
        self.applied = None;
    }

    /// Brings the kernel to `ruleset`. With `full` (or after [`Iptables::invalidate`] or a
    /// failure), every chain is rewritten and leftover weir chains are deleted; otherwise only
    /// what changed since the last successful sync is written, and nothing when nothing changed.
    ///
    /// A partial sync where no changed port adds or removes rules in the shared chains
    /// (`WEIR-SERVICES`, `WEIR-NODEPORTS`, the filter chains), as an endpoint change, renders
    /// only the changed ports.
    pub fn sync(&mut self, ruleset: &Ruleset, full: bool) -> Result<SyncStats> {
        if !full && let Some(mut stats) = self.try_partial(ruleset)? {
            stats.conntrack_flushes = self.flush_conntrack(ruleset);
            self.applied_ruleset = Some(ruleset.clone());
            return Ok(stats);
        }
        let mut stats = self.apply(render(ruleset, &self.config), full)?;
        stats.conntrack_flushes = self.flush_conntrack(ruleset);
        self.applied_ruleset = Some(ruleset.clone());
        Ok(stats)
    }

    /// The partial sync of [`Iptables::sync`], or `None` when the shared chains change.
    fn try_partial(&mut self, ruleset: &Ruleset) -> Result<Option<SyncStats>> {
        if self.applied.is_none() {
            return Ok(None);
        }
        let Some(old) = self.applied_ruleset.as_ref() else { return Ok(None) };
        let (mut before, mut after) = (Tables::default(), Tables::default());
        for (a, b) in super::plan::changed_ports(old, ruleset, self.config.family()) {
            let (a_own, a_shared) = a.map(|sp| piece(sp, &self.config)).unwrap_or_default();
            let (b_own, b_shared) = b.map(|sp| piece(sp, &self.config)).unwrap_or_default();
            if a_shared != b_shared {
                return Ok(None);
            }
            before.nat.extend(a_own);
            after.nat.extend(b_own);
        }
        let Some(mut applied) = self.applied.take() else { return Ok(None) };
        let mut stats = SyncStats::default();
        if let Some(text) = restore_text(Some(&before), &after, &Tables::default()) {
            stats.written = true;
            stats.chains_written = text.lines().filter(|l| l.starts_with(':')).count();
            stats.rules_written = text.lines().filter(|l| l.starts_with("-A ")).count();
            // On failure, `applied` stays None: the next sync is a full one.
            self.runner.run(&self.program("iptables-restore"), &["-w", "5", "--noflush"], Some(&text))?;
        }
        for name in before.nat.keys() {
            if !after.nat.contains_key(name) {
                applied.nat.remove(name);
            }
        }
        applied.nat.extend(after.nat);
        stats.rules_total = applied.rule_count();
        self.applied = Some(applied);
        Ok(Some(stats))
    }

    /// Brings weir's chains to `new` (rendered by the caller: ipvs mode has its own nat
    /// chains), as [`Iptables::sync`] does, without conntrack handling.
    pub fn apply(&mut self, new: Tables, full: bool) -> Result<SyncStats> {
        let old = if full { None } else { self.applied.take() };
        let stale = if old.is_none() { self.existing_chains()? } else { Tables::default() };
        let mut stats = SyncStats { rules_total: new.rule_count(), ..SyncStats::default() };
        let restore = self.program("iptables-restore");
        for text in restore_batches(old.as_ref(), &new, &stale, BATCH_CHAINS) {
            stats.written = true;
            stats.chains_written += text.lines().filter(|l| l.starts_with(':')).count();
            stats.rules_written += text.lines().filter(|l| l.starts_with("-A ")).count();
            // On failure, `applied` stays None: the next sync is a full one.
            self.runner.run(&restore, &["-w", "5", "--noflush"], Some(&text))?;
        }
        if old.is_none() {
            self.ensure_jumps()?;
        }
        self.applied = Some(new);
        Ok(stats)
    }

    /// Checks the jumps from the built-in chains and adds missing ones. Returns how many were
    /// missing.
    pub fn ensure_jumps(&self) -> Result<usize> {
        let iptables = self.program("iptables");
        let mut added = 0;
        for jump in JUMPS {
            added += usize::from(ensure_rule(&self.runner, &iptables, jump.table, jump.chain, jump.args)?);
        }
        Ok(added)
    }

    /// weir's chains as they exist in the kernel (names only).
    fn existing_chains(&self) -> Result<Tables> {
        let save = self.program("iptables-save");
        let mut t = Tables::default();
        for table in ["nat", "filter"] {
            let out = self.runner.run(&save, &["-t", table], None)?;
            let chains: Chains = out
                .stdout
                .lines()
                .filter_map(|l| l.strip_prefix(':'))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|c| c.starts_with(CHAIN_PREFIX))
                .map(|c| (c.to_string(), Vec::new()))
                .collect();
            match table {
                "nat" => t.nat = chains,
                _ => t.filter = chains,
            }
        }
        Ok(t)
    }

    /// Deletes stale UDP conntrack entries (see [`conntrack`]): at the first sync, those of every
    /// UDP Service port ([`conntrack::at_start`]).
    fn flush_conntrack(&self, ruleset: &Ruleset) -> usize {
        let family = self.config.family();
        let flushes = match &self.applied_ruleset {
            Some(old) => conntrack::stale_udp(family, old, ruleset),
            None => conntrack::at_start(family, ruleset),
        };
        conntrack::flush(&self.runner, family, &flushes)
    }

    /// Removes every weir chain and every jump into them (both tables), leaving all else.
    pub fn cleanup(&mut self) -> Result<()> {
        let iptables = self.program("iptables");
        for jump in JUMPS {
            let mut delete = vec!["-w", "5", "-t", jump.table, "-D", jump.chain];
            delete.extend(jump.args);
            // A jump inserted twice (by hand, or an old version) is deleted twice.
            for _ in 0..16 {
                let (status, _) = self.runner.status(&iptables, &delete, None)?;
                if !status.success() {
                    break;
                }
            }
        }
        let existing = self.existing_chains()?;
        if let Some(text) = restore_text(None, &Tables::default(), &existing) {
            // `restore_text` declares the (empty) new chains too; with an empty `new` it only
            // flushes and deletes the existing ones.
            let restore = self.program("iptables-restore");
            self.runner.run(&restore, &["-w", "5", "--noflush"], Some(&text))?;
        }
        self.applied = None;
        self.applied_ruleset = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::node::plan::test_ruleset as ruleset;

    /// `ensure_rule` against a stand-in `iptables` (a shell script run as the runner's prefix)
    /// whose `-C` exits with the given statuses in turn: what it runs, and what it returns.
    fn ensure_with(codes: &[i32]) -> (exec::Result<bool>, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let (log, todo) = (dir.path().join("calls"), dir.path().join("codes"));
        let codes: String = codes.iter().map(|c| format!("{c}\n")).collect();
        std::fs::write(&todo, codes).unwrap();
        let script = format!(
            "echo \"$*\" >> {log}; case \"$*\" in *' -C '*) c=$(head -n 1 {todo}); sed -i 1d {todo}; \
             exit ${{c:-0}};; esac",
            log = log.display(),
            todo = todo.display()
        );
        let runner = Runner::with_prefix(vec!["sh".into(), "-c".into(), script, "iptables".into()]);
        let args = ["-m", "comment", "--comment", "weir service portals", "-j", SERVICES];
        let result = ensure_rule(&runner, "iptables", "nat", "PREROUTING", &args);
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        (result, calls.lines().map(|l| l.split(' ').nth(5).unwrap_or("").to_string()).collect())
    }

    /// Only `-C`'s exit status 1 inserts the rule; a check failing otherwise (4: the xtables
    /// lock) is retried and, when it keeps failing, an error: never a second copy of the rule.
    #[test]
    fn a_rule_is_inserted_only_when_the_check_says_missing() {
        let (result, calls) = ensure_with(&[0]);
        assert_eq!((result.unwrap(), calls), (false, vec!["-C".to_string()]));
        let (result, calls) = ensure_with(&[1]);
        assert_eq!((result.unwrap(), calls), (true, vec!["-C".to_string(), "-I".to_string()]));
        let (result, calls) = ensure_with(&[4, 4, 0]);
        assert_eq!((result.unwrap(), calls), (false, vec!["-C".to_string(); 3]));
        let (result, calls) = ensure_with(&[4, 1]);
        assert_eq!((result.unwrap(), calls), (true, vec!["-C".into(), "-C".into(), "-I".into()]));
        let (result, calls) = ensure_with(&[4, 4, 2, 4]);
        let error = result.unwrap_err().to_string();
        assert!(error.contains("-C PREROUTING"), "{error}");
        assert_eq!(calls, vec!["-C".to_string(); 4], "nothing inserted");
    }

    const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.0.1]
- addresses: [10.244.0.2]
- addresses: [10.244.0.3]
"#;

    #[test]
    fn source_ranges_render_a_firewall() {
        let lb = r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [198.51.100.0/24, 192.0.2.0/28]
  ports: [{port: 80, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.7}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- addresses: [10.244.0.1]
"#;
        let r = ruleset(lb);
        let key = &r.services[0].key;
        let t = render(&r, &Config::default());
        let fw = fw_chain(key);
        let ext = ext_chain(key);
        assert_eq!(
            t.nat[&fw],
            [
                format!(r#"-m comment --comment "default/lb loadbalancer IP" -s 192.0.2.0/28 -j {ext}"#),
                format!(r#"-m comment --comment "default/lb loadbalancer IP" -s 198.51.100.0/24 -j {ext}"#),
            ]
        );
        assert!(
            t.nat[SERVICES]
                .iter()
                .any(|r| r.contains("-d 203.0.113.7/32") && r.ends_with(&format!("-j {fw}")))
        );
        // The cluster IP and the node port are not firewalled.
        assert!(
            t.nat[SERVICES]
                .iter()
                .any(|r| r.contains("-d 10.96.0.10/32") && r.ends_with(&format!("-j {}", svc_chain(key))))
        );
        let filter = &t.filter[EXTERNAL_SERVICES];
        assert_eq!(filter.len(), 3, "{filter:?}");
        assert!(filter[0].contains("-s 192.0.2.0/28 -d 203.0.113.7/32") && filter[0].ends_with("-j RETURN"));
        assert!(filter[2].contains("-d 203.0.113.7/32 -p tcp -m tcp --dport 80 -j DROP"), "{filter:?}");
        assert!(tier(&fw) > tier(&ext) && tier(SERVICES) > tier(&fw));
        // ipvs mode's filter table is this one.
        let ipvs = crate::node::ipvs::tables(&r, &crate::node::ipvs::Config::default());
        assert_eq!(&ipvs.filter[EXTERNAL_SERVICES], filter);
        // Without ranges: no firewall.
        let open = ruleset(&lb.replace("  loadBalancerSourceRanges: [198.51.100.0/24, 192.0.2.0/28]\n", ""));
        let t = render(&open, &Config::default());
        assert!(!t.nat.contains_key(&fw) && t.filter[EXTERNAL_SERVICES].is_empty());
    }

    #[test]
    fn chain_names_are_short_stable_and_distinct() {
        let r = ruleset(WEB);
        let key = &r.services[0].key;
        let svc = svc_chain(key);
        assert!(svc.len() <= 28, "{svc}");
        assert_eq!(svc, svc_chain(&key.clone()));
        let seps: BTreeSet<String> =
            r.services[0].cluster_endpoints.iter().map(|e| sep_chain(key, e)).collect();
        assert_eq!(seps.len(), 3);
        // Pinned: a name change rewrites every chain of a running node on upgrade.
        assert_eq!(svc, "WEIR-SVC-BDJDP7EKZH622ZA3");
    }

    #[test]
    fn uniform_probabilities() {
        let r = ruleset(WEB);
        let t = render(&r, &Config::default());
        let svc = &t.nat[&svc_chain(&r.services[0].key)];
        assert_eq!(svc.len(), 3);
        assert!(svc[0].contains("--probability 0.3333333333"), "{svc:?}");
        assert!(svc[1].contains("--probability 0.5000000000"), "{svc:?}");
        assert!(!svc[2].contains("statistic"), "{svc:?}");
    }

    #[test]
    fn big_syncs_are_split_in_dependency_order() {
        let mut yaml = String::new();
        for i in 0..3 {
            yaml += &format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: web{i}}}\n\
                 spec: {{clusterIP: 10.96.0.{}, ports: [{{port: 80}}]}}\n---\n\
                 apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: web{i}-1, labels: {{kubernetes.io/service-name: web{i}}}}}\n\
                 addressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n\
                 - addresses: [10.244.0.{}]\n- addresses: [10.244.0.{}]\n---\n",
                10 + i,
                10 * i + 1,
                10 * i + 2
            );
        }
        let r = ruleset(&yaml);
        assert_eq!(r.services.len(), 3, "{:?}", r.warnings);
        let t = render(&r, &Config::default());
        let whole = restore_text(None, &t, &Tables::default()).unwrap();
        assert_eq!(restore_batches(None, &t, &Tables::default(), 1000), vec![whole.clone()]);
        let batches = restore_batches(None, &t, &Tables::default(), 4);
        assert!(batches.len() > 3, "{batches:?}");
        // Every chain written once, and after every chain it jumps to.
        let mut written = BTreeSet::new();
        for text in &batches {
            let mut table = "";
            for line in text.lines() {
                if let Some(t) = line.strip_prefix('*') {
                    table = t;
                }
                if let Some(name) = line.strip_prefix(':').and_then(|l| l.split(' ').next()) {
                    assert!(written.insert((table, name)), "{table} {name} written twice");
                }
                if let Some(target) = line.split(" -j ").nth(1).and_then(|t| t.split(' ').next())
                    && target.starts_with("WEIR-")
                {
                    assert!(written.contains(&(table, target)), "{line} before {target} exists");
                }
            }
        }
        let declared = whole.lines().filter(|l| l.starts_with(':')).count();
        assert_eq!(written.len(), declared);
        // Removals: flushed (all) before deleted.
        let batches = restore_batches(
            Some(&t),
            &render(&Ruleset::default(), &Config::default()),
            &Tables::default(),
            4,
        );
        let first_delete = batches.iter().position(|b| b.contains("\n-X ")).unwrap();
        assert!(batches[..first_delete].iter().any(|b| b.contains(":WEIR-SEP-")));
        assert!(batches[first_delete..].iter().all(|b| !b.contains("\n-A ")));
    }

    /// A partial sync (only changed ports rendered) ends where a full render does.
    #[test]
    fn partial_syncs_match_full_renders() {
        // `true ...`: every tool "succeeds" and prints nothing.
        let mut ipt = Iptables::new(Runner::with_prefix(vec!["true".into()]), Config::default());
        let r1 = ruleset(WEB);
        ipt.sync(&r1, false).unwrap();
        let r2 = ruleset(&WEB.replace("- addresses: [10.244.0.3]\n", ""));
        let stats = ipt.sync(&r2, false).unwrap();
        assert_eq!((stats.chains_written, stats.rules_written), (2, 2), "{stats:?}");
        assert_eq!(ipt.applied(), Some(&render(&r2, &Config::default())));
        // No endpoint left: the filter table changes, so everything is rendered.
        let r3 = ruleset(&WEB.replace("- addresses: [10.244.0.", "- addresses: [10.245.0."));
        ipt.sync(&r3, false).unwrap();
        assert_eq!(ipt.applied(), Some(&render(&r3, &Config::default())));
        let r4 = ruleset(WEB.split("---").next().unwrap());
        ipt.sync(&r4, false).unwrap();
        assert_eq!(ipt.applied(), Some(&render(&r4, &Config::default())));
    }

    #[test]
    fn unchanged_writes_nothing_and_one_change_writes_little() {
        let r = ruleset(WEB);
        let t = render(&r, &Config::default());
        assert!(restore_text(Some(&t), &t, &Tables::default()).is_none());
        let r2 = ruleset(&WEB.replace("- addresses: [10.244.0.3]\n", ""));
        let t2 = render(&r2, &Config::default());
        let text = restore_text(Some(&t), &t2, &Tables::default()).unwrap();
        // The service chain is rewritten, the vanished endpoint chain deleted; nothing else.
        assert_eq!(text.lines().filter(|l| l.starts_with(':')).count(), 2, "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("-X")).count(), 1, "{text}");
        assert!(!text.contains("*filter"), "{text}");
    }
}
