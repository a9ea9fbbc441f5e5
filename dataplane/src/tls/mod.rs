//! TLS termination: certificates from the table, SNI selection, the rustls server config.
//!
//! Certificates are parsed once per publish (and reused across publishes while their PEM is
//! unchanged) into a [`CertIndex`] that lives in the proxy's compiled state, so a new table, or
//! a rotated Secret, takes effect for the next handshake; established connections keep the
//! certificate they negotiated.
//!
//! SNI picks the certificate: an exact name, then a wildcard entry (`*.example.com` covers one
//! label), then an entry for any host, then the default certificate (the table's, else the
//! self-signed one generated at start-up). An entry with several certificates (a Gateway
//! listener's `certificateRefs`, e.g. an ECDSA and an RSA one) serves the first whose key can
//! sign with a scheme the ClientHello offers (`signature_algorithms`), else its first. The
//! `Host` header alone picks the route, as in
//! ingress-nginx: a request whose `Host` the certificate does not cover is still routed by
//! `Host` (clients that reuse one connection for several names rely on it); except on a
//! connection whose SNI chose a Gateway HTTPS listener ([`listeners`]: 421 for another
//! listener's name, 404 for a name of no listener).
//!
//! Beside it: [`mtls`] (client certificates), [`hosts`] (per-host suites and preference),
//! [`ciphers`] (TLS 1.2 suites by OpenSSL name),
//! [`sessions`] (the resumption cache), [`tickets`] (session tickets), [`ocsp`] (stapling) and
//! [`l4`] (the ClientHello read ahead of passthrough), [`listeners`] (misdirected requests on
//! Gateway HTTPS listeners: 421 and 404).

pub mod ciphers;
pub mod hosts;
pub mod l4;
pub mod listeners;
pub mod mtls;
pub mod ocsp;
pub mod options;
pub mod sessions;
pub mod tickets;

use std::collections::HashMap;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::model::{
    Certificate, HostMatch, ObjectRef, RouteTable, Settings, TlsVersion, UpstreamProtocol, UpstreamTls,
};

/// ALPN protocols offered on the HTTPS listener, preferred first.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a certificate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `tls.crt` holds no PEM `CERTIFICATE` block.
    #[error("tls.crt has no PEM certificate")]
    NoCertificate,
    /// `tls.crt` is not valid PEM.
    #[error("tls.crt is not valid PEM: {0}")]
    CertificatePem(rustls_pki_types::pem::Error),
    /// `tls.key` holds no PEM private key (PKCS#1, PKCS#8 or SEC1).
    #[error("tls.key has no PEM private key (PKCS#1, PKCS#8 or SEC1)")]
    NoKey,
    /// `tls.key` is not valid PEM.
    #[error("tls.key is not valid PEM: {0}")]
    KeyPem(rustls_pki_types::pem::Error),
    /// The key is of an unsupported type or malformed.
    #[error("tls.key is not a usable RSA, ECDSA (P-256/P-384) or Ed25519 key: {0}")]
    Key(rustls::Error),
    /// The certificate's public key is not the private key's.
    #[error("tls.key does not match the certificate in tls.crt")]
    KeyMismatch,
    /// The leaf certificate cannot be parsed.
    #[error("the certificate in tls.crt cannot be parsed: {0}")]
    Certificate(rustls::Error),
    /// The rustls configuration could not be built (a bug: the provider lacks the versions).
    #[error("building the TLS configuration failed: {0}")]
    Config(rustls::Error),
    /// The upstream CA bundle has no usable certificate.
    #[error("the upstream CA bundle has no usable PEM certificate")]
    NoUpstreamCa,
    /// A client CA bundle (`ca.crt`) is not valid PEM.
    #[error("ca.crt is not valid PEM: {0}")]
    ClientCaPem(rustls_pki_types::pem::Error),
    /// A client CA bundle (`ca.crt`) has no usable certificate.
    #[error("ca.crt has no usable PEM certificate")]
    NoClientCa,
    /// Generating the self-signed default certificate failed.
    #[error("generating the self-signed default certificate failed: {0}")]
    Generate(rcgen::Error),
}

