//! Forwarding one request: route, pick an endpoint, apply the header policy, send with retries on
//! connect errors, and turn failures into the proxy's own responses.
//!
//! Header policy (ingress-nginx defaults, `use-forwarded-headers: false`):
//! - hop-by-hop headers are removed both ways (RFC 9110 §7.6.1): `Connection` and the headers it
//!   lists, `Keep-Alive`, `Proxy-Connection`, `TE` (`te: trailers` kept towards h2c),
//!   `Transfer-Encoding`, `Upgrade` (kept on upgrade requests and 101 responses),
//!   `Proxy-Authorization`, `Proxy-Authenticate`;
//! - `Host` is preserved: the host the request was routed on (the `Host` header, or the
//!   authority of h2 and absolute-form requests), sent as `Host` over HTTP/1.1 and as
//!   `:authority` over h2c;
//! - `X-Forwarded-For` and `X-Real-IP` are the client's IP, overwriting what the client sent so
//!   it cannot spoof them; `X-Forwarded-Proto`, `-Host`, `-Port` describe this listener;
//! - `X-Request-ID` is kept if present, else generated (32 hex characters).
//!
//! Retries (`proxy-next-upstream`, ingress-nginx's `error timeout` by default; 3 tries): a
//! request goes to another endpoint, never one already tried, when a listed condition happens
//! ([`super::Retry`]). Connect errors and connect timeouts, where nothing was sent, retry any
//! request: the client connects before it takes the request, and hands it back (body unread).
//! Once sent, a request goes again only when its method is idempotent (or `non_idempotent` is
//! listed) and its body is empty or small enough to have been read whole first
//! ([`RESEND_BODY_MAX`]); a listed status's answer is dropped, and the last try's answer stands.
//! A response whose head reached the client is never retried. `$upstream_addr` lists every
//! endpoint tried.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::header::{
    AUTHORIZATION, CONNECTION, CONTENT_LENGTH, HOST, HeaderMap, HeaderName, HeaderValue, LOCATION,
    STRICT_TRANSPORT_SECURITY, UPGRADE, WWW_AUTHENTICATE,
};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use super::accesslog;
use super::accesslog_auth;
use super::accesslog_upstream;
use super::compress::{self, Encoded};
use super::deadline::{Deadline, Deadlines};
use super::error::{BoxError, ProxyBody, ProxyError, grpc_local_response, is_grpc, local_response};
use super::headers::{
    Forwarded, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PORT, X_FORWARDED_PROTO, X_REQUEST_ID,
    connection_tokens, hide_headers, request_id, strip_hop_by_hop,
};
use super::metered::{Meter, Metered};
use super::upstream::body::{BodyTimedOut, BodyTooLarge, UpstreamBody};
use super::upstream::client::{ResponseBody, SendError, Target};
use super::upstream::conn::{Exchange, is_send_timeout};
use super::upstream::{Balancer, EndpointState};
use super::{Compiled, Proxy, ProxyConfig, extauth, mirror, upgrade};
use crate::hashkey;
use crate::metrics::UpstreamEvent;
use crate::model::{ClientVerify, RetryOn};
use crate::route::auth;
use crate::route::cors::CompiledCors;
use crate::route::filters::CompiledEdits;
use crate::route::policy::{CompiledBalance, CompiledPolicy, Verdict, set_headers};
use crate::route::retry::Retry;
use crate::route::router::CompiledRoute;
use crate::state::balance::BackendIdx;
use crate::state::connlimit::Slot;
use crate::state::throttle::Shaped;
use crate::tls::listeners::Verdict as ListenerVerdict;
use crate::uri_path;
use crate::vars::RequestView;

const X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");
const SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// `X-Forwarded-Proto`'s values (statics: the request's future holds references).
static HTTPS: HeaderValue = HeaderValue::from_static("https");
static HTTP: HeaderValue = HeaderValue::from_static("http");

/// Upper bound on [`super::ProxyConfig::connect_tries`] (the tried endpoints live on the stack).
pub(super) const MAX_TRIES: usize = crate::model::filters::Retries::MAX_ATTEMPTS as usize + 1;

/// Largest request body read whole before the first try so that a retry can send it again
/// (declared by `Content-Length`); larger bodies are streamed, and retried only when nothing
/// was sent.
pub(super) const RESEND_BODY_MAX: u64 = 64 * 1024;

/// What a connection knows once, reused by each of its requests.
pub(super) struct ConnCtx {
    pub(super) proxy: Proxy,
    pub(super) peer: SocketAddr,
    /// The client IP, for `X-Forwarded-For` / `X-Real-IP`.
    pub(super) client_ip: HeaderValue,
    /// The listener port, for `X-Forwarded-Port`.
    pub(super) listener_port: HeaderValue,
    /// Whether the connection came over TLS (`X-Forwarded-Proto: https`).
    pub(super) https: bool,
    /// The client certificate judged at the handshake, on connections to mTLS hosts.
    pub(super) client_cert: Option<crate::tls::mtls::ClientCert>,
    /// Requests served so far (counted only under `keep-alive-requests`).
    pub(super) requests: AtomicU32,
    /// The response-head deadline of an HTTP/1 connection's requests (one at a time).
    pub(super) upstream_deadline: Deadline,
    /// Those of an HTTP/2 connection's streams (one lent to each stream's wait).
    pub(super) stream_deadlines: Deadlines,
    /// The TLS version and cipher suite of an HTTPS connection (`$ssl_protocol`, `$ssl_cipher`).
    pub(super) ssl: Option<accesslog::Ssl>,
    /// The ClientHello's SNI, kept only while the table has Gateway HTTPS listeners: the
    /// listener it chose decides which hosts the connection may ask for
    /// ([`crate::tls::listeners`]).
    pub(super) sni: Option<Box<str>>,
}

const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
const SSL_CLIENT_CERT: HeaderName = HeaderName::from_static("ssl-client-cert");
const SSL_CLIENT_VERIFY: HeaderName = HeaderName::from_static("ssl-client-verify");
const SSL_CLIENT_SUBJECT_DN: HeaderName = HeaderName::from_static("ssl-client-subject-dn");
const SSL_CLIENT_ISSUER_DN: HeaderName = HeaderName::from_static("ssl-client-issuer-dn");

// === impl ConnCtx ===

impl ConnCtx {
    /// Serves one request; never fails (errors become local responses).
    pub(super) async fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Response<Metered<ProxyBody>> {
        let start = Instant::now();
        let state = self.proxy.inner.state.load_full();
        // The request as the client sent it (before weir adds an `X-Request-ID`).
        let meter =
            Meter::of(&req, self.proxy.inner.config.metrics.enabled, state.config.access_log.is_some());
        let request_id = request_id(req.headers_mut());
        let grpc = is_grpc(req.headers());
        let seen = self.before(&state.config, &mut req);
        let outcome = self.forward(&state, req, start, &request_id, &meter).await;
        let mut resp = match outcome {
            Ok(resp) => resp,
            Err(err) => {
                let status = err.status();
                tracing::debug!(
                    peer = %self.peer,
                    version = state.version,
                    status = status.as_u16(),
                    error = %err,
                    source = ?err.source_kind(),
                    elapsed_ms = start.elapsed().as_millis() as u64,
                    "request answered locally"
                );
                let mut resp = if grpc {
                    grpc_local_response(status, err.grpc_code(), request_id.clone())
                } else {
                    local_response(status, request_id.clone())
                };
                set_headers(resp.headers_mut(), &state.config.response_headers);
                resp
            }
        };
        if self.https
            && let Some(hsts) = &state.config.hsts
        {
            resp.headers_mut().insert(STRICT_TRANSPORT_SECURITY, hsts.clone());
        }
        let log = self.after(&state, seen, &mut resp, &request_id);
        meter.finish(resp, state, start, log)
    }

