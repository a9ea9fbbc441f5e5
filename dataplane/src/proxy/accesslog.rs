//! The access log: one JSON object per request, one line each, with ingress-nginx's default
//! fields or those its `log-format-upstream` selects.
//!
//! weir runs no nginx variables; it knows a fixed set of them ([`Var`], the access-log dialect of
//! [`crate::vars`]) and renders each field's [`Template`](crate::model::logformat::Template)
//! (text with `$variables`, parsed with the table) per request. What a line needs is taken in
//! two steps: from the request before it is forwarded ([`Captured`]), and from the response
//! head ([`Entry`]); the line is rendered when the response's last byte has gone out or the
//! client went away (the response body's end hook, [`super::metered`], which the metrics share),
//! so `$request_time` and `$bytes_sent` cover the whole response and `$request_end` says how it
//! ended. A line is rendered as bytes into a per-thread buffer (the template compiled once per
//! table into segments, [`super::accesslog_render`]) and appended to a bounded queue that one
//! writer thread empties a batch at a time ([`super::accesslog_batch`]; stdout by default); when
//! the writer falls behind, lines are dropped and counted rather than slowing requests down.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};

use super::accesslog_batch::{Queue, Tuning, write_batch};
use super::accesslog_render as render;
use crate::model::logformat::{Part, Template, Var};
use crate::model::{BackendId, LogField, ObjectRef};

// === impl Format ===

/// A compiled access-log format, with the settings that choose which requests are logged.
#[derive(Debug)]
pub struct Format {
    fields: Vec<LogField>,
    /// The fields compiled for rendering.
    compiled: Vec<Field>,
    /// Request headers some field logs, captured before the request is forwarded.
    request_headers: Vec<HeaderName>,
    /// Response headers some field logs, taken from the response head.
    response_headers: Vec<HeaderName>,
    remote_user: bool,
    /// Request targets never logged (`skip-access-log-urls`, matched as `$request_uri`).
    skip: Vec<String>,
    /// Requests no route took are logged too (`enable-access-log-for-default-backend`).
    default_backend: bool,
    /// auth-url subrequests get a line of their own (`enable-auth-access-log`).
    auth_subrequests: bool,
}

/// A field compiled for rendering.
#[derive(Debug)]
struct Field {
    /// `"key":` (`,"key":` but for the first).
    key: Vec<u8>,
    /// A number when its value is one, else a string, `null` when a variable has no value.
    bare: bool,
    segments: Vec<Segment>,
}

/// A piece of a field's value.
#[derive(Debug)]
enum Segment {
    /// Text as written.
    Text(Box<str>),
    /// A request header, by its index in [`Format::request_headers`].
    RequestHeader(usize),
    /// A response header, by its index in [`Format::response_headers`].
    ResponseHeader(usize),
    /// Any other variable.
    Var(Var),
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
    /// Time to connect to the endpoint that answered (TCP and TLS); zero on a reused connection.
    pub connect: Duration,
    /// `$upstream_connect_time` of the endpoints tried before it (`-` where no connection was
    /// made), comma-separated; empty when it was the first.
    pub earlier_connect: String,
}

/// The TLS parameters of an HTTPS connection, for `$ssl_protocol` and `$ssl_cipher`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ssl {
    /// `TLSv1.2` or `TLSv1.3`.
    pub protocol: &'static str,
    /// The cipher suite, by its OpenSSL name.
    pub cipher: &'static str,
}

impl Ssl {
    /// The parameters of an established TLS connection.
    pub fn of(conn: &rustls::ServerConnection) -> Option<Ssl> {
        let protocol = match conn.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
            _ => return None,
        };
        let suite = conn.negotiated_cipher_suite()?.suite().as_str()?;
        Some(Ssl { protocol, cipher: crate::tls::ciphers::openssl_name(suite).unwrap_or(suite) })
    }
}

/// What a log line needs from the response head.
#[derive(Debug)]
pub struct Outcome<'a> {
    /// The connection's client (the PROXY protocol address when there is one).
    pub peer: SocketAddr,
    /// The connection came over TLS.
    pub https: bool,
    /// Its TLS parameters.
    pub ssl: Option<Ssl>,
    /// The listener's port.
    pub listener_port: &'a HeaderValue,
    /// The request's `X-Request-ID`.
    pub request_id: &'a HeaderValue,
    /// The response status.
    pub status: StatusCode,
    /// The response headers.
    pub response_headers: &'a HeaderMap,
    /// The upstream that answered, if one did.
    pub upstream: Option<Upstream>,
}

/// How a response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Its last byte went out.
    Complete,
    /// The client went away (or stopped reading) before it.
    ClientGone,
    /// The upstream's body failed part way.
    UpstreamError,
    /// The line of an auth-url subrequest (`enable-auth-access-log`), not of the request itself.
    AuthSubrequest,
}

