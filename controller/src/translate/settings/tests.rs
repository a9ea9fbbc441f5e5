use super::*;
use crate::translate::warnings::{Severity, Warning};
use weir_dataplane::model::RateLimit;

fn parse_pairs(pairs: &[(&str, &str)]) -> (Parsed, Vec<Warning>) {
    let data: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut warnings = Warnings::default();
    let parsed = parse(
        &ObjectRef::new("ingress-nginx", "controller"),
        &data,
        &crate::snapshot::Objects::new(),
        &mut warnings,
    );
    (parsed, warnings.finish())
}

/// The settings of `pairs`, which must produce no finding.
fn clean(pairs: &[(&str, &str)]) -> Parsed {
    let (parsed, warnings) = parse_pairs(pairs);
    assert!(warnings.is_empty(), "{pairs:?}: {warnings:#?}");
    parsed
}

/// The one finding of `pairs`, checked to be about the ConfigMap and to name `key`.
fn finding(pairs: &[(&str, &str)], key: &str) -> (Parsed, Warning) {
    let (parsed, mut warnings) = parse_pairs(pairs);
    assert_eq!(warnings.len(), 1, "{pairs:?}: {warnings:#?}");
    let w = warnings.remove(0);
    assert_eq!(w.kind, ObjectKind::ConfigMap);
    assert_eq!(w.object, ObjectRef::new("ingress-nginx", "controller"));
    assert!(w.message.starts_with(&format!("data[{key}]: ")), "{}", w.message);
    (parsed, w)
}

/// `pairs` must be rejected: one error naming `key`, with `reason`, and `parsed` as if unset.
fn rejected(pairs: &[(&str, &str)], key: &str) -> Parsed {
    let (parsed, w) = finding(pairs, key);
    assert_eq!((w.severity, w.reason), (Severity::Error, Reason::InvalidSetting), "{w:?}");
    assert!(w.message.contains("invalid value"), "{}", w.message);
    parsed
}

#[test]
fn the_catalogue_has_each_key_once_and_knows_the_keys_weir_reads() {
    let mut names: Vec<&str> = CATALOGUE.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a key is listed twice");
    for key in ["use-forwarded-headers", "hsts", "ssl-protocols", "log-format-upstream", "keep-alive"] {
        assert_eq!(support(key), Some(Support::Supported), "{key}");
    }
}

#[test]
fn an_empty_configmap_changes_nothing() {
    let parsed = clean(&[]);
    assert_eq!(parsed, Parsed::default());
    assert!(parsed.settings.is_empty());
    assert!(parsed.routes.ssl_redirect && !parsed.routes.force_ssl_redirect);
    // An empty value is no value.
    assert_eq!(clean(&[("hsts", " "), ("keep-alive", "")]), Parsed::default());
}

#[test]
fn unsupported_unknown_and_refused_keys_are_reported() {
    let (_, w) = finding(&[("use-geoip2", "true")], "use-geoip2");
    assert_eq!((w.severity, w.reason), (Severity::Warning, Reason::UnsupportedSetting));
    // Not planned: the warning says what to use instead.
    assert!(w.message.contains("MaxMind") && w.message.contains("X-Forwarded-For"), "{}", w.message);
    let (_, w) = finding(&[("zipkin-collector-host", "zipkin.tracing")], "zipkin-collector-host");
    assert!(w.message.contains("OpenTelemetry"), "{}", w.message);
    // limit-connections' key is the client address; another is refused.
    let (parsed, warnings) = parse_pairs(&[("limit-conn-zone-variable", "$binary_remote_addr")]);
    assert!(warnings.is_empty() && parsed == Parsed::default(), "{warnings:#?}");
    rejected(&[("limit-conn-zone-variable", "$http_x_user")], "limit-conn-zone-variable");
    // nginx internals are accepted without a word.
    let (parsed, warnings) =
        parse_pairs(&[("worker-processes", "auto"), ("server-name-hash-bucket-size", "128")]);
    assert!(warnings.is_empty(), "{warnings:#?}");
    assert_eq!(parsed, Parsed::default());
    let (_, w) = finding(&[("use-gzipp", "true")], "use-gzipp");
    assert_eq!((w.severity, w.reason), (Severity::Warning, Reason::UnknownSetting));
    for key in ["http-snippet", "server-snippet", "location-snippet", "main-snippet", "stream-snippet"] {
        let (_, w) = finding(&[(key, "return 200;")], key);
        assert_eq!((w.severity, w.reason), (Severity::Error, Reason::RefusedSetting), "{key}");
        assert!(w.message.contains("injection"), "{}", w.message);
    }
    let (_, w) = finding(&[("lua-shared-dicts", "x: 1")], "lua-shared-dicts");
    assert!(w.message.contains("Lua"), "{}", w.message);
    let (_, w) = finding(&[("allow-snippet-annotations", "true")], "allow-snippet-annotations");
    assert_eq!(w.reason, Reason::RefusedSetting);
    // Saying what weir does anyway is fine.
    clean(&[("allow-snippet-annotations", "false")]);
}

