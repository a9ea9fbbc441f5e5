//! The HTTP proxy: listeners, forwarding, upgrades and the upstream clients.
//!
//! A [`Proxy`] holds one compiled state (router + balancers + version) behind one
//! [`ArcSwap`]. [`Proxy::publish`] compiles a new [`RouteTable`] on the caller's thread and swaps
//! it in with a single store; requests load the state once and keep that snapshot until they
//! finish, so none ever sees a half-built table and none waits for a rebuild.
//!
//! - `server`: accept loops (plain: HTTP/1.1 + h2c on one port; TLS: ClientHello read ahead,
//!   passthrough or handshake with SNI certificate selection and per-host client auth, then
//!   HTTP/1.1 or h2 by ALPN), handshake limits, graceful drain.
//! - [`proxy_protocol`]: PROXY protocol v1/v2 headers on either listener.
//! - `forward`: routing, header policy, retries, upstream errors.
//! - `extauth`, `mirror`: the external authentication subrequest, the mirrored copies.
//! - `upgrade`: HTTP/1.1 `Upgrade` (WebSocket and others) splicing.
//! - [`accesslog`]: the access log's lines and their writer; [`syslog`]: RFC 5424 over UDP.
//! - `deadline`: an HTTP/1 connection's lazily re-armed timer for its request-head and
//!   response-head deadlines.
//! - [`error`]: errors classified by where they came from, and the responses they become.
//! - `settings`: the table's settings applied to a [`ProxyConfig`].
//!
//! Beneath the pipeline, in layers of their own: `headers` (hop-by-hop headers, `X-Request-ID`,
//! the forwarded headers, the original request) and `upstream` (the upstream clients with our
//! own HTTP/1.1 codec and idle pools, the request body sent upstream). Neither imports the
//! pipeline; `upstream` imports `headers`, not the other way round.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto;

use self::upstream::Balancer;
use self::upstream::conn::Exchange;
use crate::model::changes::TableChanges;
use crate::model::{BackendId, HostMatch, RouteTable};
use crate::route::retry::Retry;
use crate::route::router::{CompileError, Router};
use crate::state::ratelimit::LimiterCache;
use crate::tls::mtls::ClientAuthIndex;
use crate::tls::{CertCache, CertIndex};

pub mod accesslog;
mod accesslog_auth;
mod accesslog_batch;
mod accesslog_render;
mod accesslog_upstream;
pub mod blocklist;
mod client_limits;
pub mod compress;
mod deadline;
pub mod error;
mod extauth;
mod forward;
mod h1_idle;
mod h2_stall;
mod headers;
mod http1_server;
pub mod limits;
mod metered;
pub(crate) mod mirror;
mod park;
pub mod proxy_protocol;
mod server;
mod settings;
pub mod syslog;
mod traced;
mod upgrade;
mod upstream;

pub use error::{ErrorSource, ProxyError};
pub use http1_server::Http1Server;

/// Entry points for the fuzz targets (`fuzz/`) into parsers the proxy keeps private. Not an
/// API: it exists so the fuzzers call the parsers themselves, not copies.
#[doc(hidden)]
pub mod fuzzing {
    use std::net::IpAddr;

    use http::{HeaderMap, Method};

    use super::headers::expand;
    use crate::vars::{Dialect, RequestView, Template};

    /// Parses an `auth-url` / `mirror-target` template as the table's compilation does, then
    /// expands it for a request of these parts.
    pub fn expand_template(
        template: &str,
        scheme: &str,
        host: &str,
        request_uri: &str,
        client: IpAddr,
        headers: &HeaderMap,
    ) -> String {
        let view = RequestView { scheme, host, method: &Method::GET, request_uri, client, headers };
        expand(&Template::parse_lenient(template, Dialect::Url), &view)
    }
}