impl Ending {
    /// `$request_end`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Complete => "complete",
            Ending::ClientGone => "client_gone",
            Ending::UpstreamError => "upstream_error",
            Ending::AuthSubrequest => "auth_subrequest",
        }
    }
}

/// What is known when the response has ended.
#[derive(Clone, Copy, Debug)]
pub struct End {
    /// From the request to the response's end.
    pub elapsed: Duration,
    /// The response head as HTTP/1.1 frames it.
    pub head_bytes: u64,
    /// The response body bytes sent.
    pub body_bytes: u64,
    /// The request head as HTTP/1.1 frames it, and its declared body.
    pub request_length: u64,
    /// How it ended.
    pub how: Ending,
}

/// One request's line, waiting for the end of its response.
#[derive(Debug)]
pub struct Entry {
    format: Arc<Format>,
    captured: Captured,
    peer: SocketAddr,
    https: bool,
    ssl: Option<Ssl>,
    listener_port: HeaderValue,
    request_id: HeaderValue,
    status: StatusCode,
    response_headers: Vec<Option<HeaderValue>>,
    upstream: Option<Upstream>,
}

impl Entry {
    /// Whether requests no route took are logged.
    pub fn logs_default_backend(&self) -> bool {
        self.format.default_backend
    }

    /// The JSON line (with its newline).
    pub fn line(&self, end: &End) -> String {
        self.format.line(self, end)
    }

    /// Renders the line, in this thread's buffer, and queues it on `log`.
    pub fn write(&self, end: &End, log: &Writer) {
        thread_local! {
            static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let write = |line: &mut Vec<u8>| {
            line.clear();
            self.format.render_line(self, end, line);
            log.write_bytes(line);
            // A very long line's buffer is not kept.
            if line.capacity() > 64 * 1024 {
                *line = Vec::new();
            }
        };
        let done = LINE.try_with(|line| line.try_borrow_mut().map(|mut line| write(&mut line)).is_ok());
        if done != Ok(true) {
            write(&mut Vec::new());
        }
    }
}

/// ingress-nginx's default `log-format-upstream` fields, as JSON keys named after their
/// variables, with weir's `$namespace`, `$ingress_name`, `$service_name` and `$request_end`.
const DEFAULT_FIELDS: &[(&str, &str, bool)] = &[
    ("time", "$time_iso8601", false),
    ("remote_addr", "$remote_addr", false),
    ("remote_user", "$remote_user", false),
    ("request", "$request", false),
    ("status", "$status", true),
    ("body_bytes_sent", "$body_bytes_sent", true),
    ("bytes_sent", "$bytes_sent", true),
    ("http_referer", "$http_referer", false),
    ("http_user_agent", "$http_user_agent", false),
    ("request_length", "$request_length", true),
    ("request_time", "$request_time", true),
    ("host", "$host", false),
    ("proxy_upstream_name", "$proxy_upstream_name", false),
    ("upstream_addr", "$upstream_addr", false),
    ("upstream_response_time", "$upstream_response_time", true),
    ("upstream_status", "$upstream_status", true),
    ("req_id", "$req_id", false),
    ("namespace", "$namespace", false),
    ("ingress_name", "$ingress_name", false),
    ("service_name", "$service_name", false),
    ("service_port", "$service_port", true),
    ("request_end", "$request_end", false),
];

impl Format {
    /// Compiles the fields of `log-format-upstream`.
    pub fn new(fields: &[LogField]) -> Format {
        let mut request_headers = Vec::new();
        let mut response_headers = Vec::new();
        let mut remote_user = false;
        for var in fields.iter().flat_map(|f| f.value.vars()) {
            match var {
                Var::RequestHeader(h) if !request_headers.contains(h) => request_headers.push(h.clone()),
                Var::ResponseHeader(h) if !response_headers.contains(h) => response_headers.push(h.clone()),
                Var::RemoteUser => remote_user = true,
                _ => {}
            }
        }
        let compiled = fields
            .iter()
            .enumerate()
            .map(|(i, field)| {
                let mut key = Vec::new();
                if i > 0 {
                    key.push(b',');
                }
                key.push(b'"');
                render::push_escaped(&mut key, field.key.as_bytes());
                key.extend_from_slice(b"\":");
                let index = |headers: &[HeaderName], h: &HeaderName| headers.iter().position(|x| x == h);
                let segments = field
                    .value
                    .parts()
                    .iter()
                    .map(|part| match part {
                        Part::Text(t) => Segment::Text(t.as_str().into()),
                        Part::Var(Var::RequestHeader(h)) => index(&request_headers, h)
                            .map_or(Segment::Var(Var::RequestHeader(h.clone())), Segment::RequestHeader),
                        Part::Var(Var::ResponseHeader(h)) => index(&response_headers, h)
                            .map_or(Segment::Var(Var::ResponseHeader(h.clone())), Segment::ResponseHeader),
                        Part::Var(v) => Segment::Var(v.clone()),
                    })
                    .collect();
                Field { key, bare: field.bare, segments }
            })
            .collect();
        Format {
            fields: fields.to_vec(),
            compiled,
            request_headers,
            response_headers,
            remote_user,
            skip: Vec::new(),
            default_backend: false,
            auth_subrequests: false,
        }
    }

