//! The routing table: the contract between the controller (which translates Kubernetes
//! objects into it) and the dataplane (which compiles it into lookup structures and serves it).
//!
//! Plain data, serde-serializable, no Kubernetes types. `weir dump` prints it as YAML and the
//! translation golden tests compare it, so every collection here has a deterministic order.
//!
//! Beside it: [`logformat`] (the access log's fields, templates of [`crate::vars`]) and
//! [`changes`] (what differs between two tables).

pub mod blocklist;
pub mod changes;
pub mod compression;
pub mod filters;
pub mod logformat;
pub mod logging;
pub mod otel;
pub mod tls_keys;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A complete, self-contained routing table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTable {
    /// Stamped by the publisher (a counter); translation leaves it at 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
    /// Virtual hosts, in the order: exact hosts (sorted), wildcard hosts (sorted), then the
    /// any-host entry. Each host appears at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<VirtualHost>,
    /// Serves requests that match no virtual host, or no route of their virtual host.
    /// Without it the proxy answers 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_backend: Option<BackendId>,
    /// Every backend a route or the default backend refers to, by identity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backends: BTreeMap<BackendId, Backend>,
    /// TLS entries: which certificate serves which host names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<TlsEntry>,
    /// Certificate material referenced by [`TlsEntry::certificate`] and
    /// [`RouteTable::default_certificate`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub certificates: BTreeMap<ObjectRef, Certificate>,
    /// Hosts whose TLS connections are not terminated but spliced to a backend as they are
    /// (ingress-nginx `ssl-passthrough`, Gateway API TLSRoutes), or terminated and then relayed
    /// as plain TCP ([`Passthrough::relay`]), sorted by host: the SNI chooses before the
    /// handshake.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough: Vec<Passthrough>,
    /// Hosts that ask TLS clients for a certificate (ingress-nginx `auth-tls-*`), sorted by host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_auth: Vec<ClientAuth>,
    /// The certificate for names no TLS entry covers (a key of [`RouteTable::certificates`]);
    /// `None`: the dataplane's self-signed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<ObjectRef>,
    /// Global settings (the controller ConfigMap); they swap with the table.
    #[serde(default, skip_serializing_if = "Settings::is_empty")]
    pub settings: Settings,
    /// TCP and UDP services (`--tcp-services-configmap`, `--udp-services-configmap`), sorted by
    /// protocol and port; each (protocol, port) at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub l4: Vec<L4Service>,
    /// Handshake options of single hosts (ingress-nginx's `ssl-ciphers` and
    /// `ssl-prefer-server-ciphers` annotations), sorted by host; the connection's SNI selects
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_tls: Vec<HostTls>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

// === impl Settings ===

/// Global settings: the controller ConfigMap with ingress-nginx's keys, typed by translation.
/// Every field is optional: `None` keeps the proxy's own value (its command-line flag, else its
/// built-in default), so a key set in the ConfigMap overrides the flag.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Where the client address comes from and whether the client's `X-Forwarded-*` headers are
    /// believed (`use-forwarded-headers`, `enable-real-ip` and their companions); `None`: the
    /// client is the connection's peer and the proxy sets every `X-Forwarded-*` header itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Forwarded>,
    /// `Strict-Transport-Security` on HTTPS responses (`hsts`, `hsts-max-age`,
    /// `hsts-include-subdomains`, `hsts-preload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<Hsts>,
    /// TLS versions offered to clients (`ssl-protocols`), for new handshakes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_versions: Option<Vec<TlsVersion>>,
    /// The TLS 1.2 cipher suites offered to clients, rustls names in preference order
    /// (`ssl-ciphers`); TLS 1.3 suites are always offered. `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ciphers: Option<Vec<String>>,
    /// TLS sessions kept for resumption (`ssl-session-cache`, `ssl-session-cache-size`); `0`
    /// turns resumption off. `None`: 40,000 (ingress-nginx's 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_sessions: Option<u32>,
    /// Seconds a TLS session can be resumed (`ssl-session-timeout`). `None`: 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_session_timeout_secs: Option<u32>,
    /// Largest request body, in bytes, where a route sets none (`proxy-body-size`); `0`: no
    /// limit. Larger bodies get 413.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    /// Time from sending a request to the upstream's response head, in milliseconds, where a
    /// route sets none (`proxy-read-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_timeout_ms: Option<u64>,
    /// Time allowed to connect to an upstream (TCP, and TLS where used), in milliseconds, where
    /// a route sets none (`proxy-connect-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// Endpoints tried in all under `proxy-next-upstream`, where a route sets none
    /// (`proxy-next-upstream-tries`; `0` means every endpoint, at most 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_tries: Option<u32>,
    /// Seconds a client connection may wait for its next request (`keep-alive`); `0` turns
    /// client keep-alive off (one request per connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_secs: Option<u64>,
    /// Requests served on one HTTP/1 client connection; the last answer carries
    /// `Connection: close` (`keep-alive-requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_requests: Option<u32>,
    /// Whether upstream connections are reused (`upstream-keepalive-connections`: `0` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_keepalive: Option<bool>,
    /// Seconds in-flight requests get to finish on shutdown (`worker-shutdown-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_secs: Option<u64>,
    /// Whether request headers whose names contain `_` are passed on
    /// (`enable-underscores-in-headers`); dropped otherwise, as nginx does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underscores_in_headers: Option<bool>,
    /// Runs of `/` in a request path count as one for routing and policies (`merge-slashes`,
    /// nginx's `merge_slashes`). `None`: on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_slashes: Option<bool>,
    /// An encoded slash (`%2F`) in a request path gets 400 instead of being decoded for routing
    /// (`encoded-slashes: reject`). `None`: decoded, as nginx does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject_encoded_slashes: Option<bool>,
    /// Every new connection starts with a PROXY protocol header (`use-proxy-protocol`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<bool>,
    /// One JSON access-log line per request with these fields (`log-format-upstream`);
    /// `None`: the default fields (unless `logging.access_log_off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<Vec<LogField>>,
    /// Headers set on every response, replacing the upstream's of the same name (`add-headers`);
    /// a route's own (`custom-headers`) win. Names in lower case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub response_headers: BTreeMap<String, String>,
    /// Headers set on every request sent upstream (`proxy-set-headers`); names in lower case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub upstream_headers: BTreeMap<String, String>,
    /// When a request goes to the next endpoint, where a route sets none
    /// (`proxy-next-upstream`); an empty list is `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_upstream: Option<Vec<RetryOn>>,
    /// Time from the first try during which further tries may start, in milliseconds, where a
    /// route sets none (`proxy-next-upstream-timeout`); `0`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_upstream_timeout_ms: Option<u64>,
    /// Requests with non-idempotent methods (POST, PATCH, ...) are retried too, on every route
    /// (`retry-non-idempotent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_non_idempotent: Option<bool>,
    /// Longest wait for one write towards an upstream to make progress, in milliseconds, where
    /// a route sets none (`proxy-send-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_timeout_ms: Option<u64>,
    /// Time allowed for a client to send a request head, in milliseconds
    /// (`client-header-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_header_timeout_ms: Option<u64>,
    /// Longest wait between two reads of a client's request body, in milliseconds
    /// (`client-body-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_body_timeout_ms: Option<u64>,
    /// Idle connections kept per upstream endpoint (`upstream-keepalive-connections`, when not
    /// `0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_idle_max: Option<u32>,
    /// How long an idle upstream connection is kept, in milliseconds
    /// (`upstream-keepalive-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_idle_timeout_ms: Option<u64>,
    /// Requests sent on one upstream connection before it is closed
    /// (`upstream-keepalive-requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_conn_requests: Option<u32>,
    /// Longest life of an upstream connection, in milliseconds; it is not reused past it
    /// (`upstream-keepalive-time`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_conn_lifetime_ms: Option<u64>,
    /// Response compression (`use-gzip`, `enable-brotli`, `enable-zstd` and their companions);
    /// `None`: responses go as the upstream sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<compression::Compression>,
    /// Requests whose `User-Agent` matches one of these get 403 (`block-user-agents`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_user_agents: Vec<blocklist::HeaderPattern>,
    /// Requests whose `Referer` matches one of these get 403 (`block-referers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_referers: Vec<blocklist::HeaderPattern>,
    /// Headers removed from upstream responses (`hide-headers`, nginx's `proxy_hide_header`);
    /// names in lower case.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide_headers: Vec<String>,
    /// The upstream's `Server` header reaches clients (`allow-backend-server-header`). `None`:
    /// hidden, as nginx does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_backend_server_header: Option<bool>,
    /// Requests sent upstream carry `X-Original-Uri` (`proxy-add-original-uri-header`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_uri_header: Option<bool>,
    /// Idle time after which an L4 connection, a UDP flow or a relayed TLS connection
    /// ([`Passthrough::relay`]) is closed, in milliseconds (`proxy-stream-timeout`). `None`:
    /// 600 s ([`Settings::stream_timeout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_timeout_ms: Option<u64>,
    /// Whether a failed L4 upstream connect moves on to the next endpoint
    /// (`proxy-stream-next-upstream`). `None`: on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_next_upstream: Option<bool>,
    /// Time from the first L4 connect attempt during which further ones may start, in
    /// milliseconds (`proxy-stream-next-upstream-timeout`); `0`: no limit. `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_next_upstream_timeout_ms: Option<u64>,
    /// L4 connect attempts in all (`proxy-stream-next-upstream-tries`); `0`: every endpoint.
    /// `None`: 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_next_upstream_tries: Option<u32>,
    /// Replies from the upstream after which a UDP flow ends (`proxy-stream-responses`); `0`:
    /// replies never end a flow (it ends when idle). `None`: 1, ingress-nginx's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_responses: Option<u32>,
    /// The PROXY protocol header sent to L4 upstreams is v2 (binary) instead of v1 (text)
    /// (`stream-proxy-protocol-version: v2`, weir's own key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_proxy_protocol_v2: Option<bool>,
    /// The HTTPS listener's other TLS keys (tickets, OCSP stapling, groups, record size, unknown
    /// SNI).
    #[serde(default, skip_serializing_if = "tls_keys::TlsKeys::is_empty")]
    pub tls_keys: tls_keys::TlsKeys,
    /// The logging keys: access log selection and destination, error-log level, syslog.
    #[serde(default, skip_serializing_if = "logging::LogSettings::is_default")]
    pub logging: logging::LogSettings,
    /// Limits on what clients send (`large-client-header-buffers`, `http2-max-*`,
    /// `proxy-protocol-header-timeout`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub client_limits: ClientLimits,
    /// OpenTelemetry tracing (`enable-opentelemetry`, `otlp-collector-*`, `otel-*`); `None`:
    /// no collector, no spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otel: Option<otel::Otel>,
}

