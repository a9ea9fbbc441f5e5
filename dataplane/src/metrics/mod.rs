//! Request metrics: counters and histograms kept per route, resolved when a table is compiled,
//! recorded on the request path without allocation, lock or shared cache-line write, summed at
//! scrape.
//!
//! Each route of a compiled table holds a [`RouteHandle`] (an index into the [`Live`] list its
//! table carries, and a liveness token). A route's [`RouteStats`] is split in shards, one per
//! group of threads (a thread-local index picks one); a shard's block is allocated on the first
//! request that thread serves for the route, padded to cache lines, and written only with
//! relaxed atomic adds. A scrape ([`Registry::collect`]) sums the shards.
//!
//! Counters of a route that leaves the table survive until the next scrape: the registry keeps
//! every entry whose token is gone until a scrape has reported it once.
//!
//! Labels are fixed per route (namespace, Ingress, Service, path rule, host, canary); per request
//! only the method (nine slots), the status (a slot per common code, else per class) and the
//! status class index the counters.

pub mod certs;
pub mod shard;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::model::{BackendId, HostMatch, PathMatch};
use shard::{Hist, Shards};

/// Upper bounds of the duration histograms, in seconds (Prometheus' and ingress-nginx's
/// default buckets).
pub const DURATION_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Upper bounds of the size histograms, in bytes (ingress-nginx's `--size-buckets`).
pub const SIZE_BUCKETS: [f64; 7] = [10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7];

/// The same bounds as integers (nanoseconds; bytes), compared on the request path.
const DURATION_BOUNDS_NS: [u64; 11] = [
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];
const SIZE_BOUNDS: [u64; 7] = [10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// Methods counted apart; any other counts as `OTHER`.
pub const METHODS: [&str; 9] =
    ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "OTHER"];

/// Status codes counted apart; any other counts under its class (`2xx`, …), as ingress-nginx's
/// `--report-status-classes` does for every code.
pub const CODES: [u16; 38] = [
    100, 101, 200, 201, 202, 204, 206, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 406, 408, 409,
    410, 411, 413, 414, 415, 421, 429, 431, 494, 495, 496, 499, 500, 501, 502, 503, 504,
];
/// Status classes (histograms are kept per class).
pub const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// Status slots: [`CODES`], then one per class.
pub const STATUS_SLOTS: usize = CODES.len() + CLASSES.len();

/// The slot of each status code 0..600.
static STATUS_SLOT: [u8; 600] = status_slots();

const fn status_slots() -> [u8; 600] {
    let mut table = [0u8; 600];
    let mut code = 0;
    while code < 600 {
        let class = if code < 200 { 0 } else { code / 100 - 1 };
        table[code] = (CODES.len() + class) as u8;
        code += 1;
    }
    let mut i = 0;
    while i < CODES.len() {
        table[CODES[i] as usize] = i as u8;
        i += 1;
    }
    table
}

/// The label of status slot `slot`.
pub fn status_label(slot: usize) -> String {
    match CODES.get(slot) {
        Some(code) => code.to_string(),
        None => CLASSES.get(slot - CODES.len()).copied().unwrap_or("5xx").to_string(),
    }
}

/// The slot of `method` in [`METHODS`].
pub fn method_slot(method: &http::Method) -> u8 {
    match *method {
        http::Method::GET => 0,
        http::Method::HEAD => 1,
        http::Method::POST => 2,
        http::Method::PUT => 3,
        http::Method::DELETE => 4,
        http::Method::PATCH => 5,
        http::Method::OPTIONS => 6,
        http::Method::CONNECT => 7,
        _ => 8,
    }
}

/// The slot of a status in [`CODES`] or its class, and its class index.
fn status_slot(status: u16) -> (usize, usize) {
    let code = usize::from(status).clamp(100, 599);
    let class = if code < 200 { 0 } else { code / 100 - 1 };
    (STATUS_SLOT[code] as usize, class)
}

/// What a route's metrics are labelled with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteLabels {
    /// The Ingress's namespace (empty for requests no route took).
    pub namespace: String,
    /// The Ingress's name.
    pub ingress: String,
    /// The Service of the route's backend.
    pub service: String,
    /// The matched rule's path as written (never the request's).
    pub path: String,
    /// The virtual host (`*.example.com` for a wildcard, empty for any host), when metrics are
    /// kept per host.
    pub host: String,
    /// The canary backend (`namespace-service-port`) when the canary answered, else empty.
    pub canary: String,
}

