//! The request path as routes and policies see it: percent-decoded, dot segments resolved,
//! repeated slashes merged — nginx's `ngx_http_parse_complex_uri` with `merge_slashes on`.
//!
//! Routing on the raw path lets `//admin`, `/%61dmin` or `/x/../admin` slip past a rule for
//! `/admin` (an allow-list, auth, a rate limit) while the backend, which cleans the path, serves
//! `/admin`: the bug class of Istio's CVE-2021-31920. So the router, the route policies and
//! `rewrite-target` read the normalized path; the upstream still gets the request target as the
//! client sent it (nginx's `proxy_pass` without a URI), unless a rewrite applies.
//!
//! What is refused with 400, as nginx does: an invalid escape (`%zz`, `%4`, a lone `%`), a
//! decoded NUL, and a `..` that climbs above the root (`/..`, `/%2e%2e/admin`). Stricter than
//! nginx: every other control character (`%01`–`%1f`, `%7f`) is refused too, where nginx passes
//! them on. `%2F` is decoded to `/` like nginx, unless [`PathOptions::reject_encoded_slashes`]
//! refuses it. A backslash and `;` are ordinary bytes, as in nginx on Unix. Bytes that do not
//! form UTF-8 after decoding are matched as U+FFFD.

use std::borrow::Cow;

/// How paths are normalized (the ConfigMap's `merge-slashes` and `encoded-slashes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathOptions {
    /// Runs of `/` count as one (`//admin` is `/admin`). nginx's default, on.
    pub merge_slashes: bool,
    /// `%2F` (an encoded `/`) is refused with 400 instead of decoded.
    pub reject_encoded_slashes: bool,
}

impl Default for PathOptions {
    fn default() -> Self {
        PathOptions { merge_slashes: true, reject_encoded_slashes: false }
    }
}

/// Why a request path is refused (each answered with 400).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%` not followed by two hex digits.
    #[error("invalid percent-escape in the request path")]
    BadEscape,
    /// A NUL or other control character, raw or escaped.
    #[error("control character in the request path")]
    ControlCharacter,
    /// A `..` segment above the root.
    #[error("the request path climbs above the root")]
    AboveRoot,
    /// `%2F` while encoded slashes are refused.
    #[error("encoded slash in the request path")]
    EncodedSlash,
}

/// The path routes and policies see for the raw request path `raw` (no query). Borrows `raw`
/// when it needs no change: no `%`, no repeated slash (when merging), no dot segment; that is
/// one scan and no allocation for ordinary requests.
pub fn normalize(raw: &str, options: PathOptions) -> Result<Cow<'_, str>, PathError> {
    if is_clean(raw.as_bytes(), options.merge_slashes)? {
        return Ok(Cow::Borrowed(raw));
    }
    let decoded = decode(raw.as_bytes(), options.reject_encoded_slashes)?;
    let resolved = resolve(&decoded, options.merge_slashes)?;
    Ok(Cow::Owned(match String::from_utf8(resolved) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }))
}

/// True when `raw` is its own normalized form; errors on raw control characters.
fn is_clean(raw: &[u8], merge_slashes: bool) -> Result<bool, PathError> {
    let mut clean = true;
    let mut prev = 0u8;
    for (i, &b) in raw.iter().enumerate() {
        match b {
            0..=0x1f | 0x7f => return Err(PathError::ControlCharacter),
            b'%' => clean = false,
            b'/' if prev == b'/' && merge_slashes => clean = false,
            // A segment that starts with `.`: `.` or `..` (or an ordinary `.well-known`).
            b'.' if prev == b'/' || i == 0 => clean = false,
            _ => {}
        }
        prev = b;
    }
    Ok(clean)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes once (`%252e` is `%2e`, a literal, not a dot).
fn decode(raw: &[u8], reject_encoded_slashes: bool) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) =
            (raw.get(i + 1).copied().and_then(hex), raw.get(i + 2).copied().and_then(hex))
        else {
            return Err(PathError::BadEscape);
        };
        let c = hi << 4 | lo;
        match c {
            0..=0x1f | 0x7f => return Err(PathError::ControlCharacter),
            b'/' if reject_encoded_slashes => return Err(PathError::EncodedSlash),
            _ => out.push(c),
        }
        i += 3;
    }
    Ok(out)
}

