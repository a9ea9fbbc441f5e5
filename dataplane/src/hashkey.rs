//! The request key of `upstream-hash-by`: literal text and a few nginx variables, parsed once
//! and evaluated per request without allocating more than the key itself.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName};

use crate::http_util::stable_hash;

/// One piece of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    RemoteAddr,
    RequestUri,
    Uri,
    Host,
    Header(HeaderName),
    Cookie(String),
    Arg(String),
}

/// A parsed `upstream-hash-by` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashKey(Vec<Part>);

/// What a key is computed from.
pub struct Request<'a> {
    /// The client's address.
    pub client: IpAddr,
    /// The host asked for.
    pub host: &'a str,
    /// Path and query as sent.
    pub request_uri: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
}

/// A piece of an nginx-style template: literal text, or the name of a `$name` / `${name}`
/// variable.
pub(crate) enum Piece<'a> {
    Literal(&'a str),
    Var(&'a str),
}

/// Splits `template` into literal text and variables; an empty name (a lone `$`) is an error.
pub(crate) fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let Some(at) = rest.find('$') else {
            pieces.push(Piece::Literal(rest));
            break;
        };
        if at > 0 {
            pieces.push(Piece::Literal(&rest[..at]));
        }
        rest = &rest[at + 1..];
        let (name, tail) = match rest.strip_prefix('{') {
            Some(braced) => braced.split_once('}').ok_or("unclosed ${")?,
            None => {
                let len = rest.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
                rest.split_at(len)
            }
        };
        if name.is_empty() {
            return Err("a lone $ (write a variable name after it)".into());
        }
        pieces.push(Piece::Var(name));
        rest = tail;
    }
    Ok(pieces)
}

/// A variable naming part of the request: `$http_NAME`, `$cookie_NAME`, `$arg_NAME`.
pub(crate) enum RequestVariable {
    Header(HeaderName),
    Cookie(String),
    Arg(String),
}

/// The request variable `name` stands for; `None` when it is none of them.
pub(crate) fn request_variable(name: &str) -> Result<Option<RequestVariable>, String> {
    Ok(Some(if let Some(h) = name.strip_prefix("http_").filter(|h| !h.is_empty()) {
        let h = h.replace('_', "-").to_ascii_lowercase();
        RequestVariable::Header(
            HeaderName::from_bytes(h.as_bytes()).map_err(|_| format!("bad header in ${name}"))?,
        )
    } else if let Some(c) = name.strip_prefix("cookie_").filter(|c| !c.is_empty()) {
        RequestVariable::Cookie(c.to_string())
    } else if let Some(a) = name.strip_prefix("arg_").filter(|a| !a.is_empty()) {
        RequestVariable::Arg(a.to_string())
    } else {
        return Ok(None);
    }))
}

impl HashKey {
    /// Parses `template`: text with `$remote_addr` (or `$binary_remote_addr`), `$request_uri`,
    /// `$uri`, `$host`, `$http_NAME`, `$cookie_NAME`, `$arg_NAME`; `${name}` delimits a name.
    pub fn parse(template: &str) -> Result<HashKey, String> {
        let mut parts = Vec::new();
        for piece in pieces(template)? {
            parts.push(match piece {
                Piece::Literal(text) => Part::Literal(text.to_string()),
                Piece::Var("remote_addr" | "binary_remote_addr") => Part::RemoteAddr,
                Piece::Var("request_uri") => Part::RequestUri,
                Piece::Var("uri") => Part::Uri,
                Piece::Var("host") => Part::Host,
                Piece::Var(name) => match request_variable(name)? {
                    Some(RequestVariable::Header(h)) => Part::Header(h),
                    Some(RequestVariable::Cookie(c)) => Part::Cookie(c),
                    Some(RequestVariable::Arg(a)) => Part::Arg(a),
                    None => {
                        return Err(format!(
                            "unsupported variable ${name} (use $remote_addr, $request_uri, $uri, $host, $http_NAME, $cookie_NAME or $arg_NAME)"
                        ));
                    }
                },
            });
        }
        if parts.iter().all(|p| matches!(p, Part::Literal(_))) {
            return Err("the key has no variable: every request would go to one endpoint".into());
        }
        Ok(HashKey(parts))
    }

    /// The key's hash for `req`.
    pub fn hash(&self, req: &Request<'_>) -> u64 {
        let mut key = Vec::with_capacity(64);
        for part in &self.0 {
            match part {
                Part::Literal(s) => key.extend_from_slice(s.as_bytes()),
                Part::RemoteAddr => {
                    key.extend_from_slice(crate::model::canonical_ip(req.client).to_string().as_bytes())
                }
                Part::RequestUri => key.extend_from_slice(req.request_uri.as_bytes()),
                Part::Uri => {
                    key.extend_from_slice(req.request_uri.split('?').next().unwrap_or_default().as_bytes())
                }
                Part::Host => key.extend_from_slice(req.host.as_bytes()),
                Part::Header(h) => {
                    if let Some(v) = req.headers.get(h) {
                        key.extend_from_slice(v.as_bytes());
                    }
                }
                Part::Cookie(name) => {
                    if let Some(v) = cookie(req.headers, name) {
                        key.extend_from_slice(v.as_bytes());
                    }
                }
                Part::Arg(name) => {
                    let query = req.request_uri.split_once('?').map_or("", |(_, q)| q);
                    if let Some(v) =
                        query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| k == name)
                    {
                        key.extend_from_slice(v.1.as_bytes());
                    }
                }
            }
        }
        stable_hash(&key)
    }
}

pub use crate::http_util::cookie;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn parse_and_hash() {
        let k = HashKey::parse("$request_uri").unwrap();
        let headers = HeaderMap::new();
        let req = |uri: &'static str| Request {
            client: "192.0.2.1".parse().unwrap(),
            host: "a",
            request_uri: uri,
            headers: &headers,
        };
        assert_eq!(k.hash(&req("/a?x=1")), k.hash(&req("/a?x=1")));
        assert_ne!(k.hash(&req("/a?x=1")), k.hash(&req("/b")));
        let mut h = HeaderMap::new();
        h.insert("x-user", HeaderValue::from_static("alice"));
        h.insert("cookie", HeaderValue::from_static("a=1; sid=xyz"));
        let k = HashKey::parse("${http_x_user}-$cookie_sid").unwrap();
        let r = Request { client: "192.0.2.1".parse().unwrap(), host: "a", request_uri: "/", headers: &h };
        assert_eq!(k.hash(&r), stable_hash(b"alice-xyz"));
        assert!(HashKey::parse("static").is_err());
        assert!(HashKey::parse("$request_time").is_err());
        assert!(HashKey::parse("${host").is_err());
    }
}
