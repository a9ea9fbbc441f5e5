//! The listener's TLS options from the table's [`TlsKeys`]: the key exchange groups offered
//! (`ssl-ecdh-curve`) and the largest record sent (`ssl-buffer-size`).

use std::sync::Arc;

use rustls::crypto::aws_lc_rs::kx_group;
use rustls::crypto::{CryptoProvider, SupportedKxGroup};

use crate::model::tls_keys::{KxGroup, TlsKeys};

/// Bytes of a TLS record header (type, version, length), which rustls counts in
/// `max_fragment_size`.
const RECORD_HEADER: usize = 5;

/// The rustls group of a [`KxGroup`].
pub fn group(g: KxGroup) -> &'static dyn SupportedKxGroup {
    match g {
        KxGroup::X25519MLKEM768 => kx_group::X25519MLKEM768,
        KxGroup::X25519 => kx_group::X25519,
        KxGroup::Secp256r1 => kx_group::SECP256R1,
        KxGroup::Secp384r1 => kx_group::SECP384R1,
    }
}

/// `provider` offering only the groups of `keys` (in their order), when it names some.
pub fn with_groups(provider: Arc<CryptoProvider>, keys: &TlsKeys) -> Arc<CryptoProvider> {
    match keys.kx_groups.as_deref() {
        Some(groups) if !groups.is_empty() => {
            let mut chosen = CryptoProvider::clone(&provider);
            chosen.kx_groups = groups.iter().map(|g| group(*g)).collect();
            Arc::new(chosen)
        }
        _ => provider,
    }
}

/// What of [`TlsKeys`] shapes a server config (the groups and the record size): a config is
/// built again when it changes.
pub type Choice = (Option<Vec<KxGroup>>, Option<u32>);

/// The [`Choice`] of `keys` (an empty group list counts as unset).
pub fn choice(keys: &TlsKeys) -> Choice {
    (keys.kx_groups.clone().filter(|g| !g.is_empty()), keys.record_size)
}

/// Applies the record size of `keys` to a server config.
pub fn apply(config: &mut rustls::ServerConfig, keys: &TlsKeys) {
    config.max_fragment_size = keys.record_size.map(|n| (n as usize).clamp(32, 16_384) + RECORD_HEADER);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn groups_keep_their_order_and_unset_keeps_the_provider() {
        let base = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let same = with_groups(base.clone(), &TlsKeys::default());
        assert!(Arc::ptr_eq(&base, &same));
        let keys =
            TlsKeys { kx_groups: Some(vec![KxGroup::Secp384r1, KxGroup::X25519]), ..TlsKeys::default() };
        let names: Vec<_> = with_groups(base, &keys).kx_groups.iter().map(|g| g.name()).collect();
        assert_eq!(names, [rustls::NamedGroup::secp384r1, rustls::NamedGroup::X25519]);
    }

    #[test]
    fn record_sizes_count_the_header_as_rustls_does() {
        let resolver = Arc::new(rustls::server::ResolvesServerCertUsingSni::new());
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(resolver);
        apply(&mut config, &TlsKeys { record_size: Some(4096), ..TlsKeys::default() });
        assert_eq!(config.max_fragment_size, Some(4101));
        apply(&mut config, &TlsKeys::default());
        assert_eq!(config.max_fragment_size, None);
        // rustls accepts every size translation lets through.
        for n in [32, 16_384] {
            apply(&mut config, &TlsKeys { record_size: Some(n), ..TlsKeys::default() });
            assert!(rustls::ServerConnection::new(Arc::new(config.clone())).is_ok(), "{n}");
        }
    }
}
