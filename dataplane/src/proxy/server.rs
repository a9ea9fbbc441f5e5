//! The listeners: plain (HTTP/1.1 and h2c prior knowledge on one port) and TLS (SNI certificate
//! selection, ALPN `h2`/`http/1.1`), graceful drain on shutdown.
//!
//! Handshake hygiene on the TLS listener: a handshake must finish within
//! [`super::ProxyConfig::handshake_timeout`]; at most
//! [`super::ProxyConfig::max_concurrent_handshakes`] run at once (more are closed at once);
//! a connection whose first byte is not a TLS handshake record (plain HTTP sent to the HTTPS
//! port) gets a `400` in plain text and is closed; every failed handshake is logged with its
//! reason, at most a few lines per second.
//!
//! Overload ([`super::limits`]): every listener admits connections under the proxy's connection
//! limits (in all and per client address) and resets the others at once; the accept loop backs
//! off when descriptors run out; client writes that make no progress for
//! [`super::ProxyConfig::client_send_timeout`] close the connection.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::deadline::ConnTimer;
use super::forward::ConnCtx;
use super::limits::{AcceptBackoff, ConnGuard, Refusal, SendTimeout};
use super::park::Parking;
use super::proxy_protocol;
use super::{HttpBuilder, Pass, Proxy};
use crate::state::balance::EndpointKey;
use crate::tls;
use crate::tls::l4::{self, Prefixed};
use crate::tls::mtls::ClientCert;

/// What a TLS listener shares between its connections.
struct TlsListener {
    acceptor: TlsAcceptor,
    handshakes: Arc<Semaphore>,
}

/// One accepted connection, before its first request.
struct Conn {
    proxy: Proxy,
    /// The socket peer (the balancer, behind a PROXY protocol balancer).
    peer: SocketAddr,
    listener_port: HeaderValue,
    builder: Arc<HttpBuilder>,
    watcher: Watcher,
    failures: Arc<RateLimit>,
    /// This connection's place under the connection limits, held until it closes.
    admission: ConnGuard,
    /// Turns true when the listener drains (read by the `--http1-server weir` driver).
    drain: tokio::sync::watch::Receiver<bool>,
    /// Where the plain listener parks idle keep-alive connections (`--http1-server weir`).
    parking: Option<Arc<Parking>>,
}

// === impl Conn ===

impl Conn {
    /// Reads the PROXY protocol header when the listener expects one; returns the client.
    ///
    /// The client's address then counts against the per-client connection limit; past it the
    /// connection is refused (`Err`).
    async fn client(&mut self, stream: &mut TcpStream) -> Result<SocketAddr, String> {
        let (expected, timeout) = {
            let config = &self.proxy.inner.state.load().config;
            (
                config.proxy_protocol,
                super::client_limits::proxy_protocol_header_timeout(&config.client_limits),
            )
        };
        let client = if !expected {
            self.peer
        } else {
            // `proxy-protocol-header-timeout`: a connection that never sends its header is closed.
            match tokio::time::timeout(timeout, proxy_protocol::read_header(stream)).await {
                Ok(Ok(client)) => client.unwrap_or(self.peer),
                Ok(Err(error)) => return Err(error.to_string()),
                Err(_) => return Err(format!("no PROXY protocol header within {timeout:?}")),
            }
        };
        let limits = &self.proxy.inner.conns;
        if limits.per_client() && limits.admit_client(&mut self.admission, client.ip()).is_err() {
            let _ = stream.set_zero_linger();
            return Err(format!(
                "{} already has {} connections open (--max-connections-per-client): connection refused",
                client.ip().to_canonical(),
                limits.config().per_client
            ));
        }
        Ok(client)
    }

    fn ctx(&self, client: SocketAddr, https: bool, client_cert: Option<ClientCert>) -> Arc<ConnCtx> {
        self.ctx_ssl(client, https, client_cert, None, None)
    }