/// The only crypto provider weir uses (aws-lc-rs); chosen explicitly so that no process-wide default
/// is needed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// TLS 1.2 and 1.3 only; with aws-lc-rs's default suites (AEAD with ECDHE only).
pub const VERSIONS: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

/// The versions offered to clients: those of `ssl-protocols` when set, else [`VERSIONS`].
pub fn versions(settings: &Settings) -> Vec<&'static SupportedProtocolVersion> {
    match settings.tls_versions.as_deref() {
        Some(wanted) if !wanted.is_empty() => {
            let mut out = Vec::with_capacity(2);
            if wanted.contains(&TlsVersion::Tls13) {
                out.push(&rustls::version::TLS13);
            }
            if wanted.contains(&TlsVersion::Tls12) {
                out.push(&rustls::version::TLS12);
            }
            out
        }
        _ => VERSIONS.to_vec(),
    }
}

/// The crypto provider of handshakes with clients: every suite, or, of TLS 1.2, those
/// `ssl-ciphers` chose; the key exchange groups of `ssl-ecdh-curve`.
pub fn server_provider(settings: &Settings) -> Arc<CryptoProvider> {
    let provider = match settings.tls_ciphers.as_deref() {
        Some(chosen) if !chosen.is_empty() => crate::tls::ciphers::provider(chosen),
        _ => provider(),
    };
    options::with_groups(provider, &settings.tls_keys)
}

/// Parses and checks a certificate: a PEM chain (leaf first) and a PEM private key that
/// matches the leaf. Pure; the controller uses it to warn about bad Secrets.
pub fn certified_key(cert: &Certificate) -> Result<CertifiedKey, Error> {
    let chain = CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::CertificatePem)?;
    if chain.is_empty() {
        return Err(Error::NoCertificate);
    }
    let key = match PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()) {
        Ok(key) => key,
        Err(rustls_pki_types::pem::Error::NoItemsFound) => return Err(Error::NoKey),
        Err(e) => return Err(Error::KeyPem(e)),
    };
    let signing = provider().key_provider.load_private_key(key).map_err(Error::Key)?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(Error::KeyMismatch)
        }
        // The key type cannot tell its public key: nothing to compare, accept.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
        Err(e) => Err(Error::Certificate(e)),
    }
}

/// A self-signed certificate for when no default certificate is configured (ECDSA P-256), as
/// ingress-nginx's "fake certificate".
pub fn self_signed() -> Result<CertifiedKey, Error> {
    let generated =
        rcgen::generate_simple_self_signed(vec!["weir.invalid".to_string()]).map_err(Error::Generate)?;
    let cert =
        Certificate { chain_pem: generated.cert.pem(), key_pem: generated.signing_key.serialize_pem() };
    certified_key(&cert)
}

// === impl CertIndex ===

/// The certificates of one TLS entry, preferred first (never empty).
type Keys = Arc<[Arc<CertifiedKey>]>;

/// Compiled SNI → certificate lookup of one table.
#[derive(Default)]
pub struct CertIndex {
    exact: HashMap<String, Keys>,
    /// Keyed by the suffix after `*.`.
    wildcard: HashMap<String, Keys>,
    any: Option<Keys>,
    /// The table's default certificate, when it names a usable one.
    default: Option<Arc<CertifiedKey>>,
    /// `ssl-reject-handshake`: the names a handshake may ask for; `None`: any.
    known: Option<KnownNames>,
    /// Gateway API `*.suffix` names (one or more labels in front), longest suffix first.
    suffix: Vec<(String, Keys)>,
}

/// The host names of a table, for `ssl-reject-handshake`.
#[derive(Default)]
struct KnownNames {
    exact: std::collections::HashSet<String>,
    /// Suffixes after `*.`.
    wildcard: std::collections::HashSet<String>,
    /// Gateway API suffixes (one or more labels in front).
    suffix: Vec<String>,
}

/// Parsed certificates kept between publishes, keyed by object, reused while the PEM is equal.
#[derive(Default)]
pub struct CertCache {
    entries: HashMap<ObjectRef, (Certificate, Arc<CertifiedKey>)>,
}

