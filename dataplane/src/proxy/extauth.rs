//! External authentication (ingress-nginx `auth-url`): before a request is proxied, a
//! subrequest without body goes to the authentication service with the client's headers; its
//! answer decides, as nginx's `auth_request` does.

use std::time::Duration;

use http::header::{
    CONTENT_LENGTH, HOST, HeaderMap, HeaderName, HeaderValue, LOCATION, SET_COOKIE, WWW_AUTHENTICATE,
};
use http::uri::{Authority, Scheme};
use http::{Method, Request, StatusCode, Uri};

use super::headers::{X_REQUEST_ID, expand, is_hop_by_hop};
use super::upstream::body::UpstreamBody;
use super::upstream::client::{Clients, UrlTls};
use crate::http_util::percent_encode;
use crate::model::ExternalAuth;
use crate::route::policy::CompiledExternalAuth;
use crate::vars::{RequestView, Template};

const X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_AUTH_REQUEST_REDIRECT: HeaderName = HeaderName::from_static("x-auth-request-redirect");
const X_SENT_FROM: HeaderName = HeaderName::from_static("x-sent-from");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The service's decision.
pub(super) enum Decision {
    /// 2xx: these headers go into the proxied request.
    Allow(Vec<(HeaderName, HeaderValue)>),
    /// Answer the client with this status, plus these headers (a challenge or a redirect).
    Deny(StatusCode, Vec<(HeaderName, HeaderValue)>),
}

/// What the subrequest did, for its access-log line (`enable-auth-access-log`).
#[derive(Debug)]
pub(super) struct Asked {
    /// The subrequest's status: the service's answer (or the cached one), 502 when it could not
    /// be asked, 504 when it did not answer in time.
    pub(super) status: StatusCode,
    /// The service as the URL names it (`host:port`), when it was asked.
    pub(super) service: Option<String>,
    /// The time to connect to it (zero on a reused connection).
    pub(super) connect: Duration,
    /// How long the decision took.
    pub(super) elapsed: Duration,
}

/// Statuses nginx's `add_header` (without `always`) applies to: the service's `Set-Cookie`
/// reaches the client with these unless `auth-always-set-cookie`.
const COOKIE_STATUSES: [u16; 10] = [200, 201, 204, 206, 301, 302, 303, 304, 307, 308];

/// Whether the service's cookies go on a response with `status`.
pub(super) fn cookies_apply(auth: &ExternalAuth, status: StatusCode) -> bool {
    auth.always_set_cookie || COOKIE_STATUSES.contains(&status.as_u16())
}

/// Reads (and drops) what is left of the service's answer, so that its connection goes back
/// to the pool; a large or slow body is abandoned (the connection is then closed).
async fn drain(body: super::upstream::client::ResponseBody, until: tokio::time::Instant) {
    use http_body_util::BodyExt as _;
    const MAX: usize = 64 * 1024;
    let mut body = std::pin::pin!(body);
    let mut read = 0;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(until, body.frame()).await {
        read += frame.data_ref().map_or(0, bytes::Buf::remaining);
        if read > MAX {
            return;
        }
    }
}

/// Asks the service (or the route's cache) and returns its decision, with the service's
/// `Set-Cookie` values (for the client's response, see [`cookies_apply`]). `asked`, when given,
/// learns what the subrequest did (for the access log).
pub(super) async fn decide(
    clients: &Clients,
    timeout: Duration,
    auth: &CompiledExternalAuth,
    cache: Option<&crate::state::authcache::AuthCache>,
    o: &RequestView<'_>,
    request_id: &HeaderValue,
    asked: Option<&mut Option<Asked>>,
) -> (Decision, Vec<HeaderValue>) {
    let started = asked.is_some().then(std::time::Instant::now);
    let report = |status: StatusCode, service: Option<(String, Duration)>| {
        if let (Some(asked), Some(started)) = (asked, started) {
            let (service, connect) = service.map_or((None, Duration::ZERO), |(s, c)| (Some(s), c));
            *asked = Some(Asked { status, service, connect, elapsed: started.elapsed() });
        }
    };
    let key = cache.and_then(|c| c.key(o));
    if let (Some(cache), Some(key)) = (cache, &key)
        && let Some(answer) = cache.get(key, std::time::Instant::now())
    {
        report(answer.status, None);
        return (interpret(auth, o, answer.status, &answer.headers), Vec::new());
    }
    let (status, headers, connect) = match ask(clients, timeout, auth, o, request_id).await {
        Ok(answer) => answer,
        Err(why) => {
            let timed_out = why.starts_with(NO_ANSWER);
            report(if timed_out { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY }, None);
            return (error(&auth.spec, why), Vec::new());
        }
    };
    if started.is_some() {
        report(status, Some((service(auth, o), connect)));
    }
    let decision = interpret(auth, o, status, &headers);
    let cookies = headers.get_all(SET_COOKIE).iter().cloned().collect();
    if let (Some(cache), Some(key)) = (cache, key)
        && let Some(ttl) = cache.lifetime(status, &headers)
    {
        // Only what the decision reads is kept.
        let mut kept = HeaderMap::new();
        for name in auth
            .spec
            .response_headers
            .iter()
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .chain([WWW_AUTHENTICATE])
        {
            for value in headers.get_all(&name) {
                kept.append(name.clone(), value.clone());
            }
        }
        let answer = crate::state::authcache::Answer { status, headers: kept };
        cache.put(key, answer, ttl, std::time::Instant::now());
    }
    (decision, cookies)
}

