//! The pooled upstream clients and a request body that survives a failed connect.
//!
//! HTTP/1.1 goes through hyper-util's pooled keep-alive client (keyed by endpoint address).
//! h2c uses one multiplexed hyper connection per endpoint ([`H2Pool`]) instead, because the
//! pooled client takes `:authority` from the URI it also connects to: we need `:authority` to be
//! the request's host (as nginx's `grpc_pass` does) while connecting to the endpoint address.
//!
//! hyper-util's legacy client drops the request when connecting fails, body included. To retry
//! a request *with* a body on another endpoint, [`UpstreamBody`] leaves the real body in a shared
//! slot until the client first polls it, which happens only once a connection exists. After a
//! connect error the body is still in the slot and [`BodySlot::reclaim`] takes it back; once
//! polled it cannot be reclaimed and the request is not retried. Bodyless requests need no slot.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::ProxyConfig;
use super::error::BoxError;
use crate::balance::{EndpointKey, EndpointState};
use crate::model::UpstreamProtocol;
use crate::tls::UpstreamTlsConfig;
use rustls_pki_types::ServerName;

/// Why sending a request upstream failed.
#[derive(Debug)]
pub(super) enum SendError {
    /// No connection could be made: nothing of the request was sent.
    Connect {
        /// It was the connect timeout.
        timed_out: bool,
        /// The cause.
        error: BoxError,
    },
    /// The connection broke or the upstream answered something invalid after sending began.
    Request(BoxError),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect { timed_out: true, .. } => f.write_str("connect timed out"),
            SendError::Connect { error, .. } => write!(f, "connect failed: {error}"),
            SendError::Request(error) => write!(f, "request failed: {error}"),
        }
    }
}

impl SendError {
    fn from_legacy(e: hyper_util::client::legacy::Error) -> Self {
        if e.is_connect() {
            SendError::Connect { timed_out: is_timeout(&e), error: Box::new(e) }
        } else {
            SendError::Request(Box::new(e))
        }
    }
}

/// Whether an error chain contains an I/O timeout.
fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::TimedOut
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// One pooled client per upstream protocol.
pub(super) struct Clients {
    /// HTTP/1.1 keep-alive pool (also carries upgrades).
    http1: Client<HttpConnector, UpstreamBody>,
    /// h2c prior knowledge, one multiplexed connection per endpoint.
    pub(super) h2c: H2Pool,
    /// HTTP/1.1 over TLS connections by endpoint and verified name: a connection is reused once
    /// its previous response is fully read.
    /// The endpoint is held weakly, as in [`H2Pool`]: publish prunes endpoints gone from every
    /// table. Idle connections otherwise last until the upstream closes them.
    https: Mutex<HashMap<H2Key, HttpsConns>>,
    https_max_per_host: usize,
}

impl Clients {
    pub(super) fn new(config: &ProxyConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // We set Host ourselves; never derive it from the endpoint address.
            .set_host(false)
            .build(connector);
        Clients {
            http1,
            h2c: H2Pool { conns: Mutex::default(), connect_timeout: config.connect_timeout },
            https: Mutex::default(),
            https_max_per_host: config.pool_max_idle_per_host.max(1),
        }
    }

