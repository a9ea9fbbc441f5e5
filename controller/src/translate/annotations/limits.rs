//! `limit-connections`, `limit-rate`, `limit-rate-after`, `proxy-redirect-from`/`-to`,
//! `proxy-cookie-domain`, `proxy-cookie-path` and `preserve-trailing-slash`.
//!
//! All but `limit-connections` are ConfigMap keys too. [`ResponseSettings`] holds what one
//! source (an Ingress's annotations, or the ConfigMap) says, key by key, so that an annotation
//! beats the ConfigMap for its own key only, as ingress-nginx resolves them; an explicit `off`
//! or `0` in an annotation beats a ConfigMap value.

use weir_dataplane::model::{ConnLimit, Replace, ResponseRate, RoutePolicy};

use super::{Ctx, values};

/// What one source says about the response settings; `None`: not set there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ResponseSettings {
    /// Bytes per second (`0`: unlimited).
    pub(crate) rate: Option<u64>,
    /// Bytes at full speed before the limit.
    pub(crate) rate_after: Option<u64>,
    /// `proxy-redirect-from`; `Some(None)`: `off` or `default`.
    pub(crate) redirect_from: Option<Option<String>>,
    /// `proxy-redirect-to`; `Some(None)`: `off`.
    pub(crate) redirect_to: Option<Option<String>>,
    /// `proxy-cookie-domain`; `Some(None)`: `off`.
    pub(crate) cookie_domain: Option<Option<Replace>>,
    /// `proxy-cookie-path`; `Some(None)`: `off`.
    pub(crate) cookie_path: Option<Option<Replace>>,
    /// `preserve-trailing-slash`.
    pub(crate) preserve_trailing_slash: Option<bool>,
}

impl ResponseSettings {
    /// These settings, with `defaults` for the keys they leave unset.
    pub(crate) fn or(&self, defaults: &ResponseSettings) -> ResponseSettings {
        ResponseSettings {
            rate: self.rate.or(defaults.rate),
            rate_after: self.rate_after.or(defaults.rate_after),
            redirect_from: self.redirect_from.clone().or_else(|| defaults.redirect_from.clone()),
            redirect_to: self.redirect_to.clone().or_else(|| defaults.redirect_to.clone()),
            cookie_domain: self.cookie_domain.clone().or_else(|| defaults.cookie_domain.clone()),
            cookie_path: self.cookie_path.clone().or_else(|| defaults.cookie_path.clone()),
            preserve_trailing_slash: self.preserve_trailing_slash.or(defaults.preserve_trailing_slash),
        }
    }

    /// Sets `policy`'s fields from these settings (ingress-nginx's defaults for unset keys:
    /// everything off).
    pub(crate) fn apply(&self, policy: &mut RoutePolicy) {
        policy.response_rate = match self.rate {
            Some(rate) if rate > 0 => Some(Box::new(ResponseRate {
                bytes_per_sec: rate,
                after_bytes: self.rate_after.unwrap_or(0),
            })),
            _ => None,
        };
        // ingress-nginx writes `proxy_redirect from to` only when neither is `off`.
        policy.redirect_rewrite = match (&self.redirect_from, &self.redirect_to) {
            (Some(Some(from)), Some(Some(to))) => {
                Some(Box::new(Replace { from: from.clone(), to: to.clone() }))
            }
            _ => None,
        };
        policy.cookie_domain = self.cookie_domain.clone().flatten().map(Box::new);
        policy.cookie_path = self.cookie_path.clone().flatten().map(Box::new);
        policy.preserve_trailing_slash = self.preserve_trailing_slash.unwrap_or(false);
    }
}

/// `limit-rate`, `limit-rate-after` (annotations): whole kilobytes (1024 bytes).
pub(crate) fn kilobytes(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|_| "expected a whole number of kilobytes (0: no limit)".to_string())?;
    n.checked_mul(1024).ok_or_else(|| "too large".to_string())
}

/// A literal URL or URL prefix of `proxy_redirect`: no nginx variables, no regex.
fn redirect_text(s: &str) -> Result<String, String> {
    if s.starts_with('~') {
        return Err("regular expressions are not supported; give a literal prefix".into());
    }
    if s.contains('$') {
        return Err("nginx variables are not supported; give a literal text".into());
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("expected a URL or path without spaces".into());
    }
    Ok(s.to_string())
}

