//! Metrics served on the admin listener's `/metrics`: the controller's own (table version,
//! reloads, warnings, leader), the dataplane's request metrics (summed from its shards at each
//! scrape), TLS and connection figures, certificate expiry and `process_*`.
//!
//! Prometheus text (0.0.4) by default, OpenMetrics 1.0 when the scraper's `Accept` asks for it.
//! Names are `weir_*` (`docs/metrics.md`); with `--metrics-compat ingress-nginx` the same
//! figures are also written under ingress-nginx's names and label names.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use weir_dataplane::metrics::{
    CLASSES, ClassSample, DURATION_BUCKETS, HistSample, LISTENERS, METHODS, RouteLabels, SIZE_BUCKETS,
    STATUS_SLOTS, Sample, TLS_VERSIONS, status_label,
};
use weir_dataplane::model::{HostMatch, ObjectRef, RouteTable};
use weir_dataplane::proxy::Proxy;

/// Which other names the figures are also exposed under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compat {
    /// `controller_class`: the IngressClass served.
    pub class: String,
    /// `controller_namespace`: the namespace weir runs in.
    pub namespace: String,
    /// `controller_pod`: this replica.
    pub pod: String,
}

/// How the metrics are exposed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsOptions {
    /// Also expose ingress-nginx's names (`--metrics-compat ingress-nginx`).
    pub ingress_nginx: Option<Compat>,
}

/// The text formats a scrape can get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names it, else Prometheus.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The controller's metrics and what it reads at each scrape.
pub struct Metrics {
    options: MetricsOptions,
    /// Version of the routing table being served.
    pub table_version: Gauge,
    /// Warnings of the last translation.
    pub translation_warnings: Gauge,
    /// Manifest files that do not parse (their last good objects keep serving).
    pub manifest_errors: Gauge,
    /// Routing tables published.
    pub reloads_ok: Counter,
    /// Routing tables the dataplane rejected (the previous one kept serving).
    pub reloads_failed: Counter,
    last_reload_ok: AtomicBool,
    /// Seconds since the epoch of the last published table (0: none yet).
    last_reload_secs: AtomicU64,
    /// The proxy whose connections and requests are counted, once known.
    proxy: OnceLock<Proxy>,
    /// The Lease and whether this replica holds it, when there is an election.
    leader: OnceLock<(ObjectRef, Arc<AtomicBool>)>,
    certs: Mutex<CertExpiry>,
    /// The TCP and UDP services' metrics (`metrics_l4.rs`).
    pub l4: crate::metrics_l4::L4Metrics,
}

/// When the served certificates expire.
#[derive(Default)]
struct CertExpiry {
    /// By Secret: the PEM last read and its `notAfter` (`None`: unreadable).
    by_secret: HashMap<ObjectRef, (String, Option<i64>)>,
    /// (host, Secret) → `notAfter`.
    served: BTreeMap<(String, ObjectRef), i64>,
}

/// A Secret name for the default certificate from files.
fn secret_label(secret: &ObjectRef) -> (&str, &str) {
    (secret.namespace.as_str(), secret.name.as_str())
}

impl Metrics {
    /// The metrics, exposed under weir's names only.
    pub fn new() -> Self {
        Self::with_options(MetricsOptions::default())
    }

    /// The metrics, exposed as `options` say.
    pub fn with_options(options: MetricsOptions) -> Self {
        Metrics {
            options,
            table_version: Gauge::default(),
            translation_warnings: Gauge::default(),
            manifest_errors: Gauge::default(),
            reloads_ok: Counter::default(),
            reloads_failed: Counter::default(),
            last_reload_ok: AtomicBool::new(false),
            last_reload_secs: AtomicU64::new(0),
            proxy: OnceLock::new(),
            leader: OnceLock::new(),
            certs: Mutex::new(CertExpiry::default()),
            l4: crate::metrics_l4::L4Metrics::default(),
        }
    }

    /// Counts `proxy`'s connections and requests from now on (the first proxy given wins).
    pub fn observe(&self, proxy: &Proxy) {
        let _ = self.proxy.set(proxy.clone());
    }

    /// Reports whether this replica holds `lease` (`holder` follows the election).
    pub fn observe_leader(&self, lease: ObjectRef, holder: Arc<AtomicBool>) {
        let _ = self.leader.set((lease, holder));
    }

