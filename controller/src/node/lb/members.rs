//! Which nodes are alive, for the announcer election ([`super::elect`]).
//!
//! - In a cluster ([`spawn`]): every `weir node --load-balancer` renews its own Lease
//!   `weir-node-<node>` (coordination.k8s.io/v1, in `--election-namespace`, labelled
//!   [`LIVENESS_LABEL`]) every [`RENEW_EVERY`] with a duration of [`LEASE_DURATION`]: one API
//!   write per node per second. Every node watches those Leases: a node is live while its
//!   Lease's `renewTime` changed within its duration, as observed by the watching node's own
//!   clock (clocks of different nodes are never compared, except for a Lease seen for the first
//!   time, which counts as dead when its `renewTime` is older than its duration). Nodes
//!   labelled [`EXCLUDE_LABEL`] are watched (metadata only) and excluded.
//! - This node itself may announce only until its own Lease would expire, counted from the
//!   moment it *sent* its last successful renewal ([`Membership::valid_until`]): a node cut
//!   off from the API server stops announcing no later than the others consider it dead.
//! - With `--manifests` ([`from_nodes`]): Node objects of the directory, live when `Ready`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::elect::{EXCLUDE_LABEL, Member};

/// How long a node's Lease is valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(2);
/// How often a node renews it.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The prefix of the nodes' Lease names.
pub const LEASE_PREFIX: &str = "weir-node-";
/// The label of those Leases (what the watch selects).
pub const LIVENESS_LABEL: &str = "weir.dev/node-liveness";
/// How often liveness is re-evaluated (a Lease expires without any event).
const EVALUATE_EVERY: Duration = Duration::from_millis(200);

/// The nodes as the election sees them, and how long this node may announce.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Membership {
    /// Every known node, sorted by name.
    pub members: Vec<Member>,
    /// Until when this node may announce (`None`: no limit, `--manifests`); past it, it
    /// announces nothing.
    pub valid_until: Option<Instant>,
}

impl Membership {
    /// Whether this node may announce at `now`.
    pub fn may_announce(&self, now: Instant) -> bool {
        self.valid_until.is_none_or(|until| now < until)
    }
}

/// The members of the Node objects of a manifest directory: live when their `Ready` condition
/// is `True`.
pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Membership {
    let mut members: Vec<Member> = nodes
        .into_iter()
        .map(|node| Member {
            name: node.name_any(),
            live: node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            excluded: node.labels().contains_key(EXCLUDE_LABEL),
        })
        .collect();
    members.sort();
    members.dedup_by(|a, b| a.name == b.name);
    Membership { members, valid_until: None }
}

/// The name of `node`'s Lease.
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// What is known of one Lease: its last `renewTime` and when that value was first seen here.
#[derive(Clone, Debug)]
struct Seen {
    renew_time: Option<MicroTime>,
    at: Instant,
}

/// Liveness from Leases, keeping when each renewal was observed.
#[derive(Debug, Default)]
pub struct Observer {
    seen: BTreeMap<String, Seen>,
}

impl Observer {
    /// The live state of every node holding a Lease of `leases` at `now` (`wall_now`: the wall
    /// clock, used only for a Lease seen for the first time), with `excluded` nodes marked.
    pub fn observe(
        &mut self,
        leases: &[Arc<Lease>],
        excluded: &dyn Fn(&str) -> bool,
        now: Instant,
        wall_now: k8s_openapi::jiff::Timestamp,
    ) -> Vec<Member> {
        let mut members = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for lease in leases {
            let name = lease.name_any();
            let Some(node) = name.strip_prefix(LEASE_PREFIX).map(str::to_string) else { continue };
            let spec = lease.spec.as_ref();
            let renew_time = spec.and_then(|s| s.renew_time.clone());
            let duration = spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map_or(LEASE_DURATION, Duration::from_secs);
            let seen = match self.seen.get(&name) {
                Some(s) if s.renew_time == renew_time => s.clone(),
                Some(_) => Seen { renew_time: renew_time.clone(), at: now },
                None => {
                    // First sight: trust the wall clock once, so that a dead node's old Lease is not
                    // taken for a live one after a restart.
                    let age = renew_time
                        .as_ref()
                        .and_then(|t| wall_now.duration_since(t.0).try_into().ok())
                        .unwrap_or(Duration::MAX);
                    let at = if age < duration { now } else { now.checked_sub(duration).unwrap_or(now) };
                    Seen { renew_time: renew_time.clone(), at }
                }
            };
            let live = renew_time.is_some() && now.saturating_duration_since(seen.at) < duration;
            self.seen.insert(name.clone(), seen);
            names.insert(name);
            let excluded = excluded(&node);
            members.push(Member { name: node, live, excluded });
        }
        self.seen.retain(|n, _| names.contains(n));
        members.sort();
        members
    }
}

