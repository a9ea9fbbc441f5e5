//! nftables mode: a [`Ruleset`] rendered into one table `weir` (family `ip`, or `ip6`), applied
//! in transactions over nf_tables netlink ([`super::nftnl`]; `nft -f` with the same text
//! when no socket can be had in the target namespace).
//!
//! - `services` (from the nat prerouting and output hooks) dispatches in O(1) through the
//!   verdict map `service-ips`, keyed by `ip daddr . meta l4proto . th dport`, and node ports
//!   (to a local address) through `service-nodeports`, keyed by `meta l4proto . th dport`.
//! - `service-<hash>-<ns>/<name>/<proto>/<port>` per service port marks for masquerade and
//!   DNATs with `dnat ip addr . port to numgen random mod 1000000 offset K map @endpoints-N`:
//!   the endpoints are *elements* of a shared interval map, `[K, K + 1000000)` split into n
//!   near-equal ranges, one per endpoint (uniform within 1e-6). An endpoint change is a change
//!   of map elements only, which the kernel applies without re-validating the table (adding a
//!   rule with a jump or a NAT statement makes it walk the whole table from its base chains).
//!   `local-...` does the same over this node's endpoints, `external-...` handles external
//!   traffic (masquerade under the `Cluster` policy), and `firewall-...` admits only the
//!   `loadBalancerSourceRanges` of a LoadBalancer IP (others are dropped).
//! - A map `endpoints-N` holds [`SLOTS_PER_MAP`] service ports: the kernel looks sets up by
//!   name in a list, so 10,000 maps (one per port) would make a full sync quadratic, and each
//!   element added walks the rules bound to its map, so one map for all would too.
//! - With ClientIP affinity a port keeps kube-proxy's per-endpoint layout: it picks with
//!   `numgen random mod (n−i)` rules after checks against per-endpoint timeout sets, and
//!   `endpoint-<hash>-<ns>/<name>/<proto>/<port>__<ip>/<port>` records the client and DNATs.
//! - Hairpin traffic (a pod reaching itself through a service) is masqueraded in postrouting
//!   by the set `hairpin` of `endpoint . endpoint` pairs.
//! - `no-endpoint-services` / `no-endpoint-nodeports` (checked from the filter hooks for new
//!   connections) reject traffic of ports without endpoints (drop when only a `Local` policy
//!   leaves none); `masquerading` (postrouting) masquerades marked packets.
//!
//! A sync writes only what changed: changed chains are flushed and refilled, elements are
//! added and deleted, vanished chains and sets are deleted, all in one transaction; only the
//! service ports that changed are rendered. A full sync recreates the table in one transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use super::conntrack;
use super::exec::{self, Runner};
use super::nftnl::{self, CmpOp, Element, ElementData, Expr, Hook, SetSpec, Verdict, reg_at};
use super::plan::{Cidr, Endpoint, IpFamily, Protocol, Ruleset, ServicePort, ServicePortKey, TrafficPolicy};

/// The table's name (in family `ip` or `ip6`).
pub const TABLE: &str = "weir";
/// The packet mark bit that asks for masquerade.
pub const MASQ_MARK: &str = "0x4000";
const MASQ_BIT: u32 = 0x4000;

/// The modulus of endpoint choice: a port's endpoints split `[0, MODULUS)` in ranges.
pub const MODULUS: u32 = 1_000_000;
/// Service ports (endpoint lists) per map `endpoints-N`.
pub const SLOTS_PER_MAP: u32 = 64;

