//! The mirrors of a route (ingress-nginx `mirror-target`, `mirror-host`, `mirror-request-body`;
//! Gateway API `RequestMirror`, one or more per rule), compiled with the table; the proxy starts
//! the copies (`proxy/mirror.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use http::header::HeaderValue;
use http::uri::Authority;

use crate::model::{Mirror, UpstreamProtocol, UpstreamTls};
use crate::vars::{Dialect, Template};

/// A mirror that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InvalidMirror {
    /// The target is not an absolute `http://` or `https://` URL, no TLS client config could
    /// be built for an `https://` one, or h2c was asked of an `https://` one.
    #[error("mirror: {0}")]
    Target(String),
    /// The `mirror-host` value cannot be sent as a header.
    #[error("mirror host {0:?} cannot be sent as an HTTP header value")]
    Host(String),
}

/// A [`Mirror`] ready for the request path.
pub struct CompiledMirror {
    /// The target URL as written, a template of the request's variables.
    pub(crate) target: String,
    /// The target, parsed.
    pub(crate) template: Template,
    /// `Host` of the copies, else the target's authority.
    pub(crate) host: Option<HeaderValue>,
    /// The copies carry the request's body.
    pub(crate) request_body: bool,
    /// For `https://` targets: verification against the system's roots, HTTP/1.1.
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    /// Parts per million of the requests copied; `None`: all.
    pub(crate) share_ppm: Option<u32>,
    /// The copies go over h2c (HTTP/2 prior knowledge), not HTTP/1.1.
    pub(crate) h2c: bool,
    /// The authorities the copies take turns with the target's ([`Mirror::spread`]), and the
    /// turn.
    spread: Vec<Authority>,
    turn: AtomicUsize,
}

impl std::fmt::Debug for CompiledMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledMirror")
            .field("target", &self.target)
            .field("host", &self.host)
            .field("request_body", &self.request_body)
            .field("tls", &self.tls.is_some())
            .field("share_ppm", &self.share_ppm)
            .field("h2c", &self.h2c)
            .field("spread", &self.spread)
            .finish()
    }
}

impl CompiledMirror {
    /// Checks the target's scheme and the host header and parses the target (translation
    /// checked its variables); `https://` targets get the shared TLS client config.
    pub(crate) fn compile(mirror: &Mirror) -> Result<Self, InvalidMirror> {
        let scheme = mirror.target.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        let tls = match scheme.as_deref() {
            Some("http") => None,
            Some("https") => Some(https_config()?),
            _ => {
                return Err(InvalidMirror::Target(format!(
                    "target {:?} is not an absolute http:// or https:// URL",
                    mirror.target
                )));
            }
        };
        if mirror.h2c && tls.is_some() {
            return Err(InvalidMirror::Target(format!(
                "target {:?}: h2c (HTTP/2 prior knowledge) is spoken to http:// targets only",
                mirror.target
            )));
        }
        let host = match &mirror.host {
            Some(h) => Some(HeaderValue::from_str(h).map_err(|_| InvalidMirror::Host(h.clone()))?),
            None => None,
        };
        let spread = mirror
            .spread
            .iter()
            .map(|a| {
                a.parse::<Authority>()
                    .map_err(|_| InvalidMirror::Target(format!("spread: {a:?} is not a host:port authority")))
            })
            .collect::<Result<_, _>>()?;
        Ok(CompiledMirror {
            target: mirror.target.clone(),
            template: Template::parse_lenient(&mirror.target, Dialect::Url),
            host,
            request_body: mirror.request_body,
            tls,
            share_ppm: mirror.share_ppm,
            h2c: mirror.h2c,
            spread,
            turn: AtomicUsize::new(0),
        })
    }

    /// The authority this copy goes to in place of the target's: `None` for the target's own
    /// (its turn, or no spread), else the next of the spread, round robin.
    pub(crate) fn next_authority(&self) -> Option<&Authority> {
        if self.spread.is_empty() {
            return None;
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) % (self.spread.len() + 1);
        turn.checked_sub(1).and_then(|i| self.spread.get(i))
    }

    /// Whether this request is copied: always without a share, else drawn at random.
    pub(crate) fn chosen(&self) -> bool {
        self.share_ppm.is_none_or(|share| rand::random_range(0..1_000_000u32) < share)
    }
}

/// The client config of every `https://` mirror target, built once.
fn https_config() -> Result<Arc<rustls::ClientConfig>, InvalidMirror> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::tls::upstream_config(&UpstreamTls::default(), UpstreamProtocol::Https)
                .map(|c| c.config)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(InvalidMirror::Target)
}
