//! Precedence between Ingresses: the oldest wins.

use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::jiff::Timestamp;
use weir_dataplane::model::ObjectRef;

/// Orders Ingresses for conflicts: by `metadata.creationTimestamp` (an Ingress without one
/// counts as the newest), then by namespace/name. Smaller wins.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    undated: bool,
    created: Option<Timestamp>,
    /// The Ingress.
    pub(crate) object: ObjectRef,
}

impl Rank {
    pub(crate) fn of(object: ObjectRef, ingress: &Ingress) -> Self {
        let created = ingress.metadata.creation_timestamp.as_ref().map(|t| t.0);
        Rank { undated: created.is_none(), created, object }
    }

    /// Why `self` takes precedence over `loser`, for messages: `Ingress ns/a (older)`.
    pub(crate) fn explain_win(&self, loser: &Rank) -> String {
        if self.object == loser.object {
            return "an earlier entry of this Ingress".to_string();
        }
        let why = match (self.created, loser.created) {
            (Some(_), None) => "older: this Ingress has no creationTimestamp",
            (Some(w), Some(l)) if w < l => "older",
            (None, None) => "neither has a creationTimestamp; first by namespace/name",
            _ => "same creationTimestamp; first by namespace/name",
        };
        format!("Ingress {} ({why})", self.object)
    }
}