/// Renews this node's Lease and watches the others'; publishes the [`Membership`] on each
/// change. Ends when `shutdown` turns true, deleting this node's Lease.
pub fn spawn(
    client: Client,
    namespace: String,
    node: String,
    shutdown: watch::Receiver<bool>,
) -> (watch::Receiver<Membership>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Membership { members: Vec::new(), valid_until: Some(Instant::now()) });
    (rx, tokio::spawn(run(client, namespace, node, tx, shutdown)))
}

async fn run(
    client: Client,
    namespace: String,
    node: String,
    tx: watch::Sender<Membership>,
    mut shutdown: watch::Receiver<bool>,
) {
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let changes = Arc::new(Notify::new());
    let (leases, lease_writer) = reflector::store();
    let config = watcher::Config::default().labels(&format!("{LIVENESS_LABEL}=true"));
    let lease_stream = watcher(leases_api.clone(), config).default_backoff().reflect(lease_writer);
    let (nodes, node_writer) = reflector::store::<PartialObjectMeta<Node>>();
    // Labels only: `PartialObjectMeta` makes the watch metadata-only.
    let node_stream =
        watcher(Api::<PartialObjectMeta<Node>>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(node_writer);
    let watch_leases = tokio::spawn(drive(lease_stream, "Lease", changes.clone()));
    let watch_nodes = tokio::spawn(drive(node_stream, "Node", changes.clone()));
    let (renewed_tx, mut renewed) = watch::channel(None::<Instant>);
    let renew = tokio::spawn(renew(leases_api.clone(), node.clone(), renewed_tx));
    let tasks = super::announce::AbortAll(vec![watch_leases, watch_nodes, renew]);

    let mut observer = Observer::default();
    let mut tick = tokio::time::interval(EVALUATE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let membership = evaluate(&mut observer, &leases, &nodes, &node, *renewed.borrow_and_update());
        tx.send_if_modified(|m| {
            if *m == membership {
                false
            } else {
                *m = membership;
                true
            }
        });
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            _ = changes.notified() => {}
            _ = renewed.changed() => {}
            _ = tick.tick() => {}
        }
    }
    // A clean stop: renewals end, and the Lease goes so that the others take over at once
    // rather than when it lapses.
    drop(tasks);
    let name = lease_name(&node);
    let params = kube::api::DeleteParams::default();
    let delete = leases_api.delete(&name, &params);
    match tokio::time::timeout(Duration::from_secs(2), delete).await {
        Ok(Ok(_)) => tracing::info!(lease = %name, "node Lease deleted"),
        Ok(Err(error)) => {
            tracing::warn!(lease = %name, %error, "cannot delete this node's Lease; it lapses in 2 s")
        }
        Err(_) => tracing::warn!(lease = %name, "deleting this node's Lease timed out; it lapses in 2 s"),
    }
}

fn evaluate(
    observer: &mut Observer,
    leases: &Store<Lease>,
    nodes: &Store<PartialObjectMeta<Node>>,
    node: &str,
    renewed: Option<Instant>,
) -> Membership {
    let excluded = |name: &str| {
        nodes.get(&reflector::ObjectRef::new(name)).is_some_and(|n| n.labels().contains_key(EXCLUDE_LABEL))
    };
    let now = Instant::now();
    let mut members = observer.observe(&leases.state(), &excluded, now, k8s_openapi::jiff::Timestamp::now());
    let valid_until = renewed.map(|sent| sent + LEASE_DURATION);
    // This node's own liveness is what it knows of its renewals, not what the watch says yet.
    let live = valid_until.is_some_and(|until| now < until);
    match members.iter_mut().find(|m| m.name == node) {
        Some(me) => me.live = live,
        None => {
            members.push(Member { name: node.to_string(), live, excluded: excluded(node) });
            members.sort();
        }
    }
    Membership { members, valid_until: Some(valid_until.unwrap_or(now)) }
}

/// Drives a reflector stream, notifying `changes` after each event.
async fn drive<S, K>(stream: S, what: &'static str, changes: Arc<Notify>)
where
    S: futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut failing = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => {
                if failing {
                    tracing::info!(kind = what, "watch restored");
                    failing = false;
                }
                changes.notify_one();
            }
            Err(error) if !failing => {
                tracing::warn!(kind = what, %error, "cannot watch {what}s for node liveness; retrying");
                failing = true;
            }
            Err(error) => tracing::debug!(kind = what, %error, "watch still failing"),
        }
    }
}

