//! The `IPAddressPool` custom resource (`weir.dev/v1alpha1`, cluster-scoped) and its validation.
//!
//! [`IpAddressPool`] is the wire format, as the API server stores it; [`Pool`] is the validated
//! model the address assignment ([`super::ipam`]) reads. [`validate`] turns a list of the one
//! into the other: a pool with a bad address, an inverted range or ranges overlapping each other
//! or an older pool's is refused as a whole with a [`PoolError`] saying why, and the others keep
//! working.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use serde::{Deserialize, Serialize};

use crate::node::plan::IpFamily;

/// The API group of weir's custom resources.
pub const GROUP: &str = "weir.dev";
/// The version of `IPAddressPool`.
pub const VERSION: &str = "v1alpha1";
/// The kind.
pub const KIND: &str = "IPAddressPool";
/// The resource name (plural).
pub const PLURAL: &str = "ipaddresspools";

// === the wire format ===

/// `IPAddressPool`: addresses weir may give to LoadBalancer Services.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpAddressPool {
    /// `weir.dev/v1alpha1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `IPAddressPool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard object metadata (the pool is cluster-scoped: no namespace).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the pool holds and who may use it.
    #[serde(default)]
    pub spec: IpAddressPoolSpec,
    /// Counts written by the assigning replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<IpAddressPoolStatus>,
}

/// `spec` of an [`IpAddressPool`]. Unknown fields are errors (a misspelt `autoAssign` must not
/// pass unnoticed in `--manifests` mode; the API server prunes them by the CRD's schema).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpAddressPoolSpec {
    /// CIDRs (`192.0.2.0/28`, `2001:db8::/120`) and inclusive ranges (`192.0.2.10-192.0.2.20`).
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Whether Services that ask for nothing in particular get addresses from this pool
    /// (default true). A pool with `false` serves only Services that name it or one of its
    /// addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_assign: Option<bool>,
    /// Skip IPv4 addresses ending in `.0` and `.255` (some clients treat them as broadcast).
    #[serde(default, rename = "avoidBuggyIPs", skip_serializing_if = "Option::is_none")]
    pub avoid_buggy_ips: Option<bool>,
    /// Which Services may use the pool and in which order pools are tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
}

/// `spec.serviceAllocation`: which Services the pool serves, and its priority.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAllocation {
    /// Lower numbers are tried first (pools without a priority come after those with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Namespaces whose Services may use the pool (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces, by label, whose Services may use the pool (any one selector matching).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_selectors: Vec<LabelSelector>,
    /// Services, by label, that may use the pool (any one selector matching).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}

/// `status` of an [`IpAddressPool`]: addresses assigned and still available, per family.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpAddressPoolStatus {
    /// IPv4 addresses of the pool assigned to Services.
    #[serde(default, rename = "assignedIPv4")]
    pub assigned_ipv4: u64,
    /// IPv6 addresses of the pool assigned to Services.
    #[serde(default, rename = "assignedIPv6")]
    pub assigned_ipv6: u64,
    /// IPv4 addresses still free.
    #[serde(default, rename = "availableIPv4")]
    pub available_ipv4: u64,
    /// IPv6 addresses still free (capped at 2^63-1).
    #[serde(default, rename = "availableIPv6")]
    pub available_ipv6: u64,
    /// Why weir refuses the pool (empty when it is in use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl kube::Resource for IpAddressPool {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

// === address ranges ===

/// An inclusive range of addresses of one family, as numbers (IPv4 in the low 32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddressRange {
    /// The family of both ends.
    pub family: IpFamily,
    /// The first address.
    pub first: u128,
    /// The last address (`>= first`).
    pub last: u128,
}

