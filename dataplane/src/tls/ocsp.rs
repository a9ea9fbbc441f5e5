//! OCSP stapling (`enable-ocsp`): the certificate's revocation status, fetched from its CA's
//! responder and sent to clients in the handshake, so they need not ask the CA themselves.
//!
//! Off the request path: a task per certificate fetches the response (HTTP POST to the
//! responder named in the certificate's Authority Information Access), keeps it while it is
//! valid and fetches the next one before its `nextUpdate` (half-way through the time left, at
//! most five minutes before it, at least an hour apart at most). A failed fetch is retried with
//! a backoff (2 s doubling to 5 minutes); the last good response is stapled until it expires,
//! then none is. Handshakes only read the current staple: a slow or dead responder never
//! delays or fails one, it only leaves it without a staple.
//!
//! As nginx, only a `good` status is stapled (`revoked` and `unknown` are logged and not sent).
//! The request asks about the leaf, identified by SHA-1 hashes of its issuer's name and key (the
//! issuer must be the next certificate of the chain in the Secret) and its serial number; a
//! response about anything else is refused. weir does not check the responder's signature:
//! clients do, against the CA they trust (a forged staple fails their check, as a missing one
//! would not). Responders over `http://` only (as CAs publish them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;
use sha1::{Digest as _, Sha1};

/// Longest wait for a responder's answer.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response read from a responder.
const MAX_RESPONSE: usize = 64 * 1024;
/// First wait after a failed fetch; doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Why a certificate cannot be stapled, or a response not used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The certificate names no OCSP responder.
    #[error("the certificate names no OCSP responder (Authority Information Access)")]
    NoResponder,
    /// The chain lacks the leaf's issuer.
    #[error("the chain has no issuer certificate after the leaf (the OCSP request names the issuer)")]
    NoIssuer,
    /// A certificate could not be read.
    #[error("a certificate of the chain cannot be parsed")]
    Certificate,
    /// The responder's URL is not usable.
    #[error("OCSP responder {0:?}: only http://host[:port]/path URLs are supported")]
    Url(String),
    /// The responder could not be reached or answered badly.
    #[error("OCSP responder {url}: {why}")]
    Fetch {
        /// The responder.
        url: String,
        /// What went wrong.
        why: String,
    },
    /// The response is not one weir can staple.
    #[error("OCSP response refused: {0}")]
    Response(&'static str),
    /// The responder says the certificate is not good.
    #[error("the OCSP responder says the certificate is {0}; not stapled")]
    Status(&'static str),
}

// === DER ===

/// A reader of DER TLVs.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    /// The next TLV: (tag, content, the whole encoding).
    fn next(&mut self) -> Option<(u8, &'a [u8], &'a [u8])> {
        let input = self.0;
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let (bytes, rest) = rest.split_at(n);
            (bytes.iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b)), rest)
        };
        if rest.len() < len {
            return None;
        }
        let (content, rest) = rest.split_at(len);
        let whole = &input[..input.len() - rest.len()];
        self.0 = rest;
        Some((tag, content, whole))
    }

    /// The content of the next TLV, which must have `tag`.
    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        match self.next()? {
            (t, content, _) if t == tag => Some(content),
            _ => None,
        }
    }

    /// The content of the next TLV if it has `tag` (else nothing is consumed).
    fn optional(&mut self, tag: u8) -> Option<&'a [u8]> {
        if self.0.first() == Some(&tag) { self.expect(tag) } else { None }
    }
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const BIT_STRING: u8 = 0x03;
const OID: u8 = 0x06;
const ENUMERATED: u8 = 0x0a;
const GENERALIZED_TIME: u8 = 0x18;
/// id-pe-authorityInfoAccess, 1.3.6.1.5.5.7.1.1.
const OID_AIA: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 1, 1];
/// id-ad-ocsp, 1.3.6.1.5.5.7.48.1.
const OID_AD_OCSP: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1];
/// id-pkix-ocsp-basic, 1.3.6.1.5.5.7.48.1.1.
const OID_OCSP_BASIC: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 0x30, 1, 1];
/// AlgorithmIdentifier of SHA-1 with NULL parameters.
const SHA1_ALG: &[u8] = &[0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00];

