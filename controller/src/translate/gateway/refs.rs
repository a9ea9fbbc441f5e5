//! ReferenceGrants: which cross-namespace references are allowed (pure).
//!
//! `ReferenceGrantSpec`: a grant in the referent's namespace lists the referring objects
//! (`from`: group, kind, namespace) and the referents (`to`: group, kind, optionally name). A
//! reference to another namespace without such a grant is refused (`RefNotPermitted`).

use weir_dataplane::model::ObjectRef;

use crate::gateway::ReferenceGrant;
use crate::snapshot::Snapshot;

/// The ReferenceGrants of a snapshot.
pub struct Grants<'a> {
    grants: Vec<(&'a ObjectRef, &'a ReferenceGrant)>,
}

impl<'a> Grants<'a> {
    /// Every grant of `snapshot`.
    pub fn new(snapshot: &'a Snapshot) -> Self {
        Grants { grants: snapshot.reference_grants.iter().collect() }
    }

    /// Whether an object `(group, kind, namespace)` may refer to `(group, kind, object)` in
    /// another namespace.
    pub fn allows(&self, from: (&str, &str, &str), to: (&str, &str, &ObjectRef)) -> bool {
        let (from_group, from_kind, from_ns) = from;
        let (to_group, to_kind, target) = to;
        self.grants.iter().filter(|(key, _)| key.namespace == target.namespace).any(|(_, grant)| {
            grant
                .spec
                .from
                .iter()
                .any(|f| f.group == from_group && f.kind == from_kind && f.namespace == from_ns)
                && grant.spec.to.iter().any(|t| {
                    t.group == to_group
                        && t.kind == to_kind
                        && t.name.as_deref().is_none_or(|n| n == target.name)
                })
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn snapshot(yaml: &str) -> Snapshot {
        crate::source::manifest::parse_manifests(yaml).unwrap().into_iter().collect::<Snapshot>()
    }

    /// `ReferenceGrantTo.name`: "When unspecified, this policy refers to all resources of the
    /// specified Group and Kind in the local namespace."
    #[test]
    fn reference_grant_from_and_to_must_both_match() {
        let s = snapshot(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: backends}\n\
             spec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps}]\n  to: [{group: \"\", kind: Service, name: api}]\n",
        );
        let grants = Grants::new(&s);
        let route = ("gateway.networking.k8s.io", "HTTPRoute", "apps");
        assert!(grants.allows(route, ("", "Service", &ObjectRef::new("backends", "api"))));
        assert!(
            !grants.allows(route, ("", "Service", &ObjectRef::new("backends", "web"))),
            "only the named one"
        );
        assert!(!grants.allows(route, ("", "Secret", &ObjectRef::new("backends", "api"))), "only Services");
        assert!(
            !grants.allows(route, ("", "Service", &ObjectRef::new("other", "api"))),
            "only its own namespace"
        );
        let other = ("gateway.networking.k8s.io", "HTTPRoute", "elsewhere");
        assert!(!grants.allows(other, ("", "Service", &ObjectRef::new("backends", "api"))), "only from apps");
        let grpc = ("gateway.networking.k8s.io", "GRPCRoute", "apps");
        assert!(!grants.allows(grpc, ("", "Service", &ObjectRef::new("backends", "api"))), "only HTTPRoutes");
    }
}
