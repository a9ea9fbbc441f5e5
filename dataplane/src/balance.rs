//! Load balancing over the endpoints of a backend.
//!
//! Weighted round robin, lock-free on the request path: each publish precomputes one cycle of
//! picks (a smooth interleaving, see [`schedule`]) and a request does one atomic `fetch_add` on
//! the backend's cursor.
//!
//! State that must outlive a table swap (the cursor, per-endpoint state) lives in a
//! [`Registry`] keyed by [`BackendId`] and [`EndpointKey`]. [`Registry::update`] reuses it for
//! backends and endpoints that still exist (pingora's `Backends::do_update`), so a swap does not
//! reset round robin to the first endpoint nor forget what was learnt about an endpoint.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use http::uri::Authority;

use crate::model::{Backend, BackendId, Target, UpstreamProtocol};

/// Longest precomputed cycle; larger weight sums are scaled down to it.
const MAX_CYCLE: u64 = 1 << 16;

/// Identity of an endpoint, the key its state is carried over by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EndpointKey {
    /// A socket address.
    Addr(SocketAddr),
    /// A DNS name resolved when connecting (ExternalName).
    Dns {
        /// The name.
        host: Box<str>,
        /// The port.
        port: u16,
    },
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointKey::Addr(a) => a.fmt(f),
            EndpointKey::Dns { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Per-endpoint state shared by every table that contains the endpoint.
#[derive(Debug)]
pub struct EndpointState {
    key: EndpointKey,
    authority: Option<Authority>,
    failures: AtomicU64,
    /// A stable hash of the key: the value of affinity cookies and the seed of ring points.
    id: u64,
    /// Exponentially weighted moving average of response-head latency, in microseconds.
    ewma_us: AtomicU64,
    /// Requests sent and not yet answered (response head).
    inflight: AtomicUsize,
}

impl EndpointState {
    fn new(key: EndpointKey) -> Self {
        // Built once per endpoint, so requests clone it instead of formatting an address.
        let text = key.to_string();
        let id = stable_hash(text.as_bytes());
        // `Bytes` takes the string's buffer: no copy.
        let authority = Authority::from_maybe_shared(bytes::Bytes::from(text)).ok();
        EndpointState {
            id,
            key,
            authority,
            failures: AtomicU64::new(0),
            ewma_us: AtomicU64::new(0),
            inflight: AtomicUsize::new(0),
        }
    }

    /// The stable identifier of this endpoint (the same in every weir replica and build).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Marks a request sent; the guard marks it answered when dropped and, with
    /// [`InFlight::answered`], records its latency.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.inflight.fetch_add(1, Relaxed);
        InFlight { endpoint: self.clone(), started: std::time::Instant::now() }
    }

    fn score(&self) -> u64 {
        // A fresh endpoint (no sample) scores as fast, so it gets tried.
        self.ewma_us.load(Relaxed).max(1).saturating_mul(self.inflight.load(Relaxed) as u64 + 1)
    }

    /// The endpoint's identity.
    pub fn key(&self) -> &EndpointKey {
        &self.key
    }

    /// `host:port` for the upstream request URI (`None` if the DNS name is not a valid authority).
    pub fn authority(&self) -> Option<&Authority> {
        self.authority.as_ref()
    }

    /// Records a failed connection attempt (kept across table swaps).
    pub fn record_failure(&self) {
        self.failures.fetch_add(1, Relaxed);
    }

    /// Connection attempts that failed since the endpoint first appeared.
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }
}

/// A request in flight to an endpoint (see [`EndpointState::start`]).
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<EndpointState>,
    started: std::time::Instant,
}

impl InFlight {
    /// Records the time to the response head in the endpoint's EWMA (weight 1/5 per sample).
    pub fn answered(self) {
        let sample = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = self.endpoint.ewma_us.fetch_update(Relaxed, Relaxed, |old| {
            Some(if old == 0 { sample } else { old - old / 5 + sample / 5 })
        });
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.endpoint.inflight.fetch_sub(1, Relaxed);
    }
}

/// FNV-1a over `bytes`, finished with splitmix64: stable across processes, builds and
/// machines (affinity cookies and hash rings must agree between replicas).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Points per endpoint on a consistent-hash ring (per unit of weight up to 4).
const RING_POINTS: u64 = 160;

