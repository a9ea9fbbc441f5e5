//! `weir node --load-balancer`: the impure edges of the Service load balancer.
//!
//! - In a cluster ([`spawn`]): every replica watches Services, Namespaces and `IPAddressPool`s;
//!   the one holding the Lease assigns ([`ipam::assign`]) and writes: Services'
//!   `status.loadBalancer.ingress`, pools' `status` counts, and Events (a refused Service, an
//!   address kept outside every pool, a refused pool). Writes are idempotent: nothing is written
//!   when the object already says the right thing, and an Event is published once per distinct
//!   message. Addresses stay stable across restarts because every Service's status is read back
//!   as what it holds before anything new is assigned.
//! - With `--manifests` ([`ManifestLb`]): pools (and Namespaces, for `namespaceSelectors`) are
//!   read from the directory, and the assignment goes straight into the snapshot the node plan
//!   programs (there is no API server to hold the status).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use weir_dataplane::model::ObjectRef;

use crate::node::lb::ipam::{self, Assignment, ClassConfig, Outcome, Request};
use crate::node::lb::pool::{self, IpAddressPool, IpAddressPoolStatus, Pool, PoolError};
use crate::node::lb::{self as lb, status_ips};
use crate::snapshot::Snapshot;

/// How often the leader re-checks everything without a change.
const RESYNC: Duration = Duration::from_secs(30);
/// Changes arriving within this long of each other are handled together.
const HOLDOFF: Duration = Duration::from_millis(100);

/// Settings of the assigning loop.
#[derive(Clone, Debug)]
pub struct LbOptions {
    /// Which Services are weir's.
    pub class: ClassConfig,
    /// The Lease electing the replica that assigns.
    pub lease: ObjectRef,
    /// How long the Lease is valid without renewal.
    pub lease_duration: Duration,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// The reporting controller of Events.
    pub controller_name: String,
}

/// Starts the assigning loop: watches, leader election, and, while leader, the writes. Ends
/// when `shutdown` turns true (releasing the Lease).
pub fn spawn(client: Client, options: LbOptions, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(run(client, options, shutdown))
}

/// Starts a reflector of `api`, notifying `changes` after its first list and every change.
fn reflect<K>(api: Api<K>, what: &'static str, changes: Arc<Notify>) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    // Every Service of the cluster is held: without what nothing here reads.
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object: &mut K| {
            object.managed_fields_mut().clear();
            object.annotations_mut().remove(crate::source::trim::LAST_APPLIED);
        })
        .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => {
                    if failing {
                        tracing::info!(kind = what, "watch restored");
                        failing = false;
                    }
                    changes.notify_one();
                }
                Err(error) if !failing => {
                    // Said once per outage; the watcher retries with backoff.
                    let hint = if what == "IPAddressPool" {
                        " (is the CRD of examples/kubernetes/ipaddresspool-crd.yaml installed?)"
                    } else {
                        ""
                    };
                    tracing::warn!(kind = what, %error, "cannot watch {what}s{hint}; retrying");
                    failing = true;
                }
                Err(error) => tracing::debug!(kind = what, %error, "watch still failing"),
            }
        }
    });
    (reader, task)
}