/// Errors of nftables mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tool failed.
    #[error(transparent)]
    Exec(#[from] exec::Error),
    /// The kernel refused a transaction, or the socket failed.
    #[error(transparent)]
    Netlink(#[from] nftnl::Error),
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Options of nftables mode: the same as iptables mode's (the family picks table `ip weir` or
/// `ip6 weir`).
pub use super::iptables::Config;

// === the family ===

/// Family-dependent words of the nft syntax and of its netlink form.
#[derive(Clone, Copy, Debug)]
struct Words {
    family: &'static str,
    ip: &'static str,
    addr_type: &'static str,
    loopback: &'static str,
    nf: nftnl::Family,
    /// Address length, and offsets of the source and destination in the network header.
    addr_len: u32,
    saddr: u32,
    daddr: u32,
    /// nft's type ids.
    addr_type_id: u32,
    /// ICMP port unreachable.
    reject_code: u8,
}

fn words(family: IpFamily) -> Words {
    match family {
        IpFamily::IPv4 => Words {
            family: "ip",
            ip: "ip",
            addr_type: "ipv4_addr",
            loopback: "127.0.0.0/8",
            nf: nftnl::Family::Ip,
            addr_len: 4,
            saddr: 12,
            daddr: 16,
            addr_type_id: 7,
            reject_code: 3,
        },
        IpFamily::IPv6 => Words {
            family: "ip6",
            ip: "ip6",
            addr_type: "ipv6_addr",
            loopback: "::1",
            nf: nftnl::Family::Ip6,
            addr_len: 16,
            saddr: 8,
            daddr: 24,
            addr_type_id: 8,
            reject_code: 4,
        },
    }
}

// nft's type ids (`inet_proto`, `inet_service`, `integer`, verdict) and concatenation.
const TYPE_INTEGER: u32 = 4;
const TYPE_INET_PROTO: u32 = 12;
const TYPE_INET_SERVICE: u32 = 13;
const TYPE_VERDICT: u32 = 0xffff_ff00;

fn concat_type(types: &[u32]) -> u32 {
    types.iter().fold(0, |acc, t| (acc << 6) | t)
}

// The userdata nft 1.0 writes for weir's sets, so that `nft list` prints their types.
const UDATA_CONCAT_MAP: &[u8] =
    b"\x00\x04\x00\x00\x00\x00\x01\x04\x00\x00\x00\x00\x03\x08\x00\x04\x0d\x00\x00\x00\x01\x00\x06\x04\x00\x00\x00\x00";
const UDATA_HAIRPIN: &[u8] = b"\x00\x04\x00\x00\x00\x00\x03\x08\x00\x04\x0d\x00\x00\x00\x01\x00";
const UDATA_AFFINITY: &[u8] = b"\x00\x04\x02\x00\x00\x00";

/// `typeof numgen random mod 1 : ip daddr . tcp dport` (`ip6 daddr`, `udp`, `sctp`), as nft 1.0
/// writes it.
fn udata_endpoints(w: Words, proto: Protocol) -> Vec<u8> {
    let hex = match w.nf {
        nftnl::Family::Ip => UDATA_ENDPOINTS_IP,
        nftnl::Family::Ip6 => UDATA_ENDPOINTS_IP6,
    };
    let proto_id = match proto {
        Protocol::Tcp => "08",
        Protocol::Udp => "06",
        Protocol::Sctp => "0a",
    };
    let hex = hex.replace("010c000408000000010402", &format!("010c0004{proto_id}000000010402"));
    (0..hex.len() / 2)
        .filter_map(|i| hex.get(2 * i..2 * i + 2))
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect()
}

const UDATA_ENDPOINTS_IP: &str = "000401000000010400000000031a00041700000001120004010000000104010000000204000000000434\
    00040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c000408000000010402000000060400000000";
const UDATA_ENDPOINTS_IP6: &str = "000401000000010400000000031a00041700000001120004010000000104010000000204000000000434\
    00040d000000012c0014000407000000010c00040d0000000104090000000114000407000000010c000408000000010402000000060400000000";

fn endpoints_spec(w: Words, proto: Protocol) -> SetSpec {
    SetSpec {
        flags: 0x4 | 0x8,
        key: (TYPE_INTEGER, 4),
        data: Some((concat_type(&[w.addr_type_id, TYPE_INET_SERVICE]), w.addr_len + 4)),
        timeout_ms: None,
        udata: udata_endpoints(w, proto),
    }
}

fn vmap_spec(w: Words, with_ip: bool) -> SetSpec {
    let (key, len) = if with_ip {
        (concat_type(&[w.addr_type_id, TYPE_INET_PROTO, TYPE_INET_SERVICE]), w.addr_len + 8)
    } else {
        (concat_type(&[TYPE_INET_PROTO, TYPE_INET_SERVICE]), 8)
    };
    SetSpec {
        flags: 0x8,
        key: (key, len),
        data: Some((TYPE_VERDICT, 0)),
        timeout_ms: None,
        udata: UDATA_CONCAT_MAP.into(),
    }
}

fn hairpin_spec(w: Words) -> SetSpec {
    SetSpec {
        flags: 0,
        key: (concat_type(&[w.addr_type_id, w.addr_type_id]), 2 * w.addr_len),
        data: None,
        timeout_ms: None,
        udata: UDATA_HAIRPIN.into(),
    }
}

fn affinity_spec(w: Words, timeout: u32) -> SetSpec {
    SetSpec {
        flags: 0x10 | 0x20,
        key: (w.addr_type_id, w.addr_len),
        data: None,
        timeout_ms: Some(u64::from(timeout) * 1000),
        udata: UDATA_AFFINITY.into(),
    }
}

// === rules ===

/// One rule: its nft text (with its comment) and the expressions `nft` makes of it.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The nft text.
    pub text: String,
    exprs: Vec<Expr>,
    comment: Option<String>,
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Rule {}

/// Builds a rule match by match, text and expressions together.
struct R {
    w: Words,
    text: Vec<String>,
    exprs: Vec<Expr>,
}

fn rule(w: Words) -> R {
    R { w, text: Vec::new(), exprs: Vec::new() }
}

fn addr_cmp_bytes(ip: &IpAddr) -> Vec<u8> {
    nftnl::addr_bytes(ip)
}

impl R {
    fn t(mut self, text: impl Into<String>) -> Self {
        self.text.push(text.into());
        self
    }

    fn e(mut self, exprs: impl IntoIterator<Item = Expr>) -> Self {
        self.exprs.extend(exprs);
        self
    }

    fn payload(&self, base: u32, offset: u32, len: u32) -> Expr {
        Expr::Payload { base, offset, len, dreg: nftnl::REG_1 }
    }

    /// `ip daddr IP`.
    fn daddr(self, ip: &IpAddr) -> Self {
        let (w, data) = (self.w, addr_cmp_bytes(ip));
        let load = self.payload(1, w.daddr, w.addr_len);
        self.t(format!("{} daddr {ip}", w.ip)).e([load, Expr::Cmp { sreg: 1, op: CmpOp::Eq, data }])
    }

    /// `ip saddr [!=] CIDR`, loading as nft does: the prefix's bytes, or all with a mask.
    fn saddr_in(self, cidr: &Cidr, op: CmpOp) -> Self {
        let w = self.w;
        let prefix = u32::from(cidr.prefix);
        let mut addr = addr_cmp_bytes(&cidr.addr);
        let full = w.addr_len * 8;
        let mut exprs = Vec::new();
        if prefix % 8 == 0 && prefix > 0 {
            let len = prefix / 8;
            addr.truncate(len as usize);
            exprs.push(self.payload(1, w.saddr, len));
        } else {
            let mask: Vec<u8> = (0..w.addr_len)
                .map(|i| {
                    let bits = prefix.saturating_sub(i * 8).min(8);
                    if bits == 0 { 0 } else { 0xffu8 << (8 - bits) }
                })
                .collect();
            for (a, m) in addr.iter_mut().zip(&mask) {
                *a &= m;
            }
            exprs.push(self.payload(1, w.saddr, w.addr_len));
            if prefix < full {
                exprs.push(Expr::Bitwise { reg: 1, mask, xor: vec![0; w.addr_len as usize] });
            }
        }
        exprs.push(Expr::Cmp { sreg: 1, op, data: addr });
        let bang = if op == CmpOp::Neq { "!= " } else { "" };
        self.t(format!("{} saddr {bang}{cidr}", w.ip)).e(exprs)
    }

    /// `meta l4proto PROTO`.
    fn l4proto(self, proto: Protocol) -> Self {
        let text = format!("meta l4proto {}", proto.as_str());
        self.t(text).e(l4proto_exprs(proto))
    }

    /// `PROTO dport PORT` (nft adds the `meta l4proto` dependency).
    fn dport(self, proto: Protocol, port: u16) -> Self {
        let load = self.payload(2, 2, 2);
        let mut exprs = l4proto_exprs(proto);
        exprs.extend([load, Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: port.to_be_bytes().to_vec() }]);
        self.t(format!("{} dport {port}", proto.as_str())).e(exprs)
    }

    /// `fib saddr|daddr type local`.
    fn fib_local(self, which: &str) -> Self {
        let flags = if which == "saddr" { 1 } else { 2 };
        self.t(format!("fib {which} type local")).e([
            Expr::FibType { flags, dreg: 1 },
            Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: 2u32.to_ne_bytes().to_vec() },
        ])
    }

    fn verdict(self, v: Verdict) -> Rule {
        let text = v.text();
        self.t(text).e([Expr::Verdict(v)]).done()
    }

    fn done(self) -> Rule {
        Rule { text: self.text.join(" "), exprs: self.exprs, comment: None }
    }

    fn commented(self, v: Verdict, comment: &str) -> Rule {
        let mut r = self.verdict(v);
        r.text = format!(r#"{} comment "{comment}""#, r.text);
        r.comment = Some(comment.into());
        r
    }
}

fn l4proto_exprs(proto: Protocol) -> Vec<Expr> {
    let number = match proto {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    };
    vec![Expr::Meta { key: 16, dreg: 1 }, Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: vec![number] }]
}

fn jump(chain: &str) -> Verdict {
    Verdict::Jump(chain.into())
}

fn goto(chain: &str) -> Verdict {
    Verdict::Goto(chain.into())
}