/// Limits on client requests and connections, each `None` when unset (weir's default applies).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientLimits {
    /// nginx's `large_client_header_buffers NUMBER SIZE`: the request line and each header line
    /// must fit in `SIZE` bytes (else 414, 431), the whole head in `NUMBER × SIZE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_buffers: Option<(u32, u32)>,
    /// Longest HTTP/2 header field, name and value (`http2-max-field-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_max_field_bytes: Option<u32>,
    /// Largest HTTP/2 request header list, decoded (`http2-max-header-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_max_header_bytes: Option<u32>,
    /// Streams an HTTP/2 client may have open at once (`http2-max-concurrent-streams`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_max_concurrent_streams: Option<u32>,
    /// Time a connection has to send its PROXY protocol header, in milliseconds
    /// (`proxy-protocol-header-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol_header_timeout_ms: Option<u64>,
    /// Request headers whose names are not letters, digits and `-` (and `_` with
    /// `enable-underscores-in-headers`) are dropped (`ignore-invalid-headers`); `None`: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_invalid_headers: Option<bool>,
}

impl Settings {
    /// True when nothing is set (used to keep serialized tables short).
    pub fn is_empty(&self) -> bool {
        *self == Settings::default()
    }

    /// `proxy-stream-timeout` with its default (600 s; at least 1 ms).
    pub fn stream_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.stream_timeout_ms.unwrap_or(600_000).max(1))
    }
}

/// Which client headers are believed, ingress-nginx's `use-forwarded-headers` and real-ip
/// settings: the client address is taken from `client_header` when the connection's peer is
/// inside `trusted`, walking the list from the right past trusted addresses (nginx's
/// `real_ip_recursive on`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forwarded {
    /// Believe the client's `X-Forwarded-Proto`, `-Host` and `-Port` (`use-forwarded-headers`);
    /// false with only `enable-real-ip`.
    pub trust_headers: bool,
    /// The header naming the client (`forwarded-for-header`), lower case.
    pub client_header: String,
    /// Peers whose `client_header` is believed (`proxy-real-ip-cidr`).
    pub trusted: Vec<IpNet>,
    /// `X-Forwarded-For` sent upstream is the incoming one with the peer appended
    /// (`compute-full-forwarded-for`); otherwise it is the client address alone.
    #[serde(default, skip_serializing_if = "is_false")]
    pub full_chain: bool,
}

/// The `Strict-Transport-Security` header (ingress-nginx's defaults: on, a year, subdomains).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hsts {
    /// Send it at all (`hsts`).
    pub enabled: bool,
    /// `max-age`, in seconds (`hsts-max-age`).
    pub max_age: u64,
    /// `includeSubDomains` (`hsts-include-subdomains`).
    pub include_subdomains: bool,
    /// `preload` (`hsts-preload`).
    pub preload: bool,
}

impl Hsts {
    /// The header value, `None` when disabled.
    pub fn header_value(&self) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let sub = if self.include_subdomains { "; includeSubDomains" } else { "" };
        let preload = if self.preload { "; preload" } else { "" };
        Some(format!("max-age={}{sub}{preload}", self.max_age))
    }
}

/// A TLS version weir can offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[serde(rename = "TLSv1.2")]
    Tls12,
    /// TLS 1.3.
    #[serde(rename = "TLSv1.3")]
    Tls13,
}

/// One field of the JSON access-log line: `key` and what its value is made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogField {
    /// The JSON key.
    pub key: String,
    /// The value: text with `$variables` (a JSON string), or one bare variable.
    pub value: logformat::Template,
    /// Written as a bare JSON value (a number, or `null` when unknown) rather than a string:
    /// the template was a variable outside quotes (`"status": $status`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub bare: bool,
}

