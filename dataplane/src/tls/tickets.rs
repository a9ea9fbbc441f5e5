//! TLS session tickets (`ssl-session-tickets`, `ssl-session-ticket-key`): stateless resumption,
//! the session's state sealed into a ticket the client keeps.
//!
//! Keys rotate: time is cut into periods as long as the ticket lifetime (`ssl-session-timeout`,
//! 10 minutes by default), and each period's AES-256-GCM key is derived with HKDF-SHA256 from one
//! secret and the period's number. A ticket names its period; tickets of the current, the
//! previous and the next period (clock skew between replicas) are accepted, so a ticket lives
//! at most two lifetimes, and a key older than that is never derived again (forward secrecy
//! within the secret's life).
//!
//! The secret is the bytes of `ssl-session-ticket-key` (nginx's 48- or 80-byte key file, base64
//! in ingress-nginx's ConfigMap): every replica given it derives the same keys and resumes the
//! others' sessions. Without it the secret is random per process. The ticket format is weir's:
//! nginx's tickets (AES-CBC + HMAC under the key's own parts) are not understood, and such a
//! client simply makes a full handshake.
//!
//! One [`Tickets`] serves every server config without client authentication (as the session
//! cache does) and is reconfigured in place by each publish; its `enabled` switch is read by
//! rustls at each handshake.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf;

/// Bytes before the sealed state: the period number and the nonce.
const HEADER: usize = 8 + NONCE_LEN;
/// HKDF salt: names what the keys are for.
const SALT: &[u8] = b"weir tls session tickets v1";

/// The ticket producer (see the module docs).
pub struct Tickets {
    enabled: AtomicBool,
    /// A random secret, used while no key is configured.
    random: Arc<[u8]>,
    keys: ArcSwap<Keys>,
}

/// The keys of one period and its neighbours, derived from one secret.
struct Keys {
    secret: Arc<[u8]>,
    /// Seconds per period (also the lifetime hint sent to clients).
    lifetime: u32,
    /// The current period.
    period: u64,
    /// Keys of `period - 1`, `period`, `period + 1`.
    keys: [LessSafeKey; 3],
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.keys.load();
        f.debug_struct("Tickets")
            .field("enabled", &self.enabled.load(Ordering::Relaxed))
            .field("lifetime", &keys.lifetime)
            .field("shared", &!Arc::ptr_eq(&keys.secret, &self.random))
            .finish()
    }
}

impl Default for Tickets {
    fn default() -> Self {
        Tickets::new()
    }
}

impl Tickets {
    /// Tickets switched off, with a random secret and the default lifetime (600 s).
    pub fn new() -> Tickets {
        let mut random = [0u8; 32];
        // aws-lc's RNG fails only if the operating system's entropy source does; then the
        // secret is the hash of the time and process, still unique per process, and logged.
        if aws_lc_rs::rand::fill(&mut random).is_err() {
            tracing::error!("no random bytes for the TLS ticket secret; using a time-derived one");
            let seed = format!("{:?} {}", SystemTime::now(), std::process::id());
            let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, seed.as_bytes());
            random.copy_from_slice(digest.as_ref());
        }
        let random: Arc<[u8]> = Arc::from(random.as_slice());
        let lifetime = super::sessions::DEFAULT_TIMEOUT.as_secs() as u32;
        let keys = Keys::derive(random.clone(), lifetime, period(now(), lifetime));
        Tickets { enabled: AtomicBool::new(false), random, keys: ArcSwap::from_pointee(keys) }
    }

    /// Switches tickets on or off, with `secret` (`None`: the process's random one) and tickets
    /// living `lifetime` (at least a second).
    pub fn configure(&self, enabled: bool, secret: Option<&[u8]>, lifetime: Duration) {
        let lifetime = lifetime.as_secs().clamp(1, u64::from(u32::MAX)) as u32;
        let current = self.keys.load();
        let same_secret = match secret {
            Some(s) => *current.secret == *s,
            None => Arc::ptr_eq(&current.secret, &self.random),
        };
        if !same_secret || current.lifetime != lifetime {
            let secret = secret.map_or_else(|| self.random.clone(), Arc::from);
            self.keys.store(Arc::new(Keys::derive(secret, lifetime, period(now(), lifetime))));
        }
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// The keys for the period of `now_secs`, derived again when the period has moved on.
    fn keys_at(&self, now_secs: u64) -> Arc<Keys> {
        let keys = self.keys.load_full();
        let wanted = period(now_secs, keys.lifetime);
        if keys.period == wanted {
            return keys;
        }
        // Two handshakes may derive at once; both store the same keys.
        let fresh = Arc::new(Keys::derive(keys.secret.clone(), keys.lifetime, wanted));
        self.keys.store(fresh.clone());
        fresh
    }

    fn seal_at(&self, plain: &[u8], now_secs: u64) -> Option<Vec<u8>> {
        let keys = self.keys_at(now_secs);
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let period = keys.period.to_be_bytes();
        let mut out = Vec::with_capacity(HEADER + plain.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(&period);
        out.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        keys.keys[1]
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(period), &mut sealed)
            .ok()?;
        out.extend_from_slice(&sealed);
        Some(out)
    }

    fn open_at(&self, ticket: &[u8], now_secs: u64) -> Option<Vec<u8>> {
        if ticket.len() < HEADER + AES_256_GCM.tag_len() {
            return None;
        }
        let (period_bytes, rest) = ticket.split_at(8);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let period = u64::from_be_bytes(period_bytes.try_into().ok()?);
        let keys = self.keys_at(now_secs);
        let slot = match period.checked_add(1)?.checked_sub(keys.period)? {
            slot @ 0..=2 => slot as usize,
            _ => return None, // too old, or from too far ahead
        };
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = keys.keys[slot].open_in_place(nonce, Aad::from(period.to_be_bytes()), &mut buf).ok()?;
        let len = plain.len();
        buf.truncate(len);
        Some(buf)
    }
}

