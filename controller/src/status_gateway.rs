//! Gateway API status, written by the leader (beside the Ingress status of `status.rs`).
//!
//! What translation decided ([`GatewayOutcome`]) becomes, per object:
//! - GatewayClass: `Accepted`;
//! - Gateway: `Accepted`, `Programmed`, `status.addresses` (the published addresses) and per
//!   listener `attachedRoutes`, `supportedKinds` and its conditions (`Accepted`, `Programmed`,
//!   `ResolvedRefs`, `Conflicted`);
//! - HTTPRoute and GRPCRoute: one `parents` entry per parent of ours (`controllerName` weir's), with
//!   `Accepted` and `ResolvedRefs`; entries of other controllers are kept.
//!
//! Every condition carries the object's `metadata.generation` as `observedGeneration`, and keeps
//! its `lastTransitionTime` while its status stays the same. Nothing is written when the object
//! already says it ([`desired_differs`]).

use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use weir_dataplane::model::ObjectRef;

use crate::gateway::{
    Gateway, GatewayClass, GatewayClassStatus, GatewayStatus, GrpcRoute, HttpRoute, RouteStatus, TlsRoute,
};
use crate::source::kube::Stores;
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

/// The desired `status` of a Gateway of ours, with `addresses` (`IPAddress` or `Hostname`).
pub fn gateway_status(
    outcome: &GatewayOutcome,
    key: &ObjectRef,
    addresses: &[String],
    current: &Value,
    now: &str,
) -> Option<Value> {
    let gw = outcome.attachments.gateways.get(key)?;
    let listeners: Vec<Value> = gw
        .listeners
        .iter()
        .enumerate()
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
                "attachedRoutes": attached_routes(outcome, key, i),
                "conditions": conditions(&l.conditions, gw.generation, &old, now),
            })
        })
        .collect();
    let addresses: Vec<Value> = addresses
        .iter()
        .map(|a| {
            let type_ = if a.parse::<std::net::IpAddr>().is_ok() { "IPAddress" } else { "Hostname" };
            json!({"type": type_, "value": a})
        })
        .collect();
    Some(json!({
        "addresses": addresses,
        "conditions": conditions(&gw.conditions, gw.generation, &current["conditions"], now),
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

/// Writes every status that differs; returns how many were written.
pub async fn reconcile(
    client: &Client,
    stores: &Stores,
    outcome: &Arc<GatewayOutcome>,
    addresses: &[String],
) -> usize {
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut written = 0;
    let mut patches: Vec<(&'static str, Option<String>, String, Value)> = Vec::new();
    for store in &stores.gateway_classes {
        for class in store.state() {
            let name = class.metadata.name.clone().unwrap_or_default();
            let current = status_json(class.status.as_ref());
            if let Some(desired) = class_status(outcome, &name, &current, &now)
                && desired_differs::<GatewayClassStatus>(&desired, &current)
            {
                patches.push(("GatewayClass", None, name, desired));
            }
        }
    }
    for store in &stores.gateways {
        for gw in store.state() {
            let key = key_of(&gw.metadata);
            let current = status_json(gw.status.as_ref());
            if let Some(desired) = gateway_status(outcome, &key, addresses, &current, &now)
                && desired_differs::<GatewayStatus>(&desired, &current)
            {
                patches.push(("Gateway", Some(key.namespace), key.name, desired));
            }
        }
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
        let current = status_json(status.as_ref());
        if let Some(desired) = route_status(outcome, (kind, &key), metadata.generation, &current, &now)
            && desired_differs::<RouteStatus>(&desired, &current)
        {
            patches.push((kind.name(), Some(key.namespace), key.name, desired));
        }
    }
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
            Err(error) => tracing::warn!(kind, name, %error, "cannot update the Gateway API status"),
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
