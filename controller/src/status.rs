//! Ingress status and Events, written by the leader only.
//!
//! Replicas elect a leader on a `coordination.k8s.io/v1` Lease. The leader writes
//! `status.loadBalancer.ingress` of the Ingresses weir serves (the addresses of
//! `--publish-service`, or `--publish-status-address`), clears it on Ingresses that left weir's
//! class, and turns each new translation warning into an `events.k8s.io/v1` Event on its object.
//! Writes are idempotent: nothing is written when the status already says the right thing, and an
//! Event is published once per distinct warning (again only after the warning went away and came
//! back).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use weir_dataplane::model::ObjectRef;

use crate::source::kube::Stores;
use crate::translate::{ObjectKind, Severity, Warning};

/// How often the leader re-checks every Ingress status even without a change.
const RESYNC: Duration = Duration::from_secs(30);

/// Settings of the status writer and leader election.
#[derive(Clone, Debug)]
pub struct StatusOptions {
    /// The Service whose addresses are published (LoadBalancer ingress, node addresses for
    /// NodePort, the cluster IP otherwise).
    pub publish_service: Option<ObjectRef>,
    /// Addresses published as they are (IPs or host names); used when no Service is named.
    pub publish_status_addresses: Vec<String>,
    /// The Lease that elects the leader.
    pub lease: ObjectRef,
    /// How long a leader's Lease is valid without renewal.
    pub lease_duration: Duration,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// The reporting controller of Events.
    pub controller_name: String,
    /// Whether this replica holds the Lease now (read by the metrics).
    pub leader: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Default for StatusOptions {
    fn default() -> Self {
        StatusOptions {
            publish_service: None,
            publish_status_addresses: Vec::new(),
            lease: ObjectRef::new("default", "weir-leader"),
            lease_duration: Duration::from_secs(15),
            identity: format!("weir-{}", std::process::id()),
            controller_name: crate::translate::TranslateConfig::default().controller_name,
            leader: Default::default(),
        }
    }
}

/// What one translation said, as the status writer needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The Ingresses of weir's class.
    pub ingresses: BTreeSet<ObjectRef>,
    /// Every warning.
    pub warnings: Vec<Warning>,
    /// Gateway API statuses to write (`status_gateway`).
    pub gateway: Option<Arc<crate::translate::gateway::GatewayOutcome>>,
}

/// Starts leader election and, while leader, the status and Event writer.
pub fn spawn(
    client: Client,
    options: StatusOptions,
    stores: Stores,
    outcomes: watch::Receiver<Outcome>,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(run(client, options, stores, outcomes, shutdown))
}

