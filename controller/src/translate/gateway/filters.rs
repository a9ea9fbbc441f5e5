//! `HTTPRouteRule.filters` and `timeouts` onto a route's policy (pure).
//!
//! - `RequestHeaderModifier`, `ResponseHeaderModifier`: header edits (set, add, remove);
//! - `RequestRedirect`: scheme, hostname, port, path (`ReplaceFullPath`, `ReplacePrefixMatch`),
//!   status code (302 by default);
//! - `URLRewrite`: hostname (the `Host` sent upstream) and path;
//! - `RequestMirror`: a copy of each request to the Service's ready endpoints in turn; with
//!   `percent` or `fraction`, of that share of the requests, each drawn at random. "This filter
//!   can be used multiple times within the same rule": each mirror gets its own copy, drawn by
//!   its own share (the body is read once and shared by the copies, see the dataplane's
//!   `proxy/mirror.rs`). Over h2c for a GRPCRoute or an `appProtocol: kubernetes.io/h2c` port;
//! - `timeouts.request` / `timeouts.backendRequest` (GEP-2257 durations): the time the upstream
//!   gets to answer (the shorter of the two; `0s`: a day, the longest weir waits); with a
//!   `retry`, `timeouts.request` bounds the tries together too;
//! - `retry` (`HTTPRouteRetry`, experimental channel in v1.6): `codes`, `attempts` (1 when
//!   unset), `backoff` (none when unset) onto the proxy's retries ([`retries`]).
//!
//! - `CORS`: onto weir's CORS machinery (`cors.rs`).
//!
//! Filters on a `backendRef` (`HTTPBackendRef.filters`, "executed if and only if the request
//! is being forwarded to the backend defined here"): `RequestHeaderModifier` (once), applied
//! after the rule's own edits to the requests of that share only ([`backend_edits`]).
//!
//! Any other type (`ExtensionRef`, `ExternalAuth`, an unknown one, any other type on a
//! `backendRef`) or a filter weir cannot apply as written makes the rule answer 500 ("requests
//! that would have been processed by that filter MUST receive a HTTP error response",
//! `HTTPRouteFilter.type`) and the route not `Accepted` (`UnsupportedValue`).

use weir_dataplane::model::filters::{HeaderEdits, PathRewrite, RequestRedirect, Retries, RouteFilters};
use weir_dataplane::model::{Mirror, RoutePolicy};

use super::GatewayConfig;
use crate::gateway::{
    BackendRef, HttpHeaderFilter, HttpPathModifier, HttpRouteFilter, HttpRouteRetry, HttpRouteRule,
};

/// The policy of one rule, and what in it cannot be served (the rule then answers 500).
#[derive(Debug, Default)]
pub struct RulePolicy {
    /// The policy.
    pub policy: RoutePolicy,
    /// Why the rule answers 500, one entry per refused filter.
    pub refused: Vec<String>,
    /// What the rule serves otherwise than written (a warning each).
    pub notes: Vec<String>,
}

/// The policy of rule `ri`; `mirror` turns the `RequestMirror` filter at a field into its
/// mirror (its share is set here), or `None` when the mirror is dropped (it says why).
pub fn rule_policy(
    ri: usize,
    rule: &HttpRouteRule,
    config: &GatewayConfig,
    mut mirror: impl FnMut(&str, &BackendRef) -> Option<Mirror>,
) -> RulePolicy {
    let mut out = RulePolicy::default();
    let mut filters = RouteFilters::default();
    for (fi, f) in rule.filters.iter().enumerate() {
        let field = format!("spec.rules[{ri}].filters[{fi}]");
        if let Err(why) = apply(&field, f, rule, config, &mut out.policy, &mut filters, &mut mirror) {
            out.refused.push(format!("{field}: {why}"));
        }
    }
    for (bi, b) in rule.backend_refs.iter().enumerate() {
        if let Err(why) = backend_edits(&b.filters) {
            out.refused.push(format!("spec.rules[{ri}].backendRefs[{bi}].{why}"));
        }
    }
    // `timeouts.request` bounds the tries of a `retry` together too.
    let mut request_ms: Option<u64> = None;
    if let Some(t) = &rule.timeouts {
        let mut shortest: Option<u64> = None;
        for (name, value) in [("request", &t.request), ("backendRequest", &t.backend_request)] {
            let Some(value) = value else { continue };
            if name == "request" {
                request_ms = duration_ms(value).filter(|ms| *ms > 0);
            }
            match duration_ms(value) {
                // "Setting a timeout to the zero duration (e.g. "0s") SHOULD disable the timeout
                // completely"; weir's longest is a day.
                Some(0) => shortest = Some(shortest.unwrap_or(DAY_MS).min(DAY_MS)),
                Some(ms) => shortest = Some(shortest.map_or(ms, |s| s.min(ms))),
                None => {
                    out.refused.push(format!("spec.rules[{ri}].timeouts.{name}: {value:?} is not a duration"))
                }
            }
        }
        out.policy.read_timeout_ms = shortest;
    }
    if let Some(r) = &rule.retry {
        match retries(r) {
            Ok(mut retries) => {
                if retries.attempts > Retries::MAX_ATTEMPTS {
                    out.notes.push(format!(
                        "spec.rules[{ri}].retry.attempts: {} retries asked, weir makes at most {}",
                        retries.attempts,
                        Retries::MAX_ATTEMPTS
                    ));
                    retries.attempts = Retries::MAX_ATTEMPTS;
                }
                retries.request_timeout_ms = request_ms;
                filters.retries = Some(retries);
            }
            Err(why) => out.refused.push(format!("spec.rules[{ri}].retry: {why}")),
        }
    }
    if !out.refused.is_empty() {
        filters = RouteFilters { respond: Some(500), ..RouteFilters::default() };
    }
    if filters != RouteFilters::default() {
        out.policy.filters = Some(Box::new(filters));
    }
    out
}

