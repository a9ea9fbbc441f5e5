//! The nginx-variables language every template weir reads is written in: text with `$name` or
//! `${name}` variables. One lexer and one name table serve all its users, each of which
//! accepts its own subset of the names (its [`Dialect`]): the access log's fields, the key of
//! `upstream-hash-by`, the key of `auth-cache-key`, and the URL templates of `auth-url`,
//! `auth-signin` and `mirror-target`.
//!
//! A template is parsed once, when translation checks it or the table is compiled
//! ([`Template::parse`]); per request, each user renders its parts from the request as the
//! client sent it ([`RequestView`]) in its own encoding (JSON, a hash, a cache key, a URL).

use std::fmt;
use std::net::IpAddr;

use http::Method;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName};

// === impl Dialect ===

/// A user of the language, and so the names it accepts and how it reads a stray `$`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// The access log's `log-format-upstream` fields: a `$` that starts no variable is text.
    AccessLog,
    /// `upstream-hash-by`: a stray `$` is an error.
    HashKey,
    /// `auth-cache-key`: a stray `$` is an error.
    AuthKey,
    /// `auth-url`, `auth-signin`, `mirror-target`: `$name` only (no `${name}`), a stray `$` is
    /// text.
    Url,
    /// The L4 access log's `log-format-stream` fields (nginx's stream variables): a stray `$` is
    /// text.
    StreamLog,
}

/// The bit of a dialect in the name table's masks.
const fn bit(dialect: Dialect) -> u8 {
    1 << dialect as u8
}
const LOG: u8 = bit(Dialect::AccessLog);
const HASH: u8 = bit(Dialect::HashKey);
const AUTH: u8 = bit(Dialect::AuthKey);
const URL: u8 = bit(Dialect::Url);
const STREAM: u8 = bit(Dialect::StreamLog);
const ALL: u8 = LOG | HASH | AUTH | URL;

impl Dialect {
    /// Whether `${name}` delimits a name.
    fn braces(self) -> bool {
        self != Dialect::Url
    }

    /// Whether a `$` that starts no variable is an error (else it is text).
    fn stray_dollar_is_wrong(self) -> bool {
        matches!(self, Dialect::HashKey | Dialect::AuthKey)
    }

    /// The names it accepts, as its error messages list them (aliases left out).
    pub fn hint(self) -> &'static str {
        match self {
            Dialect::AccessLog => "those of log-format-upstream in docs/migrating-from-ingress-nginx.md",
            Dialect::HashKey => {
                "$remote_addr, $request_uri, $uri, $host, $http_NAME, $cookie_NAME or $arg_NAME"
            }
            Dialect::AuthKey => {
                "$http_NAME, $cookie_NAME, $arg_NAME, $remote_user, $remote_addr, $host, $scheme, $request_method, $request_uri, $uri or $args"
            }
            Dialect::Url => {
                "$scheme, $host, $http_host, $best_http_host, $request_uri, $escaped_request_uri, $uri, $remote_addr"
            }
            Dialect::StreamLog => {
                "$remote_addr, $remote_port, $time_local, $time_iso8601, $msec, $protocol, $status, $bytes_sent, $bytes_received, $session_time, $upstream_addr, $server_port"
            }
        }
    }

    /// The variable `name` (without `$`) stands for in this dialect.
    pub fn lookup(self, name: &str) -> Result<Var, Problem> {
        let me = bit(self);
        if let Some((_, var, _)) = NAMES.iter().find(|(n, _, users)| *n == name && users & me != 0) {
            return Ok(var.clone());
        }
        let unsupported = || Problem::Unsupported(name.to_string());
        let (prefix, family, _) = FAMILIES
            .iter()
            .find(|(prefix, _, users)| users & me != 0 && name.starts_with(prefix))
            .ok_or_else(unsupported)?;
        let rest = &name[prefix.len()..];
        if rest.is_empty() {
            return Err(unsupported());
        }
        let header = || {
            HeaderName::from_bytes(rest.replace('_', "-").as_bytes())
                .map_err(|_| Problem::BadHeader(name.to_string()))
        };
        Ok(match family {
            Family::RequestHeader => Var::RequestHeader(header()?),
            Family::ResponseHeader => Var::ResponseHeader(header()?),
            Family::Cookie => Var::Cookie(rest.to_string()),
            Family::Arg => Var::Arg(rest.to_string()),
        })
    }

    /// Every variable name it accepts, but the families (`$http_NAME` ...).
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        NAMES.iter().filter(move |(_, _, users)| users & bit(self) != 0).map(|(n, _, _)| *n)
    }

    /// The prefixes of the families it accepts (`http_`, `cookie_` ...).
    pub fn families(self) -> impl Iterator<Item = &'static str> {
        FAMILIES.iter().filter(move |(_, _, users)| users & bit(self) != 0).map(|(p, _, _)| *p)
    }
}

