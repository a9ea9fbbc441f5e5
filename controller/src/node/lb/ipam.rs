//! Address assignment (pure): pools, Services and the addresses they hold → who gets what.
//!
//! [`assign`] is a function of validated [`Pool`]s and [`Request`]s (one per LoadBalancer
//! Service weir handles, each with the addresses it already holds, read back from its status).
//! No I/O, no clocks; the result does not depend on the order of its input. In two passes:
//!
//! 1. **Keep.** Every address a Service holds stays with it while it still fits what the Service
//!    asks for (family, requested address, named pool) and does not clash with an older holder
//!    (creation time, then namespace/name). An address that left every pool (a pool edit) is
//!    kept too, with a [`Note`]: an address in use never moves under a client's feet.
//! 2. **Assign.** Oldest first, each family a Service still lacks gets the requested address,
//!    an address shared with Services of the same `weir.dev/allow-shared-ip` key whose ports do
//!    not collide, or the first free address of the first pool open to it (pools that name the
//!    Service in `serviceAllocation` first, by priority, then the others, by name).
//!
//! A Service that cannot get every family it needs is [`Outcome::Refused`] with a
//! [`Refusal`] saying why, and holds nothing: never a wrong or partial address.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use weir_dataplane::model::ObjectRef;

use super::pool::{self, Pool};
use crate::node::plan::{IpFamily, Protocol};

/// Annotation: the addresses a Service asks for, `ip[,ip]` (one per family).
pub const ANNOTATION_IPS: &str = "weir.dev/load-balancer-ips";
/// Annotation: the pool a Service takes its addresses from.
pub const ANNOTATION_POOL: &str = "weir.dev/address-pool";
/// Annotation: Services with the same value may share an address when their ports differ.
pub const ANNOTATION_SHARED: &str = "weir.dev/allow-shared-ip";
/// The default `spec.loadBalancerClass` weir handles.
pub const DEFAULT_CLASS: &str = "weir.dev/lb";

/// Which Services are weir's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassConfig {
    /// The `spec.loadBalancerClass` weir handles.
    pub class: String,
    /// Handle only Services naming that class (not those without a class).
    pub class_required: bool,
}

impl Default for ClassConfig {
    fn default() -> Self {
        ClassConfig { class: DEFAULT_CLASS.to_string(), class_required: false }
    }
}

impl ClassConfig {
    /// Whether weir assigns `svc`'s addresses: `type: LoadBalancer`, and its class is weir's
    /// (or it has none and a class is not required).
    pub fn handles(&self, svc: &Service) -> bool {
        let Some(spec) = &svc.spec else { return false };
        if spec.type_.as_deref() != Some("LoadBalancer") {
            return false;
        }
        match spec.load_balancer_class.as_deref() {
            Some(class) => class == self.class,
            None => !self.class_required,
        }
    }
}

// === the input ===

/// One Service as the assignment sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The Service.
    pub service: ObjectRef,
    /// Its creation time (older Services win clashes); `None` sorts first (manifests).
    pub created: Option<Time>,
    /// Its labels (for `serviceSelectors`).
    pub labels: BTreeMap<String, String>,
    /// Its namespace's labels (for `namespaceSelectors`).
    pub namespace_labels: BTreeMap<String, String>,
    /// The families it needs, in order.
    pub families: Vec<IpFamily>,
    /// Families it may go without (`PreferDualStack`: the second family).
    pub optional: BTreeSet<IpFamily>,
    /// Addresses it asks for (at most one per family).
    pub requested: Vec<IpAddr>,
    /// The pool it names.
    pub pool: Option<String>,
    /// Its sharing key.
    pub sharing_key: Option<String>,
    /// Its ports.
    pub ports: BTreeSet<(Protocol, u16)>,
    /// For `externalTrafficPolicy: Local`, its selector: it shares only with Services selecting
    /// the same pods (each node must hold endpoints of every Service on the address).
    pub local_selector: Option<BTreeMap<String, String>>,
    /// The addresses it holds now (its status, or what the last assignment gave it).
    pub current: Vec<IpAddr>,
    /// Why its annotations or fields cannot be followed (it is refused).
    pub invalid: Option<String>,
}