impl CertCache {
    /// The parsed certificate for `id`, from the cache when its PEM is unchanged.
    fn get(&mut self, id: &ObjectRef, cert: &Certificate) -> Result<Arc<CertifiedKey>, Error> {
        if let Some((pem, key)) = self.entries.get(id)
            && pem == cert
        {
            return Ok(key.clone());
        }
        let key = Arc::new(certified_key(cert)?);
        self.entries.insert(id.clone(), (cert.clone(), key.clone()));
        Ok(key)
    }
}

impl CertIndex {
    /// Compiles the table's TLS entries. A certificate that cannot be used is logged and its
    /// hosts fall back to the default certificate; nothing else is affected.
    pub fn compile(table: &RouteTable, cache: &mut CertCache) -> CertIndex {
        let mut parsed: HashMap<&ObjectRef, Arc<CertifiedKey>> = HashMap::new();
        for (id, cert) in &table.certificates {
            match cache.get(id, cert) {
                Ok(key) => {
                    parsed.insert(id, key);
                }
                Err(error) => {
                    tracing::warn!(certificate = %id, %error, "certificate unusable; its hosts get the default certificate")
                }
            }
        }
        cache.entries.retain(|id, _| parsed.contains_key(id));
        let mut index = CertIndex {
            default: table.default_certificate.as_ref().and_then(|id| parsed.get(id).cloned()),
            known: (table.settings.tls_keys.reject_unknown_sni == Some(true)).then(|| KnownNames::of(table)),
            ..CertIndex::default()
        };
        for entry in &table.tls {
            let Some(first) = &entry.certificate else {
                continue; // the default certificate
            };
            // Those that parsed, in order; none: the default certificate.
            let keys: Vec<Arc<CertifiedKey>> = std::iter::once(first)
                .chain(&entry.alternatives)
                .filter_map(|id| parsed.get(id).cloned())
                .collect();
            if keys.is_empty() {
                continue;
            }
            let key: Keys = keys.into();
            let key = &key;
            for host in &entry.hosts {
                match host {
                    HostMatch::Exact(h) => index.exact.entry(h.clone()).or_insert_with(|| key.clone()),
                    HostMatch::Wildcard(s) => index.wildcard.entry(s.clone()).or_insert_with(|| key.clone()),
                    HostMatch::Any => index.any.get_or_insert_with(|| key.clone()),
                    HostMatch::Suffix(s) => {
                        if !index.suffix.iter().any(|(have, _)| have == s) {
                            index.suffix.push((s.clone(), key.clone()));
                        }
                        continue;
                    }
                };
            }
        }
        // "The GatewayClass MUST use the longest matching SNI out of all available
        // certificates" (`Listener.tls`).
        index.suffix.sort_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        index
    }

    /// Whether a handshake for `sni` is refused (`ssl-reject-handshake`): no host of the table
    /// is named (a rule for any host does not count, nor does a ClientHello without SNI).
    pub fn rejects(&self, sni: Option<&str>) -> bool {
        let Some(known) = &self.known else { return false };
        let Some(name) = sni else { return true };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if known.exact.contains(&name) {
            return false;
        }
        if name.split_once('.').is_some_and(|(_, suffix)| known.wildcard.contains(suffix)) {
            return false;
        }
        !known.suffix.iter().any(|s| HostMatch::Suffix(s.clone()).matches(&name))
    }

    /// Every certificate of the index, each once.
    pub fn keys(&self) -> Vec<Arc<CertifiedKey>> {
        let mut keys: Vec<Arc<CertifiedKey>> = Vec::new();
        let all = self
            .exact
            .values()
            .chain(self.wildcard.values())
            .chain(self.suffix.iter().map(|(_, k)| k))
            .chain(&self.any)
            .flat_map(|k| k.iter())
            .chain(&self.default);
        for key in all {
            if !keys.iter().any(|k| Arc::ptr_eq(k, key)) {
                keys.push(key.clone());
            }
        }
        keys
    }

