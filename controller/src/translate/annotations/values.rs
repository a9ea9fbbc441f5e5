//! Parsers of annotation values: each takes the trimmed text and returns a typed value or the
//! reason it is invalid (a sentence fragment, quoted in the warning).

use weir_dataplane::model::IpNet;

/// An absolute `http`/`https` URL with a host, usable as a `Location` header.
pub(super) fn redirect_url(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("only absolute http:// and https:// URLs are allowed".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    header_text(s)
}

/// A boolean as ingress-nginx (Go's `strconv.ParseBool`) reads it.
pub(crate) fn boolean(s: &str) -> Result<bool, String> {
    match s {
        "true" | "True" | "TRUE" | "t" | "T" | "1" => Ok(true),
        "false" | "False" | "FALSE" | "f" | "F" | "0" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// A `rewrite-target`: a path (with optional query) where `$1`…`$9` or `${1}` stand for the
/// captures of the path regex.
pub(super) fn rewrite_target(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err("the target must be a path starting with / (for redirects use permanent-redirect or temporal-redirect)".into());
    }
    let bytes = s.as_bytes();
    for (i, _) in s.match_indices('$') {
        match bytes.get(i + 1) {
            Some(b'0'..=b'9') => {}
            Some(b'{')
                if matches!(bytes.get(i + 2), Some(b'0'..=b'9')) && bytes.get(i + 3) == Some(&b'}') => {}
            _ => return Err("only $1…$9 (or ${1}) captures are supported, not nginx variables".into()),
        }
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("only visible ASCII characters are allowed, no spaces".into());
    }
    Ok(s.to_string())
}

/// CORS origins, comma-separated: `*`, `https://app.example.com[:port]` or
/// `https://*.example.com[:port]`.
pub(super) fn cors_origins(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for origin in s.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        if origin == "*" {
            out.push(origin.to_string());
            continue;
        }
        let (scheme, rest) = origin
            .split_once("://")
            .ok_or_else(|| format!("origin {origin:?} has no scheme (https://...)"))?;
        if !matches!(scheme, "http" | "https") {
            return Err(format!("origin {origin:?}: only http and https origins"));
        }
        let host = rest.strip_prefix("*.").unwrap_or(rest);
        let host = match host.rsplit_once(':') {
            Some((h, port)) if port.parse::<u16>().is_ok() => h,
            _ => host,
        };
        let valid = !host.is_empty()
            && host
                .split('.')
                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !valid {
            return Err(format!("origin {origin:?} is not scheme://host[:port] (a leading *. is allowed)"));
        }
        out.push(origin.to_ascii_lowercase());
    }
    if out.is_empty() {
        return Err("no origin given".into());
    }
    Ok(out)
}

/// A comma-separated list of method names (`GET, PUT`).
pub(super) fn cors_methods(s: &str) -> Result<String, String> {
    token_list(s, |b| b.is_ascii_alphabetic(), "method names")
}

/// A comma-separated list of header names (`Content-Type, X-Custom`), or `*`.
pub(crate) fn cors_headers(s: &str) -> Result<String, String> {
    if s == "*" {
        return Ok(s.to_string());
    }
    token_list(s, |b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_', "header names")
}

fn token_list(s: &str, ok: impl Fn(u8) -> bool, what: &str) -> Result<String, String> {
    let items: Vec<&str> = s.split(',').map(str::trim).collect();
    if items.iter().any(|i| i.is_empty() || !i.bytes().all(&ok)) {
        return Err(format!("expected a comma-separated list of {what}"));
    }
    Ok(items.join(", "))
}

/// A positive whole number (a rate or a multiplier).
pub(crate) fn rate(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number greater than 0".into()),
    }
}

/// A whole number of seconds.
pub(super) fn seconds(s: &str) -> Result<u32, String> {
    s.parse().map_err(|_| "expected a whole number of seconds".to_string())
}

/// An nginx timeout: seconds (`60`), or with a unit (`500ms`, `30s`, `5m`, `1h`); 1 ms to 1 day.
pub(crate) fn timeout_ms(s: &str) -> Result<u64, String> {
    let err = || "expected seconds (60) or a duration such as 500ms, 30s, 5m".to_string();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| err())?;
    let ms = match unit {
        "" | "s" => n.checked_mul(1000),
        "ms" => Some(n),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(err()),
    }
    .ok_or_else(err)?;
    if ms == 0 || ms > 86_400_000 {
        return Err("must be between 1ms and 1 day".into());
    }
    Ok(ms)
}