const DAY_MS: u64 = 86_400_000;

/// The request header edits of a `backendRef`'s `filters` (`None`: none); `Err` (`filters[i]:
/// why`) for a type weir does not apply there or a second `RequestHeaderModifier` ("cannot be
/// repeated").
pub fn backend_edits(filters: &[HttpRouteFilter]) -> Result<Option<Box<HeaderEdits>>, String> {
    let mut out: Option<Box<HeaderEdits>> = None;
    for (fi, f) in filters.iter().enumerate() {
        let field = format!("filters[{fi}]");
        match f.type_.as_str() {
            "RequestHeaderModifier" => {
                let h = f.request_header_modifier.as_ref().ok_or_else(|| {
                    format!("{field}: type RequestHeaderModifier without requestHeaderModifier")
                })?;
                if out.is_some() {
                    return Err(format!("{field}: RequestHeaderModifier filter cannot be repeated"));
                }
                out = Some(Box::new(edits(h).map_err(|why| format!("{field}: {why}"))?));
            }
            other => {
                return Err(format!(
                    "{field}: filter type {other:?} is not supported on a backendRef (only RequestHeaderModifier)"
                ));
            }
        }
    }
    Ok(out)
}

fn apply(
    field: &str,
    f: &HttpRouteFilter,
    rule: &HttpRouteRule,
    config: &GatewayConfig,
    policy: &mut RoutePolicy,
    filters: &mut RouteFilters,
    mirror: &mut impl FnMut(&str, &BackendRef) -> Option<Mirror>,
) -> Result<(), String> {
    let missing = |what: &str| format!("type {} without {what}", f.type_);
    match f.type_.as_str() {
        "RequestHeaderModifier" => {
            let h = f.request_header_modifier.as_ref().ok_or_else(|| missing("requestHeaderModifier"))?;
            filters.request_headers = Some(edits(h)?);
        }
        "ResponseHeaderModifier" => {
            let h = f.response_header_modifier.as_ref().ok_or_else(|| missing("responseHeaderModifier"))?;
            filters.response_headers = Some(edits(h)?);
        }
        "RequestRedirect" => {
            let r = f.request_redirect.as_ref().ok_or_else(|| missing("requestRedirect"))?;
            let scheme = match r.scheme.as_deref() {
                None => None,
                Some(s @ ("http" | "https")) => Some(s.to_string()),
                Some(other) => return Err(format!("scheme {other:?} is not http or https")),
            };
            let code = match r.status_code.unwrap_or(302) {
                c @ (301 | 302 | 303 | 307 | 308) => c as u16,
                other => return Err(format!("statusCode {other} is not 301, 302, 303, 307 or 308")),
            };
            let port = match r.port {
                None => None,
                Some(p) => {
                    Some(u16::try_from(p).ok().filter(|p| *p != 0).ok_or(format!("port {p} is not a port"))?)
                }
            };
            let hostname = match &r.hostname {
                None => None,
                Some(h) => Some(super::hostname::Hostname::parse(h).map_err(|e| e.to_string())?.to_string()),
            };
            let path = r.path.as_ref().map(|p| path_modifier(p, rule)).transpose()?;
            let ports = (port_u16(config.http_port), port_u16(config.https_port));
            filters.redirect =
                Some(RequestRedirect { scheme, hostname, port, path, code, listener_ports: ports });
        }
        "URLRewrite" => {
            let r = f.url_rewrite.as_ref().ok_or_else(|| missing("urlRewrite"))?;
            if let Some(h) = &r.hostname {
                policy.upstream_host =
                    Some(super::hostname::Hostname::parse(h).map_err(|e| e.to_string())?.to_string());
            }
            if let Some(p) = &r.path {
                filters.rewrite_path = Some(path_modifier(p, rule)?);
            }
        }
        "RequestMirror" => {
            let m = f.request_mirror.as_ref().ok_or_else(|| missing("requestMirror"))?;
            let share_ppm = mirror_share(m)?;
            // "This filter can be used multiple times within the same rule": one copy each.
            if let Some(to) = mirror(field, &m.backend_ref) {
                policy.mirrors.get_or_insert_default().push(Mirror { share_ppm, ..to });
            }
        }
        "CORS" => {
            let c = f.cors.as_ref().ok_or_else(|| missing("cors"))?;
            policy.cors = Some(Box::new(super::cors::cors(c)?));
        }
        other => return Err(format!("filter type {other:?} is not supported")),
    }
    Ok(())
}

