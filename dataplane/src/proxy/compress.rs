//! Response compression: ingress-nginx's `use-gzip` and `enable-brotli` (nginx's gzip filter
//! and the brotli module), and zstd beyond them.
//!
//! The codecs are maintained crates' (flate2 on zlib-rs, brotli, zstd); this module decides
//! which coding a response gets and streams the body through it, never holding the whole body:
//! each upstream frame is compressed as it comes, and whatever the codec holds is flushed out
//! whenever the upstream has nothing more ready (so a slow or streaming response is not held
//! back), as nginx does with unbuffered upstreams.
//!
//! Which responses, as nginx decides (`gzip_proxied any`, ingress-nginx's setting):
//! - the request is not `HEAD` and is HTTP/1.1 or later (`gzip_http_version 1.1`);
//! - the status is 200, 403 or 404;
//! - the response is not encoded already (any `Content-Encoding`), is not a range
//!   (`Content-Range`) and does not say `Cache-Control: no-transform` (RFC 9110 §7.7);
//! - its media type is `text/html` or one of the coding's types, and its `Content-Length`, when
//!   known, is at least the coding's minimum.
//!
//! Such a response gets `Vary: Accept-Encoding` whether or not this client takes a coding
//! (`gzip_vary on`). The coding is the one the client's `Accept-Encoding` weighs highest
//! (RFC 9110 §12.5.3: q-values, `*`, `x-gzip`); among equals zstd, then brotli, then gzip.
//! `gzip-disable` takes gzip (only) away from the clients it matches. A compressed response
//! loses `Content-Length` and `Accept-Ranges`, and its `ETag` is weakened (the bytes differ).

use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE,
    CONTENT_TYPE, ETAG, USER_AGENT, VARY,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};

use crate::model::compression::{Codec, Compression};

/// The largest window a codec keeps (512 KiB, ngx_brotli's default `brotli_window`): it bounds
/// the memory of one compressed response; smaller when the response's length is known.
const MAX_WINDOW_LOG: u32 = 19;
/// brotli's and zstd's smallest window.
const MIN_WINDOW_LOG: u32 = 10;

/// A content coding weir can apply, in the order of preference among equally weighted ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// `zstd` (RFC 8878).
    Zstd,
    /// `br` (RFC 7932).
    Brotli,
    /// `gzip` (RFC 1952).
    Gzip,
}

impl Coding {
    const ALL: [Coding; 3] = [Coding::Zstd, Coding::Brotli, Coding::Gzip];

    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What one request accepts: the codings to try, best first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Accepted {
    order: [Option<Coding>; 3],
}

impl Accepted {
    fn iter(self) -> impl Iterator<Item = Coding> {
        self.order.into_iter().flatten()
    }
}

/// The compiled settings.
#[derive(Debug)]
pub struct Config {
    /// By [`Coding::index`].
    codecs: [Option<CodecConfig>; 3],
    gzip_disable: Option<UserAgents>,
}

#[derive(Debug)]
struct CodecConfig {
    level: u32,
    min_length: u64,
    /// Lower case, without parameters; `None`: any type.
    types: Option<Box<[Box<str>]>>,
}

/// `gzip-disable`.
#[derive(Debug)]
enum UserAgents {
    /// nginx's `msie6` mask: `MSIE 4.` to `MSIE 6.`, except 6.0 with `SV1` (which decodes).
    Msie6,
    Pattern(regex::Regex),
}

impl UserAgents {
    /// `gzip-disable`'s value compiled: `msie6`, else a regular expression matched without
    /// regard to case (as nginx's `gzip_disable`).
    fn new(pattern: &str) -> Result<UserAgents, regex::Error> {
        if pattern == "msie6" {
            return Ok(UserAgents::Msie6);
        }
        regex::RegexBuilder::new(pattern)
            .case_insensitive(true)
            .size_limit(1 << 20)
            .build()
            .map(UserAgents::Pattern)
    }

