//! `Gateway.spec.addresses` against the addresses weir is reached at (pure).
//!
//! Every Gateway of weir's classes is served by weir's own sockets, which clients reach at the
//! addresses weir publishes (`--publish-service`'s load-balancer addresses, or
//! `--publish-status-address`): those are the addresses "on the outside of the Gateway" weir
//! can give (`GatewaySpec.addresses`). A Gateway's `spec.addresses` asks for some of them:
//!
//! - `IPAddress` (the default type) and `Hostname` entries are taken. Any other type makes the
//!   Gateway `Accepted: False, UnsupportedAddress` ("an address that was provided is a type
//!   which is not supported by the implementation", conformance `GatewayStaticAddresses`).
//! - A value that is one of weir's addresses is assigned. Any other value makes it `Programmed:
//!   False, AddressNotUsable` ("a provided static address can't be used"), the message naming
//!   it and weir's addresses.
//! - An entry without a value (`GatewayAddressEmpty`) is assigned weir's addresses of its type;
//!   when weir has none of that type (yet), `Programmed: False, AddressNotAssigned`.
//!
//! `status.addresses` lists what was assigned ("add a corresponding entry in
//! GatewayStatus.Addresses"): every address weir has when `spec.addresses` is empty. The
//! listeners are served whatever the addresses say: weir's sockets take every address it has.

use std::net::IpAddr;

use super::conditions::{Cond, reasons, types};
use crate::gateway::GatewayAddress;

/// The `IPAddress` type (`AddressType`, the default).
pub const IP_ADDRESS: &str = "IPAddress";
/// The `Hostname` type.
pub const HOSTNAME: &str = "Hostname";

/// What a Gateway's `spec.addresses` gives against weir's published addresses.
#[derive(Debug, Default, PartialEq)]
pub struct Assigned {
    /// `status.addresses`.
    pub status: Vec<GatewayAddress>,
    /// `Accepted: False` when an address type is not supported.
    pub accepted: Option<Cond>,
    /// `Programmed: False` when an address cannot be used or assigned.
    pub programmed: Option<Cond>,
}

/// The type of a published address: an IP address or else a hostname.
pub fn type_of(address: &str) -> &'static str {
    if address.parse::<IpAddr>().is_ok() { IP_ADDRESS } else { HOSTNAME }
}

