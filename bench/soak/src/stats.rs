//! What the load clients saw. Per interval and protocol: requests, errors by class, latency
//! percentiles and open client connections (one JSON line per interval in `intervals.jsonl`).
//! Every error also as one JSON line with its time, protocol, Service and class (`errors.jsonl`),
//! so the orchestrator can attribute it to an injected fault.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

/// A kind of client traffic the driver keeps running.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Proto {
    /// HTTP/1.1 keep-alive connections.
    H1,
    /// HTTP/1.1, a new connection per request.
    H1New,
    /// HTTP/1.1 over TLS, keep-alive, reconnecting every few dozen requests.
    H1Tls,
    /// HTTP/2 over TLS (ALPN h2), several streams at once.
    H2Tls,
    /// WebSocket connections that open, exchange messages and close.
    Ws,
    /// gRPC unary calls over TLS.
    GrpcUnary,
    /// gRPC bidirectional streams over TLS (one message round trip counts as a request).
    GrpcStream,
}

impl Proto {
    /// Every protocol, in report order.
    pub const ALL: [Proto; 7] =
        [Proto::H1, Proto::H1New, Proto::H1Tls, Proto::H2Tls, Proto::Ws, Proto::GrpcUnary, Proto::GrpcStream];

    /// The name in the JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H1New => "h1-new",
            Proto::H1Tls => "h1-tls",
            Proto::H2Tls => "h2-tls",
            Proto::Ws => "ws",
            Proto::GrpcUnary => "grpc-unary",
            Proto::GrpcStream => "grpc-stream",
        }
    }

    /// The Service (of the soak's manifests) this traffic is routed to.
    pub fn service(self) -> &'static str {
        match self {
            Proto::H1 | Proto::H2Tls | Proto::Ws => "web",
            Proto::H1New | Proto::H1Tls => "api",
            Proto::GrpcUnary | Proto::GrpcStream => "grpc",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A failed exchange: a class from a small fixed set, and a free-text detail.
#[derive(Debug)]
pub struct Failure {
    /// The class the report counts (`connect`, `http_502`, `ws_closed`, `grpc_unavailable`...).
    pub class: &'static str,
    /// What happened, for the error log only.
    pub detail: String,
}

impl Failure {
    /// A failure of `class`.
    pub fn new(class: &'static str, detail: impl std::fmt::Display) -> Self {
        Failure { class, detail: detail.to_string() }
    }
}

#[derive(Default)]
struct Interval {
    ok: u64,
    latencies_us: Vec<u32>,
    errors: BTreeMap<&'static str, u64>,
}

#[derive(Default)]
struct Totals {
    ok: u64,
    errors: BTreeMap<&'static str, u64>,
}

/// Shared by every client task: counts, latencies, the error log.
pub struct Recorder {
    intervals: Mutex<[Interval; 7]>,
    totals: Mutex<[Totals; 7]>,
    conns: [AtomicI64; 7],
    /// Leaf certificates seen in TLS handshakes (a hash of the DER) and when first seen.
    certs: Mutex<HashMap<u64, f64>>,
    error_log: Mutex<BufWriter<File>>,
    interval_log: Mutex<BufWriter<File>>,
}

/// Seconds since the Unix epoch (the orchestrator's clock too).
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Open while a client connection is: counts it in its protocol's `conns`.
pub struct ConnGuard<'a>(&'a AtomicI64);

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Recorder {
    /// A recorder writing `errors.jsonl` and `intervals.jsonl` in `out`.
    pub fn create(out: &Path) -> anyhow::Result<Self> {
        let open = |name: &str| -> anyhow::Result<Mutex<BufWriter<File>>> {
            let path = out.join(name);
            let file =
                File::create(&path).map_err(|e| anyhow::anyhow!("creating {}: {e}", path.display()))?;
            Ok(Mutex::new(BufWriter::new(file)))
        };
        Ok(Recorder {
            intervals: Mutex::default(),
            totals: Mutex::default(),
            conns: Default::default(),
            certs: Mutex::default(),
            error_log: open("errors.jsonl")?,
            interval_log: open("intervals.jsonl")?,
        })
    }

    /// One successful exchange of `proto` that took `latency`.
    pub fn ok(&self, proto: Proto, latency: Duration) {
        let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        if let Ok(mut intervals) = self.intervals.lock() {
            let interval = &mut intervals[proto.index()];
            interval.ok += 1;
            interval.latencies_us.push(micros);
        }
        if let Ok(mut totals) = self.totals.lock() {
            totals[proto.index()].ok += 1;
        }
    }

    /// One failed exchange of `proto`; `backend` is the replica involved when the client knows it.
    pub fn error(&self, proto: Proto, failure: &Failure, backend: Option<&str>) {
        if let Ok(mut intervals) = self.intervals.lock() {
            *intervals[proto.index()].errors.entry(failure.class).or_default() += 1;
        }
        if let Ok(mut totals) = self.totals.lock() {
            *totals[proto.index()].errors.entry(failure.class).or_default() += 1;
        }
        let line = json!({
            "t": now(),
            "proto": proto.name(),
            "service": proto.service(),
            "class": failure.class,
            "detail": failure.detail,
            "backend": backend,
        });
        if let Ok(mut log) = self.error_log.lock() {
            let _ = writeln!(log, "{line}");
        }
    }

    /// Counts a client connection of `proto` until the guard is dropped.
    pub fn conn(&self, proto: Proto) -> ConnGuard<'_> {
        let counter = &self.conns[proto.index()];
        counter.fetch_add(1, Ordering::Relaxed);
        ConnGuard(counter)
    }

    /// A TLS handshake presented this leaf certificate.
    pub fn cert_seen(&self, der: &[u8]) {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        der.hash(&mut hasher);
        if let Ok(mut certs) = self.certs.lock() {
            certs.entry(hasher.finish()).or_insert_with(now);
        }
    }

    /// Ends the current interval: writes its line and starts the next one.
    pub fn flush_interval(&self) {
        let taken = match self.intervals.lock() {
            Ok(mut intervals) => std::mem::take(&mut *intervals),
            Err(_) => return,
        };
        let mut protos = serde_json::Map::new();
        for (proto, mut interval) in Proto::ALL.into_iter().zip(taken) {
            interval.latencies_us.sort_unstable();
            let pct = |p: f64| -> Option<f64> {
                let n = interval.latencies_us.len();
                if n == 0 {
                    return None;
                }
                let rank = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
                Some(f64::from(interval.latencies_us[rank]) / 1000.0)
            };
            let errors: u64 = interval.errors.values().sum();
            protos.insert(
                proto.name().to_string(),
                json!({
                    "requests": interval.ok + errors,
                    "ok": interval.ok,
                    "errors": interval.errors,
                    "p50_ms": pct(0.50),
                    "p99_ms": pct(0.99),
                    "max_ms": interval.latencies_us.last().map(|&us| f64::from(us) / 1000.0),
                    "conns": self.conns[proto.index()].load(Ordering::Relaxed),
                }),
            );
        }
        let certs = self.certs.lock().map(|c| c.len()).unwrap_or(0);
        let line = json!({"t": now(), "protos": protos, "certs_seen": certs});
        if let Ok(mut log) = self.interval_log.lock() {
            let _ = writeln!(log, "{line}");
            let _ = log.flush();
        }
        if let Ok(mut log) = self.error_log.lock() {
            let _ = log.flush();
        }
    }

    /// Totals of the whole run, and the certificates seen with their first-seen times.
    pub fn summary(&self) -> serde_json::Value {
        let mut protos = serde_json::Map::new();
        if let Ok(totals) = self.totals.lock() {
            for proto in Proto::ALL {
                let t = &totals[proto.index()];
                protos.insert(proto.name().to_string(), json!({"ok": t.ok, "errors": t.errors}));
            }
        }
        let mut first_seen: Vec<f64> =
            self.certs.lock().map(|c| c.values().copied().collect()).unwrap_or_default();
        first_seen.sort_by(f64::total_cmp);
        json!({"protos": protos, "certs_first_seen": first_seen})
    }
}
