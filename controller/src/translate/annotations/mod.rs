//! ingress-nginx annotations, parsed into typed, validated policies. Never a configuration
//! injection surface: every value is parsed into a type, and the snippet annotations that
//! pasted raw nginx configuration are refused.
//!
//! Names are read under `nginx.ingress.kubernetes.io/` and under weir's own prefix `weir.dev/`;
//! weir's prefix wins when both are set. Every annotation under either prefix is accounted for:
//! - supported: parsed; an invalid value is rejected with an error naming the annotation and
//!   the reason, and the route keeps its other settings;
//! - refused (snippets, Lua): an error saying why and what to use instead;
//! - not supported yet: a warning, and where ignoring it would open access (authentication),
//!   the Ingress's routes deny every client (403) until it is removed: fail closed, never open;
//! - unknown (a typo): a warning.
//!
//! [`CATALOGUE`] is the one list of names; `docs/migrating-from-ingress-nginx.md` is checked
//! against it by a test.

mod auth;
pub(crate) mod auth_tls;
pub(crate) mod limits;
mod protocol;
pub(crate) mod risk;
mod tracing;
pub(crate) mod values;

pub(crate) use protocol::*;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use weir_dataplane::model::{
    Balance, BasicAuth, CookieAffinity, Cors, ExternalAuth, IpNet, Mirror, ObjectRef, RateLimit, Redirect,
    RoutePolicy, SourceFilter,
};

use super::warnings::{Reason, Warnings};
use crate::snapshot::Objects;

/// ingress-nginx's annotation prefix.
pub const NGINX_PREFIX: &str = "nginx.ingress.kubernetes.io/";
/// weir's own prefix; wins over [`NGINX_PREFIX`] for the same name.
pub const WEIR_PREFIX: &str = "weir.dev/";