// === impl HostMatch ===

/// Which `Host` header values a virtual host answers.
///
/// Serialized as a plain string: `example.com`, `*.example.com`, or `*` for any host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostMatch {
    /// One host name, lower case, without port.
    Exact(String),
    /// `*.suffix`: matches exactly one extra DNS label in front of the suffix (stored without `*.`).
    Wildcard(String),
    /// Any host (Ingress rules without `host`).
    Any,
    /// A Gateway API wildcard `*.suffix`: one or more labels in front of the suffix (stored
    /// without `*.`); written `**.suffix` in a table. Gateway translation only.
    Suffix(String),
}

/// A host name that cannot be a [`HostMatch`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid host {host:?}: {reason}")]
pub struct InvalidHost {
    /// The rejected input.
    pub host: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

impl HostMatch {
    /// Parses an Ingress-style host: `a.example.com`, `*.example.com`, or `*`/empty for any host.
    /// The result is lower-cased; IP addresses and ports are not host names and are rejected.
    pub fn parse(host: &str) -> Result<Self, InvalidHost> {
        let invalid = |reason| InvalidHost { host: host.to_string(), reason };
        if host.is_empty() || host == "*" {
            return Ok(HostMatch::Any);
        }
        let lower = host.to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        if name.contains('*') {
            return Err(invalid("a wildcard is only allowed as the whole first label (`*.example.com`)"));
        }
        if name.len() > 253 {
            return Err(invalid("longer than 253 characters"));
        }
        if name.parse::<std::net::IpAddr>().is_ok() {
            return Err(invalid("an IP address is not a host name"));
        }
        for label in name.split('.') {
            if label.is_empty() || label.len() > 63 {
                return Err(invalid("each DNS label must be 1 to 63 characters"));
            }
            let ok = label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(invalid("DNS labels are letters, digits and inner hyphens"));
            }
        }
        if wildcard && !name.contains('.') {
            // `*.com` would cover a whole top-level domain; the Ingress API refuses it too.
            return Err(invalid("a wildcard needs at least two labels after `*.`"));
        }
        Ok(if wildcard { HostMatch::Wildcard(name.to_string()) } else { HostMatch::Exact(name.to_string()) })
    }

    /// Whether a request host (lower case, port already removed) matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => h == host,
            HostMatch::Wildcard(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty() && !label.contains('.')),
            HostMatch::Any => true,
            HostMatch::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty() && !head.starts_with('.') && !head.ends_with('.')),
        }
    }
}

impl fmt::Display for HostMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMatch::Exact(h) => f.write_str(h),
            HostMatch::Wildcard(s) => write!(f, "*.{s}"),
            HostMatch::Any => f.write_str("*"),
            HostMatch::Suffix(s) => write!(f, "**.{s}"),
        }
    }
}

impl Serialize for HostMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if let Some(rest) = s.strip_prefix("**.") {
            return match HostMatch::parse(rest).map_err(serde::de::Error::custom)? {
                HostMatch::Exact(name) => Ok(HostMatch::Suffix(name)),
                _ => Err(serde::de::Error::custom(format!(
                    "invalid host {s:?}: `**.` is followed by a host name"
                ))),
            };
        }
        HostMatch::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One virtual host: a host match and its routes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualHost {
    /// Which hosts this entry answers.
    pub host: HostMatch,
    /// Routes of this host. Order is not significant: the router applies Ingress precedence
    /// (Exact before Prefix, longer prefix first). Translation emits them sorted for stable output.
    pub routes: Vec<Route>,
    /// Gateway API only: the routes of less specific host names that also cover this one, tried
    /// tier by tier when none of `routes` matches the request (`HTTPRouteSpec.hostnames`:
    /// precedence goes to the rules of the route with the longest matching hostname; a request
    /// its rules do not match goes to the next). Empty for Ingress hosts, which never fall
    /// through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback: Vec<Fallback>,
}

/// Routes a virtual host takes from a less specific host name ([`VirtualHost::fallback`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// The host name they belong to (what `weir dump` shows; they answer for this virtual host).
    pub from: HostMatch,
    /// Its routes, as [`VirtualHost::routes`].
    pub routes: Vec<Route>,
}

/// How a route matches the request path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// The path equals this, byte for byte (query excluded).
    Exact(String),
    /// Element-wise prefix by `/`: `/foo` matches `/foo`, `/foo/`, `/foo/bar`, not `/foobar`.
    /// Stored without a trailing slash (except the root `/`).
    Prefix(String),
    /// A regular expression (ingress-nginx `use-regex`), anchored at the start of the path.
    Regex(String),
}

/// One route: a path match, what to do with matching requests, and its policies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The path match.
    pub path: PathMatch,
    /// What happens to a matching request.
    pub action: RouteAction,
    /// Per-route policies; later issues add rewrites, timeouts, auth and so on.
    #[serde(default, skip_serializing_if = "RoutePolicy::is_empty")]
    pub policy: RoutePolicy,
    /// The object this route came from (an Ingress), for logs and error responses.
    pub origin: ObjectRef,
    /// Conditions on the method, headers and query besides the path (Gateway API
    /// `HTTPRouteMatch`); `None`: every request with the path matches (Ingress routes). Routes
    /// with the same path are tried in table order, the first whose conditions hold wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Box<RequestConditions>>,
    /// The name of the Gateway API rule it came from (`HTTPRouteRule.name`,
    /// `GRPCRouteRule.name`), for `weir dump` and logs; `None`: unnamed, or an Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<Box<str>>,
}

/// What a route does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteAction {
    /// Proxy to a backend.
    Forward(BackendId),
    /// Proxy to one of several backends, chosen at random by weight (Gateway API
    /// `backendRefs`); a share without a backend (an unresolved reference), or a list whose
    /// weights are all 0, answers 500.
    Split(Vec<WeightedBackend>),
}

/// One share of a [`RouteAction::Split`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedBackend {
    /// The backend (a key of [`RouteTable::backends`]); `None`: the reference did not resolve
    /// and this share answers 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendId>,
    /// Its weight relative to the others' (0: never chosen).
    pub weight: u32,
    /// Edits of the request when this share is picked, after the route's own (Gateway API
    /// `HTTPBackendRef.filters` `RequestHeaderModifier`: "executed if and only if the request
    /// is being forwarded to the backend defined here").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<Box<filters::HeaderEdits>>,
}

