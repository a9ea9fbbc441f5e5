//! Load balancing over the endpoints of a backend.
//!
//! Weighted round robin, lock-free on the request path: each publish precomputes one cycle of
//! picks (a smooth interleaving, see [`schedule`]) and a request does one atomic `fetch_add` on
//! the backend's cursor.
//!
//! State that must outlive a table swap (the cursor, per-endpoint state) is shared between a
//! backend's balancer and the one [`Balancer::next`] builds from it for the next table, for the
//! backends and endpoints that still exist (pingora's `Backends::do_update`), so a swap does not
//! reset round robin to the first endpoint nor forget what was learnt about an endpoint.
//!
//! Each endpoint's state has a slot of its user's type ([`EndpointState::slot`]): the proxy keeps
//! the endpoint's idle HTTP/1.1 connections there, so a request finds them without a lookup and
//! they outlive a table swap with the rest, while this module names no connection type.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use http::uri::Authority;

use crate::http_util::stable_hash;
use crate::model::{Backend, BackendId, Target, UpstreamProtocol};

/// Longest precomputed cycle; larger weight sums are scaled down to it.
const MAX_CYCLE: u64 = 1 << 16;

/// Index of a backend in a compiled table (the router's `backend_ids`, the proxy's balancers): a
/// typed, allocation-free handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendIdx(pub u32);

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
///
/// `S` is what the balancer's user keeps per endpoint with the rest of its state (the proxy: its
/// idle HTTP/1.1 connections); the balancer only makes it (`S::default()`) and carries it over.
#[derive(Debug)]
pub struct EndpointState<S = ()> {
    key: EndpointKey,
    authority: Option<Authority>,
    failures: AtomicU64,
    /// A stable hash of the key: the value of affinity cookies and the seed of ring points.
    id: u64,
    /// Exponentially weighted moving average of response-head latency, in microseconds.
    ewma_us: AtomicU64,
    /// Requests sent and not yet answered (response head).
    inflight: AtomicUsize,
    /// The user's per-endpoint slot, kept across table swaps with the rest of its state.
    slot: S,
}

impl<S: Default> EndpointState<S> {
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
            slot: S::default(),
        }
    }
}

impl<S> EndpointState<S> {
    /// The user's per-endpoint slot (the proxy: the endpoint's idle HTTP/1.1 connections).
    pub fn slot(&self) -> &S {
        &self.slot
    }