    /// A table was published (`ok`) or rejected.
    pub fn reloaded(&self, ok: bool) {
        self.last_reload_ok.store(ok, Ordering::Relaxed);
        if ok {
            self.reloads_ok.inc();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            self.last_reload_secs.store(now.as_secs(), Ordering::Relaxed);
        } else {
            self.reloads_failed.inc();
        }
    }

    /// Notes the expiry of every certificate `table` serves, by host and Secret (certificates
    /// are parsed again only when their PEM changed).
    pub fn certificates(&self, table: &RouteTable) {
        let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        certs.by_secret.retain(|secret, _| table.certificates.contains_key(secret));
        for (secret, cert) in &table.certificates {
            let stale = certs.by_secret.get(secret).is_none_or(|(pem, _)| *pem != cert.chain_pem);
            if stale {
                let expiry = match weir_dataplane::metrics::certs::not_after(&cert.chain_pem) {
                    Ok(at) => Some(at),
                    Err(error) => {
                        tracing::debug!(%secret, %error, "cannot read the certificate's expiry");
                        None
                    }
                };
                certs.by_secret.insert(secret.clone(), (cert.chain_pem.clone(), expiry));
            }
        }
        let mut served = BTreeMap::new();
        for entry in &table.tls {
            let Some(secret) = entry.certificate.as_ref().or(table.default_certificate.as_ref()) else {
                continue;
            };
            let Some((_, Some(expiry))) = certs.by_secret.get(secret) else { continue };
            for host in &entry.hosts {
                let host = match host {
                    HostMatch::Exact(h) => h.clone(),
                    HostMatch::Wildcard(s) | HostMatch::Suffix(s) => format!("*.{s}"),
                    HostMatch::Any => continue,
                };
                served.insert((host, secret.clone()), *expiry);
            }
        }
        if let Some(secret) = &table.default_certificate
            && let Some((_, Some(expiry))) = certs.by_secret.get(secret)
        {
            served.insert((String::new(), secret.clone()), *expiry);
        }
        certs.served = served;
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Bytes {
        self.render(Format::OpenMetrics)
    }

    /// The text of every metric in `format`.
    pub fn render(&self, format: Format) -> Bytes {
        let sample = self.proxy.get().map(|p| p.metrics().collect()).unwrap_or_default();
        let mut w = Writer { out: String::with_capacity(16 * 1024), format };
        self.controller(&mut w);
        if let Some(proxy) = self.proxy.get() {
            let stats = proxy.connection_stats();
            w.family("weir_connections_open", Kind::Gauge, "Client connections open over every listener");
            w.sample("weir_connections_open", "", &[], stats.open);
            w.family(
                "weir_connections_refused",
                Kind::Counter,
                "Client connections reset at once by --max-connections (limit=total) or --max-connections-per-client (limit=per_client)",
            );
            for (limit, n) in [("total", stats.refused_total), ("per_client", stats.refused_per_client)] {
                w.sample("weir_connections_refused", "_total", &[("limit", limit)], n);
            }
            w.family(
                "weir_access_log_dropped",
                Kind::Counter,
                "Access-log lines dropped: the writer's queue was full (--access-log-queue) or the destination could not be written",
            );
            for (log, n) in [("http", proxy.access_log().dropped()), ("stream", self.l4.log_dropped())] {
                w.sample("weir_access_log_dropped", "_total", &[("log", log)], n);
            }
            crate::metrics_trace::render(&mut w, proxy.trace_counts());
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            w.family(
                "weir_runtime_alive_tasks",
                Kind::Gauge,
                "Tasks alive in the proxy's runtime when the metrics were scraped",
            );
            w.sample("weir_runtime_alive_tasks", "", &[], runtime.metrics().num_alive_tasks());
        }
        requests(&mut w, &sample, None);
        upstreams(&mut w, &sample);
        connections(&mut w, &sample);
        self.cert_expiry(&mut w, None);
        self.l4.render(&mut w);
        process(&mut w, "process", "");
        if let Some(compat) = &self.options.ingress_nginx {
            self.ingress_nginx(&mut w, &sample, compat);
        }
        if format == Format::OpenMetrics {
            w.out.push_str("# EOF\n");
        }
        Bytes::from(w.out)
    }

    fn controller(&self, w: &mut Writer) {
        let gauges = [
            (
                "weir_routing_table_version",
                "Version of the routing table being served",
                self.table_version.get(),
            ),
            (
                "weir_translation_warnings",
                "Warnings of the last translation",
                self.translation_warnings.get(),
            ),
            ("weir_manifest_errors", "Manifest files that do not parse", self.manifest_errors.get()),
        ];
        for (name, help, value) in gauges {
            w.family(name, Kind::Gauge, help);
            w.sample(name, "", &[], value);
        }
        w.family("weir_reloads", Kind::Counter, "Routing tables published");
        w.sample("weir_reloads", "_total", &[], self.reloads_ok.get());
        w.family("weir_reload_failures", Kind::Counter, "Routing tables rejected by the dataplane");
        w.sample("weir_reload_failures", "_total", &[], self.reloads_failed.get());
        w.family(
            "weir_last_reload_successful",
            Kind::Gauge,
            "Whether the last routing table was published (1) or rejected (0)",
        );
        w.sample(
            "weir_last_reload_successful",
            "",
            &[],
            u8::from(self.last_reload_ok.load(Ordering::Relaxed)),
        );
        w.family(
            "weir_last_reload_timestamp_seconds",
            Kind::Gauge,
            "When the last routing table was published, in seconds since the epoch",
        );
        w.sample(
            "weir_last_reload_timestamp_seconds",
            "",
            &[],
            self.last_reload_secs.load(Ordering::Relaxed),
        );
        if let Some((lease, holder)) = self.leader.get() {
            let name = format!("{}/{}", lease.namespace, lease.name);
            w.family(
                "weir_leader",
                Kind::Gauge,
                "1 when this replica holds the Lease and writes status, else 0",
            );
            w.sample("weir_leader", "", &[("lease", &name)], u8::from(holder.load(Ordering::Relaxed)));
        }
    }

    fn cert_expiry(&self, w: &mut Writer, compat: Option<&Compat>) {
        let certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        if certs.served.is_empty() {
            return;
        }
        match compat {
            None => {
                let name = "weir_certificate_expiry_timestamp_seconds";
                w.family(name, Kind::Gauge, "When a served certificate expires (notAfter), in seconds since the epoch, by host and Secret");
                for ((host, secret), at) in &certs.served {
                    let (ns, secret) = secret_label(secret);
                    w.sample(name, "", &[("host", host), ("namespace", ns), ("secret", secret)], at);
                }
            }
            Some(c) => {
                let name = "nginx_ingress_controller_ssl_expire_time_seconds";
                w.family(name, Kind::Gauge, "Number of seconds since 1970 to the SSL Certificate expire");
                let mut seen = std::collections::BTreeSet::new();
                for ((host, _), at) in &certs.served {
                    if host.is_empty() || !seen.insert(host) {
                        continue;
                    }
                    w.sample(
                        name,
                        "",
                        &[("namespace", &c.namespace), ("class", &c.class), ("host", host)],
                        at,
                    );
                }
            }
        }
    }

    fn ingress_nginx(&self, w: &mut Writer, sample: &Sample, c: &Compat) {
        let constant = [
            ("controller_namespace", c.namespace.as_str()),
            ("controller_class", c.class.as_str()),
            ("controller_pod", c.pod.as_str()),
        ];
        let ok = u8::from(self.last_reload_ok.load(Ordering::Relaxed));
        for (name, help, value) in [
            (
                "nginx_ingress_controller_config_last_reload_successful",
                "Whether the last configuration reload attempt was successful",
                u64::from(ok),
            ),
            (
                "nginx_ingress_controller_config_last_reload_successful_timestamp_seconds",
                "Timestamp of the last successful configuration reload.",
                self.last_reload_secs.load(Ordering::Relaxed),
            ),
        ] {
            w.family(name, Kind::Gauge, help);
            w.sample(name, "", &constant, value);
        }
        for (name, help, value) in [
            (
                "nginx_ingress_controller_success",
                "Cumulative number of Ingress controller reload operations",
                self.reloads_ok.get(),
            ),
            (
                "nginx_ingress_controller_errors",
                "Cumulative number of Ingress controller errors during reload operations",
                self.reloads_failed.get(),
            ),
        ] {
            w.family(name, Kind::RawCounter, help);
            w.sample(name, "", &constant, value);
        }
        if let Some((lease, holder)) = self.leader.get() {
            let name = "nginx_ingress_controller_leader_election_status";
            w.family(
                name,
                Kind::Gauge,
                "Gauge reporting status of the leader election, 0 indicates follower, 1 indicates leader",
            );
            let mut labels = constant.to_vec();
            labels.push(("name", lease.name.as_str()));
            w.sample(name, "", &labels, u8::from(holder.load(Ordering::Relaxed)));
        }
        requests(w, sample, Some(c));
        self.cert_expiry(w, Some(c));
        // weir is the process that serves the traffic: the "nginx process" figures are its own.
        process(w, "nginx_ingress_controller_nginx_process", &format_labels(&constant));
        let name = "nginx_ingress_controller_nginx_process_connections";
        w.family(name, Kind::Gauge, "current number of client connections with state {active}");
        let open: u64 = sample.conns.open.iter().sum();
        let mut labels = constant.to_vec();
        labels.push(("state", "active"));
        w.sample(name, "", &labels, open);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// === the request metrics ===

/// The label names of a route's figures, weir's or ingress-nginx's.
fn route_labels<'a>(labels: &'a RouteLabels, per_host: bool, out: &mut Vec<(&'static str, &'a str)>) {
    out.push(("namespace", &labels.namespace));
    out.push(("ingress", &labels.ingress));
    out.push(("service", &labels.service));
    out.push(("path", &labels.path));
    out.push(("canary", &labels.canary));
    if per_host {
        out.push(("host", &labels.host));
    }
}

fn requests(w: &mut Writer, sample: &Sample, compat: Option<&Compat>) {
    let constant: Vec<(&'static str, &str)> = match compat {
        Some(c) => vec![
            ("controller_namespace", &c.namespace),
            ("controller_class", &c.class),
            ("controller_pod", &c.pod),
        ],
        None => Vec::new(),
    };
    let (requests, kind, suffix) = match compat {
        None => ("weir_requests", Kind::Counter, "_total"),
        Some(_) => ("nginx_ingress_controller_requests", Kind::RawCounter, ""),
    };
    let help = match compat {
        None => {
            "Requests answered, by route, method and status (a status not counted apart is its class, 2xx)"
        }
        Some(_) => "The total number of client requests",
    };
    w.family(requests, kind, help);
    let statuses: Vec<String> = (0..STATUS_SLOTS).map(status_label).collect();
    let mut labels = Vec::new();
    for route in &sample.routes {
        for &(method, slot, n) in &route.requests {
            labels.clear();
            labels.extend_from_slice(&constant);
            route_labels(&route.labels, sample.per_host, &mut labels);
            labels.push(("method", METHODS[method]));
            labels.push(("status", statuses[slot].as_str()));
            w.sample(requests, suffix, &labels, n);
        }
    }
    // Histograms, per status class.
    type Pick = fn(&ClassSample) -> &HistSample<12>;
    type PickSize = fn(&ClassSample) -> &HistSample<8>;
    let (duration, upstream, request_size, response_size, bytes_sent) = match compat {
        None => (
            (
                "weir_request_duration_seconds",
                "Time from the request head to the last byte of the response (or the client going away)",
            ),
            (
                "weir_upstream_response_duration_seconds",
                "Time from sending the request upstream to the upstream's response head",
            ),
            ("weir_request_size_bytes", "Request sizes: head and declared body"),
            (
                "weir_response_size_bytes",
                "Bytes sent per response: head and body (the sum is the bytes sent)",
            ),
            None,
        ),
        Some(_) => (
            ("nginx_ingress_controller_request_duration_seconds", "The request processing time in seconds"),
            (
                "nginx_ingress_controller_response_duration_seconds",
                "The time spent on receiving the response from the upstream server",
            ),
            (
                "nginx_ingress_controller_request_size",
                "The request length (including request line, header, and request body)",
            ),
            (
                "nginx_ingress_controller_response_size",
                "The response length (including request line, header, and request body)",
            ),
            Some(("nginx_ingress_controller_bytes_sent", "The number of bytes sent to a client")),
        ),
    };
    let class_label = if compat.is_some() { "status" } else { "status_class" };
    let times: [((&str, &str), Pick); 2] = [(duration, |c| &c.duration), (upstream, |c| &c.upstream)];
    for ((name, help), pick) in times {
        w.family(name, Kind::Histogram, help);
        for route in &sample.routes {
            for (class, hists) in route.classes.iter().enumerate() {
                let h = pick(hists);
                if h.count() == 0 {
                    continue;
                }
                labels.clear();
                labels.extend_from_slice(&constant);
                route_labels(&route.labels, sample.per_host, &mut labels);
                labels.push((class_label, CLASSES[class]));
                w.histogram(name, &labels, &DURATION_BUCKETS, &h.counts, h.sum as f64 / 1e9);
            }
        }
    }
    let mut sizes: Vec<((&str, &str), PickSize)> =
        vec![(request_size, |c| &c.request_size), (response_size, |c| &c.response_size)];
    if let Some(sent) = bytes_sent {
        sizes.push((sent, |c| &c.response_size));
    }
    for ((name, help), pick) in sizes {
        w.family(name, Kind::Histogram, help);
        for route in &sample.routes {
            for (class, hists) in route.classes.iter().enumerate() {
                let h = pick(hists);
                if h.count() == 0 {
                    continue;
                }
                labels.clear();
                labels.extend_from_slice(&constant);
                route_labels(&route.labels, sample.per_host, &mut labels);
                labels.push((class_label, CLASSES[class]));
                w.histogram(name, &labels, &SIZE_BUCKETS, &h.counts, h.sum as f64);
            }
        }
    }
}

fn upstreams(w: &mut Writer, sample: &Sample) {
    type Field = fn(&weir_dataplane::metrics::BackendSample) -> u64;
    let families: [(&str, &str, Field); 4] = [
        ("weir_upstream_connect_errors", "Upstream connections that failed, by backend", |b| {
            b.connect_errors
        }),
        ("weir_upstream_connect_timeouts", "Upstream connections that timed out, by backend", |b| {
            b.connect_timeouts
        }),
        (
            "weir_upstream_response_timeouts",
            "Upstream response heads that did not come in time, by backend",
            |b| b.response_timeouts,
        ),
        (
            "weir_upstream_retries",
            "Requests sent to another endpoint of the backend (proxy-next-upstream)",
            |b| b.retries,
        ),
    ];
    for (name, help, field) in families {
        w.family(name, Kind::Counter, help);
        for b in &sample.backends {
            let port = b.id.port.to_string();
            let labels =
                [("namespace", b.id.namespace.as_str()), ("service", b.id.service.as_str()), ("port", &port)];
            w.sample(name, "_total", &labels, field(b));
        }
    }
}

fn connections(w: &mut Writer, sample: &Sample) {
    let name = "weir_tls_handshakes";
    w.family(name, Kind::Counter, "TLS handshakes on the HTTPS listener, by version and result");
    for (version, n) in TLS_VERSIONS.iter().zip(sample.conns.tls_ok) {
        w.sample(name, "_total", &[("version", version), ("result", "ok")], n);
    }
    w.sample(name, "_total", &[("version", ""), ("result", "failed")], sample.conns.tls_failed);
    let name = "weir_downstream_connections";
    w.family(name, Kind::Gauge, "Client connections open, by listener and protocol");
    for ((listener, protocol), n) in LISTENERS.iter().zip(sample.conns.open) {
        w.sample(name, "", &[("listener", listener), ("protocol", protocol)], n);
    }
}

// === process ===

/// `process_*` read from `/proc/self` (Linux); nothing elsewhere or when unreadable.
fn process(w: &mut Writer, prefix: &str, constant: &str) {
    let Some(p) = ProcessStats::read() else { return };
    let name = |s: &str| format!("{prefix}_{s}");
    let cpu = name("cpu_seconds");
    w.family(&cpu, Kind::Counter, "Total user and system CPU time spent in seconds");
    w.raw(&format!("{cpu}_total{constant} {}\n", fmt_f64(p.cpu_seconds)));
    for (metric, help, value) in [
        ("resident_memory_bytes", "Resident memory size in bytes", p.resident_bytes as f64),
        ("virtual_memory_bytes", "Virtual memory size in bytes", p.virtual_bytes as f64),
        ("open_fds", "Number of open file descriptors", p.open_fds as f64),
        ("max_fds", "Maximum number of open file descriptors", p.max_fds as f64),
        ("start_time_seconds", "Start time of the process since unix epoch in seconds", p.start_time),
    ] {
        let metric = name(metric);
        w.family(&metric, Kind::Gauge, help);
        w.raw(&format!("{metric}{constant} {}\n", fmt_f64(value)));
    }
}

/// What `/proc` says about this process.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    start_time: f64,
}

/// `/proc` counts CPU time in clock ticks of `USER_HZ`, 100 on every Linux ABI.
const USER_HZ: f64 = 100.0;

impl ProcessStats {
    fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0);
        Self::parse(&stat, &status, &boot, &limits, open_fds)
    }

    fn parse(stat: &str, status: &str, boot: &str, limits: &str, open_fds: u64) -> Option<ProcessStats> {
        // Fields after the command name (which may hold spaces and parentheses).
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // `state` is field 3, so field n is at index n - 3.
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        };
        let btime =
            boot.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse::<u64>().ok())?;
        let max_fds = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Some(ProcessStats {
            cpu_seconds: (field(14)? + field(15)?) as f64 / USER_HZ,
            resident_bytes: kb("VmRSS:").unwrap_or(0) * 1024,
            virtual_bytes: field(23).unwrap_or(0),
            open_fds,
            max_fds,
            start_time: btime as f64 + field(22)? as f64 / USER_HZ,
        })
    }
}

