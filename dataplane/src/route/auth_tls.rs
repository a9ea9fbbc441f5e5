//! TLS towards an `https://` external authentication service (`auth-url`): the client config
//! built once per table from the route's [`UpstreamTls`] (the system's roots by default), and
//! the identity its connections are pooled under.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use crate::model::{ExternalAuth, UpstreamProtocol, UpstreamTls};
use crate::tls::UpstreamTlsConfig;

/// The TLS side of an authentication service, ready for the request path.
#[derive(Debug)]
pub struct AuthTls {
    /// The client config, and the name to verify in place of the URL's host (`proxy-ssl-name`).
    pub config: Arc<UpstreamTlsConfig>,
    /// Identifies the verification settings: connections made under one profile are never
    /// reused under another (one checked against a lax CA must not serve a strict route).
    pub profile: u64,
}

/// The TLS of `spec`'s service when its URL may be `https://` (any URL not written `http://`,
/// such as `$scheme://…`): `Ok(None)` for plain `http://`. An unusable CA is an error: the
/// route's requests then fail closed (500), never unverified.
pub fn compile(spec: &ExternalAuth) -> Result<Option<Arc<AuthTls>>, String> {
    let plain = spec.url.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("http://"));
    if plain {
        return Ok(None);
    }
    match &spec.tls {
        None => system_default(),
        Some(tls) => build(tls).map(|t| Some(Arc::new(t))),
    }
}

/// Verification against the system's roots, the URL's host as the name: built once.
fn system_default() -> Result<Option<Arc<AuthTls>>, String> {
    static DEFAULT: OnceLock<Result<Arc<AuthTls>, String>> = OnceLock::new();
    DEFAULT.get_or_init(|| build(&UpstreamTls::default()).map(Arc::new)).clone().map(Some)
}

fn build(tls: &UpstreamTls) -> Result<AuthTls, String> {
    // nginx's auth location sets `proxy_ssl_server_name on`: SNI always goes.
    let tls = UpstreamTls { no_sni: false, ..tls.clone() };
    let config = crate::tls::upstream_config(&tls, UpstreamProtocol::Https)
        .map_err(|e| format!("TLS towards the authentication service: {e}"))?;
    let mut hasher = std::hash::DefaultHasher::new();
    tls.hash(&mut hasher);
    Ok(AuthTls { config: Arc::new(config), profile: hasher.finish() })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn auth(url: &str, tls: Option<UpstreamTls>) -> ExternalAuth {
        ExternalAuth { url: url.into(), method: "GET".into(), tls, ..ExternalAuth::default() }
    }

    #[test]
    fn plain_urls_need_no_tls_and_others_do() {
        assert!(compile(&auth("http://auth.svc/check", None)).unwrap().is_none());
        assert!(compile(&auth("HTTP://auth.svc/check", None)).unwrap().is_none());
        let default = compile(&auth("https://$host/oauth2/auth", None)).unwrap().unwrap();
        let scheme = compile(&auth("$scheme://auth.svc/check", None)).unwrap().unwrap();
        assert_eq!(default.profile, scheme.profile, "one profile for the system roots");
        let skip = UpstreamTls { insecure_skip_verify: true, ..UpstreamTls::default() };
        let lax = compile(&auth("https://auth.svc/", Some(skip))).unwrap().unwrap();
        assert_ne!(lax.profile, default.profile, "verification off never shares connections");
    }

    #[test]
    fn an_unusable_ca_is_an_error() {
        let bad = UpstreamTls { ca_pem: Some("not a certificate".into()), ..UpstreamTls::default() };
        assert!(compile(&auth("https://auth.svc/", Some(bad))).is_err());
    }
}
