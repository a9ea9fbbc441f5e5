//! The upstream clients: pooled HTTP/1.1 (plain and TLS), multiplexed HTTP/2 (h2c and h2 over
//! TLS), and the response bodies that come back.
//!
//! HTTP/1.1 runs on our own client ([`super::h1`]: the request's task writes the request and
//! reads the response on the connection, no task or channel per connection) with our own
//! idle pool ([`Http1Pool`]): a stack per upstream of connections whose last response was read to
//! its end, most recently used on top, at most [`crate::proxy::ProxyConfig::pool_max_idle_per_host`] of
//! them; [`Clients::sweep`] closes those idle longer than
//! [`crate::proxy::ProxyConfig::pool_idle_timeout`]. A connection is retired after
//! [`crate::proxy::ProxyConfig::pool_max_requests`] requests or past
//! [`crate::proxy::ProxyConfig::pool_max_lifetime`]; the table's values apply ([`Exchange`]). Writes
//! to an upstream wait at most [`crate::proxy::ProxyConfig::send_timeout`] for progress
//! ([`SendTimed`](super::conn::SendTimed)). A plain endpoint's pool lives in its
//! [`EndpointState`]'s slot, so a request finds it without a lookup. A connection goes back to its pool
//! when the client has read the response body to its end ([`ResponseBody`]); a response body
//! dropped before its end closes the connection.
//!
//! A connection is made *before* the request is written, so when connecting fails the
//! request, body included, is handed back ([`SendError::Connect`]) and can go to another endpoint.
//! A pooled connection the upstream closed in the meantime is noticed when taken from the pool
//! (a read that does not wait) or when none of the request head could be written on it, and the
//! request goes on another connection.
//!
//! h2c (and h2 over TLS) use one multiplexed connection per endpoint ([`H2Pool`]); `:authority`
//! is the request's host (as nginx's `grpc_pass` does) while the connection goes to the
//! endpoint address. Services named by URL that speak only h2c (the mirrors of a GRPCRoute)
//! get one multiplexed connection per address too ([`Clients::send_url_h2c`]), closed once
//! idle for the pool's idle timeout.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::body::UpstreamBody;
use super::conn::{BoxError, ConnMeta, Exchange, lock};
use super::h1::{self, Conn, Home, Http1Pool, PoolRef};
use super::{Balancer, EndpointState};
use crate::model::UpstreamProtocol;
use crate::proxy::headers::Forwarded;
use crate::state::balance::EndpointKey;
use crate::tls::UpstreamTlsConfig;
use rustls_pki_types::ServerName;

/// Why sending a request upstream failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made, or it closed before the request went out: nothing of the
    /// request was sent, and here it is back.
    Connect {
        /// It was the connect timeout.
        timed_out: bool,
        /// The cause.
        error: BoxError,
        /// The request, unsent (its body unread).
        request: Box<Request<UpstreamBody>>,
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

/// How long making the connection a response came on took (TCP, and TLS when spoken), for
/// `$upstream_connect_time`: set on the responses of fresh connections only, so a response
/// without it came on a reused one (nginx logs `0.000` for those).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectTime(pub(crate) Duration);

/// Connecting failed (nothing was sent).
struct ConnectFailed {
    timed_out: bool,
    error: BoxError,
}

impl ConnectFailed {
    fn new(error: impl Into<BoxError>) -> Self {
        ConnectFailed { timed_out: false, error: error.into() }
    }

    fn timed_out(error: impl Into<BoxError>) -> Self {
        ConnectFailed { timed_out: true, error: error.into() }
    }

    /// The error to return, with the request handed back.
    fn with(self, request: Request<UpstreamBody>) -> SendError {
        SendError::Connect { timed_out: self.timed_out, error: self.error, request: Box::new(request) }
    }
}

/// Where one exchange goes: the backend's protocol and TLS client config (for the TLS
/// protocols), the endpoint, and the request's host (the name verified when the backend
/// configures none).
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    /// How the backend is spoken to.
    pub(crate) protocol: UpstreamProtocol,
    /// The endpoint picked.
    pub(crate) endpoint: &'a Arc<EndpointState>,
    /// The backend's TLS client config.
    pub(crate) tls: Option<&'a Arc<UpstreamTlsConfig>>,
    /// The request's host.
    pub(crate) host: &'a str,
}

