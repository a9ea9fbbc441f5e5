//! Changes translation cannot see: a Gateway API object whose only difference is its `status`
//! (and the `resourceVersion` that came with it).
//!
//! The leader writes the status of every GatewayClass, Gateway and route of ours; each write
//! comes back through the watch as a changed object. Translation never reads `status`, so such
//! a change needs no new table; without this filter, writing the status of 5,000 HTTPRoutes
//! made weir translate everything again after every burst of its own writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Snapshot, SnapshotKey};

/// The keys of `changed` (between `old` and `new`) whose objects differ in more than their
/// status: the changes translation has to see. Objects added or removed are always kept.
pub fn spec_changes(old: &Snapshot, new: &Snapshot, changed: &[SnapshotKey]) -> Vec<SnapshotKey> {
    changed.iter().filter(|key| !status_only(old, new, key)).cloned().collect()
}

/// Whether `key` is a Gateway API object present in both snapshots that differs only in
/// `status` and `metadata.resourceVersion`.
fn status_only(old: &Snapshot, new: &Snapshot, key: &SnapshotKey) -> bool {
    macro_rules! same {
        ($field:ident, $k:expr) => {
            match (old.$field.get($k), new.$field.get($k)) {
                (Some(a), Some(b)) => a.spec == b.spec && same_meta(&a.metadata, &b.metadata),
                _ => false,
            }
        };
    }
    match key {
        SnapshotKey::GatewayClass(k) => same!(gateway_classes, k.as_str()),
        SnapshotKey::Gateway(k) => same!(gateways, k),
        SnapshotKey::HttpRoute(k) => same!(http_routes, k),
        SnapshotKey::GrpcRoute(k) => same!(grpc_routes, k),
        SnapshotKey::TlsRoute(k) => same!(tls_routes, k),
        SnapshotKey::ListenerSet(k) => same!(listener_sets, k),
        _ => false,
    }
}

/// Metadata equal but for `resourceVersion` (and `managedFields`, which status writes change
/// too; the sources drop them anyway).
fn same_meta(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    if a.resource_version == b.resource_version {
        return a == b;
    }
    let strip = |m: &ObjectMeta| ObjectMeta { resource_version: None, managed_fields: None, ..m.clone() };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::snapshot::Object;

    fn route(rv: &str, host: &str, status: Option<Value>, labels: Option<Value>) -> Snapshot {
        let mut value = json!({
            "metadata": {"name": "r", "namespace": "ns", "generation": 1, "resourceVersion": rv},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [host]},
        });
        if let Some(status) = status {
            value["status"] = status;
        }
        if let Some(labels) = labels {
            value["metadata"]["labels"] = labels;
        }
        let mut s = Snapshot::default();
        s.insert(Object::HttpRoute(Box::new(serde_json::from_value(value).expect("an HTTPRoute"))));
        s
    }

    fn accepted() -> Option<Value> {
        Some(
            json!({"parents": [{"parentRef": {"name": "gw"}, "controllerName": "weir.dev/gateway-controller",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok",
                            "lastTransitionTime": "2026-11-26T00:00:00Z"}]}]}),
        )
    }

    #[test]
    fn a_status_write_is_not_a_change_for_translation() {
        let old = route("1", "a.example", None, None);
        let new = route("2", "a.example", accepted(), None);
        let changed = new.changes_since(&old);
        assert_eq!(changed.len(), 1, "the snapshot diff sees the new object");
        assert!(spec_changes(&old, &new, &changed).is_empty());
    }

    #[test]
    fn spec_labels_and_new_or_deleted_objects_are_changes() {
        let old = route("1", "a.example", accepted(), None);
        for new in [
            route("2", "b.example", accepted(), None),
            route("2", "a.example", accepted(), Some(json!({"team": "x"}))),
        ] {
            let changed = new.changes_since(&old);
            assert_eq!(changed.len(), 1);
            assert_eq!(spec_changes(&old, &new, &changed), changed);
        }
        let empty = Snapshot::default();
        let added = old.changes_since(&empty);
        assert_eq!(spec_changes(&empty, &old, &added), added);
        let removed = empty.changes_since(&old);
        assert_eq!(spec_changes(&old, &empty, &removed), removed);
    }

    #[test]
    fn other_kinds_are_kept_whatever_changed() {
        let ingress = |rv: &str, status: Value| {
            let value = json!({"metadata": {"name": "i", "namespace": "ns", "resourceVersion": rv},
                               "spec": {}, "status": status});
            let mut s = Snapshot::default();
            s.insert(Object::Ingress(Box::new(serde_json::from_value(value).expect("an Ingress"))));
            s
        };
        let old = ingress("1", json!({}));
        let new = ingress("2", json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}));
        let changed = new.changes_since(&old);
        assert_eq!(changed.len(), 1);
        assert_eq!(spec_changes(&old, &new, &changed), changed);
    }
}