/// Encodes a TLV.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// The parts of a certificate OCSP needs.
struct CertFields<'a> {
    serial: &'a [u8],
    /// The issuer Name, whole.
    issuer: &'a [u8],
    /// The subject Name, whole.
    subject: &'a [u8],
    /// The subjectPublicKey BIT STRING's bits (without the unused-bits byte).
    public_key: &'a [u8],
    /// The first OCSP responder URL of the Authority Information Access.
    ocsp_url: Option<&'a str>,
}

fn cert_fields(der: &[u8]) -> Option<CertFields<'_>> {
    let cert = Der(der).expect(SEQUENCE)?;
    let mut tbs = Der(Der(cert).expect(SEQUENCE)?);
    tbs.optional(0xa0); // version
    let serial = tbs.expect(INTEGER)?;
    tbs.expect(SEQUENCE)?; // signature algorithm
    let (SEQUENCE, _, issuer) = tbs.next()? else { return None };
    tbs.expect(SEQUENCE)?; // validity
    let (SEQUENCE, _, subject) = tbs.next()? else { return None };
    let mut spki = Der(tbs.expect(SEQUENCE)?);
    spki.expect(SEQUENCE)?;
    let public_key = spki.expect(BIT_STRING)?.get(1..)?;
    tbs.optional(0x81);
    tbs.optional(0x82);
    let mut ocsp_url = None;
    if let Some(extensions) = tbs.optional(0xa3) {
        let mut list = Der(Der(extensions).expect(SEQUENCE)?);
        while let Some(ext) = list.expect(SEQUENCE) {
            let mut ext = Der(ext);
            if ext.expect(OID)? != OID_AIA {
                continue;
            }
            ext.optional(0x01); // critical
            let mut descriptions = Der(Der(ext.expect(OCTET_STRING)?).expect(SEQUENCE)?);
            while let Some(description) = descriptions.expect(SEQUENCE) {
                let mut description = Der(description);
                if description.expect(OID)? == OID_AD_OCSP
                    && let Some(uri) = description.optional(0x86)
                {
                    ocsp_url = std::str::from_utf8(uri).ok();
                    break;
                }
            }
        }
    }
    Some(CertFields { serial, issuer, subject, public_key, ocsp_url })
}

/// What an OCSP request asks about: a certificate, by its issuer's hashes and its serial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertId {
    name_hash: [u8; 20],
    key_hash: [u8; 20],
    serial: Vec<u8>,
}

impl CertId {
    /// The CertID (SHA-1) and responder URL of the leaf of `chain`.
    pub fn of_chain(chain: &[CertificateDer<'_>]) -> Result<(CertId, String), Error> {
        let leaf = chain.first().ok_or(Error::Certificate)?;
        let leaf = cert_fields(leaf).ok_or(Error::Certificate)?;
        let url = leaf.ocsp_url.ok_or(Error::NoResponder)?.to_string();
        let issuer = chain
            .iter()
            .skip(1)
            .filter_map(|c| cert_fields(c))
            .find(|c| c.subject == leaf.issuer)
            .ok_or(Error::NoIssuer)?;
        let id = CertId {
            name_hash: Sha1::digest(leaf.issuer).into(),
            key_hash: Sha1::digest(issuer.public_key).into(),
            serial: leaf.serial.to_vec(),
        };
        Ok((id, url))
    }

    fn encode(&self) -> Vec<u8> {
        let mut content = SHA1_ALG.to_vec();
        content.extend(tlv(OCTET_STRING, &self.name_hash));
        content.extend(tlv(OCTET_STRING, &self.key_hash));
        content.extend(tlv(INTEGER, &self.serial));
        tlv(SEQUENCE, &content)
    }

    /// The DER OCSPRequest for this certificate (no nonce: responders may cache the answer).
    pub fn request(&self) -> Vec<u8> {
        let request = tlv(SEQUENCE, &self.encode());
        let list = tlv(SEQUENCE, &request);
        let tbs = tlv(SEQUENCE, &list);
        tlv(SEQUENCE, &tbs)
    }
}

/// A response fit to staple: its bytes and validity (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staple {
    /// The DER OCSPResponse, as sent to clients.
    pub der: Vec<u8>,
    /// `thisUpdate`.
    pub this_update: u64,
    /// `nextUpdate`; `None`: the responder gives none (refreshed hourly).
    pub next_update: Option<u64>,
}

