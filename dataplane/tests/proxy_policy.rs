//! Route policies (ingress-nginx annotations, typed) seen through a real proxy and echo backend:
//! redirects, app-root, source ranges, body size limits, upstream vhost and forwarded prefix,
//! response and upstream headers.
#![allow(clippy::unwrap_used)]

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use support::*;
use weir_dataplane::model::{Redirect, RoutePolicy, SourceFilter};
use weir_dataplane::proxy::ProxyConfig;

fn redirect(location: &str, code: u16) -> RoutePolicy {
    RoutePolicy {
        redirect: Some(Box::new(Redirect { location: location.into(), code })),
        ..RoutePolicy::default()
    }
}

#[tokio::test]
async fn permanent_and_temporal_redirects() {
    let e = echo("e").await;
    let p = proxy(
        table()
            .host("old.test")
            .prefix("/", &to(&e))
            .policy(redirect("https://new.example.com/landing", 301))
            .prefix("/moved", &to(&e))
            .policy(redirect("https://elsewhere.example.com/", 308))
            .prefix("/keep", &to(&e))
            .build(),
    )
    .await;
    let r = p.get("old.test", "/anything?x=1").await;
    r.assert_local(301);
    assert_eq!(r.headers["location"], "https://new.example.com/landing");
    let r = p.get("old.test", "/moved/deeper").await;
    r.assert_local(308);
    assert_eq!(r.headers["location"], "https://elsewhere.example.com/");
    // A route without the policy on the same host is proxied as usual.
    assert_eq!(p.get("old.test", "/keep").await.name(), "e");
}

#[tokio::test]
async fn app_root_redirects_only_the_root() {
    let e = echo("e").await;
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&e))
            .policy(RoutePolicy { app_root: Some("/app1".into()), ..RoutePolicy::default() })
            .build(),
    )
    .await;
    let r = p.get("a.test", "/").await;
    r.assert_local(302);
    assert_eq!(r.headers["location"], "/app1");
    let seen = p.get("a.test", "/app1/page").await.echo();
    assert_eq!(seen.path, "/app1/page");
}

#[tokio::test]
async fn source_ranges_allow_and_deny() {
    let e = echo("e").await;
    let only = |allow: &str, deny: &str| RoutePolicy {
        source: SourceFilter {
            allow: allow.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect(),
            deny: deny.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect(),
        },
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/allowed", &to(&e))
            .policy(only("127.0.0.0/8", ""))
            .prefix("/elsewhere", &to(&e))
            .policy(only("192.0.2.0/24,2001:db8::/32", ""))
            .prefix("/denied", &to(&e))
            .policy(only("", "127.0.0.1"))
            .prefix("/deny-wins", &to(&e))
            .policy(only("127.0.0.0/8", "127.0.0.0/24"))
            .build(),
    )
    .await;
    // The test client connects from 127.0.0.1.
    assert_eq!(p.get("a.test", "/allowed").await.name(), "e");
    p.get("a.test", "/elsewhere").await.assert_local(403);
    p.get("a.test", "/denied/x").await.assert_local(403);
    p.get("a.test", "/deny-wins").await.assert_local(403);
    // A spoofed X-Forwarded-For does not change who the client is.
    let r = p
        .send(p.req("a.test", "/elsewhere").header("x-forwarded-for", "192.0.2.7").body(empty()).unwrap())
        .await;
    r.assert_local(403);
}