    fn matches(&self, agent: &[u8]) -> bool {
        let Ok(agent) = std::str::from_utf8(agent) else { return false };
        match self {
            UserAgents::Msie6 => {
                let Some(at) = agent.find("MSIE ") else { return false };
                let rest = &agent.as_bytes()[at + 5..];
                matches!(rest, [b'4'..=b'6', b'.', ..]) && !agent.contains("SV1")
            }
            UserAgents::Pattern(re) => re.is_match(agent),
        }
    }
}

impl Config {
    /// Compiles the table's settings; `None` when no coding is on. An unusable `gzip-disable`
    /// pattern (translation checks it first) is logged and ignored.
    pub fn new(settings: &Compression) -> Option<Config> {
        if settings.is_off() {
            return None;
        }
        let codec = |c: &Option<Codec>| {
            c.as_ref().map(|c| CodecConfig {
                level: c.level,
                min_length: c.min_length,
                types: (!c.types.iter().any(|t| t == "*"))
                    .then(|| c.types.iter().map(|t| t.to_ascii_lowercase().into_boxed_str()).collect()),
            })
        };
        let gzip_disable = settings.gzip_disable.as_deref().and_then(|p| match UserAgents::new(p) {
            Ok(agents) => Some(agents),
            Err(error) => {
                tracing::warn!(pattern = p, %error, "gzip-disable unusable; ignored");
                None
            }
        });
        Some(Config {
            codecs: [codec(&settings.zstd), codec(&settings.brotli), codec(&settings.gzip)],
            gzip_disable,
        })
    }

    /// What a request accepts; `None`: its response is left alone whatever it is (`HEAD`,
    /// HTTP/1.0).
    pub(crate) fn accepted(
        &self,
        method: &Method,
        version: Version,
        headers: &HeaderMap,
    ) -> Option<Accepted> {
        if method == Method::HEAD || version < Version::HTTP_11 {
            return None;
        }
        let weights = weights(headers);
        let gzip_disabled = || {
            let agent = headers.get(USER_AGENT).map_or(&b""[..], HeaderValue::as_bytes);
            self.gzip_disable.as_ref().is_some_and(|d| d.matches(agent))
        };
        // No allocation: at most three codings.
        let mut offered = [(0u16, Coding::Gzip); 3];
        let mut n = 0;
        for coding in Coding::ALL {
            let q = weights[coding.index()];
            if q > 0 && self.codecs[coding.index()].is_some() && !(coding == Coding::Gzip && gzip_disabled())
            {
                offered[n] = (q, coding);
                n += 1;
            }
        }
        // Stable: equal weights keep the order of preference.
        offered[..n].sort_by_key(|&(q, _)| std::cmp::Reverse(q));
        let mut accepted = Accepted::default();
        for (slot, &(_, coding)) in accepted.order.iter_mut().zip(&offered[..n]) {
            *slot = Some(coding);
        }
        Some(accepted)
    }

    /// Decides how the response to a request that `accepted` goes: `None` leaves it alone;
    /// otherwise its headers are rewritten for the coding and the returned encoder must
    /// compress its body ([`Encoded::encode`]).
    pub(crate) fn respond(
        &self,
        accepted: Accepted,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) -> Option<Box<Encoding>> {
        if !matches!(status, StatusCode::OK | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND)
            || headers.get(CONTENT_ENCODING).is_some_and(|v| !v.as_bytes().trim_ascii().is_empty())
            || headers.contains_key(CONTENT_RANGE)
            || headers.get_all(CACHE_CONTROL).iter().any(no_transform)
        {
            return None;
        }
        let media = headers.get(CONTENT_TYPE).map(media_type).unwrap_or_default();
        let length = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        let eligible = |coding: Coding| {
            self.codecs[coding.index()].as_ref().filter(|c| {
                let typed = media.eq_ignore_ascii_case("text/html")
                    || c.types
                        .as_ref()
                        .is_none_or(|types| types.iter().any(|t| t.eq_ignore_ascii_case(&media)));
                typed && length.is_none_or(|len| len >= c.min_length)
            })
        };
        if !Coding::ALL.into_iter().any(|c| eligible(c).is_some()) {
            return None;
        }
        add_vary(headers);
        let (coding, codec) = accepted.iter().find_map(|c| eligible(c).map(|codec| (c, codec)))?;
        let encoding = match Encoding::new(coding, codec.level, length) {
            Ok(encoding) => encoding,
            Err(error) => {
                tracing::warn!(coding = coding.token(), %error, "compressor unavailable; response sent as it is");
                return None;
            }
        };
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
        headers.remove(CONTENT_LENGTH);
        headers.remove(ACCEPT_RANGES);
        if let Some(etag) = headers.get(ETAG)
            && !etag.as_bytes().starts_with(b"W/")
            && let Ok(weak) = HeaderValue::from_bytes(&[b"W/", etag.as_bytes()].concat())
        {
            headers.insert(ETAG, weak);
        }
        Some(Box::new(encoding))
    }
}

/// Checks a `gzip-disable` value as the proxy will compile it.
pub fn check_gzip_disable(pattern: &str) -> Result<(), String> {
    UserAgents::new(pattern).map(|_| ()).map_err(|e| e.to_string())
}

/// The weight (in thousandths) of each coding in a request's `Accept-Encoding`, by
/// [`Coding::index`]; `0`: not acceptable.
fn weights(headers: &HeaderMap) -> [u16; 3] {
    let mut explicit: [Option<u16>; 3] = [None; 3];
    let mut star = None;
    for value in headers.get_all(ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for element in value.split(',') {
            let mut parts = element.split(';');
            let coding = parts.next().unwrap_or_default().trim();
            let mut q = Some(1000);
            for param in parts {
                if let Some((name, v)) = param.split_once('=')
                    && name.trim().eq_ignore_ascii_case("q")
                {
                    q = qvalue(v.trim());
                }
            }
            // An element with a malformed weight is ignored (RFC 9110 §12.4.2's grammar).
            let Some(q) = q else { continue };
            let slot = if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                &mut explicit[Coding::Gzip.index()]
            } else if coding.eq_ignore_ascii_case("br") {
                &mut explicit[Coding::Brotli.index()]
            } else if coding.eq_ignore_ascii_case("zstd") {
                &mut explicit[Coding::Zstd.index()]
            } else if coding == "*" {
                &mut star
            } else {
                continue;
            };
            *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
        }
    }
    explicit.map(|q| q.or(star).unwrap_or(0))
}

