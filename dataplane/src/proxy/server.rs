//! The listener: HTTP/1.1 and h2c (prior knowledge) on one port, graceful drain on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::Proxy;
use super::forward::ConnCtx;

// === impl Proxy ===

impl Proxy {
    /// Serves plain HTTP on `listener` until `shutdown` completes, then stops accepting and lets
    /// in-flight requests finish for up to [`super::ProxyConfig::drain_timeout`].
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let local = listener.local_addr()?;
        let listener_port = HeaderValue::from(local.port());
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(self.inner.config.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        let graceful = GracefulShutdown::new();
        tracing::info!(%local, "proxy listening");

        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // Per-connection errors (reset before accept) and fd exhaustion are
                        // transient: back off a little instead of spinning or giving up.
                        tracing::warn!(%local, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%peer, %error, "set_nodelay failed");
            }
            let ctx = Arc::new(ConnCtx {
                proxy: self.clone(),
                peer,
                client_ip: HeaderValue::from_str(&peer.ip().to_canonical().to_string())
                    .unwrap_or_else(|_| HeaderValue::from_static("unknown")),
                listener_port: listener_port.clone(),
            });
            let service = hyper::service::service_fn(move |req| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(ctx.handle(req).await) }
            });
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(error) = conn.await {
                    tracing::debug!(%peer, %error, "connection error");
                }
            });
        }

        drop(listener);
        let open = graceful.count();
        tracing::info!(%local, open, "draining");
        match tokio::time::timeout(self.inner.config.drain_timeout, graceful.shutdown()).await {
            Ok(()) => tracing::info!(%local, "drained"),
            Err(_) => tracing::warn!(%local, "drain timeout: closing remaining connections"),
        }
        Ok(())
    }
}