    /// The default fields (ingress-nginx's default format, as JSON).
    pub fn default_fields() -> Vec<LogField> {
        DEFAULT_FIELDS
            .iter()
            .filter_map(|(key, template, bare)| {
                let value = template.parse::<Template>().ok()?;
                Some(LogField { key: (*key).to_string(), value, bare: *bare })
            })
            .collect()
    }

    /// Never logs requests whose target is one of `urls` (`skip-access-log-urls`).
    pub fn skipping(mut self, urls: &[String]) -> Format {
        self.skip = urls.to_vec();
        self
    }

    /// Logs requests no route took (`enable-access-log-for-default-backend`).
    pub fn with_default_backend(mut self, on: bool) -> Format {
        self.default_backend = on;
        self
    }

    /// Logs auth-url subrequests, a line each (`enable-auth-access-log`).
    pub fn with_auth_subrequests(mut self, on: bool) -> Format {
        self.auth_subrequests = on;
        self
    }

    /// Whether auth-url subrequests are logged.
    pub fn logs_auth_subrequests(&self) -> bool {
        self.auth_subrequests
    }

    /// Takes what the line needs from the request; `client` is the client address. `None` when
    /// the request is not logged (`skip-access-log-urls`).
    pub fn capture<B>(&self, req: &http::Request<B>, client: IpAddr) -> Option<Captured> {
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        if self.skip.iter().any(|url| url == target) {
            return None;
        }
        let headers = req.headers();
        let host = match req.uri().authority() {
            Some(auth) => HeaderValue::from_str(auth.host()).ok(),
            None => headers.get(http::header::HOST).cloned(),
        };
        Some(Captured {
            time: SystemTime::now(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            host,
            client,
            headers: self.request_headers.iter().map(|h| headers.get(h).cloned()).collect(),
            remote_user: if self.remote_user { crate::vars::basic_user(headers) } else { None },
        })
    }

    /// The line's entry, once the response head is known.
    pub fn entry(self: &Arc<Self>, captured: Captured, out: Outcome<'_>) -> Box<Entry> {
        Box::new(Entry {
            format: self.clone(),
            captured,
            peer: out.peer,
            https: out.https,
            ssl: out.ssl,
            listener_port: out.listener_port.clone(),
            request_id: out.request_id.clone(),
            status: out.status,
            response_headers: self
                .response_headers
                .iter()
                .map(|h| out.response_headers.get(h).cloned())
                .collect(),
            upstream: out.upstream,
        })
    }

    /// The JSON line (with its newline) of a request that ended.
    fn line(&self, entry: &Entry, end: &End) -> String {
        let mut line = Vec::with_capacity(64 + 48 * self.fields.len());
        self.render_line(entry, end, &mut line);
        // Every piece is UTF-8 text (strings, or bytes `str`s were checked to be).
        String::from_utf8(line).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Appends the JSON line (with its newline) of a request that ended.
    fn render_line(&self, entry: &Entry, end: &End, line: &mut Vec<u8>) {
        line.push(b'{');
        for field in &self.compiled {
            line.extend_from_slice(&field.key);
            if field.bare {
                let start = line.len();
                let known = field.segments.iter().all(|s| self.render(s, entry, end, line));
                if !known {
                    line.truncate(start);
                    line.extend_from_slice(b"null");
                } else if !render::is_json_number(&line[start..]) {
                    let value = line.split_off(start);
                    line.push(b'"');
                    render::push_escaped(line, &value);
                    line.push(b'"');
                }
                continue;
            }
            line.push(b'"');
            let start = line.len();
            for segment in &field.segments {
                // An unknown value is empty, as nginx's `escape=json` logs it.
                self.render(segment, entry, end, line);
            }
            render::escape_tail(line, start);
            line.push(b'"');
        }
        line.extend_from_slice(b"}\n");
    }

    /// Appends the raw value of `segment`; false when it has none for this request.
    fn render(&self, segment: &Segment, out: &Entry, end: &End, to: &mut Vec<u8>) -> bool {
        let req = &out.captured;
        let upstream = out.upstream.as_ref();
        let origin = upstream.and_then(|u| u.origin.as_ref());
        let backend = upstream.and_then(|u| u.backend.as_ref());
        fn text(v: Option<&HeaderValue>) -> Option<&[u8]> {
            // As `to_str`: visible ASCII only, else no value.
            v.and_then(|v| v.to_str().ok()).map(str::as_bytes)
        }
        fn put(to: &mut Vec<u8>, value: Option<&[u8]>) -> bool {
            match value {
                Some(v) => {
                    to.extend_from_slice(v);
                    true
                }
                None => false,
            }
        }
        let var = match segment {
            Segment::Text(t) => {
                to.extend_from_slice(t.as_bytes());
                return true;
            }
            Segment::RequestHeader(at) => {
                return put(to, text(req.headers.get(*at).and_then(Option::as_ref)));
            }
            Segment::ResponseHeader(at) => {
                return put(to, text(out.response_headers.get(*at).and_then(Option::as_ref)));
            }
            Segment::Var(var) => var,
        };
        let path_and_query = || req.uri.path_and_query().map_or("/", |pq| pq.as_str()).as_bytes();
        match var {
            Var::RemoteAddr => render::push_ip(to, req.client),
            Var::Peer => render::push_ip(to, crate::model::canonical_ip(out.peer.ip())),
            Var::RemoteUser => return put(to, req.remote_user.as_deref().map(str::as_bytes)),
            Var::TimeIso8601 => return render::push_time(to, req.time, TimeStyle::Iso8601),
            Var::TimeLocal => return render::push_time(to, req.time, TimeStyle::Local),
            Var::Msec => return render::push_time(to, req.time, TimeStyle::Msec),
            Var::Request => {
                to.extend_from_slice(req.method.as_str().as_bytes());
                to.push(b' ');
                to.extend_from_slice(path_and_query());
                to.push(b' ');
                push_version(to, req.version);
            }
            Var::RequestMethod => to.extend_from_slice(req.method.as_str().as_bytes()),
            Var::RequestUri => to.extend_from_slice(path_and_query()),
            Var::Uri => to.extend_from_slice(req.uri.path().as_bytes()),
            Var::Args => to.extend_from_slice(req.uri.query().unwrap_or("").as_bytes()),
            Var::ServerProtocol => push_version(to, req.version),
            Var::Scheme => to.extend_from_slice(if out.https { b"https" } else { b"http" }),
            Var::Host => {
                let host =
                    req.host.as_ref().and_then(|v| v.to_str().ok()).map(crate::http_util::normalize_host);
                return put(to, host.as_deref().map(str::as_bytes));
            }
            Var::ServerPort => return put(to, text(Some(&out.listener_port))),
            Var::Status => render::push_u64(to, u64::from(out.status.as_u16())),
            Var::RequestTime => render::push_secs3(to, end.elapsed),
            Var::BytesSent => render::push_u64(to, end.head_bytes + end.body_bytes),
            Var::BodyBytesSent => render::push_u64(to, end.body_bytes),
            Var::RequestLength => render::push_u64(to, end.request_length),
            Var::SslProtocol => return put(to, out.ssl.map(|s| s.protocol.as_bytes())),
            Var::SslCipher => return put(to, out.ssl.map(|s| s.cipher.as_bytes())),
            Var::RequestCompletion => {
                to.extend_from_slice(if end.how == Ending::Complete { b"OK" } else { b"" });
            }
            Var::RequestEnd => to.extend_from_slice(end.how.as_str().as_bytes()),
            Var::UpstreamAddr => return put(to, upstream.map(|u| u.addr.as_bytes())),
            Var::UpstreamStatus => match upstream {
                Some(u) => render::push_u64(to, u64::from(u.status)),
                None => return false,
            },
            Var::UpstreamResponseTime => match upstream {
                Some(u) => render::push_secs3(to, u.elapsed),
                None => return false,
            },
            Var::UpstreamConnectTime => match upstream {
                Some(u) => {
                    if !u.earlier_connect.is_empty() {
                        to.extend_from_slice(u.earlier_connect.as_bytes());
                        to.extend_from_slice(b", ");
                    }
                    render::push_secs3(to, u.connect);
                }
                None => return false,
            },
            Var::RequestId => return put(to, text(Some(&out.request_id))),
            Var::Namespace => return put(to, origin.map(|o| o.namespace.as_bytes())),
            Var::IngressName => return put(to, origin.map(|o| o.name.as_bytes())),
            Var::ServiceName => return put(to, backend.map(|b| b.service.as_bytes())),
            Var::ServicePort => match backend {
                Some(b) => push_port(to, &b.port),
                None => return false,
            },
            Var::ProxyUpstreamName => match backend {
                Some(b) => {
                    to.extend_from_slice(b.namespace.as_bytes());
                    to.push(b'-');
                    to.extend_from_slice(b.service.as_bytes());
                    to.push(b'-');
                    push_port(to, &b.port);
                }
                None => return false,
            },
            // Compiled into their own segments.
            Var::RequestHeader(_) | Var::ResponseHeader(_) => return false,
            // Not in the access log's dialect: never parsed into a field.
            Var::EscapedRequestUri
            | Var::Cookie(_)
            | Var::Arg(_)
            | Var::RemotePort
            | Var::Protocol
            | Var::BytesReceived
            | Var::SessionTime => return false,
        }
        true
    }
}

/// Appends `version` as `{:?}` writes it.
fn push_version(to: &mut Vec<u8>, version: Version) {
    let text: &[u8] = match version {
        Version::HTTP_09 => b"HTTP/0.9",
        Version::HTTP_10 => b"HTTP/1.0",
        Version::HTTP_11 => b"HTTP/1.1",
        Version::HTTP_2 => b"HTTP/2.0",
        Version::HTTP_3 => b"HTTP/3.0",
        other => {
            use std::io::Write as _;
            // Writing to a `Vec` cannot fail.
            let _ = write!(to, "{other:?}");
            return;
        }
    };
    to.extend_from_slice(text);
}

/// Appends a Service port as `{}` writes it.
fn push_port(to: &mut Vec<u8>, port: &crate::model::ServicePort) {
    match port {
        crate::model::ServicePort::Number(n) => render::push_u64(to, u64::from(*n)),
        crate::model::ServicePort::Name(name) => to.extend_from_slice(name.as_bytes()),
    }
}

/// Whether `s` is a JSON number (so a bare variable can be written without quotes).
pub(crate) fn is_json_number(s: &str) -> bool {
    render::is_json_number(s.as_bytes())
}

pub(crate) use super::accesslog_render::{TimeStyle, push_json_string, write_time};

// === impl Writer ===

/// Where access-log lines go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Nowhere: no access log (`--access-log off`).
    #[default]
    Off,
    /// Standard output (ingress-nginx's `access.log` is a link to it).
    Stdout,
    /// Appended to this file, reopened on [`Writer::reopen`] (`SIGUSR1`), as log rotators expect.
    File(PathBuf),
    /// Sent to a syslog server over UDP, one RFC 5424 message a line (`enable-syslog`).
    Syslog {
        /// Its host name or address.
        host: String,
        /// Its port.
        port: u16,
    },
}

impl std::str::FromStr for Output {
    type Err = String;

