//! Request rate limits per client address (ingress-nginx `limit-rps`, `limit-rpm`,
//! `limit-burst-multiplier`, `limit-allowlist`), with nginx's `limit_req ... burst=N nodelay`
//! semantics: a client may send `burst + 1` requests at once, then at the configured rate;
//! excess requests are refused at once (never queued).
//!
//! One [`Limiter`] serves all routes of one Ingress with the same limits (ingress-nginx keeps one
//! zone per Ingress). Limiters live in a [`LimiterCache`] so that publishing a new table keeps
//! every client's state: a table swap is not a way around a limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::model::{ObjectRef, RateLimit, canonical_ip};

/// How often (in new clients) stale client entries are swept.
const SWEEP_EVERY: usize = 4096;

/// One token bucket's parameters.
#[derive(Debug, Clone, Copy)]
struct Spec {
    /// Tokens added per second.
    rate: f64,
    /// Bucket size: `burst + 1` requests.
    capacity: f64,
}

/// A client's buckets (one per spec) and when they were last updated.
#[derive(Debug, Clone, Copy)]
struct Client {
    tokens: [f64; 2],
    at: Instant,
}

/// The rate limits of one Ingress, shared by its routes.
#[derive(Debug)]
pub struct Limiter {
    specs: Vec<Spec>,
    exempt: Vec<crate::model::IpNet>,
    clients: Mutex<(HashMap<IpAddr, Client>, usize)>,
    /// The status refused requests get.
    pub status: http::StatusCode,
}

impl Limiter {
    /// A limiter for `limit`; `None` when it limits nothing.
    pub fn new(limit: &RateLimit) -> Option<Limiter> {
        let burst = f64::from(limit.burst_multiplier.max(1));
        let mut specs = Vec::new();
        if let Some(rps) = limit.rps.filter(|r| *r > 0) {
            specs.push(Spec { rate: f64::from(rps), capacity: f64::from(rps) * burst + 1.0 });
        }
        if let Some(rpm) = limit.rpm.filter(|r| *r > 0) {
            specs.push(Spec { rate: f64::from(rpm) / 60.0, capacity: f64::from(rpm) * burst + 1.0 });
        }
        if specs.is_empty() {
            return None;
        }
        Some(Limiter {
            specs,
            exempt: limit.exempt.clone(),
            clients: Mutex::new((HashMap::new(), 0)),
            status: http::StatusCode::from_u16(limit.status).unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE),
        })
    }

    /// Whether a request from `ip` at `now` may pass; a passing request uses one token of each
    /// bucket, a refused one none.
    pub fn allow(&self, ip: IpAddr, now: Instant) -> bool {
        let ip = canonical_ip(ip);
        if self.exempt.iter().any(|n| n.contains(ip)) {
            return true;
        }
        let mut guard = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let (clients, added) = &mut *guard;
        let specs = &self.specs;
        let full = |s: &Spec| s.capacity;
        let client = match clients.get_mut(&ip) {
            Some(c) => c,
            None => {
                *added += 1;
                if *added % SWEEP_EVERY == 0 {
                    clients.retain(|_, c| !refilled(specs, c, now));
                }
                let mut tokens = [0.0; 2];
                for (t, s) in tokens.iter_mut().zip(specs) {
                    *t = full(s);
                }
                clients.entry(ip).or_insert(Client { tokens, at: now })
            }
        };
        let elapsed = now.saturating_duration_since(client.at).as_secs_f64();
        client.at = now;
        for (t, s) in client.tokens.iter_mut().zip(specs) {
            *t = (*t + elapsed * s.rate).min(s.capacity);
        }
        if client.tokens.iter().zip(specs).all(|(t, _)| *t >= 1.0) {
            for t in client.tokens.iter_mut().take(specs.len()) {
                *t -= 1.0;
            }
            true
        } else {
            false
        }
    }
}