impl Request {
    /// The request of `svc`, which lives in a namespace labelled `namespace_labels`.
    pub fn from_service(svc: &Service, namespace_labels: &BTreeMap<String, String>) -> Request {
        let meta = &svc.metadata;
        let spec = svc.spec.clone().unwrap_or_default();
        let annotations = meta.annotations.clone().unwrap_or_default();
        let mut invalid = None;
        let mut requested = Vec::new();
        let asked = annotations
            .get(ANNOTATION_IPS)
            .map(|s| (ANNOTATION_IPS, s.as_str()))
            .or(spec.load_balancer_ip.as_deref().map(|s| ("spec.loadBalancerIP", s)))
            .filter(|(_, s)| !s.trim().is_empty());
        if let Some((field, text)) = asked {
            for part in text.split(',').map(str::trim) {
                match part.parse::<IpAddr>() {
                    Ok(ip) if requested.iter().any(|r: &IpAddr| r.is_ipv4() == ip.is_ipv4()) => {
                        invalid = Some(format!("{field} {text:?} asks for two addresses of one family"));
                    }
                    Ok(ip) => requested.push(ip),
                    Err(_) => invalid = Some(format!("{field} {text:?}: {part:?} is not an IP address")),
                }
            }
        }
        let listed: Vec<IpFamily> = spec
            .ip_families
            .iter()
            .flatten()
            .filter_map(|f| match f.as_str() {
                "IPv4" => Some(IpFamily::IPv4),
                "IPv6" => Some(IpFamily::IPv6),
                _ => None,
            })
            .collect();
        let policy = spec.ip_family_policy.as_deref().unwrap_or("SingleStack");
        let mut optional = BTreeSet::new();
        let families: Vec<IpFamily> = if !requested.is_empty() {
            requested.iter().map(IpFamily::of).collect()
        } else if listed.is_empty() {
            vec![IpFamily::IPv4]
        } else if policy == "SingleStack" {
            listed[..1].to_vec()
        } else {
            if policy == "PreferDualStack" {
                optional.extend(listed.iter().skip(1).copied());
            }
            listed
        };
        let mut ports = BTreeSet::new();
        for p in spec.ports.iter().flatten() {
            match (Protocol::parse(p.protocol.as_deref()), u16::try_from(p.port)) {
                (Some(protocol), Ok(port)) => {
                    ports.insert((protocol, port));
                }
                _ => invalid = Some(format!("port {:?}/{:?} is not a valid port", p.port, p.protocol)),
            }
        }
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let current = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
            .collect();
        let text = |key: &str| annotations.get(key).map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        Request {
            service: crate::snapshot::key(meta),
            created: meta.creation_timestamp.clone(),
            labels: meta.labels.clone().unwrap_or_default(),
            namespace_labels: namespace_labels.clone(),
            families,
            optional,
            requested,
            pool: text(ANNOTATION_POOL),
            sharing_key: text(ANNOTATION_SHARED),
            ports,
            local_selector: local.then(|| spec.selector.clone().unwrap_or_default()),
            current,
            invalid,
        }
    }

    fn namespace(&self) -> &str {
        &self.service.namespace
    }
}

// === the output ===

/// What one Service gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its addresses, one per family, in the order of its families.
    Assigned(Vec<IpAddr>),
    /// Nothing, and why.
    Refused(Refusal),
}

/// Why a Service gets no address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its annotations or fields cannot be followed.
    Invalid(String),
    /// It asks for an address no pool holds.
    NotInAnyPool(IpAddr),
    /// It asks for an address outside the pool it names.
    NotInNamedPool(IpAddr, String),
    /// It names a pool that does not exist (or is refused).
    NoSuchPool(String),
    /// The pool's `serviceAllocation` does not include it.
    PoolNotAllowed(String),
    /// The address it asks for is held by another Service it may not share with.
    Taken(IpAddr, ObjectRef),
    /// It shares its key with the holder of the address, but a port collides.
    PortsCollide {
        /// The address.
        ip: IpAddr,
        /// The Service holding it.
        with: ObjectRef,
        /// The port both use.
        port: (Protocol, u16),
    },
    /// Every pool open to it is full (or none has addresses of the family).
    Exhausted(IpFamily),
}

