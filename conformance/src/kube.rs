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

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use weir::snapshot::Object;
use weir::source::manifest::parse_manifests;

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
                    // The Ingress scenarios have no Gateway API objects (nor Namespaces, which
                    // `ensure` creates); Gateway API scenarios bring their CRDs.
                    Object::GatewayClass(_)
                    | Object::Gateway(_)
                    | Object::HttpRoute(_)
                    | Object::GrpcRoute(_)
                    | Object::TlsRoute(_)
                    | Object::ReferenceGrant(_)
                    | Object::Namespace(_) => {}
                    Object::Other { .. } => {}
                }
            }
        }
        for ((ns, service), slices) in slices {
            insert(&mut desired, "Endpoints", endpoints_of(&ns, &service, &slices))?;
        }

        for key in desired.keys() {
            if !key.namespace.is_empty() && !self.namespaces.contains(&key.namespace) {
                self.create_namespace(&key.namespace).await?;
            }
        }
        for (key, value) in &desired {
            if self.applied.get(key) != Some(value) {
                self.apply(key, value).await?;
            }
        }
        let gone: Vec<Key> = self.applied.keys().filter(|k| !desired.contains_key(*k)).cloned().collect();
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
            other => return Err(format!("cannot delete kind {other}")),
        };
        match result {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(format!("deleting {} {}/{}: {error}", key.kind, key.namespace, key.name)),
        }
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
    let cluster_scoped = kind == "IngressClass";
    let meta = object.meta_mut();
    // The API server sets these itself.
    meta.creation_timestamp = None;
    meta.resource_version = None;
    meta.uid = None;
    let namespace = if cluster_scoped { String::new() } else { namespace(&meta.namespace) };
    if !cluster_scoped {
        meta.namespace = Some(namespace.clone());
    }
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