impl RouteLabels {
    /// The labels of a route of `host` with `path` from `origin`, forwarding to `backend`.
    pub fn of(
        origin: Option<&crate::model::ObjectRef>,
        backend: &BackendId,
        host: Option<&HostMatch>,
        path: Option<&PathMatch>,
    ) -> Self {
        RouteLabels {
            namespace: origin.map_or_else(|| backend.namespace.clone(), |o| o.namespace.clone()),
            ingress: origin.map(|o| o.name.clone()).unwrap_or_default(),
            service: backend.service.clone(),
            path: match path {
                Some(PathMatch::Exact(p) | PathMatch::Prefix(p) | PathMatch::Regex(p)) => p.clone(),
                None => String::new(),
            },
            host: match host {
                Some(HostMatch::Exact(h)) => h.clone(),
                Some(HostMatch::Wildcard(s) | HostMatch::Suffix(s)) => format!("*.{s}"),
                Some(HostMatch::Any) | None => String::new(),
            },
            canary: String::new(),
        }
    }
}

/// The upstream name of a canary backend, as ingress-nginx labels it.
pub fn canary_name(backend: &BackendId) -> String {
    format!("{}-{}-{}", backend.namespace, backend.service, backend.port)
}

/// What one finished request adds.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// [`method_slot`] of the request's method.
    pub method: u8,
    /// The status sent.
    pub status: u16,
    /// From the request head to the last byte of the response (or the client going away).
    pub duration: Duration,
    /// From sending to the upstream to its response head, when an upstream answered.
    pub upstream: Option<Duration>,
    /// The request's size: head and body.
    pub request_bytes: u64,
    /// Bytes sent for the response: head and body.
    pub response_bytes: u64,
}

/// The histograms of one status class in one shard.
#[derive(Default)]
pub(crate) struct ClassHists {
    duration: Hist<12>,
    upstream: Hist<12>,
    request_size: Hist<8>,
    response_size: Hist<8>,
}

/// One shard of a route's counters.
pub(crate) struct RouteShard {
    requests: [[AtomicU64; STATUS_SLOTS]; METHODS.len()],
    classes: [ClassHists; CLASSES.len()],
}

impl Default for RouteShard {
    fn default() -> Self {
        RouteShard {
            requests: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            classes: Default::default(),
        }
    }
}

/// The counters of one label set.
pub struct RouteStats {
    labels: RouteLabels,
    shards: Shards<RouteShard>,
}

impl std::fmt::Debug for RouteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteStats").field("labels", &self.labels).finish_non_exhaustive()
    }
}

impl RouteStats {
    fn new(labels: RouteLabels) -> Self {
        RouteStats { labels, shards: Shards::new() }
    }

    /// The labels.
    pub fn labels(&self) -> &RouteLabels {
        &self.labels
    }

    /// Adds one request (the calling thread's shard).
    pub fn record(&self, r: &Record) {
        let local = self.shards.local_owned();
        let (slot, class) = status_slot(r.status);
        let method = usize::from(r.method).min(METHODS.len() - 1);
        local.add(&local.shard.requests[method][slot], 1);
        let hists = &local.shard.classes[class];
        let ns = u64::try_from(r.duration.as_nanos()).unwrap_or(u64::MAX);
        local.observe(&hists.duration, &DURATION_BOUNDS_NS, ns);
        if let Some(up) = r.upstream {
            local.observe(
                &hists.upstream,
                &DURATION_BOUNDS_NS,
                u64::try_from(up.as_nanos()).unwrap_or(u64::MAX),
            );
        }
        local.observe(&hists.request_size, &SIZE_BOUNDS, r.request_bytes);
        local.observe(&hists.response_size, &SIZE_BOUNDS, r.response_bytes);
    }