/// Tunables of a [`Proxy`]. `Default` gives ingress-nginx-like values.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Time allowed to establish one upstream TCP connection (`proxy-connect-timeout`).
    pub connect_timeout: Duration,
    /// Time from sending the request until the upstream's response head arrives
    /// (`proxy-read-timeout` for the head), connect included.
    pub upstream_timeout: Duration,
    /// How long an idle pooled upstream connection is kept.
    pub pool_idle_timeout: Duration,
    /// Idle pooled connections kept per upstream endpoint.
    pub pool_max_idle_per_host: usize,
    /// On shutdown, how long in-flight requests may take to finish before connections are cut.
    pub drain_timeout: Duration,
    /// Endpoints tried in all under [`ProxyConfig::next_upstream`] (`proxy-next-upstream-tries`;
    /// at most 8).
    pub connect_tries: usize,
    /// Time allowed for a client to send a request head (slowloris guard;
    /// `client-header-timeout`).
    pub header_read_timeout: Duration,
    /// Longest wait between two reads of a request body streamed to the upstream
    /// (`client-body-timeout`); past it the request fails with 408.
    pub client_body_timeout: Duration,
    /// Longest wait for a write to a client to make progress (nginx's `send_timeout`): a client
    /// that stops reading is disconnected after it. Zero: no limit.
    pub client_send_timeout: Duration,
    /// Client connections admitted at once, in all and per client address; set when the proxy
    /// is made ([`Proxy::new`]), not by a table.
    pub connection_limits: limits::ConnLimitConfig,
    /// Largest request body accepted where a route sets no limit (413 past it); `None` is
    /// unlimited. ingress-nginx's global `proxy-body-size` (1m there by default).
    pub max_request_body: Option<u64>,
    /// Time allowed for a TLS handshake, from accept to the end of the handshake.
    pub handshake_timeout: Duration,
    /// TLS handshakes in progress at once per listener; connections beyond it are closed.
    pub max_concurrent_handshakes: usize,
    /// Every connection starts with a PROXY protocol (v1 or v2) header naming the client;
    /// connections without one are closed.
    pub proxy_protocol: bool,
    /// The port HTTPS redirects point to (omitted from the URL when 443).
    pub https_redirect_port: u16,
    /// `Strict-Transport-Security` value added to every HTTPS response; `None`: no header.
    pub hsts: Option<http::HeaderValue>,
    /// Where the client address comes from behind trusted proxies (`use-forwarded-headers`,
    /// `enable-real-ip`); `None`: the connection's peer.
    pub real_ip: Option<crate::route::realip::RealIp>,
    /// How long a client connection may wait for its next request; `None`: the
    /// `header_read_timeout` bounds it; zero: no keep-alive (one request per connection).
    pub keepalive: Option<Duration>,
    /// Requests served on one HTTP/1 client connection before it is closed; `None`: no limit.
    pub keepalive_requests: Option<u32>,
    /// Reuse upstream connections; when false every upstream request says `Connection: close`.
    pub upstream_keepalive: bool,
    /// Pass request headers with `_` in their names; nginx (and so weir) drops them by default.
    pub underscores_in_headers: bool,
    /// How request paths are normalized for routing and policies (`merge-slashes`,
    /// `encoded-slashes`).
    pub paths: crate::uri_path::PathOptions,
    /// The access-log format (`log-format-upstream`, else the default fields); `None`: no
    /// access log (set from the table's settings and `access_log_output`).
    pub access_log: Option<Arc<accesslog::Format>>,
    /// Where access-log lines go (`--access-log`; the table's `access-log-path` overrides it).
    /// Off by default here; the `weir` command's default is stdout.
    pub access_log_output: accesslog::Output,
    /// Headers set on every response (`add-headers`); a route's `custom-headers` win.
    pub response_headers: crate::route::policy::HeaderList,
    /// Headers set on every request sent upstream (`proxy-set-headers`).
    pub upstream_headers: crate::route::policy::HeaderList,
    /// When a request goes to the next endpoint (`proxy-next-upstream`, with
    /// `retry-non-idempotent` folded in).
    pub next_upstream: Retry,
    /// Non-idempotent requests are retried on every route (`retry-non-idempotent`).
    pub retry_non_idempotent: bool,
    /// Time from the first try during which further tries may start
    /// (`proxy-next-upstream-timeout`); `None`: no limit.
    pub next_upstream_timeout: Option<Duration>,
    /// Longest wait for one write towards an upstream (HTTP/1.1) to make progress
    /// (`proxy-send-timeout`); past it the exchange fails (504 before a response).
    pub send_timeout: Duration,
    /// Requests sent on one upstream HTTP/1.1 connection before it is closed
    /// (`upstream-keepalive-requests`); `None`: no limit.
    pub pool_max_requests: Option<u32>,
    /// Longest life of an upstream HTTP/1.1 connection: not reused past it
    /// (`upstream-keepalive-time`); `None`: no limit.
    pub pool_max_lifetime: Option<Duration>,
    /// Response compression (`use-gzip`, `enable-brotli`, `enable-zstd`); `None`: off.
    pub compression: Option<Arc<compress::Config>>,
    /// `block-user-agents` and `block-referers`; `None`: nothing blocked.
    pub blocklists: Option<Arc<blocklist::Blocklists>>,
    /// Headers removed from every upstream response: nginx's `proxy_hide_header` defaults
    /// (`Server`, unless `allow-backend-server-header`; `X-Pad`, `X-Accel-*`) and `hide-headers`.
    pub hidden_response_headers: Arc<[http::HeaderName]>,
    /// Requests sent upstream carry `X-Original-Uri`, the target as the client sent it
    /// (`proxy-add-original-uri-header`).
    pub original_uri_header: bool,
    /// Request metrics: on or off, per host or not; set when the proxy is made.
    pub metrics: crate::metrics::MetricsConfig,
    /// Access-log lines queued for the writer at most; past it they are dropped and counted.
    pub access_log_queue: usize,
    /// Request head sizes, HTTP/2 limits, the PROXY header timeout (`proxy/client_limits.rs`).
    pub client_limits: crate::model::ClientLimits,
    /// Which HTTP/1 server drives client connections (`--http1-server`): hyper's, or weir's,
    /// which holds no buffer while a connection is idle; set when the proxy is made.
    pub http1_server: Http1Server,
    /// An idle keep-alive connection of the plain listener is parked after this long, holding
    /// no task (`--http1-server weir`, `park`); `None`: never.
    pub http1_park_after: Option<Duration>,
    /// With weir's HTTP/1 server: how long a connection stays idle in its hyper connection
    /// before that is taken apart. A client sending its next request sooner (a page's
    /// resources, a load generator, a busy API client) keeps one hyper connection: taking it
    /// apart and building the next costs ~11,000 instructions per request (bench/RESULTS.md).
    pub http1_idle_grace: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_timeout: Duration::from_secs(5),
            upstream_timeout: Duration::from_secs(60),
            pool_idle_timeout: Duration::from_secs(60),
            // ingress-nginx's `upstream-keepalive-connections`: with fewer, a busy endpoint's
            // connections are closed and reopened under load (bench/RESULTS.md measured a third of
            // h2 requests opening one with 32).
            pool_max_idle_per_host: 320,
            drain_timeout: Duration::from_secs(30),
            connect_tries: 3,
            header_read_timeout: Duration::from_secs(30),
            // nginx's defaults.
            client_body_timeout: Duration::from_secs(60),
            client_send_timeout: Duration::from_secs(60),
            connection_limits: limits::ConnLimitConfig::default(),
            max_request_body: None,
            handshake_timeout: Duration::from_secs(10),
            max_concurrent_handshakes: 1024,
            proxy_protocol: false,
            https_redirect_port: 443,
            hsts: None,
            real_ip: None,
            keepalive: None,
            keepalive_requests: None,
            upstream_keepalive: true,
            underscores_in_headers: false,
            paths: crate::uri_path::PathOptions::default(),
            access_log: None,
            access_log_output: accesslog::Output::Off,
            response_headers: Vec::new(),
            upstream_headers: Vec::new(),
            next_upstream: Retry::DEFAULT,
            retry_non_idempotent: false,
            next_upstream_timeout: None,
            // ingress-nginx's defaults: 60 s, 10000 requests, 1 hour.
            send_timeout: Duration::from_secs(60),
            pool_max_requests: Some(10_000),
            pool_max_lifetime: Some(Duration::from_secs(3600)),
            compression: None,
            blocklists: None,
            hidden_response_headers: headers::hidden_by_default(false).into(),
            original_uri_header: false,
            metrics: crate::metrics::MetricsConfig::default(),
            access_log_queue: accesslog::QUEUE,
            client_limits: crate::model::ClientLimits::default(),
            http1_server: Http1Server::Weir,
            // Busy keep-alive connections (a request a second or more) are not moved.
            http1_park_after: Some(Duration::from_secs(1)),
            // Past it, the driver takes an idle connection apart (`h1_idle`).
            http1_idle_grace: Duration::from_millis(500),
        }
    }
}

