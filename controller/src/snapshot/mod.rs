//! The controller's input contract: every object of interest, keyed and sorted.
//!
//! The sources (`source/`) fill a [`Snapshot`] with [`Object`]s they parsed or received;
//! translation and the node plan read it. This module is the ground of the controller: it
//! imports nothing from the sources, from translation or from the node module.
//!
//! Objects are shared (`Arc`) between the source that holds them and the snapshots built from
//! it, so a snapshot costs a pointer per object, not a copy, and an unchanged object keeps its
//! identity from one snapshot to the next (what incremental translation keys its cache on).

pub mod object;
pub mod slice;
pub mod status_only;

pub use object::Object;
pub use slice::Slice;

use std::borrow::Borrow;
use std::collections::{BTreeMap, btree_map};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use weir_dataplane::model::ObjectRef;

use crate::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TlsRoute};

/// A consistent view of the cluster (or manifest directory) that translation and the node plan
/// read.
///
/// Every collection is sorted by key, so iteration order, and with it the translation, does not
/// depend on the order objects arrived in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// IngressClasses by name (they are cluster-scoped).
    pub ingress_classes: Objects<IngressClass, String>,
    /// Ingresses by namespace/name.
    pub ingresses: Objects<Ingress>,
    /// Services by namespace/name.
    pub services: Objects<Service>,
    /// EndpointSlices by namespace/name (of the slice, not of its Service), in weir's compact
    /// shape ([`Slice`]).
    pub endpoint_slices: Objects<Slice>,
    /// Core v1 Endpoints by namespace/name (the same as their Service's).
    pub endpoints: Objects<Endpoints>,
    /// Secrets by namespace/name.
    pub secrets: Objects<Secret>,
    /// ConfigMaps by namespace/name (the settings ConfigMap is one of them).
    pub config_maps: Objects<ConfigMap>,
    /// Gateway API GatewayClasses by name (cluster-scoped).
    pub gateway_classes: Objects<GatewayClass, String>,
    /// Gateway API Gateways by namespace/name.
    pub gateways: Objects<Gateway>,
    /// Gateway API HTTPRoutes by namespace/name.
    pub http_routes: Objects<HttpRoute>,
    /// Gateway API GRPCRoutes by namespace/name.
    pub grpc_routes: Objects<GrpcRoute>,
    /// Gateway API TLSRoutes by namespace/name.
    pub tls_routes: Objects<TlsRoute>,
    /// Gateway API ListenerSets by namespace/name.
    pub listener_sets: Objects<ListenerSet>,
    /// Gateway API ReferenceGrants by namespace/name.
    pub reference_grants: Objects<ReferenceGrant>,
    /// Namespaces by name (their labels select routes for Gateway listeners).
    pub namespaces: Objects<Namespace, String>,
}

/// The namespace/name key of a namespaced object (`default` when the namespace is unset).
pub(crate) fn key(meta: &ObjectMeta) -> ObjectRef {
    let namespace = meta.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or("default");
    ObjectRef::new(namespace, meta.name.as_deref().unwrap_or_default())
}

/// One object shared between a source and its snapshots: [`Object`] with `Arc` instead of `Box`.
#[derive(Clone, Debug, PartialEq)]
pub enum SharedObject {
    /// An Ingress.
    Ingress(Arc<Ingress>),
    /// An IngressClass.
    IngressClass(Arc<IngressClass>),
    /// A Service.
    Service(Arc<Service>),
    /// An EndpointSlice, in weir's compact shape.
    EndpointSlice(Arc<Slice>),
    /// A core v1 Endpoints.
    Endpoints(Arc<Endpoints>),
    /// A Secret.
    Secret(Arc<Secret>),
    /// A ConfigMap.
    ConfigMap(Arc<ConfigMap>),
    /// A Gateway API GatewayClass.
    GatewayClass(Arc<GatewayClass>),
    /// A Gateway API Gateway.
    Gateway(Arc<Gateway>),
    /// A Gateway API HTTPRoute.
    HttpRoute(Arc<HttpRoute>),
    /// A Gateway API GRPCRoute.
    GrpcRoute(Arc<GrpcRoute>),
    /// A Gateway API TLSRoute.
    TlsRoute(Arc<TlsRoute>),
    /// A Gateway API ListenerSet.
    ListenerSet(Arc<ListenerSet>),
    /// A Gateway API ReferenceGrant.
    ReferenceGrant(Arc<ReferenceGrant>),
    /// A Namespace.
    Namespace(Arc<Namespace>),
}

