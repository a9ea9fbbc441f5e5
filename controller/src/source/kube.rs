//! The Kubernetes API source: reflectors over the objects translation reads.
//!
//! One reflector (a watch feeding an in-memory store) per kind and watched namespace:
//! IngressClass, Ingress, Service, `kubernetes.io/tls` Secrets, and either
//! `discovery.k8s.io/v1` EndpointSlices or, where API discovery says they are not served, core v1
//! Endpoints ([`Kinds::Ingress`], `weir serve`); or only Services and endpoints
//! ([`Kinds::Services`], `weir node`, which needs no other read rights). Watch errors, expired
//! resource versions (410) and API server restarts are retried with backoff by the watchers; the
//! stores keep their last good content meanwhile, so the last good table keeps serving. [`KubeSource::wait_until_synced`] resolves once every store has
//! listed, and [`KubeSource::next_burst`] debounces changes (holdoff and max delay).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_dataplane::model::ObjectRef;

use super::trim::Trim;
use crate::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TlsRoute};
use crate::gateway_source::GatewayKinds;
use crate::snapshot::{SharedObject, Slice, Snapshot};

/// Errors of the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--kubeconfig` cannot be read or used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No `--kubeconfig`, and neither in-cluster configuration nor a default kubeconfig works.
    #[error(
        "no Kubernetes configuration: not in a cluster ({incluster}) and no usable kubeconfig ({infer}); pass --kubeconfig"
    )]
    NoConfig {
        /// Why the in-cluster configuration failed.
        incluster: String,
        /// Why inferring a configuration failed.
        infer: String,
    },
    /// The client could not be built from the configuration.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// API discovery failed.
    #[error("API discovery of {group_version} failed: {source}")]
    Discovery {
        /// The group/version asked about.
        group_version: &'static str,
        /// The error.
        source: kube::Error,
    },
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which kinds the Kubernetes source watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kinds {
    /// Everything translation reads: IngressClasses, Ingresses, Services, endpoints and
    /// `kubernetes.io/tls` Secrets (`weir serve`).
    #[default]
    Ingress,
    /// Services and endpoints (EndpointSlices, or core Endpoints) only (`weir node`).
    Services,
}

/// What the Kubernetes source watches.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// Which kinds to watch (the settings ConfigMap is watched whenever `configmap` is set).
    pub kinds: Kinds,
    /// A kubeconfig file; `None` means in-cluster configuration (else `$KUBECONFIG`/`~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// A ConfigMap of global settings, watched when set.
    pub configmap: Option<ObjectRef>,
    /// A change is translated once no further change arrived for this long...
    pub holdoff: Duration,
    /// ...or at the latest this long after the first change of a burst.
    pub max_delay: Duration,
    /// The TCP and UDP services ConfigMaps (`--tcp-services-configmap`,
    /// `--udp-services-configmap`), each watched by name.
    pub l4_config_maps: Vec<ObjectRef>,
    /// The Gateway API kinds to watch (`crate::gateway_source::discover`; with
    /// [`Kinds::Ingress`] only).
    pub gateway: GatewayKinds,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            kinds: Kinds::default(),
            kubeconfig: None,
            namespaces: Vec::new(),
            configmap: None,
            holdoff: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            l4_config_maps: Vec::new(),
            gateway: GatewayKinds::default(),
        }
    }
}

/// Builds a client from `--kubeconfig`, else in-cluster configuration, else the default
/// kubeconfig (`$KUBECONFIG`, `~/.kube/config`).
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client> {
    client(config(kubeconfig).await?)
}

/// The client of `config` (from [`config`]). Its connection pool lives on the runtime it is made
/// in.
pub fn client(config: kube::Config) -> Result<Client> {
    Client::try_from(config).map_err(Error::Client)
}