/// Per-route policies, typed and validated by translation (ingress-nginx annotations). Every
/// field is optional: an empty policy forwards the request unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutePolicy {
    /// Plain-HTTP requests get a `308` to the same URL over HTTPS (ingress-nginx `ssl-redirect`,
    /// `force-ssl-redirect`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ssl_redirect: bool,
    /// Answer every request with this redirect instead of proxying (`permanent-redirect`,
    /// `temporal-redirect`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Box<Redirect>>,
    /// Requests for exactly `/` are redirected (302) to this path (`app-root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_root: Option<String>,
    /// Which client addresses may use the route (`allowlist-source-range`,
    /// `denylist-source-range`); others get 403.
    #[serde(default, skip_serializing_if = "SourceFilter::is_empty")]
    pub source: SourceFilter,
    /// Largest request body accepted, in bytes (`proxy-body-size`); larger ones get 413.
    /// `None` leaves the proxy's global limit; `Some(0)` means unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    /// The `Host` sent upstream instead of the client's (`upstream-vhost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_host: Option<String>,
    /// Sent upstream as `X-Forwarded-Prefix` (`x-forwarded-prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_prefix: Option<String>,
    /// The path sent upstream replaces the request's (`rewrite-target`), with `$1`…`$9` (or
    /// `${1}`) standing for the groups captured by the route's regex path. The query is kept
    /// (after the target's own, if it has one) unless the target ends with `?`, as nginx's
    /// `rewrite` does. Only on [`PathMatch::Regex`] routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite_target: Option<String>,
    /// Cross-origin resource sharing (`enable-cors` and `cors-*`): preflights answered by the
    /// proxy, CORS headers added to responses for allowed origins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<Box<Cors>>,
    /// Time from sending the request to the upstream's response head, in milliseconds
    /// (`proxy-read-timeout`); `None` keeps the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_timeout_ms: Option<u64>,
    /// Time allowed to connect to an upstream, in milliseconds (`proxy-connect-timeout`); `None`
    /// keeps the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// Endpoints tried in all under `proxy-next-upstream` (`proxy-next-upstream-tries`; `0`
    /// means every endpoint, at most 8); `None` keeps the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_tries: Option<u32>,
    /// Request rate limits per client address (`limit-rps`, `limit-rpm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Box<RateLimit>>,
    /// HTTP Basic authentication (`auth-type: basic`); without valid credentials, 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<Box<BasicAuth>>,
    /// External authentication (`auth-url` and friends): a subrequest decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_auth: Option<Box<ExternalAuth>>,
    /// A canary backend taking some of the route's requests (ingress-nginx `canary-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Box<Canary>>,
    /// How the route picks an endpoint of its backend (`load-balance`, `upstream-hash-by`,
    /// `affinity`); weighted round robin by default.
    #[serde(default, skip_serializing_if = "is_default")]
    pub balance: Balance,
    /// Answers with these statuses are replaced by the answer of another backend
    /// (`custom-http-errors` with `default-backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_errors: Option<Box<CustomErrors>>,
    /// Every request gets a `308` to the same scheme and request URI on this host
    /// (`from-to-www-redirect`: `www.` added or removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_redirect: Option<String>,
    /// Headers set on every response of the route, replacing the upstream's of the same name
    /// (`custom-headers`, nginx's `more_set_headers`); names in lower case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub response_headers: BTreeMap<String, String>,
    /// Copies of the requests go to other URLs too, one copy per mirror (each with its own
    /// share); their answers are dropped and never delay or change the client's
    /// (`mirror-target`, `mirror-host`, `mirror-request-body`; Gateway API `RequestMirror`,
    /// which may be repeated). `None`: no mirror (never an empty list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[allow(clippy::box_collection)] // 8 bytes inline, as `route_size_stays_bounded` wants
    pub mirrors: Option<Box<Vec<Mirror>>>,
    /// When a request goes to the next endpoint (`proxy-next-upstream`); an empty list is
    /// `off`; `None` keeps the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_upstream: Option<Vec<RetryOn>>,
    /// Time from the first try during which further tries may start, in milliseconds
    /// (`proxy-next-upstream-timeout`; `0`: no limit); `None` keeps the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_upstream_timeout_ms: Option<u64>,
    /// Longest wait for one write towards the upstream to make progress, in milliseconds
    /// (`proxy-send-timeout`); `None` keeps the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_timeout_ms: Option<u64>,
    /// Requests in flight at once per client address, over all routes of the Ingress
    /// (`limit-connections`); past it, `status` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conn_limit: Option<Box<ConnLimit>>,
    /// Response bandwidth per request (`limit-rate`, `limit-rate-after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_rate: Option<Box<ResponseRate>>,
    /// `Location` and `Refresh` response headers starting with `from` get `to` instead
    /// (`proxy-redirect-from`, `proxy-redirect-to`; nginx's `proxy_redirect`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_rewrite: Option<Box<Replace>>,
    /// `Set-Cookie` `Domain` attributes equal to `from` (case-insensitive, a leading dot
    /// ignored) become `to` (`proxy-cookie-domain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie_domain: Option<Box<Replace>>,
    /// `Set-Cookie` `Path` attributes starting with `from` get `to` instead
    /// (`proxy-cookie-path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie_path: Option<Box<Replace>>,
    /// The HTTPS redirect keeps a trailing `/` of the request URI (`preserve-trailing-slash`);
    /// by default it is dropped, as ingress-nginx does.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preserve_trailing_slash: bool,
    /// A limit shared by every replica through memcached (`global-rate-limit*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_rate_limit: Option<Box<GlobalRateLimit>>,
    /// The route's requests are not written to the access log (`enable-access-log: "false"`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub access_log_off: bool,
    /// Gateway API filters (`HTTPRouteFilter`) the fields above do not cover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Box<filters::RouteFilters>>,
    /// The route's own tracing settings (`enable-opentelemetry`,
    /// `opentelemetry-trust-incoming-span`, `opentelemetry-operation-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Box<otel::RouteTrace>>,
}

/// One mirror of a route (ingress-nginx `mirror-*`, Gateway API `RequestMirror`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    /// An absolute `http://` or `https://` URL template: `$request_uri`, `$uri`, `$host`,
    /// `$scheme`, `$remote_addr` (and the other names of [`ExternalAuth::url`]) are expanded per
    /// request. An `https://` target's certificate is verified against the system's roots.
    pub target: String,
    /// The `Host` the copy carries; `None`: the target URL's authority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Whether the copy carries the request's body (streamed beside it, dropped if the mirror
    /// falls behind); ingress-nginx's default is on.
    pub request_body: bool,
    /// The share of requests copied, in parts per million, each request drawn at random
    /// (Gateway API `RequestMirror` `percent`/`fraction`); `None`: every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_ppm: Option<u32>,
    /// The copies go over HTTP/2 prior knowledge (h2c) rather than HTTP/1.1: a GRPCRoute's
    /// mirror, or one to a Service port with `appProtocol: kubernetes.io/h2c`. Only with an
    /// `http://` target.
    #[serde(default, skip_serializing_if = "is_false")]
    pub h2c: bool,
    /// More `host:port` authorities the copies take turns with the target's own, round robin
    /// (a Gateway API mirror's Service with several ready endpoints: the target names the
    /// first, these the others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread: Vec<String>,
}

/// A condition under which a request goes to the next endpoint (`proxy-next-upstream`, with
/// nginx's names). `non_idempotent` is not a condition: it lets POST, PATCH and other
/// non-idempotent requests be sent again once they were sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// Connecting failed, or the connection broke while sending or before the response head.
    Error,
    /// Connecting, sending (`proxy-send-timeout`) or waiting for the response head timed out.
    Timeout,
    /// The upstream's response head was not valid HTTP.
    InvalidHeader,
    /// The upstream answered 500.
    #[serde(rename = "http_500")]
    Http500,
    /// The upstream answered 502.
    #[serde(rename = "http_502")]
    Http502,
    /// The upstream answered 503.
    #[serde(rename = "http_503")]
    Http503,
    /// The upstream answered 504.
    #[serde(rename = "http_504")]
    Http504,
    /// The upstream answered 403.
    #[serde(rename = "http_403")]
    Http403,
    /// The upstream answered 404.
    #[serde(rename = "http_404")]
    Http404,
    /// The upstream answered 429.
    #[serde(rename = "http_429")]
    Http429,
    /// Non-idempotent requests may be sent again.
    NonIdempotent,
}

