//! Translation of a snapshot of Kubernetes objects into the dataplane routing table (pure).
//!
//! [`translate`] runs processors in order over one build state (`build.rs`), reading a
//! [`Snapshot`]: settings, class selection (which Ingresses are ours), annotations, routes
//! (hosts, paths, precedence, conflicts, default backends, aliases, canaries), TLS, backends
//! (Service ports to endpoints, upstream protocols), passthrough and client certificates. No
//! I/O, no clocks; the output does not depend on the order objects were added. Invalid objects
//! become [`Warning`]s, never panics; the rest of the table builds.

pub mod annotations;
mod backend;
mod build;
mod class;
pub mod gateway;
mod headers;
mod incremental;
pub mod l4;
mod rank;
mod routes;
pub mod settings;
mod tls;
mod warnings;

#[cfg(test)]
mod tests;

use k8s_openapi::api::networking::v1::Ingress;
use serde::{Deserialize, Serialize};
use weir_dataplane::model::{ObjectRef, RouteTable};

pub use incremental::{Translator, Update};
pub use warnings::{ObjectKind, Reason, Severity, Warning};

use crate::snapshot::Snapshot;
use backend::SliceIndex;
use build::Build;
use rank::Rank;
pub(crate) use warnings::Warnings;

/// What translation needs to know about this controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TranslateConfig {
    /// The class name served when no IngressClass object of that name exists.
    pub ingress_class: String,
    /// The `spec.controller` of IngressClasses that are ours.
    pub controller_name: String,
    /// Whether Ingresses naming no class at all are ours (without a default IngressClass).
    pub watch_ingress_without_class: bool,
    /// The Secret serving TLS names no Ingress covers (`--default-certificate`); none: the
    /// dataplane's self-signed certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<ObjectRef>,
    /// The ConfigMap of global settings (`--configmap`); none: defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<ObjectRef>,
    /// The TCP services ConfigMap (`--tcp-services-configmap`); none: no TCP services.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_services: Option<ObjectRef>,
    /// The UDP services ConfigMap (`--udp-services-configmap`); none: no UDP services.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_services: Option<ObjectRef>,
    /// TCP ports of weir's own listeners, with their names (`HTTP`, `HTTPS`): a TCP service
    /// on one of them is refused.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub listener_ports: std::collections::BTreeMap<u16, String>,
    /// Gateway API: the controller name and the listener ports served.
    pub gateway: gateway::GatewayConfig,
}

impl Default for TranslateConfig {
    fn default() -> Self {
        TranslateConfig {
            ingress_class: "weir".to_string(),
            controller_name: "weir.dev/ingress-controller".to_string(),
            watch_ingress_without_class: false,
            default_certificate: None,
            settings: None,
            tcp_services: None,
            udp_services: None,
            listener_ports: std::collections::BTreeMap::new(),
            gateway: gateway::GatewayConfig::default(),
        }
    }
}

/// The result of a translation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Translation {
    /// The routing table to publish.
    pub table: RouteTable,
    /// Findings about the objects, sorted.
    pub warnings: Vec<Warning>,
    /// The Ingresses of our class, sorted (the status writer updates these).
    pub ingresses: Vec<ObjectRef>,
    /// Gateway API classes, Gateways and routes of ours, for the status writer; `None` without
    /// a GatewayClass.
    #[serde(skip)]
    pub gateway: Option<std::sync::Arc<gateway::GatewayOutcome>>,
}

/// An Ingress of our class.
#[derive(Clone)]
pub(crate) struct Ours<'a> {
    /// Its identity and precedence.
    pub(crate) rank: Rank,
    /// Its key in the snapshot (equal to `rank.object`), borrowed for the whole translation so
    /// that what is built per Ingress can be keyed by it.
    pub(crate) key: &'a ObjectRef,
    /// The object.
    pub(crate) ingress: &'a Ingress,
}

/// Translates a snapshot into a routing table and warnings.
pub fn translate(snapshot: &Snapshot, config: &TranslateConfig) -> Translation {
    let slices = SliceIndex::new(snapshot);
    let mut translation = translate_part(snapshot, snapshot.ingresses.iter(), &slices, config, None);
    if let Some(secret) = &config.default_certificate {
        let mut warnings = Warnings::default();
        if let Some(cert) = tls::default_certificate(secret, snapshot, &mut warnings) {
            translation.table.certificates.insert(secret.clone(), cert);
            translation.table.default_certificate = Some(secret.clone());
        }
        translation.warnings.extend(warnings.finish());
    }
    gateway_apply(&mut translation, snapshot, &slices, config);
    l4_apply(&mut translation, snapshot, &slices, config);
    translation
}