async fn run(client: Client, options: LbOptions, mut shutdown: watch::Receiver<bool>) {
    let changes = Arc::new(Notify::new());
    let (services, t1) = reflect(Api::<Service>::all(client.clone()), "Service", changes.clone());
    let (pools, t2) = reflect(Api::<IpAddressPool>::all(client.clone()), "IPAddressPool", changes.clone());
    let (namespaces, t3) = reflect(Api::<Namespace>::all(client.clone()), "Namespace", changes.clone());
    let _tasks = AbortAll(vec![t1, t2, t3]);

    let election = "the load balancer's election";
    let Some(manager) = crate::status::lease_manager(
        &client,
        &options.lease,
        &options.identity,
        options.lease_duration,
        election,
        &mut shutdown,
    )
    .await
    else {
        return;
    };
    let (mut leader, lease_task) = manager.watch().await;

    // Nothing is assigned before every list completed: a partial view would hand out addresses
    // held by Services not listed yet.
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => return,
        _ = async {
            let _ = services.wait_until_ready().await;
            let _ = pools.wait_until_ready().await;
            let _ = namespaces.wait_until_ready().await;
        } => {}
    }
    tracing::info!("load balancer: Services, Namespaces and IPAddressPools listed");

    let mut writer = Writer::new(client.clone(), &options);
    let mut is_leader = *leader.borrow_and_update();
    if is_leader {
        tracing::info!(identity = %options.identity, lease = %options.lease, "this replica assigns LoadBalancer addresses");
    }
    let mut resync = tokio::time::interval(RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if is_leader {
            let view =
                View { services: services.state(), pools: pools.state(), namespaces: namespaces.state() };
            writer.reconcile(&view).await;
        }
        let mut burst = false;
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            changed = leader.changed() => {
                if changed.is_err() {
                    tracing::warn!("the load balancer's election stopped; this replica no longer assigns");
                    break;
                }
                is_leader = *leader.borrow_and_update();
                if is_leader {
                    tracing::info!(identity = %options.identity, lease = %options.lease, "this replica assigns LoadBalancer addresses");
                    writer.forget();
                } else {
                    tracing::info!(identity = %options.identity, "this replica no longer assigns LoadBalancer addresses");
                }
            }
            _ = changes.notified() => burst = true,
            _ = resync.tick() => {}
        }
        if burst {
            // A burst of changes is handled once.
            tokio::time::sleep(HOLDOFF).await;
        }
    }
    drop(leader);
    match tokio::time::timeout(Duration::from_secs(3), lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!(lease = %options.lease, "load balancer leadership released"),
        Ok(Ok(Err(error))) => tracing::warn!(%error, "releasing the load balancer's Lease failed"),
        Ok(Err(error)) => tracing::warn!(%error, "the load balancer's election task failed"),
        Err(_) => tracing::warn!("releasing the load balancer's Lease timed out"),
    }
}

/// Aborts its tasks when dropped.
struct AbortAll(Vec<JoinHandle<()>>);