/// The API server's address and credentials, as [`connect`] finds them; a missing or broken
/// kubeconfig is an error here, before anything is started.
pub async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config> {
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    let config = match kubeconfig {
        Some(path) => {
            let bad = |reason: String| Error::Kubeconfig { path: path.to_path_buf(), reason };
            let file = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => match Config::incluster() {
            Ok(config) => config,
            Err(incluster) => Config::infer().await.map_err(|infer| Error::NoConfig {
                incluster: incluster.to_string(),
                infer: infer.to_string(),
            })?,
        },
    };
    tracing::info!(server = %config.cluster_url, "connecting to the Kubernetes API");
    Ok(config)
}

/// Which API weir reads endpoints from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointsApi {
    /// `discovery.k8s.io/v1` EndpointSlices (Kubernetes 1.21 and later).
    EndpointSlices,
    /// Core v1 Endpoints, where the server does not serve EndpointSlice v1.
    Endpoints,
}

/// Asks the API server whether it serves `discovery.k8s.io/v1` EndpointSlices.
pub async fn discover_endpoints_api(client: &Client) -> Result<EndpointsApi> {
    const GROUP_VERSION: &str = "discovery.k8s.io/v1";
    match client.list_api_group_resources(GROUP_VERSION).await {
        Ok(list) if list.resources.iter().any(|r| r.name == "endpointslices") => {
            Ok(EndpointsApi::EndpointSlices)
        }
        Ok(_) => Ok(EndpointsApi::Endpoints),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(EndpointsApi::Endpoints),
        Err(source) => Err(Error::Discovery { group_version: GROUP_VERSION, source }),
    }
}

/// [`discover_endpoints_api`], retried with backoff (250 ms doubling up to 5 s) until the API
/// server answers; logs which API is watched.
pub async fn discover_endpoints_api_retrying(client: &Client) -> EndpointsApi {
    let mut retry = Duration::from_millis(250);
    let api = loop {
        match discover_endpoints_api(client).await {
            Ok(api) => break api,
            Err(error) => {
                tracing::warn!(%error, "cannot reach the Kubernetes API; retrying");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(5));
            }
        }
    };
    match api {
        EndpointsApi::EndpointSlices => tracing::info!("watching discovery.k8s.io/v1 EndpointSlices"),
        EndpointsApi::Endpoints => tracing::warn!(
            "this API server does not serve discovery.k8s.io/v1 EndpointSlices; watching core v1 Endpoints instead"
        ),
    }
    api
}

// === impl KubeSource ===

/// The stores of every watched kind.
#[derive(Clone)]
pub struct Stores {
    /// IngressClasses (cluster-scoped: one store).
    pub ingress_classes: Vec<Store<IngressClass>>,
    /// Ingresses, one store per watched namespace.
    pub ingresses: Vec<Store<Ingress>>,
    /// Services.
    pub services: Vec<Store<Service>>,
    /// EndpointSlices, in weir's compact shape (empty when the Endpoints fallback is used).
    pub endpoint_slices: Vec<Store<Slice>>,
    /// Core Endpoints (empty when EndpointSlices are used).
    pub endpoints: Vec<Store<Endpoints>>,
    /// `kubernetes.io/tls` Secrets.
    pub secrets: Vec<Store<Secret>>,
    /// The settings ConfigMap, when one was named.
    pub configmap: Vec<Store<ConfigMap>>,
    /// The TCP and UDP services ConfigMaps, when named.
    pub l4_config_maps: Vec<Store<ConfigMap>>,
    /// Gateway API GatewayClasses (empty when the Gateway API is not watched).
    pub gateway_classes: Vec<Store<GatewayClass>>,
    /// Gateway API Gateways.
    pub gateways: Vec<Store<Gateway>>,
    /// Gateway API HTTPRoutes.
    pub http_routes: Vec<Store<HttpRoute>>,
    /// Gateway API GRPCRoutes.
    pub grpc_routes: Vec<Store<GrpcRoute>>,
    /// Gateway API TLSRoutes.
    pub tls_routes: Vec<Store<TlsRoute>>,
    /// Gateway API ListenerSets.
    pub listener_sets: Vec<Store<ListenerSet>>,
    /// Gateway API ReferenceGrants.
    pub reference_grants: Vec<Store<ReferenceGrant>>,
    /// Namespaces (with the Gateway API: listeners select routes' namespaces by label).
    pub namespaces: Vec<Store<Namespace>>,
}