/// An RFC 9110 `qvalue` in thousandths: `0`, `1`, `0.5`, `0.125`, `1.000`.
fn qvalue(s: &str) -> Option<u16> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths =
        frac.bytes().chain(std::iter::repeat(b'0')).take(3).fold(0u16, |n, b| n * 10 + u16::from(b - b'0'));
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

fn no_transform(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|v| v.split(',').any(|d| d.trim().eq_ignore_ascii_case("no-transform")))
}

/// The media type of a `Content-Type`, without parameters.
fn media_type(value: &HeaderValue) -> String {
    let v = value.to_str().unwrap_or_default();
    v.split(';').next().unwrap_or_default().trim().to_owned()
}

/// Adds `Accept-Encoding` to `Vary` unless it is there (or `Vary: *`).
fn add_vary(headers: &mut HeaderMap) {
    let present = headers.get_all(VARY).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').map(str::trim).any(|f| f == "*" || f.eq_ignore_ascii_case("accept-encoding"))
        })
    });
    if !present {
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// The window for a response of `length` bytes (`None`: unknown), as a power of two.
fn window_log(length: Option<u64>) -> u32 {
    match length {
        Some(len) => {
            (u64::BITS - len.saturating_sub(1).leading_zeros()).clamp(MIN_WINDOW_LOG, MAX_WINDOW_LOG)
        }
        None => MAX_WINDOW_LOG,
    }
}

/// The zlib-rs level for `gzip-level`: its level 1 is zlib-ng's `deflate_quick`, whose output
/// is about 25 % larger than zlib's (nginx's) level 1; its level 2 is what zlib's level 1 is
/// (`deflate_fast`): about the same size, in less time. So `gzip-level: 1`, ingress-nginx's
/// default, gets level 2 (bench/RESULTS.md, "Response compression").
fn gzip_level(level: u32) -> u32 {
    level.clamp(2, 9)
}

/// One response's compressor.
pub(crate) struct Encoding {
    /// `None` once finished.
    codec: Option<Codec_>,
    /// Input written since the last flush.
    dirty: bool,
    /// The upstream's trailers, sent after the last compressed bytes.
    trailers: Option<HeaderMap>,
}

#[allow(clippy::large_enum_variant)]
enum Codec_ {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoding {
    fn new(coding: Coding, level: u32, length: Option<u64>) -> io::Result<Encoding> {
        let window = window_log(length);
        let codec = match coding {
            Coding::Gzip => Codec_::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(gzip_level(level)),
            )),
            Coding::Brotli => Codec_::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                level.min(11),
                window,
            ))),
            Coding::Zstd => {
                let level = i32::try_from(level).unwrap_or(3).clamp(1, 19);
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), level)?;
                encoder.window_log(window)?;
                Codec_::Zstd(encoder)
            }
        };
        Ok(Encoding { codec: Some(codec), dirty: false, trailers: None })
    }
}