/// The fixed rules of the skeleton, by chain.
fn skeleton_rules(w: Words) -> Vec<(&'static str, Rule)> {
    let ip = w.ip;
    let mark = |mask: u32, xor: u32| {
        [
            Expr::Meta { key: 3, dreg: 1 },
            Expr::Bitwise { reg: 1, mask: mask.to_ne_bytes().to_vec(), xor: xor.to_ne_bytes().to_vec() },
        ]
    };
    let ct = |key: u32, bit: u32| {
        [
            Expr::Ct { key, dreg: 1 },
            Expr::Bitwise { reg: 1, mask: bit.to_ne_bytes().to_vec(), xor: vec![0; 4] },
            Expr::Cmp { sreg: 1, op: CmpOp::Neq, data: vec![0; 4] },
        ]
    };
    let payload = |offset: u32, len: u32, dreg: u32| Expr::Payload { base: 1, offset, len, dreg };
    let service_key = |r: R| {
        let w = r.w;
        r.e([
            payload(w.daddr, w.addr_len, nftnl::REG_1),
            Expr::Meta { key: 16, dreg: reg_at(w.addr_len as usize / 4) },
            Expr::Payload { base: 2, offset: 2, len: 2, dreg: reg_at(w.addr_len as usize / 4 + 1) },
        ])
    };
    let port_key = |r: R| {
        r.e([
            Expr::Meta { key: 16, dreg: nftnl::REG_1 },
            Expr::Payload { base: 2, offset: 2, len: 2, dreg: reg_at(1) },
        ])
    };
    let not_loopback = |r: R| {
        let w = r.w;
        let (len, data) = match w.nf {
            nftnl::Family::Ip => (1, vec![127]),
            nftnl::Family::Ip6 => (16, addr_cmp_bytes(&IpAddr::V6(std::net::Ipv6Addr::LOCALHOST))),
        };
        r.t(format!("{ip} daddr != {}", w.loopback))
            .e([payload(w.daddr, len, 1), Expr::Cmp { sreg: 1, op: CmpOp::Neq, data }])
    };
    let vmap = |set: &str| Expr::Lookup { set: set.into(), sreg: 1, dreg: Some(nftnl::REG_VERDICT) };
    let hairpin = rule(w)
        .t(format!("ct status dnat {ip} saddr . {ip} daddr @{HAIRPIN} masquerade fully-random"))
        .e(ct(2, 0x20))
        .e([
            payload(w.saddr, w.addr_len, nftnl::REG_1),
            payload(w.daddr, w.addr_len, reg_at(w.addr_len as usize / 4)),
            Expr::Lookup { set: HAIRPIN.into(), sreg: 1, dreg: None },
            Expr::MasqFullyRandom,
        ])
        .done();
    vec![
        ("nat-prerouting", rule(w).verdict(jump("services"))),
        ("nat-output", rule(w).verdict(jump("services"))),
        ("nat-postrouting", hairpin),
        ("nat-postrouting", rule(w).verdict(jump("masquerading"))),
        ("filter-input", rule(w).t("ct state new").e(ct(0, 8)).verdict(jump("endpoints-check"))),
        ("filter-input", rule(w).t("ct state new").e(ct(0, 8)).verdict(jump("nodeports-check"))),
        ("filter-forward", rule(w).t("ct state new").e(ct(0, 8)).verdict(jump("endpoints-check"))),
        ("filter-output", rule(w).t("ct state new").e(ct(0, 8)).verdict(jump("endpoints-check"))),
        (
            "masquerading",
            rule(w)
                .t(format!("meta mark & {MASQ_MARK} == 0"))
                .e(mark(MASQ_BIT, 0))
                .e([Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: vec![0; 4] }])
                .verdict(Verdict::Return),
        ),
        (
            "masquerading",
            rule(w)
                .t(format!("meta mark set meta mark ^ {MASQ_MARK}"))
                .e(mark(u32::MAX, MASQ_BIT))
                .e([Expr::MetaSet { key: 3, sreg: 1 }])
                .done(),
        ),
        ("masquerading", rule(w).t("masquerade fully-random").e([Expr::MasqFullyRandom]).done()),
        (
            "mark-for-masquerade",
            rule(w)
                .t(format!("meta mark set meta mark | {MASQ_MARK}"))
                .e(mark(!MASQ_BIT, MASQ_BIT))
                .e([Expr::MetaSet { key: 3, sreg: 1 }])
                .done(),
        ),
        ("reject-chain", rule(w).t("reject").e([Expr::Reject { code: w.reject_code }]).done()),
        (
            "services",
            service_key(rule(w))
                .t(format!("{ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"))
                .e([vmap(SERVICE_IPS)])
                .done(),
        ),
        (
            "services",
            port_key(not_loopback(rule(w).fib_local("daddr")))
                .t(format!("meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"))
                .e([vmap(SERVICE_NODEPORTS)])
                .done(),
        ),
        (
            "endpoints-check",
            service_key(rule(w))
                .t(format!("{ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"))
                .e([vmap(NO_ENDPOINT_SERVICES)])
                .done(),
        ),
        (
            "nodeports-check",
            port_key(not_loopback(rule(w).fib_local("daddr")))
                .t(format!("meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"))
                .e([vmap(NO_ENDPOINT_NODEPORTS)])
                .done(),
        ),
    ]
}

const BASE_CHAINS: [(&str, &str, u32, i32); 6] = [
    ("nat-prerouting", "nat", 0, -100),
    ("nat-output", "nat", 3, -100),
    ("nat-postrouting", "nat", 4, 100),
    ("filter-input", "filter", 1, -10),
    ("filter-forward", "filter", 2, -10),
    ("filter-output", "filter", 3, -10),
];

const HOOK_NAMES: [&str; 5] = ["prerouting", "input", "forward", "output", "postrouting"];

const FIXED_CHAINS: [&str; 6] =
    ["services", "masquerading", "mark-for-masquerade", "reject-chain", "endpoints-check", "nodeports-check"];

/// The service-port maps, by name.
const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
const HAIRPIN: &str = "hairpin";

// === state ===

/// A key of the service-port verdict maps: `ip . proto . port`, or `proto . port` (node ports).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MapKey {
    /// The virtual IP (none for node ports).
    pub ip: Option<IpAddr>,
    /// The protocol.
    pub proto: Protocol,
    /// The port.
    pub port: u16,
}

impl MapKey {
    fn text(&self) -> String {
        match self.ip {
            Some(ip) => format!("{ip} . {} . {}", self.proto.as_str(), self.port),
            None => format!("{} . {}", self.proto.as_str(), self.port),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = self.ip.map(|ip| nftnl::addr_bytes(&ip)).unwrap_or_default();
        let proto = match self.proto {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        };
        v.extend_from_slice(&[proto, 0, 0, 0]);
        v.extend_from_slice(&self.port.to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v
    }
}

/// A slot in the endpoint maps of a protocol (nft checks a map's `typeof` protocol against
/// the rule's): map `endpoints-<proto>-{id / SLOTS_PER_MAP}`, numbers from
/// `(id % SLOTS_PER_MAP) * MODULUS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot {
    /// The protocol of its map.
    pub proto: Protocol,
    /// Its number among the protocol's slots.
    pub id: u32,
}

fn endpoint_map(proto: Protocol, n: u32) -> String {
    format!("endpoints-{}-{n}", proto.as_str())
}

impl Slot {
    /// The map holding the slot.
    pub fn map(self) -> String {
        endpoint_map(self.proto, self.id / SLOTS_PER_MAP)
    }

    /// The first number of the slot.
    pub fn offset(self) -> u32 {
        (self.id % SLOTS_PER_MAP) * MODULUS
    }
}

/// Which endpoint list of a service port a slot holds.
type Owner = (ServicePortKey, TrafficPolicy);

/// Slot assignment, kept across partial syncs so that a port's rule never changes.
#[derive(Clone, Debug, Default)]
pub struct Slots {
    by_owner: BTreeMap<Owner, Slot>,
    free: BTreeSet<Slot>,
    next: BTreeMap<Protocol, u32>,
}

impl Slots {
    fn get(&mut self, owner: &Owner) -> Slot {
        if let Some(slot) = self.by_owner.get(owner) {
            return *slot;
        }
        let proto = owner.0.protocol;
        let free = self.free.iter().find(|s| s.proto == proto).copied();
        let slot = match free {
            Some(slot) => {
                self.free.remove(&slot);
                slot
            }
            None => {
                let next = self.next.entry(proto).or_default();
                *next += 1;
                Slot { proto, id: *next - 1 }
            }
        };
        self.by_owner.insert(owner.clone(), slot);
        slot
    }

    fn release(&mut self, slots: &BTreeSet<Slot>) {
        self.by_owner.retain(|_, s| !slots.contains(s));
        self.free.extend(slots);
    }

    /// Endpoint maps in use, per protocol (`endpoints-<proto>-0 ..`).
    pub fn maps(&self) -> BTreeMap<Protocol, u32> {
        self.next.iter().map(|(p, n)| (*p, n.div_ceil(SLOTS_PER_MAP))).collect()
    }
}

/// One endpoint's numbers in its slot: `[lo, hi]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range {
    /// First number.
    pub lo: u32,
    /// Last number.
    pub hi: u32,
    /// The endpoint's address and port.
    pub ip: IpAddr,
    /// Its port.
    pub port: u16,
}

/// The rendered content of weir's table, apart from the fixed skeleton.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Per-service chains: name → rules.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Verdict maps: map name → key → (comment, verdict).
    pub maps: BTreeMap<&'static str, BTreeMap<MapKey, (String, Verdict)>>,
    /// Affinity sets: name → timeout in seconds.
    pub sets: BTreeMap<String, u32>,
    /// Endpoint addresses, for the hairpin set (`ip . ip` elements): a pod reaching itself
    /// through a service is masqueraded, or its reply would skip the un-DNAT.
    pub hairpin: BTreeSet<IpAddr>,
    /// Endpoint ranges by slot.
    pub endpoints: BTreeMap<Slot, BTreeSet<Range>>,
    /// Endpoint maps in the table, per protocol.
    pub endpoint_maps: BTreeMap<Protocol, u32>,
}

impl State {
    /// Rules plus map elements: a measure of the table's size.
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum::<usize>()
            + self.maps.values().map(BTreeMap::len).sum::<usize>()
            + self.endpoints.values().map(BTreeSet::len).sum::<usize>()
    }
}

// === names ===

fn port_path(key: &ServicePortKey) -> String {
    format!("{}/{}/{}/{}", key.service.namespace, key.service.name, key.protocol.as_str(), key.port_name)
}

fn hash8(identity: &str) -> String {
    let mut h = super::iptables::hash_name(identity);
    h.truncate(8);
    h
}