/// An nginx timeout as [`timeout_ms`], or `0` for no limit (`proxy-next-upstream-timeout`).
pub(crate) fn timeout_ms_or_zero(s: &str) -> Result<u64, String> {
    if s.bytes().all(|b| b == b'0') && !s.is_empty() {
        return Ok(0);
    }
    timeout_ms(s).map_err(|why| format!("{why} (or 0 for no limit)"))
}

/// `proxy-next-upstream`: conditions separated by spaces, nginx's names; `off` (which wins, as in
/// nginx) is the empty list.
pub(crate) fn next_upstream(s: &str) -> Result<Vec<weir_dataplane::model::RetryOn>, String> {
    use weir_dataplane::model::RetryOn::*;
    let (mut on, mut off) = (Vec::new(), false);
    for word in s.split_ascii_whitespace() {
        on.push(match word {
            "off" => {
                off = true;
                continue;
            }
            "error" => Error,
            "timeout" => Timeout,
            "invalid_header" => InvalidHeader,
            "http_500" => Http500,
            "http_502" => Http502,
            "http_503" => Http503,
            "http_504" => Http504,
            "http_403" => Http403,
            "http_404" => Http404,
            "http_429" => Http429,
            "non_idempotent" => NonIdempotent,
            other => {
                return Err(format!(
                    "unknown condition {other:?} (expected error, timeout, invalid_header, http_500, http_502, http_503, http_504, http_403, http_404, http_429, non_idempotent or off)"
                ));
            }
        });
    }
    if off {
        return Ok(Vec::new());
    }
    if on.is_empty() {
        return Err("expected conditions such as \"error timeout\", or off".into());
    }
    on.sort_unstable();
    on.dedup();
    Ok(on)
}

/// `proxy-next-upstream-tries`: a whole number, `0` for every endpoint.
pub(crate) fn tries(s: &str) -> Result<u32, String> {
    s.parse().map_err(|_| "expected a whole number (0 for every endpoint)".to_string())
}

/// An `auth-url` or an `auth-signin`: an absolute `http://` or `https://` URL template whose
/// `$variables` the dataplane's URL dialect accepts (it expands them per request).
pub(crate) fn auth_url(s: &str) -> Result<String, String> {
    use weir_dataplane::vars::{Dialect, Part, Problem, Template, Var};
    let template = Template::parse(s, Dialect::Url).map_err(|rejected| {
        let name = match rejected.0.first() {
            Some(Problem::Unsupported(name) | Problem::BadHeader(name)) => name.as_str(),
            _ => "",
        };
        format!("unsupported variable ${name} (supported: {})", Dialect::Url.hint())
    })?;
    // Check the shape with the variables filled in.
    let sample: String = template
        .parts()
        .iter()
        .map(|part| match part {
            Part::Text(text) => text.as_str(),
            Part::Var(Var::Scheme) => "http",
            Part::Var(_) => "x",
        })
        .collect();
    let uri: http::Uri = sample.parse().map_err(|e| format!("not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("expected an absolute http:// or https:// URL".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    header_text(s)
}

/// `mirror-target`: an absolute `http://` or `https://` URL (the scheme written out), whose
/// `$variables` are those of [`auth_url`].
pub(super) fn mirror_target(s: &str) -> Result<String, String> {
    let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
    if !lower.starts_with("http://") && !lower.starts_with("https://") {
        return Err("expected an absolute http:// or https:// URL".into());
    }
    auth_url(s)
}

/// nginx's protocol list (`TLSv1.2 TLSv1.3`): the versions weir has, and the older ones named.
pub(crate) fn tls_versions(
    value: &str,
) -> Result<(Vec<weir_dataplane::model::TlsVersion>, Vec<String>), String> {
    use weir_dataplane::model::TlsVersion;
    let (mut versions, mut old) = (Vec::new(), Vec::new());
    for token in value.split_whitespace() {
        match token {
            "TLSv1.2" => versions.push(TlsVersion::Tls12),
            "TLSv1.3" => versions.push(TlsVersion::Tls13),
            "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" => old.push(token.to_string()),
            _ => return Err(format!("{token:?} is not a protocol (TLSv1.2, TLSv1.3)")),
        }
    }
    versions.sort();
    versions.dedup();
    if versions.is_empty() {
        return Err("weir offers only TLSv1.2 and TLSv1.3".into());
    }
    Ok((versions, old))
}

/// An HTTP method name.
pub(crate) fn method(s: &str) -> Result<String, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("expected a method name such as GET or POST".into());
    }
    Ok(s.to_string())
}

