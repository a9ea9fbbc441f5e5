//! CORS for a route, as ingress-nginx does it: when the request's `Origin` is allowed, an
//! `OPTIONS` request is a preflight the proxy answers itself (`204` with the CORS headers), and
//! any other request is proxied with the CORS headers added to the response.

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, HeaderMap,
    HeaderValue, VARY,
};

use crate::model::Cors;

/// A CORS origin that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid CORS setting {0:?}")]
pub struct InvalidCors(pub String);

/// One allowed origin.
#[derive(Debug)]
enum Origin {
    Any,
    /// `scheme://host[:port]`, lower case.
    Exact(String),
    /// `scheme://*.suffix[:port]`: `prefix` is `scheme://`, `suffix` is `.suffix[:port]`.
    Wildcard {
        prefix: String,
        suffix: String,
    },
}

/// [`Cors`] ready for the request path.
#[derive(Debug)]
pub struct CompiledCors {
    origins: Vec<Origin>,
    methods: HeaderValue,
    headers: HeaderValue,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: HeaderValue,
}

impl CompiledCors {
    /// Compiles `cors`.
    pub fn compile(cors: &Cors) -> Result<CompiledCors, InvalidCors> {
        let value = |s: &str| HeaderValue::from_str(s).map_err(|_| InvalidCors(s.to_string()));
        let mut origins = Vec::new();
        for o in &cors.allow_origins {
            let o = o.trim().to_ascii_lowercase();
            origins.push(if o == "*" {
                Origin::Any
            } else if let Some((scheme, rest)) = o.split_once("://*") {
                if !rest.starts_with('.') {
                    return Err(InvalidCors(o));
                }
                Origin::Wildcard { prefix: format!("{scheme}://"), suffix: rest.to_string() }
            } else {
                Origin::Exact(o)
            });
        }
        Ok(CompiledCors {
            origins,
            methods: value(&cors.allow_methods)?,
            headers: value(&cors.allow_headers)?,
            expose: (!cors.expose_headers.is_empty()).then(|| value(&cors.expose_headers)).transpose()?,
            credentials: cors.allow_credentials,
            max_age: HeaderValue::from(cors.max_age),
        })
    }

    /// The `Access-Control-Allow-Origin` value for a request's `Origin`, or `None` when the
    /// origin is not allowed (or absent while only listed origins are).
    pub fn allow_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.origins.iter().any(|o| matches!(o, Origin::Any)) {
            return Some(HeaderValue::from_static("*"));
        }
        let origin = origin?;
        let text = origin.to_str().ok()?.to_ascii_lowercase();
        let allowed = self.origins.iter().any(|o| match o {
            Origin::Any => true,
            Origin::Exact(e) => *e == text,
            Origin::Wildcard { prefix, suffix } => text
                .strip_prefix(prefix.as_str())
                .and_then(|rest| rest.strip_suffix(suffix.as_str()))
                .is_some_and(|label| !label.is_empty() && !label.contains(['/', ':'])),
        });
        allowed.then(|| origin.clone())
    }

    /// Adds the CORS headers for an allowed origin; `preflight` adds `Access-Control-Max-Age`.
    pub fn add_headers(&self, headers: &mut HeaderMap, allow_origin: HeaderValue, preflight: bool) {
        let specific = allow_origin != "*";
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
        if specific {
            headers.append(VARY, HeaderValue::from_static("Origin"));
        }
        if self.credentials {
            headers.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        }
        headers.insert(ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, self.headers.clone());
        if let Some(expose) = &self.expose {
            headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
        }
        if preflight {
            headers.insert(ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cors(origins: &[&str]) -> CompiledCors {
        CompiledCors::compile(&Cors {
            allow_origins: origins.iter().map(|s| s.to_string()).collect(),
            allow_methods: "GET, POST".into(),
            allow_headers: "Content-Type".into(),
            expose_headers: String::new(),
            allow_credentials: true,
            max_age: 60,
        })
        .unwrap()
    }

    fn origin(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    #[test]
    fn origins_match() {
        let c = cors(&["https://app.example.com", "https://*.shop.example"]);
        assert_eq!(
            c.allow_origin(Some(&origin("https://app.example.com"))),
            Some(origin("https://app.example.com"))
        );
        assert!(c.allow_origin(Some(&origin("HTTPS://App.Example.com"))).is_some());
        assert!(c.allow_origin(Some(&origin("http://app.example.com"))).is_none());
        assert!(c.allow_origin(Some(&origin("https://a.shop.example"))).is_some());
        assert!(c.allow_origin(Some(&origin("https://a.b.shop.example"))).is_some());
        assert!(c.allow_origin(Some(&origin("https://shop.example"))).is_none());
        assert!(c.allow_origin(Some(&origin("https://evil.example/x.shop.example"))).is_none());
        assert!(c.allow_origin(None).is_none());
        assert_eq!(cors(&["*"]).allow_origin(None), Some(origin("*")));
    }

    #[test]
    fn headers_added() {
        let c = cors(&["https://app.example.com"]);
        let mut h = HeaderMap::new();
        c.add_headers(&mut h, origin("https://app.example.com"), true);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
        assert_eq!(h[ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(h[ACCESS_CONTROL_MAX_AGE], "60");
        assert_eq!(h[VARY], "Origin");
        assert!(!h.contains_key(ACCESS_CONTROL_EXPOSE_HEADERS));
    }
}
