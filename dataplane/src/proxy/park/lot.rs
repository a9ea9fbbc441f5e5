//! The parked connections of one listener, held compactly: a record of 40 bytes per connection
//! in a slab of fixed-size chunks, and their keep-alive deadlines in sorted lists threaded
//! through the records.
//!
//! What a parked connection costs is this record and the kernel's socket: nothing else is
//! allocated per connection (bench/RESULTS.md, issue 23).
//!
//! - **Slab.** Records live in chunks of [`CHUNK`] slots, each with its own free list; a new
//!   record takes a free slot of the lowest chunk that has one, so after a burst the last
//!   chunks empty and are given back (one fully free chunk is kept against flapping). No
//!   rehashing and no doubling copies: a chunk never moves. A slot's index and its generation
//!   (bumped each time it is freed) make the epoll key, so an event for a connection that left
//!   never reaches the one that took its slot.
//! - **Deadlines.** Each record is linked into one of a few lists sorted by deadline. With one
//!   keep-alive timeout, connections park in deadline order (give or take the scheduling of the
//!   moment each parks), so a new record goes at a list's tail or a few places before it; a
//!   record that fits nowhere near a tail (the table's keep-alive timeout was lowered) starts
//!   a new list. A resumed record leaves its list at once: no stale entries.
//! - **Guards.** A connection's place under the connection limits and its count in the
//!   open-connection gauge are held by the lot, not by a guard per record (each guard holds an
//!   `Arc`): taken over when a connection parks
//!   ([`ConnGuard::into_parked`](crate::proxy::limits::ConnGuard::into_parked),
//!   [`OpenConn::into_parked`](crate::metrics::OpenConn::into_parked)), handed back as guards
//!   when it resumes, given back when the lot closes it (its deadline, the drain, the lot's end).
//! - **Client address.** Kept only when it is not the socket's peer (a PROXY protocol client)
//!   or when it counts against a per-client limit; otherwise it is read back from the socket
//!   (`getpeername`) when the connection resumes.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::{Listener, OpenConn, Registry};
use crate::proxy::limits::{ConnGuard, ConnLimits};

/// What a connection keeps beyond its serving task.
pub(super) struct Kept {
    /// Its place under the connection limits.
    pub(super) _admission: ConnGuard,
    /// Its count in the open-connection gauge.
    pub(super) _open: OpenConn,
}

/// A connection on its way into the lot or back out of it, holding its guards (in the lot a
/// compact record stands for it). Defined here, not in `park.rs`, so that the lot imports
/// nothing from its parent (dataplane/tests/layers.rs: no import circles).
pub(super) struct Parked {
    pub(super) socket: std::net::TcpStream,
    /// The client (after the PROXY protocol header, if any).
    pub(super) client: SocketAddr,
    /// Requests served so far (`keep-alive-requests`).
    pub(super) requests: u32,
    /// When the keep-alive timeout closes it.
    pub(super) deadline: Instant,
    pub(super) kept: Kept,
}

/// Slots per chunk (a chunk is 20 KiB).
#[cfg(not(test))]
const CHUNK: usize = 512;
/// The tests' connections are real sockets: small chunks need few of them.
#[cfg(test)]
const CHUNK: usize = 8;
/// "No slot".
const NIL: u32 = u32::MAX;
/// How far before a list's tail a new record may go (jitter of the parking moment).
const WALK: usize = 32;
/// Deadline lists kept apart before new records are sorted into the first one at any cost.
const MAX_LISTS: usize = 8;

/// One slot: a parked connection, or free (`socket` is `None`).
struct Slot {
    socket: Option<OwnedFd>,
    /// Bumped each time the slot is freed: the epoll key's high half.
    generation: u32,
    /// Requests served so far (`keep-alive-requests`).
    requests: u32,
    /// Neighbours in its deadline list; `next` links free slots in their chunk's free list.
    prev: u32,
    next: u32,
    /// Its place counts against its client's per-client limit.
    per_client: bool,
    /// When the keep-alive timeout closes it: milliseconds since [`Lot::epoch`], rounded up.
    deadline: u64,
    /// The client when it must be kept (see the module comment); `None`: the socket's peer.
    client: Option<Box<SocketAddr>>,
}