/// A header (or cookie) name: letters, digits, `-` and `_`.
pub(crate) fn header_name(s: &str) -> Result<String, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err("expected a name of letters, digits, - and _".into());
    }
    Ok(s.to_string())
}

/// `load-balance`: `round_robin` or `ewma` (ingress-nginx's two).
pub(crate) fn load_balance(s: &str) -> Result<weir_dataplane::model::Balance, String> {
    match s {
        "round_robin" => Ok(weir_dataplane::model::Balance::RoundRobin),
        "ewma" => Ok(weir_dataplane::model::Balance::Ewma),
        _ => Err("expected round_robin or ewma".to_string()),
    }
}

/// `upstream-hash-by`: a hash key template (literal text and nginx variables weir knows).
pub(crate) fn hash_key(s: &str) -> Result<String, String> {
    weir_dataplane::hashkey::HashKey::parse(s).map(|_| s.to_string())
}

/// A regular expression in RE2 syntax (Rust's `regex` crate).
pub(super) fn regex(s: &str) -> Result<String, String> {
    weir_dataplane::route::router::compile_path_regex(s).map(|_| s.to_string()).map_err(|e| {
        format!(
            "not a valid regular expression (RE2 syntax): {}",
            e.to_string().lines().last().unwrap_or_default()
        )
    })
}

/// A cookie `Domain`: a host name, optionally with a leading dot.
pub(super) fn cookie_domain(s: &str) -> Result<String, String> {
    let name = s.strip_prefix('.').unwrap_or(s);
    if name.is_empty()
        || !name
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err("expected a domain name".into());
    }
    Ok(s.to_ascii_lowercase())
}

/// Comma-separated HTTP error statuses (400 to 599).
pub(crate) fn status_codes(s: &str) -> Result<Vec<u16>, String> {
    let mut codes = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.parse::<u16>() {
            Ok(code @ 400..=599) => codes.push(code),
            _ => return Err(format!("{item:?} is not an error status from 400 to 599")),
        }
    }
    if codes.is_empty() {
        return Err("no status given".into());
    }
    codes.sort_unstable();
    codes.dedup();
    Ok(codes)
}

/// `on` or `off`.
pub(crate) fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err("expected on or off".into()),
    }
}

/// Comma-separated host names (exact or `*.` wildcard), for `server-alias`.
pub(super) fn host_list(s: &str) -> Result<Vec<weir_dataplane::model::HostMatch>, String> {
    let mut hosts = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match weir_dataplane::model::HostMatch::parse(item) {
            Ok(
                h @ (weir_dataplane::model::HostMatch::Exact(_)
                | weir_dataplane::model::HostMatch::Wildcard(_)),
            ) => hosts.push(h),
            Ok(_) => return Err("an alias must be a host name".into()),
            Err(e) => return Err(e.to_string()),
        }
    }
    if hosts.is_empty() {
        return Err("no host name given".into());
    }
    hosts.sort();
    hosts.dedup();
    Ok(hosts)
}

/// A redirect status: 300 to 308.
pub(super) fn redirect_code(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(code @ 300..=308) => Ok(code),
        _ => Err("expected a redirect status code from 300 to 308".into()),
    }
}

/// A path starting with `/`, without query or fragment.
pub(super) fn app_root(s: &str) -> Result<String, String> {
    if !s.starts_with('/') {
        return Err("the path must start with /".into());
    }
    if s.contains(['?', '#']) {
        return Err("a path only, without query or fragment".into());
    }
    let path: http::uri::PathAndQuery = s.parse().map_err(|e| format!("not a valid path ({e})"))?;
    Ok(path.as_str().to_string())
}

/// Text sendable as a header value: visible ASCII and spaces, not empty.
pub(crate) fn header_text(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("empty".into());
    }
    if !s.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err("only visible ASCII characters are allowed".into());
    }
    Ok(s.to_string())
}