/// What weir does with an annotation name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Parsed and applied.
    Supported,
    /// Refused on principle; the text says why and what to use instead.
    Refused(&'static str),
    /// Not supported yet: ignored with a warning.
    Unsupported,
    /// Not supported yet, and ignoring it would expose what it protects: what it applies to
    /// denies every client until it is removed. (No annotation is left in this state; global
    /// settings such as `block-user-agents` are.)
    UnsupportedFailClosed,
    /// Not supported, and not planned: ignored with a warning; the text says why and what to
    /// use instead (ModSecurity, GeoIP, tracers other than OpenTelemetry).
    NotSupported(&'static str),
    /// An nginx internal with nothing to tune in weir (worker processes, hash table sizes…):
    /// accepted and ignored without a warning, listed once in the migration doc.
    NoOp,
}

const SNIPPET: &str = "raw nginx configuration is an injection surface (CVE-2021-25742; the injections behind CVE-2025-1974 are of the same kind); use the typed annotations instead";
const LUA: &str = "weir runs no Lua; use the typed annotations instead";
/// Why ModSecurity keys are not supported.
pub(crate) const MODSECURITY: &str = "no Rust engine runs ModSecurity rules or the OWASP Core Rule Set; run a WAF that does (Coraza, ModSecurity) as the backend's proxy, behind weir";
/// Why OpenTracing-era tracers are not supported.
pub(crate) const OPENTRACING: &str = "OpenTracing and its tracers are retired; weir traces with OpenTelemetry (OTLP), which Jaeger, Zipkin and Datadog agents receive";

/// Every annotation name weir knows (ingress-nginx's documented set), with what weir does.
pub const CATALOGUE: &[(&str, Support)] = {
    use Support::*;
    &[
        // Rewrites and redirects.
        ("app-root", Supported),
        ("permanent-redirect", Supported),
        ("permanent-redirect-code", Supported),
        ("temporal-redirect", Supported),
        ("temporal-redirect-code", Supported),
        ("from-to-www-redirect", Supported),
        ("rewrite-target", Supported),
        ("use-regex", Supported),
        ("x-forwarded-prefix", Supported),
        ("upstream-vhost", Supported),
        ("server-alias", Supported),
        ("preserve-trailing-slash", Supported),
        ("proxy-redirect-from", Supported),
        ("proxy-redirect-to", Supported),
        ("proxy-cookie-domain", Supported),
        ("proxy-cookie-path", Supported),
        // TLS.
        ("ssl-redirect", Supported),
        ("force-ssl-redirect", Supported),
        ("backend-protocol", Supported),
        ("ssl-passthrough", Supported),
        ("ssl-ciphers", Supported),
        ("ssl-prefer-server-ciphers", Supported),
        ("auth-tls-secret", Supported),
        ("auth-tls-verify-client", Supported),
        ("auth-tls-verify-depth", Supported),
        ("auth-tls-error-page", Supported),
        ("auth-tls-pass-certificate-to-upstream", Supported),
        ("auth-tls-match-cn", Supported),
        ("proxy-ssl-secret", Supported),
        ("proxy-ssl-verify", Supported),
        ("proxy-ssl-verify-depth", Supported),
        ("proxy-ssl-name", Supported),
        ("proxy-ssl-server-name", Supported),
        ("proxy-ssl-ciphers", Supported),
        ("proxy-ssl-protocols", Supported),
        // Limits and timeouts.
        ("proxy-body-size", Supported),
        ("client-body-buffer-size", Supported),
        ("proxy-connect-timeout", Supported),
        ("proxy-read-timeout", Supported),
        ("proxy-send-timeout", Supported),
        ("proxy-next-upstream", Supported),
        ("proxy-next-upstream-tries", Supported),
        ("proxy-next-upstream-timeout", Supported),
        ("proxy-buffering", Supported),
        ("proxy-buffers-number", Supported),
        ("proxy-buffer-size", Supported),
        ("proxy-max-temp-file-size", Supported),
        ("proxy-request-buffering", Supported),
        ("proxy-http-version", Unsupported),
        ("connection-proxy-header", Unsupported),
        ("limit-rps", Supported),
        ("limit-rpm", Supported),
        ("limit-connections", Supported),
        // ingress-nginx up to 1.11 (removed in 1.12): weir keeps them for those who used them.
        ("global-rate-limit", Supported),
        ("global-rate-limit-window", Supported),
        ("global-rate-limit-key", Supported),
        ("global-rate-limit-ignored-cidrs", Supported),
        ("limit-burst-multiplier", Supported),
        ("limit-whitelist", Supported),
        ("limit-allowlist", Supported),
        ("limit-rate", Supported),
        ("limit-rate-after", Supported),
        // Access.
        ("whitelist-source-range", Supported),
        ("allowlist-source-range", Supported),
        ("denylist-source-range", Supported),
        ("auth-type", Supported),
        ("auth-secret", Supported),
        ("auth-secret-type", Supported),
        ("auth-realm", Supported),
        ("auth-url", Supported),
        ("auth-method", Supported),
        ("auth-signin", Supported),
        ("auth-signin-redirect-param", Supported),
        ("auth-response-headers", Supported),
        ("auth-request-redirect", Supported),
        ("auth-proxy-set-headers", Supported),
        ("auth-cache-key", Supported),
        ("auth-cache-duration", Supported),
        ("auth-always-set-cookie", Supported),
        ("auth-keepalive", Supported),
        ("auth-keepalive-share-vars", Supported),
        ("auth-keepalive-requests", Supported),
        ("auth-keepalive-timeout", Supported),
        ("enable-global-auth", Supported),
        ("satisfy", Unsupported),
        ("enable-cors", Supported),
        ("cors-allow-origin", Supported),
        ("cors-allow-methods", Supported),
        ("cors-allow-headers", Supported),
        ("cors-allow-credentials", Supported),
        ("cors-max-age", Supported),
        ("cors-expose-headers", Supported),
        // Traffic.
        ("canary", Supported),
        ("canary-weight", Supported),
        ("canary-weight-total", Supported),
        ("canary-by-header", Supported),
        ("canary-by-header-value", Supported),
        ("canary-by-header-pattern", Supported),
        ("canary-by-cookie", Supported),
        ("affinity", Supported),
        ("affinity-mode", Supported),
        ("affinity-canary-behavior", Supported),
        ("session-cookie-name", Supported),
        ("session-cookie-path", Supported),
        ("session-cookie-domain", Supported),
        ("session-cookie-max-age", Supported),
        ("session-cookie-expires", Supported),
        ("session-cookie-samesite", Supported),
        ("session-cookie-conditional-samesite-none", Unsupported),
        ("session-cookie-secure", Supported),
        ("session-cookie-change-on-failure", Supported),
        ("load-balance", Supported),
        ("upstream-hash-by", Supported),
        ("upstream-hash-by-subset", Unsupported),
        ("upstream-hash-by-subset-size", Unsupported),
        ("service-upstream", Supported),
        ("mirror-target", Supported),
        ("mirror-host", Supported),
        ("mirror-request-body", Supported),
        // Responses.
        ("custom-http-errors", Supported),
        ("default-backend", Supported),
        ("custom-headers", Supported),
        ("disable-proxy-intercept-errors", Unsupported),
        (
            "http2-push-preload",
            Refused(
                "HTTP/2 server push is gone from browsers (Chrome 106, Firefox 132) and from nginx 1.25.1; send `Link: rel=preload` headers (custom-headers) and let clients fetch, or use 103 Early Hints from the application",
            ),
        ),
        // Observability.
        ("enable-access-log", Supported),
        (
            "enable-rewrite-log",
            NotSupported(
                "it traces nginx's rewrite module; weir's rewrites are typed: `weir dump` shows each route's target, and the access log the URI sent upstream",
            ),
        ),
        ("enable-opentelemetry", Supported),
        ("opentelemetry-trust-incoming-span", Supported),
        ("opentelemetry-operation-name", Supported),
        ("enable-opentracing", NotSupported(OPENTRACING)),
        ("opentracing-trust-incoming-span", NotSupported(OPENTRACING)),
        // Web application firewall.
        ("enable-modsecurity", NotSupported(MODSECURITY)),
        ("enable-owasp-core-rules", NotSupported(MODSECURITY)),
        ("modsecurity-transaction-id", NotSupported(MODSECURITY)),
        // Refused.
        ("configuration-snippet", Refused(SNIPPET)),
        ("server-snippet", Refused(SNIPPET)),
        ("auth-snippet", Refused(SNIPPET)),
        ("stream-snippet", Refused(SNIPPET)),
        ("modsecurity-snippet", Refused(SNIPPET)),
        ("lua-resty-waf", Refused(LUA)),
        ("lua-resty-waf-debug", Refused(LUA)),
        ("lua-resty-waf-ignore-rulesets", Refused(LUA)),
        ("lua-resty-waf-extra-rules", Refused(LUA)),
        ("lua-resty-waf-allow-unknown-content-types", Refused(LUA)),
        ("lua-resty-waf-score-threshold", Refused(LUA)),
        ("lua-resty-waf-process-multipart-body", Refused(LUA)),
    ]
};

/// What weir does with `name` (without prefix); `None` for a name it does not know.
pub fn support(name: &str) -> Option<Support> {
    CATALOGUE.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// What an Ingress's annotations ask for, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// The policy of every route of the Ingress.
    pub(crate) policy: RoutePolicy,
    /// `custom-http-errors` codes, and the `default-backend` Service that serves their pages
    /// (`None`: the table's default backend).
    pub(crate) custom_errors: Option<(Vec<u16>, Option<String>)>,
    /// Whether `affinity`, `upstream-hash-by` or `load-balance` chose the balancing (else the
    /// ConfigMap's applies).
    pub(crate) balance_annotated: bool,
    /// `server-alias`: more names for the Ingress's first host.
    pub(crate) server_aliases: Vec<weir_dataplane::model::HostMatch>,
    /// `from-to-www-redirect`: the other name of each host (`www.` added or removed) answers
    /// with a redirect to it.
    pub(crate) from_to_www: bool,
    /// `canary: "true"`: the Ingress shadows the main Ingress's routes with these rules.
    pub(crate) canary: Option<CanarySpec>,
    /// `use-regex` or `rewrite-target`: every path of the Ingress's hosts is a case-insensitive
    /// regex, whatever Ingress it comes from (ingress-nginx's rule).
    pub(crate) regex_paths: bool,
    /// `enable-global-auth` (true unless `"false"`): the Ingress's routes take the ConfigMap's
    /// `global-auth-url` when they have no `auth-url` of their own.
    pub(crate) global_auth: bool,
    /// The response settings the annotations give (already applied to `policy`); the
    /// ConfigMap's fill in the keys they leave unset.
    pub(crate) response: limits::ResponseSettings,
    /// `global-rate-limit*`: limit, window (ms), key, exempt clients; the ConfigMap's
    /// memcached completes it.
    pub(crate) global_limit: Option<(u64, u64, String, Vec<IpNet>)>,
}

impl Default for Parsed {
    fn default() -> Self {
        Parsed {
            policy: RoutePolicy::default(),
            custom_errors: None,
            balance_annotated: false,
            server_aliases: Vec::new(),
            from_to_www: false,
            canary: None,
            regex_paths: false,
            global_auth: true,
            response: limits::ResponseSettings::default(),
            global_limit: None,
        }
    }
}

/// A canary Ingress's selection rules (`canary-*`), waiting for the backend of each path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CanarySpec {
    weight: u32,
    weight_total: u32,
    header: Option<String>,
    header_value: Option<String>,
    header_pattern: Option<String>,
    cookie: Option<String>,
}