#[tokio::test]
async fn body_size_limits_by_length_and_while_streaming() {
    let e = echo("e").await;
    let limited = RoutePolicy { max_body_bytes: Some(1000), ..RoutePolicy::default() };
    let unlimited = RoutePolicy { max_body_bytes: Some(0), ..RoutePolicy::default() };
    let config = ProxyConfig { max_request_body: Some(2000), ..test_config() };
    let p = proxy_with(
        config,
        table()
            .host("a.test")
            .prefix("/small", &to(&e))
            .policy(limited)
            .prefix("/big", &to(&e))
            .policy(unlimited)
            .prefix("/", &to(&e))
            .build(),
    )
    .await;
    let post = |path: &str, n: usize| p.req("a.test", path).method("POST").body(full(vec![b'x'; n])).unwrap();
    assert_eq!(p.send(post("/small", 1000)).await.echo().body_bytes, 1000);
    p.send(post("/small", 1001)).await.assert_local(413);
    // The global limit applies where the route sets none; `0` on a route lifts it.
    assert_eq!(p.send(post("/other", 2000)).await.echo().body_bytes, 2000);
    p.send(post("/other", 2001)).await.assert_local(413);
    assert_eq!(p.send(post("/big", 100_000)).await.echo().body_bytes, 100_000);

    // Without Content-Length (chunked) the limit holds while streaming.
    let chunked = |n: usize| {
        let chunk = Bytes::from(vec![b'y'; 100]);
        let frames = futures_util::stream::iter((0..n).map(move |_| Ok(Frame::data(chunk.clone()))));
        p.req("a.test", "/small").method("POST").body(BodyExt::boxed(StreamBody::new(frames))).unwrap()
    };
    assert_eq!(p.send(chunked(10)).await.echo().body_bytes, 1000);
    p.send(chunked(11)).await.assert_local(413);
    // The proxy still serves afterwards.
    assert_eq!(p.get("a.test", "/small").await.name(), "e");
}

#[tokio::test]
async fn upstream_vhost_and_forwarded_prefix() {
    let e = echo("e").await;
    let p = proxy(
        table()
            .host("public.test")
            .prefix("/", &to(&e))
            .policy(RoutePolicy {
                upstream_host: Some("internal.svc.local".into()),
                forwarded_prefix: Some("/shop".into()),
                ..RoutePolicy::default()
            })
            .build(),
    )
    .await;
    let seen = p.get("public.test", "/cart").await.echo();
    assert_eq!(seen.host.as_deref(), Some("internal.svc.local"));
    assert_eq!(seen.headers["x-forwarded-host"], "public.test");
    assert_eq!(seen.headers["x-forwarded-prefix"], "/shop");
}

#[tokio::test]
async fn rewrite_target_with_captures() {
    let e = echo("e").await;
    let rewrite =
        |target: &str| RoutePolicy { rewrite_target: Some(target.into()), ..RoutePolicy::default() };
    let p = proxy(
        table()
            .host("a.test")
            .regex("(?i)/something(/|$)(.*)", &to(&e))
            .policy(rewrite("/$2"))
            .regex("(?i)/api/v1", &to(&e))
            .policy(rewrite("/"))
            .build(),
    )
    .await;
    let seen = p.get("a.test", "/something/new/page?x=1").await.echo();
    assert_eq!((seen.path.as_str(), seen.query.as_deref()), ("/new/page", Some("x=1")));
    assert_eq!(p.get("a.test", "/SOMETHING").await.echo().path, "/");
    // Without captures the whole path is replaced, as nginx's `rewrite` does.
    assert_eq!(p.get("a.test", "/api/v1/users/7").await.echo().path, "/");
    // The client's own request line is unchanged for a route without a rewrite.
    p.get("a.test", "/nothing").await.assert_local(404);
}

#[tokio::test]
async fn cors_preflight_and_response_headers() {
    use weir_dataplane::model::Cors;
    let e = echo("e").await;
    let cors = Cors {
        allow_origins: vec!["https://app.example.com".into(), "https://*.shop.example".into()],
        allow_methods: "GET, PUT, POST".into(),
        allow_headers: "Content-Type,Authorization".into(),
        expose_headers: "X-Total".into(),
        allow_credentials: true,
        max_age: 600,
    };
    let p = proxy(
        table()
            .host("api.test")
            .prefix("/", &to(&e))
            .policy(RoutePolicy { cors: Some(Box::new(cors)), ..RoutePolicy::default() })
            .build(),
    )
    .await;
    let preflight = |origin: &str| {
        p.req("api.test", "/items")
            .method("OPTIONS")
            .header("origin", origin)
            .header("access-control-request-method", "PUT")
            .body(empty())
            .unwrap()
    };
    let r = p.send(preflight("https://app.example.com")).await;
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_eq!(r.headers["access-control-allow-origin"], "https://app.example.com");
    assert_eq!(r.headers["access-control-allow-methods"], "GET, PUT, POST");
    assert_eq!(r.headers["access-control-allow-headers"], "Content-Type,Authorization");
    assert_eq!(r.headers["access-control-allow-credentials"], "true");
    assert_eq!(r.headers["access-control-max-age"], "600");
    assert_eq!(r.headers["vary"], "Origin");
    assert_eq!(p.send(preflight("https://x.shop.example")).await.status, 204);
    // Another origin's OPTIONS goes to the backend, with no CORS headers.
    let r = p.send(preflight("https://evil.example")).await;
    assert_eq!(r.echo().method, "OPTIONS");
    assert!(!r.headers.contains_key("access-control-allow-origin"));

    let r = p
        .send(p.req("api.test", "/items").header("origin", "https://app.example.com").body(empty()).unwrap())
        .await;
    assert_eq!(r.name(), "e");
    assert_eq!(r.headers["access-control-allow-origin"], "https://app.example.com");
    assert_eq!(r.headers["access-control-expose-headers"], "X-Total");
    assert!(!r.headers.contains_key("access-control-max-age"));
    let r = p.get("api.test", "/items").await;
    assert!(!r.headers.contains_key("access-control-allow-origin"), "no Origin, no CORS headers");
}

