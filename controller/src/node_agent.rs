//! `weir node`'s loop: a source of Services and endpoints feeds the pure [`plan::plan`], whose
//! rulesets the [`sync`] loop applies through a kernel backend ([`node::backend`]).
//!
//! The wiring lives here, beside `serve.rs`, so that the node module only reads snapshots
//! ([`crate::snapshot`]) and knows nothing of the sources that fill them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::{mpsc, watch};

use weir_dataplane::model::ObjectRef;

use crate::lb_agent::{self, LbOptions, ManifestLb};
use crate::node::exec::Runner;
use crate::node::lb::announce::{self as announce, LbStatus, Targets};
use crate::node::lb::members::{self, Membership};
use crate::node::lb::{elect, l2};
use crate::node::plan::{self, PlanConfig, PlanWarning, Ruleset};
use crate::node::{self, NodeArgs, admin, sync};
use crate::snapshot::Snapshot;
use crate::source::files::{self, ManifestDir};
use crate::source::kube::{self as kube_source, Kinds, KubeOptions, KubeSource};

/// This node's name: `--node-name`, else the hostname.
fn node_name(args: &NodeArgs) -> Option<String> {
    args.node_name.clone().filter(|n| !n.is_empty()).or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
    })
}

/// Runs `weir node` until interrupted (or, with `--cleanup`, cleans up and returns).
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    run_with_stats(args, Arc::new(sync::Stats::default())).await
}