    /// [`Self::ctx`] of an HTTPS connection with its TLS parameters.
    fn ctx_ssl(
        &self,
        client: SocketAddr,
        https: bool,
        client_cert: Option<ClientCert>,
        ssl: Option<super::accesslog::Ssl>,
        sni: Option<Box<str>>,
    ) -> Arc<ConnCtx> {
        Arc::new(ConnCtx {
            proxy: self.proxy.clone(),
            peer: client,
            client_ip: HeaderValue::from_str(&client.ip().to_canonical().to_string())
                .unwrap_or_else(|_| HeaderValue::from_static("unknown")),
            listener_port: self.listener_port.clone(),
            https,
            client_cert,
            requests: std::sync::atomic::AtomicU32::new(0),
            upstream_deadline: Default::default(),
            stream_deadlines: Default::default(),
            ssl,
            sni,
        })
    }

    async fn serve_plain(mut self, mut stream: TcpStream) {
        let timeout = self.proxy.inner.config.handshake_timeout;
        let client = match tokio::time::timeout(timeout, self.client(&mut stream)).await {
            Ok(Ok(client)) => client,
            Ok(Err(reason)) => return self.failures.log(self.peer, &reason),
            Err(_) => return self.failures.log(self.peer, "PROXY protocol header timed out"),
        };
        let ctx = self.ctx(client, false, None);
        if let Some(parking) = self.parking {
            return parking.serve(self.builder, stream, ctx, self.watcher, self.admission).await;
        }
        let send_timeout = self.proxy.inner.state.load().config.client_send_timeout;
        let stream = SendTimeout::new(stream, send_timeout);
        serve_http(self.builder, stream, ctx, self.watcher, false, self.drain).await;
    }