/// The chain picking among a service port's cluster endpoints.
pub fn service_chain(key: &ServicePortKey) -> String {
    let path = port_path(key);
    format!("service-{}-{path}", hash8(&key.to_string()))
}

/// The chain picking among a service port's local endpoints.
pub fn local_chain(key: &ServicePortKey) -> String {
    format!("local-{}-{}", hash8(&key.to_string()), port_path(key))
}

/// The chain of a service port's external traffic.
pub fn external_chain(key: &ServicePortKey) -> String {
    format!("external-{}-{}", hash8(&key.to_string()), port_path(key))
}

/// The chain admitting a service port's `loadBalancerSourceRanges` to its LoadBalancer IPs.
pub fn firewall_chain(key: &ServicePortKey) -> String {
    format!("firewall-{}-{}", hash8(&key.to_string()), port_path(key))
}

fn ep_path(ep: &Endpoint) -> String {
    format!("{}/{}", ep.ip, ep.port)
}

/// The chain of one endpoint of a service port (ClientIP affinity only).
pub fn endpoint_chain(key: &ServicePortKey, ep: &Endpoint) -> String {
    format!("endpoint-{}-{}__{}", hash8(&format!("{key}>{}", ep_path(ep))), port_path(key), ep_path(ep))
}

/// The affinity set of one endpoint (the timeout is part of its identity: a set's timeout
/// cannot change in place).
pub fn affinity_set(key: &ServicePortKey, ep: &Endpoint, timeout: u32) -> String {
    format!(
        "affinity-{}-{}__{}",
        hash8(&format!("{key}>{}>{timeout}", ep_path(ep))),
        port_path(key),
        ep_path(ep)
    )
}

// === rendering ===

/// Renders the entries of `config`'s family into a fresh table (slots assigned in order).
pub fn render(ruleset: &Ruleset, config: &Config) -> State {
    render_with(ruleset, config, &mut Slots::default())
}

fn render_with(ruleset: &Ruleset, config: &Config, slots: &mut Slots) -> State {
    let family = config.family.unwrap_or(IpFamily::IPv4);
    let w = words(family);
    let mut st = State::default();
    for map in [SERVICE_IPS, SERVICE_NODEPORTS, NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS] {
        st.maps.insert(map, BTreeMap::new());
    }
    for sp in ruleset.services.iter().filter(|sp| sp.key.family == family) {
        render_port(sp, config, w, &mut st, slots);
    }
    st.endpoint_maps = slots.maps();
    st
}

fn insert(st: &mut State, map: &'static str, key: MapKey, comment: String, verdict: Verdict) {
    st.maps.entry(map).or_default().insert(key, (comment, verdict));
}

/// `n` near-equal ranges of `[offset, offset + MODULUS)`.
fn ranges(offset: u32, endpoints: &[Endpoint]) -> BTreeSet<Range> {
    let n = endpoints.len() as u64;
    let bound = |i: u64| offset + u32::try_from(u64::from(MODULUS) * i / n).unwrap_or(MODULUS);
    (0..n)
        .zip(endpoints)
        .map(|(i, ep)| Range { lo: bound(i), hi: bound(i + 1) - 1, ip: ep.ip, port: ep.port })
        .collect()
}

fn render_port(sp: &ServicePort, config: &Config, w: Words, st: &mut State, slots: &mut Slots) {
    let key = &sp.key;
    let name = match key.port_name.as_str() {
        "" => key.service.to_string(),
        port => format!("{}:{port}", key.service),
    };
    let proto = key.protocol;
    let svc = service_chain(key);
    let local = local_chain(key);
    let ext = external_chain(key);
    let chain_of = |policy: TrafficPolicy| match policy {
        TrafficPolicy::Cluster => svc.clone(),
        TrafficPolicy::Local => local.clone(),
    };
    let internal_chain = chain_of(sp.internal_policy);
    let has_internal = !sp.internal_endpoints().is_empty();
    let has_external = !sp.external_endpoints().is_empty();
    // No endpoint anywhere: reject. Endpoints on other nodes only (a `Local` policy): drop.
    let no_endpoint_verdict = if sp.no_endpoints { goto("reject-chain") } else { Verdict::Drop };

    for ip in &sp.cluster_ips {
        let k = MapKey { ip: Some(*ip), proto, port: sp.port };
        let comment = format!("{name} cluster IP");
        if has_internal {
            insert(st, SERVICE_IPS, k, comment, goto(&internal_chain));
        } else {
            insert(st, NO_ENDPOINT_SERVICES, k, comment, no_endpoint_verdict.clone());
        }
    }
    for (ip, what) in sp
        .external_ips
        .iter()
        .map(|ip| (ip, "external IP"))
        .chain(sp.load_balancer_ips.iter().map(|ip| (ip, "loadbalancer IP")))
    {
        let k = MapKey { ip: Some(*ip), proto, port: sp.port };
        let comment = format!("{name} {what}");
        if has_external && sp.source_ranges.is_some() && what == "loadbalancer IP" {
            insert(st, SERVICE_IPS, k, comment, goto(&firewall_chain(key)));
        } else if has_external {
            insert(st, SERVICE_IPS, k, comment, goto(&ext));
        } else {
            insert(st, NO_ENDPOINT_SERVICES, k, comment, no_endpoint_verdict.clone());
        }
    }
    if let Some(np) = sp.node_port {
        let k = MapKey { ip: None, proto, port: np };
        if has_external {
            insert(st, SERVICE_NODEPORTS, k, name.clone(), goto(&ext));
        } else {
            insert(st, NO_ENDPOINT_NODEPORTS, k, name.clone(), no_endpoint_verdict.clone());
        }
    }

    // Admitted sources go on to the external chain; the others are dropped.
    if let Some(ranges) =
        sp.source_ranges.as_ref().filter(|_| has_external && !sp.load_balancer_ips.is_empty())
    {
        let mut rules: Vec<Rule> = ranges
            .iter()
            .map(|cidr| rule(w).saddr_in(cidr, CmpOp::Eq).commented(goto(&ext), "loadBalancerSourceRanges"))
            .collect();
        rules.push(rule(w).verdict(Verdict::Drop));
        st.chains.insert(firewall_chain(key), rules);
    }
    if sp.is_external() && has_external {
        let mut rules = Vec::new();
        match sp.external_policy {
            TrafficPolicy::Cluster => {
                rules.push(rule(w).verdict(jump("mark-for-masquerade")));
                rules.push(rule(w).verdict(goto(&svc)));
            }
            TrafficPolicy::Local => {
                if !sp.cluster_endpoints.is_empty() {
                    if let Some(cidr) = config.cluster_cidr.as_ref().filter(|c| c.family() == key.family) {
                        rules.push(rule(w).saddr_in(cidr, CmpOp::Eq).commented(goto(&svc), "pod traffic"));
                    }
                    rules.push(rule(w).fib_local("saddr").verdict(jump("mark-for-masquerade")));
                    rules.push(rule(w).fib_local("saddr").commented(goto(&svc), "local traffic"));
                }
                rules.push(rule(w).verdict(goto(&local)));
            }
        }
        st.chains.insert(ext, rules);
    }

    let masq_rules = |chain: &str| -> Vec<Rule> {
        if chain != internal_chain || !has_internal {
            return Vec::new();
        }
        sp.cluster_ips
            .iter()
            .filter_map(|ip| {
                let m = || rule(w).daddr(ip).dport(proto, sp.port);
                if config.masquerade_all {
                    Some(m().verdict(jump("mark-for-masquerade")))
                } else {
                    config
                        .cluster_cidr
                        .as_ref()
                        .filter(|c| c.family() == IpFamily::of(ip))
                        .map(|cidr| m().saddr_in(cidr, CmpOp::Neq).verdict(jump("mark-for-masquerade")))
                }
            })
            .collect()
    };
    for (chain, endpoints, policy) in [
        (&svc, &sp.cluster_endpoints, TrafficPolicy::Cluster),
        (&local, &sp.local_endpoints, TrafficPolicy::Local),
    ] {
        if endpoints.is_empty() {
            continue;
        }
        let mut rules = masq_rules(chain);
        match sp.affinity {
            None => {
                let slot = slots.get(&(key.clone(), policy));
                rules.push(dnat_map(w, proto, slot));
                st.endpoints.insert(slot, ranges(slot.offset(), endpoints));
            }
            Some(affinity) => {
                for ep in endpoints {
                    let set = affinity_set(key, ep, affinity.timeout_seconds);
                    rules.push(saddr_lookup(w, &set).verdict(goto(&endpoint_chain(key, ep))));
                }
                // Endpoint i is taken with probability 1/(n−i) if none before it was: uniform.
                let n = endpoints.len();
                for (i, ep) in endpoints.iter().enumerate() {
                    let target = goto(&endpoint_chain(key, ep));
                    if i + 1 < n {
                        let modulus = u32::try_from(n - i).unwrap_or(u32::MAX);
                        let pick = rule(w).t(format!("numgen random mod {modulus} 0")).e([
                            Expr::Numgen { dreg: 1, modulus, offset: 0 },
                            Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: vec![0; 4] },
                        ]);
                        rules.push(pick.verdict(target));
                    } else {
                        rules.push(rule(w).verdict(target));
                    }
                }
            }
        }
        st.chains.insert(chain.clone(), rules);
    }
    for ep in sp.all_endpoints() {
        st.hairpin.insert(ep.ip);
        if let Some(affinity) = sp.affinity {
            let set = affinity_set(key, ep, affinity.timeout_seconds);
            st.sets.insert(set.clone(), affinity.timeout_seconds);
            let update = rule(w)
                .t(format!("update @{set} {{ {} saddr }}", w.ip))
                .e([
                    Expr::Payload { base: 1, offset: w.saddr, len: w.addr_len, dreg: 1 },
                    Expr::DynsetUpdate { set: set.clone(), sreg: 1 },
                ])
                .done();
            st.chains.insert(endpoint_chain(key, ep), vec![update, dnat_to(w, proto, ep)]);
        }
    }
}