#[test]
fn blocklists_as_nginx_map_reads_them() {
    use weir_dataplane::model::blocklist::HeaderPattern;
    let s = clean(&[
        ("block-user-agents", r#"BadBot/1.0, ~^curl/, ~*scrapy, "Mozilla/4.0 (compatible)""#),
        ("block-referers", "~*spam\\.example"),
    ])
    .settings;
    assert_eq!(
        s.block_user_agents,
        [
            HeaderPattern::Exact("BadBot/1.0".into()),
            HeaderPattern::Regex { pattern: "^curl/".into(), caseless: false },
            HeaderPattern::Regex { pattern: "scrapy".into(), caseless: true },
            HeaderPattern::Exact("Mozilla/4.0 (compatible)".into()),
        ]
    );
    assert_eq!(s.block_referers, [HeaderPattern::Regex { pattern: "spam\\.example".into(), caseless: true }]);
    // No route is closed any more: the lists are enforced by the proxy.
    assert!(!clean(&[("block-user-agents", "x")]).routes.fail_closed);
    // A bad entry is an error naming it; the others still apply.
    let (parsed, w) = finding(&[("block-user-agents", "~a(, ~*bot")], "block-user-agents");
    assert_eq!((w.severity, w.reason), (Severity::Error, Reason::InvalidSetting));
    assert!(w.message.contains("~a("), "{}", w.message);
    assert_eq!(
        parsed.settings.block_user_agents,
        [HeaderPattern::Regex { pattern: "bot".into(), caseless: true }]
    );
    let (_, warnings) = parse_pairs(&[("block-referers", "~")]);
    assert!(warnings[0].message.contains("every client"), "{:?}", warnings);
    assert_eq!(clean(&[("block-user-agents", " , ")]).settings.block_user_agents, []);
}

#[test]
fn forwarded_headers() {
    let f = clean(&[("use-forwarded-headers", "true")]).settings.forwarded.unwrap();
    assert!(f.trust_headers && !f.full_chain);
    assert_eq!(f.client_header, "x-forwarded-for");
    assert_eq!(f.trusted, vec!["0.0.0.0/0".parse().unwrap()]);

    let f = clean(&[
        ("use-forwarded-headers", "true"),
        ("forwarded-for-header", "CF-Connecting-IP"),
        ("proxy-real-ip-cidr", "10.0.0.0/8, 192.0.2.1"),
        ("compute-full-forwarded-for", "true"),
    ])
    .settings
    .forwarded
    .unwrap();
    assert_eq!(f.client_header, "cf-connecting-ip");
    assert_eq!(f.trusted, vec!["10.0.0.0/8".parse().unwrap(), "192.0.2.1/32".parse().unwrap()]);
    assert!(f.full_chain);

    // enable-real-ip: the address only, not X-Forwarded-Proto & co.
    let f = clean(&[("enable-real-ip", "true")]).settings.forwarded.unwrap();
    assert!(!f.trust_headers);
    assert_eq!(clean(&[("use-forwarded-headers", "false")]).settings.forwarded, None);
}

#[test]
fn forwarded_headers_rejected() {
    assert_eq!(
        rejected(&[("use-forwarded-headers", "yes")], "use-forwarded-headers").settings.forwarded,
        None
    );
    assert_eq!(rejected(&[("enable-real-ip", "on")], "enable-real-ip").settings.forwarded, None);
    let f = rejected(
        &[("use-forwarded-headers", "true"), ("forwarded-for-header", "X Real")],
        "forwarded-for-header",
    )
    .settings
    .forwarded
    .unwrap();
    assert_eq!(f.client_header, "x-forwarded-for");
    // A broken trust list trusts no one (the default would let any client pick its address).
    let (parsed, w) = finding(
        &[("use-forwarded-headers", "true"), ("proxy-real-ip-cidr", "10.0.0.1/8")],
        "proxy-real-ip-cidr",
    );
    assert!(w.message.contains("no peer is trusted"), "{}", w.message);
    assert!(parsed.settings.forwarded.unwrap().trusted.is_empty());
    let f = rejected(
        &[("use-forwarded-headers", "true"), ("compute-full-forwarded-for", "2")],
        "compute-full-forwarded-for",
    )
    .settings
    .forwarded
    .unwrap();
    assert!(!f.full_chain);
    // Companions alone do nothing, which is said.
    for key in ["forwarded-for-header", "proxy-real-ip-cidr", "compute-full-forwarded-for"] {
        let value = if key == "proxy-real-ip-cidr" { "10.0.0.0/8" } else { "true" };
        let (parsed, w) = finding(&[(key, value)], key);
        assert_eq!(w.severity, Severity::Warning);
        assert!(w.message.contains("no effect without use-forwarded-headers"), "{}", w.message);
        assert_eq!(parsed.settings.forwarded, None);
    }
    let (parsed, w) = finding(
        &[("enable-real-ip", "true"), ("compute-full-forwarded-for", "true")],
        "compute-full-forwarded-for",
    );
    assert!(w.message.contains("no effect without use-forwarded-headers"), "{}", w.message);
    assert!(!parsed.settings.forwarded.unwrap().full_chain);
}

#[test]
fn hsts() {
    let hsts = |pairs: &[(&str, &str)]| clean(pairs).settings.hsts.unwrap();
    // Any key turns it on with ingress-nginx's defaults for the rest.
    assert_eq!(
        hsts(&[("hsts", "true")]),
        Hsts { enabled: true, max_age: 31_536_000, include_subdomains: true, preload: false }
    );
    assert_eq!(
        hsts(&[("hsts-max-age", "600"), ("hsts-include-subdomains", "false"), ("hsts-preload", "true")]),
        Hsts { enabled: true, max_age: 600, include_subdomains: false, preload: true }
    );
    assert!(!hsts(&[("hsts", "false")]).enabled);
    let hsts = rejected(&[("hsts-max-age", "1y")], "hsts-max-age").settings.hsts.unwrap();
    assert_eq!(hsts.max_age, 31_536_000);
    rejected(&[("hsts", "maybe")], "hsts");
    rejected(&[("hsts-include-subdomains", "x")], "hsts-include-subdomains");
    rejected(&[("hsts-preload", "x")], "hsts-preload");
}

#[test]
fn ssl_protocols() {
    let versions = |v: &str| clean(&[("ssl-protocols", v)]).settings.tls_versions.unwrap();
    assert_eq!(versions("TLSv1.3"), [TlsVersion::Tls13]);
    assert_eq!(versions("TLSv1.3 TLSv1.2"), [TlsVersion::Tls12, TlsVersion::Tls13]);
    let (parsed, w) = finding(&[("ssl-protocols", "TLSv1.1 TLSv1.2")], "ssl-protocols");
    assert_eq!(w.severity, Severity::Warning);
    assert!(w.message.contains("TLSv1.1 not offered"), "{}", w.message);
    assert_eq!(parsed.settings.tls_versions.unwrap(), [TlsVersion::Tls12]);
    assert_eq!(rejected(&[("ssl-protocols", "TLSv1 SSLv3")], "ssl-protocols").settings.tls_versions, None);
    assert_eq!(rejected(&[("ssl-protocols", "TLSv1.2 QUIC")], "ssl-protocols").settings.tls_versions, None);
}

#[test]
fn ssl_session_cache_size_and_timeout() {
    let sessions = |pairs: &[(&str, &str)]| {
        let s = clean(pairs).settings;
        (s.tls_sessions, s.tls_session_timeout_secs)
    };
    assert_eq!(sessions(&[]), (None, None), "unset: the proxy's defaults (10m, 10m)");
    assert_eq!(sessions(&[("ssl-session-cache-size", "10m")]), (Some(40_000), None));
    assert_eq!(
        sessions(&[("ssl-session-cache-size", "1k"), ("ssl-session-timeout", "1h30m")]),
        (Some(3), Some(5400))
    );
    assert_eq!(sessions(&[("ssl-session-cache", "true"), ("ssl-session-timeout", "45")]), (None, Some(45)));
    assert_eq!(sessions(&[("ssl-session-cache", "false")]), (Some(0), None), "off: no resumption");
    // Off makes the size and timeout meaningless: said, not an error.
    let (parsed, w) = finding(
        &[("ssl-session-cache", "false"), ("ssl-session-cache-size", "20m")],
        "ssl-session-cache-size",
    );
    assert_eq!(w.severity, Severity::Warning);
    assert_eq!(parsed.settings.tls_sessions, Some(0));
    for (key, bad) in [
        ("ssl-session-cache", "sometimes"),
        ("ssl-session-cache-size", "0"),
        ("ssl-session-cache-size", "100"),
        ("ssl-session-cache-size", "10x"),
        ("ssl-session-cache-size", "3g"),
        ("ssl-session-timeout", "0"),
        ("ssl-session-timeout", "2d"),
        ("ssl-session-timeout", "ten minutes"),
    ] {
        let s = rejected(&[(key, bad)], key).settings;
        assert_eq!((s.tls_sessions, s.tls_session_timeout_secs), (None, None), "{key}: {bad}");
    }
}

#[test]
fn route_defaults_for_the_dataplane() {
    let s =
        clean(&[("proxy-body-size", "8m"), ("proxy-read-timeout", "30"), ("proxy-next-upstream-tries", "0")])
            .settings;
    assert_eq!(s.max_body_bytes, Some(8 << 20));
    assert_eq!(s.read_timeout_ms, Some(30_000));
    assert_eq!(s.connect_tries, Some(0));
    assert_eq!(clean(&[("proxy-body-size", "0")]).settings.max_body_bytes, Some(0));
    assert_eq!(rejected(&[("proxy-body-size", "8mb")], "proxy-body-size").settings.max_body_bytes, None);
    assert_eq!(
        rejected(&[("proxy-read-timeout", "soon")], "proxy-read-timeout").settings.read_timeout_ms,
        None
    );
    assert_eq!(clean(&[("proxy-connect-timeout", "2s")]).settings.connect_timeout_ms, Some(2_000));
    assert_eq!(
        rejected(&[("proxy-connect-timeout", "2 s")], "proxy-connect-timeout").settings.connect_timeout_ms,
        None
    );
    assert_eq!(
        rejected(&[("proxy-next-upstream-tries", "-1")], "proxy-next-upstream-tries").settings.connect_tries,
        None
    );
}

#[test]
fn connections() {
    let s = clean(&[
        ("keep-alive", "75"),
        ("keep-alive-requests", "100"),
        ("worker-shutdown-timeout", "240s"),
        ("enable-underscores-in-headers", "true"),
        ("use-proxy-protocol", "true"),
    ])
    .settings;
    assert_eq!(s.keepalive_secs, Some(75));
    assert_eq!(s.keepalive_requests, Some(100));
    assert_eq!(s.drain_secs, Some(240));
    assert_eq!(s.underscores_in_headers, Some(true));
    assert_eq!(s.proxy_protocol, Some(true));
    assert_eq!(clean(&[("keep-alive", "0")]).settings.keepalive_secs, Some(0));
    assert_eq!(clean(&[("worker-shutdown-timeout", "1500ms")]).settings.drain_secs, Some(2));
    for bad in ["75s", "-1", "100000"] {
        assert_eq!(rejected(&[("keep-alive", bad)], "keep-alive").settings.keepalive_secs, None, "{bad}");
    }
    assert_eq!(
        rejected(&[("keep-alive-requests", "0")], "keep-alive-requests").settings.keepalive_requests,
        None
    );
    assert_eq!(
        rejected(&[("worker-shutdown-timeout", "later")], "worker-shutdown-timeout").settings.drain_secs,
        None
    );
    rejected(&[("enable-underscores-in-headers", "yes")], "enable-underscores-in-headers");
    rejected(&[("use-proxy-protocol", "1x")], "use-proxy-protocol");
}

#[test]
fn upstream_keepalive() {
    assert_eq!(clean(&[("upstream-keepalive-connections", "0")]).settings.upstream_keepalive, Some(false));
    assert_eq!(clean(&[("upstream-keepalive-connections", "320")]).settings.upstream_keepalive, Some(true));
    assert_eq!(clean(&[("upstream-keepalive-connections", "0")]).settings.upstream_idle_max, None);
    let s = clean(&[("upstream-keepalive-connections", "64")]).settings;
    assert_eq!((s.upstream_keepalive, s.upstream_idle_max), (Some(true), Some(64)));
    let parsed = rejected(&[("upstream-keepalive-connections", "many")], "upstream-keepalive-connections");
    assert_eq!((parsed.settings.upstream_keepalive, parsed.settings.upstream_idle_max), (None, None));
    rejected(&[("upstream-keepalive-connections", "-1")], "upstream-keepalive-connections");

    let s = clean(&[
        ("upstream-keepalive-timeout", "30"),
        ("upstream-keepalive-requests", "500"),
        ("upstream-keepalive-time", "10m"),
    ])
    .settings;
    assert_eq!(s.upstream_idle_timeout_ms, Some(30_000));
    assert_eq!(s.upstream_conn_requests, Some(500));
    assert_eq!(s.upstream_conn_lifetime_ms, Some(600_000));
    let bad = |key: &str, value: &str| rejected(&[(key, value)], key).settings;
    assert_eq!(bad("upstream-keepalive-timeout", "a while").upstream_idle_timeout_ms, None);
    assert_eq!(bad("upstream-keepalive-requests", "0").upstream_conn_requests, None);
    assert_eq!(bad("upstream-keepalive-time", "1d").upstream_conn_lifetime_ms, None);
}

#[test]
fn next_upstream_and_send_timeout() {
    use weir_dataplane::model::RetryOn;
    let s = clean(&[
        ("proxy-next-upstream", "error timeout http_502 http_503"),
        ("proxy-next-upstream-timeout", "10"),
        ("retry-non-idempotent", "true"),
        ("proxy-send-timeout", "30s"),
    ])
    .settings;
    assert_eq!(
        s.next_upstream,
        Some(vec![RetryOn::Error, RetryOn::Timeout, RetryOn::Http502, RetryOn::Http503])
    );
    assert_eq!(s.next_upstream_timeout_ms, Some(10_000));
    assert_eq!(s.retry_non_idempotent, Some(true));
    assert_eq!(s.send_timeout_ms, Some(30_000));
    assert_eq!(clean(&[("proxy-next-upstream", "off")]).settings.next_upstream, Some(vec![]));
    assert_eq!(clean(&[("proxy-next-upstream-timeout", "0")]).settings.next_upstream_timeout_ms, Some(0));
    let bad = |key: &str, value: &str| rejected(&[(key, value)], key).settings;
    assert_eq!(bad("proxy-next-upstream", "error http_501").next_upstream, None);
    assert_eq!(bad("proxy-next-upstream-timeout", "soon").next_upstream_timeout_ms, None);
    assert_eq!(bad("retry-non-idempotent", "sometimes").retry_non_idempotent, None);
    assert_eq!(bad("proxy-send-timeout", "0").send_timeout_ms, None);
}

#[test]
fn access_log_formats() {
    let fields = |raw: &str| clean(&[("log-format-upstream", raw)]).settings.access_log.unwrap();
    // What ingress-nginx users write: strings with variables, bare variables.
    let f = fields(
        r#"{"time": "$time_iso8601", "status": $status, "who": "${remote_addr} via \"x\"", "ua": "$http_user_agent"}"#,
    );
    let keys: Vec<&str> = f.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(keys, ["time", "status", "who", "ua"]);
    assert!(!f[0].bare && f[1].bare);
    assert_eq!(f[2].value.to_string(), "${remote_addr} via \"x\"");
    // A list of variables, keyed by name.
    let f = fields(r#"["$remote_addr", "status", "${upstream_addr}"]"#);
    let keys: Vec<&str> = f.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(keys, ["remote_addr", "status", "upstream_addr"]);
    assert!(f.iter().all(|f| f.bare));

    // Unknown variables: that field is left out, with a warning naming them.
    let (parsed, w) = finding(
        &[("log-format-upstream", r#"{"a": "$remote_addr", "b": $upstream_bytes_sent}"#)],
        "log-format-upstream",
    );
    assert_eq!(w.severity, Severity::Warning);
    assert!(w.message.contains("\"b\"") && w.message.contains("$upstream_bytes_sent"), "{}", w.message);
    assert_eq!(parsed.settings.access_log.unwrap().len(), 1);

    // nginx's text format is not JSON: the default fields are logged, and why.
    let default_format = r#"$remote_addr - $remote_user [$time_local] "$request" $status"#;
    assert_eq!(
        rejected(&[("log-format-upstream", default_format)], "log-format-upstream").settings.access_log,
        None
    );
    for bad in [r#"{"a": 1}"#, r#"{"a": "$status""#, r#"{"a": "$status"} x"#, r#"{"a": "$nope"}"#] {
        let (parsed, warnings) = parse_pairs(&[("log-format-upstream", bad)]);
        assert_eq!(parsed.settings.access_log, None, "{bad}");
        assert!(warnings.iter().any(|w| w.severity == Severity::Error), "{bad}: {warnings:?}");
    }

    // Turned off: the format is not used, which is said.
    let (parsed, w) = finding(
        &[("log-format-upstream", r#"{"s": $status}"#), ("disable-access-log", "true")],
        "log-format-upstream",
    );
    assert_eq!(parsed.settings.access_log, None);
    assert!(w.message.contains("no effect"), "{}", w.message);
    rejected(&[("disable-access-log", "nope")], "disable-access-log");
    clean(&[("log-format-escape-json", "true")]);
    let (_, w) = finding(&[("log-format-escape-none", "true")], "log-format-escape-none");
    assert_eq!(w.reason, Reason::UnsupportedSetting);
}

#[test]
fn keys_with_the_one_value_weir_implements() {
    clean(&[
        ("generate-request-id", "true"),
        ("server-tokens", "false"),
        ("use-http2", "true"),
        ("proxy-buffering", "off"),
        ("proxy-request-buffering", "on"),
        ("http-redirect-code", "308"),
    ]);
    for (key, value) in [
        ("generate-request-id", "false"),
        ("server-tokens", "true"),
        ("use-http2", "false"),
        ("proxy-buffering", "on"),
        ("http-redirect-code", "301"),
    ] {
        let (_, w) = finding(&[(key, value)], key);
        assert_eq!((w.severity, w.reason), (Severity::Warning, Reason::UnsupportedSetting), "{key}");
    }
    rejected(&[("proxy-buffering", "maybe")], "proxy-buffering");
    rejected(&[("http-redirect-code", "abc")], "http-redirect-code");
}

#[test]
fn ssl_ciphers_accepted_and_rejected() {
    let parsed = clean(&[("ssl-ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256")]);
    assert_eq!(
        parsed.settings.tls_ciphers,
        Some(vec![
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".to_string(),
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()
        ])
    );
    // ingress-nginx's default names two DHE suites weir does not have: a warning, the rest apply.
    let (parsed, w) =
        finding(&[("ssl-ciphers", "ECDHE-RSA-AES256-GCM-SHA384:DHE-RSA-AES256-GCM-SHA384")], "ssl-ciphers");
    assert_eq!((w.severity, w.reason), (Severity::Warning, Reason::InvalidSetting));
    assert!(
        w.message.contains("DHE-RSA-AES256-GCM-SHA384 selects no cipher suite weir offers"),
        "{}",
        w.message
    );
    assert_eq!(parsed.settings.tls_ciphers.unwrap().len(), 1);
    // Nothing weir offers, or not a cipher string: rejected, every suite stays offered.
    for bad in ["AES128-SHA:DES-CBC3-SHA", "HIGH;x"] {
        let parsed = rejected(&[("ssl-ciphers", bad)], "ssl-ciphers");
        assert_eq!(parsed.settings.tls_ciphers, None);
    }
}

#[test]
fn buffer_sizes_are_validated_and_change_nothing() {
    let parsed = clean(&[
        ("client-body-buffer-size", "16k"),
        ("proxy-buffer-size", "8k"),
        ("proxy-buffers-number", "8"),
        ("proxy-max-temp-file-size", "0"),
    ]);
    assert_eq!(parsed, Parsed::default(), "weir streams: nothing to apply");
    for (key, bad) in [
        ("client-body-buffer-size", "16kb"),
        ("proxy-buffer-size", "0"),
        ("proxy-buffers-number", "0"),
        ("proxy-max-temp-file-size", "lots"),
    ] {
        rejected(&[(key, bad)], key);
    }
}

#[test]
fn route_policy_defaults() {
    let parsed = clean(&[
        ("ssl-redirect", "false"),
        ("force-ssl-redirect", "true"),
        ("whitelist-source-range", "10.0.0.0/8"),
        ("denylist-source-range", "10.9.0.0/16"),
        ("block-cidrs", "192.0.2.0/24"),
        ("limit-req-status-code", "429"),
    ]);
    assert!(!parsed.routes.ssl_redirect && parsed.routes.force_ssl_redirect);
    let limited = || RoutePolicy {
        rate_limit: Some(Box::new(RateLimit {
            rps: Some(1),
            rpm: None,
            burst_multiplier: 5,
            exempt: vec![],
            status: 503,
        })),
        ..RoutePolicy::default()
    };
    let mut policy = limited();
    parsed.routes.apply(&mut policy, true);
    assert_eq!(policy.rate_limit.unwrap().status, 429);
    assert!(policy.source.permits("10.1.1.1".parse().unwrap()));
    assert!(!policy.source.permits("10.9.1.1".parse().unwrap()));
    assert!(!policy.source.permits("172.16.0.1".parse().unwrap()));
    // An Ingress's own lists win; block-cidrs applies everywhere.
    let mut own = RoutePolicy {
        source: SourceFilter {
            allow: vec!["192.0.2.0/23".parse().unwrap()],
            deny: vec!["10.0.0.0/8".parse().unwrap()],
        },
        ..RoutePolicy::default()
    };
    parsed.routes.apply(&mut own, true);
    assert!(own.source.permits("192.0.3.1".parse().unwrap()));
    assert!(!own.source.permits("192.0.2.1".parse().unwrap()));
    assert_eq!(own.source.deny.len(), 2);

    assert!(rejected(&[("ssl-redirect", "sure")], "ssl-redirect").routes.ssl_redirect);
    assert!(!rejected(&[("force-ssl-redirect", "sure")], "force-ssl-redirect").routes.force_ssl_redirect);
    let mut policy = limited();
    rejected(&[("limit-req-status-code", "200")], "limit-req-status-code").routes.apply(&mut policy, true);
    assert_eq!(policy.rate_limit.unwrap().status, 503);
    // A broken access list fails closed.
    for key in ["whitelist-source-range", "denylist-source-range", "block-cidrs"] {
        let parsed = rejected(&[(key, "10.0.0.0/33")], key);
        let mut policy = RoutePolicy::default();
        parsed.routes.apply(&mut policy, true);
        assert!(!policy.source.permits("10.1.1.1".parse().unwrap()), "{key}");
    }
}

#[test]
fn header_configmaps() {
    let cm = |pairs: &[(&str, &str)]| ConfigMap {
        data: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    };
    let config_maps = crate::snapshot::Objects::from(BTreeMap::from([
        (ObjectRef::new("ingress-nginx", "resp"), cm(&[("X-Served-By", "weir"), ("Transfer-Encoding", "x")])),
        (ObjectRef::new("ops", "up"), cm(&[("X-Team", "ops"), ("Host", "h"), ("X-Uri", "$request_uri")])),
    ]));
    let data: BTreeMap<String, String> = [
        ("add-headers", "resp"),
        ("proxy-set-headers", "ops/up"),
        ("global-allowed-response-headers", "X-Frame-Options, x-served-by"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut warnings = Warnings::default();
    let parsed = parse(&ObjectRef::new("ingress-nginx", "controller"), &data, &config_maps, &mut warnings);
    assert_eq!(parsed.settings.response_headers, BTreeMap::from([("x-served-by".into(), "weir".into())]));
    assert_eq!(parsed.settings.upstream_headers, BTreeMap::from([("x-team".into(), "ops".into())]));
    assert_eq!(
        parsed.allowed_response_headers,
        Some(["x-frame-options".to_string(), "x-served-by".to_string()].into())
    );
    let w = warnings.finish();
    let messages: Vec<&str> = w.iter().map(|w| w.message.as_str()).collect();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(w.iter().all(|w| w.severity == Severity::Error && w.reason == Reason::InvalidSetting));
    assert!(messages.contains(&"data[add-headers]: ConfigMap ingress-nginx/resp, header \"Transfer-Encoding\": a connection or framing header, which weir sets itself; the header is skipped"), "{messages:?}");
    assert!(
        messages.iter().any(|m| m.starts_with("data[proxy-set-headers]: ConfigMap ops/up, header \"Host\""))
    );
    assert!(messages.iter().any(|m| {
        m.starts_with("data[proxy-set-headers]: ConfigMap ops/up, header \"X-Uri\": nginx variables")
    }));

    // A missing ConfigMap is an error; the other keys still apply.
    let data = BTreeMap::from([
        ("add-headers".to_string(), "gone".to_string()),
        ("hsts".to_string(), "true".to_string()),
    ]);
    let mut warnings = Warnings::default();
    let parsed = parse(&ObjectRef::new("ingress-nginx", "controller"), &data, &config_maps, &mut warnings);
    assert!(parsed.settings.response_headers.is_empty());
    assert!(parsed.settings.hsts.is_some());
    let w = warnings.finish();
    assert_eq!(w.len(), 1);
    assert_eq!(
        w[0].message,
        "data[add-headers]: ConfigMap ingress-nginx/gone not found; no header is set until it exists"
    );
}

#[test]
fn global_auth() {
    use weir_dataplane::model::{ExternalAuth, PathMatch};
    let parsed = clean(&[
        ("global-auth-url", "http://oauth2-proxy.auth.svc:4180/oauth2/auth"),
        ("global-auth-method", "POST"),
        ("global-auth-signin", "https://auth.example.com/oauth2/start?rd=$escaped_request_uri"),
        ("global-auth-response-headers", "X-Auth-Request-User, X-Auth-Request-Email"),
        ("global-auth-request-redirect", "/after"),
    ]);
    let global = ExternalAuth {
        url: "http://oauth2-proxy.auth.svc:4180/oauth2/auth".into(),
        method: "POST".into(),
        signin: Some("https://auth.example.com/oauth2/start?rd=$escaped_request_uri".into()),
        response_headers: vec!["X-Auth-Request-User".into(), "X-Auth-Request-Email".into()],
        request_redirect: Some("/after".into()),
        ..ExternalAuth::default()
    };
    assert_eq!(parsed.routes.global_auth, Some(Box::new(global.clone())));
    // Routes without authentication of their own take it, unless their Ingress opts out.
    let mut policy = RoutePolicy::default();
    parsed.routes.apply(&mut policy, true);
    assert_eq!(policy.external_auth, Some(Box::new(global.clone())));
    let mut opted_out = RoutePolicy::default();
    parsed.routes.apply(&mut opted_out, false);
    assert_eq!(opted_out.external_auth, None);
    let own = ExternalAuth { url: "http://own.svc/check".into(), ..global.clone() };
    let mut policy = RoutePolicy { external_auth: Some(Box::new(own.clone())), ..RoutePolicy::default() };
    parsed.routes.apply(&mut policy, true);
    assert_eq!(policy.external_auth, Some(Box::new(own.clone())));
    // `no-auth-locations`: ingress-nginx's default exempts ACME challenges, by prefix.
    let global_policy =
        RoutePolicy { external_auth: Some(Box::new(global.clone())), ..RoutePolicy::default() };
    let acme = PathMatch::Prefix("/.well-known/acme-challenge/".into());
    assert!(parsed.routes.exempt(&global_policy, &acme));
    assert!(!parsed.routes.exempt(&global_policy, &PathMatch::Prefix("/".into())));
    let own_policy = RoutePolicy { external_auth: Some(Box::new(own)), ..RoutePolicy::default() };
    assert!(!parsed.routes.exempt(&own_policy, &acme), "an Ingress's own auth-url is never exempted");
    let parsed = clean(&[("global-auth-url", "http://auth.svc/"), ("no-auth-locations", "/public, /health")]);
    let global_policy =
        RoutePolicy { external_auth: parsed.routes.global_auth.clone(), ..RoutePolicy::default() };
    assert!(parsed.routes.exempt(&global_policy, &PathMatch::Exact("/health".into())));
    assert!(parsed.routes.exempt(&global_policy, &PathMatch::Prefix("/public/docs".into())));
    assert!(!parsed.routes.exempt(&global_policy, &acme), "the list replaces the default");

    // A bad URL fails closed; bad settings of a good URL keep their defaults.
    let parsed = rejected(&[("global-auth-url", "ftp://auth.example.com/check")], "global-auth-url");
    let mut policy = RoutePolicy::default();
    parsed.routes.apply(&mut policy, true);
    assert!(!policy.source.permits("192.0.2.1".parse().unwrap()));
    let parsed = rejected(
        &[("global-auth-url", "http://auth.svc/"), ("global-auth-method", "get")],
        "global-auth-method",
    );
    assert_eq!(parsed.routes.global_auth.unwrap().method, "GET");
    assert!(!parsed.routes.fail_closed);
    // The cache, the signin parameter and the cookie setting, as their annotations.
    let parsed = clean(&[
        ("global-auth-url", "http://auth.svc/"),
        ("global-auth-signin", "https://login.example.com/"),
        ("global-auth-signin-redirect-param", "next"),
        ("global-auth-always-set-cookie", "true"),
        ("global-auth-cache-key", "$http_authorization"),
        ("global-auth-cache-duration", "200 1m"),
    ]);
    let auth = parsed.routes.global_auth.unwrap();
    assert_eq!(auth.signin_redirect_param.as_deref(), Some("next"));
    assert!(auth.always_set_cookie);
    let cache = auth.cache.unwrap();
    assert_eq!((cache.key.as_str(), cache.valid[0].seconds), ("$http_authorization", 60));
    let parsed = rejected(
        &[("global-auth-url", "http://auth.svc/"), ("global-auth-cache-key", "static")],
        "global-auth-cache-key",
    );
    assert_eq!(parsed.routes.global_auth.unwrap().cache, None);
    // Settings without the URL do nothing, which is said.
    let (_, w) = finding(&[("global-auth-signin", "https://auth.example.com/")], "global-auth-signin");
    assert!(w.message.contains("without global-auth-url"), "{}", w.message);
}

#[test]
fn request_path_keys() {
    let s = clean(&[("merge-slashes", "false"), ("encoded-slashes", "reject")]).settings;
    assert_eq!((s.merge_slashes, s.reject_encoded_slashes), (Some(false), Some(true)));
    let s = clean(&[("merge-slashes", "true"), ("encoded-slashes", "decode")]).settings;
    assert_eq!((s.merge_slashes, s.reject_encoded_slashes), (Some(true), Some(false)));
    assert_eq!(rejected(&[("merge-slashes", "on")], "merge-slashes").settings.merge_slashes, None);
    let bad = rejected(&[("encoded-slashes", "keep")], "encoded-slashes");
    assert_eq!(bad.settings.reject_encoded_slashes, None);
}

#[test]
fn compression_keys() {
    use weir_dataplane::model::compression::Codec;
    // Off by default, and off when only the companions are set.
    assert_eq!(clean(&[]).settings.compression, None);
    assert_eq!(clean(&[("gzip-level", "5"), ("brotli-types", "text/css")]).settings.compression, None);
    // ingress-nginx's defaults.
    let c = clean(&[("use-gzip", "true"), ("enable-brotli", "true")]).settings.compression.unwrap();
    let gzip = c.gzip.unwrap();
    assert_eq!((gzip.level, gzip.min_length), (1, 256));
    assert_eq!(gzip.types.len(), 17);
    assert!(gzip.types.iter().any(|t| t == "application/json"));
    let brotli = c.brotli.unwrap();
    assert_eq!((brotli.level, brotli.min_length), (4, 20));
    assert!(brotli.types.iter().any(|t| t == "application/xml+rss"));
    assert_eq!((c.zstd, c.gzip_disable), (None, None));
    // Every key.
    let c = clean(&[
        ("use-gzip", "true"),
        ("gzip-level", "9"),
        ("gzip-min-length", "1k"),
        ("gzip-types", "Text/CSS  application/json"),
        ("gzip-disable", "msie6"),
        ("enable-zstd", "true"),
        ("zstd-level", "3"),
        ("zstd-min-length", "0"),
        ("zstd-types", "*"),
    ])
    .settings
    .compression
    .unwrap();
    assert_eq!(
        c.gzip,
        Some(Codec { level: 9, min_length: 1024, types: vec!["text/css".into(), "application/json".into()] })
    );
    assert_eq!(c.zstd, Some(Codec { level: 3, min_length: 0, types: vec!["*".into()] }));
    assert_eq!(c.gzip_disable.as_deref(), Some("msie6"));
    // Bad values: an error naming the key; the coding stays on with the default.
    let s = rejected(&[("use-gzip", "true"), ("gzip-level", "10")], "gzip-level").settings;
    assert_eq!(s.compression.unwrap().gzip.unwrap().level, 1);
    rejected(&[("enable-brotli", "true"), ("brotli-level", "-1")], "brotli-level");
    rejected(&[("use-gzip", "yes")], "use-gzip");
    rejected(&[("use-gzip", "true"), ("gzip-types", "text/css, application/json")], "gzip-types");
    rejected(&[("use-gzip", "true"), ("gzip-types", "css")], "gzip-types");
    rejected(&[("use-gzip", "true"), ("gzip-disable", "MSIE [4-6\\.")], "gzip-disable");
    rejected(&[("enable-zstd", "true"), ("zstd-min-length", "big")], "zstd-min-length");
}

#[test]
fn hidden_response_headers() {
    let s =
        clean(&[("hide-headers", "X-Powered-By, x-aspnet-version"), ("allow-backend-server-header", "true")])
            .settings;
    assert_eq!(s.hide_headers, ["x-powered-by", "x-aspnet-version"]);
    assert_eq!(s.allow_backend_server_header, Some(true));
    assert_eq!(
        rejected(&[("hide-headers", "X-Ok, bad header")], "hide-headers").settings.hide_headers,
        [] as [String; 0]
    );
}
