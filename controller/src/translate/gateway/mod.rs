//! Gateway API translation (pure): GatewayClasses, Gateways and their listeners, routes
//! attached to them, and the conditions of each.
//!
//! Processors in order over one snapshot: our classes (`listeners::classes`), the Gateways of
//! those classes and their listeners (`listeners::gateways`: ports, protocols, hostnames,
//! TLS certificates, ReferenceGrants, allowed routes, conflicts), the listeners of the
//! ListenerSets they allow, appended to theirs (`listener_sets`), the conflicts across
//! Gateways (`conflicts`), then every route attached to them (`attach`). The result
//! ([`GatewayAttachments`]) is what route building and the status writer read.

pub mod addresses;
pub mod app_protocol;
pub mod attach;
pub mod conditions;
pub mod conflicts;
pub mod cors;
pub mod filters;
pub mod frontend;
pub mod grpc;
pub mod hostname;
pub mod isolation;
pub mod listener_sets;
pub mod listeners;
pub mod refs;
pub mod routes;
pub mod rule_name;
pub mod tls;
pub mod tlsroutes;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_dataplane::model::ObjectRef;

use crate::snapshot::Snapshot;
use attach::{ParentOut, RouteParts};
use listener_sets::ListenerSetOut;
use listeners::{ClassOut, GatewayOut};
use refs::Grants;

/// What Gateway API translation needs to know about this controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The `spec.controllerName` of GatewayClasses that are ours (`--gateway-controller-name`).
    pub controller_name: String,
    /// The listener port served by the HTTP socket (`--gateway-http-port`).
    pub http_port: i32,
    /// The listener port served by the HTTPS socket (`--gateway-https-port`).
    pub https_port: i32,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            controller_name: "weir.dev/gateway-controller".into(),
            http_port: 80,
            https_port: 443,
        }
    }
}

/// The route kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum RouteKind {
    /// `HTTPRoute`.
    Http,
    /// `GRPCRoute`.
    Grpc,
    /// `TLSRoute`.
    Tls,
}

impl RouteKind {
    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tls => "TLSRoute",
        }
    }
}

/// Our classes, their Gateways, and the routes attached to them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayAttachments {
    /// Our GatewayClasses by name.
    pub classes: BTreeMap<String, ClassOut>,
    /// The Gateways of our accepted classes (with the listeners of their ListenerSets).
    pub gateways: BTreeMap<ObjectRef, GatewayOut>,
    /// The ListenerSets naming a Gateway of ours.
    pub listener_sets: BTreeMap<ObjectRef, ListenerSetOut>,
    /// `attachedListenerSets` of each Gateway that allows ListenerSets.
    pub attached_listener_sets: BTreeMap<ObjectRef, i32>,
    /// Routes with at least one parent of ours: their outcome per such parent.
    pub routes: BTreeMap<(RouteKind, ObjectRef), Vec<ParentOut>>,
    /// `attachedRoutes` by Gateway and listener index (in `GatewayOut::listeners`).
    pub attached_routes: BTreeMap<(ObjectRef, usize), i32>,
}

impl GatewayAttachments {
    /// Whether a Gateway has a ready `TLS` listener with `tls.mode: Terminate`.
    pub fn has_tls_terminate_listener(&self) -> bool {
        self.gateways
            .values()
            .flat_map(|g| &g.listeners)
            .any(|l| l.ready && matches!(l.protocol, Some(listeners::Protocol::TlsTerminate(_))))
    }
}

/// What Gateway API translation decided, for the status writer (`status_gateway`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayOutcome {
    /// Classes, Gateways, listeners and route attachment.
    pub attachments: GatewayAttachments,
    /// What the HTTPRoutes' rules resolved to.
    pub routes: routes::RoutesOut,
    /// The controller name written into route parent statuses.
    pub controller_name: String,
    /// What the TLSRoutes' backends resolved to.
    pub tls_routes: tlsroutes::TlsRoutesOut,
    /// What the GRPCRoutes' rules resolved to.
    pub grpc_routes: routes::RoutesOut,
}

/// Resolves classes, Gateways and listeners, and attaches every route.
pub fn attach_all(snapshot: &Snapshot, config: &GatewayConfig) -> GatewayAttachments {
    let grants = Grants::new(snapshot);
    let classes = listeners::classes(snapshot, config);
    let mut gateways = listeners::gateways(snapshot, config, &classes, &grants);
    let mut listener_sets = listener_sets::merge(snapshot, config, &classes, &mut gateways, &grants);
    conflicts::mark(&mut gateways, snapshot);
    let attached_listener_sets = listener_sets::conclude(&mut listener_sets, &gateways, snapshot);
    let mut out = GatewayAttachments {
        classes,
        gateways,
        listener_sets,
        attached_listener_sets,
        ..GatewayAttachments::default()
    };
    if out.gateways.is_empty() {
        return out;
    }
    for (key, route) in &snapshot.http_routes {
        let parts = RouteParts {
            kind: RouteKind::Http.name(),
            key,
            parent_refs: &route.spec.parent_refs,
            hostnames: &route.spec.hostnames,
        };
        add_route(&mut out, RouteKind::Http, parts, snapshot);
    }
    for (key, route) in &snapshot.grpc_routes {
        let parts = RouteParts {
            kind: RouteKind::Grpc.name(),
            key,
            parent_refs: &route.spec.parent_refs,
            hostnames: &route.spec.hostnames,
        };
        add_route(&mut out, RouteKind::Grpc, parts, snapshot);
    }
    for (key, route) in &snapshot.tls_routes {
        let parts = RouteParts {
            kind: RouteKind::Tls.name(),
            key,
            parent_refs: &route.spec.parent_refs,
            hostnames: &route.spec.hostnames,
        };
        add_route(&mut out, RouteKind::Tls, parts, snapshot);
    }
    grpc::resolve_kind_conflicts(&mut out, snapshot);
    out
}

/// Attaches one route; keeps its outcome when it has a parent of ours.
fn add_route(out: &mut GatewayAttachments, kind: RouteKind, parts: RouteParts<'_>, snapshot: &Snapshot) {
    let parents =
        attach::attach(parts, (&out.gateways, &out.listener_sets), &mut out.attached_routes, snapshot);
    if !parents.is_empty() {
        out.routes.insert((kind, parts.key.clone()), parents);
    }
}
