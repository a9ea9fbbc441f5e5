//! The nginx-variables language of the access log's `log-format-upstream`: text with `$name` or
//! `${name}` variables ([`Template`]), of a fixed set weir knows ([`Var`]), parsed once when the
//! table is built (translation rejects unknown names) and rendered per request by the proxy.

use std::fmt;
use std::str::FromStr;

use http::HeaderName;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

// === impl Var ===

/// A variable weir can log, by its nginx name.
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
    /// `$request_time`: seconds from the request to the response head, with milliseconds.
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
}

/// Variables by name, except the header families.
const NAMES: &[(&str, Var)] = &[
    ("remote_addr", Var::RemoteAddr),
    ("the_real_ip", Var::RemoteAddr),
    ("realip_remote_addr", Var::Peer),
    ("proxy_protocol_addr", Var::Peer),
    ("remote_user", Var::RemoteUser),
    ("time_iso8601", Var::TimeIso8601),
    ("time_local", Var::TimeLocal),
    ("msec", Var::Msec),
    ("request", Var::Request),
    ("request_method", Var::RequestMethod),
    ("request_uri", Var::RequestUri),
    ("uri", Var::Uri),
    ("document_uri", Var::Uri),
    ("args", Var::Args),
    ("query_string", Var::Args),
    ("server_protocol", Var::ServerProtocol),
    ("scheme", Var::Scheme),
    ("host", Var::Host),
    ("server_port", Var::ServerPort),
    ("status", Var::Status),
    ("request_time", Var::RequestTime),
    ("upstream_addr", Var::UpstreamAddr),
    ("upstream_status", Var::UpstreamStatus),
    ("upstream_response_time", Var::UpstreamResponseTime),
    ("upstream_header_time", Var::UpstreamResponseTime),
    ("req_id", Var::RequestId),
    ("request_id", Var::RequestId),
    ("namespace", Var::Namespace),
    ("ingress_name", Var::IngressName),
    ("service_name", Var::ServiceName),
    ("service_port", Var::ServicePort),
    ("proxy_upstream_name", Var::ProxyUpstreamName),
];

impl Var {
    /// The variable named `name` (without `$`), if weir knows it.
    pub fn parse(name: &str) -> Option<Var> {
        if let Some((_, var)) = NAMES.iter().find(|(n, _)| *n == name) {
            return Some(var.clone());
        }
        let header = |rest: &str| HeaderName::from_bytes(rest.replace('_', "-").as_bytes()).ok();
        if let Some(rest) = name.strip_prefix("sent_http_") {
            return header(rest).map(Var::ResponseHeader);
        }
        if let Some(rest) = name.strip_prefix("http_") {
            return header(rest).map(Var::RequestHeader);
        }
        match name {
            "content_type" | "content_length" => header(name).map(Var::RequestHeader),
            _ => None,
        }
    }
}

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let underscored = |h: &HeaderName| h.as_str().replace('-', "_");
        match self {
            Var::RequestHeader(h) => write!(f, "http_{}", underscored(h)),
            Var::ResponseHeader(h) => write!(f, "sent_http_{}", underscored(h)),
            other => {
                let name = NAMES.iter().find(|(_, v)| v == other).map_or("", |(n, _)| n);
                f.write_str(name)
            }
        }
    }
}

// === impl Template ===

/// Text with `$name` or `${name}` variables, as in an nginx `log_format`.
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

/// A template naming variables weir does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown or unavailable variables: {}", .0.iter().map(|v| format!("${v}")).collect::<Vec<_>>().join(", "))]
pub struct UnknownVariables(pub Vec<String>);

impl Template {
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

impl FromStr for Template {
    type Err = UnknownVariables;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut parts = Vec::new();
        let mut unknown = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(at) = rest.find('$') {
            text.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, next) = match after.strip_prefix('{').and_then(|a| a.split_once('}')) {
                Some((name, next)) => (name, next),
                None => {
                    let end = after.find(|c: char| !is_name(c)).unwrap_or(after.len());
                    (&after[..end], &after[end..])
                }
            };
            if name.is_empty() {
                // A `$` that starts no variable is text.
                text.push('$');
                rest = after;
                continue;
            }
            match Var::parse(name) {
                Some(var) => {
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Var(var));
                }
                None => unknown.push(name.to_string()),
            }
            rest = next;
        }
        text.push_str(rest);
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        if unknown.is_empty() { Ok(Template { parts }) } else { Err(UnknownVariables(unknown)) }
    }
}

/// Prints variables as `${name}`, but as `$name` after text that leaves a `${` open (parsing
/// took it as text because no `}` followed; a brace printed after it would close it and make a
/// name of everything between). A variable parsed there was written `$name` and followed by no
/// name character, so `$name` reads back the same.
impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut open = false;
        for part in &self.parts {
            match part {
                Part::Text(t) => {
                    f.write_str(t)?;
                    open = match t.rfind('}') {
                        Some(close) => t[close..].contains("${"),
                        None => open || t.contains("${"),
                    };
                }
                Part::Var(v) if open => write!(f, "${v}")?,
                Part::Var(v) => write!(f, "${{{v}}}")?,
            }
        }
        Ok(())
    }
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_round_trip() {
        let t: Template = "$remote_addr - ${status}x $$ $ $http_user_agent".parse().unwrap();
        assert_eq!(t.to_string(), "${remote_addr} - ${status}x $$ $ ${http_user_agent}");
        let back: Template = t.to_string().parse().unwrap();
        assert_eq!(back, t);
        let err = "$remote_addr $bytes_sent ${nope}".parse::<Template>().unwrap_err();
        assert_eq!(err.0, ["bytes_sent", "nope"]);
        assert_eq!("$status".parse::<Template>().unwrap().as_var(), Some(&Var::Status));
        assert_eq!(
            Var::parse("http_x_forwarded_for"),
            Some(Var::RequestHeader(HeaderName::from_static("x-forwarded-for")))
        );
    }

    /// Found by the `templates` fuzz target: a `${` that never closes is text, and the braces
    /// of a variable printed after it used to close it (`{``${${args}` does not parse).
    #[test]
    fn a_template_with_an_unclosed_brace_prints_back_to_itself() {
        for text in ["{``${$args", "x ${ $status - $msec", "$$${$remote_addr", "${} $status ${"] {
            let t: Template = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let back: Template = t.to_string().parse().unwrap_or_else(|e| panic!("{t} from {text:?}: {e}"));
            assert_eq!(back, t, "{text:?} printed as {t}");
        }
        assert_eq!("x ${ $status".parse::<Template>().unwrap().to_string(), "x ${ $status");
    }
}
