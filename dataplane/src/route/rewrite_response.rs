//! Upstream response headers rewritten for the client, as nginx does for ingress-nginx:
//! `proxy-redirect-from`/`-to` (`proxy_redirect`: the `Location` and `Refresh` URLs that start
//! with a text get another instead), `proxy-cookie-domain` and `proxy-cookie-path`
//! (`proxy_cookie_domain`, `proxy_cookie_path`: the `Domain` and `Path` attributes of
//! `Set-Cookie`).
//!
//! Matching follows nginx: `Location`/`Refresh` and cookie paths by case-sensitive prefix; cookie
//! domains whole and case-insensitive, a leading dot ignored on both sides.

use http::header::{HeaderMap, HeaderName, HeaderValue, LOCATION, REFRESH, SET_COOKIE};

use crate::model::{Replace, RoutePolicy};

/// A route's response header rewrites.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseRewrite {
    redirect: Option<Replace>,
    cookie_domain: Option<Replace>,
    cookie_path: Option<Replace>,
}

impl ResponseRewrite {
    /// The rewrites `policy` asks for; `None` when it asks for none.
    pub fn new(policy: &RoutePolicy) -> Option<ResponseRewrite> {
        let rewrite = ResponseRewrite {
            redirect: policy.redirect_rewrite.as_deref().cloned(),
            cookie_domain: policy.cookie_domain.as_deref().cloned(),
            cookie_path: policy.cookie_path.as_deref().cloned(),
        };
        let none =
            rewrite.redirect.is_none() && rewrite.cookie_domain.is_none() && rewrite.cookie_path.is_none();
        (!none).then_some(rewrite)
    }

    /// Rewrites the headers of an upstream response.
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(rule) = &self.redirect {
            rewrite_each(headers, LOCATION, |v| replace_prefix(v, rule));
            rewrite_each(headers, REFRESH, |v| {
                // `Refresh: 5; url=http://…`: the URL after `url=`.
                let at = v.to_ascii_lowercase().find("url=")? + 4;
                let url = replace_prefix(&v[at..], rule)?;
                Some(format!("{}{url}", &v[..at]))
            });
        }
        if self.cookie_domain.is_some() || self.cookie_path.is_some() {
            rewrite_each(headers, SET_COOKIE, |v| self.cookie(v));
        }
    }

    /// One `Set-Cookie` value with its `Domain` and `Path` rewritten; `None` when unchanged.
    fn cookie(&self, value: &str) -> Option<String> {
        let mut changed = false;
        let mut out = String::with_capacity(value.len() + 16);
        for (i, part) in value.split(';').enumerate() {
            if i > 0 {
                out.push(';');
            }
            let new = (i > 0).then(|| attribute(part)).flatten().and_then(|(name, v)| {
                let replaced = if name.eq_ignore_ascii_case("domain") {
                    self.cookie_domain.as_ref().and_then(|rule| replace_domain(v, rule))
                } else if name.eq_ignore_ascii_case("path") {
                    self.cookie_path.as_ref().and_then(|rule| replace_prefix(v, rule))
                } else {
                    None
                };
                replaced.map(|r| (part.len() - part.trim_start().len(), name, r))
            });
            match new {
                Some((lead, name, replaced)) => {
                    changed = true;
                    out.push_str(&part[..lead]);
                    out.push_str(name);
                    out.push('=');
                    out.push_str(&replaced);
                }
                None => out.push_str(part),
            }
        }
        changed.then_some(out)
    }
}

/// A cookie attribute's name and value (`" Domain=example.com"` → `("Domain", "example.com")`).
fn attribute(part: &str) -> Option<(&str, &str)> {
    let (name, value) = part.trim_start().split_once('=')?;
    Some((name.trim_end(), value.trim()))
}

/// `value` with `rule.from` at its start replaced by `rule.to`; `None` when it does not start so.
fn replace_prefix(value: &str, rule: &Replace) -> Option<String> {
    value.strip_prefix(rule.from.as_str()).map(|rest| format!("{}{rest}", rule.to))
}

/// `rule.to` when `value` is the domain `rule.from` (case-insensitive, leading dots ignored).
fn replace_domain(value: &str, rule: &Replace) -> Option<String> {
    let bare = |d: &str| d.strip_prefix('.').unwrap_or(d).to_string();
    bare(value).eq_ignore_ascii_case(&bare(&rule.from)).then(|| rule.to.clone())
}

/// Rewrites every value of `name` that `rewrite` changes (and that is valid to send), keeping
/// their order.
fn rewrite_each(headers: &mut HeaderMap, name: HeaderName, rewrite: impl Fn(&str) -> Option<String>) {
    let changes: Vec<Option<HeaderValue>> = headers
        .get_all(&name)
        .iter()
        .map(|v| v.to_str().ok().and_then(&rewrite).and_then(|new| HeaderValue::from_str(&new).ok()))
        .collect();
    if changes.iter().all(Option::is_none) {
        return;
    }
    let old: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
    headers.remove(&name);
    for (old, new) in old.into_iter().zip(changes) {
        headers.append(name.clone(), new.unwrap_or(old));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn replace(from: &str, to: &str) -> Option<Box<Replace>> {
        Some(Box::new(Replace { from: from.into(), to: to.into() }))
    }

    fn rewrite() -> ResponseRewrite {
        ResponseRewrite::new(&RoutePolicy {
            redirect_rewrite: replace("http://internal:8080/", "https://app.example.com/"),
            cookie_domain: replace("localhost", "example.org"),
            cookie_path: replace("/two/", "/"),
            ..RoutePolicy::default()
        })
        .unwrap()
    }

    #[test]
    fn location_and_refresh_by_prefix() {
        let mut h = HeaderMap::new();
        h.insert(LOCATION, HeaderValue::from_static("http://internal:8080/x?y=1"));
        h.insert(REFRESH, HeaderValue::from_static("5; URL=http://internal:8080/later"));
        rewrite().apply(&mut h);
        assert_eq!(h[LOCATION], "https://app.example.com/x?y=1");
        assert_eq!(h[REFRESH], "5; URL=https://app.example.com/later");
        let mut other = HeaderMap::new();
        other.insert(LOCATION, HeaderValue::from_static("HTTP://internal:8080/x"));
        rewrite().apply(&mut other);
        assert_eq!(other[LOCATION], "HTTP://internal:8080/x", "case-sensitive, as nginx");
    }

    #[test]
    fn cookies_domain_and_path() {
        let mut h = HeaderMap::new();
        h.append(
            SET_COOKIE,
            HeaderValue::from_static("a=1; Domain=.LocalHost; Path=/two/some/uri/; HttpOnly"),
        );
        h.append(SET_COOKIE, HeaderValue::from_static("b=2; domain=other.org; path=/one"));
        h.append(SET_COOKIE, HeaderValue::from_static("c=Domain=localhost"));
        rewrite().apply(&mut h);
        let all: Vec<_> = h.get_all(SET_COOKIE).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(
            all,
            [
                "a=1; Domain=example.org; Path=/some/uri/; HttpOnly",
                "b=2; domain=other.org; path=/one",
                "c=Domain=localhost"
            ]
        );
    }

    #[test]
    fn nothing_asked_is_none() {
        assert!(ResponseRewrite::new(&RoutePolicy::default()).is_none());
    }
}