/// The largest request header list an HTTP/2 client may send (decoded, as RFC 9113 counts it).
const MAX_H2_HEADER_LIST: u32 = 64 * 1024;

/// How client connections speak HTTP/1.1 and HTTP/2.
type HttpBuilder = auto::Builder<h2_stall::StreamExec>;

/// The connection settings of `config`: the head read timeout, which also bounds how long an
/// idle HTTP/1 connection waits for its next request (`keep-alive` sets it), keep-alive itself,
/// and WebSockets over HTTP/2.
fn http_builder(config: &ProxyConfig) -> HttpBuilder {
    // HTTP/2 streams that get no flow-control window are reset after the send timeout.
    let mut builder = auto::Builder::new(h2_stall::StreamExec::new(config.client_send_timeout));
    let (idle, keep_alive) = match config.keepalive {
        Some(idle) if idle.is_zero() => (config.header_read_timeout, false),
        Some(idle) => (idle, true),
        None => (config.header_read_timeout, true),
    };
    // The HTTP/1 timer is replaced per connection (`serve_http`); this one is a placeholder
    // hyper requires alongside `header_read_timeout`.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(idle).keep_alive(keep_alive);
    // RFC 8441: WebSockets over HTTP/2 (extended CONNECT). A request's header list may hold
    // 64 KiB (nginx's `large_client_header_buffers 4 8k` allow 32 KiB): the h2 default of
    // 16 MiB let one header block in CONTINUATION frames hold 16 MiB of a connection's memory
    // before it was refused.
    builder.http2().timer(TokioTimer::new()).enable_connect_protocol().max_header_list_size(
        client_limits::h2_max_header_list(&config.client_limits).unwrap_or(MAX_H2_HEADER_LIST),
    );
    if let Some(streams) = config.client_limits.h2_max_concurrent_streams {
        builder.http2().max_concurrent_streams(streams);
    }
    if let Some(max) = client_limits::h1_max_head(&config.client_limits) {
        builder.http1().max_buf_size(max);
    }
    builder
}