    async fn serve_tls(mut self, mut stream: TcpStream, tls: Arc<TlsListener>, permit: OwnedSemaphorePermit) {
        let started = Instant::now();
        let accepted = tokio::time::timeout(self.proxy.inner.config.handshake_timeout, async {
            let client = self.client(&mut stream).await?;
            Ok::<_, String>((client, handshake(&self.proxy, &tls, stream).await?))
        })
        .await;
        drop(permit);
        match accepted {
            Ok(Ok((client, Accepted::Terminated(stream, cert)))) => {
                let ssl = super::accesslog::Ssl::of(stream.get_ref().1);
                // Kept only when the table has Gateway HTTPS listeners to check requests against.
                let sni = match self.proxy.inner.state.load().listeners.is_empty() {
                    true => None,
                    false => stream.get_ref().1.server_name().map(Box::from),
                };
                let ctx = self.ctx_ssl(client, true, cert.map(|c| *c), ssl, sni);
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                serve_http(self.builder, stream, ctx, self.watcher, h2, self.drain).await;
            }
            // The passthrough connection keeps its place until it closes.
            Ok(Ok((client, Accepted::Passthrough(pass)))) => {
                let Passthrough { stream, hello, upstream, sni } = *pass;
                splice(stream, hello, upstream, client, sni).await;
            }
            // So does a relayed one.
            Ok(Ok((client, Accepted::Relay(relay)))) => {
                let Relay { stream, upstream, sni, idle } = *relay;
                relay_decrypted(*stream, upstream, idle, client, sni).await;
            }
            Ok(Err(reason)) => self.failures.log(self.peer, &reason),
            Err(_) => self
                .failures
                .log(self.peer, &format!("TLS handshake timed out after {:?}", started.elapsed())),
        }
    }
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
        self.fallback_cert()?;
        let config = self.server_config(&crate::model::Settings::default()).map_err(io::Error::other)?;
        let tls = Arc::new(TlsListener {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            handshakes: Arc::new(Semaphore::new(self.inner.config.max_concurrent_handshakes.max(1))),
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
        self.start_pool_sweeper();
        let listener_port = HeaderValue::from(local.port());
        let graceful = GracefulShutdown::new();
        let (drain, draining) = tokio::sync::watch::channel(false);
        let kind = if tls.is_some() { "https" } else { "http" };
        let failures = Arc::new(RateLimit::new(10));
        let proxy_protocol = self.inner.config.proxy_protocol;
        tracing::info!(%local, kind, proxy_protocol, "proxy listening");

        let mut shutdown = std::pin::pin!(shutdown);
        let limits = self.inner.conns.clone();
        let mut backoff = AcceptBackoff::default();
        let parking = match (&tls, self.inner.config.http1_server, self.inner.config.http1_park_after) {
            (None, super::Http1Server::Weir, Some(grace)) => {
                Parking::start(self, grace, listener_port.clone(), draining.clone(), graceful.watcher())
            }
            _ => None,
        };
        loop {
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        let wait = backoff.failed(local, &error);
                        if !wait.is_zero() {
                            tokio::select! {
                                () = &mut shutdown => break,
                                () = tokio::time::sleep(wait) => {}
                            }
                        }
                        continue;
                    }
                },
            };
            backoff.reset();
            // Limits first: a refused connection costs no task and no buffer.
            let mut admission = match limits.admit() {
                Ok(guard) => guard,
                Err(refusal) => {
                    refuse(&stream);
                    failures.log(peer, refusal_reason(refusal));
                    continue;
                }
            };
            // Behind a PROXY protocol balancer the client is known after its header
            // (`Conn::client`); the socket peer is the balancer.
            if limits.per_client()
                && !self.inner.state.load().config.proxy_protocol
                && limits.admit_client(&mut admission, peer.ip()).is_err()
            {
                refuse(&stream);
                failures.log(peer, refusal_reason(Refusal::PerClient));
                continue;
            }
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%peer, %error, "set_nodelay failed");
            }
            let conn = Conn {
                proxy: self.clone(),
                peer,
                listener_port: listener_port.clone(),
                // The live table's keep-alive settings, for this connection's life.
                builder: self.inner.state.load().http.clone(),
                watcher: graceful.watcher(),
                failures: failures.clone(),
                admission,
                drain: draining.clone(),
                parking: parking.clone(),
            };
            let Some(tls) = &tls else {
                tokio::spawn(conn.serve_plain(stream));
                continue;
            };
            let Ok(permit) = tls.handshakes.clone().try_acquire_owned() else {
                failures.log(peer, "too many concurrent TLS handshakes: connection closed");
                continue;
            };
            tokio::spawn(conn.serve_tls(stream, tls.clone(), permit));
        }

        drop(listener);
        // The parking task holds its own (ends on the drain, closing what it parked).
        drop(parking);
        drain.send_replace(true);
        let open = graceful.count();
        tracing::info!(%local, open, "draining");
        let drain = self.inner.state.load().config.drain_timeout;
        match tokio::time::timeout(drain, graceful.shutdown()).await {
            Ok(()) => tracing::info!(%local, "drained"),
            Err(_) => tracing::warn!(%local, "drain timeout: closing remaining connections"),
        }
        Ok(())
    }
}

/// Resets a refused connection at once: no FIN handshake, no `TIME_WAIT` for the refusal.
fn refuse(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// The log line of a refusal.
fn refusal_reason(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::Total => "connection limit reached (--max-connections): connection refused",
        Refusal::PerClient => {
            "this client's connection limit reached (--max-connections-per-client): connection refused"
        }
    }
}