    async fn forward(
        &self,
        state: &Compiled,
        mut req: Request<Incoming>,
        start: Instant,
        request_id: &HeaderValue,
        meter: &Meter,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        // `large-client-header-buffers`, `http2-max-field-size`: lines longer than one buffer.
        // A request that fails before a route takes it still gets its span (`unrouted`).
        super::client_limits::check(&state.config.client_limits, &req)
            .map_err(|e| self.unrouted(state, &req, meter, e))?;
        // `block-user-agents`, `block-referers`: before anything else, in every server.
        if let Some(lists) = &state.config.blocklists
            && lists.blocks(req.headers())
        {
            return Err(self.unrouted(state, &req, meter, ProxyError::Forbidden));
        }
        let host = match request_host(&req).map_err(|e| self.unrouted(state, &req, meter, e))? {
            Some(host) => host,
            // `Host` is optional in HTTP/1.0: such a request is for no name in particular, so
            // host-less rules (or the default backend) serve it, as nginx's `server_name _`
            // server does, and `_` is the host passed on.
            None if req.version() <= Version::HTTP_10 && !req.headers().contains_key(HOST) => {
                HeaderValue::from_static("_")
            }
            None => return Err(self.unrouted(state, &req, meter, ProxyError::NoHost)),
        };
        // The host as text, once for every phase (`request_host` admits only visible ASCII).
        let host_str = host.to_str().map_err(|_| self.unrouted(state, &req, meter, ProxyError::NoHost))?;
        // Gateway API `Listener.hostname` (RFC 7540 §9.1.2): a request for a name another
        // listener serves is misdirected; one for a name no listener serves is not found.
        if let Some(sni) = self.sni.as_deref()
            && !state.listeners.is_empty()
        {
            let name = crate::http_util::normalize_host(host_str);
            match state.listeners.check(sni, &name) {
                ListenerVerdict::Route => {}
                ListenerVerdict::Misdirected => {
                    return Err(self.unrouted(state, &req, meter, ProxyError::OtherListener));
                }
                ListenerVerdict::NoListener => {
                    return Err(self.unrouted(state, &req, meter, ProxyError::NoRoute));
                }
            }
        }
        // Routes and policies see the normalized path (decoded, dot segments resolved, slashes
        // merged); the upstream gets the target as sent. Owned only when it differs.
        let normalized = match uri_path::normalize(req.uri().path(), state.config.paths)
            .map_err(|e| self.unrouted(state, &req, meter, e.into()))?
        {
            Cow::Borrowed(_) => None,
            Cow::Owned(path) => Some(path),
        };
        let path = normalized.as_deref().unwrap_or(req.uri().path());
        // Gateway API conditions (method, headers, query) are only read by routes that have them.
        // (The view is gone before the first await: it takes no room in the request's future.)
        let route = {
            let view = crate::route::conditions::RequestView {
                method: req.method(),
                headers: req.headers(),
                query: req.uri().query(),
                tls: self.https,
                path,
            };
            state.router.lookup_request(host_str, path, Some(&view))
        };
        let route = route.ok_or_else(|| self.unrouted(state, &req, meter, ProxyError::NoRoute))?;
        meter.route(&route.stats);
        if route.policy.as_deref().is_some_and(|p| p.access_log_off) {
            meter.quiet();
        }
        // `custom-http-errors`: what the error page backend is told about the request (boxed:
        // it waits across the exchange, and most routes have none).
        let custom = route.policy.as_deref().and_then(|p| p.custom_errors.as_ref()).map(|(codes, pages)| {
            let header = |name: HeaderName| req.headers().get(name).cloned();
            let original = Box::new(ErrorContext {
                uri: req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_owned(),
                format: header(http::header::ACCEPT),
                origin: route.origin.clone(),
                service: state.router.backend_ids().get(route.backend.0 as usize).cloned(),
            });
            (codes, *pages, original)
        });
        let ctx = RequestCtx {
            state,
            route,
            policy: route.policy.as_deref(),
            request_id,
            start,
            host: &host,
            host_str,
            normalized: normalized.as_deref(),
            client: self.client(&state.config, req.headers()),
            meter,
        };
        // OpenTelemetry: the request's span; its context goes on in the request's headers.
        if let Some(pipeline) = &state.tracing {
            let arrival = super::traced::Arrival {
                host: host_str,
                client: ctx.client.ip,
                https: ctx.client.https,
                port: self.listener_port.to_str().ok().and_then(|p| p.parse().ok()).unwrap_or(0),
            };
            if let Some(span) = super::traced::start(pipeline, state, route, &mut req, &arrival) {
                meter.span(span);
            }
        }
        // The phases, pingora's: the request filter answers instead of forwarding, or admits
        // the request; `upstream` runs the rest (peer, upstream request, exchange, response
        // filter).
        let mut auth_cookies = Vec::new();
        let filtered = self.request_filter(&ctx, &mut req, &mut auth_cookies).await;
        let mut result = match filtered {
            Ok(Filtered::Forward(admitted)) => self.upstream(&ctx, admitted, req).await,
            Ok(Filtered::Answer(resp)) => Ok(resp),
            Err(error) => Err(error),
        };
        // The authentication service's cookies, on the answer (nginx's `add_header Set-Cookie`).
        if !auth_cookies.is_empty()
            && let (Ok(resp), Some(ext)) = (&mut result, ctx.policy.and_then(|p| p.external_auth.as_ref()))
            && extauth::cookies_apply(&ext.spec, resp.status())
        {
            for cookie in auth_cookies {
                resp.headers_mut().append(http::header::SET_COOKIE, cookie);
            }
        }
        let Some((codes, pages, original)) = custom else {
            return with_response_headers(&state.config, route, result);
        };
        let status = match &result {
            Ok(resp) => resp.status(),
            Err(err) => err.status(),
        };
        // Boxed, like every rare path: the request's future stays small.
        if codes.contains(&status.as_u16())
            && let Some(page) = Box::pin(self.error_page(state, pages, status, &original, request_id)).await
        {
            return with_response_headers(&state.config, route, Ok(page));
        }
        with_response_headers(&state.config, route, result)
    }

    /// Asks the error page backend for `GET /` about a request answered `status`; `None` when it
    /// cannot answer (the original answer stands).
    async fn error_page(
        &self,
        state: &Compiled,
        pages: crate::state::balance::BackendIdx,
        status: StatusCode,
        original: &ErrorContext,
        request_id: &HeaderValue,
    ) -> Option<Response<ProxyBody>> {
        let balancer = state.balancers.get(pages.0 as usize)?;
        let endpoint = &balancer.endpoints()[balancer.pick()?];
        let authority = endpoint.authority()?.clone();
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .ok()?;
        let mut req = Request::get(uri).body(UpstreamBody::empty()).ok()?;
        let headers = req.headers_mut();
        headers.insert(HOST, HeaderValue::from_str(authority.as_str()).ok()?);
        headers.insert(HeaderName::from_static("x-code"), HeaderValue::from(status.as_u16()));
        if let Some(format) = &original.format {
            headers.insert(HeaderName::from_static("x-format"), format.clone());
        }
        if let Ok(uri) = HeaderValue::from_str(&original.uri) {
            headers.insert(HeaderName::from_static("x-original-uri"), uri);
        }
        if let Some(origin) = &original.origin {
            let pairs =
                [("x-namespace", origin.namespace.as_str()), ("x-ingress-name", origin.name.as_str())];
            for (name, value) in pairs {
                if let Ok(v) = HeaderValue::from_str(value) {
                    headers.insert(HeaderName::from_static(name), v);
                }
            }
        }
        if let Some(service) = &original.service {
            if let Ok(v) = HeaderValue::from_str(&service.service) {
                headers.insert(HeaderName::from_static("x-service-name"), v);
            }
            if let Ok(v) = HeaderValue::from_str(&service.port.to_string()) {
                headers.insert(HeaderName::from_static("x-service-port"), v);
            }
        }
        headers.insert(X_REQUEST_ID, request_id.clone());
        let timeout = state.config.upstream_timeout;
        let sent = tokio::time::timeout(
            timeout,
            self.proxy.inner.clients.send(
                Target {
                    protocol: balancer.protocol(),
                    endpoint,
                    tls: balancer.tls(),
                    host: authority.host(),
                },
                req,
                Exchange::of(&state.config),
                None,
            ),
        );
        match sent.await {
            Ok(Ok(resp)) => self.response(resp, None, false).ok(),
            Ok(Err(error)) => {
                tracing::debug!(upstream = %endpoint.key(), %error, "custom error backend failed");
                None
            }
            Err(_) => None,
        }
    }

    // --- phase 1: the request filter ---