// === impl Var ===

/// A variable weir knows, by what it stands for (several names may stand for one).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Var {
    /// `$remote_addr`: the client address (behind trusted proxies, the one they name).
    RemoteAddr,
    /// `$realip_remote_addr`, `$proxy_protocol_addr`: the connection's client (the PROXY
    /// protocol address when there is one), before `use-forwarded-headers`.
    Peer,
    /// `$remote_user`: the user name of a `Basic` `Authorization` header.
    RemoteUser,
    /// `$time_iso8601` (UTC).
    TimeIso8601,
    /// `$time_local` (UTC), `10/Oct/2000:13:55:36 +0000`.
    TimeLocal,
    /// `$msec`: seconds since the epoch, with milliseconds.
    Msec,
    /// `$request`: `GET /path?q HTTP/1.1`.
    Request,
    /// `$request_method`.
    RequestMethod,
    /// `$request_uri`: path and query as sent.
    RequestUri,
    /// `$escaped_request_uri`: the request URI percent-encoded.
    EscapedRequestUri,
    /// `$uri`, `$document_uri`: the path (as sent; nginx logs it decoded).
    Uri,
    /// `$args`, `$query_string`.
    Args,
    /// `$server_protocol`: `HTTP/1.1`, `HTTP/2.0`.
    ServerProtocol,
    /// `$scheme`: `http` or `https`.
    Scheme,
    /// `$host`: the request's host name, lower case, without port.
    Host,
    /// `$server_port`: the listener's port.
    ServerPort,
    /// `$status`: the response status.
    Status,
    /// `$request_time`: seconds from the request to the response's last byte (or the client
    /// going away), with milliseconds.
    RequestTime,
    /// `$upstream_addr`.
    UpstreamAddr,
    /// `$upstream_status`.
    UpstreamStatus,
    /// `$upstream_response_time`, `$upstream_header_time`: seconds to the upstream's head.
    UpstreamResponseTime,
    /// `$req_id`, `$request_id`: the `X-Request-ID`.
    RequestId,
    /// `$namespace`: the namespace of the route's Ingress.
    Namespace,
    /// `$ingress_name`.
    IngressName,
    /// `$service_name`.
    ServiceName,
    /// `$service_port`.
    ServicePort,
    /// `$proxy_upstream_name`: `namespace-service-port`, as ingress-nginx names upstreams.
    ProxyUpstreamName,
    /// `$http_NAME` (and `$content_type`, `$content_length`): a request header.
    RequestHeader(HeaderName),
    /// `$sent_http_NAME`: a response header.
    ResponseHeader(HeaderName),
    /// `$bytes_sent`: bytes sent to the client, the response head (as HTTP/1.1 frames it) and
    /// body.
    BytesSent,
    /// `$body_bytes_sent`: bytes of the response body sent to the client.
    BodyBytesSent,
    /// `$request_length`: the request head (as HTTP/1.1 frames it) and its declared body.
    RequestLength,
    /// `$ssl_protocol`: `TLSv1.2` or `TLSv1.3` on HTTPS connections.
    SslProtocol,
    /// `$ssl_cipher`: the cipher suite, by its OpenSSL name, on HTTPS connections.
    SslCipher,
    /// `$request_completion`: `OK` when the whole response went out, else empty.
    RequestCompletion,
    /// `$request_end` (weir's): `complete`, `client_gone` or `upstream_error`: how the response
    /// ended.
    RequestEnd,
    /// `$remote_port`: the client's port (L4).
    RemotePort,
    /// `$protocol`: `TCP` or `UDP` (L4).
    Protocol,
    /// `$bytes_received`: bytes received from the client (L4).
    BytesReceived,
    /// `$session_time`: seconds the connection or flow lasted, with milliseconds (L4).
    SessionTime,
    /// `$upstream_connect_time`: seconds to connect to the upstream (TCP and TLS), per
    /// endpoint tried; `0.000` on a reused connection, `-` where no connection was made.
    UpstreamConnectTime,
    /// `$cookie_NAME`: a request cookie.
    Cookie(String),
    /// `$arg_NAME`: a query parameter.
    Arg(String),
}

