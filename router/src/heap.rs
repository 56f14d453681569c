//! The router's live heap: the system allocator, counting what it has handed out and not had
//! back, so that `/metrics` shows what the process holds (`tessera_router_heap_bytes`) and a
//! soak tells growing live data from a growing RSS (fragmentation, pages kept by the
//! allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes. The router binary installs it as its global
/// allocator; [`live_bytes`] reads the count.
pub struct CountingAllocator;

// SAFETY: every call is forwarded to `System` with the caller's arguments, which meet
// `System`'s contract because they meet `GlobalAlloc`'s; the count is only arithmetic.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: see the impl.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

/// Bytes allocated through [`CountingAllocator`] and not freed: 0 in a process that does not
/// install it.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Fixes glibc's thresholds for the router's allocation pattern. glibc raises its mmap
/// threshold each time a large mmapped block is freed, so that later large buffers (request
/// bodies, token vectors, SSE frames) land in the arenas instead, where they fragment them; a
/// threshold set explicitly stays put. The trim threshold makes `free` return a heap top of
/// that size at once instead of waiting for the trimmer. Other C libraries: nothing to do.
pub fn fix_malloc_thresholds() {
    set_malloc_thresholds();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_malloc_thresholds() {
    const MMAP_THRESHOLD: libc::c_int = 128 << 10;
    const TRIM_THRESHOLD: libc::c_int = 256 << 10;
    // SAFETY: `mallopt` takes plain integers; an option glibc refuses returns 0 and changes
    // nothing.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_malloc_thresholds() {}

/// Starts a thread that hands the allocator's free pages back to the system every `period`.
/// glibc keeps freed memory in its per-thread arenas for reuse; under a changing mix of
/// requests the router's worker threads fragment them, and RSS creeps up while the live heap
/// stays level. `malloc_trim` releases every arena's free pages. Other C libraries (and
/// allocators) manage their own: there it does nothing.
pub fn spawn_trimmer(period: std::time::Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(move || {
            loop {
                std::thread::sleep(period);
                release_free_pages();
            }
        })
        .map(drop)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn release_free_pages() {
    // SAFETY: `malloc_trim` takes no pointers and may be called from any thread at any time.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_pages() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_live() {
        let a = CountingAllocator;
        let layout = Layout::from_size_align(1000, 8).unwrap();
        let before = live_bytes();
        // SAFETY: a non-zero layout; the pointer is freed with the layout it has.
        #[allow(unsafe_code)]
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(live_bytes() - before, 1000);
            let p = a.realloc(p, layout, 3000);
            assert_eq!(live_bytes() - before, 3000);
            let bigger = Layout::from_size_align(3000, 8).unwrap();
            let p = a.realloc(p, bigger, 500);
            assert_eq!(live_bytes() - before, 500);
            a.dealloc(p, Layout::from_size_align(500, 8).unwrap());
        }
        assert_eq!(live_bytes(), before);
    }
}
