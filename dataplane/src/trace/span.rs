//! One request's server span: started when the request is routed (its ids, its parent if the
//! incoming context is trusted, the sampling decision, the request's attributes), finished when
//! the response's last byte has gone out or the client went away (status, end time), then
//! handed to the exporter when sampled.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderValue, USER_AGENT};
use http::{Method, Version};

use super::context::{Incoming, SpanId, TraceId, TraceParent, TraceState};
use super::export::Exporter;
use super::otlp;

/// What a request tells its span when it starts.
pub struct RequestInfo<'a> {
    /// The request's headers as the client sent them (`traceparent`, `User-Agent`).
    pub headers: &'a HeaderMap,
    /// Its method.
    pub method: &'a Method,
    /// Its path, as sent.
    pub path: &'a str,
    /// Its query, if any.
    pub query: Option<&'a str>,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The host it was routed on.
    pub host: &'a str,
    /// The listener's port.
    pub port: u16,
    /// The client's address (behind trusted proxies, the one they name).
    pub client: IpAddr,
    /// The HTTP version.
    pub version: Version,
    /// The matched route's path rule (`http.route`).
    pub route: Option<&'a str>,
    /// The route's Ingress namespace and name.
    pub ingress: Option<(&'a str, &'a str)>,
    /// The route's Service name and port.
    pub service: Option<(&'a str, String)>,
}

/// A span from its start to its end.
#[derive(Debug)]
pub struct ActiveSpan {
    /// The trace.
    pub trace_id: TraceId,
    /// This span (the `parent-id` the upstream sees).
    pub span_id: SpanId,
    /// The caller's span, when a trusted incoming context was continued.
    pub parent: Option<SpanId>,
    /// The caller's `tracestate`, passed on.
    pub state: Option<TraceState>,
    /// Whether the span is recorded and exported.
    pub sampled: bool,
    /// The recording part, only when sampled.
    recording: Option<Recording>,
}

#[derive(Debug)]
struct Recording {
    name: String,
    start_unix_nano: u64,
    attributes: Vec<otlp::KeyValue>,
    exporter: Arc<Exporter>,
}

/// Nanoseconds since the Unix epoch.
fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `network.protocol.version`'s value.
fn protocol_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_11 => "1.1",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "",
    }
}

impl ActiveSpan {
    /// Starts the span of a request: `incoming` is the context to continue (already judged
    /// trustworthy), `sampled` the sampler's decision, `name` the span's name.
    pub(super) fn start(
        incoming: Option<Incoming>,
        trace_id: TraceId,
        sampled: bool,
        name: String,
        info: &RequestInfo<'_>,
        exporter: &Arc<Exporter>,
    ) -> ActiveSpan {
        let (parent, state) = match incoming {
            Some(i) => (Some(i.parent.parent_id), i.state),
            None => (None, None),
        };
        let recording = sampled.then(|| Recording {
            name,
            start_unix_nano: now_unix_nano(),
            attributes: attributes(info),
            exporter: exporter.clone(),
        });
        ActiveSpan { trace_id, span_id: SpanId::random(), parent, state, sampled, recording }
    }

    /// The `traceparent` sent upstream and to the authentication service: this span as parent.
    pub fn traceparent(&self) -> HeaderValue {
        TraceParent::header(self.trace_id, self.span_id, self.sampled)
    }

    /// Ends the span with the response's status and, when sampled, queues it for export.
    pub fn finish(self, status: u16) {
        let Some(rec) = self.recording else { return };
        let mut attributes = rec.attributes;
        attributes.push(otlp::int("http.response.status_code", i64::from(status)));
        // Server spans: 5xx is an error, 4xx is the client's (OpenTelemetry's HTTP conventions).
        let error = status >= 500;
        if error {
            attributes.push(otlp::string("error.type", status.to_string()));
        }
        let span = otlp::Span {
            trace_id: self.trace_id.0.to_vec(),
            span_id: self.span_id.0.to_vec(),
            trace_state: self.state.as_ref().map_or_else(String::new, |s| s.as_str().to_string()),
            parent_span_id: self.parent.map_or_else(Vec::new, |p| p.0.to_vec()),
            name: rec.name,
            kind: otlp::SPAN_KIND_SERVER,
            start_time_unix_nano: rec.start_unix_nano,
            end_time_unix_nano: now_unix_nano().max(rec.start_unix_nano),
            attributes,
            status: error.then(|| otlp::Status { message: String::new(), code: otlp::STATUS_CODE_ERROR }),
            flags: u32::from(self.sampled),
        };
        rec.exporter.submit(span);
    }
}

/// The request's attributes, OpenTelemetry's HTTP server conventions plus the route's
/// Kubernetes objects.
fn attributes(info: &RequestInfo<'_>) -> Vec<otlp::KeyValue> {
    let mut a = Vec::with_capacity(16);
    a.push(otlp::string("http.request.method", info.method.as_str()));
    a.push(otlp::string("url.path", info.path));
    if let Some(query) = info.query {
        a.push(otlp::string("url.query", query));
    }
    a.push(otlp::string("url.scheme", info.scheme));
    a.push(otlp::string("server.address", info.host));
    a.push(otlp::int("server.port", i64::from(info.port)));
    a.push(otlp::string("client.address", info.client.to_string()));
    a.push(otlp::string("network.protocol.name", "http"));
    a.push(otlp::string("network.protocol.version", protocol_version(info.version)));
    if let Some(agent) = info.headers.get(USER_AGENT).and_then(|v| v.to_str().ok()) {
        a.push(otlp::string("user_agent.original", agent));
    }
    if let Some(route) = info.route {
        a.push(otlp::string("http.route", route));
    }
    if let Some((namespace, name)) = info.ingress {
        a.push(otlp::string("k8s.namespace.name", namespace));
        a.push(otlp::string("k8s.ingress.name", name));
    }
    if let Some((service, port)) = &info.service {
        a.push(otlp::string("k8s.service.name", *service));
        a.push(otlp::string("k8s.service.port", port.clone()));
    }
    a
}