    /// `off`, `stdout` (or `/dev/stdout`), or an absolute file path.
    fn from_str(s: &str) -> Result<Output, String> {
        match s {
            "off" => Ok(Output::Off),
            "stdout" | "/dev/stdout" => Ok(Output::Stdout),
            path if path.starts_with('/') && !path.contains('\0') => Ok(Output::File(PathBuf::from(path))),
            other => Err(format!("expected off, stdout or an absolute file path, not {other:?}")),
        }
    }
}

/// Lines queued for the writer thread before new ones are dropped, by default.
pub const QUEUE: usize = 16 * 1024;

/// What the writer thread and the proxy share.
#[derive(Debug, Default)]
struct Shared {
    output: Mutex<Output>,
    /// Bumped to make the thread (re)open the output before its next line.
    generation: AtomicU64,
}

/// The access log's queue and its writer thread (started with the first line).
#[derive(Debug)]
pub struct Writer {
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    /// Whether the writer thread runs.
    started: OnceLock<bool>,
    dropped: Arc<AtomicU64>,
}

impl Writer {
    /// A writer to `output` queueing at most `queue` lines.
    pub fn new(output: &Output, queue: usize) -> Writer {
        Writer::tuned(output, Tuning::new(queue))
    }

    /// A writer to `output` batching as `tuning` says.
    pub(crate) fn tuned(output: &Output, tuning: Tuning) -> Writer {
        let shared = Arc::new(Shared { output: Mutex::new(output.clone()), generation: AtomicU64::new(0) });
        let dropped = Arc::new(AtomicU64::new(0));
        Writer {
            shared,
            queue: Arc::new(Queue::new(tuning, dropped.clone())),
            started: OnceLock::new(),
            dropped,
        }
    }