/// Checks `der` is a successful response saying `good` about `id`, and reads its validity.
pub fn parse_response(der: &[u8], id: &CertId) -> Result<Staple, Error> {
    let bad = Error::Response;
    let mut top = Der(Der(der).expect(SEQUENCE).ok_or(bad("not an OCSPResponse"))?);
    match top.expect(ENUMERATED).ok_or(bad("no responseStatus"))? {
        [0] => {}
        [1] => return Err(bad("malformedRequest")),
        [2] => return Err(bad("internalError")),
        [3] => return Err(bad("tryLater")),
        [5] => return Err(bad("sigRequired")),
        [6] => return Err(bad("unauthorized")),
        _ => return Err(bad("an unknown responseStatus")),
    }
    let mut bytes = Der(Der(top.expect(0xa0).ok_or(bad("no responseBytes"))?)
        .expect(SEQUENCE)
        .ok_or(bad("malformed responseBytes"))?);
    if bytes.expect(OID) != Some(OID_OCSP_BASIC) {
        return Err(bad("not a basic OCSP response"));
    }
    let basic = bytes.expect(OCTET_STRING).ok_or(bad("malformed responseBytes"))?;
    let malformed = || bad("malformed BasicOCSPResponse");
    let mut basic = Der(Der(basic).expect(SEQUENCE).ok_or_else(malformed)?);
    let mut data = Der(basic.expect(SEQUENCE).ok_or_else(malformed)?);
    data.optional(0xa0); // version
    match data.next() {
        Some((0xa1 | 0xa2, _, _)) => {}
        _ => return Err(malformed()),
    }
    data.expect(GENERALIZED_TIME).ok_or_else(malformed)?; // producedAt
    let mut responses = Der(data.expect(SEQUENCE).ok_or_else(malformed)?);
    let ours = id.encode();
    while let Some(single) = responses.expect(SEQUENCE) {
        let mut single = Der(single);
        let Some((SEQUENCE, _, cert_id)) = single.next() else { return Err(malformed()) };
        if cert_id != ours.as_slice() {
            continue;
        }
        let status = match single.next() {
            Some((0x80, _, _)) => None,
            Some((0xa1, _, _)) => Some("revoked"),
            Some((0x82, _, _)) => Some("unknown"),
            _ => return Err(malformed()),
        };
        let this_update = single.expect(GENERALIZED_TIME).and_then(generalized_time).ok_or_else(malformed)?;
        let next_update = match single.optional(0xa0) {
            Some(inner) => {
                Some(Der(inner).expect(GENERALIZED_TIME).and_then(generalized_time).ok_or_else(malformed)?)
            }
            None => None,
        };
        if let Some(status) = status {
            return Err(Error::Status(status));
        }
        return Ok(Staple { der: der.to_vec(), this_update, next_update });
    }
    Err(bad("it says nothing about this certificate"))
}

/// `YYYYMMDDHHMMSS[.fff]Z` to Unix seconds.
fn generalized_time(raw: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(raw).ok()?.strip_suffix('Z')?;
    let whole = text.split('.').next()?;
    if whole.len() != 14 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |r: std::ops::Range<usize>| whole[r].parse::<u64>().ok();
    let (year, month, day) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hour, minute, second) = (n(8..10)?, n(10..12)?, n(12..14)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), for years from 1970.
    let y = if month <= 2 { year.checked_sub(1)? } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

/// When to fetch again after a good response, at `now` (Unix seconds): half-way to
/// `nextUpdate`, at most five minutes before it, and within an hour.
pub fn refresh_after(staple: &Staple, now: u64) -> Duration {
    let hour = 3600;
    let wait = match staple.next_update {
        Some(next) => {
            let left = next.saturating_sub(now);
            left - (left / 2).min(300)
        }
        None => hour,
    };
    Duration::from_secs(wait.clamp(1, hour))
}

