//! External authentication (ingress-nginx `auth-url`): before a request is proxied, a
//! subrequest without body goes to the authentication service with the client's headers; its
//! answer decides, as nginx's `auth_request` does.

use std::net::IpAddr;
use std::time::Duration;

use http::header::{CONTENT_LENGTH, HOST, HeaderMap, HeaderName, HeaderValue, LOCATION, WWW_AUTHENTICATE};
use http::uri::{Authority, Scheme};
use http::{Method, Request, StatusCode, Uri};

use super::client::{Clients, UpstreamBody};
use crate::http_util::percent_encode;

const X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_AUTH_REQUEST_REDIRECT: HeaderName = HeaderName::from_static("x-auth-request-redirect");
const X_SENT_FROM: HeaderName = HeaderName::from_static("x-sent-from");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// What the request being authenticated looks like, for the templates and headers.
pub(super) struct Original<'a> {
    /// `http` or `https`.
    pub(super) scheme: &'a str,
    /// The host the client asked for.
    pub(super) host: &'a str,
    /// The request method.
    pub(super) method: &'a Method,
    /// Path and query as sent.
    pub(super) request_uri: &'a str,
    /// The client's address.
    pub(super) client: IpAddr,
    /// The client's headers.
    pub(super) headers: &'a HeaderMap,
}

/// The service's decision.
pub(super) enum Decision {
    /// 2xx: these headers go into the proxied request.
    Allow(Vec<(HeaderName, HeaderValue)>),
    /// Answer the client with this status, plus these headers (a challenge or a redirect).
    Deny(StatusCode, Vec<(HeaderName, HeaderValue)>),
}

/// Expands `$scheme`, `$host`, `$http_host`, `$best_http_host`, `$request_uri`,
/// `$escaped_request_uri`, `$uri` and `$remote_addr` in `template`; an unknown `$name` is
/// left as written (translation rejects them).
pub(super) fn expand(template: &str, o: &Original<'_>) -> String {
    let mut out = String::with_capacity(template.len() + o.request_uri.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let len = rest.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
        let (name, tail) = rest.split_at(len);
        match name {
            "scheme" => out.push_str(o.scheme),
            "host" | "http_host" | "best_http_host" => out.push_str(o.host),
            "request_uri" => out.push_str(o.request_uri),
            "escaped_request_uri" => out.push_str(&percent_encode(o.request_uri)),
            "uri" => out.push_str(o.request_uri.split('?').next().unwrap_or_default()),
            "remote_addr" => out.push_str(&o.client.to_string()),
            _ => {
                out.push('$');
                out.push_str(name);
            }
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Asks the service and returns its decision.
pub(super) async fn decide(
    clients: &Clients,
    timeout: Duration,
    auth: &crate::model::ExternalAuth,
    o: &Original<'_>,
    request_id: &HeaderValue,
) -> Decision {
    let error = |why: String| {
        tracing::warn!(url = %auth.url, "external authentication failed: {why}");
        Decision::Deny(StatusCode::INTERNAL_SERVER_ERROR, Vec::new())
    };
    let url = expand(&auth.url, o);
    let uri: Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return error(format!("invalid URL {url:?}: {e}")),
    };
    let Some(authority) = uri.authority().cloned().filter(|_| uri.scheme() == Some(&Scheme::HTTP)) else {
        return error(format!("{url:?} is not an http:// URL"));
    };
    let request = match subrequest(auth, o, uri, &authority, request_id) {
        Ok(r) => r,
        Err(e) => return error(format!("cannot build the subrequest: {e}")),
    };
    let response = match tokio::time::timeout(timeout, clients.send_http1(request)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return error(e.to_string()),
        Err(_) => return error(format!("no answer within {timeout:?}")),
    };
    let status = response.status();
    let headers = response.headers();
    if status.is_success() {
        let copied = auth
            .response_headers
            .iter()
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .filter_map(|name| headers.get(&name).map(|v| (name, v.clone())))
            .collect();
        return Decision::Allow(copied);
    }
    match status {
        StatusCode::UNAUTHORIZED => match &auth.signin {
            Some(signin) => {
                let mut location = expand(signin, o);
                if !location.contains("rd=") {
                    location.push(if location.contains('?') { '&' } else { '?' });
                    location.push_str("rd=");
                    location
                        .push_str(&percent_encode(&format!("{}://{}{}", o.scheme, o.host, o.request_uri)));
                }
                match HeaderValue::try_from(location) {
                    Ok(v) => Decision::Deny(StatusCode::FOUND, vec![(LOCATION, v)]),
                    Err(e) => error(format!("invalid auth-signin location: {e}")),
                }
            }
            None => {
                let challenge = headers.get(WWW_AUTHENTICATE).map(|v| (WWW_AUTHENTICATE, v.clone()));
                Decision::Deny(status, challenge.into_iter().collect())
            }
        },
        StatusCode::FORBIDDEN => Decision::Deny(status, Vec::new()),
        other => error(format!("the service answered {other}")),
    }
}

/// The subrequest: the client's headers (no body), aimed at the service, plus what nginx's
/// `auth_request` location in ingress-nginx adds.
fn subrequest(
    auth: &crate::model::ExternalAuth,
    o: &Original<'_>,
    uri: Uri,
    authority: &Authority,
    request_id: &HeaderValue,
) -> Result<Request<UpstreamBody>, http::Error> {
    let method = Method::from_bytes(auth.method.as_bytes()).unwrap_or(Method::GET);
    let builder = Request::builder().method(method).uri(uri).version(http::Version::HTTP_11);
    let mut map = HeaderMap::with_capacity(o.headers.len() + 8);
    for (name, value) in o.headers {
        if !super::forward::is_hop_by_hop(name) && name != CONTENT_LENGTH && name != HOST {
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
    map.insert(super::forward::X_REQUEST_ID, request_id.clone());
    let mut request = builder.body(UpstreamBody::empty())?;
    *request.headers_mut() = map;
    Ok(request)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand() {
        let headers = HeaderMap::new();
        let o = Original {
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