/// `host` or `host:port` (a DNS name or an IP address); no nginx variables.
pub(super) fn host_and_port(s: &str) -> Result<String, String> {
    if s.contains('$') {
        return Err("nginx variables are not supported; give a literal host name".into());
    }
    let authority: http::uri::Authority = s.parse().map_err(|e| format!("not a host[:port] ({e})"))?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return Err("not a host[:port]".into());
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let valid_name = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if !valid_name && host.parse::<std::net::IpAddr>().is_err() {
        return Err(format!("{host:?} is not a valid host name or IP address"));
    }
    Ok(authority.as_str().to_ascii_lowercase())
}

/// An nginx size: bytes, or a number with `k`, `m` or `g` (either case); `0` is unlimited.
pub(crate) fn size(s: &str) -> Result<u64, String> {
    let err = || "expected a size like 8m, 512k, 1g or 1048576 (0 for no limit)".to_string();
    let (digits, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], Some(c.to_ascii_lowercase())),
        _ => (s, None),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let shift = match unit {
        None => 0,
        Some('k') => 10,
        Some('m') => 20,
        Some('g') => 30,
        Some(_) => return Err(err()),
    };
    n.checked_mul(1 << shift).ok_or_else(|| "too large".to_string())
}

/// A comma-separated list of CIDRs or addresses (`10.0.0.0/8, 192.168.1.1`); all must be valid.
pub(crate) fn cidr_list(s: &str) -> Result<Vec<IpNet>, String> {
    let mut nets = Vec::new();
    for item in s.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        nets.push(item.parse::<IpNet>().map_err(|e| e.to_string())?);
    }
    if nets.is_empty() {
        return Err("no CIDR given".into());
    }
    nets.sort();
    nets.dedup();
    Ok(nets)
}

/// An nginx time (`proxy_cache_valid`): units `s` (default), `m`, `h`, `d`, `w`, `M`, `y`,
/// combinable (`1h30m`); in seconds.
pub(crate) fn nginx_seconds(s: &str) -> Result<u64, String> {
    let err = || format!("{s:?} is not an nginx time such as 30s, 5m, 1h or 1h30m");
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let split = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if split == 0 {
            return Err(err());
        }
        let n: u64 = rest[..split].parse().map_err(|_| err())?;
        rest = &rest[split..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "" | "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 604_800,
            "M" => 2_592_000,
            "y" => 31_536_000,
            _ => return Err(err()),
        };
        rest = &rest[unit_len..];
        total = n.checked_mul(factor).and_then(|v| total.checked_add(v)).ok_or_else(err)?;
    }
    Ok(total)
}

/// `auth-cache-duration`: comma-separated `proxy_cache_valid` rules, each statuses then a time
/// (`200 202 10m, 401 1m`); no status means 200, 301 and 302, `any` every status.
pub(crate) fn cache_durations(s: &str) -> Result<Vec<weir_dataplane::model::CacheValid>, String> {
    let mut rules = Vec::new();
    for rule in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let words: Vec<&str> = rule.split_whitespace().collect();
        let Some((time, statuses)) = words.split_last() else { continue };
        let seconds = nginx_seconds(time)?;
        let codes = match statuses {
            [] => vec![200, 301, 302],
            ["any"] => Vec::new(),
            list => list
                .iter()
                .map(|c| match c.parse::<u16>() {
                    Ok(code) if (100..=599).contains(&code) => Ok(code),
                    _ => Err(format!("{c:?} is not an HTTP status (or any)")),
                })
                .collect::<Result<_, _>>()?,
        };
        rules.push(weir_dataplane::model::CacheValid { codes, seconds });
    }
    if rules.is_empty() {
        return Err("expected rules such as \"200 202 401 5m\"".into());
    }
    Ok(rules)
}

/// `auth-cache-key`: a template of request variables, as the dataplane's cache reads it.
pub(crate) fn auth_cache_key(s: &str) -> Result<String, String> {
    weir_dataplane::state::authcache::AuthKey::parse(s).map(|_| s.to_string())
}

