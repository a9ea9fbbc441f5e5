//! The input of translation: every object of interest, keyed and sorted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use weir_dataplane::model::ObjectRef;

use crate::source::manifest::Object;

/// A consistent view of the cluster (or manifest directory) that translation reads.
///
/// Every collection is a `BTreeMap`, so iteration order, and with it the translation, does not
/// depend on the order objects arrived in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// IngressClasses by name (they are cluster-scoped).
    pub ingress_classes: BTreeMap<String, IngressClass>,
    /// Ingresses by namespace/name.
    pub ingresses: BTreeMap<ObjectRef, Ingress>,
    /// Services by namespace/name.
    pub services: BTreeMap<ObjectRef, Service>,
    /// EndpointSlices by namespace/name (of the slice, not of its Service).
    pub endpoint_slices: BTreeMap<ObjectRef, EndpointSlice>,
    /// Core v1 Endpoints by namespace/name (the same as their Service's).
    pub endpoints: BTreeMap<ObjectRef, Endpoints>,
    /// Secrets by namespace/name.
    pub secrets: BTreeMap<ObjectRef, Secret>,
    /// ConfigMaps by namespace/name (the settings ConfigMap is one of them).
    pub config_maps: BTreeMap<ObjectRef, ConfigMap>,
}

/// The namespace/name key of a namespaced object (`default` when the namespace is unset).
pub(crate) fn key(meta: &ObjectMeta) -> ObjectRef {
    let namespace = meta.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or("default");
    ObjectRef::new(namespace, meta.name.as_deref().unwrap_or_default())
}

impl Snapshot {
    /// Adds or replaces an object. Returns the replaced object of the same kind and key, if any.
    /// Kinds weir does not read ([`Object::Other`]) are dropped.
    pub fn insert(&mut self, obj: Object) -> Option<Object> {
        match obj {
            Object::Ingress(o) => {
                self.ingresses.insert(key(&o.metadata), *o).map(|old| Object::Ingress(Box::new(old)))
            }
            Object::IngressClass(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                self.ingress_classes.insert(name, *o).map(|old| Object::IngressClass(Box::new(old)))
            }
            Object::Service(o) => {
                self.services.insert(key(&o.metadata), *o).map(|old| Object::Service(Box::new(old)))
            }
            Object::EndpointSlice(o) => self
                .endpoint_slices
                .insert(key(&o.metadata), *o)
                .map(|old| Object::EndpointSlice(Box::new(old))),
            Object::Endpoints(o) => {
                self.endpoints.insert(key(&o.metadata), *o).map(|old| Object::Endpoints(Box::new(old)))
            }
            Object::Secret(o) => {
                self.secrets.insert(key(&o.metadata), *o).map(|old| Object::Secret(Box::new(old)))
            }
            Object::ConfigMap(o) => {
                self.config_maps.insert(key(&o.metadata), *o).map(|old| Object::ConfigMap(Box::new(old)))
            }
            Object::Other { .. } => None,
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
