//! Log lines shipped to a syslog server over UDP, one RFC 5424 message per line
//! (`enable-syslog`, `syslog-host`, `syslog-port`): the access log (facility `local7`, severity
//! `info`, as nginx's `syslog:` destination sends it) and, from the controller, the error log.

use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::SystemTime;

/// nginx's facility for `syslog:` destinations.
pub const LOCAL7: u8 = 23;

/// RFC 5424 severities weir sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// 3.
    Error,
    /// 4.
    Warning,
    /// 6.
    Info,
    /// 7.
    Debug,
}

/// A UDP syslog client sending one message per line written (a partial line waits for its end).
#[derive(Debug)]
pub struct Sender {
    socket: UdpSocket,
    target: SocketAddr,
    msgid: &'static str,
    hostname: String,
    pending: Vec<u8>,
}

impl Sender {
    /// A client of `host:port` (resolved now) tagging its messages `msgid`.
    pub fn connect(host: &str, port: u16, msgid: &'static str) -> io::Result<Sender> {
        let target = (host, port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")))?;
        let bind: SocketAddr =
            if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let socket = UdpSocket::bind(bind)?;
        Ok(Sender { socket, target, msgid, hostname: hostname(), pending: Vec::new() })
    }

    /// Sends one message.
    pub fn send(&self, severity: Severity, text: &str) -> io::Result<()> {
        let message = frame(LOCAL7, severity, &self.hostname, self.msgid, text, SystemTime::now());
        self.socket.send_to(message.as_bytes(), self.target).map(|_| ())
    }
}

impl Write for Sender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line[..end]);
            self.send(Severity::Info, &text)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// This machine's host name (`-` when unknown), as RFC 5424's HOSTNAME.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| "-".to_string())
}

/// One RFC 5424 message: `<PRI>1 TIMESTAMP HOSTNAME weir PROCID MSGID - MSG`.
pub fn frame(
    facility: u8,
    severity: Severity,
    hostname: &str,
    msgid: &str,
    text: &str,
    time: SystemTime,
) -> String {
    let severity = match severity {
        Severity::Error => 3,
        Severity::Warning => 4,
        Severity::Info => 6,
        Severity::Debug => 7,
    };
    let pri = u32::from(facility) * 8 + severity;
    let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    let millis = since.subsec_millis();
    let pid = std::process::id();
    format!(
        "<{pri}>1 {year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z {hostname} weir {pid} {msgid} - {text}"
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(days: u64) -> (u64, u32, u32) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_rfc_5424() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        let m = frame(LOCAL7, Severity::Info, "node-1", "access", "{\"status\":200}", t);
        let pid = std::process::id();
        assert_eq!(
            m,
            format!("<190>1 2023-11-14T22:13:20.123Z node-1 weir {pid} access - {{\"status\":200}}")
        );
        assert!(frame(LOCAL7, Severity::Error, "-", "error", "x", t).starts_with("<187>1 "));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn each_line_is_one_datagram() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        let mut sender = Sender::connect("127.0.0.1", port, "access").unwrap();
        sender.write_all(b"one\ntw").unwrap();
        sender.write_all(b"o\n").unwrap();
        let mut buf = [0u8; 512];
        for want in ["one", "two"] {
            let n = server.recv(&mut buf).unwrap();
            let text = std::str::from_utf8(&buf[..n]).unwrap();
            assert!(text.starts_with("<190>1 ") && text.ends_with(&format!(" access - {want}")), "{text}");
        }
    }
}
