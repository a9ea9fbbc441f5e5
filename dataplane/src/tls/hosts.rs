//! Handshake options of single hosts (ingress-nginx's `ssl-ciphers` and
//! `ssl-prefer-server-ciphers` annotations): a server config per distinct set of options,
//! chosen by the ClientHello's SNI before the handshake, as for hosts that ask for client
//! certificates (whose own configs take these options too, see [`super::mtls`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use rustls::ServerConfig;

use crate::model::{HostMatch, HostTls, RouteTable, Settings};
use crate::tls;

/// A set of host options (suites, preference), the key of a shared config.
type Options<'a> = (&'a Option<Vec<String>>, Option<bool>);

/// The server configs of hosts with their own handshake options, by SNI.
#[derive(Default)]
pub struct HostTlsIndex {
    exact: HashMap<String, Arc<ServerConfig>>,
    wildcard: HashMap<String, Arc<ServerConfig>>,
}

impl HostTlsIndex {
    /// Builds a config for each distinct set of options of the table's hosts with `build` (the
    /// listener's config for given settings: certificates, sessions, tickets), shared by the
    /// hosts that set the same options. Hosts that ask for client certificates are left out:
    /// their own configs carry the options. A config that cannot be built is logged, and its
    /// hosts keep the table's.
    pub fn compile(
        table: &RouteTable,
        build: impl Fn(&Settings) -> Result<ServerConfig, tls::Error>,
    ) -> HostTlsIndex {
        let mut index = HostTlsIndex::default();
        let mut built: HashMap<Options<'_>, Arc<ServerConfig>> = HashMap::new();
        for host in &table.host_tls {
            if table.client_auth.iter().any(|auth| auth.host == host.host) {
                continue;
            }
            let key = (&host.ciphers, host.prefer_server_ciphers);
            let config = match built.get(&key) {
                Some(config) => config.clone(),
                None => match build(&settings_for(&table.settings, Some(host))) {
                    Ok(mut config) => {
                        prefer(&mut config, Some(host));
                        let config = Arc::new(config);
                        built.insert(key, config.clone());
                        config
                    }
                    Err(error) => {
                        tracing::error!(host = %host.host, %error, "ssl-ciphers: building the host's TLS configuration failed; the host keeps the listener's");
                        continue;
                    }
                },
            };
            match &host.host {
                HostMatch::Exact(name) => index.exact.insert(name.clone(), config),
                HostMatch::Wildcard(suffix) => index.wildcard.insert(suffix.clone(), config),
                HostMatch::Any | HostMatch::Suffix(_) => continue,
            };
        }
        index
    }

    /// Whether no host has options of its own.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty()
    }

    /// The config for a server name (lower case): its exact entry, else the wildcard covering
    /// its first label.
    pub fn lookup(&self, sni: &str) -> Option<&Arc<ServerConfig>> {
        self.exact.get(sni).or_else(|| {
            let (_, suffix) = sni.split_once('.')?;
            self.wildcard.get(suffix)
        })
    }
}

/// The options of `host` in the table, if it has some.
pub fn find<'a>(table: &'a RouteTable, host: &HostMatch) -> Option<&'a HostTls> {
    table.host_tls.iter().find(|h| h.host == *host)
}

/// The table's settings with the host's cipher suites in place of `ssl-ciphers`.
pub fn settings_for<'a>(settings: &'a Settings, host: Option<&HostTls>) -> Cow<'a, Settings> {
    match host.and_then(|h| h.ciphers.as_ref()) {
        Some(ciphers) => Cow::Owned(Settings { tls_ciphers: Some(ciphers.clone()), ..settings.clone() }),
        None => Cow::Borrowed(settings),
    }
}

/// `ssl-prefer-server-ciphers`: the server's order of suites (then of groups) wins.
pub fn prefer(config: &mut ServerConfig, host: Option<&HostTls>) {
    config.ignore_client_order = host.and_then(|h| h.prefer_server_ciphers).unwrap_or(false);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{ClientAuth, ClientVerify};

    fn host(name: &str, ciphers: Option<&[&str]>, prefer: Option<bool>) -> HostTls {
        HostTls {
            host: HostMatch::parse(name).unwrap(),
            ciphers: ciphers.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
            prefer_server_ciphers: prefer,
        }
    }

    fn build(settings: &Settings) -> Result<ServerConfig, tls::Error> {
        let resolver = Arc::new(rustls::server::ResolvesServerCertUsingSni::new());
        tls::server_config_for(resolver, settings)
    }

    #[test]
    fn hosts_with_the_same_options_share_one_config_and_sni_selects_it() {
        let aes = ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"];
        let table = RouteTable {
            host_tls: vec![
                host("a.test", Some(&aes), None),
                host("b.test", Some(&aes), None),
                host("*.wild.test", None, Some(true)),
                host("mtls.test", Some(&aes), Some(true)),
            ],
            client_auth: vec![ClientAuth {
                host: HostMatch::parse("mtls.test").unwrap(),
                listener: None,
                ca_pem: String::new(),
                verify: ClientVerify::On,
                depth: 1,
                pass_certificate: false,
                match_cn: None,
                error_page: None,
            }],
            ..RouteTable::default()
        };
        let index = HostTlsIndex::compile(&table, build);
        let (a, b) = (index.lookup("a.test").unwrap(), index.lookup("b.test").unwrap());
        assert!(Arc::ptr_eq(a, b));
        assert!(!a.ignore_client_order);
        let tls12: Vec<_> = a
            .crypto_provider()
            .cipher_suites
            .iter()
            .filter(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)))
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(tls12, aes);
        let wild = index.lookup("x.wild.test").unwrap();
        assert!(wild.ignore_client_order);
        assert!(index.lookup("x.y.wild.test").is_none(), "a wildcard covers one label");
        assert!(index.lookup("mtls.test").is_none(), "client-certificate hosts have their own config");
        assert!(index.lookup("other.test").is_none());
    }
}
