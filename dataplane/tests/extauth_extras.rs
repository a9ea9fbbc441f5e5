//! External authentication extras through a real proxy and a recording authentication
//! service: `auth-proxy-set-headers`, `auth-signin-redirect-param`, `auth-always-set-cookie`,
//! `auth-cache-key`/`auth-cache-duration`, and connections to the service kept alive.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use support::*;
use weir_dataplane::model::{AuthCacheSpec, CacheValid, ExternalAuth, RoutePolicy};

/// What the authentication service saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    connections: AtomicUsize,
    last: Mutex<HeaderMap>,
}

/// A recording authentication service. By `Authorization`: `Bearer good` and `Bearer other` →
/// 200 with `X-Auth-User`; `Bearer cookie` → 200 with `Set-Cookie: auth=fresh`;
/// `Bearer nocache` → 200 with `Cache-Control: no-store`; `Bearer denied-cookie` → 401 with
/// `Set-Cookie: auth=gone`; else 401. Each answer has a small body.
async fn auth_service() -> (std::net::SocketAddr, Arc<Seen>) {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let state = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            state.connections.fetch_add(1, Ordering::SeqCst);
            let state = state.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let state = state.clone();
                    async move {
                        state.requests.fetch_add(1, Ordering::SeqCst);
                        *state.last.lock().unwrap() = req.headers().clone();
                        let auth =
                            req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
                        let resp = http::Response::builder();
                        let resp = match auth {
                            "Bearer good" | "Bearer other" => {
                                resp.status(200).header("x-auth-user", &auth[7..])
                            }
                            "Bearer cookie" => resp.status(200).header("set-cookie", "auth=fresh; Path=/"),
                            "Bearer nocache" => resp.status(200).header("cache-control", "no-store"),
                            "Bearer denied-cookie" => {
                                resp.status(401).header("set-cookie", "auth=gone; Path=/")
                            }
                            _ => resp.status(401),
                        };
                        Ok::<_, std::convert::Infallible>(
                            resp.body(Full::new(Bytes::from_static(b"auth says hi"))).unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn auth(addr: std::net::SocketAddr) -> ExternalAuth {
    ExternalAuth {
        url: format!("http://{addr}/check"),
        method: "GET".into(),
        response_headers: vec!["X-Auth-User".into()],
        ..ExternalAuth::default()
    }
}

fn policy(auth: ExternalAuth) -> RoutePolicy {
    RoutePolicy { external_auth: Some(Box::new(auth)), ..RoutePolicy::default() }
}

async fn proxy_for(auth: ExternalAuth) -> (TestProxy, Echo) {
    let e = echo("app").await;
    let p = proxy(table().host("app.test").prefix("/", &to(&e)).policy(policy(auth)).build()).await;
    (p, e)
}

fn bearer(p: &TestProxy, path: &str, token: &str) -> http::Request<TestBody> {
    p.req("app.test", path).header("authorization", format!("Bearer {token}")).body(empty()).unwrap()
}

#[tokio::test]
async fn proxy_set_headers_reach_the_auth_service() {
    let (addr, seen) = auth_service().await;
    let mut a = auth(addr);
    a.proxy_set_headers = BTreeMap::from([("x-auth-tenant".into(), "shop".into())]);
    let (p, _e) = proxy_for(a).await;
    // The client's own value of the header is replaced on the subrequest.
    let req = p
        .req("app.test", "/")
        .header("authorization", "Bearer good")
        .header("x-auth-tenant", "forged")
        .body(empty())
        .unwrap();
    let echo = p.send(req).await.echo();
    assert_eq!(echo.headers["x-auth-user"], "good");
    let last = seen.last.lock().unwrap().clone();
    assert_eq!(last.get_all("x-auth-tenant").iter().collect::<Vec<_>>(), ["shop"]);
    assert_eq!(last["authorization"], "Bearer good", "the client's headers still go");
    // Only the subrequest gets it: the upstream sees what the client sent.
    assert_eq!(echo.headers["x-auth-tenant"], "forged");
}

#[tokio::test]
async fn signin_redirect_uses_the_param_name() {
    let (addr, _seen) = auth_service().await;
    let mut a = auth(addr);
    a.signin = Some("https://login.example.com/start".into());
    a.signin_redirect_param = Some("next".into());
    let (p, _e) = proxy_for(a.clone()).await;
    let r = p.send(bearer(&p, "/page?x=1", "nobody")).await;
    r.assert_local(302);
    assert_eq!(
        r.headers["location"],
        "https://login.example.com/start?next=http%3A%2F%2Fapp.test%2Fpage%3Fx%3D1"
    );
    // A sign-in URL that sets the parameter itself is kept as written.
    a.signin = Some("https://login.example.com/start?next=/home".into());
    let (p, _e) = proxy_for(a).await;
    let r = p.send(bearer(&p, "/page", "nobody")).await;
    assert_eq!(r.headers["location"], "https://login.example.com/start?next=/home");
}

#[tokio::test]
async fn cached_answers_spare_the_auth_service() {
    let (addr, seen) = auth_service().await;
    let mut a = auth(addr);
    a.cache = Some(AuthCacheSpec {
        key: "$http_authorization".into(),
        valid: vec![CacheValid { codes: vec![200], seconds: 1 }],
    });
    let (p, _e) = proxy_for(a).await;
    let count = || seen.requests.load(Ordering::SeqCst);
    // The same Authorization twice: one subrequest; the cached answer still copies headers.
    assert_eq!(p.send(bearer(&p, "/a", "good")).await.echo().headers["x-auth-user"], "good");
    assert_eq!(p.send(bearer(&p, "/b", "good")).await.echo().headers["x-auth-user"], "good");
    assert_eq!(count(), 1);
    // Another one asks again.
    assert_eq!(p.send(bearer(&p, "/a", "other")).await.echo().headers["x-auth-user"], "other");
    assert_eq!(count(), 2);
    // Statuses the rules do not name (401 here) are not kept.
    p.send(bearer(&p, "/", "nobody")).await.assert_local(401);
    p.send(bearer(&p, "/", "nobody")).await.assert_local(401);
    assert_eq!(count(), 4);
    // Answers that set a cookie or forbid caching are not kept either.
    for token in ["cookie", "cookie", "nocache", "nocache"] {
        assert_eq!(p.send(bearer(&p, "/", token)).await.status, 200);
    }
    assert_eq!(count(), 8);
    // After the duration, the service is asked again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(p.send(bearer(&p, "/a", "good")).await.echo().headers["x-auth-user"], "good");
    assert_eq!(count(), 9);
}

#[tokio::test]
async fn auth_cookies_reach_the_client() {
    let (addr, _seen) = auth_service().await;
    // Default (ingress-nginx's `add_header` without `always`): on a 2xx answer, not on a 500
    // from the upstream nor on the service's 401.
    let (p, _e) = proxy_for(auth(addr)).await;
    let r = p.send(bearer(&p, "/", "cookie")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["set-cookie"], "auth=fresh; Path=/");
    let failing =
        p.req("app.test", "/").header("authorization", "Bearer cookie").header("x-echo-status", "500");
    let r = p.send(failing.body(empty()).unwrap()).await;
    assert_eq!(r.status, 500);
    assert!(!r.headers.contains_key("set-cookie"));
    let r = p.send(bearer(&p, "/", "denied-cookie")).await;
    r.assert_local(401);
    assert!(!r.headers.contains_key("set-cookie"));
    // auth-always-set-cookie: whatever the status.
    let mut a = auth(addr);
    a.always_set_cookie = true;
    let (p, _e) = proxy_for(a).await;
    let failing =
        p.req("app.test", "/").header("authorization", "Bearer cookie").header("x-echo-status", "500");
    let r = p.send(failing.body(empty()).unwrap()).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.headers["set-cookie"], "auth=fresh; Path=/");
    let r = p.send(bearer(&p, "/", "denied-cookie")).await;
    r.assert_local(401);
    assert_eq!(r.headers["set-cookie"], "auth=gone; Path=/");
}

#[tokio::test]
async fn connections_to_the_auth_service_are_kept_alive() {
    let (addr, seen) = auth_service().await;
    let (p, _e) = proxy_for(auth(addr)).await;
    for _ in 0..5 {
        assert_eq!(p.send(bearer(&p, "/", "good")).await.status, 200);
    }
    assert_eq!(seen.requests.load(Ordering::SeqCst), 5);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1, "one pooled connection served them all");
}