    /// What answers instead of forwarding, in ingress-nginx's order: redirects, the client
    /// certificate, the body limit, a CORS preflight, rate and connection limits, address rules,
    /// basic and external authentication.
    async fn request_filter<'a>(
        &'a self,
        ctx: &'a RequestCtx<'a>,
        req: &mut Request<Incoming>,
        auth_cookies: &mut Vec<HeaderValue>,
    ) -> Result<Filtered<'a>, ProxyError> {
        if let Some(resp) = self.redirects(ctx, req) {
            return Ok(Filtered::Answer(resp));
        }
        // Gateway API: a rule that cannot be served, then `RequestRedirect`.
        if let Some(filters) = ctx.policy.and_then(|p| p.filters.as_deref()) {
            if let Some(status) = filters.respond {
                return Err(ProxyError::RuleRefused(status));
            }
            let path = ctx.normalized.unwrap_or(req.uri().path());
            if let Some((code, location)) =
                filters.redirect(ctx.client.https, ctx.host_str, path, req.uri().query())
            {
                let mut resp = local_response(code, ctx.request_id.clone());
                resp.headers_mut().insert(LOCATION, location);
                return Ok(Filtered::Answer(resp));
            }
        }
        // mTLS first: the client certificate is part of the connection, checked before any policy.
        match self.client_auth(ctx.state, ctx.host_str, req.headers_mut()) {
            Ok(()) => {}
            // `auth-tls-error-page`: a missing or invalid certificate is sent there instead.
            Err((ProxyError::ClientCertRequired | ProxyError::ClientCertInvalid, Some(page))) => {
                let mut resp = local_response(StatusCode::FOUND, ctx.request_id.clone());
                resp.headers_mut().insert(LOCATION, page);
                return Ok(Filtered::Answer(resp));
            }
            Err((error, _)) => return Err(error),
        }
        let admitted = match self.limits(ctx, req)? {
            Filtered::Forward(admitted) => admitted,
            answer => return Ok(answer),
        };
        if let Some(limiter) = ctx.policy.and_then(|p| p.global_limit.as_ref()) {
            let request_uri = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
            let view = RequestView {
                scheme: self.scheme(),
                host: ctx.host_str,
                method: req.method(),
                request_uri,
                client: ctx.client.ip,
                headers: req.headers(),
            };
            if !limiter.allow(&view, ctx.client.ip).await {
                return Err(ProxyError::RateLimited(limiter.status));
            }
        }
        if let Some(resp) = self.access(ctx, req, auth_cookies).await? {
            return Ok(Filtered::Answer(resp));
        }
        Ok(Filtered::Forward(admitted))
    }

    /// The HTTPS redirect (first, as in ingress-nginx's locations), then
    /// `from-to-www-redirect`.
    fn redirects(&self, ctx: &RequestCtx<'_>, req: &Request<Incoming>) -> Option<Response<ProxyBody>> {
        if ctx.route.ssl_redirect && !ctx.client.https {
            let preserve = ctx.policy.is_some_and(|p| p.preserve_trailing_slash);
            return Some(self.https_redirect(ctx.host_str, req, preserve));
        }
        let target = ctx.policy.and_then(|p| p.host_redirect.as_deref())?;
        Some(self.host_redirect(target, req, ctx.request_id))
    }

    /// The declared body against the limit, a CORS preflight (answered here; other requests get
    /// the CORS headers on the response), the rate limit and `limit-connections` (a place held
    /// until the response has gone out, or is dropped).
    fn limits<'a>(
        &self,
        ctx: &'a RequestCtx<'a>,
        req: &Request<Incoming>,
    ) -> Result<Filtered<'a>, ProxyError> {
        let policy = ctx.policy;
        if let Some(limit) = ctx.body_limit()
            && declared_length(req.headers()).is_some_and(|n| n > limit)
        {
            return Err(ProxyError::PayloadTooLarge);
        }
        let cors = policy
            .and_then(|p| p.cors.as_ref())
            .and_then(|c| c.allow_origin(req.headers().get(http::header::ORIGIN)).map(|origin| (c, origin)));
        if let Some((cors, origin)) = &cors
            && req.method() == http::Method::OPTIONS
        {
            let mut resp = local_response(StatusCode::NO_CONTENT, ctx.request_id.clone());
            *resp.body_mut() = Either::Right(Full::new(Bytes::new()));
            let headers = resp.headers_mut();
            headers.remove(CONTENT_LENGTH);
            headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            cors.add_headers(headers, origin.clone(), true);
            return Ok(Filtered::Answer(resp));
        }
        if let Some(limiter) = policy.and_then(|p| p.rate_limit.as_ref())
            && !limiter.allow(ctx.client.ip, Instant::now())
        {
            return Err(ProxyError::RateLimited(limiter.status));
        }
        let slot = match policy.and_then(|p| p.conn_limit.as_ref()) {
            Some(limiter) => {
                limiter.acquire(ctx.client.ip).map_err(|_| ProxyError::ConnLimited(limiter.status))?
            }
            None => None,
        };
        Ok(Filtered::Forward(Admitted { cors, slot }))
    }

    /// The route's address rules and redirects (`app-root`), then basic and external
    /// authentication, as nginx's access phase (`satisfy all`). `Some` answers the request.
    async fn access(
        &self,
        ctx: &RequestCtx<'_>,
        req: &mut Request<Incoming>,
        auth_cookies: &mut Vec<HeaderValue>,
    ) -> Result<Option<Response<ProxyBody>>, ProxyError> {
        let Some(policy) = ctx.policy else { return Ok(None) };
        match policy.check(ctx.client.ip, ctx.normalized.unwrap_or(req.uri().path())) {
            Some(Verdict::Redirect(code, location)) => {
                let mut resp = local_response(code, ctx.request_id.clone());
                resp.headers_mut().insert(LOCATION, location);
                return Ok(Some(resp));
            }
            Some(Verdict::Forbidden) => return Err(ProxyError::Forbidden),
            None => {}
        }
        if let Some((auth, challenge)) = &policy.basic_auth
            && auth::check(auth, req.headers().get(AUTHORIZATION)).await == auth::Outcome::Denied
        {
            let mut resp = local_response(StatusCode::UNAUTHORIZED, ctx.request_id.clone());
            resp.headers_mut().insert(WWW_AUTHENTICATE, challenge.clone());
            return Ok(Some(resp));
        }
        let Some(ext) = &policy.external_auth else { return Ok(None) };
        let request_uri = req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
        let original = RequestView {
            scheme: self.scheme(),
            host: ctx.host_str,
            method: req.method(),
            request_uri: &request_uri,
            client: ctx.client.ip,
            headers: req.headers(),
        };
        let clients = &self.proxy.inner.clients;
        let cache = policy.auth_cache.as_deref();
        let timeout = ctx.state.config.upstream_timeout;
        let request = &*req;
        let decision = async move {
            // `enable-auth-access-log`: the subrequest's own line.
            let log_auth = accesslog_auth::format(ctx.state);
            let mut asked = None;
            let report = log_auth.is_some().then_some(&mut asked);
            let decided =
                extauth::decide(clients, timeout, ext, cache, &original, ctx.request_id, report).await;
            if let (Some(format), Some(asked)) = (log_auth, asked) {
                let of = accesslog_auth::For {
                    req: request,
                    client: ctx.client.ip,
                    request_id: ctx.request_id,
                    origin: ctx.route.origin.as_ref(),
                    peer: self.peer,
                    ssl: self.ssl,
                    https: self.https,
                    listener_port: &self.listener_port,
                };
                accesslog_auth::write(ctx.state, format, of, asked);
            }
            decided
        };
        match Box::pin(decision).await {
            (extauth::Decision::Allow(copy), cookies) => {
                for (name, value) in copy {
                    req.headers_mut().insert(name, value);
                }
                *auth_cookies = cookies;
                Ok(None)
            }
            (extauth::Decision::Deny(status, headers), cookies) => {
                let mut resp = local_response(status, ctx.request_id.clone());
                resp.headers_mut().extend(headers);
                if extauth::cookies_apply(&ext.spec, status) {
                    for cookie in cookies {
                        resp.headers_mut().append(http::header::SET_COOKIE, cookie);
                    }
                }
                Ok(Some(resp))
            }
        }
    }

    // --- phase 2: the upstream peer ---

    /// The backend (the route's, or its canary's) and how its endpoint is picked, decided from
    /// the request as the client sent it.
    fn upstream_peer<'a>(
        &self,
        ctx: &'a RequestCtx<'a>,
        req: &Request<Incoming>,
    ) -> Result<Peer<'a>, ProxyError> {
        let (state, route, policy) = (ctx.state, ctx.route, ctx.policy);
        let balance = policy.map_or(&CompiledBalance::RoundRobin, |p| &p.balance);
        // The endpoint id the affinity cookie names, read once for the canary and the pick.
        let session = match balance {
            CompiledBalance::Cookie { name, .. } => {
                hashkey::cookie(req.headers(), name).and_then(|v| u64::from_str_radix(v, 16).ok())
            }
            _ => None,
        };
        // A split share's own request header edits (`HTTPBackendRef.filters`).
        let mut share_edits = None;
        // A canary may take the request instead of the route's own backend; a session pinned by
        // the affinity cookie to an endpoint of either stays there (`affinity-canary-behavior:
        // sticky`, ingress-nginx's default).
        let backend = match policy.and_then(|p| p.canary.as_ref()) {
            Some(canary) => {
                let sticky = matches!(balance, CompiledBalance::Cookie { sticky_canary: true, .. });
                let holds = |b: BackendIdx, id: u64| {
                    state.balancers.get(b.0 as usize).is_some_and(|bal| bal.by_id(id).is_some())
                };
                match session.filter(|_| sticky) {
                    Some(id) if holds(route.backend, id) => route.backend,
                    Some(id) if holds(canary.backend, id) => canary.backend,
                    _ if canary.selects(req.headers(), rand::random()) => canary.backend,
                    _ => route.backend,
                }
            }
            None => match &route.split {
                // A Gateway API split: a share by weight; an unresolved one answers 500.
                Some(split) => {
                    let (backend, edits) =
                        split.pick_share(rand::random()).ok_or(ProxyError::UnresolvedBackend)?;
                    share_edits = edits;
                    backend
                }
                None => route.backend,
            },
        };
        let balancer: &Balancer = state.balancers.get(backend.0 as usize).ok_or(ProxyError::NoRoute)?;
        let pick = match balance {
            CompiledBalance::RoundRobin => Pick::RoundRobin,
            CompiledBalance::Ewma => Pick::Ewma,
            CompiledBalance::Hash(key) => Pick::Hash(key.hash(&RequestView {
                scheme: self.scheme(),
                method: req.method(),
                client: ctx.client.ip,
                host: ctx.host_str,
                request_uri: req.uri().path_and_query().map_or("/", |pq| pq.as_str()),
                headers: req.headers(),
            })),
            CompiledBalance::Cookie { .. } => Pick::Sticky(session.and_then(|id| balancer.by_id(id))),
        };
        if balancer.is_empty() {
            return Err(ProxyError::NoEndpoints);
        }
        Ok(Peer { backend, balancer, balance, pick, edits: share_edits })
    }

    // --- phase 3: the upstream request ---

    /// The request head as the upstream gets it: hop-by-hop headers out, the upgrade
    /// handshake, the forwarded headers, the host, the rewritten path, the URI's form.
    fn upstream_request<'a>(
        &'a self,
        ctx: &'a RequestCtx<'a>,
        peer: &Peer<'a>,
        req: &mut Request<Incoming>,
    ) -> Result<Outgoing<'a>, ProxyError> {
        let config = &ctx.state.config;
        let policy = ctx.policy;
        let protocol = peer.balancer.protocol();
        let h2 = protocol.is_h2();
        // `mirror-*`: the copies' URLs are filled in from the request as the client sent it.
        let mirrored = policy
            .filter(|p| !p.mirrors.is_empty())
            .map(|_| req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_owned());
        // A WebSocket over HTTP/2 (RFC 8441 extended CONNECT) goes to an HTTP/1.1 upstream as
        // the classic GET + Upgrade handshake; the upstream's 101 becomes the client's 200.
        let h2_websocket = !h2 && is_h2_websocket(req);
        let one_at_a_time = req.version() < Version::HTTP_2;
        let is_upgrade = !h2 && (h2_websocket || is_upgrade_request(req));
        let downstream_upgrade = is_upgrade.then(|| hyper::upgrade::on(&mut *req));
        if h2_websocket {
            *req.method_mut() = http::Method::GET;
        }
        // To an HTTP/1.1 upstream the encoder writes the forwarded headers (see `forwarded`);
        // where the map is what goes out or is copied, or `proxy-set-headers` may override
        // them, they go in it.
        let request_edits =
            policy.and_then(|p| p.filters.as_deref()).and_then(|f| f.request_headers.as_ref());
        let encoded = !h2
            && mirrored.is_none()
            && config.upstream_headers.is_empty()
            && request_edits.is_none()
            && peer.edits.is_none();
        // `proxy-add-original-uri-header`: the request target as the client sent it.
        let original_uri = if config.original_uri_header {
            HeaderValue::from_str(req.uri().path_and_query().map_or("/", |pq| pq.as_str())).ok()
        } else {
            None
        };
        let headers = req.headers_mut();
        // Room for the headers set below, so the map grows (and rehashes) at most once.
        headers.reserve(if encoded { 3 } else { 8 });
        strip_hop_by_hop(headers, is_upgrade, h2);
        if is_upgrade {
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
        if h2_websocket {
            headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
            headers.insert(SEC_WEBSOCKET_KEY, websocket_key());
        }
        let mut forwarded = Forwarded {
            r#for: &self.client_ip,
            real_ip: &self.client_ip,
            proto: if self.https { &HTTPS } else { &HTTP },
            host: ctx.host,
            port: &self.listener_port,
        };
        if let Some(trusted) = &ctx.client.forwarded {
            trusted.apply(&mut forwarded);
        }
        if !encoded {
            forwarded.insert_into(headers);
        }
        if !config.upstream_keepalive && !h2 && !is_upgrade {
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(prefix) = policy.and_then(|p| p.forwarded_prefix.clone()) {
            headers.insert(X_FORWARDED_PREFIX, prefix);
        }
        if let Some(uri) = original_uri {
            headers.insert(X_ORIGINAL_URI, uri);
        }
        // `proxy-set-headers` (translation refuses Host and the framing headers).
        set_headers(headers, &config.upstream_headers);
        // Gateway API `RequestHeaderModifier`.
        if let Some(edits) = request_edits {
            edits.apply(headers);
        }
        // Then the backendRef's own (`HTTPBackendRef.filters`), for this backend only.
        if let Some(edits) = peer.edits {
            edits.apply(headers);
        }
        // `upstream-vhost` replaces the host the upstream sees (not `X-Forwarded-Host`).
        let upstream_host = policy.and_then(|p| p.upstream_host.clone()).unwrap_or_else(|| ctx.host.clone());
        // The host we routed on is what the upstream sees: for HTTP/1.1 the Host header (the same
        // value for ordinary requests; the authority for h2 clients, which send no Host, and for
        // absolute-form requests, whose Host must be ignored); for h2c the `:authority`.
        let h2_authority = if h2 {
            headers.remove(HOST);
            Some(Authority::try_from(upstream_host.as_bytes()).map_err(|_| ProxyError::NoHost)?)
        } else {
            headers.insert(HOST, upstream_host);
            None
        };
        *req.version_mut() = if h2 { Version::HTTP_2 } else { Version::HTTP_11 };
        *req.uri_mut() = upstream_uri(ctx, req.uri(), h2_authority, protocol.is_tls())?;
        Ok(Outgoing {
            forwarded,
            encoded,
            is_upgrade,
            h2_websocket,
            one_at_a_time,
            downstream_upgrade,
            mirrored,
        })
    }

    // --- phases 2 to 5, driven: the exchange, with retries ---

    /// What follows an admitted request: its upstream peer and upstream request phases, then the
    /// exchange with the picked endpoint and, under `proxy-next-upstream`, the next ones; the
    /// answer passes the response filter. (The request is moved in once: each async call it is
    /// moved into adds its size to the future every request carries.)
    async fn upstream<'a>(
        &'a self,
        ctx: &'a RequestCtx<'a>,
        admitted: Admitted<'a>,
        mut req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let peer = &self.upstream_peer(ctx, &req)?;
        if peer.backend != ctx.route.backend && ctx.route.split.is_none() {
            ctx.meter.canary_took_it();
        }
        let outgoing = self.upstream_request(ctx, peer, &mut req)?;
        let (parts, body) = req.into_parts();
        let config = &ctx.state.config;
        let balancer = peer.balancer;
        let protocol = balancer.protocol();
        // The name a TLS upstream is verified against, unless the backend configures one.
        let tls_host = if protocol.is_tls() { ctx.host_str } else { "" };
        // The fields of `outgoing` are used in place: moved into new bindings, they would take
        // room of their own in this future, which every request carries.
        let plan = RetryPlan::of(ctx, balancer, &parts.method, outgoing.is_upgrade);
        let (mut body, replay) =
            upstream_body(body, &plan, ctx.body_limit(), ctx.state.config.client_body_timeout).await?;
        if let Some(counter) = ctx.meter.body_counter() {
            body.count_into(counter.clone());
        }
        let head = replay.as_ref().map(|_| Head::of(&parts));
        if let Some(request_uri) = outgoing.mirrored.filter(|_| !outgoing.is_upgrade) {
            let wait = plan.opts.connect_timeout + plan.head_timeout;
            self.mirror(ctx, request_uri, &parts, &mut body, wait);
        }
        // A connect error hands the request back, unsent, for the next endpoint.
        let mut attempt = Request::from_parts(parts, body);
        let (mut tried, mut tries) = ([usize::MAX; MAX_TRIES], 0);
        // `$upstream_addr` and `$upstream_connect_time`: every endpoint tried before the one
        // that answers, nginx's way.
        let mut earlier = accesslog_upstream::Tried::default();
        // Whether another endpoint may take the request after `on` happened.
        let more = |tries: usize, sent: bool| {
            tries < plan.max_tries
                && (!sent || replay.is_some())
                && plan.until.is_none_or(|until| Instant::now() < until)
        };
        let again = |on: RetryOn, tries: usize, sent: bool| plan.retry.on(on) && more(tries, sent);

        loop {
            // Gateway API retries go to an endpoint already tried once every one was.
            let Some(idx) = peer
                .pick_untried(&tried[..tries])
                .or_else(|| gateway_retries(ctx).and_then(|_| peer.pick_untried(&[])))
            else {
                return Err(ProxyError::NoEndpoints);
            };
            tried[tries] = idx;
            tries += 1;
            let endpoint = &balancer.endpoints()[idx];
            // For the metrics, the debug log and the access log only: no clock read otherwise.
            let started = (config.metrics.enabled
                || config.access_log.is_some()
                || tracing::enabled!(tracing::Level::DEBUG))
            .then(Instant::now);
            // Latency is only measured where a route balances by it.
            let flight = matches!(peer.pick, Pick::Ewma).then(|| endpoint.start());
            // Boxed: this future would otherwise be part of every enclosing one, each moved
            // (copied whole) as the request's future is built and handed to hyper.
            let target = Target { protocol, endpoint, tls: balancer.tls(), host: tls_host };
            // Gateway API `retry.backoff`: "unsuccessful backend requests are not retried before
            // the configured minimum duration": a retry waits first, inside the boxed exchange
            // (an await out here would grow every request's future), the wait added to its
            // timeout below.
            let backoff = gateway_retries(ctx).map(|g| g.backoff).filter(|w| tries > 1 && !w.is_zero());
            let (clients, opts) = (&self.proxy.inner.clients, plan.opts);
            let forwarded = outgoing.encoded.then_some(&outgoing.forwarded);
            let exchange = Box::pin(async move {
                if let Some(wait) = backoff {
                    Box::pin(tokio::time::sleep(wait)).await;
                }
                clients.send(target, attempt, opts, forwarded).await
            });
            let mut head_timeout = plan.head_timeout + backoff.unwrap_or_default();
            if let Some(until) = plan.until.filter(|_| plan.until_bounds_tries) {
                head_timeout = head_timeout.min(until.saturating_duration_since(Instant::now()));
            }
            // An HTTP/1 client connection has one request at a time: its own lazily armed
            // timer waits for the response head (no timer-wheel work per request). HTTP/2
            // streams run concurrently, each with a timer lent by the connection for the wait.
            let sent = if outgoing.one_at_a_time {
                self.upstream_deadline.timeout(head_timeout, exchange).await.map_err(|_| ())
            } else {
                let deadline = self.stream_deadlines.lend();
                deadline.timeout(head_timeout, exchange).await.map_err(|_| ())
            };
            let (on, failure) = match sent {
                Ok(Ok(resp)) => {
                    if let Some(flight) = flight {
                        flight.answered();
                    }
                    let status = resp.status();
                    // `http_5xx` and friends: the answer is dropped (its connection closed unless
                    // it was complete) and the next endpoint asked; the last one's stands.
                    if (plan.retry.on_status(status)
                        || gateway_retries(ctx).is_some_and(|g| g.on_status(status)))
                        && more(tries, true)
                        && let Some((head, bytes)) = head.as_ref().zip(replay.as_ref())
                    {
                        ctx.count(peer, UpstreamEvent::Retry);
                        tracing::debug!(upstream = %endpoint.key(), status = status.as_u16(), "retrying on the next endpoint");
                        earlier.note(config, endpoint, Some(accesslog_upstream::connect_time(&resp)));
                        drop(resp);
                        attempt = head.request(bytes.clone());
                        continue;
                    }
                    let answered = Answered {
                        idx,
                        tries,
                        endpoint,
                        earlier,
                        started,
                        downstream_upgrade: outgoing.downstream_upgrade,
                        h2_websocket: outgoing.h2_websocket,
                    };
                    return self.response_filter(ctx, peer, admitted, answered, resp);
                }
                Ok(Err(SendError::Connect { timed_out, error, request })) => {
                    endpoint.record_failure();
                    tracing::debug!(upstream = %endpoint.key(), %error, timed_out, "upstream connect failed");
                    let on = if timed_out { RetryOn::Timeout } else { RetryOn::Error };
                    ctx.count(
                        peer,
                        if timed_out { UpstreamEvent::ConnectTimeout } else { UpstreamEvent::ConnectError },
                    );
                    // Nothing was sent: the request goes to the next endpoint, if there is one.
                    if again(on, tries, false) {
                        ctx.count(peer, UpstreamEvent::Retry);
                        earlier.note(config, endpoint, None);
                        attempt = *request;
                        continue;
                    }
                    return Err(if timed_out {
                        ProxyError::ConnectTimeout
                    } else {
                        ProxyError::Connect(error)
                    });
                }
                Ok(Err(SendError::Request(error))) => match classify_send_error(error) {
                    Ok(failure) => failure,
                    Err(final_error) => return Err(final_error),
                },
                Err(_elapsed) => {
                    ctx.count(peer, UpstreamEvent::ResponseTimeout);
                    (RetryOn::Timeout, ProxyError::ResponseTimeout)
                }
            };
            // Sent (at least in part): again only with the whole request at hand.
            match head.as_ref().zip(replay.as_ref()) {
                Some((head, bytes)) if again(on, tries, true) => {
                    ctx.count(peer, UpstreamEvent::Retry);
                    tracing::debug!(upstream = %endpoint.key(), error = %failure, "retrying on the next endpoint");
                    earlier.note(config, endpoint, None);
                    attempt = head.request(bytes.clone());
                }
                _ => return Err(failure),
            }
        }
    }

    /// `mirror-*`, `RequestMirror`: a copy of the request goes to each mirror of the route
    /// (`request_uri` as the client sent it), their bodies teed from `body`; a copy may take
    /// `wait`.
    fn mirror(
        &self,
        ctx: &RequestCtx<'_>,
        request_uri: String,
        parts: &http::request::Parts,
        body: &mut UpstreamBody,
        wait: std::time::Duration,
    ) {
        let original = RequestView {
            scheme: self.scheme(),
            host: ctx.host_str,
            method: &parts.method,
            request_uri: &request_uri,
            client: ctx.client.ip,
            headers: &parts.headers,
        };
        for target in ctx.policy.map_or(&[][..], |p| &p.mirrors[..]) {
            mirror::start(&self.proxy, target, &original, body, wait);
        }
    }

    // --- phase 5: the response filter ---

    /// The upstream's answer as the client gets it: the upgrade spliced, `proxy-redirect-*` and
    /// `proxy-cookie-*`, the body paced (`limit-rate`) and holding the `limit-connections`
    /// place, the access log's upstream fields, CORS headers, the affinity cookie.
    fn response_filter(
        &self,
        ctx: &RequestCtx<'_>,
        peer: &Peer<'_>,
        mut admitted: Admitted<'_>,
        answered: Answered<'_>,
        resp: Response<ResponseBody>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let Answered { idx, tries, endpoint, earlier, started, downstream_upgrade, h2_websocket } = answered;
        let status = resp.status();
        if let Some(started) = started {
            ctx.meter.upstream(started.elapsed());
        }
        let connect = accesslog_upstream::connect_time(&resp);
        tracing::debug!(
            peer = %self.peer,
            version = ctx.state.version,
            route = ?ctx.route.path,
            origin = ctx.route.origin.as_ref().map(tracing::field::display),
            rule = ctx.route.rule.as_deref(),
            backend = %ctx.state.router.backend_ids()[peer.backend.0 as usize],
            upstream = %endpoint.key(),
            tries,
            status = status.as_u16(),
            upstream_ms = started.map(|t| t.elapsed().as_millis() as u64),
            elapsed_ms = ctx.start.elapsed().as_millis() as u64,
            "proxied"
        );
        let mut resp = self.response(resp, downstream_upgrade, h2_websocket)?;
        hide_headers(resp.headers_mut(), &ctx.state.config.hidden_response_headers);
        if let Some(policy) = ctx.policy {
            if let Some(rewrite) = &policy.response_rewrite {
                rewrite.apply(resp.headers_mut());
            }
            if let Either::Left(body) = resp.body_mut() {
                body.limit(admitted.slot.take(), policy.response_rate.as_ref());
            }
        }
        if ctx.state.config.access_log.is_some() {
            let (addr, earlier_connect) = earlier.finish(endpoint);
            resp.extensions_mut().insert(accesslog::Upstream {
                addr,
                status: status.as_u16(),
                elapsed: started.map(|t| t.elapsed()).unwrap_or_default(),
                backend: ctx.state.router.backend_ids().get(peer.backend.0 as usize).cloned(),
                origin: ctx.route.origin.clone(),
                connect,
                earlier_connect,
            });
        }
        if let Some((cors, origin)) = admitted.cors {
            cors.add_headers(resp.headers_mut(), origin, false);
        }
        // A new session, or one whose endpoint is gone, learns where it now sticks.
        if !matches!(peer.pick, Pick::Sticky(Some(i)) if i == idx)
            && let Some(cookie) = peer.balance.set_cookie(endpoint.id())
        {
            resp.headers_mut().append(http::header::SET_COOKIE, cookie);
        }
        Ok(resp)
    }

    /// The scheme clients reached this listener with.
    fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// mTLS: the request's host decides the policy; the connection must have been made for that
    /// policy (its SNI), else 421; the result goes upstream in `ssl-client-*` headers, which a
    /// client can never set itself. A failure comes with the policy's `auth-tls-error-page`.
    fn client_auth(
        &self,
        state: &Compiled,
        host: &str,
        headers: &mut HeaderMap,
    ) -> Result<(), (ProxyError, Option<HeaderValue>)> {
        // One pass over the names; removing four absent names would hash each of them.
        if headers.keys().any(|name| name.as_str().starts_with("ssl-client-")) {
            for name in [SSL_CLIENT_CERT, SSL_CLIENT_VERIFY, SSL_CLIENT_SUBJECT_DN, SSL_CLIENT_ISSUER_DN] {
                headers.remove(name);
            }
        }
        if !self.https || state.client_auth.is_empty() {
            return Ok(());
        }
        let name = crate::http_util::normalize_host(host);
        let Some(policy) = state.client_auth.lookup(&name) else { return Ok(()) };
        let cert = match &self.client_cert {
            Some(cert) if cert.host == policy.host => cert,
            _ => return Err((ProxyError::Misdirected, None)),
        };
        let failed = match policy.verify {
            // `Handshake`: the handshake verified it; a chain over the depth still fails here.
            ClientVerify::On | ClientVerify::Handshake if !cert.ok => Some(if cert.presented {
                ProxyError::ClientCertInvalid
            } else {
                ProxyError::ClientCertRequired
            }),
            ClientVerify::Optional if cert.presented && !cert.ok => Some(ProxyError::ClientCertInvalid),
            _ => None,
        };
        if let Some(error) = failed {
            return Err((error, policy.error_page.clone()));
        }
        // `auth-tls-match-cn`, as ingress-nginx checks `$ssl_client_s_dn`: no certificate is an
        // empty subject.
        if let Some(re) = &policy.match_cn
            && !re.is_match(cert.subject.as_ref().and_then(|s| s.to_str().ok()).unwrap_or_default())
        {
            return Err((ProxyError::ClientCertUnauthorized, None));
        }
        headers.insert(SSL_CLIENT_VERIFY, cert.verify.clone());
        if let Some(v) = &cert.subject {
            headers.insert(SSL_CLIENT_SUBJECT_DN, v.clone());
        }
        if let Some(v) = &cert.issuer {
            headers.insert(SSL_CLIENT_ISSUER_DN, v.clone());
        }
        if let Some(v) = &cert.pem {
            headers.insert(SSL_CLIENT_CERT, v.clone());
        }
        Ok(())
    }

    /// `from-to-www-redirect`: `308` to the same scheme and request URI on `target`.
    fn host_redirect(
        &self,
        target: &str,
        req: &Request<Incoming>,
        request_id: &HeaderValue,
    ) -> Response<ProxyBody> {
        let uri = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        let location = format!("{}://{target}{uri}", self.scheme());
        let mut resp = local_response(StatusCode::PERMANENT_REDIRECT, request_id.clone());
        if let Ok(location) = HeaderValue::from_str(&location) {
            resp.headers_mut().insert(LOCATION, location);
        }
        resp
    }

    /// `308 Permanent Redirect` to the same host and path over HTTPS (the method and body are
    /// kept by the client, unlike with 301).
    ///
    /// A trailing `/` of the request URI is dropped unless `preserve_slash`
    /// (`preserve-trailing-slash`), as ingress-nginx does.
    fn https_redirect(
        &self,
        host: &str,
        req: &Request<Incoming>,
        preserve_slash: bool,
    ) -> Response<ProxyBody> {
        // Drop a port from the host (IPv6 literals keep their brackets).
        let name = match host.rsplit_once(':') {
            Some((name, port))
                if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') =>
            {
                name
            }
            _ => host,
        };
        let port = self.proxy.inner.config.https_redirect_port;
        let mut path = req.uri().path_and_query().map_or("/", PathAndQuery::as_str);
        if !preserve_slash {
            path = path.strip_suffix('/').unwrap_or(path);
        }
        let location = if port == 443 {
            format!("https://{name}{path}")
        } else {
            format!("https://{name}:{port}{path}")
        };
        let mut resp =
            Response::new(Either::Right(Full::new(Bytes::from_static(b"308 Permanent Redirect\n"))));
        *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
        let headers = resp.headers_mut();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if let Ok(location) = HeaderValue::from_str(&location) {
            headers.insert(http::header::LOCATION, location);
        }
        resp
    }

    /// Prepares the upstream response for the client; on `101` splices the two connections.
    fn response(
        &self,
        mut resp: Response<ResponseBody>,
        downstream_upgrade: Option<hyper::upgrade::OnUpgrade>,
        h2_websocket: bool,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            // A 101 we did not ask for cannot be relayed meaningfully.
            let downstream = downstream_upgrade.ok_or(ProxyError::UnexpectedSwitch)?;
            let upstream = resp.body_mut().take_upgrade().ok_or(ProxyError::UnexpectedSwitch)?;
            upgrade::splice(downstream, upstream, self.peer);
        }
        strip_hop_by_hop(resp.headers_mut(), switching && !h2_websocket, false);
        if switching && h2_websocket {
            // RFC 8441: the extended CONNECT succeeds with a 2xx; the stream carries the frames.
            *resp.status_mut() = StatusCode::OK;
            resp.headers_mut().remove(SEC_WEBSOCKET_ACCEPT);
        } else if switching {
            resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
        Ok(resp.map(|body| Either::Left(Shaped::plain(Encoded::plain(body)))))
    }
}

