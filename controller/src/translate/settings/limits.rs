//! The ConfigMap's response settings: `limit-rate` and `limit-rate-after` (bytes, as nginx's
//! `limit_rate` there, unlike the annotations' kilobytes), `proxy-redirect-from`/`-to`,
//! `proxy-cookie-domain`, `proxy-cookie-path`, `preserve-trailing-slash`; and the status of
//! `limit-connections` refusals.

use super::Ctx;
use crate::translate::annotations::limits::{self, ResponseSettings};
use crate::translate::annotations::values;

/// A status from 400 to 599.
pub(super) fn status_code(v: &str) -> Result<u16, String> {
    match v.parse::<u16>() {
        Ok(code @ 400..=599) => Ok(code),
        _ => Err("expected a status from 400 to 599".to_string()),
    }
}

impl Ctx<'_, '_> {
    /// The defaults of the routes' response settings.
    pub(super) fn response_settings(&mut self) -> ResponseSettings {
        ResponseSettings {
            rate: self.value("limit-rate", values::size, "0, unlimited"),
            rate_after: self.value("limit-rate-after", values::size, "0"),
            redirect_from: self.value("proxy-redirect-from", limits::redirect_from, "off"),
            redirect_to: self.value("proxy-redirect-to", limits::redirect_to, "off"),
            cookie_domain: self.value("proxy-cookie-domain", limits::cookie_domain, "off"),
            cookie_path: self.value("proxy-cookie-path", limits::cookie_path, "off"),
            preserve_trailing_slash: self.value("preserve-trailing-slash", values::boolean, "false"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use weir_dataplane::model::{ConnLimit, ObjectRef, Replace, ResponseRate, RoutePolicy};

    use super::super::parse;
    use crate::translate::warnings::{ObjectKind, Reason, Severity, Warnings};

    fn routes(
        pairs: &[(&str, &str)],
    ) -> (super::super::RouteDefaults, Vec<crate::translate::warnings::Warning>) {
        let data: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut warnings = Warnings::default();
        let parsed = parse(
            &ObjectRef::new("ingress-nginx", "controller"),
            &data,
            &crate::snapshot::Objects::new(),
            &mut warnings,
        );
        (parsed.routes, warnings.finish())
    }

    #[test]
    fn configmap_response_settings() {
        let (defaults, w) = routes(&[
            ("limit-rate", "65536"),
            ("limit-rate-after", "1m"),
            ("proxy-redirect-from", "http://internal/"),
            ("proxy-redirect-to", "https://public/"),
            ("proxy-cookie-domain", "internal.svc example.org"),
            ("proxy-cookie-path", "/app/ /"),
            ("preserve-trailing-slash", "true"),
            ("limit-conn-status-code", "429"),
        ]);
        assert!(w.is_empty(), "{w:#?}");
        let mut policy = RoutePolicy {
            conn_limit: Some(Box::new(ConnLimit { max: 1, exempt: Vec::new(), status: 503 })),
            ..RoutePolicy::default()
        };
        defaults.apply(&mut policy, true);
        defaults.response.apply(&mut policy);
        assert_eq!(policy.conn_limit.unwrap().status, 429);
        // The ConfigMap's rate is in bytes, as nginx's `limit_rate` there.
        assert_eq!(
            policy.response_rate,
            Some(Box::new(ResponseRate { bytes_per_sec: 65536, after_bytes: 1 << 20 }))
        );
        let replace = |from: &str, to: &str| Some(Box::new(Replace { from: from.into(), to: to.into() }));
        assert_eq!(policy.redirect_rewrite, replace("http://internal/", "https://public/"));
        assert_eq!(policy.cookie_domain, replace("internal.svc", "example.org"));
        assert_eq!(policy.cookie_path, replace("/app/", "/"));
        assert!(policy.preserve_trailing_slash);
    }

    #[test]
    fn configmap_response_settings_rejected() {
        for (key, bad) in [
            ("limit-rate", "fast"),
            ("limit-rate-after", "-1"),
            ("proxy-redirect-from", "~^/x"),
            ("proxy-redirect-to", "https://$host/"),
            ("proxy-cookie-domain", "only-one"),
            ("proxy-cookie-path", "relative /"),
            ("preserve-trailing-slash", "maybe"),
            ("limit-conn-status-code", "200"),
        ] {
            let (defaults, w) = routes(&[(key, bad), ("limit-req-status-code", "429")]);
            assert_eq!(w.len(), 1, "{key}: {w:#?}");
            assert_eq!(
                (w[0].kind, w[0].severity, w[0].reason),
                (ObjectKind::ConfigMap, Severity::Error, Reason::InvalidSetting)
            );
            assert!(w[0].message.starts_with(&format!("data[{key}]: invalid value")), "{}", w[0].message);
            assert_eq!(defaults.response, Default::default(), "{key}: the default is kept");
            // The other keys apply.
            let mut policy = RoutePolicy {
                rate_limit: Some(Box::new(weir_dataplane::model::RateLimit {
                    rps: Some(1),
                    rpm: None,
                    burst_multiplier: 1,
                    exempt: Vec::new(),
                    status: 503,
                })),
                conn_limit: Some(Box::new(ConnLimit { max: 1, exempt: Vec::new(), status: 503 })),
                ..RoutePolicy::default()
            };
            defaults.apply(&mut policy, true);
            assert_eq!(policy.rate_limit.unwrap().status, 429);
            assert_eq!(policy.conn_limit.unwrap().status, 503);
        }
    }
}