/// The upstream clients of a proxy.
pub(crate) struct Clients {
    /// h2c prior knowledge and h2 over TLS, one multiplexed connection per endpoint.
    pub(crate) h2c: H2Pool,
    /// HTTP/1.1 over TLS, by endpoint and verified name. The endpoint is held weakly, as in
    /// [`H2Pool`]: publish prunes endpoints gone from every table.
    https: Mutex<HashMap<H2Key, HttpsPool>>,
    /// HTTP/1.1 to services named by URL (external authentication), by host and port.
    by_name: Mutex<HashMap<EndpointKey, Arc<Http1Pool>>>,
    /// The same over TLS (`https://` URLs), apart so that a name's plain and TLS connections
    /// never mix; by the verified name and the verification profile too (see [`UrlTls`]).
    by_name_tls: Mutex<HashMap<(EndpointKey, ServerName<'static>, u64), Arc<Http1Pool>>>,
    /// h2c to services named by URL (mirrors speaking HTTP/2), one multiplexed connection per
    /// host and port, with when it was last used (for [`Clients::sweep`]).
    by_name_h2c: Mutex<HashMap<EndpointKey, (Instant, http2::SendRequest<UpstreamBody>)>>,
    /// The proxy's own values, for services named by URL.
    exchange: Exchange,
}

impl Clients {
    pub(crate) fn new(exchange: Exchange) -> Self {
        Clients {
            h2c: H2Pool { conns: Mutex::default() },
            https: Mutex::default(),
            by_name: Mutex::default(),
            by_name_tls: Mutex::default(),
            by_name_h2c: Mutex::default(),
            exchange,
        }
    }

