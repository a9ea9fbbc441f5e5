//! Request conditions besides host and path ([`RequestConditions`]: method, headers, query
//! parameters), compiled once per table and checked by the router for the routes that have
//! them (Gateway API `HTTPRouteMatch`).
//!
//! - method: equal, byte for byte (`GET`);
//! - headers: the name case-insensitive; a header sent several times is matched as its values
//!   joined with `, ` (RFC 9110 5.3); `Exact` equal, `RegularExpression` matching the whole value;
//! - query parameters: the name case-sensitive, the first occurrence only ("only the first
//!   entry with that name MUST be considered"), the value percent-decoded (`+` is a space);
//!   `Exact` equal, `RegularExpression` matching the whole value;
//! - path: the whole normalized path the router matched on (GRPCRoute method matches).
//!
//! A condition on a header or parameter the request lacks does not hold.

use http::{HeaderMap, HeaderName, Method};

use crate::model::{RequestConditions, StringMatch, ValueMatch};

/// What a request offers to conditions.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// Its query (after `?`, without it), if any.
    pub query: Option<&'a str>,
    /// Whether it came over TLS (the HTTPS socket).
    pub tls: bool,
    /// Its normalized path (as the router sees it).
    pub path: &'a str,
}

/// Why conditions do not compile.
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    /// A method is not one.
    #[error("invalid method {0:?}")]
    Method(String),
    /// A header name is not one.
    #[error("invalid header name {0:?}")]
    HeaderName(String),
    /// A regular expression does not compile.
    #[error("invalid regular expression {pattern:?}: {source}")]
    Regex {
        /// As written.
        pattern: String,
        /// Why.
        #[source]
        source: Box<regex::Error>,
    },
}

/// [`RequestConditions`], compiled.
#[derive(Clone, Debug)]
pub struct CompiledConditions {
    method: Option<Method>,
    headers: Vec<(HeaderName, Matcher)>,
    query: Vec<(String, Matcher)>,
    tls: Option<bool>,
    path: Option<Matcher>,
}

#[derive(Clone, Debug)]
enum Matcher {
    Exact(String),
    Regex(regex::Regex),
}

impl Matcher {
    fn compile(m: &StringMatch) -> Result<Matcher, ConditionError> {
        Ok(match m {
            StringMatch::Exact(s) => Matcher::Exact(s.clone()),
            StringMatch::Regex(pattern) => Matcher::Regex(
                regex::Regex::new(&format!("^(?:{pattern})$"))
                    .map_err(|e| ConditionError::Regex { pattern: pattern.clone(), source: Box::new(e) })?,
            ),
        })
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Matcher::Exact(s) => s == value,
            Matcher::Regex(re) => re.is_match(value),
        }
    }
}

impl CompiledConditions {
    /// Compiles conditions; a bad header name or regular expression is an error.
    pub fn compile(c: &RequestConditions) -> Result<CompiledConditions, ConditionError> {
        let method = match &c.method {
            Some(m) => Some(Method::from_bytes(m.as_bytes()).map_err(|_| ConditionError::Method(m.clone()))?),
            None => None,
        };
        let headers = c
            .headers
            .iter()
            .map(|ValueMatch { name, value }| {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ConditionError::HeaderName(name.clone()))?;
                Ok((name, Matcher::compile(value)?))
            })
            .collect::<Result<_, ConditionError>>()?;
        let query = c
            .query
            .iter()
            .map(|ValueMatch { name, value }| Ok((name.clone(), Matcher::compile(value)?)))
            .collect::<Result<_, ConditionError>>()?;
        let path = c.path.as_ref().map(Matcher::compile).transpose()?;
        Ok(CompiledConditions { method, headers, query, tls: c.tls, path })
    }

    /// Whether the request meets every condition.
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        if self.tls.is_some_and(|tls| tls != req.tls) {
            return false;
        }
        if self.method.as_ref().is_some_and(|m| m != req.method) {
            return false;
        }
        if self.path.as_ref().is_some_and(|p| !p.matches(req.path)) {
            return false;
        }
        for (name, matcher) in &self.headers {
            let mut values = req.headers.get_all(name).iter();
            let Some(first) = values.next() else { return false };
            let Ok(first) = first.to_str() else { return false };
            let ok = match values.next() {
                None => matcher.matches(first),
                Some(second) => {
                    let mut joined = String::from(first);
                    for v in std::iter::once(second).chain(values) {
                        let Ok(v) = v.to_str() else { return false };
                        joined.push_str(", ");
                        joined.push_str(v);
                    }
                    matcher.matches(&joined)
                }
            };
            if !ok {
                return false;
            }
        }
        for (name, matcher) in &self.query {
            match req.query.and_then(|q| first_param(q, name)) {
                Some(value) if matcher.matches(&value) => {}
                _ => return false,
            }
        }
        true
    }
}

