//! The access log's byte-level writing: integers, seconds with milliseconds, IPv4 addresses
//! and JSON escaping straight into a byte buffer, without `fmt`'s machinery, and the formatted
//! time cached per second per thread (as nginx caches its own). Each writes exactly what the
//! `fmt` form it replaces writes (`{}` of an integer or address, `{:.3}` of
//! `Duration::as_secs_f64`, [`push_json_string`]); the tests compare them.

use std::cell::RefCell;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

/// Appends `n` in decimal.
pub(crate) fn push_u64(to: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // `n % 10` is below 10: the cast loses nothing.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    to.extend_from_slice(&digits[at..]);
}

/// Durations below this many seconds are written without `fmt`: their `f64` is exact to well
/// under a nanosecond, so rounding the nanoseconds gives what `{:.3}` gives (but at a tie).
const FAST_SECS: u64 = 1 << 20;

/// Appends `took` in seconds with three decimals, as `{:.3}` writes `took.as_secs_f64()`.
pub(crate) fn push_secs3(to: &mut Vec<u8>, took: Duration) {
    let (secs, nanos) = (took.as_secs(), took.subsec_nanos());
    // An exact half millisecond rounds the way the `f64` nearest it lies: leave it to `fmt`.
    if secs >= FAST_SECS || nanos % 1_000_000 == 500_000 {
        use std::io::Write as _;
        // Writing to a `Vec` cannot fail.
        let _ = write!(to, "{:.3}", took.as_secs_f64());
        return;
    }
    let mut millis = (nanos + 500_000) / 1_000_000;
    let mut secs = secs;
    if millis == 1000 {
        secs += 1;
        millis = 0;
    }
    push_u64(to, secs);
    // `millis` is below 1000: each digit fits a `u8`.
    to.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
    ]);
}

/// Appends `ip` as `{}` writes it.
pub(crate) fn push_ip(to: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            push_u64(to, u64::from(a));
            for octet in [b, c, d] {
                to.push(b'.');
                push_u64(to, u64::from(octet));
            }
        }
        IpAddr::V6(v6) => {
            use std::io::Write as _;
            // Writing to a `Vec` cannot fail.
            let _ = write!(to, "{v6}");
        }
    }
}

/// Whether `b` is written escaped in a JSON string.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f
}

/// JSON-escapes, in place, what `to` holds from `start` on (text appended raw).
pub(crate) fn escape_tail(to: &mut Vec<u8>, start: usize) {
    let Some(first) = to.get(start..).and_then(|tail| tail.iter().position(|b| needs_escape(*b))) else {
        return;
    };
    let raw = to.split_off(start + first);
    push_escaped(to, &raw);
}

/// Appends `s` JSON-escaped (without quotes).
pub(crate) fn push_escaped(to: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut rest = s;
    while let Some(at) = rest.iter().position(|b| needs_escape(*b)) {
        to.extend_from_slice(&rest[..at]);
        let b = rest[at];
        match b {
            b'"' => to.extend_from_slice(b"\\\""),
            b'\\' => to.extend_from_slice(b"\\\\"),
            b'\n' => to.extend_from_slice(b"\\n"),
            b'\r' => to.extend_from_slice(b"\\r"),
            b'\t' => to.extend_from_slice(b"\\t"),
            _ => to.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
        }
        rest = &rest[at + 1..];
    }
    to.extend_from_slice(rest);
}

/// Whether `s` is a JSON number (so a bare variable can be written without quotes).
pub(crate) fn is_json_number(s: &[u8]) -> bool {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    let (int, frac) = match digits.iter().position(|b| *b == b'.') {
        Some(dot) => (&digits[..dot], Some(&digits[dot + 1..])),
        None => (digits, None),
    };
    let all_digits = |t: &[u8]| !t.is_empty() && t.iter().all(u8::is_ascii_digit);
    all_digits(int) && (int == b"0" || !int.starts_with(b"0")) && frac.is_none_or(all_digits)
}

// === impl TimeCache ===

/// The second last written in each style, and its text.
#[derive(Default)]
struct TimeCache {
    iso8601: Option<(u64, Vec<u8>)>,
    local: Option<(u64, Vec<u8>)>,
}

thread_local! {
    static TIMES: RefCell<TimeCache> = RefCell::new(TimeCache::default());
}

/// Appends `time` (UTC) in `style`, formatted once per second per thread; false when it is
/// before 1970.
pub(crate) fn push_time(to: &mut Vec<u8>, time: SystemTime, style: TimeStyle) -> bool {
    let Ok(since) = time.duration_since(SystemTime::UNIX_EPOCH) else { return false };
    let secs = since.as_secs();
    let cached = TIMES.try_with(|cache| {
        let mut cache = cache.try_borrow_mut().ok()?;
        let slot = match style {
            TimeStyle::Iso8601 => &mut cache.iso8601,
            TimeStyle::Local => &mut cache.local,
            TimeStyle::Msec => return None,
        };
        if let Some((second, text)) = slot.as_ref()
            && *second == secs
        {
            to.extend_from_slice(text);
            return Some(());
        }
        let mut text = String::new();
        write_time(&mut text, SystemTime::UNIX_EPOCH + Duration::from_secs(secs), style);
        to.extend_from_slice(text.as_bytes());
        *slot = Some((secs, text.into_bytes()));
        Some(())
    });
    if let Ok(Some(())) = cached {
        return true;
    }
    if let TimeStyle::Msec = style {
        push_u64(to, secs);
        let millis = since.subsec_millis();
        // `millis` is below 1000: each digit fits a `u8`.
        to.extend_from_slice(&[
            b'.',
            b'0' + (millis / 100) as u8,
            b'0' + (millis / 10 % 10) as u8,
            b'0' + (millis % 10) as u8,
        ]);
        return true;
    }
    // The thread is ending: no cache.
    let mut text = String::new();
    let known = write_time(&mut text, time, style);
    to.extend_from_slice(text.as_bytes());
    known
}