impl Drop for AbortAll {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What the stores hold at one moment.
struct View {
    services: Vec<Arc<Service>>,
    pools: Vec<Arc<IpAddressPool>>,
    namespaces: Vec<Arc<Namespace>>,
}

/// Labels of every namespace, by name.
fn namespace_labels(namespaces: &[Arc<Namespace>]) -> BTreeMap<String, BTreeMap<String, String>> {
    namespaces.iter().map(|n| (n.name_any(), n.labels().clone())).collect()
}

/// The pure step of a reconcile: the requests of the Services weir handles and their
/// assignment. `held` overrides a Service's status when the store has not caught up with
/// our own write yet.
fn plan(
    class: &ClassConfig,
    services: &[Arc<Service>],
    pools: &[Pool],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    held: impl Fn(&ObjectRef, &Service) -> Option<Vec<IpAddr>>,
) -> Assignment {
    let empty = BTreeMap::new();
    let requests: Vec<Request> = services
        .iter()
        .filter(|svc| class.handles(svc))
        .map(|svc| {
            let key = crate::snapshot::key(&svc.metadata);
            let labels = namespaces.get(&key.namespace).unwrap_or(&empty);
            let mut request = Request::from_service(svc, labels);
            if let Some(ips) = held(&key, svc) {
                request.current = ips;
            }
            request
        })
        .collect();
    ipam::assign(pools, &requests)
}

/// The leader's writes, with what it already wrote.
struct Writer {
    client: Client,
    class: ClassConfig,
    recorder: Recorder,
    /// The reporting controller and instance of Events (for those the recorder cannot write).
    reporter: (String, String),
    /// Per Service: the addresses written and the resourceVersion seen before the write, so a
    /// store that has not caught up with our own write does not cause a second one.
    written: BTreeMap<ObjectRef, (Vec<IpAddr>, Option<String>)>,
    /// Pool statuses written, with the resourceVersion seen before.
    pool_status: BTreeMap<String, (IpAddressPoolStatus, Option<String>)>,
    /// Event messages already published, per object.
    emitted: BTreeSet<(String, String)>,
}

impl Writer {
    fn new(client: Client, options: &LbOptions) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: options.controller_name.clone(),
                instance: Some(options.identity.clone()),
            },
        );
        Writer {
            client,
            class: options.class.clone(),
            recorder,
            reporter: (options.controller_name.clone(), options.identity.clone()),
            written: BTreeMap::new(),
            pool_status: BTreeMap::new(),
            emitted: BTreeSet::new(),
        }
    }

    /// Forgets what it wrote (a new term: everything is checked again).
    fn forget(&mut self) {
        self.written.clear();
        self.pool_status.clear();
    }

    async fn reconcile(&mut self, view: &View) {
        let raw: Vec<IpAddressPool> = view.pools.iter().map(|p| (**p).clone()).collect();
        let (pools, errors) = pool::validate(&raw);
        let namespaces = namespace_labels(&view.namespaces);
        let written = &self.written;
        let assignment = plan(&self.class, &view.services, &pools, &namespaces, |key, svc| {
            written
                .get(key)
                .filter(|(_, version)| *version == svc.resource_version())
                .map(|(ips, _)| ips.clone())
        });
        let mut events = Vec::new();
        self.write_services(view, &pools, &assignment, &mut events).await;
        for note in &assignment.notes {
            if let Some(svc) = find(&view.services, &note.service) {
                events.push((
                    svc.object_ref(&()),
                    EventType::Warning,
                    "AddressOutsidePools",
                    note.message.clone(),
                ));
            }
        }
        for e in &errors {
            if let Some(p) = view.pools.iter().find(|p| p.name_any() == e.pool) {
                events.push((p.object_ref(&()), EventType::Warning, "InvalidPool", e.reason.clone()));
            }
        }
        self.write_pools(view, &assignment, &errors).await;
        self.publish(events).await;
    }

    async fn write_services(
        &mut self,
        view: &View,
        pools: &[Pool],
        assignment: &Assignment,
        events: &mut Vec<(ObjectReference, EventType, &'static str, String)>,
    ) {
        let keys: BTreeSet<ObjectRef> =
            view.services.iter().map(|s| crate::snapshot::key(&s.metadata)).collect();
        self.written.retain(|k, _| keys.contains(k));
        for svc in &view.services {
            let key = crate::snapshot::key(&svc.metadata);
            let current = status_ips(svc);
            let desired: Vec<IpAddr> = match assignment.services.get(&key) {
                Some(Outcome::Assigned(ips)) => ips.clone(),
                Some(Outcome::Refused(refusal)) => {
                    events.push((
                        svc.object_ref(&()),
                        EventType::Warning,
                        refusal.reason(),
                        refusal.to_string(),
                    ));
                    Vec::new()
                }
                // Not weir's (any more): take back what weir gave it. Addresses of weir's pools
                // on a Service that is no LoadBalancer any more are weir's too (after a
                // restart nothing else says so).
                None if current.is_empty() => continue,
                None => {
                    let ours = self.written.get(&key).is_some_and(|(ips, _)| *ips == current)
                        || (!is_load_balancer(svc)
                            && current.iter().all(|ip| pools.iter().any(|p| p.contains(*ip))));
                    if !ours {
                        continue;
                    }
                    Vec::new()
                }
            };
            if current == desired {
                continue;
            }
            let version = svc.resource_version();
            if self.written.get(&key) == Some(&(desired.clone(), version.clone())) {
                continue; // our write is on its way to the store
            }
            let api = Api::<Service>::namespaced(self.client.clone(), &key.namespace);
            let ingress = if desired.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::json!(lb::ingress_of(&desired))
            };
            let patch = serde_json::json!({ "status": { "loadBalancer": { "ingress": ingress } } });
            match api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    let shown: Vec<String> = desired.iter().map(ToString::to_string).collect();
                    tracing::info!(service = %key, addresses = ?shown, "LoadBalancer status updated");
                    if !desired.is_empty() {
                        events.push((
                            svc.object_ref(&()),
                            EventType::Normal,
                            "AddressAssigned",
                            format!("assigned {}", shown.join(", ")),
                        ));
                    }
                    self.written.insert(key, (desired, version));
                }
                Err(error) => tracing::warn!(service = %key, %error, "cannot update the LoadBalancer status"),
            }
        }
    }

    async fn write_pools(&mut self, view: &View, assignment: &Assignment, errors: &[PoolError]) {
        let names: BTreeSet<String> = view.pools.iter().map(|p| p.name_any()).collect();
        self.pool_status.retain(|k, _| names.contains(k));
        let cap = |n: u128| u64::try_from(n).unwrap_or(u64::MAX).min(i64::MAX as u64);
        for p in &view.pools {
            let name = p.name_any();
            let desired = match assignment.usage.get(&name) {
                Some(u) => IpAddressPoolStatus {
                    assigned_ipv4: cap(u.assigned_v4),
                    assigned_ipv6: cap(u.assigned_v6),
                    available_ipv4: cap(u.available_v4),
                    available_ipv6: cap(u.available_v6),
                    error: None,
                },
                None => IpAddressPoolStatus {
                    error: errors.iter().find(|e| e.pool == name).map(|e| e.reason.clone()),
                    ..IpAddressPoolStatus::default()
                },
            };
            if p.status.as_ref() == Some(&desired) {
                continue;
            }
            let version = p.resource_version();
            if self.pool_status.get(&name) == Some(&(desired.clone(), version.clone())) {
                continue;
            }
            let api = Api::<IpAddressPool>::all(self.client.clone());
            let patch = serde_json::json!({ "status": desired });
            match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    self.pool_status.insert(name, (desired, version));
                }
                Err(error) => tracing::warn!(pool = %name, %error, "cannot update the IPAddressPool status"),
            }
        }
    }

    /// Publishes each Event whose message was not published yet for its object (a message that
    /// went away and came back is published again), and logs each new warning.
    async fn publish(&mut self, events: Vec<(ObjectReference, EventType, &'static str, String)>) {
        let id = |r: &ObjectReference| {
            format!(
                "{}/{}/{}",
                r.kind.as_deref().unwrap_or_default(),
                r.namespace.as_deref().unwrap_or_default(),
                r.name.as_deref().unwrap_or_default()
            )
        };
        let current: BTreeSet<(String, String)> =
            events.iter().filter(|e| e.1 == EventType::Warning).map(|e| (id(&e.0), e.3.clone())).collect();
        // Warnings are remembered while they last; Normal events are emitted at each change.
        self.emitted.retain(|e| current.contains(e));
        for (reference, type_, reason, note) in events {
            let key = (id(&reference), note.clone());
            if type_ == EventType::Warning {
                if self.emitted.contains(&key) {
                    continue;
                }
                // Logged once, as the Event is published.
                tracing::warn!(object = %key.0, reason, "{note}");
            }
            let event = Event {
                type_,
                reason: reason.to_string(),
                note: Some(note),
                action: "AssignAddress".to_string(),
                secondary: None,
            };
            let published = if reference.namespace.is_none() {
                self.publish_cluster_scoped(&event, &reference).await
            } else {
                self.recorder.publish(&event, &reference).await
            };
            match published {
                Ok(()) => {
                    if type_ == EventType::Warning {
                        self.emitted.insert(key);
                    }
                }
                Err(error) => tracing::warn!(object = %key.0, %error, "cannot publish an Event"),
            }
        }
    }
}