    /// The sums over every shard.
    pub fn sample(&self) -> RouteSample {
        let mut requests = Vec::new();
        let mut classes: [ClassSample; CLASSES.len()] = Default::default();
        for method in 0..METHODS.len() {
            for slot in 0..STATUS_SLOTS {
                let n: u64 =
                    self.shards.iter().map(|s| s.requests[method][slot].load(Ordering::Relaxed)).sum();
                if n > 0 {
                    requests.push((method, slot, n));
                }
            }
        }
        for (class, out) in classes.iter_mut().enumerate() {
            for shard in self.shards.iter() {
                let h = &shard.classes[class];
                out.duration.add(&h.duration);
                out.upstream.add(&h.upstream);
                out.request_size.add(&h.request_size);
                out.response_size.add(&h.response_size);
            }
        }
        RouteSample { labels: self.labels.clone(), requests, classes }
    }
}

/// A histogram summed at scrape: counts per bucket (not cumulative, the last is `+Inf`) and the
/// sum in the recorded unit (nanoseconds or bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistSample<const B: usize> {
    /// Observations per bucket.
    pub counts: [u64; B],
    /// Sum of the observations.
    pub sum: u64,
}

impl<const B: usize> Default for HistSample<B> {
    fn default() -> Self {
        HistSample { counts: [0; B], sum: 0 }
    }
}

impl<const B: usize> HistSample<B> {
    fn add(&mut self, h: &Hist<B>) {
        for (out, c) in self.counts.iter_mut().zip(h.counts.iter()) {
            *out += c.load(Ordering::Relaxed);
        }
        self.sum += h.sum.load(Ordering::Relaxed);
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// The histograms of one status class.
#[derive(Clone, Debug, Default)]
pub struct ClassSample {
    /// Request duration to the last byte (nanoseconds).
    pub duration: HistSample<12>,
    /// Upstream response time to the head (nanoseconds).
    pub upstream: HistSample<12>,
    /// Request sizes (bytes).
    pub request_size: HistSample<8>,
    /// Response sizes (bytes sent).
    pub response_size: HistSample<8>,
}

/// One label set's figures at a scrape.
#[derive(Clone, Debug)]
pub struct RouteSample {
    /// Its labels.
    pub labels: RouteLabels,
    /// Requests by ([`METHODS`] slot, status slot), non-zero only.
    pub requests: Vec<(usize, usize, u64)>,
    /// Histograms per status class ([`CLASSES`]).
    pub classes: [ClassSample; CLASSES.len()],
}

/// Keeps a route's registry entry alive: held by the compiled routes.
#[derive(Debug)]
struct Token;

/// A compiled route's metrics: the indexes of its label sets in [`Live::routes`].
#[derive(Clone, Debug)]
pub struct RouteHandle {
    /// The route's own.
    pub id: u32,
    /// Where requests the canary answers count.
    pub canary: Option<u32>,
    _tokens: (Arc<Token>, Option<Arc<Token>>),
}

/// Per-backend counters.
#[derive(Default)]
pub struct BackendShard {
    connect_errors: AtomicU64,
    connect_timeouts: AtomicU64,
    response_timeouts: AtomicU64,
    retries: AtomicU64,
}

/// The upstream failures of one backend.
pub struct BackendStats {
    id: BackendId,
    shards: Shards<BackendShard>,
    /// Not in the live table any more: dropped after the next scrape.
    retired: AtomicBool,
}

/// What happened with an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// A connection could not be made.
    ConnectError,
    /// Connecting timed out.
    ConnectTimeout,
    /// The response head did not come in time.
    ResponseTimeout,
    /// The request went to another endpoint.
    Retry,
}

impl BackendStats {
    fn new(id: BackendId) -> Self {
        BackendStats { id, shards: Shards::new(), retired: AtomicBool::new(false) }
    }