fn saddr_lookup(w: Words, set: &str) -> R {
    rule(w).t(format!("{} saddr @{set}", w.ip)).e([
        Expr::Payload { base: 1, offset: w.saddr, len: w.addr_len, dreg: 1 },
        Expr::Lookup { set: set.into(), sreg: 1, dreg: None },
    ])
}

/// `meta l4proto P dnat ip addr . port to numgen random mod M offset K map @endpoints-N`.
fn dnat_map(w: Words, proto: Protocol, slot: Slot) -> Rule {
    let (map, offset) = (slot.map(), slot.offset());
    rule(w)
        .l4proto(proto)
        .t(format!("dnat {} addr . port to numgen random mod {MODULUS} offset {offset} map @{map}", w.ip))
        .e([
            Expr::Numgen { dreg: 1, modulus: MODULUS, offset },
            Expr::Hton32 { reg: 1 },
            Expr::Lookup { set: map, sreg: 1, dreg: Some(1) },
            Expr::Dnat { family: w.nf, addr: 1, proto: reg_at(w.addr_len as usize / 4), flags: None },
        ])
        .done()
}

/// `meta l4proto P dnat to IP:PORT`.
fn dnat_to(w: Words, proto: Protocol, ep: &Endpoint) -> Rule {
    let to = match ep.ip {
        IpAddr::V4(ip) => format!("{ip}:{}", ep.port),
        IpAddr::V6(ip) => format!("[{ip}]:{}", ep.port),
    };
    rule(w)
        .l4proto(proto)
        .t(format!("dnat to {to}"))
        .e([
            Expr::Immediate { dreg: 1, data: nftnl::addr_bytes(&ep.ip) },
            Expr::Immediate { dreg: 2, data: ep.port.to_be_bytes().to_vec() },
            Expr::Dnat { family: w.nf, addr: 1, proto: 2, flags: Some(2) },
        ])
        .done()
}

// === transactions ===

/// An element of one of weir's sets.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Elem {
    Map(MapKey, String, Verdict),
    Pair(IpAddr),
    Range(Range),
}

impl Elem {
    fn text(&self, with_data: bool) -> String {
        match (self, with_data) {
            (Elem::Map(k, c, v), true) => format!(r#"{} comment "{c}" : {}"#, k.text(), v.text()),
            (Elem::Map(k, ..), false) => k.text(),
            (Elem::Pair(ip), _) => format!("{ip} . {ip}"),
            (Elem::Range(r), true) => format!("{}-{} : {} . {}", r.lo, r.hi, r.ip, r.port),
            (Elem::Range(r), false) => format!("{}-{}", r.lo, r.hi),
        }
    }

    fn netlink(&self) -> Vec<Element> {
        match self {
            Elem::Map(k, c, v) => vec![Element {
                key: k.bytes(),
                data: Some(ElementData::Verdict(v.clone())),
                interval_end: false,
                comment: Some(c.clone()),
            }],
            Elem::Pair(ip) => {
                let mut key = nftnl::addr_bytes(ip);
                key.extend(nftnl::addr_bytes(ip));
                vec![Element { key, data: None, interval_end: false, comment: None }]
            }
            Elem::Range(r) => {
                let mut data = nftnl::addr_bytes(&r.ip);
                data.extend_from_slice(&r.port.to_be_bytes());
                data.extend_from_slice(&[0, 0]);
                vec![
                    Element {
                        key: r.lo.to_be_bytes().to_vec(),
                        data: Some(ElementData::Value(data)),
                        interval_end: false,
                        comment: None,
                    },
                    Element {
                        key: (r.hi + 1).to_be_bytes().to_vec(),
                        data: None,
                        interval_end: true,
                        comment: None,
                    },
                ]
            }
        }
    }
}

/// One step of a transaction.
#[derive(Clone, Debug)]
enum Op {
    /// Deletes the table if it exists and creates it empty.
    RecreateTable,
    AddChain(String, Option<Hook>),
    FlushChain(String),
    DeleteChain(String),
    AddRule(String, Rule),
    AddSet(String, SetSpec, String),
    DeleteSet(String),
    AddElements(String, Vec<Elem>),
    DeleteElements(String, Vec<Elem>),
}

/// A transaction: its steps, rendered as `nft -f` text or sent over netlink.
#[derive(Clone, Debug)]
pub struct Transaction {
    family: IpFamily,
    ops: Vec<Op>,
}

/// Elements per `add element` command of the text form.
const ELEMENTS_PER_COMMAND: usize = 1000;

impl Transaction {
    fn new(family: IpFamily) -> Self {
        Transaction { family, ops: Vec::new() }
    }

    /// Whether it does nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Steps (commands of the text form, counting each group of elements once).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    fn push(&mut self, op: Op) {
        match op {
            Op::AddElements(_, ref e) | Op::DeleteElements(_, ref e) if e.is_empty() => {}
            op => self.ops.push(op),
        }
    }

    fn append(&mut self, other: Transaction) {
        self.ops.extend(other.ops);
    }

