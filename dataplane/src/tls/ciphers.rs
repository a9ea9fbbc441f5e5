//! OpenSSL cipher strings (nginx's `ssl_ciphers`, ingress-nginx's `ssl-ciphers` and
//! `proxy-ssl-ciphers`) mapped onto the cipher suites weir's TLS library offers.
//!
//! As in nginx with OpenSSL, the string chooses the TLS 1.2 suites and their order; TLS 1.3
//! suites are not chosen by it and stay on. The TLS 1.2 suites weir has are the six ECDHE
//! AEAD ones (AES-GCM and ChaCha20-Poly1305, with ECDSA or RSA certificates); names and aliases
//! that select only other suites (CBC, DHE, static RSA, 3DES…) select nothing here.
//!
//! Syntax, as OpenSSL's: entries separated by `:` (or `,` or spaces), each a suite name or
//! aliases joined by `+` (all must match), optionally prefixed by `!` (removed for good), `-`
//! (removed, may come back) or `+` (moved to the end); `@STRENGTH` and `@SECLEVEL=n` are
//! accepted and change nothing.

use std::sync::Arc;

use rustls::SupportedCipherSuite;
use rustls::crypto::CryptoProvider;

/// One TLS 1.2 suite weir offers: its rustls name, its OpenSSL name, and the OpenSSL aliases
/// that select it.
struct Suite {
    rustls: &'static str,
    openssl: &'static str,
    aliases: &'static [&'static str],
}

const COMMON: &[&str] =
    &["ALL", "DEFAULT", "HIGH", "ECDHE", "EECDH", "kECDHE", "kEECDH", "TLSv1.2", "AEAD", "FIPS"];

/// TLS 1.2 suites in OpenSSL's default preference order.
const SUITES: [Suite; 6] = [
    Suite {
        rustls: "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        openssl: "ECDHE-ECDSA-AES256-GCM-SHA384",
        aliases: &["aECDSA", "ECDSA", "AESGCM", "AES", "AES256", "SHA384"],
    },
    Suite {
        rustls: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        openssl: "ECDHE-RSA-AES256-GCM-SHA384",
        aliases: &["aRSA", "RSA", "AESGCM", "AES", "AES256", "SHA384"],
    },
    Suite {
        rustls: "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        openssl: "ECDHE-ECDSA-CHACHA20-POLY1305",
        aliases: &["aECDSA", "ECDSA", "CHACHA20", "SHA256"],
    },
    Suite {
        rustls: "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        openssl: "ECDHE-RSA-CHACHA20-POLY1305",
        aliases: &["aRSA", "RSA", "CHACHA20", "SHA256"],
    },
    Suite {
        rustls: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        openssl: "ECDHE-ECDSA-AES128-GCM-SHA256",
        aliases: &["aECDSA", "ECDSA", "AESGCM", "AES", "AES128", "SHA256"],
    },
    Suite {
        rustls: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        openssl: "ECDHE-RSA-AES128-GCM-SHA256",
        aliases: &["aRSA", "RSA", "AESGCM", "AES", "AES128", "SHA256"],
    },
];

/// TLS 1.3 suite names as OpenSSL writes them: accepted in a cipher string, and change
/// nothing (TLS 1.3 suites are always on).
const TLS13: [&str; 3] = ["TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"];

impl Suite {
    fn matches(&self, alias: &str) -> bool {
        self.openssl == alias
            || self.rustls == alias
            || COMMON.contains(&alias)
            || self.aliases.contains(&alias)
    }
}

/// What a cipher string selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The TLS 1.2 suites, rustls names, in the string's order.
    pub tls12: Vec<String>,
    /// Entries that add no suite weir has (unknown names, or suites weir does not offer).
    pub unmatched: Vec<String>,
}

/// Parses an OpenSSL cipher string. An error for a string with characters no cipher string
/// has, and for one that selects no TLS 1.2 suite weir offers.
pub fn parse(s: &str) -> Result<Selection, String> {
    if s.trim().is_empty() {
        return Err("empty cipher list".into());
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || "+-!@=:,. _".contains(*c))) {
        return Err(format!("{c:?} has no place in an OpenSSL cipher string"));
    }
    let mut order: Vec<usize> = Vec::new();
    let mut banned = [false; SUITES.len()];
    let mut unmatched = Vec::new();
    for entry in s.split([':', ',', ' ']).map(str::trim).filter(|e| !e.is_empty()) {
        if entry.starts_with('@') {
            continue;
        }
        let (op, body) = match entry.as_bytes()[0] {
            b'!' | b'-' | b'+' => (entry.as_bytes()[0], &entry[1..]),
            _ => (b' ', entry),
        };
        if TLS13.contains(&body) {
            continue;
        }
        let aliases: Vec<&str> = body.split('+').collect();
        let hits: Vec<usize> =
            (0..SUITES.len()).filter(|&i| aliases.iter().all(|a| SUITES[i].matches(a))).collect();
        match op {
            b'!' => {
                for &i in &hits {
                    banned[i] = true;
                }
                order.retain(|i| !hits.contains(i));
            }
            b'-' => order.retain(|i| !hits.contains(i)),
            b'+' => {
                let moved: Vec<usize> = order.iter().copied().filter(|i| hits.contains(i)).collect();
                order.retain(|i| !hits.contains(i));
                order.extend(moved);
            }
            _ => {
                let added: Vec<usize> =
                    hits.iter().copied().filter(|i| !banned[*i] && !order.contains(i)).collect();
                if hits.is_empty() {
                    unmatched.push(entry.to_string());
                }
                order.extend(added);
            }
        }
    }
    if order.is_empty() {
        return Err("selects no TLS 1.2 cipher suite weir offers (ECDHE with AES-GCM or CHACHA20-POLY1305, e.g. ECDHE-ECDSA-AES128-GCM-SHA256)".into());
    }
    Ok(Selection { tls12: order.iter().map(|&i| SUITES[i].rustls.to_string()).collect(), unmatched })
}