/// A Lease manager for `lease` held by `identity` for `duration` (at least 2 s; renewed a third
/// of it before it lapses), retried with backoff while the API server refuses; `None` once
/// `shutdown` turns true. `what` names the election in logs.
pub(crate) async fn lease_manager(
    client: &Client,
    lease: &ObjectRef,
    identity: &str,
    duration: Duration,
    what: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<kube_lease_manager::LeaseManager> {
    let lease_secs = duration.as_secs().max(2);
    let mut retry = Duration::from_millis(250);
    loop {
        let built = LeaseManagerBuilder::new(client.clone(), &lease.name)
            .with_namespace(&lease.namespace)
            .with_identity(identity)
            .with_duration(lease_secs)
            .with_grace((lease_secs / 3).max(1))
            .build()
            .await;
        match built {
            Ok(manager) => return Some(manager),
            Err(error) => {
                tracing::warn!(%error, %lease, "cannot set up {what}; retrying");
                tokio::select! {
                    _ = shutdown.wait_for(|s| *s) => return None,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn run(
    client: Client,
    options: StatusOptions,
    stores: Stores,
    mut outcomes: watch::Receiver<Outcome>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(manager) = lease_manager(
        &client,
        &options.lease,
        &options.identity,
        options.lease_duration,
        "leader election",
        &mut shutdown,
    )
    .await
    else {
        return;
    };
    let (mut leader, lease_task) = manager.watch().await;

    let publish_changes = Arc::new(Notify::new());
    let (publish_store, publish_task) = match &options.publish_service {
        Some(svc) => {
            let (store, task) = watch_one_service(&client, svc, publish_changes.clone());
            (Some(store), Some(task))
        }
        None => (None, None),
    };

    let mut writer = Writer {
        ingresses: client.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: options.controller_name.clone(),
                instance: Some(options.identity.clone()),
            },
        ),
        options: options.clone(),
        publish_store,
        written: BTreeMap::new(),
        emitted: BTreeSet::new(),
        gateway_written: crate::status_gateway::Written::default(),
    };
    let mut is_leader = *leader.borrow_and_update();
    options.leader.store(is_leader, std::sync::atomic::Ordering::Relaxed);
    if is_leader {
        tracing::info!(identity = %options.identity, lease = %options.lease, "this replica is the leader");
    }
    let mut resync = tokio::time::interval(RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if is_leader {
            let outcome = outcomes.borrow_and_update().clone();
            writer.reconcile(&stores, &outcome).await;
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            changed = leader.changed() => {
                if changed.is_err() {
                    tracing::warn!("leader election stopped; this replica no longer writes status");
                    break;
                }
                is_leader = *leader.borrow_and_update();
                options.leader.store(is_leader, std::sync::atomic::Ordering::Relaxed);
                if is_leader {
                    tracing::info!(identity = %options.identity, lease = %options.lease, "this replica is the leader");
                    writer.written.clear();
                    writer.gateway_written.clear();
                } else {
                    tracing::info!(identity = %options.identity, "this replica lost the leadership");
                }
            }
            _ = outcomes.changed() => {}
            _ = publish_changes.notified() => {}
            _ = resync.tick() => {}
        }
    }
    if let Some(task) = publish_task {
        task.abort();
    }
    // Closing the channel makes the lease task release the Lease, so that another replica
    // takes over at once.
    drop(leader);
    match tokio::time::timeout(Duration::from_secs(3), lease_task).await {
        Ok(Ok(Ok(_))) => tracing::info!(lease = %options.lease, "leadership released"),
        Ok(Ok(Err(error))) => tracing::warn!(%error, "releasing the Lease failed"),
        Ok(Err(error)) => tracing::warn!(%error, "the leader election task failed"),
        Err(_) => tracing::warn!("releasing the Lease timed out"),
    }
}

fn watch_one_service(
    client: &Client,
    svc: &ObjectRef,
    changes: Arc<Notify>,
) -> (Store<Service>, JoinHandle<()>) {
    let api = Api::<Service>::namespaced(client.clone(), &svc.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", svc.name));
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    let name = svc.to_string();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => changes.notify_one(),
                Err(error) => {
                    tracing::debug!(%error, service = %name, "publish-service watch failed; retrying")
                }
            }
        }
    });
    (reader, task)
}

/// The leader's writes, with what it already wrote.
struct Writer {
    ingresses: Client,
    recorder: Recorder,
    options: StatusOptions,
    publish_store: Option<Store<Service>>,
    /// Per Ingress: the addresses written and the resourceVersion seen before the write, so a
    /// store that has not caught up with our own write does not cause a second one.
    written: BTreeMap<ObjectRef, (Vec<IngressLoadBalancerIngress>, Option<String>)>,
    /// Warnings already published as Events.
    emitted: BTreeSet<Warning>,
    /// What the Gateway API status writer decided per object (`status_gateway::Written`).
    gateway_written: crate::status_gateway::Written,
}

impl Writer {
    async fn reconcile(&mut self, stores: &Stores, outcome: &Outcome) {
        let ingresses = stores.ingresses();
        let addresses = self.addresses().await;
        if let Some(addresses) = &addresses {
            self.write_status(&ingresses, outcome, addresses).await;
        }
        if let Some(gateway) = &outcome.gateway {
            let published =
                addresses.as_deref().map(crate::status_gateway::address_values).unwrap_or_default();
            crate::status_gateway::reconcile(
                &self.ingresses,
                stores,
                gateway,
                &published,
                &mut self.gateway_written,
            )
            .await;
        }
        self.publish_events(&ingresses, outcome).await;
    }

    /// The addresses to publish; `None` when nothing says what to publish (no
    /// `--publish-service`, no `--publish-status-address`) or when the publish Service does not
    /// exist (yet): statuses are then left alone.
    async fn addresses(&self) -> Option<Vec<IngressLoadBalancerIngress>> {
        let raw: Vec<String> = match &self.publish_store {
            None if self.options.publish_status_addresses.is_empty() => return None,
            None => self.options.publish_status_addresses.clone(),
            Some(store) => {
                let svc = store.state().into_iter().next()?;
                self.service_addresses(&svc).await?
            }
        };
        let mut out: Vec<IngressLoadBalancerIngress> = raw
            .into_iter()
            .filter(|a| !a.is_empty())
            .map(|a| match a.parse::<IpAddr>() {
                Ok(_) => IngressLoadBalancerIngress { ip: Some(a), ..Default::default() },
                Err(_) => IngressLoadBalancerIngress { hostname: Some(a), ..Default::default() },
            })
            .collect();
        out.sort_by(|a, b| (&a.ip, &a.hostname).cmp(&(&b.ip, &b.hostname)));
        out.dedup();
        Some(out)
    }

    async fn service_addresses(&self, svc: &Service) -> Option<Vec<String>> {
        let spec = svc.spec.clone().unwrap_or_default();
        match spec.type_.as_deref() {
            Some("NodePort") => {
                let nodes = match Api::<Node>::all(self.ingresses.clone()).list(&ListParams::default()).await
                {
                    Ok(nodes) => nodes,
                    Err(error) => {
                        tracing::warn!(%error, "cannot list Nodes for the NodePort publish Service");
                        return None;
                    }
                };
                Some(nodes.items.iter().filter_map(node_address).collect())
            }
            Some("LoadBalancer") => {
                let lb = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
                let ingress = lb.and_then(|lb| lb.ingress.clone()).unwrap_or_default();
                Some(ingress.into_iter().filter_map(|i| i.ip.or(i.hostname)).collect())
            }
            _ => {
                let mut ips = spec.external_ips.unwrap_or_default();
                if ips.is_empty() {
                    ips.extend(spec.cluster_ip.filter(|ip| ip != "None"));
                }
                Some(ips)
            }
        }
    }

    async fn write_status(
        &mut self,
        ingresses: &BTreeMap<ObjectRef, Arc<Ingress>>,
        outcome: &Outcome,
        addresses: &[IngressLoadBalancerIngress],
    ) {
        self.written.retain(|k, _| ingresses.contains_key(k));
        for (key, ingress) in ingresses {
            let current = current_addresses(ingress);
            let desired = if outcome.ingresses.contains(key) {
                addresses.to_vec()
            } else if !current.is_empty() && same(&current, addresses) {
                // It left weir's class: take weir's addresses back.
                Vec::new()
            } else {
                continue;
            };
            if same(&current, &desired) {
                continue;
            }
            let version = ingress.resource_version();
            if self.written.get(key) == Some(&(desired.clone(), version.clone())) {
                continue; // our write is on its way to the store
            }
            let api = Api::<Ingress>::namespaced(self.ingresses.clone(), &key.namespace);
            let value = if desired.is_empty() { serde_json::Value::Null } else { serde_json::json!(desired) };
            let patch = serde_json::json!({ "status": { "loadBalancer": { "ingress": value } } });
            match api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(ingress = %key, addresses = ?desired, "Ingress status updated");
                    self.written.insert(key.clone(), (desired, version));
                }
                Err(error) => tracing::warn!(ingress = %key, %error, "cannot update the Ingress status"),
            }
        }
    }

    async fn publish_events(&mut self, ingresses: &BTreeMap<ObjectRef, Arc<Ingress>>, outcome: &Outcome) {
        let current: BTreeSet<&Warning> = outcome.warnings.iter().collect();
        self.emitted.retain(|w| current.contains(w));
        for warning in &outcome.warnings {
            if self.emitted.contains(warning) {
                continue;
            }
            let reference = match warning.kind {
                // Ingresses are in the store: the reference carries their uid.
                ObjectKind::Ingress => match ingresses.get(&warning.object) {
                    Some(ingress) => ingress.object_ref(&()),
                    None => continue,
                },
                kind => reference_to(kind, &warning.object),
            };
            let event = Event {
                type_: match warning.severity {
                    Severity::Error | Severity::Warning => EventType::Warning,
                },
                reason: warning.reason.to_string(),
                note: Some(truncate(&warning.message, 1000)),
                action: "Translate".to_string(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => {
                    self.emitted.insert(warning.clone());
                }
                Err(error) => {
                    tracing::warn!(object = %warning.object, kind = %warning.kind, %error, "cannot publish an Event");
                }
            }
        }
    }
}

