//! Making assigned addresses reachable: the announcer seam.
//!
//! An [`Announcer`] is told, after every change, the full set of addresses this node must
//! answer for; it makes the network deliver their traffic here (L2: answer ARP requests and
//! IPv6 neighbour solicitations with this node's MAC and send gratuitous announcements on
//! takeover; later BGP: advertise host routes). Which node announces which address is decided
//! elsewhere (a deterministic choice every node computes alike), so an announcer holds no
//! cluster logic. The addresses are never added to an interface: the node module's rules
//! already accept their traffic.
//!
//! [`super::l2::L2Announcer`] is the L2 implementation. [`run`] is the loop that feeds an
//! announcer: after every change of the addresses to announce ([`super::elect::targets`]) or of
//! the nodes ([`super::members`]), it elects the announcer of each address and gives this node's
//! share to its announcer; it keeps [`LbStatus`] (the admin `/lb` document and the metric) and,
//! in a cluster, publishes an Event on each Service when this node starts announcing its address.

use std::collections::BTreeSet;
use std::net::IpAddr;

/// Makes the network deliver traffic for a set of addresses to this node.
pub trait Announcer: Send {
    /// A short name for logs and metrics (`l2`, `bgp`).
    fn name(&self) -> &'static str;

    /// Announces exactly `addresses` from now on: starts announcing the new ones (a takeover
    /// burst for L2) and stops announcing those no longer listed.
    fn announce(&mut self, addresses: &BTreeSet<IpAddr>) -> anyhow::Result<()>;
}

// === the loop ===