impl Stores {
    /// A snapshot of the stores' current content. The objects are shared with the stores, not
    /// copied, and keep their identity while unchanged (what incremental translation relies on).
    pub fn snapshot(&self) -> Snapshot {
        fn add<K>(snapshot: &mut Snapshot, stores: &[Store<K>], wrap: fn(Arc<K>) -> SharedObject)
        where
            K: Resource<DynamicType = ()> + Clone + 'static,
        {
            for store in stores {
                for object in store.state() {
                    let object = wrap(object);
                    snapshot.insert_shared(object.key(), object);
                }
            }
        }
        let mut snapshot = Snapshot::default();
        add(&mut snapshot, &self.ingress_classes, SharedObject::IngressClass);
        add(&mut snapshot, &self.ingresses, SharedObject::Ingress);
        add(&mut snapshot, &self.services, SharedObject::Service);
        add(&mut snapshot, &self.endpoint_slices, SharedObject::EndpointSlice);
        add(&mut snapshot, &self.endpoints, SharedObject::Endpoints);
        add(&mut snapshot, &self.secrets, SharedObject::Secret);
        add(&mut snapshot, &self.configmap, SharedObject::ConfigMap);
        add(&mut snapshot, &self.l4_config_maps, SharedObject::ConfigMap);
        add(&mut snapshot, &self.gateway_classes, SharedObject::GatewayClass);
        add(&mut snapshot, &self.gateways, SharedObject::Gateway);
        add(&mut snapshot, &self.http_routes, SharedObject::HttpRoute);
        add(&mut snapshot, &self.grpc_routes, SharedObject::GrpcRoute);
        add(&mut snapshot, &self.tls_routes, SharedObject::TlsRoute);
        add(&mut snapshot, &self.listener_sets, SharedObject::ListenerSet);
        add(&mut snapshot, &self.reference_grants, SharedObject::ReferenceGrant);
        add(&mut snapshot, &self.namespaces, SharedObject::Namespace);
        snapshot
    }

    /// Every Ingress in the stores, by namespace/name.
    pub fn ingresses(&self) -> BTreeMap<ObjectRef, Arc<Ingress>> {
        let mut out = BTreeMap::new();
        for store in &self.ingresses {
            for ingress in store.state() {
                let key = ObjectRef::new(ingress.namespace().unwrap_or_default(), ingress.name_any());
                out.insert(key, ingress);
            }
        }
        out
    }

    /// The settings ConfigMap's data, if it exists.
    pub fn settings(&self) -> Option<BTreeMap<String, String>> {
        self.configmap.iter().flat_map(|s| s.state()).next().map(|cm| cm.data.clone().unwrap_or_default())
    }

    async fn wait_until_ready(&self) -> bool {
        macro_rules! wait {
            ($($field:ident),*) => {
                $(for store in &self.$field {
                    if store.wait_until_ready().await.is_err() {
                        return false;
                    }
                })*
            };
        }
        wait!(
            ingress_classes,
            ingresses,
            services,
            endpoint_slices,
            endpoints,
            secrets,
            configmap,
            l4_config_maps
        );
        wait!(
            gateway_classes,
            gateways,
            http_routes,
            grpc_routes,
            tls_routes,
            listener_sets,
            reference_grants,
            namespaces
        );
        true
    }
}

/// The running reflectors of the Kubernetes source.
pub struct KubeSource {
    /// The stores the reflectors fill.
    pub stores: Stores,
    /// Which endpoints API is watched.
    pub endpoints_api: EndpointsApi,
    changes: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
    holdoff: Duration,
    max_delay: Duration,
    client: Client,
    /// Secrets of any type named by an Ingress annotation, each watched by name.
    referenced: BTreeMap<ObjectRef, (Store<Secret>, JoinHandle<()>)>,
    /// ConfigMaps named by an Ingress annotation or a settings key, each watched by name.
    referenced_config_maps: BTreeMap<ObjectRef, (Store<ConfigMap>, JoinHandle<()>)>,
}

