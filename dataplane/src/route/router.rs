//! The compiled router: host → path lookup with Ingress precedence.
//!
//! [`Router::compile`] turns a [`RouteTable`] into lookup structures off the request path;
//! [`Router::lookup`] is then a few hash probes and, only for virtual hosts that have them,
//! regex matches.
//!
//! Precedence, one rule at a time (each has its own unit test below):
//! - host: exact name → wildcard (`*.suffix`, exactly one extra label) → the any-host entry.
//!   One virtual host is chosen; when none of its routes matches, the table's default backend
//!   serves (else no route: 404). There is no fall back to a less specific virtual host
//!   (nginx `server_name` and envoy virtual-host semantics).
//! - path, within the chosen virtual host: `Exact` → `Regex` (anchored at the start, longest
//!   pattern first) → `Prefix` (longest, element-wise by `/`).
//! - Gateway API routes: a host `**.suffix` ([`HostMatch::Suffix`]) is tried after the exact
//!   and one-label wildcard hosts, longest suffix first ("Characters in a matching hostname");
//!   routes with [`RequestConditions`](crate::model::RequestConditions) share a path with
//!   others: at one path they are tried in table order, the first whose conditions hold wins,
//!   and when none does the next shorter path is tried (see `Vhost::first_holding`).
//!
//! ## Why not matchit for paths
//! Exact paths are one `HashMap` probe. Element-wise prefixes are a walk over the request path's
//! `/` boundaries from the longest candidate to the shortest, one probe each: `O(segments)`,
//! no allocation, and the "longest element-wise prefix wins" rule falls out of the walk order.
//! matchit would need every prefix inserted twice (`/foo` and `/foo/{*rest}`), escaping of
//! `{`/`}`, and relies on its static-over-catch-all priority and backtracking to emulate
//! longest-prefix; the map walk is simpler to reason about and at least as fast for the few
//! segments real paths have.

use std::collections::HashMap;
use std::sync::Arc;

use crate::http_util::normalize_host;
use crate::model::changes::TableChanges;
use crate::model::{BackendId, HostMatch, ObjectRef, PathMatch, Route, RouteAction, RouteTable, VirtualHost};
use crate::route::canary::CompiledCanary;
use crate::route::conditions::{CompiledConditions, RequestView};
use crate::route::filters::CompiledEdits;
use crate::route::policy::{CompiledPolicy, PolicyError};
use crate::route::split::CompiledSplit;
use crate::state::balance::BackendIdx;
use crate::state::ratelimit::LimiterCache;

/// Errors compiling a [`RouteTable`].
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// A route or the default backend names a backend missing from [`RouteTable::backends`].
    #[error("{referrer} refers to unknown backend {backend}")]
    UnknownBackend {
        /// Who refers to it (a host and path, or `default backend`).
        referrer: String,
        /// The missing backend.
        backend: BackendId,
    },
    /// A regex path does not compile.
    #[error("host {host}: invalid regex path {pattern:?}: {source}")]
    InvalidRegex {
        /// The virtual host of the route.
        host: HostMatch,
        /// The pattern as written.
        pattern: String,
        /// Why it does not compile.
        #[source]
        source: Box<regex::Error>,
    },
    /// The same host appears twice in [`RouteTable::hosts`].
    #[error("host {0} appears more than once")]
    DuplicateHost(HostMatch),
    /// A route's policy cannot be compiled.
    #[error("host {host} path {path:?}: {source}")]
    InvalidPolicy {
        /// The virtual host of the route.
        host: HostMatch,
        /// The route's path.
        path: PathMatch,
        /// What is wrong.
        #[source]
        source: PolicyError,
    },
}

/// `Result` with [`CompileError`].
pub type Result<T, E = CompileError> = std::result::Result<T, E>;

/// What the router found for a request: the backend to forward to and where the route came from.
#[derive(Clone, Debug)]
pub struct CompiledRoute {
    /// The backend, an index into [`Router::backend_ids`].
    pub backend: BackendIdx,
    /// The virtual host the route belongs to (`None` for the default backend).
    pub host: Option<HostMatch>,
    /// The matched path rule (`None` for the default backend).
    pub path: Option<PathMatch>,
    /// The object the route came from (`None` for the default backend).
    pub origin: Option<ObjectRef>,
    /// The route's policy; `None` when it has none (the common case).
    pub policy: Option<Arc<CompiledPolicy>>,
    /// Plain-HTTP requests are redirected to HTTPS.
    pub ssl_redirect: bool,
    /// Where the route's requests are counted.
    pub stats: crate::metrics::RouteHandle,
    /// A weighted split among backends ([`RouteAction::Split`]); `backend` is then its first
    /// resolved share, for labels only.
    pub split: Option<Box<CompiledSplit>>,
    /// Conditions besides host and path; `None` for Ingress routes.
    pub conditions: Option<Box<CompiledConditions>>,
    /// The Gateway API rule's name ([`Route::rule`]), for logs.
    pub rule: Option<Arc<str>>,
}

impl CompiledRoute {
    /// True for the table's default backend (no host/path rule matched).
    pub fn is_default(&self) -> bool {
        self.path.is_none()
    }
}