#[tokio::test]
async fn read_timeout_and_tries_per_route() {
    let e = echo("e").await;
    let (dead1, dead2) = (dead_addr().await, dead_addr().await);
    let slow = RoutePolicy { read_timeout_ms: Some(200), ..RoutePolicy::default() };
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/slow", &to(&e))
            .policy(slow)
            .prefix("/", &to(&e))
            .host("b.test")
            .prefix("/one-try", &backend("flaky", &[dead1, dead2, e.addr]))
            .policy(RoutePolicy { connect_tries: Some(1), ..RoutePolicy::default() })
            .build(),
    )
    .await;
    let delayed = |path: &str| p.req("a.test", path).header("x-echo-delay-ms", "1000").body(empty()).unwrap();
    p.send(delayed("/slow")).await.assert_local(504);
    // The proxy's own timeout (10 s in tests) still applies elsewhere.
    assert_eq!(p.send(delayed("/other")).await.name(), "e");
    // One try: a dead endpoint is not retried on another, so some requests fail with 502.
    let mut statuses = std::collections::BTreeSet::new();
    for _ in 0..6 {
        statuses.insert(p.get("b.test", "/one-try").await.status.as_u16());
    }
    assert!(statuses.contains(&502), "{statuses:?}");
}

#[tokio::test]
async fn rate_limits_after_the_burst_and_survive_a_publish() {
    use weir_dataplane::model::RateLimit;
    let e = echo("e").await;
    let limited = |status: u16, exempt: &str| RoutePolicy {
        rate_limit: Some(Box::new(RateLimit {
            rps: Some(1),
            rpm: None,
            burst_multiplier: 2,
            exempt: exempt.split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect(),
            status,
        })),
        ..RoutePolicy::default()
    };
    let build = || {
        table()
            .host("a.test")
            .prefix("/", &to(&e))
            .policy(limited(503, ""))
            .host("b.test")
            .prefix("/", &to(&e))
            .policy(limited(429, ""))
            .host("c.test")
            .prefix("/", &to(&e))
            .policy(limited(503, "127.0.0.0/8"))
            .build()
    };
    let p = proxy(build()).await;
    // 1 r/s with a burst of 2: three pass at once, the next is refused at once.
    for _ in 0..3 {
        assert_eq!(p.get("a.test", "/").await.name(), "e");
    }
    p.get("a.test", "/").await.assert_local(503);
    for _ in 0..3 {
        assert_eq!(p.get("b.test", "/").await.name(), "e");
    }
    p.get("b.test", "/").await.assert_local(429);
    // Publishing the same limits again does not reset them.
    p.proxy.publish(build()).unwrap();
    p.get("a.test", "/").await.assert_local(503);
    // Exempt clients are never limited.
    for _ in 0..10 {
        assert_eq!(p.get("c.test", "/").await.name(), "e");
    }
    // After a second, one more request passes.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(p.get("a.test", "/").await.name(), "e");
}