/// Annotations whose value names a ConfigMap (`NAME` in the Ingress's namespace, or
/// `NAMESPACE/NAME`).
pub const CONFIGMAP_ANNOTATIONS: &[&str] = &[
    "nginx.ingress.kubernetes.io/custom-headers",
    "weir.dev/custom-headers",
    "nginx.ingress.kubernetes.io/auth-proxy-set-headers",
    "weir.dev/auth-proxy-set-headers",
];

/// Settings keys whose value names a ConfigMap (`NAME` in the settings ConfigMap's namespace,
/// or `NAMESPACE/NAME`).
pub const CONFIGMAP_SETTINGS: &[&str] = &["add-headers", "proxy-set-headers"];

/// The ConfigMaps the annotations of `ingresses` and the `settings` ConfigMap name.
pub fn referenced_config_maps<'a>(
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    settings: Option<&ConfigMap>,
) -> BTreeSet<ObjectRef> {
    let mut out = BTreeSet::new();
    for ingress in ingresses {
        let Some(annotations) = ingress.metadata.annotations.as_ref() else { continue };
        let namespace = ingress.metadata.namespace.as_deref().unwrap_or("default");
        out.extend(CONFIGMAP_ANNOTATIONS.iter().filter_map(|k| named(annotations.get(*k)?, namespace)));
    }
    if let Some(cm) = settings
        && let Some(data) = &cm.data
    {
        let namespace = cm.metadata.namespace.as_deref().unwrap_or("default");
        out.extend(CONFIGMAP_SETTINGS.iter().filter_map(|k| named(data.get(*k)?, namespace)));
    }
    out
}

/// The ConfigMaps Gateways name as client certificate CAs (`spec.tls.frontend`: `default` and
/// `perPort` `caCertificateRefs` of kind ConfigMap), whatever their namespace (translation
/// checks ReferenceGrants).
pub fn gateway_config_maps<'a>(gateways: impl IntoIterator<Item = &'a Gateway>) -> BTreeSet<ObjectRef> {
    let mut out = BTreeSet::new();
    for gateway in gateways {
        let Some(frontend) = gateway.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else { continue };
        let namespace = gateway.metadata.namespace.as_deref().unwrap_or("default");
        let validations = std::iter::once(&frontend.default)
            .chain(frontend.per_port.iter().map(|p| &p.tls))
            .filter_map(|t| t.validation.as_ref());
        for r in validations.flat_map(|v| &v.ca_certificate_refs) {
            if r.group.is_empty() && r.kind == "ConfigMap" && !r.name.is_empty() {
                out.insert(ObjectRef::new(r.namespace.as_deref().unwrap_or(namespace), &r.name));
            }
        }
    }
    out
}

/// `NAME` (in `namespace`) or `NAMESPACE/NAME`; `None` when empty or malformed.
fn named(value: &str, namespace: &str) -> Option<ObjectRef> {
    let value = value.trim();
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => Some(ObjectRef::new(ns, name)),
        Some(_) => None,
        None if value.is_empty() => None,
        None => Some(ObjectRef::new(namespace, value)),
    }
}

/// Annotations whose value names a Secret (`NAME` in the Ingress's namespace, or
/// `NAMESPACE/NAME`). Such Secrets are read whatever their type; other Secrets only when they
/// are of type `kubernetes.io/tls`.
pub const SECRET_ANNOTATIONS: &[&str] = &[
    "nginx.ingress.kubernetes.io/auth-secret",
    "nginx.ingress.kubernetes.io/auth-tls-secret",
    "nginx.ingress.kubernetes.io/proxy-ssl-secret",
    "weir.dev/auth-secret",
    "weir.dev/auth-tls-secret",
    "weir.dev/proxy-ssl-secret",
];

/// The Secrets the annotations of `ingresses` name.
pub fn referenced_secrets<'a>(ingresses: impl IntoIterator<Item = &'a Ingress>) -> BTreeSet<ObjectRef> {
    let mut out = BTreeSet::new();
    for ingress in ingresses {
        let Some(annotations) = ingress.metadata.annotations.as_ref() else { continue };
        let namespace = ingress.metadata.namespace.as_deref().unwrap_or("default");
        for key in SECRET_ANNOTATIONS {
            let Some(value) = annotations.get(*key).map(|v| v.trim()).filter(|v| !v.is_empty()) else {
                continue;
            };
            let secret = match value.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() => ObjectRef::new(ns, name),
                Some(_) => continue,
                None => ObjectRef::new(namespace, value),
            };
            out.insert(secret);
        }
    }
    out
}