impl Refusal {
    /// A short CamelCase reason (the Event's `reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Invalid(_) => "InvalidLoadBalancerRequest",
            Refusal::NotInAnyPool(_) | Refusal::NotInNamedPool(..) => "AddressNotInPool",
            Refusal::NoSuchPool(_) => "NoSuchPool",
            Refusal::PoolNotAllowed(_) => "PoolNotAllowed",
            Refusal::Taken(..) => "AddressTaken",
            Refusal::PortsCollide { .. } => "SharedPortsCollide",
            Refusal::Exhausted(_) => "PoolExhausted",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Invalid(why) => write!(f, "{why}"),
            Refusal::NotInAnyPool(ip) => write!(f, "the requested address {ip} is in no IPAddressPool"),
            Refusal::NotInNamedPool(ip, pool) => {
                write!(f, "the requested address {ip} is not in IPAddressPool {pool} ({ANNOTATION_POOL})")
            }
            Refusal::NoSuchPool(pool) => {
                write!(f, "IPAddressPool {pool} ({ANNOTATION_POOL}) does not exist or is invalid")
            }
            Refusal::PoolNotAllowed(pool) => {
                write!(f, "IPAddressPool {pool}'s serviceAllocation does not include this Service")
            }
            Refusal::Taken(ip, by) => write!(
                f,
                "the requested address {ip} is held by Service {by} (sharing needs the same {ANNOTATION_SHARED} on both)"
            ),
            Refusal::PortsCollide { ip, with, port } => write!(
                f,
                "the address {ip} is shared with Service {with}, which uses port {}/{} too",
                port.1,
                port.0.as_str()
            ),
            Refusal::Exhausted(family) => {
                write!(f, "no IPAddressPool open to this Service has a free {family:?} address")
            }
        }
    }
}

/// A warning about an assignment that stands.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Note {
    /// The Service concerned.
    pub service: ObjectRef,
    /// What to know.
    pub message: String,
}

/// Addresses of one pool assigned and free, per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Assigned IPv4 addresses.
    pub assigned_v4: u128,
    /// Assigned IPv6 addresses.
    pub assigned_v6: u128,
    /// Free IPv4 addresses.
    pub available_v4: u128,
    /// Free IPv6 addresses.
    pub available_v6: u128,
}

/// The result of [`assign`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Per Service.
    pub services: BTreeMap<ObjectRef, Outcome>,
    /// Warnings on assignments that stand (an address in use that left every pool).
    pub notes: Vec<Note>,
    /// Per valid pool, by name.
    pub usage: BTreeMap<String, Usage>,
}

impl Assignment {
    /// The addresses of `service`, empty when it has none.
    pub fn addresses(&self, service: &ObjectRef) -> &[IpAddr] {
        match self.services.get(service) {
            Some(Outcome::Assigned(ips)) => ips,
            _ => &[],
        }
    }
}

// === the assignment ===

/// Who holds each address (indexes into the sorted requests).
type Held = BTreeMap<IpAddr, Vec<usize>>;

/// Assigns addresses from `pools` (validated, see [`pool::validate`]) to `requests`.
pub fn assign(pools: &[Pool], requests: &[Request]) -> Assignment {
    let mut order: Vec<&Request> = requests.iter().collect();
    order.sort_by(|a, b| (&a.created, &a.service).cmp(&(&b.created, &b.service)));
    order.dedup_by(|a, b| a.service == b.service);
    let mut pools: Vec<&Pool> = pools.iter().collect();
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    let mut held: Held = BTreeMap::new();
    let mut notes = Vec::new();

    // 1. Keep what is held and still fits.
    let mut kept: Vec<Vec<IpAddr>> = vec![Vec::new(); order.len()];
    for (i, r) in order.iter().enumerate() {
        if r.invalid.is_some() {
            continue;
        }
        for &ip in &r.current {
            let family = IpFamily::of(&ip);
            if !r.families.contains(&family) || kept[i].iter().any(|k| IpFamily::of(k) == family) {
                continue;
            }
            if !r.requested.is_empty() && !r.requested.contains(&ip) {
                continue; // it asks for another address now
            }
            let home = pools.iter().find(|p| p.contains(ip));
            if let Some(name) = &r.pool
                && home.is_none_or(|p| &p.name != name)
            {
                continue; // it names another pool now
            }
            let holders = held.get(&ip).map(Vec::as_slice).unwrap_or_default();
            if holders.iter().any(|&h| clash(r, order[h]).is_some()) {
                continue; // an older Service holds it
            }
            if home.is_none() {
                notes.push(Note {
                    service: r.service.clone(),
                    message: format!(
                        "the address {ip} is in no IPAddressPool any more; the Service keeps it until it lets it go"
                    ),
                });
            }
            kept[i].push(ip);
            held.entry(ip).or_default().push(i);
        }
    }

    // 2. Assign what is missing, oldest first.
    let mut services = BTreeMap::new();
    for (i, r) in order.iter().enumerate() {
        let outcome = match complete(i, r, &kept[i], &pools, &order, &mut held) {
            Ok(ips) => Outcome::Assigned(ips),
            Err(refusal) => {
                for ip in &kept[i] {
                    release(&mut held, *ip, i);
                }
                Outcome::Refused(refusal)
            }
        };
        services.insert(r.service.clone(), outcome);
    }

    let usage = pools.iter().map(|p| (p.name.clone(), usage(p, &held))).collect();
    notes.sort();
    Assignment { services, notes, usage }
}

