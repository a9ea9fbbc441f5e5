//! ipvs mode: a [`Ruleset`] as IPVS virtual services and real servers (generic netlink family
//! `IPVS`), service IPs bound to the dummy interface `weir-ipvs0`, ipsets, and a few iptables
//! rules for masquerading.
//!
//! - One virtual service per virtual IP, port and protocol (ClusterIPs, externalIPs,
//!   LoadBalancer IPs, and the node port on every node address), with the `--ipvs-scheduler`
//!   and, for ClientIP affinity, persistence with the affinity timeout. Its real servers are the
//!   endpoints its traffic policy allows, forwarded by masquerading (NAT), weight 1.
//! - Virtual IPs are bound to `weir-ipvs0` (a dummy interface, left down) so that the node
//!   accepts their packets; IPVS takes them in LOCAL_IN.
//! - ipsets name what needs masquerading (`WEIR-CLUSTER-IP`, `WEIR-EXTERNAL-IP`,
//!   `WEIR-NODE-PORT-TCP`/`-UDP`) and hairpin pairs (`WEIR-LOOP-BACK`); the nat chains match
//!   them, in the same chains as iptables mode (`WEIR-SERVICES`, `WEIR-MARK-MASQ`,
//!   `WEIR-POSTROUTING`), and the filter table is iptables mode's (reject without endpoints).
//!
//! The plan ([`render`], [`messages`]) is pure: the netlink messages are data, checked against
//! recorded fixtures. A sync diffs against what it applied last; a full sync (and the first)
//! reads the kernel's IPVS table instead, so that leftovers of an earlier run are removed.
//! IPVS has no transactions: a failed message aborts the sync and the retry is a full sync,
//! which converges from what the kernel really has.
//!
//! Scope: virtual services of both families; ipsets and iptables rules for IPv4 only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use super::conntrack;
use super::exec::{self, Runner};
use super::iptables::{self, Chains, MARK_MASQ, MASQ_MARK, NODEPORTS, POSTROUTING, SERVICES, Tables};
use super::netlink::{self, Attr, F_ACK, F_DUMP, F_REQUEST, Kind, Message, Value};
use super::plan::{Cidr, Endpoint, IpFamily, Protocol, Ruleset, ServicePort, TrafficPolicy};

/// The dummy interface holding the virtual IPs.
pub const INTERFACE: &str = "weir-ipvs0";
/// The generic netlink family name of IPVS.
pub const FAMILY: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub const GENL_VERSION: u8 = 1;
/// Node ports `--cleanup` considers weir's on node addresses (the Kubernetes default
/// `--service-node-port-range`), unless kube-proxy's `kube-ipvs0` exists.
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// IPVS commands (`IPVS_CMD_*`).
pub mod cmd {
    /// Add a virtual service.
    pub const NEW_SERVICE: u8 = 1;
    /// Change a virtual service.
    pub const SET_SERVICE: u8 = 2;
    /// Delete a virtual service.
    pub const DEL_SERVICE: u8 = 3;
    /// Get (dump) virtual services.
    pub const GET_SERVICE: u8 = 4;
    /// Add a real server.
    pub const NEW_DEST: u8 = 5;
    /// Change a real server.
    pub const SET_DEST: u8 = 6;
    /// Delete a real server.
    pub const DEL_DEST: u8 = 7;
    /// Get (dump) the real servers of a service.
    pub const GET_DEST: u8 = 8;
}

/// Top-level attributes (`IPVS_CMD_ATTR_*`).
pub mod cmd_attr {
    /// Nested service attributes.
    pub const SERVICE: u16 = 1;
    /// Nested destination attributes.
    pub const DEST: u16 = 2;
}

/// Service attributes (`IPVS_SVC_ATTR_*`).
pub mod svc {
    /// Address family (u16).
    pub const AF: u16 = 1;
    /// L4 protocol (u16).
    pub const PROTOCOL: u16 = 2;
    /// Virtual address (16 bytes, `union nf_inet_addr`).
    pub const ADDR: u16 = 3;
    /// Virtual port (network order).
    pub const PORT: u16 = 4;
    /// Firewall mark (u32).
    pub const FWMARK: u16 = 5;
    /// Scheduler name (string).
    pub const SCHED_NAME: u16 = 6;
    /// `struct ip_vs_flags { u32 flags; u32 mask; }`.
    pub const FLAGS: u16 = 7;
    /// Persistence timeout in seconds (u32).
    pub const TIMEOUT: u16 = 8;
    /// Persistence netmask (u32; a prefix length for IPv6).
    pub const NETMASK: u16 = 9;
    /// Statistics (nested).
    pub const STATS: u16 = 10;
    /// Persistence engine name (string).
    pub const PE_NAME: u16 = 11;
}

/// Destination attributes (`IPVS_DEST_ATTR_*`).
pub mod dest {
    /// Real server address (16 bytes).
    pub const ADDR: u16 = 1;
    /// Real server port (network order).
    pub const PORT: u16 = 2;
    /// Forwarding method (u32, `IP_VS_CONN_F_*`).
    pub const FWD_METHOD: u16 = 3;
    /// Weight (u32).
    pub const WEIGHT: u16 = 4;
    /// Upper connection threshold (u32).
    pub const U_THRESH: u16 = 5;
    /// Lower connection threshold (u32).
    pub const L_THRESH: u16 = 6;
    /// Active connections (u32, read only).
    pub const ACTIVE_CONNS: u16 = 7;
    /// Inactive connections (u32, read only).
    pub const INACT_CONNS: u16 = 8;
    /// Persistent connections (u32, read only).
    pub const PERSIST_CONNS: u16 = 9;
    /// Address family of the real server (u16).
    pub const ADDR_FAMILY: u16 = 11;
}