impl Exchange {
    /// The proxy's (or table's) values.
    pub(crate) fn of(config: &ProxyConfig) -> Self {
        Exchange {
            connect_timeout: config.connect_timeout,
            send_timeout: config.send_timeout,
            max_idle: config.pool_max_idle_per_host,
            max_requests: config.pool_max_requests,
            max_lifetime: config.pool_max_lifetime,
        }
    }
}

/// The L7 proxy: cheap to clone, serves any number of listeners from one routing state.
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProxyConfig,
    state: ArcSwap<Compiled>,
    publisher: Mutex<Publisher>,
    clients: upstream::client::Clients,
    /// Rate limiters, kept across publishes.
    limiters: LimiterCache,
    /// The self-signed certificate served when the table names no default one; generated when
    /// the first TLS listener starts.
    fallback_cert: OnceLock<Arc<rustls::sign::CertifiedKey>>,
    /// The access-log writer, started with the first line.
    access_log: Arc<accesslog::Writer>,
    /// Set once the task closing idle upstream connections runs (with the first listener).
    sweeping: std::sync::atomic::AtomicBool,
    /// Pooled upstream connections that gave their buffers back so far.
    pool_buffers_released: std::sync::atomic::AtomicU64,
    /// TLS sessions for resumption, shared by the server configs without client
    /// authentication and kept across publishes.
    sessions: Arc<crate::tls::sessions::SessionCache>,
    /// Client connections admitted, shared by every listener.
    conns: Arc<limits::ConnLimits>,
    /// Session tickets (`ssl-session-tickets`), shared as `sessions` is.
    tickets: Arc<crate::tls::tickets::Tickets>,
    /// OCSP staples of the live certificates (`enable-ocsp`).
    stapler: crate::tls::ocsp::Stapler,
    /// The span exporter and its counters, kept across publishes.
    tracer: crate::trace::Tracer,
    /// Idle connections parked now, over every plain listener (`park`).
    parked: std::sync::atomic::AtomicUsize,
}