/// The name table: each name, what it stands for, and the dialects accepting it. A variable's
/// first name here is the one it is written back with.
const NAMES: &[(&str, Var, u8)] = &[
    ("remote_addr", Var::RemoteAddr, ALL | STREAM),
    ("the_real_ip", Var::RemoteAddr, LOG),
    ("realip_remote_addr", Var::Peer, LOG),
    ("proxy_protocol_addr", Var::Peer, LOG),
    ("remote_user", Var::RemoteUser, LOG | AUTH),
    ("time_iso8601", Var::TimeIso8601, LOG | STREAM),
    ("time_local", Var::TimeLocal, LOG | STREAM),
    ("msec", Var::Msec, LOG | STREAM),
    ("request", Var::Request, LOG),
    ("request_method", Var::RequestMethod, LOG | AUTH),
    ("request_uri", Var::RequestUri, ALL),
    ("uri", Var::Uri, ALL),
    ("document_uri", Var::Uri, LOG | AUTH),
    ("args", Var::Args, LOG | AUTH),
    ("query_string", Var::Args, LOG | AUTH),
    ("server_protocol", Var::ServerProtocol, LOG),
    ("scheme", Var::Scheme, LOG | AUTH | URL),
    ("host", Var::Host, ALL),
    ("server_port", Var::ServerPort, LOG | STREAM),
    ("status", Var::Status, LOG | STREAM),
    ("request_time", Var::RequestTime, LOG),
    ("upstream_addr", Var::UpstreamAddr, LOG | STREAM),
    ("upstream_status", Var::UpstreamStatus, LOG),
    ("upstream_response_time", Var::UpstreamResponseTime, LOG),
    ("upstream_header_time", Var::UpstreamResponseTime, LOG),
    ("upstream_connect_time", Var::UpstreamConnectTime, LOG),
    ("req_id", Var::RequestId, LOG),
    ("request_id", Var::RequestId, LOG),
    ("namespace", Var::Namespace, LOG),
    ("ingress_name", Var::IngressName, LOG),
    ("service_name", Var::ServiceName, LOG),
    ("service_port", Var::ServicePort, LOG),
    ("proxy_upstream_name", Var::ProxyUpstreamName, LOG),
    ("bytes_sent", Var::BytesSent, LOG | STREAM),
    ("body_bytes_sent", Var::BodyBytesSent, LOG),
    ("request_length", Var::RequestLength, LOG),
    ("ssl_protocol", Var::SslProtocol, LOG),
    ("ssl_cipher", Var::SslCipher, LOG),
    ("request_completion", Var::RequestCompletion, LOG),
    ("request_end", Var::RequestEnd, LOG),
    ("remote_port", Var::RemotePort, STREAM),
    ("protocol", Var::Protocol, STREAM),
    ("bytes_received", Var::BytesReceived, STREAM),
    ("session_time", Var::SessionTime, STREAM),
    // Where the access log reads the header (`$http_NAME`), the keys and URLs read the host.
    ("http_host", Var::Host, AUTH | URL),
    ("best_http_host", Var::Host, URL),
    ("binary_remote_addr", Var::RemoteAddr, HASH | AUTH),
    ("escaped_request_uri", Var::EscapedRequestUri, URL),
    ("content_type", Var::RequestHeader(CONTENT_TYPE), LOG),
    ("content_length", Var::RequestHeader(CONTENT_LENGTH), LOG),
];

