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
            Err(error) => tracing::warn!(%error, "cannot flush stale UDP conntrack entries"),
        }
    }
    flushes.len()
}