    /// Sends `req` over HTTP/1.1 to its URI's authority (a name is resolved when connecting); its
    /// `Host` header must be set. For services named by URL, not endpoints. Over TLS with `tls`
    /// when given (the URI's host is the name verified and sent as SNI; the port defaults to 443).
    pub(crate) async fn send_url(
        &self,
        req: Request<UpstreamBody>,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Response<ResponseBody>, SendError> {
        let tls = tls.map(|config| UrlTls { config, server_name: None, profile: 0 });
        self.send_url_with(req, tls).await
    }

    /// [`Clients::send_url`] with a [`UrlTls`] profile: its name, when it has one, is the one
    /// verified and sent as SNI in place of the URI's host.
    pub(crate) async fn send_url_with(
        &self,
        mut req: Request<UpstreamBody>,
        tls: Option<UrlTls<'_>>,
    ) -> Result<Response<ResponseBody>, SendError> {
        let default_port = if tls.is_some() { 443 } else { 80 };
        let Some((key, host)) = req.uri().authority().and_then(|a| {
            let key = authority_key(a.host(), Some(a.port_u16().unwrap_or(default_port)))?;
            Some((key, a.host().trim_start_matches('[').trim_end_matches(']').to_string()))
        }) else {
            return Err(ConnectFailed::new("the URL names no host to connect to").with(req));
        };
        let tls = match tls {
            Some(UrlTls { config, server_name: Some(name), profile }) => {
                Some((config.clone(), name.clone(), profile))
            }
            Some(UrlTls { config, server_name: None, profile }) => match ServerName::try_from(host) {
                Ok(name) => Some((config.clone(), name, profile)),
                Err(e) => return Err(ConnectFailed::new(e).with(req)),
            },
            None => None,
        };
        let pq = req.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(pq);
        let (pool, tls) = match tls {
            Some((config, name, profile)) => {
                let mut pools = lock(&self.by_name_tls);
                let pool = pools.entry((key.clone(), name.clone(), profile)).or_default().clone();
                (pool, Some((config, name)))
            }
            None => (lock(&self.by_name).entry(key.clone()).or_default().clone(), None),
        };
        self.http1(PoolRef::Keyed(pool), &key, tls, req, self.exchange, None).await
    }

    /// Sends `req` over h2c (HTTP/2 prior knowledge) to `to`, a URL's host and port (a name is
    /// resolved when connecting); `req`'s URI is absolute, its authority the `:authority` sent.
    /// For services named by URL that speak HTTP/2 only (a GRPCRoute's mirror).
    pub(crate) async fn send_url_h2c(
        &self,
        to: &http::uri::Authority,
        req: Request<UpstreamBody>,
    ) -> Result<Response<ResponseBody>, SendError> {
        let Some(key) = authority_key(to.host(), Some(to.port_u16().unwrap_or(80))) else {
            return Err(ConnectFailed::new("the URL names no host to connect to").with(req));
        };
        let (key, connect_timeout) = (&key, self.exchange.connect_timeout);
        let cached = || {
            let mut conns = lock(&self.by_name_h2c);
            let (used, sender) = conns.get_mut(key).filter(|(_, s)| !s.is_closed())?;
            *used = Instant::now();
            Some(sender.clone())
        };
        let connect = move || async move {
            let stream = connect_tcp(key, connect_timeout).await?;
            let sender = h2c_handshake(stream, key.clone()).await?;
            lock(&self.by_name_h2c).insert(key.clone(), (Instant::now(), sender.clone()));
            Ok::<_, ConnectFailed>(sender)
        };
        let evict = || {
            lock(&self.by_name_h2c).remove(key);
        };
        h2_exchange(cached, connect, evict, req).await
    }

    /// Sends `req` to `target`'s endpoint: its URI is origin-form for HTTP/1.1, absolute with
    /// the request host as authority for h2. `opts` bound connecting, sending, and the
    /// connection's reuse. `forwarded`: headers the HTTP/1.1 encoder writes in place of the
    /// request's own of the same names (HTTP/1.1 only: an h2 request carries them in its map).
    pub(crate) async fn send(
        &self,
        target: Target<'_>,
        req: Request<UpstreamBody>,
        opts: Exchange,
        forwarded: Option<&Forwarded<'_>>,
    ) -> Result<Response<ResponseBody>, SendError> {
        let Target { protocol, endpoint, tls, host } = target;
        debug_assert!(forwarded.is_none() || !protocol.is_h2(), "h2 requests carry them in their map");
        let connect_timeout = opts.connect_timeout;
        match protocol {
            UpstreamProtocol::Http1 => {
                let pool = PoolRef::Endpoint(endpoint.clone());
                self.http1(pool, endpoint.key(), None, req, opts, forwarded).await
            }
            // Boxed: HTTP/1.1's future is the one every request carries, keep it small.
            UpstreamProtocol::H2c => Box::pin(self.h2c.send(endpoint, None, req, connect_timeout)).await,
            UpstreamProtocol::H2 => match tls_target(tls, host) {
                Ok(tls) => Box::pin(self.h2c.send(endpoint, Some(tls), req, connect_timeout)).await,
                Err(e) => Err(e.with(req)),
            },
            UpstreamProtocol::Https => {
                let (config, name) = match tls_target(tls, host) {
                    Ok(tls) => tls,
                    Err(e) => return Err(e.with(req)),
                };
                let pool = {
                    let mut pools = lock(&self.https);
                    let key: H2Key = (endpoint.key().clone(), Some(name.clone()));
                    let (_, pool) =
                        pools.entry(key).or_insert_with(|| (Arc::downgrade(endpoint), Arc::default()));
                    pool.clone()
                };
                self.http1(PoolRef::Keyed(pool), endpoint.key(), Some((config, name)), req, opts, forwarded)
                    .await
            }
        }
    }

    /// HTTP/1.1 (over TLS with `tls`) on an idle connection of `pool`, else a new one to `key`;
    /// `forwarded` as [`Clients::send`] says.
    async fn http1(
        &self,
        pool: PoolRef,
        key: &EndpointKey,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
        mut req: Request<UpstreamBody>,
        opts: Exchange,
        forwarded: Option<&Forwarded<'_>>,
    ) -> Result<Response<ResponseBody>, SendError> {
        // One clock read for the connection's age, checked when it is taken and when it is done.
        let now = Instant::now();
        loop {
            let (mut conn, fresh) = match pool.get().checkout(opts.max_lifetime, now) {
                Some(conn) => (conn, None),
                // Boxed: connecting (TLS above all) is a large future, and rare.
                None => {
                    let begun = Instant::now();
                    match Box::pin(self.connect_http1(key, tls.clone(), opts.connect_timeout)).await {
                        Ok(conn) => (conn, Some(ConnectTime(begun.elapsed()))),
                        Err(e) => return Err(e.with(req)),
                    }
                }
            };
            conn.meta.send_timeout_ms.store(opts.send_timeout.as_millis() as u64, Relaxed);
            conn.meta.requests.fetch_add(1, Relaxed);
            match h1::send(&mut conn, req, forwarded).await {
                Ok(sent) => {
                    // A connection at the end of its requests or lifetime never returns.
                    let home = (opts.max_idle > 0 && conn.meta.reusable(&opts, now))
                        .then(|| Home { pool, max: opts.max_idle });
                    let mut resp = sent.into_response(conn, home).map(ResponseBody::H1);
                    if let Some(took) = fresh {
                        resp.extensions_mut().insert(took);
                    }
                    return Ok(resp);
                }
                // The upstream closed the pooled connection since it was put back; the request
                // did not go out: the next connection takes it.
                Err(h1::Failed::Unsent(unsent, _)) if fresh.is_none() => req = *unsent,
                Err(h1::Failed::Unsent(unsent, error)) => return Err(ConnectFailed::new(error).with(*unsent)),
                Err(h1::Failed::Sent(error)) => return Err(SendError::Request(error)),
            }
        }
    }

    async fn connect_http1(
        &self,
        key: &EndpointKey,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
        connect_timeout: Duration,
    ) -> Result<Box<Conn>, ConnectFailed> {
        let tcp = connect_tcp(key, connect_timeout).await?;
        let io = match tls {
            None => h1::Io::Tcp(tcp),
            Some((config, name)) => {
                h1::Io::Tls(Box::new(tls_handshake(config, name, tcp, connect_timeout).await?))
            }
        };
        // Boxed: it moves between the pool and the response body.
        Ok(Box::new(Conn::new(io, Arc::new(ConnMeta::new()))))
    }

    /// Drops pooled connections of endpoints no longer in use and closed ones.
    pub(crate) fn prune(&self) {
        self.h2c.prune();
        lock(&self.https)
            .retain(|_, (endpoint, pool)| endpoint.strong_count() > 0 && in_use(pool, None, None, &mut 0));
    }

    /// Closes HTTP/1.1 connections idle for longer than `idle_timeout` (and those the upstream
    /// closed) in the pools of `balancers`' endpoints and the keyed pools; gives back the
    /// buffers of those idle for [`BUFFERS_KEPT_IDLE`]. Returns how many gave buffers back.
    pub(crate) fn sweep(&self, balancers: &[Arc<Balancer>], idle_timeout: Duration) -> u64 {
        let now = Instant::now();
        let expiry = Some(now.checked_sub(idle_timeout).unwrap_or(now));
        let stale = Some(now.checked_sub(BUFFERS_KEPT_IDLE).unwrap_or(now));
        let mut released = 0;
        for balancer in balancers.iter().filter(|b| b.protocol() == UpstreamProtocol::Http1) {
            for endpoint in balancer.endpoints() {
                endpoint.slot().sweep(expiry, stale, &mut released);
            }
        }
        let mut in_use = |pool: &Arc<Http1Pool>| in_use(pool, expiry, stale, &mut released);
        lock(&self.https).retain(|_, (endpoint, pool)| endpoint.strong_count() > 0 && in_use(pool));
        lock(&self.by_name).retain(|_, pool| in_use(pool));
        lock(&self.by_name_tls).retain(|_, pool| in_use(pool));
        // Dropping the last sender closes an h2c connection once its streams are done.
        lock(&self.by_name_h2c)
            .retain(|_, (used, sender)| !sender.is_closed() && expiry.is_none_or(|e| *used > e));
        released
    }
}

/// A pooled connection idle this long gives its buffers back at the next sweep (a busy one
/// keeps them: it is idle only between a response and the next request).
const BUFFERS_KEPT_IDLE: Duration = Duration::from_secs(1);

/// Sweeps a keyed pool (see [`Http1Pool::sweep`]); whether to keep it: it has idle
/// connections, or a request holds it (its connection comes back to it).
fn in_use(
    pool: &Arc<Http1Pool>,
    expiry: Option<Instant>,
    stale: Option<Instant>,
    released: &mut u64,
) -> bool {
    pool.sweep(expiry, stale, released) > 0 || Arc::strong_count(pool) > 1
}

/// TLS towards a service named by URL: the client config, the name to verify (`None`: the URL's
/// host), and the identity of the verification settings. Connections are pooled per profile, so
/// one verified under lax settings never serves a request that asked for strict ones.
#[derive(Clone, Copy)]
pub(crate) struct UrlTls<'a> {
    /// The client config.
    pub(crate) config: &'a Arc<rustls::ClientConfig>,
    /// The name verified and sent as SNI in place of the URL's host.
    pub(crate) server_name: Option<&'a ServerName<'static>>,
    /// The settings' identity (0: the shared defaults of mirror targets).
    pub(crate) profile: u64,
}

/// The pool of HTTPS connections to one endpoint for one verified name (the endpoint held
/// weakly).
type HttpsPool = (Weak<EndpointState>, Arc<Http1Pool>);

/// The endpoint a URL's host and port name (port 80 when none).
fn authority_key(host: &str, port: Option<u16>) -> Option<EndpointKey> {
    let port = port.unwrap_or(80);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.is_empty() {
        return None;
    }
    Some(match bare.parse() {
        Ok(ip) => EndpointKey::Addr(SocketAddr::new(ip, port)),
        Err(_) => EndpointKey::Dns { host: bare.into(), port },
    })
}

/// The TLS config and the name to verify for one request.
fn tls_target(
    tls: Option<&Arc<UpstreamTlsConfig>>,
    host: &str,
) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), ConnectFailed> {
    let tls = tls.ok_or_else(|| ConnectFailed::new("no usable upstream TLS configuration"))?;
    let name = match &tls.server_name {
        Some(name) => name.clone(),
        None => {
            let bare = crate::http_util::normalize_host(host);
            let bare = bare.trim_start_matches('[').trim_end_matches(']');
            ServerName::try_from(bare.to_string())
                .map_err(|_| ConnectFailed::new(format!("{host:?} is not a name to verify")))?
        }
    };
    Ok((tls.config.clone(), name))
}