impl KubeSource {
    /// Starts a reflector per kind and namespace. Nothing is listed yet when this returns: see
    /// [`KubeSource::wait_until_synced`].
    pub fn start(client: &Client, options: &KubeOptions, endpoints_api: EndpointsApi) -> KubeSource {
        let changes = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let namespaces: Vec<Option<&str>> = if options.namespaces.is_empty() {
            vec![None]
        } else {
            options.namespaces.iter().map(|n| Some(n.as_str())).collect()
        };
        // Kinds left out get no reflector: an empty list of namespaces.
        let ingress_namespaces = match options.kinds {
            Kinds::Ingress => namespaces.as_slice(),
            Kinds::Services => &[],
        };
        let mut reflect = Reflect { client, changes: &changes, tasks: &mut tasks };
        let plain = watcher::Config::default;
        let mut stores = Stores {
            ingress_classes: match options.kinds {
                Kinds::Ingress => vec![reflect.cluster::<IngressClass>(plain())],
                Kinds::Services => Vec::new(),
            },
            ingresses: reflect.each::<Ingress>(ingress_namespaces, plain),
            services: reflect.each::<Service>(&namespaces, plain),
            endpoint_slices: match endpoints_api {
                EndpointsApi::EndpointSlices => reflect.each::<EndpointSlice>(&namespaces, plain),
                EndpointsApi::Endpoints => Vec::new(),
            },
            endpoints: match endpoints_api {
                EndpointsApi::EndpointSlices => Vec::new(),
                EndpointsApi::Endpoints => reflect.each::<Endpoints>(&namespaces, plain),
            },
            secrets: reflect.each::<Secret>(ingress_namespaces, || {
                watcher::Config::default().fields("type=kubernetes.io/tls")
            }),
            configmap: match &options.configmap {
                Some(cm) => reflect.each::<ConfigMap>(&[Some(cm.namespace.as_str())], || {
                    watcher::Config::default().fields(&format!("metadata.name={}", cm.name))
                }),
                None => Vec::new(),
            },
            l4_config_maps: options
                .l4_config_maps
                .iter()
                .flat_map(|cm| {
                    reflect.each::<ConfigMap>(&[Some(cm.namespace.as_str())], || {
                        watcher::Config::default().fields(&format!("metadata.name={}", cm.name))
                    })
                })
                .collect(),
            gateway_classes: Vec::new(),
            gateways: Vec::new(),
            http_routes: Vec::new(),
            grpc_routes: Vec::new(),
            tls_routes: Vec::new(),
            listener_sets: Vec::new(),
            reference_grants: Vec::new(),
            namespaces: Vec::new(),
        };
        // The Gateway API kinds discovered (`crate::gateway_source`), for `weir serve` only.
        let gateway = if options.kinds == Kinds::Ingress { options.gateway } else { GatewayKinds::default() };
        if gateway.http {
            stores.gateway_classes = vec![reflect.cluster::<GatewayClass>(plain())];
            stores.gateways = reflect.each::<Gateway>(&namespaces, plain);
            stores.http_routes = reflect.each::<HttpRoute>(&namespaces, plain);
            stores.namespaces = vec![reflect.cluster::<Namespace>(plain())];
        }
        if gateway.grpc {
            stores.grpc_routes = reflect.each::<GrpcRoute>(&namespaces, plain);
        }
        if gateway.tls {
            stores.tls_routes = reflect.each::<TlsRoute>(&namespaces, plain);
        }
        if gateway.listener_sets {
            stores.listener_sets = reflect.each::<ListenerSet>(&namespaces, plain);
        }
        if gateway.reference_grants {
            stores.reference_grants = reflect.each::<ReferenceGrant>(&namespaces, plain);
        }
        KubeSource {
            stores,
            endpoints_api,
            changes,
            tasks,
            holdoff: options.holdoff,
            max_delay: options.max_delay,
            client: client.clone(),
            referenced: BTreeMap::new(),
            referenced_config_maps: BTreeMap::new(),
        }
    }

