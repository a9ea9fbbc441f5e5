//! The admin listener of `weir node` (`--listen-admin`, by default `127.0.0.1:10256`, kube-proxy's
//! healthz port): `/metrics` (the sync loop's [`Stats`], OpenMetrics text), `/healthz`, and,
//! with `--load-balancer`, `/lb` (assignments and announcers as JSON, [`LbStatus`]).
//!
//! `/healthz` answers 200 while rules are being kept in sync: the last successful sync is at
//! most twice the sync period (plus a grace of 10 s for slow full syncs) old. It answers 503
//! before the first successful sync and when syncs keep failing. The JSON body says when the
//! last successful sync was, as kube-proxy's does.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::lb::announce::LbStatus;
use super::sync::Stats;

/// Extra age allowed to the last successful sync on top of twice the sync period.
pub const HEALTH_GRACE: Duration = Duration::from_secs(10);

/// What the admin listener serves.
pub struct Admin {
    registry: Registry,
    stats: Arc<Stats>,
    max_age: Duration,
    lb: Option<Arc<LbStatus>>,
    /// userspace mode: its proxy's `weir_l4_*` metrics.
    l4: Option<crate::metrics_l4::L4Metrics>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").field("max_age", &self.max_age).finish_non_exhaustive()
    }
}

impl Admin {
    /// Serves `stats` (registered under `weir_node_*`); healthy while the last successful sync
    /// is younger than twice `sync_period` plus [`HEALTH_GRACE`].
    pub fn new(stats: Arc<Stats>, sync_period: Duration) -> Self {
        let mut registry = Registry::with_prefix("weir");
        stats.register(&mut registry);
        Admin { registry, stats, max_age: sync_period.saturating_mul(2) + HEALTH_GRACE, lb: None, l4: None }
    }

    /// Serves the load balancer's `/lb` document and metric as well.
    pub fn with_lb(mut self, lb: Arc<LbStatus>) -> Self {
        lb.register(&mut self.registry);
        self.lb = Some(lb);
        self
    }

    /// Serves the L4 proxy's `weir_l4_*` metrics as well (userspace mode).
    pub fn with_l4(mut self, l4: crate::metrics_l4::L4Metrics) -> Self {
        self.l4 = Some(l4);
        self
    }

    /// The OpenMetrics text of every metric.
    pub fn metrics(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        if let Some(l4) = &self.l4 {
            let text = l4.openmetrics_text();
            if !text.is_empty() {
                // The L4 families go before the closing `# EOF`.
                let body = out.strip_suffix("# EOF\n").unwrap_or(&out).len();
                out.truncate(body);
                out.push_str(&text);
                out.push_str("# EOF\n");
            }
        }
        out
    }

    /// Whether the rules are in sync, and the JSON body telling why.
    pub fn health(&self, now: SystemTime) -> (bool, String) {
        let now = now.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let last = self.stats.last_sync_timestamp.get();
        let failures = self.stats.consecutive_failures.get();
        let healthy = last > 0.0 && now - last <= self.max_age.as_secs_f64();
        let body = format!(
            "{{\"healthy\":{healthy},\"lastSuccessfulSync\":{last:.3},\"currentTime\":{now:.3},\
             \"consecutiveFailures\":{failures}}}\n"
        );
        (healthy, body)
    }

    fn respond(&self, path: &str) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match path {
            "/healthz" | "/livez" => {
                let (healthy, body) = self.health(SystemTime::now());
                let status = if healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                (status, "application/json", body)
            }
            "/metrics" => {
                (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", self.metrics())
            }
            "/lb" if self.lb.is_some() => (
                StatusCode::OK,
                "application/json",
                self.lb.as_ref().map(|l| l.document()).unwrap_or_default(),
            ),
            _ => (StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "404 Not Found\n".to_string()),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
        response
    }
}

/// Serves `admin` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let response = admin.respond(req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%error, "admin connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn health_follows_the_last_successful_sync() {
        let stats = Arc::new(Stats::default());
        let admin = Admin::new(stats.clone(), Duration::from_secs(30));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (healthy, body) = admin.health(t0);
        assert!(!healthy, "healthy before any sync: {body}");
        stats.last_sync_timestamp.set(1_000_000.0);
        assert!(admin.health(t0 + Duration::from_secs(60)).0);
        stats.consecutive_failures.set(3);
        let (healthy, body) = admin.health(t0 + Duration::from_secs(71));
        assert!(!healthy, "{body}");
        assert!(body.contains("\"consecutiveFailures\":3"), "{body}");
        assert!(admin.metrics().contains("weir_node_sync_consecutive_failures 3"));
    }
}
