//! Controller metrics, served on the admin listener's `/metrics` (OpenMetrics text).

use bytes::Bytes;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_dataplane::proxy::Proxy;

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
    /// Tasks alive in the runtime that encodes the metrics (the proxy's: connections, streams,
    /// the admin listener), read at each scrape: a count that only grows is a task leak.
    runtime_alive_tasks: Gauge,
    /// Client connections open, read from the proxy at each scrape.
    connections_open: Gauge,
    /// Client connections refused by the connection limits, by `limit` (`total`, `per_client`).
    connections_refused: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// The proxy whose connections are counted, once known.
    proxy: std::sync::OnceLock<Proxy>,
    /// The TCP and UDP services' metrics (`metrics_l4.rs`).
    pub l4: crate::metrics_l4::L4Metrics,
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
        let runtime_alive_tasks = Gauge::default();
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
        registry.register(
            "runtime_alive_tasks",
            "Tasks alive in the proxy's runtime when the metrics were scraped",
            runtime_alive_tasks.clone(),
        );
        let connections_open = Gauge::default();
        let connections_refused = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
        registry.register(
            "connections_open",
            "Client connections open over every listener",
            connections_open.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections reset at once by --max-connections (limit=total) or --max-connections-per-client (limit=per_client)",
            connections_refused.clone(),
        );
        let l4 = crate::metrics_l4::L4Metrics::register(&mut registry);
        Metrics {
            l4,
            connections_open,
            connections_refused,
            proxy: std::sync::OnceLock::new(),
            registry,
            table_version,
            translation_warnings,
            manifest_errors,
            reloads_ok,
            reloads_failed,
            runtime_alive_tasks,
        }
    }

    /// The OpenMetrics text of every metric. Called on a runtime (the admin listener's, which is
    /// the proxy's), it first reads that runtime's alive tasks; elsewhere that gauge keeps its
    /// last value.
    pub fn encode(&self) -> Bytes {
        if let Some(proxy) = self.proxy.get() {
            let stats = proxy.connection_stats();
            self.connections_open.set(i64::try_from(stats.open).unwrap_or(i64::MAX));
            for (limit, refused) in [("total", stats.refused_total), ("per_client", stats.refused_per_client)]
            {
                let counter = self.connections_refused.get_or_create(&vec![("limit", limit)]);
                counter.inc_by(refused.saturating_sub(counter.get()));
            }
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let tasks = runtime.metrics().num_alive_tasks();
            self.runtime_alive_tasks.set(i64::try_from(tasks).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        if let Err(error) = encode(&mut out, &self.registry) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        Bytes::from(out)
    }
}

impl Metrics {
    /// Counts `proxy`'s client connections from now on (the first proxy given wins).
    pub fn observe(&self, proxy: &Proxy) {
        let _ = self.proxy.set(proxy.clone());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gauge counts the scraping runtime's tasks: it follows tasks spawned and finished.
    #[tokio::test(flavor = "current_thread")]
    async fn alive_tasks_follow_the_runtime() {
        let metrics = Metrics::new();
        let tasks = |text: &Bytes| -> i64 {
            let text = String::from_utf8_lossy(text).into_owned();
            let line = text.lines().find(|l| l.starts_with("weir_runtime_alive_tasks ")).unwrap_or_default();
            line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(-1)
        };
        let before = tasks(&metrics.encode());
        assert!(before >= 0, "{:?}", metrics.encode());
        let (senders, parked): (Vec<_>, Vec<_>) = (0..10)
            .map(|_| {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                (tx, tokio::spawn(rx))
            })
            .unzip();
        assert_eq!(tasks(&metrics.encode()), before + 10);
        drop(senders);
        for task in parked {
            assert!(matches!(task.await, Ok(Err(_))));
        }
        assert_eq!(tasks(&metrics.encode()), before);
    }
}