/// Aborts its tasks when dropped.
pub(crate) struct AbortAll(pub(crate) Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortAll {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The addresses to announce, with the uid of each Service (for Events).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Targets {
    /// Sorted by address.
    pub list: Vec<super::elect::Target>,
    /// The uid of the Services named in `list`, where known.
    pub uids: std::collections::BTreeMap<weir_dataplane::model::ObjectRef, String>,
}

/// What the admin listener shows of the load balancer: the `/lb` JSON document and the
/// announced-addresses gauge.
#[derive(Debug, Default)]
pub struct LbStatus {
    document: std::sync::Mutex<String>,
    announced: prometheus_client::metrics::family::Family<
        Vec<(String, String)>,
        prometheus_client::metrics::gauge::Gauge,
    >,
}

impl LbStatus {
    /// Registers the gauge `weir_node_lb_announced_addresses{node,family}`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "node_lb_announced_addresses",
            "LoadBalancer addresses this node announces",
            self.announced.clone(),
        );
    }

    /// The `/lb` JSON document.
    pub fn document(&self) -> String {
        self.document.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// The document of a node that announces nothing, saying why.
    pub fn set_unannounced(&self, node: &str, why: &str) {
        let document = serde_json::json!({ "node": node, "announcer": null, "why": why }).to_string();
        self.set(node, document, &BTreeSet::new());
    }

    fn set(&self, node: &str, document: String, mine: &BTreeSet<IpAddr>) {
        if let Ok(mut d) = self.document.lock() {
            *d = document;
        }
        for (family, v4) in [("ipv4", true), ("ipv6", false)] {
            let count = mine.iter().filter(|a| a.is_ipv4() == v4).count();
            self.announced
                .get_or_create(&vec![
                    ("node".to_string(), node.to_string()),
                    ("family".to_string(), family.to_string()),
                ])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// Settings of [`run`].
pub struct LoopOptions {
    /// This node's name.
    pub node: String,
    /// The interfaces announced on (for `/lb` and Events).
    pub interfaces: Vec<String>,
    /// Where Events go (in a cluster).
    pub events: Option<kube::runtime::events::Recorder>,
}

/// Feeds `announcer` with this node's share of `targets` among `members` until both channels
/// close; an announcer failure is logged and retried at the next change or second.
pub async fn run(
    options: LoopOptions,
    mut announcer: Box<dyn Announcer>,
    mut targets: tokio::sync::watch::Receiver<Targets>,
    mut members: tokio::sync::watch::Receiver<super::members::Membership>,
    status: std::sync::Arc<LbStatus>,
) {
    use super::elect;
    let mut announced: Option<BTreeSet<IpAddr>> = None;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_document = String::new();
    let mut last_error = String::new();
    loop {
        let current = targets.borrow_and_update().clone();
        let membership = members.borrow_and_update().clone();
        let now = tokio::time::Instant::now();
        let chosen = elect::elect(&current.list, &membership.members);
        let may = membership.may_announce(now);
        let mine: BTreeSet<IpAddr> = if may {
            chosen
                .iter()
                .filter(|(_, n)| n.as_deref() == Some(options.node.as_str()))
                .map(|(a, _)| *a)
                .collect()
        } else {
            BTreeSet::new()
        };
        if announced.as_ref() != Some(&mine) {
            match announcer.announce(&mine) {
                Ok(()) => {
                    let before = announced.take().unwrap_or_default();
                    if !may && !before.is_empty() {
                        tracing::warn!(node = %options.node, "this node's Lease lapsed: it stops announcing");
                    }
                    if let Some(recorder) = &options.events {
                        for target in current
                            .list
                            .iter()
                            .filter(|t| mine.contains(&t.address) && !before.contains(&t.address))
                        {
                            for service in &target.services {
                                publish(
                                    recorder,
                                    &options,
                                    announcer.name(),
                                    target.address,
                                    service,
                                    current.uids.get(service),
                                )
                                .await;
                            }
                        }
                    }
                    announced = Some(mine.clone());
                    last_error.clear();
                }
                Err(error) => {
                    // Retried every tick: said once per distinct failure.
                    let text = format!("{error:#}");
                    if text != last_error {
                        tracing::error!(error = %text, "the announcer failed");
                        last_error = text;
                    }
                }
            }
        }
        let document = serde_json::json!({
            "node": options.node,
            "announcer": announcer.name(),
            "interfaces": options.interfaces,
            "mayAnnounce": may,
            "members": membership.members,
            "assignments": current.list.iter().map(|t| serde_json::json!({
                "address": t.address,
                "services": t.services.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "localNodes": t.local_nodes,
                "announcer": chosen.get(&t.address).cloned().flatten(),
            })).collect::<Vec<_>>(),
            "announcing": announced.clone().unwrap_or_default(),
        })
        .to_string();
        if document != last_document {
            status.set(&options.node, document.clone(), announced.as_ref().unwrap_or(&BTreeSet::new()));
            last_document = document;
        }
        tokio::select! {
            changed = targets.changed() => if changed.is_err() { return },
            changed = members.changed() => if changed.is_err() { return },
            // A Lease lapses without any change; a failed announcer is retried.
            _ = tick.tick() => {}
        }
    }
}

/// The Event saying that this node announces `address` of `service`.
async fn publish(
    recorder: &kube::runtime::events::Recorder,
    options: &LoopOptions,
    announcer: &str,
    address: IpAddr,
    service: &weir_dataplane::model::ObjectRef,
    uid: Option<&String>,
) {
    use kube::runtime::events::{Event, EventType};
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Service".to_string()),
        namespace: Some(service.namespace.clone()),
        name: Some(service.name.clone()),
        uid: uid.cloned(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "AnnouncingAddress".to_string(),
        note: Some(format!(
            "node {} announces {address} ({announcer} on {})",
            options.node,
            options.interfaces.join(", ")
        )),
        action: "Announce".to_string(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &reference).await {
        tracing::warn!(service = %service, %error, "cannot publish the announcing Event");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::node::lb::elect::{Member, Target};
    use crate::node::lb::members::Membership;

    /// Records every set it is told to announce.
    struct Recording(Arc<Mutex<Vec<BTreeSet<IpAddr>>>>);

    impl Announcer for Recording {
        fn name(&self) -> &'static str {
            "test"
        }

        fn announce(&mut self, addresses: &BTreeSet<IpAddr>) -> anyhow::Result<()> {
            self.0.lock().unwrap().push(addresses.clone());
            Ok(())
        }
    }

    fn member(name: &str, live: bool) -> Member {
        Member { name: name.to_string(), live, excluded: false }
    }

    #[tokio::test]
    async fn the_loop_announces_this_nodes_share_and_stops_when_its_lease_lapses() {
        let addresses: Vec<IpAddr> = (0..20).map(|i| format!("203.0.113.{i}").parse().unwrap()).collect();
        let list = addresses
            .iter()
            .map(|a| Target {
                address: *a,
                services: vec![weir_dataplane::model::ObjectRef::new("default", "web")],
                local_nodes: None,
            })
            .collect();
        let (targets_tx, targets) = tokio::sync::watch::channel(Targets { list, uids: Default::default() });
        let valid = tokio::time::Instant::now() + Duration::from_millis(1500);
        let membership = |b_live: bool| Membership {
            members: vec![member("node-a", true), member("node-b", b_live)],
            valid_until: Some(valid),
        };
        let (members_tx, members) = tokio::sync::watch::channel(membership(true));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(LbStatus::default());
        let options =
            LoopOptions { node: "node-a".to_string(), interfaces: vec!["eth0".to_string()], events: None };
        let task =
            tokio::spawn(run(options, Box::new(Recording(calls.clone())), targets, members, status.clone()));

        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = calls.lock().unwrap().last().cloned().unwrap();
        // Its share: some of the addresses, not all (node-b takes the others).
        assert!(!first.is_empty() && first.len() < addresses.len(), "{first:?}");
        let doc: serde_json::Value = serde_json::from_str(&status.document()).unwrap();
        assert_eq!(doc["announcing"].as_array().unwrap().len(), first.len());

        // node-b dies: node-a announces everything, and says so once.
        members_tx.send_replace(membership(false));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(calls.lock().unwrap().last().unwrap().len(), addresses.len());
        let before = calls.lock().unwrap().len();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(calls.lock().unwrap().len(), before, "an unchanged set is not announced again");

        // Its own Lease lapses (no renewal arrives): it stops announcing by itself.
        tokio::time::sleep_until(valid + Duration::from_millis(300)).await;
        assert!(calls.lock().unwrap().last().unwrap().is_empty());
        let doc: serde_json::Value = serde_json::from_str(&status.document()).unwrap();
        assert_eq!(doc["mayAnnounce"], false);

        drop(targets_tx);
        drop(members_tx);
        tokio::time::timeout(Duration::from_secs(1), task).await.unwrap().unwrap();
    }
}