/// Routes of one virtual host, indexed for lookup.
#[derive(Debug, Default)]
struct Vhost {
    exact: crate::fast::HashMap<Box<str>, usize>,
    /// Anchored regexes, longest pattern first.
    regex: Vec<(regex::Regex, usize)>,
    /// Element-wise prefixes, stored without trailing slash; the root `/` is `root`.
    prefix: crate::fast::HashMap<Box<str>, usize>,
    root: Option<usize>,
    routes: Vec<CompiledRoute>,
    /// The next route with the same path, for routes with conditions (rare: Gateway API).
    alt: crate::fast::HashMap<usize, usize>,
    /// [`VirtualHost::fallback`]: tried in order when no route of this one matches (Gateway
    /// API only).
    fallback: Vec<Vhost>,
}

/// A compiled [`RouteTable`]: answers `(host, path) → route`.
///
/// Virtual hosts are shared (`Arc`) between a router and the one [`Router::update`] makes from
/// it, and backends keep their [`BackendIdx`] across updates, so an update compiles only the
/// virtual hosts that changed.
#[derive(Debug, Default)]
pub struct Router {
    exact: crate::fast::HashMap<Box<str>, Arc<Vhost>>,
    wildcard: crate::fast::HashMap<Box<str>, Arc<Vhost>>,
    any: Option<Arc<Vhost>>,
    /// Gateway API `*.suffix` hosts (any number of labels), by suffix.
    suffix: crate::fast::HashMap<Box<str>, Arc<Vhost>>,
    default: Option<CompiledRoute>,
    backend_ids: Arc<Vec<BackendId>>,
    backend_index: Arc<HashMap<BackendId, BackendIdx>>,
    /// Indexes of backends that are gone (their [`Router::backend_ids`] entry is a placeholder
    /// that names no Service), reused first.
    free: Vec<BackendIdx>,
}

/// A regex path as the router matches it: anchored at the start of the path.
pub fn compile_path_regex(pattern: &str) -> std::result::Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{pattern})"))
}

/// The [`Router::backend_ids`] entry of a backend that is gone.
fn placeholder() -> BackendId {
    BackendId { namespace: String::new(), service: String::new(), port: crate::model::ServicePort::Number(0) }
}

// === impl Router ===

impl Router {
    /// Compiles a table. Fails on references to unknown backends, bad regexes, duplicate hosts.
    pub fn compile(table: &RouteTable) -> Result<Router> {
        Router::compile_with(table, &LimiterCache::default())
    }

    /// [`Router::compile`], reusing the live rate limiters of `limiters`.
    pub fn compile_with(table: &RouteTable, limiters: &LimiterCache) -> Result<Router> {
        let backend_ids: Vec<BackendId> = table.backends.keys().cloned().collect();
        let index: HashMap<BackendId, BackendIdx> =
            backend_ids.iter().enumerate().map(|(i, id)| (id.clone(), BackendIdx(i as u32))).collect();
        let mut router = Router {
            backend_ids: Arc::new(backend_ids),
            backend_index: Arc::new(index),
            ..Router::default()
        };
        for vh in &table.hosts {
            let compiled = Arc::new(router.compile_vhost(vh, limiters)?);
            if router.insert_vhost(&vh.host, compiled) {
                return Err(CompileError::DuplicateHost(vh.host.clone()));
            }
        }
        router.default = router.compile_default(table, limiters)?;
        Ok(router)
    }

    /// The router of `table`, which differs from the table this router was compiled from only
    /// in `changes`: the changed virtual hosts are compiled, the others shared with this router;
    /// backends that stay keep their index, new ones take the index of a gone one or a new one.
    /// `changes` must name every difference (a virtual host not named is not looked at).
    pub fn update(
        &self,
        table: &RouteTable,
        changes: &TableChanges,
        limiters: &LimiterCache,
    ) -> Result<Router> {
        let mut router = Router {
            exact: self.exact.clone(),
            wildcard: self.wildcard.clone(),
            any: self.any.clone(),
            suffix: self.suffix.clone(),
            default: None,
            backend_ids: self.backend_ids.clone(),
            backend_index: self.backend_index.clone(),
            free: self.free.clone(),
        };
        let (gone, new): (Vec<&BackendId>, Vec<&BackendId>) =
            changes.backends.iter().partition(|id| !table.backends.contains_key(*id));
        for id in gone {
            if let Some(idx) = Arc::make_mut(&mut router.backend_index).remove(id) {
                Arc::make_mut(&mut router.backend_ids)[idx.0 as usize] = placeholder();
                router.free.push(idx);
            }
        }
        for id in new {
            if router.backend_index.contains_key(id) {
                continue;
            }
            let ids = Arc::make_mut(&mut router.backend_ids);
            let idx = router.free.pop().unwrap_or(BackendIdx(ids.len() as u32));
            match ids.get_mut(idx.0 as usize) {
                Some(slot) => *slot = id.clone(),
                None => ids.push(id.clone()),
            }
            Arc::make_mut(&mut router.backend_index).insert(id.clone(), idx);
        }
        for host in &changes.hosts {
            router.remove_vhost(host);
        }
        for vh in table.hosts.iter().filter(|vh| changes.hosts.contains(&vh.host)) {
            let compiled = Arc::new(router.compile_vhost(vh, limiters)?);
            if router.insert_vhost(&vh.host, compiled) {
                return Err(CompileError::DuplicateHost(vh.host.clone()));
            }
        }
        router.default = router.compile_default(table, limiters)?;
        Ok(router)
    }

    /// The index of backend `id`, if the table has it.
    pub fn backend_index(&self, id: &BackendId) -> Option<BackendIdx> {
        self.backend_index.get(id).copied()
    }