    /// Counts one event.
    pub fn count(&self, event: UpstreamEvent) {
        let s = self.shards.local();
        let c = match event {
            UpstreamEvent::ConnectError => &s.connect_errors,
            UpstreamEvent::ConnectTimeout => &s.connect_timeouts,
            UpstreamEvent::ResponseTimeout => &s.response_timeouts,
            UpstreamEvent::Retry => &s.retries,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn sample(&self) -> BackendSample {
        let sum = |f: fn(&BackendShard) -> &AtomicU64| -> u64 {
            self.shards.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
        };
        BackendSample {
            id: self.id.clone(),
            connect_errors: sum(|s| &s.connect_errors),
            connect_timeouts: sum(|s| &s.connect_timeouts),
            response_timeouts: sum(|s| &s.response_timeouts),
            retries: sum(|s| &s.retries),
        }
    }
}

/// One backend's upstream failures at a scrape.
#[derive(Clone, Debug)]
pub struct BackendSample {
    /// The backend.
    pub id: BackendId,
    /// Connections refused or failed.
    pub connect_errors: u64,
    /// Connections that timed out.
    pub connect_timeouts: u64,
    /// Response heads that did not come in time.
    pub response_timeouts: u64,
    /// Requests sent to another endpoint.
    pub retries: u64,
}

/// TLS versions counted apart.
pub const TLS_VERSIONS: [&str; 3] = ["TLSv1.2", "TLSv1.3", "unknown"];

/// Handshakes by version and result, and downstream connections by listener and protocol.
#[derive(Default)]
pub struct ConnShard {
    /// Handshakes that succeeded, by [`TLS_VERSIONS`].
    tls_ok: [AtomicU64; 3],
    /// Handshakes that failed.
    tls_failed: AtomicU64,
    /// Connections opened and closed, by [`Listener`].
    opened: [AtomicU64; 3],
    closed: [AtomicU64; 3],
}

/// Which listener and protocol a client connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The plain listener (HTTP/1.1 or h2c prior knowledge).
    Http,
    /// The TLS listener, HTTP/1.1.
    HttpsH1,
    /// The TLS listener, HTTP/2 (ALPN).
    HttpsH2,
}

/// `(listener, protocol)` label values of each [`Listener`].
pub const LISTENERS: [(&str, &str); 3] = [("http", "cleartext"), ("https", "http/1.1"), ("https", "h2")];

/// Counts a connection open until dropped.
#[derive(Debug)]
pub struct OpenConn {
    registry: Arc<Registry>,
    listener: usize,
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.registry.conns.local().closed[self.listener].fetch_add(1, Ordering::Relaxed);
    }
}

impl OpenConn {
    /// Ends the guard with its connection still counted open, for a parked connection's record,
    /// which holds no guard (`proxy::park`): [`Registry::resume_parked`] makes a guard of it
    /// again, [`Registry::close_parked`] counts it closed.
    pub(crate) fn into_parked(self) {
        // Counted opened once more here, closed once more as `self` drops: open still.
        self.registry.conns.local().opened[self.listener].fetch_add(1, Ordering::Relaxed);
    }
}

impl Registry {
    /// The guard of a parked connection resumed ([`OpenConn::into_parked`]): counted open since.
    pub(crate) fn resume_parked(self: &Arc<Self>, listener: Listener) -> OpenConn {
        OpenConn { registry: self.clone(), listener: listener as usize }
    }