impl CanarySpec {
    /// The canary of a route whose canary backend is `backend`.
    pub(crate) fn with_backend(
        &self,
        backend: weir_dataplane::model::BackendId,
    ) -> weir_dataplane::model::Canary {
        weir_dataplane::model::Canary {
            backend,
            weight: self.weight,
            weight_total: self.weight_total,
            header: self.header.clone(),
            header_value: self.header_value.clone(),
            header_pattern: self.header_pattern.clone(),
            cookie: self.cookie.clone(),
        }
    }
}

/// One Ingress's annotations under both prefixes, weir's winning.
struct Reader<'a> {
    /// Name (without prefix) → (full key, value).
    values: BTreeMap<&'a str, (&'a str, &'a str)>,
}

impl<'a> Reader<'a> {
    fn new(annotations: &'a BTreeMap<String, String>) -> Self {
        let mut values = BTreeMap::new();
        for prefix in [NGINX_PREFIX, WEIR_PREFIX] {
            for (key, value) in annotations {
                if let Some(name) = key.strip_prefix(prefix) {
                    values.insert(name, (key.as_str(), value.as_str()));
                }
            }
        }
        Reader { values }
    }

    fn get(&self, name: &str) -> Option<(&'a str, &'a str)> {
        self.values.get(name).copied()
    }
}

/// The objects annotations may name, and the settings that limit them.
pub(crate) struct Refs<'a> {
    /// Secrets (`auth-secret`).
    pub(crate) secrets: &'a Objects<Secret>,
    /// ConfigMaps (`custom-headers`).
    pub(crate) config_maps: &'a Objects<ConfigMap>,
    /// `global-allowed-response-headers`, when set (lower case).
    pub(crate) allowed_response_headers: Option<&'a std::collections::BTreeSet<String>>,
    /// What the ConfigMap lets Ingress authors do.
    pub(crate) guards: &'a risk::Guards,
}