#[tokio::test]
async fn basic_auth_challenge_and_success() {
    use base64::Engine as _;
    use weir_dataplane::model::BasicAuth;
    let e = echo("e").await;
    let users = [
        ("alice", "$apr1$abcdefgh$r/p0TRuenjeL4j5EsxbGb/"), // p@ssw0rd
        ("bob", "$2b$05$abcdefghijklmnopqrstuuKwWV7ESJpzKzf9FQg57dBvMuv92X9HS"), // letmein
        ("carol", "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ="),     // secret
    ];
    let auth = BasicAuth {
        realm: "Staff only".into(),
        users: users.iter().map(|(u, h)| (u.to_string(), h.to_string())).collect(),
    };
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&e))
            .policy(RoutePolicy { basic_auth: Some(Box::new(auth)), ..RoutePolicy::default() })
            .build(),
    )
    .await;
    let with = |user: &str, pass: &str| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        p.req("a.test", "/private").header("authorization", format!("Basic {token}")).body(empty()).unwrap()
    };
    let r = p.get("a.test", "/private").await;
    r.assert_local(401);
    assert_eq!(r.headers["www-authenticate"], "Basic realm=\"Staff only\"");
    p.send(with("alice", "wrong")).await.assert_local(401);
    p.send(with("mallory", "p@ssw0rd")).await.assert_local(401);
    for (user, pass) in [("alice", "p@ssw0rd"), ("bob", "letmein"), ("carol", "secret")] {
        let seen = p.send(with(user, pass)).await.echo();
        assert_eq!(seen.path, "/private", "{user}");
        assert!(seen.headers["authorization"].starts_with("Basic "), "passed on, as nginx does");
    }
}

/// A stand-in authentication service: `Bearer good` → 200 with `X-Auth-User: alice`,
/// `Bearer banned` → 403, `Bearer broken` → 500, else 401 with a challenge. It answers
/// `X-Original-URL` back in `X-Seen-Original` so that tests can check it.
async fn auth_service() -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
                    let mut resp = http::Response::builder();
                    resp = match auth {
                        "Bearer good" => {
                            resp.status(200).header("x-auth-user", "alice").header("x-other", "no")
                        }
                        "Bearer banned" => resp.status(403),
                        "Bearer broken" => resp.status(500),
                        _ => resp.status(401).header("www-authenticate", "Bearer realm=\"sso\""),
                    };
                    if let Some(original) = req.headers().get("x-original-url") {
                        resp = resp.header("x-seen-original", original.clone());
                    }
                    Ok::<_, std::convert::Infallible>(resp.body(Full::new(Bytes::new())).unwrap())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn external_auth_subrequest() {
    use weir_dataplane::model::ExternalAuth;
    let e = echo("e").await;
    let auth = auth_service().await;
    let ext = |signin: Option<&str>| RoutePolicy {
        external_auth: Some(Box::new(ExternalAuth {
            url: format!("http://{auth}/check?host=$host"),
            method: "GET".into(),
            signin: signin.map(str::to_string),
            response_headers: vec!["X-Auth-User".into()],
            request_redirect: None,
            ..ExternalAuth::default()
        })),
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(ext(None))
            .host("sso.test")
            .prefix("/", &to(&e))
            .policy(ext(Some("https://login.example.com/start")))
            .build(),
    )
    .await;
    let with = |host: &str, token: &str| {
        p.req(host, "/page?x=1").header("authorization", format!("Bearer {token}")).body(empty()).unwrap()
    };
    // 2xx: through, with the named header copied (and only that one).
    let seen = p.send(with("app.test", "good")).await.echo();
    assert_eq!(seen.path, "/page");
    assert_eq!(seen.headers["x-auth-user"], "alice");
    assert!(!seen.headers.contains_key("x-other"));
    // 401 and 403 reach the client; a 401's challenge too.
    let r = p.send(with("app.test", "nobody")).await;
    r.assert_local(401);
    assert_eq!(r.headers["www-authenticate"], "Bearer realm=\"sso\"");
    p.send(with("app.test", "banned")).await.assert_local(403);
    // Any other answer is a 500.
    p.send(with("app.test", "broken")).await.assert_local(500);
    // With auth-signin, a 401 becomes a redirect carrying the original URL.
    let r = p.send(with("sso.test", "nobody")).await;
    r.assert_local(302);
    assert_eq!(
        r.headers["location"],
        "https://login.example.com/start?rd=http%3A%2F%2Fsso.test%2Fpage%3Fx%3D1"
    );
    // A service that is down denies (500), never lets through.
    let down = dead_addr().await;
    let p2 = proxy(
        table()
            .host("app.test")
            .prefix("/", &to(&e))
            .policy(RoutePolicy {
                external_auth: Some(Box::new(ExternalAuth {
                    url: format!("http://{down}/check"),
                    method: "GET".into(),
                    signin: None,
                    response_headers: vec![],
                    request_redirect: None,
                    ..ExternalAuth::default()
                })),
                ..RoutePolicy::default()
            })
            .build(),
    )
    .await;
    p2.send(p2.req("app.test", "/").header("authorization", "Bearer good").body(empty()).unwrap())
        .await
        .assert_local(500);
}