/// The `ssl-protocols` and `ssl-ciphers` (TLS 1.2 suites) a server TLS config offers, and its
/// `ssl-ecdh-curve` groups and `ssl-buffer-size`.
type TlsChoice = (Vec<crate::model::TlsVersion>, Vec<String>, crate::tls::options::Choice);

/// Only touched by `publish`, serialized by its mutex.
#[derive(Default)]
struct Publisher {
    certs: CertCache,
    last_version: u64,
    /// The TLS config of the last `ssl-protocols` and `ssl-ciphers`, kept (with its session
    /// cache) while they stay.
    tls: Option<(TlsChoice, Arc<rustls::ServerConfig>)>,
    /// The client certificate policies of the last table, kept (with their configs' session
    /// caches) while what they are built from stays.
    client_auth: Option<(ClientAuthChoice, Arc<ClientAuthIndex>)>,
}

/// What a [`ClientAuthIndex`] is built from: the policies, the hosts' own TLS options, the
/// listener's protocols, suites, groups and record size, and (when the table has Gateway
/// listeners) the TLS entries that say which name belongs to which listener.
type ClientAuthChoice = (
    Vec<crate::model::ClientAuth>,
    Vec<crate::model::HostTls>,
    Option<Vec<crate::model::TlsVersion>>,
    Option<Vec<String>>,
    crate::tls::options::Choice,
    Vec<crate::model::TlsEntry>,
);

/// Everything a request needs, built together and swapped together.
struct Compiled {
    version: u64,
    router: Router,
    /// Indexed by [`crate::state::balance::BackendIdx`].
    balancers: Vec<Arc<Balancer>>,
    /// SNI → certificate.
    certs: CertIndex,
    /// SNI → passthrough backend (an index into `balancers`).
    passthrough: PassIndex,
    /// Host → client certificate policy.
    client_auth: Arc<ClientAuthIndex>,
    /// Server configs of hosts with their own cipher suites or preference.
    host_tls: crate::tls::hosts::HostTlsIndex,
    /// Name → Gateway HTTPS listener, for misdirected requests (empty without listeners).
    listeners: crate::tls::listeners::ListenerIndex,
    /// The proxy's configuration with the table's settings applied.
    config: ProxyConfig,
    /// How client connections speak HTTP (keep-alive per `config`).
    http: Arc<HttpBuilder>,
    /// The TLS config offering the table's `ssl-protocols`; `None`: the listener's own.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// The TLS config of relayed names ([`crate::model::Passthrough::relay`]): the table's,
    /// without ALPN; `None` when the table relays nothing.
    relay_tls: Option<Arc<rustls::ServerConfig>>,
    /// How long a relayed TLS connection may stay idle (`proxy-stream-timeout`).
    stream_idle: Duration,
    /// The request metrics' label sets, by route handle id and backend index.
    metrics: crate::metrics::Live,
    /// The access log's writer (the proxy's one).
    log: Arc<accesslog::Writer>,
    /// OpenTelemetry tracing (`enable-opentelemetry`, `otlp-collector-host`...); `None`: off.
    tracing: Option<Arc<crate::trace::Pipeline>>,
}

/// Picks the certificate of each handshake from the live table (so a publish rotates it), else
/// the self-signed fallback. Holds the proxy weakly: compiled configs refer to it.
#[derive(Debug)]
pub(crate) struct LiveResolver(std::sync::Weak<Inner>);

impl rustls::server::ResolvesServerCert for LiveResolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let inner = self.0.upgrade()?;
        let state = inner.state.load();
        if state.certs.rejects(hello.server_name()) {
            return None; // `ssl-reject-handshake`: rustls ends the handshake with an alert
        }
        // Of a name's several certificates, the first whose key signs with a scheme the client
        // offers.
        let key = state
            .certs
            .resolve_for(hello.server_name(), Some(hello.signature_schemes()))
            .or_else(|| inner.fallback_cert.get().cloned())?;
        Some(inner.stapler.staple(key))
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").finish_non_exhaustive()
    }
}

/// TLS passthrough hosts of a table, by SNI.
#[derive(Default)]
struct PassIndex {
    exact: std::collections::HashMap<String, PassTarget>,
    /// Keyed by the suffix after `*.`.
    wildcard: std::collections::HashMap<String, PassTarget>,
    /// Gateway API `*.suffix` names (one or more labels in front), longest first.
    suffix: Vec<(String, PassTarget)>,
}