/// Parses `ingress`'s annotations; every problem becomes a warning about it.
pub(crate) fn parse(
    ingress: &ObjectRef,
    annotations: Option<&BTreeMap<String, String>>,
    refs: &Refs<'_>,
    warnings: &mut Warnings,
) -> Parsed {
    let mut parsed = Parsed::default();
    let Some(annotations) = annotations else { return parsed };
    let reader = Reader::new(annotations);
    let mut fail_closed = Vec::new();
    for (name, (key, _)) in &reader.values {
        let at = format!("metadata.annotations[{key}]");
        match support(name) {
            Some(Support::Supported) => {}
            Some(Support::Refused(why)) => warnings.error(
                ingress,
                Reason::RefusedAnnotation,
                format!("{at}: refused and ignored: {why}"),
            ),
            Some(Support::Unsupported) => warnings.warn(
                ingress,
                Reason::UnsupportedAnnotation,
                format!("{at}: not supported by weir yet; ignored"),
            ),
            Some(Support::NotSupported(why)) => warnings.warn(
                ingress,
                Reason::UnsupportedAnnotation,
                format!("{at}: not supported by weir: {why}; ignored"),
            ),
            Some(Support::NoOp) => {}
            Some(Support::UnsupportedFailClosed) => {
                fail_closed.push(*key);
                warnings.error(
                    ingress,
                    Reason::UnsupportedAnnotation,
                    format!(
                        "{at}: not supported by weir yet; its routes deny every client (403) rather than serve unprotected"
                    ),
                );
            }
            None => warnings.warn(
                ingress,
                Reason::UnknownAnnotation,
                format!("{at}: unknown annotation; ignored"),
            ),
        }
    }
    // The ConfigMap's guards, on what weir applies (the others are reported above): a refused
    // annotation is not applied, and closes the Ingress's routes (ingress-nginx drops the whole
    // Ingress; a request must not fall through to another Ingress's path).
    let mut reader = reader;
    let refused: Vec<(&str, &str, String)> = reader
        .values
        .iter()
        .filter(|(name, _)| support(name) == Some(Support::Supported))
        .filter_map(|(name, (key, value))| Some((*name, *key, refs.guards.refusal(name, value)?)))
        .collect();
    for (name, key, why) in refused {
        reader.values.remove(name);
        fail_closed.push(key);
        warnings.error(
            ingress,
            Reason::RefusedAnnotation,
            format!("metadata.annotations[{key}]: refused: {why}; the Ingress's routes deny every client (403) until it is removed"),
        );
    }
    let mut ctx = Ctx { ingress, reader: &reader, secrets: refs.secrets, guards: refs.guards, warnings };
    parsed.policy.redirect = ctx.redirect().map(Box::new);
    parsed.policy.app_root = ctx.value("app-root", values::app_root);
    parsed.policy.forwarded_prefix = ctx.value("x-forwarded-prefix", values::header_text);
    parsed.policy.upstream_host = ctx.value("upstream-vhost", values::host_and_port);
    parsed.policy.max_body_bytes = ctx.value("proxy-body-size", values::size);
    parsed.policy.source = ctx.source_filter();
    parsed.policy.rewrite_target = ctx.value("rewrite-target", values::rewrite_target);
    parsed.policy.cors = ctx.cors().map(Box::new);
    parsed.policy.read_timeout_ms = ctx.value("proxy-read-timeout", values::timeout_ms);
    parsed.policy.connect_timeout_ms = ctx.value("proxy-connect-timeout", values::timeout_ms);
    parsed.policy.connect_tries = ctx.value("proxy-next-upstream-tries", values::tries);
    parsed.policy.next_upstream = ctx.value("proxy-next-upstream", values::next_upstream);
    parsed.policy.next_upstream_timeout_ms =
        ctx.value("proxy-next-upstream-timeout", values::timeout_ms_or_zero);
    parsed.policy.send_timeout_ms = ctx.value("proxy-send-timeout", values::timeout_ms);
    parsed.policy.rate_limit = ctx.rate_limit().map(Box::new);
    parsed.policy.conn_limit = ctx.conn_limit().map(Box::new);
    parsed.global_limit = ctx.global_limit();
    parsed.response = ctx.response_settings();
    parsed.response.apply(&mut parsed.policy);
    let (basic_auth, auth_failed) = ctx.basic_auth();
    parsed.policy.basic_auth = basic_auth.map(Box::new);
    if auth_failed {
        fail_closed.push("auth-type");
    }
    let (external_auth, external_failed) = ctx.external_auth(refs);
    parsed.policy.external_auth = external_auth.map(Box::new);
    parsed.canary = ctx.canary();
    let balance = ctx.balance();
    parsed.balance_annotated = balance.is_some();
    parsed.policy.balance = balance.unwrap_or_default();
    parsed.server_aliases = ctx.value("server-alias", values::host_list).unwrap_or_default();
    parsed.from_to_www = ctx.value("from-to-www-redirect", values::boolean).unwrap_or(false);
    parsed.policy.response_headers = ctx.custom_headers(refs);
    parsed.policy.mirrors = ctx.mirror().map(|m| Box::new(vec![m]));
    parsed.policy.trace = ctx.trace().map(Box::new);
    parsed.global_auth = ctx.value("enable-global-auth", values::boolean).unwrap_or(true);
    parsed.policy.access_log_off = ctx.value("enable-access-log", values::boolean) == Some(false);
    // weir streams bodies both ways and never spools them to disk: buffering settings are
    // validated and have nothing to change.
    let _ = ctx.value("proxy-buffering", values::on_off);
    let _ = ctx.value("proxy-request-buffering", values::on_off);
    // So are nginx's buffer sizes (weir reads upstream response heads up to hyper's limits).
    let _ = ctx.value("client-body-buffer-size", values::buffer_size);
    let _ = ctx.value("proxy-buffer-size", values::buffer_size);
    let _ = ctx.value("proxy-buffers-number", values::buffers_number);
    let _ = ctx.value("proxy-max-temp-file-size", values::size);
    let error_backend = ctx.value("default-backend", values::header_name);
    parsed.custom_errors =
        ctx.value("custom-http-errors", values::status_codes).map(|codes| (codes, error_backend));
    if external_failed {
        fail_closed.push("auth-url");
    }
    let use_regex = ctx.value("use-regex", values::boolean).unwrap_or(false);
    parsed.regex_paths = use_regex || parsed.policy.rewrite_target.is_some();
    if !fail_closed.is_empty() {
        parsed.policy.source = SourceFilter { allow: Vec::new(), deny: deny_all() };
    }
    parsed
}

/// Networks covering every client, IPv4 and IPv6.
pub(crate) fn deny_all() -> Vec<IpNet> {
    ["0.0.0.0/0", "::/0"].iter().filter_map(|n| n.parse().ok()).collect()
}

/// Parsing context: the Ingress, its annotations, and where problems go.
struct Ctx<'a, 'w> {
    ingress: &'a ObjectRef,
    reader: &'a Reader<'a>,
    secrets: &'a Objects<Secret>,
    guards: &'a risk::Guards,
    warnings: &'w mut Warnings,
}