    /// The `nft -f` text.
    pub fn text(&self) -> String {
        let w = words(self.family);
        let (f, t) = (w.family, TABLE);
        let mut s = String::new();
        for op in &self.ops {
            match op {
                Op::RecreateTable => {
                    let _ = writeln!(s, "add table {f} {t}\ndelete table {f} {t}");
                    let _ = writeln!(s, r#"add table {f} {t} {{ comment "{TABLE_COMMENT}"; }}"#);
                }
                Op::AddChain(c, None) => {
                    let _ = writeln!(s, "add chain {f} {t} {c}");
                }
                Op::AddChain(c, Some(h)) => {
                    let hook = HOOK_NAMES.get(h.hooknum as usize).copied().unwrap_or("?");
                    let _ = writeln!(
                        s,
                        "add chain {f} {t} {c} {{ type {} hook {hook} priority {}; policy accept; }}",
                        h.kind, h.priority
                    );
                }
                Op::FlushChain(c) => {
                    let _ = writeln!(s, "flush chain {f} {t} {c}");
                }
                Op::DeleteChain(c) => {
                    let _ = writeln!(s, "delete chain {f} {t} {c}");
                }
                Op::AddRule(c, r) => {
                    let _ = writeln!(s, "add rule {f} {t} {c} {}", r.text);
                }
                Op::AddSet(name, _, decl) => {
                    let _ =
                        writeln!(s, "add {decl}", decl = decl.replace("{NAME}", &format!("{f} {t} {name}")));
                }
                Op::DeleteSet(name) => {
                    let _ = writeln!(s, "delete set {f} {t} {name}");
                }
                Op::AddElements(set, elems) => {
                    for chunk in elems.chunks(ELEMENTS_PER_COMMAND) {
                        let list: Vec<String> = chunk.iter().map(|e| e.text(true)).collect();
                        let _ = writeln!(s, "add element {f} {t} {set} {{ {} }}", list.join(", "));
                    }
                }
                Op::DeleteElements(set, elems) => {
                    for e in elems {
                        let _ = writeln!(s, "delete element {f} {t} {set} {{ {} }}", e.text(false));
                    }
                }
            }
        }
        s
    }

    /// The netlink batch.
    pub fn batch(&self) -> nftnl::Batch {
        let w = words(self.family);
        let mut b = nftnl::Batch::new(w.nf, TABLE);
        for op in &self.ops {
            match op {
                Op::RecreateTable => {
                    b.add_table(None);
                    b.delete_table();
                    b.add_table(Some(TABLE_COMMENT));
                }
                Op::AddChain(c, hook) => b.add_chain(c, *hook),
                Op::FlushChain(c) => b.flush_chain(c),
                Op::DeleteChain(c) => b.delete_chain(c),
                Op::AddRule(c, r) => b.add_rule(c, &r.exprs, r.comment.as_deref(), &r.text),
                Op::AddSet(name, spec, _) => b.add_set(name, spec),
                Op::DeleteSet(name) => b.delete_set(name),
                Op::AddElements(set, elems) => {
                    let list: Vec<Element> = elems.iter().flat_map(Elem::netlink).collect();
                    b.add_elements(set, &list);
                }
                Op::DeleteElements(set, elems) => {
                    let list: Vec<Element> = elems.iter().flat_map(Elem::netlink).collect();
                    b.delete_elements(set, &list);
                }
            }
        }
        b
    }
}

const TABLE_COMMENT: &str = "rules for weir node";

fn add_set(tx: &mut Transaction, name: &str, spec: SetSpec, decl: String) {
    tx.push(Op::AddSet(name.into(), spec, decl));
}

/// Creates the endpoint maps `after` has and `before` has not.
fn add_endpoint_maps(
    tx: &mut Transaction,
    w: Words,
    before: &BTreeMap<Protocol, u32>,
    after: &BTreeMap<Protocol, u32>,
) {
    for (proto, n) in after {
        for i in before.get(proto).copied().unwrap_or(0)..*n {
            let p = proto.as_str();
            let decl = format!(
                "map {{NAME}} {{ typeof numgen random mod 1 : {} daddr . {p} dport; flags interval; }}",
                w.ip
            );
            add_set(tx, &endpoint_map(*proto, i), endpoints_spec(w, *proto), decl);
        }
    }
}

/// The fixed part of the table: hooks, maps, masquerading.
fn skeleton(tx: &mut Transaction, w: Words) {
    tx.push(Op::RecreateTable);
    for (chain, kind, hooknum, priority) in BASE_CHAINS {
        tx.push(Op::AddChain(chain.into(), Some(Hook { kind, hooknum, priority })));
    }
    for chain in FIXED_CHAINS {
        tx.push(Op::AddChain(chain.into(), None));
    }
    let a = w.addr_type;
    add_set(tx, HAIRPIN, hairpin_spec(w), format!("set {{NAME}} {{ type {a} . {a}; }}"));
    let ip_key = format!("{a} . inet_proto . inet_service");
    for (map, with_ip) in [
        (SERVICE_IPS, true),
        (NO_ENDPOINT_SERVICES, true),
        (SERVICE_NODEPORTS, false),
        (NO_ENDPOINT_NODEPORTS, false),
    ] {
        let key = if with_ip { ip_key.as_str() } else { "inet_proto . inet_service" };
        add_set(tx, map, vmap_spec(w, with_ip), format!("map {{NAME}} {{ type {key} : verdict; }}"));
    }
    for (chain, rule) in skeleton_rules(w) {
        tx.push(Op::AddRule(chain.into(), rule));
    }
}

fn affinity_decl(w: Words, timeout: u32) -> String {
    format!("set {{NAME}} {{ type {}; flags dynamic,timeout; timeout {timeout}s; }}", w.addr_type)
}

/// The transaction that turns `old` into `new` (`old == None`: recreate the table).
pub fn diff(family: IpFamily, old: Option<&State>, new: &State) -> Transaction {
    let w = words(family);
    let mut tx = Transaction::new(family);
    let empty = State::default();
    let base = match old {
        Some(old) => old,
        None => {
            skeleton(&mut tx, w);
            &empty
        }
    };
    add_endpoint_maps(&mut tx, w, &base.endpoint_maps, &new.endpoint_maps);
    for (name, timeout) in &new.sets {
        if base.sets.get(name) != Some(timeout) {
            add_set(&mut tx, name, affinity_spec(w, *timeout), affinity_decl(w, *timeout));
        }
    }
    let changed: Vec<(&String, &Vec<Rule>)> =
        new.chains.iter().filter(|(n, r)| base.chains.get(*n) != Some(*r)).collect();
    for (name, _) in &changed {
        if !base.chains.contains_key(*name) {
            tx.push(Op::AddChain((*name).clone(), None));
        }
    }
    for (name, rules) in &changed {
        if base.chains.contains_key(*name) {
            tx.push(Op::FlushChain((*name).clone()));
        }
        for rule in *rules {
            tx.push(Op::AddRule((*name).clone(), rule.clone()));
        }
    }
    // Endpoint ranges: the deleted ones first (a new range may reuse a deleted one's start).
    let slots: BTreeSet<&Slot> = base.endpoints.keys().chain(new.endpoints.keys()).collect();
    let none = BTreeSet::new();
    let mut adds: BTreeMap<String, Vec<Elem>> = BTreeMap::new();
    let mut dels: BTreeMap<String, Vec<Elem>> = BTreeMap::new();
    for slot in slots {
        let (a, b) = (base.endpoints.get(slot).unwrap_or(&none), new.endpoints.get(slot).unwrap_or(&none));
        dels.entry(slot.map()).or_default().extend(a.difference(b).cloned().map(Elem::Range));
        adds.entry(slot.map()).or_default().extend(b.difference(a).cloned().map(Elem::Range));
    }
    for (map, elems) in dels {
        tx.push(Op::DeleteElements(map, elems));
    }
    for (map, elems) in adds {
        tx.push(Op::AddElements(map, elems));
    }
    let no_elements = BTreeMap::new();
    // Every map either state has elements in (a port may leave a map altogether).
    let names: BTreeSet<&'static str> = base.maps.keys().chain(new.maps.keys()).copied().collect();
    for map in names {
        let before = base.maps.get(map).unwrap_or(&no_elements);
        let elements = new.maps.get(map).unwrap_or(&no_elements);
        let gone: Vec<Elem> = before
            .iter()
            .filter(|(k, v)| elements.get(*k) != Some(*v))
            .map(|(k, (c, v))| Elem::Map(k.clone(), c.clone(), v.clone()))
            .collect();
        tx.push(Op::DeleteElements(map.into(), gone));
        let added: Vec<Elem> = elements
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v))
            .map(|(k, (c, v))| Elem::Map(k.clone(), c.clone(), v.clone()))
            .collect();
        tx.push(Op::AddElements(map.into(), added));
    }
    hairpin_ops(&mut tx, base.hairpin.difference(&new.hairpin), new.hairpin.difference(&base.hairpin));
    let removed: Vec<&String> = base.chains.keys().filter(|c| !new.chains.contains_key(*c)).collect();
    for name in &removed {
        tx.push(Op::FlushChain((*name).clone()));
    }
    for name in &removed {
        tx.push(Op::DeleteChain((*name).clone()));
    }
    for name in base.sets.keys().filter(|n| !new.sets.contains_key(*n)) {
        tx.push(Op::DeleteSet(name.clone()));
    }
    tx
}