/// `auth-cache-key` (`key`) with `auth-cache-duration` (`valid`; ingress-nginx's default
/// `200 202 401 5m` when unset).
pub(crate) fn auth_cache(
    key: String,
    valid: Option<Vec<weir_dataplane::model::CacheValid>>,
) -> weir_dataplane::model::AuthCacheSpec {
    let valid = valid.unwrap_or_else(|| {
        vec![weir_dataplane::model::CacheValid { codes: vec![200, 202, 401], seconds: 300 }]
    });
    weir_dataplane::model::AuthCacheSpec { key, valid }
}

/// A query parameter name (`auth-signin-redirect-param`).
pub(crate) fn query_param(s: &str) -> Result<String, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'~'))
    {
        return Err("expected a query parameter name (letters, digits, _ - . ~)".into());
    }
    Ok(s.to_string())
}

/// A whole number from `min` up, for settings weir validates but does not need.
pub(crate) fn at_least(min: u64) -> impl Fn(&str) -> Result<u64, String> {
    move |s| match s.parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!("expected a whole number from {min}")),
    }
}

/// A buffer size (`client-body-buffer-size`, `proxy-buffer-size`): an nginx size above 0.
pub(crate) fn buffer_size(s: &str) -> Result<u64, String> {
    match size(s)? {
        0 => Err("a buffer cannot be empty (expected a size like 8k or 16k)".into()),
        n => Ok(n),
    }
}

/// `proxy-buffers-number`: how many buffers, from 1.
pub(crate) fn buffers_number(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n @ 1..=1024) => Ok(n),
        _ => Err("expected a whole number from 1 to 1024".into()),
    }
}

/// A server's host (`otlp-collector-host`, `syslog-host`, `global-rate-limit-memcached-host`):
/// a DNS name or an IP address (`[v6]` too), without scheme or port. An address comes back
/// written canonically, a name in lower case without its trailing dot.
pub(crate) fn host(s: &str) -> Result<String, String> {
    if let Ok(ip) =
        s.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(s).parse::<std::net::IpAddr>()
    {
        return Ok(ip.to_string());
    }
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let name = s.strip_suffix('.').unwrap_or(s);
    if name.len() <= 253 && name.split('.').all(label) {
        Ok(name.to_ascii_lowercase())
    } else {
        Err("expected a host name or an IP address, without scheme or port".into())
    }
}