/// `add-headers`, then the route's `custom-headers` (which win over them), set on an answer
/// for `route`, replacing the upstream's headers of the same names (nginx's `more_set_headers`).
fn with_response_headers(
    config: &super::ProxyConfig,
    route: &crate::route::router::CompiledRoute,
    mut result: Result<Response<ProxyBody>, ProxyError>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if let Ok(resp) = &mut result {
        set_headers(resp.headers_mut(), &config.response_headers);
        if let Some(policy) = route.policy.as_deref() {
            set_headers(resp.headers_mut(), &policy.response_headers);
            // Gateway API `ResponseHeaderModifier`.
            if let Some(edits) = policy.filters.as_deref().and_then(|f| f.response_headers.as_ref()) {
                edits.apply(resp.headers_mut());
            }
        }
    }
    result
}

// === global settings ===

/// What [`ConnCtx::before`] noted about a request for [`ConnCtx::after`].
struct Seen {
    http1: bool,
    log: Option<accesslog::Captured>,
    /// The codings the client takes, when compression is on and may apply.
    compress: Option<compress::Accepted>,
}

/// The client of one request, as far as the proxy believes.
struct Client {
    /// Its address: the connection's, or the one trusted proxies name.
    ip: IpAddr,
    /// Whether it reached the edge over HTTPS (a trusted `X-Forwarded-Proto` decides).
    https: bool,
    /// The `X-Forwarded-*` headers to send instead of the proxy's own.
    forwarded: Option<Box<ForwardedHeaders>>,
}