/// `proxy-redirect-from`: `off`, `default` (which changes nothing behind weir, as behind
/// ingress-nginx, whose `proxy_pass` names no URL an upstream would send) or a literal prefix.
pub(crate) fn redirect_from(s: &str) -> Result<Option<String>, String> {
    match s {
        "off" | "default" => Ok(None),
        _ => redirect_text(s).map(Some),
    }
}

/// `proxy-redirect-to`: `off` or a literal replacement.
pub(crate) fn redirect_to(s: &str) -> Result<Option<String>, String> {
    match s {
        "off" => Ok(None),
        _ => redirect_text(s).map(Some),
    }
}

/// `proxy-cookie-domain`: `off`, or `FROM TO` (domain names).
pub(crate) fn cookie_domain(s: &str) -> Result<Option<Replace>, String> {
    cookie_pair(s, "domain", values::cookie_domain)
}

/// `proxy-cookie-path`: `off`, or `FROM TO` (paths starting with `/`).
pub(crate) fn cookie_path(s: &str) -> Result<Option<Replace>, String> {
    cookie_pair(s, "path", |p| {
        if !p.starts_with('/') {
            return Err(format!("{p:?} does not start with /"));
        }
        if !p.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'$')) {
            return Err(format!("{p:?} is not a plain path (no ; , or $)"));
        }
        Ok(p.to_string())
    })
}

fn cookie_pair(
    s: &str,
    what: &str,
    check: impl Fn(&str) -> Result<String, String>,
) -> Result<Option<Replace>, String> {
    if s == "off" {
        return Ok(None);
    }
    let words: Vec<&str> = s.split_whitespace().collect();
    let [from, to] = words.as_slice() else {
        return Err(format!("expected off, or two values: the {what} to replace and its replacement"));
    };
    if from.starts_with('~') {
        return Err("regular expressions are not supported; give a literal value".into());
    }
    Ok(Some(Replace { from: check(from)?, to: check(to)? }))
}

impl Ctx<'_, '_> {
    /// The response settings the Ingress's annotations give.
    pub(super) fn response_settings(&mut self) -> ResponseSettings {
        ResponseSettings {
            rate: self.value("limit-rate", kilobytes),
            rate_after: self.value("limit-rate-after", kilobytes),
            redirect_from: self.value("proxy-redirect-from", redirect_from),
            redirect_to: self.value("proxy-redirect-to", redirect_to),
            cookie_domain: self.value("proxy-cookie-domain", cookie_domain),
            cookie_path: self.value("proxy-cookie-path", cookie_path),
            preserve_trailing_slash: self.value("preserve-trailing-slash", values::boolean),
        }
    }