impl Ctx<'_, '_> {
    /// Reports each of `names` that is set: it has no effect without `without`.
    fn unused_without(&mut self, names: &[&str], without: &str) {
        for name in names {
            if let Some((key, _)) = self.reader.get(name) {
                self.warnings.warn(
                    self.ingress,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{key}]: has no effect without {without}"),
                );
            }
        }
    }

    /// The value of `name` parsed by `parse`; an invalid value is reported and ignored.
    fn value<T>(&mut self, name: &str, parse: impl FnOnce(&str) -> Result<T, String>) -> Option<T> {
        let (key, raw) = self.reader.get(name)?;
        match parse(raw.trim()) {
            Ok(v) => Some(v),
            Err(why) => {
                self.invalid(key, raw, &why, "ignored");
                None
            }
        }
    }

    fn invalid(&mut self, key: &str, raw: &str, why: &str, consequence: &str) {
        self.warnings.error(
            self.ingress,
            Reason::InvalidAnnotation,
            format!("metadata.annotations[{key}]: invalid value {raw:?}: {why}; {consequence}"),
        );
    }

    /// `custom-headers`: the headers of a ConfigMap in the Ingress's namespace, set on the
    /// responses of its routes. A missing ConfigMap sets nothing; each unusable header (not
    /// valid HTTP, a variable, a framing header, not in `global-allowed-response-headers` when
    /// that is set) is reported and skipped.
    fn custom_headers(&mut self, refs: &Refs<'_>) -> BTreeMap<String, String> {
        let allowed = refs.allowed_response_headers;
        self.header_configmap("custom-headers", refs, super::headers::Direction::Response, allowed)
    }

    /// The headers of the ConfigMap annotation `name` names, in the Ingress's namespace, checked
    /// for `direction` (and `allowed`, when set). A missing ConfigMap gives none; each unusable
    /// header is reported and skipped.
    fn header_configmap(
        &mut self,
        name: &str,
        refs: &Refs<'_>,
        direction: super::headers::Direction,
        allowed: Option<&std::collections::BTreeSet<String>>,
    ) -> BTreeMap<String, String> {
        let ingress = self.ingress;
        let guards = self.guards;
        let Some(cm_name) = self.value(name, |v| {
            let cm_name = super::headers::configmap_ref(v, &ingress.namespace)?;
            if !guards.may_reach(&ingress.namespace, &cm_name.namespace) {
                return Err(format!(
                    "the ConfigMap must be in the Ingress's namespace {:?}, not {:?} (allow-cross-namespace-resources is off)",
                    ingress.namespace, cm_name.namespace
                ));
            }
            Ok(cm_name)
        }) else {
            return BTreeMap::new();
        };
        let Some((key, raw)) = self.reader.get(name) else { return BTreeMap::new() };
        let Some(cm) = refs.config_maps.get(&cm_name) else {
            self.invalid(
                key,
                raw,
                &format!("ConfigMap {cm_name} not found"),
                "no header is set until it exists",
            );
            return BTreeMap::new();
        };
        let (found, refused) =
            super::headers::read(cm.data.as_ref().unwrap_or(&BTreeMap::new()), direction, allowed);
        for (header, why) in refused {
            self.warnings.error(
                self.ingress,
                Reason::InvalidAnnotation,
                format!("metadata.annotations[{key}]: ConfigMap {cm_name}, header {header:?}: {why}; the header is skipped"),
            );
        }
        found
    }

    /// `mirror-target` with `mirror-host` (the target's host by default) and
    /// `mirror-request-body` (`on` by default).
    fn mirror(&mut self) -> Option<Mirror> {
        let Some(target) = self.value("mirror-target", values::mirror_target) else {
            if self.reader.get("mirror-target").is_none() {
                self.unused_without(&["mirror-host", "mirror-request-body"], "mirror-target");
            }
            return None;
        };
        Some(Mirror {
            target,
            host: self.value("mirror-host", values::host_and_port),
            request_body: self.value("mirror-request-body", values::on_off).unwrap_or(true),
            share_ppm: None,
            h2c: false,
            spread: Vec::new(),
        })
    }

    /// `temporal-redirect` (302 unless `temporal-redirect-code`) wins over `permanent-redirect`
    /// (301 unless `permanent-redirect-code`), as in ingress-nginx.
    fn redirect(&mut self) -> Option<Redirect> {
        let permanent = self.value("permanent-redirect", values::redirect_url);
        let permanent_code = self.value("permanent-redirect-code", values::redirect_code);
        let temporal = self.value("temporal-redirect", values::redirect_url);
        let temporal_code = self.value("temporal-redirect-code", values::redirect_code);
        if let Some(location) = temporal {
            if permanent.is_some()
                && let Some((key, _)) = self.reader.get("permanent-redirect")
            {
                self.warnings.warn(
                    self.ingress,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{key}]: ignored: temporal-redirect takes precedence, as in ingress-nginx"),
                );
            }
            return Some(Redirect { location, code: temporal_code.unwrap_or(302) });
        }
        permanent.map(|location| Redirect { location, code: permanent_code.unwrap_or(301) })
    }

    /// `enable-cors` and the `cors-*` settings, with ingress-nginx's defaults. Without
    /// `enable-cors: "true"` the settings do nothing, which is said.
    fn cors(&mut self) -> Option<Cors> {
        const SETTINGS: [&str; 6] = [
            "cors-allow-origin",
            "cors-allow-methods",
            "cors-allow-headers",
            "cors-allow-credentials",
            "cors-max-age",
            "cors-expose-headers",
        ];
        if !self.value("enable-cors", values::boolean).unwrap_or(false) {
            self.unused_without(&SETTINGS, "enable-cors: \"true\"");
            return None;
        }
        Some(Cors {
            allow_origins: self.value("cors-allow-origin", values::cors_origins).unwrap_or_else(|| vec!["*".into()]),
            allow_methods: self
                .value("cors-allow-methods", values::cors_methods)
                .unwrap_or_else(|| "GET, PUT, POST, DELETE, PATCH, OPTIONS".into()),
            allow_headers: self.value("cors-allow-headers", values::cors_headers).unwrap_or_else(|| {
                "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization".into()
            }),
            expose_headers: self.value("cors-expose-headers", values::cors_headers).unwrap_or_default(),
            allow_credentials: self.value("cors-allow-credentials", values::boolean).unwrap_or(true),
            max_age: self.value("cors-max-age", values::seconds).unwrap_or(1_728_000),
        })
    }

    /// `auth-type: basic` with `auth-secret`, `auth-secret-type` and `auth-realm`. Returns the
    /// policy, and whether authentication was asked for but cannot be set up (then the routes
    /// fail closed: never served unprotected).
    fn basic_auth(&mut self) -> (Option<BasicAuth>, bool) {
        let Some((type_key, kind)) = self.reader.get("auth-type") else {
            self.unused_without(&["auth-secret", "auth-secret-type", "auth-realm"], "auth-type");
            return (None, false);
        };
        let closed = "the routes deny every client (403) until it is fixed";
        if kind.trim() != "basic" {
            let why = if kind.trim() == "digest" {
                "digest authentication is not supported (use basic over TLS)"
            } else {
                "expected basic"
            };
            self.invalid(type_key, kind, why, closed);
            return (None, true);
        }
        let Some((secret_key, secret_name)) = self.reader.get("auth-secret") else {
            self.invalid(type_key, kind, "auth-type basic needs auth-secret", closed);
            return (None, true);
        };
        let map = match self.value("auth-secret-type", |v| match v {
            "auth-file" => Ok(false),
            "auth-map" => Ok(true),
            _ => Err("expected auth-file or auth-map".to_string()),
        }) {
            Some(map) => map,
            None if self.reader.get("auth-secret-type").is_some() => return (None, true),
            None => false,
        };
        let secret_ref = match auth::secret_ref(self.ingress, secret_name.trim(), self.guards) {
            Ok(r) => r,
            Err(why) => {
                self.invalid(secret_key, secret_name, &why, closed);
                return (None, true);
            }
        };
        let Some(secret) = self.secrets.get(&secret_ref) else {
            self.invalid(secret_key, secret_name, &format!("Secret {secret_ref} not found"), closed);
            return (None, true);
        };
        let mut skipped = Vec::new();
        let users = match auth::users(secret, map, &mut skipped) {
            Ok(users) => users,
            Err(why) => {
                self.invalid(secret_key, secret_name, &format!("Secret {secret_ref} {why}"), closed);
                return (None, true);
            }
        };
        for why in skipped {
            self.warnings.error(
                self.ingress,
                Reason::InvalidAnnotation,
                format!(
                    "metadata.annotations[{secret_key}]: Secret {secret_ref}: {why}; that user is ignored"
                ),
            );
        }
        if users.is_empty() {
            self.invalid(secret_key, secret_name, &format!("Secret {secret_ref} has no usable user"), closed);
            return (None, true);
        }
        let realm = self.value("auth-realm", values::header_text).unwrap_or_default();
        (Some(auth::basic(realm, users)), false)
    }

    /// `auth-url` with `auth-method`, `auth-signin`, `auth-response-headers` and
    /// `auth-request-redirect`. Returns the policy, and whether it was asked for but cannot be
    /// set up (then the routes fail closed).
    fn external_auth(&mut self, refs: &Refs<'_>) -> (Option<ExternalAuth>, bool) {
        let Some((url_key, raw)) = self.reader.get("auth-url") else {
            self.unused_without(
                &[
                    "auth-method",
                    "auth-signin",
                    "auth-response-headers",
                    "auth-request-redirect",
                    "auth-proxy-set-headers",
                    "auth-signin-redirect-param",
                    "auth-always-set-cookie",
                    "auth-cache-key",
                    "auth-cache-duration",
                    "auth-keepalive",
                    "auth-keepalive-requests",
                    "auth-keepalive-timeout",
                    "auth-keepalive-share-vars",
                ],
                "auth-url",
            );
            return (None, false);
        };
        let url = match values::auth_url(raw.trim()) {
            Ok(url) => url,
            Err(why) => {
                self.invalid(url_key, raw, &why, "the routes deny every client (403) until it is fixed");
                return (None, true);
            }
        };
        let method = self.value("auth-method", values::method).unwrap_or_else(|| "GET".into());
        let signin = self.value("auth-signin", values::auth_url);
        let response_headers = self
            .value("auth-response-headers", values::cors_headers)
            .map(|list| list.split(',').map(|h| h.trim().to_string()).filter(|h| h != "*").collect())
            .unwrap_or_default();
        let request_redirect = self.value("auth-request-redirect", values::header_text);
        let proxy_set_headers = self.auth_proxy_set_headers(refs);
        let signin_redirect_param = self.value("auth-signin-redirect-param", values::query_param);
        if signin.is_none() {
            self.unused_without(&["auth-signin-redirect-param"], "auth-signin");
        }
        let always_set_cookie = self.value("auth-always-set-cookie", values::boolean).unwrap_or(false);
        let cache = self.auth_cache();
        // weir pools connections to the service with its upstream connections (idle ones
        // closed after the pool's idle timeout): these are validated, and change nothing.
        let _ = self.value("auth-keepalive", values::at_least(0));
        let _ = self.value("auth-keepalive-requests", values::at_least(1));
        let _ = self.value("auth-keepalive-timeout", values::at_least(1));
        let _ = self.value("auth-keepalive-share-vars", values::boolean);
        let auth = ExternalAuth {
            url,
            method,
            signin,
            response_headers,
            request_redirect,
            proxy_set_headers,
            signin_redirect_param,
            always_set_cookie,
            cache,
            // The Ingress's `proxy-ssl-*`, set by translation with the snapshot's Secrets.
            tls: None,
        };
        (Some(auth), false)
    }

    /// `auth-cache-key` with `auth-cache-duration` (default `200 202 401 5m`, as ingress-nginx).
    /// Without a key nothing is cached, as in ingress-nginx.
    fn auth_cache(&mut self) -> Option<weir_dataplane::model::AuthCacheSpec> {
        let key = self.value("auth-cache-key", values::auth_cache_key);
        let valid = self.value("auth-cache-duration", values::cache_durations);
        if key.is_none() && self.reader.get("auth-cache-key").is_none() {
            self.unused_without(&["auth-cache-duration"], "auth-cache-key");
        }
        Some(values::auth_cache(key?, valid))
    }

    /// `auth-proxy-set-headers`: the headers of a ConfigMap in the Ingress's namespace, set on
    /// the authentication subrequest. Each unusable header is reported and skipped.
    fn auth_proxy_set_headers(&mut self, refs: &Refs<'_>) -> BTreeMap<String, String> {
        self.header_configmap("auth-proxy-set-headers", refs, super::headers::Direction::Upstream, None)
    }

    /// `affinity: cookie` (with `session-cookie-*` and `affinity-mode`), else `upstream-hash-by`,
    /// else `load-balance`: ingress-nginx's precedence. An empty cookie path stands for the
    /// route's path, filled in per route. `None`: none of them is set (the ConfigMap's
    /// `upstream-hash-by` or `load-balance` applies).
    fn balance(&mut self) -> Option<Balance> {
        let affinity = self.value("affinity", |v| match v {
            "cookie" => Ok(()),
            _ => Err("only cookie affinity exists".to_string()),
        });
        let cookie_settings = [
            "affinity-mode",
            "session-cookie-name",
            "session-cookie-path",
            "session-cookie-domain",
            "session-cookie-max-age",
            "session-cookie-expires",
            "session-cookie-samesite",
            "session-cookie-secure",
            "session-cookie-change-on-failure",
            "affinity-canary-behavior",
        ];
        if affinity.is_some() {
            let _mode = self.value("affinity-mode", |v| match v {
                "balanced" | "persistent" => Ok(()),
                _ => Err("expected balanced or persistent".to_string()),
            });
            // weir always moves a session whose endpoint failed to the endpoint that answered
            // (and says so in a new cookie): `true`'s behaviour. `false` would keep sending the
            // session to an endpoint that just failed.
            if self.value("session-cookie-change-on-failure", values::boolean) == Some(false)
                && let Some((key, _)) = self.reader.get("session-cookie-change-on-failure")
            {
                self.warnings.warn(
                    self.ingress,
                    Reason::InvalidAnnotation,
                    format!("metadata.annotations[{key}]: weir always moves a session whose endpoint failed to the endpoint that answered; \"false\" is not available"),
                );
            }
            return Some(Balance::Cookie(Box::new(CookieAffinity {
                name: self
                    .value("session-cookie-name", values::header_name)
                    .unwrap_or_else(|| "INGRESSCOOKIE".into()),
                path: self.value("session-cookie-path", values::app_root).unwrap_or_default(),
                max_age: self.value("session-cookie-max-age", |v| values::seconds(v).map(u64::from)),
                expires: self.value("session-cookie-expires", |v| values::seconds(v).map(u64::from)),
                domain: self.value("session-cookie-domain", values::cookie_domain),
                same_site: self.value("session-cookie-samesite", |v| match v.to_ascii_lowercase().as_str() {
                    "none" => Ok("None".to_string()),
                    "lax" => Ok("Lax".to_string()),
                    "strict" => Ok("Strict".to_string()),
                    _ => Err("expected None, Lax or Strict".to_string()),
                }),
                secure: self.value("session-cookie-secure", values::boolean).unwrap_or(false),
                legacy_canary: self
                    .value("affinity-canary-behavior", |v| match v {
                        "sticky" => Ok(false),
                        "legacy" => Ok(true),
                        _ => Err("expected sticky or legacy".to_string()),
                    })
                    .unwrap_or(false),
            })));
        }
        if self.reader.get("affinity").is_none() {
            self.unused_without(&cookie_settings, "affinity: cookie");
        }
        if let Some(template) = self.value("upstream-hash-by", values::hash_key) {
            return Some(Balance::Hash(template));
        }
        self.value("load-balance", values::load_balance)
    }

    /// `canary: "true"` with `canary-weight` (0), `canary-weight-total` (100), `canary-by-header`
    /// (and `-value` or `-pattern`) and `canary-by-cookie`.
    fn canary(&mut self) -> Option<CanarySpec> {
        const SETTINGS: [&str; 6] = [
            "canary-weight",
            "canary-weight-total",
            "canary-by-header",
            "canary-by-header-value",
            "canary-by-header-pattern",
            "canary-by-cookie",
        ];
        if !self.value("canary", values::boolean).unwrap_or(false) {
            self.unused_without(&SETTINGS, "canary: \"true\"");
            return None;
        }
        let weight_total = self.value("canary-weight-total", values::rate).unwrap_or(100);
        let weight = self
            .value("canary-weight", |v| match v.parse::<u32>() {
                Ok(w) if w <= weight_total => Ok(w),
                _ => Err(format!("expected a whole number from 0 to canary-weight-total ({weight_total})")),
            })
            .unwrap_or(0);
        let header = self.value("canary-by-header", values::header_name);
        let header_value = self.value("canary-by-header-value", values::header_text);
        let header_pattern = self.value("canary-by-header-pattern", values::regex);
        let cookie = self.value("canary-by-cookie", values::header_name);
        Some(CanarySpec { weight, weight_total, header, header_value, header_pattern, cookie })
    }

    /// `limit-rps` and `limit-rpm`, with `limit-burst-multiplier` (5) and `limit-allowlist` (or
    /// its old name `limit-whitelist`). Refused requests get 503, ingress-nginx's default.
    fn rate_limit(&mut self) -> Option<RateLimit> {
        let rps = self.value("limit-rps", values::rate);
        let rpm = self.value("limit-rpm", values::rate);
        let burst_multiplier = self.value("limit-burst-multiplier", values::rate).unwrap_or(5);
        let exempt = self
            .value("limit-allowlist", values::cidr_list)
            .or_else(|| self.value("limit-whitelist", values::cidr_list))
            .unwrap_or_default();
        if rps.is_none() && rpm.is_none() {
            // The allowlist exempts clients from limit-connections too.
            let connections = self.reader.get("limit-connections").is_some();
            let unused: &[&str] = if connections {
                &["limit-burst-multiplier"]
            } else {
                &["limit-burst-multiplier", "limit-allowlist", "limit-whitelist"]
            };
            self.unused_without(unused, "limit-rps or limit-rpm");
            return None;
        }
        Some(RateLimit { rps, rpm, burst_multiplier, exempt, status: 503 })
    }

    /// `global-rate-limit` and `global-rate-limit-window` (both needed), `global-rate-limit-key`
    /// (default `$remote_addr`), `global-rate-limit-ignored-cidrs`.
    fn global_limit(&mut self) -> Option<(u64, u64, String, Vec<IpNet>)> {
        let limit = self.value("global-rate-limit", |v| match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err("expected a number of requests above 0".to_string()),
        });
        let window = self.value("global-rate-limit-window", values::timeout_ms);
        let key =
            self.value("global-rate-limit-key", values::hash_key).unwrap_or_else(|| "$remote_addr".into());
        let exempt = self.value("global-rate-limit-ignored-cidrs", values::cidr_list).unwrap_or_default();
        match (limit, window) {
            (Some(limit), Some(window)) => Some((limit, window, key, exempt)),
            (Some(_), None) if self.reader.get("global-rate-limit-window").is_none() => {
                self.unused_without(&["global-rate-limit"], "global-rate-limit-window");
                None
            }
            (None, _) => {
                let names =
                    ["global-rate-limit-window", "global-rate-limit-key", "global-rate-limit-ignored-cidrs"];
                if self.reader.get("global-rate-limit").is_none() {
                    self.unused_without(&names, "global-rate-limit");
                }
                None
            }
            _ => None,
        }
    }

    /// `allowlist-source-range` (or its old name `whitelist-source-range`) and
    /// `denylist-source-range`. An invalid list fails closed: the routes deny every client.
    fn source_filter(&mut self) -> SourceFilter {
        let mut filter = SourceFilter::default();
        let allow =
            self.reader.get("allowlist-source-range").or_else(|| self.reader.get("whitelist-source-range"));
        if let (Some(_), Some((old, _))) =
            (self.reader.get("allowlist-source-range"), self.reader.get("whitelist-source-range"))
        {
            self.warnings.warn(
                self.ingress,
                Reason::InvalidAnnotation,
                format!(
                    "metadata.annotations[{old}]: ignored: allowlist-source-range, its new name, is set too"
                ),
            );
        }
        for (entry, list) in
            [(allow, &mut filter.allow), (self.reader.get("denylist-source-range"), &mut filter.deny)]
        {
            let Some((key, raw)) = entry else { continue };
            match values::cidr_list(raw) {
                Ok(nets) => *list = nets,
                Err(why) => {
                    self.invalid(key, raw, &why, "the routes deny every client (403) until it is fixed");
                    return SourceFilter { allow: Vec::new(), deny: deny_all() };
                }
            }
        }
        filter
    }
}

