//! L4 services: ingress-nginx's `--tcp-services-configmap` and `--udp-services-configmap`
//! ConfigMaps into [`L4Service`]s (pure).
//!
//! Each key is a port to listen on; each value `namespace/service:port[:PROXY][:PROXY]` names a
//! Service port (by number or name) and, with the first `PROXY`, says clients send a PROXY
//! protocol header; with the second, that weir sends one upstream (TCP only). An entry that is
//! malformed, names a missing Service or port, or takes a port of weir's own TCP listeners is
//! refused with a warning on its ConfigMap; the other entries still serve.

use std::collections::BTreeMap;

use weir_dataplane::model::{BackendId, L4Protocol, L4Service, ObjectRef, ServicePort};

use super::backend::{Resolver, SliceIndex};
use super::warnings::{ObjectKind, Reason, Warnings};
use super::{TranslateConfig, Warning};
use crate::snapshot::Snapshot;

/// One parsed ConfigMap entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The port to listen on.
    pub port: u16,
    /// The Service port forwarded to.
    pub backend: BackendId,
    /// The first `PROXY`: clients send a PROXY protocol header.
    pub proxy_in: bool,
    /// The second `PROXY`: weir sends one upstream.
    pub proxy_out: bool,
}

/// Why an entry was refused by the parser.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The key is not a port number.
    #[error("key {0:?} is not a port number from 1 to 65535")]
    Port(String),
    /// The value does not have the form `namespace/service:port[:PROXY][:PROXY]`.
    #[error("value {value:?}: {why} (expected namespace/service:port[:PROXY][:PROXY])")]
    Value {
        /// The value as written.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Parses one entry: `key` the listening port, `value` `namespace/service:port[:PROXY][:PROXY]`.
pub fn parse_entry(key: &str, value: &str) -> Result<Entry, ParseError> {
    let port = key
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && !key.trim().starts_with('+') && !key.trim().starts_with('0'))
        .ok_or_else(|| ParseError::Port(key.to_string()))?;
    let bad = |why| ParseError::Value { value: value.to_string(), why };
    let mut parts = value.trim().split(':');
    let service = parts.next().unwrap_or_default();
    let (namespace, name) = service.split_once('/').ok_or_else(|| bad("no namespace/ before the Service"))?;
    if !is_dns_label(namespace) {
        return Err(bad("the namespace is not a DNS label"));
    }
    if !is_dns_label(name) {
        return Err(bad("the Service name is not a DNS label"));
    }
    let service_port = parts.next().ok_or_else(|| bad("no :port after the Service"))?;
    let service_port = match service_port.parse::<u16>() {
        Ok(0) => return Err(bad("port 0")),
        Ok(n) if !service_port.starts_with('0') && !service_port.starts_with('+') => ServicePort::Number(n),
        Ok(_) => return Err(bad("the port has a leading zero or sign")),
        Err(_) if is_port_name(service_port) => ServicePort::Name(service_port.to_string()),
        Err(_) => return Err(bad("the port is neither a number nor a port name")),
    };
    let flag = |part: Option<&str>| match part {
        None | Some("") => Ok(false),
        Some("PROXY") => Ok(true),
        Some(_) => Err(bad("only PROXY may follow the port")),
    };
    let proxy_in = flag(parts.next())?;
    let proxy_out = flag(parts.next())?;
    if parts.next().is_some() {
        return Err(bad("more than two fields after the port"));
    }
    let backend =
        BackendId { namespace: namespace.to_string(), service: name.to_string(), port: service_port };
    Ok(Entry { port, backend, proxy_in, proxy_out })
}

/// `proxy-stream-responses`: a whole number (`0`: replies never end a flow).
pub(crate) fn responses(s: &str) -> Result<u32, String> {
    s.parse().map_err(|_| "expected a whole number (0: replies never end a UDP flow)".to_string())
}

/// `stream-proxy-protocol-version`: `v1` (false) or `v2` (true).
pub(crate) fn proxy_protocol_version(s: &str) -> Result<bool, String> {
    match s {
        "v1" | "1" => Ok(false),
        "v2" | "2" => Ok(true),
        _ => Err("expected v1 or v2".into()),
    }
}

/// An RFC 1123 label: lower-case letters, digits and `-`, 1 to 63, no `-` at either end.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A Service port name (an IANA service name as Kubernetes checks it): lower-case letters,
/// digits and `-`, at most 15, at least one letter, no `-` at either end nor `--`.
fn is_port_name(s: &str) -> bool {
    is_dns_label(s) && s.len() <= 15 && s.bytes().any(|b| b.is_ascii_lowercase()) && !s.contains("--")
}

