//! Requests in flight per client address (ingress-nginx `limit-connections`, nginx's
//! `limit_conn` on a `$binary_remote_addr` zone per Ingress).
//!
//! weir multiplexes requests (HTTP/2), so it counts requests in flight rather than TCP
//! connections: a request holds a [`Slot`] from routing until its response body has been sent to
//! its end or dropped (the client went away), whichever comes first. A client's entry exists only
//! while it has a request in flight, so idle clients cost no memory.
//!
//! One [`ConnLimiter`] serves all routes of one Ingress with the same limit; a
//! [`ConnLimiterCache`] hands the live one to a new table, so a publish neither resets the counts
//! nor loses the slots of requests still running.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use crate::model::{ConnLimit, IpNet, ObjectRef, canonical_ip};

/// The requests in flight of one Ingress's clients.
#[derive(Debug)]
pub struct ConnLimiter {
    max: u32,
    exempt: Vec<IpNet>,
    clients: Mutex<HashMap<IpAddr, u32>>,
    /// The status refused requests get.
    pub status: http::StatusCode,
}

/// A request refused: its client has as many in flight as the limit allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtLimit;

/// One request in flight; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    limiter: Arc<ConnLimiter>,
    ip: IpAddr,
}

impl ConnLimiter {
    /// A limiter for `limit`.
    pub fn new(limit: &ConnLimit) -> ConnLimiter {
        ConnLimiter {
            max: limit.max,
            exempt: limit.exempt.clone(),
            clients: Mutex::new(HashMap::new()),
            status: http::StatusCode::from_u16(limit.status).unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE),
        }
    }

    /// A place for one more request from `ip`: `Ok(None)` for an exempt client, [`AtLimit`]
    /// when `ip` already has the maximum in flight.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Result<Option<Slot>, AtLimit> {
        let ip = canonical_ip(ip);
        if self.exempt.iter().any(|n| n.contains(ip)) {
            return Ok(None);
        }
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let count = clients.entry(ip).or_insert(0);
        if *count >= self.max {
            if *count == 0 {
                // `max` is 0: nothing may pass, and nothing is kept.
                clients.remove(&ip);
            }
            return Err(AtLimit);
        }
        *count += 1;
        Ok(Some(Slot { limiter: Arc::clone(self), ip }))
    }

    /// Requests in flight from `ip` (for tests and diagnostics).
    pub fn in_flight(&self, ip: IpAddr) -> u32 {
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.get(&canonical_ip(ip)).copied().unwrap_or(0)
    }

    /// Clients with a request in flight.
    pub fn clients(&self) -> usize {
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut clients = self.limiter.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = clients.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                clients.remove(&self.ip);
            }
        }
    }
}

/// The live connection limiters by Ingress and limit, so that a new table reuses the old state.
#[derive(Debug, Default)]
pub struct ConnLimiterCache(Mutex<HashMap<(ObjectRef, ConnLimit), Weak<ConnLimiter>>>);

impl ConnLimiterCache {
    /// The limiter for `origin`'s routes with `limit`: the live one, or a new one.
    pub fn get(&self, origin: &ObjectRef, limit: &ConnLimit) -> Arc<ConnLimiter> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        let key = (origin.clone(), limit.clone());
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let limiter = Arc::new(ConnLimiter::new(limit));
        map.insert(key, Arc::downgrade(&limiter));
        limiter
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limit(max: u32) -> ConnLimit {
        ConnLimit { max, exempt: vec!["10.0.0.0/8".parse().unwrap()], status: 503 }
    }

    #[test]
    fn counts_per_client_and_frees_on_drop() {
        let l = Arc::new(ConnLimiter::new(&limit(2)));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let one = l.acquire(a).unwrap().unwrap();
        let two = l.acquire(a).unwrap().unwrap();
        assert!(l.acquire(a).is_err(), "a third request from the same client is refused");
        let other = l.acquire(b).unwrap().unwrap();
        assert_eq!(l.in_flight(a), 2);
        drop(one);
        let three = l.acquire(a).unwrap().unwrap();
        drop((two, three, other));
        assert_eq!(l.clients(), 0, "idle clients leave no entry");
    }

    #[test]
    fn exempt_and_zero() {
        let l = Arc::new(ConnLimiter::new(&limit(1)));
        let inside: IpAddr = "10.1.2.3".parse().unwrap();
        let held: Vec<_> = (0..10).map(|_| l.acquire(inside).unwrap()).collect();
        assert!(held.iter().all(Option::is_none));
        assert_eq!(l.clients(), 0);
        let zero = Arc::new(ConnLimiter::new(&ConnLimit { max: 0, exempt: Vec::new(), status: 429 }));
        assert!(zero.acquire("192.0.2.1".parse().unwrap()).is_err());
        assert_eq!(zero.clients(), 0);
        assert_eq!(zero.status, http::StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn mapped_ipv4_is_the_same_client() {
        let l = Arc::new(ConnLimiter::new(&limit(1)));
        let _held = l.acquire("192.0.2.1".parse().unwrap()).unwrap();
        assert!(l.acquire("::ffff:192.0.2.1".parse().unwrap()).is_err());
    }

    #[test]
    fn cache_keeps_the_live_limiter() {
        let cache = ConnLimiterCache::default();
        let ing = ObjectRef::new("ns", "a");
        let a = cache.get(&ing, &limit(2));
        let slot = a.acquire("192.0.2.1".parse().unwrap()).unwrap();
        let b = cache.get(&ing, &limit(2));
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        // A request still in flight keeps its limiter alive for the next table.
        let c = cache.get(&ing, &limit(2));
        assert_eq!(c.in_flight("192.0.2.1".parse().unwrap()), 1);
        drop(slot);
        assert_eq!(c.clients(), 0);
    }
}