impl Keys {
    fn derive(secret: Arc<[u8]>, lifetime: u32, period: u64) -> Keys {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(&secret);
        let key = |p: u64| {
            let info = p.to_be_bytes();
            let info = [info.as_slice()];
            // Expanding 32 bytes from SHA-256 cannot fail (the limit is 255 hash lengths), and
            // an AES-256 key of 32 bytes is always accepted.
            let okm = prk.expand(&info, &AES_256_GCM).expect("32 bytes is within HKDF-SHA256's limit");
            LessSafeKey::new(UnboundKey::from(okm))
        };
        Keys {
            secret,
            lifetime,
            period,
            keys: [key(period.wrapping_sub(1)), key(period), key(period.wrapping_add(1))],
        }
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn period(now_secs: u64, lifetime: u32) -> u64 {
    now_secs / u64::from(lifetime.max(1))
}

impl rustls::server::ProducesTickets for Tickets {
    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn lifetime(&self) -> u32 {
        self.keys.load().lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal_at(plain, now())
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        self.open_at(ticket, now())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn on(secret: Option<&[u8]>, lifetime: u64) -> Tickets {
        let t = Tickets::new();
        t.configure(true, secret, Duration::from_secs(lifetime));
        t
    }

    #[test]
    fn a_ticket_opens_within_two_lifetimes_and_not_after() {
        let t = on(Some(&[7; 48]), 600);
        let start = 600 * 1000; // the start of a period
        let ticket = t.seal_at(b"state", start).unwrap();
        assert_eq!(t.open_at(&ticket, start + 599).unwrap(), b"state");
        assert_eq!(t.open_at(&ticket, start + 1199).unwrap(), b"state", "the next period");
        assert_eq!(t.open_at(&ticket, start + 1200), None, "two periods on");
        // A replica whose clock is a period behind still opens it.
        assert_eq!(t.open_at(&ticket, start - 1).unwrap(), b"state");
        assert_eq!(t.open_at(&ticket, start - 601), None);
    }

    #[test]
    fn the_same_secret_opens_another_replicas_tickets_and_others_do_not() {
        let a = on(Some(&[1; 80]), 600);
        let b = on(Some(&[1; 80]), 600);
        let c = on(Some(&[2; 80]), 600);
        let random = on(None, 600);
        let ticket = a.seal_at(b"session", 5_000_000).unwrap();
        assert_eq!(b.open_at(&ticket, 5_000_100).unwrap(), b"session");
        assert_eq!(c.open_at(&ticket, 5_000_100), None);
        assert_eq!(random.open_at(&ticket, 5_000_100), None);
        // Two processes without a key do not share either.
        let other = on(None, 600);
        let mine = random.seal_at(b"x", 5_000_000).unwrap();
        assert_eq!(random.open_at(&mine, 5_000_000).unwrap(), b"x");
        assert_eq!(other.open_at(&mine, 5_000_000), None);
    }

    #[test]
    fn tampered_truncated_and_relabelled_tickets_are_refused() {
        let t = on(Some(&[3; 48]), 600);
        let now = 7_000_000;
        let ticket = t.seal_at(b"state", now).unwrap();
        for i in 0..ticket.len() {
            let mut bad = ticket.clone();
            bad[i] ^= 1;
            assert_eq!(t.open_at(&bad, now), None, "byte {i} flipped");
        }
        for len in 0..ticket.len() {
            assert_eq!(t.open_at(&ticket[..len], now), None, "{len} bytes");
        }
        assert_eq!(t.open_at(&[], now), None);
        assert_eq!(t.open_at(&[0xff; 64], now), None);
    }

    #[test]
    fn reconfiguring_keeps_keys_while_the_secret_and_lifetime_stay() {
        use rustls::server::ProducesTickets;
        let t = Tickets::new();
        assert!(!t.enabled(), "off by default, as ingress-nginx");
        t.configure(true, None, Duration::from_secs(300));
        assert!(t.enabled());
        assert_eq!(t.lifetime(), 300);
        let ticket = t.encrypt(b"s").unwrap();
        t.configure(true, None, Duration::from_secs(300));
        assert_eq!(t.decrypt(&ticket).unwrap(), b"s");
        t.configure(true, Some(&[9; 48]), Duration::from_secs(300));
        assert_eq!(t.decrypt(&ticket), None, "a new secret: old tickets are not opened");
        t.configure(false, Some(&[9; 48]), Duration::from_secs(300));
        assert!(!t.enabled());
    }
}