#[tokio::test]
async fn canary_by_header_cookie_and_weight() {
    use weir_dataplane::model::Canary;
    let (main, canary) = (echo("main").await, echo("canary").await);
    let canary_be = to(&canary);
    let policy = |weight: u32| RoutePolicy {
        canary: Some(Box::new(Canary {
            backend: canary_be.id.clone(),
            weight,
            weight_total: 100,
            header: Some("X-Canary".into()),
            header_value: None,
            header_pattern: None,
            cookie: Some("canary".into()),
        })),
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&main))
            .policy(policy(30))
            .host("b.test")
            .prefix("/", &to(&main))
            .policy(policy(0))
            .backend(&canary_be)
            .build(),
    )
    .await;
    let with = |host: &str, name: &'static str, value: &'static str| {
        p.req(host, "/").header(name, value).body(empty()).unwrap()
    };
    assert_eq!(p.send(with("b.test", "x-canary", "always")).await.name(), "canary");
    assert_eq!(p.send(with("a.test", "x-canary", "never")).await.name(), "main");
    assert_eq!(p.send(with("b.test", "cookie", "session=1; canary=always")).await.name(), "canary");
    assert_eq!(p.get("b.test", "/").await.name(), "main", "weight 0: never by chance");
    // 30 of 100 by weight: over 1000 requests, 300 expected; 4.5 standard deviations (≈ 65) of
    // slack make a false failure about one in 150,000 runs.
    let mut to_canary = 0;
    for _ in 0..1000 {
        if p.get("a.test", "/").await.name() == "canary" {
            to_canary += 1;
        }
    }
    assert!((235..=365).contains(&to_canary), "{to_canary} of 1000 went to the canary");
}

/// Cookie affinity with a `route` cookie on `/`, no other attributes.
fn route_cookie() -> weir_dataplane::model::CookieAffinity {
    weir_dataplane::model::CookieAffinity {
        name: "route".into(),
        path: "/".into(),
        max_age: None,
        expires: None,
        domain: None,
        same_site: None,
        secure: false,
        legacy_canary: false,
    }
}

/// `affinity-canary-behavior`: with `sticky` (the default) a session pinned by the affinity cookie
/// stays on the main backend or the canary, whatever the weight draws; with `legacy` the weight
/// decides each request and the cookie only picks within the chosen backend.
#[tokio::test]
async fn affinity_sticks_across_the_canary_unless_legacy() {
    use weir_dataplane::model::{Balance, Canary, CookieAffinity};
    let (main, canary) = (echo("main").await, echo("canary").await);
    let canary_be = to(&canary);
    let policy = |legacy_canary: bool| RoutePolicy {
        canary: Some(Box::new(Canary {
            backend: canary_be.id.clone(),
            weight: 50,
            weight_total: 100,
            header: None,
            header_value: None,
            header_pattern: None,
            cookie: None,
        })),
        balance: Balance::Cookie(Box::new(CookieAffinity { legacy_canary, ..route_cookie() })),
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("sticky.test")
            .prefix("/", &to(&main))
            .policy(policy(false))
            .host("legacy.test")
            .prefix("/", &to(&main))
            .policy(policy(true))
            .backend(&canary_be)
            .build(),
    )
    .await;
    for (host, sticks) in [("sticky.test", true), ("legacy.test", false)] {
        // One session pinned to each backend.
        let mut sessions = std::collections::BTreeMap::new();
        for _ in 0..200 {
            let r = p.get(host, "/").await;
            if let Some(set) = r.headers.get("set-cookie") {
                let pair = set.to_str().unwrap().split(';').next().unwrap().to_string();
                sessions.entry(r.name()).or_insert(pair);
            }
            if sessions.len() == 2 {
                break;
            }
        }
        assert_eq!(sessions.len(), 2, "{host}: both backends answered new sessions");
        for (pinned_to, cookie) in &sessions {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..40 {
                let req = p.req(host, "/").header("cookie", cookie.as_str()).body(empty()).unwrap();
                seen.insert(p.send(req).await.name());
            }
            if sticks {
                assert_eq!(seen, [pinned_to.clone()].into(), "{host}: the session stays on {pinned_to}");
            } else {
                // 40 draws at 50 %: both backends, but for a one in 2^39 chance.
                assert_eq!(seen.len(), 2, "{host}: the weight decides each request ({seen:?})");
            }
        }
    }
}