/// `IP_VS_SVC_F_PERSISTENT`.
pub const SVC_F_PERSISTENT: u32 = 0x1;
/// `IP_VS_CONN_F_MASQ`: forwarding by NAT.
pub const CONN_F_MASQ: u32 = 0;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// Errors of ipvs mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Talking to the kernel over netlink failed.
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    /// A tool (`ip`, `ipset`, `iptables-restore`) failed.
    #[error(transparent)]
    Exec(#[from] exec::Error),
    /// The iptables part failed.
    #[error(transparent)]
    Iptables(#[from] iptables::Error),
    /// IPVS is programmed over this process's netlink socket: only in its own namespace.
    #[error("IPVS can only be programmed in weir node's own network namespace (run it there)")]
    ForeignNamespace,
    /// Output of a tool does not parse.
    #[error("cannot read {what}: {reason}")]
    Parse {
        /// What was read.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// IPVS schedulers (`--ipvs-scheduler`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Scheduler {
    /// Round robin.
    #[default]
    Rr,
    /// Weighted round robin.
    Wrr,
    /// Least connection.
    Lc,
    /// Weighted least connection.
    Wlc,
    /// Source hashing.
    Sh,
    /// Destination hashing.
    Dh,
    /// Shortest expected delay.
    Sed,
    /// Never queue.
    Nq,
    /// Maglev hashing.
    Mh,
}

impl Scheduler {
    /// The kernel's name of the scheduler (module `ip_vs_<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheduler::Rr => "rr",
            Scheduler::Wrr => "wrr",
            Scheduler::Lc => "lc",
            Scheduler::Wlc => "wlc",
            Scheduler::Sh => "sh",
            Scheduler::Dh => "dh",
            Scheduler::Sed => "sed",
            Scheduler::Nq => "nq",
            Scheduler::Mh => "mh",
        }
    }
}

/// Options of ipvs mode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// The scheduler of every virtual service.
    pub scheduler: Scheduler,
    /// Pod CIDR: ClusterIP traffic from outside it is masqueraded.
    pub cluster_cidr: Option<Cidr>,
    /// Masquerade all ClusterIP traffic.
    pub masquerade_all: bool,
}

/// A virtual service's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    /// Virtual address.
    pub addr: IpAddr,
    /// Protocol.
    pub protocol: Protocol,
    /// Virtual port.
    pub port: u16,
}

/// A virtual service's settings and real servers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VirtualServer {
    /// Scheduler name.
    pub scheduler: String,
    /// Persistence timeout (ClientIP affinity), if any.
    pub persistence: Option<u32>,
    /// Real servers: (address, port) → weight.
    pub dests: BTreeMap<(IpAddr, u16), u32>,
}

/// The IPVS set, addresses, and ipset content ipvs mode wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Virtual services.
    pub services: BTreeMap<ServiceId, VirtualServer>,
    /// Addresses bound to [`INTERFACE`].
    pub addresses: BTreeSet<IpAddr>,
    /// ipset name → entries (IPv4).
    pub sets: BTreeMap<&'static str, BTreeSet<String>>,
}

/// ipsets of ipvs mode: name, type and creation options.
pub const SETS: &[(&str, &str)] = &[
    ("WEIR-CLUSTER-IP", "hash:ip,port family inet"),
    ("WEIR-EXTERNAL-IP", "hash:ip,port family inet"),
    ("WEIR-LOOP-BACK", "hash:ip,port,ip family inet"),
    ("WEIR-NODE-PORT-TCP", "bitmap:port range 0-65535"),
    ("WEIR-NODE-PORT-UDP", "bitmap:port range 0-65535"),
];

// === the plan ===

fn add_service(st: &mut State, config: &Config, sp: &ServicePort, addr: IpAddr, port: u16, eps: &[Endpoint]) {
    if eps.is_empty() {
        // No virtual service: the node itself (or the filter table) rejects, as without one.
        return;
    }
    let vs = st.services.entry(ServiceId { addr, protocol: sp.key.protocol, port }).or_default();
    vs.scheduler = config.scheduler.as_str().to_string();
    vs.persistence = sp.affinity.map(|a| a.timeout_seconds);
    for ep in eps {
        vs.dests.insert((ep.ip, ep.port), 1);
    }
}

fn set_add(st: &mut State, set: &'static str, entry: String) {
    st.sets.entry(set).or_default().insert(entry);
}

/// The IPVS state for `ruleset`; node ports are served on every address of `node_ips`.
pub fn render(ruleset: &Ruleset, config: &Config, node_ips: &[IpAddr]) -> State {
    let mut st = State::default();
    for (set, _) in SETS {
        st.sets.insert(set, BTreeSet::new());
    }
    for sp in &ruleset.services {
        let proto = sp.key.protocol.as_str();
        let v4 = sp.key.family == IpFamily::IPv4;
        for ip in &sp.cluster_ips {
            st.addresses.insert(*ip);
            add_service(&mut st, config, sp, *ip, sp.port, sp.internal_endpoints());
            if v4 && !sp.internal_endpoints().is_empty() {
                set_add(&mut st, "WEIR-CLUSTER-IP", format!("{ip},{proto}:{}", sp.port));
            }
        }
        for ip in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
            st.addresses.insert(*ip);
            add_service(&mut st, config, sp, *ip, sp.port, sp.external_endpoints());
            if v4 && sp.external_policy == TrafficPolicy::Cluster && !sp.external_endpoints().is_empty() {
                set_add(&mut st, "WEIR-EXTERNAL-IP", format!("{ip},{proto}:{}", sp.port));
            }
        }
        if let Some(np) = sp.node_port {
            for ip in node_ips.iter().filter(|ip| IpFamily::of(ip) == sp.key.family) {
                add_service(&mut st, config, sp, *ip, np, sp.external_endpoints());
            }
            let set = match sp.key.protocol {
                Protocol::Tcp => Some("WEIR-NODE-PORT-TCP"),
                Protocol::Udp => Some("WEIR-NODE-PORT-UDP"),
                Protocol::Sctp => None,
            };
            let masquerade =
                v4 && sp.external_policy == TrafficPolicy::Cluster && !sp.external_endpoints().is_empty();
            if let Some(set) = set.filter(|_| masquerade) {
                set_add(&mut st, set, np.to_string());
            }
        }
        if v4 {
            for ep in sp.all_endpoints() {
                set_add(&mut st, "WEIR-LOOP-BACK", format!("{},{proto}:{},{}", ep.ip, ep.port, ep.ip));
            }
        }
    }
    st
}

