//! The listeners: plain (HTTP/1.1 and h2c prior knowledge on one port) and TLS (SNI certificate
//! selection, ALPN `h2`/`http/1.1`), graceful drain on shutdown.
//!
//! Handshake hygiene on the TLS listener: a handshake must finish within
//! [`super::ProxyConfig::handshake_timeout`]; at most
//! [`super::ProxyConfig::max_concurrent_handshakes`] run at once (more are closed at once);
//! a connection whose first byte is not a TLS handshake record (plain HTTP sent to the HTTPS
//! port) gets a `400` in plain text and is closed; every failed handshake is logged with its
//! reason, at most a few lines per second.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::Proxy;
use super::forward::ConnCtx;
use crate::tls::{self, SniResolver};

/// The TLS record type of a handshake message: the first byte of every ClientHello.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a TLS listener shares between its connections.
struct TlsListener {
    acceptor: TlsAcceptor,
    handshakes: Arc<Semaphore>,
    failures: RateLimit,
}

// === impl Proxy ===

impl Proxy {
    /// Serves plain HTTP on `listener` until `shutdown` completes, then stops accepting and lets
    /// in-flight requests finish for up to [`super::ProxyConfig::drain_timeout`].
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        self.accept_loop(listener, None, shutdown).await
    }

    /// Serves HTTPS on `listener` (certificates chosen by SNI from the live table) until
    /// `shutdown` completes, then drains like [`Proxy::serve`].
    pub async fn serve_tls(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let fallback = self.fallback_cert()?;
        let inner = self.inner.clone();
        let resolver =
            SniResolver { lookup: move |sni: Option<&str>| inner.state.load().certs.resolve(sni), fallback };
        let config = tls::server_config(Arc::new(resolver)).map_err(io::Error::other)?;
        let tls = Arc::new(TlsListener {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshakes: Arc::new(Semaphore::new(self.inner.config.max_concurrent_handshakes.max(1))),
            failures: RateLimit::new(10),
        });
        self.accept_loop(listener, Some(tls), shutdown).await
    }

    /// The self-signed certificate, generated (and announced) once.
    fn fallback_cert(&self) -> io::Result<Arc<rustls::sign::CertifiedKey>> {
        if let Some(cert) = self.inner.fallback_cert.get() {
            return Ok(cert.clone());
        }
        let cert = Arc::new(tls::self_signed().map_err(io::Error::other)?);
        let cert = self.inner.fallback_cert.get_or_init(|| {
            tracing::info!(
                "generated a self-signed default certificate (CN weir.invalid): it serves TLS names that no Ingress and no configured default certificate cover"
            );
            cert
        });
        Ok(cert.clone())
    }

    async fn accept_loop(
        &self,
        listener: TcpListener,
        tls: Option<Arc<TlsListener>>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        let local = listener.local_addr()?;
        let listener_port = HeaderValue::from(local.port());
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(self.inner.config.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        let builder = Arc::new(builder);
        let graceful = GracefulShutdown::new();
        let kind = if tls.is_some() { "https" } else { "http" };
        tracing::info!(%local, kind, "proxy listening");

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
                https: tls.is_some(),
            });
            let builder = builder.clone();
            let watcher = graceful.watcher();
            match &tls {
                None => {
                    tokio::spawn(serve_http(builder, stream, ctx, watcher));
                }
                Some(tls) => {
                    let Ok(permit) = tls.handshakes.clone().try_acquire_owned() else {
                        tls.failures.log(peer, "too many concurrent TLS handshakes: connection closed");
                        continue;
                    };
                    let tls = tls.clone();
                    let handshake_timeout = self.inner.config.handshake_timeout;
                    tokio::spawn(async move {
                        let started = Instant::now();
                        let accepted = tokio::time::timeout(handshake_timeout, handshake(&tls, stream)).await;
                        drop(permit);
                        match accepted {
                            Ok(Ok(stream)) => serve_http(builder, stream, ctx, watcher).await,
                            Ok(Err(reason)) => tls.failures.log(peer, &reason),
                            Err(_) => tls
                                .failures
                                .log(peer, &format!("TLS handshake timed out after {:?}", started.elapsed())),
                        }
                    });
                }
            }
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

/// Serves HTTP on one established connection (plain or TLS), watched for graceful shutdown.
async fn serve_http<S>(
    builder: Arc<auto::Builder<TokioExecutor>>,
    stream: S,
    ctx: Arc<ConnCtx>,
    watcher: Watcher,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = ctx.peer;
    let service = hyper::service::service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(ctx.handle(req).await) }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    if let Err(error) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, %error, "connection error");
    }
}

/// Runs the server side of a TLS handshake; plain HTTP gets a 400 and is closed.
async fn handshake(
    tls: &TlsListener,
    mut stream: TcpStream,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await.map_err(|e| format!("reading the ClientHello failed: {e}"))?;
    if n == 0 {
        return Err("connection closed before the TLS handshake".to_string());
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        const ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 48\r\nconnection: close\r\n\r\n400 The plain HTTP request was sent to HTTPS port";
        // Best effort: the client may already be gone.
        let _ = stream.write_all(ANSWER).await;
        let _ = stream.shutdown().await;
        return Err("plain HTTP on the TLS port: answered 400 and closed".to_string());
    }
    tls.acceptor.accept(stream).await.map_err(|e| format!("TLS handshake failed: {e}"))
}

// === impl RateLimit ===

/// Logs at most `per_second` lines a second, then counts what it dropped and says so.
struct RateLimit {
    per_second: u32,
    window: Mutex<(Instant, u32, u64)>,
}

impl RateLimit {
    fn new(per_second: u32) -> Self {
        RateLimit { per_second, window: Mutex::new((Instant::now(), 0, 0)) }
    }

    fn log(&self, peer: SocketAddr, reason: &str) {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, logged, suppressed) = &mut *window;
        if start.elapsed() >= Duration::from_secs(1) {
            if *suppressed > 0 {
                tracing::info!(suppressed = *suppressed, "more TLS handshake failures were not logged");
            }
            *start = Instant::now();
            *logged = 0;
            *suppressed = 0;
        }
        if *logged < self.per_second {
            *logged += 1;
            tracing::info!(%peer, reason, "TLS connection rejected");
        } else {
            *suppressed += 1;
        }
    }
}
