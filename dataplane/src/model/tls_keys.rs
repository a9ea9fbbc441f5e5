//! The ConfigMap's TLS keys beyond versions, suites and the session cache (`ssl-session-tickets`,
//! `ssl-session-ticket-key`, `enable-ocsp`, `ssl-ecdh-curve`, `ssl-buffer-size`,
//! `ssl-reject-handshake`), part of the table's [`super::Settings`].

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// TLS settings of the HTTPS listener; every field `None` keeps weir's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsKeys {
    /// Stateless resumption with session tickets (`ssl-session-tickets`). `None`: off, as
    /// ingress-nginx (sessions are resumed from the session cache instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_tickets: Option<bool>,
    /// The secret the ticket keys derive from (`ssl-session-ticket-key`): replicas given the
    /// same one resume each other's sessions. `None`: a random secret per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ticket_key: Option<TicketSecret>,
    /// OCSP stapling (`enable-ocsp`). `None`: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocsp: Option<bool>,
    /// The key exchange groups offered, preferred first (`ssl-ecdh-curve`). `None`: rustls's
    /// default list (X25519MLKEM768, X25519, P-256, P-384).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kx_groups: Option<Vec<KxGroup>>,
    /// Largest plaintext carried by one TLS record, in bytes, 32 to 16384 (`ssl-buffer-size`).
    /// `None`: 16384, the TLS maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_size: Option<u32>,
    /// Handshakes whose SNI names no host with a certificate are refused with an
    /// `unrecognized_name` alert instead of getting the default certificate
    /// (`ssl-reject-handshake`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject_unknown_sni: Option<bool>,
}

impl TlsKeys {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == TlsKeys::default()
    }
}

/// A key exchange group clients may use (`ssl-ecdh-curve`), by its IANA name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KxGroup {
    /// The hybrid post-quantum group X25519 + ML-KEM-768.
    X25519MLKEM768,
    /// X25519 (Curve25519 ECDH).
    X25519,
    /// NIST P-256 (`prime256v1`, `secp256r1`).
    #[serde(rename = "secp256r1")]
    Secp256r1,
    /// NIST P-384 (`secp384r1`).
    #[serde(rename = "secp384r1")]
    Secp384r1,
}

/// The bytes of `ssl-session-ticket-key` (48 or 80, as nginx's key file holds). Shown as base64
/// in a serialized table, as the ConfigMap holds it; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct TicketSecret(pub Vec<u8>);

impl TicketSecret {
    /// The key as ingress-nginx's ConfigMap holds it: base64 (standard alphabet, padded) of 48
    /// or 80 bytes.
    pub fn from_base64(s: &str) -> Result<TicketSecret, String> {
        let bytes =
            base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("not base64 ({e})"))?;
        match bytes.len() {
            48 | 80 => Ok(TicketSecret(bytes)),
            n => Err(format!("{n} bytes; nginx's ticket keys have 48 or 80")),
        }
    }
}

impl std::fmt::Debug for TicketSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketSecret({} bytes)", self.0.len())
    }
}

impl Serialize for TicketSecret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for TicketSecret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map(TicketSecret)
            .map_err(serde::de::Error::custom)
    }
}