fn af(addr: &IpAddr) -> u16 {
    if addr.is_ipv4() { AF_INET } else { AF_INET6 }
}

fn proto_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// `union nf_inet_addr`: 16 bytes, an IPv4 address in the first four.
fn addr_bytes(addr: &IpAddr) -> Vec<u8> {
    let mut b = match addr {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    b.resize(16, 0);
    b
}

fn service_attrs(id: &ServiceId, vs: Option<&VirtualServer>) -> Attr {
    let mut attrs = vec![
        Attr::new(svc::AF, Value::U16(af(&id.addr))),
        Attr::new(svc::PROTOCOL, Value::U16(proto_number(id.protocol))),
        Attr::new(svc::ADDR, Value::Bytes(addr_bytes(&id.addr))),
        Attr::new(svc::PORT, Value::Be16(id.port)),
    ];
    if let Some(vs) = vs {
        let flags = if vs.persistence.is_some() { SVC_F_PERSISTENT } else { 0 };
        let mut flag_bytes = flags.to_ne_bytes().to_vec();
        flag_bytes.extend_from_slice(&u32::MAX.to_ne_bytes());
        let netmask = if id.addr.is_ipv4() { u32::MAX } else { 128 };
        attrs.extend([
            Attr::new(svc::SCHED_NAME, Value::Str(vs.scheduler.clone())),
            Attr::new(svc::FLAGS, Value::Bytes(flag_bytes)),
            Attr::new(svc::TIMEOUT, Value::U32(vs.persistence.unwrap_or(0))),
            Attr::new(svc::NETMASK, Value::U32(netmask)),
        ]);
    }
    Attr::new(cmd_attr::SERVICE, Value::Nested(attrs))
}

fn dest_attrs(addr: &IpAddr, port: u16, weight: Option<u32>) -> Attr {
    let mut attrs =
        vec![Attr::new(dest::ADDR, Value::Bytes(addr_bytes(addr))), Attr::new(dest::PORT, Value::Be16(port))];
    if let Some(weight) = weight {
        attrs.extend([
            Attr::new(dest::FWD_METHOD, Value::U32(CONN_F_MASQ)),
            Attr::new(dest::WEIGHT, Value::U32(weight)),
            Attr::new(dest::U_THRESH, Value::U32(0)),
            Attr::new(dest::L_THRESH, Value::U32(0)),
            Attr::new(dest::ADDR_FAMILY, Value::U16(af(addr))),
        ]);
    }
    Attr::new(cmd_attr::DEST, Value::Nested(attrs))
}

fn request(cmd: u8, attrs: Vec<Attr>) -> Message {
    Message { cmd, version: GENL_VERSION, flags: F_REQUEST | F_ACK, attrs }
}

/// The IPVS messages that turn `old` into `new`: new and changed services and real servers
/// first, then what went away (a service never loses its last real server before it gains
/// the new ones).
pub fn messages(
    old: &BTreeMap<ServiceId, VirtualServer>,
    new: &BTreeMap<ServiceId, VirtualServer>,
) -> Vec<Message> {
    let mut out = Vec::new();
    let empty = VirtualServer::default();
    for (id, vs) in new {
        let before = old.get(id);
        match before {
            None => out.push(request(cmd::NEW_SERVICE, vec![service_attrs(id, Some(vs))])),
            Some(b) if b.scheduler != vs.scheduler || b.persistence != vs.persistence => {
                out.push(request(cmd::SET_SERVICE, vec![service_attrs(id, Some(vs))]));
            }
            Some(_) => {}
        }
        let before = before.unwrap_or(&empty);
        for ((addr, port), weight) in &vs.dests {
            let cmd = match before.dests.get(&(*addr, *port)) {
                None => cmd::NEW_DEST,
                Some(w) if w != weight => cmd::SET_DEST,
                Some(_) => continue,
            };
            out.push(request(cmd, vec![service_attrs(id, None), dest_attrs(addr, *port, Some(*weight))]));
        }
        for (addr, port) in before.dests.keys().filter(|k| !vs.dests.contains_key(*k)) {
            out.push(request(cmd::DEL_DEST, vec![service_attrs(id, None), dest_attrs(addr, *port, None)]));
        }
    }
    for id in old.keys().filter(|id| !new.contains_key(*id)) {
        out.push(request(cmd::DEL_SERVICE, vec![service_attrs(id, None)]));
    }
    out
}

/// How IPVS attributes are read (for [`netlink::decode`]).
pub fn schema(nest: u16, kind: u16) -> Kind {
    match (nest, kind) {
        (0, cmd_attr::SERVICE) => Kind::Nested(cmd_attr::SERVICE),
        (0, cmd_attr::DEST) => Kind::Nested(cmd_attr::DEST),
        (cmd_attr::SERVICE, svc::AF | svc::PROTOCOL) => Kind::U16,
        (cmd_attr::SERVICE, svc::PORT) => Kind::Be16,
        (cmd_attr::SERVICE, svc::FWMARK | svc::TIMEOUT | svc::NETMASK) => Kind::U32,
        (cmd_attr::SERVICE, svc::SCHED_NAME | svc::PE_NAME) => Kind::Str,
        (cmd_attr::DEST, dest::PORT) => Kind::Be16,
        (
            cmd_attr::DEST,
            dest::FWD_METHOD
            | dest::WEIGHT
            | dest::U_THRESH
            | dest::L_THRESH
            | dest::ACTIVE_CONNS
            | dest::INACT_CONNS
            | dest::PERSIST_CONNS,
        ) => Kind::U32,
        (cmd_attr::DEST, dest::ADDR_FAMILY) => Kind::U16,
        _ => Kind::Bytes,
    }
}

fn read_addr(bytes: &[u8], family: u16) -> Option<IpAddr> {
    match family {
        AF_INET => <[u8; 4]>::try_from(bytes.get(..4)?).ok().map(IpAddr::from),
        AF_INET6 => <[u8; 16]>::try_from(bytes.get(..16)?).ok().map(IpAddr::from),
        _ => None,
    }
}

fn u16_of(a: Option<&Attr>) -> Option<u16> {
    match a.map(|a| &a.value) {
        Some(Value::U16(v) | Value::Be16(v)) => Some(*v),
        _ => None,
    }
}

fn u32_of(a: Option<&Attr>) -> Option<u32> {
    match a.map(|a| &a.value) {
        Some(Value::U32(v)) => Some(*v),
        _ => None,
    }
}

fn bytes_of(a: Option<&Attr>) -> Option<&[u8]> {
    match a.map(|a| &a.value) {
        Some(Value::Bytes(b)) => Some(b),
        _ => None,
    }
}

/// A virtual service from a `SERVICE` nest of a dump (fwmark services: `None`).
pub fn parse_service(nest: &Attr) -> Option<(ServiceId, VirtualServer)> {
    let family = u16_of(nest.get(svc::AF))?;
    let protocol = match u16_of(nest.get(svc::PROTOCOL))? {
        6 => Protocol::Tcp,
        17 => Protocol::Udp,
        132 => Protocol::Sctp,
        _ => return None,
    };
    let addr = read_addr(bytes_of(nest.get(svc::ADDR))?, family)?;
    let port = u16_of(nest.get(svc::PORT))?;
    let scheduler = match nest.get(svc::SCHED_NAME).map(|a| &a.value) {
        Some(Value::Str(s)) => s.clone(),
        _ => String::new(),
    };
    let flags = bytes_of(nest.get(svc::FLAGS))
        .and_then(|b| b.get(..4))
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_ne_bytes);
    let persistence = (flags & SVC_F_PERSISTENT != 0).then(|| u32_of(nest.get(svc::TIMEOUT)).unwrap_or(0));
    Some((
        ServiceId { addr, protocol, port },
        VirtualServer { scheduler, persistence, dests: BTreeMap::new() },
    ))
}