/// The compiled balancer of one backend for one table.
#[derive(Debug)]
pub struct Balancer {
    protocol: UpstreamProtocol,
    /// For TLS protocols: the client config (`None` when it could not be built: 502s).
    tls: Option<Arc<crate::tls::UpstreamTlsConfig>>,
    cursor: Arc<AtomicUsize>,
    endpoints: Box<[Arc<EndpointState>]>,
    /// One weighted cycle of endpoint indexes; empty when all weights are equal (plain modulo).
    cycle: Box<[u32]>,
    /// Relative weights, by endpoint.
    weights: Box<[u32]>,
    /// The consistent-hash ring (point, endpoint index), sorted; built on first use.
    ring: std::sync::OnceLock<Box<[(u64, u32)]>>,
}

impl Balancer {
    /// A balancer with no endpoint (requests to it answer 503).
    fn empty() -> Balancer {
        Balancer {
            protocol: UpstreamProtocol::default(),
            tls: None,
            cursor: Arc::default(),
            endpoints: Box::default(),
            cycle: Box::default(),
            weights: Box::default(),
            ring: std::sync::OnceLock::new(),
        }
    }

    /// The protocol spoken to this backend's endpoints.
    pub fn protocol(&self) -> UpstreamProtocol {
        self.protocol
    }

    /// The TLS client config of a TLS backend.
    pub fn tls(&self) -> Option<&Arc<crate::tls::UpstreamTlsConfig>> {
        self.tls.as_ref()
    }

    /// The endpoints, in table order.
    pub fn endpoints(&self) -> &[Arc<EndpointState>] {
        &self.endpoints
    }

    /// True when there is nothing to send to (the backend answers 503).
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The next endpoint in weighted round-robin order, as an index into [`Balancer::endpoints`].
    pub fn pick(&self) -> Option<usize> {
        let n = self.endpoints.len();
        if n == 0 {
            return None;
        }
        let tick = self.cursor.fetch_add(1, Relaxed);
        if self.cycle.is_empty() {
            Some(tick % n)
        } else {
            Some(self.cycle[tick % self.cycle.len()] as usize)
        }
    }

    /// The endpoint whose [`EndpointState::id`] is `id`, if it is in this table.
    pub fn by_id(&self, id: u64) -> Option<usize> {
        self.endpoints.iter().position(|e| e.id == id)
    }

    /// Power of two choices over the endpoints not `tried`: of two at random, the one with the
    /// lower latency EWMA × (requests in flight + 1) (ingress-nginx `load-balance: ewma`).
    pub fn pick_ewma(&self, tried: &[usize]) -> Option<usize> {
        let free: Vec<usize> = (0..self.endpoints.len()).filter(|i| !tried.contains(i)).collect();
        match free.len() {
            0 => None,
            1 => Some(free[0]),
            n => {
                let a = free[rand::random_range(0..n)];
                let mut b = free[rand::random_range(0..n - 1)];
                if b == a {
                    b = free[n - 1];
                }
                Some(if self.endpoints[b].score() < self.endpoints[a].score() { b } else { a })
            }
        }
    }

    /// Consistent hashing (ingress-nginx `upstream-hash-by`): the first endpoint not `tried`
    /// clockwise from `key` on a ring of [`RING_POINTS`] points per endpoint (more for heavier
    /// weights). An endpoint joining or leaving moves only the keys of its own arcs, about 1/N.
    pub fn pick_hashed(&self, key: u64, tried: &[usize]) -> Option<usize> {
        if tried.len() >= self.endpoints.len() {
            return None;
        }
        let ring = self.ring.get_or_init(|| self.build_ring());
        if ring.is_empty() {
            return None;
        }
        let start = ring.partition_point(|(point, _)| *point < key);
        (0..ring.len()).map(|step| ring[(start + step) % ring.len()].1 as usize).find(|i| !tried.contains(i))
    }