// The reference writers (and `fmt`-based fallbacks), moved here from `accesslog` so that
// it imports this module and not the other way round.

/// Appends `s` as a JSON string.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// How a time variable is written.
#[derive(Clone, Copy)]
pub(crate) enum TimeStyle {
    Iso8601,
    Local,
    Msec,
}

/// Writes `time` (UTC) in `style`.
pub(crate) fn write_time(to: &mut String, time: SystemTime, style: TimeStyle) -> bool {
    use std::fmt::Write as _;
    let Ok(since) = time.duration_since(SystemTime::UNIX_EPOCH) else { return false };
    let secs = since.as_secs();
    let (year, month, day) = super::syslog::civil_from_days(secs / 86_400);
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    match style {
        TimeStyle::Iso8601 => write!(to, "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}+00:00"),
        TimeStyle::Local => {
            let mon = MONTHS.get(month.saturating_sub(1) as usize).copied().unwrap_or("Jan");
            write!(to, "{day:02}/{mon}/{year:04}:{h:02}:{m:02}:{s:02} +0000")
        }
        TimeStyle::Msec => write!(to, "{secs}.{:03}", since.subsec_millis()),
    }
    .is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut v = Vec::new();
        f(&mut v);
        String::from_utf8(v).unwrap()
    }

    /// A small deterministic generator (xorshift), so the comparisons cover many values.
    fn values(seed: u64, n: usize) -> impl Iterator<Item = u64> {
        let mut x = seed;
        (0..n).map(move |_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
    }

    #[test]
    fn integers_are_written_as_display_writes_them() {
        let edges = [0, 1, 9, 10, 99, 100, 65_535, u64::from(u32::MAX), u64::MAX - 1, u64::MAX];
        for n in edges.into_iter().chain(values(7, 10_000)).chain(values(9, 1000).map(|v| v % 100_000)) {
            assert_eq!(text(|v| push_u64(v, n)), n.to_string());
        }
    }

    #[test]
    fn seconds_are_written_as_fmt_rounds_them() {
        let mut durations: Vec<Duration> = [
            0u64,
            1,
            499_999,
            500_000,
            500_001,
            999_499_999,
            999_500_000,
            999_500_001,
            999_999_999,
            1_000_000_000,
            1_500_000_000,
            2_000_500_000,
            3_000_499_999,
        ]
        .into_iter()
        .map(Duration::from_nanos)
        .collect();
        durations.extend([
            Duration::new(FAST_SECS - 1, 999_999_999),
            Duration::new(FAST_SECS, 0),
            Duration::new(u64::from(u32::MAX), 123_456_789),
        ]);
        durations.extend(values(3, 20_000).map(|v| Duration::from_nanos(v % 100_000_000_000)));
        durations.extend(values(5, 5000).map(|v| Duration::from_micros(v % 10_000_000)));
        durations.extend(values(11, 5000).map(|v| Duration::from_millis(v % 100_000)));
        for took in durations {
            assert_eq!(text(|v| push_secs3(v, took)), format!("{:.3}", took.as_secs_f64()), "{took:?}");
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let ips: Vec<IpAddr> =
            ["0.0.0.0", "127.0.0.1", "203.0.113.255", "255.255.255.255", "::1", "2001:db8::7"]
                .iter()
                .map(|s| s.parse().unwrap())
                .chain(values(13, 1000).map(|v| IpAddr::from((v as u32).to_be_bytes())))
                .collect();
        for ip in ips {
            assert_eq!(text(|v| push_ip(v, ip)), ip.to_string());
        }
    }

    #[test]
    fn escaping_matches_the_string_escaper() {
        let samples = [
            "",
            "plain text / with spaces",
            "quote \" backslash \\ end",
            "\n\r\t\u{0}\u{1}\u{1f}\u{7f}",
            "ünïcødé ✓ and \"q\"",
            "\\",
            "tail\u{7}",
        ];
        let every: String = (0u8..=0x7f).map(char::from).collect();
        for s in samples.iter().copied().chain([every.as_str()]) {
            let mut expected = String::new();
            super::push_json_string(&mut expected, s);
            let written = text(|v| {
                v.push(b'"');
                push_escaped(v, s.as_bytes());
                v.push(b'"');
            });
            assert_eq!(written, expected, "{s:?}");
            // In place, after text that is kept as it is.
            let in_place = text(|v| {
                v.extend_from_slice(b"{\"k\":\"");
                let start = v.len();
                v.extend_from_slice(s.as_bytes());
                escape_tail(v, start);
                v.push(b'"');
            });
            assert_eq!(in_place, format!("{{\"k\":{expected}"), "{s:?}");
        }
    }

    #[test]
    fn the_cached_time_changes_with_the_second() {
        let reference = |t: SystemTime, style| {
            let mut s = String::new();
            write_time(&mut s, t, style);
            s
        };
        // Within one second, across its end, and back (another request of an earlier second).
        let base = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
        let times = [0u64, 1, 999, 1000, 1001, 1999, 500, 2000, 86_400_000, 3_000]
            .map(|ms| base + Duration::from_millis(ms));
        for style in [TimeStyle::Iso8601, TimeStyle::Local, TimeStyle::Msec] {
            for t in times {
                let mut v = Vec::new();
                assert!(push_time(&mut v, t, style));
                assert_eq!(String::from_utf8(v).unwrap(), reference(t, style));
            }
        }
        let early = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        assert!(!push_time(&mut Vec::new(), early, TimeStyle::Iso8601));
    }
}
