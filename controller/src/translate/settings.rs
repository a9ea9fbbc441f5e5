//! The settings ConfigMap: ingress-nginx's global keys, parsed into typed [`Settings`] for the
//! dataplane and route policy defaults for translation. Never an injection surface: every value
//! is parsed into a type, and the snippet keys that pasted raw nginx configuration are refused.
//!
//! Every key is accounted for, as annotations are (`annotations::CATALOGUE`):
//! - supported: parsed; an invalid value is an error naming the key, the value and the reason,
//!   and that key keeps its default while the others apply;
//! - refused (snippets, Lua): an error saying why;
//! - not supported yet: a warning; where ignoring it would open access (global authentication,
//!   client blocklists), every route denies every client (403) until it is removed;
//! - unknown (a typo): a warning.
//!
//! [`CATALOGUE`] is the one list of keys; `docs/migrating-from-ingress-nginx.md` is checked
//! against it by a test. Precedence: an annotation beats the ConfigMap, which beats weir's
//! command-line flags, which beat the built-in defaults.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;

use weir_dataplane::model::logformat::Template;
use weir_dataplane::model::{
    ExternalAuth, Forwarded, Hsts, IpNet, LogField, ObjectRef, RoutePolicy, Settings, SourceFilter,
    TlsVersion,
};

use super::TranslateConfig;
use super::annotations::{MODSECURITY, OPENTRACING, Support, deny_all, values};
use super::headers::{self, Direction};
use super::warnings::{ObjectKind, Reason, Warnings};
use crate::snapshot::{Objects, Snapshot};

const SNIPPET: &str = "raw nginx configuration is an injection surface (CVE-2021-25742; the injections behind CVE-2025-1974 are of the same kind); use the typed settings and annotations instead";
const LUA: &str = "weir runs no Lua";
const GEOIP: &str = "it needs MaxMind databases weir cannot ship; look the client address up in the backend (weir sends it in X-Forwarded-For and X-Real-IP)";
const STATUS: &str = "weir has no nginx status page; its admin listener (--admin) serves metrics and health checks: restrict it with a NetworkPolicy";
const LISTEN: &str =
    "weir's listeners are set by its flags (--listen-http, --listen-https), not by the ConfigMap";

