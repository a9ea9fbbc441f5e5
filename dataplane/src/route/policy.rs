//! Route policies compiled for the request path: what a matched route does before, or instead
//! of, forwarding (ingress-nginx annotations, typed by translation).
//!
//! [`CompiledPolicy::compile`] turns a [`RoutePolicy`] into ready-made header values once per
//! table, so a request only compares and copies. The checks run in nginx's phase order, which
//! ingress-nginx users see: the body size from `Content-Length` (nginx's find-config phase; the
//! proxy checks it first), then redirects (`return` in the rewrite phase), then client addresses
//! (the access phase).

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};

use crate::hashkey::HashKey;
use crate::model::{Balance, BasicAuth, ExternalAuth, ObjectRef, RoutePolicy, SourceFilter};
use crate::route::cors::{CompiledCors, InvalidCors};
use crate::route::mirror::InvalidMirror;
use crate::state::ratelimit::{Limiter, LimiterCache};
use crate::vars::{Dialect, Template};

/// A policy that cannot be compiled (translation validates first; this guards hand-made tables).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A redirect code outside 300–399.
    #[error("redirect code {0} is not a 3xx status")]
    RedirectCode(u16),
    /// A CORS setting that cannot be sent.
    #[error(transparent)]
    Cors(#[from] InvalidCors),
    /// An `upstream-hash-by` key that cannot be used.
    #[error("hash key: {0}")]
    HashKey(String),
    /// A canary that cannot be used.
    #[error(transparent)]
    Canary(#[from] crate::route::canary::InvalidCanary),
    /// `rewrite_target` on a route whose path is not a regex.
    #[error("rewrite_target needs a regex path")]
    RewriteWithoutRegex,
    /// A mirror target that cannot be used.
    #[error("mirror: {0}")]
    Mirror(String),
    /// A global rate limit that cannot be used.
    #[error("global rate limit: {0}")]
    GlobalLimit(String),
    /// A value that cannot be sent as a header.
    #[error("{field} {value:?} cannot be sent as an HTTP header value")]
    HeaderValue {
        /// The policy field.
        field: &'static str,
        /// The value.
        value: String,
    },
    /// Gateway API filters that cannot be compiled.
    #[error("filters: {0}")]
    Filters(#[from] crate::route::filters::FilterError),
    /// Request conditions that cannot be compiled (a bad regex, header name or method).
    #[error("conditions: {0}")]
    Conditions(#[from] crate::route::conditions::ConditionError),
}

impl From<InvalidMirror> for PolicyError {
    fn from(invalid: InvalidMirror) -> Self {
        match invalid {
            InvalidMirror::Target(why) => PolicyError::Mirror(why),
            InvalidMirror::Host(value) => PolicyError::HeaderValue { field: "mirror host", value },
        }
    }
}

/// A [`RoutePolicy`] ready for the request path.
#[derive(Debug)]
pub struct CompiledPolicy {
    redirect: Option<(StatusCode, HeaderValue)>,
    app_root: Option<HeaderValue>,
    source: SourceFilter,
    /// The route's body limit: `None` defers to the proxy's, `Some(0)` is unlimited.
    pub max_body_bytes: Option<u64>,
    /// `Host` sent upstream instead of the client's.
    pub upstream_host: Option<HeaderValue>,
    /// `X-Forwarded-Prefix` sent upstream.
    pub forwarded_prefix: Option<HeaderValue>,
    rewrite: Option<Rewrite>,
    /// CORS, when enabled.
    pub cors: Option<CompiledCors>,
    /// The response-head timeout, when the route sets one.
    pub read_timeout: Option<std::time::Duration>,
    /// The upstream connect timeout, when the route sets one.
    pub connect_timeout: Option<std::time::Duration>,
    /// Endpoints tried in all, when the route sets it (`0`: all).
    pub connect_tries: Option<u32>,
    /// When a request goes to the next endpoint, when the route sets it.
    pub next_upstream: Option<crate::route::retry::Retry>,
    /// Gateway API `retry`: in place of `next_upstream` and `connect_tries`.
    pub retries: Option<Box<crate::route::retry::Retries>>,
    /// How long after the first try further tries may start, when the route sets it (`Some(None)`:
    /// no limit).
    pub next_upstream_timeout: Option<Option<std::time::Duration>>,
    /// The upstream send timeout, when the route sets one.
    pub send_timeout: Option<std::time::Duration>,
    /// The rate limiter shared by the routes of this route's Ingress.
    pub rate_limit: Option<Arc<Limiter>>,
    /// HTTP Basic authentication and its ready-made challenge.
    pub basic_auth: Option<(BasicAuth, HeaderValue)>,
    /// External authentication.
    pub external_auth: Option<CompiledExternalAuth>,
    /// The canary, set by the router once its backend is resolved.
    pub canary: Option<crate::route::canary::CompiledCanary>,
    /// How an endpoint is picked.
    pub balance: CompiledBalance,
    /// Error statuses replaced, and the backend serving the pages (set by the router).
    pub custom_errors: Option<(Vec<u16>, crate::state::balance::BackendIdx)>,
    /// `from-to-www-redirect`: the host every request is sent to (308).
    pub host_redirect: Option<String>,
    /// `custom-headers`: set on the route's responses.
    pub response_headers: HeaderList,
    /// `mirror-*`, `RequestMirror`: where copies of the requests go, one copy per mirror
    /// (empty: none).
    pub mirrors: Box<[crate::route::mirror::CompiledMirror]>,
    /// `limit-connections`: the requests in flight of this route's Ingress, per client.
    pub conn_limit: Option<Arc<crate::state::connlimit::ConnLimiter>>,
    /// `limit-rate`, `limit-rate-after`: the pace of each response body.
    pub response_rate: Option<crate::model::ResponseRate>,
    /// `proxy-redirect-*`, `proxy-cookie-*`: upstream response headers rewritten.
    pub response_rewrite: Option<crate::route::rewrite_response::ResponseRewrite>,
    /// `preserve-trailing-slash`: the HTTPS redirect keeps a trailing `/`.
    pub preserve_trailing_slash: bool,
    /// External authentication's answer cache (`auth-cache-key`), set by the router.
    pub auth_cache: Option<Arc<crate::state::authcache::AuthCache>>,
    /// `global-rate-limit*`: the limit shared by the replicas through memcached.
    pub global_limit: Option<Arc<crate::state::global_limit::GlobalLimiter>>,
    /// `enable-access-log: "false"`: the route's requests are not logged.
    pub access_log_off: bool,
    /// Gateway API filters.
    pub filters: Option<Box<crate::route::filters::CompiledFilters>>,
    /// The route's own tracing settings.
    pub trace: Option<crate::trace::CompiledRouteTrace>,
}

/// External authentication ready for the request path: its settings, with the URL templates
/// parsed (translation checked their variables).
#[derive(Debug)]
pub struct CompiledExternalAuth {
    /// The settings.
    pub spec: ExternalAuth,
    /// `auth-url`, parsed.
    pub url: Template,
    /// `auth-signin`, parsed.
    pub signin: Option<Template>,
    /// TLS for an `https://` service; an error when its settings cannot be used (the requests
    /// then fail closed).
    pub tls: Result<Option<std::sync::Arc<crate::route::auth_tls::AuthTls>>, String>,
}

impl CompiledExternalAuth {
    /// Parses the templates of `spec`.
    pub fn compile(spec: &ExternalAuth) -> CompiledExternalAuth {
        let parse = |t: &str| Template::parse_lenient(t, Dialect::Url);
        CompiledExternalAuth {
            spec: spec.clone(),
            url: parse(&spec.url),
            signin: spec.signin.as_deref().map(parse),
            tls: crate::route::auth_tls::compile(spec),
        }
    }
}

/// Headers set as they are: name and value parsed once per table.
pub type HeaderList = Vec<(HeaderName, HeaderValue)>;

/// Parses `headers` (a [`RoutePolicy::response_headers`] or a settings list); `field` names the
/// list in the error. Translation validates first; this guards hand-made tables.
pub fn compile_headers(
    field: &'static str,
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<HeaderList, PolicyError> {
    headers
        .iter()
        .map(|(name, value)| {
            let invalid = || PolicyError::HeaderValue { field, value: format!("{name}: {value}") };
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
            let value = HeaderValue::from_str(value).map_err(|_| invalid())?;
            Ok((name, value))
        })
        .collect()
}

/// Sets each of `headers` on `map`, replacing what was there.
pub fn set_headers(map: &mut http::HeaderMap, headers: &[(HeaderName, HeaderValue)]) {
    for (name, value) in headers {
        map.insert(name.clone(), value.clone());
    }
}

/// [`Balance`] ready for the request path.
#[derive(Debug, Default)]
pub enum CompiledBalance {
    /// Weighted round robin.
    #[default]
    RoundRobin,
    /// P2C on latency EWMA.
    Ewma,
    /// Consistent hashing of this key.
    Hash(HashKey),
    /// Sticky cookie: its name, and the attributes after the value (`; Path=/; HttpOnly`...).
    Cookie {
        /// The cookie's name.
        name: String,
        /// Everything after `name=value` but `Expires`, which depends on the time.
        attributes: String,
        /// Seconds from the response to `Expires`.
        expires: Option<u64>,
        /// A session pinned to the route's backend or to its canary stays there
        /// (`affinity-canary-behavior: sticky`).
        sticky_canary: bool,
    },
}

impl CompiledBalance {
    fn compile(balance: &Balance) -> Result<CompiledBalance, PolicyError> {
        Ok(match balance {
            Balance::RoundRobin => CompiledBalance::RoundRobin,
            Balance::Ewma => CompiledBalance::Ewma,
            Balance::Hash(template) => {
                CompiledBalance::Hash(HashKey::parse(template).map_err(PolicyError::HashKey)?)
            }
            Balance::Cookie(c) => {
                let mut attributes = format!("; Path={}", c.path);
                if let Some(max_age) = c.max_age {
                    attributes.push_str(&format!("; Max-Age={max_age}"));
                }
                if let Some(domain) = &c.domain {
                    attributes.push_str(&format!("; Domain={domain}"));
                }
                if let Some(same_site) = &c.same_site {
                    attributes.push_str(&format!("; SameSite={same_site}"));
                }
                if c.secure {
                    attributes.push_str("; Secure");
                }
                attributes.push_str("; HttpOnly");
                if HeaderValue::from_str(&format!("{}=0{attributes}", c.name)).is_err() {
                    return Err(PolicyError::HeaderValue { field: "affinity cookie", value: c.name.clone() });
                }
                CompiledBalance::Cookie {
                    name: c.name.clone(),
                    attributes,
                    expires: c.expires,
                    sticky_canary: !c.legacy_canary,
                }
            }
        })
    }

    /// The `Set-Cookie` value naming endpoint `id`, for [`CompiledBalance::Cookie`].
    pub fn set_cookie(&self, id: u64) -> Option<HeaderValue> {
        let CompiledBalance::Cookie { name, attributes, expires, .. } = self else { return None };
        let mut value = format!("{name}={id:016x}{attributes}");
        if let Some(secs) = expires {
            let at = std::time::SystemTime::now() + std::time::Duration::from_secs(*secs);
            value.push_str(&format!("; Expires={}", httpdate::fmt_http_date(at)));
        }
        HeaderValue::from_str(&value).ok()
    }
}

/// `rewrite-target`: the route's regex (for its captures) and the target.
#[derive(Debug)]
struct Rewrite {
    regex: regex::Regex,
    target: String,
}

/// What a policy decides before forwarding.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Answer with this redirect.
    Redirect(StatusCode, HeaderValue),
    /// The client address is not allowed: 403.
    Forbidden,
}

// === impl CompiledPolicy ===

impl CompiledPolicy {
    /// Compiles `policy`; `None` for an empty one, so that most routes cost nothing. `path_regex`
    /// is the route's compiled path when it is a regex (rewrites capture from it); rate limiters
    /// come from `limiters`, keyed by the route's `origin`.
    pub fn compile(
        policy: &RoutePolicy,
        path_regex: Option<&regex::Regex>,
        origin: &ObjectRef,
        limiters: &LimiterCache,
    ) -> Result<Option<CompiledPolicy>, PolicyError> {
        if policy.is_empty() {
            return Ok(None);
        }
        let header = |field: &'static str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| {
                    HeaderValue::from_str(v)
                        .map_err(|_| PolicyError::HeaderValue { field, value: v.to_string() })
                })
                .transpose()
        };
        let redirect = match &policy.redirect {
            Some(r) => {
                let code = StatusCode::from_u16(r.code)
                    .ok()
                    .filter(StatusCode::is_redirection)
                    .ok_or(PolicyError::RedirectCode(r.code))?;
                let location = header("redirect location", &Some(r.location.clone()))?;
                location.map(|l| (code, l))
            }
            None => None,
        };
        Ok(Some(CompiledPolicy {
            redirect,
            app_root: header("app-root", &policy.app_root)?,
            source: policy.source.clone(),
            max_body_bytes: policy.max_body_bytes,
            upstream_host: header("upstream host", &policy.upstream_host)?,
            forwarded_prefix: header("x-forwarded-prefix", &policy.forwarded_prefix)?,
            rewrite: match (&policy.rewrite_target, path_regex) {
                (Some(target), Some(regex)) => Some(Rewrite { regex: regex.clone(), target: target.clone() }),
                (Some(_), None) => return Err(PolicyError::RewriteWithoutRegex),
                (None, _) => None,
            },
            cors: policy.cors.as_deref().map(CompiledCors::compile).transpose()?,
            read_timeout: policy.read_timeout_ms.map(std::time::Duration::from_millis),
            connect_timeout: policy.connect_timeout_ms.map(std::time::Duration::from_millis),
            connect_tries: policy.connect_tries,
            next_upstream: policy.next_upstream.as_deref().map(crate::route::retry::Retry::new),
            retries: policy
                .filters
                .as_deref()
                .and_then(|f| f.retries.as_ref())
                .map(|r| Box::new(crate::route::retry::Retries::new(r))),
            next_upstream_timeout: policy
                .next_upstream_timeout_ms
                .map(|ms| (ms > 0).then(|| std::time::Duration::from_millis(ms))),
            send_timeout: policy.send_timeout_ms.map(std::time::Duration::from_millis),
            rate_limit: policy.rate_limit.as_deref().and_then(|l| limiters.get(origin, l)),
            basic_auth: match &policy.basic_auth {
                Some(auth) => {
                    let realm = auth.realm.replace(['"', '\\'], "");
                    let challenge = header("auth-realm", &Some(format!("Basic realm=\"{realm}\"")))?;
                    challenge.map(|c| (BasicAuth::clone(auth), c))
                }
                None => None,
            },
            external_auth: policy.external_auth.as_deref().map(CompiledExternalAuth::compile),
            canary: None,
            balance: CompiledBalance::compile(&policy.balance)?,
            custom_errors: None,
            host_redirect: match &policy.host_redirect {
                Some(host) if HeaderValue::from_str(host).is_err() => {
                    return Err(PolicyError::HeaderValue { field: "host redirect", value: host.clone() });
                }
                other => other.clone(),
            },
            response_headers: compile_headers("custom-headers", &policy.response_headers)?,
            mirrors: policy
                .mirrors
                .iter()
                .flat_map(|m| m.iter())
                .map(crate::route::mirror::CompiledMirror::compile)
                .collect::<Result<_, _>>()?,
            conn_limit: policy.conn_limit.as_deref().map(|l| limiters.connections(origin, l)),
            response_rate: policy.response_rate.as_deref().cloned().filter(|r| r.bytes_per_sec > 0),
            response_rewrite: crate::route::rewrite_response::ResponseRewrite::new(policy),
            preserve_trailing_slash: policy.preserve_trailing_slash,
            auth_cache: None,
            global_limit: match &policy.global_rate_limit {
                Some(limit) => Some(Arc::new(
                    crate::state::global_limit::GlobalLimiter::compile(limit)
                        .map_err(PolicyError::GlobalLimit)?,
                )),
                None => None,
            },
            access_log_off: policy.access_log_off,
            filters: match &policy.filters {
                Some(f) => Some(Box::new(crate::route::filters::CompiledFilters::compile(f)?)),
                None => None,
            },
            trace: policy.trace.as_deref().map(crate::trace::CompiledRouteTrace::compile),
        }))
    }

    /// The checks that answer instead of forwarding, for a client at `client` asking for
    /// `path`. (The body limit, [`CompiledPolicy::body_limit`], is checked by the caller first.)
    pub fn check(&self, client: IpAddr, path: &str) -> Option<Verdict> {
        if let Some((code, location)) = &self.redirect {
            return Some(Verdict::Redirect(*code, location.clone()));
        }
        if let Some(root) = &self.app_root
            && path == "/"
        {
            return Some(Verdict::Redirect(StatusCode::FOUND, root.clone()));
        }
        if !self.source.permits(client) {
            return Some(Verdict::Forbidden);
        }
        None
    }

    /// The path and query to send upstream when the route rewrites (`None`: unchanged), from the
    /// request's `path` and `query`. nginx semantics: the whole path is replaced by the target
    /// with the captures substituted; the request's query follows the target's own (after `&`),
    /// and is dropped when the target ends with `?`.
    pub fn rewrite(&self, path: &str, query: Option<&str>) -> Option<String> {
        self.rewrite_path(path, query, false)
    }

    /// [`CompiledPolicy::rewrite`] of a path that may hold decoded bytes (the normalized path,
    /// [`crate::uri_path`]) when `decoded`: captures are percent-encoded again as they are
    /// substituted, so a decoded `?`, `%` or space cannot change the target's shape.
    pub fn rewrite_path(&self, path: &str, query: Option<&str>, decoded: bool) -> Option<String> {
        let rewrite = self.rewrite.as_ref()?;
        let captures = rewrite.regex.captures(path)?;
        let mut out = String::with_capacity(rewrite.target.len() + path.len());
        let mut rest = rewrite.target.as_str();
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            rest = &rest[at + 1..];
            let (group, used) = match rest.as_bytes() {
                [d @ b'0'..=b'9', ..] => (Some(usize::from(d - b'0')), 1),
                [b'{', d @ b'0'..=b'9', b'}', ..] => (Some(usize::from(d - b'0')), 3),
                _ => (None, 0),
            };
            match group {
                Some(g) => {
                    let capture = captures.get(g).map_or("", |m| m.as_str());
                    if decoded {
                        out.push_str(&crate::uri_path::encode(capture));
                    } else {
                        out.push_str(capture);
                    }
                }
                None => out.push('$'),
            }
            rest = &rest[used..];
        }
        out.push_str(rest);
        if let Some(stripped) = out.strip_suffix('?') {
            out.truncate(stripped.len());
        } else if let Some(query) = query.filter(|q| !q.is_empty()) {
            out.push(if out.contains('?') { '&' } else { '?' });
            out.push_str(query);
        }
        if !out.starts_with('/') {
            out.insert(0, '/');
        }
        Some(out)
    }

    /// The body limit in force: the route's, else `global` (`0` on the route lifts the limit).
    pub fn body_limit(&self, global: Option<u64>) -> Option<u64> {
        match self.max_body_bytes {
            Some(0) => None,
            Some(n) => Some(n),
            None => global,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::Redirect;

    fn origin() -> ObjectRef {
        ObjectRef::new("ns", "ing")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn empty_policy_compiles_to_nothing() {
        assert!(
            CompiledPolicy::compile(&RoutePolicy::default(), None, &origin(), &LimiterCache::default())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn redirect_then_source() {
        let policy = RoutePolicy {
            redirect: Some(Box::new(Redirect { location: "https://new.example.com/".into(), code: 308 })),
            max_body_bytes: Some(10),
            source: SourceFilter { allow: vec![], deny: vec!["10.0.0.0/8".parse().unwrap()] },
            ..RoutePolicy::default()
        };
        let p = CompiledPolicy::compile(&policy, None, &origin(), &LimiterCache::default()).unwrap().unwrap();
        assert_eq!(p.body_limit(None), Some(10));
        let redirect =
            Verdict::Redirect(StatusCode::PERMANENT_REDIRECT, "https://new.example.com/".parse().unwrap());
        assert_eq!(p.check(ip("10.1.1.1"), "/"), Some(redirect));

        let policy = RoutePolicy { redirect: None, ..policy };
        let p = CompiledPolicy::compile(&policy, None, &origin(), &LimiterCache::default()).unwrap().unwrap();
        assert_eq!(p.check(ip("10.1.1.1"), "/"), Some(Verdict::Forbidden));
        assert_eq!(p.check(ip("192.0.2.1"), "/"), None);
    }

    #[test]
    fn app_root_only_for_the_root() {
        let policy = RoutePolicy { app_root: Some("/app".into()), ..RoutePolicy::default() };
        let p = CompiledPolicy::compile(&policy, None, &origin(), &LimiterCache::default()).unwrap().unwrap();
        assert_eq!(
            p.check(ip("127.0.0.1"), "/"),
            Some(Verdict::Redirect(StatusCode::FOUND, HeaderValue::from_static("/app")))
        );
        assert_eq!(p.check(ip("127.0.0.1"), "/app"), None);
    }

    #[test]
    fn body_limits() {
        let unlimited = RoutePolicy { max_body_bytes: Some(0), ..RoutePolicy::default() };
        let p =
            CompiledPolicy::compile(&unlimited, None, &origin(), &LimiterCache::default()).unwrap().unwrap();
        assert_eq!(p.body_limit(Some(5)), None);
        let forwarded = RoutePolicy { forwarded_prefix: Some("/x".into()), ..RoutePolicy::default() };
        let p =
            CompiledPolicy::compile(&forwarded, None, &origin(), &LimiterCache::default()).unwrap().unwrap();
        assert_eq!(p.body_limit(Some(5)), Some(5));
    }

    #[test]
    fn rewrites_like_nginx() {
        let re = regex::Regex::new("^(?:(?i)/something(/|$)(.*))").unwrap();
        let policy =
            |target: &str| RoutePolicy { rewrite_target: Some(target.into()), ..RoutePolicy::default() };
        let p = CompiledPolicy::compile(&policy("/$2"), Some(&re), &origin(), &LimiterCache::default())
            .unwrap()
            .unwrap();
        assert_eq!(p.rewrite("/something/new", None).as_deref(), Some("/new"));
        assert_eq!(p.rewrite("/something", None).as_deref(), Some("/"));
        assert_eq!(p.rewrite("/Something/a/b", Some("x=1")).as_deref(), Some("/a/b?x=1"));
        let p =
            CompiledPolicy::compile(&policy("/v2/${2}/$9$x"), Some(&re), &origin(), &LimiterCache::default())
                .unwrap()
                .unwrap();
        assert_eq!(p.rewrite("/something/a", None).as_deref(), Some("/v2/a/$x"));
        let p =
            CompiledPolicy::compile(&policy("/new?from=old"), Some(&re), &origin(), &LimiterCache::default())
                .unwrap()
                .unwrap();
        assert_eq!(p.rewrite("/something/a", Some("x=1")).as_deref(), Some("/new?from=old&x=1"));
        let p = CompiledPolicy::compile(&policy("/new?"), Some(&re), &origin(), &LimiterCache::default())
            .unwrap()
            .unwrap();
        assert_eq!(p.rewrite("/something/a", Some("x=1")).as_deref(), Some("/new"));
        assert!(matches!(
            CompiledPolicy::compile(&policy("/"), None, &origin(), &LimiterCache::default()),
            Err(PolicyError::RewriteWithoutRegex)
        ));
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = RoutePolicy {
            redirect: Some(Box::new(Redirect { location: "https://x/".into(), code: 200 })),
            ..RoutePolicy::default()
        };
        assert!(matches!(
            CompiledPolicy::compile(&bad, None, &origin(), &LimiterCache::default()),
            Err(PolicyError::RedirectCode(200))
        ));
        let bad = RoutePolicy { upstream_host: Some("a\nb".into()), ..RoutePolicy::default() };
        assert!(matches!(
            CompiledPolicy::compile(&bad, None, &origin(), &LimiterCache::default()),
            Err(PolicyError::HeaderValue { .. })
        ));
    }
}