// === the text formats ===

/// What a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A counter whose samples end in `_total`.
    Counter,
    /// A counter whose samples keep the family's name (ingress-nginx's); OpenMetrics calls it
    /// `unknown`, since its counters must end in `_total`.
    RawCounter,
    Gauge,
    Histogram,
}

pub(crate) struct Writer {
    out: String,
    format: Format,
}

impl Writer {
    /// An empty text in `format` (for metrics served apart from [`Metrics`]).
    pub(crate) fn new(format: Format) -> Self {
        Writer { out: String::new(), format }
    }

    /// The text written.
    pub(crate) fn into_text(self) -> String {
        self.out
    }

    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let (family, kind) = match (self.format, kind) {
            (Format::Prometheus, Kind::Counter) => (format!("{name}_total"), "counter"),
            (Format::OpenMetrics, Kind::Counter) => (name.to_string(), "counter"),
            (Format::Prometheus, Kind::RawCounter) => (name.to_string(), "counter"),
            (Format::OpenMetrics, Kind::RawCounter) => (name.to_string(), "unknown"),
            (_, Kind::Gauge) => (name.to_string(), "gauge"),
            (_, Kind::Histogram) => (name.to_string(), "histogram"),
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {family} {help}");
        let _ = writeln!(self.out, "# TYPE {family} {kind}");
    }