fn hairpin_ops<'a>(
    tx: &mut Transaction,
    gone: impl Iterator<Item = &'a IpAddr>,
    added: impl Iterator<Item = &'a IpAddr>,
) {
    tx.push(Op::DeleteElements(HAIRPIN.into(), gone.copied().map(Elem::Pair).collect()));
    tx.push(Op::AddElements(HAIRPIN.into(), added.copied().map(Elem::Pair).collect()));
}

/// The `nft -f` transaction that turns `old` into `new` (`old == None`: recreate the table).
/// `None` when there is nothing to do.
pub fn transaction(family: IpFamily, old: Option<&State>, new: &State) -> Option<String> {
    let tx = diff(family, old, new);
    (!tx.is_empty()).then(|| tx.text())
}

// === applying ===

/// How transactions reach the kernel.
#[derive(Debug)]
enum Writer {
    /// nf_tables netlink, opened on first use in the runner's namespace.
    Netlink(Option<nftnl::Socket>),
    /// `nft -f -` through the runner (a runner that is neither this namespace nor a named one).
    Nft,
}

/// The nftables backend for one family.
#[derive(Debug)]
pub struct Nftables {
    runner: Runner,
    config: Config,
    writer: Writer,
    applied: Option<Applied>,
    applied_ruleset: Option<Arc<Ruleset>>,
}

/// What the last successful sync applied.
#[derive(Debug)]
struct Applied {
    ruleset: Arc<Ruleset>,
    /// Endpoint address → service ports using it (the hairpin set holds those with ≥ 1).
    hairpin: BTreeMap<IpAddr, usize>,
    slots: Slots,
    rules_total: usize,
}

fn hairpin_refs(ruleset: &Ruleset, family: IpFamily) -> BTreeMap<IpAddr, usize> {
    let mut refs = BTreeMap::new();
    for sp in ruleset.services.iter().filter(|sp| sp.key.family == family) {
        for ep in sp.all_endpoints() {
            *refs.entry(ep.ip).or_default() += 1;
        }
    }
    refs
}

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether anything was written.
    pub written: bool,
    /// Steps in the transaction (commands of its text form).
    pub commands: usize,
    /// Rules and map elements in the table after the sync.
    pub rules_total: usize,
    /// conntrack deletions run.
    pub conntrack_flushes: usize,
}

impl Nftables {
    /// A backend writing through nf_tables netlink in `runner`'s namespace (through `nft`
    /// when the runner runs programs elsewhere).
    pub fn new(runner: Runner, config: Config) -> Self {
        let writer = if runner.is_host() || runner.netns_name().is_some() {
            Writer::Netlink(None)
        } else {
            Writer::Nft
        };
        Nftables { runner, config, writer, applied: None, applied_ruleset: None }
    }

    /// The same, always through `nft -f` (for comparisons).
    pub fn with_nft(runner: Runner, config: Config) -> Self {
        Nftables { writer: Writer::Nft, ..Self::new(runner, config) }
    }

    fn family(&self) -> IpFamily {
        self.config.family.unwrap_or(IpFamily::IPv4)
    }