/// [`run`], recording into `stats` (register them with [`sync::Stats::register`] to serve them).
pub async fn run_with_stats(args: NodeArgs, stats: Arc<sync::Stats>) -> anyhow::Result<()> {
    let runner = Runner::host();
    if args.cleanup {
        node::cleanup(&runner)?;
        tracing::info!("removed weir node's rules");
        return Ok(());
    }
    let (mode, fallback) = node::effective_mode(args.mode, Path::new("/proc"));
    if let Some(reason) = fallback {
        tracing::warn!("{reason}");
    }
    // Said once, clearly, at start-up, rather than as a failure at every sync.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let node::ToolCheck { mode, warnings } = node::check_tools(mode, &path).map_err(anyhow::Error::msg)?;
    for warning in warnings {
        tracing::error!("{warning}");
    }
    let mut args = args;
    if mode == node::Mode::Userspace {
        args.userspace_nat = args.userspace_nat.resolve(&path)?;
        tracing::info!(nat = ?args.userspace_nat, "userspace mode: redirects written with {}", match args.userspace_nat {
            node::userspace::NatTool::Nftables => "nftables (table weir_userspace)",
            _ => "iptables (nat chain WEIR-USERSPACE)",
        });
    }
    // A node switched from another mode: its rules go before this mode writes its own.
    node::cleanup_other_modes(mode, &runner)?;
    // A configuration problem is a usage error (exit at once); an unreachable API server is
    // retried.
    let source = match &args.manifests {
        Some(dir) => Source::Manifests(dir.clone()),
        None => Source::Kube(kube_source::connect(args.kubeconfig.as_deref()).await?),
    };
    let config = PlanConfig { node_name: node_name(&args) };
    let from = match &source {
        Source::Manifests(dir) => dir.display().to_string(),
        Source::Kube(_) => "the Kubernetes API".to_string(),
    };
    tracing::info!(mode = ?mode, node = ?config.node_name, source = %from, "weir node starting");
    // userspace mode's proxy reports on the admin listener.
    let l4_metrics = crate::metrics_l4::L4Metrics::default();
    let backend: Box<dyn sync::Backend> = if mode == node::Mode::Userspace {
        let backend = node::userspace::UserspaceBackend::new(
            runner,
            node::userspace::Config { port_range: args.proxy_port_range, nat: args.userspace_nat },
        );
        l4_metrics.observe(backend.proxy());
        Box::new(backend)
    } else {
        node::backend(mode, &args, runner)
    };
    let options = sync::Options {
        sync_period: args.sync_period,
        min_sync_interval: args.min_sync_interval,
        ..sync::Options::default()
    };
    let admin_listener = tokio::net::TcpListener::bind(args.listen_admin)
        .await
        .with_context(|| format!("binding the admin listener on {}", args.listen_admin))?;
    // The announcer opens its sockets before anything else runs: a bad --lb-interface is a
    // usage error.
    let announcer = match (args.load_balancer, args.lb_announce) {
        (true, node::LbAnnounce::L2) => l2_announcer(&args)?,
        _ => None,
    };
    let lb_status = Arc::new(LbStatus::default());
    let mut admin = admin::Admin::new(stats.clone(), args.sync_period);
    if args.load_balancer {
        admin = admin.with_lb(lb_status.clone());
    }
    if mode == node::Mode::Userspace {
        admin = admin.with_l4(l4_metrics);
    }
    let admin = Arc::new(admin);
    tracing::info!(admin = %admin_listener.local_addr()?, "serving /healthz and /metrics");
    let admin_task = AbortOnDrop(tokio::spawn(admin::serve(admin_listener, admin)));
    let (tx, rx) = watch::channel(None);
    let mut publisher = Publisher { config, tx, warnings: Vec::new(), lb: None, announce: None };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut lb_task = None;
    let mut members_task = None;
    let mut announce_tasks = Vec::new();
    if args.load_balancer {
        let (targets_tx, targets_rx) = watch::channel(Targets::default());
        let node = node_name(&args).unwrap_or_else(|| "weir-node".to_string());
        let (members_rx, events) = match &source {
            Source::Manifests(dir) => {
                publisher.lb = Some(ManifestLb::new(args.lb_class(), dir));
                let (members_tx, members_rx) = watch::channel(Membership::default());
                publisher.announce = Some(Announce {
                    class: args.lb_class(),
                    targets: targets_tx,
                    members: Some(members_tx),
                    node: node.clone(),
                    alone: false,
                });
                (members_rx, None)
            }
            Source::Kube(client) => {
                let options = lb_options(&args);
                tracing::info!(class = %options.class.class, lease = %options.lease, identity = %options.identity, "load balancer enabled");
                lb_task = Some(lb_agent::spawn(client.clone(), options, shutdown_rx.clone()));
                publisher.announce = Some(Announce {
                    class: args.lb_class(),
                    targets: targets_tx,
                    members: None,
                    node: node.clone(),
                    alone: false,
                });
                let recorder = kube::runtime::events::Recorder::new(
                    client.clone(),
                    kube::runtime::events::Reporter {
                        controller: "weir.dev/node-lb".to_string(),
                        instance: Some(node.clone()),
                    },
                );
                if announcer.is_some() {
                    let (members_rx, task) = members::spawn(
                        client.clone(),
                        args.election_namespace.clone(),
                        node.clone(),
                        shutdown_rx.clone(),
                    );
                    members_task = Some(task);
                    (members_rx, Some(recorder))
                } else {
                    (watch::channel(Membership::default()).1, None)
                }
            }
        };
        if let Some((announcer, interfaces)) = announcer {
            let options = announce::LoopOptions { node, interfaces, events };
            announce_tasks.push(AbortOnDrop(tokio::spawn(announce::run(
                options,
                Box::new(announcer),
                targets_rx,
                members_rx,
                lb_status.clone(),
            ))));
        } else {
            let why = match args.lb_announce {
                node::LbAnnounce::None => "--lb-announce none",
                node::LbAnnounce::L2 => "no --lb-interface and no default route",
            };
            lb_status.set_unannounced(&node, why);
        }
    }
    let source = match source {
        Source::Kube(client) => tokio::spawn(watch_kube(client, publisher)),
        Source::Manifests(dir) => tokio::spawn(watch_manifests(dir, publisher)),
    };
    let result = tokio::select! {
        result = sync::run(backend, rx, options, stats) => result,
        result = source => result?,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("interrupted; the rules stay in place (use --cleanup to remove them)");
            Ok(())
        }
    };
    drop(admin_task);
    // Announcing stops first (the sockets close), then this node's liveness Lease is deleted so
    // that the others take over at once (after a crash they do when it lapses; with --manifests,
    // when the Node turns not Ready).
    drop(announce_tasks);
    // The load balancer releases its Lease, so that another replica takes over at once.
    shutdown_tx.send_replace(true);
    if let Some(task) = members_task
        && tokio::time::timeout(Duration::from_secs(3), task).await.is_err()
    {
        tracing::warn!("this node's liveness Lease was not deleted within 3 s");
    }
    if let Some(task) = lb_task
        && tokio::time::timeout(Duration::from_secs(5), task).await.is_err()
    {
        tracing::warn!("the load balancer did not stop within 5 s");
    }
    result
}