/// The variables named by a prefix and a header, cookie or parameter name.
#[derive(Clone, Copy)]
enum Family {
    RequestHeader,
    ResponseHeader,
    Cookie,
    Arg,
}

/// The families by prefix, with the dialects accepting them.
const FAMILIES: &[(&str, Family, u8)] = &[
    ("sent_http_", Family::ResponseHeader, LOG),
    ("http_", Family::RequestHeader, LOG | HASH | AUTH),
    ("cookie_", Family::Cookie, HASH | AUTH),
    ("arg_", Family::Arg, HASH | AUTH),
];

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let underscored = |h: &HeaderName| h.as_str().replace('-', "_");
        match self {
            Var::RequestHeader(h) => write!(f, "http_{}", underscored(h)),
            Var::ResponseHeader(h) => write!(f, "sent_http_{}", underscored(h)),
            Var::Cookie(name) => write!(f, "cookie_{name}"),
            Var::Arg(name) => write!(f, "arg_{name}"),
            other => {
                let name = NAMES.iter().find(|(_, v, _)| v == other).map_or("", |(n, _, _)| n);
                f.write_str(name)
            }
        }
    }
}

// === impl Template ===

/// Text with variables, parsed for one [`Dialect`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// One piece of a [`Template`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text as written.
    Text(String),
    /// A variable, replaced by its value.
    Var(Var),
}

/// What a dialect does not accept in a template.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// `${` without `}`.
    #[error("unclosed ${{")]
    Unclosed,
    /// A `$` that starts no variable.
    #[error("a lone $ (write a variable name after it)")]
    Lone,
    /// A variable the dialect does not know.
    #[error("unsupported variable ${0}")]
    Unsupported(String),
    /// `$http_NAME` whose NAME is no header name.
    #[error("bad header in ${0}")]
    BadHeader(String),
}

impl Problem {
    /// Whether it is about the template's form (a stray `$`), not about a variable.
    pub fn is_syntax(&self) -> bool {
        matches!(self, Problem::Unclosed | Problem::Lone)
    }
}

/// A template with problems, in the order they are written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Rejected(pub Vec<Problem>);

impl Rejected {
    /// The problem a key reports: the first about the form, else the first variable.
    pub fn first(&self) -> Option<&Problem> {
        self.0.iter().find(|p| p.is_syntax()).or_else(|| self.0.first())
    }

    /// The message of a key's template (`upstream-hash-by`, `auth-cache-key`): the
    /// [`first`](Rejected::first) problem, with the names `dialect` accepts when it is a name.
    pub fn message(&self, dialect: Dialect) -> String {
        match self.first() {
            Some(Problem::Unsupported(name)) => {
                format!("unsupported variable ${name} (use {})", dialect.hint())
            }
            Some(other) => other.to_string(),
            None => String::new(),
        }
    }
}

/// One token of a template.
enum Token<'a> {
    /// Text without `$`.
    Text(&'a str),
    /// `$name` or `${name}`: the name and the template as written.
    Var { name: &'a str, written: &'a str },
    /// A `$` that starts no variable (the text after it is read on); `unclosed` when it is a
    /// `${` without `}`.
    Stray { unclosed: bool },
}

