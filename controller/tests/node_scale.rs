//! Scale benchmark of `weir node` (not a timed test; ignored by default): N services × M
//! endpoints, full sync time and rule count per mode, and the time to apply one endpoint change,
//! in a scratch network namespace. Run as root:
//!
//! ```text
//! WEIR_SCALE_SERVICES=10000 WEIR_SCALE_ENDPOINTS=10 WEIR_SCALE_MODES=iptables,nftables,ipvs \
//!   cargo test --release -p weir --test node_scale -- --ignored --nocapture
//! ```
//!
//! `ipvs` measures the plan only (render, netlink messages and their encoding): applying needs
//! a kernel with IPVS.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use weir::node::exec::Runner;
use weir::node::plan::{Endpoint, IpFamily, Protocol, Ruleset, ServicePort, ServicePortKey, TrafficPolicy};
use weir::node::{iptables, ipvs, netlink, nftables};
use weir_dataplane::model::ObjectRef;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn ip(base: u32, i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(base + u32::try_from(i).unwrap()))
}

/// `services` services with one TCP port each, `endpoints` endpoints each.
fn ruleset(services: usize, endpoints: usize) -> Ruleset {
    let cluster_base = u32::from(Ipv4Addr::new(10, 96, 0, 0));
    let pod_base = u32::from(Ipv4Addr::new(10, 128, 0, 0));
    let mut r = Ruleset::default();
    for s in 0..services {
        let eps = (0..endpoints)
            .map(|e| Endpoint {
                ip: ip(pod_base, s * endpoints + e),
                port: 8080,
                node: None,
                terminating: false,
            })
            .collect();
        r.services.push(ServicePort {
            key: ServicePortKey {
                service: ObjectRef::new("bench", format!("svc-{s:05}")),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
                family: IpFamily::IPv4,
            },
            port: 80,
            cluster_ips: vec![ip(cluster_base, s + 1)],
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: None,
            affinity: None,
            internal_policy: TrafficPolicy::Cluster,
            external_policy: TrafficPolicy::Cluster,
            cluster_endpoints: eps,
            local_endpoints: Vec::new(),
            no_endpoints: false,
        });
    }
    r.services.sort_by(|a, b| a.key.cmp(&b.key));
    r
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `f` 5 times (one endpoint removed, restored, removed, ...): the median and range, and
/// what the first run reported.
fn repeat<T>(mut f: impl FnMut(usize) -> T) -> (String, T) {
    let mut times = Vec::new();
    let mut first = None;
    for i in 0..5 {
        let t = Instant::now();
        let r = f(i);
        times.push(t.elapsed());
        first.get_or_insert(r);
    }
    times.sort();
    let text = format!("{} (median of 5; {} to {})", ms(times[2]), ms(times[0]), ms(times[4]));
    (text, first.unwrap())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[test]
#[ignore = "benchmark: run with --ignored as root"]
fn scale() {
    let (n, m) = (env("WEIR_SCALE_SERVICES", 10_000), env("WEIR_SCALE_ENDPOINTS", 10));
    let full = ruleset(n, m);
    let mut changed = full.clone();
    changed.services[n / 2].cluster_endpoints.pop();
    let cidr = Some("10.128.0.0/9".parse().unwrap());
    println!("weir node scale: {n} services x {m} endpoints");
    println!(
        "reproduce: WEIR_SCALE_SERVICES={n} WEIR_SCALE_ENDPOINTS={m} \
         WEIR_SCALE_MODES={} cargo test --release -p weir --test node_scale -- --ignored --nocapture",
        std::env::var("WEIR_SCALE_MODES").unwrap_or_else(|_| "iptables,nftables".into())
    );
    let modes = std::env::var("WEIR_SCALE_MODES").unwrap_or_else(|_| "iptables,nftables".into());
    for mode in modes.split(',') {
        if mode == "ipvs" {
            ipvs_plan(&full, &changed);
            continue;
        }
        let ns = Netns(format!("wscale{}-{mode}", std::process::id()));
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &ns.0])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            println!("SKIPPED: cannot create a network namespace (not root?)");
            return;
        }
        let runner = Runner::netns(&ns.0);
        let started = Instant::now();
        let (rules, full_time, change_time, written) = match mode {
            "iptables" => {
                let config = iptables::Config { cluster_cidr: cidr, ..Default::default() };
                let render = iptables::render(&full, &config);
                println!("  iptables render: {}", ms(started.elapsed()));
                let mut b = iptables::Iptables::new(runner, config);
                let t = Instant::now();
                b.sync(&full, true).unwrap();
                let full_time = t.elapsed();
                let (change_time, s) =
                    repeat(|i| b.sync(if i % 2 == 0 { &changed } else { &full }, false).unwrap());
                (
                    render.rule_count(),
                    full_time,
                    change_time,
                    format!("{} rules in {} chains", s.rules_written, s.chains_written),
                )
            }
            _ => {
                let config = nftables::Config { cluster_cidr: cidr, ..Default::default() };
                let render = nftables::render(&full, &config);
                println!("  nftables render: {}", ms(started.elapsed()));
                let mut b = nftables::Nftables::new(runner, config);
                let (full, changed) =
                    (std::sync::Arc::new(full.clone()), std::sync::Arc::new(changed.clone()));
                let t = Instant::now();
                b.sync(&full, true).unwrap();
                let full_time = t.elapsed();
                let (change_time, s) =
                    repeat(|i| b.sync(if i % 2 == 0 { &changed } else { &full }, false).unwrap());
                (render.rule_count(), full_time, change_time, format!("{} transaction steps", s.commands))
            }
        };
        println!(
            "  {mode}: {rules} rules/elements; full sync {}; one endpoint change {change_time} ({written})",
            ms(full_time),
        );
    }
}

/// ipvs mode's pure part at scale: the state, the messages of a full sync and of one change,
/// and their wire encoding.
fn ipvs_plan(full: &Ruleset, changed: &Ruleset) {
    let config = ipvs::Config::default();
    let node_ips = ["192.0.2.1".parse().unwrap()];
    let t = Instant::now();
    let a = ipvs::render(full, &config, &node_ips);
    let msgs = ipvs::messages(&Default::default(), &a.services);
    let bytes: usize = msgs.iter().map(|m| netlink::encode(m, 0x1d, 1).len()).sum();
    let full_time = t.elapsed();
    let t = Instant::now();
    let b = ipvs::render(changed, &config, &node_ips);
    let diff = ipvs::messages(&a.services, &b.services);
    let change_time = t.elapsed();
    println!(
        "  ipvs (plan only, no IPVS in this kernel): {} virtual services + real servers; full sync \
         plan {} ({} messages, {} bytes); one endpoint change plan {} ({} messages: {})",
        msgs.len(),
        ms(full_time),
        msgs.len(),
        bytes,
        ms(change_time),
        diff.len(),
        diff.iter().map(ipvs::describe).collect::<Vec<_>>().join("; ")
    );
}
