//! Controller metrics, served on the admin listener's `/metrics` (OpenMetrics text).

use bytes::Bytes;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The controller's metrics and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    /// Version of the routing table being served.
    pub table_version: Gauge,
    /// Warnings of the last translation.
    pub translation_warnings: Gauge,
    /// Manifest files that do not parse (their last good objects keep serving).
    pub manifest_errors: Gauge,
    /// Routing tables published.
    pub reloads_ok: Counter,
    /// Routing tables the dataplane rejected (the previous one kept serving).
    pub reloads_failed: Counter,
}

impl Metrics {
    /// Registers every metric under the `weir` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("weir");
        let table_version = Gauge::default();
        let translation_warnings = Gauge::default();
        let manifest_errors = Gauge::default();
        let reloads_ok = Counter::default();
        let reloads_failed = Counter::default();
        registry.register(
            "routing_table_version",
            "Version of the routing table being served",
            table_version.clone(),
        );
        registry.register(
            "translation_warnings",
            "Warnings of the last translation",
            translation_warnings.clone(),
        );
        registry.register("manifest_errors", "Manifest files that do not parse", manifest_errors.clone());
        registry.register("reloads", "Routing tables published", reloads_ok.clone());
        registry.register(
            "reload_failures",
            "Routing tables rejected by the dataplane",
            reloads_failed.clone(),
        );
        Metrics { registry, table_version, translation_warnings, manifest_errors, reloads_ok, reloads_failed }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Bytes {
        let mut out = String::new();
        if let Err(error) = encode(&mut out, &self.registry) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        Bytes::from(out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
