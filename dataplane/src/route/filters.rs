//! Gateway API filters ([`RouteFilters`]), compiled once per table and applied by the proxy:
//! header edits on the upstream request and on the response (`HTTPHeaderFilter`: set, then
//! add, then remove), the redirect (`HTTPRequestRedirectFilter`), the path rewrite
//! (`HTTPPathModifier`) and the fixed status of rules that cannot be served.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::model::filters::{HeaderEdits, PathRewrite, RequestRedirect, RouteFilters};

/// Why filters do not compile.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// A header name or value that cannot be sent.
    #[error("header {name:?}: {value:?} cannot be sent")]
    Header {
        /// The name.
        name: String,
        /// The value.
        value: String,
    },
    /// A redirect or fixed status that is not one.
    #[error("status {0} is not allowed here")]
    Status(u16),
}

/// [`HeaderEdits`], compiled.
#[derive(Clone, Debug, Default)]
pub struct CompiledEdits {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl CompiledEdits {
    /// Compiles the edits; a name or value that cannot be sent is an error.
    pub fn compile(e: &HeaderEdits) -> Result<CompiledEdits, FilterError> {
        let pair = |(n, v): &(String, String)| {
            let bad = || FilterError::Header { name: n.clone(), value: v.clone() };
            Ok((
                HeaderName::from_bytes(n.as_bytes()).map_err(|_| bad())?,
                HeaderValue::from_str(v).map_err(|_| bad())?,
            ))
        };
        Ok(CompiledEdits {
            set: e.set.iter().map(pair).collect::<Result<_, _>>()?,
            add: e.add.iter().map(pair).collect::<Result<_, _>>()?,
            remove: e
                .remove
                .iter()
                .map(|n| {
                    HeaderName::from_bytes(n.as_bytes())
                        .map_err(|_| FilterError::Header { name: n.clone(), value: String::new() })
                })
                .collect::<Result<_, _>>()?,
        })
    }

    /// Applies the edits: set, add, remove.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (n, v) in &self.set {
            headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            headers.append(n.clone(), v.clone());
        }
        for n in &self.remove {
            headers.remove(n);
        }
    }
}

/// [`RouteFilters`], compiled.
#[derive(Clone, Debug)]
pub struct CompiledFilters {
    /// Edits of the request sent upstream.
    pub request_headers: Option<CompiledEdits>,
    /// Edits of the response.
    pub response_headers: Option<CompiledEdits>,
    redirect: Option<(RequestRedirect, StatusCode)>,
    rewrite: Option<PathRewrite>,
    /// The status every request gets instead.
    pub respond: Option<StatusCode>,
}

impl CompiledFilters {
    /// Compiles filters.
    pub fn compile(f: &RouteFilters) -> Result<CompiledFilters, FilterError> {
        let redirect = match &f.redirect {
            Some(r) => {
                let code = StatusCode::from_u16(r.code)
                    .ok()
                    .filter(StatusCode::is_redirection)
                    .ok_or(FilterError::Status(r.code))?;
                Some((r.clone(), code))
            }
            None => None,
        };
        Ok(CompiledFilters {
            request_headers: f.request_headers.as_ref().map(CompiledEdits::compile).transpose()?,
            response_headers: f.response_headers.as_ref().map(CompiledEdits::compile).transpose()?,
            redirect,
            rewrite: f.rewrite_path.clone(),
            respond: match f.respond {
                Some(s) => Some(StatusCode::from_u16(s).map_err(|_| FilterError::Status(s))?),
                None => None,
            },
        })
    }

    /// The redirect's status and `Location` for a request over `https` (or not) for `host`
    /// (as sent, port included or not), `path` (normalized) and `query`; `None` without a
    /// redirect filter or when the result cannot be a header.
    pub fn redirect(
        &self,
        https: bool,
        host: &str,
        path: &str,
        query: Option<&str>,
    ) -> Option<(StatusCode, HeaderValue)> {
        let (r, code) = self.redirect.as_ref()?;
        let scheme = r.scheme.as_deref().unwrap_or(if https { "https" } else { "http" });
        let host = r.hostname.as_deref().unwrap_or_else(|| strip_port(host));
        // `HTTPRequestRedirectFilter.port`: without one, the scheme's well-known port when the
        // scheme is set, else the listener's port; 80 for http and 443 for https are left out.
        let port = r.port.unwrap_or(match (&r.scheme, https) {
            (Some(s), _) if s == "https" => 443,
            (Some(_), _) => 80,
            (None, true) => r.listener_ports.1,
            (None, false) => r.listener_ports.0,
        });
        let default_port = matches!((scheme, port), ("http", 80) | ("https", 443));
        let path = match &r.path {
            Some(p) => rewrite(p, path),
            None => path.to_string(),
        };
        let mut location = format!("{scheme}://{host}");
        if !default_port {
            location.push_str(&format!(":{port}"));
        }
        location.push_str(&path);
        if let Some(q) = query {
            location.push('?');
            location.push_str(q);
        }
        Some((*code, HeaderValue::from_str(&location).ok()?))
    }