impl Slot {
    fn free(next: u32) -> Slot {
        Slot {
            socket: None,
            generation: 0,
            requests: 0,
            prev: NIL,
            next,
            per_client: false,
            deadline: 0,
            client: None,
        }
    }
}

/// A chunk's free list.
#[derive(Clone, Copy)]
struct ChunkFree {
    /// Its first free slot (an index within the chunk), or [`NIL`].
    head: u32,
    /// Its free slots.
    count: u32,
}

/// A list of records sorted by deadline, earliest first.
#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

/// The parked connections of one listener.
pub(super) struct Lot {
    chunks: Vec<Box<[Slot]>>,
    free: Vec<ChunkFree>,
    /// Every chunk below this one is full.
    lowest_free: usize,
    len: usize,
    lists: Vec<List>,
    /// Deadlines count from here.
    epoch: Instant,
    limits: Arc<ConnLimits>,
    metrics: Arc<Registry>,
}

/// A record's epoll key: its slot's generation and index.
fn key(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

// === impl Lot ===

impl Lot {
    pub(super) fn new(limits: Arc<ConnLimits>, metrics: Arc<Registry>) -> Lot {
        Lot {
            chunks: Vec::new(),
            free: Vec::new(),
            lowest_free: 0,
            len: 0,
            lists: Vec::new(),
            epoch: Instant::now(),
            limits,
            metrics,
        }
    }

    /// Connections parked.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Slots allocated (parked or free), for tests.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    fn slot(&self, index: u32) -> &Slot {
        let i = index as usize;
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    fn slot_mut(&mut self, index: u32) -> &mut Slot {
        let i = index as usize;
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    /// The earliest deadline, if any connection is parked.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let ms = self.lists.iter().map(|l| self.slot(l.head).deadline).min()?;
        Some(self.epoch + Duration::from_millis(ms))
    }

    /// `at` in milliseconds since the epoch, rounded up (a deadline is never brought forward).
    fn millis(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch);
        let ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        if since.subsec_nanos().is_multiple_of(1_000_000) { ms } else { ms.saturating_add(1) }
    }

    /// Takes `conn` into the lot; its epoll key. `None`: it is dead (no peer address: it was
    /// reset) and was closed.
    pub(super) fn insert(&mut self, conn: Parked) -> Option<u64> {
        let Parked { socket, client, requests, deadline, kept } = conn;
        let peer = match socket.peer_addr() {
            Ok(peer) => peer,
            Err(error) => {
                tracing::debug!(peer = %client, %error, "a connection to park is gone");
                return None;
            }
        };
        let Kept { _admission: admission, _open: open } = kept;
        let per_client = admission.into_parked();
        open.into_parked();
        debug_assert!(per_client.is_none_or(|ip| ip == client.ip().to_canonical()));
        let index = self.allocate();
        let deadline = self.millis(deadline);
        let slot = self.slot_mut(index);
        slot.socket = Some(OwnedFd::from(socket));
        slot.requests = requests;
        slot.per_client = per_client.is_some();
        slot.deadline = deadline;
        slot.client = (client != peer || per_client.is_some()).then(|| Box::new(client));
        let generation = slot.generation;
        self.len += 1;
        self.link(index);
        Some(key(index, generation))
    }

    /// The socket of the record `key`, if it is still parked.
    pub(super) fn socket(&self, key: u64) -> Option<&OwnedFd> {
        let index = self.index(key)?;
        self.slot(index).socket.as_ref()
    }

    /// The slot of `key` if its record is still there.
    fn index(&self, key: u64) -> Option<u32> {
        let index = (key & u64::from(u32::MAX)) as u32;
        let generation = (key >> 32) as u32;
        let i = index as usize;
        let slot = self.chunks.get(i / CHUNK)?.get(i % CHUNK)?;
        (slot.socket.is_some() && slot.generation == generation).then_some(index)
    }

    /// Takes the record `key` out of the lot, as a connection holding its guards again;
    /// `None`: gone already, or dead (reset: its peer address cannot be read), and closed.
    pub(super) fn remove(&mut self, key: u64) -> Option<Parked> {
        let index = self.index(key)?;
        // `Some`: `index` found it there.
        let socket = std::net::TcpStream::from(self.slot_mut(index).socket.take()?);
        self.unlink(index);
        let epoch = self.epoch;
        let slot = self.slot_mut(index);
        let requests = slot.requests;
        let per_client = slot.per_client;
        let deadline = epoch + Duration::from_millis(slot.deadline);
        let kept_client = slot.client.take().map(|c| *c);
        self.release_slot(index);
        self.len -= 1;
        let client = match kept_client.map_or_else(|| socket.peer_addr(), Ok) {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "a parked connection was reset");
                self.give_back(None);
                return None;
            }
        };
        let admission = self.limits.resume_parked(per_client.then(|| client.ip().to_canonical()));
        let open = self.metrics.resume_parked(Listener::Http);
        Some(Parked { socket, client, requests, deadline, kept: Kept { _admission: admission, _open: open } })
    }

    /// Closes the connections whose deadline is `now` or past.
    pub(super) fn expire(&mut self, now: Instant) {
        let now = u64::try_from(now.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX);
        let mut l = 0;
        while let Some(&list) = self.lists.get(l) {
            if self.slot(list.head).deadline <= now {
                // A list it leaves empty is dropped, and another takes its place at `l`.
                self.close(list.head);
            } else {
                l += 1;
            }
        }
    }

    /// Closes every parked connection.
    pub(super) fn clear(&mut self) {
        while let Some(list) = self.lists.first() {
            let head = list.head;
            self.close(head);
        }
        debug_assert_eq!(self.len, 0);
    }

    /// Closes the record at `index`: its socket (which also takes it out of the epoll set), its
    /// place under the limits, its count in the gauge.
    fn close(&mut self, index: u32) {
        self.unlink(index);
        let slot = self.slot_mut(index);
        drop(slot.socket.take());
        let client = slot.client.take();
        let per_client = slot.per_client;
        self.release_slot(index);
        self.len -= 1;
        self.give_back(client.filter(|_| per_client).map(|c| c.ip().to_canonical()));
    }

    /// Gives back a closed record's place and gauge count.
    fn give_back(&self, per_client: Option<IpAddr>) {
        self.limits.release_parked(per_client);
        self.metrics.close_parked(Listener::Http);
    }

    // --- the slab ---

    /// A free slot, from the lowest chunk that has one.
    fn allocate(&mut self) -> u32 {
        while self.lowest_free < self.free.len() && self.free[self.lowest_free].count == 0 {
            self.lowest_free += 1;
        }
        if self.lowest_free == self.free.len() {
            let last = CHUNK as u32 - 1;
            self.chunks
                .push((0..CHUNK as u32).map(|i| Slot::free(if i == last { NIL } else { i + 1 })).collect());
            self.free.push(ChunkFree { head: 0, count: CHUNK as u32 });
        }
        let c = self.lowest_free;
        let within = self.free[c].head;
        let slot = &mut self.chunks[c][within as usize];
        self.free[c] = ChunkFree { head: slot.next, count: self.free[c].count - 1 };
        slot.next = NIL;
        (c * CHUNK) as u32 + within
    }

    /// Puts the (emptied) slot `index` back in its chunk's free list; gives back the last
    /// chunks while two are fully free.
    fn release_slot(&mut self, index: u32) {
        let (c, within) = (index as usize / CHUNK, (index as usize % CHUNK) as u32);
        let head = self.free[c].head;
        let slot = &mut self.chunks[c][within as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.prev = NIL;
        slot.next = head;
        self.free[c] = ChunkFree { head: within, count: self.free[c].count + 1 };
        self.lowest_free = self.lowest_free.min(c);
        while let [.., before, last] = self.free[..]
            && before.count == CHUNK as u32
            && last.count == CHUNK as u32
        {
            self.chunks.pop();
            self.free.pop();
        }
        self.lowest_free = self.lowest_free.min(self.free.len());
    }

    // --- the deadline lists ---

    /// Links the record at `index` into a deadline list, in order.
    fn link(&mut self, index: u32) {
        let deadline = self.slot(index).deadline;
        for l in 0..self.lists.len() {
            if let Some(after) = self.place(self.lists[l], deadline, WALK) {
                return self.link_after(l, after, index);
            }
        }
        if self.lists.len() < MAX_LISTS {
            self.lists.push(List { head: index, tail: index });
            return;
        }
        // Many timeouts at once (the table changed it again and again): sorted in, however far.
        let after = self.place(self.lists[0], deadline, usize::MAX).unwrap_or(NIL);
        self.link_after(0, after, index);
    }

    /// Where a record due at `deadline` goes in `list`, walking at most `walk` records back from
    /// its tail: after the returned record ([`NIL`]: first), or `None` if further back.
    fn place(&self, list: List, deadline: u64, walk: usize) -> Option<u32> {
        let mut at = list.tail;
        for _ in 0..walk {
            if at == NIL {
                return Some(NIL);
            }
            let slot = self.slot(at);
            if slot.deadline <= deadline {
                return Some(at);
            }
            at = slot.prev;
        }
        (at == NIL).then_some(NIL)
    }

    fn link_after(&mut self, l: usize, after: u32, index: u32) {
        let next = if after == NIL { self.lists[l].head } else { self.slot(after).next };
        {
            let slot = self.slot_mut(index);
            slot.prev = after;
            slot.next = next;
        }
        if after == NIL {
            self.lists[l].head = index;
        } else {
            self.slot_mut(after).next = index;
        }
        if next == NIL {
            self.lists[l].tail = index;
        } else {
            self.slot_mut(next).prev = index;
        }
    }

    /// Takes the record at `index` out of its deadline list (a list left empty is dropped).
    fn unlink(&mut self, index: u32) {
        let (prev, next) = {
            let slot = self.slot(index);
            (slot.prev, slot.next)
        };
        if prev != NIL {
            self.slot_mut(prev).next = next;
        }
        if next != NIL {
            self.slot_mut(next).prev = prev;
        }
        if prev == NIL || next == NIL {
            let Some(l) = self.lists.iter().position(|l| l.head == index || l.tail == index) else {
                return;
            };
            let list = &mut self.lists[l];
            if list.head == index {
                list.head = next;
            }
            if list.tail == index {
                list.tail = prev;
            }
            if list.head == NIL {
                self.lists.swap_remove(l);
            }
        }
        let slot = self.slot_mut(index);
        slot.prev = NIL;
        slot.next = NIL;
    }
}