/// Serves HTTP on one established connection (plain or TLS), watched for graceful shutdown.
///
/// `h2`: the connection negotiated HTTP/2 (ALPN), and each request's future is boxed where it is
/// made. hyper moves a stream's future several times as it spawns a task for it (`spawn`, `bind`,
/// `set_stage`: each a copy of the request's whole state, ~3 KB); a pointer is cheaper to move.
/// On HTTP/1 the box would add a copy instead (hyper keeps the future in its dispatcher's slot),
/// so there the connection gets its own timer for its request-head deadlines (see `deadline`:
/// hyper drops and asks for a new one at every request).
async fn serve_http<S>(
    builder: Arc<HttpBuilder>,
    stream: S,
    ctx: Arc<ConnCtx>,
    watcher: Watcher,
    h2: bool,
    drain: tokio::sync::watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = ctx.peer;
    let listener = match (ctx.https, h2) {
        (false, _) => crate::metrics::Listener::Http,
        (true, false) => crate::metrics::Listener::HttpsH1,
        (true, true) => crate::metrics::Listener::HttpsH2,
    };
    let _open = ctx.proxy.metrics().open_conn(listener);
    // The connection futures are boxed: the task's own size is that of its largest state, and
    // `--http1-server weir` keeps only a small one while a connection is idle.
    if !h2 && ctx.proxy.inner.config.http1_server == super::Http1Server::Weir {
        super::h1_idle::serve(builder, stream, ctx, Some(watcher), drain, None).await;
        return;
    }
    let io = TokioIo::new(stream);
    let served = if h2 {
        let service = hyper::service::service_fn(move |req| {
            let handled = Box::pin(ctx.clone().handle(req));
            async move { Ok::<_, Infallible>(handled.await) }
        });
        Box::pin(watcher.watch(builder.serve_connection_with_upgrades(io, service).into_owned())).await
    } else {
        let service = hyper::service::service_fn(move |req| {
            let ctx = ctx.clone();
            async move { Ok::<_, Infallible>(ctx.handle(req).await) }
        });
        let mut builder = (*builder).clone();
        builder.http1().timer(ConnTimer::default());
        Box::pin(watcher.watch(builder.serve_connection_with_upgrades(io, service).into_owned())).await
    };
    if let Err(error) = served {
        tracing::debug!(%peer, %error, "connection error");
    }
}

/// What the TLS listener does with a connection once it has read the first record.
enum Accepted {
    /// TLS terminated here.
    Terminated(Box<TerminatedStream>, Option<Box<ClientCert>>),
    /// To be spliced to a passthrough backend (connected).
    Passthrough(Box<Passthrough>),
    /// TLS terminated here, to be relayed as plain TCP to a backend (connected).
    Relay(Box<Relay>),
}

/// A terminated TLS connection whose bytes go to a TCP backend (Gateway API TLSRoute on a
/// `Terminate` listener): the client, the connected backend, the SNI and the idle timeout.
struct Relay {
    stream: Box<TerminatedStream>,
    upstream: TcpStream,
    sni: String,
    idle: Duration,
}

/// A client connection whose TLS weir terminated.
type TerminatedStream = tokio_rustls::server::TlsStream<Prefixed<SendTimeout<TcpStream>>>;

/// The copy buffer per direction of a relayed TLS connection: one TLS record's plaintext.
const RELAY_BUFFER: usize = 16 * 1024;

/// A passthrough connection: the client, its ClientHello, the connected backend and the SNI.
struct Passthrough {
    stream: TcpStream,
    hello: bytes::BytesMut,
    upstream: TcpStream,
    sni: String,
}