    fn resolve(&self, id: &BackendId, referrer: &dyn Fn() -> String) -> Result<BackendIdx> {
        self.backend_index(id)
            .ok_or_else(|| CompileError::UnknownBackend { referrer: referrer(), backend: id.clone() })
    }

    /// Adds a compiled virtual host; true if its host already had one.
    fn insert_vhost(&mut self, host: &HostMatch, vhost: Arc<Vhost>) -> bool {
        match host {
            HostMatch::Exact(h) => self.exact.insert(h.as_str().into(), vhost).is_some(),
            HostMatch::Wildcard(s) => self.wildcard.insert(s.as_str().into(), vhost).is_some(),
            HostMatch::Any => self.any.replace(vhost).is_some(),
            HostMatch::Suffix(s) => self.suffix.insert(s.as_str().into(), vhost).is_some(),
        }
    }

    fn remove_vhost(&mut self, host: &HostMatch) {
        match host {
            HostMatch::Exact(h) => drop(self.exact.remove(h.as_str())),
            HostMatch::Wildcard(s) => drop(self.wildcard.remove(s.as_str())),
            HostMatch::Any => self.any = None,
            HostMatch::Suffix(s) => drop(self.suffix.remove(s.as_str())),
        }
    }

    fn compile_default(&self, table: &RouteTable, limiters: &LimiterCache) -> Result<Option<CompiledRoute>> {
        let Some(id) = &table.default_backend else { return Ok(None) };
        Ok(Some(CompiledRoute {
            backend: self.resolve(id, &|| "default backend".to_string())?,
            host: None,
            path: None,
            origin: None,
            policy: None,
            ssl_redirect: false,
            stats: limiters.metrics().route(crate::metrics::RouteLabels::of(None, id, None, None), None),
            split: None,
            conditions: None,
            rule: None,
        }))
    }

    fn compile_vhost(&self, vh: &VirtualHost, limiters: &LimiterCache) -> Result<Vhost> {
        let mut compiled = self.compile_routes(&vh.host, &vh.routes, limiters)?;
        for tier in &vh.fallback {
            compiled.fallback.push(self.compile_routes(&vh.host, &tier.routes, limiters)?);
        }
        Ok(compiled)
    }

    /// The routes of one virtual host (or of one of its fallback tiers), answering for `host`.
    fn compile_routes(&self, host: &HostMatch, routes: &[Route], limiters: &LimiterCache) -> Result<Vhost> {
        let mut compiled = Vhost::default();
        let mut regexes: Vec<(usize, regex::Regex, usize)> = Vec::new();
        // The labels of a split none of whose shares resolved.
        let unresolved = placeholder();
        for route in routes {
            let referrer = || format!("host {} path {:?}", host, route.path);
            let (id, backend, split) = match &route.action {
                RouteAction::Forward(id) => (id, self.resolve(id, &referrer)?, None),
                RouteAction::Split(shares) => {
                    let mut resolved = Vec::with_capacity(shares.len());
                    for share in shares {
                        let idx = match &share.backend {
                            Some(id) => Some(self.resolve(id, &referrer)?),
                            None => None,
                        };
                        let edits = match &share.request_headers {
                            Some(e) => {
                                Some(CompiledEdits::compile(e).map_err(|e| CompileError::InvalidPolicy {
                                    host: host.clone(),
                                    path: route.path.clone(),
                                    source: PolicyError::Filters(e),
                                })?)
                            }
                            None => None,
                        };
                        resolved.push((idx, share.weight, edits));
                    }
                    let first = shares
                        .iter()
                        .zip(&resolved)
                        .find_map(|(s, (idx, w, _))| s.backend.as_ref().zip(*idx).filter(|_| *w > 0));
                    let (id, idx) = match first {
                        Some((id, idx)) => (id, idx),
                        None => (&unresolved, BackendIdx(u32::MAX)),
                    };
                    (id, idx, Some(Box::new(CompiledSplit::with_edits(resolved))))
                }
            };
            let conditions = match &route.conditions {
                Some(c) => Some(Box::new(CompiledConditions::compile(c).map_err(|e| {
                    CompileError::InvalidPolicy {
                        host: host.clone(),
                        path: route.path.clone(),
                        source: PolicyError::Conditions(e),
                    }
                })?)),
                None => None,
            };
            let regex = match &route.path {
                PathMatch::Regex(pattern) => {
                    Some(compile_path_regex(pattern).map_err(|e| CompileError::InvalidRegex {
                        host: host.clone(),
                        pattern: pattern.clone(),
                        source: Box::new(e),
                    })?)
                }
                _ => None,
            };
            let invalid =
                |source| CompileError::InvalidPolicy { host: host.clone(), path: route.path.clone(), source };
            let mut policy = CompiledPolicy::compile(&route.policy, regex.as_ref(), &route.origin, limiters)
                .map_err(invalid)?;
            if let (Some(policy), Some(auth)) = (policy.as_mut(), &route.policy.external_auth) {
                policy.auth_cache = limiters.auth_caches().get(&route.origin, host, &route.path, auth);
            }
            if let (Some(policy), Some(errors)) = (policy.as_mut(), &route.policy.custom_errors) {
                let idx = self.resolve(&errors.backend, &|| {
                    format!("the custom error backend of host {} path {:?}", host, route.path)
                })?;
                policy.custom_errors = Some((errors.codes.clone(), idx));
            }
            if let (Some(policy), Some(canary)) = (policy.as_mut(), &route.policy.canary) {
                let idx = self.resolve(&canary.backend, &|| {
                    format!("the canary of host {} path {:?}", host, route.path)
                })?;
                policy.canary =
                    Some(CompiledCanary::compile(canary, idx).map_err(|e| invalid(PolicyError::Canary(e)))?);
            }
            let labels =
                crate::metrics::RouteLabels::of(Some(&route.origin), id, Some(host), Some(&route.path));
            let stats = limiters.metrics().route(labels, route.policy.canary.as_ref().map(|c| &c.backend));
            let idx = compiled.routes.len();
            compiled.routes.push(CompiledRoute {
                backend,
                host: Some(host.clone()),
                path: Some(route.path.clone()),
                origin: Some(route.origin.clone()),
                policy: policy.map(Arc::new),
                ssl_redirect: route.policy.ssl_redirect,
                stats,
                split,
                conditions,
                rule: route.rule.as_deref().map(Arc::from),
            });
            // On duplicates the first route wins (translation already resolved conflicts),
            // unless it has conditions: then the next is tried when they do not hold.
            match (&route.path, regex) {
                (PathMatch::Exact(p), _) => {
                    let first = *compiled.exact.entry(p.as_str().into()).or_insert(idx);
                    compiled.chain(first, idx);
                }
                (PathMatch::Prefix(p), _) => {
                    let p = p.trim_end_matches('/');
                    let first = if p.is_empty() {
                        *compiled.root.get_or_insert(idx)
                    } else {
                        *compiled.prefix.entry(p.into()).or_insert(idx)
                    };
                    compiled.chain(first, idx);
                }
                (PathMatch::Regex(pattern), Some(re)) => regexes.push((pattern.len(), re, idx)),
                (PathMatch::Regex(_), None) => {}
            }
        }
        // Longest pattern first (nginx tries regex locations in order; translation and
        // ingress-nginx sort them by length); ties keep table order (stable sort).
        regexes.sort_by_key(|r| std::cmp::Reverse(r.0));
        compiled.regex = regexes.into_iter().map(|(_, re, idx)| (re, idx)).collect();
        Ok(compiled)
    }