/// A real server from a `DEST` nest of a dump, in a service of `family`.
pub fn parse_dest(nest: &Attr, family: IpFamily) -> Option<((IpAddr, u16), u32)> {
    let af = u16_of(nest.get(dest::ADDR_FAMILY)).unwrap_or(match family {
        IpFamily::IPv4 => AF_INET,
        IpFamily::IPv6 => AF_INET6,
    });
    let addr = read_addr(bytes_of(nest.get(dest::ADDR))?, af)?;
    let port = u16_of(nest.get(dest::PORT))?;
    Some(((addr, port), u32_of(nest.get(dest::WEIGHT)).unwrap_or(1)))
}

// === readable dumps (fixtures, logs) ===

fn svc_attr_name(kind: u16) -> &'static str {
    match kind {
        svc::AF => "af",
        svc::PROTOCOL => "protocol",
        svc::ADDR => "addr",
        svc::PORT => "port",
        svc::FWMARK => "fwmark",
        svc::SCHED_NAME => "sched",
        svc::FLAGS => "flags",
        svc::TIMEOUT => "timeout",
        svc::NETMASK => "netmask",
        svc::PE_NAME => "pe",
        _ => "?",
    }
}

fn dest_attr_name(kind: u16) -> &'static str {
    match kind {
        dest::ADDR => "addr",
        dest::PORT => "port",
        dest::FWD_METHOD => "fwd",
        dest::WEIGHT => "weight",
        dest::U_THRESH => "u_thresh",
        dest::L_THRESH => "l_thresh",
        dest::ADDR_FAMILY => "addr_family",
        _ => "?",
    }
}

fn cmd_name(cmd: u8) -> String {
    match cmd {
        cmd::NEW_SERVICE => "NEW_SERVICE".into(),
        cmd::SET_SERVICE => "SET_SERVICE".into(),
        cmd::DEL_SERVICE => "DEL_SERVICE".into(),
        cmd::GET_SERVICE => "GET_SERVICE".into(),
        cmd::NEW_DEST => "NEW_DEST".into(),
        cmd::SET_DEST => "SET_DEST".into(),
        cmd::DEL_DEST => "DEL_DEST".into(),
        cmd::GET_DEST => "GET_DEST".into(),
        other => format!("CMD_{other}"),
    }
}

