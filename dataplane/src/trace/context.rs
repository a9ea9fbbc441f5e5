//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and
//! `tracestate` request headers, parsed strictly and written back.
//!
//! `traceparent` is `version-traceid-parentid-flags` in lower-case hex. Version `00` is exactly
//! 55 characters; a higher version (`01`–`fe`) is read by its first four fields when what
//! follows them is nothing or a `-` (the spec's forward compatibility); `ff`, upper-case hex,
//! an all-zero trace id or parent id, or two `traceparent` headers make it invalid, and an
//! invalid `traceparent` means no incoming trace at all (its `tracestate` is not read either).
//! Of the flags only `sampled` (bit 0) is kept: others are not passed on, as version 00 says.
//!
//! `tracestate` is a list of at most 32 `key=value` members over any number of headers; an
//! invalid member, a duplicate key or more than 32 members drop the whole header (the spec
//! allows it), the trace itself goes on.

use std::fmt;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The `traceparent` request header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The `tracestate` request header.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Most members a `tracestate` may have.
pub const TRACESTATE_MAX_MEMBERS: usize = 32;

/// A 16-byte trace id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// Why a `traceparent` or `tracestate` was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Wrong length, a missing `-`, or not lower-case hex where hex is due.
    #[error("malformed")]
    Malformed,
    /// Version `ff`, forbidden by the spec.
    #[error("version ff")]
    Version,
    /// An all-zero trace id or parent id.
    #[error("all-zero id")]
    ZeroId,
    /// More than one `traceparent` header.
    #[error("more than one traceparent header")]
    Repeated,
    /// A `tracestate` member that is not `key=value` by the spec's grammar.
    #[error("bad tracestate member")]
    Member,
    /// Two `tracestate` members with one key.
    #[error("duplicate tracestate key")]
    DuplicateKey,
    /// More than [`TRACESTATE_MAX_MEMBERS`] members.
    #[error("more than 32 tracestate members")]
    TooManyMembers,
}

/// A parsed `traceparent`: the trace, the caller's span, and whether the caller sampled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace this request belongs to.
    pub trace_id: TraceId,
    /// The caller's span: the parent of the span made for this request.
    pub parent_id: SpanId,
    /// The caller recorded its span (flag bit 0).
    pub sampled: bool,
}

/// A validated `tracestate`, its members joined by `,` without blanks; never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceState(String);

/// What a request says about the trace it is part of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// Its `traceparent`.
    pub parent: TraceParent,
    /// Its `tracestate`, when present and valid.
    pub state: Option<TraceState>,
}

// === impl TraceId, SpanId ===

impl TraceId {
    /// A random trace id (never all zeros).
    pub fn random() -> TraceId {
        loop {
            let id: u128 = rand::random();
            if id != 0 {
                return TraceId(id.to_be_bytes());
            }
        }
    }

    /// True for the invalid all-zero id.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl SpanId {
    /// A random span id (never all zeros).
    pub fn random() -> SpanId {
        loop {
            let id: u64 = rand::random();
            if id != 0 {
                return SpanId(id.to_be_bytes());
            }
        }
    }

    /// True for the invalid all-zero id.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 8]
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

// === impl TraceParent ===

/// Length of a version-00 `traceparent`.
const LEN_00: usize = 55;

impl TraceParent {
    /// Parses one `traceparent` value.
    pub fn parse(v: &[u8]) -> Result<TraceParent, Invalid> {
        if v.len() < LEN_00 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return Err(Invalid::Malformed);
        }
        let mut version = [0u8; 1];
        hex_into(&v[0..2], &mut version)?;
        match version[0] {
            0xff => return Err(Invalid::Version),
            0x00 if v.len() != LEN_00 => return Err(Invalid::Malformed),
            // A later version may append fields, after a `-`.
            _ if v.len() > LEN_00 && v[LEN_00] != b'-' => return Err(Invalid::Malformed),
            _ => {}
        }
        let mut trace_id = [0u8; 16];
        hex_into(&v[3..35], &mut trace_id)?;
        let mut parent_id = [0u8; 8];
        hex_into(&v[36..52], &mut parent_id)?;
        let mut flags = [0u8; 1];
        hex_into(&v[53..55], &mut flags)?;
        let (trace_id, parent_id) = (TraceId(trace_id), SpanId(parent_id));
        if trace_id.is_zero() || parent_id.is_zero() {
            return Err(Invalid::ZeroId);
        }
        Ok(TraceParent { trace_id, parent_id, sampled: flags[0] & 1 == 1 })
    }

