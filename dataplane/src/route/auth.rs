//! HTTP Basic authentication against htpasswd hashes (ingress-nginx `auth-type: basic`).
//!
//! Hash formats, as nginx's `auth_basic_user_file` and Apache's `htpasswd` write them: bcrypt
//! (`$2y$`, `$2b$`, `$2a$`), APR1-MD5 (`$apr1$`), MD5-crypt (`$1$`), SHA1 (`{SHA}`) and
//! `{PLAIN}`. bcrypt is slow by design, so it is checked on the blocking pool, never on a
//! request worker.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use md5::{Digest as _, Md5};
use sha1::Sha1;

use crate::model::BasicAuth;

/// Which algorithm a stored hash uses; `None` for one weir cannot check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashKind {
    /// `$2a$`, `$2b$`, `$2x$`, `$2y$`.
    Bcrypt,
    /// `$apr1$salt$hash`.
    Apr1,
    /// `$1$salt$hash`.
    Md5Crypt,
    /// `{SHA}base64`.
    Sha1,
    /// `{PLAIN}password`.
    Plain,
}

impl HashKind {
    /// The algorithm of `hash`.
    pub fn of(hash: &str) -> Option<HashKind> {
        if ["$2a$", "$2b$", "$2x$", "$2y$"].iter().any(|p| hash.starts_with(p)) {
            Some(HashKind::Bcrypt)
        } else if hash.starts_with("$apr1$") {
            Some(HashKind::Apr1)
        } else if hash.starts_with("$1$") {
            Some(HashKind::Md5Crypt)
        } else if hash.starts_with("{SHA}") {
            Some(HashKind::Sha1)
        } else if hash.starts_with("{PLAIN}") {
            Some(HashKind::Plain)
        } else {
            None
        }
    }
}

/// Whether `password` matches `hash` (blocking for bcrypt: call through [`check`]).
pub fn verify(hash: &str, password: &[u8]) -> bool {
    match HashKind::of(hash) {
        Some(HashKind::Bcrypt) => bcrypt::verify(password, hash).unwrap_or(false),
        Some(HashKind::Apr1) => md5_crypt_matches(hash, password, "$apr1$"),
        Some(HashKind::Md5Crypt) => md5_crypt_matches(hash, password, "$1$"),
        Some(HashKind::Sha1) => {
            let digest = Sha1::digest(password);
            constant_time_eq(STANDARD.encode(digest).as_bytes(), &hash.as_bytes()["{SHA}".len()..])
        }
        Some(HashKind::Plain) => constant_time_eq(password, &hash.as_bytes()["{PLAIN}".len()..]),
        None => false,
    }
}

/// The outcome of checking a request's `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Known user, right password.
    Allowed,
    /// No credentials, bad ones, or an unknown user: 401 with a challenge.
    Denied,
}

/// Checks an `Authorization` header value against `auth`.
pub async fn check(auth: &BasicAuth, header: Option<&http::HeaderValue>) -> Outcome {
    let Some((user, password)) = header.and_then(credentials) else { return Outcome::Denied };
    let Some(hash) = auth.users.get(&user) else { return Outcome::Denied };
    let ok = if HashKind::of(hash) == Some(HashKind::Bcrypt) {
        let hash = hash.clone();
        tokio::task::spawn_blocking(move || verify(&hash, &password)).await.unwrap_or(false)
    } else {
        verify(hash, &password)
    };
    if ok { Outcome::Allowed } else { Outcome::Denied }
}

/// `Basic base64(user:password)` → (user, password).
fn credentials(value: &http::HeaderValue) -> Option<(String, Vec<u8>)> {
    let value = value.to_str().ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(encoded.trim()).ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// MD5-crypt (`$1$`) and its Apache variant APR1 (`$apr1$`): same algorithm, other magic.
fn md5_crypt_matches(hash: &str, password: &[u8], magic: &str) -> bool {
    let Some(rest) = hash.strip_prefix(magic) else { return false };
    let Some((salt, _)) = rest.split_once('$') else { return false };
    let salt = &salt.as_bytes()[..salt.len().min(8)];
    constant_time_eq(md5_crypt(password, salt, magic.as_bytes()).as_bytes(), hash.as_bytes())
}

fn md5_crypt(pw: &[u8], salt: &[u8], magic: &[u8]) -> String {
    let alt = Md5::new().chain_update(pw).chain_update(salt).chain_update(pw).finalize();
    let mut ctx = Md5::new().chain_update(pw).chain_update(magic).chain_update(salt);
    let mut left = pw.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alt[..n]);
        left -= n;
    }
    let mut i = pw.len();
    while i > 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&pw[..1]);
        }
        i >>= 1;
    }
    let mut fin = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(pw);
        } else {
            c.update(fin);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(pw);
        }
        if round & 1 == 1 {
            c.update(fin);
        } else {
            c.update(pw);
        }
        fin = c.finalize();
    }
    const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(magic.len() + salt.len() + 23);
    out.push_str(&String::from_utf8_lossy(magic));
    out.push_str(&String::from_utf8_lossy(salt));
    out.push('$');
    let f = fin.as_slice();
    let mut push = |mut v: u32, n: usize| {
        for _ in 0..n {
            out.push(char::from(ITOA64[(v & 0x3f) as usize]));
            v >>= 6;
        }
    };
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        push((u32::from(f[a]) << 16) | (u32::from(f[b]) << 8) | u32::from(f[c]), 4);
    }
    push(u32::from(f[11]), 2);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // Vectors made by independent implementations: `openssl passwd -apr1 / -1`, `openssl dgst
    // -sha1 | base64`, and libxcrypt's bcrypt (Python's `crypt`).
    #[test]
    fn known_hashes() {
        assert!(verify("$apr1$abcdefgh$r/p0TRuenjeL4j5EsxbGb/", b"p@ssw0rd"));
        assert!(!verify("$apr1$abcdefgh$r/p0TRuenjeL4j5EsxbGb/", b"p@ssw0rD"));
        assert!(verify("$1$saltsalt$ZliGyAN3DciDHEkDboonh/", b"hunter2"));
        assert!(!verify("$1$saltsalt$ZliGyAN3DciDHEkDboonh/", b"hunter3"));
        assert!(verify("{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=", b"secret"));
        assert!(!verify("{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=", b"Secret"));
        assert!(verify("$2b$05$abcdefghijklmnopqrstuuKwWV7ESJpzKzf9FQg57dBvMuv92X9HS", b"letmein"));
        assert!(!verify("$2b$05$abcdefghijklmnopqrstuuKwWV7ESJpzKzf9FQg57dBvMuv92X9HS", b"letmeout"));
        assert!(verify("{PLAIN}open", b"open"));
        assert!(!verify("plaintext-without-scheme", b"plaintext-without-scheme"));
    }

    #[test]
    fn credentials_parse() {
        let v = http::HeaderValue::from_static("Basic dXNlcjpwYTpzcw==");
        assert_eq!(credentials(&v), Some(("user".into(), b"pa:ss".to_vec())));
        assert_eq!(credentials(&http::HeaderValue::from_static("Bearer x")), None);
        assert_eq!(credentials(&http::HeaderValue::from_static("Basic !!!")), None);
    }
}