    /// A snapshot of every store, with the Secrets and ConfigMaps annotations (and settings)
    /// reference.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = self.stores.snapshot();
        for (store, _) in self.referenced.values() {
            for secret in store.state() {
                let secret = SharedObject::Secret(secret);
                snapshot.insert_shared(secret.key(), secret);
            }
        }
        for (store, _) in self.referenced_config_maps.values() {
            for cm in store.state() {
                let cm = SharedObject::ConfigMap(cm);
                snapshot.insert_shared(cm.key(), cm);
            }
        }
        snapshot
    }

    /// Watches the Secrets and ConfigMaps the Ingresses' annotations (and the settings
    /// ConfigMap's header keys, and the Gateways' client certificate CAs) name now, and stops watching those no longer named. Newly named
    /// objects are listed before this returns (at most `wait`), so the next snapshot has them if
    /// they exist.
    pub async fn track_referenced_secrets(&mut self, wait: Duration) {
        let ingresses: Vec<Arc<Ingress>> = self.stores.ingresses.iter().flat_map(|s| s.state()).collect();
        let wanted = referenced_secrets(ingresses.iter().map(|i| i.as_ref()));
        let mut reflect = Reflect { client: &self.client, changes: &self.changes, tasks: &mut Vec::new() };
        let secrets = reflect.by_name(&mut self.referenced, wanted);
        let settings = self.stores.configmap.iter().flat_map(|s| s.state()).next();
        let mut wanted = referenced_config_maps(ingresses.iter().map(|i| i.as_ref()), settings.as_deref());
        let gateways: Vec<Arc<Gateway>> = self.stores.gateways.iter().flat_map(|s| s.state()).collect();
        wanted.extend(gateway_config_maps(gateways.iter().map(|g| g.as_ref())));
        let config_maps = reflect.by_name(&mut self.referenced_config_maps, wanted);
        let listed = async {
            for store in &secrets {
                let _ = store.wait_until_ready().await;
            }
            for store in &config_maps {
                let _ = store.wait_until_ready().await;
            }
        };
        if tokio::time::timeout(wait, listed).await.is_err() {
            tracing::warn!(
                "Secrets or ConfigMaps named by annotations not listed within {wait:?}; they follow when they are"
            );
        }
    }

    /// Resolves once every reflector has completed its first list (false if one stopped).
    pub async fn wait_until_synced(&self) -> bool {
        self.stores.wait_until_ready().await
    }

    /// Waits for the next burst of changes to end: returns `holdoff` after the last change, or
    /// `max_delay` after the first one, whichever comes first.
    pub async fn next_burst(&self) {
        debounce(&self.changes, self.holdoff, self.max_delay).await;
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Waits for a notification, then until `holdoff` passed without one or `max_delay` passed since
/// the first.
async fn debounce(changes: &Notify, holdoff: Duration, max_delay: Duration) {
    changes.notified().await;
    let deadline = Instant::now() + max_delay;
    loop {
        let quiet = (Instant::now() + holdoff).min(deadline);
        tokio::select! {
            _ = changes.notified() => {
                if Instant::now() >= deadline {
                    return;
                }
            }
            _ = tokio::time::sleep_until(quiet) => return,
        }
    }
}

/// An API kind as a reflector stores it: trimmed ([`Trim`]), or in weir's own shape.
trait Keep: Resource<DynamicType = ()> + Trim + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    /// What the store holds.
    type Stored: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static;
    /// Turns a received object into what the store holds.
    fn keep(self) -> Self::Stored;
}

macro_rules! keep_trimmed {
    ($($kind:ty),*) => {
        $(impl Keep for $kind {
            type Stored = $kind;
            fn keep(mut self) -> $kind {
                self.trim();
                self
            }
        })*
    };
}

keep_trimmed!(IngressClass, Ingress, Service, Endpoints, Secret, ConfigMap);
keep_trimmed!(GatewayClass, Gateway, HttpRoute, GrpcRoute, TlsRoute, ListenerSet, ReferenceGrant, Namespace);