/// Why an entry of `spec.addresses` is not an address range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Neither `ADDRESS/PREFIX` nor `FIRST-LAST`.
    #[error("{0:?} is neither a CIDR (192.0.2.0/24) nor a range (192.0.2.10-192.0.2.20)")]
    Syntax(String),
    /// An address that does not parse.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// A prefix length beyond the family's bits.
    #[error("{0:?}: the prefix length is out of range")]
    Prefix(String),
    /// A CIDR with host bits set (`192.0.2.5/24`): ambiguous, so refused.
    #[error("{given:?} has host bits set: did you mean {network}?")]
    HostBits {
        /// As written.
        given: String,
        /// The network it is in.
        network: String,
    },
    /// A range whose ends are of different families.
    #[error("{0:?} mixes IPv4 and IPv6")]
    MixedFamilies(String),
    /// A range whose first address is after its last.
    #[error("{0:?}: the first address is after the last")]
    Inverted(String),
}

fn to_number(ip: IpAddr) -> (IpFamily, u128) {
    match ip {
        IpAddr::V4(v4) => (IpFamily::IPv4, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (IpFamily::IPv6, u128::from(v6)),
    }
}

/// The address `n` of `family` (`n` must fit the family: IPv4 numbers beyond 32 bits wrap).
pub fn to_ip(family: IpFamily, n: u128) -> IpAddr {
    match family {
        IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// An address as (family, number).
pub fn number(ip: IpAddr) -> (IpFamily, u128) {
    to_number(ip)
}

impl AddressRange {
    /// Parses one entry of `spec.addresses`: `ADDRESS/PREFIX` or `FIRST-LAST` (inclusive),
    /// spaces around `-` allowed.
    pub fn parse(s: &str) -> Result<AddressRange, RangeError> {
        let given = s.trim();
        let address = |a: &str| a.trim().parse::<IpAddr>().map_err(|_| RangeError::Address(a.trim().into()));
        if let Some((addr, prefix)) = given.split_once('/') {
            let (family, n) = to_number(address(addr)?);
            let bits = match family {
                IpFamily::IPv4 => 32u32,
                IpFamily::IPv6 => 128,
            };
            let prefix: u32 = prefix.trim().parse().map_err(|_| RangeError::Prefix(given.into()))?;
            if prefix > bits {
                return Err(RangeError::Prefix(given.into()));
            }
            let host_bits = bits - prefix;
            let host_mask = if host_bits == 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
            let first = n & !host_mask;
            if first != n {
                return Err(RangeError::HostBits {
                    given: given.into(),
                    network: format!("{}/{prefix}", to_ip(family, first)),
                });
            }
            return Ok(AddressRange { family, first, last: first | host_mask });
        }
        let (a, b) = given.split_once('-').ok_or_else(|| RangeError::Syntax(given.into()))?;
        let ((fa, first), (fb, last)) = (to_number(address(a)?), to_number(address(b)?));
        if fa != fb {
            return Err(RangeError::MixedFamilies(given.into()));
        }
        if first > last {
            return Err(RangeError::Inverted(given.into()));
        }
        Ok(AddressRange { family: fa, first, last })
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let (family, n) = to_number(ip);
        family == self.family && self.first <= n && n <= self.last
    }

    /// The number of addresses (saturating at `u128::MAX`).
    pub fn len(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    /// Never empty (`first <= last`); here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", to_ip(self.family, self.first), to_ip(self.family, self.last))
    }
}

// === the validated model ===

/// A validated pool: what the address assignment reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// The pool's name.
    pub name: String,
    /// Its ranges, sorted.
    pub ranges: Vec<AddressRange>,
    /// `spec.autoAssign` (default true).
    pub auto_assign: bool,
    /// `spec.avoidBuggyIPs`.
    pub avoid_buggy_ips: bool,
    /// `spec.serviceAllocation`, when given.
    pub allocation: Option<Allocation>,
}

/// A validated `spec.serviceAllocation`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// Lower first; `None` after every number.
    pub priority: Option<i32>,
    /// Allowed namespaces (empty: no restriction by name).
    pub namespaces: Vec<String>,
    /// Namespace label selectors (empty: no restriction by namespace label).
    pub namespace_selectors: Vec<Selector>,
    /// Service label selectors (empty: no restriction by Service label).
    pub service_selectors: Vec<Selector>,
}

/// A label selector, parsed and checked: `matchLabels` and `matchExpressions` (`In`, `NotIn`,
/// `Exists`, `DoesNotExist`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// Parses a Kubernetes `LabelSelector`; an unknown operator, or `In`/`NotIn` without
    /// values, is an error.
    pub fn parse(selector: &LabelSelector) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        for (k, v) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement::In(k.clone(), vec![v.clone()]));
        }
        for e in selector.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            let r = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!("operator {} of key {:?} needs values", e.operator, e.key));
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                other => {
                    return Err(format!(
                        "unknown operator {other:?} of key {:?} (In, NotIn, Exists, DoesNotExist)",
                        e.key
                    ));
                }
            };
            requirements.push(r);
        }
        Ok(Selector { requirements })
    }

    /// Whether `labels` satisfy every requirement (an empty selector matches everything).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