    /// Sends `req` over the HTTP/1.1 pool, to its URI's authority (resolved by DNS); its `Host`
    /// header must be set.
    pub(super) async fn send_http1(
        &self,
        req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, SendError> {
        self.http1.request(req).await.map_err(SendError::from_legacy)
    }

    /// Sends `req` (its URI already aimed at `endpoint` for HTTP/1.1, at the request host for h2c).
    /// `tls` is the backend's TLS client config for the TLS protocols; `host` the request's host
    /// (the name verified when the backend configures none).
    pub(super) async fn send(
        &self,
        protocol: UpstreamProtocol,
        endpoint: &Arc<EndpointState>,
        tls: Option<&Arc<UpstreamTlsConfig>>,
        host: &str,
        req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, SendError> {
        match protocol {
            UpstreamProtocol::Http1 => self.http1.request(req).await.map_err(SendError::from_legacy),
            UpstreamProtocol::H2c => self.h2c.send(endpoint, None, req).await,
            UpstreamProtocol::H2 => {
                let tls = tls_target(tls, host)?;
                self.h2c.send(endpoint, Some(tls), req).await
            }
            UpstreamProtocol::Https => {
                let tls = tls_target(tls, host)?;
                self.https(endpoint, tls, req).await
            }
        }
    }

    /// HTTP/1.1 over TLS, on an idle pooled connection when there is one.
    async fn https(
        &self,
        endpoint: &Arc<EndpointState>,
        (config, name): (Arc<rustls::ClientConfig>, ServerName<'static>),
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, SendError> {
        // Origin-form request target on the wire.
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        *req.uri_mut() = path.parse().map_err(|e: http::uri::InvalidUri| SendError::Request(e.into()))?;
        let key: H2Key = (endpoint.key().clone(), Some(name.clone()));
        // A pooled connection may have been closed by the upstream since; hyper hands the request
        // back when it was not sent, and it goes once more on a new connection.
        for _ in 0..2 {
            let idle = {
                let mut pool = self.https.lock().unwrap_or_else(|p| p.into_inner());
                let (_, list) =
                    pool.entry(key.clone()).or_insert_with(|| (Arc::downgrade(endpoint), Vec::new()));
                list.retain(|s| !s.is_closed());
                list.iter().position(|s| s.is_ready()).map(|i| list.swap_remove(i))
            };
            let mut sender = match idle {
                Some(sender) => sender,
                None => self.https_connect(endpoint, config.clone(), name.clone()).await?,
            };
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    // Back to the pool: it is ready again once this response's body is read
                    // (an upgraded connection closes and is dropped from the pool).
                    let mut pool = self.https.lock().unwrap_or_else(|p| p.into_inner());
                    let (_, list) = pool.entry(key).or_insert_with(|| (Arc::downgrade(endpoint), Vec::new()));
                    if list.len() < self.https_max_per_host {
                        list.push(sender);
                    }
                    return Ok(resp);
                }
                Err(mut err) => match err.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(SendError::Request(Box::new(err.into_error()))),
                },
            }
        }
        Err(SendError::Request("https upstream connection closed before the request was sent".into()))
    }

    async fn https_connect(
        &self,
        endpoint: &Arc<EndpointState>,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> Result<hyper::client::conn::http1::SendRequest<UpstreamBody>, SendError> {
        let connect_timeout = self.h2c.connect_timeout;
        let tcp = connect_tcp(endpoint.key(), connect_timeout).await?;
        let stream = tls_handshake(config, name, tcp, connect_timeout).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Connect { timed_out: false, error: e.into() })?;
        let upstream = endpoint.key().clone();
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%upstream, %error, "https upstream connection closed");
            }
        });
        Ok(sender)
    }

    /// Drops pooled HTTPS connections of endpoints no longer in use and closed ones.
    pub(super) fn prune_https(&self) {
        let mut pool = self.https.lock().unwrap_or_else(|p| p.into_inner());
        pool.retain(|_, (endpoint, list)| {
            list.retain(|s| !s.is_closed());
            endpoint.strong_count() > 0 && !list.is_empty()
        });
    }
}

/// Pooled HTTPS connections of one endpoint and name (the endpoint held weakly).
type HttpsConns = (Weak<EndpointState>, Vec<hyper::client::conn::http1::SendRequest<UpstreamBody>>);

/// The TLS config and the name to verify for one request.
fn tls_target(
    tls: Option<&Arc<UpstreamTlsConfig>>,
    host: &str,
) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), SendError> {
    let tls = tls.ok_or_else(|| SendError::Connect {
        timed_out: false,
        error: "no usable upstream TLS configuration".into(),
    })?;
    let name = match &tls.server_name {
        Some(name) => name.clone(),
        None => {
            let bare = crate::router::normalize_host(host);
            let bare = bare.trim_start_matches('[').trim_end_matches(']');
            ServerName::try_from(bare.to_string()).map_err(|_| SendError::Connect {
                timed_out: false,
                error: format!("{host:?} is not a name to verify").into(),
            })?
        }
    };
    Ok((tls.config.clone(), name))
}