#[tokio::test]
async fn cookie_affinity_sticks_and_moves_when_the_endpoint_goes() {
    use weir_dataplane::model::{Balance, CookieAffinity};
    let eps = [echo("e0").await, echo("e1").await, echo("e2").await];
    let addrs: Vec<_> = eps.iter().map(|e| e.addr).collect();
    let affinity = RoutePolicy {
        balance: Balance::Cookie(Box::new(CookieAffinity {
            name: "route".into(),
            path: "/".into(),
            max_age: Some(3600),
            expires: Some(3600),
            domain: None,
            same_site: Some("Lax".into()),
            secure: false,
            legacy_canary: false,
        })),
        ..RoutePolicy::default()
    };
    let build = |addrs: &[std::net::SocketAddr]| {
        table().host("a.test").prefix("/", &backend("web", addrs)).policy(affinity.clone()).build()
    };
    let p = proxy(build(&addrs)).await;
    let first = p.get("a.test", "/").await;
    let cookie = first.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.starts_with("route="), "{cookie}");
    for attr in ["; Path=/", "; Max-Age=3600", "; SameSite=Lax", "; HttpOnly", "; Expires="] {
        assert!(cookie.contains(attr), "{cookie} lacks {attr}");
    }
    let pair = cookie.split(';').next().unwrap().to_string();
    let stuck = first.name();
    for _ in 0..10 {
        let r = p.send(p.req("a.test", "/").header("cookie", pair.as_str()).body(empty()).unwrap()).await;
        assert_eq!(r.name(), stuck, "the session sticks");
        assert!(!r.headers.contains_key("set-cookie"), "no new cookie while it sticks");
    }
    // Without the cookie, round robin spreads new sessions.
    let mut fresh = std::collections::BTreeSet::new();
    for _ in 0..6 {
        fresh.insert(p.get("a.test", "/").await.name());
    }
    assert_eq!(fresh.len(), 3, "{fresh:?}");
    // The endpoint leaves: the session moves and learns its new endpoint.
    let rest: Vec<_> = eps.iter().filter(|e| e.name != stuck).map(|e| e.addr).collect();
    p.proxy.publish(build(&rest)).unwrap();
    let r = p.send(p.req("a.test", "/").header("cookie", pair.as_str()).body(empty()).unwrap()).await;
    assert_ne!(r.name(), stuck);
    assert!(r.headers["set-cookie"].to_str().unwrap().starts_with("route="));
}

/// `session-cookie-change-on-failure` (weir's only behaviour): a session pinned to an endpoint
/// that refuses connections is served by another, and the answer re-pins it there.
#[tokio::test]
async fn cookie_affinity_moves_when_the_endpoint_fails() {
    use weir_dataplane::model::Balance;
    let live = echo("live").await;
    let dead = dead_addr().await;
    let policy = RoutePolicy { balance: Balance::Cookie(Box::new(route_cookie())), ..RoutePolicy::default() };
    let p =
        proxy(table().host("a.test").prefix("/", &backend("web", &[live.addr, dead])).policy(policy).build())
            .await;
    // The cookie of the endpoint that refuses (ids are a stable hash of the address).
    let pinned =
        format!("route={:016x}", weir_dataplane::http_util::stable_hash(dead.to_string().as_bytes()));
    let live_cookie =
        format!("route={:016x}", weir_dataplane::http_util::stable_hash(live.addr.to_string().as_bytes()));
    for _ in 0..3 {
        let r = p.send(p.req("a.test", "/").header("cookie", pinned.as_str()).body(empty()).unwrap()).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.name(), "live");
        let set = r.headers["set-cookie"].to_str().unwrap();
        assert!(set.starts_with(&live_cookie), "{set}");
    }
    let r = p.send(p.req("a.test", "/").header("cookie", live_cookie.as_str()).body(empty()).unwrap()).await;
    assert_eq!(r.name(), "live");
    assert!(!r.headers.contains_key("set-cookie"), "the new pin holds");
}

