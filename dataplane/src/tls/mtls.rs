//! Client certificate authentication (mTLS) per host, ingress-nginx `auth-tls-*` style.
//!
//! The SNI of the ClientHello selects the host's policy and with it a server config that asks
//! for a client certificate (never mandatory at the TLS level: a missing or, for
//! `optional_no_ca`, unverifiable certificate is judged per request so the client gets an HTTP
//! answer, as with nginx). After the handshake the presented chain is verified once more, by
//! the same verifier, to produce what goes upstream: `ssl-client-verify` (`SUCCESS`, `NONE` or
//! `FAILED:reason`), `ssl-client-subject-dn`, `ssl-client-issuer-dn` and, when asked,
//! `ssl-client-cert` (URL-encoded PEM).
//!
//! Gateway API client certificate validation (`FrontendTLSValidation`) is the same machinery
//! per HTTPS listener: a policy carries its listener ([`ClientAuth::listener`]), and a name that
//! belongs to a listener's TLS entry (the entry the certificate resolver chooses for it, see
//! [`super::listeners`]) takes that listener's policy or, when the listener validates nothing,
//! none. `AllowValidOnly` ([`ClientVerify::Handshake`]) makes the certificate mandatory in the
//! handshake itself: without a valid one the handshake fails. `AllowInsecureFallback` is
//! `optional_no_ca`: any certificate or none, the verification result passed upstream.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::model::{ClientAuth, ClientVerify, HostMatch, RouteTable};
use crate::tls;
use crate::tls::listeners::ListenerIndex;

/// A host's compiled policy.
pub struct HostAuth {
    /// The host entry it was compiled from (identifies the policy).
    pub host: HostMatch,
    /// What happens without a valid certificate.
    pub verify: ClientVerify,
    depth: u8,
    pass_certificate: bool,
    /// `auth-tls-match-cn`: the subject DN must match.
    pub match_cn: Option<regex::Regex>,
    /// `auth-tls-error-page`: the redirect target for certificate failures.
    pub error_page: Option<HeaderValue>,
    /// The CA was unusable: every request is refused.
    broken: bool,
    /// Verifies chains against the host's CA.
    verifier: Arc<dyn ClientCertVerifier>,
    /// The server config of handshakes for this host.
    pub config: Arc<ServerConfig>,
}

/// What a connection established about its client certificate, for the requests on it.
#[derive(Clone, Debug)]
pub struct ClientCert {
    /// The policy host the connection was made for.
    pub host: HostMatch,
    /// The verification result: `SUCCESS`, `NONE` or `FAILED:reason`.
    pub verify: HeaderValue,
    /// Whether the result is `SUCCESS`.
    pub ok: bool,
    /// Whether a certificate was sent at all.
    pub presented: bool,
    /// Subject DN of the client certificate.
    pub subject: Option<HeaderValue>,
    /// Issuer DN of the client certificate.
    pub issuer: Option<HeaderValue>,
    /// URL-encoded PEM of the client certificate, when the policy passes it on.
    pub pem: Option<HeaderValue>,
}

/// Client auth policies of a table, by SNI / host.
#[derive(Default)]
pub struct ClientAuthIndex {
    exact: HashMap<String, Arc<HostAuth>>,
    wildcard: HashMap<String, Arc<HostAuth>>,
    /// Gateway listeners' policies, by listener (`namespace/gateway/listener`).
    by_listener: HashMap<String, Arc<HostAuth>>,
    /// Which listener a name belongs to (empty when the table has no Gateway listener).
    listeners: ListenerIndex,
}