    /// Counts closed a parked connection ([`OpenConn::into_parked`]).
    pub(crate) fn close_parked(&self, listener: Listener) {
        self.conns.local().closed[listener as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Connection figures at a scrape.
#[derive(Clone, Debug, Default)]
pub struct ConnSample {
    /// Handshakes that succeeded, by [`TLS_VERSIONS`].
    pub tls_ok: [u64; 3],
    /// Handshakes that failed.
    pub tls_failed: u64,
    /// Connections open, by [`LISTENERS`].
    pub open: [u64; 3],
}

/// Everything a scrape reads.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Per label set, sorted by labels.
    pub routes: Vec<RouteSample>,
    /// Per backend, sorted.
    pub backends: Vec<BackendSample>,
    /// Connections and handshakes.
    pub conns: ConnSample,
    /// Whether label sets carry the host.
    pub per_host: bool,
}

/// The label sets a compiled table records into, indexed by [`RouteHandle`] ids and by
/// backend index.
#[derive(Clone, Debug, Default)]
pub struct Live {
    routes: Arc<[Arc<RouteStats>]>,
    backends: Arc<[Arc<BackendStats>]>,
}

impl std::fmt::Debug for BackendStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendStats").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Live {
    /// The label set of id `id` (`0`: requests no route took).
    pub fn route(&self, id: u32) -> Option<&RouteStats> {
        self.routes.get(id as usize).map(|s| &**s)
    }

    /// The counters of backend index `idx`.
    pub fn backend(&self, idx: u32) -> Option<&BackendStats> {
        self.backends.get(idx as usize).map(|s| &**s)
    }
}

/// Settings of the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Record request metrics at all.
    pub enabled: bool,
    /// Label request metrics with the virtual host (ingress-nginx `--metrics-per-host`).
    pub per_host: bool,
    /// Distinct hosts labelled at most; routes of further hosts get an empty host label.
    pub max_hosts: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { enabled: true, per_host: true, max_hosts: 1000 }
    }
}

struct Entry {
    stats: Arc<RouteStats>,
    token: Weak<Token>,
    /// Held by the registry itself (the unrouted entry).
    pinned: Option<Arc<Token>>,
}

#[derive(Default)]
struct Entries {
    routes: Vec<Option<Entry>>,
    by_labels: HashMap<RouteLabels, u32>,
    free: Vec<u32>,
    hosts: HashSet<String>,
    /// The routes list changed since [`Registry::live`] last built one.
    dirty: bool,
    live_routes: Option<Arc<[Arc<RouteStats>]>>,
    backends: HashMap<BackendId, Arc<BackendStats>>,
}

