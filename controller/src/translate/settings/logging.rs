//! The ConfigMap's logging keys: which requests the access log records and where it goes
//! (`disable-access-log`, `skip-access-log-urls`, `enable-access-log-for-default-backend`,
//! `access-log-path`, `http-access-log-path`), the error log (`error-log-level`,
//! `error-log-path`) and syslog (`enable-syslog`, `syslog-host`, `syslog-port`). Paths are
//! typed (`off`, `stdout`, an absolute file), levels are nginx's names mapped onto weir's log
//! filter; nothing is passed on as text.

use weir_dataplane::model::logging::{LogSettings, StreamField, Syslog};
use weir_dataplane::vars::{Dialect, Template};

use super::Ctx;
use crate::translate::annotations::values;
use crate::translate::warnings::Reason;

/// Where ingress-nginx's image links the access log to standard output.
const NGINX_ACCESS_LOG: &str = "/var/log/nginx/access.log";
/// Where ingress-nginx's image links the error log to standard error.
const NGINX_ERROR_LOG: &str = "/var/log/nginx/error.log";

/// `access-log-params`: refused, with this reason.
pub(super) const ACCESS_LOG_PARAMS: &str = "nginx's access_log parameters (buffer, gzip, flush, if) tune nginx's own writer; weir writes through a bounded queue and one writer thread, flushed after each batch (--access-log-queue), and chooses requests with skip-access-log-urls and enable-access-log";

impl Ctx<'_, '_> {
    /// The logging keys.
    pub(super) fn logging(&mut self) -> LogSettings {
        let off = |v: Option<&str>| v.map(values::boolean) == Some(Ok(true));
        self.error_log_path();
        LogSettings {
            // Reported by `access_log` when invalid.
            access_log_off: off(self.raw("disable-access-log")) || off(self.raw("disable-http-access-log")),
            skip_urls: self.value("skip-access-log-urls", urls, "none").unwrap_or_default(),
            default_backend: self
                .value("enable-access-log-for-default-backend", values::boolean, "false")
                .unwrap_or(false),
            path: self.access_log_path(),
            error_level: self.value("error-log-level", error_level, "--log-level, else info"),
            syslog: self.syslog(),
            stream_off: off(self.raw("disable-access-log")) || off(self.raw("disable-stream-access-log")),
            stream_format: self.stream_format(),
            stream_path: self.value("stream-access-log-path", log_path, "--access-log"),
            auth: self.value("enable-auth-access-log", values::boolean, "false").unwrap_or(false),
        }
    }

    /// `log-format-stream`: JSON as `log-format-upstream`, with nginx's stream variables.
    fn stream_format(&mut self) -> Option<Vec<StreamField>> {
        let _ = self.value("disable-stream-access-log", values::boolean, "false");
        let raw = self.raw("log-format-stream")?;
        let parsed = super::log_format_with(raw, |key, template, bare| {
            Template::parse(template, Dialect::StreamLog)
                .map(|_| StreamField { key, template: template.to_string(), bare })
                .map_err(|rejected| format!("{rejected} (use {})", Dialect::StreamLog.hint()))
        });
        let (fields, dropped) = match parsed {
            Ok(parsed) => parsed,
            Err(why) => {
                self.error(
                    Reason::InvalidSetting,
                    format!("data[log-format-stream]: invalid value: {why}; the default fields are logged"),
                );
                return None;
            }
        };
        for (key, why) in dropped {
            self.warn(
                Reason::InvalidSetting,
                format!("data[log-format-stream]: field {key:?}: {why}; the field is left out"),
            );
        }
        (!fields.is_empty()).then_some(fields)
    }

    /// `http-access-log-path`, else `access-log-path`: `off`, `stdout` or an absolute file path.
    fn access_log_path(&mut self) -> Option<String> {
        let http = self.value("http-access-log-path", log_path, "--access-log");
        let both = self.value("access-log-path", log_path, "--access-log");
        http.or(both)
    }