/// weir's crypto provider offering every TLS 1.3 suite and, of TLS 1.2, only `tls12` (rustls
/// names) in that order; all of them when `tls12` names none weir has.
pub fn provider(tls12: &[String]) -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    let all = provider.cipher_suites.clone();
    let name = |s: &SupportedCipherSuite| format!("{:?}", s.suite());
    let mut chosen: Vec<SupportedCipherSuite> =
        all.iter().filter(|s| matches!(s, SupportedCipherSuite::Tls13(_))).copied().collect();
    for wanted in tls12 {
        if let Some(suite) =
            all.iter().find(|s| matches!(s, SupportedCipherSuite::Tls12(_)) && name(s) == *wanted)
        {
            chosen.push(*suite);
        }
    }
    if chosen.iter().any(|s| matches!(s, SupportedCipherSuite::Tls12(_))) {
        provider.cipher_suites = chosen;
    }
    Arc::new(provider)
}

/// The OpenSSL name of a suite weir offers, from its rustls name (`$ssl_cipher` in the access
/// log): `TLS_AES_128_GCM_SHA256`, `ECDHE-RSA-AES128-GCM-SHA256`.
pub fn openssl_name(rustls: &str) -> Option<&'static str> {
    if let Some(tls13) = rustls.strip_prefix("TLS13_") {
        return TLS13.iter().find(|name| name.strip_prefix("TLS_") == Some(tls13)).copied();
    }
    SUITES.iter().find(|s| s.rustls == rustls).map(|s| s.openssl)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        let one = parse("ECDHE-ECDSA-AES128-GCM-SHA256").unwrap();
        assert_eq!(one.tls12, ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]);
        // ingress-nginx's default: the DHE suites are not weir's, reported.
        let default = parse("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384").unwrap();
        assert_eq!(default.tls12.len(), 6);
        assert_eq!(default.tls12[0], "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
        assert_eq!(default.unmatched, ["DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384"]);
        assert_eq!(parse("HIGH:!aNULL:!MD5").unwrap().tls12.len(), 6);
        assert_eq!(
            parse("ECDHE+AESGCM:!aRSA").unwrap().tls12,
            ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]
        );
        // `-` removes, a later entry brings back; `!` is for good; `+` moves to the end.
        assert_eq!(parse("CHACHA20:-CHACHA20:ECDHE-RSA-CHACHA20-POLY1305").unwrap().tls12.len(), 1);
        assert!(parse("!CHACHA20:CHACHA20").is_err());
        let moved = parse("CHACHA20:AES128:+CHACHA20").unwrap().tls12;
        assert_eq!(moved.last().unwrap(), "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256");
        // TLS 1.3 names and @ directives change nothing; nothing weir has is an error.
        assert_eq!(parse("TLS_AES_128_GCM_SHA256:AESGCM:@STRENGTH").unwrap().tls12.len(), 4);
        for bad in ["AES128-SHA:DES-CBC3-SHA", "TLS_AES_128_GCM_SHA256", "", "HIGH;rm -rf", "a\nb"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_provider_keeps_tls13_and_the_chosen_tls12_suites() {
        let p = provider(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()]);
        let tls12: Vec<_> =
            p.cipher_suites.iter().filter(|s| matches!(s, SupportedCipherSuite::Tls12(_))).collect();
        assert_eq!(tls12.len(), 1);
        assert_eq!(p.cipher_suites.len(), 4);
        assert_eq!(provider(&[]).cipher_suites.len(), 9);
    }

    #[test]
    fn suites_have_their_openssl_names() {
        assert_eq!(openssl_name("TLS13_AES_128_GCM_SHA256"), Some("TLS_AES_128_GCM_SHA256"));
        assert_eq!(
            openssl_name("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
            Some("ECDHE-RSA-AES128-GCM-SHA256")
        );
        assert_eq!(openssl_name("TLS13_AES_128_CCM_SHA256"), None);
    }
}
