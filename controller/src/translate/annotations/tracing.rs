//! The OpenTelemetry annotations: `enable-opentelemetry`, `opentelemetry-trust-incoming-span`,
//! `opentelemetry-operation-name`, each overriding the ConfigMap key of the same name for the
//! Ingress's routes. They need the ConfigMap's `otlp-collector-host` (spans need somewhere to
//! go); without it they are kept in the table and have no effect.

use weir_dataplane::model::otel::RouteTrace;

use super::{Ctx, values};
use crate::translate::settings::operation_name;

impl Ctx<'_, '_> {
    /// The route's tracing settings; `None` when no annotation sets one.
    pub(super) fn trace(&mut self) -> Option<RouteTrace> {
        let trace = RouteTrace {
            enabled: self.value("enable-opentelemetry", values::boolean),
            trust_incoming: self.value("opentelemetry-trust-incoming-span", values::boolean),
            operation_name: self.value("opentelemetry-operation-name", operation_name),
        };
        (trace != RouteTrace::default()).then_some(trace)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_dataplane::model::ObjectRef;

    use super::super::{Refs, parse};
    use super::*;
    use crate::translate::warnings::Warnings;

    fn trace(pairs: &[(&str, &str)]) -> (Option<Box<RouteTrace>>, usize) {
        let map: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), v.to_string())).collect();
        let (secrets, config_maps) = (crate::snapshot::Objects::new(), crate::snapshot::Objects::new());
        let refs = Refs {
            secrets: &secrets,
            config_maps: &config_maps,
            allowed_response_headers: None,
            guards: &crate::translate::annotations::risk::DEFAULTS,
        };
        let mut warnings = Warnings::default();
        let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
        (parsed.policy.trace, warnings.finish().len())
    }

    #[test]
    fn the_annotations_override_the_configmap_per_ingress() {
        assert_eq!(trace(&[]), (None, 0));
        let (t, findings) = trace(&[
            ("enable-opentelemetry", "true"),
            ("opentelemetry-trust-incoming-span", "false"),
            ("opentelemetry-operation-name", "$request_method $ingress_name"),
        ]);
        assert_eq!(findings, 0);
        assert_eq!(
            t.as_deref(),
            Some(&RouteTrace {
                enabled: Some(true),
                trust_incoming: Some(false),
                operation_name: Some("$request_method $ingress_name".into()),
            })
        );
        let (t, _) = trace(&[("enable-opentelemetry", "false")]);
        assert_eq!(t.and_then(|t| t.enabled), Some(false));
        // Invalid values are errors and set nothing.
        assert_eq!(trace(&[("enable-opentelemetry", "yes")]), (None, 1));
        assert_eq!(trace(&[("opentelemetry-operation-name", "$upstream_addr")]), (None, 1));
    }
}