/// The tokens of `template`; with `braces`, `${name}` delimits a name.
fn tokens(template: &str, braces: bool) -> impl Iterator<Item = Token<'_>> {
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut rest = template;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let Some(at) = rest.find('$') else {
            return Some(Token::Text(std::mem::take(&mut rest)));
        };
        if at > 0 {
            let (text, tail) = rest.split_at(at);
            rest = tail;
            return Some(Token::Text(text));
        }
        let after = &rest[1..];
        if braces && let Some(inner) = after.strip_prefix('{') {
            match inner.split_once('}') {
                Some((name, tail)) if !name.is_empty() => {
                    let written = &rest[..rest.len() - tail.len()];
                    rest = tail;
                    return Some(Token::Var { name, written });
                }
                Some(_) => {
                    rest = after;
                    return Some(Token::Stray { unclosed: false });
                }
                None => {
                    rest = after;
                    return Some(Token::Stray { unclosed: true });
                }
            }
        }
        let len = after.bytes().take_while(|b| is_name(*b)).count();
        if len == 0 {
            rest = after;
            return Some(Token::Stray { unclosed: false });
        }
        let (written, tail) = rest.split_at(len + 1);
        rest = tail;
        Some(Token::Var { name: &written[1..], written })
    })
}

impl Template {
    /// Parses `text` in `dialect`; `Err` lists every problem, in order.
    pub fn parse(text: &str, dialect: Dialect) -> Result<Template, Rejected> {
        let (template, problems) = Template::read(text, dialect);
        if problems.is_empty() { Ok(template) } else { Err(Rejected(problems)) }
    }

    /// Parses `text` in `dialect`, what it does not accept kept as the text written (for
    /// templates translation has checked already).
    pub fn parse_lenient(text: &str, dialect: Dialect) -> Template {
        Template::read(text, dialect).0
    }

    /// The template, and its problems.
    fn read(text: &str, dialect: Dialect) -> (Template, Vec<Problem>) {
        let mut parts = Vec::new();
        let mut problems = Vec::new();
        let mut literal = String::new();
        for token in tokens(text, dialect.braces()) {
            match token {
                Token::Text(t) => literal.push_str(t),
                Token::Stray { unclosed } => {
                    if dialect.stray_dollar_is_wrong() {
                        problems.push(if unclosed { Problem::Unclosed } else { Problem::Lone });
                    } else if dialect == Dialect::Url {
                        // A URL template is checked by translation: a stray `$` is not a variable.
                        problems.push(Problem::Unsupported(String::new()));
                    }
                    literal.push('$');
                }
                Token::Var { name, written } => match dialect.lookup(name) {
                    Ok(var) => {
                        if !literal.is_empty() {
                            parts.push(Part::Text(std::mem::take(&mut literal)));
                        }
                        parts.push(Part::Var(var));
                    }
                    Err(problem) => {
                        problems.push(problem);
                        literal.push_str(written);
                    }
                },
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        (Template { parts }, problems)
    }

    /// A template of exactly one variable.
    pub fn var(var: Var) -> Template {
        Template { parts: vec![Part::Var(var)] }
    }

    /// The single variable, when the template is nothing else.
    pub fn as_var(&self) -> Option<&Var> {
        match self.parts.as_slice() {
            [Part::Var(v)] => Some(v),
            _ => None,
        }
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The variables it names, in order.
    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(v) => Some(v),
            Part::Text(_) => None,
        })
    }
}

// === impl RequestView ===

/// The request as the client sent it, as templates read it (the access log keeps its own
/// copy of what it needs, taken before the request is forwarded).
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The host the client asked for.
    pub host: &'a str,
    /// The request method.
    pub method: &'a Method,
    /// Path and query as sent.
    pub request_uri: &'a str,
    /// The client's address.
    pub client: IpAddr,
    /// The client's headers.
    pub headers: &'a HeaderMap,
}

impl<'a> RequestView<'a> {
    /// `$uri`: the path, without the query.
    pub fn path(&self) -> &'a str {
        self.request_uri.split('?').next().unwrap_or_default()
    }

    /// `$args`: the query, empty when there is none.
    pub fn query(&self) -> &'a str {
        self.request_uri.split_once('?').map_or("", |(_, q)| q)
    }

    /// `$arg_NAME`: the value of the first `name=value` parameter.
    pub fn arg(&self, name: &str) -> Option<&'a str> {
        self.query().split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// `$cookie_NAME`.
    pub fn cookie(&self, name: &str) -> Option<&'a str> {
        crate::http_util::cookie(self.headers, name)
    }
}