    pub(crate) fn sample(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        value: impl std::fmt::Display,
    ) {
        let _ = writeln!(self.out, "{name}{suffix}{} {value}", format_labels(labels));
    }

    fn raw(&mut self, line: &str) {
        self.out.push_str(line);
    }

    /// `counts` per bucket (not cumulative; the last is `+Inf`), one more than `bounds`.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], bounds: &[f64], counts: &[u64], sum: f64) {
        let les: Vec<String> = (0..counts.len())
            .map(|i| bounds.get(i).map_or_else(|| "+Inf".to_string(), |b| fmt_f64(*b)))
            .collect();
        let mut with_le: Vec<(&str, &str)> = labels.to_vec();
        let mut cumulative = 0;
        for (count, le) in counts.iter().zip(&les) {
            cumulative += count;
            with_le.truncate(labels.len());
            with_le.push(("le", le));
            let _ = writeln!(self.out, "{name}_bucket{} {cumulative}", format_labels(&with_le));
        }
        let set = format_labels(labels);
        let _ = writeln!(self.out, "{name}_sum{set} {}", fmt_f64(sum));
        let _ = writeln!(self.out, "{name}_count{set} {cumulative}");
    }
}

/// `{a="x",b="y"}` with values escaped; empty for no labels.
fn format_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut out = String::from("{");
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// A float as both formats accept it (`1`, `0.005`, `10000000`).
fn fmt_f64(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v}") }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The gauge counts the scraping runtime's tasks: it follows tasks spawned and finished.
    #[tokio::test(flavor = "current_thread")]
    async fn alive_tasks_follow_the_runtime() {
        let metrics = Metrics::new();
        let tasks = |text: &Bytes| -> i64 {
            let text = String::from_utf8_lossy(text).into_owned();
            let line = text.lines().find(|l| l.starts_with("weir_runtime_alive_tasks ")).unwrap_or_default();
            line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(-1)
        };
        let before = tasks(&metrics.encode());
        assert!(before >= 0, "{:?}", metrics.encode());
        let (senders, parked): (Vec<_>, Vec<_>) = (0..10)
            .map(|_| {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                (tx, tokio::spawn(rx))
            })
            .unzip();
        assert_eq!(tasks(&metrics.encode()), before + 10);
        drop(senders);
        for task in parked {
            assert!(matches!(task.await, Ok(Err(_))));
        }
        assert_eq!(tasks(&metrics.encode()), before);
    }

    #[test]
    fn negotiation() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(Format::negotiate(Some("text/plain;version=0.0.4")), Format::Prometheus);
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
    }

    /// Counters: `_total` on the family in Prometheus text, on the samples only in OpenMetrics;
    /// ingress-nginx's counter without `_total` is `unknown` in OpenMetrics.
    #[test]
    fn counter_names_per_format() {
        for (format, family, raw) in [
            (
                Format::Prometheus,
                "# TYPE weir_reloads_total counter",
                "# TYPE nginx_ingress_controller_success counter",
            ),
            (
                Format::OpenMetrics,
                "# TYPE weir_reloads counter",
                "# TYPE nginx_ingress_controller_success unknown",
            ),
        ] {
            let metrics = Metrics::with_options(MetricsOptions {
                ingress_nginx: Some(Compat { class: "weir".into(), namespace: "ns".into(), pod: "p".into() }),
            });
            metrics.reloaded(true);
            let text = String::from_utf8(metrics.render(format).to_vec()).unwrap();
            assert!(text.contains(family), "{text}");
            assert!(text.contains(raw), "{text}");
            assert!(text.contains("\nweir_reloads_total 1\n"), "{text}");
            assert!(
                text.contains("nginx_ingress_controller_success{controller_namespace=\"ns\",controller_class=\"weir\",controller_pod=\"p\"} 1\n"),
                "{text}"
            );
            assert_eq!(text.ends_with("# EOF\n"), format == Format::OpenMetrics);
        }
    }

    #[test]
    fn histogram_lines_are_cumulative() {
        let mut w = Writer { out: String::new(), format: Format::Prometheus };
        w.histogram("h", &[("a", "x\"y")], &[0.5, 1.0], &[1, 0, 2], 3.25);
        assert_eq!(
            w.out,
            "h_bucket{a=\"x\\\"y\",le=\"0.5\"} 1\nh_bucket{a=\"x\\\"y\",le=\"1\"} 1\nh_bucket{a=\"x\\\"y\",le=\"+Inf\"} 3\nh_sum{a=\"x\\\"y\"} 3.25\nh_count{a=\"x\\\"y\"} 3\n"
        );
    }

    #[test]
    fn process_stats_parse() {
        let stat = "4242 (we ir) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 8 0 12345 104857600 2560 18446744073709551615";
        let status = "Name:\tweir\nVmRSS:\t   10240 kB\n";
        let boot = "cpu 1 2 3\nbtime 1700000000\n";
        let limits = "Limit Soft Limit Hard Limit Units\nMax open files            1048576              1048576              files\n";
        let p = ProcessStats::parse(stat, status, boot, limits, 12).unwrap();
        assert_eq!(p.cpu_seconds, 4.0);
        assert_eq!((p.resident_bytes, p.virtual_bytes), (10240 * 1024, 104_857_600));
        assert_eq!((p.open_fds, p.max_fds), (12, 1_048_576));
        assert!((p.start_time - 1_700_000_123.45).abs() < 1e-3, "{}", p.start_time);
        assert_eq!(ProcessStats::parse("garbage", "", "", "", 0), None);
    }
}