/// Reads the first TLS record; passes the connection through when its SNI is a passthrough
/// host, else runs the TLS handshake (and, for a relayed host, connects its backend). Plain
/// HTTP gets a 400 and is closed.
async fn handshake(proxy: &Proxy, tls: &TlsListener, mut stream: TcpStream) -> Result<Accepted, String> {
    let record = l4::read_first_record(&mut stream)
        .await
        .map_err(|e| format!("reading the ClientHello failed: {e}"))?;
    match record.first() {
        None => return Err("connection closed before the TLS handshake".to_string()),
        Some(&l4::HANDSHAKE_RECORD) => {}
        Some(_) => {
            const ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 48\r\nconnection: close\r\n\r\n400 The plain HTTP request was sent to HTTPS port";
            // Best effort: the client may already be gone.
            let _ = stream.write_all(ANSWER).await;
            let _ = stream.shutdown().await;
            return Err("plain HTTP on the TLS port: answered 400 and closed".to_string());
        }
    }
    let state = proxy.inner.state.load_full();
    if !state.passthrough.is_empty()
        && let Some(sni) = l4::client_hello_sni(&record)
        && let Some(pass) = state.passthrough.lookup(&sni)
    {
        let (Pass::Splice(idx) | Pass::Relay(idx)) = pass;
        // A TLSRoute share without backend: the connection is refused.
        let Some(balancer) = idx.and_then(|i| state.balancers.get(i)).cloned() else {
            return Err(format!("{sni}: no backend for this connection (an unresolved backendRef)"));
        };
        if let Pass::Splice(_) = pass {
            let upstream =
                connect_any(proxy, &balancer).await.map_err(|e| format!("passthrough to {sni}: {e}"))?;
            return Ok(Accepted::Passthrough(Box::new(Passthrough { stream, hello: record, upstream, sni })));
        }
        // Terminated with the certificate the SNI chooses, without ALPN (the bytes are not
        // HTTP's), then relayed to the backend drawn.
        let acceptor = state.relay_tls.clone().map_or_else(|| tls.acceptor.clone(), TlsAcceptor::from);
        let (send_timeout, idle) = (state.config.client_send_timeout, state.stream_idle);
        drop(state);
        let stream =
            accept(proxy, &acceptor, Prefixed::new(record, SendTimeout::new(stream, send_timeout))).await?;
        let upstream = connect_any(proxy, &balancer).await.map_err(|e| format!("TLS relay to {sni}: {e}"))?;
        return Ok(Accepted::Relay(Box::new(Relay { stream: Box::new(stream), upstream, sni, idle })));
    }
    // A host that asks for client certificates, or sets its own cipher suites, has its own
    // server config.
    let sni = match state.client_auth.is_empty() && state.host_tls.is_empty() {
        true => None,
        false => l4::client_hello_sni(&record),
    };
    // Without SNI: the policy of a Gateway listener without hostname, if there is one.
    let auth = match state.client_auth.is_empty() {
        true => None,
        false => state.client_auth.lookup(sni.as_deref().unwrap_or("")).cloned(),
    };
    let host_config = match auth {
        Some(_) => None,
        None => sni.as_deref().and_then(|sni| state.host_tls.lookup(sni).cloned()),
    };
    // `ssl-protocols` of the live table, if it sets them.
    let versions = state.tls.clone();
    let send_timeout = state.config.client_send_timeout;
    drop(state);
    let stream = Prefixed::new(record, SendTimeout::new(stream, send_timeout));
    let acceptor = match (&auth, host_config, versions) {
        (Some(auth), _, _) => TlsAcceptor::from(auth.config.clone()),
        (None, Some(config), _) | (None, None, Some(config)) => TlsAcceptor::from(config),
        (None, None, None) => tls.acceptor.clone(),
    };
    let stream = accept(proxy, &acceptor, stream).await?;
    let cert = auth.map(|auth| Box::new(auth.judge(stream.get_ref().1.peer_certificates())));
    Ok(Accepted::Terminated(Box::new(stream), cert))
}

/// Runs the TLS handshake, counted in the handshake metrics.
async fn accept(
    proxy: &Proxy,
    acceptor: &TlsAcceptor,
    stream: Prefixed<SendTimeout<TcpStream>>,
) -> Result<TerminatedStream, String> {
    let accepted = acceptor.accept(stream).await;
    let version = accepted
        .as_ref()
        .ok()
        .map(|s| s.get_ref().1.protocol_version().unwrap_or(rustls::ProtocolVersion::Unknown(0)));
    proxy.metrics().tls_handshake(version);
    accepted.map_err(|e| format!("TLS handshake failed: {e}"))
}