async fn connect_tcp(key: &EndpointKey, timeout: Duration) -> Result<TcpStream, SendError> {
    let tcp = async {
        let stream = match key {
            EndpointKey::Addr(addr) => TcpStream::connect(*addr).await?,
            // tokio resolves the name and tries each address in turn.
            EndpointKey::Dns { host, port } => TcpStream::connect((&**host, *port)).await?,
        };
        stream.set_nodelay(true)?;
        Ok::<_, io::Error>(stream)
    };
    match tokio::time::timeout(timeout, tcp).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => {
            Err(SendError::Connect { timed_out: e.kind() == io::ErrorKind::TimedOut, error: e.into() })
        }
        Err(_) => Err(SendError::Connect { timed_out: true, error: "connect timeout".into() }),
    }
}

/// The client TLS handshake, bounded by the connect timeout; a failure is a connect error
/// (nothing of the request was sent), so another endpoint may be tried.
async fn tls_handshake(
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    tcp: TcpStream,
    timeout: Duration,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, SendError> {
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(SendError::Connect {
            timed_out: false,
            error: format!("upstream TLS handshake failed: {e}").into(),
        }),
        Err(_) => {
            Err(SendError::Connect { timed_out: true, error: "upstream TLS handshake timed out".into() })
        }
    }
}

// === impl H2Pool ===

/// A pooled h2c connection and (weakly) the endpoint it belongs to.
type H2Conn = (Weak<EndpointState>, http2::SendRequest<UpstreamBody>);

/// A pooled HTTP/2 connection's identity: the endpoint, and for TLS the verified name.
type H2Key = (EndpointKey, Option<ServerName<'static>>);

/// One HTTP/2 connection (h2c, or h2 over TLS per verified name) per endpoint, shared by all
/// requests to it.
pub(super) struct H2Pool {
    /// The endpoint's state is held weakly: entries of endpoints gone from every table are
    /// pruned on publish, closing their connections.
    conns: Mutex<HashMap<H2Key, H2Conn>>,
    connect_timeout: Duration,
}

impl H2Pool {
    async fn send(
        &self,
        endpoint: &Arc<EndpointState>,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, SendError> {
        let key: H2Key = (endpoint.key().clone(), tls.as_ref().map(|(_, name)| name.clone()));
        // A cached connection may have been closed (GOAWAY, idle close) since; hyper hands the
        // request back when it was not sent, and we go once more on a fresh connection.
        for _ in 0..2 {
            let mut sender = match self.cached(&key) {
                Some(s) => s,
                None => self.connect(endpoint, &key, tls.clone()).await?,
            };
            if sender.ready().await.is_err() {
                self.evict(&key);
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut err) => match err.take_message() {
                    Some(unsent) => {
                        self.evict(&key);
                        req = unsent;
                    }
                    None => return Err(SendError::Request(Box::new(err.into_error()))),
                },
            }
        }
        Err(SendError::Request("h2c connection closed before the request was sent".into()))
    }

    fn cached(&self, key: &H2Key) -> Option<http2::SendRequest<UpstreamBody>> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.get(key).filter(|(_, s)| !s.is_closed()).map(|(_, s)| s.clone())
    }

    /// Forgets the endpoint's connection (at worst one a concurrent request just made: it
    /// stays usable by whoever holds it and closes when they are done).
    fn evict(&self, key: &H2Key) {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    async fn connect(
        &self,
        endpoint: &Arc<EndpointState>,
        key: &H2Key,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    ) -> Result<http2::SendRequest<UpstreamBody>, SendError> {
        let stream = connect_tcp(endpoint.key(), self.connect_timeout).await?;
        let builder = {
            let mut b = http2::Builder::new(TokioExecutor::new());
            b.timer(TokioTimer::new());
            b
        };
        let upstream = endpoint.key().clone();
        let handshake_error = |e: hyper::Error| SendError::Connect { timed_out: false, error: e.into() };
        let sender = match tls {
            None => {
                let (sender, conn) =
                    builder.handshake(TokioIo::new(stream)).await.map_err(handshake_error)?;
                tokio::spawn(async move {
                    if let Err(error) = conn.await {
                        tracing::debug!(%upstream, %error, "h2c upstream connection closed");
                    }
                });
                sender
            }
            Some((config, name)) => {
                let stream = tls_handshake(config, name, stream, self.connect_timeout).await?;
                if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                    return Err(SendError::Connect {
                        timed_out: false,
                        error: "the upstream did not negotiate h2 (ALPN)".into(),
                    });
                }
                let (sender, conn) =
                    builder.handshake(TokioIo::new(stream)).await.map_err(handshake_error)?;
                tokio::spawn(async move {
                    if let Err(error) = conn.await {
                        tracing::debug!(%upstream, %error, "h2 upstream connection closed");
                    }
                });
                sender
            }
        };
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.insert(key.clone(), (Arc::downgrade(endpoint), sender.clone()));
        Ok(sender)
    }

    /// Drops connections of endpoints that no table refers to any more.
    pub(super) fn prune(&self) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain(|_, (state, sender)| state.strong_count() > 0 && !sender.is_closed());
    }
}