    /// The certificate for a ClientHello's SNI, if the table has one (else the caller's
    /// fallback applies): of an entry with several, the first.
    pub fn resolve(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        self.resolve_for(sni, None)
    }

    /// [`CertIndex::resolve`] for a ClientHello offering the signature `schemes`: of an entry
    /// with several certificates, the first whose key can sign with one of them (else the
    /// first, and the handshake fails as it would with that one alone).
    pub fn resolve_for(
        &self,
        sni: Option<&str>,
        schemes: Option<&[rustls::SignatureScheme]>,
    ) -> Option<Arc<CertifiedKey>> {
        let keys = self.entry(sni);
        let Some(keys) = keys else { return self.default.clone() };
        let usable = |k: &&Arc<CertifiedKey>| schemes.is_none_or(|s| k.key.choose_scheme(s).is_some());
        keys.iter().find(usable).or_else(|| keys.first()).cloned()
    }

    /// The TLS entry's certificates for an SNI: exact, one-label wildcard, longest suffix, any.
    fn entry(&self, sni: Option<&str>) -> Option<&Keys> {
        if let Some(name) = sni {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if let Some(keys) = self.exact.get(&name) {
                return Some(keys);
            }
            if let Some((_, suffix)) = name.split_once('.')
                && let Some(keys) = self.wildcard.get(suffix)
            {
                return Some(keys);
            }
            if let Some((_, keys)) = self.suffix.iter().find(|(s, _)| suffix_matches(s, &name)) {
                return Some(keys);
            }
        }
        self.any.as_ref()
    }
}

/// Whether `name` ends in `.suffix` with one or more labels in front (Gateway API `*.suffix`).
fn suffix_matches(suffix: &str, name: &str) -> bool {
    name.strip_suffix(suffix)
        .and_then(|head| head.strip_suffix('.'))
        .is_some_and(|head| !head.is_empty() && !head.starts_with('.') && !head.ends_with('.'))
}

impl KnownNames {
    /// The exact and wildcard hosts of the table's routes and TLS entries.
    fn of(table: &RouteTable) -> KnownNames {
        let mut known = KnownNames::default();
        let hosts = table.hosts.iter().map(|h| &h.host);
        for host in hosts.chain(table.tls.iter().flat_map(|t| &t.hosts)) {
            match host {
                HostMatch::Exact(h) => known.exact.insert(h.to_ascii_lowercase()),
                HostMatch::Wildcard(s) => known.wildcard.insert(s.to_ascii_lowercase()),
                HostMatch::Suffix(s) => {
                    known.suffix.push(s.to_ascii_lowercase());
                    true
                }
                HostMatch::Any => false,
            };
        }
        known
    }
}

/// A rustls server config over `resolver`: TLS 1.2/1.3, ALPN h2 and http/1.1, no client auth.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, Error> {
    server_config_with(resolver, VERSIONS)
}

