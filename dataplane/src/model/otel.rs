//! OpenTelemetry tracing settings: the global ones (ConfigMap `enable-opentelemetry`,
//! `otlp-collector-*`, `otel-*`), part of the table's [`super::Settings`], and a route's own
//! (annotations `enable-opentelemetry`, `opentelemetry-trust-incoming-span`,
//! `opentelemetry-operation-name`), part of its [`super::RoutePolicy`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where spans go and which requests make them. Present when a collector is configured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Otel {
    /// Routes trace unless their Ingress says otherwise (`enable-opentelemetry`).
    pub enabled: bool,
    /// The OTLP/gRPC collector's host name or address (`otlp-collector-host`).
    pub collector_host: String,
    /// Its port (`otlp-collector-port`, 4317 by default).
    pub collector_port: u16,
    /// `service.name` of the spans' resource (`otel-service-name`, `nginx` in ingress-nginx,
    /// `weir` here).
    pub service_name: String,
    /// Share of new traces recorded, 0 to 1 (`otel-sampler`: `AlwaysOn` is 1, `AlwaysOff` 0,
    /// `TraceIdRatioBased` takes `otel-sampler-ratio`).
    pub sampler_ratio: Ratio,
    /// A trusted incoming `traceparent`'s sampled flag decides instead (`otel-sampler-parent-based`).
    pub parent_based: bool,
    /// An incoming `traceparent` is continued (`opentelemetry-trust-incoming-span`); else every
    /// request starts a trace.
    pub trust_incoming: bool,
    /// The span name, an nginx-variables template (`opentelemetry-operation-name`); `None`:
    /// `METHOD route-path`, as OpenTelemetry's HTTP conventions name server spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_name: Option<String>,
    /// Finished spans waiting for export; more are dropped and counted (`otel-max-queuesize`).
    pub max_queue: u32,
    /// Longest wait before a partly filled batch is sent, in milliseconds
    /// (`otel-schedule-delay-millis`).
    pub schedule_delay_ms: u32,
    /// Most spans in one export request (`otel-max-export-batch-size`).
    pub max_batch: u32,
}

/// A route's own tracing settings; `None` fields follow [`Otel`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTrace {
    /// `enable-opentelemetry` on the Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `opentelemetry-trust-incoming-span` on the Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_incoming: Option<bool>,
    /// `opentelemetry-operation-name` on the Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_name: Option<String>,
}

/// A share from 0 to 1 (checked when read).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio(f64);

// A NaN never passes `Ratio::new`: equality is an equivalence.
impl Eq for Ratio {}

impl Ratio {
    /// Every trace.
    pub const ALL: Ratio = Ratio(1.0);
    /// No trace.
    pub const NONE: Ratio = Ratio(0.0);

    /// `share` when it is a number from 0 to 1.
    pub fn new(share: f64) -> Option<Ratio> {
        (0.0..=1.0).contains(&share).then_some(Ratio(share))
    }

    /// The share.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl Serialize for Ratio {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ratio, D::Error> {
        let share = f64::deserialize(d)?;
        Ratio::new(share)
            .ok_or_else(|| serde::de::Error::custom(format!("{share} is not a ratio from 0 to 1")))
    }
}