/// Every ConfigMap key ingress-nginx documents, with what weir does with it.
pub const CATALOGUE: &[(&str, Support)] = {
    use Support::*;
    &[
        // Client address and forwarded headers.
        ("use-forwarded-headers", Supported),
        ("enable-real-ip", Supported),
        ("forwarded-for-header", Supported),
        ("compute-full-forwarded-for", Supported),
        ("proxy-real-ip-cidr", Supported),
        ("use-proxy-protocol", Supported),
        ("proxy-protocol-header-timeout", Supported),
        ("proxy-add-original-uri-header", Supported),
        ("generate-request-id", Supported),
        // TLS.
        ("hsts", Supported),
        ("hsts-max-age", Supported),
        ("hsts-include-subdomains", Supported),
        ("hsts-preload", Supported),
        ("ssl-protocols", Supported),
        ("ssl-redirect", Supported),
        ("force-ssl-redirect", Supported),
        ("http-redirect-code", Supported),
        ("no-tls-redirect-locations", Supported),
        ("ssl-ciphers", Supported),
        ("ssl-ecdh-curve", Supported),
        (
            "ssl-dh-param",
            NotSupported(
                "weir's TLS library (rustls) has no finite-field Diffie-Hellman (DHE) suites, so there are no DH parameters to set; key exchange is always ECDHE (see ssl-ecdh-curve)",
            ),
        ),
        ("ssl-early-data", Unsupported),
        ("ssl-session-cache", Supported),
        ("ssl-session-cache-size", Supported),
        ("ssl-session-tickets", Supported),
        ("ssl-session-ticket-key", Supported),
        ("ssl-session-timeout", Supported),
        ("ssl-buffer-size", Supported),
        ("ssl-reject-handshake", Supported),
        ("enable-ocsp", Supported),
        ("proxy-ssl-location-only", Supported),
        // Client connections.
        ("keep-alive", Supported),
        ("keep-alive-requests", Supported),
        ("worker-shutdown-timeout", Supported),
        ("enable-underscores-in-headers", Supported),
        ("ignore-invalid-headers", Supported),
        ("use-http2", Supported),
        ("http2-max-concurrent-streams", Supported),
        ("http2-max-field-size", Supported),
        ("http2-max-header-size", Supported),
        ("http2-max-requests", Unsupported),
        ("client-header-buffer-size", Supported),
        ("client-header-timeout", Supported),
        ("client-body-buffer-size", Supported),
        ("client-body-timeout", Supported),
        ("large-client-header-buffers", Supported),
        ("server-tokens", Supported),
        // Request paths: weir's own keys (nginx's `merge_slashes`; ingress-nginx has none).
        ("merge-slashes", Supported),
        ("encoded-slashes", Supported),
        // Upstreams: route defaults and connections.
        ("proxy-body-size", Supported),
        ("proxy-read-timeout", Supported),
        ("proxy-next-upstream-tries", Supported),
        ("proxy-connect-timeout", Supported),
        ("proxy-send-timeout", Supported),
        ("proxy-next-upstream", Supported),
        ("proxy-next-upstream-timeout", Supported),
        ("retry-non-idempotent", Supported),
        ("proxy-buffering", Supported),
        ("proxy-request-buffering", Supported),
        ("proxy-buffer-size", Supported),
        ("proxy-buffers-number", Supported),
        ("proxy-max-temp-file-size", Supported),
        ("proxy-http-version", Unsupported),
        ("proxy-cookie-domain", Supported),
        ("proxy-cookie-path", Supported),
        ("proxy-redirect-from", Supported),
        ("proxy-redirect-to", Supported),
        ("proxy-set-headers", Supported),
        ("add-headers", Supported),
        ("global-allowed-response-headers", Supported),
        ("hide-headers", Supported),
        ("allow-backend-server-header", Supported),
        ("upstream-keepalive-connections", Supported),
        ("upstream-keepalive-time", Supported),
        ("upstream-keepalive-timeout", Supported),
        ("upstream-keepalive-requests", Supported),
        ("load-balance", Supported),
        ("upstream-hash-by", Supported),
        ("upstream-hash-by-subset", Unsupported),
        ("upstream-hash-by-subset-size", Unsupported),
        ("service-upstream", Supported),
        ("preserve-trailing-slash", Supported),
        ("use-port-in-redirects", Unsupported),
        ("custom-http-errors", Supported),
        ("disable-proxy-intercept-errors", Unsupported),
        ("default-type", Unsupported),
        // Access.
        ("whitelist-source-range", Supported),
        ("denylist-source-range", Supported),
        ("block-cidrs", Supported),
        ("block-user-agents", Supported),
        ("block-referers", Supported),
        ("limit-req-status-code", Supported),
        ("limit-conn-status-code", Supported),
        ("limit-conn-zone-variable", Supported),
        ("limit-rate", Supported),
        ("limit-rate-after", Supported),
        ("global-auth-url", Supported),
        ("global-auth-method", Supported),
        ("global-auth-signin", Supported),
        ("global-auth-signin-redirect-param", Supported),
        ("global-auth-response-headers", Supported),
        ("global-auth-request-redirect", Supported),
        ("global-auth-cache-key", Supported),
        ("global-auth-cache-duration", Supported),
        ("global-auth-always-set-cookie", Supported),
        ("no-auth-locations", Supported),
        ("global-rate-limit-memcached-host", Supported),
        ("global-rate-limit-memcached-port", Supported),
        ("global-rate-limit-memcached-connect-timeout", Supported),
        ("global-rate-limit-memcached-max-idle-timeout", Supported),
        ("global-rate-limit-memcached-pool-size", Supported),
        ("global-rate-limit-status-code", Supported),
        ("allow-cross-namespace-resources", Supported),
        ("annotation-value-word-blocklist", Supported),
        ("annotations-risk-level", Supported),
        ("strict-validate-path-type", Supported),
        // Logs.
        ("log-format-upstream", Supported),
        ("log-format-escape-json", Supported),
        ("log-format-escape-none", Supported),
        ("disable-access-log", Supported),
        ("disable-http-access-log", Supported),
        ("disable-stream-access-log", Supported),
        ("log-format-stream", Supported),
        ("access-log-path", Supported),
        ("http-access-log-path", Supported),
        ("stream-access-log-path", Supported),
        ("access-log-params", Refused(logging::ACCESS_LOG_PARAMS)),
        ("enable-access-log-for-default-backend", Supported),
        ("enable-auth-access-log", Supported),
        ("skip-access-log-urls", Supported),
        ("error-log-path", Supported),
        ("error-log-level", Supported),
        ("enable-syslog", Supported),
        ("syslog-host", Supported),
        ("syslog-port", Supported),
        // Tracing.
        ("enable-opentelemetry", Supported),
        (
            "opentelemetry-config",
            NotSupported("it names an nginx OpenTelemetry module file; weir takes the otel-* keys"),
        ),
        ("opentelemetry-operation-name", Supported),
        ("opentelemetry-trust-incoming-span", Supported),
        ("otlp-collector-host", Supported),
        ("otlp-collector-port", Supported),
        ("otel-service-name", Supported),
        ("otel-sampler", Supported),
        ("otel-sampler-ratio", Supported),
        ("otel-sampler-parent-based", Supported),
        ("otel-max-queuesize", Supported),
        ("otel-schedule-delay-millis", Supported),
        ("otel-max-export-batch-size", Supported),
        ("enable-opentracing", NotSupported(OPENTRACING)),
        ("opentracing-operation-name", NotSupported(OPENTRACING)),
        ("opentracing-location-operation-name", NotSupported(OPENTRACING)),
        ("opentracing-trust-incoming-span", NotSupported(OPENTRACING)),
        ("zipkin-collector-host", NotSupported(OPENTRACING)),
        ("zipkin-collector-port", NotSupported(OPENTRACING)),
        ("zipkin-service-name", NotSupported(OPENTRACING)),
        ("zipkin-sample-rate", NotSupported(OPENTRACING)),
        ("jaeger-collector-host", NotSupported(OPENTRACING)),
        ("jaeger-collector-port", NotSupported(OPENTRACING)),
        ("jaeger-endpoint", NotSupported(OPENTRACING)),
        ("jaeger-service-name", NotSupported(OPENTRACING)),
        ("jaeger-propagation-format", NotSupported(OPENTRACING)),
        ("jaeger-sampler-type", NotSupported(OPENTRACING)),
        ("jaeger-sampler-param", NotSupported(OPENTRACING)),
        ("jaeger-sampler-host", NotSupported(OPENTRACING)),
        ("jaeger-sampler-port", NotSupported(OPENTRACING)),
        ("jaeger-trace-context-header-name", NotSupported(OPENTRACING)),
        ("jaeger-debug-header", NotSupported(OPENTRACING)),
        ("jaeger-baggage-header", NotSupported(OPENTRACING)),
        ("jaeger-tracer-baggage-header-prefix", NotSupported(OPENTRACING)),
        ("datadog-collector-host", NotSupported(OPENTRACING)),
        ("datadog-collector-port", NotSupported(OPENTRACING)),
        ("datadog-service-name", NotSupported(OPENTRACING)),
        ("datadog-environment", NotSupported(OPENTRACING)),
        ("datadog-operation-name-override", NotSupported(OPENTRACING)),
        ("datadog-priority-sampling", NotSupported(OPENTRACING)),
        ("datadog-sample-rate", NotSupported(OPENTRACING)),
        // Compression, GeoIP, WAF.
        ("use-gzip", Supported),
        ("gzip-level", Supported),
        ("gzip-min-length", Supported),
        ("gzip-types", Supported),
        ("gzip-disable", Supported),
        ("enable-brotli", Supported),
        ("brotli-level", Supported),
        ("brotli-min-length", Supported),
        ("brotli-types", Supported),
        // weir's own: zstd (nginx's zstd module's directive names).
        ("enable-zstd", Supported),
        ("zstd-level", Supported),
        ("zstd-min-length", Supported),
        ("zstd-types", Supported),
        ("use-geoip", NotSupported(GEOIP)),
        ("use-geoip2", NotSupported(GEOIP)),
        ("enable-modsecurity", NotSupported(MODSECURITY)),
        ("enable-owasp-modsecurity-crs", NotSupported(MODSECURITY)),
        // nginx process tuning and internals: weir has nothing to tune (no-ops, no warning).
        ("worker-processes", NoOp),
        ("worker-cpu-affinity", NoOp),
        ("max-worker-connections", NoOp),
        ("max-worker-open-files", NoOp),
        ("enable-multi-accept", NoOp),
        ("reuse-port", NoOp),
        ("bind-address", NotSupported(LISTEN)),
        ("disable-ipv6", NotSupported(LISTEN)),
        ("disable-ipv6-dns", NoOp),
        ("enable-aio-write", NoOp),
        ("map-hash-bucket-size", NoOp),
        ("server-name-hash-max-size", NoOp),
        ("server-name-hash-bucket-size", NoOp),
        ("proxy-headers-hash-max-size", NoOp),
        ("proxy-headers-hash-bucket-size", NoOp),
        ("variables-hash-bucket-size", NoOp),
        ("variables-hash-max-size", NoOp),
        ("nginx-status-ipv4-whitelist", NotSupported(STATUS)),
        ("nginx-status-ipv6-whitelist", NotSupported(STATUS)),
        (
            "debug-connections",
            NotSupported("weir has no per-client debug log; error-log-level sets the level for all"),
        ),
        // TCP/UDP streams.
        ("proxy-stream-timeout", Supported),
        ("proxy-stream-next-upstream", Supported),
        ("proxy-stream-next-upstream-timeout", Supported),
        ("proxy-stream-next-upstream-tries", Supported),
        ("proxy-stream-responses", Supported),
        // weir's own: the PROXY protocol version sent to TCP services' upstreams.
        ("stream-proxy-protocol-version", Supported),
        // Refused.
        ("allow-snippet-annotations", Refused(SNIPPET)),
        ("main-snippet", Refused(SNIPPET)),
        ("http-snippet", Refused(SNIPPET)),
        ("server-snippet", Refused(SNIPPET)),
        ("location-snippet", Refused(SNIPPET)),
        ("stream-snippet", Refused(SNIPPET)),
        ("modsecurity-snippet", Refused(SNIPPET)),
        ("global-auth-snippet", Refused(SNIPPET)),
        ("lua-shared-dicts", Refused(LUA)),
        ("plugins", Refused(LUA)),
    ]
};

