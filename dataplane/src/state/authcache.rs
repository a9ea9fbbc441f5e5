//! The answer cache of external authentication (ingress-nginx `auth-cache-key` and
//! `auth-cache-duration`): per route, answers of the authentication service are kept by a key
//! computed from the request, for the time nginx's `proxy_cache_valid` rules give their
//! status. As nginx's `proxy_cache`, an answer that sets a cookie or says `Cache-Control:
//! no-store`, `no-cache` or `private` is never kept.
//!
//! The cache is bounded (entries and bytes); when full, expired entries are dropped, and a new
//! answer that still does not fit is not kept (the service is asked again next time). Caches
//! live in an [`AuthCaches`] registry, so that publishing a new table keeps the answers of
//! routes whose authentication did not change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::StatusCode;
use http::header::HeaderMap;

use crate::model::{AuthCacheSpec, CacheValid, ExternalAuth, HostMatch, ObjectRef, PathMatch};
use crate::vars::{Dialect, Part, RequestView, Template, Var, basic_user};

/// Entries kept per route at most.
const MAX_ENTRIES: usize = 4096;
/// Bytes (keys and kept headers) kept per route at most.
const MAX_BYTES: usize = 4 << 20;
/// A key longer than this is not cached (the service is asked every time).
const MAX_KEY: usize = 4096;

/// A parsed `auth-cache-key` template: literal text and nginx variables (the
/// [`Dialect::AuthKey`] of [`crate::vars`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthKey(Template);

impl AuthKey {
    /// Parses `template`: text with `$remote_addr`, `$remote_user`, `$scheme`, `$host` (also
    /// `$http_host`), `$request_method`, `$request_uri`, `$uri`, `$args`, `$http_NAME`,
    /// `$cookie_NAME`, `$arg_NAME`; `${name}` delimits a name. Any other variable is an error,
    /// as is a template without variable (every client would share one answer).
    pub fn parse(template: &str) -> Result<AuthKey, String> {
        let template =
            Template::parse(template, Dialect::AuthKey).map_err(|r| r.message(Dialect::AuthKey))?;
        if template.vars().next().is_none() {
            return Err("the key has no variable: every client would share one answer".into());
        }
        Ok(AuthKey(template))
    }

    /// The key of `req`. Each variable's value is written with its length, so that two
    /// requests share a key only when every variable has the same value.
    pub fn key(&self, req: &RequestView<'_>) -> Vec<u8> {
        let mut key = Vec::with_capacity(128);
        let mut put = |value: &[u8]| {
            key.extend_from_slice(value.len().to_string().as_bytes());
            key.push(b':');
            key.extend_from_slice(value);
        };
        for part in self.0.parts() {
            let var = match part {
                Part::Text(s) => {
                    put(s.as_bytes());
                    continue;
                }
                Part::Var(var) => var,
            };
            match var {
                Var::RemoteAddr => put(crate::model::canonical_ip(req.client).to_string().as_bytes()),
                Var::RemoteUser => put(basic_user(req.headers).unwrap_or_default().as_bytes()),
                Var::Scheme => put(req.scheme.as_bytes()),
                Var::Host => put(req.host.as_bytes()),
                Var::RequestMethod => put(req.method.as_str().as_bytes()),
                Var::RequestUri => put(req.request_uri.as_bytes()),
                Var::Uri => put(req.path().as_bytes()),
                Var::Args => put(req.query().as_bytes()),
                Var::RequestHeader(h) => {
                    // Every line of the header: the service sees them all.
                    let mut joined = Vec::new();
                    for (i, v) in req.headers.get_all(h).iter().enumerate() {
                        if i > 0 {
                            joined.extend_from_slice(b", ");
                        }
                        joined.extend_from_slice(v.as_bytes());
                    }
                    put(&joined);
                }
                Var::Cookie(name) => put(req.cookie(name).unwrap_or_default().as_bytes()),
                Var::Arg(name) => put(req.arg(name).unwrap_or_default().as_bytes()),
                // Not in the dialect: never parsed into a key.
                _ => {}
            }
        }
        key
    }
}

/// A kept answer of the service: its status and the headers that decide what it means.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The service's status.
    pub status: StatusCode,
    /// The service's headers (those the decision reads).
    pub headers: HeaderMap,
}