    fn build_ring(&self) -> Box<[(u64, u32)]> {
        let mut ring = Vec::new();
        for (i, e) in self.endpoints.iter().enumerate() {
            let points = RING_POINTS * u64::from(self.weights.get(i).copied().unwrap_or(1).clamp(1, 4));
            for p in 0..points {
                let mut seed = e.id.to_le_bytes().to_vec();
                seed.extend_from_slice(&p.to_le_bytes());
                ring.push((stable_hash(&seed), i as u32));
            }
        }
        ring.sort_unstable();
        ring.into()
    }

    /// Like [`Balancer::pick`], skipping endpoints already `tried` (for retries). `None` when
    /// every endpoint was tried.
    pub fn pick_untried(&self, tried: &[usize]) -> Option<usize> {
        if tried.len() >= self.endpoints.len() {
            return None;
        }
        // The cycle visits every endpoint; bound the walk by its length.
        let bound = self.cycle.len().max(self.endpoints.len());
        for _ in 0..bound {
            let i = self.pick()?;
            if !tried.contains(&i) {
                return Some(i);
            }
        }
        (0..self.endpoints.len()).find(|i| !tried.contains(i))
    }
}

/// Balancer state kept across table swaps, keyed by backend and endpoint identity.
#[derive(Debug, Default)]
pub struct Registry {
    backends: HashMap<BackendId, BackendEntry>,
}

#[derive(Debug, Default)]
struct BackendEntry {
    cursor: Arc<AtomicUsize>,
    endpoints: HashMap<EndpointKey, Arc<EndpointState>>,
}

impl BackendEntry {
    /// The balancer of `backend` in a new table, with the state kept for the backend and for
    /// the endpoints still in it (the others are forgotten).
    fn next(&mut self, id: &BackendId, backend: &Backend) -> Balancer {
        let mut old = std::mem::take(&mut self.endpoints);
        let entry = self;
        let weighted: Vec<(EndpointKey, u32)> = match &backend.target {
            Target::Endpoints(eps) => eps.iter().map(|e| (EndpointKey::Addr(e.address), e.weight)).collect(),
            Target::Dns { host, port } => {
                vec![(EndpointKey::Dns { host: host.as_str().into(), port: *port }, 1)]
            }
        };
        let mut endpoints = Vec::with_capacity(weighted.len());
        let mut weights = Vec::with_capacity(weighted.len());
        for (key, weight) in weighted {
            if weight == 0 || entry.endpoints.contains_key(&key) {
                continue; // weight 0 means drained; duplicates keep their first weight
            }
            let state = old.remove(&key).unwrap_or_else(|| Arc::new(EndpointState::new(key.clone())));
            entry.endpoints.insert(key, state.clone());
            endpoints.push(state);
            weights.push(weight);
        }
        let tls = if backend.protocol.is_tls() {
            match crate::tls::upstream_config(&backend.tls.clone().unwrap_or_default(), backend.protocol) {
                Ok(config) => Some(Arc::new(config)),
                Err(error) => {
                    tracing::warn!(backend = %id, %error, "upstream TLS configuration unusable; requests to it answer 502");
                    None
                }
            }
        } else {
            None
        };
        Balancer {
            protocol: backend.protocol,
            tls,
            cursor: entry.cursor.clone(),
            endpoints: endpoints.into(),
            cycle: schedule(&weights).into(),
            weights: weights.into(),
            ring: std::sync::OnceLock::new(),
        }
    }
}