/// The settings ConfigMap read from a manifest directory when `--configmap` names none.
pub fn default_configmap() -> ObjectRef {
    ObjectRef::new("default", "weir-settings")
}

/// What weir does with ConfigMap key `key`; `None` for a key it does not know.
pub fn support(key: &str) -> Option<Support> {
    CATALOGUE.iter().find(|(n, _)| *n == key).map(|(_, s)| *s)
}

/// `encoded-slashes`: `decode` (nginx's way: `%2F` is `/` for routing) or `reject` (400).
fn encoded_slashes(s: &str) -> Result<bool, String> {
    match s {
        "decode" => Ok(false),
        "reject" => Ok(true),
        _ => Err("expected decode or reject".into()),
    }
}

/// ingress-nginx's `hsts-max-age` default: a year.
const HSTS_MAX_AGE: u64 = 31_536_000;

/// `hide-headers`: comma-separated header names, lower-cased.
fn header_names(s: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        names.push(values::header_name(name)?.to_ascii_lowercase());
    }
    Ok(names)
}

/// What the settings ConfigMap says, typed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// Global settings for the dataplane.
    pub(crate) settings: Settings,
    /// Defaults of the route policies.
    pub(crate) routes: RouteDefaults,
    /// `global-allowed-response-headers` (lower case): when set, the only header names
    /// `custom-headers` may set.
    pub(crate) allowed_response_headers: Option<BTreeSet<String>>,
    /// What Ingress authors may do with annotations and paths.
    pub(crate) guards: super::annotations::risk::Guards,
}

/// Route policy defaults from the ConfigMap; an Ingress's annotations beat them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RouteDefaults {
    /// `ssl-redirect` (true).
    pub(crate) ssl_redirect: bool,
    /// `force-ssl-redirect` (false).
    pub(crate) force_ssl_redirect: bool,
    /// `whitelist-source-range`: for routes without an allow list of their own.
    allow: Vec<IpNet>,
    /// `denylist-source-range`: for routes without a deny list of their own.
    deny: Vec<IpNet>,
    /// `block-cidrs`: denied on every route.
    block: Vec<IpNet>,
    /// An unsupported or invalid access setting: every route denies every client.
    fail_closed: bool,
    /// `limit-req-status-code`.
    limit_status: Option<u16>,
    /// `global-auth-url` and its `global-auth-*` settings: the external authentication of every
    /// route whose Ingress has none of its own and does not say `enable-global-auth: "false"`.
    pub(crate) global_auth: Option<Box<ExternalAuth>>,
    /// `no-auth-locations`: path prefixes exempt from the global authentication.
    no_auth_locations: Vec<String>,
    /// `limit-conn-status-code`.
    conn_status: Option<u16>,
    /// `limit-rate`, `limit-rate-after`, `proxy-redirect-*`, `proxy-cookie-*`,
    /// `preserve-trailing-slash`: for the keys an Ingress's annotations leave unset.
    pub(crate) response: super::annotations::limits::ResponseSettings,
    /// `upstream-hash-by`, else `load-balance`: the balancing of routes whose Ingress sets none
    /// (`affinity`, `upstream-hash-by` or `load-balance` annotations).
    pub(crate) balance: Option<weir_dataplane::model::Balance>,
    /// `custom-http-errors`: the codes whose answers the default backend replaces, on routes
    /// whose Ingress has no `custom-http-errors` of its own.
    pub(crate) custom_errors: Option<Vec<u16>>,
    /// `no-tls-redirect-locations`: routes whose path starts with one of these never redirect
    /// to HTTPS (ACME HTTP-01 challenges must be answered over plain HTTP).
    pub(crate) no_tls_redirect_locations: Vec<String>,
    /// `global-rate-limit-memcached-*`: where the global rate limits count; `None`: the
    /// `global-rate-limit` annotations are ignored (warned).
    pub(crate) memcached: Option<weir_dataplane::model::Memcached>,
    /// `global-rate-limit-status-code` (default 429).
    pub(crate) global_limit_status: u16,
    /// `service-upstream`: backends of Ingresses without the annotation go through the
    /// Service's ClusterIP (default false: the endpoints).
    pub(crate) service_upstream: bool,
}

impl Default for RouteDefaults {
    fn default() -> Self {
        RouteDefaults {
            ssl_redirect: true,
            force_ssl_redirect: false,
            allow: Vec::new(),
            deny: Vec::new(),
            block: Vec::new(),
            fail_closed: false,
            limit_status: None,
            global_auth: None,
            no_auth_locations: vec!["/.well-known/acme-challenge".to_string()],
            conn_status: None,
            response: Default::default(),
            balance: None,
            custom_errors: None,
            no_tls_redirect_locations: vec!["/.well-known/acme-challenge".to_string()],
            memcached: None,
            global_limit_status: 429,
            service_upstream: false,
        }
    }
}

