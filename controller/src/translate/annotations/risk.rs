//! `annotations-risk-level`: how much each annotation can change, ingress-nginx's rating of it
//! (each annotation parser's `Risk` in ingress-nginx 1.12+), so that a cluster can forbid what
//! its Ingress authors should not set. An annotation rated above the level is refused, and the
//! routes of its Ingress deny every client (ingress-nginx drops the whole Ingress; weir keeps it
//! closed rather than let a request fall through to another Ingress's path).

/// A rating, from least to most dangerous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Risk {
    /// Choices among fixed values, numbers.
    Low,
    /// Free text checked against a pattern (names, URLs, header values).
    Medium,
    /// Reaches other services or rewrites what the server is (auth URLs, mirrors, aliases).
    High,
    /// Raw configuration (snippets; weir refuses them anyway).
    Critical,
}

impl Risk {
    /// The ConfigMap's spelling, any case, as ingress-nginx reads it.
    pub(crate) fn parse(s: &str) -> Result<Risk, String> {
        match s.to_ascii_lowercase().as_str() {
            "low" => Ok(Risk::Low),
            "medium" => Ok(Risk::Medium),
            "high" => Ok(Risk::High),
            "critical" => Ok(Risk::Critical),
            _ => Err("expected Low, Medium, High or Critical".to_string()),
        }
    }
}

impl std::fmt::Display for Risk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Risk::Low => "Low",
            Risk::Medium => "Medium",
            Risk::High => "High",
            Risk::Critical => "Critical",
        })
    }
}

/// What the ConfigMap lets Ingress authors do: ingress-nginx's `annotations-risk-level`,
/// `annotation-value-word-blocklist`, `allow-cross-namespace-resources` and
/// `strict-validate-path-type`, with its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Guards {
    /// The highest rating an annotation may have (default High).
    pub(crate) risk_level: Risk,
    /// Substrings no annotation value may contain (default none).
    pub(crate) blocked_words: Vec<String>,
    /// Whether annotations may name Secrets and ConfigMaps of other namespaces (default no).
    pub(crate) cross_namespace: bool,
    /// Whether `Exact` and `Prefix` paths must be plain: `/` then letters, digits, `.`, `_`,
    /// `-` and `/` (default yes).
    pub(crate) strict_path_type: bool,
}

/// The defaults, for tests that need a `&'static Guards`.
#[cfg(test)]
pub(crate) static DEFAULTS: Guards = Guards::DEFAULT;

impl Default for Guards {
    fn default() -> Self {
        Guards::DEFAULT
    }
}

impl Guards {
    /// ingress-nginx's defaults.
    pub(crate) const DEFAULT: Guards = Guards {
        risk_level: Risk::High,
        blocked_words: Vec::new(),
        cross_namespace: false,
        strict_path_type: true,
    };

    /// Why annotation `name` with `value` is refused, if it is.
    pub(crate) fn refusal(&self, name: &str, value: &str) -> Option<String> {
        let risk = of(name);
        if risk > self.risk_level {
            return Some(format!(
                "its risk {risk} is above the ConfigMap's annotations-risk-level {}",
                self.risk_level
            ));
        }
        let word = self.blocked_words.iter().find(|w| value.contains(w.as_str()))?;
        Some(format!(
            "the value contains {word:?}, a word of the ConfigMap's annotation-value-word-blocklist"
        ))
    }

    /// Why `path` of type `path_type` is refused by `strict-validate-path-type`, if it is.
    pub(crate) fn path_refusal(&self, path: &str, path_type: &str) -> Option<String> {
        if !self.strict_path_type || path.is_empty() || !matches!(path_type, "Exact" | "Prefix") {
            return None;
        }
        let plain = path.starts_with('/')
            && path.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
        (!plain).then(|| {
            format!("path {path:?} has characters other than letters, digits, '.', '_', '-' and '/', which pathType {path_type} cannot have while strict-validate-path-type is on (use ImplementationSpecific for regular expressions)")
        })
    }

    /// Whether an annotation of an Ingress in `namespace` may name an object in `other`.
    pub(crate) fn may_reach(&self, namespace: &str, other: &str) -> bool {
        self.cross_namespace || namespace == other
    }
}