/// Resolves `.` and `..` segments and, with `merge_slashes`, empty ones (RFC 3986 §5.2.4 on an
/// absolute path). A path that does not start with `/` (`*` of `OPTIONS *`) is left as it is.
fn resolve(path: &[u8], merge_slashes: bool) -> Result<Vec<u8>, PathError> {
    let Some(rest) = path.strip_prefix(b"/") else { return Ok(path.to_vec()) };
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    let mut pieces = rest.split(|&b| b == b'/').peekable();
    while let Some(segment) = pieces.next() {
        let last = pieces.peek().is_none();
        trailing_slash = false;
        match segment {
            b"." => trailing_slash = true,
            b".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = true;
            }
            b"" if last => trailing_slash = true,
            b"" if merge_slashes => {}
            _ => segments.push(segment),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for segment in &segments {
        out.push(b'/');
        out.extend_from_slice(segment);
    }
    if trailing_slash || segments.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// Percent-encodes what a path sent upstream cannot carry as it is: a normalized (decoded) path
/// after `rewrite-target`, as nginx escapes a rewritten `$uri` (`%` itself, `?`, `#`, space,
/// controls, quotes, and bytes outside ASCII).
pub fn encode(path: &str) -> Cow<'_, str> {
    let needs = |b: u8| {
        matches!(b, 0..=0x20 | 0x7f..=0xff | b'"' | b'#' | b'%' | b'<' | b'>' | b'?' | b'\\' | b'^' | b'`')
            || matches!(b, b'{' | b'|' | b'}')
    };
    if !path.bytes().any(needs) {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len() + 8);
    for b in path.bytes() {
        if needs(b) {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(b & 15)]));
        } else {
            out.push(char::from(b));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(raw: &str) -> Result<String, PathError> {
        normalize(raw, PathOptions::default()).map(Cow::into_owned)
    }

    /// Every answer here was read off nginx 1.22.1 (`merge_slashes on`), except the control
    /// characters other than NUL, which nginx passes and weir refuses.
    #[test]
    fn normalizes_like_nginx() {
        let cases: &[(&str, Result<&str, PathError>)] = &[
            ("/admin", Ok("/admin")),
            ("//admin", Ok("/admin")),
            ("///admin//x", Ok("/admin/x")),
            ("/%61dmin", Ok("/admin")),
            ("/%61DMIN", Ok("/aDMIN")),
            ("/adm%69n", Ok("/admin")),
            ("/./admin", Ok("/admin")),
            ("/x/../admin", Ok("/admin")),
            ("/x/%2e%2e/admin", Ok("/admin")),
            ("/x/.%2E/admin", Ok("/admin")),
            ("/x/..%2fadmin", Ok("/admin")),
            ("/x%2f..%2fadmin", Ok("/admin")),
            ("/admin%2fx", Ok("/admin/x")),
            ("/admin%2Fx", Ok("/admin/x")),
            ("/admin/.", Ok("/admin/")),
            ("/admin/..", Ok("/")),
            ("/%252e%252e/admin", Ok("/%2e%2e/admin")),
            ("/\\admin", Ok("/\\admin")),
            ("/admin;x", Ok("/admin;x")),
            ("/admin%20", Ok("/admin ")),
            ("/", Ok("/")),
            ("/a/", Ok("/a/")),
            ("/a//", Ok("/a/")),
            ("/.well-known/x", Ok("/.well-known/x")),
            ("/a/.b/..c/", Ok("/a/.b/..c/")),
            ("*", Ok("*")),
            ("/%2e%2e/admin", Err(PathError::AboveRoot)),
            ("/%2E%2e/admin", Err(PathError::AboveRoot)),
            ("/.%2e/admin", Err(PathError::AboveRoot)),
            ("/..", Err(PathError::AboveRoot)),
            ("/a/../../admin", Err(PathError::AboveRoot)),
            ("/admin%00", Err(PathError::ControlCharacter)),
            ("/admin%0a", Err(PathError::ControlCharacter)),
            ("/admin%7F", Err(PathError::ControlCharacter)),
            ("/admin\u{1}", Err(PathError::ControlCharacter)),
            ("/%zz", Err(PathError::BadEscape)),
            ("/%4", Err(PathError::BadEscape)),
            ("/admin%", Err(PathError::BadEscape)),
        ];
        for (raw, want) in cases {
            assert_eq!(n(raw).as_deref().map_err(|e| *e), *want, "{raw}");
        }
    }

    #[test]
    fn clean_paths_are_borrowed() {
        for raw in ["/", "/admin", "/a/b/c.html", "/a.b/c", "/api/v1/", "/\\x"] {
            assert!(matches!(normalize(raw, PathOptions::default()), Ok(Cow::Borrowed(_))), "{raw}");
        }
    }

    #[test]
    fn options() {
        let keep = PathOptions { merge_slashes: false, reject_encoded_slashes: false };
        assert_eq!(normalize("//admin", keep).unwrap(), "//admin");
        assert_eq!(normalize("/a//../b", keep).unwrap(), "/a/b");
        assert_eq!(normalize("/a/%2e/b", keep).unwrap(), "/a/b");
        let strict = PathOptions { merge_slashes: true, reject_encoded_slashes: true };
        assert_eq!(normalize("/admin%2fx", strict), Err(PathError::EncodedSlash));
        assert_eq!(normalize("/admin%2Fx", strict), Err(PathError::EncodedSlash));
        assert_eq!(normalize("/admin/x", strict).unwrap(), "/admin/x");
    }

    #[test]
    fn invalid_utf8_is_matched_as_replacement() {
        assert_eq!(n("/admin%ff").unwrap(), "/admin\u{fffd}");
        assert_eq!(n("/caf%C3%A9").unwrap(), "/café");
    }

    #[test]
    fn encode_round_trips_what_decode_made() {
        for raw in ["/a%20b", "/x%3Fy", "/caf%C3%A9", "/p%25q", "/h%23"] {
            let decoded = n(raw).unwrap();
            assert_eq!(encode(&decoded), raw, "{raw}");
        }
        assert!(matches!(encode("/plain/path-1.2_~x"), Cow::Borrowed(_)));
    }
}
