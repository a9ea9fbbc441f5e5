//! Per-thread shards of counters: each thread writes the shard its thread-local index picks, so
//! two threads share no cache line on the request path; a scrape sums the shards.
//!
//! The first [`shard_count`] threads that write own their shard alone: they add with a plain
//! load and store ([`Local::add`]), not a locked read-modify-write, which on x86 costs a `lock`
//! prefix (a full barrier, ~20 cycles) per counter, nine per request. Threads past them share
//! one extra shard and add atomically.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How many shards every sharded value has: the machine's parallelism, at most 64.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 64))
}

/// The shard of the calling thread: threads take indexes in turn the first time they ask. The
/// first `shard_count()` threads get one each, which no other thread gets; every later thread
/// gets `shard_count()`, the shared shard.
fn local_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|index| {
        let mut i = index.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, Ordering::Relaxed).min(shard_count());
            index.set(i);
        }
        i
    })
}

/// One shard's block, allocated on first use and aligned to its own cache lines (128 bytes:
/// adjacent-line prefetching pairs 64-byte lines on x86).
#[repr(align(128))]
struct Padded<T>(T);

/// A value split in per-thread shards, each allocated when its first thread writes.
pub(crate) struct Shards<T> {
    shards: Box<[OnceLock<Box<Padded<T>>>]>,
}

/// The calling thread's shard, and whether the thread is its only writer.
pub(crate) struct Local<'a, T> {
    pub(crate) shard: &'a T,
    owned: bool,
}

impl<T> Local<'_, T> {
    /// Adds `v` to `counter`, one of this shard's.
    #[inline]
    pub(crate) fn add(&self, counter: &AtomicU64, v: u64) {
        if self.owned {
            // This thread is the shard's only writer (`local_index`), so no add can come
            // between the load and the store; readers (a scrape) see the old or the new value.
            counter.store(counter.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
        } else {
            counter.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Adds `value` to `hist`, one of this shard's ([`Hist::observe`]).
    #[inline]
    pub(crate) fn observe<const B: usize>(&self, hist: &Hist<B>, bounds: &[u64], value: u64) {
        self.add(&hist.counts[Hist::<B>::bucket(bounds, value)], 1);
        self.add(&hist.sum, value);
    }
}

impl<T: Default> Shards<T> {
    /// Shards, none allocated yet: one per owning thread and the shared one.
    pub(crate) fn new() -> Self {
        Shards { shards: (0..=shard_count()).map(|_| OnceLock::new()).collect() }
    }

    /// The calling thread's shard (allocated on its first use).
    pub(crate) fn local(&self) -> &T {
        self.local_owned().shard
    }

    /// The calling thread's shard (allocated on its first use), owned when the thread is its
    /// only writer.
    pub(crate) fn local_owned(&self) -> Local<'_, T> {
        let i = local_index().min(self.shards.len() - 1);
        let slot = &self.shards[i];
        Local {
            shard: &slot.get_or_init(|| Box::new(Padded(T::default()))).0,
            owned: i < self.shards.len() - 1,
        }
    }

    /// Every allocated shard.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().filter_map(|s| s.get().map(|p| &p.0))
    }
}

/// A histogram in one shard: counts per bucket (the last is `+Inf`), and the sum.
pub(crate) struct Hist<const B: usize> {
    pub(crate) counts: [AtomicU64; B],
    pub(crate) sum: AtomicU64,
}

impl<const B: usize> Default for Hist<B> {
    fn default() -> Self {
        Hist { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum: AtomicU64::new(0) }
    }
}

impl<const B: usize> Hist<B> {
    /// Adds `value` to the first bucket whose bound (`bounds`, ascending, `B - 1` of them) it
    /// does not exceed (the request path adds through [`Local::observe`]).
    #[cfg(test)]
    pub(crate) fn observe(&self, bounds: &[u64], value: u64) {
        self.counts[Self::bucket(bounds, value)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// The bucket of `value`.
    #[inline]
    fn bucket(bounds: &[u64], value: u64) -> usize {
        bounds.iter().position(|&b| value <= b).unwrap_or(bounds.len()).min(B - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads writing the same value land in shards that a sum finds whole.
    #[test]
    fn shards_sum_every_thread() {
        let shards: std::sync::Arc<Shards<AtomicU64>> = std::sync::Arc::new(Shards::new());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let shards = shards.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        shards.local().fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let total: u64 = shards.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 8000);
        assert!(shards.iter().count() <= shard_count() + 1);
    }

    /// More threads than owned shards, each adding without a locked add where it owns its
    /// shard: the sum loses nothing (the threads past the owners share one shard atomically).
    #[test]
    fn owned_and_shared_adds_sum_exactly() {
        let shards: std::sync::Arc<Shards<AtomicU64>> = std::sync::Arc::new(Shards::new());
        let threads: Vec<_> = (0..shard_count() + 6)
            .map(|_| {
                let shards = shards.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let local = shards.local_owned();
                        local.add(local.shard, 3);
                    }
                })
            })
            .collect();
        let n = threads.len() as u64;
        for t in threads {
            t.join().expect("thread");
        }
        let total: u64 = shards.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        assert_eq!(total, n * 30_000);
    }

    /// A value goes to the first bucket whose bound it does not exceed; past the last, `+Inf`.
    #[test]
    fn histogram_buckets() {
        let h: Hist<3> = Hist::default();
        for v in [0, 10, 11, 20, 21, 1000] {
            h.observe(&[10, 20], v);
        }
        let counts: Vec<u64> = h.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [2, 2, 2]);
        assert_eq!(h.sum.load(Ordering::Relaxed), 1062);
    }
}