/// Connects to one of the balancer's endpoints, trying others when connecting fails.
async fn connect_any(proxy: &Proxy, balancer: &super::upstream::Balancer) -> io::Result<TcpStream> {
    let config = &proxy.inner.config;
    let mut tried = Vec::new();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the backend has no endpoints");
    while tried.len() < config.connect_tries.max(1) {
        let Some(idx) = balancer.pick_untried(&tried) else { break };
        tried.push(idx);
        let endpoint = &balancer.endpoints()[idx];
        let connect = async {
            match endpoint.key() {
                EndpointKey::Addr(addr) => TcpStream::connect(*addr).await,
                EndpointKey::Dns { host, port } => TcpStream::connect((&**host, *port)).await,
            }
        };
        match tokio::time::timeout(config.connect_timeout, connect).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        }
        endpoint.record_failure();
    }
    Err(last)
}

/// Replays the ClientHello to the backend, then copies both ways until either side closes.
async fn splice(
    mut client: TcpStream,
    hello: bytes::BytesMut,
    mut upstream: TcpStream,
    peer: SocketAddr,
    sni: String,
) {
    if let Err(error) = upstream.write_all(&hello).await {
        tracing::debug!(%peer, sni, %error, "passthrough: writing the ClientHello failed");
        return;
    }
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((up, down)) => tracing::debug!(%peer, sni, up, down, "passthrough connection closed"),
        Err(error) => tracing::debug!(%peer, sni, %error, "passthrough connection failed"),
    }
}

/// Relays a terminated TLS connection's bytes to the backend and back, over plain TCP, until
/// both sides are done or nothing moved for `idle` (`proxy-stream-timeout`), as an L4 TCP
/// service does; the copy relay, as splice(2) cannot move decrypted bytes.
async fn relay_decrypted(
    client: TerminatedStream,
    upstream: TcpStream,
    idle: Duration,
    peer: SocketAddr,
    sni: String,
) {
    let (client_read, client_write) = tokio::io::split(client);
    let (upstream_read, upstream_write) = upstream.into_split();
    let timer = std::pin::pin!(tokio::time::sleep(idle));
    let relayed = crate::relay::copy(
        crate::relay::Side { read: client_read, write: client_write },
        crate::relay::Side { read: upstream_read, write: upstream_write },
        idle,
        RELAY_BUFFER,
        &[],
        &[],
        timer,
    )
    .await;
    match relayed {
        Ok(()) => tracing::debug!(%peer, sni, "TLS relay connection closed"),
        Err(error) => tracing::debug!(%peer, sni, %error, "TLS relay connection ended"),
    }
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

    /// Logs `reason` unless the budget of this second is spent.
    fn log(&self, peer: SocketAddr, reason: &str) {
        self.try_log(peer, reason);
    }

    /// [`RateLimit::log`], telling whether it logged.
    fn try_log(&self, peer: SocketAddr, reason: &str) -> bool {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, logged, suppressed) = &mut *window;
        if start.elapsed() >= Duration::from_secs(1) {
            if *suppressed > 0 {
                tracing::info!(suppressed = *suppressed, "more rejected connections were not logged");
            }
            *start = Instant::now();
            *logged = 0;
            *suppressed = 0;
        }
        if *logged < self.per_second {
            *logged += 1;
            tracing::info!(%peer, reason, "connection rejected");
            true
        } else {
            *suppressed += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejected_connections_are_logged_at_most_n_a_second() {
        let limit = RateLimit::new(3);
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let logged = (0..100).filter(|_| limit.try_log(peer, "test")).count();
        assert_eq!(logged, 3);
        // A new window logs again.
        limit.window.lock().unwrap_or_else(|p| p.into_inner()).0 -= Duration::from_secs(2);
        assert!(limit.try_log(peer, "test"));
    }
}