impl Pool {
    /// Whether `ip` is one of the pool's addresses (ignoring `avoidBuggyIPs`).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    /// Whether the pool hands out `ip` (in a range, and not a `.0`/`.255` it avoids).
    pub fn usable(&self, ip: IpAddr) -> bool {
        self.contains(ip) && !(self.avoid_buggy_ips && buggy(ip))
    }

    /// Whether the pool has addresses of `family`.
    pub fn has_family(&self, family: IpFamily) -> bool {
        self.ranges.iter().any(|r| r.family == family)
    }
}

/// An IPv4 address ending in `.0` or `.255`.
pub fn buggy(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => matches!(v4.octets()[3], 0 | 255),
        IpAddr::V6(_) => false,
    }
}

/// Why a pool is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("IPAddressPool {pool}: {reason}")]
pub struct PoolError {
    /// The pool.
    pub pool: String,
    /// Why.
    pub reason: String,
}

/// Validates one pool on its own: addresses parse, no two of its ranges overlap, selectors
/// are well-formed.
pub fn parse_pool(pool: &IpAddressPool) -> Result<Pool, PoolError> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let err = |reason: String| PoolError { pool: name.clone(), reason };
    if name.is_empty() {
        return Err(err("metadata.name is missing".into()));
    }
    let spec = &pool.spec;
    if spec.addresses.is_empty() {
        return Err(err("spec.addresses is empty".into()));
    }
    let mut ranges = Vec::with_capacity(spec.addresses.len());
    for (i, entry) in spec.addresses.iter().enumerate() {
        let range = AddressRange::parse(entry).map_err(|e| err(format!("spec.addresses[{i}]: {e}")))?;
        if let Some(other) = ranges.iter().find(|r: &&AddressRange| r.overlaps(&range)) {
            return Err(err(format!("spec.addresses[{i}] {range} overlaps {other}")));
        }
        ranges.push(range);
    }
    ranges.sort();
    let allocation = match &spec.service_allocation {
        None => None,
        Some(a) => {
            let parse_all = |field: &str, selectors: &[LabelSelector]| -> Result<Vec<Selector>, PoolError> {
                selectors
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        Selector::parse(s)
                            .map_err(|e| err(format!("spec.serviceAllocation.{field}[{i}]: {e}")))
                    })
                    .collect()
            };
            Some(Allocation {
                priority: a.priority,
                namespaces: a.namespaces.clone(),
                namespace_selectors: parse_all("namespaceSelectors", &a.namespace_selectors)?,
                service_selectors: parse_all("serviceSelectors", &a.service_selectors)?,
            })
        }
    };
    Ok(Pool {
        name,
        ranges,
        auto_assign: spec.auto_assign.unwrap_or(true),
        avoid_buggy_ips: spec.avoid_buggy_ips.unwrap_or(false),
        allocation,
    })
}

