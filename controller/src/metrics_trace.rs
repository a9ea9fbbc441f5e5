//! Metrics of OpenTelemetry tracing: spans exported, and spans dropped because the export queue
//! was full or their export failed (a slow or dead collector), read from the proxy at each
//! scrape.

use weir_dataplane::trace::export::TraceCounts;

use crate::metrics::{Kind, Writer};

/// Writes the span counters.
pub(crate) fn render(w: &mut Writer, counts: TraceCounts) {
    w.family("weir_otel_spans_exported", Kind::Counter, "Spans the OpenTelemetry collector accepted");
    w.sample("weir_otel_spans_exported", "_total", &[], counts.exported);
    w.family(
        "weir_otel_spans_dropped",
        Kind::Counter,
        "Spans not exported: the export queue was full (reason=queue_full) or their export failed or timed out (reason=export_failed)",
    );
    for (reason, n) in
        [("queue_full", counts.dropped_queue_full), ("export_failed", counts.dropped_export_failed)]
    {
        w.sample("weir_otel_spans_dropped", "_total", &[("reason", reason)], n);
    }
}