/// The L2 announcer on `--lb-interface`s (default: the default route's interface), with their
/// names; `None` (logged) when no interface is named and there is no default route.
fn l2_announcer(args: &NodeArgs) -> anyhow::Result<Option<(l2::L2Announcer, Vec<String>)>> {
    let names = if args.lb_interfaces.is_empty() {
        match l2::default_route_interface() {
            Ok(name) => vec![name],
            Err(error) => {
                tracing::warn!("{error:#}; LoadBalancer addresses are assigned but not announced");
                return Ok(None);
            }
        }
    } else {
        args.lb_interfaces.clone()
    };
    let interfaces = names.iter().map(|n| l2::Interface::lookup(n)).collect::<anyhow::Result<Vec<_>>>()?;
    let announcer = l2::L2Announcer::start(&interfaces)?;
    Ok(Some((announcer, names)))
}

/// The load balancer's settings from `weir node`'s flags.
fn lb_options(args: &NodeArgs) -> LbOptions {
    let identity = args.election_identity.clone().unwrap_or_else(|| {
        format!("{}-{}", node_name(args).unwrap_or_else(|| "weir-node".to_string()), std::process::id())
    });
    LbOptions {
        class: args.lb_class(),
        lease: ObjectRef::new(&args.election_namespace, &args.election_id),
        lease_duration: Duration::from_secs(args.election_lease_duration),
        identity,
        controller_name: "weir.dev/node-lb".to_string(),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where `weir node` reads Services and endpoints from.
enum Source {
    /// `--manifests DIR`.
    Manifests(PathBuf),
    /// The Kubernetes API.
    Kube(kube::Client),
}

/// Plans snapshots and publishes each ruleset that differs from the last one.
struct Publisher {
    config: PlanConfig,
    tx: watch::Sender<Option<Arc<Ruleset>>>,
    /// The plan warnings last logged (a new plan logs them again only when they change).
    warnings: Vec<PlanWarning>,
    /// With `--manifests --load-balancer`: the assignment, written into each snapshot.
    lb: Option<ManifestLb>,
    /// With `--load-balancer`: where the addresses to announce (and, with `--manifests`, the
    /// Nodes) go.
    announce: Option<Announce>,
}

/// The announcing loop's inputs.
struct Announce {
    class: crate::node::lb::ipam::ClassConfig,
    targets: watch::Sender<Targets>,
    /// With `--manifests`: the Node objects of the directory.
    members: Option<watch::Sender<Membership>>,
    /// This node's name.
    node: String,
    /// Whether the directory holds no Node object (this node then announces alone; logged once).
    alone: bool,
}

impl Publisher {
    fn publish(&mut self, snapshot: &Snapshot) {
        let assigned;
        let snapshot = match &mut self.lb {
            Some(lb) => {
                assigned = lb.apply(snapshot).0;
                &assigned
            }
            None => snapshot,
        };
        if let Some(announce) = &mut self.announce {
            let targets = Targets {
                list: elect::targets(snapshot, &announce.class),
                uids: snapshot
                    .services
                    .iter()
                    .filter_map(|(k, s)| s.metadata.uid.clone().map(|u| (k.clone(), u)))
                    .collect(),
            };
            announce.targets.send_if_modified(|t| {
                if *t == targets {
                    false
                } else {
                    *t = targets;
                    true
                }
            });
            if let (Some(members), Some(lb)) = (&announce.members, &self.lb) {
                let mut membership = lb.membership().clone();
                let alone = membership.members.is_empty();
                if alone {
                    // No Node object to elect among: a single-node set-up, this node announces.
                    membership.members.push(elect::Member {
                        name: announce.node.clone(),
                        live: true,
                        excluded: false,
                    });
                    if !announce.alone {
                        tracing::warn!(node = %announce.node, "no Node object in the manifests: this node announces every address alone (add Node objects when several nodes share the directory)");
                    }
                }
                announce.alone = alone;
                members.send_if_modified(|m| {
                    if *m == membership {
                        false
                    } else {
                        *m = membership;
                        true
                    }
                });
            }
        }
        let ruleset = plan::plan(snapshot, &self.config);
        if ruleset.warnings != self.warnings {
            for w in &ruleset.warnings {
                tracing::warn!(object = %w.object, "{}", w.reason);
            }
            self.warnings = ruleset.warnings.clone();
        }
        if self.tx.borrow().as_deref() != Some(&ruleset) {
            self.tx.send_replace(Some(Arc::new(ruleset)));
        }
    }

    fn published(&self) -> bool {
        self.tx.borrow().is_some()
    }
}

/// How long a manifest file truncated and still open for writing may keep a scan waiting: an
/// empty read is a valid manifest without Services, which would remove every rule until the
/// writer's next write.
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// Reads the manifest directory, plans, and publishes each new ruleset. A burst of
/// notifications is read once it settles ([`files::settle`]): files written in place are read
/// once closed, not half-written.
async fn watch_manifests(dir: PathBuf, mut publisher: Publisher) -> anyhow::Result<()> {
    let mut source = ManifestDir::new(&dir);
    let (wake_tx, mut wake) = mpsc::channel(1);
    let (_guard, seen) = files::watch_paths(&dir, wake_tx, Duration::from_secs(2))?;
    let mut everything = true;
    let mut paths = std::collections::BTreeSet::new();
    loop {
        let scan = if everything { source.rescan(true) } else { source.rescan_paths(&paths) };
        let scan = scan.with_context(|| format!("reading {}", dir.display()))?;
        // Pools are not objects of the snapshot: re-read at every change of the directory.
        let pools_changed = publisher.lb.as_mut().is_some_and(|lb| lb.reload());
        if scan.changed || pools_changed || !publisher.published() {
            let (snapshot, duplicates) = source.snapshot();
            for d in duplicates {
                tracing::warn!("{d}");
            }
            publisher.publish(&snapshot);
        }
        if wake.recv().await.is_none() {
            return Ok(());
        }
        // Also after a poll: a file may be open for writing, truncated.
        files::settle(&seen, &mut wake, WRITE_WAIT).await;
        let taken = std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()));
        (everything, paths) = (taken.everything, taken.paths);
    }
}

/// Watches Services and endpoints through the API server and publishes a ruleset after every
/// burst of changes (debounced by the source; the sync loop rate-limits further). Nothing is
/// published before every list has completed: an early, partial ruleset would remove the
/// rules of services not listed yet. While the API server is unreachable, the stores and so
/// the rules stay as they were.
async fn watch_kube(client: kube::Client, mut publisher: Publisher) -> anyhow::Result<()> {
    let endpoints_api = kube_source::discover_endpoints_api_retrying(&client).await;
    let options = KubeOptions { kinds: Kinds::Services, ..KubeOptions::default() };
    let source = KubeSource::start(&client, &options, endpoints_api);
    let started = std::time::Instant::now();
    if !source.wait_until_synced().await {
        anyhow::bail!("a watch of the Kubernetes API stopped before its first list");
    }
    tracing::info!(sync_ms = started.elapsed().as_millis() as u64, "Services and endpoints listed");
    loop {
        publisher.publish(&source.stores.snapshot());
        source.next_burst().await;
    }
}