#[derive(Debug)]
struct Entry {
    answer: Answer,
    until: Instant,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Vec<u8>, Entry>,
    bytes: usize,
}

/// One route's cache.
#[derive(Debug)]
pub struct AuthCache {
    key: AuthKey,
    valid: Vec<CacheValid>,
    entries: Mutex<Entries>,
}

impl AuthCache {
    /// A cache for `spec`; `Err` when its key does not parse.
    pub fn new(spec: &AuthCacheSpec) -> Result<AuthCache, String> {
        Ok(AuthCache {
            key: AuthKey::parse(&spec.key)?,
            valid: spec.valid.clone(),
            entries: Mutex::default(),
        })
    }

    /// The key of `req`; `None` when it is too long to be cached.
    pub fn key(&self, req: &RequestView<'_>) -> Option<Vec<u8>> {
        Some(self.key.key(req)).filter(|k| k.len() <= MAX_KEY)
    }

    /// The answer kept for `key` at `now`, if any (an expired one is dropped).
    pub fn get(&self, key: &[u8], now: Instant) -> Option<Answer> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.map.get(key) {
            Some(e) if e.until > now => Some(e.answer.clone()),
            Some(_) => {
                if let Some(gone) = entries.map.remove(key) {
                    entries.bytes -= gone.bytes;
                }
                None
            }
            None => None,
        }
    }

    /// How long an answer with `status` and `headers` may be kept; `None`: not kept.
    pub fn lifetime(&self, status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
        if headers.contains_key(http::header::SET_COOKIE) {
            return None;
        }
        let uncacheable = headers.get_all(http::header::CACHE_CONTROL).iter().any(|v| {
            v.to_str().unwrap_or("private").split(',').any(|d| {
                let d = d.trim().to_ascii_lowercase();
                d == "no-store" || d == "no-cache" || d == "private" || d.starts_with("no-cache=")
            })
        });
        if uncacheable {
            return None;
        }
        self.valid
            .iter()
            .find(|v| v.codes.is_empty() || v.codes.contains(&status.as_u16()))
            .map(|v| Duration::from_secs(v.seconds))
            .filter(|d| !d.is_zero())
    }

    /// Keeps `answer` under `key` for `ttl` from `now`, if it fits.
    pub fn put(&self, key: Vec<u8>, answer: Answer, ttl: Duration, now: Instant) {
        let bytes = key.len()
            + answer.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 32).sum::<usize>()
            + 64;
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entries = &mut *guard;
        if let Some(old) = entries.map.remove(&key) {
            entries.bytes -= old.bytes;
        }
        if entries.map.len() >= MAX_ENTRIES || entries.bytes + bytes > MAX_BYTES {
            let mut freed = 0;
            entries.map.retain(|_, e| {
                let keep = e.until > now;
                if !keep {
                    freed += e.bytes;
                }
                keep
            });
            entries.bytes -= freed;
        }
        if entries.map.len() >= MAX_ENTRIES || entries.bytes + bytes > MAX_BYTES {
            return;
        }
        entries.bytes += bytes;
        entries.map.insert(key, Entry { answer, until: now + ttl, bytes });
    }

    /// Entries kept (expired ones included until they are swept).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which route a cache belongs to: the answers of one route never serve another.
type RouteKey = (ObjectRef, HostMatch, PathMatch, ExternalAuth);

/// The live caches by route and authentication settings, so that a new table keeps the
/// answers of routes whose settings did not change.
#[derive(Debug, Default)]
pub struct AuthCaches(Mutex<HashMap<RouteKey, Weak<AuthCache>>>);

impl AuthCaches {
    /// The cache of the route `host` `path` of `origin` with `auth`: the live one, or a new one;
    /// `None` when `auth` caches nothing (or its key does not parse).
    pub fn get(
        &self,
        origin: &ObjectRef,
        host: &HostMatch,
        path: &PathMatch,
        auth: &ExternalAuth,
    ) -> Option<Arc<AuthCache>> {
        let spec = auth.cache.as_ref()?;
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        let key = (origin.clone(), host.clone(), path.clone(), auth.clone());
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return Some(live);
        }
        let cache = match AuthCache::new(spec) {
            Ok(cache) => Arc::new(cache),
            Err(why) => {
                tracing::warn!(%origin, "auth-cache-key {:?} ignored: {why}", spec.key);
                return None;
            }
        };
        map.insert(key, Arc::downgrade(&cache));
        Some(cache)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::{HeaderValue, Method};