#[tokio::test]
async fn hash_by_request_uri_is_consistent() {
    use weir_dataplane::model::Balance;
    let eps = [echo("e0").await, echo("e1").await, echo("e2").await];
    let addrs: Vec<_> = eps.iter().map(|e| e.addr).collect();
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &backend("web", &addrs))
            .policy(RoutePolicy { balance: Balance::Hash("$request_uri".into()), ..RoutePolicy::default() })
            .build(),
    )
    .await;
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..30 {
        let path = format!("/item/{i}");
        let name = p.get("a.test", &path).await.name();
        for _ in 0..3 {
            assert_eq!(p.get("a.test", &path).await.name(), name, "{path} moved");
        }
        *seen.entry(name).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 3, "30 keys spread over all endpoints: {seen:?}");
}

/// A backend that answers `slow` after `delay`.
async fn slow_service(delay: std::time::Duration) -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = service_fn(move |_req: http::Request<hyper::body::Incoming>| async move {
                    tokio::time::sleep(delay).await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(
                        b"slow",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn ewma_sends_most_requests_to_the_fast_endpoint() {
    use weir_dataplane::model::Balance;
    let fast = echo("fast").await;
    let slow = slow_service(std::time::Duration::from_millis(30)).await;
    let policy = |balance| RoutePolicy { balance, ..RoutePolicy::default() };
    let p = proxy(
        table()
            .host("ewma.test")
            .prefix("/", &backend("web", &[fast.addr, slow]))
            .policy(policy(Balance::Ewma))
            .host("rr.test")
            .prefix("/", &backend("web", &[fast.addr, slow]))
            .policy(policy(Balance::RoundRobin))
            .build(),
    )
    .await;
    let mut to_slow = 0;
    for _ in 0..40 {
        if p.get("ewma.test", "/").await.text() == "slow" {
            to_slow += 1;
        }
    }
    // Round robin would send 20 of 40 to the slow endpoint; EWMA learns within a few requests.
    assert!(to_slow <= 8, "{to_slow} of 40 requests went to the slow endpoint");
    let mut rr_slow = 0;
    for _ in 0..10 {
        if p.get("rr.test", "/").await.text() == "slow" {
            rr_slow += 1;
        }
    }
    assert_eq!(rr_slow, 5, "round robin alternates");
}

#[tokio::test]
async fn custom_http_errors_come_from_the_error_backend() {
    use weir_dataplane::model::CustomErrors;
    let (app, pages) = (echo("app").await, echo("pages").await);
    let pages_be = to(&pages);
    let empty_be = backend("empty", &[]);
    let errors = RoutePolicy {
        custom_errors: Some(Box::new(CustomErrors { codes: vec![404, 503], backend: pages_be.id.clone() })),
        ..RoutePolicy::default()
    };
    let p = proxy(
        table()
            .host("a.test")
            .prefix("/", &to(&app))
            .policy(errors.clone())
            .prefix("/down", &empty_be)
            .policy(errors)
            .backend(&pages_be)
            .build(),
    )
    .await;
    let r = p
        .send(
            p.req("a.test", "/missing?q=1")
                .header("x-echo-status", "404")
                .header("accept", "text/html")
                .body(empty())
                .unwrap(),
        )
        .await;
    let seen = r.echo();
    assert_eq!(seen.name, "pages");
    assert_eq!(seen.path, "/");
    assert_eq!(seen.headers["x-code"], "404");
    assert_eq!(seen.headers["x-format"], "text/html");
    assert_eq!(seen.headers["x-original-uri"], "/missing?q=1");
    assert_eq!(seen.headers["x-namespace"], "test");
    assert_eq!(seen.headers["x-ingress-name"], "app");
    assert_eq!(seen.headers["x-service-name"], "app");
    // The proxy's own 503 (no endpoint) is replaced too.
    assert_eq!(p.get("a.test", "/down").await.echo().headers["x-code"], "503");
    // Other statuses pass through untouched.
    let r = p.send(p.req("a.test", "/x").header("x-echo-status", "500").body(empty()).unwrap()).await;
    assert_eq!(r.status.as_u16(), 500);
    assert!(r.text().contains("\"name\":\"app\""), "{}", r.text());
}

#[tokio::test]
async fn response_and_upstream_headers() {
    let e = echo("e").await;
    let map = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    // `custom-headers` on /custom (one replaces the echo's own Content-Type), nothing of its
    // own on /plain.
    let custom = RoutePolicy {
        response_headers: map(&[("x-frame-options", "DENY"), ("content-type", "text/x-custom")]),
        ..RoutePolicy::default()
    };
    let mut t =
        table().host("a.test").prefix("/custom", &to(&e)).policy(custom).prefix("/plain", &to(&e)).build();
    // `add-headers` and `proxy-set-headers`.
    t.settings.response_headers = map(&[("x-frame-options", "SAMEORIGIN"), ("x-served-by", "weir")]);
    t.settings.upstream_headers = map(&[("x-team", "ops"), ("x-forwarded-proto", "https")]);
    let p = proxy(t).await;

    let r = p.get("a.test", "/custom/x").await;
    assert_eq!(r.headers["x-frame-options"], "DENY", "the route's header wins over add-headers");
    assert_eq!(r.headers["content-type"], "text/x-custom", "the upstream's header is replaced");
    assert_eq!(r.headers.get_all("content-type").iter().count(), 1);
    assert_eq!(r.headers["x-served-by"], "weir");
    let seen = r.echo();
    assert_eq!(seen.headers["x-team"], "ops");
    assert_eq!(seen.headers["x-forwarded-proto"], "https", "proxy-set-headers come after X-Forwarded-*");

    let r = p.get("a.test", "/plain").await;
    assert_eq!(r.headers["x-frame-options"], "SAMEORIGIN");
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.echo().headers["x-team"], "ops");

    // The proxy's own errors carry add-headers.
    let r = p.send(p.req("a.test", "/").body(empty()).unwrap()).await;
    r.assert_local(404);
    assert_eq!(r.headers["x-served-by"], "weir");
    assert_eq!(r.headers["x-frame-options"], "SAMEORIGIN");
}

#[tokio::test]
async fn app_root_redirect_carries_custom_headers() {
    let e = echo("e").await;
    let policy = RoutePolicy {
        response_headers: [("x-frame-options".to_string(), "DENY".to_string())].into(),
        app_root: Some("/app".into()),
        ..RoutePolicy::default()
    };
    let p = proxy(table().host("a.test").prefix("/", &to(&e)).policy(policy).build()).await;
    let r = p.get("a.test", "/").await;
    r.assert_local(302);
    assert_eq!(r.headers["x-frame-options"], "DENY");
}

/// An upstream that never completes a TCP handshake: a listener with a full accept queue (the
/// kernel drops further SYNs). Returns its address and what must stay alive.
async fn unreachable_upstream() -> (std::net::SocketAddr, Vec<tokio::net::TcpStream>, tokio::net::TcpListener)
{
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(
            std::time::Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(stream)) => queued.push(stream),
            _ => return (addr, queued, listener),
        }
    }
    panic!("the accept queue never filled");
}

/// `proxy-connect-timeout`: a route's own connect timeout answers 504 when the upstream does not
/// accept in time, where the proxy's (here 30 s) would still be waiting.
#[tokio::test]
async fn route_connect_timeout() {
    let (addr, _queued, _listener) = unreachable_upstream().await;
    let config = ProxyConfig { connect_timeout: std::time::Duration::from_secs(30), ..test_config() };
    let p = proxy_with(
        config,
        table()
            .host("short.test")
            .prefix("/", &backend("web", &[addr]))
            .policy(RoutePolicy { connect_timeout_ms: Some(300), ..RoutePolicy::default() })
            .host("default.test")
            .prefix("/", &backend("web", &[addr]))
            .build(),
    )
    .await;
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), p.get("short.test", "/"))
        .await
        .expect("the route's 300 ms connect timeout answers well within 10 s");
    r.assert_local(504);
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(2), p.get("default.test", "/")).await.is_err(),
        "without it the proxy's 30 s connect timeout is still waiting"
    );
}