/// Whether a client's buckets would be full by `now` (its entry can go).
fn refilled(specs: &[Spec], c: &Client, now: Instant) -> bool {
    let elapsed = now.saturating_duration_since(c.at).as_secs_f64();
    c.tokens.iter().zip(specs).all(|(t, s)| t + elapsed * s.rate >= s.capacity)
}

/// The live limiters by Ingress and limits, so that a new table reuses the old state; with the
/// connection limiters (`limit-connections`) and the external-authentication answer caches,
/// kept across tables the same way; and the request metrics' label sets.
#[derive(Debug, Default)]
pub struct LimiterCache(
    Mutex<HashMap<(ObjectRef, RateLimit), Weak<Limiter>>>,
    crate::state::connlimit::ConnLimiterCache,
    crate::state::authcache::AuthCaches,
    Arc<crate::metrics::Registry>,
);

impl LimiterCache {
    /// The request metrics' label sets, kept across tables so that counts carry over.
    pub fn metrics(&self) -> &Arc<crate::metrics::Registry> {
        &self.3
    }

    /// The live external-authentication answer caches.
    pub fn auth_caches(&self) -> &crate::state::authcache::AuthCaches {
        &self.2
    }

    /// The limiter for `origin`'s routes with `limit`: the live one, or a new one.
    pub fn get(&self, origin: &ObjectRef, limit: &RateLimit) -> Option<Arc<Limiter>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        let key = (origin.clone(), limit.clone());
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return Some(live);
        }
        let limiter = Arc::new(Limiter::new(limit)?);
        map.insert(key, Arc::downgrade(&limiter));
        Some(limiter)
    }

    /// The connection limiter for `origin`'s routes with `limit`: the live one, or a new one.
    pub fn connections(
        &self,
        origin: &ObjectRef,
        limit: &crate::model::ConnLimit,
    ) -> Arc<crate::state::connlimit::ConnLimiter> {
        self.1.get(origin, limit)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limit(rps: Option<u32>, rpm: Option<u32>, burst: u32) -> RateLimit {
        RateLimit { rps, rpm, burst_multiplier: burst, exempt: Vec::new(), status: 503 }
    }

    #[test]
    fn burst_then_rate() {
        let l = Limiter::new(&limit(Some(2), None, 1)).unwrap();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        // burst = 2 × 1: three requests pass at once, the fourth is refused.
        assert!((0..3).all(|_| l.allow(ip, t0)));
        assert!(!l.allow(ip, t0));
        // Another client has its own bucket.
        assert!(l.allow("192.0.2.2".parse().unwrap(), t0));
        // 2 r/s: one token back after 500 ms.
        assert!(l.allow(ip, t0 + Duration::from_millis(500)));
        assert!(!l.allow(ip, t0 + Duration::from_millis(500)));
    }

    #[test]
    fn per_minute_and_exempt() {
        let mut lim = limit(None, Some(60), 1);
        lim.exempt = vec!["10.0.0.0/8".parse().unwrap()];
        let l = Limiter::new(&lim).unwrap();
        let t0 = Instant::now();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!((0..100).filter(|_| l.allow(ip, t0)).count(), 61);
        assert!(l.allow(ip, t0 + Duration::from_secs(1)));
        assert!((0..1000).all(|_| l.allow("10.1.2.3".parse().unwrap(), t0)));
        assert!(Limiter::new(&limit(None, None, 5)).is_none());
    }

    #[test]
    fn cache_keeps_state_for_the_same_ingress_and_limits() {
        let cache = LimiterCache::default();
        let ing = ObjectRef::new("ns", "a");
        let a = cache.get(&ing, &limit(Some(1), None, 1)).unwrap();
        let b = cache.get(&ing, &limit(Some(1), None, 1)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = cache.get(&ing, &limit(Some(2), None, 1)).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        drop((a, b));
        let d = cache.get(&ing, &limit(Some(1), None, 1)).unwrap();
        assert_eq!(d.specs.len(), 1, "a new limiter once nothing used the old one");
    }
}
