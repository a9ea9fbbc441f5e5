//! OpenTelemetry tracing: the W3C trace context ([`context`]), the sampler ([`Sampler`]), a
//! request's server span ([`span`]) and the OTLP/gRPC exporter ([`export`], [`otlp`]).
//!
//! A table's `otel` settings become a [`Pipeline`] when it is compiled (the request side:
//! sampler, trust, span name; and the [`export::Exporter`], kept while the collector and
//! batching settings stay the same). Per request, [`Pipeline::start`] decides the trace
//! (continued or new), the span id and the sampling; the proxy sends the span's `traceparent`
//! upstream and to the authentication service, and finishes the span when the response ends.

pub mod context;
pub mod export;
pub mod otlp;
pub mod span;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use context::{Incoming, TraceId, TraceParent};
use export::{ExportConfig, Exporter, TraceCounts, TraceStats};
use span::{ActiveSpan, RequestInfo};

use crate::model::otel::{Otel, RouteTrace};
use crate::vars::{Dialect, Part, Template, Var};

/// Which new traces are recorded (`otel-sampler`, `otel-sampler-ratio`,
/// `otel-sampler-parent-based`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// Share of traces recorded, 0 to 1 (`AlwaysOn` is 1, `AlwaysOff` 0).
    pub ratio: f64,
    /// A request continuing a trusted trace follows its caller's `sampled` flag instead.
    pub parent_based: bool,
}

impl Sampler {
    /// Whether the span of a request in `trace_id` is recorded; `parent` is the trusted
    /// incoming context, if any.
    pub fn sampled(&self, trace_id: TraceId, parent: Option<&TraceParent>) -> bool {
        match parent {
            Some(p) if self.parent_based => p.sampled,
            _ => ratio_sampled(self.ratio, trace_id),
        }
    }
}

/// OpenTelemetry's `TraceIdRatioBased`: the trace's last 8 bytes, as a 63-bit number, below
/// `ratio` of the range. Deterministic per trace id, so every hop using the same ratio takes the
/// same decision.
fn ratio_sampled(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio.is_nan() || ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id.0[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    // `ratio` is in (0, 1): the product fits in 63 bits.
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    x < bound
}

// === impl Pipeline ===

/// A table's tracing, ready for the request path.
#[derive(Debug)]
pub struct Pipeline {
    enabled: bool,
    trust_incoming: bool,
    sampler: Sampler,
    operation: Option<Template>,
    exporter: Arc<Exporter>,
}

/// A route's tracing settings, compiled with its policy.
#[derive(Debug, Default)]
pub struct CompiledRouteTrace {
    enabled: Option<bool>,
    trust_incoming: Option<bool>,
    operation: Option<Template>,
}

impl CompiledRouteTrace {
    /// Compiles a route's settings (its operation name was checked by translation).
    pub fn compile(spec: &RouteTrace) -> CompiledRouteTrace {
        CompiledRouteTrace {
            enabled: spec.enabled,
            trust_incoming: spec.trust_incoming,
            operation: spec.operation_name.as_deref().map(operation_template),
        }
    }
}

/// The variables an operation name may hold.
pub const OPERATION_VARS: &str = "$request_method, $uri, $request_uri, $host, $scheme, $server_protocol, $namespace, $ingress_name, $service_name, $service_port";

fn operation_template(text: &str) -> Template {
    Template::parse_lenient(text, Dialect::AccessLog)
}

/// Checks an operation name template (`opentelemetry-operation-name`): nginx variables among
/// [`OPERATION_VARS`].
pub fn check_operation_name(text: &str) -> Result<(), String> {
    let template = Template::parse(text, Dialect::AccessLog).map_err(|r| r.to_string())?;
    for var in template.vars() {
        if !operation_var(var) {
            return Err(format!("${var} cannot name a span (use {OPERATION_VARS})"));
        }
    }
    Ok(())
}

fn operation_var(var: &Var) -> bool {
    matches!(
        var,
        Var::RequestMethod
            | Var::Uri
            | Var::RequestUri
            | Var::Host
            | Var::Scheme
            | Var::ServerProtocol
            | Var::Namespace
            | Var::IngressName
            | Var::ServiceName
            | Var::ServicePort
    )
}

impl Pipeline {
    /// Starts the span of a routed request, when tracing is on for its route (`route`: the
    /// route's own settings).
    pub fn start(&self, route: Option<&CompiledRouteTrace>, info: &RequestInfo<'_>) -> Option<ActiveSpan> {
        if !route.and_then(|r| r.enabled).unwrap_or(self.enabled) {
            return None;
        }
        let trust = route.and_then(|r| r.trust_incoming).unwrap_or(self.trust_incoming);
        // An untrusted or invalid incoming context starts a new trace.
        let incoming = if trust { Incoming::from_headers(info.headers).ok().flatten() } else { None };
        let trace_id = incoming.as_ref().map_or_else(TraceId::random, |i| i.parent.trace_id);
        let sampled = self.sampler.sampled(trace_id, incoming.as_ref().map(|i| &i.parent));
        let name = if sampled {
            match route.and_then(|r| r.operation.as_ref()).or(self.operation.as_ref()) {
                Some(template) => render(template, info),
                None => match info.route {
                    Some(route) => format!("{} {route}", info.method),
                    None => info.method.to_string(),
                },
            }
        } else {
            String::new()
        };
        Some(ActiveSpan::start(incoming, trace_id, sampled, name, info, &self.exporter))
    }
}

/// The operation name for `info`.
fn render(template: &Template, info: &RequestInfo<'_>) -> String {
    let mut out = String::new();
    for part in template.parts() {
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Var(var) => match var {
                Var::RequestMethod => out.push_str(info.method.as_str()),
                Var::Uri => out.push_str(info.path),
                Var::RequestUri => {
                    out.push_str(info.path);
                    if let Some(q) = info.query {
                        out.push('?');
                        out.push_str(q);
                    }
                }
                Var::Host => out.push_str(info.host),
                Var::Scheme => out.push_str(info.scheme),
                Var::ServerProtocol => out.push_str(match info.version {
                    http::Version::HTTP_10 => "HTTP/1.0",
                    http::Version::HTTP_2 => "HTTP/2.0",
                    _ => "HTTP/1.1",
                }),
                Var::Namespace => out.push_str(info.ingress.map_or("", |(ns, _)| ns)),
                Var::IngressName => out.push_str(info.ingress.map_or("", |(_, n)| n)),
                Var::ServiceName => out.push_str(info.service.as_ref().map_or("", |(s, _)| *s)),
                Var::ServicePort => out.push_str(info.service.as_ref().map_or("", |(_, p)| p.as_str())),
                // Refused by translation; written back as is.
                other => {
                    out.push('$');
                    out.push_str(&other.to_string());
                }
            },
        }
    }
    out
}