// === fetching ===

/// Sends `request` to the `http://` responder `url`; the response body.
pub async fn fetch(url: &str, request: Vec<u8>) -> Result<Vec<u8>, Error> {
    let uri: http::Uri = url.parse().map_err(|_| Error::Url(url.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(Error::Url(url.to_string()));
    }
    let host = uri.host().ok_or_else(|| Error::Url(url.to_string()))?;
    let port = uri.port_u16().unwrap_or(80);
    let fail = |why: String| Error::Fetch { url: url.to_string(), why };
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port))
            .await
            .map_err(|e| fail(format!("connecting: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| fail(format!("HTTP: {e}")))?;
        // Bounded like the exchange: a responder that never answers holds no task or socket.
        tokio::spawn(async move {
            match tokio::time::timeout(FETCH_TIMEOUT, conn).await {
                Ok(Err(error)) => tracing::debug!(%error, "OCSP responder connection ended"),
                Ok(Ok(())) => {}
                Err(_) => tracing::debug!("OCSP responder connection closed after the timeout"),
            }
        });
        let authority = uri.authority().map_or(host, |a| a.as_str());
        let request = http::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, authority)
            .header(http::header::CONTENT_TYPE, "application/ocsp-request")
            .header(http::header::ACCEPT, "application/ocsp-response")
            .body(http_body_util::Full::new(Bytes::from(request)))
            .map_err(|e| fail(format!("request: {e}")))?;
        let response = sender.send_request(request).await.map_err(|e| fail(format!("HTTP: {e}")))?;
        if !response.status().is_success() {
            return Err(fail(format!("answered {}", response.status())));
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| fail(format!("reading the response: {e}")))?;
        Ok(body.to_bytes().to_vec())
    };
    tokio::time::timeout(FETCH_TIMEOUT, exchange).await.map_err(|_| fail("no answer in time".to_string()))?
}

// === impl Stapler ===

/// Keeps a staple per certificate of the live table (see the module docs).
#[derive(Default)]
pub struct Stapler {
    shared: Arc<Shared>,
    /// Certificates watched, by the address of their [`CertifiedKey`].
    tracked: Mutex<HashMap<usize, Tracked>>,
}

#[derive(Default)]
struct Shared {
    /// Stapled copies, by the address of the certificate they staple.
    staples: ArcSwap<HashMap<usize, Arc<CertifiedKey>>>,
    /// Serializes writers of `staples`.
    write: Mutex<()>,
}

struct Tracked {
    /// Held so that its address names it alone while tracked.
    _key: Arc<CertifiedKey>,
    task: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Stapler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stapler").field("stapled", &self.shared.staples.load().len()).finish()
    }
}

fn addr(key: &Arc<CertifiedKey>) -> usize {
    Arc::as_ptr(key) as usize
}

impl Shared {
    fn set(&self, id: usize, staple: Option<Arc<CertifiedKey>>) {
        let _guard = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let mut map = HashMap::clone(&self.staples.load());
        match staple {
            Some(s) => map.insert(id, s),
            None => map.remove(&id),
        };
        self.staples.store(Arc::new(map));
    }
}

impl Stapler {
    /// The certificate to send: `key` with its staple when there is a valid one.
    pub fn staple(&self, key: Arc<CertifiedKey>) -> Arc<CertifiedKey> {
        let staples = self.shared.staples.load();
        if staples.is_empty() {
            return key;
        }
        staples.get(&addr(&key)).cloned().unwrap_or(key)
    }