/// Assigns `spec` (a Gateway's `spec.addresses`) from `published` (weir's addresses).
pub fn assign(spec: &[GatewayAddress], published: &[String]) -> Assigned {
    let ours: Vec<(&'static str, &str)> = published.iter().map(|a| (type_of(a), a.as_str())).collect();
    let mut out = Assigned::default();
    if spec.is_empty() {
        for (type_, value) in &ours {
            push(&mut out.status, type_, value);
        }
        return out;
    }
    let (mut unsupported, mut unusable, mut unassigned) = (Vec::new(), Vec::new(), Vec::new());
    for a in spec {
        let type_ = match a.type_.as_deref() {
            None | Some(IP_ADDRESS) => IP_ADDRESS,
            Some(HOSTNAME) => HOSTNAME,
            Some(other) => {
                unsupported.push(format!("{other:?}"));
                continue;
            }
        };
        if a.value.is_empty() {
            if !ours.iter().any(|(t, _)| *t == type_) {
                unassigned.push(type_);
            }
            for (t, value) in ours.iter().filter(|(t, _)| *t == type_) {
                push(&mut out.status, t, value);
            }
            continue;
        }
        if ours.iter().any(|(t, value)| *t == type_ && same(type_, value, &a.value)) {
            push(&mut out.status, type_, &a.value);
        } else if type_ == IP_ADDRESS && a.value.parse::<IpAddr>().is_err() {
            unusable.push(format!("{:?} (not an IP address)", a.value));
        } else {
            unusable.push(a.value.clone());
        }
    }
    let weirs = if published.is_empty() {
        "weir publishes none yet".to_string()
    } else {
        format!("weir's addresses are {}", published.join(", "))
    };
    if !unsupported.is_empty() {
        out.accepted = Some(Cond::no(
            types::ACCEPTED,
            reasons::UNSUPPORTED_ADDRESS,
            format!(
                "spec.addresses: type {} is not supported: weir assigns IPAddress and Hostname addresses",
                unsupported.join(", ")
            ),
        ));
    }
    const SHARED: &str = "every Gateway of weir's classes is reached at the addresses of \
                          --publish-service or --publish-status-address";
    if !unusable.is_empty() {
        out.programmed = Some(Cond::no(
            types::PROGRAMMED,
            reasons::ADDRESS_NOT_USABLE,
            format!("spec.addresses: {} cannot be used: {weirs} ({SHARED})", unusable.join(", ")),
        ));
    } else if !unassigned.is_empty() {
        out.programmed = Some(Cond::no(
            types::PROGRAMMED,
            reasons::ADDRESS_NOT_ASSIGNED,
            format!("spec.addresses: no {} address to assign: {weirs} ({SHARED})", unassigned.join(" or ")),
        ));
    }
    out
}

/// Whether the published `ours` is the requested `wanted`: the same IP address however
/// written, or the same hostname in any case.
fn same(type_: &str, ours: &str, wanted: &str) -> bool {
    if type_ == IP_ADDRESS {
        matches!((ours.parse::<IpAddr>(), wanted.parse::<IpAddr>()), (Ok(a), Ok(b)) if a == b)
    } else {
        ours.trim_end_matches('.').eq_ignore_ascii_case(wanted.trim_end_matches('.'))
    }
}

fn push(status: &mut Vec<GatewayAddress>, type_: &str, value: &str) {
    if !status.iter().any(|a| a.type_.as_deref() == Some(type_) && same(type_, &a.value, value)) {
        status.push(GatewayAddress { type_: Some(type_.to_string()), value: value.to_string() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(list: &[(Option<&str>, &str)]) -> Vec<GatewayAddress> {
        list.iter()
            .map(|(t, v)| GatewayAddress { type_: t.map(str::to_string), value: v.to_string() })
            .collect()
    }

    fn published(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn values(a: &Assigned) -> Vec<(String, String)> {
        a.status.iter().map(|a| (a.type_.clone().unwrap_or_default(), a.value.clone())).collect()
    }

    fn pair(t: &str, v: &str) -> (String, String) {
        (t.to_string(), v.to_string())
    }

    /// No `spec.addresses`: "the implementation MAY schedule the Gateway in an
    /// implementation-specific manner, assigning an appropriate set of Addresses": all of weir's.
    #[test]
    fn without_spec_addresses_every_published_address_is_assigned() {
        let a = assign(&[], &published(&["192.0.2.10", "lb.example.com", "2001:db8::1"]));
        assert_eq!(
            values(&a),
            [
                pair(IP_ADDRESS, "192.0.2.10"),
                pair(HOSTNAME, "lb.example.com"),
                pair(IP_ADDRESS, "2001:db8::1")
            ]
        );
        assert_eq!((&a.accepted, &a.programmed), (&None, &None));
    }

    /// The three steps of conformance `GatewayStaticAddresses`: an unsupported type, then an
    /// unusable value, then only the usable one.
    #[test]
    fn gateway_static_addresses_conformance_steps() {
        let ours = published(&["192.0.2.10"]);
        let all = spec(&[
            (Some("test/fake-invalid-type"), "fake address teehee!"),
            (None, "198.51.100.7"),
            (Some("IPAddress"), "192.0.2.10"),
        ]);
        let a = assign(&all, &ours);
        let accepted = a.accepted.expect("Accepted False");
        assert_eq!((accepted.status, accepted.reason), (false, "UnsupportedAddress"));
        assert!(accepted.message.contains("test/fake-invalid-type"), "{}", accepted.message);

        let a = assign(&all[1..], &ours);
        assert_eq!(a.accepted, None);
        let programmed = a.programmed.clone().expect("Programmed False");
        assert_eq!((programmed.status, programmed.reason), (false, "AddressNotUsable"));
        assert!(
            programmed.message.contains("198.51.100.7") && programmed.message.contains("192.0.2.10"),
            "names the unusable address and weir's: {}",
            programmed.message
        );
        assert_eq!(values(&a), [pair(IP_ADDRESS, "192.0.2.10")], "only the usable address in status");

        let a = assign(&all[2..], &ours);
        assert_eq!((&a.accepted, &a.programmed), (&None, &None));
        assert_eq!(values(&a), [pair(IP_ADDRESS, "192.0.2.10")]);
    }

    /// `GatewayAddressEmpty`: a type without a value is given weir's addresses of that type;
    /// none of that type is `AddressNotAssigned`.
    #[test]
    fn an_address_without_value_is_assigned_from_weirs() {
        let ours = published(&["192.0.2.10", "lb.example.com", "192.0.2.11"]);
        let a = assign(&spec(&[(Some("IPAddress"), "")]), &ours);
        assert_eq!(values(&a), [pair(IP_ADDRESS, "192.0.2.10"), pair(IP_ADDRESS, "192.0.2.11")]);
        assert_eq!(a.programmed, None);

        let a = assign(&spec(&[(Some("Hostname"), "")]), &published(&["192.0.2.10"]));
        let programmed = a.programmed.clone().expect("Programmed False");
        assert_eq!((programmed.status, programmed.reason), (false, "AddressNotAssigned"));
        assert!(a.status.is_empty());

        let a = assign(&spec(&[(None, "")]), &[]);
        assert_eq!(a.programmed.map(|c| c.reason), Some("AddressNotAssigned"), "nothing published yet");
    }

    /// An address is the same however it is written: IPv6 forms, hostname case, a final dot.
    #[test]
    fn requested_addresses_match_however_written() {
        let ours = published(&["2001:db8::1", "LB.example.com"]);
        let a = assign(&spec(&[(None, "2001:0db8:0:0::1"), (Some("Hostname"), "lb.example.com.")]), &ours);
        assert_eq!((&a.accepted, &a.programmed), (&None, &None));
        assert_eq!(values(&a), [pair(IP_ADDRESS, "2001:0db8:0:0::1"), pair(HOSTNAME, "lb.example.com.")]);
        // A hostname asked as an IPAddress is not an IP address.
        let a = assign(&spec(&[(None, "lb.example.com")]), &ours);
        let programmed = a.programmed.clone().expect("Programmed False");
        assert!(programmed.message.contains("not an IP address"), "{}", programmed.message);
    }
}
