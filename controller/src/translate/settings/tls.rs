//! The ConfigMap's TLS keys beyond versions, suites and the session cache:
//! `ssl-session-tickets`, `ssl-session-ticket-key`, `enable-ocsp`, `ssl-ecdh-curve`,
//! `ssl-buffer-size`, `ssl-reject-handshake`, and `proxy-ssl-location-only` (checked only).
//! Defaults are ingress-nginx's (its
//! `internal/ingress/controller/config/config.go`: tickets off, no key, no stapling, curves
//! `auto`, no rejection) except `ssl-buffer-size` (ingress-nginx: 4k; weir: 16k, the TLS maximum).

use weir_dataplane::model::tls_keys::{KxGroup, TicketSecret, TlsKeys};

use super::Ctx;
use crate::translate::annotations::values;
use crate::translate::warnings::Reason;

/// `ssl-session-ticket-key`: base64 of 48 or 80 bytes.
pub(super) fn ticket_key(s: &str) -> Result<TicketSecret, String> {
    TicketSecret::from_base64(s)
        .map_err(|why| format!("{why}; make one with: openssl rand 80 | openssl enc -A -base64"))
}

/// `ssl-ecdh-curve`: `auto` (rustls's list) or OpenSSL group names separated by `:`, in order of
/// preference.
pub(super) fn groups(s: &str) -> Result<Option<Vec<KxGroup>>, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    let mut groups = Vec::new();
    for name in s.split(':').map(str::trim) {
        let group = match name.to_ascii_lowercase().as_str() {
            "x25519mlkem768" => KxGroup::X25519MLKEM768,
            "x25519" => KxGroup::X25519,
            "prime256v1" | "secp256r1" | "p-256" => KxGroup::Secp256r1,
            "secp384r1" | "p-384" => KxGroup::Secp384r1,
            _ => {
                return Err(format!(
                    "{name:?} is not a group weir has (X25519MLKEM768, X25519, prime256v1, secp384r1; no X448, P-521 or finite-field groups)"
                ));
            }
        };
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    Ok(Some(groups))
}

/// `ssl-buffer-size`: an nginx size, at least 32 bytes; more than 16k is 16k (a TLS record
/// carries no more).
pub(super) fn record_size(s: &str) -> Result<u32, String> {
    match values::size(s)? {
        n if n < 32 => Err("less than 32 bytes of data per TLS record".to_string()),
        n => Ok(n.min(16_384) as u32),
    }
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
        keys.kx_groups = self.value("ssl-ecdh-curve", groups, "auto").flatten();
        keys.record_size = self.value("ssl-buffer-size", record_size, "16k");
        keys.reject_unknown_sni = self.value("ssl-reject-handshake", values::boolean, "false");
        // ingress-nginx (default false) also writes an Ingress's `proxy-ssl-*` annotations at
        // the server level, where other Ingresses' locations of the host inherit them; weir
        // applies them to the Ingress's own backends only, which is what "true" asks for.
        if self.value("proxy-ssl-location-only", values::boolean, "false") == Some(false) {
            self.warn(
                Reason::UnsupportedSetting,
                "data[proxy-ssl-location-only]: ignored: weir applies proxy-ssl-* annotations to the Ingress's own backends only, as with \"true\"; other Ingresses of the host do not inherit them".to_string(),
            );
        }
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
    fn groups_record_size_and_unknown_names() {
        use weir_dataplane::model::tls_keys::KxGroup::*;
        let groups = |v: &str| keys(&[("ssl-ecdh-curve", v)]).0.kx_groups;
        assert_eq!(groups("auto"), None);
        assert_eq!(groups("X25519:prime256v1:secp384r1"), Some(vec![X25519, Secp256r1, Secp384r1]));
        assert_eq!(groups("secp384r1:P-256:x25519:X25519"), Some(vec![Secp384r1, Secp256r1, X25519]));
        assert_eq!(groups("X25519MLKEM768"), Some(vec![X25519MLKEM768]));
        for bad in ["X448", "X25519:secp521r1", "ffdhe2048", "X25519::P-256"] {
            let (k, severity, message) = one(&[("ssl-ecdh-curve", bad)]);
            assert_eq!((k.kx_groups, severity), (None, Severity::Error), "{bad}");
            assert!(message.contains("not a group weir has"), "{message}");
        }
        let size = |v: &str| keys(&[("ssl-buffer-size", v)]).0.record_size;
        assert_eq!(size("4k"), Some(4096));
        assert_eq!(size("16k"), Some(16_384));
        assert_eq!(size("1m"), Some(16_384), "a record carries 16k at most");
        assert_eq!(size("1400"), Some(1400));
        for bad in ["16", "0", "lots"] {
            let (k, severity, _) = one(&[("ssl-buffer-size", bad)]);
            assert_eq!((k.record_size, severity), (None, Severity::Error), "{bad}");
        }
        assert_eq!(keys(&[("ssl-reject-handshake", "true")]).0.reject_unknown_sni, Some(true));
        let (_, severity, _) = one(&[("ssl-reject-handshake", "sure")]);
        assert_eq!(severity, Severity::Error);
    }

    #[test]
    fn proxy_ssl_location_only_is_what_weir_does() {
        let (_, warnings) = keys(&[("proxy-ssl-location-only", "true")]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let (_, severity, message) = one(&[("proxy-ssl-location-only", "false")]);
        assert_eq!(severity, Severity::Warning);
        assert!(message.contains("own backends only"), "{message}");
        let (_, severity, _) = one(&[("proxy-ssl-location-only", "often")]);
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
