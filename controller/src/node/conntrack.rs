//! Stale UDP conntrack entries: UDP has no connection end, so an entry DNATed to an endpoint
//! that went away keeps sending a client's packets there until flushed (as kube-proxy does).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::exec::Runner;
use super::plan::{IpFamily, Protocol, Ruleset, ServicePort, ServicePortKey};

/// The `conntrack -D` arguments (after `-p udp`) that remove stale UDP entries when going from
/// `old` to `ruleset`: entries DNATed to endpoints that went away, and entries of virtual IPs that
/// had no endpoint (their packets were rejected or dropped) and now have some.
pub fn stale_udp(family: IpFamily, old: &Ruleset, ruleset: &Ruleset) -> Vec<Vec<String>> {
    let old_ports: BTreeMap<&ServicePortKey, &ServicePort> =
        old.services.iter().filter(|sp| sp.key.family == family).map(|sp| (&sp.key, sp)).collect();
    let mut flushes = Vec::new();
    for sp in ruleset.services.iter().filter(|sp| sp.key.family == family && sp.key.protocol == Protocol::Udp)
    {
        let new_eps: BTreeSet<IpAddr> = sp.all_endpoints().iter().map(|e| e.ip).collect();
        let old_eps: BTreeSet<IpAddr> = old_ports
            .get(&sp.key)
            .map(|o| o.all_endpoints().iter().map(|e| e.ip).collect())
            .unwrap_or_default();
        for gone in old_eps.difference(&new_eps) {
            for vip in sp.virtual_ips() {
                flushes.push(vec![
                    "--orig-dst".to_string(),
                    vip.to_string(),
                    "--dst-nat".into(),
                    gone.to_string(),
                ]);
            }
            if let Some(np) = sp.node_port {
                flushes.push(vec![
                    "--orig-port-dst".into(),
                    np.to_string(),
                    "--dst-nat".into(),
                    gone.to_string(),
                ]);
            }
        }
        if old_eps.is_empty() && !new_eps.is_empty() {
            for vip in sp.virtual_ips() {
                flushes.push(vec!["--orig-dst".to_string(), vip.to_string()]);
            }
            if let Some(np) = sp.node_port {
                flushes.push(vec!["--orig-port-dst".into(), np.to_string()]);
            }
        }
    }
    // Endpoints of UDP ports that disappeared altogether.
    for (key, sp) in &old_ports {
        if key.protocol == Protocol::Udp && !ruleset.services.iter().any(|n| &n.key == *key) {
            for ep in sp.all_endpoints() {
                for vip in sp.virtual_ips() {
                    flushes.push(vec![
                        "--orig-dst".into(),
                        vip.to_string(),
                        "--dst-nat".into(),
                        ep.ip.to_string(),
                    ]);
                }
            }
        }
    }
    flushes
}

/// The `conntrack -D` arguments (after `-p udp`) a mode runs at its first sync: every UDP entry
/// of `ruleset`'s Service IPs and ports (ClusterIPs, externalIPs, LoadBalancer IPs) and every
/// DNATed one of its node ports. Entries made before this process wrote its rules were NATed by
/// another mode's (or another process's) rules: userspace mode's redirects to proxy ports that
/// died with it, endpoints chosen by rules that are gone. A client that reuses its source port
/// would keep reaching them until the entry expires (kube-proxy flushes its UDP Service IPs at
/// start likewise). The next datagram of each flow is NATed by the rules now in place.
pub fn at_start(family: IpFamily, ruleset: &Ruleset) -> Vec<Vec<String>> {
    let mut flushes = BTreeSet::new();
    for sp in ruleset.services.iter().filter(|sp| sp.key.family == family && sp.key.protocol == Protocol::Udp)
    {
        for vip in sp.virtual_ips() {
            flushes.insert(vec![
                "--orig-dst".to_string(),
                vip.to_string(),
                "--orig-port-dst".into(),
                sp.port.to_string(),
            ]);
        }
        if let Some(np) = sp.node_port {
            flushes.insert(vec!["--orig-port-dst".to_string(), np.to_string(), "--dst-nat".into()]);
        }
    }
    flushes.into_iter().collect()
}

/// Runs the deletions; failures are logged (a stale entry is a nuisance, not an outage).
/// Returns how many deletions were run.
pub fn flush(runner: &Runner, family: IpFamily, flushes: &[Vec<String>]) -> usize {
    let family_flag = match family {
        IpFamily::IPv4 => "ipv4",
        IpFamily::IPv6 => "ipv6",
    };
    for args in flushes {
        let mut full = vec!["-D", "-f", family_flag, "-p", "udp"];
        full.extend(args.iter().map(String::as_str));
        match runner.status("conntrack", &full, None) {
            // Exit 1 with "0 flow entries have been deleted" just means none matched.
            Ok((status, out)) if !status.success() && !out.stderr.contains("0 flow entries") => {
                tracing::warn!(args = ?full, stderr = %out.stderr.trim(), "conntrack flush failed");
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot flush stale UDP conntrack entries");
                // Not installed (said at start-up): the other deletions would fail alike.
                if matches!(error, super::exec::Error::Spawn { .. }) {
                    break;
                }
            }
        }
    }
    flushes.len()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn port(protocol: &str, port: u16, extra: &str) -> String {
        format!(
            r#"{{"service": "default/web", "port_name": "p{port}", "protocol": "{protocol}", "family": "IPv4",
                "port": {port}, "cluster_ips": ["10.96.0.10"], "internal_policy": "Cluster",
                "external_policy": "Cluster", "cluster_endpoints": [] {extra}}}"#
        )
    }

    /// At start: every UDP Service IP and port (endpoints or not), the node port's DNATed
    /// entries; nothing of TCP or of the other family; each deletion once.
    #[test]
    fn the_first_sync_flushes_every_udp_service_port() {
        let ports = [
            port("UDP", 53, r#", "node_port": 30053, "external_ips": ["198.51.100.7"]"#),
            port("UDP", 5353, ""),
            port("TCP", 80, r#", "node_port": 30080"#),
        ];
        let json = format!(r#"{{"services": [{}]}}"#, ports.join(","));
        let ruleset: Ruleset = serde_json::from_str(&json).unwrap();
        let flushes: Vec<String> = at_start(IpFamily::IPv4, &ruleset).iter().map(|a| a.join(" ")).collect();
        assert_eq!(
            flushes,
            [
                "--orig-dst 10.96.0.10 --orig-port-dst 53",
                "--orig-dst 10.96.0.10 --orig-port-dst 5353",
                "--orig-dst 198.51.100.7 --orig-port-dst 53",
                "--orig-port-dst 30053 --dst-nat",
            ]
        );
        assert!(at_start(IpFamily::IPv6, &ruleset).is_empty());
    }
}