impl RouteDefaults {
    /// Fills in what `policy` (an Ingress's annotations) leaves unset; `global_auth`: whether
    /// the Ingress takes the global authentication (`enable-global-auth`, true by default).
    pub(crate) fn apply(&self, policy: &mut RoutePolicy, global_auth: bool) {
        if global_auth && policy.external_auth.is_none() {
            policy.external_auth.clone_from(&self.global_auth);
        }
        if let Some(status) = self.limit_status
            && let Some(limit) = &mut policy.rate_limit
        {
            limit.status = status;
        }
        if let Some(status) = self.conn_status
            && let Some(limit) = &mut policy.conn_limit
        {
            limit.status = status;
        }
        if self.fail_closed {
            policy.source = SourceFilter { allow: Vec::new(), deny: deny_all() };
            return;
        }
        let source = &mut policy.source;
        if source.allow.is_empty() {
            source.allow.clone_from(&self.allow);
        }
        if source.deny.is_empty() {
            source.deny.clone_from(&self.deny);
        }
        if !self.block.is_empty() {
            source.deny.extend(self.block.iter().copied());
            source.deny.sort();
            source.deny.dedup();
        }
    }
}

impl RouteDefaults {
    /// Whether the route on `path` never redirects to HTTPS (`no-tls-redirect-locations`: prefixes
    /// of the route's path, as ingress-nginx's `isLocationInLocationList` compares them).
    pub(crate) fn tls_redirect_exempt(&self, path: &weir_dataplane::model::PathMatch) -> bool {
        use weir_dataplane::model::PathMatch;
        let path = match path {
            PathMatch::Exact(p) | PathMatch::Prefix(p) | PathMatch::Regex(p) => p,
        };
        self.no_tls_redirect_locations.iter().any(|l| path.starts_with(l.as_str()))
    }

    /// Whether the route on `path` is exempt from the global authentication it was given
    /// (`no-auth-locations`: prefixes of the route's path, as ingress-nginx compares them).
    pub(crate) fn exempt(&self, policy: &RoutePolicy, path: &weir_dataplane::model::PathMatch) -> bool {
        use weir_dataplane::model::PathMatch;
        let (Some(global), Some(auth)) = (&self.global_auth, &policy.external_auth) else { return false };
        let path = match path {
            PathMatch::Exact(p) | PathMatch::Prefix(p) | PathMatch::Regex(p) => p,
        };
        global == auth && self.no_auth_locations.iter().any(|l| path.starts_with(l.as_str()))
    }
}

/// Reads the settings ConfigMap `config` names, if the snapshot has it; defaults otherwise.
pub(crate) fn read(snapshot: &Snapshot, config: &TranslateConfig, warnings: &mut Warnings) -> Parsed {
    let Some(name) = &config.settings else { return Parsed::default() };
    match snapshot.config_maps.get(name) {
        Some(cm) => {
            parse(name, cm.data.as_ref().unwrap_or(&BTreeMap::new()), &snapshot.config_maps, warnings)
        }
        None => Parsed::default(),
    }
}

/// Parses a settings ConfigMap's `data` (`config_maps`: those `add-headers` and
/// `proxy-set-headers` may name); every problem becomes a finding about the ConfigMap.
pub(crate) fn parse(
    configmap: &ObjectRef,
    data: &BTreeMap<String, String>,
    config_maps: &Objects<ConfigMap>,
    warnings: &mut Warnings,
) -> Parsed {
    let mut ctx = Ctx { configmap, data, warnings, fail_closed: false };
    ctx.classify();
    let mut parsed = Parsed::default();
    let s = &mut parsed.settings;
    s.forwarded = ctx.forwarded();
    s.hsts = ctx.hsts();
    s.tls_versions = ctx.tls_versions();
    s.tls_ciphers = ctx.tls_ciphers();
    (s.tls_sessions, s.tls_session_timeout_secs) = ctx.tls_sessions();
    s.max_body_bytes = ctx.value("proxy-body-size", values::size, "no limit");
    s.read_timeout_ms = ctx.value("proxy-read-timeout", values::timeout_ms, "60s");
    s.connect_timeout_ms = ctx.value("proxy-connect-timeout", values::timeout_ms, "5s");
    s.connect_tries = ctx.value("proxy-next-upstream-tries", values::tries, "3");
    s.next_upstream = ctx.value("proxy-next-upstream", values::next_upstream, "error timeout");
    s.next_upstream_timeout_ms =
        ctx.value("proxy-next-upstream-timeout", values::timeout_ms_or_zero, "0, no limit");
    s.retry_non_idempotent = ctx.value("retry-non-idempotent", values::boolean, "false");
    s.send_timeout_ms = ctx.value("proxy-send-timeout", values::timeout_ms, "60s");
    s.client_header_timeout_ms = ctx.value("client-header-timeout", values::timeout_ms, "30s");
    s.client_body_timeout_ms = ctx.value("client-body-timeout", values::timeout_ms, "60s");
    s.upstream_idle_timeout_ms = ctx.value("upstream-keepalive-timeout", values::timeout_ms, "60s");
    s.upstream_conn_requests = ctx.value("upstream-keepalive-requests", values::rate, "10000");
    s.upstream_conn_lifetime_ms = ctx.value("upstream-keepalive-time", values::timeout_ms, "1h");
    s.keepalive_secs = ctx.value("keep-alive", whole_seconds, "the 30 s request head timeout");
    s.keepalive_requests = ctx.value("keep-alive-requests", values::rate, "no limit");
    (s.upstream_keepalive, s.upstream_idle_max) = ctx.upstream_keepalive();
    s.drain_secs =
        ctx.value("worker-shutdown-timeout", |v| values::timeout_ms(v).map(|ms| ms.div_ceil(1000)), "30s");
    s.underscores_in_headers = ctx.value("enable-underscores-in-headers", values::boolean, "false");
    s.proxy_protocol = ctx.value("use-proxy-protocol", values::boolean, "--proxy-protocol");
    s.merge_slashes = ctx.value("merge-slashes", values::boolean, "true");
    s.reject_encoded_slashes = ctx.value("encoded-slashes", encoded_slashes, "decode");
    s.access_log = ctx.access_log();
    s.logging = ctx.logging();
    s.compression = ctx.compression();
    s.block_user_agents = ctx.blocklist("block-user-agents");
    s.block_referers = ctx.blocklist("block-referers");
    s.hide_headers = ctx.value("hide-headers", header_names, "none").unwrap_or_default();
    s.allow_backend_server_header = ctx.value("allow-backend-server-header", values::boolean, "false");
    s.original_uri_header = ctx.value("proxy-add-original-uri-header", values::boolean, "false");
    s.stream_timeout_ms = ctx.value("proxy-stream-timeout", values::timeout_ms, "600s");
    s.stream_next_upstream = ctx.value("proxy-stream-next-upstream", values::boolean, "true");
    s.stream_next_upstream_timeout_ms =
        ctx.value("proxy-stream-next-upstream-timeout", values::timeout_ms_or_zero, "0, no limit");
    s.stream_next_upstream_tries = ctx.value("proxy-stream-next-upstream-tries", values::tries, "3");
    s.stream_responses = ctx.value("proxy-stream-responses", super::l4::responses, "1");
    s.stream_proxy_protocol_v2 =
        ctx.value("stream-proxy-protocol-version", super::l4::proxy_protocol_version, "v1");
    s.client_limits = ctx.client_limits();
    s.otel = ctx.otel();
    s.response_headers = ctx.headers("add-headers", Direction::Response, config_maps);
    s.upstream_headers = ctx.headers("proxy-set-headers", Direction::Upstream, config_maps);
    parsed.allowed_response_headers = ctx.raw("global-allowed-response-headers").map(|list| {
        list.split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect()
    });
    parsed.guards = ctx.guards();
    s.tls_keys = ctx.tls_keys();
    ctx.fixed_values();
    parsed.routes = ctx.route_defaults();
    parsed
}