/// A limit on a client's requests in flight at once (`limit-connections`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnLimit {
    /// Requests in flight allowed per client address.
    pub max: u32,
    /// Clients never limited (`limit-allowlist`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<IpNet>,
    /// The status of refused requests (`limit-conn-status-code`, 503 by default).
    pub status: u16,
}

/// Response bandwidth per request, as nginx's `limit_rate` and `limit_rate_after`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseRate {
    /// Bytes per second once `after_bytes` have been sent; `0`: unlimited.
    pub bytes_per_sec: u64,
    /// Bytes sent at full speed first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub after_bytes: u64,
}

/// A text replaced by another in a response header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replace {
    /// What is looked for.
    pub from: String,
    /// What it becomes.
    pub to: String,
}

/// Error pages from another backend: when the upstream answers (or the proxy would answer) one
/// of `codes`, the proxy asks `backend` for `GET /` with `X-Code`, `X-Format`, `X-Original-URI`,
/// `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port` and `X-Request-ID`, and
/// returns that answer instead, as ingress-nginx does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomErrors {
    /// The statuses replaced.
    pub codes: Vec<u16>,
    /// The backend serving the error pages (a key of [`RouteTable::backends`]).
    pub backend: BackendId,
}

/// How a route picks an endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Weighted round robin.
    #[default]
    RoundRobin,
    /// Power of two choices on latency EWMA × requests in flight (`load-balance: ewma`).
    Ewma,
    /// Consistent hashing of a key built from the request (`upstream-hash-by`): literal text and
    /// `$remote_addr`, `$request_uri`, `$uri`, `$host`, `$http_NAME`, `$cookie_NAME`,
    /// `$arg_NAME`.
    Hash(String),
    /// Sticky sessions by cookie (`affinity: cookie`).
    Cookie(Box<CookieAffinity>),
}

/// A session-affinity cookie: names the endpoint that served the session's first request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CookieAffinity {
    /// The cookie's name (`session-cookie-name`, `INGRESSCOOKIE` by default).
    pub name: String,
    /// Its `Path` (`session-cookie-path`; by default the route's path).
    pub path: String,
    /// `Max-Age` in seconds (`session-cookie-max-age`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u64>,
    /// `Expires`, in seconds from the response (`session-cookie-expires`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    /// `Domain` (`session-cookie-domain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// `SameSite`: `None`, `Lax` or `Strict` (`session-cookie-samesite`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_site: Option<String>,
    /// `Secure` (`session-cookie-secure`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub secure: bool,
    /// `affinity-canary-behavior: legacy`: the cookie does not decide between the route's backend
    /// and its canary. By default (`sticky`) a session pinned to an endpoint of either stays
    /// there, whatever the canary's weight says.
    #[serde(default, skip_serializing_if = "is_false")]
    pub legacy_canary: bool,
}

/// A canary: requests chosen by header, then cookie, then weight go to `backend` instead of
/// the route's own, as ingress-nginx decides.
///
/// - `header`: its value `always` (or exactly `header_value`, or matching `header_pattern`)
///   sends the request to the canary, `never` to the main backend; absent or any other value
///   leaves the decision to the next rule;
/// - `cookie`: its value `always` or `never`, likewise;
/// - otherwise a `weight` out of `weight_total` requests, at random.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    /// The canary's backend (a key of [`RouteTable::backends`]).
    pub backend: BackendId,
    /// Requests per `weight_total` sent to the canary by chance.
    pub weight: u32,
    /// The weight's total (100 by default).
    pub weight_total: u32,
    /// The request header that decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The header value that selects the canary (instead of `always`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_value: Option<String>,
    /// A regex the header value must match to select the canary (when no `header_value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_pattern: Option<String>,
    /// The cookie that decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
}

/// External authentication: before proxying, the proxy asks `url`; a 2xx lets the request
/// through (copying `response_headers` from the answer into the request), 401 and 403 are
/// returned to the client (401 becomes a redirect to `signin` when set), anything else is 500.
///
/// `url` and `signin` may use these variables, expanded per request: `$scheme`, `$host`
/// (also `$http_host`, `$best_http_host`), `$request_uri`, `$escaped_request_uri`, `$uri`,
/// `$remote_addr`. Translation rejects any other.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAuth {
    /// The authentication service (`auth-url`), an `http://` or `https://` URL template.
    pub url: String,
    /// The subrequest's method (`auth-method`, `GET` by default).
    pub method: String,
    /// Where to send clients the service answered 401 for (`auth-signin`), a URL template; an
    /// `rd` parameter with the original URL is added unless it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signin: Option<String>,
    /// Headers of the service's 2xx answer copied into the proxied request
    /// (`auth-response-headers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<String>,
    /// Sent to the service as `X-Auth-Request-Redirect` (`auth-request-redirect`; by default
    /// the original request URI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<String>,
    /// Headers set on the subrequest, replacing the client's of the same name
    /// (`auth-proxy-set-headers`); names in lower case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proxy_set_headers: BTreeMap<String, String>,
    /// The query parameter of the `signin` redirect carrying the original URL
    /// (`auth-signin-redirect-param`); `None`: `rd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signin_redirect_param: Option<String>,
    /// The service's `Set-Cookie` reaches the client whatever the final status
    /// (`auth-always-set-cookie`); otherwise only with 200, 201, 204, 206, 301, 302, 303, 304,
    /// 307 and 308 (nginx's `add_header` without `always`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub always_set_cookie: bool,
    /// Answers of the service kept and reused (`auth-cache-key`, `auth-cache-duration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<AuthCacheSpec>,
    /// How an `https://` service's certificate is verified (the Ingress's `proxy-ssl-*`);
    /// `None`: against the system's roots, the URL's host as the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
}

/// How external authentication answers are cached: per route, by `key` (a template over
/// request variables, the `auth-cache-key` dialect of [`crate::vars`]), for the time the first rule of
/// `valid` naming the answer's status gives.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthCacheSpec {
    /// The key template (`auth-cache-key`).
    pub key: String,
    /// How long answers stay valid, by status (`auth-cache-duration`).
    pub valid: Vec<CacheValid>,
}

/// One `proxy_cache_valid` rule: answers with one of `codes` (any status when empty) are kept
/// `seconds`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheValid {
    /// Statuses the rule covers; empty: every status (nginx's `any`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    /// How long such answers are reused.
    pub seconds: u64,
}

/// Users allowed in by HTTP Basic authentication.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// The realm of the challenge (`auth-realm`).
    pub realm: String,
    /// User name → htpasswd hash. Serialized as `<redacted>` so that `weir dump`, logs and
    /// golden files never carry hashes (which invite offline guessing).
    #[serde(serialize_with = "redact_values")]
    pub users: BTreeMap<String, String>,
}

fn redact_values<S: Serializer>(users: &BTreeMap<String, String>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(users.keys().map(|k| (k, "<redacted>")))
}