    /// Finds the route for a request `Host` (as sent: any case, optional port, optional trailing
    /// dot) and raw path (no query). `None` means 404. Routes with conditions never match.
    pub fn lookup(&self, host: &str, path: &str) -> Option<&CompiledRoute> {
        self.lookup_request(host, path, None)
    }

    /// [`Router::lookup`], with the rest of the request for the routes that have conditions.
    pub fn lookup_request(
        &self,
        host: &str,
        path: &str,
        req: Option<&RequestView<'_>>,
    ) -> Option<&CompiledRoute> {
        let host = normalize_host(host);
        match self.vhost_for(&host) {
            Some(vh) => vh.lookup(path, req).or(self.default.as_ref()),
            None => self.default.as_ref(),
        }
    }

    /// Backends in table order; [`BackendIdx`] indexes this.
    pub fn backend_ids(&self) -> &[BackendId] {
        &self.backend_ids
    }

    fn vhost_for(&self, host: &str) -> Option<&Vhost> {
        let vhost = self.exact.get(host).or_else(|| {
            // One label only: `a.example.com` → `example.com`; `*.example.com` does not cover
            // `a.b.example.com` because its suffix `b.example.com` is a different key.
            let (label, suffix) = host.split_once('.')?;
            if label.is_empty() {
                return None;
            }
            self.wildcard.get(suffix)
        });
        let vhost = match vhost {
            Some(v) => Some(v),
            None if !self.suffix.is_empty() => self.suffix_for(host),
            None => None,
        };
        vhost.or(self.any.as_ref()).map(|v| &**v)
    }

    /// The Gateway API `*.suffix` host with the longest suffix of `host` (at least one label
    /// in front of it).
    fn suffix_for(&self, host: &str) -> Option<&Arc<Vhost>> {
        let mut rest = host;
        while let Some((label, suffix)) = rest.split_once('.') {
            if label.is_empty() {
                return None;
            }
            if let Some(v) = self.suffix.get(suffix) {
                return Some(v);
            }
            rest = suffix;
        }
        None
    }
}

// === impl Vhost ===

impl Vhost {
    fn lookup(&self, path: &str, req: Option<&RequestView<'_>>) -> Option<&CompiledRoute> {
        self.lookup_own(path, req)
            .or_else(|| self.fallback.iter().find_map(|tier| tier.lookup_own(path, req)))
    }

    /// The route of this tier (not its fallbacks) for the request.
    fn lookup_own(&self, path: &str, req: Option<&RequestView<'_>>) -> Option<&CompiledRoute> {
        let idx = self
            .exact
            .get(path)
            .and_then(|i| self.first_holding(*i, req))
            .or_else(|| {
                self.regex.iter().find(|(re, i)| re.is_match(path) && self.holds(*i, req)).map(|(_, i)| *i)
            })
            .or_else(|| self.longest_prefix(path, req))?;
        self.routes.get(idx)
    }

    /// Appends route `idx` to the routes tried at the path whose first route is `first`.
    fn chain(&mut self, first: usize, idx: usize) {
        if first == idx {
            return;
        }
        let mut last = first;
        while let Some(next) = self.alt.get(&last) {
            last = *next;
        }
        self.alt.insert(last, idx);
    }