    /// The version-00 `traceparent` naming `span` (this hop's span) in `trace_id`'s trace.
    pub fn header(trace_id: TraceId, span: SpanId, sampled: bool) -> HeaderValue {
        let mut buf = [0u8; LEN_00];
        buf[..3].copy_from_slice(b"00-");
        hex_write(&trace_id.0, &mut buf[3..35]);
        buf[35] = b'-';
        hex_write(&span.0, &mut buf[36..52]);
        buf[52] = b'-';
        buf[53] = b'0';
        buf[54] = if sampled { b'1' } else { b'0' };
        // Lower-case hex and dashes only: always a valid header value.
        HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// Decodes lower-case hex `src` into `out` (`src` is twice as long).
fn hex_into(src: &[u8], out: &mut [u8]) -> Result<(), Invalid> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(Invalid::Malformed),
    };
    for (byte, pair) in out.iter_mut().zip(src.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(())
}

/// Writes `src` as lower-case hex into `out` (twice as long).
fn hex_write(src: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(src) {
        pair[0] = HEX[(byte >> 4) as usize];
        pair[1] = HEX[(byte & 0xf) as usize];
    }
}

// === impl TraceState ===

impl TraceState {
    /// Parses the `tracestate` header values (several headers are one list). `Ok(None)` when
    /// the list has no member.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Result<Option<TraceState>, Invalid> {
        let mut members: Vec<&[u8]> = Vec::new();
        for value in values {
            for member in value.split(|b| *b == b',') {
                let member = trim_ows(member);
                if member.is_empty() {
                    continue;
                }
                let eq = member.iter().position(|b| *b == b'=').ok_or(Invalid::Member)?;
                let (key, value) = (&member[..eq], &member[eq + 1..]);
                if !valid_key(key) || !valid_value(value) {
                    return Err(Invalid::Member);
                }
                if members.iter().any(|m| m.get(..=key.len()) == member.get(..=key.len())) {
                    return Err(Invalid::DuplicateKey);
                }
                if members.len() == TRACESTATE_MAX_MEMBERS {
                    return Err(Invalid::TooManyMembers);
                }
                members.push(member);
            }
        }
        if members.is_empty() {
            return Ok(None);
        }
        let joined = members.join(&b","[..]);
        // Only printable ASCII passed the checks.
        Ok(Some(TraceState(String::from_utf8_lossy(&joined).into_owned())))
    }

    /// The list, members joined by `,`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `tracestate` header value.
    pub fn header(&self) -> HeaderValue {
        HeaderValue::from_str(&self.0).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// `simple-key` or `tenant-id@system-id`.
fn valid_key(key: &[u8]) -> bool {
    let rest = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/".contains(c);
    match key.iter().position(|b| *b == b'@') {
        None => {
            key.len() <= 256 && key.first().is_some_and(u8::is_ascii_lowercase) && key[1..].iter().all(rest)
        }
        Some(at) => {
            let (tenant, system) = (&key[..at], &key[at + 1..]);
            tenant.len() <= 241
                && tenant.first().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && tenant[1..].iter().all(rest)
                && system.len() <= 14
                && system.first().is_some_and(u8::is_ascii_lowercase)
                && system[1..].iter().all(rest)
        }
    }
}

/// Up to 256 printable characters other than `,` and `=`, spaces inside only.
fn valid_value(value: &[u8]) -> bool {
    let nblk = |c: &u8| (0x21..=0x7e).contains(c) && *c != b',' && *c != b'=';
    !value.is_empty()
        && value.len() <= 256
        && value.last().is_some_and(nblk)
        && value.iter().all(|c| *c == b' ' || nblk(c))
}

// === impl Incoming ===

impl Incoming {
    /// The trace context a request carries; `None` without a valid `traceparent`.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Incoming>, Invalid> {
        let mut parents = headers.get_all(TRACEPARENT).iter();
        let Some(first) = parents.next() else { return Ok(None) };
        if parents.next().is_some() {
            return Err(Invalid::Repeated);
        }
        let parent = TraceParent::parse(first.as_bytes())?;
        // A bad tracestate is dropped; the trace itself stands.
        let state =
            TraceState::parse(headers.get_all(TRACESTATE).iter().map(HeaderValue::as_bytes)).ok().flatten();
        Ok(Some(Incoming { parent, state }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_example_parses() {
        let p = TraceParent::parse(SPEC.as_bytes()).expect("valid");
        assert_eq!(p.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.parent_id.to_string(), "00f067aa0ba902b7");
        assert!(p.sampled);
        let q =
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").expect("valid");
        assert!(!q.sampled);
    }

    #[test]
    fn generation_round_trips() {
        let p = TraceParent::parse(SPEC.as_bytes()).expect("valid");
        assert_eq!(TraceParent::header(p.trace_id, p.parent_id, true), SPEC);
        for sampled in [false, true] {
            let (t, s) = (TraceId::random(), SpanId::random());
            let h = TraceParent::header(t, s, sampled);
            assert_eq!(
                TraceParent::parse(h.as_bytes()),
                Ok(TraceParent { trace_id: t, parent_id: s, sampled })
            );
        }
        assert_ne!(TraceId::random(), TraceId::random());
    }

    #[test]
    fn only_the_sampled_flag_is_read() {
        // Unknown flag bits are ignored, not an error; bit 0 alone decides.
        let p =
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe").expect("valid");
        assert!(!p.sampled);
        let p =
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03").expect("valid");
        assert!(p.sampled);
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        let cases: &[(&str, Invalid)] = &[
            ("", Invalid::Malformed),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", Invalid::Malformed),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", Invalid::Malformed),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", Invalid::Malformed),
            ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", Invalid::Malformed),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01", Invalid::Malformed),
            ("0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Invalid::Malformed),
            ("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Invalid::Malformed),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", Invalid::Malformed),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", Invalid::Malformed),
            ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Invalid::Version),
            ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", Invalid::ZeroId),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", Invalid::ZeroId),
            ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", Invalid::Malformed),
        ];
        for (v, why) in cases {
            assert_eq!(TraceParent::parse(v.as_bytes()), Err(*why), "{v:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        for v in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-brings",
        ] {
            let p = TraceParent::parse(v.as_bytes()).expect(v);
            assert_eq!(p.parent_id.to_string(), "00f067aa0ba902b7");
        }
    }

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append((*n).clone(), HeaderValue::from_str(v).expect("test value"));
        }
        h
    }