fn show_value(nest: u16, attr: &Attr, family: u16) -> String {
    match (&attr.value, nest, attr.kind) {
        (Value::Bytes(b), _, svc::ADDR) if nest == cmd_attr::SERVICE => {
            read_addr(b, family).map_or_else(|| netlink::hex(b), |a| a.to_string())
        }
        (Value::Bytes(b), _, dest::ADDR) if nest == cmd_attr::DEST => {
            read_addr(b, family).map_or_else(|| netlink::hex(b), |a| a.to_string())
        }
        (Value::Bytes(b), _, svc::FLAGS) if nest == cmd_attr::SERVICE && b.len() == 8 => {
            let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            format!("{:#x}/{:#x}", word(0), word(4))
        }
        (Value::U16(v), _, svc::AF) if nest == cmd_attr::SERVICE => af_name(*v),
        (Value::U16(v), _, dest::ADDR_FAMILY) if nest == cmd_attr::DEST => af_name(*v),
        (Value::U16(v), _, svc::PROTOCOL) if nest == cmd_attr::SERVICE => match v {
            6 => "tcp".into(),
            17 => "udp".into(),
            132 => "sctp".into(),
            _ => v.to_string(),
        },
        (Value::U32(0), _, dest::FWD_METHOD) if nest == cmd_attr::DEST => "masq".into(),
        (Value::U32(v), _, svc::NETMASK) if nest == cmd_attr::SERVICE => format!("{v:#x}"),
        (Value::U16(v) | Value::Be16(v), _, _) => v.to_string(),
        (Value::U32(v), _, _) => v.to_string(),
        (Value::Str(s), _, _) => format!("{s:?}"),
        (Value::Bytes(b), _, _) => netlink::hex(b),
        (Value::Nested(_), _, _) => "{..}".into(),
    }
}

fn af_name(v: u16) -> String {
    match v {
        AF_INET => "inet".into(),
        AF_INET6 => "inet6".into(),
        _ => v.to_string(),
    }
}

/// One line per message: the command and its attributes by name (`addr`s read with the
/// service's family).
pub fn describe(msg: &Message) -> String {
    let mut out = cmd_name(msg.cmd);
    let family = msg.get(cmd_attr::SERVICE).and_then(|s| u16_of(s.get(svc::AF))).unwrap_or(AF_INET);
    for attr in &msg.attrs {
        let (label, names): (&str, fn(u16) -> &'static str) = match attr.kind {
            cmd_attr::SERVICE => ("service", svc_attr_name),
            cmd_attr::DEST => ("dest", dest_attr_name),
            _ => ("?", svc_attr_name),
        };
        let Value::Nested(inner) = &attr.value else { continue };
        let parts: Vec<String> =
            inner.iter().map(|a| format!("{}={}", names(a.kind), show_value(attr.kind, a, family))).collect();
        let _ = write!(out, " {label}[{}]", parts.join(" "));
    }
    out
}

/// The `ipset restore` input that turns `old` (`None`: unknown, rewrite) into `new`.
pub fn ipset_text(
    old: Option<&BTreeMap<&'static str, BTreeSet<String>>>,
    new: &BTreeMap<&'static str, BTreeSet<String>>,
) -> String {
    let mut s = String::new();
    for (name, kind) in SETS {
        let empty = BTreeSet::new();
        let entries = new.get(name).unwrap_or(&empty);
        match old {
            None => {
                let _ = writeln!(s, "create {name} {kind}");
                let _ = writeln!(s, "flush {name}");
                for e in entries {
                    let _ = writeln!(s, "add {name} {e}");
                }
            }
            Some(old) => {
                let before = old.get(name).unwrap_or(&empty);
                for e in before.difference(entries) {
                    let _ = writeln!(s, "del {name} {e}");
                }
                for e in entries.difference(before) {
                    let _ = writeln!(s, "add {name} {e}");
                }
            }
        }
    }
    s
}

/// The nat chains of ipvs mode (IPv4), in the layout of iptables mode.
pub fn nat_chains(config: &Config) -> Chains {
    let mut nat = Chains::new();
    let masq_cluster = if config.masquerade_all {
        Some(String::new())
    } else {
        config.cluster_cidr.filter(|c| c.family() == IpFamily::IPv4).map(|c| format!("! -s {c} "))
    };
    let mut services = Vec::new();
    if let Some(src) = masq_cluster {
        services.push(format!(
            r#"-m comment --comment "weir service cluster ip + port for masquerade purpose" {src}-m set --match-set WEIR-CLUSTER-IP dst,dst -j {MARK_MASQ}"#
        ));
    }
    services.push(format!(
        r#"-m comment --comment "weir service external ip + port for masquerade purpose" -m set --match-set WEIR-EXTERNAL-IP dst,dst -j {MARK_MASQ}"#
    ));
    services.push(format!(
        r#"-m comment --comment "weir service nodeports" -m addrtype --dst-type LOCAL -j {NODEPORTS}"#
    ));
    nat.insert(SERVICES.into(), services);
    nat.insert(
        NODEPORTS.into(),
        vec![
            format!("-p tcp -m comment --comment \"weir nodeport TCP\" -m set --match-set WEIR-NODE-PORT-TCP dst -j {MARK_MASQ}"),
            format!("-p udp -m comment --comment \"weir nodeport UDP\" -m set --match-set WEIR-NODE-PORT-UDP dst -j {MARK_MASQ}"),
        ],
    );
    nat.insert(MARK_MASQ.into(), vec![format!("-j MARK --or-mark {MASQ_MARK}")]);
    nat.insert(
        POSTROUTING.into(),
        vec![
            r#"-m comment --comment "weir endpoint hairpin" -m set --match-set WEIR-LOOP-BACK dst,dst,src -j MASQUERADE"#.into(),
            format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-j MARK --xor-mark {MASQ_MARK}"),
            r#"-m comment --comment "weir service traffic requiring SNAT" -j MASQUERADE --random-fully"#.into(),
        ],
    );
    nat
}

/// The iptables tables of ipvs mode: [`nat_chains`], and iptables mode's filter table.
pub fn tables(ruleset: &Ruleset, config: &Config) -> Tables {
    let ipt = iptables::Config {
        family: Some(IpFamily::IPv4),
        cluster_cidr: config.cluster_cidr,
        masquerade_all: config.masquerade_all,
    };
    Tables { nat: nat_chains(config), filter: iptables::render(ruleset, &ipt).filter }
}