/// `X-Forwarded-*` and `X-Real-IP` values under `use-forwarded-headers` / real-ip settings.
struct ForwardedHeaders {
    real_ip: HeaderValue,
    xff: HeaderValue,
    proto: Option<HeaderValue>,
    host: Option<HeaderValue>,
    port: Option<HeaderValue>,
}

impl ForwardedHeaders {
    /// Replaces the proxy's own values with the trusted ones.
    fn apply<'a>(&'a self, forwarded: &mut Forwarded<'a>) {
        forwarded.r#for = &self.xff;
        forwarded.real_ip = &self.real_ip;
        for (value, trusted) in [
            (&mut forwarded.proto, &self.proto),
            (&mut forwarded.host, &self.host),
            (&mut forwarded.port, &self.port),
        ] {
            if let Some(trusted) = trusted {
                *value = trusted;
            }
        }
    }
}

impl ConnCtx {
    /// Settings applied before routing: headers with `_` dropped (nginx's default), what the
    /// access log needs taken.
    fn before(&self, config: &ProxyConfig, req: &mut Request<Incoming>) -> Seen {
        // `ignore-invalid-headers` (on by default), with `_` allowed or not.
        if config.client_limits.ignore_invalid_headers != Some(false) {
            super::client_limits::drop_invalid(req.headers_mut(), config.underscores_in_headers);
        }
        let log = config
            .access_log
            .as_ref()
            .and_then(|format| format.capture(req, self.client(config, req.headers()).ip));
        let compress =
            config.compression.as_ref().and_then(|c| c.accepted(req.method(), req.version(), req.headers()));
        Seen { http1: req.version() <= Version::HTTP_11, log, compress }
    }

