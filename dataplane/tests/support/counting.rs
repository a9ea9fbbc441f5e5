//! A counting global allocator for the memory tests: the system allocator, with the bytes live
//! kept in [`LIVE`]. A test binary that includes this module declares
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;` (one per binary; tests in the
//! binary share the counter, so such a binary holds one test).
// A global allocator must be an `unsafe impl`; see the SAFETY comments.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting the bytes live.
pub struct Counting;

/// Bytes allocated and not freed.
pub static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Bytes live now.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s
// guarantees (and the caller's obligations) carry over unchanged; the counter is a side effect
// that allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above, i.e. by `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract; `ptr` came from `System`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        new
    }
}