impl ClientAuthIndex {
    /// Compiles the table's policies; a policy whose CA is unusable is logged and its host
    /// answers 400 to every request (never served without the required check).
    pub fn compile(table: &RouteTable, resolver: &Arc<dyn ResolvesServerCert>) -> ClientAuthIndex {
        let mut index = ClientAuthIndex { listeners: ListenerIndex::compile(table), ..Default::default() };
        let versions = tls::versions(&table.settings);
        let provider = tls::server_provider(&table.settings);
        for auth in &table.client_auth {
            // The host's own `ssl-ciphers`/`ssl-prefer-server-ciphers`, if it has some.
            let options = tls::hosts::find(table, &auth.host);
            let provider = match options.and_then(|o| o.ciphers.as_ref()) {
                Some(_) => tls::server_provider(&tls::hosts::settings_for(&table.settings, options)),
                None => provider.clone(),
            };
            let compiled = match compile(auth, resolver, &versions, &provider, options, &table.settings) {
                Ok(c) => Arc::new(c),
                Err(error) => {
                    tracing::warn!(host = %auth.host, %error, "client certificate CA unusable; the host refuses every request");
                    Arc::new(HostAuth {
                        host: auth.host.clone(),
                        verify: ClientVerify::On,
                        depth: 0,
                        pass_certificate: false,
                        match_cn: None,
                        error_page: None,
                        broken: true,
                        verifier: Arc::new(Permissive(tls::provider())),
                        config: match tls::server_config_for(resolver.clone(), &table.settings) {
                            Ok(c) => Arc::new(c),
                            Err(_) => continue,
                        },
                    })
                }
            };
            if let Some(listener) = &auth.listener {
                index.by_listener.entry(listener.clone()).or_insert(compiled);
                continue;
            }
            match &auth.host {
                HostMatch::Exact(h) => index.exact.entry(h.clone()).or_insert(compiled),
                HostMatch::Wildcard(s) => index.wildcard.entry(s.clone()).or_insert(compiled),
                HostMatch::Any | HostMatch::Suffix(_) => continue,
            };
        }
        index
    }

    /// Whether no host asks for client certificates.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.by_listener.is_empty()
    }

    /// The policy for a host name (lower case, no port; `""` for a ClientHello without SNI). A
    /// name that belongs to a Gateway listener takes the listener's policy, or none.
    pub fn lookup(&self, host: &str) -> Option<&Arc<HostAuth>> {
        if let Some(listener) = self.listeners.listener_of(host) {
            return self.by_listener.get(listener);
        }
        self.exact.get(host).or_else(|| {
            let (_, suffix) = host.split_once('.')?;
            self.wildcard.get(suffix)
        })
    }
}

fn compile(
    auth: &ClientAuth,
    resolver: &Arc<dyn ResolvesServerCert>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    provider: &Arc<rustls::crypto::CryptoProvider>,
    options: Option<&crate::model::HostTls>,
    settings: &crate::model::Settings,
) -> Result<HostAuth, tls::Error> {
    let roots = Arc::new(ca_roots(&auth.ca_pem)?);
    let built =
        |e: rustls::server::VerifierBuilderError| tls::Error::Config(rustls::Error::General(e.to_string()));
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), tls::provider())
        .allow_unauthenticated()
        .build()
        .map_err(built)?;
    let handshake: Arc<dyn ClientCertVerifier> = match auth.verify {
        ClientVerify::OptionalNoCa => Arc::new(Permissive(tls::provider())),
        ClientVerify::On | ClientVerify::Optional => verifier.clone(),
        // Mandatory: no certificate, or one that does not verify, fails the handshake.
        ClientVerify::Handshake => {
            WebPkiClientVerifier::builder_with_provider(roots, tls::provider()).build().map_err(built)?
        }
    };
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(tls::Error::Config)?
        .with_client_cert_verifier(handshake)
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = tls::ALPN.iter().map(|p| p.to_vec()).collect();
    tls::hosts::prefer(&mut config, options);
    // `ssl-buffer-size` as on every other host. The session cache stays the config's own
    // (rustls's default, 256 sessions) and tickets off: a session made on another config,
    // perhaps without a client certificate, must never resume here.
    tls::options::apply(&mut config, &settings.tls_keys);
    let match_cn = match &auth.match_cn {
        Some(re) => Some(
            regex::Regex::new(re)
                .map_err(|e| tls::Error::Config(rustls::Error::General(format!("auth-tls-match-cn: {e}"))))?,
        ),
        None => None,
    };
    let error_page = match &auth.error_page {
        Some(url) => Some(HeaderValue::from_str(url).map_err(|_| {
            tls::Error::Config(rustls::Error::General("auth-tls-error-page: not a header value".into()))
        })?),
        None => None,
    };
    Ok(HostAuth {
        host: auth.host.clone(),
        verify: auth.verify,
        depth: auth.depth,
        pass_certificate: auth.pass_certificate,
        match_cn,
        error_page,
        broken: false,
        verifier,
        config: Arc::new(config),
    })
}

/// The trust anchors of a PEM CA bundle (`ca.crt`): every certificate in it that parses; an
/// error when none does. Pure; the controller uses it to check a Gateway's
/// `caCertificateRefs`.
pub fn ca_roots(pem: &str) -> Result<rustls::RootCertStore, tls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(tls::Error::ClientCaPem)?;
    if roots.add_parsable_certificates(certs).0 == 0 {
        return Err(tls::Error::NoClientCa);
    }
    Ok(roots)
}