/// Where a passthrough host's connections go.
#[derive(Clone)]
enum PassTarget {
    /// One backend (an index into `balancers`).
    One(usize),
    /// A weighted choice per connection (TLSRoute `backendRefs`).
    Split(Arc<crate::route::split::CompiledSplit>),
    /// Terminated, not passed through (a more specific HTTPS listener's name).
    Terminate,
    /// Terminated, then relayed as plain TCP to a weighted choice per connection (a TLSRoute
    /// on a Gateway `TLS` listener with `tls.mode: Terminate`).
    Relay(Arc<crate::route::split::CompiledSplit>),
}

/// Where the SNI lookup sends a connection (each holds the backend drawn for it: an index into
/// `balancers`, `None` for a share without backend, whose connection is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Spliced undecrypted.
    Splice(Option<usize>),
    /// Terminated here, then relayed as plain TCP.
    Relay(Option<usize>),
}

impl PassIndex {
    fn compile(table: &RouteTable, router: &Router) -> PassIndex {
        let mut index = PassIndex::default();
        // The weighted shares of an entry: its split, else its one backend.
        let shares = |pass: &crate::model::Passthrough| -> Arc<crate::route::split::CompiledSplit> {
            let index_of =
                |b: &Option<crate::model::BackendId>| b.as_ref().and_then(|b| router.backend_index(b));
            let shares: Vec<_> = match pass.split.is_empty() {
                true => vec![(index_of(&pass.backend), 1)],
                false => pass.split.iter().map(|s| (index_of(&s.backend), s.weight)).collect(),
            };
            Arc::new(crate::route::split::CompiledSplit::new(shares))
        };
        for pass in &table.passthrough {
            let target = if pass.terminate {
                PassTarget::Terminate
            } else if pass.relay {
                PassTarget::Relay(shares(pass))
            } else if pass.split.is_empty() {
                // No backend: every connection is refused.
                let backend = pass.backend.as_ref();
                let idx = backend.and_then(|b| router.backend_index(b)).map(|i| i.0 as usize);
                match (idx, backend) {
                    (Some(idx), _) => PassTarget::One(idx),
                    (None, Some(backend)) => {
                        tracing::warn!(host = %pass.host, %backend, "passthrough backend has no route; host ignored");
                        continue;
                    }
                    (None, None) => PassTarget::Split(Arc::new(crate::route::split::CompiledSplit::new([]))),
                }
            } else {
                PassTarget::Split(shares(pass))
            };
            match &pass.host {
                HostMatch::Exact(h) => drop(index.exact.entry(h.clone()).or_insert(target)),
                HostMatch::Wildcard(s) => drop(index.wildcard.entry(s.clone()).or_insert(target)),
                HostMatch::Suffix(s) => {
                    if !index.suffix.iter().any(|(have, _)| have == s) {
                        index.suffix.push((s.clone(), target));
                    }
                }
                HostMatch::Any => {}
            }
        }
        index.suffix.sort_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        index
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.suffix.is_empty()
    }

    /// What to do with a connection for an SNI name (lower case): exact, one-label wildcard,
    /// then the longest Gateway API suffix; a weighted split draws the backend. `None`:
    /// terminated and served as HTTPS.
    fn lookup(&self, sni: &str) -> Option<Pass> {
        let target = self.exact.get(sni).or_else(|| {
            let (_, suffix) = sni.split_once('.')?;
            self.wildcard.get(suffix)
        });
        let target = target.or_else(|| {
            self.suffix.iter().find(|(s, _)| HostMatch::Suffix(s.clone()).matches(sni)).map(|(_, t)| t)
        })?;
        Some(match target {
            PassTarget::Terminate => return None,
            PassTarget::One(idx) => Pass::Splice(Some(*idx)),
            PassTarget::Split(split) => Pass::Splice(split.pick(rand::random()).map(|i| i.0 as usize)),
            PassTarget::Relay(split) => Pass::Relay(split.pick(rand::random()).map(|i| i.0 as usize)),
        })
    }
}

// === impl Proxy ===