impl fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicAuth")
            .field("realm", &self.realm)
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Request rate limits per client address; requests past them get `status` at once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Requests per second (`limit-rps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rps: Option<u32>,
    /// Requests per minute (`limit-rpm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    /// Burst allowed, as a multiple of the rate (`limit-burst-multiplier`, 5 by default).
    pub burst_multiplier: u32,
    /// Clients never limited (`limit-allowlist`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<IpNet>,
    /// The status of refused requests: 503 (ingress-nginx's default) or 429.
    pub status: u16,
}

/// CORS settings of a route, with ingress-nginx's defaults filled in by translation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cors {
    /// Allowed origins: `*` (any), `https://app.example.com`, or `https://*.example.com` (one or
    /// more labels); matched case-insensitively against the request's `Origin`.
    pub allow_origins: Vec<String>,
    /// `Access-Control-Allow-Methods`.
    pub allow_methods: String,
    /// `Access-Control-Allow-Headers`.
    pub allow_headers: String,
    /// `Access-Control-Expose-Headers` (empty: not sent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub expose_headers: String,
    /// `Access-Control-Allow-Credentials: true`.
    pub allow_credentials: bool,
    /// `Access-Control-Max-Age` of preflight answers, in seconds.
    pub max_age: u32,
}

/// A redirect the proxy answers with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    /// The `Location`, an absolute `http`/`https` URL, sent as is.
    pub location: String,
    /// The status: a 3xx code (301, 302, 307 and 308 are usual).
    pub code: u16,
}

/// Client address rules of a route. The deny list is checked first; then, when the allow list
/// is not empty, only addresses in it pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFilter {
    /// Only these networks may use the route (empty: everyone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<IpNet>,
    /// These networks may not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<IpNet>,
}

impl SourceFilter {
    /// True when every address passes.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether `ip` may use the route.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        if self.deny.iter().any(|n| n.contains(ip)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|n| n.contains(ip))
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, as dual-stack sockets report IPv4 peers) as the
/// IPv4 address it is; others unchanged.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

// === impl IpNet ===

/// An IP network in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`); a bare address is a /32 or
/// /128. Host bits must be zero, so that what is written is what is matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// A string that is not a CIDR or an IP address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {reason}")]
pub struct InvalidIpNet {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl IpNet {
    /// The network of `addr` with `prefix` leading bits; fails when host bits are set.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpNet, &'static str> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err("prefix length too long");
        }
        let net = IpNet { addr, prefix };
        if net.mask(addr) != addr {
            return Err("host bits set (write the network address)");
        }
        Ok(net)
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside (an IPv4 network never contains an IPv6 address, and back).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && self.mask(ip) == self.addr
    }

    fn mask(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V4((bits & mask).into())
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                IpAddr::V6((bits & mask).into())
            }
        }
    }
}

impl FromStr for IpNet {
    type Err = InvalidIpNet;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| InvalidIpNet { input: s.to_string(), reason };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| err("prefix length too long"))?
            }
            Some(_) => return Err(err("prefix length is not a number")),
            None if addr.is_ipv4() => 32,
            None => 128,
        };
        IpNet::new(addr, prefix).map_err(err)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for IpNet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl RoutePolicy {
    /// True when no policy is set (used to keep serialized tables short).
    pub fn is_empty(&self) -> bool {
        *self == RoutePolicy::default()
    }
}

// === impl BackendId ===

/// Identity of a backend: a Service port, `namespace/service:port`.
///
/// Serialized as that string, so it can be a map key in YAML and JSON.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendId {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub service: String,
    /// The Service port, as the Ingress named it.
    pub port: ServicePort,
}

/// A Service port as an Ingress backend names it: by number or by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServicePort {
    /// `port.number`.
    Number(u16),
    /// `port.name`.
    Name(String),
}

impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServicePort::Number(n) => write!(f, "{n}"),
            ServicePort::Name(n) => f.write_str(n),
        }
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.service, self.port)
    }
}

/// A string that is not `namespace/service:port`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid backend id {0:?}: expected namespace/service:port")]
pub struct InvalidBackendId(pub String);

impl FromStr for BackendId {
    type Err = InvalidBackendId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || InvalidBackendId(s.to_string());
        let (namespace, rest) = s.split_once('/').ok_or_else(err)?;
        let (service, port) = rest.rsplit_once(':').ok_or_else(err)?;
        if namespace.is_empty() || service.is_empty() || port.is_empty() {
            return Err(err());
        }
        let port = match port.parse::<u16>() {
            Ok(n) => ServicePort::Number(n),
            Err(_) => ServicePort::Name(port.to_string()),
        };
        Ok(BackendId { namespace: namespace.to_string(), service: service.to_string(), port })
    }
}

impl Serialize for BackendId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BackendId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A named upstream cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// The protocol spoken to the upstream.
    #[serde(default, skip_serializing_if = "is_default")]
    pub protocol: UpstreamProtocol,
    /// Where the backend's traffic goes.
    pub target: Target,
    /// TLS towards the upstream, for the `https` and `h2` protocols.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
}

/// How weir verifies an upstream's certificate (ingress-nginx `proxy-ssl-*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// CA certificates (PEM) to verify against; `None`: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// The name to verify (and send as SNI); `None`: the request's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Do not verify the certificate at all (only when explicitly asked: `proxy-ssl-verify: "off"`
    /// together with a `backend-protocol` of HTTPS/GRPCS).
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_skip_verify: bool,
    /// Do not send SNI (`proxy-ssl-server-name: "off"`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_sni: bool,
    /// The TLS 1.2 cipher suites offered to upstreams, rustls names in preference order
    /// (`proxy-ssl-ciphers`); TLS 1.3 suites are always offered. `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ciphers: Option<Vec<String>>,
    /// TLS versions offered to upstreams (`proxy-ssl-protocols`); `None`: 1.2 and 1.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<TlsVersion>>,
    /// Longest upstream chain accepted: the certificate plus the intermediates the upstream
    /// sends (`proxy-ssl-verify-depth`); `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_depth: Option<u32>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Where a backend's traffic goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Ready endpoints only (sorted by address). Empty: the backend answers 503.
    Endpoints(Vec<Endpoint>),
    /// An ExternalName Service: resolved by DNS when connecting.
    Dns {
        /// The DNS name.
        host: String,
        /// The port to connect to.
        port: u16,
    },
}

/// One upstream endpoint ready to receive traffic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// Socket address to connect to.
    pub address: SocketAddr,
    /// Relative weight for balancing (1 unless a policy says otherwise).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

impl Endpoint {
    /// An endpoint with weight 1.
    pub fn new(address: SocketAddr) -> Self {
        Endpoint { address, weight: 1 }
    }
}

/// Protocol used towards the upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 in clear text.
    #[default]
    Http1,
    /// HTTP/2 in clear text, prior knowledge (h2c; also gRPC).
    H2c,
    /// HTTP/1.1 over TLS (`backend-protocol: HTTPS`).
    Https,
    /// HTTP/2 over TLS, ALPN `h2` (`backend-protocol: GRPCS`).
    H2,
}

impl UpstreamProtocol {
    /// Spoken over HTTP/2.
    pub fn is_h2(self) -> bool {
        matches!(self, UpstreamProtocol::H2c | UpstreamProtocol::H2)
    }