/// Entry points for the fuzz targets (`fuzz/`) into the value parsers this module keeps
/// private. Not an API: it exists so the fuzzers call the parsers themselves, not copies.
#[doc(hidden)]
pub mod fuzzing {
    use super::values as v;

    /// Every value parser whose answer is text that ends up in a header or a URL (`redirect_url`,
    /// `auth_url`, ...), applied to `value`: (parser name, its answer).
    pub fn text_values(value: &str) -> Vec<(&'static str, Result<String, String>)> {
        vec![
            ("redirect_url", v::redirect_url(value)),
            ("rewrite_target", v::rewrite_target(value)),
            ("cors_origins", v::cors_origins(value).map(|o| o.join(","))),
            ("cors_methods", v::cors_methods(value)),
            ("cors_headers", v::cors_headers(value)),
            ("auth_url", v::auth_url(value)),
            ("auth_signin", v::auth_url(value)),
            ("mirror_target", v::mirror_target(value)),
            ("method", v::method(value)),
            ("header_name", v::header_name(value)),
            ("cookie_domain", v::cookie_domain(value)),
            ("app_root", v::app_root(value)),
            ("header_text", v::header_text(value)),
            ("host_and_port", v::host_and_port(value)),
            ("query_param", v::query_param(value)),
        ]
    }