/// A [`Slice`] is what the Kubernetes source's reflectors store: the API's resource, in weir's
/// shape.
impl Resource for Slice {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "EndpointSlice".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "discovery.k8s.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "endpointslices".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// EndpointSlices are stored as [`Slice`]s: a tenth of the memory per endpoint.
impl Keep for EndpointSlice {
    type Stored = Slice;
    fn keep(self) -> Slice {
        Slice::from(self)
    }
}

/// `event` with its object (if any) turned into what the store holds.
fn keep_event<K: Keep>(event: watcher::Event<K>) -> watcher::Event<K::Stored> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.keep()),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.keep()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.keep()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Starts reflectors, collecting their tasks.
struct Reflect<'a> {
    client: &'a Client,
    changes: &'a Arc<Notify>,
    tasks: &'a mut Vec<JoinHandle<()>>,
}

impl Reflect<'_> {
    /// Watches each of `wanted` by name (those in `watched` already stay), stops watching the
    /// others; returns the new stores.
    fn by_name<K>(
        &mut self,
        watched: &mut BTreeMap<ObjectRef, (Store<K>, JoinHandle<()>)>,
        wanted: BTreeSet<ObjectRef>,
    ) -> Vec<Store<K>>
    where
        K: Keep<Stored = K> + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        watched.retain(|object, (_, task)| {
            let keep = wanted.contains(object);
            if !keep {
                task.abort();
            }
            keep
        });
        let mut new = Vec::new();
        for object in wanted {
            if watched.contains_key(&object) {
                continue;
            }
            let name = object.name.clone();
            let store = self.each::<K>(&[Some(object.namespace.as_str())], || {
                watcher::Config::default().fields(&format!("metadata.name={name}"))
            });
            let (Some(store), Some(task)) = (store.into_iter().next(), self.tasks.pop()) else { continue };
            new.push(store.clone());
            watched.insert(object, (store, task));
        }
        new
    }

    fn each<K>(
        &mut self,
        namespaces: &[Option<&str>],
        config: impl Fn() -> watcher::Config,
    ) -> Vec<Store<K::Stored>>
    where
        K: Keep + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        namespaces
            .iter()
            .map(|ns| {
                let api = match ns {
                    Some(ns) => Api::<K>::namespaced(self.client.clone(), ns),
                    None => Api::<K>::all(self.client.clone()),
                };
                self.spawn(api, config(), *ns)
            })
            .collect()
    }

    fn cluster<K: Keep>(&mut self, config: watcher::Config) -> Store<K::Stored> {
        self.spawn(Api::<K>::all(self.client.clone()), config, None)
    }

    fn spawn<K: Keep>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
        namespace: Option<&str>,
    ) -> Store<K::Stored> {
        let kind = K::kind(&());
        let namespace = namespace.unwrap_or("*").to_string();
        let (reader, writer) = reflector::store();
        // The first list (and a relist) from the API server's watch cache, in one response, as
        // client-go's informers list: without it (a quorum read from etcd in pages of 500, one
        // after another) the list of 5,000 HTTPRoutes was ten round trips, 2.8-3.9 s of the time
        // to the first table, and by hand it cost the API server 2.6-16 times the CPU of the list
        // from the cache (bench/RESULTS.md, "Gateway API scale", 2026-11-27). The watch that
        // follows starts from the list's version, so a list a moment behind is caught up by its
        // events.
        let config = config.any_semantic();
        let stream = watcher(api, config).backoff(WatchBackoff::default()).map_ok(keep_event).reflect(writer);
        let changes = self.changes.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut failing = false;
            while let Some(event) = stream.next().await {
                match event {
                    // The store changes on these; Init and InitApply only fill its buffer.
                    Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                        if failing {
                            failing = false;
                            tracing::info!(%kind, %namespace, "watch resumed");
                        }
                        changes.notify_one();
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Err(error) => {
                        if !failing {
                            failing = true;
                            tracing::warn!(%kind, %namespace, %error, "watch failed; retrying with backoff, the current routing table keeps serving");
                        } else {
                            tracing::debug!(%kind, %namespace, %error, "watch still failing");
                        }
                    }
                }
            }
        }));
        reader
    }
}