/// Which collection of a [`Snapshot`] an object is in, and its key there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SnapshotKey {
    /// An IngressClass, by name.
    IngressClass(String),
    /// An Ingress.
    Ingress(ObjectRef),
    /// A Service.
    Service(ObjectRef),
    /// An EndpointSlice.
    EndpointSlice(ObjectRef),
    /// A core v1 Endpoints.
    Endpoints(ObjectRef),
    /// A Secret.
    Secret(ObjectRef),
    /// A ConfigMap.
    ConfigMap(ObjectRef),
    /// A GatewayClass, by name.
    GatewayClass(String),
    /// A Gateway.
    Gateway(ObjectRef),
    /// An HTTPRoute.
    HttpRoute(ObjectRef),
    /// A GRPCRoute.
    GrpcRoute(ObjectRef),
    /// A TLSRoute.
    TlsRoute(ObjectRef),
    /// A ListenerSet.
    ListenerSet(ObjectRef),
    /// A ReferenceGrant.
    ReferenceGrant(ObjectRef),
    /// A Namespace, by name.
    Namespace(String),
}

impl SharedObject {
    /// Shares a parsed object; `None` for kinds weir does not read ([`Object::Other`]). An
    /// EndpointSlice becomes a [`Slice`].
    pub fn new(object: Object) -> Option<SharedObject> {
        Some(match object {
            Object::Ingress(o) => SharedObject::Ingress(Arc::from(o)),
            Object::IngressClass(o) => SharedObject::IngressClass(Arc::from(o)),
            Object::Service(o) => SharedObject::Service(Arc::from(o)),
            Object::EndpointSlice(o) => SharedObject::EndpointSlice(Arc::new(Slice::from(*o))),
            Object::Endpoints(o) => SharedObject::Endpoints(Arc::from(o)),
            Object::Secret(o) => SharedObject::Secret(Arc::from(o)),
            Object::ConfigMap(o) => SharedObject::ConfigMap(Arc::from(o)),
            Object::GatewayClass(o) => SharedObject::GatewayClass(Arc::from(o)),
            Object::Gateway(o) => SharedObject::Gateway(Arc::from(o)),
            Object::HttpRoute(o) => SharedObject::HttpRoute(Arc::from(o)),
            Object::GrpcRoute(o) => SharedObject::GrpcRoute(Arc::from(o)),
            Object::TlsRoute(o) => SharedObject::TlsRoute(Arc::from(o)),
            Object::ListenerSet(o) => SharedObject::ListenerSet(Arc::from(o)),
            Object::ReferenceGrant(o) => SharedObject::ReferenceGrant(Arc::from(o)),
            Object::Namespace(o) => SharedObject::Namespace(Arc::from(o)),
            Object::Other { .. } => return None,
        })
    }