/// Every label set with counters: kept across table swaps, so counts carry over.
pub struct Registry {
    config: std::sync::RwLock<MetricsConfig>,
    entries: Mutex<Entries>,
    conns: Shards<ConnShard>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Default for Registry {
    fn default() -> Self {
        let registry = Registry {
            config: std::sync::RwLock::new(MetricsConfig::default()),
            entries: Mutex::new(Entries::default()),
            conns: Shards::new(),
        };
        // Id 0: requests that no route took (404, a bad host).
        {
            let mut entries = registry.lock();
            let token = Arc::new(Token);
            entries.routes.push(Some(Entry {
                stats: Arc::new(RouteStats::new(RouteLabels::default())),
                token: Arc::downgrade(&token),
                pinned: Some(token),
            }));
            entries.by_labels.insert(RouteLabels::default(), 0);
            entries.dirty = true;
        }
        registry
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `config` to label sets made from now on.
    pub fn configure(&self, config: MetricsConfig) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// The settings.
    pub fn config(&self) -> MetricsConfig {
        *self.config.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle of a route with `labels` (and its canary's, `canary`): the live entries when
    /// they exist, else new ones.
    pub fn route(&self, mut labels: RouteLabels, canary: Option<&BackendId>) -> RouteHandle {
        let config = self.config();
        let mut entries = self.lock();
        if !config.per_host {
            labels.host.clear();
        } else if !labels.host.is_empty() && !entries.hosts.contains(&labels.host) {
            if entries.hosts.len() >= config.max_hosts {
                labels.host.clear();
            } else {
                entries.hosts.insert(labels.host.clone());
            }
        }
        let canary = canary.map(|backend| {
            let labels = RouteLabels { canary: canary_name(backend), ..labels.clone() };
            entries.entry(labels)
        });
        let (id, token) = entries.entry(labels);
        let (canary, canary_token) = canary.map_or((None, None), |(id, token)| (Some(id), Some(token)));
        RouteHandle { id, canary, _tokens: (token, canary_token) }
    }

    /// The list a table compiled now records into, with the backend counters indexed as
    /// `backends`. Backends not in it are retired (reported at the next scrape, then dropped).
    pub fn live(&self, backends: &[BackendId]) -> Live {
        let mut entries = self.lock();
        if entries.dirty || entries.live_routes.is_none() {
            let empty = Arc::new(RouteStats::new(RouteLabels::default()));
            let routes: Vec<Arc<RouteStats>> = entries
                .routes
                .iter()
                .map(|e| e.as_ref().map_or_else(|| empty.clone(), |e| e.stats.clone()))
                .collect();
            entries.live_routes = Some(routes.into());
            entries.dirty = false;
        }
        for stats in entries.backends.values() {
            stats.retired.store(true, Ordering::Relaxed);
        }
        let backends: Vec<Arc<BackendStats>> = backends
            .iter()
            .map(|id| {
                let stats = entries
                    .backends
                    .entry(id.clone())
                    .or_insert_with(|| Arc::new(BackendStats::new(id.clone())));
                stats.retired.store(false, Ordering::Relaxed);
                stats.clone()
            })
            .collect();
        Live {
            routes: entries.live_routes.clone().unwrap_or_else(|| Arc::new([])),
            backends: backends.into(),
        }
    }

    /// Counts a client connection open until the returned guard drops.
    pub fn open_conn(self: &Arc<Self>, listener: Listener) -> OpenConn {
        let listener = listener as usize;
        self.conns.local().opened[listener].fetch_add(1, Ordering::Relaxed);
        OpenConn { registry: self.clone(), listener }
    }

    /// Counts a TLS handshake: its version when it succeeded, `None` when it failed.
    pub fn tls_handshake(&self, version: Option<rustls::ProtocolVersion>) {
        let shard = self.conns.local();
        match version {
            None => shard.tls_failed.fetch_add(1, Ordering::Relaxed),
            Some(rustls::ProtocolVersion::TLSv1_2) => shard.tls_ok[0].fetch_add(1, Ordering::Relaxed),
            Some(rustls::ProtocolVersion::TLSv1_3) => shard.tls_ok[1].fetch_add(1, Ordering::Relaxed),
            Some(_) => shard.tls_ok[2].fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Sums every label set; those whose routes are gone are reported this once, then dropped.
    pub fn collect(&self) -> Sample {
        let config = self.config();
        let mut entries = self.lock();
        let mut routes = Vec::new();
        let mut gone = Vec::new();
        for (id, entry) in entries.routes.iter().enumerate() {
            let Some(entry) = entry else { continue };
            let sample = entry.stats.sample();
            let alive = entry.pinned.is_some() || entry.token.strong_count() > 0;
            if !alive {
                gone.push(id);
            }
            if !sample.requests.is_empty() || id == 0 {
                routes.push(sample);
            }
        }
        for id in gone {
            if let Some(entry) = entries.routes[id].take() {
                entries.by_labels.remove(entry.stats.labels());
                entries.free.push(id as u32);
                entries.dirty = true;
            }
        }
        if !entries.dirty {
            // Nothing dropped: the hosts in use did not change.
        } else {
            let hosts: HashSet<String> = entries
                .routes
                .iter()
                .flatten()
                .map(|e| e.stats.labels.host.clone())
                .filter(|h| !h.is_empty())
                .collect();
            entries.hosts = hosts;
        }
        let mut backends: Vec<BackendSample> = entries.backends.values().map(|b| b.sample()).collect();
        entries.backends.retain(|_, b| !b.retired.load(Ordering::Relaxed));
        drop(entries);
        backends.sort_by(|a, b| a.id.cmp(&b.id));
        routes.sort_by(|a, b| a.labels.cmp(&b.labels));
        let mut conns = ConnSample::default();
        for shard in self.conns.iter() {
            for i in 0..3 {
                conns.tls_ok[i] += shard.tls_ok[i].load(Ordering::Relaxed);
                conns.open[i] = conns.open[i]
                    .wrapping_add(shard.opened[i].load(Ordering::Relaxed))
                    .wrapping_sub(shard.closed[i].load(Ordering::Relaxed));
            }
            conns.tls_failed += shard.tls_failed.load(Ordering::Relaxed);
        }
        Sample { routes, backends, conns, per_host: config.per_host }
    }
}

impl Entries {
    /// The id of `labels` and the token that keeps its entry: the live entry, else a new one.
    fn entry(&mut self, labels: RouteLabels) -> (u32, Arc<Token>) {
        if let Some(&id) = self.by_labels.get(&labels)
            && let Some(Some(entry)) = self.routes.get_mut(id as usize)
        {
            // Several routes (and the same route in an older table) share one token: the entry
            // stays while any of them lives.
            let token = match (&entry.pinned, entry.token.upgrade()) {
                (Some(pinned), _) => pinned.clone(),
                (None, Some(token)) => token,
                (None, None) => {
                    let token = Arc::new(Token);
                    entry.token = Arc::downgrade(&token);
                    token
                }
            };
            return (id, token);
        }
        let token = Arc::new(Token);
        let entry = Entry {
            stats: Arc::new(RouteStats::new(labels.clone())),
            token: Arc::downgrade(&token),
            pinned: None,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.routes[id as usize] = Some(entry);
                id
            }
            None => {
                self.routes.push(Some(entry));
                (self.routes.len() - 1) as u32
            }
        };
        self.by_labels.insert(labels, id);
        self.dirty = true;
        (id, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(ingress: &str, host: &str) -> RouteLabels {
        RouteLabels {
            namespace: "ns".into(),
            ingress: ingress.into(),
            service: "svc".into(),
            path: "/".into(),
            host: host.into(),
            canary: String::new(),
        }
    }

    fn record(status: u16) -> Record {
        Record {
            method: 0,
            status,
            duration: Duration::from_millis(30),
            upstream: Some(Duration::from_millis(20)),
            request_bytes: 120,
            response_bytes: 2_000,
        }
    }

    fn requests(sample: &Sample, ingress: &str) -> Vec<(String, u64)> {
        sample
            .routes
            .iter()
            .filter(|r| r.labels.ingress == ingress)
            .flat_map(|r| r.requests.iter().map(|&(_, slot, n)| (status_label(slot), n)))
            .collect()
    }

    /// A route that leaves the table keeps its counts until one scrape has reported them.
    #[test]
    fn counts_of_a_gone_route_survive_until_the_next_scrape() {
        let registry = Registry::default();
        let handle = registry.route(labels("web", "a.test"), None);
        let live = registry.live(&[]);
        live.route(handle.id).expect("live").record(&record(200));
        drop(handle);
        assert_eq!(requests(&registry.collect(), "web"), [("200".to_string(), 1)]);
        assert!(requests(&registry.collect(), "web").is_empty());
    }

    /// Two routes with one label set count together; the set lives while either route does,
    /// and a table compiled again keeps counting where the last one stopped.
    #[test]
    fn routes_with_the_same_labels_share_counts() {
        let registry = Registry::default();
        let a = registry.route(labels("web", "a.test"), None);
        let b = registry.route(labels("web", "a.test"), None);
        assert_eq!(a.id, b.id);
        let live = registry.live(&[]);
        live.route(a.id).expect("a").record(&record(200));
        drop(a);
        let _ = registry.collect();
        live.route(b.id).expect("b").record(&record(200));
        let again = registry.route(labels("web", "a.test"), None);
        assert_eq!(again.id, b.id);
        assert_eq!(requests(&registry.collect(), "web"), [("200".to_string(), 2)]);
    }

    /// Codes not counted apart count under their class; the histograms are per class.
    #[test]
    fn statuses_and_classes() {
        let registry = Registry::default();
        let handle = registry.route(labels("web", ""), None);
        let live = registry.live(&[]);
        for status in [200, 503, 418, 418, 299] {
            live.route(handle.id).expect("live").record(&record(status));
        }
        let sample = registry.collect();
        let mut got = requests(&sample, "web");
        got.sort();
        let want = [("200", 1), ("2xx", 1), ("4xx", 2), ("503", 1)].map(|(s, n)| (s.to_string(), n));
        assert_eq!(got, want);
        let route = sample.routes.iter().find(|r| r.labels.ingress == "web").expect("route");
        assert_eq!(route.classes[1].duration.count(), 2);
        assert_eq!(route.classes[3].duration.count(), 2);
        // 30 ms: in the (0.025, 0.05] bucket; 2000 bytes: (1000, 10000].
        assert_eq!(route.classes[4].duration.counts[3], 1);
        assert_eq!(route.classes[4].response_size.counts[3], 1);
        assert_eq!(route.classes[4].upstream.sum, 20_000_000);
    }

    /// Past `max_hosts` distinct hosts, routes count with an empty host; without per-host
    /// metrics, every host label is empty.
    #[test]
    fn hosts_are_capped() {
        let registry = Registry::default();
        registry.configure(MetricsConfig { max_hosts: 1, ..MetricsConfig::default() });
        let a = registry.route(labels("a", "a.test"), None);
        let b = registry.route(labels("b", "b.test"), None);
        let live = registry.live(&[]);
        live.route(a.id).expect("a").record(&record(200));
        live.route(b.id).expect("b").record(&record(200));
        let sample = registry.collect();
        let host = |ingress: &str| {
            sample.routes.iter().find(|r| r.labels.ingress == ingress).map(|r| r.labels.host.clone())
        };
        assert_eq!(host("a").as_deref(), Some("a.test"));
        assert_eq!(host("b").as_deref(), Some(""));

        registry.configure(MetricsConfig { per_host: false, ..MetricsConfig::default() });
        let c = registry.route(labels("c", "c.test"), None);
        registry.live(&[]).route(c.id).expect("c").record(&record(200));
        let sample = registry.collect();
        assert!(!sample.per_host);
        assert_eq!(
            sample.routes.iter().find(|r| r.labels.ingress == "c").map(|r| r.labels.host.as_str()),
            Some("")
        );
    }

    /// A canary's requests count under the route's labels with `canary` naming its backend.
    #[test]
    fn canary_has_its_own_label_set() {
        let registry = Registry::default();
        let canary = BackendId {
            namespace: "ns".into(),
            service: "svc-canary".into(),
            port: crate::model::ServicePort::Number(80),
        };
        let handle = registry.route(labels("web", ""), Some(&canary));
        let canary_id = handle.canary.expect("canary id");
        assert_ne!(canary_id, handle.id);
        registry.live(&[]).route(canary_id).expect("canary").record(&record(200));
        let sample = registry.collect();
        let route = sample.routes.iter().find(|r| !r.requests.is_empty()).expect("counted");
        assert_eq!(route.labels.canary, "ns-svc-canary-80");
    }

    /// Backend counters follow the table's backends; a gone backend is reported once more.
    #[test]
    fn backend_counters() {
        let registry = Registry::default();
        let id = BackendId {
            namespace: "ns".into(),
            service: "svc".into(),
            port: crate::model::ServicePort::Number(80),
        };
        let live = registry.live(std::slice::from_ref(&id));
        live.backend(0).expect("backend").count(UpstreamEvent::ConnectError);
        live.backend(0).expect("backend").count(UpstreamEvent::Retry);
        let _ = registry.live(&[]);
        let sample = registry.collect();
        assert_eq!(sample.backends.len(), 1);
        assert_eq!((sample.backends[0].connect_errors, sample.backends[0].retries), (1, 1));
        assert!(registry.collect().backends.is_empty());
    }
}