impl Drop for Lot {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::{TcpListener, TcpStream};

    use super::*;
    use crate::proxy::limits::ConnLimitConfig;

    /// A lot, its limits and gauge, and a loopback listener to make connections with.
    struct Fixture {
        lot: Lot,
        limits: Arc<ConnLimits>,
        metrics: Arc<Registry>,
        listener: TcpListener,
        /// The client ends, kept open.
        clients: Vec<TcpStream>,
    }

    impl Fixture {
        fn new(per_client: u32) -> Fixture {
            let limits = Arc::new(ConnLimits::new(ConnLimitConfig { max: 100_000, per_client }));
            let metrics = Arc::new(Registry::default());
            Fixture {
                lot: Lot::new(limits.clone(), metrics.clone()),
                limits,
                metrics,
                listener: TcpListener::bind("127.0.0.1:0").unwrap(),
                clients: Vec::new(),
            }
        }

        /// A connection admitted and counted, as the accept path does, due at `deadline`.
        fn conn(&mut self, client: Option<SocketAddr>, deadline: Instant) -> Parked {
            self.clients.push(TcpStream::connect(self.listener.local_addr().unwrap()).unwrap());
            let (socket, peer) = self.listener.accept().unwrap();
            let client = client.unwrap_or(peer);
            let mut admission = self.limits.admit().unwrap();
            if self.limits.per_client() {
                self.limits.admit_client(&mut admission, client.ip()).unwrap();
            }
            let open = self.metrics.open_conn(Listener::Http);
            Parked {
                socket,
                client,
                requests: 3,
                deadline,
                kept: Kept { _admission: admission, _open: open },
            }
        }