    /// Spoken over TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, UpstreamProtocol::Https | UpstreamProtocol::H2)
    }
}

/// A reference to a namespaced Kubernetes-style object, used for origins and certificate ids.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// Builds a reference.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectRef { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Serialize for ObjectRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ObjectRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ObjectRef::new(ns, name))
            }
            _ => Err(serde::de::Error::custom(format!(
                "invalid object reference {s:?}: expected namespace/name"
            ))),
        }
    }
}

/// Host names served by one certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsEntry {
    /// Host names (exact or `*.` wildcard) this entry covers.
    pub hosts: Vec<HostMatch>,
    /// The certificate (a key of [`RouteTable::certificates`]); `None` means the default certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<ObjectRef>,
    /// The Gateway HTTPS listener this entry serves (`namespace/gateway/listener`, one host);
    /// `None` for an Ingress's `spec.tls`. On a connection whose SNI chose a listener's entry, a
    /// request for a name of another listener is answered 421 and one for a name of no
    /// listener 404 (Gateway API `Listener.hostname`, RFC 7540 §9.1.2; the dataplane's `tls/listeners.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
    /// Further certificates for the same names (a Gateway listener's other `certificateRefs`,
    /// keys of [`RouteTable::certificates`]): a handshake gets the first of `certificate` and
    /// these whose key signs with a scheme the ClientHello offers (e.g. ECDSA, else RSA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<ObjectRef>,
}

/// A TLS passthrough host: connections whose SNI it matches go to `backend` undecrypted (or,
/// with [`Passthrough::relay`], decrypted by weir and relayed as plain TCP).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Passthrough {
    /// The SNI name (exact or `*.` wildcard).
    pub host: HostMatch,
    /// The backend that terminates TLS itself (also in [`RouteTable::backends`]); `None`
    /// with an empty `split`: every connection is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendId>,
    /// Gateway API TLSRoute `backendRefs`: each connection goes to one of these, chosen at
    /// random by weight (a share without backend, or weights all 0, refuses the connection);
    /// empty: `backend`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<WeightedBackend>,
    /// Not passed through but terminated: a Gateway HTTPS listener's name under a TLS
    /// listener's wildcard (the more specific listener wins); `backend` is then unused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminate: bool,
    /// Terminated here with the certificate the SNI chooses among [`RouteTable::tls`] (a
    /// Gateway `TLS` listener with `tls.mode: Terminate`), no ALPN negotiated, then the
    /// decrypted byte stream relayed over plain TCP to `split` (or `backend`) as passthrough
    /// would splice it (Gateway API TLSRoute termination). Ignored with `terminate`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relay: bool,
}

/// The TLS handshake options of one host, chosen by SNI: the host's own TLS 1.2 cipher suites
/// and whose order of preference counts. What it leaves unset is the table's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostTls {
    /// The host (exact or `*.` wildcard).
    pub host: HostMatch,
    /// `ssl-ciphers`: the TLS 1.2 suites offered, by rustls name, in order of preference (TLS
    /// 1.3 suites stay on); `None`: the table's `ssl-ciphers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ciphers: Option<Vec<String>>,
    /// `ssl-prefer-server-ciphers`: the server's order of suites wins over the client's;
    /// `None`: the client's order (nginx's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_server_ciphers: Option<bool>,
}

/// Client certificate authentication of one host (mTLS), or of one Gateway HTTPS listener
/// (Gateway API `FrontendTLSValidation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuth {
    /// The host (exact or `*.` wildcard; a listener's also a suffix or any); the connection's
    /// SNI selects it.
    pub host: HostMatch,
    /// The Gateway HTTPS listener this policy belongs to (`namespace/gateway/listener`, as
    /// [`TlsEntry::listener`]); `None` for an Ingress's `auth-tls-*`. A name that belongs to a
    /// listener's TLS entry (by the certificate resolver's longest match) takes that listener's
    /// policy, or none when the listener validates no client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<String>,
    /// CA certificates (PEM) client certificates must chain to.
    pub ca_pem: String,
    /// What happens without a valid certificate.
    pub verify: ClientVerify,
    /// Longest accepted client chain, the client certificate included (`auth-tls-verify-depth`).
    pub depth: u8,
    /// Forward the client certificate upstream, URL-encoded PEM in `ssl-client-cert`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pass_certificate: bool,
    /// `auth-tls-match-cn`: a regex the client certificate's subject DN (RFC 2253, as in
    /// `ssl-client-subject-dn`) must match, unanchored; otherwise 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_cn: Option<String>,
    /// `auth-tls-error-page`: where a client without a required or valid certificate is sent
    /// (302) instead of getting 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_page: Option<String>,
}

/// `auth-tls-verify-client`, and Gateway API `FrontendValidationModeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientVerify {
    /// A valid certificate is required (else 400).
    On,
    /// A valid certificate is required by the TLS handshake itself: without one the handshake
    /// fails and no request is answered (Gateway API `AllowValidOnly`).
    Handshake,
    /// A certificate is optional, but if sent it must be valid (else 400).
    Optional,
    /// A certificate is optional and not required to be valid; the result is passed upstream
    /// (also Gateway API `AllowInsecureFallback`).
    OptionalNoCa,
}

/// PEM-encoded certificate chain and private key, as found in a `kubernetes.io/tls` Secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// The certificate chain, leaf first (PEM).
    pub chain_pem: String,
    /// The private key (PEM). Serialized as `<redacted>` so that `weir dump`, logs and golden
    /// files never carry key material; tables are handed to the dataplane as values, not text.
    #[serde(serialize_with = "redact")]
    pub key_pem: String,
}

fn redact<S: Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("Certificate").field("chain_pem_len", &self.chain_pem.len()).finish_non_exhaustive()
    }
}

// === L4 services ===

// TCP and UDP ports weir listens on and forwards as they are to a Service's endpoints
// (ingress-nginx's `--tcp-services-configmap` and `--udp-services-configmap`); the stream
// settings (`proxy-stream-*`) are global, in [`Settings`].

/// The transport of an L4 service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum L4Protocol {
    /// A TCP listener; each connection is spliced to one endpoint.
    Tcp,
    /// A UDP socket; each client address and port is a flow to one endpoint.
    Udp,
}

impl std::fmt::Display for L4Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            L4Protocol::Tcp => "TCP",
            L4Protocol::Udp => "UDP",
        })
    }
}

/// One listening port forwarded to a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L4Service {
    /// The port weir listens on (the ConfigMap key).
    pub port: u16,
    /// TCP or UDP.
    pub protocol: L4Protocol,
    /// The Service port forwarded to: the identity its balancer state is kept by.
    pub backend: BackendId,
    /// Its ready endpoints (or DNS name); no endpoint: connections are closed, datagrams
    /// dropped.
    pub target: Target,
    /// Clients start each connection with a PROXY protocol header (the first `:PROXY`; TCP).
    #[serde(default, skip_serializing_if = "is_false")]
    pub proxy_protocol_in: bool,
    /// weir starts each upstream connection with a PROXY protocol header naming the client
    /// (the second `:PROXY`; TCP), of the version [`Settings::stream_proxy_protocol_v2`]
    /// says (v1 by default, as nginx's `proxy_protocol on`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub proxy_protocol_out: bool,
    /// Each client address sticks to the endpoint it reached until it has started no connection
    /// or flow for this many seconds (a Service's `sessionAffinity: ClientIP`, `weir node --mode
    /// userspace`); `None`: every connection and flow is balanced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ip_affinity_s: Option<u32>,
}