fn error(auth: &ExternalAuth, why: String) -> Decision {
    tracing::warn!(url = %auth.url, "external authentication failed: {why}");
    Decision::Deny(StatusCode::INTERNAL_SERVER_ERROR, Vec::new())
}

/// How [`ask`]'s error for a service that did not answer in time begins.
const NO_ANSWER: &str = "no answer within";

/// The service the URL names, `host:port` (for `$upstream_addr`).
fn service(auth: &CompiledExternalAuth, o: &RequestView<'_>) -> String {
    let url = expand(&auth.url, o);
    let Ok(uri) = url.parse::<Uri>() else { return url };
    let port = uri.port_u16().unwrap_or(if uri.scheme() == Some(&Scheme::HTTPS) { 443 } else { 80 });
    format!("{}:{port}", uri.host().unwrap_or_default())
}

/// Sends the subrequest; the service's status and headers, and the time to connect to it.
async fn ask(
    clients: &Clients,
    timeout: Duration,
    auth: &CompiledExternalAuth,
    o: &RequestView<'_>,
    request_id: &HeaderValue,
) -> Result<(StatusCode, HeaderMap, Duration), String> {
    let url = expand(&auth.url, o);
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    let https = uri.scheme() == Some(&Scheme::HTTPS);
    let Some(authority) = uri.authority().cloned().filter(|_| https || uri.scheme() == Some(&Scheme::HTTP))
    else {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    };
    let tls = match (&auth.tls, https) {
        (_, false) => None,
        (Ok(Some(tls)), true) => Some(UrlTls {
            config: &tls.config.config,
            server_name: tls.config.server_name.as_ref(),
            profile: tls.profile,
        }),
        (Ok(None), true) => return Err(format!("{url:?}: no TLS settings for an https:// URL")),
        (Err(why), true) => return Err(why.clone()),
    };
    let request = subrequest(&auth.spec, o, uri, &authority, request_id)
        .map_err(|e| format!("cannot build the subrequest: {e}"))?;
    let until = tokio::time::Instant::now() + timeout;
    let response = match tokio::time::timeout_at(until, clients.send_url_with(request, tls)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("{NO_ANSWER} {timeout:?}")),
    };
    let connect = super::accesslog_upstream::connect_time(&response);
    let (head, body) = response.into_parts();
    drain(body, until).await;
    Ok((head.status, head.headers, connect))
}

/// What the service's answer means for the request.
fn interpret(
    auth: &CompiledExternalAuth,
    o: &RequestView<'_>,
    status: StatusCode,
    headers: &HeaderMap,
) -> Decision {
    let (spec, signin) = (&auth.spec, &auth.signin);
    if status.is_success() {
        let copied = spec
            .response_headers
            .iter()
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .filter_map(|name| headers.get(&name).map(|v| (name, v.clone())))
            .collect();
        return Decision::Allow(copied);
    }
    match status {
        StatusCode::UNAUTHORIZED => match signin {
            Some(signin) => {
                let location =
                    signin_location(signin, spec.signin_redirect_param.as_deref().unwrap_or("rd"), o);
                match HeaderValue::try_from(location) {
                    Ok(v) => Decision::Deny(StatusCode::FOUND, vec![(LOCATION, v)]),
                    Err(e) => error(spec, format!("invalid auth-signin location: {e}")),
                }
            }
            None => {
                let challenge = headers.get(WWW_AUTHENTICATE).map(|v| (WWW_AUTHENTICATE, v.clone()));
                Decision::Deny(status, challenge.into_iter().collect())
            }
        },
        StatusCode::FORBIDDEN => Decision::Deny(status, Vec::new()),
        other => error(spec, format!("the service answered {other}")),
    }
}