/// The L4 services of `snapshot` and the warnings about its two ConfigMaps.
pub(crate) fn translate(
    snapshot: &Snapshot,
    slices: &SliceIndex,
    config: &TranslateConfig,
) -> (Vec<L4Service>, Vec<Warning>) {
    let mut services = Vec::new();
    let mut warnings = Warnings::default();
    let resolver = Resolver::new(snapshot, slices);
    for (protocol, name) in [(L4Protocol::Tcp, &config.tcp_services), (L4Protocol::Udp, &config.udp_services)]
    {
        let Some(name) = name else { continue };
        let Some(cm) = snapshot.config_maps.get(name) else {
            warnings.warn_on(
                ObjectKind::ConfigMap,
                name,
                Reason::InvalidL4Entry,
                format!("the {protocol} services ConfigMap does not exist; no {protocol} port is served"),
            );
            continue;
        };
        let empty = BTreeMap::new();
        let data = cm.data.as_ref().unwrap_or(&empty);
        let ctx = Ctx { configmap: name, protocol, config, resolver: &resolver };
        for (key, value) in data {
            if let Some(service) = ctx.entry(key, value, &mut warnings) {
                services.push(service);
            }
        }
    }
    // Keys are unique per ConfigMap, and the two ConfigMaps are of different protocols.
    services.sort_by_key(|s| (s.protocol, s.port));
    (services, warnings.finish())
}

struct Ctx<'a> {
    configmap: &'a ObjectRef,
    protocol: L4Protocol,
    config: &'a TranslateConfig,
    resolver: &'a Resolver<'a>,
}

impl Ctx<'_> {
    fn entry(&self, key: &str, value: &str, warnings: &mut Warnings) -> Option<L4Service> {
        let protocol = self.protocol;
        let mut refuse = |reason, why: String| {
            warnings.error_on(
                ObjectKind::ConfigMap,
                self.configmap,
                reason,
                format!("data[{key}]: {protocol} service refused: {why}"),
            );
        };
        let entry = match parse_entry(key, value) {
            Ok(entry) => entry,
            Err(error) => {
                refuse(Reason::InvalidL4Entry, error.to_string());
                return None;
            }
        };
        if protocol == L4Protocol::Tcp
            && let Some(listener) = self.config.listener_ports.get(&entry.port)
        {
            refuse(Reason::L4PortConflict, format!("port {} is weir's own {listener} listener", entry.port));
            return None;
        }
        let transport = match protocol {
            L4Protocol::Tcp => "TCP",
            L4Protocol::Udp => "UDP",
        };
        let (backend, error) = self.resolver.resolve_protocol(&entry.backend, transport);
        if let Some(error) = error {
            let reason = error.reason();
            refuse(reason, error.to_string());
            return None;
        }
        let (mut proxy_in, mut proxy_out) = (entry.proxy_in, entry.proxy_out);
        if protocol == L4Protocol::Udp && (proxy_in || proxy_out) {
            warnings.warn_on(
                ObjectKind::ConfigMap,
                self.configmap,
                Reason::InvalidL4Entry,
                format!("data[{key}]: the PROXY protocol is TCP only; ignored for this UDP service"),
            );
            (proxy_in, proxy_out) = (false, false);
        }
        Some(L4Service {
            port: entry.port,
            protocol,
            backend: entry.backend,
            target: backend.target,
            proxy_protocol_in: proxy_in,
            proxy_protocol_out: proxy_out,
            client_ip_affinity_s: None,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn id(s: &str) -> BackendId {
        s.parse().unwrap()
    }

    #[test]
    fn entries_parse_as_ingress_nginx_writes_them() {
        let e = parse_entry("9000", "default/db:5432").unwrap();
        assert_eq!(
            e,
            Entry { port: 9000, backend: id("default/db:5432"), proxy_in: false, proxy_out: false }
        );
        let e = parse_entry("53", "kube-system/dns:dns-udp").unwrap();
        assert_eq!(e.backend.port, ServicePort::Name("dns-udp".into()));
        let e = parse_entry("9001", "shop/mq:1883:PROXY").unwrap();
        assert!(e.proxy_in && !e.proxy_out);
        let e = parse_entry("9002", "shop/mq:1883:PROXY:PROXY").unwrap();
        assert!(e.proxy_in && e.proxy_out);
        let e = parse_entry("9003", "shop/mq:1883::PROXY").unwrap();
        assert!(!e.proxy_in && e.proxy_out, "an empty first flag sends PROXY upstream only");
        let e = parse_entry(" 9004 ", " shop/mq:mqtt ").unwrap();
        assert_eq!(e.port, 9004, "surrounding blanks are trimmed");
    }

    #[test]
    fn malformed_entries_say_what_is_wrong() {
        let cases = [
            ("0", "a/b:1", "key \"0\""),
            ("70000", "a/b:1", "key \"70000\""),
            ("http", "a/b:1", "key \"http\""),
            ("080", "a/b:1", "key \"080\""),
            ("9000", "b:1", "no namespace/"),
            ("9000", "a/b", "no :port"),
            ("9000", "a/b:", "neither a number nor a port name"),
            ("9000", "a/b:0", "port 0"),
            ("9000", "a/b:70000", "neither a number"),
            ("9000", "A/b:1", "namespace is not a DNS label"),
            ("9000", "a/b_c:1", "Service name is not a DNS label"),
            ("9000", "a/b:1:proxy", "only PROXY"),
            ("9000", "a/b:1:PROXY:PROXY:PROXY", "more than two"),
            ("9000", "a/b:1;rm -rf", "neither a number nor a port name"),
            ("9000", "a/b:very-long-port-name", "neither a number nor a port name"),
        ];
        for (key, value, want) in cases {
            let error = parse_entry(key, value).unwrap_err().to_string();
            assert!(error.contains(want), "{key}={value}: {error}");
        }
    }
}