impl Registry {
    /// Builds the balancers of a new table, in the iteration order of `backends`, reusing the
    /// state of backends and endpoints that still exist and forgetting the rest.
    pub fn update<'a>(
        &mut self,
        backends: impl IntoIterator<Item = (&'a BackendId, &'a Backend)>,
    ) -> Vec<Arc<Balancer>> {
        let mut balancers = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (id, backend) in backends {
            balancers.push(Arc::new(self.balancer(id, backend)));
            seen.insert(id);
        }
        self.backends.retain(|id, _| seen.contains(id));
        balancers
    }

    /// Like [`Registry::update`] for a table that differs from the last one only in some
    /// backends: `previous` are the last table's balancers, `len` the number of the new one's.
    /// The backends `removed` (with their old index) are forgotten and their balancers emptied;
    /// those `changed` (with their new index) are rebuilt with their state carried over. The
    /// other balancers are shared with the last table.
    pub fn update_changed<'a>(
        &mut self,
        previous: &[Arc<Balancer>],
        len: usize,
        removed: impl IntoIterator<Item = (usize, &'a BackendId)>,
        changed: impl IntoIterator<Item = (usize, &'a BackendId, &'a Backend)>,
    ) -> Vec<Arc<Balancer>> {
        let mut balancers = previous.to_vec();
        balancers.resize_with(len, || Arc::new(Balancer::empty()));
        for (slot, id) in removed {
            self.backends.remove(id);
            if let Some(balancer) = balancers.get_mut(slot) {
                *balancer = Arc::new(Balancer::empty());
            }
        }
        for (slot, id, backend) in changed {
            let balancer = Arc::new(self.balancer(id, backend));
            if let Some(place) = balancers.get_mut(slot) {
                *place = balancer;
            }
        }
        balancers
    }

    /// The balancer of `backend` in a new table, with its state carried over.
    fn balancer(&mut self, id: &BackendId, backend: &Backend) -> Balancer {
        match self.backends.get_mut(id) {
            Some(entry) => entry.next(id, backend),
            None => self.backends.entry(id.clone()).or_default().next(id, backend),
        }
    }

    /// The state of an endpoint of a backend, if both are in the last table.
    pub fn endpoint(&self, backend: &BackendId, key: &EndpointKey) -> Option<&Arc<EndpointState>> {
        self.backends.get(backend)?.endpoints.get(key)
    }
}

