//! The logging settings of the table (ingress-nginx's logging keys, typed by translation): which
//! requests and connections the access log records and where it goes, the error log's level, and
//! syslog. Every field is optional: `None` (or empty) keeps the proxy's own value.

use serde::{Deserialize, Serialize};

/// Global logging settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// No HTTP access log at all (`disable-access-log`, `disable-http-access-log`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub access_log_off: bool,
    /// Request targets never logged (`skip-access-log-urls`), compared with `$request_uri`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_urls: Vec<String>,
    /// Requests no Ingress rule took are logged too (`enable-access-log-for-default-backend`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default_backend: bool,
    /// Where the access log goes (`access-log-path`, `http-access-log-path`): `off`, `stdout`
    /// or an absolute file path; `None`: the `--access-log` flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The error log's level (`error-log-level`) as a tracing filter directive (`info`,
    /// `warn`...); `None`: the `--log-level` flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_level: Option<String>,
    /// Ship the logs to a syslog server over UDP (`enable-syslog`, `syslog-host`,
    /// `syslog-port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syslog: Option<Syslog>,
    /// No L4 access log (`disable-stream-access-log`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_off: bool,
    /// The L4 access log's fields (`log-format-stream`); `None`: the default ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_format: Option<Vec<StreamField>>,
    /// Where the L4 access log goes (`stream-access-log-path`), as [`LogSettings::path`];
    /// `None`: where the HTTP access log goes by the flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_path: Option<String>,
    /// auth-url subrequests get a line of their own (`enable-auth-access-log`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auth: bool,
}

/// One field of the L4 access log's JSON line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamField {
    /// The JSON key.
    pub key: String,
    /// The value: text with nginx stream `$variables` (checked by translation).
    pub template: String,
    /// Written as a bare JSON value (a number, or `null` when unknown).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bare: bool,
}

/// A syslog server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Syslog {
    /// Its host name or address.
    pub host: String,
    /// Its UDP port.
    pub port: u16,
}

impl LogSettings {
    /// Whether nothing is set.
    pub fn is_default(&self) -> bool {
        *self == LogSettings::default()
    }
}
