//! The export pipeline: a bounded queue the request path hands finished spans to (never
//! waiting: when it is full the span is dropped and counted), and one task per collector
//! configuration that batches them into OTLP `ExportTraceServiceRequest`s over gRPC, with a
//! timeout. A slow or dead collector fills the queue and loses spans; it never slows a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;

use super::otlp;

/// Longest wait for one export request's answer (and for its connection).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the exporters did so far; kept by the proxy across configurations.
#[derive(Debug, Default)]
pub struct TraceStats {
    exported: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
}

/// A snapshot of [`TraceStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceCounts {
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans dropped because the queue was full (the collector slow or down).
    pub dropped_queue_full: u64,
    /// Spans dropped because their export failed or timed out (or the collector rejected them).
    pub dropped_export_failed: u64,
}

impl TraceStats {
    /// The counts now.
    pub fn counts(&self) -> TraceCounts {
        TraceCounts {
            exported: self.exported.load(Ordering::Relaxed),
            dropped_queue_full: self.dropped_queue_full.load(Ordering::Relaxed),
            dropped_export_failed: self.dropped_export_failed.load(Ordering::Relaxed),
        }
    }
}

/// Where spans are exported and how they are batched: a change of any of these starts a new
/// exporter (the old one sends what it holds, then ends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    /// `http://host:port` of the OTLP/gRPC collector.
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Capacity of the queue.
    pub max_queue: usize,
    /// Longest wait before a partial batch goes.
    pub schedule_delay: Duration,
    /// Most spans per request.
    pub max_batch: usize,
}

/// The request path's end of one exporter.
#[derive(Debug)]
pub struct Exporter {
    config: ExportConfig,
    queue: mpsc::Sender<otlp::Span>,
    stats: Arc<TraceStats>,
}

impl Exporter {
    /// Starts the exporter task on the current Tokio runtime; `None` outside one (logged).
    pub fn start(config: ExportConfig, stats: Arc<TraceStats>) -> Option<Arc<Exporter>> {
        let runtime = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime,
            Err(_) => {
                tracing::error!("OpenTelemetry: no runtime to export spans on; tracing is off");
                return None;
            }
        };
        let channel = match tonic::transport::Endpoint::from_shared(config.endpoint.clone()) {
            Ok(endpoint) => endpoint.connect_timeout(EXPORT_TIMEOUT).timeout(EXPORT_TIMEOUT),
            Err(error) => {
                tracing::error!(endpoint = %config.endpoint, %error, "OpenTelemetry: bad collector address; tracing is off");
                return None;
            }
        };
        let (queue, spans) = mpsc::channel(config.max_queue.max(1));
        let task = Task { config: config.clone(), stats: stats.clone(), spans };
        // `connect_lazy` needs the runtime: the task makes the channel.
        runtime.spawn(task.run(channel));
        Some(Arc::new(Exporter { config, queue, stats }))
    }

    /// Its configuration.
    pub fn config(&self) -> &ExportConfig {
        &self.config
    }

    /// Queues a finished span; drops and counts it when the queue is full.
    pub fn submit(&self, span: otlp::Span) {
        if self.queue.try_send(span).is_err() {
            self.stats.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The exporter task's state.
struct Task {
    config: ExportConfig,
    stats: Arc<TraceStats>,
    spans: mpsc::Receiver<otlp::Span>,
}

impl Task {
    /// Batches and exports until every [`Exporter`] handle is gone and the queue is empty.
    async fn run(mut self, endpoint: tonic::transport::Endpoint) {
        let channel = endpoint.connect_lazy();
        let max = self.config.max_batch.max(1);
        let mut batch: Vec<otlp::Span> = Vec::with_capacity(max);
        loop {
            // The first span of a batch, then others until the batch is full or the delay ends.
            match self.spans.recv().await {
                Some(span) => batch.push(span),
                None => return,
            }
            let until = tokio::time::Instant::now() + self.config.schedule_delay;
            let mut closed = false;
            while batch.len() < max {
                match tokio::time::timeout_at(until, self.spans.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) => {
                        closed = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            self.export(&channel, &mut batch).await;
            if closed {
                return;
            }
        }
    }

    /// Sends `batch` (emptied) as one request; what fails is counted as dropped.
    async fn export(&self, channel: &tonic::transport::Channel, batch: &mut Vec<otlp::Span>) {
        let n = batch.len() as u64;
        let request = request(&self.config.service_name, batch.drain(..));
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        let call = async {
            grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            grpc
                .unary(
                    tonic::Request::new(request),
                    PathAndQuery::from_static(otlp::EXPORT_PATH),
                    tonic_prost::ProstCodec::<
                        otlp::ExportTraceServiceRequest,
                        otlp::ExportTraceServiceResponse,
                    >::default(),
                )
                .await
        };
        match tokio::time::timeout(EXPORT_TIMEOUT, call).await {
            Ok(Ok(answer)) => {
                let rejected = answer
                    .get_ref()
                    .partial_success
                    .as_ref()
                    .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0).min(n));
                if rejected > 0 {
                    tracing::warn!(rejected, "OpenTelemetry: the collector rejected spans");
                }
                self.stats.exported.fetch_add(n - rejected, Ordering::Relaxed);
                self.stats.dropped_export_failed.fetch_add(rejected, Ordering::Relaxed);
            }
            Ok(Err(status)) => {
                tracing::debug!(endpoint = %self.config.endpoint, %status, spans = n, "OpenTelemetry: export failed");
                self.stats.dropped_export_failed.fetch_add(n, Ordering::Relaxed);
            }
            Err(_) => {
                tracing::debug!(endpoint = %self.config.endpoint, spans = n, "OpenTelemetry: export timed out");
                self.stats.dropped_export_failed.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// One export request: the spans under one resource (`service.name`) and scope (`weir`).
pub fn request(
    service_name: &str,
    spans: impl Iterator<Item = otlp::Span>,
) -> otlp::ExportTraceServiceRequest {
    let resource = otlp::Resource {
        attributes: vec![
            otlp::string("service.name", service_name),
            otlp::string("telemetry.sdk.name", "weir"),
            otlp::string("telemetry.sdk.language", "rust"),
        ],
    };
    let scope = otlp::InstrumentationScope { name: "weir".into(), version: env!("CARGO_PKG_VERSION").into() };
    otlp::ExportTraceServiceRequest {
        resource_spans: vec![otlp::ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![otlp::ScopeSpans { scope: Some(scope), spans: spans.collect() }],
        }],
    }
}
