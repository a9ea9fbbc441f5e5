//! Scenarios through a Kubernetes API server: a step's manifest files are parsed and their
//! objects created, replaced or deleted through the API, and weir reads them with its
//! Kubernetes source instead of a manifests directory.
//!
//! EndpointSlices become core v1 Endpoints (one per Service, one subset per slice): the API
//! servers weir is tested against (1.20) do not serve `discovery.k8s.io/v1`, and weir falls back
//! to Endpoints there. The API server refuses loopback Endpoints, so the echo backends must use
//! another local block (see [`crate::backends::use_address_block`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use weir::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TlsRoute};
use weir::snapshot::Object;
use weir::source::manifest::parse_manifests;

use crate::scenario::ConditionExpect;

/// The API server a scenario runs against.
#[derive(Clone)]
pub struct KubeTarget {
    /// An admin client, used to apply the scenario's objects.
    pub client: Client,
    /// The kubeconfig weir reads the API with.
    pub kubeconfig: PathBuf,
}

/// The identity of an applied object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    kind: &'static str,
    namespace: String,
    name: String,
}

/// Keeps the API server's objects equal to those of the current manifest files.
pub(crate) struct ApiSink {
    target: KubeTarget,
    /// What was applied, as the JSON sent.
    applied: BTreeMap<Key, serde_json::Value>,
    namespaces: BTreeSet<String>,
}

impl ApiSink {
    pub(crate) fn new(target: KubeTarget) -> Self {
        ApiSink { target, applied: BTreeMap::new(), namespaces: BTreeSet::new() }
    }

    /// Applies the objects of `files` (name → text), deletes those no longer in any file.
    /// Files that do not parse contribute nothing.
    pub(crate) async fn sync(&mut self, files: &BTreeMap<String, String>) -> Result<(), String> {
        let mut desired: BTreeMap<Key, serde_json::Value> = BTreeMap::new();
        let mut slices: BTreeMap<(String, String), Vec<EndpointSlice>> = BTreeMap::new();
        for text in files.values() {
            let Ok(objects) = parse_manifests(text) else { continue };
            for object in objects {
                match object {
                    Object::EndpointSlice(slice) => {
                        let ns = namespace(&slice.metadata.namespace);
                        let service = slice
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("kubernetes.io/service-name"))
                            .cloned()
                            .unwrap_or_default();
                        slices.entry((ns, service)).or_default().push(*slice);
                    }
                    Object::Ingress(o) => insert(&mut desired, "Ingress", *o)?,
                    Object::IngressClass(o) => insert(&mut desired, "IngressClass", *o)?,
                    Object::Service(mut o) => {
                        // Server-side apply of 1.20 needs the protocol, a key of the ports list.
                        for port in o.spec.iter_mut().flat_map(|s| s.ports.iter_mut().flatten()) {
                            port.protocol.get_or_insert_with(|| "TCP".to_owned());
                        }
                        insert(&mut desired, "Service", *o)?
                    }
                    Object::Endpoints(mut o) => {
                        for port in o.subsets.iter_mut().flatten().flat_map(|s| s.ports.iter_mut().flatten())
                        {
                            port.protocol.get_or_insert_with(|| "TCP".to_owned());
                        }
                        insert(&mut desired, "Endpoints", *o)?
                    }
                    Object::Secret(o) => insert(&mut desired, "Secret", *o)?,
                    Object::ConfigMap(o) => insert(&mut desired, "ConfigMap", *o)?,
                    // Gateway API objects need their CRDs (`install_gateway_crds`).
                    Object::GatewayClass(o) => insert(&mut desired, "GatewayClass", *o)?,
                    Object::Gateway(o) => insert(&mut desired, "Gateway", *o)?,
                    Object::HttpRoute(o) => insert(&mut desired, "HTTPRoute", *o)?,
                    Object::GrpcRoute(o) => insert(&mut desired, "GRPCRoute", *o)?,
                    Object::TlsRoute(o) => insert(&mut desired, "TLSRoute", *o)?,
                    Object::ListenerSet(o) => insert(&mut desired, "ListenerSet", *o)?,
                    Object::ReferenceGrant(o) => insert(&mut desired, "ReferenceGrant", *o)?,
                    // Written Namespaces carry labels (`allowedRoutes` selectors); the others
                    // are created bare by `create_namespace`.
                    Object::Namespace(o) => insert(&mut desired, "Namespace", *o)?,
                    Object::Other { .. } => {}
                }
            }
        }
        for ((ns, service), slices) in slices {
            insert(&mut desired, "Endpoints", endpoints_of(&ns, &service, &slices))?;
        }