    /// Whether route `idx`'s conditions (if any) hold for `req`.
    fn holds(&self, idx: usize, req: Option<&RequestView<'_>>) -> bool {
        match self.routes.get(idx).and_then(|r| r.conditions.as_deref()) {
            None => true,
            Some(c) => req.is_some_and(|req| c.matches(req)),
        }
    }

    /// The first route, from `idx` along the routes with the same path, whose conditions hold.
    fn first_holding(&self, mut idx: usize, req: Option<&RequestView<'_>>) -> Option<usize> {
        loop {
            if self.holds(idx, req) {
                return Some(idx);
            }
            idx = *self.alt.get(&idx)?;
        }
    }

    /// Longest element-wise prefix: candidates are the whole path and each piece ending just
    /// before a `/`, longest first; the root prefix matches everything.
    fn longest_prefix(&self, path: &str, req: Option<&RequestView<'_>>) -> Option<usize> {
        if !self.prefix.is_empty() {
            let trimmed = path.trim_end_matches('/');
            if let Some(i) = self.prefix.get(trimmed).and_then(|i| self.first_holding(*i, req)) {
                return Some(i);
            }
            let mut rest = trimmed;
            while let Some(cut) = rest.rfind('/') {
                rest = &rest[..cut];
                if rest.is_empty() {
                    break;
                }
                if let Some(i) = self.prefix.get(rest).and_then(|i| self.first_holding(*i, req)) {
                    return Some(i);
                }
            }
        }
        self.root.and_then(|i| self.first_holding(i, req))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{Backend, Endpoint, Route, RoutePolicy, Target, VirtualHost};

    fn id(name: &str) -> BackendId {
        format!("ns/{name}:80").parse().unwrap()
    }

    /// A table whose backends are named after what they route, so lookups read as assertions.
    struct T(RouteTable);

    impl T {
        fn new() -> Self {
            T(RouteTable::default())
        }
        fn route(mut self, host: &str, path: PathMatch, backend: &str) -> Self {
            let host = HostMatch::parse(host).unwrap();
            let route = Route {
                path,
                action: RouteAction::Forward(id(backend)),
                policy: RoutePolicy::default(),
                origin: ObjectRef::new("ns", backend),
                conditions: None,
                rule: None,
            };
            match self.0.hosts.iter_mut().find(|v| v.host == host) {
                Some(v) => v.routes.push(route),
                None => self.0.hosts.push(VirtualHost { host, routes: vec![route], fallback: Vec::new() }),
            }
            self.backend(backend)
        }
        fn backend(mut self, name: &str) -> Self {
            let target = Target::Endpoints(vec![Endpoint::new("127.0.0.1:1".parse().unwrap())]);
            self.0.backends.insert(id(name), Backend { protocol: Default::default(), target, tls: None });
            self
        }
        fn default_backend(mut self, name: &str) -> Self {
            self.0.default_backend = Some(id(name));
            self.backend(name)
        }
        fn compile(self) -> Router {
            Router::compile(&self.0).unwrap()
        }
    }

    fn prefix(p: &str) -> PathMatch {
        PathMatch::Prefix(p.into())
    }
    fn exact(p: &str) -> PathMatch {
        PathMatch::Exact(p.into())
    }
    fn regex(p: &str) -> PathMatch {
        PathMatch::Regex(p.into())
    }

    fn hit<'a>(r: &'a Router, host: &str, path: &str) -> Option<&'a str> {
        r.lookup(host, path).map(|route| r.backend_ids()[route.backend.0 as usize].service.as_str())
    }

    #[test]
    fn exact_host_beats_wildcard_beats_any() {
        let r = T::new()
            .route("a.example.com", prefix("/"), "exact")
            .route("*.example.com", prefix("/"), "wild")
            .route("*", prefix("/"), "any")
            .compile();
        assert_eq!(hit(&r, "a.example.com", "/"), Some("exact"));
        assert_eq!(hit(&r, "b.example.com", "/"), Some("wild"));
        assert_eq!(hit(&r, "other.test", "/"), Some("any"));
    }

    #[test]
    fn wildcard_covers_exactly_one_label() {
        let r = T::new().route("*.example.com", prefix("/"), "wild").compile();
        assert_eq!(hit(&r, "a.example.com", "/"), Some("wild"));
        assert_eq!(hit(&r, "example.com", "/"), None);
        assert_eq!(hit(&r, "a.b.example.com", "/"), None);
        assert_eq!(hit(&r, ".example.com", "/"), None);
    }

    #[test]
    fn host_is_case_insensitive_without_port_or_trailing_dot() {
        let r = T::new().route("a.example.com", prefix("/"), "a").compile();
        assert_eq!(hit(&r, "A.Example.COM", "/"), Some("a"));
        assert_eq!(hit(&r, "a.example.com:8080", "/"), Some("a"));
        assert_eq!(hit(&r, "a.example.com.", "/"), Some("a"));
        assert_eq!(hit(&r, "A.example.com.:80", "/"), Some("a"));
        assert_eq!(normalize_host("[::1]:8080"), "[::1]");
        assert_eq!(normalize_host("[::1]"), "[::1]");
    }

    #[test]
    fn chosen_vhost_without_match_falls_to_default_backend_not_to_any_host() {
        let r = T::new()
            .route("a.test", prefix("/api"), "a-api")
            .route("*", prefix("/"), "any")
            .default_backend("default")
            .compile();
        assert_eq!(hit(&r, "a.test", "/api/x"), Some("a-api"));
        assert_eq!(hit(&r, "a.test", "/other"), Some("default"));
        assert_eq!(hit(&r, "b.test", "/other"), Some("any"));
        assert!(r.lookup("a.test", "/other").unwrap().is_default());
    }

    #[test]
    fn no_vhost_and_no_default_is_none() {
        let r = T::new().route("a.test", prefix("/"), "a").compile();
        assert_eq!(hit(&r, "b.test", "/"), None);
        let r = T::new().route("a.test", prefix("/api"), "a").compile();
        assert_eq!(hit(&r, "a.test", "/"), None);
        let r = T::new().default_backend("default").compile();
        assert_eq!(hit(&r, "b.test", "/x"), Some("default"));
    }

    #[test]
    fn exact_path_beats_regex_and_prefix() {
        let r = T::new()
            .route("a.test", prefix("/foo"), "prefix")
            .route("a.test", regex("/fo+"), "regex")
            .route("a.test", exact("/foo"), "exact")
            .compile();
        assert_eq!(hit(&r, "a.test", "/foo"), Some("exact"));
        assert_eq!(hit(&r, "a.test", "/foo/"), Some("regex"));
    }

    #[test]
    fn regex_beats_prefix_even_shorter() {
        let r = T::new()
            .route("a.test", prefix("/api/v1/users"), "prefix")
            .route("a.test", regex("/api/.*"), "regex")
            .compile();
        assert_eq!(hit(&r, "a.test", "/api/v1/users"), Some("regex"));
        assert_eq!(hit(&r, "a.test", "/other"), None);
    }

    #[test]
    fn regex_is_anchored_at_start_and_longest_pattern_first() {
        let r = T::new()
            .route("a.test", regex("/a.*"), "short")
            .route("a.test", regex("/a/b/[0-9]+"), "long")
            .compile();
        assert_eq!(hit(&r, "a.test", "/a/b/42"), Some("long"));
        assert_eq!(hit(&r, "a.test", "/a/b/x"), Some("short"));
        assert_eq!(hit(&r, "a.test", "/x/a"), None, "anchored at the start");
    }

    #[test]
    fn longest_prefix_wins() {
        let r = T::new()
            .route("a.test", prefix("/"), "root")
            .route("a.test", prefix("/foo"), "foo")
            .route("a.test", prefix("/foo/bar"), "foobar")
            .compile();
        assert_eq!(hit(&r, "a.test", "/foo/bar/baz"), Some("foobar"));
        assert_eq!(hit(&r, "a.test", "/foo/baz"), Some("foo"));
        assert_eq!(hit(&r, "a.test", "/"), Some("root"));
        assert_eq!(hit(&r, "a.test", "/x"), Some("root"));
    }

    #[test]
    fn prefix_matches_element_wise() {
        let r = T::new().route("a.test", prefix("/foo"), "foo").compile();
        assert_eq!(hit(&r, "a.test", "/foo"), Some("foo"));
        assert_eq!(hit(&r, "a.test", "/foo/"), Some("foo"));
        assert_eq!(hit(&r, "a.test", "/foo/bar"), Some("foo"));
        assert_eq!(hit(&r, "a.test", "/foobar"), None);
        assert_eq!(hit(&r, "a.test", "/fo"), None);
        // A trailing slash on the prefix is ignored.
        let r = T::new().route("a.test", prefix("/foo/"), "foo").compile();
        assert_eq!(hit(&r, "a.test", "/foo"), Some("foo"));
        assert_eq!(hit(&r, "a.test", "/foobar"), None);
    }

    #[test]
    fn root_prefix_matches_everything() {
        let r = T::new().route("a.test", prefix("/"), "root").compile();
        for path in ["/", "/x", "/x/y/", "//"] {
            assert_eq!(hit(&r, "a.test", path), Some("root"), "{path}");
        }
    }

    #[test]
    fn exact_path_is_byte_for_byte() {
        let r = T::new().route("a.test", exact("/foo"), "exact").compile();
        assert_eq!(hit(&r, "a.test", "/foo"), Some("exact"));
        assert_eq!(hit(&r, "a.test", "/foo/"), None);
        assert_eq!(hit(&r, "a.test", "/Foo"), None);
    }

    #[test]
    fn literal_braces_in_paths_are_plain_bytes() {
        let r = T::new().route("a.test", prefix("/{id}"), "braces").compile();
        assert_eq!(hit(&r, "a.test", "/{id}/x"), Some("braces"));
        assert_eq!(hit(&r, "a.test", "/42"), None);
    }

    #[test]
    fn compile_errors() {
        let mut t = T::new().route("a.test", prefix("/"), "a").0;
        t.backends.clear();
        assert!(matches!(Router::compile(&t), Err(CompileError::UnknownBackend { .. })));
        let t = T::new().route("a.test", regex("(unclosed"), "a").0;
        assert!(matches!(Router::compile(&t), Err(CompileError::InvalidRegex { .. })));
        let mut t = T::new().route("a.test", prefix("/"), "a").0;
        t.hosts.push(t.hosts[0].clone());
        assert!(matches!(Router::compile(&t), Err(CompileError::DuplicateHost(_))));
        let mut t = T::new().0;
        t.default_backend = Some(id("missing"));
        assert!(matches!(Router::compile(&t), Err(CompileError::UnknownBackend { .. })));
    }

    fn with_method(mut t: T, host: &str, path: PathMatch, backend: &str, method: &str) -> T {
        t = t.route(host, path, backend);
        let host = HostMatch::parse(host).unwrap();
        let vh = t.0.hosts.iter_mut().find(|v| v.host == host).unwrap();
        let route = vh.routes.last_mut().unwrap();
        route.conditions = Some(Box::new(crate::model::RequestConditions {
            method: Some(method.into()),
            ..Default::default()
        }));
        t
    }

    fn hit_with<'a>(r: &'a Router, host: &str, path: &str, method: &str) -> Option<&'a str> {
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        let headers = http::HeaderMap::new();
        let view = RequestView { method: &method, headers: &headers, query: None, tls: false, path };
        r.lookup_request(host, path, Some(&view))
            .map(|route| r.backend_ids()[route.backend.0 as usize].service.as_str())
    }

    /// `HTTPRouteRule.matches`: among routes with one path, the first in table order whose
    /// conditions hold wins; when none holds the next shorter prefix is tried ("continuing on
    /// ties" of the precedence list, path first).
    #[test]
    fn conditions_share_a_path_and_fall_through_to_shorter_prefix() {
        let mut t = T::new().route("a.test", prefix("/"), "root");
        t = with_method(t, "a.test", prefix("/api"), "post", "POST");
        t = with_method(t, "a.test", prefix("/api"), "get", "GET");
        t = with_method(t, "a.test", exact("/x"), "exact-put", "PUT");
        let r = t.compile();
        assert_eq!(hit_with(&r, "a.test", "/api/v1", "POST"), Some("post"));
        assert_eq!(hit_with(&r, "a.test", "/api/v1", "GET"), Some("get"));
        assert_eq!(hit_with(&r, "a.test", "/api/v1", "DELETE"), Some("root"));
        assert_eq!(hit_with(&r, "a.test", "/x", "PUT"), Some("exact-put"));
        assert_eq!(hit_with(&r, "a.test", "/x", "GET"), Some("root"));
        // Without the request, routes with conditions never match.
        assert_eq!(hit(&r, "a.test", "/api/v1"), Some("root"));
    }

    /// Gateway API `Listener.hostname` / `HTTPRouteSpec.hostnames`: `*.example.com` matches
    /// `test.example.com` and `foo.test.example.com`, not `example.com`; the longest matching
    /// hostname wins ("Characters in a matching hostname"); exact and Ingress one-label
    /// wildcards are tried first.
    #[test]
    fn suffix_hosts_match_any_depth_longest_first() {
        let mut r = T::new().route("x.example.com", prefix("/"), "exact").0;
        for (suffix, name) in [("example.com", "deep"), ("b.example.com", "deeper")] {
            r.hosts.push(VirtualHost {
                host: HostMatch::Suffix(suffix.into()),
                routes: vec![Route {
                    path: prefix("/"),
                    action: RouteAction::Forward(id(name)),
                    policy: RoutePolicy::default(),
                    origin: ObjectRef::new("ns", name),
                    conditions: None,
                    rule: None,
                }],
                fallback: Vec::new(),
            });
            r = T(r).backend(name).0;
        }
        let r = Router::compile(&r).unwrap();
        assert_eq!(hit(&r, "x.example.com", "/"), Some("exact"));
        assert_eq!(hit(&r, "y.example.com", "/"), Some("deep"));
        assert_eq!(hit(&r, "a.y.example.com", "/"), Some("deep"));
        assert_eq!(hit(&r, "a.b.example.com", "/"), Some("deeper"));
        assert_eq!(hit(&r, "z.a.b.example.com", "/"), Some("deeper"));
        assert_eq!(hit(&r, "b.example.com", "/"), Some("deep"));
        assert_eq!(hit(&r, "example.com", "/"), None);
    }

    /// `HTTPRouteSpec.hostnames`: "precedence must be given to rules from the HTTPRoute with
    /// the largest number of: Characters in a matching non-wildcard hostname. Characters in a
    /// matching hostname." A virtual host's own routes are tried first, whatever the paths of
    /// its fallback tiers; a request none of them matches (path or conditions) goes to the
    /// tiers in order; the default backend only after every tier.
    #[test]
    fn fallback_tiers_are_tried_after_the_hosts_own_routes_in_order() {
        let mut t = T::new().route("foo.example.com", prefix("/app"), "own");
        t = with_method(t, "foo.example.com", prefix("/api"), "own-post", "POST");
        let mut t = t.backend("wild").backend("any").backend("default").default_backend("default").0;
        let route = |path: PathMatch, name: &str| Route {
            path,
            action: RouteAction::Forward(id(name)),
            policy: RoutePolicy::default(),
            origin: ObjectRef::new("ns", name),
            conditions: None,
            rule: None,
        };
        let own = t.hosts.iter_mut().find(|v| v.host == HostMatch::Exact("foo.example.com".into())).unwrap();
        own.fallback = vec![
            crate::model::Fallback {
                from: HostMatch::Suffix("example.com".into()),
                routes: vec![route(prefix("/app/admin"), "wild"), route(exact("/wild"), "wild")],
            },
            crate::model::Fallback {
                from: HostMatch::Any,
                routes: vec![route(prefix("/app/admin/deeper"), "any"), route(prefix("/any"), "any")],
            },
        ];
        let r = Router::compile(&t).unwrap();
        // Own routes first, even against a longer prefix in a tier.
        assert_eq!(hit_with(&r, "foo.example.com", "/app/admin/deeper/x", "GET"), Some("own"));
        assert_eq!(hit_with(&r, "foo.example.com", "/api", "POST"), Some("own-post"));
        // Nothing of its own matches: the first tier that does.
        assert_eq!(hit_with(&r, "foo.example.com", "/wild", "GET"), Some("wild"));
        assert_eq!(hit_with(&r, "foo.example.com", "/api", "GET"), Some("default"));
        assert_eq!(hit_with(&r, "foo.example.com", "/any/x", "GET"), Some("any"));
        // After every tier, the default backend.
        assert_eq!(hit_with(&r, "foo.example.com", "/nothing", "GET"), Some("default"));
        // Updating the host recompiles its tiers too.
        let mut t2 = t.clone();
        let own = t2.hosts.iter_mut().find(|v| v.host == HostMatch::Exact("foo.example.com".into())).unwrap();
        own.fallback.remove(0);
        let changes = TableChanges::between(&t, &t2);
        let updated = r.update(&t2, &changes, &LimiterCache::default()).unwrap();
        assert_eq!(hit_with(&updated, "foo.example.com", "/wild", "GET"), Some("default"));
        assert_eq!(hit_with(&updated, "foo.example.com", "/any", "GET"), Some("any"));
    }

    #[test]
    fn split_routes_compile_with_unresolved_shares() {
        let mut t = T::new().backend("one").0;
        t.hosts.push(VirtualHost {
            host: HostMatch::parse("a.test").unwrap(),
            routes: vec![Route {
                path: prefix("/"),
                action: RouteAction::Split(vec![
                    crate::model::WeightedBackend { backend: None, weight: 1, request_headers: None },
                    crate::model::WeightedBackend {
                        backend: Some(id("one")),
                        weight: 1,
                        request_headers: None,
                    },
                ]),
                policy: RoutePolicy::default(),
                origin: ObjectRef::new("ns", "r"),
                conditions: None,
                rule: None,
            }],
            fallback: Vec::new(),
        });
        let r = Router::compile(&t).unwrap();
        let route = r.lookup("a.test", "/").unwrap();
        assert_eq!(r.backend_ids()[route.backend.0 as usize].service, "one");
        let split = route.split.as_ref().unwrap();
        assert_eq!(split.pick(0), None);
        assert_eq!(split.pick(1), r.backend_index(&id("one")));
    }

    /// What a router answers for every host and path of a small vocabulary: the backend (by
    /// name), the route's path and whether it is the default backend.
    fn answers(r: &Router) -> Vec<Option<(String, Option<PathMatch>)>> {
        let mut out = Vec::new();
        for host in ["a.test", "b.test", "c.test", "x.wild.test", "other.test"] {
            for path in ["/", "/api", "/api/v1", "/x"] {
                out.push(r.lookup(host, path).map(|route| {
                    (r.backend_ids()[route.backend.0 as usize].service.clone(), route.path.clone())
                }));
            }
        }
        out
    }

    /// A router updated with the changes of each step of random table edits answers like one
    /// compiled from scratch, and keeps the index of every backend that stays.
    #[test]
    fn update_matches_compiling_from_scratch() {
        let hosts = ["a.test", "b.test", "c.test", "*.wild.test", "*"];
        let paths = [prefix("/"), prefix("/api"), exact("/api/v1"), regex("/x.*")];
        let backends = ["one", "two", "three", "four"];
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let mut table = T::new().0;
        let mut router = Router::compile(&table).unwrap();
        for step in 0..500 {
            let old = table.clone();
            let host = HostMatch::parse(hosts[next(hosts.len())]).unwrap();
            let backend = backends[next(backends.len())];
            match next(5) {
                0 => table.hosts.retain(|v| v.host != host),
                1 => {
                    let path = paths[next(paths.len())].clone();
                    table = T(table).route(&host.to_string(), path, backend).0;
                }
                2 => {
                    table.backends.remove(&id(backend));
                    table
                        .hosts
                        .retain(|v| v.routes.iter().all(|r| r.action != RouteAction::Forward(id(backend))));
                    if table.default_backend == Some(id(backend)) {
                        table.default_backend = None;
                    }
                }
                3 => {
                    if let Some(b) = table.backends.get_mut(&id(backend)) {
                        b.target = Target::Endpoints(vec![Endpoint::new(
                            format!("127.0.0.{}:1", next(9) + 1).parse().unwrap(),
                        )]);
                    }
                }
                _ => table = T(table).default_backend(backend).0,
            }
            let changes = TableChanges::between(&old, &table);
            let updated = router.update(&table, &changes, &LimiterCache::default()).unwrap();
            let fresh = Router::compile(&table).unwrap();
            assert_eq!(answers(&updated), answers(&fresh), "step {step}: {changes:?}");
            for id in table.backends.keys() {
                if old.backends.contains_key(id) {
                    assert_eq!(
                        updated.backend_index(id),
                        router.backend_index(id),
                        "step {step}: {id} moved"
                    );
                }
                assert_eq!(updated.backend_ids()[updated.backend_index(id).unwrap().0 as usize], *id);
            }
            assert!(updated.backend_ids().len() <= backends.len(), "gone backends' indexes are reused");
            for id in updated.backend_ids() {
                assert!(id.service.is_empty() || table.backends.contains_key(id), "step {step}: stale {id}");
            }
            router = updated;
        }
    }
}