    /// `limit-connections` (`0`: no limit), with the clients `limit-allowlist` (or
    /// `limit-whitelist`) exempts; refused requests get 503 unless the ConfigMap's
    /// `limit-conn-status-code` says otherwise.
    pub(super) fn conn_limit(&mut self) -> Option<ConnLimit> {
        let max = self.value("limit-connections", |v| {
            v.parse::<u32>().map_err(|_| "expected a whole number of requests (0: no limit)".to_string())
        })?;
        if max == 0 {
            return None;
        }
        // The list's problems were reported with limit-rps's.
        let exempt = ["limit-allowlist", "limit-whitelist"]
            .iter()
            .find_map(|name| self.reader.get(name).and_then(|(_, raw)| values::cidr_list(raw.trim()).ok()))
            .unwrap_or_default();
        Some(ConnLimit { max, exempt, status: 503 })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use weir_dataplane::model::ObjectRef;

    use super::super::{NGINX_PREFIX, Parsed, Refs, WEIR_PREFIX, parse};
    use super::*;
    use crate::translate::warnings::{Reason, Severity, Warning, Warnings};

    fn parse_all(pairs: &[(&str, &str)]) -> (Parsed, Vec<Warning>) {
        let map: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string())).collect();
        let (secrets, config_maps) = (crate::snapshot::Objects::new(), crate::snapshot::Objects::new());
        let refs = Refs {
            secrets: &secrets,
            config_maps: &config_maps,
            allowed_response_headers: None,
            guards: &crate::translate::annotations::risk::DEFAULTS,
        };
        let mut warnings = Warnings::default();
        let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
        (parsed, warnings.finish())
    }

    fn clean(pairs: &[(&str, &str)]) -> RoutePolicy {
        let (parsed, w) = parse_all(pairs);
        assert!(w.is_empty(), "{pairs:?}: {w:#?}");
        parsed.policy
    }

    /// The one finding of `pairs`: an error naming the annotation and the value.
    fn rejected(pairs: &[(&str, &str)], name: &str) -> (RoutePolicy, Warning) {
        let (parsed, mut w) = parse_all(pairs);
        assert_eq!(w.len(), 1, "{pairs:?}: {w:#?}");
        let w = w.remove(0);
        assert_eq!((w.severity, w.reason), (Severity::Error, Reason::InvalidAnnotation), "{w:?}");
        assert!(w.object == ObjectRef::new("ns", "ing"));
        assert!(w.message.contains(&format!("[{NGINX_PREFIX}{name}]: invalid value")), "{}", w.message);
        (parsed.policy, w)
    }

    fn replace(from: &str, to: &str) -> Option<Box<Replace>> {
        Some(Box::new(Replace { from: from.into(), to: to.into() }))
    }

    #[test]
    fn limit_connections_accepted_and_rejected() {
        let p = clean(&[("limit-connections", "2"), ("limit-allowlist", "10.0.0.0/8")]);
        let want = ConnLimit { max: 2, exempt: vec!["10.0.0.0/8".parse().unwrap()], status: 503 };
        assert_eq!(p.conn_limit, Some(Box::new(want)));
        assert_eq!(p.rate_limit, None, "the allowlist alone sets no rate limit");
        assert_eq!(clean(&[("limit-connections", "0")]).conn_limit, None, "0: no limit");
        // The old name of the allowlist works too, and the rate limit shares it.
        let p = clean(&[("limit-connections", "1"), ("limit-rps", "5"), ("limit-whitelist", "192.0.2.0/24")]);
        assert_eq!(p.conn_limit.unwrap().exempt, p.rate_limit.unwrap().exempt);

        for bad in ["-1", "two", "1.5"] {
            let (p, w) = rejected(&[("limit-connections", bad), ("limit-rps", "5")], "limit-connections");
            assert_eq!(p.conn_limit, None);
            assert!(p.rate_limit.is_some(), "the route keeps its other settings");
            assert!(w.message.contains("expected a whole number"), "{}", w.message);
        }
    }

    #[test]
    fn limit_rate_accepted_and_rejected() {
        let p = clean(&[("limit-rate", "64"), ("limit-rate-after", "128")]);
        assert_eq!(
            p.response_rate,
            Some(Box::new(ResponseRate { bytes_per_sec: 64 * 1024, after_bytes: 128 * 1024 }))
        );
        assert_eq!(clean(&[("limit-rate", "0")]).response_rate, None, "0: unlimited");
        assert_eq!(clean(&[("limit-rate-after", "10")]).response_rate, None, "nothing to pace");

        let (p, w) = rejected(&[("limit-rate", "64k"), ("limit-rps", "1")], "limit-rate");
        assert_eq!(p.response_rate, None);
        assert!(p.rate_limit.is_some());
        assert!(w.message.contains("kilobytes"), "{}", w.message);
        let (p, _) = rejected(&[("limit-rate", "8"), ("limit-rate-after", "lots")], "limit-rate-after");
        assert_eq!(p.response_rate, Some(Box::new(ResponseRate { bytes_per_sec: 8192, after_bytes: 0 })));
    }

    #[test]
    fn proxy_redirect_accepted_and_rejected() {
        let p = clean(&[
            ("proxy-redirect-from", "http://internal:8080/"),
            ("proxy-redirect-to", "https://a.test/"),
        ]);
        assert_eq!(p.redirect_rewrite, replace("http://internal:8080/", "https://a.test/"));
        // `off` and `default` on either side: nothing is rewritten, as ingress-nginx writes it.
        for (from, to) in [("off", "https://a.test/"), ("default", "/"), ("http://x/", "off")] {
            let p = clean(&[("proxy-redirect-from", from), ("proxy-redirect-to", to)]);
            assert_eq!(p.redirect_rewrite, None, "{from} {to}");
        }
        assert_eq!(clean(&[("proxy-redirect-from", "http://x/")]).redirect_rewrite, None);

        for (bad, why) in [
            ("~^http://(.*)$", "regular expressions"),
            ("http://$host/", "variables"),
            ("http://a b/", "without spaces"),
        ] {
            let (p, w) = rejected(
                &[("proxy-redirect-from", bad), ("proxy-redirect-to", "/"), ("limit-rate", "1")],
                "proxy-redirect-from",
            );
            assert_eq!(p.redirect_rewrite, None);
            assert!(p.response_rate.is_some(), "the route keeps its other settings");
            assert!(w.message.contains(why), "{}", w.message);
        }
        let (_, w) = rejected(
            &[("proxy-redirect-from", "http://x/"), ("proxy-redirect-to", "$scheme://y/")],
            "proxy-redirect-to",
        );
        assert!(w.message.contains("variables"), "{}", w.message);
    }

    #[test]
    fn proxy_cookie_accepted_and_rejected() {
        let p = clean(&[("proxy-cookie-domain", "localhost example.org"), ("proxy-cookie-path", "/two/ /")]);
        assert_eq!(p.cookie_domain, replace("localhost", "example.org"));
        assert_eq!(p.cookie_path, replace("/two/", "/"));
        let p = clean(&[("proxy-cookie-domain", "off"), ("proxy-cookie-path", "off")]);
        assert_eq!((p.cookie_domain, p.cookie_path), (None, None));

        for (name, bad, why) in [
            ("proxy-cookie-domain", "localhost", "two values"),
            ("proxy-cookie-domain", "a.test b.test c.test", "two values"),
            ("proxy-cookie-domain", "local_host example.org", "domain name"),
            ("proxy-cookie-domain", "~\\.svc$ example.org", "regular expressions"),
            ("proxy-cookie-path", "two/ /", "does not start with /"),
            ("proxy-cookie-path", "/a /$1", "plain path"),
        ] {
            let (p, w) = rejected(&[(name, bad), ("preserve-trailing-slash", "true")], name);
            assert_eq!((p.cookie_domain, p.cookie_path), (None, None), "{bad}");
            assert!(p.preserve_trailing_slash, "the route keeps its other settings");
            assert!(w.message.contains(why), "{bad}: {}", w.message);
        }
    }

    #[test]
    fn preserve_trailing_slash_accepted_and_rejected() {
        assert!(clean(&[("preserve-trailing-slash", "true")]).preserve_trailing_slash);
        assert!(!clean(&[("preserve-trailing-slash", "false")]).preserve_trailing_slash);
        let (p, w) = rejected(
            &[("preserve-trailing-slash", "yes please"), ("limit-connections", "3")],
            "preserve-trailing-slash",
        );
        assert!(!p.preserve_trailing_slash);
        assert!(p.conn_limit.is_some());
        assert!(w.message.contains("\"yes please\""), "{}", w.message);
    }

    #[test]
    fn weir_prefix_wins() {
        let map: BTreeMap<String, String> = [
            (format!("{NGINX_PREFIX}limit-connections"), "5".to_string()),
            (format!("{WEIR_PREFIX}limit-connections"), "7".to_string()),
        ]
        .into();
        let (secrets, config_maps) = (crate::snapshot::Objects::new(), crate::snapshot::Objects::new());
        let refs = Refs {
            secrets: &secrets,
            config_maps: &config_maps,
            allowed_response_headers: None,
            guards: &crate::translate::annotations::risk::DEFAULTS,
        };
        let mut warnings = Warnings::default();
        let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
        assert_eq!(parsed.policy.conn_limit.unwrap().max, 7);
    }

    #[test]
    fn annotations_beat_the_configmap_key_by_key() {
        let configmap = ResponseSettings {
            rate: Some(1000),
            rate_after: Some(5000),
            redirect_from: Some(Some("http://in/".into())),
            redirect_to: Some(Some("https://out/".into())),
            cookie_domain: Some(replace("a", "b").map(|r| *r)),
            cookie_path: Some(replace("/x", "/").map(|r| *r)),
            preserve_trailing_slash: Some(true),
        };
        let annotations = parse_all(&[
            ("limit-rate", "2"),
            ("proxy-redirect-to", "https://mine/"),
            ("proxy-cookie-domain", "off"),
            ("preserve-trailing-slash", "false"),
        ])
        .0
        .response;
        let mut policy = RoutePolicy::default();
        annotations.or(&configmap).apply(&mut policy);
        assert_eq!(
            policy.response_rate,
            Some(Box::new(ResponseRate { bytes_per_sec: 2048, after_bytes: 5000 }))
        );
        assert_eq!(policy.redirect_rewrite, replace("http://in/", "https://mine/"));
        assert_eq!(policy.cookie_domain, None, "an explicit off beats the ConfigMap");
        assert_eq!(policy.cookie_path, replace("/x", "/"));
        assert!(!policy.preserve_trailing_slash);
        // `limit-rate: "0"` turns off the ConfigMap's rate.
        let mut policy = RoutePolicy::default();
        parse_all(&[("limit-rate", "0")]).0.response.or(&configmap).apply(&mut policy);
        assert_eq!(policy.response_rate, None);
    }
}