/// `HTTPRequestMirrorFilter.percent` ("Percent represents the percentage of requests that
/// should be mirrored to BackendRef. Its minimum value is 0 (indicating 0% of requests) and its
/// maximum value is 100") or `fraction` (numerator over denominator, 100 by default; "Only one
/// of percent or fraction may be specified"), in parts per million; `None`: every request.
fn mirror_share(m: &crate::gateway::HttpRequestMirrorFilter) -> Result<Option<u32>, String> {
    let (numerator, denominator) = match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => return Err("only one of percent or fraction may be specified".into()),
        (None, None) => return Ok(None),
        (Some(p), None) => (p, 100),
        (None, Some(f)) => (f.numerator, f.denominator.unwrap_or(100)),
    };
    if denominator <= 0 || numerator < 0 || numerator > denominator {
        return Err(format!(
            "the share {numerator}/{denominator} is not between 0 and 1 (a positive denominator, a numerator from 0 to it)"
        ));
    }
    if numerator == denominator {
        return Ok(None);
    }
    let ppm = i64::from(numerator) * 1_000_000 / i64::from(denominator);
    Ok(Some(u32::try_from(ppm).unwrap_or(1_000_000)))
}

/// `HTTPRouteRetry`: `codes` from 400 to 599 (`HTTPRouteRetryStatusCode`'s bounds), `attempts`
/// 1 or more ("When this field is unspecified, the number of times to attempt to retry a backend
/// request is implementation-specific": weir retries once), `backoff` a GEP-2257 duration
/// ("When this field is unspecified, the time to wait between retry attempts is
/// implementation-specific": weir does not wait).
fn retries(r: &HttpRouteRetry) -> Result<Retries, String> {
    let mut codes = Vec::with_capacity(r.codes.len());
    for c in &r.codes {
        match u16::try_from(*c) {
            Ok(code @ 400..=599) => codes.push(code),
            _ => return Err(format!("code {c} is not from 400 to 599")),
        }
    }
    codes.sort_unstable();
    codes.dedup();
    let attempts = match r.attempts {
        None => 1,
        Some(n) => u32::try_from(n).ok().filter(|n| *n >= 1).ok_or(format!("attempts {n} is less than 1"))?,
    };
    let backoff_ms = match &r.backoff {
        None => 0,
        Some(b) => duration_ms(b).ok_or_else(|| format!("backoff {b:?} is not a duration"))?,
    };
    Ok(Retries { codes, attempts, backoff_ms, request_timeout_ms: None })
}

fn port_u16(p: i32) -> u16 {
    u16::try_from(p).unwrap_or(0)
}

/// `HTTPHeaderFilter`: names lower-cased ("Header names are case-insensitive").
fn edits(h: &HttpHeaderFilter) -> Result<HeaderEdits, String> {
    let pair = |name: &str, value: &str| -> Result<(String, String), String> {
        let name = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("header name {name:?} is invalid"));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return Err(format!("header {name}: value {value:?} cannot be sent"));
        }
        Ok((name, value.to_string()))
    };
    Ok(HeaderEdits {
        set: h.set.iter().map(|x| pair(&x.name, &x.value)).collect::<Result<_, _>>()?,
        add: h.add.iter().map(|x| pair(&x.name, &x.value)).collect::<Result<_, _>>()?,
        remove: h.remove.iter().map(|n| pair(n, "").map(|(n, _)| n)).collect::<Result<_, _>>()?,
    })
}

