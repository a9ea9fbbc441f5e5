//! Metrics of the TCP and UDP services, read from the [`L4Proxy`] at each scrape, labelled by
//! protocol, port and Service port (bounded by the services ConfigMaps).

use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use weir_dataplane::l4::{L4Proxy, StatsSnapshot};

/// The hook [`crate::metrics::Metrics`] keeps: the L4 proxy, once serving.
#[derive(Clone, Debug, Default)]
pub struct L4Metrics(Arc<OnceLock<L4Proxy>>);

impl L4Metrics {
    /// Registers the L4 metrics in `registry`.
    pub fn register(registry: &mut Registry) -> L4Metrics {
        let metrics = L4Metrics::default();
        registry.register_collector(Box::new(metrics.clone()));
        metrics
    }

    /// Reports `l4`'s services from now on (the first given wins).
    pub fn observe(&self, l4: &L4Proxy) {
        let _ = self.0.set(l4.clone());
    }
}

type Read = fn(&StatsSnapshot) -> u64;

/// Counters: name, help, value.
const COUNTERS: &[(&str, &str, Read)] = &[
    ("l4_connections", "TCP connections accepted or UDP flows started, by L4 service", |s| s.opened),
    ("l4_received_bytes", "Bytes from clients to upstreams, by L4 service", |s| s.bytes_up),
    ("l4_sent_bytes", "Bytes from upstreams to clients, by L4 service", |s| s.bytes_down),
    (
        "l4_connect_errors",
        "Upstream connects that failed or timed out (TCP), or flows without an endpoint (UDP), by L4 service",
        |s| s.connect_errors,
    ),
    ("l4_flows_evicted", "UDP flows evicted from a full flow table, by L4 service", |s| s.evicted),
    ("l4_datagrams_dropped", "UDP datagrams dropped (a full upstream socket buffer), by L4 service", |s| {
        s.dropped
    }),
];

impl Collector for L4Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(l4) = self.0.get() else { return Ok(()) };
        let services = l4.stats();
        if services.is_empty() {
            return Ok(());
        }
        let labels: Vec<[(&str, String); 3]> = services
            .iter()
            .map(|s| {
                [
                    ("protocol", s.protocol.to_string()),
                    ("port", s.port.to_string()),
                    ("service", s.backend.to_string()),
                ]
            })
            .collect();
        for (name, help, read) in COUNTERS {
            let first = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(name, help, None, first.metric_type())?;
            for (service, labels) in services.iter().zip(&labels) {
                ConstCounter::new(read(&service.stats)).encode(family.encode_family(labels)?)?;
            }
        }
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "l4_open",
            "TCP connections or UDP flows open now, by L4 service",
            None,
            gauge.metric_type(),
        )?;
        for (service, labels) in services.iter().zip(&labels) {
            let open = i64::try_from(service.stats.open).unwrap_or(i64::MAX);
            ConstGauge::new(open).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}
