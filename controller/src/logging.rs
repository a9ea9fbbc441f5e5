//! weir's error log (the `tracing` events on standard error) and the table's logging keys that
//! change it at run time: `error-log-level` swaps the filter, `enable-syslog` also ships every
//! event to a syslog server (RFC 5424 over UDP, facility `local7`, message id `error`). And
//! `SIGUSR1` reopens the access logs' files, as log rotators expect.

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};
use weir_dataplane::l4::L4Proxy;
use weir_dataplane::model::logging::{LogSettings, Syslog};
use weir_dataplane::proxy::Proxy;
use weir_dataplane::proxy::syslog::{Sender, Severity};

/// What [`apply`] changes.
struct Live {
    filter: reload::Handle<EnvFilter, Registry>,
    /// The `--log-level` (or `RUST_LOG`) filter, used while the table sets no level.
    flag: String,
    /// The filter and syslog server applied last.
    level: String,
    syslog: Option<Syslog>,
}

static LIVE: OnceLock<Mutex<Live>> = OnceLock::new();
/// The syslog client events are also sent to, when `enable-syslog` is on.
static SYSLOG: Mutex<Option<Sender>> = Mutex::new(None);

/// Installs the error log: events matching `spec` (a tracing filter) on standard error.
pub fn init(spec: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(crate::cli::log_filter(spec)).map_err(|e| e.to_string())?;
    let (filter, handle) = reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let syslog = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .without_time()
        .with_writer(|| SyslogEvent(Vec::new()))
        .with_filter(tracing_subscriber::filter::filter_fn(|_| syslog_on()));
    tracing_subscriber::registry()
        .with(filter)
        .with(stderr)
        .with(syslog)
        .try_init()
        .map_err(|e| e.to_string())?;
    let live = Live { filter: handle, flag: spec.to_string(), level: spec.to_string(), syslog: None };
    let _ = LIVE.set(Mutex::new(live));
    Ok(())
}

fn syslog_on() -> bool {
    SYSLOG.lock().map(|s| s.is_some()).unwrap_or(false)
}

/// Applies the table's `error-log-level` and `enable-syslog` (no-op unless [`init`] ran).
pub fn apply(settings: &LogSettings) {
    let Some(live) = LIVE.get() else { return };
    let mut live = live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let level = settings.error_level.clone().unwrap_or_else(|| live.flag.clone());
    if level != live.level {
        match EnvFilter::try_new(crate::cli::log_filter(&level)) {
            Ok(filter) => match live.filter.reload(filter) {
                Ok(()) => {
                    tracing::info!(level, "error-log-level applied");
                    live.level = level;
                }
                Err(error) => tracing::error!(%error, "cannot change the log level"),
            },
            Err(error) => tracing::error!(level, %error, "error-log-level unusable; ignored"),
        }
    }
    if settings.syslog != live.syslog {
        let sender = settings.syslog.as_ref().and_then(|s| match Sender::connect(&s.host, s.port, "error") {
            Ok(sender) => Some(sender),
            Err(error) => {
                tracing::error!(host = s.host, port = s.port, %error, "cannot reach the syslog server; the error log is not shipped");
                None
            }
        });
        *SYSLOG.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = sender;
        live.syslog = settings.syslog.clone();
    }
}

/// One formatted event, sent to syslog when dropped.
struct SyslogEvent(Vec<u8>);

impl std::io::Write for SyslogEvent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for SyslogEvent {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        let text = text.trim_end();
        if text.is_empty() {
            return;
        }
        // The level is the event's first word (the layer prints no time).
        let severity = match text.split_whitespace().next() {
            Some("ERROR") => Severity::Error,
            Some("WARN") => Severity::Warning,
            Some("DEBUG" | "TRACE") => Severity::Debug,
            _ => Severity::Info,
        };
        if let Ok(guard) = SYSLOG.lock()
            && let Some(sender) = guard.as_ref()
        {
            // A lost datagram is not worth an event (which would come back here).
            let _ = sender.send(severity, text);
        }
    }
}

/// Reopens the access logs' files (HTTP and L4) on each `SIGUSR1` (after logrotate moved them).
pub fn reopen_on_sigusr1(proxy: Proxy, l4: L4Proxy) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::user_defined1()) {
            Ok(mut usr1) => {
                tokio::spawn(async move {
                    while usr1.recv().await.is_some() {
                        tracing::info!("SIGUSR1: reopening the access log");
                        proxy.access_log().reopen();
                        l4.reopen_log();
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGUSR1; the access log is not reopened on rotation")
            }
        }
    }
}