async fn connect_tcp(key: &EndpointKey, timeout: Duration) -> Result<TcpStream, ConnectFailed> {
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
        Ok(Err(e)) => Err(ConnectFailed { timed_out: e.kind() == io::ErrorKind::TimedOut, error: e.into() }),
        Err(_) => Err(ConnectFailed::timed_out("connect timeout")),
    }
}

/// The client TLS handshake, bounded by the connect timeout; a failure is a connect error
/// (nothing of the request was sent), so another endpoint may be tried.
async fn tls_handshake(
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    tcp: TcpStream,
    timeout: Duration,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ConnectFailed> {
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(ConnectFailed::new(format!("upstream TLS handshake failed: {e}"))),
        Err(_) => Err(ConnectFailed::timed_out("upstream TLS handshake timed out")),
    }
}

// === impl ResponseBody ===

/// An upstream response body, streamed: HTTP/1.1's own ([`h1::Body`]: its connection goes
/// back to the pool once the body has been read to its end, a body dropped before that closes
/// the connection), or hyper's for h2.
pub(crate) enum ResponseBody {
    H1(h1::Body),
    H2(Incoming),
}

impl ResponseBody {
    /// The upstream connection of a `101 Switching Protocols` response, for the splice.
    pub(crate) fn take_upgrade(&mut self) -> Option<h1::Upgraded> {
        match self {
            ResponseBody::H1(body) => body.take_upgrade(),
            ResponseBody::H2(_) => None,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ResponseBody::H1(body) => Pin::new(body).poll_frame(cx),
            ResponseBody::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::H1(body) => body.is_end_stream(),
            ResponseBody::H2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::H1(body) => body.size_hint(),
            ResponseBody::H2(body) => body.size_hint(),
        }
    }
}