    /// The path and query sent upstream under `URLRewrite.path`; `None` without one.
    pub fn rewrite(&self, path: &str, query: Option<&str>) -> Option<String> {
        let rewritten = rewrite(self.rewrite.as_ref()?, path);
        Some(match query {
            Some(q) => format!("{rewritten}?{q}"),
            None => rewritten,
        })
    }
}

/// `host` without its `:port` (an IPv6 literal keeps its brackets).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(i) => &host[..=i],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// `HTTPPathModifier` on `path`: "`ReplacePrefixMatch` ... `/foo` with `/xyz` turns `/foo/bar`
/// into `/xyz/bar`; with `/` into `/bar`", and `/foo` into `/xyz` or `/`.
fn rewrite(p: &PathRewrite, path: &str) -> String {
    match p {
        PathRewrite::Full(full) => full.clone(),
        PathRewrite::Prefix { matched, replacement } => {
            let matched = matched.trim_end_matches('/');
            let rest = path.strip_prefix(matched).unwrap_or(path);
            let out = if rest.is_empty() || rest.starts_with('/') {
                format!(
                    "{}{rest}",
                    if rest.is_empty() { replacement.as_str() } else { replacement.trim_end_matches('/') }
                )
            } else {
                format!("{}/{rest}", replacement.trim_end_matches('/'))
            };
            if out.is_empty() { "/".to_string() } else { out }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn prefix(matched: &str, replacement: &str) -> PathRewrite {
        PathRewrite::Prefix { matched: matched.into(), replacement: replacement.into() }
    }

    /// `HTTPPathModifier.replacePrefixMatch`: `/foo` → `/xyz`: `/foo` → `/xyz`, `/foo/` →
    /// `/xyz/`, `/foo/bar` → `/xyz/bar`; `/foo` → `/`: `/foo` → `/`, `/foo/bar` → `/bar`.
    #[test]
    fn replace_prefix_match_as_the_spec_table_says() {
        assert_eq!(rewrite(&prefix("/foo", "/xyz"), "/foo"), "/xyz");
        assert_eq!(rewrite(&prefix("/foo", "/xyz"), "/foo/"), "/xyz/");
        assert_eq!(rewrite(&prefix("/foo", "/xyz"), "/foo/bar"), "/xyz/bar");
        assert_eq!(rewrite(&prefix("/foo/", "/xyz/"), "/foo/bar"), "/xyz/bar");
        assert_eq!(rewrite(&prefix("/foo", "/"), "/foo"), "/");
        assert_eq!(rewrite(&prefix("/foo", "/"), "/foo/bar"), "/bar");
        assert_eq!(rewrite(&prefix("/", "/app"), "/x"), "/app/x");
        assert_eq!(rewrite(&PathRewrite::Full("/new".into()), "/foo/bar"), "/new");
    }

    fn redirect(scheme: Option<&str>, hostname: Option<&str>, port: Option<u16>) -> CompiledFilters {
        CompiledFilters::compile(&RouteFilters {
            redirect: Some(RequestRedirect {
                scheme: scheme.map(Into::into),
                hostname: hostname.map(Into::into),
                port,
                path: None,
                code: 302,
                listener_ports: (80, 443),
            }),
            ..RouteFilters::default()
        })
        .unwrap()
    }

    /// `HTTPRequestRedirectFilter.port`: "If no port is specified, the redirect port MUST be
    /// derived ... the well-known port associated with the redirect scheme ... [else] the
    /// Gateway Listener port"; port 80 with http and 443 with https are left out.
    #[test]
    fn redirect_port_rules() {
        let loc = |f: &CompiledFilters, https| f.redirect(https, "a.test:8080", "/p", Some("q=1")).unwrap().1;
        assert_eq!(loc(&redirect(Some("https"), None, None), false), "https://a.test/p?q=1");
        assert_eq!(loc(&redirect(None, Some("b.test"), None), false), "http://b.test/p?q=1");
        assert_eq!(loc(&redirect(None, None, Some(8443)), true), "https://a.test:8443/p?q=1");
        assert_eq!(loc(&redirect(Some("http"), None, Some(443)), true), "http://a.test:443/p?q=1");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
    }

    #[test]
    fn header_edits_set_add_remove() {
        let e = CompiledEdits::compile(&HeaderEdits {
            set: vec![("x-set".into(), "new".into())],
            add: vec![("x-add".into(), "two".into())],
            remove: vec!["x-gone".into()],
        })
        .unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-set", HeaderValue::from_static("old"));
        h.insert("x-add", HeaderValue::from_static("one"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        e.apply(&mut h);
        assert_eq!(h["x-set"], "new");
        assert_eq!(h.get_all("x-add").iter().collect::<Vec<_>>(), ["one", "two"]);
        assert!(!h.contains_key("x-gone"));
        assert!(
            CompiledEdits::compile(&HeaderEdits {
                set: vec![("bad name".into(), "v".into())],
                ..Default::default()
            })
            .is_err()
        );
    }
}