/// `$remote_user`: the user name of a `Basic` `Authorization` header (not verified).
pub fn basic_user(headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(text.split_once(':').map_or(text.as_str(), |(user, _)| user).to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DIALECTS: [Dialect; 4] = [Dialect::AccessLog, Dialect::HashKey, Dialect::AuthKey, Dialect::Url];

    fn accepts(dialect: Dialect, name: &str) -> bool {
        dialect.lookup(name).is_ok()
    }

    #[test]
    fn each_dialect_accepts_its_names() {
        use Dialect::*;
        // name, then whether the access log, the hash key, the cache key and URLs accept it
        let table: &[(&str, [bool; 4])] = &[
            ("remote_addr", [true, true, true, true]),
            ("binary_remote_addr", [false, true, true, false]),
            ("the_real_ip", [true, false, false, false]),
            ("remote_user", [true, false, true, false]),
            ("scheme", [true, false, true, true]),
            ("host", [true, true, true, true]),
            ("best_http_host", [false, false, false, true]),
            ("request_method", [true, false, true, false]),
            ("request_uri", [true, true, true, true]),
            ("escaped_request_uri", [false, false, false, true]),
            ("uri", [true, true, true, true]),
            ("document_uri", [true, false, true, false]),
            ("args", [true, false, true, false]),
            ("query_string", [true, false, true, false]),
            ("status", [true, false, false, false]),
            ("request_time", [true, false, false, false]),
            ("upstream_addr", [true, false, false, false]),
            ("content_type", [true, false, false, false]),
            ("http_x_user", [true, true, true, false]),
            ("sent_http_x_user", [true, false, false, false]),
            ("cookie_sid", [false, true, true, false]),
            ("arg_page", [false, true, true, false]),
            ("http_", [false, false, false, false]),
            ("cookie_", [false, false, false, false]),
            ("bytes_sent", [true, false, false, false]),
            ("upstream_bytes_sent", [false, false, false, false]),
        ];
        for (name, expected) in table {
            for (dialect, want) in DIALECTS.into_iter().zip(expected) {
                assert_eq!(accepts(dialect, name), *want, "{dialect:?} ${name}");
            }
        }
        // `$http_host` is the header to the access log and the hash key, the host to the rest.
        let header = Var::RequestHeader(http::header::HOST);
        assert_eq!(AccessLog.lookup("http_host"), Ok(header.clone()));
        assert_eq!(HashKey.lookup("http_host"), Ok(header));
        assert_eq!(AuthKey.lookup("http_host"), Ok(Var::Host));
        assert_eq!(Url.lookup("http_host"), Ok(Var::Host));
        // Header names are lower case, `_` for `-`; one that is not a name is told apart.
        assert_eq!(HashKey.lookup("http_X_Y"), Ok(Var::RequestHeader(HeaderName::from_static("x-y"))));
        assert_eq!(HashKey.lookup("http_a b"), Err(Problem::BadHeader("http_a b".into())));
        assert_eq!(Url.lookup("cookie_x"), Err(Problem::Unsupported("cookie_x".into())));
    }

    #[test]
    fn every_name_a_dialect_accepts_is_in_its_hint() {
        for dialect in [Dialect::HashKey, Dialect::AuthKey, Dialect::Url, Dialect::StreamLog] {
            let hinted: Vec<&str> =
                dialect.hint().split([',', ' ']).filter_map(|w| w.strip_prefix('$')).collect();
            for name in &hinted {
                let name = name.replace("NAME", "x");
                assert!(accepts(dialect, &name), "{dialect:?} hints ${name} but refuses it");
            }
            // Every variable accepted is hinted, by one of its names.
            for name in dialect.names() {
                let var = dialect.lookup(name).unwrap();
                let named = hinted.iter().any(|h| dialect.lookup(h).is_ok_and(|v| v == var));
                assert!(named, "{dialect:?} accepts ${name}, not in its hint");
            }
            for prefix in dialect.families() {
                assert!(
                    hinted.iter().any(|h| h.strip_suffix("NAME") == Some(prefix)),
                    "{dialect:?}: {prefix}"
                );
            }
        }
    }

    fn parts(text: &str, dialect: Dialect) -> Vec<Part> {
        Template::parse(text, dialect).unwrap().parts().to_vec()
    }

    fn text(t: &str) -> Part {
        Part::Text(t.into())
    }

    #[test]
    fn both_forms_name_a_variable() {
        for dialect in [Dialect::AccessLog, Dialect::HashKey, Dialect::AuthKey] {
            let expected = vec![text("a"), Part::Var(Var::Host), text("b"), Part::Var(Var::Host), text("c")];
            assert_eq!(parts("a${host}b$host-c", dialect).len(), 5, "{dialect:?}");
            assert_eq!(parts("a${host}b${host}c", dialect), expected, "{dialect:?}");
        }
        // URLs know no braces: `${host}` is text, and `$` a stray one.
        assert_eq!(parts("x$host/", Dialect::Url), [text("x"), Part::Var(Var::Host), text("/")]);
        let err = Template::parse("x${host}", Dialect::Url).unwrap_err();
        assert_eq!(err.0, [Problem::Unsupported(String::new())]);
        assert_eq!(Template::parse_lenient("x${host}", Dialect::Url).parts(), [text("x${host}")]);
    }

    #[test]
    fn a_stray_dollar_is_text_to_the_log_and_an_error_to_keys() {
        for (written, log) in
            [("a $ b", "a $ b"), ("$$", "$$"), ("${}", "${}"), ("${host", "${host"), ("-$-", "-$-")]
        {
            assert_eq!(parts(written, Dialect::AccessLog), [text(log)], "{written}");
        }
        let first = |t: &str| Template::parse(t, Dialect::HashKey).unwrap_err().first().cloned();
        assert_eq!(first("$host $"), Some(Problem::Lone));
        assert_eq!(first("${}"), Some(Problem::Lone));
        assert_eq!(first("$host ${host"), Some(Problem::Unclosed));
        // The form is reported before the names.
        assert_eq!(first("$nope ${host"), Some(Problem::Unclosed));
        assert_eq!(first("$nope $request_time"), Some(Problem::Unsupported("nope".into())));
        assert_eq!(
            Template::parse("$nope", Dialect::HashKey).unwrap_err().message(Dialect::HashKey),
            format!("unsupported variable $nope (use {})", Dialect::HashKey.hint())
        );
        // URLs: text, which translation refuses.
        assert_eq!(Template::parse_lenient("a$ b", Dialect::Url).parts(), [text("a$ b")]);
    }

    #[test]
    fn unknown_names_are_all_reported_and_kept_as_written() {
        let err = Template::parse("$remote_addr $upstream_bytes_sent ${nope} $cookie_x", Dialect::AccessLog)
            .unwrap_err();
        let names = ["upstream_bytes_sent", "nope", "cookie_x"].map(|n| Problem::Unsupported(n.into()));
        assert_eq!(err.0, names);
        let kept = Template::parse_lenient("$scheme://h/$other?$host", Dialect::Url);
        assert_eq!(kept.parts(), [Part::Var(Var::Scheme), text("://h/$other?"), Part::Var(Var::Host)]);
    }

    #[test]
    fn the_view_reads_the_request() {
        let mut headers = HeaderMap::new();
        headers.insert("cookie", http::HeaderValue::from_static("a=1; sid=xyz"));
        headers.insert("authorization", http::HeaderValue::from_static("Basic YWxpY2U6c2VjcmV0"));
        let view = RequestView {
            scheme: "http",
            host: "a",
            method: &Method::GET,
            request_uri: "/p?x=1&y=2&x=3",
            client: "192.0.2.1".parse().unwrap(),
            headers: &headers,
        };
        assert_eq!((view.path(), view.query()), ("/p", "x=1&y=2&x=3"));
        assert_eq!((view.arg("x"), view.arg("z")), (Some("1"), None));
        assert_eq!(view.cookie("sid"), Some("xyz"));
        assert_eq!(basic_user(&headers).as_deref(), Some("alice"));
    }
}