    /// Its metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            SharedObject::Ingress(o) => &o.metadata,
            SharedObject::IngressClass(o) => &o.metadata,
            SharedObject::Service(o) => &o.metadata,
            SharedObject::EndpointSlice(o) => &o.metadata,
            SharedObject::Endpoints(o) => &o.metadata,
            SharedObject::Secret(o) => &o.metadata,
            SharedObject::ConfigMap(o) => &o.metadata,
            SharedObject::GatewayClass(o) => &o.metadata,
            SharedObject::Gateway(o) => &o.metadata,
            SharedObject::HttpRoute(o) => &o.metadata,
            SharedObject::GrpcRoute(o) => &o.metadata,
            SharedObject::TlsRoute(o) => &o.metadata,
            SharedObject::ListenerSet(o) => &o.metadata,
            SharedObject::ReferenceGrant(o) => &o.metadata,
            SharedObject::Namespace(o) => &o.metadata,
        }
    }

    /// Where it goes in a snapshot.
    pub fn key(&self) -> SnapshotKey {
        match self {
            SharedObject::IngressClass(o) => {
                SnapshotKey::IngressClass(o.metadata.name.clone().unwrap_or_default())
            }
            SharedObject::Ingress(o) => SnapshotKey::Ingress(key(&o.metadata)),
            SharedObject::Service(o) => SnapshotKey::Service(key(&o.metadata)),
            SharedObject::EndpointSlice(o) => SnapshotKey::EndpointSlice(key(&o.metadata)),
            SharedObject::Endpoints(o) => SnapshotKey::Endpoints(key(&o.metadata)),
            SharedObject::Secret(o) => SnapshotKey::Secret(key(&o.metadata)),
            SharedObject::ConfigMap(o) => SnapshotKey::ConfigMap(key(&o.metadata)),
            SharedObject::GatewayClass(o) => {
                SnapshotKey::GatewayClass(o.metadata.name.clone().unwrap_or_default())
            }
            SharedObject::Gateway(o) => SnapshotKey::Gateway(key(&o.metadata)),
            SharedObject::HttpRoute(o) => SnapshotKey::HttpRoute(key(&o.metadata)),
            SharedObject::GrpcRoute(o) => SnapshotKey::GrpcRoute(key(&o.metadata)),
            SharedObject::TlsRoute(o) => SnapshotKey::TlsRoute(key(&o.metadata)),
            SharedObject::ListenerSet(o) => SnapshotKey::ListenerSet(key(&o.metadata)),
            SharedObject::ReferenceGrant(o) => SnapshotKey::ReferenceGrant(key(&o.metadata)),
            SharedObject::Namespace(o) => SnapshotKey::Namespace(o.metadata.name.clone().unwrap_or_default()),
        }
    }

    /// True when both are the same allocation (not merely equal).
    pub fn same(&self, other: &SharedObject) -> bool {
        match (self, other) {
            (SharedObject::Ingress(a), SharedObject::Ingress(b)) => Arc::ptr_eq(a, b),
            (SharedObject::IngressClass(a), SharedObject::IngressClass(b)) => Arc::ptr_eq(a, b),
            (SharedObject::Service(a), SharedObject::Service(b)) => Arc::ptr_eq(a, b),
            (SharedObject::EndpointSlice(a), SharedObject::EndpointSlice(b)) => Arc::ptr_eq(a, b),
            (SharedObject::Endpoints(a), SharedObject::Endpoints(b)) => Arc::ptr_eq(a, b),
            (SharedObject::Secret(a), SharedObject::Secret(b)) => Arc::ptr_eq(a, b),
            (SharedObject::ConfigMap(a), SharedObject::ConfigMap(b)) => Arc::ptr_eq(a, b),
            (SharedObject::GatewayClass(a), SharedObject::GatewayClass(b)) => Arc::ptr_eq(a, b),
            (SharedObject::Gateway(a), SharedObject::Gateway(b)) => Arc::ptr_eq(a, b),
            (SharedObject::HttpRoute(a), SharedObject::HttpRoute(b)) => Arc::ptr_eq(a, b),
            (SharedObject::GrpcRoute(a), SharedObject::GrpcRoute(b)) => Arc::ptr_eq(a, b),
            (SharedObject::TlsRoute(a), SharedObject::TlsRoute(b)) => Arc::ptr_eq(a, b),
            (SharedObject::ListenerSet(a), SharedObject::ListenerSet(b)) => Arc::ptr_eq(a, b),
            (SharedObject::ReferenceGrant(a), SharedObject::ReferenceGrant(b)) => Arc::ptr_eq(a, b),
            (SharedObject::Namespace(a), SharedObject::Namespace(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// A short description for messages: `Ingress default/web`, `IngressClass weir`.
    pub fn describe(&self) -> String {
        match self.key() {
            SnapshotKey::IngressClass(name) => format!("IngressClass {name}"),
            SnapshotKey::Ingress(k) => format!("Ingress {k}"),
            SnapshotKey::Service(k) => format!("Service {k}"),
            SnapshotKey::EndpointSlice(k) => format!("EndpointSlice {k}"),
            SnapshotKey::Endpoints(k) => format!("Endpoints {k}"),
            SnapshotKey::Secret(k) => format!("Secret {k}"),
            SnapshotKey::ConfigMap(k) => format!("ConfigMap {k}"),
            SnapshotKey::GatewayClass(name) => format!("GatewayClass {name}"),
            SnapshotKey::Gateway(k) => format!("Gateway {k}"),
            SnapshotKey::HttpRoute(k) => format!("HTTPRoute {k}"),
            SnapshotKey::GrpcRoute(k) => format!("GRPCRoute {k}"),
            SnapshotKey::TlsRoute(k) => format!("TLSRoute {k}"),
            SnapshotKey::ListenerSet(k) => format!("ListenerSet {k}"),
            SnapshotKey::ReferenceGrant(k) => format!("ReferenceGrant {k}"),
            SnapshotKey::Namespace(name) => format!("Namespace {name}"),
        }
    }
}

impl Snapshot {
    /// Adds or replaces an object. Returns the replaced object of the same kind and key, if any.
    /// Kinds weir does not read ([`Object::Other`]) are dropped.
    pub fn insert(&mut self, obj: Object) -> Option<SharedObject> {
        let shared = SharedObject::new(obj)?;
        let key = shared.key();
        self.insert_shared(key, shared)
    }

    /// Adds or replaces a shared object under `key` (which must be `object.key()`).
    pub fn insert_shared(&mut self, key: SnapshotKey, object: SharedObject) -> Option<SharedObject> {
        match (key, object) {
            (SnapshotKey::IngressClass(k), SharedObject::IngressClass(o)) => {
                self.ingress_classes.insert(k, o).map(SharedObject::IngressClass)
            }
            (SnapshotKey::Ingress(k), SharedObject::Ingress(o)) => {
                self.ingresses.insert(k, o).map(SharedObject::Ingress)
            }
            (SnapshotKey::Service(k), SharedObject::Service(o)) => {
                self.services.insert(k, o).map(SharedObject::Service)
            }
            (SnapshotKey::EndpointSlice(k), SharedObject::EndpointSlice(o)) => {
                self.endpoint_slices.insert(k, o).map(SharedObject::EndpointSlice)
            }
            (SnapshotKey::Endpoints(k), SharedObject::Endpoints(o)) => {
                self.endpoints.insert(k, o).map(SharedObject::Endpoints)
            }
            (SnapshotKey::Secret(k), SharedObject::Secret(o)) => {
                self.secrets.insert(k, o).map(SharedObject::Secret)
            }
            (SnapshotKey::ConfigMap(k), SharedObject::ConfigMap(o)) => {
                self.config_maps.insert(k, o).map(SharedObject::ConfigMap)
            }
            (SnapshotKey::GatewayClass(k), SharedObject::GatewayClass(o)) => {
                self.gateway_classes.insert(k, o).map(SharedObject::GatewayClass)
            }
            (SnapshotKey::Gateway(k), SharedObject::Gateway(o)) => {
                self.gateways.insert(k, o).map(SharedObject::Gateway)
            }
            (SnapshotKey::HttpRoute(k), SharedObject::HttpRoute(o)) => {
                self.http_routes.insert(k, o).map(SharedObject::HttpRoute)
            }
            (SnapshotKey::GrpcRoute(k), SharedObject::GrpcRoute(o)) => {
                self.grpc_routes.insert(k, o).map(SharedObject::GrpcRoute)
            }
            (SnapshotKey::TlsRoute(k), SharedObject::TlsRoute(o)) => {
                self.tls_routes.insert(k, o).map(SharedObject::TlsRoute)
            }
            (SnapshotKey::ListenerSet(k), SharedObject::ListenerSet(o)) => {
                self.listener_sets.insert(k, o).map(SharedObject::ListenerSet)
            }
            (SnapshotKey::ReferenceGrant(k), SharedObject::ReferenceGrant(o)) => {
                self.reference_grants.insert(k, o).map(SharedObject::ReferenceGrant)
            }
            (SnapshotKey::Namespace(k), SharedObject::Namespace(o)) => {
                self.namespaces.insert(k, o).map(SharedObject::Namespace)
            }
            (key, object) => {
                debug_assert!(false, "{key:?} is not the key of {}", object.describe());
                None
            }
        }
    }

    /// The object under `key`, if any.
    pub fn get(&self, key: &SnapshotKey) -> Option<SharedObject> {
        match key {
            SnapshotKey::IngressClass(k) => {
                self.ingress_classes.get_shared(k).cloned().map(SharedObject::IngressClass)
            }
            SnapshotKey::Ingress(k) => self.ingresses.get_shared(k).cloned().map(SharedObject::Ingress),
            SnapshotKey::Service(k) => self.services.get_shared(k).cloned().map(SharedObject::Service),
            SnapshotKey::EndpointSlice(k) => {
                self.endpoint_slices.get_shared(k).cloned().map(SharedObject::EndpointSlice)
            }
            SnapshotKey::Endpoints(k) => self.endpoints.get_shared(k).cloned().map(SharedObject::Endpoints),
            SnapshotKey::Secret(k) => self.secrets.get_shared(k).cloned().map(SharedObject::Secret),
            SnapshotKey::ConfigMap(k) => self.config_maps.get_shared(k).cloned().map(SharedObject::ConfigMap),
            SnapshotKey::GatewayClass(k) => {
                self.gateway_classes.get_shared(k).cloned().map(SharedObject::GatewayClass)
            }
            SnapshotKey::Gateway(k) => self.gateways.get_shared(k).cloned().map(SharedObject::Gateway),
            SnapshotKey::HttpRoute(k) => self.http_routes.get_shared(k).cloned().map(SharedObject::HttpRoute),
            SnapshotKey::GrpcRoute(k) => self.grpc_routes.get_shared(k).cloned().map(SharedObject::GrpcRoute),
            SnapshotKey::TlsRoute(k) => self.tls_routes.get_shared(k).cloned().map(SharedObject::TlsRoute),
            SnapshotKey::ListenerSet(k) => {
                self.listener_sets.get_shared(k).cloned().map(SharedObject::ListenerSet)
            }
            SnapshotKey::ReferenceGrant(k) => {
                self.reference_grants.get_shared(k).cloned().map(SharedObject::ReferenceGrant)
            }
            SnapshotKey::Namespace(k) => self.namespaces.get_shared(k).cloned().map(SharedObject::Namespace),
        }
    }

    /// Removes the object under `key`; returns it.
    pub fn remove(&mut self, key: &SnapshotKey) -> Option<SharedObject> {
        match key {
            SnapshotKey::IngressClass(k) => self.ingress_classes.remove(k).map(SharedObject::IngressClass),
            SnapshotKey::Ingress(k) => self.ingresses.remove(k).map(SharedObject::Ingress),
            SnapshotKey::Service(k) => self.services.remove(k).map(SharedObject::Service),
            SnapshotKey::EndpointSlice(k) => self.endpoint_slices.remove(k).map(SharedObject::EndpointSlice),
            SnapshotKey::Endpoints(k) => self.endpoints.remove(k).map(SharedObject::Endpoints),
            SnapshotKey::Secret(k) => self.secrets.remove(k).map(SharedObject::Secret),
            SnapshotKey::ConfigMap(k) => self.config_maps.remove(k).map(SharedObject::ConfigMap),
            SnapshotKey::GatewayClass(k) => self.gateway_classes.remove(k).map(SharedObject::GatewayClass),
            SnapshotKey::Gateway(k) => self.gateways.remove(k).map(SharedObject::Gateway),
            SnapshotKey::HttpRoute(k) => self.http_routes.remove(k).map(SharedObject::HttpRoute),
            SnapshotKey::GrpcRoute(k) => self.grpc_routes.remove(k).map(SharedObject::GrpcRoute),
            SnapshotKey::TlsRoute(k) => self.tls_routes.remove(k).map(SharedObject::TlsRoute),
            SnapshotKey::ListenerSet(k) => self.listener_sets.remove(k).map(SharedObject::ListenerSet),
            SnapshotKey::ReferenceGrant(k) => {
                self.reference_grants.remove(k).map(SharedObject::ReferenceGrant)
            }
            SnapshotKey::Namespace(k) => self.namespaces.remove(k).map(SharedObject::Namespace),
        }
    }

    /// The keys whose object differs between `old` and `self` (added, removed or replaced by
    /// another allocation), in key order. Objects are compared by identity, so this is a walk
    /// over both snapshots without copying anything.
    pub fn changes_since(&self, old: &Snapshot) -> Vec<SnapshotKey> {
        let mut out = Vec::new();
        diff(&old.ingress_classes, &self.ingress_classes, |k| SnapshotKey::IngressClass(k.clone()), &mut out);
        diff(&old.ingresses, &self.ingresses, |k| SnapshotKey::Ingress(k.clone()), &mut out);
        diff(&old.services, &self.services, |k| SnapshotKey::Service(k.clone()), &mut out);
        diff(
            &old.endpoint_slices,
            &self.endpoint_slices,
            |k| SnapshotKey::EndpointSlice(k.clone()),
            &mut out,
        );
        diff(&old.endpoints, &self.endpoints, |k| SnapshotKey::Endpoints(k.clone()), &mut out);
        diff(&old.secrets, &self.secrets, |k| SnapshotKey::Secret(k.clone()), &mut out);
        diff(&old.config_maps, &self.config_maps, |k| SnapshotKey::ConfigMap(k.clone()), &mut out);
        diff(&old.gateway_classes, &self.gateway_classes, |k| SnapshotKey::GatewayClass(k.clone()), &mut out);
        diff(&old.gateways, &self.gateways, |k| SnapshotKey::Gateway(k.clone()), &mut out);
        diff(&old.http_routes, &self.http_routes, |k| SnapshotKey::HttpRoute(k.clone()), &mut out);
        diff(&old.grpc_routes, &self.grpc_routes, |k| SnapshotKey::GrpcRoute(k.clone()), &mut out);
        diff(&old.tls_routes, &self.tls_routes, |k| SnapshotKey::TlsRoute(k.clone()), &mut out);
        diff(&old.listener_sets, &self.listener_sets, |k| SnapshotKey::ListenerSet(k.clone()), &mut out);
        diff(
            &old.reference_grants,
            &self.reference_grants,
            |k| SnapshotKey::ReferenceGrant(k.clone()),
            &mut out,
        );
        diff(&old.namespaces, &self.namespaces, |k| SnapshotKey::Namespace(k.clone()), &mut out);
        out
    }
}

/// Appends the keys that differ between two sorted collections (a merge walk).
fn diff<T, K: Ord>(
    old: &Objects<T, K>,
    new: &Objects<T, K>,
    key: impl Fn(&K) -> SnapshotKey,
    out: &mut Vec<SnapshotKey>,
) {
    use std::cmp::Ordering;
    let mut a = old.0.iter().peekable();
    let mut b = new.0.iter().peekable();
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => return,
            (Some((k, _)), None) => {
                out.push(key(k));
                a.next();
            }
            (None, Some((k, _))) => {
                out.push(key(k));
                b.next();
            }
            (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                Ordering::Less => {
                    out.push(key(ka));
                    a.next();
                }
                Ordering::Greater => {
                    out.push(key(kb));
                    b.next();
                }
                Ordering::Equal => {
                    if !Arc::ptr_eq(va, vb) {
                        out.push(key(ka));
                    }
                    a.next();
                    b.next();
                }
            },
        }
    }
}

impl FromIterator<Object> for Snapshot {
    fn from_iter<I: IntoIterator<Item = Object>>(iter: I) -> Self {
        let mut snapshot = Snapshot::default();
        snapshot.extend(iter);
        snapshot
    }
}

impl Extend<Object> for Snapshot {
    fn extend<I: IntoIterator<Item = Object>>(&mut self, iter: I) {
        for obj in iter {
            self.insert(obj);
        }
    }
}

// === impl Objects ===

/// Objects of one kind by key, sorted, each behind an `Arc`: cloning the collection shares the
/// objects. Reads hand out plain references (`&T`), as a `BTreeMap<K, T>` would.
#[derive(Debug, PartialEq)]
pub struct Objects<T, K = ObjectRef>(BTreeMap<K, Arc<T>>);

impl<T, K: Clone> Clone for Objects<T, K> {
    fn clone(&self) -> Self {
        Objects(self.0.clone())
    }
}

impl<T, K> Default for Objects<T, K> {
    fn default() -> Self {
        Objects::new()
    }
}

impl<T, K> Objects<T, K> {
    /// No objects.
    pub const fn new() -> Self {
        Objects(BTreeMap::new())
    }
}

impl<T, K: Ord> Objects<T, K> {
    /// The object under `key`.
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&T>
    where
        K: Borrow<Q>,
    {
        self.0.get(key).map(|o| &**o)
    }

    /// The shared object under `key`.
    pub fn get_shared<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&Arc<T>>
    where
        K: Borrow<Q>,
    {
        self.0.get(key)
    }

    /// Whether there is an object under `key`.
    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.contains_key(key)
    }

    /// Adds or replaces; returns the replaced object.
    pub fn insert(&mut self, key: K, object: Arc<T>) -> Option<Arc<T>> {
        self.0.insert(key, object)
    }

    /// Removes and returns the object under `key`.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<Arc<T>>
    where
        K: Borrow<Q>,
    {
        self.0.remove(key)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Objects in key order.
    pub fn iter(&self) -> Iter<'_, T, K> {
        Iter(self.0.iter())
    }

    /// Keys in order.
    pub fn keys(&self) -> btree_map::Keys<'_, K, Arc<T>> {
        self.0.keys()
    }

    /// Objects in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.0.values().map(|o| &**o)
    }

    /// The shared objects in key order.
    pub fn shared(&self) -> &BTreeMap<K, Arc<T>> {
        &self.0
    }
}

/// Iterator over `(&key, &object)` of [`Objects`].
pub struct Iter<'a, T, K>(btree_map::Iter<'a, K, Arc<T>>);

impl<'a, T, K> Iterator for Iter<'a, T, K> {
    type Item = (&'a K, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (k, &**v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl<T, K> DoubleEndedIterator for Iter<'_, T, K> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, v)| (k, &**v))
    }
}

impl<T, K> ExactSizeIterator for Iter<'_, T, K> {}

impl<'a, T, K: Ord> IntoIterator for &'a Objects<T, K> {
    type Item = (&'a K, &'a T);
    type IntoIter = Iter<'a, T, K>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T, K: Ord> FromIterator<(K, T)> for Objects<T, K> {
    fn from_iter<I: IntoIterator<Item = (K, T)>>(iter: I) -> Self {
        Objects(iter.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
    }
}

impl<T, K: Ord> From<BTreeMap<K, T>> for Objects<T, K> {
    fn from(map: BTreeMap<K, T>) -> Self {
        map.into_iter().collect()
    }
}
