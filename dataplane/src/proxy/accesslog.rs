//! The access log: one JSON object per request, one line each, with the fields that
//! ingress-nginx's `log-format-upstream` selects.
//!
//! weir runs no nginx variables; it knows a fixed set of them ([`Var`], the access-log dialect of
//! [`crate::vars`]) and renders each field's [`Template`](crate::model::logformat::Template)
//! (text with `$variables`, parsed with the table) per request. The line is written when the
//! response head is ready, so `$request_time` is the time to the response head. Lines go
//! through a bounded queue to one writer thread (stdout by default); when the writer falls
//! behind, lines are dropped and counted rather than slowing requests down.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};

use crate::model::logformat::{Part, Var};
use crate::model::{BackendId, LogField, ObjectRef};

// === impl Format ===

/// A compiled access-log format.
#[derive(Debug)]
pub struct Format {
    fields: Vec<LogField>,
    /// Request headers some field logs, captured before the request is forwarded.
    request_headers: Vec<HeaderName>,
    remote_user: bool,
}

/// What a log line needs from the request, taken before it is forwarded.
#[derive(Debug)]
pub struct Captured {
    time: SystemTime,
    method: Method,
    uri: Uri,
    version: Version,
    host: Option<HeaderValue>,
    client: IpAddr,
    headers: Vec<Option<HeaderValue>>,
    remote_user: Option<String>,
}

/// What the proxy learnt from the upstream, for `$upstream_*`, `$namespace` and friends.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// The endpoint that answered.
    pub addr: String,
    /// Its status.
    pub status: u16,
    /// Time to its response head.
    pub elapsed: Duration,
    /// The backend it belongs to.
    pub backend: Option<BackendId>,
    /// The route's Ingress.
    pub origin: Option<ObjectRef>,
}

/// The rest of what a log line needs, known once the response head is ready.
#[derive(Debug)]
pub struct Outcome<'a> {
    /// The connection's client (the PROXY protocol address when there is one).
    pub peer: SocketAddr,
    /// The connection came over TLS.
    pub https: bool,
    /// The listener's port.
    pub listener_port: &'a HeaderValue,
    /// The request's `X-Request-ID`.
    pub request_id: &'a HeaderValue,
    /// The response status.
    pub status: StatusCode,
    /// The response headers.
    pub response_headers: &'a HeaderMap,
    /// Time from the request to the response head.
    pub elapsed: Duration,
    /// The upstream that answered, if one did.
    pub upstream: Option<&'a Upstream>,
}

impl Format {
    /// Compiles the fields of `log-format-upstream`.
    pub fn new(fields: &[LogField]) -> Format {
        let mut request_headers = Vec::new();
        let mut remote_user = false;
        for var in fields.iter().flat_map(|f| f.value.vars()) {
            match var {
                Var::RequestHeader(h) if !request_headers.contains(h) => request_headers.push(h.clone()),
                Var::RemoteUser => remote_user = true,
                _ => {}
            }
        }
        Format { fields: fields.to_vec(), request_headers, remote_user }
    }

    /// Takes what the line needs from the request; `client` is the client address.
    pub fn capture<B>(&self, req: &http::Request<B>, client: IpAddr) -> Captured {
        let headers = req.headers();
        let host = match req.uri().authority() {
            Some(auth) => HeaderValue::from_str(auth.host()).ok(),
            None => headers.get(http::header::HOST).cloned(),
        };
        Captured {
            time: SystemTime::now(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            host,
            client,
            headers: self.request_headers.iter().map(|h| headers.get(h).cloned()).collect(),
            remote_user: if self.remote_user { crate::vars::basic_user(headers) } else { None },
        }
    }

    /// The JSON line (with its newline) for a request and its outcome.
    pub fn line(&self, req: &Captured, out: &Outcome<'_>) -> String {
        let mut line = String::with_capacity(64 + 48 * self.fields.len());
        let mut value = String::new();
        line.push('{');
        for (i, field) in self.fields.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            push_json_string(&mut line, &field.key);
            line.push(':');
            value.clear();
            if field.bare {
                let known = field.value.parts().iter().all(|p| match p {
                    Part::Text(t) => {
                        value.push_str(t);
                        true
                    }
                    Part::Var(v) => self.render(v, req, out, &mut value),
                });
                if !known {
                    line.push_str("null");
                } else if is_json_number(&value) {
                    line.push_str(&value);
                } else {
                    push_json_string(&mut line, &value);
                }
                continue;
            }
            for part in field.value.parts() {
                match part {
                    Part::Text(t) => value.push_str(t),
                    // An unknown value is empty, as nginx's `escape=json` logs it.
                    Part::Var(v) => {
                        self.render(v, req, out, &mut value);
                    }
                }
            }
            push_json_string(&mut line, &value);
        }
        line.push_str("}\n");
        line
    }