/// The first value of parameter `name` in `query`, percent-decoded (`+` a space); `None` when
/// absent or not UTF-8 once decoded.
fn first_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k)? == name).then(|| decode(v)).flatten()
    })
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn conditions(
        method: Option<&str>,
        headers: &[(&str, StringMatch)],
        query: &[(&str, StringMatch)],
    ) -> CompiledConditions {
        let vm = |(n, v): &(&str, StringMatch)| ValueMatch { name: n.to_string(), value: v.clone() };
        CompiledConditions::compile(&RequestConditions {
            method: method.map(str::to_string),
            headers: headers.iter().map(vm).collect(),
            query: query.iter().map(vm).collect(),
            tls: None,
            path: None,
        })
        .unwrap()
    }

    fn request(
        method: &str,
        headers: &[(&str, &str)],
        query: Option<&'static str>,
    ) -> (Method, HeaderMap, Option<&'static str>) {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        (Method::from_bytes(method.as_bytes()).unwrap(), map, query)
    }

    fn check(c: &CompiledConditions, r: &(Method, HeaderMap, Option<&str>)) -> bool {
        c.matches(&RequestView { method: &r.0, headers: &r.1, query: r.2, tls: false, path: "/" })
    }

    fn exact(s: &str) -> StringMatch {
        StringMatch::Exact(s.into())
    }

    #[test]
    fn method_must_be_equal() {
        let c = conditions(Some("POST"), &[], &[]);
        assert!(check(&c, &request("POST", &[], None)));
        assert!(!check(&c, &request("GET", &[], None)));
        assert!(!check(&c, &request("post", &[], None)), "methods are case-sensitive");
    }

    /// `HTTPHeaderMatch.name`: "Name matching MUST be case-insensitive"; values exact.
    #[test]
    fn headers_names_case_insensitive_values_exact_or_whole_regex() {
        let c = conditions(
            None,
            &[("X-Env", exact("canary")), ("x-version", StringMatch::Regex("v[0-9]+".into()))],
            &[],
        );
        assert!(check(&c, &request("GET", &[("x-env", "canary"), ("X-VERSION", "v2")], None)));
        assert!(
            !check(&c, &request("GET", &[("x-env", "Canary"), ("x-version", "v2")], None)),
            "values are exact"
        );
        assert!(
            !check(&c, &request("GET", &[("x-env", "canary"), ("x-version", "v2-beta")], None)),
            "whole value"
        );
        assert!(!check(&c, &request("GET", &[("x-env", "canary")], None)), "every condition must hold");
        // A header sent twice is its values joined.
        let joined = conditions(None, &[("x-a", exact("1, 2"))], &[]);
        assert!(check(&joined, &request("GET", &[("x-a", "1"), ("x-a", "2")], None)));
    }

    /// `HTTPQueryParamMatch.name`: case-sensitive; "only the first entry with that name MUST be
    /// considered".
    #[test]
    fn query_params_first_occurrence_decoded() {
        let c = conditions(None, &[], &[("animal", exact("whale")), ("q", exact("a b/c"))]);
        assert!(check(&c, &request("GET", &[], Some("animal=whale&q=a+b%2Fc"))));
        assert!(
            !check(&c, &request("GET", &[], Some("animal=dolphin&animal=whale&q=a+b%2Fc"))),
            "first only"
        );
        assert!(!check(&c, &request("GET", &[], Some("Animal=whale&q=a+b%2Fc"))), "names are case-sensitive");
        assert!(!check(&c, &request("GET", &[], None)));
        let re = conditions(None, &[], &[("id", StringMatch::Regex("[0-9]+".into()))]);
        assert!(check(&re, &request("GET", &[], Some("id=42"))));
        assert!(!check(&re, &request("GET", &[], Some("id=42x"))));
        assert!(!check(&re, &request("GET", &[], Some("id"))));
    }

    /// Gateway API listener isolation: a route of an HTTPS listener answers only requests that
    /// came over TLS, one of an HTTP listener only plain-HTTP ones.
    #[test]
    fn tls_condition_checks_the_socket() {
        let (m, h) = (Method::GET, HeaderMap::new());
        let plain = RequestView { method: &m, headers: &h, query: None, tls: false, path: "/" };
        let tls = RequestView { tls: true, ..plain };
        for (wanted, over_plain, over_tls) in
            [(Some(true), false, true), (Some(false), true, false), (None, true, true)]
        {
            let c = CompiledConditions::compile(&RequestConditions {
                tls: wanted,
                ..RequestConditions::default()
            })
            .unwrap();
            assert_eq!((c.matches(&plain), c.matches(&tls)), (over_plain, over_tls), "{wanted:?}");
        }
    }

    #[test]
    fn bad_patterns_are_errors() {
        let bad = RequestConditions {
            method: None,
            headers: vec![],
            query: vec![ValueMatch { name: "a".into(), value: StringMatch::Regex("(".into()) }],
            tls: None,
            path: None,
        };
        assert!(matches!(CompiledConditions::compile(&bad), Err(ConditionError::Regex { .. })));
        let bad = RequestConditions {
            method: None,
            headers: vec![ValueMatch { name: "bad name".into(), value: exact("x") }],
            query: vec![],
            tls: None,
            path: None,
        };
        assert!(matches!(CompiledConditions::compile(&bad), Err(ConditionError::HeaderName(_))));
        assert_eq!(decode("%41%zz%4"), Some("A%zz%4".into()));
    }

    /// A path condition matches the whole path (`GRPCMethodMatch`: `/service/method`).
    #[test]
    fn path_condition_matches_the_whole_path() {
        let c = CompiledConditions::compile(&RequestConditions {
            path: Some(StringMatch::Regex("/[^/]+/Echo".into())),
            ..RequestConditions::default()
        })
        .unwrap();
        let (method, headers) = (Method::POST, HeaderMap::new());
        let at = |path| {
            c.matches(&RequestView { method: &method, headers: &headers, query: None, tls: false, path })
        };
        assert!(at("/t.Test/Echo"));
        assert!(at("/other.Svc/Echo"));
        assert!(!at("/t.Test/EchoMore"), "whole path");
        assert!(!at("/t.Test/Fail"));
    }
}