// === impl H2Pool ===

/// A pooled h2c connection and (weakly) the endpoint it belongs to.
type H2Conn = (Weak<EndpointState>, http2::SendRequest<UpstreamBody>);

/// A pooled connection's identity: the endpoint, and for TLS the verified name.
type H2Key = (EndpointKey, Option<ServerName<'static>>);

/// One HTTP/2 connection (h2c, or h2 over TLS per verified name) per endpoint, shared by all
/// requests to it.
pub(crate) struct H2Pool {
    /// The endpoint's state is held weakly: entries of endpoints gone from every table are
    /// pruned on publish, closing their connections.
    conns: Mutex<HashMap<H2Key, H2Conn>>,
}

impl H2Pool {
    async fn send(
        &self,
        endpoint: &Arc<EndpointState>,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
        req: Request<UpstreamBody>,
        connect_timeout: Duration,
    ) -> Result<Response<ResponseBody>, SendError> {
        let key: H2Key = (endpoint.key().clone(), tls.as_ref().map(|(_, name)| name.clone()));
        let connect = || self.connect(endpoint, &key, tls.clone(), connect_timeout);
        h2_exchange(|| self.cached(&key), connect, || self.evict(&key), req).await
    }

    fn cached(&self, key: &H2Key) -> Option<http2::SendRequest<UpstreamBody>> {
        let conns = lock(&self.conns);
        conns.get(key).filter(|(_, s)| !s.is_closed()).map(|(_, s)| s.clone())
    }

    /// Forgets the endpoint's connection (at worst one a concurrent request just made: it
    /// stays usable by whoever holds it and closes when they are done).
    fn evict(&self, key: &H2Key) {
        lock(&self.conns).remove(key);
    }

    async fn connect(
        &self,
        endpoint: &Arc<EndpointState>,
        key: &H2Key,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
        connect_timeout: Duration,
    ) -> Result<http2::SendRequest<UpstreamBody>, ConnectFailed> {
        let stream = connect_tcp(endpoint.key(), connect_timeout).await?;
        let upstream = endpoint.key().clone();
        let sender = match tls {
            None => h2c_handshake(stream, upstream).await?,
            Some((config, name)) => {
                let stream = tls_handshake(config, name, stream, connect_timeout).await?;
                if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                    return Err(ConnectFailed::new("the upstream did not negotiate h2 (ALPN)"));
                }
                let mut builder = http2::Builder::new(TokioExecutor::new());
                builder.timer(TokioTimer::new());
                let (sender, conn) =
                    builder.handshake(TokioIo::new(stream)).await.map_err(ConnectFailed::new)?;
                tokio::spawn(async move {
                    if let Err(error) = conn.await {
                        tracing::debug!(%upstream, %error, "h2 upstream connection closed");
                    }
                });
                sender
            }
        };
        let mut conns = lock(&self.conns);
        conns.insert(key.clone(), (Arc::downgrade(endpoint), sender.clone()));
        Ok(sender)
    }

    /// Drops connections of endpoints that no table refers to any more.
    fn prune(&self) {
        lock(&self.conns).retain(|_, (state, sender)| state.strong_count() > 0 && !sender.is_closed());
    }
}