    /// Every other value parser applied to `value` (the path regex and the cache key, which
    /// never reach a header, among them): (parser name, its answer as `Debug` text).
    pub fn typed_values(value: &str) -> Vec<(&'static str, Result<String, String>)> {
        fn dbg<T: std::fmt::Debug>(r: Result<T, String>) -> Result<String, String> {
            r.map(|t| format!("{t:?}"))
        }
        vec![
            ("regex", v::regex(value)),
            ("auth_cache_key", v::auth_cache_key(value)),
            ("boolean", dbg(v::boolean(value))),
            ("rate", dbg(v::rate(value))),
            ("seconds", dbg(v::seconds(value))),
            ("timeout_ms", dbg(v::timeout_ms(value))),
            ("timeout_ms_or_zero", dbg(v::timeout_ms_or_zero(value))),
            ("next_upstream", dbg(v::next_upstream(value))),
            ("tries", dbg(v::tries(value))),
            ("tls_versions", dbg(v::tls_versions(value))),
            ("status_codes", dbg(v::status_codes(value))),
            ("on_off", dbg(v::on_off(value))),
            ("host_list", dbg(v::host_list(value))),
            ("redirect_code", dbg(v::redirect_code(value))),
            ("size", dbg(v::size(value))),
            ("cidr_list", dbg(v::cidr_list(value))),
            ("nginx_seconds", dbg(v::nginx_seconds(value))),
            ("cache_durations", dbg(v::cache_durations(value))),
            ("at_least_1", dbg(v::at_least(1)(value))),
            ("buffer_size", dbg(v::buffer_size(value))),
            ("buffers_number", dbg(v::buffers_number(value))),
        ]
    }
}

#[cfg(test)]
mod tests;