    fn apply(&mut self, tx: &Transaction) -> Result<()> {
        if std::env::var_os("WEIR_NFT_DEBUG").is_some() {
            eprintln!("--- transaction\n{}", tx.text());
        }
        match &mut self.writer {
            Writer::Nft => {
                self.runner.run("nft", &["-f", "-"], Some(&tx.text()))?;
            }
            Writer::Netlink(socket) => {
                let socket = match socket {
                    Some(s) => s,
                    None => socket.insert(nftnl::Socket::open(self.runner.netns_name())?),
                };
                if let Err(e) = socket.commit(&tx.batch()) {
                    // A socket that failed may hold answers that were never read: start afresh.
                    self.writer = Writer::Netlink(None);
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Brings the table to `ruleset`: with `full` (or after a failure) the table is recreated
    /// in one transaction, otherwise only what changed is written (nothing when nothing did).
    ///
    /// A partial sync costs O(changed ports) in rendering and kernel work: only the service
    /// ports that differ from the last applied ruleset are rendered (old and new) and diffed,
    /// plus an O(ports) comparison of the two rulesets.
    pub fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> Result<SyncStats> {
        let family = self.family();
        let old = if full { None } else { self.applied.take() };
        let (tx, hairpin, slots, released, rules_total) = match old {
            Some(applied) => self.partial(applied, ruleset),
            None => {
                let mut slots = Slots::default();
                let new = render_with(ruleset, &self.config, &mut slots);
                let hairpin = hairpin_refs(ruleset, family);
                (diff(family, None, &new), hairpin, slots, BTreeSet::new(), new.rule_count())
            }
        };
        let mut stats = SyncStats { rules_total, ..SyncStats::default() };
        if !tx.is_empty() {
            stats.written = true;
            stats.commands = tx.len();
            // On failure nothing is applied (one transaction) and `applied` stays None: the
            // next sync recreates the table.
            self.apply(&tx)?;
        }
        // At the first sync, every UDP Service port's entries (another mode's NAT).
        let flushes = match &self.applied_ruleset {
            Some(old) => conntrack::stale_udp(family, old, ruleset),
            None => conntrack::at_start(family, ruleset),
        };
        stats.conntrack_flushes = conntrack::flush(&self.runner, family, &flushes);
        let mut slots = slots;
        slots.release(&released);
        self.applied = Some(Applied { ruleset: ruleset.clone(), hairpin, slots, rules_total });
        self.applied_ruleset = Some(ruleset.clone());
        Ok(stats)
    }

    /// The transaction from `applied` to `ruleset`, rendering only the ports that changed;
    /// with the slots after it, and those it frees.
    fn partial(
        &self,
        applied: Applied,
        ruleset: &Ruleset,
    ) -> (Transaction, BTreeMap<IpAddr, usize>, Slots, BTreeSet<Slot>, usize) {
        let family = self.family();
        let w = words(family);
        let mut hairpin = applied.hairpin;
        let mut slots = applied.slots;
        let maps_before = slots.maps();
        let mut total = applied.rules_total;
        let mut tx = Transaction::new(family);
        let mut released = BTreeSet::new();
        let (mut hairpin_add, mut hairpin_del) = (BTreeSet::new(), BTreeSet::new());
        for (before, after) in super::plan::changed_ports(&applied.ruleset, ruleset, family) {
            let mut a = State::default();
            let mut b = State::default();
            if let Some(sp) = before {
                render_port(sp, &self.config, w, &mut a, &mut slots);
            }
            if let Some(sp) = after {
                render_port(sp, &self.config, w, &mut b, &mut slots);
            }
            released.extend(a.endpoints.keys().filter(|s| !b.endpoints.contains_key(*s)));
            total = (total + b.rule_count()).saturating_sub(a.rule_count());
            for ip in std::mem::take(&mut a.hairpin) {
                let n = hairpin.entry(ip).or_default();
                *n = n.saturating_sub(1);
                if *n == 0 {
                    hairpin.remove(&ip);
                    hairpin_del.insert(ip);
                }
            }
            for ip in std::mem::take(&mut b.hairpin) {
                let n = hairpin.entry(ip).or_default();
                *n += 1;
                if *n == 1 {
                    hairpin_add.insert(ip);
                }
            }
            // New maps are created once, below, before the elements that need them.
            a.endpoint_maps.clear();
            b.endpoint_maps.clear();
            tx.append(diff(family, Some(&a), &b));
        }
        let mut head = Transaction::new(family);
        add_endpoint_maps(&mut head, w, &maps_before, &slots.maps());
        head.append(tx);
        // An address that left one port and joined another stays.
        hairpin_ops(&mut head, hairpin_del.difference(&hairpin_add), hairpin_add.difference(&hairpin_del));
        (head, hairpin, slots, released, total)
    }

    /// Checks that the table still exists (someone may have flushed the ruleset); returns
    /// whether it was missing, after which a full sync is needed.
    pub fn table_missing(&mut self) -> Result<bool> {
        let w = words(self.family());
        if let Some(socket) = self.socket()? {
            let exists = socket.table_exists(w.nf, TABLE);
            if exists.is_err() {
                self.writer = Writer::Netlink(None);
            }
            return Ok(!exists?);
        }
        let (status, _) = self.runner.status("nft", &["list", "table", w.family, TABLE], None)?;
        Ok(!status.success())
    }

    /// The nf_tables socket (opened now if need be); `None` when transactions go through `nft`.
    fn socket(&mut self) -> Result<Option<&mut nftnl::Socket>> {
        let netns = self.runner.netns_name().map(str::to_string);
        match &mut self.writer {
            Writer::Nft => Ok(None),
            Writer::Netlink(Some(socket)) => Ok(Some(socket)),
            Writer::Netlink(socket) => Ok(Some(socket.insert(nftnl::Socket::open(netns.as_deref())?))),
        }
    }

    /// Deletes the table (and with it everything weir node created in this family).
    pub fn cleanup(&mut self) -> Result<()> {
        let w = words(self.family());
        if let Some(socket) = self.socket()? {
            let deleted = socket.delete_table(w.nf, TABLE);
            if deleted.is_err() {
                self.writer = Writer::Netlink(None);
            }
            deleted?;
        } else {
            let f = w.family;
            self.runner.run(
                "nft",
                &["-f", "-"],
                Some(&format!("add table {f} {TABLE}\ndelete table {f} {TABLE}\n")),
            )?;
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

    const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.1]
- addresses: [10.244.0.2]
- addresses: [10.244.0.3]
"#;

    /// `loadBalancerSourceRanges`: the LoadBalancer IP goes to a firewall chain admitting the
    /// ranges, dropping the rest; the cluster IP does not.
    #[test]
    fn source_ranges_render_a_firewall_chain() {
        let lb = WEB
            .replace("spec: {clusterIP: 10.96.0.10,", "spec: {type: LoadBalancer, loadBalancerSourceRanges: [198.51.100.0/24, 192.0.2.0/25], clusterIP: 10.96.0.10,")
            .replace("metadata: {name: web}\n", "metadata: {name: web}\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.7}]}}\n");
        let r = ruleset(&lb);
        let key = &r.services[0].key;
        let st = render(&r, &Config::default());
        let fw = firewall_chain(key);
        let texts: Vec<&str> = st.chains[&fw].iter().map(|r| r.text.as_str()).collect();
        let ext = external_chain(key);
        assert_eq!(
            texts,
            [
                format!(r#"ip saddr 192.0.2.0/25 goto {ext} comment "loadBalancerSourceRanges""#).as_str(),
                format!(r#"ip saddr 198.51.100.0/24 goto {ext} comment "loadBalancerSourceRanges""#).as_str(),
                "drop",
            ]
        );
        let verdict = |ip: &str| {
            st.maps[SERVICE_IPS][&MapKey { ip: Some(ip.parse().unwrap()), proto: Protocol::Tcp, port: 80 }]
                .1
                .clone()
        };
        assert_eq!(verdict("203.0.113.7"), goto(&fw));
        assert_eq!(verdict("10.96.0.10"), goto(&service_chain(key)));
        let open = render(
            &ruleset(&lb.replace(" loadBalancerSourceRanges: [198.51.100.0/24, 192.0.2.0/25],", "")),
            &Config::default(),
        );
        assert!(!open.chains.contains_key(&fw));
    }

    /// An endpoint change writes map elements only: no rule, no chain (rules with a jump or a
    /// NAT statement make the kernel re-validate the whole table).
    #[test]
    fn one_endpoint_change_writes_elements_only() {
        let config = Config::default();
        let a = render(&ruleset(WEB), &config);
        assert!(transaction(IpFamily::IPv4, Some(&a), &a).is_none());
        let b = render(&ruleset(&WEB.replace("- addresses: [10.244.0.3]\n", "")), &config);
        let text = transaction(IpFamily::IPv4, Some(&a), &b).unwrap();
        let expected = "\
            delete element ip weir endpoints-tcp-0 { 0-333332 }\n\
            delete element ip weir endpoints-tcp-0 { 333333-666665 }\n\
            delete element ip weir endpoints-tcp-0 { 666666-999999 }\n\
            add element ip weir endpoints-tcp-0 { 0-499999 : 10.244.0.1 . 8080, 500000-999999 : 10.244.0.2 . 8080 }\n\
            delete element ip weir hairpin { 10.244.0.3 . 10.244.0.3 }\n";
        assert_eq!(text, expected);
    }

    /// Ranges split the modulus uniformly (within 1e-6) and cover it without gaps.
    #[test]
    fn ranges_are_uniform_and_cover_the_slot() {
        for n in 1..=40usize {
            let eps: Vec<Endpoint> = (0..n)
                .map(|i| Endpoint {
                    ip: format!("10.0.0.{}", i + 1).parse().unwrap(),
                    port: 80,
                    node: None,
                    terminating: false,
                })
                .collect();
            let offset = 5 * MODULUS;
            let r: Vec<Range> = ranges(offset, &eps).into_iter().collect();
            let mut next = offset;
            let mut sorted = r.clone();
            sorted.sort_by_key(|r| r.lo);
            for range in &sorted {
                assert_eq!(range.lo, next, "gap or overlap for n={n}: {sorted:?}");
                next = range.hi + 1;
                let share = f64::from(range.hi - range.lo + 1) / f64::from(MODULUS);
                assert!((share - 1.0 / n as f64).abs() <= 1e-6, "n={n}: share {share}");
            }
            assert_eq!(next, offset + MODULUS);
        }
    }

    /// Slots are stable: a port keeps its slot while it has endpoints; a freed slot is reused;
    /// each protocol has its own maps, 64 slots each.
    #[test]
    fn slots_are_kept_and_reused() {
        let key = |name: &str, protocol| ServicePortKey {
            service: weir_dataplane::model::ObjectRef::new("default", name),
            port_name: String::new(),
            protocol,
            family: IpFamily::IPv4,
        };
        let mut slots = Slots::default();
        let owners: Vec<Owner> =
            (0..65).map(|i| (key(&format!("s{i}"), Protocol::Tcp), TrafficPolicy::Cluster)).collect();
        let got: Vec<Slot> = owners.iter().map(|o| slots.get(o)).collect();
        assert_eq!(got[0], Slot { proto: Protocol::Tcp, id: 0 });
        assert_eq!(got[64].map(), "endpoints-tcp-1");
        assert_eq!(got[64].offset(), 0);
        assert_eq!(got[63].offset(), 63 * MODULUS);
        assert_eq!(slots.get(&owners[3]), got[3]);
        let udp = slots.get(&(key("dns", Protocol::Udp), TrafficPolicy::Cluster));
        assert_eq!(udp.map(), "endpoints-udp-0");
        slots.release(&BTreeSet::from([got[3]]));
        assert_eq!(slots.get(&(key("new", Protocol::Tcp), TrafficPolicy::Local)), got[3]);
        assert_eq!(slots.maps(), BTreeMap::from([(Protocol::Tcp, 2), (Protocol::Udp, 1)]));
    }

    /// The netlink form of a batch: begin, messages with consecutive sequence numbers and the
    /// acknowledgement asked on the last, end.
    #[test]
    fn batch_wire_form() {
        let tx = diff(IpFamily::IPv4, None, &render(&ruleset(WEB), &Config::default()));
        let batch = tx.batch();
        let bytes = batch.encode(100);
        let frames = crate::node::netlink::decode(&bytes, &|_, _| crate::node::netlink::Kind::Bytes).unwrap();
        assert_eq!(frames.len(), batch.len() + 2);
        let seqs: Vec<u32> = frames
            .iter()
            .map(|f| match f {
                crate::node::netlink::Frame::Message(d) => d.seq,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(seqs, (100..100 + seqs.len() as u32).collect::<Vec<_>>());
        // BATCH_BEGIN for subsystem nf_tables (res_id 10, big endian), then NEWTABLE in family ip.
        assert_eq!(&bytes[4..6], &0x10u16.to_ne_bytes());
        assert_eq!(&bytes[16..20], &[0, 0, 0, 10]);
        assert_eq!(&bytes[24..26], &(10u16 << 8).to_ne_bytes());
        assert_eq!(bytes[36], 2);
    }
}
