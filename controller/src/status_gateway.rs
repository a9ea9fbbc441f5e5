//! Gateway API status, written by the leader (beside the Ingress status of `status.rs`).
//!
//! What translation decided ([`GatewayOutcome`]) becomes, per object:
//! - GatewayClass: `Accepted`;
//! - Gateway: `Accepted`, `Programmed`, `status.addresses` (the published addresses, or those
//!   `spec.addresses` asks for: `translate::gateway::addresses`) and per listener
//!   `attachedRoutes`, `supportedKinds` and its conditions (`Accepted`, `Programmed`,
//!   `ResolvedRefs`, `Conflicted`); `attachedListenerSets` when it allows ListenerSets;
//! - ListenerSet (naming a Gateway of ours): `Accepted`, `Programmed`, and per listener the same
//!   as a Gateway's listeners;
//! - HTTPRoute and GRPCRoute: one `parents` entry per parent of ours (`controllerName` weir's), with
//!   `Accepted` and `ResolvedRefs`; entries of other controllers are kept.
//!
//! Every condition carries the object's `metadata.generation` as `observedGeneration`, and keeps
//! its `lastTransitionTime` while its status stays the same. Nothing is written when the object
//! already says it ([`desired_differs`]), nor again while the store has not yet seen weir's own
//! write ([`Written`]).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use weir_dataplane::model::ObjectRef;

use crate::gateway::{
    Gateway, GatewayAddress, GatewayClass, GatewayClassStatus, GatewayStatus, GrpcRoute, HttpRoute,
    ListenerSet, ListenerSetStatus, RouteStatus, TlsRoute,
};
use crate::source::kube::Stores;
use crate::translate::gateway::addresses;
use crate::translate::gateway::conditions::{Cond, reasons, types};
use crate::translate::gateway::{GatewayOutcome, RouteKind};

/// One condition as the API stores it; `old` are the object's current conditions (the
/// transition time of one of the same type and status is kept).
fn condition(c: &Cond, generation: Option<i64>, old: &[Value], now: &str) -> Value {
    let status = if c.status { "True" } else { "False" };
    let since = old
        .iter()
        .find(|o| o["type"] == c.type_ && o["status"] == status)
        .and_then(|o| o["lastTransitionTime"].as_str())
        .unwrap_or(now);
    let mut v = json!({
        "type": c.type_,
        "status": status,
        "reason": c.reason,
        "message": truncate(&c.message),
        "lastTransitionTime": since,
    });
    if let Some(g) = generation {
        v["observedGeneration"] = json!(g);
    }
    v
}

fn conditions(conds: &[Cond], generation: Option<i64>, old: &Value, now: &str) -> Value {
    let old = old.as_array().map(Vec::as_slice).unwrap_or_default();
    Value::Array(conds.iter().map(|c| condition(c, generation, old, now)).collect())
}

/// Condition messages are at most 32768 characters in the API.
fn truncate(s: &str) -> String {
    s.chars().take(2000).collect()
}

/// The desired `status` of a GatewayClass of ours.
pub fn class_status(outcome: &GatewayOutcome, name: &str, current: &Value, now: &str) -> Option<Value> {
    let class = outcome.attachments.classes.get(name)?;
    Some(
        json!({ "conditions": conditions(&class.conditions, class.generation, &current["conditions"], now) }),
    )
}

/// The desired `status` of a Gateway of ours: `addresses` assigned from weir's `published`
/// ones as its `spec.addresses` asks ([`addresses::assign`], which may turn `Accepted` or
/// `Programmed` false), conditions and listeners.
pub fn gateway_status(
    outcome: &GatewayOutcome,
    key: &ObjectRef,
    spec_addresses: &[GatewayAddress],
    published: &[String],
    current: &Value,
    now: &str,
) -> Option<Value> {
    let gw = outcome.attachments.gateways.get(key)?;
    let assigned = addresses::assign(spec_addresses, published);
    let listeners = listener_statuses(outcome, key, None, gw.generation, current, now);
    let addresses: Vec<Value> =
        assigned.status.iter().map(|a| json!({"type": a.type_, "value": a.value})).collect();
    let mut gateway_conditions = gw.conditions.clone();
    for cond in [assigned.accepted, assigned.programmed].into_iter().flatten() {
        match gateway_conditions.iter_mut().find(|c| c.type_ == cond.type_) {
            Some(c) => *c = cond,
            None => gateway_conditions.push(cond),
        }
    }
    Some(json!({
        "addresses": addresses,
        "conditions": conditions(&gateway_conditions, gw.generation, &current["conditions"], now),
        "listeners": listeners,
        // Null (removed by the merge patch) when the Gateway takes no ListenerSets.
        "attachedListenerSets": outcome.attachments.attached_listener_sets.get(key),
    }))
}