/// The pools that can be used, sorted by name, and an error for each that cannot.
///
/// Pools are checked oldest first (creation time, then name): a pool whose addresses overlap an
/// older valid pool's is refused, so adding a pool never takes addresses from one in use.
pub fn validate(pools: &[IpAddressPool]) -> (Vec<Pool>, Vec<PoolError>) {
    let mut order: Vec<&IpAddressPool> = pools.iter().collect();
    let created = |p: &IpAddressPool| p.metadata.creation_timestamp.clone().map(|Time(t)| t);
    order.sort_by(|a, b| {
        // Pools without a timestamp (manifests) sort by name only.
        (created(a), &a.metadata.name).cmp(&(created(b), &b.metadata.name))
    });
    let mut valid: Vec<Pool> = Vec::new();
    let mut errors = Vec::new();
    for raw in order {
        let pool = match parse_pool(raw) {
            Ok(pool) => pool,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if let Some(e) = valid.iter().find(|v| v.name == pool.name) {
            errors.push(PoolError { pool: pool.name.clone(), reason: format!("defined twice ({})", e.name) });
            continue;
        }
        let clash = valid.iter().find_map(|v| {
            v.ranges.iter().find_map(|a| pool.ranges.iter().find(|b| a.overlaps(b)).map(|b| (v, a, b)))
        });
        if let Some((older, a, b)) = clash {
            errors.push(PoolError {
                pool: pool.name.clone(),
                reason: format!("{b} overlaps {a} of IPAddressPool {}, which is older", older.name),
            });
            continue;
        }
        valid.push(pool);
    }
    valid.sort_by(|a, b| a.name.cmp(&b.name));
    errors.sort_by(|a, b| a.pool.cmp(&b.pool));
    (valid, errors)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool(name: &str, addresses: &[&str]) -> IpAddressPool {
        IpAddressPool {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: IpAddressPoolSpec {
                addresses: addresses.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn ranges_parse_in_both_families() {
        let r = AddressRange::parse("192.0.2.0/30").unwrap();
        assert_eq!((r.to_string(), r.len()), ("192.0.2.0-192.0.2.3".to_string(), 4));
        let r = AddressRange::parse(" 192.0.2.10 - 192.0.2.20 ").unwrap();
        assert_eq!((r.family, r.len()), (IpFamily::IPv4, 11));
        let r = AddressRange::parse("2001:db8::/120").unwrap();
        assert_eq!((r.to_string(), r.len()), ("2001:db8::-2001:db8::ff".to_string(), 256));
        let r = AddressRange::parse("2001:db8::5-2001:db8::5").unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(AddressRange::parse("10.0.0.7/32").unwrap().len(), 1);
        assert_eq!(AddressRange::parse("::/0").unwrap().len(), u128::MAX);
        assert_eq!(AddressRange::parse("0.0.0.0/0").unwrap().len(), 1 << 32);
        assert!(AddressRange::parse("192.0.2.0/30").unwrap().contains("192.0.2.3".parse().unwrap()));
        assert!(!AddressRange::parse("192.0.2.0/30").unwrap().contains("192.0.2.4".parse().unwrap()));
        assert!(!AddressRange::parse("::/0").unwrap().contains("192.0.2.4".parse().unwrap()));
    }

    #[test]
    fn bad_ranges_say_why() {
        let e = |s: &str| AddressRange::parse(s).unwrap_err().to_string();
        assert!(e("192.0.2.0").contains("neither a CIDR"), "{}", e("192.0.2.0"));
        assert!(e("192.0.2.0/33").contains("prefix length"));
        assert!(e("192.0.2.0/x").contains("prefix length"));
        assert!(e("192.0.2.300/24").contains("not an IP address"));
        assert_eq!(e("192.0.2.5/24"), "\"192.0.2.5/24\" has host bits set: did you mean 192.0.2.0/24?");
        assert!(e("192.0.2.9-192.0.2.1").contains("first address is after the last"));
        assert!(e("192.0.2.1-2001:db8::1").contains("mixes IPv4 and IPv6"));
        assert!(e("fd00::1-fd00::zz").contains("not an IP address"));
    }

    #[test]
    fn a_bad_pool_is_refused_and_the_others_work() {
        let mut older = pool("a-old", &["192.0.2.0/28"]);
        older.metadata.creation_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        let mut newer = pool("0-new", &["192.0.2.8-192.0.2.20"]);
        newer.metadata.creation_timestamp = Some(Time("2026-02-01T00:00:00Z".parse().unwrap()));
        let pools = vec![
            newer,
            older,
            pool("self-overlap", &["198.51.100.0/24", "198.51.100.7-198.51.100.9"]),
            pool("bad-cidr", &["198.51.100.0/24", "10.0.0.1/40"]),
            pool("empty", &[]),
            pool("v6", &["2001:db8::/120", "10.9.0.0/24"]),
        ];
        let (valid, errors) = validate(&pools);
        let names: Vec<&str> = valid.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a-old", "v6"]);
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "IPAddressPool 0-new: 192.0.2.8-192.0.2.20 overlaps 192.0.2.0-192.0.2.15 of IPAddressPool a-old, which is older",
                "IPAddressPool bad-cidr: spec.addresses[1]: \"10.0.0.1/40\": the prefix length is out of range",
                "IPAddressPool empty: spec.addresses is empty",
                "IPAddressPool self-overlap: spec.addresses[1] 198.51.100.7-198.51.100.9 overlaps 198.51.100.0-198.51.100.255",
            ]
        );
        let v6 = &valid[1];
        assert!(v6.has_family(IpFamily::IPv4) && v6.has_family(IpFamily::IPv6));
        assert!(v6.auto_assign && !v6.avoid_buggy_ips);
    }

    #[test]
    fn the_wire_format_reads_the_crd_fields() {
        let yaml = r#"
apiVersion: weir.dev/v1alpha1
kind: IPAddressPool
metadata: {name: lan}
spec:
  addresses: [192.0.2.0/24, "2001:db8::10-2001:db8::20"]
  autoAssign: false
  avoidBuggyIPs: true
  serviceAllocation:
    priority: 10
    namespaces: [shop]
    namespaceSelectors: [{matchLabels: {team: web}}]
    serviceSelectors:
    - matchExpressions: [{key: tier, operator: In, values: [edge]}]
"#;
        let raw: IpAddressPool = serde_saphyr::from_str(yaml).unwrap();
        let p = parse_pool(&raw).unwrap();
        assert!(!p.auto_assign && p.avoid_buggy_ips);
        assert!(p.usable("192.0.2.1".parse().unwrap()) && !p.usable("192.0.2.255".parse().unwrap()));
        assert!(p.contains("192.0.2.0".parse().unwrap()) && !p.usable("192.0.2.0".parse().unwrap()));
        let a = p.allocation.unwrap();
        assert_eq!((a.priority, a.namespaces.as_slice()), (Some(10), ["shop".to_string()].as_slice()));
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(a.namespace_selectors[0].matches(&labels(&[("team", "web"), ("x", "y")])));
        assert!(!a.namespace_selectors[0].matches(&labels(&[("team", "db")])));
        assert!(a.service_selectors[0].matches(&labels(&[("tier", "edge")])));
        assert!(!a.service_selectors[0].matches(&labels(&[])));
        // Counts serialise under the CRD's names.
        let status = IpAddressPoolStatus { assigned_ipv4: 1, available_ipv6: 2, ..Default::default() };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!((json["assignedIPv4"].as_u64(), json["availableIPv6"].as_u64()), (Some(1), Some(2)));
    }

    #[test]
    fn selectors_check_their_operators() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let expr = |op: &str, values: Option<Vec<String>>| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: op.into(),
                values,
            }]),
            ..Default::default()
        };
        assert!(Selector::parse(&expr("Matches", None)).unwrap_err().contains("unknown operator"));
        assert!(Selector::parse(&expr("In", None)).unwrap_err().contains("needs values"));
        let not_in = Selector::parse(&expr("NotIn", Some(vec!["a".into()]))).unwrap();
        let labels = |v: &str| BTreeMap::from([("k".to_string(), v.to_string())]);
        assert!(not_in.matches(&labels("b")) && !not_in.matches(&labels("a")));
        assert!(not_in.matches(&BTreeMap::new()));
        let gone = Selector::parse(&expr("DoesNotExist", None)).unwrap();
        assert!(gone.matches(&BTreeMap::new()) && !gone.matches(&labels("a")));
    }
}