        fn open(&self) -> (usize, u64) {
            (self.limits.stats().open, self.metrics.collect().conns.open[0])
        }
    }

    #[test]
    fn a_record_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 40);
    }

    #[test]
    fn a_connection_parks_and_resumes_with_its_client_place_and_count() {
        let mut f = Fixture::new(0);
        let at = Instant::now() + Duration::from_secs(60);
        let conn = f.conn(None, at);
        let (client, fd) = (conn.client, std::os::fd::AsRawFd::as_raw_fd(&conn.socket));
        let key = f.lot.insert(conn).unwrap();
        assert_eq!((f.lot.len(), f.open()), (1, (1, 1)), "parked: still open and holding its place");
        assert!(f.lot.slot(key as u32).client.is_none(), "the peer is not kept: the socket has it");

        let back = f.lot.remove(key).unwrap();
        assert_eq!((back.client, back.requests), (client, 3));
        assert_eq!(std::os::fd::AsRawFd::as_raw_fd(&back.socket), fd);
        assert!(
            back.deadline >= at && back.deadline < at + Duration::from_millis(2),
            "{:?}",
            back.deadline - at
        );
        assert_eq!((f.lot.len(), f.open()), (0, (1, 1)), "resumed: its guards hold it");
        assert!(f.lot.remove(key).is_none(), "gone");
        drop(back);
        assert_eq!(f.open(), (0, 0), "closed by its task: given back");
    }

    #[test]
    fn a_proxy_protocol_client_is_kept_and_its_per_client_place_given_back() {
        let mut f = Fixture::new(2);
        let behind: SocketAddr = "[2001:db8::7]:4242".parse().unwrap();
        let at = Instant::now() + Duration::from_secs(60);
        let first = f.conn(Some(behind), at);
        let key = f.lot.insert(first).unwrap();
        let second = f.conn(Some(behind), at);
        let _other = f.lot.insert(second).unwrap();
        // The client's two places are held by the lot: a third is refused.
        let mut third = f.limits.admit().unwrap();
        assert!(f.limits.admit_client(&mut third, behind.ip()).is_err());
        drop(third);

        let back = f.lot.remove(key).unwrap();
        assert_eq!(back.client, behind);
        drop(back);
        let mut again = f.limits.admit().unwrap();
        assert!(f.limits.admit_client(&mut again, behind.ip()).is_ok(), "the closed one's place");
        drop(again);

        f.lot.expire(at + Duration::from_millis(1));
        assert_eq!((f.lot.len(), f.open()), (0, (0, 0)));
        let mut fresh = [f.limits.admit().unwrap(), f.limits.admit().unwrap(), f.limits.admit().unwrap()];
        let [one, two, three] = &mut fresh;
        f.limits.admit_client(one, behind.ip()).unwrap();
        f.limits.admit_client(two, behind.ip()).expect("no place left counted");
        assert!(f.limits.admit_client(three, behind.ip()).is_err());
    }

    #[test]
    fn connections_close_at_their_deadlines_in_order_whatever_order_they_parked_in() {
        let mut f = Fixture::new(0);
        let t0 = f.lot.epoch;
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // Parking jitter (a few out of order), then a lowered timeout (much earlier deadlines),
        // then back up.
        let order = [1000, 1010, 1005, 1020, 1015, 1030, 300, 310, 305, 1040, 320, 2000, 1050];
        let mut keys = Vec::new();
        for &d in &order {
            let conn = f.conn(None, ms(d));
            keys.push((d, f.lot.insert(conn).unwrap()));
        }
        assert_eq!(f.lot.next_deadline().map(|at| at - t0), Some(Duration::from_millis(300)));
        let mut sorted: Vec<u64> = order.to_vec();
        sorted.sort_unstable();
        let mut left = order.len();
        for &d in &sorted {
            f.lot.expire(ms(d) - Duration::from_millis(1));
            assert_eq!(f.lot.len(), left, "nothing closes before its deadline ({d})");
            f.lot.expire(ms(d));
            left -= 1;
            assert_eq!(f.lot.len(), left, "closed at its deadline ({d})");
            for &(other, key) in &keys {
                assert_eq!(f.lot.socket(key).is_some(), other > d, "{other} after expiring {d}");
            }
        }
        assert_eq!(f.open(), (0, 0));
        assert!(f.lot.lists.is_empty());
    }

    #[test]
    fn a_resumed_connection_leaves_its_list_at_once() {
        let mut f = Fixture::new(0);
        let t0 = f.lot.epoch;
        let keys: Vec<u64> = (0..5)
            .map(|i| {
                let conn = f.conn(None, t0 + Duration::from_secs(10 + i));
                f.lot.insert(conn).unwrap()
            })
            .collect();
        // Head, middle and tail leave.
        for &i in &[0, 2, 4] {
            drop(f.lot.remove(keys[i]).unwrap());
        }
        assert_eq!(f.lot.next_deadline().map(|at| at - t0), Some(Duration::from_secs(11)));
        f.lot.expire(t0 + Duration::from_secs(11));
        assert_eq!(f.lot.len(), 1);
        assert!(f.lot.socket(keys[3]).is_some());
        f.lot.expire(t0 + Duration::from_secs(13));
        assert_eq!((f.lot.len(), f.lot.next_deadline()), (0, None));
    }

    #[test]
    fn a_slot_taken_again_does_not_answer_to_its_old_key() {
        let mut f = Fixture::new(0);
        let at = Instant::now() + Duration::from_secs(60);
        let conn = f.conn(None, at);
        let old = f.lot.insert(conn).unwrap();
        drop(f.lot.remove(old).unwrap());
        let conn = f.conn(None, at);
        let new = f.lot.insert(conn).unwrap();
        assert_eq!(old as u32, new as u32, "the same slot");
        assert!(f.lot.socket(old).is_none() && f.lot.remove(old).is_none());
        assert!(f.lot.socket(new).is_some());
    }

    #[test]
    fn chunks_emptied_after_a_burst_are_given_back() {
        let mut f = Fixture::new(0);
        let at = Instant::now() + Duration::from_secs(60);
        let n = 3 * CHUNK + 2;
        let keys: Vec<u64> = (0..n)
            .map(|_| {
                let conn = f.conn(None, at);
                f.lot.insert(conn).unwrap()
            })
            .collect();
        assert_eq!(f.lot.capacity(), 4 * CHUNK);
        // The burst's connections close but for the first two.
        for &key in &keys[2..] {
            drop(f.lot.remove(key).unwrap());
        }
        assert_eq!(f.lot.len(), 2);
        assert_eq!(f.lot.capacity(), 2 * CHUNK, "one chunk in use, one free kept");
        // New records fill the lowest chunk first.
        for _ in 0..CHUNK - 2 {
            let conn = f.conn(None, at);
            let key = f.lot.insert(conn).unwrap();
            assert!((key as u32 as usize) < CHUNK);
        }
        f.lot.clear();
        assert_eq!((f.lot.len(), f.open()), (0, (0, 0)));
    }
}