/// [`server_config`] offering only `versions` (`ssl-protocols`).
pub fn server_config_with(
    resolver: Arc<dyn ResolvesServerCert>,
    versions: &[&'static SupportedProtocolVersion],
) -> Result<ServerConfig, Error> {
    server_config_from(provider(), resolver, versions)
}

/// [`server_config`] with the versions (`ssl-protocols`), cipher suites (`ssl-ciphers`), groups
/// (`ssl-ecdh-curve`) and record size (`ssl-buffer-size`) of `settings`.
pub fn server_config_for(
    resolver: Arc<dyn ResolvesServerCert>,
    settings: &Settings,
) -> Result<ServerConfig, Error> {
    let mut config = server_config_from(server_provider(settings), resolver, &versions(settings))?;
    options::apply(&mut config, &settings.tls_keys);
    Ok(config)
}

fn server_config_from(
    provider: Arc<CryptoProvider>,
    resolver: Arc<dyn ResolvesServerCert>,
    versions: &[&'static SupportedProtocolVersion],
) -> Result<ServerConfig, Error> {
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(Error::Config)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

// === upstream TLS ===

/// The client side of TLS towards one backend's upstreams.
#[derive(Debug)]
pub struct UpstreamTlsConfig {
    /// The rustls client config (roots or no verification, ALPN by protocol, SNI on or off).
    pub config: Arc<rustls::ClientConfig>,
    /// The configured name to verify; `None`: the request's host.
    pub server_name: Option<rustls_pki_types::ServerName<'static>>,
}

/// The system's trust roots, loaded once (missing or unreadable ones are logged).
fn system_roots() -> Arc<rustls::RootCertStore> {
    static ROOTS: std::sync::OnceLock<Arc<rustls::RootCertStore>> = std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            for error in &loaded.errors {
                tracing::warn!(%error, "loading a system trust root failed");
            }
            let mut roots = rustls::RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(loaded.certs);
            tracing::debug!(added, ignored, "system trust roots loaded for upstream TLS");
            Arc::new(roots)
        })
        .clone()
}

/// Builds the client config for a TLS backend: verification against `tls.ca_pem` or the system
/// roots (or none when explicitly asked), ALPN `h2` for [`UpstreamProtocol::H2`].
pub fn upstream_config(tls: &UpstreamTls, protocol: UpstreamProtocol) -> Result<UpstreamTlsConfig, Error> {
    let crypto = match tls.ciphers.as_deref() {
        Some(chosen) if !chosen.is_empty() => crate::tls::ciphers::provider(chosen),
        _ => provider(),
    };
    let versions = versions(&Settings { tls_versions: tls.versions.clone(), ..Settings::default() });
    let builder = rustls::ClientConfig::builder_with_provider(crypto.clone())
        .with_protocol_versions(&versions)
        .map_err(Error::Config)?;
    let mut config = if tls.insecure_skip_verify {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerify(crypto))).with_no_client_auth()
    } else {
        let roots = match &tls.ca_pem {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(Error::CertificatePem)?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(Error::NoUpstreamCa);
                }
                Arc::new(roots)
            }
            None => system_roots(),
        };
        match tls.verify_depth {
            Some(depth) => {
                let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, crypto)
                    .build()
                    .map_err(|e| Error::Config(rustls::Error::General(e.to_string())))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(DepthLimited { inner: webpki, depth }))
                    .with_no_client_auth()
            }
            None => builder.with_root_certificates(roots).with_no_client_auth(),
        }
    };
    config.enable_sni = !tls.no_sni;
    if protocol == UpstreamProtocol::H2 {
        config.alpn_protocols = vec![b"h2".to_vec()];
    }
    let server_name =
        tls.server_name.as_ref().and_then(|n| rustls_pki_types::ServerName::try_from(n.clone()).ok());
    Ok(UpstreamTlsConfig { config: Arc::new(config), server_name })
}

/// Accepts any upstream certificate (signatures are still checked): `proxy-ssl-verify: "off"`.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Verifies as webpki does, then refuses a chain longer than `depth`: the certificate plus the
/// intermediates the upstream sends (`proxy-ssl-verify-depth`).
#[derive(Debug)]
struct DepthLimited {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    depth: u32,
}

impl rustls::client::danger::ServerCertVerifier for DepthLimited {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        if intermediates.len() + 1 > self.depth as usize {
            return Err(rustls::Error::General(format!(
                "the upstream's chain has {} certificates, more than proxy-ssl-verify-depth {}",
                intermediates.len() + 1,
                self.depth
            )));
        }
        Ok(verified)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::TlsEntry;

    fn cert(name: &str) -> Certificate {
        let generated = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        Certificate { chain_pem: generated.cert.pem(), key_pem: generated.signing_key.serialize_pem() }
    }

