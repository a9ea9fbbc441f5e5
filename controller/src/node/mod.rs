//! `weir node`: the in-tree kube-proxy for Service ClusterIP L4 (iptables, ipvs, nftables,
//! userspace).
//!
//! Services and their endpoints, read from the Kubernetes API (Services and EndpointSlices, or
//! core Endpoints where EndpointSlice v1 is not served: nothing else, so the node agent needs no
//! other read rights) or from `--manifests DIR` by the loop in `node_agent.rs`, arrive here as a
//! snapshot: the pure [`plan::plan`] turns it into a [`plan::Ruleset`], and a backend
//! ([`iptables`], [`nftables`] or [`ipvs`]) applies that in the [`sync`] loop, whose metrics
//! [`admin`] serves. `--mode ipvs` falls back to iptables mode (logged) where the kernel has no
//! IPVS. [`userspace`] serves each Service port with the dataplane's L4 proxy instead, behind NAT
//! redirects. Each mode removes the others' rules when it starts ([`cleanup_other_modes`]).

pub mod admin;
pub mod conntrack;
pub mod exec;
pub mod iptables;
pub mod ipvs;
pub mod lb;
pub mod netlink;
pub mod nftables;
pub mod nftnl;
pub mod plan;
pub mod sync;
pub mod userspace;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use exec::Runner;
use plan::{Cidr, IpFamily, Ruleset};

/// How `weir node` programs the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// iptables (nat and filter tables), applied with `iptables-restore`.
    #[default]
    Iptables,
    /// IPVS virtual servers; falls back to iptables where the kernel has no IPVS.
    Ipvs,
    /// nftables, one table `weir`.
    Nftables,
    /// A proxy port per Service port (weir's L4 proxy: retries on another endpoint when one
    /// refuses), reached through NAT redirects (iptables, else nftables).
    Userspace,
}

/// Options of `weir node`.
#[derive(Clone, Debug, clap::Args)]
pub struct NodeArgs {
    /// Read Services, EndpointSlices and Endpoints from YAML manifests below DIR (watched)
    /// instead of the Kubernetes API.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig file (default: in-cluster configuration, else $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE", conflicts_with = "manifests")]
    pub kubeconfig: Option<PathBuf>,
    /// How to program the kernel.
    #[arg(long, value_enum, default_value_t = Mode::Iptables)]
    pub mode: Mode,
    /// The IPVS scheduler of every virtual service (ipvs mode).
    #[arg(long, value_enum, default_value_t = ipvs::Scheduler::Rr)]
    pub ipvs_scheduler: ipvs::Scheduler,
    /// This node's name: endpoints with this `nodeName` are local (default: the hostname).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Pod CIDR; ClusterIP traffic from outside it is masqueraded.
    #[arg(long, value_name = "CIDR")]
    pub cluster_cidr: Option<Cidr>,
    /// Masquerade all traffic sent to ClusterIPs.
    #[arg(long)]
    pub masquerade_all: bool,
    /// Period of the full resync (e.g. `30s`, `1m`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub sync_period: Duration,
    /// Minimum time between two syncs (e.g. `1s`, `500ms`).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub min_sync_interval: Duration,
    /// Remove everything weir node created, in every mode, and exit.
    #[arg(long)]
    pub cleanup: bool,
    /// Admin listener: `/healthz` (200 while rules are in sync) and `/metrics`.
    #[arg(long, default_value = "127.0.0.1:10256", value_name = "ADDR")]
    pub listen_admin: std::net::SocketAddr,
    /// Assign addresses from IPAddressPools to LoadBalancer Services (one replica assigns,
    /// elected by a Lease; with --manifests, pools are read from DIR).
    #[arg(long)]
    pub load_balancer: bool,
    /// The `spec.loadBalancerClass` of the Services weir assigns addresses to.
    #[arg(long, default_value = lb::ipam::DEFAULT_CLASS, value_name = "CLASS")]
    pub load_balancer_class: String,
    /// Assign addresses only to Services naming --load-balancer-class (not to those without a
    /// class).
    #[arg(long)]
    pub load_balancer_class_required: bool,
    /// Name of the coordination.k8s.io/v1 Lease that elects the replica assigning addresses.
    #[arg(long, default_value = "weir-node-lb", value_name = "NAME")]
    pub election_id: String,
    /// Namespace of that Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default", value_name = "NS")]
    pub election_namespace: String,
    /// How long the Lease stays valid without renewal (seconds).
    #[arg(long, default_value_t = 15, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(2..))]
    pub election_lease_duration: u64,
    /// This replica's identity in the Lease (default: the node name and process id).
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    pub election_identity: Option<String>,
    /// How this node makes the addresses it is elected for reachable: `l2` answers ARP and
    /// NDP for them; `none` leaves it to something else (static routes, BGP elsewhere).
    #[arg(long, value_enum, default_value_t = LbAnnounce::L2)]
    pub lb_announce: LbAnnounce,
    /// Interface on which to announce LoadBalancer addresses (repeatable; default: the
    /// interface of the default route).
    #[arg(long = "lb-interface", value_name = "IFACE")]
    pub lb_interfaces: Vec<String>,
    /// userspace mode: the ports its proxy listens on, one per Service port (and protocol).
    #[arg(long, default_value = userspace::DEFAULT_PORT_RANGE, value_name = "FIRST-LAST")]
    pub proxy_port_range: userspace::PortRange,
    /// userspace mode: how its redirects are written (auto: iptables where installed, else
    /// nftables).
    #[arg(long, value_enum, default_value_t = userspace::NatTool::Auto)]
    pub userspace_nat: userspace::NatTool,
}