/// Parsing context: the ConfigMap, its data, and where problems go.
struct Ctx<'a, 'w> {
    configmap: &'a ObjectRef,
    data: &'a BTreeMap<String, String>,
    warnings: &'w mut Warnings,
    fail_closed: bool,
}

impl<'a> Ctx<'a, '_> {
    /// `annotations-risk-level`, `annotation-value-word-blocklist`,
    /// `allow-cross-namespace-resources`, `strict-validate-path-type`.
    fn guards(&mut self) -> super::annotations::risk::Guards {
        use super::annotations::risk::{Guards, Risk};
        let default = Guards::default();
        Guards {
            risk_level: self
                .value("annotations-risk-level", Risk::parse, "High")
                .unwrap_or(default.risk_level),
            blocked_words: self
                .raw("annotation-value-word-blocklist")
                .map(|list| {
                    list.split(',').map(str::trim).filter(|w| !w.is_empty()).map(String::from).collect()
                })
                .unwrap_or_default(),
            cross_namespace: self
                .value("allow-cross-namespace-resources", values::boolean, "false")
                .unwrap_or(default.cross_namespace),
            strict_path_type: self
                .value("strict-validate-path-type", values::boolean, "true")
                .unwrap_or(default.strict_path_type),
        }
    }

    /// Reports every key that is refused, not supported or unknown.
    fn classify(&mut self) {
        for (key, value) in self.data {
            let at = format!("data[{key}]");
            match support(key) {
                Some(Support::Supported) => {}
                // weir never runs snippets: saying so is fine.
                Some(Support::Refused(_))
                    if key == "allow-snippet-annotations" && values::boolean(value.trim()) == Ok(false) => {}
                Some(Support::Refused(why)) => {
                    self.error(Reason::RefusedSetting, format!("{at}: refused and ignored: {why}"))
                }
                Some(Support::Unsupported) => {
                    self.warn(Reason::UnsupportedSetting, format!("{at}: not supported by weir; ignored"))
                }
                Some(Support::NotSupported(why)) => self
                    .warn(Reason::UnsupportedSetting, format!("{at}: not supported by weir: {why}; ignored")),
                Some(Support::NoOp) => {}
                Some(Support::UnsupportedFailClosed) if value.trim().is_empty() => {}
                Some(Support::UnsupportedFailClosed) => {
                    self.fail_closed = true;
                    self.error(
                        Reason::UnsupportedSetting,
                        format!("{at}: not supported by weir; every route denies every client (403) rather than serve unprotected"),
                    );
                }
                None => self.warn(Reason::UnknownSetting, format!("{at}: unknown key; ignored")),
            }
        }
    }

    fn error(&mut self, reason: Reason, message: String) {
        self.warnings.error_on(ObjectKind::ConfigMap, self.configmap, reason, message);
    }

    fn warn(&mut self, reason: Reason, message: String) {
        self.warnings.warn_on(ObjectKind::ConfigMap, self.configmap, reason, message);
    }

    /// The trimmed value of `key`; an empty value is no value.
    fn raw(&self, key: &str) -> Option<&'a str> {
        self.data.get(key).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    /// The value of `key` parsed by `parse`; an invalid one is reported and `default` stays.
    fn value<T>(
        &mut self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
        default: &str,
    ) -> Option<T> {
        self.value_or(key, parse, &format!("the default ({default}) is kept"))
    }

    /// [`Ctx::value`] with the consequence of an invalid value spelled out.
    fn value_or<T>(
        &mut self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
        consequence: &str,
    ) -> Option<T> {
        let raw = self.raw(key)?;
        match parse(raw) {
            Ok(v) => Some(v),
            Err(why) => {
                self.error(
                    Reason::InvalidSetting,
                    format!("data[{key}]: invalid value {raw:?}: {why}; {consequence}"),
                );
                None
            }
        }
    }

    /// Reports each of `keys` that is set: it has no effect without `without`.
    fn unused_without(&mut self, keys: &[&str], without: &str) {
        for key in keys {
            if self.raw(key).is_some() {
                self.warn(Reason::InvalidSetting, format!("data[{key}]: has no effect without {without}"));
            }
        }
    }

    /// `add-headers` or `proxy-set-headers`: the headers of the ConfigMap `key` names. A missing
    /// ConfigMap is an error and adds nothing; each unusable header is an error and is skipped.
    fn headers(
        &mut self,
        key: &str,
        direction: Direction,
        config_maps: &Objects<ConfigMap>,
    ) -> BTreeMap<String, String> {
        let configmap = self.configmap;
        let Some(name) =
            self.value_or(key, |v| headers::configmap_ref(v, &configmap.namespace), "no header is set")
        else {
            return BTreeMap::new();
        };
        let Some(cm) = config_maps.get(&name) else {
            self.error(
                Reason::InvalidSetting,
                format!("data[{key}]: ConfigMap {name} not found; no header is set until it exists"),
            );
            return BTreeMap::new();
        };
        let (found, refused) = headers::read(cm.data.as_ref().unwrap_or(&BTreeMap::new()), direction, None);
        for (header, why) in refused {
            self.error(
                Reason::InvalidSetting,
                format!("data[{key}]: ConfigMap {name}, header {header:?}: {why}; the header is skipped"),
            );
        }
        found
    }

    /// `use-forwarded-headers` / `enable-real-ip` with `forwarded-for-header`,
    /// `proxy-real-ip-cidr` and `compute-full-forwarded-for`.
    fn forwarded(&mut self) -> Option<Forwarded> {
        let trust_headers = self.value("use-forwarded-headers", values::boolean, "false").unwrap_or(false);
        let real_ip = self.value("enable-real-ip", values::boolean, "false").unwrap_or(false);
        if !trust_headers && !real_ip {
            self.unused_without(
                &["forwarded-for-header", "proxy-real-ip-cidr", "compute-full-forwarded-for"],
                "use-forwarded-headers or enable-real-ip (a PROXY protocol address is taken from every peer)",
            );
            return None;
        }
        let client_header = self
            .value(
                "forwarded-for-header",
                |v| values::header_name(v).map(|h| h.to_ascii_lowercase()),
                "X-Forwarded-For",
            )
            .unwrap_or_else(|| "x-forwarded-for".to_string());
        // An unusable list trusts no one: falling back to 0.0.0.0/0 would let clients pick
        // their address.
        let trusted = match self.raw("proxy-real-ip-cidr") {
            None => "0.0.0.0/0".parse::<IpNet>().into_iter().collect(),
            Some(_) => self
                .value_or("proxy-real-ip-cidr", values::cidr_list, "no peer is trusted until it is fixed")
                .unwrap_or_default(),
        };
        let full_chain = self.value("compute-full-forwarded-for", values::boolean, "false").unwrap_or(false);
        if full_chain && !trust_headers {
            self.unused_without(&["compute-full-forwarded-for"], "use-forwarded-headers");
        }
        Some(Forwarded { trust_headers, client_header, trusted, full_chain: full_chain && trust_headers })
    }

    /// `hsts`, `hsts-max-age`, `hsts-include-subdomains`, `hsts-preload`: any of them set turns
    /// the header on with ingress-nginx's defaults for the others.
    fn hsts(&mut self) -> Option<Hsts> {
        const KEYS: [&str; 4] = ["hsts", "hsts-max-age", "hsts-include-subdomains", "hsts-preload"];
        if KEYS.iter().all(|k| self.raw(k).is_none()) {
            return None;
        }
        let whole = |v: &str| v.parse::<u64>().map_err(|_| "expected a whole number of seconds".to_string());
        Some(Hsts {
            enabled: self.value("hsts", values::boolean, "true").unwrap_or(true),
            max_age: self.value("hsts-max-age", whole, "31536000").unwrap_or(HSTS_MAX_AGE),
            include_subdomains: self
                .value("hsts-include-subdomains", values::boolean, "true")
                .unwrap_or(true),
            preload: self.value("hsts-preload", values::boolean, "false").unwrap_or(false),
        })
    }

    /// `ssl-protocols`: nginx's list; versions before TLS 1.2 are left out with a warning.
    fn tls_versions(&mut self) -> Option<Vec<TlsVersion>> {
        let (versions, old) = self.value("ssl-protocols", values::tls_versions, "TLSv1.2 TLSv1.3")?;
        if !old.is_empty() {
            self.warn(
                Reason::InvalidSetting,
                format!(
                    "data[ssl-protocols]: {} not offered: weir supports TLSv1.2 and TLSv1.3 only",
                    old.join(" ")
                ),
            );
        }
        Some(versions)
    }

    /// `ssl-ciphers`: an OpenSSL cipher string choosing the TLS 1.2 suites (TLS 1.3 ones stay
    /// on, as with nginx); entries selecting nothing weir offers are reported.
    fn tls_ciphers(&mut self) -> Option<Vec<String>> {
        let selection = self.value_or(
            "ssl-ciphers",
            weir_dataplane::tls::ciphers::parse,
            "every cipher suite weir has stays offered",
        )?;
        if !selection.unmatched.is_empty() {
            self.warn(
                Reason::InvalidSetting,
                format!(
                    "data[ssl-ciphers]: {} selects no cipher suite weir offers; left out",
                    selection.unmatched.join(":")
                ),
            );
        }
        Some(selection.tls12)
    }

    /// `ssl-session-cache` (`false`: no session resumption), `ssl-session-cache-size` (an nginx
    /// size; sessions kept at nginx's count of about 4000 per megabyte) and
    /// `ssl-session-timeout` (an nginx time, at most a day).
    fn tls_sessions(&mut self) -> (Option<u32>, Option<u32>) {
        let on = self.value("ssl-session-cache", values::boolean, "true");
        let size = self.value(
            "ssl-session-cache-size",
            |v| {
                let bytes = values::size(v)?;
                let sessions = bytes.saturating_mul(weir_dataplane::tls::sessions::SESSIONS_PER_MIB) >> 20;
                match u32::try_from(sessions) {
                    Ok(0) => Err("holds no session (nginx counts about 4000 per megabyte: 1k is the least that holds one); use ssl-session-cache: \"false\" to turn resumption off".to_string()),
                    Ok(n) if n <= 10_000_000 => Ok(n),
                    _ => Err("more than 10,000,000 sessions (2500m)".to_string()),
                }
            },
            "10m",
        );
        let timeout = self.value(
            "ssl-session-timeout",
            |v| match values::nginx_seconds(v)? {
                0 => Err("a session must be resumable for at least 1s".to_string()),
                n if n <= 86_400 => Ok(n as u32),
                _ => Err("more than a day (1d)".to_string()),
            },
            "10m",
        );
        if on == Some(false) {
            self.unused_without(&["ssl-session-cache-size", "ssl-session-timeout"], "ssl-session-cache");
            return (Some(0), None);
        }
        (size, timeout)
    }

    /// `upstream-keepalive-connections`: `0` turns upstream keep-alive off; any other value is
    /// the number of idle connections kept per endpoint.
    fn upstream_keepalive(&mut self) -> (Option<bool>, Option<u32>) {
        let idle = self.value(
            "upstream-keepalive-connections",
            |v| {
                v.parse::<u32>().map_err(|_| {
                    "expected a whole number of connections (0 turns keep-alive off)".to_string()
                })
            },
            "320",
        );
        match idle {
            None => (None, None),
            Some(0) => (Some(false), None),
            Some(n) => (Some(true), Some(n)),
        }
    }

    /// `log-format-upstream` as a JSON field selection, unless `disable-access-log`.
    fn access_log(&mut self) -> Option<Vec<LogField>> {
        let escape = "weir writes every line as JSON with JSON escaping";
        if self.value("log-format-escape-none", values::boolean, "false") == Some(true) {
            self.warn(Reason::UnsupportedSetting, format!("data[log-format-escape-none]: ignored: {escape}"));
        }
        let _ = self.value("log-format-escape-json", values::boolean, "false");
        let all = self.value("disable-access-log", values::boolean, "false") == Some(true);
        let http = self.value("disable-http-access-log", values::boolean, "false") == Some(true);
        let raw = self.raw("log-format-upstream")?;
        if all || http {
            self.unused_without(&["log-format-upstream"], "the access log (disable-access-log is set)");
            return None;
        }
        let (fields, dropped) = match log_format(raw) {
            Ok(parsed) => parsed,
            Err(why) => {
                self.error(
                    Reason::InvalidSetting,
                    format!("data[log-format-upstream]: invalid value: {why}; the default fields are logged"),
                );
                return None;
            }
        };
        for (key, why) in dropped {
            self.warn(
                Reason::InvalidSetting,
                format!("data[log-format-upstream]: field {key:?}: {why}; the field is left out"),
            );
        }
        if fields.is_empty() {
            self.error(
                Reason::InvalidSetting,
                "data[log-format-upstream]: no field left; the default fields are logged".to_string(),
            );
            return None;
        }
        Some(fields)
    }

    /// Keys weir accepts with the one value it implements (or that change nothing in a proxy
    /// that streams); another value is reported.
    fn fixed_values(&mut self) {
        let number =
            |v: &str| v.parse::<u16>().map(u64::from).map_err(|_| "expected a status code".to_string());
        type Parse = fn(&str) -> Result<bool, String>;
        let checks: [(&str, Parse, bool, &str); 4] = [
            ("generate-request-id", values::boolean, true, "weir always generates a missing X-Request-ID"),
            ("server-tokens", values::boolean, false, "weir sends no Server header of its own"),
            ("use-http2", values::boolean, true, "weir always offers HTTP/2 by ALPN"),
            ("proxy-buffering", values::on_off, false, "weir streams responses"),
        ];
        for (key, parse, expected, why) in checks {
            if let Some(v) = self.value(key, parse, &expected.to_string())
                && v != expected
            {
                self.warn(Reason::UnsupportedSetting, format!("data[{key}]: ignored: {why}"));
            }
        }
        // weir streams request bodies either way.
        let _ = self.value("proxy-request-buffering", values::on_off, "on");
        // limit-connections counts per client address, which is the default key.
        let _ =
            self.value(
                "limit-conn-zone-variable",
                |v| match v {
                    "$binary_remote_addr" | "$remote_addr" => Ok(()),
                    _ => Err("weir counts limit-connections per client address only ($binary_remote_addr)"
                        .to_string()),
                },
                "$binary_remote_addr",
            );
        // nginx's buffers: weir streams bodies both ways, never spools to disk, and reads
        // upstream response heads up to hyper's limits. Validated; nothing to change.
        let _ = self.value("client-body-buffer-size", values::buffer_size, "8k");
        let _ = self.value("proxy-buffer-size", values::buffer_size, "4k");
        let _ = self.value("proxy-buffers-number", values::buffers_number, "4");
        let _ = self.value("proxy-max-temp-file-size", values::size, "1024m");
        if let Some(code) = self.value("http-redirect-code", number, "308")
            && code != 308
        {
            self.warn(
                Reason::UnsupportedSetting,
                "data[http-redirect-code]: ignored: weir's HTTPS redirects are 308".to_string(),
            );
        }
    }

    /// `ssl-redirect`, `force-ssl-redirect`, the address lists and `limit-req-status-code`.
    fn route_defaults(&mut self) -> RouteDefaults {
        let mut routes = RouteDefaults {
            ssl_redirect: self.value("ssl-redirect", values::boolean, "true").unwrap_or(true),
            force_ssl_redirect: self.value("force-ssl-redirect", values::boolean, "false").unwrap_or(false),
            limit_status: self.value(
                "limit-req-status-code",
                |v| match v.parse::<u16>() {
                    Ok(code @ 400..=599) => Ok(code),
                    _ => Err("expected a status from 400 to 599".to_string()),
                },
                "503",
            ),
            conn_status: self.value("limit-conn-status-code", limits::status_code, "503"),
            response: self.response_settings(),
            ..RouteDefaults::default()
        };
        let closed = "every route denies every client (403) until it is fixed";
        for (key, list) in [
            ("whitelist-source-range", &mut routes.allow),
            ("denylist-source-range", &mut routes.deny),
            ("block-cidrs", &mut routes.block),
        ] {
            if self.raw(key).is_none() {
                continue;
            }
            match self.value_or(key, values::cidr_list, closed) {
                Some(nets) => *list = nets,
                None => self.fail_closed = true,
            }
        }
        if let Some(locations) = self.raw("no-tls-redirect-locations") {
            routes.no_tls_redirect_locations =
                locations.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
        }
        if let Some(locations) = self.raw("no-auth-locations") {
            routes.no_auth_locations =
                locations.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
        }
        routes.global_auth = self.global_auth().map(Box::new);
        routes.fail_closed = self.fail_closed;
        routes.balance = match self.value("upstream-hash-by", values::hash_key, "none") {
            Some(template) => Some(weir_dataplane::model::Balance::Hash(template)),
            None => self.value("load-balance", values::load_balance, "round_robin"),
        };
        routes.custom_errors = self.value("custom-http-errors", values::status_codes, "none");
        routes.memcached = self.memcached();
        routes.global_limit_status =
            self.value("global-rate-limit-status-code", limits::status_code, "429").unwrap_or(429);
        routes.service_upstream = self.value("service-upstream", values::boolean, "false").unwrap_or(false);
        routes
    }

    /// `global-rate-limit-memcached-host` and its companions, with ingress-nginx's defaults.
    fn memcached(&mut self) -> Option<weir_dataplane::model::Memcached> {
        const OTHERS: [&str; 4] = [
            "global-rate-limit-memcached-port",
            "global-rate-limit-memcached-connect-timeout",
            "global-rate-limit-memcached-max-idle-timeout",
            "global-rate-limit-memcached-pool-size",
        ];
        let Some(host) = self.value("global-rate-limit-memcached-host", values::host, "none") else {
            let set: Vec<&str> = OTHERS.into_iter().filter(|k| self.raw(k).is_some()).collect();
            for key in set {
                self.warn(
                    Reason::InvalidSetting,
                    format!("data[{key}]: has no effect without global-rate-limit-memcached-host"),
                );
            }
            return None;
        };
        let ms = |v: &str| match v.trim_end_matches("ms").parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err("expected milliseconds above 0".to_string()),
        };
        Some(weir_dataplane::model::Memcached {
            host,
            port: self.value("global-rate-limit-memcached-port", values::port, "11211").unwrap_or(11211),
            connect_timeout_ms: self
                .value("global-rate-limit-memcached-connect-timeout", ms, "50")
                .unwrap_or(50),
            idle_timeout_ms: self
                .value("global-rate-limit-memcached-max-idle-timeout", ms, "10000")
                .unwrap_or(10_000),
            pool_size: self
                .value(
                    "global-rate-limit-memcached-pool-size",
                    |v| match v.parse::<u32>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => Err("expected a number above 0".to_string()),
                    },
                    "50",
                )
                .unwrap_or(50),
        })
    }

    /// `global-auth-url` with `global-auth-method`, `-signin`, `-response-headers` and
    /// `-request-redirect`, read as the `auth-*` annotations are. An invalid URL fails closed.
    fn global_auth(&mut self) -> Option<ExternalAuth> {
        const SETTINGS: [&str; 8] = [
            "global-auth-method",
            "global-auth-signin",
            "global-auth-response-headers",
            "global-auth-request-redirect",
            "global-auth-signin-redirect-param",
            "global-auth-always-set-cookie",
            "global-auth-cache-key",
            "global-auth-cache-duration",
        ];
        if self.raw("global-auth-url").is_none() {
            self.unused_without(&SETTINGS, "global-auth-url");
            return None;
        }
        let closed = "every route denies every client (403) until it is fixed";
        let Some(url) = self.value_or("global-auth-url", values::auth_url, closed) else {
            self.fail_closed = true;
            return None;
        };
        Some(ExternalAuth {
            url,
            method: self.value("global-auth-method", values::method, "GET").unwrap_or_else(|| "GET".into()),
            signin: self.value("global-auth-signin", values::auth_url, "none"),
            response_headers: self
                .value("global-auth-response-headers", values::cors_headers, "none")
                .map(|list| list.split(',').map(|h| h.trim().to_string()).filter(|h| h != "*").collect())
                .unwrap_or_default(),
            request_redirect: self.value(
                "global-auth-request-redirect",
                values::header_text,
                "the request URI",
            ),
            signin_redirect_param: self.value("global-auth-signin-redirect-param", values::query_param, "rd"),
            always_set_cookie: self
                .value("global-auth-always-set-cookie", values::boolean, "false")
                .unwrap_or(false),
            cache: self.global_auth_cache(),
            ..ExternalAuth::default()
        })
    }

    /// `global-auth-cache-key` with `global-auth-cache-duration`, read as the `auth-cache-*`
    /// annotations are.
    fn global_auth_cache(&mut self) -> Option<weir_dataplane::model::AuthCacheSpec> {
        let key = self.value("global-auth-cache-key", values::auth_cache_key, "no caching");
        let valid = self.value("global-auth-cache-duration", values::cache_durations, "200 202 401 5m");
        if key.is_none() && self.raw("global-auth-cache-key").is_none() {
            self.unused_without(&["global-auth-cache-duration"], "global-auth-cache-key");
        }
        Some(values::auth_cache(key?, valid))
    }
}