/// The addresses of request `i`, one per family it needs: what it kept, plus new ones (added to
/// `held`); or why it gets none (its new ones released again).
fn complete(
    i: usize,
    r: &Request,
    kept: &[IpAddr],
    pools: &[&Pool],
    order: &[&Request],
    held: &mut Held,
) -> Result<Vec<IpAddr>, Refusal> {
    if let Some(why) = &r.invalid {
        return Err(Refusal::Invalid(why.clone()));
    }
    let mut out = Vec::new();
    let mut added = Vec::new();
    let mut result = Ok(());
    for &family in &r.families {
        if let Some(ip) = kept.iter().find(|ip| IpFamily::of(ip) == family) {
            out.push(*ip);
            continue;
        }
        match pick(r, family, pools, order, held) {
            Ok(ip) => {
                held.entry(ip).or_default().push(i);
                added.push(ip);
                out.push(ip);
            }
            Err(_) if r.optional.contains(&family) => {}
            Err(refusal) => {
                result = Err(refusal);
                break;
            }
        }
    }
    match result {
        Ok(()) => Ok(out),
        Err(refusal) => {
            for ip in added {
                release(held, ip, i);
            }
            Err(refusal)
        }
    }
}

fn release(held: &mut Held, ip: IpAddr, i: usize) {
    if let Some(holders) = held.get_mut(&ip) {
        holders.retain(|&h| h != i);
        if holders.is_empty() {
            held.remove(&ip);
        }
    }
}

/// One new address of `family` for `r`.
fn pick(
    r: &Request,
    family: IpFamily,
    pools: &[&Pool],
    order: &[&Request],
    held: &Held,
) -> Result<IpAddr, Refusal> {
    if let Some(&ip) = r.requested.iter().find(|ip| IpFamily::of(ip) == family) {
        let Some(home) = pools.iter().find(|p| p.usable(ip)) else {
            return Err(Refusal::NotInAnyPool(ip));
        };
        if let Some(name) = &r.pool
            && &home.name != name
        {
            return Err(Refusal::NotInNamedPool(ip, name.clone()));
        }
        if !allows(home, r) {
            return Err(Refusal::PoolNotAllowed(home.name.clone()));
        }
        let holders = held.get(&ip).map(Vec::as_slice).unwrap_or_default();
        if let Some(refusal) = holders.iter().find_map(|&h| clash(r, order[h]).map(|c| c.refusal(ip))) {
            return Err(refusal);
        }
        return Ok(ip);
    }
    let candidates: Vec<&Pool> = match &r.pool {
        Some(name) => {
            let Some(p) = pools.iter().find(|p| &p.name == name) else {
                return Err(Refusal::NoSuchPool(name.clone()));
            };
            if !allows(p, r) {
                return Err(Refusal::PoolNotAllowed(name.clone()));
            }
            vec![*p]
        }
        None => {
            let mut open: Vec<&Pool> =
                pools.iter().copied().filter(|p| p.auto_assign && allows(p, r)).collect();
            // serviceAllocation pools first, by priority (unset last), then by name.
            open.sort_by_key(|p| {
                let a = p.allocation.as_ref();
                (a.is_none(), a.and_then(|a| a.priority).map_or((1, 0), |n| (0, n)), p.name.clone())
            });
            open
        }
    };
    let candidates: Vec<&Pool> = candidates.into_iter().filter(|p| p.has_family(family)).collect();
    // An address already shared under the same key, if the ports allow.
    if r.sharing_key.is_some() {
        for (ip, holders) in held.iter() {
            if IpFamily::of(ip) == family
                && candidates.iter().any(|p| p.usable(*ip))
                && holders.iter().all(|&h| clash(r, order[h]).is_none())
            {
                return Ok(*ip);
            }
        }
    }
    for p in candidates {
        if let Some(ip) = first_free(p, family, held) {
            return Ok(ip);
        }
    }
    Err(Refusal::Exhausted(family))
}

