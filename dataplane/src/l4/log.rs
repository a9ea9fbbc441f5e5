//! The L4 access log: one JSON line per TCP connection and per UDP flow, written when it ends
//! (`log-format-stream`, `disable-stream-access-log`, `stream-access-log-path`), through the
//! same kind of bounded queue and writer thread as the HTTP access log.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::L4Protocol;
use crate::model::logging::LogSettings;
use crate::proxy::accesslog::{Output, TimeStyle, Writer, is_json_number, push_json_string, write_time};
use crate::vars::{Dialect, Part, Template, Var};

/// ingress-nginx's default `log-format-stream`
/// (`[$remote_addr] [$time_local] $protocol $status $bytes_sent $bytes_received $session_time`)
/// as JSON, with the client's port, the upstream and the listener's port.
const DEFAULT_FIELDS: &[(&str, &str, bool)] = &[
    ("time", "$time_iso8601", false),
    ("remote_addr", "$remote_addr", false),
    ("remote_port", "$remote_port", true),
    ("protocol", "$protocol", false),
    ("status", "$status", true),
    ("bytes_sent", "$bytes_sent", true),
    ("bytes_received", "$bytes_received", true),
    ("session_time", "$session_time", true),
    ("upstream_addr", "$upstream_addr", false),
    ("server_port", "$server_port", true),
];

/// A compiled L4 log format and the writer its lines go to.
#[derive(Debug)]
pub(crate) struct StreamLog {
    fields: Vec<(String, Template, bool)>,
    writer: Arc<Writer>,
}

/// One ended connection or flow.
#[derive(Debug)]
pub(crate) struct Session {
    /// When it started.
    pub(crate) time: SystemTime,
    /// How long it lasted.
    pub(crate) duration: Duration,
    /// The client (the PROXY protocol's source when there is one).
    pub(crate) client: SocketAddr,
    /// TCP or UDP.
    pub(crate) protocol: L4Protocol,
    /// The listener's port.
    pub(crate) port: u16,
    /// nginx's stream status: 200 ended normally, 400 bad PROXY header, 502 no endpoint
    /// reached, 503 refused by a limit.
    pub(crate) status: u16,
    /// Bytes sent to the client.
    pub(crate) sent: u64,
    /// Bytes received from the client.
    pub(crate) received: u64,
    /// The endpoint, when one was reached.
    pub(crate) upstream: Option<String>,
}

impl StreamLog {
    /// The L4 log of `settings` writing to `writer`; `None` when it is off.
    pub(crate) fn of(settings: &LogSettings, writer: &Arc<Writer>) -> Option<Arc<StreamLog>> {
        if settings.stream_off {
            return None;
        }
        let fields = match &settings.stream_format {
            Some(fields) => fields.iter().map(|f| (f.key.clone(), f.template.as_str(), f.bare)).collect(),
            None => DEFAULT_FIELDS.iter().map(|(k, t, b)| ((*k).to_string(), *t, *b)).collect::<Vec<_>>(),
        };
        let fields = fields
            .into_iter()
            .map(|(key, text, bare)| (key, Template::parse_lenient(text, Dialect::StreamLog), bare))
            .collect();
        Some(Arc::new(StreamLog { fields, writer: writer.clone() }))
    }

    /// Where the L4 log goes under `settings`: syslog, `stream-access-log-path`, else `flag`.
    pub(crate) fn output(settings: &LogSettings, flag: &Output) -> Output {
        if let Some(syslog) = &settings.syslog {
            return Output::Syslog { host: syslog.host.clone(), port: syslog.port };
        }
        match settings.stream_path.as_deref().map(str::parse::<Output>) {
            Some(Ok(output)) => output,
            Some(Err(error)) => {
                tracing::warn!(%error, "stream-access-log-path unusable; ignored");
                flag.clone()
            }
            None => flag.clone(),
        }
    }

    /// Queues the line of `session`.
    pub(crate) fn write(&self, session: &Session) {
        self.writer.write(self.line(session));
    }