    /// Appends the value of `var`; false when it has none for this request.
    fn render(&self, var: &Var, req: &Captured, out: &Outcome<'_>, to: &mut String) -> bool {
        use std::fmt::Write as _;
        let upstream = out.upstream;
        let origin = upstream.and_then(|u| u.origin.as_ref());
        let backend = upstream.and_then(|u| u.backend.as_ref());
        fn text(v: Option<&HeaderValue>) -> Option<&str> {
            v.and_then(|v| v.to_str().ok())
        }
        let path_and_query = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let written = match var {
            Var::RemoteAddr => write!(to, "{}", req.client),
            Var::Peer => write!(to, "{}", crate::model::canonical_ip(out.peer.ip())),
            Var::RemoteUser => return put(to, req.remote_user.as_deref()),
            Var::TimeIso8601 => return write_time(to, req.time, TimeStyle::Iso8601),
            Var::TimeLocal => return write_time(to, req.time, TimeStyle::Local),
            Var::Msec => return write_time(to, req.time, TimeStyle::Msec),
            Var::Request => write!(to, "{} {path_and_query} {:?}", req.method, req.version),
            Var::RequestMethod => return put(to, Some(req.method.as_str())),
            Var::RequestUri => return put(to, Some(path_and_query)),
            Var::Uri => return put(to, Some(req.uri.path())),
            Var::Args => return put(to, Some(req.uri.query().unwrap_or(""))),
            Var::ServerProtocol => write!(to, "{:?}", req.version),
            Var::Scheme => return put(to, Some(if out.https { "https" } else { "http" })),
            Var::Host => {
                let host = text(req.host.as_ref()).map(crate::http_util::normalize_host);
                return put(to, host.as_deref());
            }
            Var::ServerPort => return put(to, text(Some(out.listener_port))),
            Var::Status => write!(to, "{}", out.status.as_u16()),
            Var::RequestTime => write!(to, "{:.3}", out.elapsed.as_secs_f64()),
            Var::UpstreamAddr => return put(to, upstream.map(|u| u.addr.as_str())),
            Var::UpstreamStatus => match upstream {
                Some(u) => write!(to, "{}", u.status),
                None => return false,
            },
            Var::UpstreamResponseTime => match upstream {
                Some(u) => write!(to, "{:.3}", u.elapsed.as_secs_f64()),
                None => return false,
            },
            Var::RequestId => return put(to, text(Some(out.request_id))),
            Var::Namespace => return put(to, origin.map(|o| o.namespace.as_str())),
            Var::IngressName => return put(to, origin.map(|o| o.name.as_str())),
            Var::ServiceName => return put(to, backend.map(|b| b.service.as_str())),
            Var::ServicePort => match backend {
                Some(b) => write!(to, "{}", b.port),
                None => return false,
            },
            Var::ProxyUpstreamName => match backend {
                Some(b) => write!(to, "{}-{}-{}", b.namespace, b.service, b.port),
                None => return false,
            },
            Var::RequestHeader(name) => {
                let at = self.request_headers.iter().position(|h| h == name);
                return put(to, text(at.and_then(|i| req.headers.get(i)).and_then(Option::as_ref)));
            }
            Var::ResponseHeader(name) => return put(to, text(out.response_headers.get(name))),
            // Not in the access log's dialect: never parsed into a field.
            Var::EscapedRequestUri | Var::Cookie(_) | Var::Arg(_) => return false,
        };
        written.is_ok()
    }
}

/// Appends `value`; false when there is none.
fn put(to: &mut String, value: Option<&str>) -> bool {
    match value {
        Some(v) => {
            to.push_str(v);
            true
        }
        None => false,
    }
}

/// Whether `s` is a JSON number (so a bare variable can be written without quotes).
fn is_json_number(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = digits.split_once('.').map_or((digits, None), |(i, f)| (i, Some(f)));
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    all_digits(int) && (int == "0" || !int.starts_with('0')) && frac.is_none_or(all_digits)
}

/// Appends `s` as a JSON string.
fn push_json_string(out: &mut String, s: &str) {
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

#[derive(Clone, Copy)]
enum TimeStyle {
    Iso8601,
    Local,
    Msec,
}

/// Writes `time` (UTC) in `style`.
fn write_time(to: &mut String, time: SystemTime, style: TimeStyle) -> bool {
    use std::fmt::Write as _;
    let Ok(since) = time.duration_since(SystemTime::UNIX_EPOCH) else { return false };
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
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

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u32, u32) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

// === impl Writer ===

/// Where access-log lines go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Standard output (ingress-nginx's `access.log` is a link to it).
    #[default]
    Stdout,
    /// Appended to this file.
    File(PathBuf),
}

/// Lines queued for the writer thread before new ones are dropped.
const QUEUE: usize = 16 * 1024;

/// The writer thread's queue.
#[derive(Debug)]
pub(crate) struct Writer {
    tx: Option<SyncSender<String>>,
    dropped: AtomicU64,
}

