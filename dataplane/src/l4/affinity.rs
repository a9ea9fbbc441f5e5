//! ClientIP session affinity of an L4 service (a Service's `sessionAffinity: ClientIP`): each
//! client address sticks to the endpoint it last reached until it has not started a connection
//! or flow for the timeout. The table is kept across publishes while the service's backend
//! stays, keyed by endpoint identity, so a publish neither moves clients nor forgets them; a
//! client whose endpoint left the table (or refused) is balanced again and sticks to the new one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::state::balance::{Balancer, EndpointKey};

/// Expired entries are swept when the table has grown by this many since the last sweep.
const SWEEP_EVERY: usize = 1024;

/// Where each client address went last, and when.
#[derive(Debug, Default)]
pub(crate) struct AffinityTable {
    inner: Mutex<Clients>,
}

#[derive(Debug, Default)]
struct Clients {
    by_ip: HashMap<IpAddr, Entry>,
    /// Size of `by_ip` after the last sweep.
    swept_at: usize,
}

#[derive(Debug)]
struct Entry {
    endpoint: EndpointKey,
    last: Instant,
}

impl AffinityTable {
    /// The index in `balancer` of the endpoint `client` sticks to at `now`, if its entry has
    /// not expired after `timeout` and the endpoint is still in the balancer.
    pub(crate) fn lookup<S>(
        &self,
        client: IpAddr,
        balancer: &Balancer<S>,
        timeout: Duration,
        now: Instant,
    ) -> Option<usize> {
        let clients = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let entry = clients.by_ip.get(&client)?;
        if now.saturating_duration_since(entry.last) >= timeout {
            return None;
        }
        balancer.endpoints().iter().position(|e| *e.key() == entry.endpoint)
    }

    /// Records that `client` reached `endpoint` at `now` (its timeout starts again).
    pub(crate) fn record(&self, client: IpAddr, endpoint: &EndpointKey, timeout: Duration, now: Instant) {
        let mut clients = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match clients.by_ip.get_mut(&client) {
            Some(entry) => {
                if entry.endpoint != *endpoint {
                    entry.endpoint = endpoint.clone();
                }
                entry.last = now;
            }
            None => {
                clients.by_ip.insert(client, Entry { endpoint: endpoint.clone(), last: now });
            }
        }
        // Bounded by the clients seen within one timeout: expired entries go in batches.
        if clients.by_ip.len() >= clients.swept_at + SWEEP_EVERY {
            clients.by_ip.retain(|_, e| now.saturating_duration_since(e.last) < timeout);
            clients.swept_at = clients.by_ip.len();
        }
    }

    /// Clients with an entry (expired or not), for tests.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).by_ip.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{Backend, BackendId, Endpoint, Target, UpstreamProtocol};
    use std::net::SocketAddr;

    fn balancer(previous: Option<&Balancer>, ports: &[u16]) -> Balancer {
        let id: BackendId = "default/sticky:80".parse().unwrap();
        let target = Target::Endpoints(
            ports.iter().map(|p| Endpoint::new(SocketAddr::from(([10, 0, 0, 1], *p)))).collect(),
        );
        Balancer::next(previous, &id, &Backend { protocol: UpstreamProtocol::default(), target, tls: None })
    }

    fn key(port: u16) -> EndpointKey {
        EndpointKey::Addr(SocketAddr::from(([10, 0, 0, 1], port)))
    }

    #[test]
    fn a_client_sticks_until_its_timeout_and_across_publishes() {
        let table = AffinityTable::default();
        let timeout = Duration::from_secs(10);
        let t0 = Instant::now();
        let client: IpAddr = "192.0.2.2".parse().unwrap();
        let other: IpAddr = "192.0.2.3".parse().unwrap();
        let b1 = balancer(None, &[1, 2, 3]);
        assert_eq!(table.lookup(client, &b1, timeout, t0), None, "a new client has no endpoint");
        table.record(client, &key(2), timeout, t0);
        assert_eq!(table.lookup(client, &b1, timeout, t0 + Duration::from_secs(9)), Some(1));
        assert_eq!(table.lookup(other, &b1, timeout, t0), None, "only that client sticks");
        // Each connection restarts the timeout.
        table.record(client, &key(2), timeout, t0 + Duration::from_secs(9));
        assert_eq!(table.lookup(client, &b1, timeout, t0 + Duration::from_secs(18)), Some(1));
        // A publish that reorders the endpoints keeps the client on its endpoint.
        let b2 = balancer(Some(&b1), &[0, 2, 3]);
        assert_eq!(table.lookup(client, &b2, timeout, t0 + Duration::from_secs(18)), Some(1));
        let b3 = balancer(Some(&b2), &[2, 7]);
        assert_eq!(table.lookup(client, &b3, timeout, t0 + Duration::from_secs(18)), Some(0));
        // Expired: balanced again.
        assert_eq!(table.lookup(client, &b3, timeout, t0 + Duration::from_secs(19)), None);
        // Its endpoint gone: balanced again; the new endpoint then sticks.
        table.record(client, &key(2), timeout, t0 + Duration::from_secs(20));
        let b4 = balancer(Some(&b3), &[7, 8]);
        assert_eq!(table.lookup(client, &b4, timeout, t0 + Duration::from_secs(20)), None);
        table.record(client, &key(8), timeout, t0 + Duration::from_secs(20));
        assert_eq!(table.lookup(client, &b4, timeout, t0 + Duration::from_secs(21)), Some(1));
    }

    #[test]
    fn expired_clients_are_swept() {
        let table = AffinityTable::default();
        let timeout = Duration::from_secs(1);
        let t0 = Instant::now();
        for i in 0..SWEEP_EVERY as u32 - 1 {
            table.record(IpAddr::from(i.to_be_bytes()), &key(1), timeout, t0);
        }
        assert_eq!(table.len(), SWEEP_EVERY - 1);
        // Past the timeout, the next new client sweeps the expired ones.
        table.record("192.0.2.9".parse().unwrap(), &key(1), timeout, t0 + Duration::from_secs(2));
        assert_eq!(table.len(), 1);
    }
}
