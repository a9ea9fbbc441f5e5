#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::*;
use crate::translate::warnings::{Severity, Warning};

fn parse_all(pairs: &[(&str, &str)]) -> (RoutePolicy, Vec<Warning>) {
    let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut warnings = Warnings::default();
    let secrets = secrets();
    let config_maps = config_maps();
    let refs = Refs {
        secrets: &secrets,
        config_maps: &config_maps,
        allowed_response_headers: None,
        guards: &crate::translate::annotations::risk::DEFAULTS,
    };
    let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
    (parsed.policy, warnings.finish())
}

/// Secrets in namespace `ns`: `htpasswd` (auth-file) and `users` (auth-map).
fn secrets() -> crate::snapshot::Objects<k8s_openapi::api::core::v1::Secret> {
    use k8s_openapi::ByteString;
    let secret = |pairs: &[(&str, &str)]| k8s_openapi::api::core::v1::Secret {
        data: Some(pairs.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    };
    crate::snapshot::Objects::from(BTreeMap::from([
        (
            ObjectRef::new("ns", "htpasswd"),
            secret(&[("auth", "alice:$apr1$abcdefgh$r/p0TRuenjeL4j5EsxbGb/\nbob:nohash\n")]),
        ),
        (ObjectRef::new("ns", "users"), secret(&[("carol", "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=")])),
    ]))
}

fn refs(secrets: &crate::snapshot::Objects<k8s_openapi::api::core::v1::Secret>) -> Refs<'_> {
    Refs {
        secrets,
        config_maps: &EMPTY_CONFIG_MAPS,
        allowed_response_headers: None,
        guards: &crate::translate::annotations::risk::DEFAULTS,
    }
}

static EMPTY_CONFIG_MAPS: crate::snapshot::Objects<k8s_openapi::api::core::v1::ConfigMap> =
    crate::snapshot::Objects::new();

fn nginx(name: &str) -> String {
    format!("{NGINX_PREFIX}{name}")
}

fn one(name: &str, value: &str) -> (RoutePolicy, Vec<Warning>) {
    parse_all(&[(&nginx(name), value)])
}

fn reasons(w: &[Warning]) -> Vec<(Severity, Reason)> {
    w.iter().map(|w| (w.severity, w.reason)).collect()
}