/// The `status.listeners` of the Gateway `gateway` (`set`: `None`) or of its ListenerSet `set`:
/// the listeners of the Gateway's merged list that are theirs.
fn listener_statuses(
    outcome: &GatewayOutcome,
    gateway: &ObjectRef,
    set: Option<&ObjectRef>,
    generation: Option<i64>,
    current: &Value,
    now: &str,
) -> Vec<Value> {
    let Some(gw) = outcome.attachments.gateways.get(gateway) else { return Vec::new() };
    gw.listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.set.as_ref() == set)
        .map(|(i, l)| {
            let old = current["listeners"]
                .as_array()
                .and_then(|ls| ls.iter().find(|o| o["name"] == l.name.as_str()))
                .map(|o| o["conditions"].clone())
                .unwrap_or(Value::Null);
            let kinds: Vec<Value> = l
                .kinds
                .iter()
                .map(
                    |k| json!({"group": k.group.as_deref().unwrap_or(crate::gateway::GROUP), "kind": k.kind}),
                )
                .collect();
            json!({
                "name": l.name,
                "supportedKinds": kinds,
                "attachedRoutes": attached_routes(outcome, gateway, i),
                "conditions": conditions(&l.conditions, generation, &old, now),
            })
        })
        .collect()
}

/// The desired `status` of a ListenerSet naming a Gateway of ours: `Accepted`, `Programmed`,
/// and its listeners once attached (none while it is not: they are not the Gateway's).
pub fn listener_set_status(
    outcome: &GatewayOutcome,
    key: &ObjectRef,
    current: &Value,
    now: &str,
) -> Option<Value> {
    let set = outcome.attachments.listener_sets.get(key)?;
    let listeners = if set.attached {
        listener_statuses(outcome, &set.gateway, Some(key), set.generation, current, now)
    } else {
        Vec::new()
    };
    Some(json!({
        "conditions": conditions(&set.conditions, set.generation, &current["conditions"], now),
        "listeners": listeners,
    }))
}

/// `ListenerStatus.attachedRoutes`: "Routes with any other value for the Accepted condition
/// MUST NOT be included in this count": routes attached to listener `i` of `gateway` whose rules
/// make them not `Accepted` (an unsupported filter or match) are left out.
fn attached_routes(outcome: &GatewayOutcome, gateway: &ObjectRef, i: usize) -> i32 {
    let attached = outcome.attachments.attached_routes.get(&(gateway.clone(), i)).copied().unwrap_or(0);
    let refused = outcome
        .attachments
        .routes
        .iter()
        .filter(|((kind, key), _)| match kind {
            RouteKind::Http => outcome.routes.invalid_rules.contains_key(key),
            RouteKind::Grpc => outcome.grpc_routes.invalid_rules.contains_key(key),
            RouteKind::Tls => false,
        })
        .filter(|(_, parents)| {
            parents.iter().any(|p| p.attached.iter().any(|a| a.gateway == *gateway && a.listener == i))
        })
        .count();
    attached - i32::try_from(refused).unwrap_or(0)
}