impl HostAuth {
    /// Judges the chain a client presented (leaf first) on a connection made for this policy.
    pub fn judge(&self, chain: Option<&[CertificateDer<'_>]>) -> ClientCert {
        let mut out = ClientCert {
            host: self.host.clone(),
            verify: HeaderValue::from_static("NONE"),
            ok: false,
            presented: false,
            subject: None,
            issuer: None,
            pem: None,
        };
        if self.broken {
            out.verify = HeaderValue::from_static("FAILED:no usable client CA configured");
            return out;
        }
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else { return out };
        out.presented = true;
        // The depth counts the client certificate and the intermediates it sent; a self-issued
        // certificate (a root the client sent along) is the anchor, not part of the path.
        let path = 1 + intermediates.iter().filter(|c| names(c.as_ref()).is_none_or(|(s, i)| s != i)).count();
        let result = if path > usize::from(self.depth.max(1)) {
            Err(format!("chain longer than verify depth {}", self.depth))
        } else {
            self.verifier
                .verify_client_cert(leaf, intermediates, UnixTime::now())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        match result {
            Ok(()) => {
                out.ok = true;
                out.verify = HeaderValue::from_static("SUCCESS");
            }
            Err(reason) => {
                let value = format!(
                    "FAILED:{}",
                    reason.replace(|c: char| !c.is_ascii() || c.is_ascii_control(), " ")
                );
                out.verify = HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("FAILED"));
            }
        }
        let (subject, issuer) = names(leaf.as_ref()).unwrap_or_default();
        out.subject = HeaderValue::from_str(&subject).ok().filter(|_| !subject.is_empty());
        out.issuer = HeaderValue::from_str(&issuer).ok().filter(|_| !issuer.is_empty());
        if self.pass_certificate {
            out.pem = HeaderValue::from_str(&crate::http_util::percent_encode(&pem(leaf.as_ref()))).ok();
        }
        out
    }
}

/// Requests a client certificate but accepts any (signatures still checked): `optional_no_ca`.
#[derive(Debug)]
struct Permissive(Arc<rustls::crypto::CryptoProvider>);

impl ClientCertVerifier for Permissive {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

// === certificate text ===

/// PEM of a DER certificate.
fn pem(der: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len() * 4 / 3 + 4);
    for chunk in der.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Subject and issuer DNs of a DER certificate, RFC 4514 style (`CN=a,O=b`, most specific first).
fn names(der: &[u8]) -> Option<(String, String)> {
    let (_, cert, _) = der_item(der)?; // Certificate SEQUENCE
    let (_, tbs, _) = der_item(cert)?; // TBSCertificate SEQUENCE
    let mut rest = tbs;
    let (tag, _, after) = der_item(rest)?;
    if tag == 0xa0 {
        rest = after; // [0] version
    }
    let (_, _, after) = der_item(rest)?; // serial
    let (_, _, after) = der_item(after)?; // signature algorithm
    let (_, issuer, after) = der_item(after)?;
    let (_, _, after) = der_item(after)?; // validity
    let (_, subject, _) = der_item(after)?;
    Some((dn(subject)?, dn(issuer)?))
}

fn dn(mut name: &[u8]) -> Option<String> {
    let mut rdns = Vec::new();
    while !name.is_empty() {
        let (_, set, after) = der_item(name)?;
        name = after;
        let mut set = set;
        let mut parts = Vec::new();
        while !set.is_empty() {
            let (_, atv, after) = der_item(set)?;
            set = after;
            let (_, oid, value) = der_item(atv)?;
            let (_, value, _) = der_item(value)?;
            let key = match oid {
                [0x55, 0x04, 0x03] => "CN".to_string(),
                [0x55, 0x04, 0x06] => "C".to_string(),
                [0x55, 0x04, 0x07] => "L".to_string(),
                [0x55, 0x04, 0x08] => "ST".to_string(),
                [0x55, 0x04, 0x0a] => "O".to_string(),
                [0x55, 0x04, 0x0b] => "OU".to_string(),
                [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01] => "emailAddress".to_string(),
                other => other.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            };
            let value = String::from_utf8_lossy(value);
            let escaped: String = value
                .chars()
                .flat_map(|c| match c {
                    ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=' => vec!['\\', c],
                    c if c.is_control() => vec!['?'],
                    c => vec![c],
                })
                .collect();
            parts.push(format!("{key}={escaped}"));
        }
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// One DER TLV: (tag, contents, rest).
fn der_item(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| acc << 8 | usize::from(*b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_pem_and_url_encoding() {
        let mut params = rcgen::CertificateParams::new(vec!["x.test".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "client one");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "Acme, Inc");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (subject, issuer) = names(cert.der()).unwrap();
        assert_eq!(subject, "O=Acme\\, Inc,CN=client one");
        assert_eq!(issuer, subject, "self-signed");
        assert_eq!(pem(cert.der()), cert.pem().replace("\r\n", "\n"));
        assert_eq!(crate::http_util::percent_encode("a b\n+/="), "a%20b%0A%2B%2F%3D");
    }

    /// A host asking for client certificates keeps the listener's `ssl-buffer-size` and its own
    /// session cache, with tickets off.
    #[test]
    fn client_auth_configs_take_the_record_size_and_no_shared_sessions() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let key = rcgen::KeyPair::generate().unwrap();
        let ca =
            rcgen::CertificateParams::new(vec!["ca.test".to_string()]).unwrap().self_signed(&key).unwrap();
        let mut table = RouteTable::default();
        table.settings.tls_keys.record_size = Some(4096);
        table.client_auth.push(ClientAuth {
            host: HostMatch::Exact("x.test".into()),
            listener: None,
            ca_pem: ca.pem(),
            verify: ClientVerify::On,
            depth: 1,
            pass_certificate: false,
            match_cn: None,
            error_page: None,
        });
        let resolver: Arc<dyn ResolvesServerCert> =
            Arc::new(rustls::server::ResolvesServerCertUsingSni::new());
        let index = ClientAuthIndex::compile(&table, &resolver);
        let auth = index.lookup("x.test").unwrap();
        assert!(!auth.broken);
        assert_eq!(auth.config.max_fragment_size, Some(4096 + 5));
        assert!(!auth.config.ticketer.enabled());
    }

    /// Gateway API `FrontendTLSValidation` is per listener: a name takes the policy of the
    /// listener its TLS entry belongs to (the certificate resolver's longest match), or none
    /// when that listener validates nothing, whatever an Ingress's wildcard policy covers; a
    /// ClientHello without SNI takes the policy of a listener without hostname.
    #[test]
    fn listener_policies_follow_the_listener_a_name_belongs_to() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let key = rcgen::KeyPair::generate().unwrap();
        let ca =
            rcgen::CertificateParams::new(vec!["ca.test".to_string()]).unwrap().self_signed(&key).unwrap();
        let listener = |host: HostMatch, name: &str| crate::model::TlsEntry {
            hosts: vec![host],
            certificate: None,
            listener: Some(name.to_string()),
            alternatives: Vec::new(),
        };
        let policy = |host: HostMatch, listener: Option<&str>, verify: ClientVerify| ClientAuth {
            host,
            listener: listener.map(str::to_string),
            ca_pem: ca.pem(),
            verify,
            depth: 1,
            pass_certificate: false,
            match_cn: None,
            error_page: None,
        };
        let mut table = RouteTable {
            tls: vec![
                listener(HostMatch::Exact("a.example.com".into()), "gw/a"),
                listener(HostMatch::Suffix("example.com".into()), "gw/wild"),
                listener(HostMatch::Any, "gw/any"),
            ],
            client_auth: vec![
                policy(HostMatch::Wildcard("example.com".into()), None, ClientVerify::On),
                policy(HostMatch::Suffix("example.com".into()), Some("gw/wild"), ClientVerify::Handshake),
                policy(HostMatch::Any, Some("gw/any"), ClientVerify::OptionalNoCa),
            ],
            ..RouteTable::default()
        };
        let resolver: Arc<dyn ResolvesServerCert> =
            Arc::new(rustls::server::ResolvesServerCertUsingSni::new());
        let index = ClientAuthIndex::compile(&table, &resolver);
        let verify = |name: &str| index.lookup(name).map(|a| a.verify);
        assert_eq!(verify("a.example.com"), None, "its listener validates nothing");
        assert_eq!(verify("b.example.com"), Some(ClientVerify::Handshake));
        assert_eq!(verify("c.b.example.com"), Some(ClientVerify::Handshake));
        assert_eq!(verify("other.test"), Some(ClientVerify::OptionalNoCa));
        assert_eq!(verify(""), Some(ClientVerify::OptionalNoCa), "no SNI: the listener without hostname");
        // Without listeners the Ingress's wildcard policy covers one label, as before.
        table.tls.clear();
        table.client_auth.truncate(1);
        let index = ClientAuthIndex::compile(&table, &resolver);
        assert_eq!(index.lookup("a.example.com").map(|a| a.verify), Some(ClientVerify::On));
        assert!(index.lookup("").is_none());
    }
}