/// Whether the snapshot has HTTPRoutes that may route (and a Gateway they may attach to):
/// then every change translates everything (`incremental`).
fn has_gateway_routes(snapshot: &Snapshot) -> bool {
    !snapshot.gateways.is_empty() && (!snapshot.http_routes.is_empty() || !snapshot.grpc_routes.is_empty())
}

/// Adds the routes of the HTTPRoutes attached to our Gateways (`gateway::routes`) to
/// `translation`, after the Ingresses', with their warnings.
fn gateway_apply(
    translation: &mut Translation,
    snapshot: &Snapshot,
    slices: &SliceIndex,
    config: &TranslateConfig,
) {
    translation.gateway = None;
    if snapshot.gateway_classes.is_empty() {
        return;
    }
    let attachments = gateway::attach_all(snapshot, &config.gateway);
    let mut warnings = Warnings::default();
    gateway::tls::apply(&mut translation.table, &attachments, &mut warnings);
    gateway::listener_sets::warn(&attachments.listener_sets, &mut warnings);
    translation.warnings.extend(warnings.finish());
    let mut routes = gateway::routes::RoutesOut::default();
    let mut grpc_routes = gateway::routes::RoutesOut::default();
    let mut tls_routes = gateway::tlsroutes::TlsRoutesOut::default();
    let http = has_gateway_routes(snapshot);
    // TLSRoutes, or a `Terminate` TLS listener whose names refuse connections without them.
    let tls = !attachments.gateways.is_empty()
        && (!snapshot.tls_routes.is_empty() || attachments.has_tls_terminate_listener());
    if http || tls {
        // One resolver and one set of findings for every route kind.
        let resolver = backend::Resolver::new(snapshot, slices);
        let mut warnings = Warnings::default();
        let table = &mut translation.table;
        if http {
            routes = gateway::routes::apply(
                table,
                &attachments,
                snapshot,
                &resolver,
                &config.gateway,
                &mut warnings,
            );
            grpc_routes = gateway::grpc::apply(
                table,
                &attachments,
                snapshot,
                &resolver,
                &config.gateway,
                &mut warnings,
            );
        }
        if tls {
            tls_routes = gateway::tlsroutes::apply(table, &attachments, snapshot, &resolver, &mut warnings);
        }
        translation.warnings.extend(warnings.finish());
        translation.warnings.sort();
        translation.warnings.dedup();
    }
    translation.gateway = Some(std::sync::Arc::new(gateway::GatewayOutcome {
        attachments,
        routes,
        controller_name: config.gateway.controller_name.clone(),
        tls_routes,
        grpc_routes,
    }));
}

/// Puts the L4 services (`l4.rs`) in `translation`, replacing any there, with their warnings.
fn l4_apply(
    translation: &mut Translation,
    snapshot: &Snapshot,
    slices: &SliceIndex,
    config: &TranslateConfig,
) {
    let (services, warnings) = l4::translate(snapshot, slices, config);
    translation.table.l4 = services;
    if !warnings.is_empty() {
        translation.warnings.extend(warnings);
        translation.warnings.sort();
        translation.warnings.dedup();
    }
}

/// Translates `ingresses` (some or all of the snapshot's), reading the rest of the snapshot
/// only by key. The default certificate is left to the caller. With `couplings`, each Ingress
/// of our class also reports what ties its translation to others' ([`incremental`]).
///
/// The processors of [`Build`] run in order over one build state, each adding its part.
fn translate_part<'s>(
    snapshot: &'s Snapshot,
    ingresses: impl IntoIterator<Item = (&'s ObjectRef, &'s Ingress)>,
    slices: &SliceIndex,
    config: &TranslateConfig,
    couplings: Option<&mut Vec<(ObjectRef, incremental::Couplings)>>,
) -> Translation {
    let mut build = Build::new(snapshot, slices, config);
    build.read_settings();
    build.select_ours(ingresses);
    build.parse_annotations(couplings);
    build.plan_routes();
    build.add_server_aliases();
    build.add_www_redirects();
    build.plan_canaries();
    build.plan_tls();
    build.build_routes();
    build.settle_upstream_protocols();
    build.add_passthrough();
    build.add_client_auth();
    build.add_host_tls();
    build.finish()
}