// === applying ===

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether anything was written.
    pub written: bool,
    /// IPVS messages, address changes, ipset lines and iptables rules written.
    pub written_items: usize,
    /// Virtual services plus real servers after the sync.
    pub total: usize,
}

/// The ipvs backend.
#[derive(Debug)]
pub struct Ipvs {
    runner: Runner,
    config: Config,
    socket: Option<(netlink::Socket, u16)>,
    iptables: iptables::Iptables,
    applied: Option<State>,
    applied_ruleset: Option<Ruleset>,
}

impl Ipvs {
    /// A backend running tools through `runner`; IPVS itself is programmed over a netlink
    /// socket of this process (its network namespace, whatever the runner's).
    pub fn new(runner: Runner, config: Config) -> Self {
        let iptables = iptables::Iptables::new(
            runner.clone(),
            iptables::Config {
                family: Some(IpFamily::IPv4),
                cluster_cidr: config.cluster_cidr,
                masquerade_all: config.masquerade_all,
            },
        );
        Ipvs { runner, config, socket: None, iptables, applied: None, applied_ruleset: None }
    }

    fn socket(&mut self) -> Result<&mut (netlink::Socket, u16)> {
        if !self.runner.is_host() {
            // The socket would act on this process's namespace, not the runner's.
            return Err(Error::ForeignNamespace);
        }
        if self.socket.is_none() {
            let mut socket = netlink::Socket::open()?;
            let family = socket.resolve(FAMILY)?;
            self.socket = Some((socket, family));
        }
        // Just set when it was None.
        self.socket.as_mut().ok_or_else(|| Error::Parse { what: "netlink socket", reason: "lost".into() })
    }

    /// The node's own addresses (all interfaces but loopback and [`INTERFACE`]).
    pub fn node_ips(&self) -> Result<Vec<IpAddr>> {
        let out = self.runner.run("ip", &["-j", "addr", "show"], None)?;
        parse_node_ips(&out.stdout)
    }

    fn interface_addresses(&self) -> Result<BTreeSet<IpAddr>> {
        let (status, out) = self.runner.status("ip", &["-j", "addr", "show", "dev", INTERFACE], None)?;
        if !status.success() {
            return Ok(BTreeSet::new());
        }
        let links: serde_json::Value = serde_json::from_str(&out.stdout)
            .map_err(|e| Error::Parse { what: "ip -j addr", reason: e.to_string() })?;
        Ok(addresses_of(&links).map(|(_, ip)| ip).collect())
    }

    fn ensure_interface(&self) -> Result<()> {
        let (status, _) = self.runner.status("ip", &["link", "show", INTERFACE], None)?;
        if !status.success() {
            self.runner.run("ip", &["link", "add", INTERFACE, "type", "dummy"], None)?;
        }
        // As kube-proxy: IPVS conntrack for masquerading; forget connections of removed real
        // servers; answer ARP only for addresses of the interface asked.
        for (key, value) in [
            ("net.ipv4.vs.conntrack", "1"),
            ("net.ipv4.vs.expire_nodest_conn", "1"),
            ("net.ipv4.vs.expire_quiescent_template", "1"),
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
        ] {
            if let Err(error) = self.runner.run("sysctl", &["-qw", &format!("{key}={value}")], None) {
                tracing::warn!(%error, "cannot set {key}");
            }
        }
        Ok(())
    }

    /// The virtual services weir owns in the kernel (on [`INTERFACE`]'s addresses, or node
    /// ports on node addresses), with their real servers.
    ///
    /// A virtual service on a node address is weir's only when `node_port(port)` says so: IPVS
    /// services carry no owner, and kube-proxy's (ipvs mode) live on the same addresses.
    fn read_kernel(
        &mut self,
        bound: &BTreeSet<IpAddr>,
        node_ips: &[IpAddr],
        node_port: &dyn Fn(u16) -> bool,
    ) -> Result<BTreeMap<ServiceId, VirtualServer>> {
        let (socket, family) = self.socket()?;
        let family = *family;
        let dump = Message {
            cmd: cmd::GET_SERVICE,
            version: GENL_VERSION,
            flags: F_REQUEST | F_DUMP,
            attrs: vec![],
        };
        let mut out = BTreeMap::new();
        for msg in socket.request(&dump, family, &schema, "IPVS_CMD_GET_SERVICE")? {
            let Some((id, mut vs)) = msg.get(cmd_attr::SERVICE).and_then(parse_service) else { continue };
            let owned = bound.contains(&id.addr) || (node_ips.contains(&id.addr) && node_port(id.port));
            if !owned {
                continue;
            }
            let get = Message {
                cmd: cmd::GET_DEST,
                version: GENL_VERSION,
                flags: F_REQUEST | F_DUMP,
                attrs: vec![service_attrs(&id, None)],
            };
            for d in socket.request(&get, family, &schema, "IPVS_CMD_GET_DEST")? {
                if let Some((k, w)) =
                    d.get(cmd_attr::DEST).and_then(|n| parse_dest(n, IpFamily::of(&id.addr)))
                {
                    vs.dests.insert(k, w);
                }
            }
            out.insert(id, vs);
        }
        Ok(out)
    }