/// A TCP or UDP port, 1–65535.
pub(crate) fn port(s: &str) -> Result<u16, String> {
    s.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| "expected a port from 1 to 65535".into())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nginx_times_and_cache_rules() {
        assert_eq!(nginx_seconds("5m"), Ok(300));
        assert_eq!(nginx_seconds("1h30m"), Ok(5400));
        assert_eq!(nginx_seconds("10"), Ok(10));
        for bad in ["", "m", "5x", "1.5m", "-1"] {
            assert!(nginx_seconds(bad).is_err(), "{bad}");
        }
        let rules = cache_durations("200 202 10m, 401 1m,5s, any 1s").unwrap();
        assert_eq!(rules.len(), 4);
        assert_eq!((rules[0].codes.clone(), rules[0].seconds), (vec![200, 202], 600));
        assert_eq!((rules[2].codes.clone(), rules[2].seconds), (vec![200, 301, 302], 5));
        assert!(rules[3].codes.is_empty());
        for bad in ["", "200 abc", "200 5m; x", "99 5m"] {
            assert!(cache_durations(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(size("0"), Ok(0));
        assert_eq!(size("1024"), Ok(1024));
        assert_eq!(size("8k"), Ok(8 << 10));
        assert_eq!(size("8K"), Ok(8 << 10));
        assert_eq!(size("1m"), Ok(1 << 20));
        assert_eq!(size("2G"), Ok(2 << 30));
        for bad in ["", "m", "1.5m", "1mb", "-1", "1t", "99999999999999999999g"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redirects() {
        assert!(redirect_url("https://example.com/x?y=1").is_ok());
        assert!(redirect_url("http://example.com").is_ok());
        for bad in ["/relative", "ftp://example.com/", "https://", "javascript:alert(1)", "https://a b/"] {
            assert!(redirect_url(bad).is_err(), "{bad}");
        }
        assert_eq!(redirect_code("308"), Ok(308));
        for bad in ["200", "309", "abc", ""] {
            assert!(redirect_code(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_and_paths() {
        assert_eq!(host_and_port("Backend.Internal:8080").unwrap(), "backend.internal:8080");
        assert_eq!(host_and_port("10.0.0.1").unwrap(), "10.0.0.1");
        for bad in ["$host", "a b", "user@host", "-bad.example", "", "a..b"] {
            assert!(host_and_port(bad).is_err(), "{bad}");
        }
        assert_eq!(app_root("/app").unwrap(), "/app");
        for bad in ["app", "/a?b", "/a b", ""] {
            assert!(app_root(bad).is_err(), "{bad}");
        }
        assert!(header_text("x\ny").is_err());
    }

    #[test]
    fn booleans_and_rewrites() {
        assert_eq!(boolean("true"), Ok(true));
        assert_eq!(boolean("0"), Ok(false));
        assert!(boolean("yes").is_err());
        assert_eq!(rewrite_target("/$2").unwrap(), "/$2");
        assert_eq!(rewrite_target("/v2/${1}/x?y=1").unwrap(), "/v2/${1}/x?y=1");
        for bad in ["$1", "https://x/", "/$host", "/a b", "/$", "/${x}"] {
            assert!(rewrite_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cors_values() {
        assert_eq!(
            cors_origins("https://App.example.com, https://*.shop.example:8443 ,*").unwrap(),
            ["https://app.example.com", "https://*.shop.example:8443", "*"]
        );
        for bad in ["app.example.com", "ftp://x.example", "https://", "https://a b", " , "] {
            assert!(cors_origins(bad).is_err(), "{bad}");
        }
        assert_eq!(cors_methods("GET,PUT , POST").unwrap(), "GET, PUT, POST");
        assert!(cors_methods("GET;DROP").is_err());
        assert_eq!(cors_headers("X-Custom,Content-Type").unwrap(), "X-Custom, Content-Type");
        assert!(cors_headers("X-A\r\nX-B").is_err());
        assert_eq!(seconds("600"), Ok(600));
        assert!(seconds("-1").is_err());
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout_ms("60"), Ok(60_000));
        assert_eq!(timeout_ms("500ms"), Ok(500));
        assert_eq!(timeout_ms("2m"), Ok(120_000));
        for bad in ["", "0", "1.5", "10d", "-1", "2h30m"] {
            assert!(timeout_ms(bad).is_err(), "{bad}");
        }
        assert_eq!(tries("0"), Ok(0));
        assert!(tries("many").is_err());
    }

    #[test]
    fn auth_urls() {
        assert!(auth_url("http://oauth2-proxy.auth.svc:4180/oauth2/auth").is_ok());
        assert!(auth_url("http://auth.svc/check?h=$host&u=$escaped_request_uri").is_ok());
        assert!(auth_url("https://$host/oauth2/start?rd=$escaped_request_uri").is_ok());
        assert!(auth_url("https://auth.example.com/check").is_ok());
        assert!(auth_url("https://$host:8443/oauth2/auth").is_ok());
        assert!(auth_url("ftp://auth.example.com/check").unwrap_err().contains("https://"));
        assert!(auth_url("http://auth.svc/$cookie_session").unwrap_err().contains("$cookie_session"));
        assert!(auth_url("/relative").is_err());
        assert_eq!(method("POST"), Ok("POST".into()));
        assert!(method("get it").is_err());
    }

    #[test]
    fn mirror_targets() {
        assert!(mirror_target("https://test.env.com$request_uri").is_ok());
        assert!(mirror_target("http://10.0.0.1:8080/copy?u=$escaped_request_uri&h=$host").is_ok());
        assert!(mirror_target("$scheme://copy.svc$request_uri").unwrap_err().contains("http://"));
        assert!(mirror_target("ftp://copy.svc/").is_err());
        assert!(mirror_target("/relative").is_err());
        assert!(mirror_target("http://copy.svc/$cookie_x").unwrap_err().contains("$cookie_x"));
        assert!(mirror_target("http:///no-host").is_err());
    }

    #[test]
    fn cidrs() {
        let nets = cidr_list("10.0.0.0/8, 192.168.1.1 ,10.0.0.0/8").unwrap();
        assert_eq!(
            nets.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.0.0.0/8", "192.168.1.1/32"]
        );
        assert!(cidr_list("10.0.0.0/8,nope").is_err());
        assert!(cidr_list(" , ").is_err());
    }
}