/// The namespace of Events about cluster-scoped objects: the API servers that validate
/// `events.k8s.io/v1` strictly (1.20 among them) accept them only there.
const CLUSTER_EVENTS_NAMESPACE: &str = "kube-system";

impl Writer {
    /// Publishes an Event about a cluster-scoped object (an `IPAddressPool`) in
    /// [`CLUSTER_EVENTS_NAMESPACE`], where kube's recorder (which uses `default`) cannot.
    async fn publish_cluster_scoped(&self, event: &Event, reference: &ObjectReference) -> kube::Result<()> {
        use k8s_openapi::api::events::v1::Event as K8sEvent;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = reference.name.as_deref().unwrap_or("object");
        let object = K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(CLUSTER_EVENTS_NAMESPACE.to_string()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(match event.type_ {
                EventType::Normal => "Normal".to_string(),
                EventType::Warning => "Warning".to_string(),
            }),
            regarding: Some(reference.clone()),
            event_time: Some(MicroTime(now)),
            reporting_controller: Some(self.reporter.0.clone()),
            reporting_instance: Some(self.reporter.1.clone()),
            ..K8sEvent::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), CLUSTER_EVENTS_NAMESPACE);
        api.create(&kube::api::PostParams::default(), &object).await.map(drop)
    }
}

fn find<'a>(services: &'a [Arc<Service>], key: &ObjectRef) -> Option<&'a Arc<Service>> {
    services.iter().find(|s| crate::snapshot::key(&s.metadata) == *key)
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

