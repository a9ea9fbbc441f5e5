//! The server's TLS session cache: what lets a returning client resume its session (an
//! abbreviated handshake: no certificate, no signature) instead of a full handshake.
//!
//! Stateful resumption, as ingress-nginx does by default (`ssl_session_cache shared:SSL:10m`,
//! `ssl_session_timeout 10m`, tickets off): TLS 1.2 session IDs and TLS 1.3 tickets name an entry
//! here, and a TLS 1.3 ticket is used once. One cache serves every server config without client
//! authentication (the listener's own and the one of `ssl-protocols`/`ssl-ciphers`), and it
//! lives as long as the proxy, so a new routing table keeps the sessions. Configs that ask for
//! client certificates keep rustls's own small cache each: a session made without a client
//! certificate must never resume where one is required.
//!
//! Bounded in entries (the oldest goes first) and in age: an entry older than the timeout is
//! not resumed. Both bounds follow the table's settings (`ssl-session-cache`,
//! `ssl-session-cache-size`, `ssl-session-timeout`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Sessions kept by default: ingress-nginx's `ssl-session-cache-size` of 10m, at nginx's
/// "about 4000 sessions per megabyte".
pub const DEFAULT_SESSIONS: usize = 40_000;
/// How long a session can be resumed by default (ingress-nginx's `ssl-session-timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Sessions per megabyte of an nginx `ssl_session_cache` size.
pub const SESSIONS_PER_MIB: u64 = 4000;

/// The session cache (see the module docs).
pub struct SessionCache {
    inner: Mutex<Sessions>,
}

struct Sessions {
    capacity: usize,
    timeout: Duration,
    /// Key → (stored at, value).
    map: HashMap<Vec<u8>, (Instant, Vec<u8>)>,
    /// Keys in the order they were stored, with the time that tells a re-stored key apart.
    /// Holds keys already taken too, until eviction or compaction passes them.
    order: VecDeque<(Vec<u8>, Instant)>,
}

impl Default for SessionCache {
    fn default() -> Self {
        SessionCache::new(DEFAULT_SESSIONS, DEFAULT_TIMEOUT)
    }
}

impl std::fmt::Debug for SessionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("SessionCache")
            .field("capacity", &s.capacity)
            .field("timeout", &s.timeout)
            .field("len", &s.map.len())
            .finish()
    }
}

impl SessionCache {
    /// A cache of up to `capacity` sessions (0: none, resumption off) resumable for `timeout`.
    pub fn new(capacity: usize, timeout: Duration) -> SessionCache {
        SessionCache {
            inner: Mutex::new(Sessions { capacity, timeout, map: HashMap::new(), order: VecDeque::new() }),
        }
    }

    /// Applies new bounds; sessions beyond the new capacity go, oldest first.
    pub fn configure(&self, capacity: usize, timeout: Duration) {
        let mut s = self.lock();
        if (s.capacity, s.timeout) == (capacity, timeout) {
            return;
        }
        s.capacity = capacity;
        s.timeout = timeout;
        s.evict_to(capacity);
        if capacity == 0 {
            s.map = HashMap::new();
            s.order = VecDeque::new();
        }
    }

    /// Sessions held now (expired ones included until they are evicted or looked up).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // Whatever step a panic interrupted, the map and the queue are consistent with each
        // other (the queue may name keys the map no longer has, which every reader allows), so
        // a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn put_at(&self, key: Vec<u8>, value: Vec<u8>, now: Instant) -> bool {
        let mut s = self.lock();
        if s.capacity == 0 {
            return false;
        }
        let capacity = s.capacity;
        s.evict_to(capacity - 1);
        s.order.push_back((key.clone(), now));
        s.map.insert(key, (now, value));
        // Taken keys stay in `order` until they reach its front; keep it within twice the
        // capacity (amortized: a compaction follows at least `capacity` puts).
        if s.order.len() > 2 * capacity + 16 {
            let Sessions { map, order, .. } = &mut *s;
            order.retain(|(k, at)| map.get(k).is_some_and(|(stored, _)| stored == at));
        }
        true
    }

    fn get_at(&self, key: &[u8], now: Instant, take: bool) -> Option<Vec<u8>> {
        let mut s = self.lock();
        let timeout = s.timeout;
        let fresh = match s.map.get(key) {
            None => return None,
            Some((stored, _)) => now.saturating_duration_since(*stored) < timeout,
        };
        if take || !fresh {
            let (_, value) = s.map.remove(key)?;
            return fresh.then_some(value);
        }
        s.map.get(key).map(|(_, value)| value.clone())
    }
}

