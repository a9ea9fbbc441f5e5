//! The request-path normalizer (`weir_dataplane::uri_path`), differential: `normalize` must give
//! what a plain reference gives (decode once, RFC 3986 §5.2.4 remove_dot_segments, merge
//! slashes; the same errors in the same order). Properties: no panic; the output starts with
//! `/` when the input does; and normalizing is idempotent through `encode` (the path a rewrite
//! sends upstream normalizes back to itself).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_dataplane::uri_path::{PathError, PathOptions, encode, normalize};

/// The reference: each step as the crate doc and RFC 3986 state it, with no fast path.
fn reference(raw: &str, options: PathOptions) -> Result<String, PathError> {
    let is_control = |b: u8| b < 0x20 || b == 0x7f;
    // 1. A raw control character anywhere is refused first.
    if raw.bytes().any(is_control) {
        return Err(PathError::ControlCharacter);
    }
    // 2. Percent-decode once, left to right.
    let raw = raw.as_bytes();
    let mut decoded = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'%' {
            decoded.push(raw[i]);
            i += 1;
            continue;
        }
        let digits = raw.get(i + 1..i + 3).filter(|d| d.iter().all(u8::is_ascii_hexdigit));
        let Some(digits) = digits else { return Err(PathError::BadEscape) };
        let text = std::str::from_utf8(digits).map_err(|_| PathError::BadEscape)?;
        let byte = u8::from_str_radix(text, 16).map_err(|_| PathError::BadEscape)?;
        if is_control(byte) {
            return Err(PathError::ControlCharacter);
        }
        if byte == b'/' && options.reject_encoded_slashes {
            return Err(PathError::EncodedSlash);
        }
        decoded.push(byte);
        i += 3;
    }
    // 3. Only an absolute path is resolved (`*` and the like stay as they are).
    if !decoded.starts_with(b"/") {
        return Ok(String::from_utf8_lossy(&decoded).into_owned());
    }
    // 4. Merge runs of slashes.
    if options.merge_slashes {
        decoded.dedup_by(|a, b| *a == b'/' && *b == b'/');
    }
    // 5. RFC 3986 §5.2.4 on an absolute path, with `..` above the root an error.
    let mut input: &[u8] = &decoded;
    let mut output: Vec<u8> = Vec::new();
    while !input.is_empty() {
        if input.starts_with(b"/./") {
            input = &input[2..];
        } else if input == b"/." {
            input = b"/";
        } else if input.starts_with(b"/../") || input == b"/.." {
            if output.is_empty() {
                return Err(PathError::AboveRoot);
            }
            input = if input.len() == 3 { b"/" } else { &input[3..] };
            let cut = output.iter().rposition(|&b| b == b'/').unwrap_or(0);
            output.truncate(cut);
        } else {
            // Move the first segment, with its leading `/`, to the output.
            let end = input[1..].iter().position(|&b| b == b'/').map_or(input.len(), |p| p + 1);
            output.extend_from_slice(&input[..end]);
            input = &input[end..];
        }
    }
    Ok(String::from_utf8_lossy(&output).into_owned())
}

fuzz_target!(|input: (u8, &str)| {
    let (flags, raw) = input;
    let options = PathOptions { merge_slashes: flags & 1 == 0, reject_encoded_slashes: flags & 2 != 0 };
    let got = normalize(raw, options).map(|p| p.into_owned());
    assert_eq!(got, reference(raw, options), "normalize({raw:?}, {options:?})");
    let Ok(path) = got else { return };
    if raw.starts_with('/') {
        assert!(path.starts_with('/'), "normalize({raw:?}) = {path:?}");
    }
    let sent = encode(&path);
    let again = normalize(&sent, options).map(|p| p.into_owned());
    assert_eq!(again.as_deref(), Ok(path.as_str()), "normalize(encode({path:?}) = {sent:?})");
});