    /// `enable-syslog` with `syslog-host` and `syslog-port` (default 514).
    fn syslog(&mut self) -> Option<Syslog> {
        let on = self.value("enable-syslog", values::boolean, "false") == Some(true);
        let host = self.value("syslog-host", values::host, "none");
        let port = self.value("syslog-port", values::port, "514");
        if !on {
            self.unused_without(&["syslog-host", "syslog-port"], "enable-syslog: \"true\"");
            return None;
        }
        match host {
            Some(host) => Some(Syslog { host, port: port.unwrap_or(514) }),
            None => {
                self.error(
                    Reason::InvalidSetting,
                    "data[enable-syslog]: syslog-host is not set; nothing is sent to syslog".to_string(),
                );
                None
            }
        }
    }
}

impl Ctx<'_, '_> {
    /// `error-log-path`: the error log goes to standard error; another path is refused.
    fn error_log_path(&mut self) {
        if let Some(path) = self.raw("error-log-path")
            && path != NGINX_ERROR_LOG
            && path != "/dev/stderr"
        {
            self.error(
                Reason::InvalidSetting,
                format!("data[error-log-path]: {path:?} refused: weir writes its error log to standard error (ingress-nginx's {NGINX_ERROR_LOG} is a link to it), where the container runtime collects it; ship it elsewhere with enable-syslog"),
            );
        }
    }
}

/// `skip-access-log-urls`: comma-separated request targets (`/healthz,/metrics`), each compared
/// with `$request_uri`.
fn urls(v: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = v.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from).collect();
    match urls.iter().find(|u| !u.starts_with('/') || u.bytes().any(|b| b.is_ascii_control() || b == b' ')) {
        Some(bad) => Err(format!("{bad:?} is not a request target starting with /")),
        None => Ok(urls),
    }
}

/// An access-log destination: `off`, `stdout` (also `/dev/stdout` and ingress-nginx's
/// `/var/log/nginx/access.log`, which its image links to standard output) or an absolute path.
fn log_path(v: &str) -> Result<String, String> {
    match v {
        "off" | "/dev/null" => Ok("off".into()),
        "stdout" | "/dev/stdout" | NGINX_ACCESS_LOG => Ok("stdout".into()),
        v if v.starts_with("syslog:") => {
            Err("nginx's syslog: destinations are not paths; use enable-syslog, syslog-host and syslog-port"
                .into())
        }
        v if v.starts_with('/') && !v.bytes().any(|b| b.is_ascii_control()) && !v.ends_with('/') => {
            Ok(v.into())
        }
        _ => Err("expected off, /dev/stdout or an absolute file path".into()),
    }
}

/// `error-log-level`: nginx's levels onto weir's (`notice` is `info`; `crit`, `alert` and
/// `emerg` are `error`, weir's most severe).
pub(crate) fn error_level(v: &str) -> Result<String, String> {
    Ok(match v {
        "debug" => "debug",
        "info" | "notice" => "info",
        "warn" => "warn",
        "error" | "crit" | "alert" | "emerg" => "error",
        _ => return Err("expected debug, info, notice, warn, error, crit, alert or emerg".into()),
    }
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_typed() {
        assert_eq!(urls("/healthz, /metrics"), Ok(vec!["/healthz".to_string(), "/metrics".to_string()]));
        assert!(urls("healthz").is_err());
        assert_eq!(log_path(NGINX_ACCESS_LOG).as_deref(), Ok("stdout"));
        assert_eq!(log_path("/dev/null").as_deref(), Ok("off"));
        assert_eq!(log_path("/var/log/weir/access.log").as_deref(), Ok("/var/log/weir/access.log"));
        assert!(log_path("syslog:server=1.2.3.4").is_err());
        assert!(log_path("access.log").is_err());
        for (nginx, weir) in
            [("debug", "debug"), ("notice", "info"), ("warn", "warn"), ("crit", "error"), ("emerg", "error")]
        {
            assert_eq!(error_level(nginx).as_deref(), Ok(weir));
        }
        assert!(error_level("trace").is_err());
        assert_eq!(values::host("Syslog.Example.com").as_deref(), Ok("syslog.example.com"));
        assert_eq!(values::host("::1").as_deref(), Ok("::1"));
        assert!(values::host("a b").is_err());
    }
}