// === --manifests ===

/// The load balancer where no API server holds the status: pools read from the manifest
/// directory, the assignment written into the snapshot the node plan reads.
#[derive(Debug)]
pub struct ManifestLb {
    class: ClassConfig,
    dir: PathBuf,
    pools: Vec<Pool>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The addresses of the last assignment (stable from one change to the next).
    last: BTreeMap<ObjectRef, Vec<IpAddr>>,
    /// The Node objects of the directory, as announcer election members.
    members: crate::node::lb::members::Membership,
    /// What was logged last (logged again only when it changes).
    logged: BTreeSet<String>,
}

impl ManifestLb {
    /// Pools from `dir`, Services of `class`.
    pub fn new(class: ClassConfig, dir: &Path) -> Self {
        ManifestLb {
            class,
            dir: dir.to_path_buf(),
            pools: Vec::new(),
            namespaces: BTreeMap::new(),
            last: BTreeMap::new(),
            members: crate::node::lb::members::Membership::default(),
            logged: BTreeSet::new(),
        }
    }

    /// Re-reads the pools and Namespaces; returns whether they changed. Refused pools and
    /// unreadable documents are logged (once per distinct message); the others are used.
    pub fn reload(&mut self) -> bool {
        let read = read_dir(&self.dir);
        let (pools, errors) = pool::validate(&read.pools);
        let mut messages: BTreeSet<String> = read.errors.into_iter().collect();
        messages.extend(errors.iter().map(ToString::to_string));
        for m in messages.difference(&self.logged) {
            tracing::error!("{m}; the other pools are used");
        }
        self.logged = messages;
        let members = crate::node::lb::members::from_nodes(&read.nodes);
        let changed = pools != self.pools || read.namespaces != self.namespaces || members != self.members;
        self.pools = pools;
        self.namespaces = read.namespaces;
        self.members = members;
        changed
    }

    /// The Node objects of the directory as election members (live when `Ready`).
    pub fn membership(&self) -> &crate::node::lb::members::Membership {
        &self.members
    }

    /// The pools in use.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// `snapshot` with the addresses assigned now in its Services' status (refused Services
    /// with none), and the assignment.
    pub fn apply(&mut self, snapshot: &Snapshot) -> (Snapshot, Assignment) {
        let services: Vec<Arc<Service>> = snapshot.services.shared().values().cloned().collect();
        let last = &self.last;
        let assignment =
            plan(&self.class, &services, &self.pools, &self.namespaces, |key, _| last.get(key).cloned());
        let addresses: BTreeMap<ObjectRef, Vec<IpAddr>> =
            assignment.services.keys().map(|k| (k.clone(), assignment.addresses(k).to_vec())).collect();
        for (key, outcome) in &assignment.services {
            match outcome {
                Outcome::Refused(r) if !matches!(self.last.get(key), Some(v) if v.is_empty()) => {
                    tracing::warn!(service = %key, reason = r.reason(), "{r}");
                }
                Outcome::Assigned(ips) if self.last.get(key) != Some(ips) => {
                    let shown: Vec<String> = ips.iter().map(ToString::to_string).collect();
                    tracing::info!(service = %key, addresses = ?shown, "LoadBalancer addresses assigned");
                }
                _ => {}
            }
        }
        for note in &assignment.notes {
            if !self.last.contains_key(&note.service) {
                tracing::warn!(service = %note.service, "{}", note.message);
            }
        }
        let out = lb::with_addresses(snapshot, &addresses);
        self.last = addresses;
        (out, assignment)
    }
}

/// What [`read_dir`] found.
#[derive(Debug, Default)]
struct Read {
    pools: Vec<IpAddressPool>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
    errors: Vec<String>,
}