// === impl Tracer ===

/// The proxy's tracing state across tables: the exporter of the last configuration and the
/// counters.
#[derive(Debug, Default)]
pub struct Tracer {
    stats: Arc<TraceStats>,
    exporter: Mutex<Option<Arc<Exporter>>>,
}

impl Tracer {
    /// The pipeline for a table's settings (`None`: no collector, no tracing). The exporter is
    /// kept when its settings did not change, else a new one starts and the old one ends once
    /// it has sent what it holds.
    pub fn pipeline(&self, otel: Option<&Otel>) -> Option<Arc<Pipeline>> {
        let mut current = self.exporter.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(otel) = otel else {
            *current = None;
            return None;
        };
        let host = if otel.collector_host.contains(':') {
            format!("[{}]", otel.collector_host)
        } else {
            otel.collector_host.clone()
        };
        let config = ExportConfig {
            endpoint: format!("http://{host}:{}", otel.collector_port),
            service_name: otel.service_name.clone(),
            max_queue: otel.max_queue as usize,
            schedule_delay: Duration::from_millis(u64::from(otel.schedule_delay_ms)),
            max_batch: otel.max_batch as usize,
        };
        let exporter = match current.as_ref().filter(|e| *e.config() == config) {
            Some(same) => same.clone(),
            None => {
                let started = Exporter::start(config, self.stats.clone())?;
                *current = Some(started.clone());
                started
            }
        };
        Some(Arc::new(Pipeline {
            enabled: otel.enabled,
            trust_incoming: otel.trust_incoming,
            sampler: Sampler { ratio: otel.sampler_ratio.get(), parent_based: otel.parent_based },
            operation: otel.operation_name.as_deref().map(operation_template),
            exporter,
        }))
    }

    /// Spans exported and dropped so far.
    pub fn counts(&self) -> TraceCounts {
        self.stats.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use context::SpanId;

    #[test]
    fn operation_names_take_request_and_route_variables() {
        assert_eq!(check_operation_name("HTTP $request_method $service_name $uri"), Ok(()));
        assert!(check_operation_name("$status").is_err_and(|e| e.contains("$status cannot name a span")));
        assert!(check_operation_name("$nope").is_err());
        let headers = http::HeaderMap::new();
        let info = RequestInfo {
            headers: &headers,
            method: &http::Method::POST,
            path: "/a/b",
            query: Some("x=1"),
            scheme: "https",
            host: "h.test",
            port: 8443,
            client: std::net::IpAddr::from([127, 0, 0, 1]),
            version: http::Version::HTTP_2,
            route: Some("/a"),
            ingress: Some(("ns", "web")),
            service: Some(("svc", "80".into())),
        };
        let t = operation_template(
            "HTTP $request_method $service_name:$service_port $request_uri $namespace/$ingress_name $server_protocol",
        );
        assert_eq!(render(&t, &info), "HTTP POST svc:80 /a/b?x=1 ns/web HTTP/2.0");
    }

    #[test]
    fn ratio_sampling_takes_about_its_share() {
        let ids: Vec<TraceId> = (0..20_000).map(|_| TraceId::random()).collect();
        let taken = |ratio: f64| {
            let s = Sampler { ratio, parent_based: false };
            ids.iter().filter(|id| s.sampled(**id, None)).count()
        };
        assert_eq!(taken(0.0), 0);
        assert_eq!(taken(1.0), ids.len());
        let quarter = taken(0.25);
        assert!((4_000..6_000).contains(&quarter), "{quarter} of 20000 at 0.25");
        // The decision belongs to the trace id: a smaller ratio samples a subset.
        let s10 = Sampler { ratio: 0.1, parent_based: false };
        let s50 = Sampler { ratio: 0.5, parent_based: false };
        assert!(ids.iter().filter(|id| s10.sampled(**id, None)).all(|id| s50.sampled(*id, None)));
    }

    #[test]
    fn parent_based_follows_the_caller() {
        let parent =
            |sampled| TraceParent { trace_id: TraceId::random(), parent_id: SpanId::random(), sampled };
        let on = Sampler { ratio: 1.0, parent_based: true };
        let off = Sampler { ratio: 0.0, parent_based: true };
        assert!(!on.sampled(TraceId::random(), Some(&parent(false))));
        assert!(off.sampled(TraceId::random(), Some(&parent(true))));
        // Without a parent the ratio decides.
        assert!(on.sampled(TraceId::random(), None));
        assert!(!off.sampled(TraceId::random(), None));
        // Not parent-based: the caller's flag is ignored.
        let ratio_only = Sampler { ratio: 0.0, parent_based: false };
        assert!(!ratio_only.sampled(TraceId::random(), Some(&parent(true))));
    }
}
