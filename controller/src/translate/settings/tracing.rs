//! The ConfigMap's OpenTelemetry keys: `enable-opentelemetry`, `otlp-collector-host`,
//! `otlp-collector-port`, `otel-service-name`, `otel-sampler`, `otel-sampler-ratio`,
//! `otel-sampler-parent-based`, `opentelemetry-trust-incoming-span`,
//! `opentelemetry-operation-name`, `otel-max-queuesize`, `otel-schedule-delay-millis`,
//! `otel-max-export-batch-size`. Defaults are ingress-nginx's
//! (`internal/ingress/controller/config/config.go`), except the service name (`weir`).
//!
//! Tracing needs a collector: without `otlp-collector-host` nothing is traced, and the other
//! keys are reported as having no effect. With one, `enable-opentelemetry` says whether routes
//! trace unless their Ingress says otherwise (the `enable-opentelemetry` annotation can turn it
//! on for one Ingress, as in ingress-nginx).

use weir_dataplane::model::otel::{Otel, Ratio};

use super::Ctx;
use crate::translate::annotations::values;
use crate::translate::warnings::Reason;

/// ingress-nginx's defaults.
const DEFAULT_PORT: u16 = 4317;
const DEFAULT_RATIO: f64 = 0.01;
const DEFAULT_QUEUE: u32 = 2048;
const DEFAULT_DELAY_MS: u32 = 5000;
const DEFAULT_BATCH: u32 = 512;
/// weir's `service.name` where `otel-service-name` is not set (ingress-nginx's is `nginx`).
pub(crate) const DEFAULT_SERVICE_NAME: &str = "weir";

/// The keys that mean nothing without a collector.
const NEEDS_COLLECTOR: &[&str] = &[
    "enable-opentelemetry",
    "otlp-collector-port",
    "otel-service-name",
    "otel-sampler",
    "otel-sampler-ratio",
    "otel-sampler-parent-based",
    "opentelemetry-trust-incoming-span",
    "opentelemetry-operation-name",
    "otel-max-queuesize",
    "otel-schedule-delay-millis",
    "otel-max-export-batch-size",
];

/// `otel-sampler`: the share of new traces it records (`TraceIdRatioBased`: `None`, the ratio
/// key decides).
fn sampler(s: &str) -> Result<Option<Ratio>, String> {
    match s {
        "AlwaysOn" => Ok(Some(Ratio::ALL)),
        "AlwaysOff" => Ok(Some(Ratio::NONE)),
        "TraceIdRatioBased" => Ok(None),
        _ => Err("expected AlwaysOn, AlwaysOff or TraceIdRatioBased".into()),
    }
}

/// `otel-sampler-ratio`: a number from 0 to 1.
fn ratio(s: &str) -> Result<Ratio, String> {
    s.parse::<f64>().ok().and_then(Ratio::new).ok_or_else(|| "expected a number from 0 to 1".into())
}

/// `otel-service-name`: printable text.
fn service_name(s: &str) -> Result<String, String> {
    if s.len() <= 255 && s.chars().all(|c| !c.is_control()) {
        Ok(s.to_string())
    } else {
        Err("expected up to 255 printable characters".into())
    }
}

/// `opentelemetry-operation-name` (ConfigMap and annotation): an nginx-variables template.
pub(crate) fn operation_name(s: &str) -> Result<String, String> {
    if s.chars().any(char::is_control) || s.len() > 1024 {
        return Err("expected up to 1024 printable characters".into());
    }
    weir_dataplane::trace::check_operation_name(s).map(|()| s.to_string())
}

/// A count from `min` to `max`.
fn count(min: u32, max: u32) -> impl Fn(&str) -> Result<u32, String> {
    move |s| match s.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number from {min} to {max}")),
    }
}