/// `keep-alive`: whole seconds, at most a day.
fn whole_seconds(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n <= 86_400 => Ok(n),
        _ => Err("expected a whole number of seconds up to a day (0 turns keep-alive off)".into()),
    }
}

/// The fields of a log format, and those left out (key, why).
type LogFormat<T = LogField> = (Vec<T>, Vec<(String, String)>);

/// `log-format-upstream`: a JSON object whose values are strings with `$variables` or bare
/// variables (`{"time": "$time_iso8601", "status": $status}`, as ingress-nginx users write
/// them), or a JSON list of variables (`["$remote_addr", "$status"]`, keyed by their names).
/// Returns the fields, and those left out with the reason.
fn log_format(raw: &str) -> Result<LogFormat, String> {
    log_format_with(raw, |key, template, bare| {
        template.parse::<Template>().map(|value| LogField { key, value, bare }).map_err(|e| e.to_string())
    })
}

/// [`log_format`] with each field made by `field` (key, template, bare), in another dialect.
fn log_format_with<T>(
    raw: &str,
    field: impl Fn(String, &str, bool) -> Result<T, String>,
) -> Result<LogFormat<T>, String> {
    let mut fields = Vec::new();
    let mut dropped = Vec::new();
    let mut push = |key: String, template: &str, bare: bool| match field(key.clone(), template, bare) {
        Ok(value) => fields.push(value),
        Err(why) => dropped.push((key, why)),
    };
    if let Ok(list) = serde_json::from_str::<Vec<String>>(raw) {
        for item in list {
            let name = item.trim().trim_start_matches('$').trim_start_matches('{').trim_end_matches('}');
            push(name.to_string(), &format!("${{{name}}}"), true);
        }
        return Ok((fields, dropped));
    }
    let mut scan = Scanner { text: raw, at: 0 };
    scan.expect('{').map_err(|_| {
        "weir writes JSON lines: expected a JSON object such as {\"time\": \"$time_iso8601\", \"status\": $status} or a list of variables".to_string()
    })?;
    if scan.eat('}') {
        return scan.end().map(|()| (fields, dropped));
    }
    loop {
        let key = scan.string()?;
        scan.expect(':')?;
        match scan.peek() {
            Some('"') => {
                let text = scan.string()?;
                push(key, &text, false);
            }
            Some('$') => {
                let var = scan.variable()?;
                push(key, var, true);
            }
            _ => return Err(format!("field {key:?}: expected a \"string\" or a $variable")),
        }
        if scan.eat('}') {
            return scan.end().map(|()| (fields, dropped));
        }
        scan.expect(',')?;
    }
}