    /// Brings the kernel to `ruleset` (see the module docs).
    pub fn sync(&mut self, ruleset: &Ruleset, full: bool) -> Result<SyncStats> {
        // Resolve the IPVS family first: without it nothing is touched.
        self.socket()?;
        let node_ips = self.node_ips()?;
        let new = render(ruleset, &self.config, &node_ips);
        let old = if full { None } else { self.applied.take() };
        let mut stats = SyncStats {
            total: new.services.values().map(|vs| 1 + vs.dests.len()).sum(),
            ..SyncStats::default()
        };
        // 1. ipsets (the iptables rules refer to them).
        let text = ipset_text(old.as_ref().map(|o| &o.sets), &new.sets);
        if !text.is_empty() {
            self.runner.run("ipset", &["restore", "-exist"], Some(&text))?;
            stats.written_items += text.lines().count();
        }
        // 2. addresses on the dummy interface.
        let bound = match &old {
            Some(o) => o.addresses.clone(),
            None => {
                self.ensure_interface()?;
                self.interface_addresses()?
            }
        };
        let mut batch = String::new();
        for ip in new.addresses.difference(&bound) {
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            let _ = writeln!(batch, "address add {ip}/{prefix} dev {INTERFACE}");
        }
        for ip in bound.difference(&new.addresses) {
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            let _ = writeln!(batch, "address del {ip}/{prefix} dev {INTERFACE}");
        }
        // 3. virtual services.
        let kernel = match &old {
            Some(o) => o.services.clone(),
            None => {
                // Node ports weir wants now or applied before (in this process).
                let mine: BTreeSet<u16> = ruleset
                    .services
                    .iter()
                    .chain(self.applied_ruleset.iter().flat_map(|r| &r.services))
                    .filter_map(|sp| sp.node_port)
                    .collect();
                self.read_kernel(&bound, &node_ips, &|port| mine.contains(&port))?
            }
        };
        let msgs = messages(&kernel, &new.services);
        // New addresses before new services, stale ones after (deleting an address drops the
        // connections to it).
        let (adds, dels): (Vec<&str>, Vec<&str>) = batch.lines().partition(|l| l.starts_with("address add"));
        if !adds.is_empty() {
            self.runner.run("ip", &["-batch", "-"], Some(&(adds.join("\n") + "\n")))?;
        }
        let (socket, family) = self.socket()?;
        let family = *family;
        for msg in &msgs {
            socket.request(msg, family, &schema, &describe(msg))?;
        }
        if !dels.is_empty() {
            self.runner.run("ip", &["-batch", "-"], Some(&(dels.join("\n") + "\n")))?;
        }
        stats.written_items += adds.len() + dels.len() + msgs.len();
        // 4. iptables.
        let ipt = self.iptables.apply(tables(ruleset, &self.config), full)?;
        stats.written_items += ipt.rules_written;
        stats.written = stats.written_items > 0 || ipt.written;
        // At the first sync, every UDP Service port's entries (another mode's NAT).
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let flushes = match &self.applied_ruleset {
                Some(old_ruleset) => conntrack::stale_udp(family, old_ruleset, ruleset),
                None => conntrack::at_start(family, ruleset),
            };
            conntrack::flush(&self.runner, family, &flushes);
        }
        self.applied = Some(new);
        self.applied_ruleset = Some(ruleset.clone());
        Ok(stats)
    }

    /// Checks the jumps into weir's iptables chains; returns how many were missing.
    pub fn ensure_jumps(&self) -> Result<usize> {
        Ok(self.iptables.ensure_jumps()?)
    }
}

fn addresses_of(links: &serde_json::Value) -> impl Iterator<Item = (String, IpAddr)> + '_ {
    links.as_array().into_iter().flatten().flat_map(|link| {
        let name = link.get("ifname").and_then(|n| n.as_str()).unwrap_or_default().to_string();
        link.get("addr_info")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
            .filter_map(|a| a.get("local").and_then(|l| l.as_str()).and_then(|l| l.parse().ok()))
            .map(move |ip| (name.clone(), ip))
    })
}