impl Codec_ {
    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Codec_::Gzip(e) => e.write_all(data),
            Codec_::Brotli(e) => e.write_all(data),
            Codec_::Zstd(e) => e.write_all(data),
        }
    }

    /// Makes everything written so far decodable by the client.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Codec_::Gzip(e) => e.flush(),
            Codec_::Brotli(e) => e.flush(),
            Codec_::Zstd(e) => e.flush(),
        }
    }

    /// The compressed bytes produced so far.
    fn take(&mut self) -> Bytes {
        let out = match self {
            Codec_::Gzip(e) => e.get_mut(),
            Codec_::Brotli(e) => e.get_mut(),
            Codec_::Zstd(e) => e.get_mut(),
        };
        Bytes::from(std::mem::take(out))
    }

    /// Ends the stream; the last compressed bytes.
    fn finish(self) -> io::Result<Bytes> {
        let out = match self {
            Codec_::Gzip(e) => e.finish()?,
            Codec_::Brotli(e) => e.into_inner(),
            Codec_::Zstd(e) => e.finish()?,
        };
        Ok(Bytes::from(out))
    }
}

/// A response body, compressed when [`Encoded::encode`] gave it an encoder.
pub struct Encoded<B> {
    inner: B,
    encoding: Option<Box<Encoding>>,
}

impl<B> Encoded<B> {
    /// `inner` as it is.
    pub fn plain(inner: B) -> Self {
        Encoded { inner, encoding: None }
    }

    /// Compresses the body with `encoding` from now on.
    pub(crate) fn encode(&mut self, encoding: Box<Encoding>) {
        self.encoding = Some(encoding);
    }
}

impl<B> Body for Encoded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: From<io::Error>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let Some(enc) = this.encoding.as_deref_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        loop {
            let Some(codec) = enc.codec.as_mut() else {
                // Finished: the trailers, if any, then the end.
                return Poll::Ready(enc.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            let ended = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => {
                        if let Err(error) = codec.write(&data) {
                            return Poll::Ready(Some(Err(error.into())));
                        }
                        enc.dirty = true;
                        let out = codec.take();
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                        false
                    }
                    Err(frame) => {
                        enc.trailers = frame.into_trailers().ok();
                        true
                    }
                },
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(None) => true,
                Poll::Pending => {
                    // Nothing more ready upstream: what the codec holds goes out now.
                    if enc.dirty {
                        enc.dirty = false;
                        if let Err(error) = codec.flush() {
                            return Poll::Ready(Some(Err(error.into())));
                        }
                        let out = codec.take();
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    return Poll::Pending;
                }
            };
            if ended && let Some(codec) = enc.codec.take() {
                match codec.finish() {
                    Ok(out) if !out.is_empty() => return Poll::Ready(Some(Ok(Frame::data(out)))),
                    Ok(_) => {}
                    Err(error) => return Poll::Ready(Some(Err(error.into()))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.encoding {
            None => self.inner.is_end_stream(),
            Some(enc) => enc.codec.is_none() && enc.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.encoding {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Read;

    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    fn codec(level: u32, min_length: u64) -> Option<Codec> {
        Some(Codec { level, min_length, types: vec!["text/plain".into(), "application/json".into()] })
    }

    fn all_on() -> Config {
        Config::new(&Compression {
            gzip: codec(1, 256),
            brotli: codec(4, 20),
            zstd: codec(1, 20),
            gzip_disable: Some("msie6".into()),
        })
        .unwrap()
    }

    fn accept(config: &Config, value: &str) -> Vec<Coding> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_str(value).unwrap());
        config.accepted(&Method::GET, Version::HTTP_11, &headers).unwrap().iter().collect()
    }

    #[test]
    fn accept_encoding_weights_and_preference() {
        let c = all_on();
        assert_eq!(accept(&c, "gzip, deflate, br, zstd"), [Coding::Zstd, Coding::Brotli, Coding::Gzip]);
        assert_eq!(accept(&c, "gzip;q=1.0, br;q=0.5"), [Coding::Gzip, Coding::Brotli]);
        assert_eq!(accept(&c, "br;q=0, *"), [Coding::Zstd, Coding::Gzip], "`*` covers the unnamed");
        assert_eq!(accept(&c, "x-gzip"), [Coding::Gzip]);
        assert_eq!(accept(&c, "identity"), []);
        assert_eq!(
            accept(&c, "gzip;q=2, br;q=0.x, zstd;q=0.001"),
            [Coding::Zstd],
            "malformed weights ignored"
        );
        let gzip_only = Config::new(&Compression { gzip: codec(1, 0), ..Compression::default() }).unwrap();
        assert_eq!(accept(&gzip_only, "br, zstd, gzip;q=0.1"), [Coding::Gzip], "only codings that are on");
        assert_eq!(Config::new(&Compression::default()).map(|_| ()), None);
    }

    #[test]
    fn head_http10_and_gzip_disable() {
        let c = all_on();
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip, br"));
        assert_eq!(c.accepted(&Method::HEAD, Version::HTTP_11, &headers), None);
        assert_eq!(c.accepted(&Method::GET, Version::HTTP_10, &headers), None);
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0)"),
        );
        let got: Vec<_> = c.accepted(&Method::GET, Version::HTTP_11, &headers).unwrap().iter().collect();
        assert_eq!(got, [Coding::Brotli], "msie6 loses gzip only");
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1)"),
        );
        let got: Vec<_> = c.accepted(&Method::GET, Version::HTTP_11, &headers).unwrap().iter().collect();
        assert_eq!(got, [Coding::Brotli, Coding::Gzip], "SV1 decodes gzip");
    }

