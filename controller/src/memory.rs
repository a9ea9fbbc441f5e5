//! Handing memory back to the system after a full rebuild.
//!
//! A full rebuild allocates a new table and frees the old one; the allocator (mimalloc, see
//! `main.rs`) keeps freed pages for a while to reuse them, so the resident size after a rebuild
//! stays near its peak until later allocations happen to reuse or purge them. Full rebuilds are
//! rare (an IngressClass or settings change, a resync), so right after one, the rebuilding
//! thread asks the allocator to return what is free at once: a few milliseconds once, where
//! returning freed pages eagerly on every free (`MIMALLOC_PURGE_DELAY=0`) doubles the rebuild
//! time (bench/RESULTS.md).

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