impl Sessions {
    /// Drops the oldest sessions until at most `keep` remain.
    fn evict_to(&mut self, keep: usize) {
        while self.map.len() > keep {
            let Some((key, at)) = self.order.pop_front() else { break };
            if self.map.get(&key).is_some_and(|(stored, _)| *stored == at) {
                self.map.remove(&key);
            }
        }
    }
}

impl rustls::server::StoresServerSessions for SessionCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.put_at(key, value, Instant::now())
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.get_at(key, Instant::now(), false)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.get_at(key, Instant::now(), true)
    }

    fn can_cache(&self) -> bool {
        self.lock().capacity > 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    #[test]
    fn the_oldest_session_goes_first_and_taken_ones_are_gone() {
        let cache = SessionCache::new(3, DEFAULT_TIMEOUT);
        let now = Instant::now();
        for i in 0..3 {
            assert!(cache.put_at(key(i), vec![i as u8], now));
        }
        assert_eq!(cache.get_at(&key(0), now, false), Some(vec![0]), "get leaves it");
        assert!(cache.put_at(key(3), vec![3], now));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get_at(&key(0), now, false), None, "the oldest was evicted");
        assert_eq!(cache.get_at(&key(1), now, true), Some(vec![1]), "take returns it once");
        assert_eq!(cache.get_at(&key(1), now, true), None);
        assert!(cache.put_at(key(4), vec![4], now));
        assert_eq!(cache.len(), 3, "a taken entry freed its place: nothing else went");
        for i in 2..5 {
            assert_eq!(cache.get_at(&key(i), now, false), Some(vec![i as u8]), "{i}");
        }
    }

    #[test]
    fn a_session_older_than_the_timeout_does_not_resume() {
        let cache = SessionCache::new(10, Duration::from_secs(600));
        let then = Instant::now();
        assert!(cache.put_at(key(1), vec![1], then));
        assert!(cache.put_at(key(2), vec![2], then));
        let later = then + Duration::from_secs(599);
        assert_eq!(cache.get_at(&key(1), later, false), Some(vec![1]));
        let expired = then + Duration::from_secs(600);
        assert_eq!(cache.get_at(&key(1), expired, false), None);
        assert_eq!(cache.get_at(&key(2), expired, true), None);
        assert_eq!(cache.len(), 0, "expired entries are dropped when looked up");
        // A shorter timeout applies to what is already stored.
        assert!(cache.put_at(key(3), vec![3], then));
        cache.configure(10, Duration::from_secs(60));
        assert_eq!(cache.get_at(&key(3), then + Duration::from_secs(61), false), None);
    }

    #[test]
    fn capacity_zero_turns_resumption_off_and_shrinking_evicts_the_oldest() {
        use rustls::server::StoresServerSessions;
        let cache = SessionCache::new(4, DEFAULT_TIMEOUT);
        let now = Instant::now();
        for i in 0..4 {
            cache.put_at(key(i), vec![0], now);
        }
        cache.configure(2, DEFAULT_TIMEOUT);
        assert_eq!(cache.len(), 2);
        assert!(cache.get_at(&key(1), now, false).is_none() && cache.get_at(&key(3), now, false).is_some());
        cache.configure(0, DEFAULT_TIMEOUT);
        assert!(!cache.can_cache());
        assert!(!cache.put(key(9), vec![9]));
        assert!(cache.is_empty());
        cache.configure(2, DEFAULT_TIMEOUT);
        assert!(cache.can_cache() && cache.put(key(9), vec![9]));
        assert_eq!(cache.get(&key(9)), Some(vec![9]));
    }

    #[test]
    fn the_order_queue_stays_bounded_when_every_session_is_taken() {
        // TLS 1.3: every resumption takes its ticket, so the map rarely fills and only
        // compaction keeps the queue of keys in check.
        let cache = SessionCache::new(100, DEFAULT_TIMEOUT);
        let now = Instant::now();
        for i in 0..10_000 {
            cache.put_at(key(i), vec![1], now);
            assert!(cache.get_at(&key(i), now, true).is_some());
        }
        let s = cache.lock();
        assert!(s.map.is_empty());
        assert!(s.order.len() <= 2 * 100 + 16, "{}", s.order.len());
    }

    #[test]
    fn a_key_stored_again_keeps_its_newest_value_and_place() {
        let cache = SessionCache::new(3, DEFAULT_TIMEOUT);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        cache.put_at(key(1), vec![1], at(0));
        cache.put_at(key(2), vec![2], at(1));
        cache.put_at(key(1), vec![11], at(2));
        cache.put_at(key(3), vec![3], at(3));
        // The queue's first entry is key 1's stale stamp: evicting the oldest must drop key 2,
        // not the newly stored key 1.
        cache.put_at(key(4), vec![4], at(4));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get_at(&key(1), at(5), false), Some(vec![11]));
        assert_eq!(cache.get_at(&key(2), at(5), false), None);
    }
}