    /// `Listener.tls`: "The GatewayClass MUST use the longest matching SNI out of all available
    /// certificates": exact, then the Ingress one-label wildcard, then the Gateway API suffix
    /// names longest first, then an entry for any name.
    #[test]
    fn listener_tls_longest_matching_sni_wins() {
        let mut table = RouteTable::default();
        let names = ["exact", "ingress-wildcard", "suffix-short", "suffix-long", "any"];
        let hosts = [
            HostMatch::Exact("a.foo.example.com".into()),
            HostMatch::Wildcard("example.com".into()),
            HostMatch::Suffix("example.com".into()),
            HostMatch::Suffix("foo.example.com".into()),
            HostMatch::Any,
        ];
        for (name, host) in names.into_iter().zip(hosts) {
            let id = ObjectRef::new("ns", name);
            table.certificates.insert(id.clone(), cert(&format!("{name}.test")));
            table.tls.push(TlsEntry {
                hosts: vec![host],
                certificate: Some(id),
                listener: None,
                alternatives: Vec::new(),
            });
        }
        let index = CertIndex::compile(&table, &mut CertCache::default());
        let leaf = |sni: &str| {
            let key = index.resolve(Some(sni)).unwrap();
            let all = index.keys();
            let i = all.iter().position(|k| Arc::ptr_eq(k, &key)).unwrap();
            all[i].cert[0].clone()
        };
        let of = |name: &str| {
            let id = ObjectRef::new("ns", name);
            CertificateDer::pem_slice_iter(table.certificates[&id].chain_pem.as_bytes())
                .next()
                .unwrap()
                .unwrap()
        };
        assert_eq!(leaf("a.foo.example.com"), of("exact"));
        assert_eq!(leaf("b.example.com"), of("ingress-wildcard"));
        assert_eq!(leaf("b.foo.example.com"), of("suffix-long"));
        assert_eq!(leaf("c.b.foo.example.com"), of("suffix-long"));
        assert_eq!(leaf("c.b.example.com"), of("suffix-short"));
        assert_eq!(leaf("example.com"), of("any"), "a suffix name needs a label in front");
        assert_eq!(leaf("other.test"), of("any"));
    }

    /// Several certificates for one name (`ListenerTLSConfig.certificateRefs`: "Implementations
    /// MAY choose to support attaching multiple certificates to a Listener"): the handshake
    /// gets the first whose key signs with a scheme the ClientHello offers, else the first.
    #[test]
    fn several_certificates_for_one_name_the_client_signature_schemes_choose() {
        use rustls::SignatureAlgorithm as A;
        use rustls::SignatureScheme as S;
        let make = |alg: &'static rcgen::SignatureAlgorithm| {
            let key = rcgen::KeyPair::generate_for(alg).unwrap();
            let cert =
                rcgen::CertificateParams::new(vec!["a.test".to_string()]).unwrap().self_signed(&key).unwrap();
            Certificate { chain_pem: cert.pem(), key_pem: key.serialize_pem() }
        };
        let mut table = RouteTable::default();
        let (ecdsa, ed25519) = (ObjectRef::new("ns", "ecdsa"), ObjectRef::new("ns", "ed25519"));
        table.certificates.insert(ecdsa.clone(), make(&rcgen::PKCS_ECDSA_P256_SHA256));
        table.certificates.insert(ed25519.clone(), make(&rcgen::PKCS_ED25519));
        table.tls.push(TlsEntry {
            hosts: vec![HostMatch::Exact("a.test".into())],
            certificate: Some(ecdsa),
            listener: None,
            alternatives: vec![ObjectRef::new("ns", "missing"), ed25519],
        });
        let index = CertIndex::compile(&table, &mut CertCache::default());
        assert_eq!(index.keys().len(), 2);
        let algorithm =
            |schemes: Option<&[S]>| index.resolve_for(Some("a.test"), schemes).unwrap().key.algorithm();
        assert_eq!(algorithm(None), A::ECDSA, "no ClientHello: the first");
        assert_eq!(algorithm(Some(&[S::ECDSA_NISTP256_SHA256, S::ED25519])), A::ECDSA, "both fit: the first");
        assert_eq!(algorithm(Some(&[S::ED25519])), A::ED25519, "a client that verifies Ed25519 only");
        assert_eq!(algorithm(Some(&[S::RSA_PSS_SHA256])), A::ECDSA, "none fits: the first");
        assert_eq!(index.resolve(Some("a.test")).unwrap().key.algorithm(), A::ECDSA);
    }
}