        for (key, value) in desired.iter().filter(|(k, _)| k.kind == "Namespace") {
            if self.applied.get(key) != Some(value) {
                self.apply(key, value).await?;
            }
            self.namespaces.insert(key.name.clone());
        }
        for key in desired.keys() {
            if !key.namespace.is_empty() && !self.namespaces.contains(&key.namespace) {
                self.create_namespace(&key.namespace).await?;
            }
        }
        // What routes refer to first, the routes last: a table weir publishes halfway through
        // lacks routes rather than answering for routes whose backends are not there yet.
        let mut changed: Vec<(&Key, &serde_json::Value)> =
            desired.iter().filter(|(key, value)| self.applied.get(*key) != Some(*value)).collect();
        changed.sort_by_key(|(key, _)| apply_rank(key.kind));
        for (key, value) in changed {
            self.apply(key, value).await?;
        }
        // Namespaces stay: deleting one takes long and would delete what it holds.
        let gone: Vec<Key> = self
            .applied
            .keys()
            .filter(|k| !desired.contains_key(*k) && k.kind != "Namespace")
            .cloned()
            .collect();
        for key in gone {
            self.delete(&key).await?;
        }
        self.applied = desired;
        Ok(())
    }

    async fn create_namespace(&mut self, name: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.target.client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(format!("creating namespace {name}: {error}")),
        }
        self.namespaces.insert(name.to_owned());
        Ok(())
    }

    async fn apply(&self, key: &Key, value: &serde_json::Value) -> Result<(), String> {
        let client = self.target.client.clone();
        let ns = key.namespace.as_str();
        let result = match key.kind {
            "Ingress" => patch(Api::<Ingress>::namespaced(client, ns), key, value).await,
            "IngressClass" => patch(Api::<IngressClass>::all(client), key, value).await,
            "Service" => patch(Api::<Service>::namespaced(client, ns), key, value).await,
            "Endpoints" => patch(Api::<Endpoints>::namespaced(client, ns), key, value).await,
            "Secret" => patch(Api::<Secret>::namespaced(client, ns), key, value).await,
            "ConfigMap" => patch(Api::<ConfigMap>::namespaced(client, ns), key, value).await,
            "Namespace" => patch(Api::<Namespace>::all(client), key, value).await,
            "GatewayClass" => patch(Api::<GatewayClass>::all(client), key, value).await,
            "Gateway" => patch(Api::<Gateway>::namespaced(client, ns), key, value).await,
            "HTTPRoute" => patch(Api::<HttpRoute>::namespaced(client, ns), key, value).await,
            "GRPCRoute" => patch(Api::<GrpcRoute>::namespaced(client, ns), key, value).await,
            "TLSRoute" => patch(Api::<TlsRoute>::namespaced(client, ns), key, value).await,
            "ListenerSet" => patch(Api::<ListenerSet>::namespaced(client, ns), key, value).await,
            "ReferenceGrant" => patch(Api::<ReferenceGrant>::namespaced(client, ns), key, value).await,
            other => return Err(format!("cannot apply kind {other}")),
        };
        result.map_err(|error| format!("applying {} {}/{}: {error}", key.kind, key.namespace, key.name))
    }

    async fn delete(&self, key: &Key) -> Result<(), String> {
        let client = self.target.client.clone();
        let ns = key.namespace.as_str();
        let dp = DeleteParams::default();
        let name = key.name.as_str();
        let result = match key.kind {
            "Ingress" => Api::<Ingress>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "IngressClass" => Api::<IngressClass>::all(client).delete(name, &dp).await.map(drop),
            "Service" => Api::<Service>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "Endpoints" => Api::<Endpoints>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "Secret" => Api::<Secret>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "ConfigMap" => Api::<ConfigMap>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "GatewayClass" => Api::<GatewayClass>::all(client).delete(name, &dp).await.map(drop),
            "Gateway" => Api::<Gateway>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "HTTPRoute" => Api::<HttpRoute>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "GRPCRoute" => Api::<GrpcRoute>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "TLSRoute" => Api::<TlsRoute>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "ListenerSet" => Api::<ListenerSet>::namespaced(client, ns).delete(name, &dp).await.map(drop),
            "ReferenceGrant" => {
                Api::<ReferenceGrant>::namespaced(client, ns).delete(name, &dp).await.map(drop)
            }
            other => return Err(format!("cannot delete kind {other}")),
        };
        match result {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(format!("deleting {} {}/{}: {error}", key.kind, key.namespace, key.name)),
        }
    }
}