impl Ctx<'_, '_> {
    /// The tracing settings; `None` without a collector.
    pub(super) fn otel(&mut self) -> Option<Otel> {
        let host = self.value_or("otlp-collector-host", values::host, "nothing is traced");
        let Some(collector_host) = host else {
            if self.raw("otlp-collector-host").is_none() {
                self.unused_without(NEEDS_COLLECTOR, "otlp-collector-host");
            }
            return None;
        };
        let enabled = self.value("enable-opentelemetry", values::boolean, "false").unwrap_or(false);
        let collector_port = self.value("otlp-collector-port", values::port, "4317").unwrap_or(DEFAULT_PORT);
        let service_name = self
            .value("otel-service-name", service_name, DEFAULT_SERVICE_NAME)
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
        let chosen = self.value("otel-sampler", sampler, "AlwaysOff").unwrap_or(Some(Ratio::NONE));
        let ratio_value = self.value("otel-sampler-ratio", ratio, "0.01");
        let sampler_ratio = match chosen {
            Some(fixed) => {
                if ratio_value.is_some() {
                    self.unused_without(&["otel-sampler-ratio"], "otel-sampler: TraceIdRatioBased");
                }
                fixed
            }
            None => ratio_value.or(Ratio::new(DEFAULT_RATIO)).unwrap_or(Ratio::NONE),
        };
        let parent_based = self.value("otel-sampler-parent-based", values::boolean, "false").unwrap_or(false);
        let trust_incoming =
            self.value("opentelemetry-trust-incoming-span", values::boolean, "true").unwrap_or(true);
        let operation_name = self.value("opentelemetry-operation-name", operation_name, "METHOD route-path");
        let max_queue = self.value("otel-max-queuesize", count(1, 1 << 20), "2048").unwrap_or(DEFAULT_QUEUE);
        let schedule_delay_ms =
            self.value("otel-schedule-delay-millis", count(0, 600_000), "5000").unwrap_or(DEFAULT_DELAY_MS);
        let mut max_batch =
            self.value("otel-max-export-batch-size", count(1, 1 << 20), "512").unwrap_or(DEFAULT_BATCH);
        if max_batch > max_queue {
            self.error(
                Reason::InvalidSetting,
                format!(
                    "data[otel-max-export-batch-size]: {max_batch} is more than otel-max-queuesize ({max_queue}); batches hold at most {max_queue} spans"
                ),
            );
            max_batch = max_queue;
        }
        Some(Otel {
            enabled,
            collector_host,
            collector_port,
            service_name,
            sampler_ratio,
            parent_based,
            trust_incoming,
            operation_name,
            max_queue,
            schedule_delay_ms,
            max_batch,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_dataplane::model::ObjectRef;

    use super::*;
    use crate::translate::warnings::{Severity, Warning, Warnings};

    /// The tracing settings of a ConfigMap's `pairs`, and the findings.
    fn otel(pairs: &[(&str, &str)]) -> (Option<Otel>, Vec<Warning>) {
        let data: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut warnings = Warnings::default();
        let cm = ObjectRef::new("ingress-nginx", "controller");
        let parsed = super::super::parse(&cm, &data, &crate::snapshot::Objects::new(), &mut warnings);
        (parsed.settings.otel, warnings.finish())
    }

    #[test]
    fn ingress_nginx_defaults_with_a_collector() {
        let (o, w) = otel(&[("otlp-collector-host", "otel.observability.svc")]);
        assert!(w.is_empty(), "{w:#?}");
        let o = o.expect("a collector");
        assert_eq!(
            o,
            Otel {
                enabled: false,
                collector_host: "otel.observability.svc".into(),
                collector_port: 4317,
                service_name: "weir".into(),
                sampler_ratio: Ratio::NONE,
                parent_based: false,
                trust_incoming: true,
                operation_name: None,
                max_queue: 2048,
                schedule_delay_ms: 5000,
                max_batch: 512,
            }
        );
    }

    #[test]
    fn every_key_is_read() {
        let (o, w) = otel(&[
            ("enable-opentelemetry", "true"),
            ("otlp-collector-host", "127.0.0.1"),
            ("otlp-collector-port", "14317"),
            ("otel-service-name", "edge"),
            ("otel-sampler", "TraceIdRatioBased"),
            ("otel-sampler-ratio", "0.5"),
            ("otel-sampler-parent-based", "true"),
            ("opentelemetry-trust-incoming-span", "false"),
            ("opentelemetry-operation-name", "HTTP $request_method $service_name $uri"),
            ("otel-max-queuesize", "100"),
            ("otel-schedule-delay-millis", "50"),
            ("otel-max-export-batch-size", "10"),
        ]);
        assert!(w.is_empty(), "{w:#?}");
        let o = o.expect("a collector");
        assert!(o.enabled && o.parent_based && !o.trust_incoming);
        assert_eq!(
            (o.collector_host.as_str(), o.collector_port, o.service_name.as_str()),
            ("127.0.0.1", 14317, "edge")
        );
        assert_eq!(o.sampler_ratio.get(), 0.5);
        assert_eq!(o.operation_name.as_deref(), Some("HTTP $request_method $service_name $uri"));
        assert_eq!((o.max_queue, o.schedule_delay_ms, o.max_batch), (100, 50, 10));
        let (o, _) = otel(&[("otlp-collector-host", "c"), ("otel-sampler", "TraceIdRatioBased")]);
        assert_eq!(o.map(|o| o.sampler_ratio.get()), Some(0.01));
        let (o, _) = otel(&[("otlp-collector-host", "c"), ("otel-sampler", "AlwaysOn")]);
        assert_eq!(o.map(|o| o.sampler_ratio), Some(Ratio::ALL));
    }

    #[test]
    fn bad_values_are_errors_naming_the_key_and_keep_the_default() {
        for (key, value) in [
            ("otlp-collector-port", "0"),
            ("otel-sampler", "Sometimes"),
            ("otel-sampler-ratio", "2"),
            ("otel-sampler-parent-based", "yes"),
            ("opentelemetry-trust-incoming-span", "maybe"),
            ("opentelemetry-operation-name", "$status"),
            ("otel-max-queuesize", "0"),
            ("otel-schedule-delay-millis", "-1"),
            ("otel-max-export-batch-size", "x"),
            ("enable-opentelemetry", "on"),
        ] {
            let base = [("otlp-collector-host", "c"), ("otel-sampler", "TraceIdRatioBased")];
            let base: Vec<_> = base.into_iter().filter(|(k, _)| *k != key).collect();
            let (o, w) = otel(&[&base[..], &[(key, value)]].concat());
            assert_eq!(w.len(), 1, "{key}: {w:#?}");
            assert_eq!(w[0].severity, Severity::Error);
            assert!(w[0].message.starts_with(&format!("data[{key}]: invalid value")), "{}", w[0].message);
            let (defaults, _) = otel(&base);
            assert_eq!(o, defaults, "{key}");
        }
        // A bad collector host traces nothing.
        let (o, w) = otel(&[("otlp-collector-host", "http://c:4317"), ("enable-opentelemetry", "true")]);
        assert!(o.is_none());
        assert_eq!(w.len(), 1, "{w:#?}");
        // A batch larger than the queue is cut to it.
        let (o, w) = otel(&[
            ("otlp-collector-host", "c"),
            ("otel-max-queuesize", "10"),
            ("otel-max-export-batch-size", "20"),
        ]);
        assert_eq!(o.map(|o| o.max_batch), Some(10));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn without_a_collector_the_keys_have_no_effect_and_say_so() {
        let (o, w) = otel(&[("enable-opentelemetry", "true"), ("otel-sampler", "AlwaysOn")]);
        assert!(o.is_none());
        assert_eq!(w.len(), 2, "{w:#?}");
        assert!(w.iter().all(|w| w.message.contains("has no effect without otlp-collector-host")), "{w:#?}");
    }

    #[test]
    fn values() {
        assert_eq!(sampler("AlwaysOn"), Ok(Some(Ratio::ALL)));
        assert_eq!(sampler("TraceIdRatioBased"), Ok(None));
        assert!(sampler("alwayson").is_err());
        assert_eq!(ratio("0.25").map(Ratio::get), Ok(0.25));
        for bad in ["-0.1", "1.5", "NaN", "x", ""] {
            assert!(ratio(bad).is_err(), "{bad}");
        }
        assert_eq!(
            values::host("Otel-Collector.observability.svc."),
            Ok("otel-collector.observability.svc".into())
        );
        assert_eq!(values::host("[::1]"), Ok("::1".into()));
        for bad in ["http://c", "c:4317", "a b", "-a", "a..b", ""] {
            assert!(values::host(bad).is_err(), "{bad}");
        }
        assert!(
            values::port("0").is_err() && values::port("65536").is_err() && values::port("4317") == Ok(4317)
        );
        assert!(operation_name("HTTP $request_method $uri").is_ok());
        assert!(operation_name("$status").is_err());
        assert!(operation_name("a\nb").is_err());
        assert!(service_name("a\tb").is_err());
    }
}