    fn line(&self, session: &Session) -> String {
        let mut line = String::with_capacity(64 + 32 * self.fields.len());
        let mut value = String::new();
        line.push('{');
        for (i, (key, template, bare)) in self.fields.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            push_json_string(&mut line, key);
            line.push(':');
            value.clear();
            let mut known = true;
            for part in template.parts() {
                match part {
                    Part::Text(t) => value.push_str(t),
                    Part::Var(v) => known &= render(v, session, &mut value),
                }
            }
            if !*bare {
                push_json_string(&mut line, &value);
            } else if !known {
                line.push_str("null");
            } else if is_json_number(&value) {
                line.push_str(&value);
            } else {
                push_json_string(&mut line, &value);
            }
        }
        line.push_str("}\n");
        line
    }
}

/// Appends the value of `var`; false when it has none.
fn render(var: &Var, s: &Session, to: &mut String) -> bool {
    use std::fmt::Write as _;
    let written = match var {
        Var::RemoteAddr => write!(to, "{}", crate::model::canonical_ip(s.client.ip())),
        Var::RemotePort => write!(to, "{}", s.client.port()),
        Var::TimeIso8601 => return write_time(to, s.time, TimeStyle::Iso8601),
        Var::TimeLocal => return write_time(to, s.time, TimeStyle::Local),
        Var::Msec => return write_time(to, s.time, TimeStyle::Msec),
        Var::Protocol => write!(to, "{}", if s.protocol == L4Protocol::Tcp { "TCP" } else { "UDP" }),
        Var::Status => write!(to, "{}", s.status),
        Var::BytesSent => write!(to, "{}", s.sent),
        Var::BytesReceived => write!(to, "{}", s.received),
        Var::SessionTime => write!(to, "{:.3}", s.duration.as_secs_f64()),
        Var::UpstreamAddr => match &s.upstream {
            Some(addr) => write!(to, "{addr}"),
            None => return false,
        },
        Var::ServerPort => write!(to, "{}", s.port),
        // Not in the stream dialect: never parsed into a field.
        _ => return false,
    };
    written.is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::logging::StreamField;

    #[test]
    fn lines_have_the_default_fields_or_the_chosen_ones() {
        let writer = Arc::new(Writer::new(&Output::Off, 1));
        let session = Session {
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            duration: Duration::from_millis(1250),
            client: "[::ffff:192.0.2.1]:4000".parse().unwrap(),
            protocol: L4Protocol::Udp,
            port: 5353,
            status: 200,
            sent: 10,
            received: 20,
            upstream: None,
        };
        let log = StreamLog::of(&LogSettings::default(), &writer).unwrap();
        let v: serde_json::Value = serde_json::from_str(&log.line(&session)).unwrap();
        assert_eq!(v["time"], "2023-11-14T22:13:20+00:00");
        assert_eq!((v["remote_addr"].as_str(), v["remote_port"].as_u64()), (Some("192.0.2.1"), Some(4000)));
        assert_eq!((v["protocol"].as_str(), v["status"].as_u64()), (Some("UDP"), Some(200)));
        assert_eq!((v["bytes_sent"].as_u64(), v["bytes_received"].as_u64()), (Some(10), Some(20)));
        assert_eq!(v["session_time"].as_f64(), Some(1.25));
        assert_eq!((v["upstream_addr"].as_str(), v["server_port"].as_u64()), (Some(""), Some(5353)));
        let chosen = LogSettings {
            stream_format: Some(vec![StreamField {
                key: "who".into(),
                template: "$remote_addr:$remote_port via $protocol".into(),
                bare: false,
            }]),
            ..LogSettings::default()
        };
        let log = StreamLog::of(&chosen, &writer).unwrap();
        assert_eq!(log.line(&session), "{\"who\":\"192.0.2.1:4000 via UDP\"}\n");
        let off = LogSettings { stream_off: true, ..LogSettings::default() };
        assert!(StreamLog::of(&off, &writer).is_none());
    }
}