    /// Watches exactly `keys` (`enabled`: stapling on), starting a fetching task for each new one
    /// and stopping those of the others. Needs a Tokio runtime when `enabled`.
    pub fn track(&self, keys: Vec<Arc<CertifiedKey>>, enabled: bool) {
        let mut tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        let keep: HashMap<usize, Arc<CertifiedKey>> =
            if enabled { keys.into_iter().map(|k| (addr(&k), k)).collect() } else { HashMap::new() };
        tracked.retain(|id, t| {
            let stays = keep.contains_key(id);
            if !stays {
                t.task.abort();
                self.shared.set(*id, None);
            }
            stays
        });
        for (id, key) in keep {
            if tracked.contains_key(&id) {
                continue;
            }
            let (cert_id, url) = match CertId::of_chain(&key.cert) {
                Ok(found) => found,
                Err(Error::NoResponder) => continue, // nothing to staple (the self-signed one too)
                Err(error) => {
                    tracing::warn!(%error, "enable-ocsp: this certificate is served without a staple");
                    continue;
                }
            };
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                tracing::error!("enable-ocsp: no runtime to fetch OCSP responses on; not stapling");
                return;
            };
            let task =
                runtime.spawn(keep_stapled(Arc::downgrade(&self.shared), id, key.clone(), cert_id, url));
            tracked.insert(id, Tracked { _key: key, task: task.abort_handle() });
        }
    }
}