impl Proxy {
    /// A proxy with an empty table: every request gets 404 until the first [`Proxy::publish`].
    pub fn new(config: ProxyConfig) -> Proxy {
        let clients = upstream::client::Clients::new(Exchange::of(&config));
        let access_log = Arc::new(accesslog::Writer::new(&config.access_log_output, config.access_log_queue));
        let empty = Compiled {
            version: 0,
            router: Router::default(),
            balancers: Vec::new(),
            certs: CertIndex::default(),
            passthrough: PassIndex::default(),
            client_auth: Arc::default(),
            host_tls: crate::tls::hosts::HostTlsIndex::default(),
            listeners: crate::tls::listeners::ListenerIndex::default(),
            http: Arc::new(http_builder(&config)),
            config: config.clone(),
            tls: None,
            relay_tls: None,
            stream_idle: crate::model::Settings::default().stream_timeout(),
            metrics: crate::metrics::Live::default(),
            log: access_log.clone(),
            tracing: None,
        };
        let conns = Arc::new(limits::ConnLimits::new(config.connection_limits));
        let limiters = LimiterCache::default();
        limiters.metrics().configure(config.metrics);
        Proxy {
            inner: Arc::new(Inner {
                conns,
                config,
                state: ArcSwap::from_pointee(empty),
                publisher: Mutex::new(Publisher::default()),
                clients,
                limiters,
                fallback_cert: OnceLock::new(),
                access_log,
                sweeping: std::sync::atomic::AtomicBool::new(false),
                pool_buffers_released: std::sync::atomic::AtomicU64::new(0),
                sessions: Arc::new(crate::tls::sessions::SessionCache::default()),
                tickets: Arc::new(crate::tls::tickets::Tickets::new()),
                stapler: crate::tls::ocsp::Stapler::default(),
                tracer: crate::trace::Tracer::default(),
                parked: Default::default(),
            }),
        }
    }

    /// Compiles `table` and makes it the live table; returns the version stamped on it.
    /// On error the live table is unchanged. Requests in flight finish on the table they started
    /// with; balancer state of backends that still exist is carried over.
    pub fn publish(&self, table: RouteTable) -> Result<u64, CompileError> {
        self.publish_changes(&table, None)
    }

    /// [`Proxy::publish`] for a table that differs from the live one only in `changes` (`None`:
    /// in anything): only the virtual hosts and backends named are compiled again, the rest is
    /// shared with the live state.
    pub fn publish_changes(
        &self,
        table: &RouteTable,
        changes: Option<&TableChanges>,
    ) -> Result<u64, CompileError> {
        let config = self.inner.config.with_settings(&table.settings);
        self.inner.access_log.retarget(&config.access_log_output);
        let http = Arc::new(http_builder(&config));
        // Serializes publishers (versions stay monotonic, registry updates don't interleave);
        // requests never take this lock.
        let mut publisher = self.inner.publisher.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let live = self.inner.state.load_full();
        let version = publisher.last_version + 1;
        // Each backend's balancer starts from its balancer in the live table, if any.
        let previous =
            |id: &BackendId| live.router.backend_index(id).and_then(|i| live.balancers.get(i.0 as usize));
        let next = |id: &BackendId| {
            Arc::new(match table.backends.get(id) {
                Some(backend) => Balancer::next(previous(id).map(|b| &**b), id, backend),
                None => Balancer::empty(),
            })
        };
        let (router, balancers) = match changes {
            Some(changes) if live.version != 0 => {
                let router = live.router.update(table, changes, &self.inner.limiters)?;
                let mut balancers = live.balancers.clone();
                balancers.resize_with(router.backend_ids().len(), || Arc::new(Balancer::empty()));
                // Gone backends first: a new one may take the index of a gone one.
                let (gone, present): (Vec<&BackendId>, Vec<&BackendId>) =
                    changes.backends.iter().partition(|id| router.backend_index(id).is_none());
                let slots = gone.iter().filter_map(|id| Some((live.router.backend_index(id)?, *id)));
                let slots =
                    slots.chain(present.iter().filter_map(|id| Some((router.backend_index(id)?, *id))));
                for (index, id) in slots.collect::<Vec<_>>() {
                    if let Some(slot) = balancers.get_mut(index.0 as usize) {
                        *slot = next(id);
                    }
                }
                (router, balancers)
            }
            _ => {
                let router = Router::compile_with(table, &self.inner.limiters)?;
                let balancers = router.backend_ids().iter().map(next).collect();
                (router, balancers)
            }
        };
        let certs = CertIndex::compile(table, &mut publisher.certs);
        self.inner.stapler.track(certs.keys(), table.settings.tls_keys.ocsp == Some(true));
        let passthrough = PassIndex::compile(table, &router);
        let client_auth = self.client_auth(table, &mut publisher);
        let host_tls = if table.host_tls.is_empty() {
            crate::tls::hosts::HostTlsIndex::default()
        } else {
            crate::tls::hosts::HostTlsIndex::compile(table, |settings| self.server_config(settings))
        };
        let listeners = crate::tls::listeners::ListenerIndex::compile(table);
        self.configure_sessions(&table.settings);
        let tls = self.tls_config(&table.settings, &mut publisher);
        let relay_tls = self.relay_tls_config(table);
        let metrics = self.inner.limiters.metrics().live(router.backend_ids());
        let tracing = self.inner.tracer.pipeline(table.settings.otel.as_ref());
        self.inner.state.store(Arc::new(Compiled {
            version,
            router,
            balancers,
            certs,
            passthrough,
            client_auth,
            host_tls,
            listeners,
            config,
            http,
            tls,
            relay_tls,
            stream_idle: table.settings.stream_timeout(),
            metrics,
            log: self.inner.access_log.clone(),
            tracing,
        }));
        drop(live);
        self.inner.clients.prune();
        publisher.last_version = version;
        tracing::debug!(
            version,
            hosts = table.hosts.len(),
            backends = table.backends.len(),
            "published route table"
        );
        Ok(version)
    }