/// How LoadBalancer addresses are made reachable (`--lb-announce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LbAnnounce {
    /// ARP and NDP answers from the elected node (L2 mode).
    #[default]
    L2,
    /// Not announced by weir.
    None,
}

impl NodeArgs {
    /// Which Services the load balancer handles.
    pub fn lb_class(&self) -> lb::ipam::ClassConfig {
        lb::ipam::ClassConfig {
            class: self.load_balancer_class.clone(),
            class_required: self.load_balancer_class_required,
        }
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("invalid duration {s:?}: expected e.g. 30s, 500ms, 1m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

// === mode selection ===

/// Why IPVS cannot be used here, or `None` when the kernel offers it.
pub fn ipvs_unavailable(proc_root: &Path) -> Option<String> {
    let path = proc_root.join("net/ip_vs");
    if path.exists() {
        None
    } else {
        Some(format!(
            "{} does not exist (the kernel has no IPVS, or the ip_vs module is not loaded)",
            path.display()
        ))
    }
}

/// The mode to run: `requested`, or iptables with the reason when `requested` is not usable.
pub fn effective_mode(requested: Mode, proc_root: &Path) -> (Mode, Option<String>) {
    match requested {
        Mode::Iptables => (Mode::Iptables, None),
        Mode::Ipvs => match ipvs_unavailable(proc_root) {
            Some(reason) => {
                (Mode::Iptables, Some(format!("IPVS is unavailable: {reason}; using iptables mode")))
            }
            None => (Mode::Ipvs, None),
        },
        Mode::Nftables => (Mode::Nftables, None),
        Mode::Userspace => (Mode::Userspace, None),
    }
}

// === the kernel tools each mode runs ===

/// The programs `weir node` runs in `mode`, each with its Debian package and what a node
/// without it loses; `required` ones stop the node at start-up.
struct Tool {
    program: &'static str,
    package: &'static str,
    required: bool,
    without: &'static str,
}

fn tools(mode: Mode) -> Vec<Tool> {
    let conntrack = Tool {
        program: "conntrack",
        package: "conntrack",
        required: false,
        without: "stale UDP conntrack entries are not flushed when endpoints go away, so UDP clients (DNS among them) keep sending to removed endpoints until their entries expire",
    };
    let restore = |program, family| Tool {
        program,
        package: "iptables",
        required: family == "IPv4",
        without: if family == "IPv4" { "no rule can be written" } else { "IPv6 Services are not programmed" },
    };
    match mode {
        Mode::Iptables => {
            vec![restore("iptables-restore", "IPv4"), restore("ip6tables-restore", "IPv6"), conntrack]
        }
        Mode::Ipvs => vec![
            restore("iptables-restore", "IPv4"),
            restore("ip6tables-restore", "IPv6"),
            Tool {
                program: "ipset",
                package: "ipset",
                required: true,
                without: "ipvs mode cannot match its address sets",
            },
            conntrack,
        ],
        // Either NAT tool does (userspace::NatTool::resolve says which).
        Mode::Userspace => vec![Tool {
            without: "UDP conntrack entries NATed before userspace mode started (by another mode's rules) are not flushed, so UDP clients that reuse their source port keep reaching them until their entries expire",
            ..conntrack
        }],
        // Its rules go over nf_tables netlink: no `nft` (weir's image has none).
        Mode::Nftables => vec![conntrack],
    }
}

/// Whether `program` is an executable file in one of the directories of `path` (a `PATH`).
pub fn in_path(program: &str, path: &std::ffi::OsStr) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path).any(|dir| {
        std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What the start-up check of the kernel tools decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCheck {
    /// The mode to run (ipvs falls back to iptables without `ipset`).
    pub mode: Mode,
    /// One line per missing optional tool: what is missing, what it costs, what to install.
    pub warnings: Vec<String>,
}

/// Checks that the programs `mode` runs are in `path` (a `PATH`). A missing required one is an
/// error naming its package (ipvs mode without `ipset` falls back to iptables instead); a
/// missing optional one is a warning saying what the node loses.
pub fn check_tools(mode: Mode, path: &std::ffi::OsStr) -> Result<ToolCheck, String> {
    let mut warnings = Vec::new();
    let mut mode = mode;
    if mode == Mode::Ipvs && !in_path("ipset", path) {
        warnings.push(
            "ipset is not installed (Debian package ipset): ipvs mode needs it; using iptables mode"
                .to_string(),
        );
        mode = Mode::Iptables;
    }
    for tool in tools(mode) {
        if in_path(tool.program, path) {
            continue;
        }
        let line =
            format!("{} is not installed (Debian package {}): {}", tool.program, tool.package, tool.without);
        if tool.required {
            return Err(format!("{line}; weir node cannot run in {mode:?} mode"));
        }
        warnings.push(line);
    }
    Ok(ToolCheck { mode, warnings })
}

// === the iptables backend, both families ===

/// iptables mode for IPv4 and, when the ruleset has IPv6 entries, IPv6.
#[derive(Debug)]
pub struct IptablesBackend {
    v4: iptables::Iptables,
    v6: Option<iptables::Iptables>,
    runner: Runner,
    config: iptables::Config,
}

impl IptablesBackend {
    /// A backend running its tools through `runner`.
    pub fn new(runner: Runner, config: iptables::Config) -> Self {
        let v4 = iptables::Iptables::new(
            runner.clone(),
            iptables::Config { family: Some(IpFamily::IPv4), ..config.clone() },
        );
        IptablesBackend { v4, v6: None, runner, config }
    }
}

impl sync::Backend for IptablesBackend {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<sync::Report> {
        let s4 = self.v4.sync(ruleset, full).context("iptables (IPv4)")?;
        let mut report = sync::Report {
            written: s4.written,
            rules_written: s4.rules_written,
            rules_total: s4.rules_total,
        };
        let has_v6 = ruleset.services.iter().any(|sp| sp.key.family == IpFamily::IPv6);
        if has_v6 && self.v6.is_none() {
            let config = iptables::Config { family: Some(IpFamily::IPv6), ..self.config.clone() };
            self.v6 = Some(iptables::Iptables::new(self.runner.clone(), config));
        }
        if let Some(v6) = &mut self.v6 {
            let s6 = v6.sync(ruleset, full).context("ip6tables (IPv6)")?;
            report.written |= s6.written;
            report.rules_written += s6.rules_written;
            report.rules_total += s6.rules_total;
        }
        Ok(report)
    }

    fn repair(&mut self) -> anyhow::Result<bool> {
        let mut missing = self.v4.ensure_jumps()?;
        if let Some(v6) = &self.v6 {
            missing += v6.ensure_jumps()?;
        }
        if missing > 0 {
            tracing::warn!(missing, "jumps into weir's chains were missing; restored");
        }
        Ok(missing > 0)
    }
}

// === the nftables backend, both families ===

/// nftables mode: table `ip weir`, and `ip6 weir` when the ruleset has IPv6 entries.
#[derive(Debug)]
pub struct NftablesBackend {
    v4: nftables::Nftables,
    v6: Option<nftables::Nftables>,
    runner: Runner,
    config: nftables::Config,
}

impl NftablesBackend {
    /// A backend writing over nf_tables netlink in `runner`'s namespace (`nft` through other
    /// runners).
    pub fn new(runner: Runner, config: nftables::Config) -> Self {
        let v4 = nftables::Nftables::new(
            runner.clone(),
            nftables::Config { family: Some(IpFamily::IPv4), ..config.clone() },
        );
        NftablesBackend { v4, v6: None, runner, config }
    }
}

impl sync::Backend for NftablesBackend {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<sync::Report> {
        let s4 = self.v4.sync(ruleset, full).context("nftables (table ip weir)")?;
        let mut report =
            sync::Report { written: s4.written, rules_written: s4.commands, rules_total: s4.rules_total };
        if self.v6.is_none() && ruleset.services.iter().any(|sp| sp.key.family == IpFamily::IPv6) {
            let config = nftables::Config { family: Some(IpFamily::IPv6), ..self.config.clone() };
            self.v6 = Some(nftables::Nftables::new(self.runner.clone(), config));
        }
        if let Some(v6) = &mut self.v6 {
            let s6 = v6.sync(ruleset, full).context("nftables (table ip6 weir)")?;
            report.written |= s6.written;
            report.rules_written += s6.commands;
            report.rules_total += s6.rules_total;
        }
        Ok(report)
    }

    fn repair(&mut self) -> anyhow::Result<bool> {
        let mut missing = self.v4.table_missing()?;
        if let Some(v6) = &mut self.v6 {
            missing |= v6.table_missing()?;
        }
        if missing {
            tracing::warn!("the nftables table weir was missing; restored");
        }
        Ok(missing)
    }
}

// === the ipvs backend ===

/// ipvs mode (see [`ipvs`]).
#[derive(Debug)]
pub struct IpvsBackend(ipvs::Ipvs);

impl IpvsBackend {
    /// A backend running its tools through `runner`.
    pub fn new(runner: Runner, config: ipvs::Config) -> Self {
        IpvsBackend(ipvs::Ipvs::new(runner, config))
    }
}

impl sync::Backend for IpvsBackend {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn sync(&mut self, ruleset: &Arc<Ruleset>, full: bool) -> anyhow::Result<sync::Report> {
        let s = self.0.sync(ruleset, full).context("ipvs")?;
        Ok(sync::Report { written: s.written, rules_written: s.written_items, rules_total: s.total })
    }

    fn repair(&mut self) -> anyhow::Result<bool> {
        let missing = self.0.ensure_jumps()?;
        if missing > 0 {
            tracing::warn!(missing, "jumps into weir's chains were missing; restored");
        }
        Ok(missing > 0)
    }
}

/// The backend that programs the kernel in `mode`, configured from `args`.
pub fn backend(mode: Mode, args: &NodeArgs, runner: Runner) -> Box<dyn sync::Backend> {
    match mode {
        Mode::Userspace => Box::new(userspace::UserspaceBackend::new(
            runner,
            userspace::Config { port_range: args.proxy_port_range, nat: args.userspace_nat },
        )),
        Mode::Nftables => Box::new(NftablesBackend::new(
            runner,
            nftables::Config {
                family: None,
                cluster_cidr: args.cluster_cidr,
                masquerade_all: args.masquerade_all,
            },
        )),
        Mode::Ipvs => Box::new(IpvsBackend::new(
            runner,
            ipvs::Config {
                scheduler: args.ipvs_scheduler,
                cluster_cidr: args.cluster_cidr,
                masquerade_all: args.masquerade_all,
            },
        )),
        Mode::Iptables => Box::new(IptablesBackend::new(
            runner,
            iptables::Config {
                family: None,
                cluster_cidr: args.cluster_cidr,
                masquerade_all: args.masquerade_all,
            },
        )),
    }
}

/// Removes everything `weir node` created through `runner`: iptables and ip6tables chains and
/// jumps; IPVS virtual services, the interface `weir-ipvs0` and the ipsets; the nftables table
/// `weir` (where those tools exist).
pub fn cleanup(runner: &Runner) -> anyhow::Result<()> {
    // First: its chain is a `WEIR-` chain, which iptables' cleanup cannot delete while the
    // jumps into it remain.
    userspace::cleanup(runner).context("userspace cleanup")?;
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let mut ipt = iptables::Iptables::new(
            runner.clone(),
            iptables::Config { family: Some(family), ..Default::default() },
        );
        match ipt.cleanup() {
            Ok(()) => {}
            Err(iptables::Error::Exec(exec::Error::Spawn { program, .. })) => {
                tracing::info!(%program, "not installed; nothing to clean up");
            }
            Err(e) if family == IpFamily::IPv6 => tracing::warn!(error = %e, "ip6tables cleanup failed"),
            Err(e) => return Err(e).context("iptables cleanup"),
        }
    }
    // After iptables: its rules refer to the ipsets.
    match ipvs::cleanup(runner) {
        Ok(()) => {}
        Err(ipvs::Error::Exec(exec::Error::Spawn { program, .. })) => {
            tracing::info!(%program, "not installed; nothing to clean up");
        }
        Err(e) => return Err(e).context("ipvs cleanup"),
    }
    // Over nf_tables netlink: no `nft` needed (weir's image has none).
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let config = nftables::Config { family: Some(family), ..Default::default() };
        if let Err(e) = nftables::Nftables::new(runner.clone(), config).cleanup() {
            tracing::info!(error = %e, ?family, "nf_tables unavailable; nothing to clean up");
        }
    }
    // Exit status 1 when the table does not exist; only a missing `nft` matters less.
    if let Err(e) = runner.status("nft", &["delete", "table", "inet", "weir"], None) {
        tracing::info!(error = %e, "nft unavailable; no inet table to clean up");
    }
    Ok(())
}

/// Removes what the modes other than `mode` left on this node (a node switched from one mode to
/// another), before `mode` writes its own: userspace mode's redirects; iptables and ipvs modes'
/// chains, virtual services and sets; nftables mode's table. Only what exists is touched (no
/// table is created on the way), so a restart in a kernel mode changes nothing. userspace mode
/// starts afresh (its proxy ports died with the last process; its redirects may have been
/// written with the other NAT tool).
pub fn cleanup_other_modes(mode: Mode, runner: &Runner) -> anyhow::Result<()> {
    userspace::cleanup(runner).context("removing userspace mode's redirects")?;
    if !matches!(mode, Mode::Iptables | Mode::Ipvs) {
        for family in [IpFamily::IPv4, IpFamily::IPv6] {
            let save = match family {
                IpFamily::IPv4 => "iptables-save",
                IpFamily::IPv6 => "ip6tables-save",
            };
            let has_chains = ["nat", "filter"].iter().any(|table| {
                runner.run(save, &["-t", table], None).is_ok_and(|out| {
                    out.stdout.lines().any(|l| l.starts_with(&format!(":{}", iptables::CHAIN_PREFIX)))
                })
            });
            if has_chains {
                tracing::info!(?family, "removing iptables mode's chains (another mode ran here)");
                let config = iptables::Config { family: Some(family), ..Default::default() };
                iptables::Iptables::new(runner.clone(), config)
                    .cleanup()
                    .context("removing iptables mode's chains")?;
            }
        }
        match ipvs::cleanup(runner) {
            Ok(()) | Err(ipvs::Error::Exec(exec::Error::Spawn { .. })) => {}
            Err(e) => return Err(e).context("removing ipvs mode's services and sets"),
        }
    }
    if mode != Mode::Nftables {
        for family in ["ip", "ip6", "inet"] {
            // Exit status 1 when the table does not exist.
            if let Ok((status, _)) = runner.status("nft", &["delete", "table", family, nftables::TABLE], None)
                && status.success()
            {
                tracing::info!(family, "removed nftables mode's table (another mode ran here)");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1").unwrap(), Duration::from_secs(1));
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn ipvs_falls_back_to_iptables_when_missing() {
        let proc_root = tempfile::tempdir().unwrap();
        let (mode, reason) = effective_mode(Mode::Ipvs, proc_root.path());
        assert_eq!(mode, Mode::Iptables);
        let reason = reason.unwrap();
        assert!(reason.contains("IPVS is unavailable") && reason.contains("net/ip_vs"), "{reason}");
        // This machine's kernel has no IPVS: the real /proc says so too.
        if !Path::new("/proc/net/ip_vs").exists() {
            let (mode, reason) = effective_mode(Mode::Ipvs, Path::new("/proc"));
            assert_eq!(mode, Mode::Iptables);
            assert!(reason.unwrap().contains("/proc/net/ip_vs"));
        }
        assert_eq!(effective_mode(Mode::Iptables, proc_root.path()), (Mode::Iptables, None));
        // Where the kernel has IPVS, ipvs mode runs.
        std::fs::create_dir(proc_root.path().join("net")).unwrap();
        std::fs::write(proc_root.path().join("net/ip_vs"), "IP Virtual Server version 1.2.1\n").unwrap();
        assert_eq!(effective_mode(Mode::Ipvs, proc_root.path()), (Mode::Ipvs, None));
    }

    /// A `PATH` of one directory holding executables named `programs`.
    fn fake_path(programs: &[&str]) -> (tempfile::TempDir, std::ffi::OsString) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for program in programs {
            let file = dir.path().join(program);
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // Not executable: does not count.
        std::fs::write(dir.path().join("nft"), "").unwrap();
        let path = dir.path().as_os_str().to_owned();
        (dir, path)
    }

    #[test]
    fn missing_kernel_tools_are_said_at_start_up() {
        let all = ["iptables-restore", "ip6tables-restore", "ipset", "conntrack"];
        let (_dir, path) = fake_path(&all);
        let check = check_tools(Mode::Ipvs, &path).unwrap();
        assert_eq!((check.mode, check.warnings.len()), (Mode::Ipvs, 0), "{check:?}");

        // No conntrack: the node runs, and says what it loses.
        let (_dir, path) = fake_path(&all[..3]);
        for mode in [Mode::Iptables, Mode::Ipvs] {
            let check = check_tools(mode, &path).unwrap();
            assert_eq!(check.mode, mode);
            assert_eq!(check.warnings.len(), 1, "{check:?}");
            assert!(check.warnings[0].starts_with("conntrack is not installed (Debian package conntrack)"));
            assert!(check.warnings[0].contains("stale UDP conntrack entries are not flushed"));
        }

        let check = check_tools(Mode::Userspace, &path).unwrap();
        assert_eq!(check.warnings.len(), 1, "{check:?}");
        assert!(check.warnings[0].contains("UDP conntrack entries NATed before userspace mode started"));

        // No ipset: ipvs mode falls back to iptables.
        let (_dir, path) = fake_path(&["iptables-restore", "ip6tables-restore", "conntrack"]);
        let check = check_tools(Mode::Ipvs, &path).unwrap();
        assert_eq!(check.mode, Mode::Iptables);
        assert_eq!(check.warnings.len(), 1);
        assert!(
            check.warnings[0].contains("ipset is not installed")
                && check.warnings[0].contains("iptables mode")
        );

        // No nft (the file there is not executable): nftables mode runs all the same (netlink).
        let (_dir, path) = fake_path(&["conntrack"]);
        let check = check_tools(Mode::Nftables, &path).unwrap();
        assert_eq!((check.mode, check.warnings.len()), (Mode::Nftables, 0), "{check:?}");
        let error = check_tools(Mode::Iptables, &path).unwrap_err();
        assert!(error.starts_with("iptables-restore is not installed (Debian package iptables)"), "{error}");
        // No ip6tables-restore: IPv4 still works.
        let (_dir, path) = fake_path(&["iptables-restore", "conntrack"]);
        let check = check_tools(Mode::Iptables, &path).unwrap();
        assert!(check.warnings.len() == 1 && check.warnings[0].contains("IPv6 Services are not programmed"));
    }

    #[test]
    fn args_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            node: NodeArgs,
        }
        let cli = Cli::try_parse_from([
            "weir",
            "--manifests",
            "/m",
            "--mode",
            "ipvs",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--min-sync-interval",
            "250ms",
            "--ipvs-scheduler",
            "mh",
        ])
        .unwrap();
        assert_eq!(cli.node.mode, Mode::Ipvs);
        assert_eq!(cli.node.ipvs_scheduler, ipvs::Scheduler::Mh);
        assert!(Cli::try_parse_from(["weir", "--ipvs-scheduler", "fifo"]).is_err());
        assert_eq!(cli.node.sync_period, Duration::from_secs(30));
        assert_eq!(cli.node.min_sync_interval, Duration::from_millis(250));
        assert_eq!(cli.node.cluster_cidr.unwrap().to_string(), "10.244.0.0/16");
        assert!(Cli::try_parse_from(["weir", "--cluster-cidr", "10.0.0.0/33"]).is_err());
        // One source: the API server (kubeconfig, else in-cluster) or a manifest directory.
        let cli = Cli::try_parse_from(["weir", "--kubeconfig", "/k"]).unwrap();
        assert_eq!(cli.node.kubeconfig.as_deref(), Some(Path::new("/k")));
        assert!(cli.node.manifests.is_none());
        assert!(Cli::try_parse_from(["weir", "--kubeconfig", "/k", "--manifests", "/m"]).is_err());
        // The load balancer: off by default, weir's class, no class required.
        assert!(!cli.node.load_balancer);
        assert_eq!(cli.node.lb_class(), lb::ipam::ClassConfig::default());
        assert_eq!((cli.node.election_id.as_str(), cli.node.election_lease_duration), ("weir-node-lb", 15));
        let cli = Cli::try_parse_from([
            "weir",
            "--load-balancer",
            "--load-balancer-class",
            "example.com/lb",
            "--load-balancer-class-required",
            "--election-lease-duration",
            "5",
        ])
        .unwrap();
        assert!(cli.node.load_balancer);
        assert_eq!(
            cli.node.lb_class(),
            lb::ipam::ClassConfig { class: "example.com/lb".into(), class_required: true }
        );
        assert!(Cli::try_parse_from(["weir", "--election-lease-duration", "1"]).is_err());
    }
}