/// Retry delays of a failed watch: 250 ms doubling up to 4 s, so that an API server restart is
/// noticed within seconds without hammering it.
#[derive(Clone, Debug)]
struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    const MIN: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(4);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: Self::MIN }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let current = self.next;
        self.next = (current * 2).min(Self::MAX);
        Some(current)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn referenced_secrets_come_from_known_annotations() {
        let ingress: Ingress = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "shop", "annotations": {
                "nginx.ingress.kubernetes.io/auth-secret": "basic",
                "nginx.ingress.kubernetes.io/auth-tls-secret": "certs/ca",
                "nginx.ingress.kubernetes.io/proxy-ssl-secret": "/broken",
                "example.com/secret": "ignored"
            }}
        }))
        .unwrap();
        let refs: Vec<String> = referenced_secrets([&ingress]).iter().map(|r| r.to_string()).collect();
        assert_eq!(refs, ["certs/ca", "shop/basic"]);
    }

    #[test]
    fn referenced_config_maps_come_from_annotations_and_settings() {
        let ingress: Ingress = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "shop", "annotations": {
                "nginx.ingress.kubernetes.io/custom-headers": "hdrs",
                "weir.dev/custom-headers": "other/hdrs",
                "nginx.ingress.kubernetes.io/auth-secret": "not-a-configmap"
            }}
        }))
        .unwrap();
        let settings: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "settings", "namespace": "weir-system"},
            "data": {"add-headers": "resp", "proxy-set-headers": "ops/up", "hsts": "true"}
        }))
        .unwrap();
        let refs: Vec<String> =
            referenced_config_maps([&ingress], Some(&settings)).iter().map(|r| r.to_string()).collect();
        assert_eq!(refs, ["ops/up", "other/hdrs", "shop/hdrs", "weir-system/resp"]);
    }

    /// `FrontendTLSValidation.caCertificateRefs` of `default` and `perPort`: the ConfigMaps,
    /// in the Gateway's namespace unless named; other kinds are not watched.
    #[test]
    fn gateway_config_maps_are_the_frontend_ca_certificate_refs() {
        let gateway: Gateway = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gw", "namespace": "infra"},
            "spec": {"gatewayClassName": "weir", "listeners": [], "tls": {"frontend": {
                "default": {"validation": {"caCertificateRefs": [
                    {"group": "", "kind": "ConfigMap", "name": "ca"},
                    {"group": "", "kind": "Service", "name": "not-a-ca"}
                ]}},
                "perPort": [{"port": 443, "tls": {"validation": {"caCertificateRefs": [
                    {"kind": "ConfigMap", "name": "other", "namespace": "web"}
                ]}}}]
            }}}
        }))
        .unwrap();
        let refs: Vec<String> = gateway_config_maps([&gateway]).iter().map(|r| r.to_string()).collect();
        assert_eq!(refs, ["infra/ca", "web/other"]);
    }

    #[tokio::test]
    async fn debounce_waits_for_quiet_but_not_longer_than_max_delay() {
        let changes = Arc::new(Notify::new());
        let (holdoff, max_delay) = (Duration::from_millis(60), Duration::from_millis(250));

        // One change: published a holdoff later.
        changes.notify_one();
        let t = Instant::now();
        debounce(&changes, holdoff, max_delay).await;
        let single = t.elapsed();
        assert!(single >= holdoff && single < max_delay, "{single:?}");

        // A change every 20 ms for a second: published at max_delay, not after the storm.
        let storm = changes.clone();
        let pinger = tokio::spawn(async move {
            for _ in 0..50 {
                storm.notify_one();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t = Instant::now();
        debounce(&changes, holdoff, max_delay).await;
        let burst = t.elapsed();
        pinger.abort();
        assert!(
            burst >= max_delay - Duration::from_millis(30) && burst < Duration::from_millis(600),
            "{burst:?}"
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let delays: Vec<_> = (&mut b).take(7).collect();
        assert_eq!(delays[0], Duration::from_millis(250));
        assert_eq!(delays[1], Duration::from_millis(500));
        assert_eq!(delays[6], Duration::from_secs(4));
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(250)));
    }
}