impl Writer {
    /// Starts the writer thread for `output`.
    pub(crate) fn start(output: &Output) -> Writer {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let output = output.clone();
        let spawned =
            std::thread::Builder::new().name("weir-access-log".into()).spawn(move || run(&output, &rx));
        let tx = match spawned {
            Ok(_) => Some(tx),
            Err(error) => {
                tracing::error!(%error, "cannot start the access log writer; no access log");
                None
            }
        };
        Writer { tx, dropped: AtomicU64::new(0) }
    }

    /// Queues one line; drops it (counted, logged now and then) when the writer is behind.
    pub(crate) fn write(&self, line: String) {
        let Some(tx) = &self.tx else { return };
        if let Err(TrySendError::Full(_)) = tx.try_send(line) {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "the access log writer is behind; lines were dropped");
            }
        }
    }
}

fn run(output: &Output, rx: &Receiver<String>) {
    let sink: Box<dyn Write> = match output {
        Output::Stdout => Box::new(std::io::stdout()),
        Output::File(path) => match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Box::new(file),
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot open the access log; no access log");
                return;
            }
        },
    };
    let mut out = std::io::BufWriter::new(sink);
    let mut failing = false;
    while let Ok(line) = rx.recv() {
        let mut result = out.write_all(line.as_bytes());
        while let Ok(more) = rx.try_recv() {
            result = result.and_then(|()| out.write_all(more.as_bytes()));
        }
        result = result.and_then(|()| out.flush());
        match result {
            Err(error) if !failing => {
                tracing::error!(%error, "writing the access log failed");
                failing = true;
            }
            Err(_) => {}
            Ok(()) => failing = false,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn field(key: &str, template: &str, bare: bool) -> LogField {
        LogField { key: key.into(), value: template.parse().unwrap(), bare }
    }

    #[test]
    fn lines_are_json_with_the_selected_fields() {
        let format = Format::new(&[
            field("client", "$remote_addr", false),
            field("req", "$request", false),
            field("status", "$status", true),
            field("ua", "$http_user_agent", false),
            field("upstream", "$upstream_addr", false),
            field("upstream_status", "$upstream_status", true),
            field("user", "$remote_user", false),
            field("svc", "$proxy_upstream_name", false),
        ]);
        let req = http::Request::get("http://a.test/x?y=1")
            .header("user-agent", "t\"1")
            .header("authorization", "Basic YWxpY2U6c2VjcmV0")
            .body(())
            .unwrap();
        let captured = format.capture(&req, "203.0.113.7".parse().unwrap());
        let port = HeaderValue::from_static("80");
        let id = HeaderValue::from_static("abc");
        let headers = HeaderMap::new();
        let upstream = Upstream {
            addr: "10.0.0.1:8080".into(),
            status: 200,
            elapsed: Duration::from_millis(3),
            backend: Some("ns/web:80".parse().unwrap()),
            origin: Some(ObjectRef::new("ns", "ing")),
        };
        let mut out = Outcome {
            peer: "127.0.0.1:5000".parse().unwrap(),
            https: false,
            listener_port: &port,
            request_id: &id,
            status: StatusCode::OK,
            response_headers: &headers,
            elapsed: Duration::from_millis(5),
            upstream: Some(&upstream),
        };
        let line = format.line(&captured, &out);
        assert!(line.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["client"], "203.0.113.7");
        assert_eq!(v["req"], "GET /x?y=1 HTTP/1.1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["ua"], "t\"1");
        assert_eq!(v["upstream"], "10.0.0.1:8080");
        assert_eq!(v["upstream_status"], 200);
        assert_eq!(v["user"], "alice");
        assert_eq!(v["svc"], "ns-web-80");
        // Answered locally: upstream fields are empty, bare ones null.
        out.upstream = None;
        let v: serde_json::Value = serde_json::from_str(&format.line(&captured, &out)).unwrap();
        assert_eq!(v["upstream"], "");
        assert!(v["upstream_status"].is_null());
    }

    #[test]
    fn times_are_formatted() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut s = String::new();
        write_time(&mut s, t, TimeStyle::Iso8601);
        assert_eq!(s, "2023-11-14T22:13:20+00:00");
        s.clear();
        write_time(&mut s, t, TimeStyle::Local);
        assert_eq!(s, "14/Nov/2023:22:13:20 +0000");
        s.clear();
        write_time(&mut s, t, TimeStyle::Msec);
        assert_eq!(s, "1700000000.123");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn json_numbers_are_recognised() {
        for yes in ["0", "200", "0.005", "-1", "12.5"] {
            assert!(is_json_number(yes), "{yes}");
        }
        for no in ["", "-", "01", "1.", ".5", "1e5", "abc", "1.2.3"] {
            assert!(!is_json_number(no), "{no}");
        }
    }
}