/// `HTTPPathModifier`; `ReplacePrefixMatch` "is only compatible with a `PathPrefix`
/// HTTPRouteMatch": the rule must have exactly one match, a PathPrefix.
fn path_modifier(p: &HttpPathModifier, rule: &HttpRouteRule) -> Result<PathRewrite, String> {
    match p.type_.as_str() {
        "ReplaceFullPath" => {
            let full = p.replace_full_path.as_deref().ok_or("ReplaceFullPath without replaceFullPath")?;
            if !full.starts_with('/') {
                return Err(format!("replaceFullPath {full:?} must start with /"));
            }
            Ok(PathRewrite::Full(full.to_string()))
        }
        "ReplacePrefixMatch" => {
            let replacement =
                p.replace_prefix_match.as_deref().ok_or("ReplacePrefixMatch without replacePrefixMatch")?;
            if !replacement.starts_with('/') {
                return Err(format!("replacePrefixMatch {replacement:?} must start with /"));
            }
            let matched = match rule.matches.as_slice() {
                [] => "/".to_string(),
                [m] => match &m.path {
                    None => "/".to_string(),
                    Some(path) if path.type_.as_deref().unwrap_or("PathPrefix") == "PathPrefix" => {
                        path.value.clone().unwrap_or_else(|| "/".into())
                    }
                    Some(_) => {
                        return Err("ReplacePrefixMatch needs the rule's match to be a PathPrefix".into());
                    }
                },
                _ => return Err("ReplacePrefixMatch needs exactly one PathPrefix match in the rule".into()),
            };
            Ok(PathRewrite::Prefix { matched, replacement: replacement.to_string() })
        }
        other => Err(format!("path modifier type {other:?} is not supported")),
    }
}

/// A GEP-2257 duration (`1h`, `30s`, `500ms`, `1m30s`: one to four `<number><unit>`, units
/// h, m, s, ms) in milliseconds.
pub fn duration_ms(s: &str) -> Option<u64> {
    let mut rest = s;
    let mut total: u64 = 0;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total = total.checked_add(n.checked_mul(unit)?)?;
        parts += 1;
    }
    (parts > 0 && parts <= 4).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(percent: Option<i32>, fraction: Option<(i32, Option<i32>)>) -> Result<Option<u32>, String> {
        mirror_share(&crate::gateway::HttpRequestMirrorFilter {
            percent,
            fraction: fraction
                .map(|(numerator, denominator)| crate::gateway::Fraction { numerator, denominator }),
            ..Default::default()
        })
    }

    /// `HTTPRequestMirrorFilter.percent` / `fraction` in parts per million.
    #[test]
    fn request_mirror_percent_and_fraction() {
        assert_eq!(share(None, None), Ok(None));
        assert_eq!(share(Some(100), None), Ok(None));
        assert_eq!(share(Some(25), None), Ok(Some(250_000)));
        assert_eq!(share(Some(0), None), Ok(Some(0)));
        assert_eq!(share(None, Some((1, None))), Ok(Some(10_000)), "denominator 100 by default");
        assert_eq!(share(None, Some((1, Some(3)))), Ok(Some(333_333)));
        assert_eq!(share(None, Some((5, Some(5)))), Ok(None));
        assert!(share(Some(101), None).is_err());
        assert!(share(Some(-1), None).is_err());
        assert!(share(None, Some((1, Some(0)))).is_err());
        assert!(share(Some(10), Some((1, Some(2)))).is_err(), "only one of them");
    }

    /// `HTTPRouteRetry`: codes within `HTTPRouteRetryStatusCode`'s 400 to 599, `attempts`
    /// "Minimum:=1" (1 when unset), `backoff` a duration (none when unset).
    #[test]
    fn http_route_retry() {
        let r = |codes: Vec<i32>, attempts: Option<i32>, backoff: Option<&str>| {
            retries(&HttpRouteRetry { codes, attempts, backoff: backoff.map(str::to_string) })
        };
        assert_eq!(
            r(vec![503, 500, 500], Some(3), Some("100ms")),
            Ok(Retries { codes: vec![500, 503], attempts: 3, backoff_ms: 100, request_timeout_ms: None })
        );
        assert_eq!(
            r(vec![], None, None),
            Ok(Retries { codes: vec![], attempts: 1, backoff_ms: 0, request_timeout_ms: None })
        );
        assert!(r(vec![600], None, None).is_err());
        assert!(r(vec![399], None, None).is_err());
        assert!(r(vec![500], Some(0), None).is_err());
        assert!(r(vec![500], None, Some("1d")).is_err());
    }

    /// GEP-2257 (`Duration` in `shared_types.go`): `^([0-9]{1,5}(h|m|s|ms)){1,4}$`.
    #[test]
    fn gep_2257_durations() {
        assert_eq!(duration_ms("1h"), Some(3_600_000));
        assert_eq!(duration_ms("1m30s"), Some(90_000));
        assert_eq!(duration_ms("500ms"), Some(500));
        assert_eq!(duration_ms("0s"), Some(0));
        for bad in ["", "1", "1d", "1.5s", "123456s", "1h1m1s1ms1h", "-1s", "s"] {
            assert_eq!(duration_ms(bad), None, "{bad}");
        }
    }
}