/// A reference to an object weir read, by kind and namespace/name (empty namespace: cluster-scoped).
fn reference_to(kind: ObjectKind, object: &ObjectRef) -> ObjectReference {
    let (api_version, kind) = match kind {
        ObjectKind::Ingress => ("networking.k8s.io/v1", "Ingress"),
        ObjectKind::IngressClass => ("networking.k8s.io/v1", "IngressClass"),
        ObjectKind::Service => ("v1", "Service"),
        ObjectKind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
        ObjectKind::Endpoints => ("v1", "Endpoints"),
        ObjectKind::Secret => ("v1", "Secret"),
        ObjectKind::ConfigMap => ("v1", "ConfigMap"),
        ObjectKind::HttpRoute => ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ObjectKind::Gateway => ("gateway.networking.k8s.io/v1", "Gateway"),
        ObjectKind::TlsRoute => ("gateway.networking.k8s.io/v1", "TLSRoute"),
        ObjectKind::GrpcRoute => ("gateway.networking.k8s.io/v1", "GRPCRoute"),
        ObjectKind::ListenerSet => ("gateway.networking.k8s.io/v1", "ListenerSet"),
    };
    ObjectReference {
        api_version: Some(api_version.to_owned()),
        kind: Some(kind.to_owned()),
        namespace: Some(object.namespace.clone()).filter(|n| !n.is_empty()),
        name: Some(object.name.clone()),
        ..Default::default()
    }
}