// === request conditions ===

/// Conditions on a request besides its host and path, all of which must hold (Gateway API
/// `HTTPRouteMatch`: method, headers, query parameters). Compiled and checked by
/// `route::conditions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestConditions {
    /// The method, exactly (`GET`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Headers (names case-insensitive).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    /// Query parameters (names case-sensitive, first occurrence).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<ValueMatch>,
    /// The socket the request came on (Gateway API listener isolation): `Some(true)` only over
    /// TLS (HTTPS listeners), `Some(false)` only over plain HTTP; `None`: either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// The whole (normalized) path, for matches a path type cannot say (Gateway API
    /// `GRPCMethodMatch`: a method of any service, regular expressions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<StringMatch>,
}

/// A named value and how it must match.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueMatch {
    /// The header or parameter name.
    pub name: String,
    /// How its value must match.
    pub value: StringMatch,
}

/// How a value must match.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StringMatch {
    /// Equal, byte for byte.
    Exact(String),
    /// A regular expression matching the whole value.
    Regex(String),
}

// === The global rate limit (`global-rate-limit*`: counters shared through memcached) ===

/// A limit per window, counted per key across replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalRateLimit {
    /// Requests per window (`global-rate-limit`).
    pub limit: u64,
    /// The window (`global-rate-limit-window`), in milliseconds.
    pub window_ms: u64,
    /// What is counted (`global-rate-limit-key`, default `$remote_addr`): the variables of
    /// `upstream-hash-by`.
    pub key: String,
    /// Clients never limited (`global-rate-limit-ignored-cidrs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<IpNet>,
    /// Whose counters these are (`namespace/ingress`): two Ingresses never share a count.
    pub zone: String,
    /// The status of refused requests (`global-rate-limit-status-code`, default 429).
    pub status: u16,
    /// Where the counters live.
    pub memcached: Memcached,
}

/// A memcached server (`global-rate-limit-memcached-*`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memcached {
    /// Host name or address.
    pub host: String,
    /// Port (default 11211).
    pub port: u16,
    /// Timeout of connecting and of each exchange, in milliseconds (default 50).
    pub connect_timeout_ms: u64,
    /// How long a pooled connection may stay idle, in milliseconds (default 10000).
    pub idle_timeout_ms: u64,
    /// Idle connections kept (default 50).
    pub pool_size: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_size_stays_bounded() {
        // Every route of a table carries its whole policy inline, set or not: at 10,000
        // Ingresses this is most of the table's memory and of a full rebuild's page faults
        // (bench/RESULTS.md, "What limits weir"). Rarely-set policies belong behind a `Box`
        // (`Option<Box<_>>`: 8 bytes when unset); with them inline a route was 1,584 bytes.
        let (route, policy) = (std::mem::size_of::<Route>(), std::mem::size_of::<RoutePolicy>());
        eprintln!("Route: {route} bytes, RoutePolicy: {policy} bytes");
        assert!(route <= 640, "Route grew to {route} bytes");
        assert!(policy <= 480, "RoutePolicy grew to {policy} bytes");
    }

    #[test]
    fn host_match_parses_and_matches() {
        let w = HostMatch::parse("*.Example.com").unwrap();
        assert_eq!(w, HostMatch::Wildcard("example.com".into()));
        assert!(w.matches("a.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("a.b.example.com"));
        assert!(!w.matches(".example.com"));
        assert!(!w.matches("aexample.com"));
        assert_eq!(HostMatch::parse("").unwrap(), HostMatch::Any);
        assert_eq!(HostMatch::parse("Foo.COM").unwrap(), HostMatch::Exact("foo.com".into()));
        assert!(HostMatch::parse("a.*.com").is_err());
        assert!(HostMatch::parse("*.com").is_err());
        assert!(HostMatch::parse("10.0.0.1").is_err());
        assert!(HostMatch::parse("foo_bar.com").is_err());
    }

    #[test]
    fn ip_nets_parse_and_match() {
        let n: IpNet = "10.1.0.0/16".parse().unwrap();
        assert!(n.contains("10.1.2.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        assert_eq!(n.to_string(), "10.1.0.0/16");
        assert_eq!("127.0.0.1".parse::<IpNet>().unwrap().to_string(), "127.0.0.1/32");
        assert!("0.0.0.0/0".parse::<IpNet>().unwrap().contains("8.8.8.8".parse().unwrap()));
        let v6: IpNet = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        for bad in ["10.1.0.1/16", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "nope", "::/129", ""] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
    }

    #[test]
    fn source_filter_deny_then_allow() {
        let f = SourceFilter {
            allow: vec!["10.0.0.0/8".parse().unwrap()],
            deny: vec!["10.9.0.0/16".parse().unwrap()],
        };
        assert!(f.permits("10.1.1.1".parse().unwrap()));
        assert!(!f.permits("10.9.1.1".parse().unwrap()));
        assert!(!f.permits("192.0.2.1".parse().unwrap()));
        // An IPv4 client on a dual-stack socket is matched as IPv4.
        assert!(f.permits("::ffff:10.1.1.1".parse().unwrap()));
        assert!(SourceFilter::default().permits("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn backend_id_round_trips() {
        let id: BackendId = "default/web:http".parse().unwrap();
        assert_eq!(id.port, ServicePort::Name("http".into()));
        assert_eq!(id.to_string(), "default/web:http");
        let id: BackendId = "ns/svc:8080".parse().unwrap();
        assert_eq!(id.port, ServicePort::Number(8080));
        assert!("nope".parse::<BackendId>().is_err());
        assert!("ns/:80".parse::<BackendId>().is_err());
    }

    #[test]
    fn table_round_trips_through_yaml() {
        let mut table = RouteTable::default();
        let id: BackendId = "default/web:80".parse().unwrap();
        table.hosts.push(VirtualHost {
            host: HostMatch::parse("*.example.com").unwrap(),
            routes: vec![Route {
                path: PathMatch::Prefix("/api".into()),
                action: RouteAction::Forward(id.clone()),
                policy: RoutePolicy::default(),
                origin: ObjectRef::new("default", "web"),
                conditions: None,
                rule: None,
            }],
            fallback: Vec::new(),
        });
        // A Gateway API host with routes of a less specific name to fall back to.
        let mut deep = table.hosts[0].clone();
        deep.host = HostMatch::Exact("a.example.com".into());
        deep.fallback =
            vec![Fallback { from: HostMatch::Suffix("example.com".into()), routes: deep.routes.clone() }];
        table.hosts.push(deep);
        table.backends.insert(
            id,
            Backend {
                protocol: UpstreamProtocol::Http1,
                target: Target::Endpoints(vec![Endpoint::new("127.0.0.1:8080".parse().unwrap())]),
                tls: None,
            },
        );
        let yaml = serde_saphyr::to_string(&table).unwrap();
        let back: RouteTable = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, table, "{yaml}");
    }
}