    /// The stable identifier of this endpoint (the same in every weir replica and build).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Marks a request sent; the guard marks it answered when dropped and, with
    /// [`InFlight::answered`], records its latency.
    pub fn start(self: &Arc<Self>) -> InFlight<S> {
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
pub struct InFlight<S = ()> {
    endpoint: Arc<EndpointState<S>>,
    started: std::time::Instant,
}

impl<S> InFlight<S> {
    /// Records the time to the response head in the endpoint's EWMA (weight 1/5 per sample).
    pub fn answered(self) {
        let sample = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = self.endpoint.ewma_us.fetch_update(Relaxed, Relaxed, |old| {
            Some(if old == 0 { sample } else { old - old / 5 + sample / 5 })
        });
    }
}

impl<S> Drop for InFlight<S> {
    fn drop(&mut self) {
        self.endpoint.inflight.fetch_sub(1, Relaxed);
    }
}

/// Points per endpoint on a consistent-hash ring (per unit of weight up to 4).
const RING_POINTS: u64 = 160;

/// The compiled balancer of one backend for one table; `S` is its endpoints' slot
/// ([`EndpointState::slot`]).
#[derive(Debug)]
pub struct Balancer<S = ()> {
    protocol: UpstreamProtocol,
    /// For TLS protocols: the client config (`None` when it could not be built: 502s).
    tls: Option<Arc<crate::tls::UpstreamTlsConfig>>,
    cursor: Arc<AtomicUsize>,
    endpoints: Box<[Arc<EndpointState<S>>]>,
    /// One weighted cycle of endpoint indexes; empty when all weights are equal (plain modulo).
    cycle: Box<[u32]>,
    /// Relative weights, by endpoint.
    weights: Box<[u32]>,
    /// The consistent-hash ring (point, endpoint index), sorted; built on first use.
    ring: std::sync::OnceLock<Box<[(u64, u32)]>>,
}

impl<S> Balancer<S> {
    /// A balancer with no endpoint (requests to it answer 503).
    pub(crate) fn empty() -> Self {
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
    pub fn endpoints(&self) -> &[Arc<EndpointState<S>>] {
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

// === state across tables ===

/// Endpoints looked up by key: a scan for a few, a hash map for many.
enum ByKey<'a, S> {
    Few(&'a [Arc<EndpointState<S>>]),
    Many(HashMap<&'a EndpointKey, &'a Arc<EndpointState<S>>>),
}

impl<'a, S> ByKey<'a, S> {
    fn new(endpoints: &'a [Arc<EndpointState<S>>]) -> Self {
        if endpoints.len() <= 16 {
            ByKey::Few(endpoints)
        } else {
            ByKey::Many(endpoints.iter().map(|e| (&e.key, e)).collect())
        }
    }

    fn get(&self, key: &EndpointKey) -> Option<&'a Arc<EndpointState<S>>> {
        match self {
            ByKey::Few(list) => list.iter().find(|e| e.key == *key),
            ByKey::Many(map) => map.get(key).copied(),
        }
    }
}

impl<S: Default> Balancer<S> {
    /// The balancer of `backend` (`id`) in a new table. `previous` is its balancer in the last
    /// table, if it was there: the cursor and the state of the endpoints still in the backend
    /// carry over; endpoints that left are forgotten.
    pub fn next(previous: Option<&Self>, id: &BackendId, backend: &Backend) -> Self {
        let weighted: Vec<(EndpointKey, u32)> = match &backend.target {
            Target::Endpoints(eps) => eps.iter().map(|e| (EndpointKey::Addr(e.address), e.weight)).collect(),
            Target::Dns { host, port } => {
                vec![(EndpointKey::Dns { host: host.as_str().into(), port: *port }, 1)]
            }
        };
        let old = ByKey::new(previous.map_or(&[][..], |p| &p.endpoints));
        let mut endpoints: Vec<Arc<EndpointState<S>>> = Vec::with_capacity(weighted.len());
        let mut weights = Vec::with_capacity(weighted.len());
        let large = weighted.len() > 16;
        let mut seen = std::collections::HashSet::new();
        for (key, weight) in weighted {
            // Weight 0 means drained; duplicates keep their first weight.
            let duplicate =
                if large { !seen.insert(key.clone()) } else { endpoints.iter().any(|e| e.key == key) };
            if weight == 0 || duplicate {
                continue;
            }
            let state = match old.get(&key) {
                Some(state) => state.clone(),
                None => Arc::new(EndpointState::new(key)),
            };
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
            cursor: previous.map(|p| p.cursor.clone()).unwrap_or_default(),
            endpoints: endpoints.into(),
            cycle: schedule(&weights).into(),
            weights: weights.into(),
            ring: std::sync::OnceLock::new(),
        }
    }

    /// The state of the endpoint `key`, if it is in this balancer.
    pub fn endpoint(&self, key: &EndpointKey) -> Option<&Arc<EndpointState<S>>> {
        self.endpoints.iter().find(|e| e.key == *key)
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

    /// The balancer without a slot.
    type Balancer = super::Balancer;

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

    /// A fresh balancer of backend `ns/a:80` with these endpoints (port, weight).
    fn fresh(eps: &[(u16, u32)]) -> Balancer {
        Balancer::next(None, &"ns/a:80".parse().unwrap(), &backend(eps))
    }

    fn many(n: u16) -> Balancer {
        fresh(&(0..n).map(|i| (1000 + i, 1)).collect::<Vec<_>>())
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
        let b = fresh(&[(1, 1), (2, 1), (3, 1)]);
        let seq: Vec<_> = (0..6).map(|_| b.pick().unwrap()).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn weights_are_honoured_and_smooth() {
        assert_eq!(schedule(&[5, 1, 1]), [0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(schedule(&[2, 4]), [1, 0, 1]); // gcd 2 → [1, 2]
        assert_eq!(schedule(&[3, 3]), Vec::<u32>::new());
        let b = fresh(&[(1, 3), (2, 1)]);
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
        let b = fresh(&[(1, 0), (2, 1)]);
        assert_eq!(b.endpoints().len(), 1);
        let b = fresh(&[]);
        assert!(b.is_empty());
        assert_eq!(b.pick(), None);
    }

    #[test]
    fn pick_untried_skips_tried_endpoints() {
        let b = fresh(&[(1, 5), (2, 1), (3, 1)]);
        assert_eq!(b.pick_untried(&[0, 2]), Some(1));
        assert_eq!(b.pick_untried(&[0, 1, 2]), None);
    }

    #[test]
    fn state_is_carried_over_to_the_next_table() {
        let a: BackendId = "ns/a:80".parse().unwrap();
        let first = Balancer::next(None, &a, &backend(&[(1, 1), (2, 1)]));
        let kept = first.endpoints()[1].clone();
        kept.record_failure();
        assert_eq!(first.pick(), Some(0));

        // Endpoint 1 leaves, 3 arrives, 2 stays.
        let b = Balancer::next(Some(&first), &a, &backend(&[(2, 1), (3, 1)]));
        assert!(Arc::ptr_eq(&b.endpoints()[0], &kept), "endpoint state is reused");
        assert_eq!(b.endpoints()[0].failures(), 1);
        assert_eq!(b.endpoints()[1].failures(), 0);
        // The cursor continues where the previous table left it (1 pick so far).
        assert_eq!(b.pick(), Some(1));
        assert!(b.endpoint(&EndpointKey::Addr(SocketAddr::from(([127, 0, 0, 1], 1)))).is_none());

        // Without a previous balancer (a backend that comes back), it starts afresh.
        let again = Balancer::next(None, &a, &backend(&[(2, 1)]));
        assert_eq!(again.endpoints()[0].failures(), 0);
        assert_eq!(again.pick(), Some(0));
    }

    #[test]
    fn many_endpoints_carry_over_and_duplicates_keep_the_first() {
        let a: BackendId = "ns/a:80".parse().unwrap();
        let eps: Vec<(u16, u32)> = (1..=40).map(|p| (p, 1)).chain([(5, 3)]).collect();
        let first = Balancer::next(None, &a, &backend(&eps));
        assert_eq!(first.endpoints().len(), 40, "the duplicate of port 5 is dropped");
        let next = Balancer::next(Some(&first), &a, &backend(&eps[10..40]));
        assert_eq!(next.endpoints().len(), 30);
        assert!(next.endpoints().iter().zip(&first.endpoints()[10..]).all(|(n, f)| Arc::ptr_eq(n, f)));
    }
}