    /// Starts the task that closes upstream connections idle for longer than
    /// [`ProxyConfig::pool_idle_timeout`] (once per proxy; it ends with the proxy).
    fn start_pool_sweeper(&self) {
        if self.inner.sweeping.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // Idle connections close between the timeout and the timeout plus half of it; the
        // timeout is the live table's (`upstream-keepalive-timeout`).
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let every = match inner.upgrade() {
                    Some(inner) => (inner.state.load().config.pool_idle_timeout / 2)
                        .clamp(Duration::from_millis(10), Duration::from_secs(10)),
                    None => return,
                };
                tokio::time::sleep(every).await;
                let Some(inner) = inner.upgrade() else { return };
                let state = inner.state.load();
                let released = inner.clients.sweep(&state.balancers, state.config.pool_idle_timeout);
                inner.pool_buffers_released.fetch_add(released, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }

    /// The live certificate resolver.
    pub(crate) fn resolver(&self) -> Arc<dyn rustls::server::ResolvesServerCert> {
        Arc::new(LiveResolver(Arc::downgrade(&self.inner)))
    }

    /// The version of the live table (0 before the first publish).
    pub fn version(&self) -> u64 {
        self.inner.state.load().version
    }

    /// The configuration this proxy was built with.
    pub fn config(&self) -> &ProxyConfig {
        &self.inner.config
    }

    /// Client connections open now and refused so far by the connection limits.
    pub fn connection_stats(&self) -> limits::ConnStats {
        self.inner.conns.stats()
    }

    /// The connection limits every listener admits under (the L4 listeners too).
    pub(crate) fn connection_limits(&self) -> Arc<limits::ConnLimits> {
        self.inner.conns.clone()
    }

    /// The request metrics, for a scrape ([`crate::metrics::Registry::collect`]).
    pub fn metrics(&self) -> &Arc<crate::metrics::Registry> {
        self.inner.limiters.metrics()
    }

    /// The access log's writer: its dropped lines, and reopening its file (`SIGUSR1`).
    pub fn access_log(&self) -> &accesslog::Writer {
        &self.inner.access_log
    }

    /// Idle keep-alive connections parked now, held by no task (`--http1-server weir`).
    pub fn parked_connections(&self) -> usize {
        self.inner.parked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Idle pooled upstream connections that gave their buffers back so far (the pool's sweep
    /// does that once a connection has been idle for a second): memory the allocator can then
    /// return to the system.
    pub fn pool_buffers_released(&self) -> u64 {
        self.inner.pool_buffers_released.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Spans exported and dropped so far (OpenTelemetry tracing).
    pub fn trace_counts(&self) -> crate::trace::export::TraceCounts {
        self.inner.tracer.counts()
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("version", &self.version()).finish_non_exhaustive()
    }
}
