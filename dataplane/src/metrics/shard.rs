//! Per-thread shards of counters: each thread writes the shard its thread-local index picks, so
//! two threads share no cache line on the request path; a scrape sums the shards.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How many shards every sharded value has: the machine's parallelism, at most 64.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 64))
}

/// The shard of the calling thread: threads take indexes in turn the first time they ask.
fn local_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|index| {
        let mut i = index.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, Ordering::Relaxed) % shard_count();
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

impl<T: Default> Shards<T> {
    /// Shards, none allocated yet.
    pub(crate) fn new() -> Self {
        Shards { shards: (0..shard_count()).map(|_| OnceLock::new()).collect() }
    }

    /// The calling thread's shard (allocated on its first use).
    pub(crate) fn local(&self) -> &T {
        let slot = &self.shards[local_index() % self.shards.len()];
        &slot.get_or_init(|| Box::new(Padded(T::default()))).0
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
    /// does not exceed.
    pub(crate) fn observe(&self, bounds: &[u64], value: u64) {
        let bucket = bounds.iter().position(|&b| value <= b).unwrap_or(bounds.len()).min(B - 1);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
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
        assert!(shards.iter().count() <= shard_count());
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