/// A small reader for the nginx-flavoured JSON of `log-format-upstream`.
struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn skip_space(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.at..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) { Ok(()) } else { Err(format!("expected {c:?} at byte {}", self.at)) }
    }

    fn end(&mut self) -> Result<(), String> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(format!("unexpected text after the object at byte {}", self.at)),
        }
    }

    /// A JSON string (escapes decoded).
    fn string(&mut self) -> Result<String, String> {
        if self.peek() != Some('"') {
            return Err(format!("expected a \"string\" at byte {}", self.at));
        }
        let bytes = self.text.as_bytes();
        let mut end = self.at + 1;
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        if end >= bytes.len() {
            return Err("unterminated string".into());
        }
        let literal = &self.text[self.at..=end];
        self.at = end + 1;
        serde_json::from_str(literal).map_err(|e| format!("invalid string {literal}: {e}"))
    }

    /// A bare `$name` or `${name}`.
    fn variable(&mut self) -> Result<&'a str, String> {
        self.skip_space();
        let rest = &self.text[self.at..];
        let len = match rest.strip_prefix("${") {
            Some(inner) => inner.find('}').map(|i| i + 3).ok_or("unterminated ${")?,
            None => {
                1 + rest[1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len() - 1)
            }
        };
        self.at += len;
        Ok(&rest[..len])
    }
}

mod blocklist;
mod client;
mod compression;
mod limits;
mod logging;
mod tls;
mod tracing;
pub(crate) use tracing::operation_name;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