fn current_addresses(ingress: &Ingress) -> Vec<IngressLoadBalancerIngress> {
    ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
}

/// Same addresses, in any order (ports are not published by weir and are ignored).
fn same(a: &[IngressLoadBalancerIngress], b: &[IngressLoadBalancerIngress]) -> bool {
    let key = |v: &[IngressLoadBalancerIngress]| -> BTreeSet<(Option<String>, Option<String>)> {
        v.iter().map(|i| (i.ip.clone(), i.hostname.clone())).collect()
    };
    a.len() == b.len() && key(a) == key(b)
}

fn node_address(node: &Node) -> Option<String> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let by_type = |t: &str| addresses.iter().find(|a| a.type_ == t).map(|a| a.address.clone());
    by_type("ExternalIP").or_else(|| by_type("InternalIP"))
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: &str) -> IngressLoadBalancerIngress {
        IngressLoadBalancerIngress { ip: Some(a.to_string()), ..Default::default() }
    }

    #[test]
    fn references_name_kind_and_scope() {
        let svc = reference_to(ObjectKind::Service, &ObjectRef::new("shop", "web"));
        assert_eq!((svc.kind.as_deref(), svc.namespace.as_deref()), (Some("Service"), Some("shop")));
        let class = reference_to(ObjectKind::IngressClass, &ObjectRef::new("", "weir"));
        assert_eq!((class.api_version.as_deref(), class.namespace), (Some("networking.k8s.io/v1"), None));
    }

    #[test]
    fn same_ignores_order_but_not_content() {
        assert!(same(&[ip("10.0.0.1"), ip("10.0.0.2")], &[ip("10.0.0.2"), ip("10.0.0.1")]));
        assert!(!same(&[ip("10.0.0.1")], &[ip("10.0.0.2")]));
        assert!(!same(&[ip("10.0.0.1")], &[]));
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("short", 10), "short");
    }
}