// === status conditions ===

/// How long conditions may take to be written as expected after a step (the status writer
/// debounces, takes the lease, then writes).
const CONDITIONS_TIMEOUT: Duration = Duration::from_secs(20);

impl ApiSink {
    /// Checks each condition (one result per entry), waiting up to [`CONDITIONS_TIMEOUT`] for the
    /// ones not marked `known_failure` to hold; the known ones are then read once.
    pub(crate) async fn check_conditions(&self, expected: &[ConditionExpect]) -> Vec<Result<(), String>> {
        let deadline = tokio::time::Instant::now() + CONDITIONS_TIMEOUT;
        loop {
            let mut results = Vec::with_capacity(expected.len());
            for condition in expected {
                results.push(self.condition(condition).await);
            }
            let waiting = expected.iter().zip(&results).any(|(c, r)| c.known_failure.is_none() && r.is_err());
            if !waiting || tokio::time::Instant::now() >= deadline {
                return results;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Reads the object and checks one condition, with its `observedGeneration`.
    async fn condition(&self, want: &ConditionExpect) -> Result<(), String> {
        let plural = match want.kind.as_str() {
            "GatewayClass" => "gatewayclasses",
            "Gateway" => "gateways",
            "GRPCRoute" => "grpcroutes",
            "ListenerSet" => "listenersets",
            _ => "httproutes",
        };
        let gvk = GroupVersionKind::gvk(weir::gateway::GROUP, weir::gateway::VERSION, &want.kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let client = self.target.client.clone();
        let api: Api<DynamicObject> = if want.kind == "GatewayClass" {
            Api::all_with(client, &resource)
        } else {
            Api::namespaced_with(client, want.namespace(), &resource)
        };
        let object = api.get(&want.name).await.map_err(|error| format!("cannot read the object: {error}"))?;
        let generation = object.metadata.generation;
        let status = object.data.get("status").cloned().unwrap_or_default();
        let (holder, conditions) = if let Some(listener) = &want.listener {
            let found = status["listeners"]
                .as_array()
                .and_then(|ls| ls.iter().find(|l| l["name"] == listener.as_str()))
                .ok_or_else(|| format!("no status for listener {listener} (status {status})"))?;
            if let Some(attached) = want.attached_routes
                && found["attachedRoutes"].as_i64() != Some(attached)
            {
                return Err(format!("attachedRoutes {attached}, got {}", found["attachedRoutes"]));
            }
            (found.clone(), found["conditions"].clone())
        } else if let Some(parent) = &want.parent {
            let controller = weir::translate::gateway::GatewayConfig::default().controller_name;
            let found = status["parents"]
                .as_array()
                .and_then(|ps| {
                    ps.iter().find(|p| {
                        p["controllerName"] == controller.as_str()
                            && p["parentRef"]["name"] == parent.as_str()
                            && want.section.as_deref().is_none_or(|s| p["parentRef"]["sectionName"] == s)
                    })
                })
                .ok_or_else(|| format!("no parent status of weir for {parent} (status {status})"))?;
            (found.clone(), found["conditions"].clone())
        } else {
            if let Some(sets) = want.attached_listener_sets {
                let got = status["attachedListenerSets"].as_i64().unwrap_or(0);
                if got != sets {
                    return Err(format!("attachedListenerSets {sets}, got {got}"));
                }
            }
            (status.clone(), status["conditions"].clone())
        };
        let condition = conditions
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == want.type_.as_str()))
            .ok_or_else(|| format!("no {} condition (in {holder})", want.type_))?;
        let got = |field: &str| condition[field].as_str().unwrap_or_default().to_owned();
        let mut problems = Vec::new();
        if got("status") != want.status {
            problems.push(format!("status {}", want.status));
        }
        if let Some(reason) = &want.reason
            && got("reason") != *reason
        {
            problems.push(format!("reason {reason}"));
        }
        if condition["observedGeneration"].as_i64() != generation {
            problems.push(format!("observedGeneration {generation:?} (the object's generation)"));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!("expected {}, got {condition}", problems.join(" and ")))
        }
    }
}

/// Installs the Gateway API CRDs of the repository (`examples/kubernetes/gateway-api/crds`)
/// and waits until the API server serves each kind.
pub async fn install_gateway_crds(client: &Client) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes/gateway-api/crds");
    let entries = std::fs::read_dir(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut plurals = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|error| format!("{}: {error}", file.display()))?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|error| format!("{}: {error}", file.display()))?;
        plurals.push((crd.spec.names.plural.clone(), crd.spec.names.kind.clone()));
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(format!("creating the CRD of {}: {error}", file.display())),
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (plural, kind) in plurals {
        let version = if kind == "ReferenceGrant" {
            weir::gateway::REFERENCE_GRANT_VERSION
        } else {
            weir::gateway::VERSION
        };
        let gvk = GroupVersionKind::gvk(weir::gateway::GROUP, version, &kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
        let listed: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        while let Err(error) = listed.list(&ListParams::default().limit(1)).await {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{kind} not served within 60 s: {error}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// The order objects are applied in: referenced objects, then classes and Gateways, then routes.
fn apply_rank(kind: &str) -> u8 {
    match kind {
        "Namespace" => 0,
        "Service" | "Endpoints" | "Secret" | "ConfigMap" => 1,
        "IngressClass" | "GatewayClass" | "ReferenceGrant" => 2,
        "Gateway" | "ListenerSet" => 3,
        _ => 4,
    }
}

fn namespace(ns: &Option<String>) -> String {
    ns.as_deref().filter(|n| !n.is_empty()).unwrap_or("default").to_owned()
}

fn insert<K>(
    desired: &mut BTreeMap<Key, serde_json::Value>,
    kind: &'static str,
    mut object: K,
) -> Result<(), String>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let cluster_scoped = matches!(kind, "IngressClass" | "GatewayClass" | "Namespace");
    let meta = object.meta_mut();
    // The API server sets these itself.
    meta.creation_timestamp = None;
    meta.resource_version = None;
    meta.uid = None;
    let namespace = if cluster_scoped { String::new() } else { namespace(&meta.namespace) };
    meta.namespace = (!cluster_scoped).then(|| namespace.clone());
    let name = meta.name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    desired.insert(Key { kind, namespace, name }, value);
    Ok(())
}

/// The Endpoints equivalent of a Service's EndpointSlices: one subset per slice, ready
/// endpoints as addresses, the others (not ready or terminating) as not-ready addresses.
fn endpoints_of(namespace: &str, service: &str, slices: &[EndpointSlice]) -> Endpoints {
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset};
    let mut subsets = Vec::new();
    for slice in slices {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let ports: Vec<EndpointPort> = slice
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| {
                Some(EndpointPort {
                    name: p.name.clone(),
                    port: p.port?,
                    protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".to_owned())),
                    ..Default::default()
                })
            })
            .collect();
        let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
        for endpoint in &slice.endpoints {
            let conditions = endpoint.conditions.as_ref();
            let is_ready = conditions.and_then(|c| c.ready).unwrap_or(true)
                && !conditions.and_then(|c| c.terminating).unwrap_or(false);
            for ip in &endpoint.addresses {
                let address = EndpointAddress { ip: ip.clone(), ..Default::default() };
                if is_ready { ready.push(address) } else { not_ready.push(address) }
            }
        }
        if ports.is_empty() || (ready.is_empty() && not_ready.is_empty()) {
            continue;
        }
        subsets.push(EndpointSubset {
            addresses: (!ready.is_empty()).then_some(ready),
            not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
            ports: Some(ports),
        });
    }
    Endpoints {
        metadata: kube::api::ObjectMeta {
            name: Some(service.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    }
}

async fn patch<K>(api: Api<K>, key: &Key, value: &serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(&key.name, &PatchParams::apply("weir-conformance").force(), &Patch::Apply(value))
        .await
        .map(drop)
}