/// Reads every `IPAddressPool`, `Namespace` and `Node` of the manifests below `dir` (`.yaml`, `.yml`,
/// `.json`; hidden entries skipped). Other kinds are the main source's business; a document that
/// is not YAML is skipped here (the main source reports it).
fn read_dir(dir: &Path) -> Read {
    let mut read = Read::default();
    let mut files = Vec::new();
    list(dir, &mut files, &mut read.errors);
    files.sort();
    for file in files {
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                read.errors.push(format!("{}: {e}", file.display()));
                continue;
            }
        };
        for doc in documents(&text) {
            let Ok(value) = serde_saphyr::from_str::<serde_json::Value>(doc) else { continue };
            let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
            let api_version = value.get("apiVersion").and_then(|k| k.as_str()).unwrap_or_default();
            match (api_version, kind) {
                ("weir.dev/v1alpha1", pool::KIND) => {
                    let name =
                        value.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
                    match serde_json::from_value::<IpAddressPool>(value) {
                        Ok(p) => read.pools.push(p),
                        Err(e) => read.errors.push(format!("{}: IPAddressPool {name}: {e}", file.display())),
                    }
                }
                ("v1", "Namespace") => {
                    if let Ok(ns) = serde_json::from_value::<Namespace>(value) {
                        read.namespaces.insert(ns.name_any(), ns.labels().clone());
                    }
                }
                ("v1", "Node") => match serde_json::from_value::<k8s_openapi::api::core::v1::Node>(value) {
                    Ok(node) => read.nodes.push(node),
                    Err(e) => read.errors.push(format!("{}: Node: {e}", file.display())),
                },
                (other, pool::KIND) if other.starts_with("weir.dev/") => read.errors.push(format!(
                    "{}: IPAddressPool of apiVersion {other}: only weir.dev/v1alpha1 exists",
                    file.display()
                )),
                _ => {}
            }
        }
    }
    read
}

fn list(dir: &Path, out: &mut Vec<PathBuf>, errors: &mut Vec<String>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            errors.push(format!("{}: {e}", dir.display()));
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() => list(&path, out, errors),
            Ok(_) if path.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json") => {
                out.push(path)
            }
            _ => {}
        }
    }
}

/// The documents of a YAML stream (`---` at the start of a line separates them).
fn documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end();
        if bare == "---" || bare.starts_with("--- ") {
            docs.push(&text[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    docs.push(&text[start..]);
    docs.retain(|d| !d.trim().is_empty());
    docs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn manifest_pools_are_read_and_a_bad_one_is_refused_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("pools.yaml"),
            "apiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\nmetadata: {name: good}\nspec: {addresses: [192.0.2.0/30]}\n\
             ---\napiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\nmetadata: {name: inverted}\nspec: {addresses: [192.0.2.9-192.0.2.1]}\n\
             ---\napiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\nmetadata: {name: typo}\nspec: {addresses: [198.51.100.0/30], autoasign: false}\n\
             ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {team: blue}}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("svc.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: LoadBalancer\n  ports: [{port: 80}]\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join(".hidden.yaml"),
            "apiVersion: weir.dev/v1alpha1\nkind: IPAddressPool\n",
        )
        .unwrap();
        let read = read_dir(dir.path());
        assert_eq!(read.pools.len(), 2, "{:?}", read.errors);
        assert_eq!(read.errors.len(), 1, "{:?}", read.errors);
        assert!(
            read.errors[0].contains("IPAddressPool typo") && read.errors[0].contains("autoasign"),
            "{:?}",
            read.errors
        );
        assert_eq!(read.namespaces["shop"]["team"], "blue");

        let mut lb = ManifestLb::new(ClassConfig::default(), dir.path());
        assert!(lb.reload());
        assert_eq!(lb.pools().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["good"]);
        assert!(!lb.reload());

        // The assignment lands in the snapshot's status, where the node plan reads it.
        let text = std::fs::read_to_string(dir.path().join("svc.yaml")).unwrap();
        let snapshot: Snapshot =
            crate::source::manifest::parse_manifests(&text).unwrap().into_iter().collect();
        let (with, assignment) = lb.apply(&snapshot);
        let key = ObjectRef::new("default", "web");
        assert_eq!(assignment.addresses(&key), ["192.0.2.0".parse::<IpAddr>().unwrap()]);
        assert_eq!(status_ips(with.services.get(&key).unwrap()), assignment.addresses(&key));
        assert!(status_ips(snapshot.services.get(&key).unwrap()).is_empty());
    }

    #[test]
    fn documents_split_at_markers() {
        assert_eq!(documents("a: 1\n---\nb: 2\n--- \n\n---\nc: 3"), ["a: 1\n", "b: 2\n", "c: 3"]);
        assert_eq!(documents("---\na: 1\n"), ["a: 1\n"]);
    }
}