/// Renews `node`'s Lease every [`RENEW_EVERY`] (creating it when missing), publishing when each
/// successful renewal was sent.
async fn renew(api: Api<Lease>, node: String, renewed: watch::Sender<Option<Instant>>) {
    let name = lease_name(&node);
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let sent = Instant::now();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let duration = i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(2);
        let patch = serde_json::json!({
            "spec": { "holderIdentity": node, "leaseDurationSeconds": duration, "renewTime": now }
        });
        // A renewal that takes longer than the Lease is worth nothing.
        let params = PatchParams::default();
        let merge = Patch::Merge(&patch);
        let call = api.patch(&name, &params, &merge);
        let result = match tokio::time::timeout(LEASE_DURATION, call).await {
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some([(LIVENESS_LABEL.to_string(), "true".to_string())].into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                        holder_identity: Some(node.clone()),
                        lease_duration_seconds: Some(duration),
                        renew_time: Some(now),
                        acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                        ..Default::default()
                    }),
                };
                match tokio::time::timeout(LEASE_DURATION, api.create(&PostParams::default(), &lease)).await {
                    Ok(r) => r.map(drop).map_err(|e| e.to_string()),
                    Err(_) => Err("timed out".to_string()),
                }
            }
            Ok(r) => r.map(drop).map_err(|e| e.to_string()),
            Err(_) => Err("timed out".to_string()),
        };
        match result {
            Ok(()) => {
                if failing {
                    tracing::info!(lease = %name, "node Lease renewed again");
                    failing = false;
                }
                renewed.send_replace(Some(sent));
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(lease = %name, %error, "cannot renew this node's Lease; it stops announcing when the Lease lapses");
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lease(node: &str, renew: Option<k8s_openapi::jiff::Timestamp>) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta { name: Some(lease_name(node)), ..ObjectMeta::default() },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                lease_duration_seconds: Some(2),
                renew_time: renew.map(MicroTime),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn a_lease_is_live_while_its_renewals_are_observed() {
        let wall = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let t0 = Instant::now();
        let mut observer = Observer::default();
        let no = |_: &str| false;
        let old = wall - k8s_openapi::jiff::SignedDuration::from_secs(60);
        let leases = vec![lease("node-a", Some(wall)), lease("node-b", Some(old)), lease("node-c", None)];
        let members = observer.observe(&leases, &no, t0, wall);
        let live: Vec<(&str, bool)> = members.iter().map(|m| (m.name.as_str(), m.live)).collect();
        // Fresh, stale at first sight, never renewed.
        assert_eq!(live, [("node-a", true), ("node-b", false), ("node-c", false)]);

        // node-a stops renewing: dead once its duration passed on our clock, whatever the
        // wall clock says.
        let later = t0 + Duration::from_millis(1900);
        assert!(observer.observe(&leases, &no, later, old).iter().find(|m| m.name == "node-a").unwrap().live);
        let later = t0 + Duration::from_millis(2100);
        assert!(
            !observer.observe(&leases, &no, later, old).iter().find(|m| m.name == "node-a").unwrap().live
        );

        // node-b renews (its clock is a minute behind ours): live from now on.
        let leases = vec![lease("node-a", Some(wall)), lease("node-b", Some(old + Duration::from_secs(1)))];
        let excluded = |n: &str| n == "node-b";
        let members = observer.observe(&leases, &excluded, later, wall);
        let b = members.iter().find(|m| m.name == "node-b").unwrap();
        assert!(b.live && b.excluded && !b.eligible());
        assert_eq!(members.len(), 2, "a deleted Lease is forgotten");
    }

    #[test]
    fn manifest_nodes_are_live_when_ready() {
        let text = "apiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n\
            status: {conditions: [{type: Ready, status: 'True'}]}\n---\n\
            apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {node.kubernetes.io/exclude-from-external-load-balancers: ''}}\n\
            status: {conditions: [{type: Ready, status: 'True'}]}\n---\n\
            apiVersion: v1\nkind: Node\nmetadata: {name: node-c}\n\
            status: {conditions: [{type: MemoryPressure, status: 'True'}, {type: Ready, status: 'Unknown'}]}\n";
        let nodes: Vec<Node> = text.split("---\n").map(|d| serde_saphyr::from_str(d).unwrap()).collect();
        let m = from_nodes(&nodes);
        let got: Vec<(&str, bool, bool)> =
            m.members.iter().map(|m| (m.name.as_str(), m.live, m.excluded)).collect();
        assert_eq!(got, [("node-a", true, true), ("node-b", true, false), ("node-c", false, false)]);
        assert!(m.may_announce(Instant::now()));
    }
}
