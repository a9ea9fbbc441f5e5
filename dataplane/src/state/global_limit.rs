//! ingress-nginx's global rate limit (`global-rate-limit*`, as in its releases up to 1.11): a
//! limit per window shared by every replica through memcached, with a sliding window as
//! lua-resty-global-throttle computes it. The count of the current window is incremented for
//! each request; the estimate is the previous window's count, weighted by the part of it the
//! sliding window still covers, plus the current count. Past the limit the key is refused, and
//! remembered locally until the estimate falls back under it, so a client over its limit costs
//! memcached nothing. When memcached fails or is slow the request is let through (as
//! ingress-nginx does), and the failure is logged (at most once per second) and counted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::StatusCode;

use crate::hashkey::HashKey;
use crate::http_util::stable_hash;
use crate::model::{GlobalRateLimit, IpNet};
use crate::state::memcached::Client;
use crate::vars::RequestView;

/// Keys remembered as over their limit, at most (then the expired are dropped, and if that is
/// not enough, all).
const REMEMBERED: usize = 65_536;

/// Memcached failures, for the metrics and the log's rate limit.
pub static FAILURES: AtomicU64 = AtomicU64::new(0);
static LAST_LOG: AtomicU64 = AtomicU64::new(0);

/// A route's compiled global limit.
pub struct GlobalLimiter {
    limit: u64,
    window: Duration,
    key: HashKey,
    exempt: Vec<IpNet>,
    zone: u64,
    /// The status of refused requests.
    pub status: StatusCode,
    client: Arc<Client>,
    /// Key hash → until when it is refused without asking memcached.
    over: Mutex<HashMap<u64, Instant>>,
}

impl std::fmt::Debug for GlobalLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalLimiter")
            .field("limit", &self.limit)
            .field("window", &self.window)
            .field("memcached", &self.client.addr())
            .finish_non_exhaustive()
    }
}

impl GlobalLimiter {
    /// Compiles `limit`; `Err` names what is wrong (translation checks it first).
    pub fn compile(limit: &GlobalRateLimit) -> Result<GlobalLimiter, String> {
        if limit.limit == 0 || limit.window_ms == 0 {
            return Err("global-rate-limit and its window must be more than 0".into());
        }
        Ok(GlobalLimiter {
            limit: limit.limit,
            window: Duration::from_millis(limit.window_ms),
            key: HashKey::parse(&limit.key)?,
            exempt: limit.exempt.clone(),
            zone: stable_hash(limit.zone.as_bytes()),
            status: StatusCode::from_u16(limit.status).map_err(|e| e.to_string())?,
            client: Client::shared(&limit.memcached),
            over: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `req` may go on.
    pub async fn allow(&self, req: &RequestView<'_>, client: IpAddr) -> bool {
        if self.exempt.iter().any(|net| net.contains(client)) {
            return true;
        }
        let key = self.key.hash(req);
        let now = Instant::now();
        {
            let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
            match over.get(&key) {
                Some(until) if *until > now => return false,
                Some(_) => {
                    over.remove(&key);
                }
                None => {}
            }
        }
        let window_ms = self.window.as_millis().max(1) as u64;
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
        let index = since_epoch / window_ms;
        let elapsed = since_epoch % window_ms;
        let name = |i: u64| format!("weir-grl-{:016x}-{key:016x}-{window_ms}-{i}", self.zone);
        let (count, previous) = match self
            .client
            .sample(&name(index), &name(index.wrapping_sub(1)), self.window * 2)
            .await
        {
            Ok(counts) => counts,
            Err(e) => {
                FAILURES.fetch_add(1, Ordering::Relaxed);
                let second = since_epoch / 1000;
                if LAST_LOG.swap(second, Ordering::Relaxed) != second {
                    tracing::warn!(memcached = self.client.addr(), error = %e, "global rate limit: memcached failed; the request is let through");
                }
                return true;
            }
        };
        match delay(self.limit, window_ms, elapsed, count, previous) {
            None => true,
            Some(wait) => {
                let mut over = self.over.lock().unwrap_or_else(|p| p.into_inner());
                if over.len() >= REMEMBERED {
                    over.retain(|_, until| *until > now);
                    if over.len() >= REMEMBERED {
                        over.clear();
                    }
                }
                over.insert(key, now + Duration::from_millis(wait));
                false
            }
        }
    }
}

/// `None` when the sliding window's estimate is within `limit`; else how long (ms) until it
/// falls back under it. `elapsed` is the time into the current window, `count` and `previous`
/// the current and previous windows' counts.
fn delay(limit: u64, window: u64, elapsed: u64, count: u64, previous: u64) -> Option<u64> {
    let remaining = window - elapsed.min(window);
    // previous × remaining / window, in integers.
    let carried = previous.saturating_mul(remaining) / window;
    if carried.saturating_add(count) <= limit {
        return None;
    }
    // The current window's own count is over: only the next window helps.
    if count > limit || previous == 0 {
        return Some(remaining.max(1));
    }
    // The carried part shrinks by `previous / window` per ms: wait until it fits.
    let excess = carried + count - limit;
    Some((excess.saturating_mul(window) / previous).clamp(1, remaining.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sliding_window_estimate() {
        // Within the limit.
        assert_eq!(delay(10, 1000, 0, 10, 0), None);
        // Over in the current window alone: until it ends.
        assert_eq!(delay(10, 1000, 400, 11, 0), Some(600));
        // Half of the previous window still counts: 10 × 0.5 + 6 = 11 > 10.
        assert_eq!(delay(10, 1000, 500, 6, 10), Some(100));
        // ... and 10 × 0.3 + 6 = 9 fits later.
        assert_eq!(delay(10, 1000, 700, 6, 10), None);
        // At the window's end nothing of the previous one counts.
        assert_eq!(delay(10, 1000, 1000, 10, 1000), None);
    }
}
