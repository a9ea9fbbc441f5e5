//! Handing memory back to the system after a full rebuild, and once connections stop parking.
//!
//! A full rebuild allocates a new table and frees the old one; the allocator (mimalloc, see
//! `main.rs`) keeps freed pages for a while to reuse them, so the resident size after a rebuild
//! stays near its peak until later allocations happen to reuse or purge them. Full rebuilds are
//! rare (an IngressClass or settings change, a resync), so right after one, the rebuilding
//! thread asks the allocator to return what is free at once: a few milliseconds once, where
//! returning freed pages eagerly on every free (`MIMALLOC_PURGE_DELAY=0`) doubles the rebuild
//! time (bench/RESULTS.md).
//!
//! The same holds after a burst of connections that then stay idle: each is served by a task
//! with hyper's buffers, and parked a second later (`weir_dataplane::proxy`'s parking), which
//! frees all of that; the allocator purges freed pages only when it is called again, so an idle
//! proxy kept ~400 B per idle keep-alive connection of freed memory resident (bench/RESULTS.md,
//! issue 23). [`release_after_parking`] gives it back once the count of parked connections has
//! stopped changing. Idle pooled upstream connections give their read buffers back a second
//! after their last response (the pool's sweep): that count settling triggers it too.

use std::future::Future;
use std::time::Duration;

use weir_dataplane::proxy::Proxy;

/// Returns the free memory of the calling thread's allocator heap (and of abandoned heaps) to
/// the system.
#[allow(unsafe_code)] // the one call below, sound as its comment says
pub fn release_free_memory() {
    // SAFETY: `mi_collect` takes no pointer and touches only mimalloc's own bookkeeping: it frees
    // pages that hold no live allocation and purges them, which mimalloc documents as callable
    // at any time from any thread. Live allocations are not moved or freed. When mimalloc is not
    // the global allocator (the library's tests), its heap is empty and the call does nothing.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Stops the kernel from backing this process's memory with transparent huge pages
/// (`prctl(PR_SET_THP_DISABLE)`, from now on, for every mapping, the allocator's arenas
/// included): mimalloc asks for them with `madvise`, and a kernel in THP mode `madvise` (Debian's
/// default) or `always` grants them, so the resident size moves in 2 MiB steps and an idle
/// proxy keeps freed memory resident (`--transparent-huge-pages`, bench/RESULTS.md). A
/// failure (a kernel without the call) is logged and changes nothing else.
pub fn disable_transparent_huge_pages() {
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(%error, "could not disable transparent huge pages (prctl PR_SET_THP_DISABLE)");
    }
}

/// How often [`release_after_parking`] looks at the count of parked connections.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Calls [`release_free_memory`] once the proxy's count of parked connections, and its count
/// of pooled upstream connections that gave their buffers back, have stopped changing (for
/// [`LOOK_EVERY`]) after a change, until `stop`. A proxy whose connections keep parking and
/// resuming reuses what it frees and is left alone.
pub async fn release_after_parking(proxy: Proxy, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let counts = |proxy: &Proxy| (proxy.parked_connections(), proxy.pool_buffers_released());
    let mut quiet = Quiet::new(counts(&proxy));
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        if quiet.look(counts(&proxy)) {
            release_free_memory();
        }
    }
}

/// When counts that changed have stopped changing.
#[derive(Debug)]
struct Quiet<T> {
    last: T,
    changed: bool,
}

impl<T: PartialEq> Quiet<T> {
    fn new(count: T) -> Quiet<T> {
        Quiet { last: count, changed: false }
    }

    /// The counts now; whether they stopped changing since the last look, after a change.
    fn look(&mut self, count: T) -> bool {
        if count != self.last {
            self.last = count;
            self.changed = true;
            return false;
        }
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_released_once_each_time_the_parked_count_settles() {
        let mut quiet = Quiet::new(0);
        // Nothing happened: nothing to give back.
        assert!(!quiet.look(0));
        // A burst parks connections; once the count holds, once.
        assert!(!quiet.look(3000));
        assert!(!quiet.look(9900));
        assert!(quiet.look(9900));
        assert!(!quiet.look(9900));
        // They resume and park again (a busy proxy): nothing until it settles.
        assert!(!quiet.look(9800));
        assert!(!quiet.look(9850));
        assert!(quiet.look(9850));
        assert!(!quiet.look(9850));
    }

    #[test]
    fn memory_is_released_once_pooled_buffers_are_given_back_too() {
        let mut quiet = Quiet::new((0, 0));
        assert!(!quiet.look((9900, 0)));
        assert!(quiet.look((9900, 0)));
        // The pool's sweep gives 200 connections' buffers back later: released again, once.
        assert!(!quiet.look((9900, 200)));
        assert!(quiet.look((9900, 200)));
        assert!(!quiet.look((9900, 200)));
    }
}