/// The `auth-signin` redirect: the expanded template, with `param=<original URL>` added unless
/// its query has a non-empty `param` already (ingress-nginx's rule).
fn signin_location(signin: &Template, param: &str, o: &RequestView<'_>) -> String {
    let mut location = expand(signin, o);
    let query = location.split_once('?').map_or("", |(_, q)| q);
    let has = query.split('&').any(|kv| kv.split_once('=').is_some_and(|(k, v)| k == param && !v.is_empty()));
    if !has {
        location.push(if location.contains('?') { '&' } else { '?' });
        location.push_str(param);
        location.push('=');
        location.push_str(&percent_encode(&format!("{}://{}{}", o.scheme, o.host, o.request_uri)));
    }
    location
}

/// The subrequest: the client's headers (no body), aimed at the service, plus what nginx's
/// `auth_request` location in ingress-nginx adds.
fn subrequest(
    auth: &ExternalAuth,
    o: &RequestView<'_>,
    uri: Uri,
    authority: &Authority,
    request_id: &HeaderValue,
) -> Result<Request<UpstreamBody>, http::Error> {
    let method = Method::from_bytes(auth.method.as_bytes()).unwrap_or(Method::GET);
    let builder = Request::builder().method(method).uri(uri).version(http::Version::HTTP_11);
    let mut map = HeaderMap::with_capacity(o.headers.len() + 8);
    for (name, value) in o.headers {
        if !is_hop_by_hop(name) && name != CONTENT_LENGTH && name != HOST {
            map.append(name, value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
        map.insert(HOST, v);
    }
    let original = format!("{}://{}{}", o.scheme, o.host, o.request_uri);
    if let Ok(v) = HeaderValue::try_from(original) {
        map.insert(X_ORIGINAL_URL, v);
    }
    if let Ok(v) = HeaderValue::from_str(o.method.as_str()) {
        map.insert(X_ORIGINAL_METHOD, v);
    }
    let redirect = auth.request_redirect.as_deref().unwrap_or(o.request_uri);
    if let Ok(v) = HeaderValue::from_str(redirect) {
        map.insert(X_AUTH_REQUEST_REDIRECT, v);
    }
    map.insert(X_SENT_FROM, HeaderValue::from_static("weir"));
    if let Ok(v) = HeaderValue::from_str(&o.client.to_string()) {
        map.insert(X_REAL_IP, v.clone());
        map.insert(X_FORWARDED_FOR, v);
    }
    map.insert(X_REQUEST_ID, request_id.clone());
    // `auth-proxy-set-headers` last: they replace the client's and weir's (translation keeps
    // the framing and connection headers out).
    for (name, value) in &auth.proxy_set_headers {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value))
        {
            map.insert(name, value);
        }
    }
    let mut request = builder.body(UpstreamBody::empty())?;
    *request.headers_mut() = map;
    Ok(request)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::vars::Dialect;

    /// Parses `template` as the table does, then renders it as the proxy does.
    fn expand(template: &str, o: &RequestView<'_>) -> String {
        super::expand(&Template::parse_lenient(template, Dialect::Url), o)
    }

    #[test]
    fn templates_expand() {
        let headers = HeaderMap::new();
        let o = RequestView {
            scheme: "https",
            host: "app.example.com",
            method: &Method::GET,
            request_uri: "/a b?x=1",
            client: "192.0.2.1".parse().unwrap(),
            headers: &headers,
        };
        assert_eq!(
            expand("http://auth.svc/oauth2/start?rd=$escaped_request_uri&h=$host", &o),
            "http://auth.svc/oauth2/start?rd=%2Fa%20b%3Fx%3D1&h=app.example.com"
        );
        assert_eq!(
            expand("$scheme://$best_http_host$uri from $remote_addr $other", &o),
            "https://app.example.com/a b from 192.0.2.1 $other"
        );
    }
}