#[test]
fn redirects_accepted_and_rejected() {
    let (p, w) = one("permanent-redirect", "https://new.example.com/");
    assert_eq!(
        p.redirect,
        Some(Box::new(Redirect { location: "https://new.example.com/".into(), code: 301 }))
    );
    assert!(w.is_empty(), "{w:?}");

    let (p, _) = parse_all(&[
        (&nginx("permanent-redirect"), "https://new.example.com/"),
        (&nginx("permanent-redirect-code"), "308"),
    ]);
    assert_eq!(p.redirect.unwrap().code, 308);

    let (p, w) = parse_all(&[
        (&nginx("permanent-redirect"), "https://p.example.com/"),
        (&nginx("temporal-redirect"), "https://t.example.com/"),
    ]);
    assert_eq!(p.redirect, Some(Box::new(Redirect { location: "https://t.example.com/".into(), code: 302 })));
    assert_eq!(reasons(&w), [(Severity::Warning, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("temporal-redirect takes precedence"), "{}", w[0].message);

    let (p, w) = one("permanent-redirect", "/relative");
    assert_eq!(p.redirect, None);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("nginx.ingress.kubernetes.io/permanent-redirect"), "{}", w[0].message);
    assert!(w[0].message.contains("\"/relative\""), "{}", w[0].message);

    let (p, w) = parse_all(&[
        (&nginx("permanent-redirect"), "https://p.example.com/"),
        (&nginx("permanent-redirect-code"), "200"),
    ]);
    assert_eq!(p.redirect.unwrap().code, 301, "a bad code keeps the default");
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

#[test]
fn app_root_prefix_and_vhost() {
    let (p, w) = parse_all(&[
        (&nginx("app-root"), "/app1"),
        (&nginx("x-forwarded-prefix"), "/shop"),
        (&nginx("upstream-vhost"), "internal.example:8080"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.app_root.as_deref(), Some("/app1"));
    assert_eq!(p.forwarded_prefix.as_deref(), Some("/shop"));
    assert_eq!(p.upstream_host.as_deref(), Some("internal.example:8080"));

    let (p, w) = one("upstream-vhost", "$host");
    assert_eq!(p.upstream_host, None);
    assert!(w[0].message.contains("nginx variables"), "{}", w[0].message);
    let (p, w) = one("app-root", "app1");
    assert_eq!(p.app_root, None);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

#[test]
fn body_size() {
    assert_eq!(one("proxy-body-size", "8m").0.max_body_bytes, Some(8 << 20));
    assert_eq!(one("proxy-body-size", "0").0.max_body_bytes, Some(0));
    let (p, w) = one("proxy-body-size", "8 megs");
    assert_eq!(p.max_body_bytes, None);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

#[test]
fn source_ranges() {
    let (p, w) = parse_all(&[
        (&nginx("whitelist-source-range"), "10.0.0.0/8, 192.168.0.1"),
        (&nginx("denylist-source-range"), "10.9.0.0/16"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.source.allow.len(), 2);
    assert_eq!(p.source.deny.len(), 1);
    // The new name wins over the old one, with a warning.
    let (p, w) = parse_all(&[
        (&nginx("whitelist-source-range"), "10.0.0.0/8"),
        (&nginx("allowlist-source-range"), "192.0.2.0/24"),
    ]);
    assert_eq!(p.source.allow, vec!["192.0.2.0/24".parse().unwrap()]);
    assert_eq!(reasons(&w), [(Severity::Warning, Reason::InvalidAnnotation)]);
    // An invalid list fails closed: nobody gets in.
    let (p, w) = one("allowlist-source-range", "10.0.0.0/8, 10.0.0.300");
    assert!(!p.source.permits("10.1.1.1".parse().unwrap()));
    assert!(!p.source.permits("::1".parse().unwrap()));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("deny every client"), "{}", w[0].message);
}

#[test]
fn weir_prefix_wins() {
    let (p, w) =
        parse_all(&[(&nginx("proxy-body-size"), "1m"), (&format!("{WEIR_PREFIX}proxy-body-size"), "2m")]);
    assert_eq!(p.max_body_bytes, Some(2 << 20));
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn snippets_refused_unsupported_warned_unknown_warned() {
    let (p, w) = parse_all(&[
        (&nginx("configuration-snippet"), "more_set_headers \"X: y\";"),
        (&nginx("server-snippet"), "location /x { return 200; }"),
        (&nginx("enable-modsecurity"), "true"),
        (&nginx("proxy-bodysize"), "1m"),
        ("example.com/other", "not ours"),
    ]);
    assert_eq!(p, RoutePolicy::default());
    assert_eq!(
        reasons(&w),
        [
            (Severity::Error, Reason::RefusedAnnotation),
            (Severity::Error, Reason::RefusedAnnotation),
            (Severity::Warning, Reason::UnsupportedAnnotation),
            (Severity::Warning, Reason::UnknownAnnotation),
        ]
    );
    assert!(w.iter().any(|w| w.message.contains("configuration-snippet") && w.message.contains("injection")));
    assert!(w.iter().any(|w| w.message.contains("proxy-bodysize") && w.message.contains("unknown")));
    // Not planned: the warning says what to use instead.
    assert!(
        w.iter().any(|w| w.message.contains("enable-modsecurity") && w.message.contains("Core Rule Set"))
    );
}

#[test]
fn client_certificate_annotations_do_not_close_the_routes() {
    // auth-tls-match-cn is applied per host by the TLS layer (see tls-client-auth's golden
    // fixture), not by the route's source filter.
    let (p, w) = parse_all(&[(&nginx("auth-tls-match-cn"), "CN=admin")]);
    assert!(p.source.permits("127.0.0.1".parse().unwrap()));
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn basic_auth_from_secrets() {
    let (p, w) = parse_all(&[
        (&nginx("auth-type"), "basic"),
        (&nginx("auth-secret"), "htpasswd"),
        (&nginx("auth-realm"), "Staff"),
    ]);
    let auth = p.basic_auth.unwrap();
    assert_eq!(auth.realm, "Staff");
    assert_eq!(auth.users.keys().collect::<Vec<_>>(), ["alice"]);
    assert!(p.source.is_empty());
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "bob's line is reported");
    assert!(
        w[0].message.contains("line 2: not user:hash") || w[0].message.contains("line 2"),
        "{}",
        w[0].message
    );

    let (p, w) = parse_all(&[
        (&nginx("auth-type"), "basic"),
        (&nginx("auth-secret"), "ns/users"),
        (&nginx("auth-secret-type"), "auth-map"),
    ]);
    assert_eq!(p.basic_auth.unwrap().users.keys().collect::<Vec<_>>(), ["carol"]);
    assert!(w.is_empty(), "{w:?}");

    // Whatever goes wrong, the routes fail closed.
    for pairs in [
        vec![(nginx("auth-type"), "basic"), (nginx("auth-secret"), "missing")],
        vec![(nginx("auth-type"), "basic")],
        vec![(nginx("auth-type"), "digest"), (nginx("auth-secret"), "htpasswd")],
        vec![(nginx("auth-type"), "basic"), (nginx("auth-secret"), "other/htpasswd")],
        vec![(nginx("auth-type"), "basic"), (nginx("auth-secret"), "users")],
    ] {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let (p, w) = parse_all(&pairs);
        assert!(p.basic_auth.is_none(), "{pairs:?}");
        assert!(!p.source.permits("127.0.0.1".parse().unwrap()), "{pairs:?} must fail closed");
        assert!(w.iter().any(|w| w.severity == Severity::Error), "{pairs:?}: {w:?}");
    }
}

#[test]
fn catalogue_has_no_duplicates() {
    let mut names: Vec<_> = CATALOGUE.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len());
}

#[test]
fn cors_defaults_and_settings() {
    let (p, w) = one("enable-cors", "true");
    assert!(w.is_empty(), "{w:?}");
    let cors = p.cors.unwrap();
    assert_eq!(cors.allow_origins, ["*"]);
    assert_eq!(cors.allow_methods, "GET, PUT, POST, DELETE, PATCH, OPTIONS");
    assert!(cors.allow_credentials);
    assert_eq!(cors.max_age, 1_728_000);

    let (p, w) = parse_all(&[
        (&nginx("enable-cors"), "true"),
        (&nginx("cors-allow-origin"), "https://app.example.com"),
        (&nginx("cors-allow-credentials"), "false"),
        (&nginx("cors-max-age"), "soon"),
    ]);
    let cors = p.cors.unwrap();
    assert_eq!(cors.allow_origins, ["https://app.example.com"]);
    assert!(!cors.allow_credentials);
    assert_eq!(cors.max_age, 1_728_000, "an invalid max age keeps the default");
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);

    let (p, w) = one("cors-allow-origin", "https://app.example.com");
    assert_eq!(p.cors, None);
    assert_eq!(reasons(&w), [(Severity::Warning, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("no effect without enable-cors"), "{}", w[0].message);
}

#[test]
fn timeouts_and_tries() {
    let (p, w) =
        parse_all(&[(&nginx("proxy-read-timeout"), "120"), (&nginx("proxy-next-upstream-tries"), "5")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((p.read_timeout_ms, p.connect_tries), (Some(120_000), Some(5)));
    let (p, w) = one("proxy-read-timeout", "forever");
    assert_eq!(p.read_timeout_ms, None);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    let (p, w) = one("proxy-connect-timeout", "500ms");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.connect_timeout_ms, Some(500));
    assert_eq!(one("proxy-connect-timeout", "15").0.connect_timeout_ms, Some(15_000));
    let (p, w) = one("proxy-connect-timeout", "0");
    assert_eq!(p.connect_timeout_ms, None);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

#[test]
fn next_upstream_and_send_timeout() {
    use weir_dataplane::model::RetryOn;
    let (p, w) = parse_all(&[
        (&nginx("proxy-next-upstream"), "http_502  error timeout http_502 non_idempotent"),
        (&nginx("proxy-next-upstream-timeout"), "0"),
        (&nginx("proxy-send-timeout"), "5"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        p.next_upstream,
        Some(vec![RetryOn::Error, RetryOn::Timeout, RetryOn::Http502, RetryOn::NonIdempotent])
    );
    assert_eq!(p.next_upstream_timeout_ms, Some(0));
    assert_eq!(p.send_timeout_ms, Some(5_000));
    // `off` wins over the rest, as in nginx.
    assert_eq!(one("proxy-next-upstream", "off").0.next_upstream, Some(vec![]));
    assert_eq!(one("proxy-next-upstream", "error off").0.next_upstream, Some(vec![]));
    assert_eq!(one("proxy-next-upstream-timeout", "1500ms").0.next_upstream_timeout_ms, Some(1_500));
    // weir's own prefix wins.
    let (p, w) =
        parse_all(&[(&nginx("proxy-next-upstream"), "error"), ("weir.dev/proxy-next-upstream", "http_503")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.next_upstream, Some(vec![RetryOn::Http503]));
    for (name, bad) in [
        ("proxy-next-upstream", "http_501"),
        ("proxy-next-upstream", "error;timeout"),
        ("proxy-next-upstream", ""),
        ("proxy-next-upstream-timeout", "-1"),
        ("proxy-send-timeout", "0"),
        ("proxy-send-timeout", "1 minute"),
    ] {
        let (p, w) = one(name, bad);
        assert_eq!(
            (p.next_upstream, p.next_upstream_timeout_ms, p.send_timeout_ms),
            (None, None, None),
            "{name}: {bad:?}"
        );
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{name}: {bad:?}");
        assert!(w[0].message.contains(name), "{}", w[0].message);
    }
    let (_, w) = one("proxy-next-upstream", "http_501");
    assert!(w[0].message.contains("unknown condition \"http_501\""), "{}", w[0].message);
}

#[test]
fn rate_limits() {
    let (p, w) = parse_all(&[
        (&nginx("limit-rps"), "10"),
        (&nginx("limit-burst-multiplier"), "3"),
        (&nginx("limit-whitelist"), "10.0.0.0/8"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    let l = p.rate_limit.unwrap();
    assert_eq!((l.rps, l.rpm, l.burst_multiplier, l.status), (Some(10), None, 3, 503));
    assert_eq!(l.exempt, vec!["10.0.0.0/8".parse().unwrap()]);
    assert_eq!(one("limit-rpm", "600").0.rate_limit.unwrap().burst_multiplier, 5);

    let (p, w) = one("limit-rps", "0");
    assert_eq!(p.rate_limit, None);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    let (p, w) = one("limit-burst-multiplier", "2");
    assert_eq!(p.rate_limit, None);
    assert!(w[0].message.contains("no effect without limit-rps"), "{}", w[0].message);
}

#[test]
fn external_auth() {
    let (p, w) = parse_all(&[
        (&nginx("auth-url"), "http://oauth2-proxy.auth.svc:4180/oauth2/auth"),
        (&nginx("auth-signin"), "https://$host/oauth2/start?rd=$escaped_request_uri"),
        (&nginx("auth-response-headers"), "X-Auth-Request-User, X-Auth-Request-Email"),
        (&nginx("auth-method"), "POST"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    let ext = p.external_auth.unwrap();
    assert_eq!(ext.method, "POST");
    assert_eq!(ext.response_headers, ["X-Auth-Request-User", "X-Auth-Request-Email"]);
    assert_eq!(ext.signin.as_deref(), Some("https://$host/oauth2/start?rd=$escaped_request_uri"));
    assert!(p.source.is_empty());

    // A URL weir cannot use fails closed.
    let (p, w) = one("auth-url", "http://auth.svc/check?s=$cookie_session");
    assert!(p.external_auth.is_none());
    assert!(!p.source.permits("127.0.0.1".parse().unwrap()));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    // A bad signin URL is dropped, authentication stays.
    let (p, w) =
        parse_all(&[(&nginx("auth-url"), "http://auth.svc/check"), (&nginx("auth-signin"), "ftp://x")]);
    assert!(p.external_auth.unwrap().signin.is_none());
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

#[test]
fn canary_rules() {
    let map: BTreeMap<String, String> = [
        (nginx("canary"), "true"),
        (nginx("canary-weight"), "30"),
        (nginx("canary-weight-total"), "1000"),
        (nginx("canary-by-header"), "X-Region"),
        (nginx("canary-by-header-pattern"), "eu-.*"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect();
    let mut warnings = Warnings::default();
    let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs(&secrets()), &mut warnings);
    assert!(warnings.finish().is_empty());
    let canary = parsed.canary.unwrap().with_backend("ns/v2:80".parse().unwrap());
    assert_eq!((canary.weight, canary.weight_total), (30, 1000));
    assert_eq!(canary.header.as_deref(), Some("X-Region"));
    assert_eq!(canary.header_pattern.as_deref(), Some("eu-.*"));

    for (name, bad) in
        [("canary-weight", "101"), ("canary-by-header-pattern", "(?=x)"), ("canary-by-header", "X Canary")]
    {
        let (_, w) = parse_all(&[(&nginx("canary"), "true"), (&nginx(name), bad)]);
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{name}: {bad}");
    }
}

#[test]
fn balancing() {
    let (p, w) = parse_all(&[
        (&nginx("affinity"), "cookie"),
        (&nginx("session-cookie-name"), "route"),
        (&nginx("session-cookie-samesite"), "strict"),
        (&nginx("session-cookie-max-age"), "172800"),
        (&nginx("upstream-hash-by"), "$request_uri"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    let Balance::Cookie(c) = p.balance else { panic!("{:?}", p.balance) };
    assert_eq!(
        (c.name.as_str(), c.same_site.as_deref(), c.max_age),
        ("route", Some("Strict"), Some(172_800))
    );
    assert_eq!(c.path, "", "filled in per route");

    assert_eq!(one("upstream-hash-by", "$remote_addr").0.balance, Balance::Hash("$remote_addr".into()));
    assert_eq!(one("load-balance", "ewma").0.balance, Balance::Ewma);
    for (name, bad) in
        [("upstream-hash-by", "$request_time"), ("load-balance", "least_conn"), ("affinity", "ip")]
    {
        let (p, w) = one(name, bad);
        assert_eq!(p.balance, Balance::RoundRobin, "{name}");
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{name}");
    }
    let (_, w) = one("session-cookie-name", "x");
    assert!(w[0].message.contains("no effect without affinity"), "{}", w[0].message);

    // session-cookie-change-on-failure: weir always re-pins; "false" is warned, junk rejected.
    let change = |v: &str| {
        parse_all(&[(&nginx("affinity"), "cookie"), (&nginx("session-cookie-change-on-failure"), v)]).1
    };
    assert!(change("true").is_empty());
    assert_eq!(reasons(&change("false")), [(Severity::Warning, Reason::InvalidAnnotation)]);
    assert_eq!(reasons(&change("sometimes")), [(Severity::Error, Reason::InvalidAnnotation)]);

    // affinity-canary-behavior: sticky (default) or legacy.
    let canary =
        |v: &str| parse_all(&[(&nginx("affinity"), "cookie"), (&nginx("affinity-canary-behavior"), v)]);
    let legacy = |p: &RoutePolicy| matches!(&p.balance, Balance::Cookie(c) if c.legacy_canary);
    assert!(legacy(&canary("legacy").0) && canary("legacy").1.is_empty());
    assert!(!legacy(&canary("sticky").0) && canary("sticky").1.is_empty());
    let (p, w) = canary("always");
    assert!(!legacy(&p));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    let (_, w) = one("affinity-canary-behavior", "legacy");
    assert!(w[0].message.contains("no effect without affinity"), "{}", w[0].message);
}

#[test]
fn custom_errors() {
    let map: BTreeMap<String, String> =
        [(nginx("custom-http-errors"), "503, 404,404"), (nginx("default-backend"), "error-pages")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
    let mut warnings = Warnings::default();
    let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs(&secrets()), &mut warnings);
    assert!(warnings.finish().is_empty());
    assert_eq!(parsed.custom_errors, Some((vec![404, 503], Some("error-pages".to_string()))));
    let (_, w) = one("custom-http-errors", "404,302");
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

#[test]
fn aliases_and_buffering() {
    let map: BTreeMap<String, String> =
        [(nginx("server-alias"), "www.example.com, *.example.org"), (nginx("proxy-buffering"), "on")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
    let mut warnings = Warnings::default();
    let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs(&secrets()), &mut warnings);
    assert!(warnings.finish().is_empty());
    assert_eq!(parsed.server_aliases.len(), 2);
    for (name, bad) in [("server-alias", "not a host!"), ("server-alias", "*"), ("proxy-buffering", "yes")] {
        let (_, w) = one(name, bad);
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{name}: {bad}");
    }
}

/// ConfigMaps: `ns/hdrs` (custom headers, one with a variable) and `other/hdrs`.
fn config_maps() -> crate::snapshot::Objects<k8s_openapi::api::core::v1::ConfigMap> {
    let cm = |pairs: &[(&str, &str)]| k8s_openapi::api::core::v1::ConfigMap {
        data: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    };
    [
        (
            ObjectRef::new("ns", "hdrs"),
            cm(&[("X-Frame-Options", "DENY"), ("X-Id", "$request_id"), ("Content-Length", "1")]),
        ),
        (ObjectRef::new("other", "hdrs"), cm(&[("X-A", "1")])),
        (ObjectRef::new("ns", "auth-hdrs"), cm(&[("X-Auth-Tenant", "shop"), ("Host", "evil.example")])),
    ]
    .into_iter()
    .collect()
}

#[test]
fn custom_headers_accepted_and_rejected() {
    // The valid header is set; the variable and the framing header are each reported and skipped.
    let (p, w) = one("custom-headers", "ns/hdrs");
    assert_eq!(p.response_headers, BTreeMap::from([("x-frame-options".into(), "DENY".into())]));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation); 2]);
    let key = nginx("custom-headers");
    let messages: Vec<&str> = w.iter().map(|w| w.message.as_str()).collect();
    assert!(
        messages.iter().any(|m| m.starts_with(&format!(
            "metadata.annotations[{key}]: ConfigMap ns/hdrs, header \"X-Id\": nginx variables"
        ))),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("\"Content-Length\": a connection or framing header")),
        "{messages:?}"
    );
    // The bare name is in the Ingress's namespace; weir's prefix works too.
    let (p, _) = parse_all(&[(&format!("{WEIR_PREFIX}custom-headers"), "hdrs")]);
    assert_eq!(p.response_headers.len(), 1);

    // Missing ConfigMap: an error, and the other annotations still apply.
    let (p, w) = parse_all(&[(&key, "ns/nope"), (&nginx("proxy-body-size"), "1k")]);
    assert!(p.response_headers.is_empty());
    assert_eq!(p.max_body_bytes, Some(1024));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("ConfigMap ns/nope not found"), "{}", w[0].message);

    // Another namespace's ConfigMap is refused, as Secrets are.
    let (p, w) = one("custom-headers", "other/hdrs");
    assert!(p.response_headers.is_empty());
    assert!(w[0].message.contains("must be in the Ingress's namespace"), "{}", w[0].message);
    let (_, w) = one("custom-headers", "a/b/c");
    assert!(w[0].message.contains("invalid value"), "{}", w[0].message);
}

#[test]
fn custom_headers_limited_by_global_allowed_response_headers() {
    let map = BTreeMap::from([(nginx("custom-headers"), "hdrs".to_string())]);
    let (secrets, config_maps) = (secrets(), config_maps());
    let allowed = std::collections::BTreeSet::from(["x-other".to_string()]);
    let refs = Refs {
        secrets: &secrets,
        config_maps: &config_maps,
        allowed_response_headers: Some(&allowed),
        guards: &crate::translate::annotations::risk::DEFAULTS,
    };
    let mut warnings = Warnings::default();
    let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
    assert!(parsed.policy.response_headers.is_empty());
    let w = warnings.finish();
    assert!(
        w.iter().any(|w| w
            .message
            .contains("\"X-Frame-Options\": not listed in the global-allowed-response-headers")),
        "{w:?}"
    );
}

#[test]
fn mirror_accepted_and_rejected() {
    let (p, w) = one("mirror-target", "https://test.env.com$request_uri");
    assert_eq!(
        p.mirrors,
        Some(Box::new(vec![Mirror {
            target: "https://test.env.com$request_uri".into(),
            host: None,
            request_body: true,
            share_ppm: None,
            h2c: false,
            spread: Vec::new(),
        }]))
    );
    assert!(w.is_empty(), "{w:?}");

    let (p, w) = parse_all(&[
        (&nginx("mirror-target"), "http://copy.ns.svc:8080/shadow$uri"),
        (&nginx("mirror-host"), "shadow.example.com"),
        (&nginx("mirror-request-body"), "off"),
    ]);
    assert_eq!(
        p.mirrors,
        Some(Box::new(vec![Mirror {
            target: "http://copy.ns.svc:8080/shadow$uri".into(),
            host: Some("shadow.example.com".into()),
            request_body: false,
            share_ppm: None,
            h2c: false,
            spread: Vec::new(),
        }]))
    );
    assert!(w.is_empty(), "{w:?}");

    // A bad target: no mirror, and the route keeps its other settings.
    let (p, w) = parse_all(&[
        (&nginx("mirror-target"), "$scheme://copy.svc$request_uri"),
        (&nginx("proxy-body-size"), "1m"),
    ]);
    assert_eq!(p.mirrors, None);
    assert_eq!(p.max_body_bytes, Some(1 << 20));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("nginx.ingress.kubernetes.io/mirror-target"), "{}", w[0].message);

    // Bad settings of a good target are reported; the mirror keeps its defaults.
    let (p, w) = parse_all(&[
        (&nginx("mirror-target"), "http://copy.svc$request_uri"),
        (&nginx("mirror-host"), "$host"),
        (&nginx("mirror-request-body"), "maybe"),
    ]);
    assert_eq!(
        p.mirrors,
        Some(Box::new(vec![Mirror {
            target: "http://copy.svc$request_uri".into(),
            host: None,
            request_body: true,
            share_ppm: None,
            h2c: false,
            spread: Vec::new(),
        }]))
    );
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation); 2]);

    // Settings without a target do nothing, which is said.
    let (p, w) = one("mirror-request-body", "off");
    assert_eq!(p.mirrors, None);
    assert_eq!(reasons(&w), [(Severity::Warning, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("without mirror-target"), "{}", w[0].message);
}

#[test]
fn enable_global_auth() {
    let parse_one = |value: &str| {
        let map = BTreeMap::from([(nginx("enable-global-auth"), value.to_string())]);
        let mut warnings = Warnings::default();
        let refs = refs(&EMPTY_SECRETS);
        let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
        (parsed.global_auth, warnings.finish())
    };
    assert!(Parsed::default().global_auth, "global authentication applies unless an Ingress opts out");
    let (global, w) = parse_one("false");
    assert!(!global && w.is_empty(), "{w:?}");
    let (global, w) = parse_one("true");
    assert!(global && w.is_empty(), "{w:?}");
    let (global, w) = parse_one("nope");
    assert!(global, "an invalid value keeps the default");
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
}

static EMPTY_SECRETS: crate::snapshot::Objects<k8s_openapi::api::core::v1::Secret> =
    crate::snapshot::Objects::new();

/// `auth-url` plus `extra` annotations.
fn with_auth(extra: &[(&str, &str)]) -> (RoutePolicy, Vec<Warning>) {
    let mut pairs = vec![(nginx("auth-url"), "http://auth.svc/check".to_string())];
    pairs.extend(extra.iter().map(|(k, v)| (nginx(k), v.to_string())));
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    parse_all(&pairs)
}

#[test]
fn auth_proxy_set_headers_accepted_and_rejected() {
    // The usable header is set on the subrequest; Host is reported and skipped.
    let (p, w) = with_auth(&[("auth-proxy-set-headers", "auth-hdrs")]);
    let auth = p.external_auth.unwrap();
    assert_eq!(auth.proxy_set_headers, BTreeMap::from([("x-auth-tenant".into(), "shop".into())]));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(
        w[0].message.contains("auth-proxy-set-headers]: ConfigMap ns/auth-hdrs, header \"Host\""),
        "{}",
        w[0].message
    );
    // Missing, in another namespace, or not a name: an error; authentication still applies.
    for (value, why) in [
        ("ns/nope", "ConfigMap ns/nope not found"),
        ("other/hdrs", "must be in the Ingress's namespace"),
        ("a/b/c", "expected a ConfigMap"),
    ] {
        let (p, w) = with_auth(&[("auth-proxy-set-headers", value)]);
        let auth = p.external_auth.unwrap();
        assert!(auth.proxy_set_headers.is_empty());
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{value}");
        assert!(w[0].message.contains(&nginx("auth-proxy-set-headers")), "{}", w[0].message);
        assert!(w[0].message.contains(why), "{}", w[0].message);
        assert!(p.source.deny.is_empty(), "the routes do not fail closed for it");
    }
    // Without auth-url it does nothing, which is said.
    let (_, w) = one("auth-proxy-set-headers", "auth-hdrs");
    assert!(w[0].message.contains("has no effect without auth-url"), "{}", w[0].message);
}

#[test]
fn auth_signin_redirect_param_accepted_and_rejected() {
    let (p, w) =
        with_auth(&[("auth-signin", "https://login.example.com/"), ("auth-signin-redirect-param", "next")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.external_auth.unwrap().signin_redirect_param.as_deref(), Some("next"));
    let (p, w) =
        with_auth(&[("auth-signin", "https://login.example.com/"), ("auth-signin-redirect-param", "a&b=c")]);
    assert_eq!(p.external_auth.unwrap().signin_redirect_param, None, "rd is kept");
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(
        w[0].message.contains("auth-signin-redirect-param]: invalid value \"a&b=c\""),
        "{}",
        w[0].message
    );
    let (_, w) = with_auth(&[("auth-signin-redirect-param", "next")]);
    assert!(w[0].message.contains("has no effect without auth-signin"), "{}", w[0].message);
}

#[test]
fn auth_always_set_cookie_accepted_and_rejected() {
    let (p, w) = with_auth(&[("auth-always-set-cookie", "true")]);
    assert!(w.is_empty(), "{w:?}");
    assert!(p.external_auth.unwrap().always_set_cookie);
    let (p, w) = with_auth(&[("auth-always-set-cookie", "sometimes")]);
    assert!(!p.external_auth.unwrap().always_set_cookie);
    assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)]);
    assert!(w[0].message.contains("auth-always-set-cookie]: invalid value"), "{}", w[0].message);
}

#[test]
fn auth_cache_accepted_and_rejected() {
    use weir_dataplane::model::{AuthCacheSpec, CacheValid};
    // The key alone: ingress-nginx's default durations.
    let (p, w) = with_auth(&[("auth-cache-key", "$remote_user$http_authorization")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        p.external_auth.unwrap().cache,
        Some(AuthCacheSpec {
            key: "$remote_user$http_authorization".into(),
            valid: vec![CacheValid { codes: vec![200, 202, 401], seconds: 300 }],
        })
    );
    let (p, w) = with_auth(&[("auth-cache-key", "$cookie_sid"), ("auth-cache-duration", "200 10m, 401 30s")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.external_auth.unwrap().cache.unwrap().valid.len(), 2);
    // An unknown variable, or no variable: rejected, nothing cached, authentication still on.
    for bad in ["$upstream_addr", "static"] {
        let (p, w) = with_auth(&[("auth-cache-key", bad)]);
        assert_eq!(p.external_auth.unwrap().cache, None, "{bad}");
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{bad}");
        assert!(w[0].message.contains("auth-cache-key]: invalid value"), "{}", w[0].message);
    }
    // A bad duration: reported, the default durations apply.
    let (p, w) =
        with_auth(&[("auth-cache-key", "$http_authorization"), ("auth-cache-duration", "200 5 minutes")]);
    assert_eq!(p.external_auth.unwrap().cache.unwrap().valid[0].seconds, 300);
    assert!(w[0].message.contains("auth-cache-duration]: invalid value"), "{}", w[0].message);
    // A duration without a key does nothing, which is said.
    let (_, w) = with_auth(&[("auth-cache-duration", "200 5m")]);
    assert!(w[0].message.contains("has no effect without auth-cache-key"), "{}", w[0].message);
}

#[test]
fn auth_keepalive_accepted_and_rejected() {
    let (p, w) = with_auth(&[
        ("auth-keepalive", "10"),
        ("auth-keepalive-requests", "100"),
        ("auth-keepalive-timeout", "60"),
        ("auth-keepalive-share-vars", "true"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert!(p.external_auth.is_some());
    for (name, bad) in [
        ("auth-keepalive", "-1"),
        ("auth-keepalive-requests", "0"),
        ("auth-keepalive-timeout", "1m"),
        ("auth-keepalive-share-vars", "maybe"),
    ] {
        let (p, w) = with_auth(&[(name, bad)]);
        assert!(p.external_auth.is_some());
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{name}");
        assert!(w[0].message.contains(&format!("{name}]: invalid value")), "{}", w[0].message);
    }
}

#[test]
fn buffer_annotations_accepted_and_rejected() {
    let pairs = [
        (nginx("client-body-buffer-size"), "1m"),
        (nginx("proxy-buffer-size"), "16k"),
        (nginx("proxy-buffers-number"), "4"),
        (nginx("proxy-max-temp-file-size"), "0"),
    ];
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let (p, w) = parse_all(&pairs);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p, RoutePolicy::default(), "weir streams: nothing to apply");
    for (name, bad) in [
        ("client-body-buffer-size", "1.5m"),
        ("proxy-buffer-size", "0"),
        ("proxy-buffers-number", "many"),
        ("proxy-max-temp-file-size", "-1"),
    ] {
        let (p, w) = parse_all(&[(&nginx(name), bad), (&nginx("proxy-body-size"), "1k")]);
        assert_eq!(p.max_body_bytes, Some(1024), "the other annotations still apply");
        assert_eq!(reasons(&w), [(Severity::Error, Reason::InvalidAnnotation)], "{name}");
        assert!(w[0].message.contains(&format!("{name}]: invalid value {bad:?}")), "{}", w[0].message);
    }
}

fn parse_guarded(pairs: &[(&str, &str)], guards: &risk::Guards) -> (RoutePolicy, Vec<Warning>) {
    let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut warnings = Warnings::default();
    let secrets = secrets();
    let config_maps = config_maps();
    let refs = Refs { secrets: &secrets, config_maps: &config_maps, allowed_response_headers: None, guards };
    let parsed = parse(&ObjectRef::new("ns", "ing"), Some(&map), &refs, &mut warnings);
    (parsed.policy, warnings.finish())
}

#[test]
fn annotations_above_the_risk_level_or_with_blocked_words_close_the_ingress() {
    let client = "127.0.0.1".parse().unwrap();
    // ingress-nginx's default level (High) lets auth-url through.
    let (url, size) = (nginx("auth-url"), nginx("proxy-body-size"));
    let auth = [(url.as_str(), "http://auth.example/check"), (size.as_str(), "8m")];
    let (p, w) = parse_guarded(&auth, &risk::Guards::default());
    assert!(w.is_empty(), "{w:?}");
    assert!(p.source.permits(client) && p.external_auth.is_some());
    // Medium refuses it, and the routes deny every client rather than serve unprotected.
    let medium = risk::Guards { risk_level: risk::Risk::Medium, ..risk::Guards::default() };
    let (p, w) = parse_guarded(&auth, &medium);
    assert!(!p.source.permits(client));
    assert_eq!(reasons(&w), [(Severity::Error, Reason::RefusedAnnotation)]);
    assert!(w[0].message.contains("auth-url") && w[0].message.contains("risk High"), "{}", w[0].message);
    // A blocked word in any applied value does the same.
    let words = risk::Guards { blocked_words: vec!["load_module".into()], ..risk::Guards::default() };
    let (p, w) = parse_guarded(&[(&nginx("x-forwarded-prefix"), "/load_module/x")], &words);
    assert!(!p.source.permits(client));
    assert!(w.iter().any(|w| w.message.contains("annotation-value-word-blocklist")), "{w:?}");
    let (p, w) = parse_guarded(&[(&nginx("x-forwarded-prefix"), "/app")], &words);
    assert!(p.source.permits(client) && w.is_empty(), "{w:?}");
}

#[test]
fn cross_namespace_secrets_need_allow_cross_namespace_resources() {
    let pairs = [(nginx("auth-type")), (nginx("auth-secret"))];
    let pairs = [(pairs[0].as_str(), "basic"), (pairs[1].as_str(), "other/htpasswd")];
    let (p, w) = parse_guarded(&pairs, &risk::Guards::default());
    assert!(!p.source.permits("127.0.0.1".parse().unwrap()), "fails closed");
    assert!(w.iter().any(|w| w.message.contains("allow-cross-namespace-resources is off")), "{w:?}");
    // Allowed, the Secret is looked up there (and is missing: still closed, for that reason).
    let open = risk::Guards { cross_namespace: true, ..risk::Guards::default() };
    let (_, w) = parse_guarded(&pairs, &open);
    assert!(w.iter().any(|w| w.message.contains("Secret other/htpasswd not found")), "{w:?}");
}