/// One cycle of a smooth weighted round robin: endpoint `i` appears `weights[i]` times (after
/// dividing by the gcd and scaling to at most 65 536 turns), spread out rather than bunched.
/// Empty when all weights are equal, which [`Balancer::pick`] serves with a plain modulo.
///
/// Each endpoint's `k`-th turn is due at `(2k + 1) / (2w)` of the cycle (earliest deadline
/// first, ties to the lower index), which interleaves like nginx's smooth WRR in
/// `O(total · log n)` instead of its `O(total · n)`.
pub fn schedule(weights: &[u32]) -> Vec<u32> {
    if weights.windows(2).all(|w| w[0] == w[1]) {
        return Vec::new();
    }
    let g = weights.iter().fold(0u64, |g, &w| gcd(g, u64::from(w))).max(1);
    let mut weights: Vec<u64> = weights.iter().map(|&w| u64::from(w) / g).collect();
    let total: u64 = weights.iter().sum();
    if total > MAX_CYCLE {
        for w in &mut weights {
            *w = (*w * MAX_CYCLE / total).max(1);
        }
    }
    let total: u64 = weights.iter().sum();

    #[derive(PartialEq, Eq)]
    struct Turn {
        num: u64, // deadline = num / den
        den: u64,
        idx: u32,
    }
    impl Ord for Turn {
        fn cmp(&self, other: &Self) -> Ordering {
            // Reversed: BinaryHeap is a max-heap and we want the earliest deadline.
            let a = u128::from(self.num) * u128::from(other.den);
            let b = u128::from(other.num) * u128::from(self.den);
            b.cmp(&a).then(other.idx.cmp(&self.idx))
        }
    }
    impl PartialOrd for Turn {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }

    let mut heap: BinaryHeap<Turn> =
        weights.iter().enumerate().map(|(i, &w)| Turn { num: 1, den: 2 * w, idx: i as u32 }).collect();
    let mut cycle = Vec::with_capacity(total as usize);
    while let Some(mut turn) = heap.pop() {
        cycle.push(turn.idx);
        if cycle.len() as u64 == total {
            break;
        }
        turn.num += 2;
        if turn.num < turn.den {
            heap.push(turn);
        }
    }
    cycle
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::Endpoint;

    fn backend(eps: &[(u16, u32)]) -> Backend {
        Backend {
            protocol: UpstreamProtocol::Http1,
            target: Target::Endpoints(
                eps.iter()
                    .map(|&(port, weight)| Endpoint {
                        address: SocketAddr::from(([127, 0, 0, 1], port)),
                        weight,
                    })
                    .collect(),
            ),
            tls: None,
        }
    }

    fn counts(b: &Balancer, picks: usize) -> Vec<usize> {
        let mut c = vec![0; b.endpoints().len()];
        for _ in 0..picks {
            c[b.pick().unwrap()] += 1;
        }
        c
    }

    fn many(n: u16) -> Arc<Balancer> {
        let mut r = Registry::default();
        let id: BackendId = "ns/b:80".parse().unwrap();
        let b = backend(&(0..n).map(|i| (1000 + i, 1)).collect::<Vec<_>>());
        r.update([(&id, &b)]).remove(0)
    }

    #[test]
    fn hashing_is_consistent_and_moves_about_one_nth() {
        let ten = many(10);
        let eleven = many(11);
        let keys: Vec<u64> = (0..10_000u32).map(|k| stable_hash(&k.to_le_bytes())).collect();
        let before: Vec<usize> = keys.iter().map(|k| ten.pick_hashed(*k, &[]).unwrap()).collect();
        // The same key, the same endpoint, every time.
        assert!(keys.iter().zip(&before).all(|(k, b)| ten.pick_hashed(*k, &[]) == Some(*b)));
        // Every endpoint gets a fair share (loose: 1000 ± 40%).
        let mut share = [0usize; 10];
        before.iter().for_each(|b| share[*b] += 1);
        assert!(share.iter().all(|s| (600..1400).contains(s)), "{share:?}");
        // An eleventh endpoint takes about 1/11 of the keys, and only from the others.
        let after: Vec<usize> = keys.iter().map(|k| eleven.pick_hashed(*k, &[]).unwrap()).collect();
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        assert!(
            after.iter().zip(&before).all(|(a, b)| a == b || *a == 10),
            "keys moved between old endpoints"
        );
        assert!((450..1400).contains(&moved), "{moved} of 10000 keys moved (1/11 is 909)");
        // Retries walk on to another endpoint.
        let first = ten.pick_hashed(keys[0], &[]).unwrap();
        assert_ne!(ten.pick_hashed(keys[0], &[first]), Some(first));
    }

    #[test]
    fn ewma_prefers_the_faster_endpoint() {
        let b = many(2);
        for _ in 0..20 {
            let slow = b.endpoints[0].start();
            std::thread::sleep(std::time::Duration::from_millis(2));
            slow.answered();
            b.endpoints[1].start().answered();
        }
        let fast = (0..200).filter(|_| b.pick_ewma(&[]) == Some(1)).count();
        assert_eq!(fast, 200, "with two endpoints P2C always compares both");
        assert_eq!(b.pick_ewma(&[1]), Some(0));
        assert_eq!(b.pick_ewma(&[0, 1]), None);
        assert_eq!(b.by_id(b.endpoints[1].id()), Some(1));
    }

    #[test]
    fn equal_weights_round_robin_in_order() {
        let id: BackendId = "ns/a:80".parse().unwrap();
        let mut reg = Registry::default();
        let b = reg.update([(&id, &backend(&[(1, 1), (2, 1), (3, 1)]))]).pop().unwrap();
        let seq: Vec<_> = (0..6).map(|_| b.pick().unwrap()).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn weights_are_honoured_and_smooth() {
        assert_eq!(schedule(&[5, 1, 1]), [0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(schedule(&[2, 4]), [1, 0, 1]); // gcd 2 → [1, 2]
        assert_eq!(schedule(&[3, 3]), Vec::<u32>::new());
        let id: BackendId = "ns/a:80".parse().unwrap();
        let b = Registry::default().update([(&id, &backend(&[(1, 3), (2, 1)]))]).pop().unwrap();
        assert_eq!(counts(&b, 400), [300, 100]);
    }

    #[test]
    fn huge_weight_sums_are_scaled() {
        let cycle = schedule(&[u32::MAX, 1, u32::MAX / 2]);
        assert!(cycle.len() as u64 <= MAX_CYCLE + 3);
        assert!(cycle.contains(&1), "every endpoint keeps at least one turn");
    }

    #[test]
    fn zero_weight_and_empty() {
        let id: BackendId = "ns/a:80".parse().unwrap();
        let b = Registry::default().update([(&id, &backend(&[(1, 0), (2, 1)]))]).pop().unwrap();
        assert_eq!(b.endpoints().len(), 1);
        let b = Registry::default().update([(&id, &backend(&[]))]).pop().unwrap();
        assert!(b.is_empty());
        assert_eq!(b.pick(), None);
    }

    #[test]
    fn pick_untried_skips_tried_endpoints() {
        let id: BackendId = "ns/a:80".parse().unwrap();
        let b = Registry::default().update([(&id, &backend(&[(1, 5), (2, 1), (3, 1)]))]).pop().unwrap();
        assert_eq!(b.pick_untried(&[0, 2]), Some(1));
        assert_eq!(b.pick_untried(&[0, 1, 2]), None);
    }

    #[test]
    fn state_is_carried_over_across_updates() {
        let a: BackendId = "ns/a:80".parse().unwrap();
        let gone: BackendId = "ns/gone:80".parse().unwrap();
        let mut reg = Registry::default();
        let first = reg.update([(&a, &backend(&[(1, 1), (2, 1)])), (&gone, &backend(&[(9, 1)]))]);
        let kept = first[0].endpoints()[1].clone();
        kept.record_failure();
        assert_eq!(first[0].pick(), Some(0));

        // Endpoint 1 leaves, 3 arrives, 2 stays; `gone` is removed.
        let second = reg.update([(&a, &backend(&[(2, 1), (3, 1)]))]);
        let b = &second[0];
        assert!(Arc::ptr_eq(&b.endpoints()[0], &kept), "endpoint state is reused");
        assert_eq!(b.endpoints()[0].failures(), 1);
        assert_eq!(b.endpoints()[1].failures(), 0);
        // The cursor continues where the previous table left it (1 pick so far).
        assert_eq!(b.pick(), Some(1));
        assert!(reg.endpoint(&a, &EndpointKey::Addr(SocketAddr::from(([127, 0, 0, 1], 1)))).is_none());
        assert!(reg.endpoint(&gone, &EndpointKey::Addr(SocketAddr::from(([127, 0, 0, 1], 9)))).is_none());

        // A backend that comes back starts afresh.
        let third = reg.update([(&a, &backend(&[(2, 1)])), (&gone, &backend(&[(9, 1)]))]);
        assert_eq!(third[1].endpoints()[0].failures(), 0);
        assert!(Arc::ptr_eq(&third[0].endpoints()[0], &kept));
    }

    #[test]
    fn update_changed_rebuilds_only_the_changed_and_keeps_their_state() {
        let (a, b, gone): (BackendId, BackendId, BackendId) =
            ("ns/a:80".parse().unwrap(), "ns/b:80".parse().unwrap(), "ns/gone:80".parse().unwrap());
        let mut reg = Registry::default();
        let first = reg.update([
            (&a, &backend(&[(1, 1), (2, 1)])),
            (&b, &backend(&[(5, 1)])),
            (&gone, &backend(&[(9, 1)])),
        ]);
        let kept = first[0].endpoints()[1].clone();
        kept.record_failure();
        assert_eq!(first[0].pick(), Some(0));

        // `a` loses endpoint 1, `gone` goes (index 2) and `new` takes a new index (3).
        let new: BackendId = "ns/new:80".parse().unwrap();
        let (a2, new2) = (backend(&[(2, 1)]), backend(&[(7, 1)]));
        let second = reg.update_changed(&first, 4, [(2, &gone)], [(0, &a, &a2), (3, &new, &new2)]);
        assert!(Arc::ptr_eq(&second[1], &first[1]), "unchanged balancers are shared");
        assert!(Arc::ptr_eq(&second[0].endpoints()[0], &kept), "endpoint state is reused");
        assert_eq!(second[0].endpoints()[0].failures(), 1);
        assert_eq!(second[0].pick(), Some(0), "the cursor continues (1 pick so far, 1 endpoint)");
        assert!(second[2].is_empty(), "a gone backend's index answers 503");
        assert_eq!(second[3].endpoints().len(), 1);
        assert!(reg.endpoint(&gone, &EndpointKey::Addr(SocketAddr::from(([127, 0, 0, 1], 9)))).is_none());
        assert!(reg.endpoint(&new, &EndpointKey::Addr(SocketAddr::from(([127, 0, 0, 1], 7)))).is_some());
    }
}