/// The HTTP/2 client handshake over a plain connection to `upstream` (h2c prior knowledge);
/// the connection runs in a task of its own.
async fn h2c_handshake(
    stream: TcpStream,
    upstream: EndpointKey,
) -> Result<http2::SendRequest<UpstreamBody>, ConnectFailed> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    let (sender, conn) = builder.handshake(TokioIo::new(stream)).await.map_err(ConnectFailed::new)?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%upstream, %error, "h2c upstream connection closed");
        }
    });
    Ok(sender)
}

/// One request over a pooled HTTP/2 connection (`cached`), else a new one (`connect`, which
/// pools it). A cached connection may have been closed (GOAWAY, idle close) since: it is
/// forgotten (`evict`) and, as hyper hands the request back when it was not sent, the request
/// goes once more on a fresh connection.
async fn h2_exchange<F>(
    cached: impl Fn() -> Option<http2::SendRequest<UpstreamBody>>,
    connect: impl Fn() -> F,
    evict: impl Fn(),
    mut req: Request<UpstreamBody>,
) -> Result<Response<ResponseBody>, SendError>
where
    F: Future<Output = Result<http2::SendRequest<UpstreamBody>, ConnectFailed>>,
{
    loop {
        let (mut sender, fresh) = match cached() {
            Some(s) => (s, None),
            // Boxed: connecting is a large future, and rare.
            None => {
                let begun = Instant::now();
                match Box::pin(connect()).await {
                    Ok(s) => (s, Some(ConnectTime(begun.elapsed()))),
                    Err(e) => return Err(e.with(req)),
                }
            }
        };
        if let Err(error) = sender.ready().await {
            evict();
            if fresh.is_some() {
                return Err(ConnectFailed::new(error).with(req));
            }
            continue;
        }
        match sender.try_send_request(req).await {
            Ok(resp) => {
                let mut resp = resp.map(ResponseBody::H2);
                if let Some(took) = fresh {
                    resp.extensions_mut().insert(took);
                }
                return Ok(resp);
            }
            Err(mut err) => match err.take_message() {
                Some(unsent) => {
                    evict();
                    if fresh.is_some() {
                        return Err(ConnectFailed::new(err.into_error()).with(unsent));
                    }
                    req = unsent;
                }
                None => return Err(SendError::Request(Box::new(err.into_error()))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_hosts_become_endpoint_keys() {
        let addr = |s: &str| EndpointKey::Addr(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")));
        assert_eq!(authority_key("127.0.0.1", Some(8080)), Some(addr("127.0.0.1:8080")));
        assert_eq!(authority_key("[::1]", None), Some(addr("[::1]:80")));
        assert_eq!(
            authority_key("auth.example", Some(9000)),
            Some(EndpointKey::Dns { host: "auth.example".into(), port: 9000 })
        );
        assert_eq!(authority_key("", None), None);
    }
}