/// The desired `status` of a route (HTTPRoute, GRPCRoute, TLSRoute) with parents of ours: our
/// entries replaced, others kept.
pub fn route_status(
    outcome: &GatewayOutcome,
    (kind, key): (RouteKind, &ObjectRef),
    generation: Option<i64>,
    current: &Value,
    now: &str,
) -> Option<Value> {
    let (resolved, invalid) = match kind {
        RouteKind::Tls => (outcome.tls_routes.resolved_refs.get(key), None),
        RouteKind::Http => (outcome.routes.resolved_refs.get(key), outcome.routes.invalid_rules.get(key)),
        RouteKind::Grpc => {
            (outcome.grpc_routes.resolved_refs.get(key), outcome.grpc_routes.invalid_rules.get(key))
        }
    };
    let parents = outcome.attachments.routes.get(&(kind, key.clone()))?;
    let ours = outcome.controller_name.as_str();
    let old_parents = current["parents"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<Value> = old_parents.iter().filter(|p| p["controllerName"] != ours).cloned().collect();
    for p in parents {
        let parent_ref = serde_json::to_value(&p.parent_ref).unwrap_or(Value::Null);
        let old = old_parents
            .iter()
            .find(|o| o["controllerName"] == ours && o["parentRef"] == parent_ref)
            .map(|o| o["conditions"].clone())
            .unwrap_or(Value::Null);
        let mut conds = vec![match invalid {
            // `HTTPRouteFilter.type`: "Unknown values here must result in the implementation
            // setting the Accepted Condition for the Route to `status: False`, with a Reason of
            // `UnsupportedValue`."
            Some(why) if p.accepted.status => {
                Cond::no(types::ACCEPTED, reasons::UNSUPPORTED_VALUE, why.join("; "))
            }
            _ => p.accepted.clone(),
        }];
        conds.push(resolved.cloned().unwrap_or_else(|| {
            Cond::yes(types::RESOLVED_REFS, reasons::RESOLVED_REFS, "every backend reference resolved")
        }));
        out.push(json!({
            "parentRef": parent_ref,
            "controllerName": ours,
            "conditions": conditions(&conds, generation, &old, now),
        }));
    }
    Some(json!({ "parents": out }))
}

/// Whether `desired` says something `current` does not, both read through the status type `T`
/// (so that fields left out and fields empty compare equal); transition times are compared
/// too: they are carried over, so they differ only when a status changed.
pub fn desired_differs<T: serde::Serialize + serde::de::DeserializeOwned>(
    desired: &Value,
    current: &Value,
) -> bool {
    let typed =
        |v: &Value| serde_json::from_value::<T>(v.clone()).ok().and_then(|t| serde_json::to_value(t).ok());
    match (typed(desired), typed(current)) {
        (Some(d), Some(c)) => d != c,
        _ => true,
    }
}

/// What the leader decided per object at a given version of it, so that an object is neither
/// written twice nor compared again while nothing changed: the Ingress writer's `written`
/// (`status.rs`) for Gateway API objects.
///
/// A status write comes back through the watch a little later. A reconcile in between (another
/// change, the resync) still sees the old status in the store and would write the same status
/// again: at 5,000 HTTPRoutes about 240 writes were such duplicates (bench/RESULTS.md, Gateway
/// API scale). A [`Mark`] says what was written (or found already there) for the object's
/// `resourceVersion` and `generation` as the store showed them; it is forgotten when the object
/// is deleted or the store shows another version of it (weir's write arrived, or someone else
/// changed the object: then it is compared again).
#[derive(Debug, Default)]
pub struct Written {
    marks: HashMap<(&'static str, ObjectRef), Mark>,
}

/// See [`Written`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mark {
    /// The object's `resourceVersion` in the store when the status was decided.
    version: Option<String>,
    /// Its `metadata.generation` then.
    generation: Option<i64>,
    /// [`digest`] of the status decided.
    digest: u64,
}

impl Written {
    /// Whether the status `digest` was already written (or found there) for the object `key` of
    /// `kind` at this `version` and `generation`: nothing to do.
    pub fn settled(
        &self,
        (kind, key): (&'static str, &ObjectRef),
        version: Option<&str>,
        generation: Option<i64>,
        digest: u64,
    ) -> bool {
        self.marks.get(&(kind, key.clone())).is_some_and(|m| {
            m.version.as_deref() == version && m.generation == generation && m.digest == digest
        })
    }

    /// Notes that the status `digest` was written (or found there) for the object at `version`
    /// and `generation`.
    pub fn record(
        &mut self,
        (kind, key): (&'static str, &ObjectRef),
        version: Option<String>,
        generation: Option<i64>,
        digest: u64,
    ) {
        self.marks.insert((kind, key.clone()), Mark { version, generation, digest });
    }

    /// Forgets every object not in `seen` (kind, key and the version the store has now) or whose
    /// version moved on.
    pub fn retain_seen(&mut self, seen: &HashMap<(&'static str, ObjectRef), Option<String>>) {
        self.marks.retain(|k, m| seen.get(k).is_some_and(|v| *v == m.version));
    }

    /// Forgets the object `key` of `kind` (its write failed).
    pub fn forget(&mut self, (kind, key): (&'static str, &ObjectRef)) {
        self.marks.remove(&(kind, key.clone()));
    }

    /// Forgets everything (a new leadership: another replica may have written since).
    pub fn clear(&mut self) {
        self.marks.clear();
    }

    /// How many objects are remembered.
    pub fn len(&self) -> usize {
        self.marks.len()
    }

    /// Whether no object is remembered.
    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

/// A hash of a desired status as it would be written, transition times left out: they come
/// from the clock (a condition new at this write gets the current second), so two reconciles
/// deciding the same status a second apart still agree.
pub fn digest(status: &Value) -> u64 {
    fn feed(v: &Value, h: &mut std::collections::hash_map::DefaultHasher) {
        match v {
            Value::Null => 0u8.hash(h),
            Value::Bool(b) => (1u8, b).hash(h),
            Value::Number(n) => (2u8, n.to_string()).hash(h),
            Value::String(s) => (3u8, s).hash(h),
            Value::Array(items) => {
                (4u8, items.len()).hash(h);
                items.iter().for_each(|i| feed(i, h));
            }
            Value::Object(map) => {
                5u8.hash(h);
                for (k, v) in map.iter().filter(|(k, _)| k.as_str() != "lastTransitionTime") {
                    k.hash(h);
                    feed(v, h);
                }
            }
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    feed(status, &mut h);
    h.finish()
}

/// One object of ours the reconcile looks at: its kind, key, version and generation in the
/// store, and its current status as JSON (made only when needed).
struct Seen<'a, C: FnOnce() -> Value> {
    kind: &'static str,
    key: &'a ObjectRef,
    version: Option<String>,
    generation: Option<i64>,
    current: C,
}

/// Decides one object: `desired(current, now)` is its status (`None`: not ours). Skips it when
/// `written` says this status is settled for this version; else compares it with the current
/// status through `T` and returns the patch to make when they differ.
fn decide<T, C>(
    seen: Seen<'_, C>,
    desired: impl Fn(&Value, &str) -> Option<Value>,
    written: &mut Written,
    now: &str,
) -> Option<Value>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    C: FnOnce() -> Value,
{
    // The status as it would be for an object without any (no transition times kept): cheap to
    // make, and what the digest is taken of.
    let bare = desired(&Value::Null, "")?;
    let digest = digest(&bare);
    let id = (seen.kind, seen.key);
    if written.settled(id, seen.version.as_deref(), seen.generation, digest) {
        return None;
    }
    let current = (seen.current)();
    let desired = desired(&current, now)?;
    written.record(id, seen.version, seen.generation, digest);
    desired_differs::<T>(&desired, &current).then_some(desired)
}

/// What one `reconcile` decides, object by object: the status patches to make, and the version
/// of every object of ours it looked at.
struct Queue<'m, 'n> {
    /// (kind, namespace, name, status).
    patches: Vec<(&'static str, Option<String>, String, Value)>,
    seen: HashMap<(&'static str, ObjectRef), Option<String>>,
    marks: &'m mut Written,
    now: &'n str,
}

impl Queue<'_, '_> {
    /// Decides one object of `kind` (`key`: its namespace and name; `None` for a cluster-scoped
    /// GatewayClass, named by `meta`), whose status type is `T`, and queues its patch.
    fn decide<T: serde::Serialize + serde::de::DeserializeOwned>(
        &mut self,
        kind: &'static str,
        key: Option<&ObjectRef>,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        current: impl FnOnce() -> Value,
        desired: impl Fn(&Value, &str) -> Option<Value>,
    ) {
        let key =
            key.cloned().unwrap_or_else(|| ObjectRef::new("", meta.name.as_deref().unwrap_or_default()));
        let version = meta.resource_version.clone();
        self.seen.insert((kind, key.clone()), version.clone());
        let item = Seen { kind, key: &key, version, generation: meta.generation, current };
        if let Some(status) = decide::<T, _>(item, desired, self.marks, self.now) {
            let namespace = (kind != "GatewayClass").then(|| key.namespace.clone());
            self.patches.push((kind, namespace, key.name, status));
        }
    }
}

/// Writes every status that differs and that weir did not just write; returns how many were
/// written.
pub async fn reconcile(
    client: &Client,
    stores: &Stores,
    outcome: &Arc<GatewayOutcome>,
    addresses: &[String],
    marks: &mut Written,
) -> usize {
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut written = 0;
    let mut queue = Queue { patches: Vec::new(), seen: HashMap::new(), marks, now: &now };
    for class in stores.gateway_classes.iter().flat_map(|s| s.state()) {
        let name = class.metadata.name.clone().unwrap_or_default();
        let current = || status_json(class.status.as_ref());
        let desired = |current: &Value, now: &str| class_status(outcome, &name, current, now);
        queue.decide::<GatewayClassStatus>("GatewayClass", None, &class.metadata, current, desired);
    }
    for gw in stores.gateways.iter().flat_map(|s| s.state()) {
        let key = key_of(&gw.metadata);
        let current = || status_json(gw.status.as_ref());
        let spec = &gw.spec.addresses;
        let desired =
            |current: &Value, now: &str| gateway_status(outcome, &key, spec, addresses, current, now);
        queue.decide::<GatewayStatus>("Gateway", Some(&key), &gw.metadata, current, desired);
    }
    for set in stores.listener_sets.iter().flat_map(|s| s.state()) {
        let key = key_of(&set.metadata);
        let current = || status_json(set.status.as_ref());
        let desired = |current: &Value, now: &str| listener_set_status(outcome, &key, current, now);
        queue.decide::<ListenerSetStatus>("ListenerSet", Some(&key), &set.metadata, current, desired);
    }
    let http = stores
        .http_routes
        .iter()
        .flat_map(|s| s.state())
        .map(|r| (RouteKind::Http, r.metadata.clone(), r.status.clone()));
    let tls = stores
        .tls_routes
        .iter()
        .flat_map(|s| s.state())
        .map(|r| (RouteKind::Tls, r.metadata.clone(), r.status.clone()));
    let grpc = stores
        .grpc_routes
        .iter()
        .flat_map(|s| s.state())
        .map(|r| (RouteKind::Grpc, r.metadata.clone(), r.status.clone()));
    for (kind, metadata, status) in http.chain(tls).chain(grpc) {
        let key = key_of(&metadata);
        let current = || status_json(status.as_ref());
        let desired = |current: &Value, now: &str| {
            route_status(outcome, (kind, &key), metadata.generation, current, now)
        };
        queue.decide::<RouteStatus>(kind.name(), Some(&key), &metadata, current, desired);
    }
    let Queue { patches, seen, marks, .. } = queue;
    // What the store shows now decides what is remembered: a mark made above is for the
    // version seen above, so it stays.
    marks.retain_seen(&seen);
    // The futures are made first, each owning what it needs: a stream mapping a closure to
    // them would not be `Send` for the status task (rust-lang/rust#102211).
    let writes: Vec<_> = patches
        .into_iter()
        .map(|(kind, namespace, name, status)| {
            let client = client.clone();
            async move {
                let result = write(client, kind, namespace.clone(), name.clone(), status).await;
                (kind, namespace, name, result)
            }
        })
        .collect();
    let mut writes = futures_util::stream::iter(writes).buffer_unordered(WRITES_AT_ONCE);
    while let Some((kind, namespace, name, result)) = writes.next().await {
        match result {
            Ok(true) => {
                written += 1;
                tracing::info!(
                    kind,
                    namespace = namespace.as_deref().unwrap_or(""),
                    name,
                    "Gateway API status updated"
                );
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(kind, name, %error, "cannot update the Gateway API status");
                // Not written: the next reconcile tries again.
                marks.forget((kind, &ObjectRef::new(namespace.unwrap_or_default(), name)));
            }
        }
    }
    written
}

/// Status patches in flight at once: one at a time, 5,000 HTTPRoutes took as many round trips
/// to the API server in a row (bench/scale `MODE=gateway`); a few at once keep it busy without
/// flooding it (its default `--max-mutating-requests-inflight` is 200).
const WRITES_AT_ONCE: usize = 16;

/// Merge-patches the `status` of one object; false when the kind has no such object (a
/// namespaced kind without namespace).
async fn write(
    client: Client,
    kind: &'static str,
    namespace: Option<String>,
    name: String,
    status: Value,
) -> Result<bool, kube::Error> {
    let patch = Patch::Merge(json!({ "status": status }));
    let params = PatchParams::default();
    let name = name.as_str();
    match (kind, namespace.as_deref()) {
        ("GatewayClass", _) => {
            Api::<GatewayClass>::all(client).patch_status(name, &params, &patch).await?;
        }
        ("Gateway", Some(ns)) => {
            Api::<Gateway>::namespaced(client, ns).patch_status(name, &params, &patch).await?;
        }
        ("TLSRoute", Some(ns)) => {
            Api::<TlsRoute>::namespaced(client, ns).patch_status(name, &params, &patch).await?;
        }
        ("ListenerSet", Some(ns)) => {
            Api::<ListenerSet>::namespaced(client, ns).patch_status(name, &params, &patch).await?;
        }
        ("GRPCRoute", Some(ns)) => {
            Api::<GrpcRoute>::namespaced(client, ns).patch_status(name, &params, &patch).await?;
        }
        (_, Some(ns)) => {
            Api::<HttpRoute>::namespaced(client, ns).patch_status(name, &params, &patch).await?;
        }
        (_, None) => return Ok(false),
    }
    Ok(true)
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectRef {
    ObjectRef::new(meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

fn status_json<T: serde::Serialize>(status: Option<&T>) -> Value {
    status.and_then(|s| serde_json::to_value(s).ok()).unwrap_or_else(|| json!({}))
}

/// Addresses as `status.addresses` values, from the Ingress status writer's.
pub fn address_values(list: &[k8s_openapi::api::networking::v1::IngressLoadBalancerIngress]) -> Vec<String> {
    list.iter().filter_map(|a| a.ip.clone().or_else(|| a.hostname.clone())).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A GatewayClass status with one `Accepted` condition, as `condition` writes it.
    fn accepted(status: &str, since: &str) -> Value {
        json!({"conditions": [{
            "type": "Accepted", "status": status, "reason": "Accepted", "message": "ours",
            "lastTransitionTime": since, "observedGeneration": 1,
        }]})
    }

    /// What `class_status` does: the transition time is kept from the current status when the
    /// condition's status stays, else it is `now`.
    fn desired(status: &'static str) -> impl Fn(&Value, &str) -> Option<Value> {
        move |current: &Value, now: &str| {
            let same = current["conditions"][0]["status"] == status;
            let since = if same { current["conditions"][0]["lastTransitionTime"].as_str() } else { None };
            Some(accepted(status, since.unwrap_or(now)))
        }
    }

    fn seen<'a>(key: &'a ObjectRef, version: &str, current: Value) -> Seen<'a, impl FnOnce() -> Value> {
        Seen {
            kind: "GatewayClass",
            key,
            version: Some(version.into()),
            generation: Some(1),
            current: move || current,
        }
    }

    #[test]
    fn the_digest_leaves_out_transition_times_only() {
        let a = accepted("True", "2026-01-01T00:00:00Z");
        assert_eq!(digest(&a), digest(&accepted("True", "2026-01-01T00:00:01Z")));
        assert_ne!(digest(&a), digest(&accepted("False", "2026-01-01T00:00:00Z")));
        let mut other_generation = a.clone();
        other_generation["conditions"][0]["observedGeneration"] = json!(2);
        assert_ne!(digest(&a), digest(&other_generation));
    }

    /// The duplicate writes of bench/RESULTS.md (Gateway API scale): the store still shows the
    /// status from before weir's write when the next reconcile comes (a second later, so a new
    /// condition would get another transition time); nothing is written twice. When the store
    /// catches up, the status is compared again and found written.
    #[test]
    fn a_status_is_not_written_again_before_the_store_shows_the_write() {
        let key = ObjectRef::new("", "weir");
        let mut marks = Written::default();
        let old = json!({});
        let first = decide::<GatewayClassStatus, _>(
            seen(&key, "10", old.clone()),
            desired("True"),
            &mut marks,
            "2026-01-01T00:00:00Z",
        );
        assert_eq!(first, Some(accepted("True", "2026-01-01T00:00:00Z")), "written once");
        let again = decide::<GatewayClassStatus, _>(
            seen(&key, "10", old.clone()),
            desired("True"),
            &mut marks,
            "2026-01-01T00:00:01Z",
        );
        assert_eq!(again, None, "the store has not caught up: not written again");
        // Translation changed its mind meanwhile: that is written.
        let changed = decide::<GatewayClassStatus, _>(
            seen(&key, "10", old),
            desired("False"),
            &mut marks,
            "2026-01-01T00:00:02Z",
        );
        assert_eq!(changed, Some(accepted("False", "2026-01-01T00:00:02Z")));
        // The store shows weir's write (a new version): the mark is forgotten, the status
        // compared and found right.
        let seen_now = HashMap::from([(("GatewayClass", key.clone()), Some("11".to_string()))]);
        marks.retain_seen(&seen_now);
        assert!(marks.is_empty());
        let caught_up = decide::<GatewayClassStatus, _>(
            seen(&key, "11", accepted("False", "2026-01-01T00:00:02Z")),
            desired("False"),
            &mut marks,
            "2026-01-01T00:00:09Z",
        );
        assert_eq!(caught_up, None);
        assert_eq!(marks.len(), 1, "remembered as settled at version 11");
        // Someone else rewrote the status (version 12): compared again, and put right.
        let overwritten = accepted("True", "2026-01-01T00:00:03Z");
        let seen_now = HashMap::from([(("GatewayClass", key.clone()), Some("12".to_string()))]);
        marks.retain_seen(&seen_now);
        let fixed = decide::<GatewayClassStatus, _>(
            seen(&key, "12", overwritten),
            desired("False"),
            &mut marks,
            "2026-01-01T00:00:10Z",
        );
        assert_eq!(fixed, Some(accepted("False", "2026-01-01T00:00:10Z")));
        // Deleted: forgotten.
        marks.retain_seen(&HashMap::new());
        assert!(marks.is_empty());
    }

    /// A status settled at one version is not compared again while neither the object nor what
    /// translation says about it changes (each reconcile used to convert both statuses through
    /// their type for every object); a new generation is compared again.
    #[test]
    fn a_settled_status_is_not_looked_at_again() {
        let key = ObjectRef::new("", "weir");
        let mut marks = Written::default();
        let current = accepted("True", "2026-01-01T00:00:00Z");
        assert_eq!(
            decide::<GatewayClassStatus, _>(
                seen(&key, "5", current.clone()),
                desired("True"),
                &mut marks,
                "x"
            ),
            None
        );
        let looked = std::cell::Cell::new(false);
        let item = Seen {
            kind: "GatewayClass",
            key: &key,
            version: Some("5".into()),
            generation: Some(1),
            current: || {
                looked.set(true);
                current.clone()
            },
        };
        assert_eq!(decide::<GatewayClassStatus, _>(item, desired("True"), &mut marks, "y"), None);
        assert!(!looked.get(), "the current status was not even read");
        let item = Seen { generation: Some(2), ..seen(&key, "5", current.clone()) };
        let looked_again = decide::<GatewayClassStatus, _>(item, desired("True"), &mut marks, "z");
        assert_eq!(looked_again, None, "same status, compared again for the new generation");
    }
}
