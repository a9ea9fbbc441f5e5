//! Canary selection for a route (ingress-nginx `canary-by-header`, `-by-cookie`, `-weight`): by
//! header, then by cookie, then by weight.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::model::Canary;
use crate::state::balance::BackendIdx;

/// A [`Canary`] that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InvalidCanary {
    /// The header name is not a header name.
    #[error("canary header {0:?} is not a valid header name")]
    Header(String),
    /// The pattern does not compile.
    #[error("canary header pattern {0:?} is not a valid regex")]
    Pattern(String),
}

/// How the header decides.
#[derive(Debug)]
enum HeaderRule {
    /// `always` / `never`.
    AlwaysNever,
    /// This exact value selects the canary.
    Value(HeaderValue),
    /// A value matching this selects the canary.
    Pattern(regex::Regex),
}

/// A [`Canary`] ready for the request path.
#[derive(Debug)]
pub struct CompiledCanary {
    /// The canary's backend.
    pub backend: BackendIdx,
    header: Option<(HeaderName, HeaderRule)>,
    cookie: Option<String>,
    weight: u32,
    weight_total: u32,
}

impl CompiledCanary {
    /// Compiles `canary`, whose backend is `backend`.
    pub fn compile(canary: &Canary, backend: BackendIdx) -> Result<CompiledCanary, InvalidCanary> {
        let header = match &canary.header {
            Some(name) => {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| InvalidCanary::Header(name.clone()))?;
                let rule = match (&canary.header_value, &canary.header_pattern) {
                    (Some(v), _) => HeaderRule::Value(
                        HeaderValue::from_str(v).map_err(|_| InvalidCanary::Header(v.clone()))?,
                    ),
                    (None, Some(p)) => HeaderRule::Pattern(
                        regex::Regex::new(&format!("^(?:{p})$"))
                            .map_err(|_| InvalidCanary::Pattern(p.clone()))?,
                    ),
                    (None, None) => HeaderRule::AlwaysNever,
                };
                Some((name, rule))
            }
            None => None,
        };
        Ok(CompiledCanary {
            backend,
            header,
            cookie: canary.cookie.clone(),
            weight: canary.weight,
            weight_total: canary.weight_total.max(1),
        })
    }

    /// Whether this request goes to the canary; `roll` is a uniform random number (the weight
    /// is compared with `roll % weight_total`).
    pub fn selects(&self, headers: &HeaderMap, roll: u32) -> bool {
        if let Some((name, rule)) = &self.header
            && let Some(value) = headers.get(name)
        {
            let decided = match rule {
                HeaderRule::Value(want) => (value == want).then_some(true),
                HeaderRule::Pattern(re) => value.to_str().ok().filter(|v| re.is_match(v)).map(|_| true),
                HeaderRule::AlwaysNever => always_never(value.as_bytes()),
            };
            if let Some(decided) = decided {
                return decided;
            }
        }
        if let Some(cookie) = &self.cookie
            && let Some(value) = crate::http_util::cookie(headers, cookie)
            && let Some(decided) = always_never(value.as_bytes())
        {
            return decided;
        }
        self.weight > 0 && roll % self.weight_total < self.weight
    }
}

fn always_never(value: &[u8]) -> Option<bool> {
    match value {
        b"always" => Some(true),
        b"never" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::BackendId;

    fn canary(f: impl FnOnce(&mut Canary)) -> CompiledCanary {
        let mut c = Canary {
            backend: "ns/canary:80".parse::<BackendId>().unwrap(),
            weight: 0,
            weight_total: 100,
            header: None,
            header_value: None,
            header_pattern: None,
            cookie: None,
        };
        f(&mut c);
        CompiledCanary::compile(&c, BackendIdx(1)).unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn header_then_cookie_then_weight() {
        let c = canary(|c| {
            c.header = Some("X-Canary".into());
            c.cookie = Some("canary".into());
            c.weight = 50;
        });
        assert!(c.selects(&headers(&[("x-canary", "always")]), 99));
        assert!(!c.selects(&headers(&[("x-canary", "never"), ("cookie", "canary=always")]), 0));
        // Another header value defers to the cookie, then the weight.
        assert!(c.selects(&headers(&[("x-canary", "maybe"), ("cookie", "a=b; canary=always")]), 99));
        assert!(!c.selects(&headers(&[("cookie", "canary=never")]), 0));
        assert!(c.selects(&headers(&[]), 49));
        assert!(!c.selects(&headers(&[]), 50));
    }

    #[test]
    fn header_value_and_pattern() {
        let c = canary(|c| {
            c.header = Some("x-region".into());
            c.header_value = Some("eu".into());
        });
        assert!(c.selects(&headers(&[("x-region", "eu")]), 0));
        assert!(!c.selects(&headers(&[("x-region", "always")]), 0), "only the value selects");
        let c = canary(|c| {
            c.header = Some("x-user".into());
            c.header_pattern = Some("beta-.*".into());
        });
        assert!(c.selects(&headers(&[("x-user", "beta-42")]), 0));
        assert!(!c.selects(&headers(&[("x-user", "xbeta-42")]), 0), "anchored");
    }

    #[test]
    fn weights() {
        let c = canary(|c| {
            c.weight = 3;
            c.weight_total = 10;
        });
        assert_eq!((0..1000).filter(|r| c.selects(&HeaderMap::new(), *r)).count(), 300);
        let never = canary(|_| {});
        assert!(!(0..100).any(|r| never.selects(&HeaderMap::new(), r)));
    }
}
