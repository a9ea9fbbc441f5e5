//! The ConfigMap's TLS keys beyond versions, suites and the session cache:
//! `ssl-session-tickets`, `ssl-session-ticket-key`, `enable-ocsp` (defaults are ingress-nginx's, from its
//! `internal/ingress/controller/config/config.go`: tickets off, no key, no stapling).

use weir_dataplane::model::tls_keys::{TicketSecret, TlsKeys};

use super::Ctx;
use crate::translate::annotations::values;

/// `ssl-session-ticket-key`: base64 of 48 or 80 bytes.
pub(super) fn ticket_key(s: &str) -> Result<TicketSecret, String> {
    TicketSecret::from_base64(s)
        .map_err(|why| format!("{why}; make one with: openssl rand 80 | openssl enc -A -base64"))
}

impl Ctx<'_, '_> {
    /// The TLS keys of [`TlsKeys`].
    pub(super) fn tls_keys(&mut self) -> TlsKeys {
        let mut keys = TlsKeys {
            session_tickets: self.value("ssl-session-tickets", values::boolean, "false"),
            ocsp: self.value("enable-ocsp", values::boolean, "false"),
            ..TlsKeys::default()
        };
        keys.session_ticket_key = self.value_or(
            "ssl-session-ticket-key",
            ticket_key,
            "tickets are sealed with a random key of each replica's own (replicas do not resume each other's sessions)",
        );
        if keys.session_tickets != Some(true) {
            self.unused_without(&["ssl-session-ticket-key"], "ssl-session-tickets: \"true\"");
        }
        keys
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use weir_dataplane::model::ObjectRef;
    use weir_dataplane::model::tls_keys::TlsKeys;

    use crate::translate::warnings::{Severity, Warning, Warnings};

    /// The TLS keys of a ConfigMap with `pairs`, and its findings.
    fn keys(pairs: &[(&str, &str)]) -> (TlsKeys, Vec<Warning>) {
        let data: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut warnings = Warnings::default();
        let parsed = super::super::parse(
            &ObjectRef::new("ingress-nginx", "controller"),
            &data,
            &crate::snapshot::Objects::new(),
            &mut warnings,
        );
        (parsed.settings.tls_keys, warnings.finish())
    }

    /// The one finding of `pairs`: its severity and message.
    fn one(pairs: &[(&str, &str)]) -> (TlsKeys, Severity, String) {
        let (keys, mut warnings) = keys(pairs);
        assert_eq!(warnings.len(), 1, "{pairs:?}: {warnings:#?}");
        let w = warnings.remove(0);
        (keys, w.severity, w.message)
    }

    #[test]
    fn session_tickets_and_their_key() {
        let (unset, warnings) = keys(&[]);
        assert!(unset.is_empty() && warnings.is_empty(), "{unset:?} {warnings:?}");
        let b64_80 = "A".repeat(107) + "="; // 80 zero bytes
        let b64_48 = "B".repeat(64);
        for (key, len) in [(&b64_80, 80), (&b64_48, 48)] {
            let (k, warnings) = keys(&[("ssl-session-tickets", "true"), ("ssl-session-ticket-key", key)]);
            assert!(warnings.is_empty(), "{warnings:?}");
            assert_eq!(k.session_tickets, Some(true));
            assert!(matches!(k.session_ticket_key, Some(s) if s.0.len() == len));
        }
        // A bad key: an error, and tickets stay on with each replica's own random key.
        for bad in ["not base64!", "AAAA", &"A".repeat(100)] {
            let (k, severity, message) =
                one(&[("ssl-session-tickets", "true"), ("ssl-session-ticket-key", bad)]);
            assert_eq!(severity, Severity::Error);
            assert!(message.starts_with("data[ssl-session-ticket-key]: invalid value"), "{message}");
            assert!(message.contains("openssl rand 80"), "{message}");
            assert_eq!((k.session_tickets, k.session_ticket_key), (Some(true), None));
        }
        // A key without tickets on does nothing: said.
        let (k, severity, message) = one(&[("ssl-session-ticket-key", &b64_80)]);
        assert_eq!(severity, Severity::Warning);
        assert!(message.contains("no effect without ssl-session-tickets"), "{message}");
        assert_eq!(k.session_tickets, None);
        let (_, severity, _) = one(&[("ssl-session-tickets", "maybe")]);
        assert_eq!(severity, Severity::Error);
    }

    #[test]
    fn ocsp_stapling() {
        assert_eq!(keys(&[("enable-ocsp", "true")]).0.ocsp, Some(true));
        assert_eq!(keys(&[("enable-ocsp", "false")]).0.ocsp, Some(false));
        let (k, severity, message) = one(&[("enable-ocsp", "yes please")]);
        assert_eq!((k.ocsp, severity), (None, Severity::Error), "{message}");
    }
}
