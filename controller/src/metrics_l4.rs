//! Metrics of the TCP and UDP services, read from the [`L4Proxy`] at each scrape, labelled by
//! protocol, port and Service port (bounded by the services ConfigMaps).

use std::sync::{Arc, OnceLock};

use weir_dataplane::l4::{L4Proxy, StatsSnapshot};

use crate::metrics::{Kind, Writer};

/// The hook [`crate::metrics::Metrics`] keeps: the L4 proxy, once serving.
#[derive(Clone, Debug, Default)]
pub struct L4Metrics(Arc<OnceLock<L4Proxy>>);

impl L4Metrics {
    /// Reports `l4`'s services from now on (the first given wins).
    pub fn observe(&self, l4: &L4Proxy) {
        let _ = self.0.set(l4.clone());
    }

    /// L4 access-log lines dropped so far (0 before the L4 proxy serves).
    pub(crate) fn log_dropped(&self) -> u64 {
        self.0.get().map_or(0, L4Proxy::log_dropped)
    }

    /// The services' figures as OpenMetrics text without its `# EOF` (`weir node --mode
    /// userspace`'s admin listener appends them to its own).
    pub fn openmetrics_text(&self) -> String {
        let mut w = crate::metrics::Writer::new(crate::metrics::Format::OpenMetrics);
        self.render(&mut w);
        w.into_text()
    }

    /// Writes the services' figures (nothing before the L4 proxy serves, or without services).
    pub(crate) fn render(&self, w: &mut Writer) {
        let Some(l4) = self.0.get() else { return };
        let services = l4.stats();
        if services.is_empty() {
            return;
        }
        let labels: Vec<[String; 3]> = services
            .iter()
            .map(|s| [s.protocol.to_string(), s.port.to_string(), s.backend.to_string()])
            .collect();
        let set =
            |l: &[String; 3]| [("protocol", l[0].clone()), ("port", l[1].clone()), ("service", l[2].clone())];
        for (name, help, read) in COUNTERS {
            let name = format!("weir_{name}");
            w.family(&name, Kind::Counter, help);
            for (service, l) in services.iter().zip(&labels) {
                let owned = set(l);
                let pairs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
                w.sample(&name, "_total", &pairs, read(&service.stats));
            }
        }
        w.family("weir_l4_open", Kind::Gauge, "TCP connections or UDP flows open now, by L4 service");
        for (service, l) in services.iter().zip(&labels) {
            let owned = set(l);
            let pairs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
            w.sample("weir_l4_open", "", &pairs, service.stats.open);
        }
    }
}

type Read = fn(&StatsSnapshot) -> u64;

/// Counters: name (after `weir_`), help, value.
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
    (
        "l4_spliced_connections",
        "TCP connections with a direction relayed with splice(2) (zero-copy), by L4 service",
        |s| s.spliced,
    ),
];