    fn respond(
        c: &Config,
        accepted: &str,
        status: u16,
        headers: &[(&str, &str)],
    ) -> (Option<Coding>, HeaderMap) {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(http::HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        let mut req = HeaderMap::new();
        req.insert(ACCEPT_ENCODING, HeaderValue::from_str(accepted).unwrap());
        let acc = c.accepted(&Method::GET, Version::HTTP_11, &req).unwrap();
        let enc = c.respond(acc, StatusCode::from_u16(status).unwrap(), &mut h);
        let coding = enc.map(|_| match h.get(CONTENT_ENCODING).unwrap().to_str().unwrap() {
            "gzip" => Coding::Gzip,
            "br" => Coding::Brotli,
            _ => Coding::Zstd,
        });
        (coding, h)
    }

    #[test]
    fn which_responses() {
        let c = all_on();
        let text = ("content-type", "text/plain; charset=utf-8");
        let (got, h) = respond(
            &c,
            "gzip",
            200,
            &[text, ("content-length", "1000"), ("etag", "\"v1\""), ("accept-ranges", "bytes")],
        );
        assert_eq!(got, Some(Coding::Gzip));
        assert_eq!(h.get(ETAG).unwrap(), "W/\"v1\"");
        assert!(!h.contains_key(CONTENT_LENGTH) && !h.contains_key(ACCEPT_RANGES));
        assert_eq!(h.get(VARY).unwrap(), "Accept-Encoding");
        // text/html always; other types only when listed.
        assert_eq!(respond(&c, "gzip", 200, &[("content-type", "TEXT/HTML")]).0, Some(Coding::Gzip));
        let (got, h) = respond(&c, "gzip", 200, &[("content-type", "image/png")]);
        assert_eq!((got, h.contains_key(VARY)), (None, false), "not eligible: no Vary");
        // Too short for gzip (256) but long enough for brotli (20); unknown length is compressed.
        assert_eq!(respond(&c, "gzip, br", 200, &[text, ("content-length", "100")]).0, Some(Coding::Brotli));
        let (got, h) = respond(&c, "gzip", 200, &[text, ("content-length", "100")]);
        assert_eq!(got, None);
        assert_eq!(h.get(VARY).unwrap(), "Accept-Encoding", "eligible for brotli: caches must vary");
        assert_eq!(respond(&c, "gzip", 200, &[text]).0, Some(Coding::Gzip));
        // Statuses, existing codings, ranges, no-transform.
        assert_eq!(respond(&c, "gzip", 404, &[text]).0, Some(Coding::Gzip));
        assert_eq!(respond(&c, "gzip", 500, &[text]).0, None);
        assert_eq!(respond(&c, "gzip", 206, &[text, ("content-range", "bytes 0-9/100")]).0, None);
        assert_eq!(respond(&c, "gzip", 200, &[text, ("content-encoding", "br")]).0, None);
        assert_eq!(respond(&c, "gzip", 200, &[text, ("cache-control", "public, No-Transform")]).0, None);
        // Vary kept, extended, not doubled.
        let (_, h) = respond(&c, "gzip", 200, &[text, ("vary", "Origin")]);
        assert_eq!(h.get_all(VARY).iter().collect::<Vec<_>>(), ["Origin", "Accept-Encoding"]);
        let (_, h) = respond(&c, "gzip", 200, &[text, ("vary", "accept-encoding")]);
        assert_eq!(h.get_all(VARY).iter().count(), 1);
        // A client that takes none still gets Vary.
        let (got, h) = respond(&c, "identity", 200, &[text]);
        assert_eq!((got, h.contains_key(VARY)), (None, true));
    }

    #[test]
    fn window_sizes() {
        assert_eq!(window_log(Some(0)), MIN_WINDOW_LOG);
        assert_eq!(window_log(Some(1 << 12)), 12);
        assert_eq!(window_log(Some((1 << 12) + 1)), 13);
        assert_eq!(window_log(Some(1 << 40)), MAX_WINDOW_LOG);
        assert_eq!(window_log(None), MAX_WINDOW_LOG);
    }

    fn decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match coding {
            Coding::Gzip => flate2::read::GzDecoder::new(data).read_to_end(&mut out).unwrap(),
            Coding::Brotli => brotli::Decompressor::new(data, 4096).read_to_end(&mut out).unwrap(),
            Coding::Zstd => zstd::stream::read::Decoder::new(data).unwrap().read_to_end(&mut out).unwrap(),
        };
        out
    }