/// The first address of `family` in `pool` that it hands out and nobody holds.
fn first_free(pool: &Pool, family: IpFamily, held: &Held) -> Option<IpAddr> {
    for range in pool.ranges.iter().filter(|r| r.family == family) {
        let mut n = range.first;
        loop {
            let ip = pool::to_ip(family, n);
            if pool.usable(ip) && !held.contains_key(&ip) {
                return Some(ip);
            }
            if n == range.last {
                break;
            }
            n += 1;
        }
    }
    None
}

/// Whether `pool`'s `serviceAllocation` lets `r` use it.
fn allows(pool: &Pool, r: &Request) -> bool {
    let Some(a) = &pool.allocation else { return true };
    (a.namespaces.is_empty() || a.namespaces.iter().any(|n| n == r.namespace()))
        && (a.namespace_selectors.is_empty()
            || a.namespace_selectors.iter().any(|s| s.matches(&r.namespace_labels)))
        && (a.service_selectors.is_empty() || a.service_selectors.iter().any(|s| s.matches(&r.labels)))
}

/// Why `r` cannot share an address with `other`.
enum Clash<'a> {
    /// Not the same sharing key (or none), or incompatible traffic policies.
    Key(&'a ObjectRef),
    /// The same key, and a port in common.
    Port(&'a ObjectRef, (Protocol, u16)),
}

impl Clash<'_> {
    fn refusal(&self, ip: IpAddr) -> Refusal {
        match self {
            Clash::Key(with) => Refusal::Taken(ip, (*with).clone()),
            Clash::Port(with, port) => Refusal::PortsCollide { ip, with: (*with).clone(), port: *port },
        }
    }
}

fn clash<'a>(r: &Request, other: &'a Request) -> Option<Clash<'a>> {
    if r.service == other.service {
        return None;
    }
    let same_key = r.sharing_key.is_some() && r.sharing_key == other.sharing_key;
    let policies_fit = match (&r.local_selector, &other.local_selector) {
        (None, None) => true,
        (Some(a), Some(b)) => a == b,
        _ => false,
    };
    if !same_key || !policies_fit {
        return Some(Clash::Key(&other.service));
    }
    r.ports.intersection(&other.ports).next().map(|port| Clash::Port(&other.service, *port))
}

/// How many of `pool`'s addresses are held and free, per family.
fn usage(pool: &Pool, held: &Held) -> Usage {
    let mut u = Usage::default();
    for range in &pool.ranges {
        let mut total = range.len();
        if pool.avoid_buggy_ips && range.family == IpFamily::IPv4 {
            total -=
                count_last_octet(range.first, range.last, 0) + count_last_octet(range.first, range.last, 255);
        }
        let assigned = held
            .range(pool::to_ip(range.family, range.first)..=pool::to_ip(range.family, range.last))
            .filter(|(ip, _)| pool.usable(**ip))
            .count() as u128;
        let (a, f) = match range.family {
            IpFamily::IPv4 => (&mut u.assigned_v4, &mut u.available_v4),
            IpFamily::IPv6 => (&mut u.assigned_v6, &mut u.available_v6),
        };
        *a += assigned;
        *f = f.saturating_add(total.saturating_sub(assigned));
    }
    u
}

/// How many numbers in `first..=last` end in the byte `octet`.
fn count_last_octet(first: u128, last: u128, octet: u128) -> u128 {
    // Numbers n <= x with n % 256 == octet.
    let upto = |x: u128| if x < octet { 0 } else { (x - octet) / 256 + 1 };
    upto(last) - if first == 0 { 0 } else { upto(first - 1) }
}

#[cfg(test)]
mod tests;