    /// OpenTelemetry: the span of a request no route takes (weir's 404, a 400 or 403 before
    /// routing), when the ConfigMap's `enable-opentelemetry` is on, as nginx's module traces
    /// every request of a server with tracing on. Returns `error`.
    fn unrouted(
        &self,
        state: &Compiled,
        req: &Request<Incoming>,
        meter: &Meter,
        error: ProxyError,
    ) -> ProxyError {
        if let Some(pipeline) = &state.tracing {
            let host = req.uri().host().or_else(|| req.headers().get(HOST).and_then(|h| h.to_str().ok()));
            let arrival = super::traced::Arrival {
                host: host.unwrap_or_default(),
                client: self.client(&state.config, req.headers()).ip,
                https: self.https,
                port: self.listener_port.to_str().ok().and_then(|p| p.parse().ok()).unwrap_or(0),
            };
            if let Some(span) = super::traced::start_unrouted(pipeline, req, &arrival) {
                meter.span(span);
            }
        }
        error
    }

    /// Settings applied to the answer: compression, `keep-alive-requests`; returns what the
    /// access-log line needs from the response head (written when the response ends).
    fn after(
        &self,
        state: &Compiled,
        seen: Seen,
        resp: &mut Response<ProxyBody>,
        request_id: &HeaderValue,
    ) -> Option<Box<accesslog::Entry>> {
        // Upstream answers only: weir's own are short.
        if let (Some(config), Some(accepted)) = (&state.config.compression, seen.compress)
            && matches!(resp.body(), Either::Left(_))
        {
            let status = resp.status();
            if let Some(encoding) = config.respond(accepted, status, resp.headers_mut())
                && let Either::Left(body) = resp.body_mut()
            {
                body.get_mut().encode(encoding);
            }
        }
        if seen.http1
            && let Some(max) = state.config.keepalive_requests
            && resp.status() != StatusCode::SWITCHING_PROTOCOLS
            && self.requests.fetch_add(1, Ordering::Relaxed).saturating_add(1) >= max
        {
            resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        }
        let (Some(format), Some(captured)) = (&state.config.access_log, seen.log) else { return None };
        let upstream = resp.extensions_mut().remove::<accesslog::Upstream>();
        Some(format.entry(
            captured,
            accesslog::Outcome {
                peer: self.peer,
                https: self.https,
                ssl: self.ssl,
                listener_port: &self.listener_port,
                request_id,
                status: resp.status(),
                response_headers: resp.headers(),
                upstream,
            },
        ))
    }