    #[test]
    fn incoming_context_from_headers() {
        assert_eq!(Incoming::from_headers(&HeaderMap::new()), Ok(None));
        let one = Incoming::from_headers(&headers(&[
            (&TRACEPARENT, SPEC),
            (&TRACESTATE, "rojo=00f067aa0ba902b7 , ,congo=t61rcWkgMzE"),
            (&TRACESTATE, "tenant@vendor=x y"),
        ]))
        .expect("valid")
        .expect("present");
        assert_eq!(
            one.state.as_ref().map(TraceState::as_str),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE,tenant@vendor=x y")
        );
        // Two traceparents: no incoming trace.
        let two = headers(&[(&TRACEPARENT, SPEC), (&TRACEPARENT, SPEC)]);
        assert_eq!(Incoming::from_headers(&two), Err(Invalid::Repeated));
        // A bad tracestate is dropped, the parent kept.
        let bad = Incoming::from_headers(&headers(&[(&TRACEPARENT, SPEC), (&TRACESTATE, "Rojo=1")]));
        assert_eq!(bad.map(|i| i.map(|i| (i.parent.sampled, i.state))), Ok(Some((true, None))));
    }

    #[test]
    fn tracestate_grammar() {
        let parse = |v: &str| TraceState::parse([v.as_bytes()]);
        assert_eq!(parse(""), Ok(None));
        assert_eq!(parse(" , "), Ok(None));
        assert!(parse("a=1").expect("valid").is_some());
        assert!(parse("a-b_c*d/e9=v v").expect("valid").is_some());
        assert!(parse("1tenant@sys=v").expect("valid").is_some());
        for bad in [
            "A=1",                 // upper-case key
            "1a=1",                // a simple key starts with a letter
            "a=",                  // empty value
            "a= ",                 // a value ends with a non-blank
            "a",                   // no '='
            "a=b=c",               // '=' in a value
            "a@=1",                // empty system id
            "a@1sys=1",            // a system id starts with a letter
            "a@abcdefghijklmno=1", // system id too long
            "a=\u{7f}",
        ] {
            assert_eq!(parse(bad), Err(Invalid::Member), "{bad:?}");
        }
        assert_eq!(parse(&format!("a={}", "v".repeat(257))), Err(Invalid::Member));
        assert_eq!(parse(&format!("{}=v", "k".repeat(257))), Err(Invalid::Member));
        assert_eq!(parse("a=1,b=2,a=3"), Err(Invalid::DuplicateKey));
        // "a" and "ab" are different keys.
        assert!(parse("a=1,ab=2").expect("valid").is_some());
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert_eq!(parse(&many.join(",")), Err(Invalid::TooManyMembers));
        assert!(parse(&many[..32].join(",")).expect("valid").is_some());
    }
}