/// The node addresses in `ip -j addr show` output: not loopback, not link-local IPv6, not on
/// [`INTERFACE`].
pub fn parse_node_ips(json: &str) -> Result<Vec<IpAddr>> {
    let links: serde_json::Value =
        serde_json::from_str(json).map_err(|e| Error::Parse { what: "ip -j addr", reason: e.to_string() })?;
    let mut ips: Vec<IpAddr> = addresses_of(&links)
        .filter(|(name, ip)| {
            name != INTERFACE
                && !ip.is_loopback()
                && !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
        })
        .map(|(_, ip)| ip)
        .collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// Removes weir's virtual services (where the kernel has IPVS), the dummy interface and the
/// ipsets. The iptables chains go with iptables mode's cleanup, which must run first (its
/// rules refer to the sets).
pub fn cleanup(runner: &Runner) -> Result<()> {
    let mut ipvs = Ipvs::new(runner.clone(), Config::default());
    match ipvs.socket() {
        Ok(_) => {
            let node_ips = ipvs.node_ips()?;
            let bound = ipvs.interface_addresses()?;
            // Without state, node-port services are recognised by the node port range, and
            // only where kube-proxy's ipvs mode (interface kube-ipvs0) is not running.
            let (kube, _) = runner.status("ip", &["link", "show", "kube-ipvs0"], None)?;
            let in_range = |port: u16| !kube.success() && NODE_PORT_RANGE.contains(&port);
            let owned = ipvs.read_kernel(&bound, &node_ips, &in_range)?;
            let msgs = messages(&owned, &BTreeMap::new());
            if let Some((socket, family)) = ipvs.socket.as_mut() {
                for msg in &msgs {
                    socket.request(msg, *family, &schema, &describe(msg))?;
                }
            }
        }
        Err(Error::Netlink(netlink::Error::NoFamily(_))) => {
            tracing::info!("the kernel has no IPVS; no virtual services to remove");
        }
        Err(Error::ForeignNamespace) => {
            tracing::info!("not in the target namespace; IPVS virtual services left alone");
        }
        Err(e) => return Err(e),
    }
    let (status, _) = runner.status("ip", &["link", "show", INTERFACE], None)?;
    if status.success() {
        runner.run("ip", &["link", "del", INTERFACE], None)?;
    }
    match runner.status("ipset", &["list", "-n"], None) {
        Ok((status, out)) if status.success() => {
            for name in out.stdout.lines().filter(|n| SETS.iter().any(|(s, _)| s == n)) {
                runner.run("ipset", &["destroy", name], None)?;
            }
        }
        Ok(_) => {}
        Err(e) => tracing::info!(error = %e, "ipset unavailable; no sets to remove"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn id(addr: &str, port: u16) -> ServiceId {
        ServiceId { addr: addr.parse().unwrap(), protocol: Protocol::Tcp, port }
    }

    fn vs(dests: &[(&str, u32)], persistence: Option<u32>) -> VirtualServer {
        VirtualServer {
            scheduler: "rr".into(),
            persistence,
            dests: dests.iter().map(|(a, w)| ((a.parse().unwrap(), 8080), *w)).collect(),
        }
    }

    #[test]
    fn diff_adds_before_it_removes() {
        let old = BTreeMap::from([
            (id("10.96.0.1", 80), vs(&[("10.244.0.1", 1), ("10.244.0.2", 1)], None)),
            (id("10.96.0.2", 80), vs(&[("10.244.0.3", 1)], None)),
        ]);
        let new = BTreeMap::from([
            (id("10.96.0.1", 80), vs(&[("10.244.0.2", 1), ("10.244.0.4", 1)], Some(60))),
            (id("10.96.0.3", 80), vs(&[("10.244.0.5", 1)], None)),
        ]);
        let lines: Vec<String> = messages(&old, &new).iter().map(describe).collect();
        let cmds: Vec<&str> = lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(
            cmds,
            ["SET_SERVICE", "NEW_DEST", "DEL_DEST", "NEW_SERVICE", "NEW_DEST", "DEL_SERVICE"],
            "{lines:#?}"
        );
        assert!(lines[0].contains("flags=0x1/0xffffffff timeout=60"), "{}", lines[0]);
        assert!(lines[2].contains("addr=10.244.0.1"), "{}", lines[2]);
        assert!(messages(&new, &new).is_empty());
    }

    /// One message laid out by hand from `linux/netlink.h`, `linux/genetlink.h` and
    /// `linux/ip_vs.h` (little-endian host), independent of the encoder.
    #[test]
    fn new_service_wire_format() {
        let msg = request(cmd::NEW_SERVICE, vec![service_attrs(&id("10.96.0.10", 80), Some(&vs(&[], None)))]);
        let expected = [
            "68000000",
            "1d00",
            "0500",
            "01000000",
            "00000000",                                 // nlmsghdr: len, type, flags, seq, pid
            "01010000",                                 // genlmsghdr: NEW_SERVICE, version 1
            "54000180",                                 // IPVS_CMD_ATTR_SERVICE | NLA_F_NESTED, 84 bytes
            "0600010002000000",                         // AF = AF_INET
            "0600020006000000",                         // PROTOCOL = IPPROTO_TCP
            "140003000a60000a000000000000000000000000", // ADDR (union nf_inet_addr)
            "0600040000500000",                         // PORT = 80, network order
            "0700060072720000",                         // SCHED_NAME = "rr\0"
            "0c00070000000000ffffffff",                 // FLAGS = {0, ~0}
            "0800080000000000",                         // TIMEOUT = 0
            "08000900ffffffff",                         // NETMASK
        ]
        .concat();
        if cfg!(target_endian = "little") {
            assert_eq!(netlink::hex(&netlink::encode(&msg, 0x1d, 1)), expected);
        }
    }

    #[test]
    fn dumps_parse_back() {
        let (id, v) = (id("10.96.0.1", 80), vs(&[("10.244.0.1", 3)], Some(10800)));
        let msg = request(cmd::NEW_SERVICE, vec![service_attrs(&id, Some(&v))]);
        let bytes = netlink::encode(&msg, 0x20, 1);
        let frames = netlink::decode(&bytes, &schema).unwrap();
        let netlink::Frame::Message(d) = &frames[0] else { panic!("{frames:?}") };
        let (pid, pvs) = parse_service(d.message.get(cmd_attr::SERVICE).unwrap()).unwrap();
        assert_eq!(pid, id);
        assert_eq!(pvs.persistence, Some(10800));
        let msg = request(
            cmd::NEW_DEST,
            vec![service_attrs(&id, None), dest_attrs(&"10.244.0.1".parse().unwrap(), 8080, Some(3))],
        );
        let frames = netlink::decode(&netlink::encode(&msg, 0x20, 2), &schema).unwrap();
        let netlink::Frame::Message(d) = &frames[0] else { panic!("{frames:?}") };
        let dest = parse_dest(d.message.get(cmd_attr::DEST).unwrap(), IpFamily::IPv4).unwrap();
        assert_eq!(dest, (("10.244.0.1".parse().unwrap(), 8080), 3));
    }

    #[test]
    fn node_ips_skip_loopback_link_local_and_the_dummy() {
        let json = r#"[{"ifname":"lo","addr_info":[{"local":"127.0.0.1"},{"local":"::1"}]},
            {"ifname":"eth0","addr_info":[{"local":"192.0.2.1"},{"local":"fe80::1"},{"local":"2001:db8::1"}]},
            {"ifname":"weir-ipvs0","addr_info":[{"local":"10.96.0.1"}]}]"#;
        let ips = parse_node_ips(json).unwrap();
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["192.0.2.1", "2001:db8::1"]);
        assert!(parse_node_ips("not json").is_err());
    }
}