/// Where a request body waits until a connection polls it.
#[derive(Clone)]
pub(super) struct BodySlot(Arc<Mutex<Option<Incoming>>>, Option<u64>);

impl BodySlot {
    /// Wraps `body`: the returned slot can reclaim it while the returned body is unpolled.
    /// `None` for a body that is already at its end (nothing to keep). A body longer than
    /// `limit` bytes fails with [`BodyTooLarge`] once it passes the limit.
    pub(super) fn new(body: Incoming, limit: Option<u64>) -> (Option<BodySlot>, UpstreamBody) {
        if body.is_end_stream() {
            return (None, UpstreamBody::empty());
        }
        let hint = body.size_hint();
        let slot = BodySlot(Arc::new(Mutex::new(Some(body))), limit);
        let upstream =
            UpstreamBody { slot: Some(slot.clone()), body: None, hint, end: false, limit, seen: 0 };
        (Some(slot), upstream)
    }

    /// Takes the body back if the upstream client never started sending it.
    pub(super) fn reclaim(self) -> Option<(Option<BodySlot>, UpstreamBody)> {
        let body = self.0.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        Some(BodySlot::new(body, self.1))
    }
}

/// The client's request body passed the route's size limit (`proxy-body-size`): 413.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {0} bytes")]
pub(super) struct BodyTooLarge(u64);

/// The request body sent upstream: the client's body, streamed frame by frame, never buffered.
pub(super) struct UpstreamBody {
    slot: Option<BodySlot>,
    body: Option<Incoming>,
    hint: SizeHint,
    end: bool,
    limit: Option<u64>,
    seen: u64,
}

impl UpstreamBody {
    /// An empty body.
    pub(super) fn empty() -> Self {
        UpstreamBody {
            slot: None,
            body: None,
            hint: SizeHint::with_exact(0),
            end: true,
            limit: None,
            seen: 0,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(slot) = this.slot.take() {
            // First poll: from now on the body belongs to this connection.
            this.body = slot.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        let Some(body) = &mut this.body else { return Poll::Ready(None) };
        let frame = match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let (Some(limit), Some(data)) = (this.limit, frame.data_ref()) {
            this.seen = this.seen.saturating_add(data.len() as u64);
            if this.seen > limit {
                return Poll::Ready(Some(Err(Box::new(BodyTooLarge(limit)))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Some(body) => body.is_end_stream(),
            None => self.end,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Some(body) => body.size_hint(),
            None => self.hint,
        }
    }
}