    #[tokio::test]
    async fn streams_each_coding_and_keeps_trailers() {
        let text: Vec<u8> =
            (0..20_000).flat_map(|i| format!("line {i} of a compressible body\n").into_bytes()).collect();
        for coding in Coding::ALL {
            let chunks: Vec<Result<Frame<Bytes>, BoxError>> = text
                .chunks(7_000)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .chain([Ok(Frame::trailers(HeaderMap::from_iter([(
                    http::HeaderName::from_static("grpc-status"),
                    HeaderValue::from_static("0"),
                )])))])
                .collect();
            let mut body = Encoded::plain(StreamBody::new(futures_util::stream::iter(chunks)));
            body.encode(Box::new(Encoding::new(coding, 4, None).unwrap()));
            let collected = body.collect().await.unwrap();
            let trailers = collected.trailers().cloned();
            let bytes = collected.to_bytes();
            assert!(bytes.len() < text.len() / 4, "{coding:?}: {} of {}", bytes.len(), text.len());
            assert_eq!(decode(coding, &bytes), text, "{coding:?} round trip");
            assert_eq!(trailers.unwrap().get("grpc-status").unwrap(), "0");
        }
    }

    #[tokio::test]
    async fn a_streaming_response_is_flushed_when_the_upstream_pauses() {
        for coding in Coding::ALL {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
            let stream = tokio_stream_like(rx);
            let mut body = Encoded::plain(StreamBody::new(stream));
            body.encode(Box::new(Encoding::new(coding, 4, None).unwrap()));
            tx.send(Ok(Frame::data(Bytes::from_static(b"data: first event\n\n")))).await.unwrap();
            // The upstream says nothing more: what was compressed so far must reach the client
            // and decode to the whole event, before the body ends.
            let mut got = Vec::new();
            while partial_decode(coding, &got) != b"data: first event\n\n" {
                let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{coding:?}: the event was held back while the upstream paused")
                    });
                got.extend_from_slice(&frame.unwrap().unwrap().into_data().unwrap());
            }
            drop(tx);
        }
    }

    /// What a client can decode of an unfinished stream.
    fn partial_decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut reader: Box<dyn Read + '_> = match coding {
            Coding::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
            Coding::Brotli => Box::new(brotli::Decompressor::new(data, 4096)),
            Coding::Zstd => Box::new(zstd::stream::read::Decoder::new(data).unwrap()),
        };
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    /// A receiver as a stream (tokio-stream is a dev-dependency, but its wrappers need a
    /// feature; this is all the test needs).
    fn tokio_stream_like<T: Send + 'static>(
        rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) }))
    }

    #[tokio::test]
    async fn plain_bodies_pass_untouched() {
        let body = Encoded::plain(
            Full::new(Bytes::from_static(b"as it is")).map_err(|e| -> BoxError { match e {} }),
        );
        assert_eq!(body.size_hint().exact(), Some(8));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "as it is");
    }
}
