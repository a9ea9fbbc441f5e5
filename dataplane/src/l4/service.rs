//! What the listeners of one port share: the port's service as the live table has it, with
//! the table's stream settings, and the stop signal of a removed port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::affinity::AffinityTable;
use crate::model::{L4Service, Settings};
use crate::state::balance::Balancer;
use std::net::IpAddr;

/// Tunables of an [`super::L4Proxy`] that no table changes.
#[derive(Clone, Debug)]
pub struct L4Config {
    /// The address L4 ports listen on; `None`: every address (`[::]`, which takes IPv4 too;
    /// `0.0.0.0` where IPv6 is off).
    pub listen: Option<IpAddr>,
    /// UDP flows kept per port; past it the oldest flow is evicted.
    pub udp_max_flows: usize,
    /// Bytes buffered per direction of a TCP connection.
    pub buffer: usize,
    /// Time allowed to connect to an endpoint when the table sets no `proxy-connect-timeout`.
    pub connect_timeout: Duration,
    /// Relay TCP connections with splice(2) (zero-copy, Linux) where pipes are to be had;
    /// `false`: always through the copy buffer.
    pub zero_copy: bool,
    /// Threads that run the listeners and connections (at least one).
    pub threads: usize,
}

impl Default for L4Config {
    fn default() -> Self {
        L4Config {
            listen: None,
            udp_max_flows: 16_384,
            buffer: 64 * 1024,
            connect_timeout: Duration::from_secs(5),
            zero_copy: true,
            threads: 1,
        }
    }
}

/// The stream settings of a table (`proxy-stream-*`), with their defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stream {
    /// `proxy-stream-timeout`.
    pub(crate) idle: Duration,
    /// `proxy-connect-timeout`.
    pub(crate) connect_timeout: Duration,
    /// Connect attempts in all (`proxy-stream-next-upstream-tries`, 1 when
    /// `proxy-stream-next-upstream` is off; 0: every endpoint).
    pub(crate) tries: usize,
    /// `proxy-stream-next-upstream-timeout`.
    pub(crate) next_upstream_timeout: Option<Duration>,
    /// `proxy-stream-responses`; 0: no limit.
    pub(crate) responses: u32,
    /// The PROXY header sent upstream is v2.
    pub(crate) v2: bool,
}

impl Stream {
    pub(crate) fn of(settings: &Settings, config: &L4Config) -> Stream {
        let next = settings.stream_next_upstream.unwrap_or(true);
        Stream {
            idle: settings.stream_timeout(),
            connect_timeout: settings
                .connect_timeout_ms
                .map_or(config.connect_timeout, Duration::from_millis),
            tries: if next { settings.stream_next_upstream_tries.unwrap_or(3) as usize } else { 1 },
            next_upstream_timeout: settings
                .stream_next_upstream_timeout_ms
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            responses: settings.stream_responses.unwrap_or(1),
            v2: settings.stream_proxy_protocol_v2.unwrap_or(false),
        }
    }
}

/// One port's service as the live table has it.
#[derive(Debug)]
pub(crate) struct Service {
    pub(crate) spec: L4Service,
    pub(crate) balancer: Arc<Balancer>,
    pub(crate) stream: Stream,
    /// The L4 access log; `None`: off.
    pub(crate) log: Option<Arc<super::log::StreamLog>>,
    /// Where each client went (ClientIP affinity), kept across publishes with the balancer.
    pub(crate) affinity: Arc<AffinityTable>,
}

impl Service {
    /// The affinity timeout, when the service has ClientIP affinity.
    pub(crate) fn affinity_timeout(&self) -> Option<Duration> {
        self.spec.client_ip_affinity_s.map(|s| Duration::from_secs(u64::from(s.max(1))))
    }

    /// The endpoint a new connection or flow of `client` tries first: the one it sticks to,
    /// else the next in round-robin order (skipping `tried`).
    pub(crate) fn pick_for(&self, client: IpAddr, tried: &[usize]) -> Option<usize> {
        if tried.is_empty()
            && let Some(timeout) = self.affinity_timeout()
            && let Some(i) = self.affinity.lookup(client, &self.balancer, timeout, Instant::now())
        {
            return Some(i);
        }
        self.balancer.pick_untried(tried)
    }

    /// Records that `client` reached endpoint `i` (with ClientIP affinity).
    pub(crate) fn reached(&self, client: IpAddr, i: usize) {
        if let Some(timeout) = self.affinity_timeout()
            && let Some(endpoint) = self.balancer.endpoints().get(i)
        {
            self.affinity.record(client, endpoint.key(), timeout, Instant::now());
        }
    }
}

/// Resolves when `stop` turns true or its sender is gone.
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