    /// Lines dropped so far: the queue was full, or the output could not be opened or written.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Makes the writer reopen its file before the next line (after a log rotation).
    pub fn reopen(&self) {
        self.shared.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends the following lines to `output` (the table's `access-log-path`, or the flag).
    pub fn retarget(&self, output: &Output) {
        let mut current = self.shared.output.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *current != *output {
            *current = output.clone();
            drop(current);
            self.reopen();
        }
    }

    /// Queues one line; drops it (counted, logged now and then) when the writer is behind.
    pub fn write(&self, line: String) {
        self.write_bytes(line.as_bytes());
    }

    /// Queues one line (UTF-8, with its newline); drops it (counted, logged now and then) when
    /// the writer is behind.
    pub fn write_bytes(&self, line: &[u8]) {
        if !*self.started.get_or_init(|| self.start()) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.queue.push(line);
    }

    fn start(&self) -> bool {
        let shared = self.shared.clone();
        let queue = self.queue.clone();
        let spawned =
            std::thread::Builder::new().name("weir-access-log".into()).spawn(move || run(&shared, &queue));
        match spawned {
            Ok(_) => true,
            Err(error) => {
                tracing::error!(%error, "cannot start the access log writer; no access log");
                false
            }
        }
    }
}

impl Drop for Writer {
    /// The writer thread writes what is queued, then ends.
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// Opens `output` for appending; `None` when there is nothing to write to.
fn open(output: &Output) -> Option<Box<dyn Write>> {
    match output {
        Output::Off => None,
        Output::Stdout => Some(Box::new(std::io::stdout())),
        Output::Syslog { host, port } => match super::syslog::Sender::connect(host, *port, "access") {
            Ok(sender) => Some(Box::new(sender)),
            Err(error) => {
                tracing::error!(host, port, %error, "cannot reach the syslog server; access-log lines are dropped until it is reopened (SIGUSR1) or changed");
                None
            }
        },
        Output::File(path) => match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Some(Box::new(file)),
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot open the access log; its lines are dropped until it is reopened (SIGUSR1) or changed");
                None
            }
        },
    }
}

/// The writer thread: writes what is queued, a batch at a time, reopening the output when asked.
fn run(shared: &Shared, queue: &Queue) {
    let mut generation = u64::MAX;
    let mut out: Option<Box<dyn Write>> = None;
    let mut failing = false;
    queue.run(&mut |batch: Option<&[u8]>| {
        let now = shared.generation.load(Ordering::Relaxed);
        if now != generation {
            generation = now;
            if let Some(mut old) = out.take() {
                let _ = old.flush();
            }
            let output = shared.output.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
            out = open(&output);
        }
        let Some(batch) = batch else { return Ok(()) };
        // No output: the batch is dropped (its opening was logged).
        let sink = out.as_mut().ok_or_else(|| std::io::Error::other("no output"))?;
        let written = write_batch(sink.as_mut(), batch);
        match &written {
            Err(error) if !failing => {
                tracing::error!(%error, "writing the access log failed");
                failing = true;
            }
            Err(_) => {}
            Ok(()) => failing = false,
        }
        written
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn field(key: &str, template: &str, bare: bool) -> LogField {
        LogField { key: key.into(), value: template.parse().unwrap(), bare }
    }

    fn end(how: Ending) -> End {
        End {
            elapsed: Duration::from_millis(1500),
            head_bytes: 100,
            body_bytes: 1000,
            request_length: 80,
            how,
        }
    }

    /// An upstream of `ns/web:80` (Ingress `ns/ing`) tried second, after an endpoint it could not
    /// connect to.
    fn sample_upstream(addr: &str, status: u16) -> Upstream {
        Upstream {
            addr: addr.into(),
            status,
            elapsed: Duration::from_millis(3),
            backend: Some("ns/web:80".parse().unwrap()),
            origin: Some(ObjectRef::new("ns", "ing")),
            connect: Duration::from_micros(2400),
            earlier_connect: "-".into(),
        }
    }

    /// What both rendering tests share: a request with a user agent and Basic credentials (user
    /// `alice`), and the outcome's borrowed parts (listener port, request ID `abc`, a
    /// `text/plain` response).
    struct Fixture {
        port: HeaderValue,
        id: HeaderValue,
        headers: HeaderMap,
    }

    impl Fixture {
        fn new(port: &'static str) -> Fixture {
            let mut headers = HeaderMap::new();
            headers.insert("content-type", HeaderValue::from_static("text/plain"));
            Fixture { port: HeaderValue::from_static(port), id: HeaderValue::from_static("abc"), headers }
        }

        fn request(uri: &str, version: Version, user_agent: &str) -> http::Request<()> {
            http::Request::get(uri)
                .version(version)
                .header("user-agent", user_agent)
                .header("authorization", "Basic YWxpY2U6c2VjcmV0")
                .body(())
                .unwrap()
        }

        /// A 200 answered to `peer`, through `upstream` (or locally), over TLS `ssl` (or not).
        fn outcome(
            &self,
            peer: &str,
            https: bool,
            upstream: Option<Upstream>,
            ssl: Option<Ssl>,
        ) -> Outcome<'_> {
            Outcome {
                peer: peer.parse().unwrap(),
                https,
                ssl,
                listener_port: &self.port,
                request_id: &self.id,
                status: StatusCode::OK,
                response_headers: &self.headers,
                upstream,
            }
        }
    }

    #[test]
    fn lines_are_json_with_the_selected_fields() {
        let format = Arc::new(Format::new(&[
            field("client", "$remote_addr", false),
            field("req", "$request", false),
            field("status", "$status", true),
            field("ua", "$http_user_agent", false),
            field("upstream", "$upstream_addr", false),
            field("upstream_status", "$upstream_status", true),
            field("user", "$remote_user", false),
            field("svc", "$proxy_upstream_name", false),
            field("sent", "$bytes_sent", true),
            field("body", "$body_bytes_sent", true),
            field("len", "$request_length", true),
            field("took", "$request_time", true),
            field("ok", "$request_completion", false),
            field("end", "$request_end", false),
            field("tls", "$ssl_protocol/$ssl_cipher", false),
            field("ct", "$sent_http_content_type", false),
            field("connect", "$upstream_connect_time", true),
        ]));
        let req = Fixture::request("http://a.test/x?y=1", Version::HTTP_11, "t\"1");
        let fixture = Fixture::new("80");
        let upstream = sample_upstream("10.0.0.1:8080", 200);
        let out = |upstream: Option<Upstream>, ssl| fixture.outcome("127.0.0.1:5000", false, upstream, ssl);
        let captured = format.capture(&req, "203.0.113.7".parse().unwrap()).unwrap();
        let ssl = Ssl { protocol: "TLSv1.3", cipher: "TLS_AES_128_GCM_SHA256" };
        let entry = format.entry(captured, out(Some(upstream), Some(ssl)));
        let line = entry.line(&end(Ending::Complete));
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
        assert_eq!(
            (v["sent"].as_u64(), v["body"].as_u64(), v["len"].as_u64()),
            (Some(1100), Some(1000), Some(80))
        );
        assert_eq!(v["took"].as_f64(), Some(1.5));
        assert_eq!((v["ok"].as_str(), v["end"].as_str()), (Some("OK"), Some("complete")));
        assert_eq!(v["tls"], "TLSv1.3/TLS_AES_128_GCM_SHA256");
        assert_eq!(v["ct"], "text/plain");
        assert_eq!(v["connect"], "-, 0.002", "per endpoint tried, as $upstream_addr");
        // Answered locally over plain HTTP, and the client went away: upstream fields are empty,
        // bare ones null.
        let captured = format.capture(&req, "203.0.113.7".parse().unwrap()).unwrap();
        let entry = format.entry(captured, out(None, None));
        let v: serde_json::Value = serde_json::from_str(&entry.line(&end(Ending::ClientGone))).unwrap();
        assert_eq!(v["upstream"], "");
        assert!(v["upstream_status"].is_null());
        assert!(v["connect"].is_null());
        assert_eq!((v["ok"].as_str(), v["end"].as_str()), (Some(""), Some("client_gone")));
        assert_eq!(v["tls"], "/");
    }

    #[test]
    fn every_variable_is_written_byte_for_byte_as_before() {
        // The expected text is what the `fmt`-based renderer wrote (weir before e6fa9ad's
        // successor): the byte renderer must not change one byte of it.
        let format = Arc::new(Format::new(&[
            field("t", "$time_local", false),
            field("ms", "$msec", true),
            field("k\"ey", "a $ b $request", false),
            field("ua", "$http_user_agent", false),
            field("ct", "$sent_http_content_type", false),
            field("rt", "$request_time", true),
            field("urt", "$upstream_response_time", true),
            field("conn", "$upstream_connect_time", true),
            field("pun", "$proxy_upstream_name", false),
            field("sp", "$service_port", true),
            field("port", "$server_port", true),
            field("peer", "$realip_remote_addr", false),
            field("client", "$remote_addr", false),
            field("host", "$host", false),
            field("proto", "$server_protocol $scheme", false),
            field("bytes", "$bytes_sent/$body_bytes_sent", true),
            field("len", "$request_length", true),
            field("ustatus", "$upstream_status", true),
            field("iso", "${time_iso8601}Z", false),
            field("args", "$args|$uri|$request_uri|$request_method", false),
            field("ssl", "$ssl_protocol $ssl_cipher", false),
            field("done", "$request_completion$request_end", false),
            field("ns", "$namespace/$ingress_name/$service_name", false),
            field("rid", "$req_id", false),
            field("user", "$remote_user", false),
            field("upaddr", "$upstream_addr", false),
            field("nl", "line\nbreak\u{1}$status", false),
            field("st", "$status", true),
        ]));
        let req = Fixture::request("http://A.Test:8080/x?y=1&z=%22", Version::HTTP_2, "q\"b\\s\tt");
        let fixture = Fixture::new("8443");
        let upstream = sample_upstream("10.0.0.1:8080, 10.0.0.2:8080", 502);
        let out =
            |upstream: Option<Upstream>, ssl| fixture.outcome("[::ffff:127.0.0.1]:5000", true, upstream, ssl);
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut captured = format.capture(&req, "2001:db8::1".parse().unwrap()).unwrap();
        captured.time = at;
        let ssl = Ssl { protocol: "TLSv1.3", cipher: "TLS_AES_128_GCM_SHA256" };
        let entry = format.entry(captured, out(Some(upstream), Some(ssl)));
        let expected = concat!(
            r#"{"t":"14/Nov/2023:22:13:20 +0000","ms":1700000000.123,"k\"ey":"a $ b GET /x?y=1&z=%22 HTTP/2.0","#,
            r#""ua":"q\"b\\s\tt","ct":"text/plain","rt":1.500,"urt":0.003,"conn":"-, 0.002","#,
            r#""pun":"ns-web-80","sp":80,"port":8443,"peer":"127.0.0.1","client":"2001:db8::1","host":"a.test","#,
            r#""proto":"HTTP/2.0 https","bytes":"1100/1000","len":80,"ustatus":502,"#,
            r#""iso":"2023-11-14T22:13:20+00:00Z","args":"y=1&z=%22|/x|/x?y=1&z=%22|GET","#,
            r#""ssl":"TLSv1.3 TLS_AES_128_GCM_SHA256","done":"OKcomplete","ns":"ns/ing/web","rid":"abc","#,
            r#""user":"alice","upaddr":"10.0.0.1:8080, 10.0.0.2:8080","nl":"line\nbreak\u0001200","st":200}"#,
            "\n"
        );
        assert_eq!(entry.line(&end(Ending::Complete)), expected);
        // No upstream, no TLS, the client gone: empty strings, bare fields null.
        let mut captured = format.capture(&req, "192.0.2.1".parse().unwrap()).unwrap();
        captured.time = at;
        let entry = format.entry(captured, out(None, None));
        let expected = concat!(
            r#"{"t":"14/Nov/2023:22:13:20 +0000","ms":1700000000.123,"k\"ey":"a $ b GET /x?y=1&z=%22 HTTP/2.0","#,
            r#""ua":"q\"b\\s\tt","ct":"text/plain","rt":1.500,"urt":null,"conn":null,"#,
            r#""pun":"","sp":null,"port":8443,"peer":"127.0.0.1","client":"192.0.2.1","host":"a.test","#,
            r#""proto":"HTTP/2.0 https","bytes":"1100/1000","len":80,"ustatus":null,"#,
            r#""iso":"2023-11-14T22:13:20+00:00Z","args":"y=1&z=%22|/x|/x?y=1&z=%22|GET","#,
            r#""ssl":" ","done":"client_gone","ns":"//","rid":"abc","#,
            r#""user":"alice","upaddr":"","nl":"line\nbreak\u0001200","st":200}"#,
            "\n"
        );
        assert_eq!(entry.line(&end(Ending::ClientGone)), expected);
        // What goes to the writer is the same line.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let writer = Writer::new(&Output::File(path.clone()), 8);
        entry.write(&end(Ending::ClientGone), &writer);
        for _ in 0..3000 {
            if std::fs::read_to_string(&path).unwrap_or_default() == expected {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);
    }

    #[test]
    fn the_default_format_has_every_default_field_and_skipped_urls_are_not_captured() {
        let fields = Format::default_fields();
        assert_eq!(fields.len(), DEFAULT_FIELDS.len(), "every default field parses");
        let format = Format::new(&fields).skipping(&["/healthz".to_string()]);
        let get = |target: &str| http::Request::get(target).body(()).unwrap();
        let client = "192.0.2.1".parse().unwrap();
        assert!(format.capture(&get("/healthz"), client).is_none());
        assert!(format.capture(&get("/healthz?x"), client).is_some(), "matched as $request_uri");
        assert!(format.capture(&get("/"), client).is_some());
    }

    #[test]
    fn outputs_parse() {
        assert_eq!("off".parse::<Output>(), Ok(Output::Off));
        assert_eq!("stdout".parse::<Output>(), Ok(Output::Stdout));
        assert_eq!("/dev/stdout".parse::<Output>(), Ok(Output::Stdout));
        assert_eq!("/var/log/a.log".parse::<Output>(), Ok(Output::File("/var/log/a.log".into())));
        assert!("a.log".parse::<Output>().is_err());
    }

    #[test]
    fn the_writer_reopens_its_file_after_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let writer = Writer::new(&Output::File(path.clone()), 8);
        let wait_for = |path: &std::path::Path, text: &str| {
            for _ in 0..500 {
                if std::fs::read_to_string(path).unwrap_or_default() == text {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("{} never held {text:?}", path.display());
        };
        writer.write("one\n".into());
        wait_for(&path, "one\n");
        let rotated = dir.path().join("access.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        writer.write("two\n".into());
        wait_for(&rotated, "one\ntwo\n");
        writer.reopen();
        writer.write("three\n".into());
        wait_for(&path, "three\n");
        writer.retarget(&Output::Off);
        writer.write("four\n".into());
        for _ in 0..500 {
            if writer.dropped() == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(writer.dropped(), 1, "a line with no output is dropped and counted");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "three\n");
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