    use super::*;

    fn req<'a>(headers: &'a HeaderMap, uri: &'a str) -> RequestView<'a> {
        RequestView {
            client: "192.0.2.1".parse().unwrap(),
            scheme: "https",
            host: "app.test",
            method: &Method::GET,
            request_uri: uri,
            headers,
        }
    }

    #[test]
    fn keys_parse_and_tell_requests_apart() {
        let k = AuthKey::parse("$remote_user$http_authorization-${cookie_sid}:$arg_x").unwrap();
        let mut a = HeaderMap::new();
        a.insert("authorization", HeaderValue::from_static("Bearer 1"));
        let mut b = HeaderMap::new();
        b.insert("authorization", HeaderValue::from_static("Bearer 2"));
        assert_eq!(k.key(&req(&a, "/?x=1")), k.key(&req(&a, "/other?x=1")));
        assert_ne!(k.key(&req(&a, "/?x=1")), k.key(&req(&b, "/?x=1")));
        assert_ne!(k.key(&req(&a, "/?x=1")), k.key(&req(&a, "/?x=2")));
        // Values cannot run into each other.
        let k = AuthKey::parse("$http_a$http_b").unwrap();
        let mut ab = HeaderMap::new();
        ab.insert("a", HeaderValue::from_static("xy"));
        let mut a_b = HeaderMap::new();
        a_b.insert("a", HeaderValue::from_static("x"));
        a_b.insert("b", HeaderValue::from_static("y"));
        assert_ne!(k.key(&req(&ab, "/")), k.key(&req(&a_b, "/")));
        for bad in ["static", "$request_time", "${host", "$", "$http_", "a$upstream_addr"] {
            assert!(AuthKey::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lifetimes_follow_the_rules_and_refuse_cookies() {
        let spec = AuthCacheSpec {
            key: "$http_authorization".into(),
            valid: vec![
                CacheValid { codes: vec![200, 202], seconds: 600 },
                CacheValid { codes: vec![], seconds: 60 },
            ],
        };
        let cache = AuthCache::new(&spec).unwrap();
        let none = HeaderMap::new();
        assert_eq!(cache.lifetime(StatusCode::OK, &none), Some(Duration::from_secs(600)));
        assert_eq!(cache.lifetime(StatusCode::UNAUTHORIZED, &none), Some(Duration::from_secs(60)));
        let mut cookie = HeaderMap::new();
        cookie.insert("set-cookie", HeaderValue::from_static("s=1"));
        assert_eq!(cache.lifetime(StatusCode::OK, &cookie), None);
        let mut private = HeaderMap::new();
        private.insert("cache-control", HeaderValue::from_static("max-age=5, private"));
        assert_eq!(cache.lifetime(StatusCode::OK, &private), None);
    }

    #[test]
    fn entries_expire_and_stay_bounded() {
        let spec = AuthCacheSpec { key: "$http_x".into(), valid: vec![] };
        let cache = AuthCache::new(&spec).unwrap();
        let t0 = Instant::now();
        let answer = Answer { status: StatusCode::OK, headers: HeaderMap::new() };
        cache.put(b"a".to_vec(), answer.clone(), Duration::from_secs(1), t0);
        assert!(cache.get(b"a", t0).is_some());
        assert!(cache.get(b"a", t0 + Duration::from_secs(2)).is_none());
        assert!(cache.is_empty(), "an expired entry is dropped when looked up");
        for i in 0..MAX_ENTRIES + 10 {
            cache.put(i.to_string().into_bytes(), answer.clone(), Duration::from_secs(60), t0);
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
        // Once they expire, new answers take their place.
        let later = t0 + Duration::from_secs(61);
        cache.put(b"new".to_vec(), answer, Duration::from_secs(60), later);
        assert_eq!(cache.len(), 1);
    }
}
