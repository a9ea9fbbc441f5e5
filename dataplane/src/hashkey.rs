//! The request key of `upstream-hash-by`: literal text and a few nginx variables (the
//! [`Dialect::HashKey`] of [`crate::vars`]), parsed once and evaluated per request without
//! allocating more than the key itself.

use crate::http_util::stable_hash;
use crate::vars::{Dialect, Part, RequestView, Template, Var};

/// A parsed `upstream-hash-by` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashKey(Template);

impl HashKey {
    /// Parses `template`: text with `$remote_addr` (or `$binary_remote_addr`), `$request_uri`,
    /// `$uri`, `$host`, `$http_NAME`, `$cookie_NAME`, `$arg_NAME`; `${name}` delimits a name.
    pub fn parse(template: &str) -> Result<HashKey, String> {
        let template =
            Template::parse(template, Dialect::HashKey).map_err(|r| r.message(Dialect::HashKey))?;
        if template.vars().next().is_none() {
            return Err("the key has no variable: every request would go to one endpoint".into());
        }
        Ok(HashKey(template))
    }

    /// The key's hash for `req`.
    pub fn hash(&self, req: &RequestView<'_>) -> u64 {
        let mut key = Vec::with_capacity(64);
        for part in self.0.parts() {
            let var = match part {
                Part::Text(s) => {
                    key.extend_from_slice(s.as_bytes());
                    continue;
                }
                Part::Var(var) => var,
            };
            match var {
                Var::RemoteAddr => {
                    key.extend_from_slice(crate::model::canonical_ip(req.client).to_string().as_bytes())
                }
                Var::RequestUri => key.extend_from_slice(req.request_uri.as_bytes()),
                Var::Uri => key.extend_from_slice(req.path().as_bytes()),
                Var::Host => key.extend_from_slice(req.host.as_bytes()),
                Var::RequestHeader(h) => {
                    if let Some(v) = req.headers.get(h) {
                        key.extend_from_slice(v.as_bytes());
                    }
                }
                Var::Cookie(name) => {
                    if let Some(v) = req.cookie(name) {
                        key.extend_from_slice(v.as_bytes());
                    }
                }
                Var::Arg(name) => {
                    if let Some(v) = req.arg(name) {
                        key.extend_from_slice(v.as_bytes());
                    }
                }
                // Not in the dialect: never parsed into a key.
                _ => {}
            }
        }
        stable_hash(&key)
    }
}

pub use crate::http_util::cookie;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::{HeaderMap, HeaderValue, Method};

    use super::*;

    #[test]
    fn parse_and_hash() {
        let k = HashKey::parse("$request_uri").unwrap();
        let headers = HeaderMap::new();
        let req = |uri: &'static str| RequestView {
            scheme: "http",
            method: &Method::GET,
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
        let r = RequestView {
            scheme: "http",
            method: &Method::GET,
            client: "192.0.2.1".parse().unwrap(),
            host: "a",
            request_uri: "/",
            headers: &h,
        };
        assert_eq!(k.hash(&r), stable_hash(b"alice-xyz"));
        assert!(HashKey::parse("static").is_err());
        assert!(HashKey::parse("$request_time").is_err());
        assert!(HashKey::parse("${host").is_err());
    }
}