impl Drop for Stapler {
    fn drop(&mut self) {
        for t in self.tracked.get_mut().unwrap_or_else(|p| p.into_inner()).values() {
            t.task.abort();
        }
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Fetches and refreshes the staple of `key` for as long as the stapler lives.
async fn keep_stapled(shared: Weak<Shared>, id: usize, key: Arc<CertifiedKey>, cert_id: CertId, url: String) {
    let request = cert_id.request();
    let mut backoff = MIN_BACKOFF;
    let mut expires: Option<u64> = None;
    loop {
        let result = match fetch(&url, request.clone()).await {
            Ok(body) => parse_response(&body, &cert_id),
            Err(error) => Err(error),
        };
        let Some(live) = shared.upgrade() else { return };
        let wait = match result {
            Ok(staple) if staple.next_update.is_some_and(|n| n <= now()) => {
                tracing::warn!(url, "OCSP response already expired (nextUpdate passed); not stapled");
                None
            }
            Ok(staple) => {
                let wait = refresh_after(&staple, now());
                tracing::debug!(url, refresh_in = ?wait, "OCSP response stapled");
                expires = staple.next_update;
                let stapled = CertifiedKey { ocsp: Some(staple.der), ..CertifiedKey::clone(&key) };
                live.set(id, Some(Arc::new(stapled)));
                backoff = MIN_BACKOFF;
                Some(wait)
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "OCSP stapling: fetching the response failed");
                None
            }
        };
        let wait = wait.unwrap_or_else(|| {
            let wait = backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            // The last good staple goes when it expires; it may outlive the retry.
            if let Some(at) = expires {
                let left = at.saturating_sub(now());
                if left == 0 {
                    live.set(id, None);
                    expires = None;
                } else if left < wait.as_secs() {
                    return Duration::from_secs(left);
                }
            }
            wait
        });
        drop(live);
        tokio::time::sleep(wait).await;
        if expires.is_some_and(|at| at <= now())
            && let Some(live) = shared.upgrade()
        {
            live.set(id, None);
            expires = None;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn generalized_times() {
        assert_eq!(generalized_time(b"19700101000000Z"), Some(0));
        // `date -u -d "2026-11-26 09:53:38" +%s`
        assert_eq!(generalized_time(b"20261126095338Z"), Some(1_795_686_818));
        assert_eq!(generalized_time(b"20000229120000.123Z"), Some(951_825_600));
        for bad in [&b"2026112609533Z"[..], b"20261126095338", b"20261326095338Z", b"2026112609533xZ", b""] {
            assert_eq!(generalized_time(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn refreshes_before_next_update_and_at_least_hourly() {
        let staple = |next| Staple { der: vec![], this_update: 1000, next_update: next };
        // A minute left: half-way.
        assert_eq!(refresh_after(&staple(Some(1060)), 1000), Duration::from_secs(30));
        // A week left: five minutes before, capped at an hour.
        assert_eq!(refresh_after(&staple(Some(1000 + 7 * 86_400)), 1000), Duration::from_secs(3600));
        // Ten minutes left: five minutes before.
        assert_eq!(refresh_after(&staple(Some(1600)), 1000), Duration::from_secs(300));
        assert_eq!(refresh_after(&staple(None), 1000), Duration::from_secs(3600));
        assert_eq!(refresh_after(&staple(Some(900)), 1000), Duration::from_secs(1), "expired: soon");
    }

    #[test]
    fn der_lengths_round_trip() {
        for len in [0usize, 1, 127, 128, 255, 256, 70_000] {
            let content = vec![7u8; len];
            let encoded = tlv(OCTET_STRING, &content);
            let mut der = Der(&encoded);
            assert_eq!(der.expect(OCTET_STRING).unwrap().len(), len);
            assert!(der.0.is_empty());
            // Truncated encodings are refused, never read past.
            for cut in 0..encoded.len().min(8) {
                assert!(Der(&encoded[..cut]).next().is_none() || cut == encoded.len());
            }
        }
    }

    #[test]
    fn a_chain_without_responder_or_issuer_is_refused() {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "ca");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["a.test".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let chain = [leaf.der().clone(), ca.der().clone()];
        assert!(matches!(CertId::of_chain(&chain), Err(Error::NoResponder)));
        assert!(matches!(CertId::of_chain(&[]), Err(Error::Certificate)));
        assert!(matches!(
            CertId::of_chain(&[CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])]),
            Err(Error::Certificate)
        ));
        // The fields are read (the leaf's issuer is the CA's subject).
        let leaf_fields = cert_fields(leaf.der()).unwrap();
        let ca_fields = cert_fields(ca.der()).unwrap();
        assert_eq!(leaf_fields.issuer, ca_fields.subject);
        assert!(leaf_fields.ocsp_url.is_none());
    }

    #[test]
    fn responses_that_are_not_a_good_answer_about_this_certificate_are_refused() {
        let id = CertId { name_hash: [1; 20], key_hash: [2; 20], serial: vec![0x12, 0x34] };
        let single = |id: &CertId, status: &[u8], next: bool| {
            let mut s = id.encode();
            s.extend_from_slice(status);
            s.extend(tlv(GENERALIZED_TIME, b"20261126095338Z"));
            if next {
                s.extend(tlv(0xa0, &tlv(GENERALIZED_TIME, b"20261126095438Z")));
            }
            tlv(SEQUENCE, &s)
        };
        let response = |status: u8, singles: Vec<u8>| {
            let mut data = tlv(0xa2, &tlv(OCTET_STRING, &[9; 20]));
            data.extend(tlv(GENERALIZED_TIME, b"20261126095338Z"));
            data.extend(tlv(SEQUENCE, &singles));
            let mut basic = tlv(SEQUENCE, &data);
            basic.extend(tlv(SEQUENCE, &[0x06, 0x01, 0x00]));
            basic.extend(tlv(BIT_STRING, &[0, 1, 2]));
            let mut bytes = tlv(OID, OID_OCSP_BASIC);
            bytes.extend(tlv(OCTET_STRING, &tlv(SEQUENCE, &basic)));
            let mut top = tlv(ENUMERATED, &[status]);
            top.extend(tlv(0xa0, &tlv(SEQUENCE, &bytes)));
            tlv(SEQUENCE, &top)
        };
        let good = response(0, single(&id, &[0x80, 0x00], true));
        let staple = parse_response(&good, &id).unwrap();
        assert_eq!((staple.this_update, staple.next_update), (1_795_686_818, Some(1_795_686_878)));
        assert_eq!(staple.der, good);
        let no_next = parse_response(&response(0, single(&id, &[0x80, 0x00], false)), &id).unwrap();
        assert_eq!(no_next.next_update, None);
        let other = CertId { serial: vec![0x99], ..id.clone() };
        let cases = [
            (response(0, single(&other, &[0x80, 0x00], true)), "nothing about this certificate"),
            (
                response(0, single(&id, &tlv(0xa1, &tlv(GENERALIZED_TIME, b"20261126095338Z")), true)),
                "revoked",
            ),
            (response(0, single(&id, &[0x82, 0x00], true)), "unknown"),
            (response(3, vec![]), "tryLater"),
            (good[..good.len() - 1].to_vec(), "not an OCSPResponse"),
            (vec![], "not an OCSPResponse"),
        ];
        for (der, want) in cases {
            let error = parse_response(&der, &id).unwrap_err().to_string();
            assert!(error.contains(want), "{want}: {error}");
        }
    }
}