    /// The client: the connection's peer, unless trusted proxies name another
    /// (`use-forwarded-headers`, `enable-real-ip`; with the PROXY protocol its address).
    fn client(&self, config: &ProxyConfig, headers: &HeaderMap) -> Client {
        let Some(real_ip) = &config.real_ip else {
            return Client { ip: self.peer.ip(), https: self.https, forwarded: None };
        };
        let peer = self.peer.ip().to_canonical();
        let ip = if config.proxy_protocol { peer } else { real_ip.client(peer, headers) };
        let real = if ip == peer {
            self.client_ip.clone()
        } else {
            HeaderValue::from_str(&ip.to_string()).unwrap_or_else(|_| self.client_ip.clone())
        };
        let trusted = |name: &HeaderName| {
            if real_ip.trust_headers { headers.get(name).filter(|v| !v.is_empty()).cloned() } else { None }
        };
        // `compute-full-forwarded-for` (only with `use-forwarded-headers`, as in ingress-nginx):
        // the incoming chain with the connection's client appended.
        let xff = if real_ip.full_chain && real_ip.trust_headers {
            full_chain(headers, &self.client_ip)
        } else {
            real.clone()
        };
        let proto = trusted(&X_FORWARDED_PROTO);
        let host = trusted(&X_FORWARDED_HOST).and_then(|v| {
            let first = v.to_str().ok()?.split(',').next()?.trim();
            HeaderValue::from_str(first).ok().filter(|v| !v.is_empty())
        });
        let https = proto.as_ref().map_or(self.https, |p| p.as_bytes() != b"http");
        let forwarded =
            ForwardedHeaders { real_ip: real, xff, proto, host, port: trusted(&X_FORWARDED_PORT) };
        Client { ip, https, forwarded: Some(Box::new(forwarded)) }
    }
}

/// The incoming `X-Forwarded-For` lines and `client`, comma-separated.
fn full_chain(headers: &HeaderMap, client: &HeaderValue) -> HeaderValue {
    let mut chain = Vec::new();
    for value in headers.get_all(X_FORWARDED_FOR).iter().filter(|v| !v.is_empty()) {
        chain.extend_from_slice(value.as_bytes());
        chain.extend_from_slice(b", ");
    }
    chain.extend_from_slice(client.as_bytes());
    HeaderValue::from_bytes(&chain).unwrap_or_else(|_| client.clone())
}

/// The request's host as sent: the URI authority (h2, absolute-form) else the `Host` header;
/// `None` when unusable. Two `Host` headers are an error whatever the authority (RFC 9112 §3.2).
fn request_host<B>(req: &Request<B>) -> Result<Option<HeaderValue>, ProxyError> {
    let mut hosts = req.headers().get_all(HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::DuplicateHost);
    }
    let value = match (req.uri().authority(), header) {
        (Some(auth), _) => {
            let s = auth.as_str();
            let s = s.rsplit_once('@').map_or(s, |(_, host)| host);
            match HeaderValue::from_str(s) {
                Ok(value) => value,
                Err(_) => return Ok(None),
            }
        }
        (None, Some(header)) => header.clone(),
        (None, None) => return Ok(None),
    };
    match value.to_str() {
        Ok(s) if !s.is_empty() && !s.starts_with(':') => Ok(Some(value)),
        _ => Ok(None),
    }
}

/// What one request carries from phase to phase (pingora's per-request context): read once in
/// [`ConnCtx::forward`], borrowed by every phase.
struct RequestCtx<'a> {
    state: &'a Compiled,
    route: &'a CompiledRoute,
    policy: Option<&'a CompiledPolicy>,
    request_id: &'a HeaderValue,
    start: Instant,
    /// The host routed on, as sent.
    host: &'a HeaderValue,
    /// The same, as text: parsed once.
    host_str: &'a str,
    /// The normalized request path, when it differs from the request's ([`uri_path`]).
    normalized: Option<&'a str>,
    /// The client, as far as the proxy believes.
    client: Client,
    /// What the request's metrics learn on the way.
    meter: &'a Meter,
}

impl RequestCtx<'_> {
    /// Counts an upstream event of `peer`'s backend.
    fn count(&self, peer: &Peer<'_>, event: UpstreamEvent) {
        if let Some(stats) = self.state.metrics.backend(peer.backend.0) {
            stats.count(event);
        }
    }

    /// The body limit in force: the route's, else the proxy's (`None`: unlimited).
    fn body_limit(&self) -> Option<u64> {
        let global = self.state.config.max_request_body;
        self.policy.map_or(global, |p| p.body_limit(global))
    }
}

/// What the request filter decided.
enum Filtered<'a> {
    /// Answered here (a redirect, a preflight, a challenge, a denial).
    Answer(Response<ProxyBody>),
    /// On to the upstream.
    Forward(Admitted<'a>),
}

/// What the request filter hands on: the CORS origin to answer with, and the
/// `limit-connections` place held until the response has gone out.
struct Admitted<'a> {
    cors: Option<(&'a CompiledCors, HeaderValue)>,
    slot: Option<Slot>,
}

/// Where the request goes: the upstream peer phase's choice.
struct Peer<'a> {
    backend: BackendIdx,
    balancer: &'a Balancer,
    balance: &'a CompiledBalance,
    pick: Pick,
    /// The request header edits of the split share picked (`HTTPBackendRef.filters`).
    edits: Option<&'a CompiledEdits>,
}

impl Peer<'_> {
    /// The next endpoint to try, none of `tried`.
    fn pick_untried(&self, tried: &[usize]) -> Option<usize> {
        let balancer = self.balancer;
        match self.pick {
            Pick::RoundRobin => balancer.pick_untried(tried),
            Pick::Ewma => balancer.pick_ewma(tried),
            Pick::Hash(key) => balancer.pick_hashed(key, tried),
            Pick::Sticky(Some(i)) if !tried.contains(&i) => Some(i),
            Pick::Sticky(_) => balancer.pick_untried(tried),
        }
    }
}

/// How the request goes upstream, beside its rewritten head: the upstream request phase's
/// result.
struct Outgoing<'a> {
    /// The forwarded headers, written by the HTTP/1.1 encoder when `encoded`.
    forwarded: Forwarded<'a>,
    encoded: bool,
    is_upgrade: bool,
    h2_websocket: bool,
    /// HTTP/1 (one request at a time on the connection), not an h2 stream.
    one_at_a_time: bool,
    downstream_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// `mirror-*`: the request URI as the client sent it, when the route has mirrors.
    mirrored: Option<String>,
}

/// The route's Gateway API `retry` (its statuses and backoff; its attempts are the plan's
/// `max_tries`). Looked up where needed rather than kept: every request's future would carry it.
fn gateway_retries<'a>(ctx: &RequestCtx<'a>) -> Option<&'a crate::route::retry::Retries> {
    ctx.policy.and_then(|p| p.retries.as_deref())
}

/// How the exchange may retry (`proxy-next-upstream*`, or the Gateway API `retry`) and its
/// timeouts, from the route and the table.
struct RetryPlan {
    retry: Retry,
    max_tries: usize,
    head_timeout: std::time::Duration,
    opts: Exchange,
    /// No try starts past it (`proxy-next-upstream-timeout`, or the Gateway API
    /// `timeouts.request`; the clock is read only with one).
    until: Option<Instant>,
    /// `until` bounds each try's wait too (`timeouts.request`: the whole exchange).
    until_bounds_tries: bool,
    /// Whether a request that went out may go again (its method allows it).
    resend: bool,
}

