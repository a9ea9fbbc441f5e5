//! The access log's view of the endpoints a request tried: `$upstream_addr` and
//! `$upstream_connect_time`, written nginx's way: one value per endpoint tried, comma-separated.
//! A connect time comes from the [`ConnectTime`] the upstream client puts on the responses of
//! fresh connections: `0.000` for a reused (keep-alive) connection, as nginx logs it, and `-`
//! where no connection was made.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::Response;

use super::ProxyConfig;
use super::upstream::EndpointState;
use super::upstream::client::ConnectTime;
use crate::state::balance::EndpointKey;

/// The time to connect of the connection `resp` came on; zero when it was reused.
pub(super) fn connect_time<B>(resp: &Response<B>) -> Duration {
    resp.extensions().get::<ConnectTime>().map_or(Duration::ZERO, |took| took.0)
}

/// The endpoints tried before the one that answers (only with an access log). Boxed: only
/// retried requests have any, and every request's future carries this.
#[derive(Debug, Default)]
pub(super) struct Tried(Option<Box<Earlier>>);

#[derive(Debug, Default)]
struct Earlier {
    /// `$upstream_addr`'s values, comma-separated.
    addrs: String,
    /// `$upstream_connect_time`'s.
    connect: String,
}

impl Tried {
    /// Notes `endpoint`, tried before another one, and its connection's connect time (`None`:
    /// none was made, or it broke before an answer).
    pub(super) fn note(&mut self, config: &ProxyConfig, endpoint: &EndpointState, took: Option<Duration>) {
        use std::fmt::Write as _;
        if config.access_log.is_none() {
            return;
        }
        let earlier = self.0.get_or_insert_default();
        if !earlier.addrs.is_empty() {
            earlier.addrs.push_str(", ");
            earlier.connect.push_str(", ");
        }
        let _ = write!(earlier.addrs, "{}", endpoint.key());
        push(&mut earlier.connect, took);
    }

    /// `$upstream_addr` once `last` answered, and the connect times of the endpoints before it.
    pub(super) fn finish(self, last: &EndpointState) -> (String, String) {
        match self.0 {
            None => (addr(last.key()), String::new()),
            Some(earlier) => (format!("{}, {}", earlier.addrs, last.key()), earlier.connect),
        }
    }
}

/// `key` as `{}` writes it (an IPv4 address and port without `fmt`).
fn addr(key: &EndpointKey) -> String {
    match key {
        EndpointKey::Addr(SocketAddr::V4(v4)) => {
            let mut text = Vec::with_capacity(21);
            super::accesslog_render::push_ip(&mut text, IpAddr::V4(*v4.ip()));
            text.push(b':');
            super::accesslog_render::push_u64(&mut text, u64::from(v4.port()));
            // Digits, dots and a colon.
            String::from_utf8(text).unwrap_or_else(|_| key.to_string())
        }
        other => other.to_string(),
    }
}

/// Appends one value: seconds with milliseconds, or `-`.
fn push(to: &mut String, took: Option<Duration>) {
    use std::fmt::Write as _;
    match took {
        Some(took) => {
            let _ = write!(to, "{:.3}", took.as_secs_f64());
        }
        None => to.push('-'),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fresh_connections_give_their_time_and_reused_ones_zero() {
        let mut resp = Response::new(());
        assert_eq!(connect_time(&resp), Duration::ZERO, "reused");
        resp.extensions_mut().insert(ConnectTime(Duration::from_millis(12)));
        assert_eq!(connect_time(&resp), Duration::from_millis(12));
        let mut values = String::new();
        push(&mut values, None);
        values.push_str(", ");
        push(&mut values, Some(connect_time(&resp)));
        assert_eq!(values, "-, 0.012");
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let keys = [
            EndpointKey::Addr("10.0.0.1:8080".parse().unwrap()),
            EndpointKey::Addr("255.255.255.255:65535".parse().unwrap()),
            EndpointKey::Addr("0.0.0.0:0".parse().unwrap()),
            EndpointKey::Addr("[2001:db8::1]:443".parse().unwrap()),
            EndpointKey::Dns { host: "svc.example".into(), port: 80 },
        ];
        for key in keys {
            assert_eq!(addr(&key), key.to_string());
        }
    }

    #[test]
    fn the_tried_endpoints_take_one_pointer() {
        assert_eq!(std::mem::size_of::<Tried>(), std::mem::size_of::<usize>());
    }
}