/// The annotations rated above Low, sorted by name; every other annotation is Low.
const RATED: &[(&str, Risk)] = {
    use Risk::*;
    &[
        ("affinity-mode", Medium),
        ("allowlist-source-range", Medium),
        ("app-root", Medium),
        ("auth-cache-duration", Medium),
        ("auth-cache-key", Medium),
        ("auth-proxy-set-headers", Medium),
        ("auth-realm", Medium),
        ("auth-request-redirect", Medium),
        ("auth-response-headers", Medium),
        ("auth-secret", Medium),
        ("auth-signin", High),
        ("auth-signin-redirect-param", Medium),
        ("auth-snippet", Critical),
        ("auth-tls-error-page", High),
        ("auth-tls-match-cn", High),
        ("auth-tls-secret", Medium),
        ("auth-tls-verify-client", Medium),
        ("auth-url", High),
        ("canary-by-cookie", Medium),
        ("canary-by-header", Medium),
        ("canary-by-header-pattern", Medium),
        ("canary-by-header-value", Medium),
        ("configuration-snippet", Critical),
        ("cors-allow-headers", Medium),
        ("cors-allow-methods", Medium),
        ("cors-allow-origin", Medium),
        ("cors-expose-headers", Medium),
        ("custom-headers", Medium),
        ("denylist-source-range", Medium),
        ("fastcgi-index", Medium),
        ("fastcgi-params-configmap", Medium),
        ("force-ssl-redirect", Medium),
        ("mirror-host", High),
        ("mirror-target", High),
        ("modsecurity-snippet", Critical),
        ("modsecurity-transaction-id", High),
        ("opentelemetry-operation-name", Medium),
        ("permanent-redirect", Medium),
        ("preserve-trailing-slash", Medium),
        ("proxy-body-size", Medium),
        ("proxy-cookie-domain", Medium),
        ("proxy-cookie-path", Medium),
        ("proxy-next-upstream", Medium),
        ("proxy-redirect-from", Medium),
        ("proxy-redirect-to", Medium),
        ("proxy-ssl-ciphers", Medium),
        ("proxy-ssl-name", High),
        ("proxy-ssl-secret", Medium),
        ("rewrite-target", Medium),
        ("server-alias", High),
        ("server-snippet", Critical),
        ("session-cookie-domain", Medium),
        ("session-cookie-expires", Medium),
        ("session-cookie-max-age", Medium),
        ("session-cookie-name", Medium),
        ("session-cookie-path", Medium),
        ("stream-snippet", Critical),
        ("temporal-redirect", Medium),
        ("upstream-hash-by", High),
        ("whitelist-source-range", Medium),
        ("x-forwarded-prefix", Medium),
    ]
};

/// The rating of annotation `name` (without prefix).
pub(crate) fn of(name: &str) -> Risk {
    RATED.binary_search_by(|(n, _)| n.cmp(&name)).map(|i| RATED[i].1).unwrap_or(Risk::Low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_rates_what_ingress_nginx_rates() {
        assert!(RATED.windows(2).all(|w| w[0].0 < w[1].0), "RATED must stay sorted");
        assert_eq!(of("configuration-snippet"), Risk::Critical);
        assert_eq!(of("auth-url"), Risk::High);
        assert_eq!(of("server-alias"), Risk::High);
        assert_eq!(of("rewrite-target"), Risk::Medium);
        assert_eq!(of("whitelist-source-range"), Risk::Medium, "an alias is rated as its annotation");
        assert_eq!(of("proxy-body-size"), Risk::Medium);
        assert_eq!(of("ssl-redirect"), Risk::Low);
        assert_eq!(of("no-such-annotation"), Risk::Low);
        assert!(Risk::Low < Risk::Medium && Risk::Medium < Risk::High && Risk::High < Risk::Critical);
        assert_eq!(Risk::parse("mEdium"), Ok(Risk::Medium));
        assert!(Risk::parse("severe").is_err());
    }

    #[test]
    fn guards_refuse_what_the_configmap_forbids() {
        let mut g = Guards::default();
        assert_eq!(g.refusal("auth-url", "http://auth"), None, "High is allowed by default");
        assert!(g.refusal("configuration-snippet", "x").is_some(), "Critical is not");
        g.risk_level = Risk::Medium;
        assert!(g.refusal("auth-url", "http://auth").unwrap().contains("risk High"));
        assert_eq!(g.refusal("rewrite-target", "/$1"), None);
        g.blocked_words = vec!["load_module".into(), "lua".into()];
        assert!(g.refusal("rewrite-target", "/lua/x").unwrap().contains("\"lua\""));
        assert_eq!(g.refusal("rewrite-target", "/LUA"), None, "case-sensitive, as ingress-nginx");
        assert_eq!(g.path_refusal("/api/v1.2/_x-y", "Prefix"), None);
        assert_eq!(g.path_refusal("/a(/|$)(.*)", "ImplementationSpecific"), None);
        assert!(g.path_refusal("/a(/|$)(.*)", "Prefix").is_some());
        assert!(g.path_refusal("/users/@me", "Exact").is_some());
        assert!(g.path_refusal("/caf\u{e9}", "Exact").is_some(), "ASCII only");
        g.strict_path_type = false;
        assert_eq!(g.path_refusal("/a(/|$)(.*)", "Prefix"), None);
        assert!(!g.may_reach("shop", "kube-system") && g.may_reach("shop", "shop"));
        g.cross_namespace = true;
        assert!(g.may_reach("shop", "kube-system"));
    }
}