impl RetryPlan {
    fn of(ctx: &RequestCtx<'_>, balancer: &Balancer, method: &http::Method, is_upgrade: bool) -> RetryPlan {
        let (config, policy) = (&ctx.state.config, ctx.policy);
        let gateway = gateway_retries(ctx);
        // `proxy-next-upstream`: the route's conditions (with `retry-non-idempotent`), else the
        // table's. Gateway API `retry`: "Implementations SHOULD retry on connection errors
        // (disconnect, reset, timeout, TCP failure) if a retry stanza is configured".
        let retry = match gateway {
            Some(_) => Retry::new(&[RetryOn::Error, RetryOn::Timeout]),
            None => policy
                .and_then(|p| p.next_upstream)
                .map_or(config.next_upstream, |r| r.with_non_idempotent(config.retry_non_idempotent)),
        };
        let max_tries = match gateway {
            // `attempts` retries, to the same endpoints again when there are fewer.
            Some(g) => (g.attempts as usize).saturating_add(1).clamp(1, MAX_TRIES),
            None => {
                let tries_wanted = match policy.and_then(|p| p.connect_tries) {
                    Some(0) => MAX_TRIES,
                    Some(n) => n as usize,
                    None => config.connect_tries,
                };
                tries_wanted.clamp(1, balancer.endpoints().len().min(MAX_TRIES))
            }
        };
        let head_timeout = policy.and_then(|p| p.read_timeout).unwrap_or(config.upstream_timeout);
        let mut opts = Exchange::of(config);
        if let Some(timeout) = policy.and_then(|p| p.connect_timeout) {
            opts.connect_timeout = timeout;
        }
        if let Some(timeout) = policy.and_then(|p| p.send_timeout) {
            opts.send_timeout = timeout;
        }
        // `timeouts.request`: "the maximum duration for a gateway to respond to an HTTP request"
        // covers every try ("may result in more than one call from the gateway to the
        // destination backend, for example, if automatic retries are supported").
        let request_timeout = gateway.and_then(|g| g.request_timeout).filter(|_| max_tries > 1);
        let until = request_timeout
            .or_else(|| {
                policy
                    .and_then(|p| p.next_upstream_timeout)
                    .unwrap_or(config.next_upstream_timeout)
                    .filter(|_| max_tries > 1)
            })
            .map(|limit| Instant::now() + limit);
        let resend = max_tries > 1 && !is_upgrade && retry.after_send() && retry.may_resend(method);
        RetryPlan {
            retry,
            max_tries,
            head_timeout,
            opts,
            until,
            until_bounds_tries: request_timeout.is_some(),
            resend,
        }
    }
}

/// The endpoint that answered, and what the response filter needs of the exchange.
struct Answered<'a> {
    idx: usize,
    /// Endpoints tried, this one included.
    tries: usize,
    endpoint: &'a EndpointState,
    /// `$upstream_addr`'s and `$upstream_connect_time`'s earlier endpoints.
    earlier: accesslog_upstream::Tried,
    started: Option<Instant>,
    downstream_upgrade: Option<hyper::upgrade::OnUpgrade>,
    h2_websocket: bool,
}

/// The body as it goes upstream, and the copy to send again: a request that went out goes
/// again only if its body can be sent again (none, or a small one, by its declared length, read
/// whole first) and `plan` allows resending.
async fn upstream_body(
    body: Incoming,
    plan: &RetryPlan,
    limit: Option<u64>,
    idle: std::time::Duration,
) -> Result<(UpstreamBody, Option<Bytes>), ProxyError> {
    Ok(if !plan.resend {
        (UpstreamBody::new(body, limit, idle), None)
    } else if http_body::Body::is_end_stream(&body) {
        (UpstreamBody::empty(), Some(Bytes::new()))
    } else if http_body::Body::size_hint(&body).exact().is_some_and(|n| n <= RESEND_BODY_MAX) {
        let bytes = Box::pin(read_whole(body, plan.head_timeout)).await?;
        (UpstreamBody::buffered(bytes.clone()), Some(bytes))
    } else {
        (UpstreamBody::new(body, limit, idle), None)
    })
}

/// The path and query sent upstream (rewritten by `rewrite-target` from the normalized path,
/// else as sent), in origin-form for HTTP/1.1 and with the scheme and `:authority` for h2. The
/// client connects to the endpoint, so the URI is the same whichever endpoint is tried.
fn upstream_uri(
    ctx: &RequestCtx<'_>,
    uri: &Uri,
    h2_authority: Option<Authority>,
    tls: bool,
) -> Result<Uri, ProxyError> {
    // `rewrite-target` rewrites the path the route matched (nginx's `$uri`), escaped again.
    let rewritten = ctx.policy.and_then(|p| {
        // Gateway API `URLRewrite.path`, on the path the route matched.
        if let Some(target) =
            p.filters.as_deref().and_then(|f| f.rewrite(ctx.normalized.unwrap_or(uri.path()), uri.query()))
        {
            return Some(target);
        }
        match ctx.normalized {
            Some(path) => p.rewrite_path(path, uri.query(), true),
            None => p.rewrite(uri.path(), uri.query()),
        }
    });
    let path_and_query = match rewritten {
        Some(target) => PathAndQuery::try_from(target).map_err(|_| ProxyError::BadRewrite)?,
        None => uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")),
    };
    Ok(match h2_authority {
        Some(authority) => {
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(if tls { Scheme::HTTPS } else { Scheme::HTTP });
            parts.authority = Some(authority);
            parts.path_and_query = Some(path_and_query);
            Uri::from_parts(parts).map_err(|_| ProxyError::BadUpstreamAddress)?
        }
        None => Uri::from(path_and_query),
    })
}

/// A failed exchange after (part of) the request went out: what it means for retrying and the
/// error it stands for; `Err` when no retry can help (the body was too large).
fn classify_send_error(error: BoxError) -> Result<(RetryOn, ProxyError), ProxyError> {
    if is_body_too_large(&*error) {
        return Err(ProxyError::PayloadTooLarge);
    }
    if caused_by::<BodyTimedOut>(&*error) {
        return Err(ProxyError::ClientBodyTimeout);
    }
    if is_send_timeout(&*error) {
        return Ok((RetryOn::Timeout, ProxyError::SendTimeout));
    }
    let parse = error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_parse)
        || error
            .downcast_ref::<super::upstream::h1::Error>()
            .is_some_and(super::upstream::h1::Error::is_parse);
    Ok((if parse { RetryOn::InvalidHeader } else { RetryOn::Error }, ProxyError::Upstream(error)))
}

/// What a custom error page backend is told about the original request.
struct ErrorContext {
    uri: String,
    format: Option<HeaderValue>,
    origin: Option<crate::model::ObjectRef>,
    service: Option<crate::model::BackendId>,
}

/// How this request's endpoint is picked.
#[derive(Clone, Copy)]
enum Pick {
    RoundRobin,
    Ewma,
    /// Consistent hashing of this key.
    Hash(u64),
    /// The endpoint the session cookie names, if it is still there.
    Sticky(Option<usize>),
}

/// The body length the client declared (`Content-Length`), if any and valid.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// What a request to send again is made of (its body aside).
struct Head {
    method: http::Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
}

impl Head {
    fn of(parts: &http::request::Parts) -> Head {
        Head {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
        }
    }

    /// The request again, with `body`.
    fn request(&self, body: Bytes) -> Request<UpstreamBody> {
        let mut req = Request::new(UpstreamBody::buffered(body));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// Reads a (small, length-declared) request body whole, within `timeout`.
async fn read_whole(body: Incoming, timeout: std::time::Duration) -> Result<Bytes, ProxyError> {
    use http_body_util::BodyExt;
    match tokio::time::timeout(timeout, body.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) => Err(ProxyError::ClientBody(Box::new(error))),
        Err(_) => Err(ProxyError::ClientBodyTimeout),
    }
}

/// Whether a failed upstream request failed because the client's body passed the route's limit.
fn is_body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    caused_by::<BodyTooLarge>(error)
}

/// Whether `error` or one of its sources is an `E`.
fn caused_by<E: std::error::Error + 'static>(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<E>() {
            return true;
        }
        current = e.source();
    }
    false
}

/// An HTTP/2 extended CONNECT for a WebSocket (RFC 8441).
fn is_h2_websocket<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == http::Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64.
fn websocket_key() -> HeaderValue {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bits: u128 = rand::random();
    let bytes = bits.to_be_bytes();
    let mut out = Vec::with_capacity(24);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { B64[((n >> (18 - 6 * i)) & 63) as usize] } else { b'=' });
        }
    }
    HeaderValue::from_maybe_shared(Bytes::from(out))
        .unwrap_or_else(|_| HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="))
}

/// An HTTP/1.1 `Connection: upgrade` + `Upgrade: x` request.
fn is_upgrade_request<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(UPGRADE)
        && connection_tokens(req.headers()).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, F: Future>(_f: impl Fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn the_request_future_stays_small() {
        // Every request's future is written into hyper's connection (and for h2 moved into a
        // task per stream): its size is copied per request. Rare paths (connecting, TLS, error
        // pages, external auth, h2 upstreams) are boxed to keep it so.
        let handle = future_size(|(ctx, req): (Arc<ConnCtx>, Request<Incoming>)| ctx.handle(req));
        eprintln!("request future: {handle} bytes");
        assert!(handle <= 4096, "the request future grew to {handle} bytes");
    }
}
