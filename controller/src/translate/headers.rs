//! Header ConfigMaps: `custom-headers` (an annotation) and the settings keys `add-headers` and
//! `proxy-set-headers`. Every key of the ConfigMap's `data` is a header name, its value the
//! header's value, sent literally: weir runs no nginx variables, so a value with `$` is refused,
//! as are names and values that are not valid HTTP and the headers that frame the message or
//! belong to one connection (weir sets those itself).

use std::collections::{BTreeMap, BTreeSet};

use http::{HeaderName, HeaderValue};

/// Which way the headers go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Set on responses to clients (`custom-headers`, `add-headers`).
    Response,
    /// Set on requests sent upstream (`proxy-set-headers`).
    Upstream,
}

/// Headers weir never takes from a ConfigMap, either way: hop-by-hop and framing headers.
const FRAMING: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
];

/// Headers weir sets on upstream requests itself (client-certificate results, the host).
const UPSTREAM_OWN: &[&str] =
    &["host", "ssl-client-cert", "ssl-client-verify", "ssl-client-subject-dn", "ssl-client-issuer-dn"];

/// The usable headers of `data` (lower-case names), and the refused ones as (header, why).
/// `allowed` (`global-allowed-response-headers`, lower case), when set, lists the only names a
/// response header may have.
pub(crate) fn read(
    data: &BTreeMap<String, String>,
    direction: Direction,
    allowed: Option<&BTreeSet<String>>,
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let mut headers = BTreeMap::new();
    let mut refused = Vec::new();
    for (name, value) in data {
        match check(name, value, direction, allowed) {
            Ok((name, value)) => {
                headers.insert(name, value);
            }
            Err(why) => refused.push((name.clone(), why)),
        }
    }
    (headers, refused)
}

fn check(
    name: &str,
    value: &str,
    direction: Direction,
    allowed: Option<&BTreeSet<String>>,
) -> Result<(String, String), String> {
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| "not a valid HTTP header name".to_string())?;
    let lower = name.as_str();
    if FRAMING.contains(&lower) {
        return Err("a connection or framing header, which weir sets itself".into());
    }
    if direction == Direction::Upstream && UPSTREAM_OWN.contains(&lower) {
        let instead = if lower == "host" { " (use the upstream-vhost annotation)" } else { "" };
        return Err(format!("weir sets it on upstream requests itself{instead}"));
    }
    if direction == Direction::Response
        && let Some(list) = allowed
        && !list.contains(lower)
    {
        return Err("not listed in the global-allowed-response-headers setting".into());
    }
    let value = value.trim();
    if value.contains('$') {
        return Err("nginx variables ($...) are not supported; weir sends values literally".into());
    }
    if value.is_empty() {
        return Err("empty value (weir does not remove headers)".into());
    }
    HeaderValue::from_str(value).map_err(|_| "not a valid HTTP header value".to_string())?;
    Ok((lower.to_string(), value.to_string()))
}

/// `namespace/name` (or `name` in `default_ns`) of a ConfigMap.
pub(crate) fn configmap_ref(
    value: &str,
    default_ns: &str,
) -> Result<weir_dataplane::model::ObjectRef, String> {
    let value = value.trim();
    let (ns, name) = value.split_once('/').unwrap_or((default_ns, value));
    let dns = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !dns(ns) || !dns(name) {
        return Err("expected a ConfigMap as namespace/name".into());
    }
    Ok(weir_dataplane::model::ObjectRef::new(ns, name))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn valid_headers_are_kept_in_lower_case() {
        let (ok, refused) = read(&data(&[("X-Frame-Options", "DENY")]), Direction::Response, None);
        assert_eq!(ok, BTreeMap::from([("x-frame-options".into(), "DENY".into())]));
        assert!(refused.is_empty());
    }

    #[test]
    fn refusals_say_why() {
        let (ok, refused) = read(
            &data(&[
                ("X-Id", "$request_id"),
                ("Bad Name", "v"),
                ("X-Nl", "a\u{7f}b"),
                ("Content-Length", "3"),
                ("Connection", "close"),
                ("Host", "example.com"),
                ("X-Empty", ""),
            ]),
            Direction::Upstream,
            None,
        );
        assert!(ok.is_empty(), "{ok:?}");
        let why: BTreeMap<_, _> = refused.into_iter().collect();
        assert!(why["X-Id"].contains("nginx variables"));
        assert!(why["Bad Name"].contains("header name"));
        assert!(why["X-Nl"].contains("header value"));
        assert!(why["Content-Length"].contains("framing"));
        assert!(why["Connection"].contains("framing"));
        assert!(why["Host"].contains("upstream-vhost"));
        assert!(why["X-Empty"].contains("empty"));
        // Host is fine on responses (it means nothing there, but nothing breaks).
        let (ok, _) = read(&data(&[("Host", "x")]), Direction::Response, None);
        assert_eq!(ok.len(), 1);
    }

    #[test]
    fn allowed_list_limits_response_headers_only() {
        let allowed = BTreeSet::from(["x-a".to_string()]);
        let pairs = data(&[("X-A", "1"), ("X-B", "2")]);
        let (ok, refused) = read(&pairs, Direction::Response, Some(&allowed));
        assert_eq!(ok.keys().collect::<Vec<_>>(), ["x-a"]);
        assert_eq!(refused[0].0, "X-B");
        assert!(refused[0].1.contains("global-allowed-response-headers"));
        let (ok, _) = read(&pairs, Direction::Upstream, Some(&allowed));
        assert_eq!(ok.len(), 2);
    }

    #[test]
    fn configmap_refs() {
        assert_eq!(configmap_ref("hdrs", "shop").unwrap().to_string(), "shop/hdrs");
        assert_eq!(configmap_ref("ops/hdrs", "shop").unwrap().to_string(), "ops/hdrs");
        assert!(configmap_ref("a/b/c", "shop").is_err());
        assert!(configmap_ref("/x", "shop").is_err());
        assert!(configmap_ref("Bad", "shop").is_err());
    }
}
