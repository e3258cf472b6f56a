//! A global allocator that keeps an emergency reserve, so that running out
//! of memory ends in the program's own error, not in the allocator's abort.
//!
//! The large buffers (weights, packed copies, KV caches, vocabulary tables)
//! are fallible allocations that turn a refusal into
//! [`crate::Error::OutOfMemory`]. But every thread also makes small
//! infallible ones (a `String`, a `Vec` push, a thread's name), and under a
//! memory limit (`ulimit -v`, `RLIMIT_AS`) one of them can be the first
//! to find memory gone, when another thread's large allocation took the
//! rest: Rust then aborts ("memory allocation of 41 bytes failed") before
//! the large allocation's error can be reported. Which allocation that is
//! depends on timing, so no set of fallible call sites closes the gap.
//!
//! [`ReserveAllocator`] closes it in one place: it holds back a block of
//! address space (untouched, so it costs no resident memory) and
//! - a failed allocation of at most [`SMALL`] bytes releases the reserve
//!   and retries: the small allocation succeeds;
//! - while the reserve is released, allocations (and growth) of more than
//!   [`SMALL`] bytes are refused, so the next large fallible allocation
//!   reports its error and the error path has the reserve to run in;
//! - freeing a block of more than [`SMALL`] bytes while released, or
//!   small blocks that add up to the reserve's size, tries to take the
//!   reserve back, so a long-running process (`infer serve`) recovers once
//!   the memory is returned.
//!
//! The reserve guards against the allocator's refusals (address-space
//! limits, exhausted mappings); a cgroup or overcommit limit that kills
//! the process on touch is outside what any allocator can see.
//!
//! A binary opts in with
//! `#[global_allocator] static A: ReserveAllocator = ReserveAllocator::system();`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// Allocations of at most this many bytes may release the reserve; larger
/// ones are refused while it is released (256 KiB).
pub const SMALL: usize = 256 << 10;

/// The reserve [`ReserveAllocator::system`] keeps (16 MiB).
pub const DEFAULT_RESERVE: usize = 16 << 20;

const UNARMED: u8 = 0;
const HELD: u8 = 1;
const RELEASED: u8 = 2;
const ARMING: u8 = 3;

/// A [`GlobalAlloc`] over `A` that keeps an emergency reserve (see the
/// module's documentation for the policy).
pub struct ReserveAllocator<A = System> {
    inner: A,
    reserve_bytes: usize,
    /// The reserve's block while held, null otherwise.
    reserve: AtomicPtr<u8>,
    /// `UNARMED` until the first allocation takes the reserve; then `HELD`
    /// or `RELEASED` (`ARMING` while one thread takes it).
    state: AtomicU8,
    /// Bytes of small blocks freed since the last try to take the reserve
    /// back (counted while released only).
    freed: AtomicUsize,
}

impl ReserveAllocator<System> {
    /// The system allocator with a [`DEFAULT_RESERVE`] reserve, taken at the
    /// first allocation.
    pub const fn system() -> Self {
        Self::new(System, DEFAULT_RESERVE)
    }
}

impl<A: GlobalAlloc> ReserveAllocator<A> {
    /// `inner` with a reserve of `reserve_bytes` (a multiple of 4096, at
    /// least [`SMALL`]), taken at the first allocation.
    pub const fn new(inner: A, reserve_bytes: usize) -> Self {
        Self {
            inner,
            reserve_bytes,
            reserve: AtomicPtr::new(std::ptr::null_mut()),
            state: AtomicU8::new(UNARMED),
            freed: AtomicUsize::new(0),
        }
    }

    /// Whether the reserve is released (memory ran short, and large
    /// allocations are refused until enough is freed to take it back).
    pub fn is_released(&self) -> bool {
        self.state.load(Ordering::Acquire) == RELEASED
    }

    fn reserve_layout(&self) -> Layout {
        // A page-aligned block: the size is a constant from `new`.
        Layout::from_size_align(self.reserve_bytes, 4096).unwrap_or(Layout::new::<u8>())
    }

    /// Takes the reserve when the state is `from` (`UNARMED` or
    /// `RELEASED`); a failure leaves it `RELEASED`.
    fn take_reserve(&self, from: u8) {
        if self.state.compare_exchange(from, ARMING, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { self.inner.alloc(self.reserve_layout()) };
            self.reserve.store(p, Ordering::Release);
            self.state.store(if p.is_null() { RELEASED } else { HELD }, Ordering::Release);
        }
    }

    /// Frees the reserve; false when it was not held.
    fn release_reserve(&self) -> bool {
        let p = self.reserve.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if p.is_null() {
            return false;
        }
        self.state.store(RELEASED, Ordering::Release);
        // SAFETY: `p` was allocated by `inner` with the reserve's layout
        // and is owned by nobody else (the swap took it).
        unsafe { self.inner.dealloc(p, self.reserve_layout()) };
        true
    }

    /// `bytes` returned to `inner` while released: a large block, or small
    /// ones adding up to the reserve's size, try to take it back.
    fn returned(&self, bytes: usize) {
        if bytes > SMALL || self.freed.fetch_add(bytes, Ordering::Relaxed) + bytes >= self.reserve_bytes {
            self.freed.store(0, Ordering::Relaxed);
            self.take_reserve(RELEASED);
        }
    }

    /// Whether an allocation of `size` bytes is refused now.
    fn refused(&self, size: usize) -> bool {
        match self.state.load(Ordering::Acquire) {
            UNARMED => {
                self.take_reserve(UNARMED);
                size > SMALL && self.is_released()
            }
            RELEASED => size > SMALL,
            _ => false,
        }
    }

    /// `attempt()`, retried once after releasing the reserve when it
    /// failed for a small allocation.
    fn with_reserve(&self, size: usize, attempt: impl Fn() -> *mut u8) -> *mut u8 {
        let p = attempt();
        if p.is_null() && size <= SMALL && self.release_reserve() {
            return attempt();
        }
        p
    }
}

// SAFETY: every method forwards to `inner` with the caller's layout and
// pointer, or returns null (a refusal, which `GlobalAlloc` allows); the
// reserve is a block of `inner`'s own, never handed out.
unsafe impl<A: GlobalAlloc> GlobalAlloc for ReserveAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.refused(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as `GlobalAlloc::alloc`, with the caller's layout.
        self.with_reserve(layout.size(), || unsafe { self.inner.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.refused(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as `GlobalAlloc::alloc_zeroed`, with the caller's layout.
        self.with_reserve(layout.size(), || unsafe { self.inner.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract: `ptr` came from this allocator
        // (so from `inner`) with `layout`.
        unsafe { self.inner.dealloc(ptr, layout) };
        if self.state.load(Ordering::Relaxed) == RELEASED {
            self.returned(layout.size());
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && self.refused(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `realloc`; a failed attempt
        // leaves `ptr` valid, so the retry may use it again.
        let p = self.with_reserve(new_size, || unsafe { self.inner.realloc(ptr, layout, new_size) });
        if !p.is_null() && new_size < layout.size() && self.is_released() {
            self.returned(layout.size() - new_size);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system allocator with a budget of `limit` bytes in use.
    struct Budget {
        limit: usize,
        used: AtomicUsize,
    }

    unsafe impl GlobalAlloc for Budget {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if self.used.fetch_add(layout.size(), Ordering::SeqCst) + layout.size() > self.limit {
                self.used.fetch_sub(layout.size(), Ordering::SeqCst);
                return std::ptr::null_mut();
            }
            // SAFETY: the caller's layout.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `alloc` with `layout`.
            unsafe { System.dealloc(ptr, layout) };
            self.used.fetch_sub(layout.size(), Ordering::SeqCst);
        }
    }

    const MIB: usize = 1 << 20;

    fn limited(limit: usize) -> ReserveAllocator<Budget> {
        ReserveAllocator::new(Budget { limit, used: AtomicUsize::new(0) }, 4 * MIB)
    }

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes, 8).unwrap()
    }

    #[test]
    fn a_small_allocation_that_finds_memory_gone_gets_the_reserve_and_large_ones_are_then_refused() {
        let a = limited(10 * MIB);
        unsafe {
            // The reserve (4 MiB) is taken first; 6 MiB remain.
            let big = a.alloc(layout(6 * MIB));
            assert!(!big.is_null());
            assert!(!a.is_released());
            // Nothing is left: a small allocation releases the reserve.
            let small = a.alloc(layout(41));
            assert!(!small.is_null(), "the reserve did not serve the small allocation");
            assert!(a.is_released());
            // Large allocations are refused while released, though they
            // would fit in what the reserve freed.
            assert!(a.alloc(layout(2 * MIB)).is_null());
            assert!(a.alloc_zeroed(layout(2 * MIB)).is_null());
            let grown = a.realloc(small, layout(41), 2 * MIB);
            assert!(grown.is_null(), "growth past SMALL was not refused");
            // Small ones go on (the error path's strings).
            let more = a.alloc(layout(4096));
            assert!(!more.is_null());
            // Freeing a large block takes the reserve back; large
            // allocations fit again.
            a.dealloc(big, layout(6 * MIB));
            assert!(!a.is_released());
            let again = a.alloc(layout(2 * MIB));
            assert!(!again.is_null());
            a.dealloc(again, layout(2 * MIB));
            a.dealloc(more, layout(4096));
            a.dealloc(small, layout(41));
        }
    }

    #[test]
    fn small_frees_that_add_up_to_the_reserve_take_it_back() {
        let a = limited(10 * MIB);
        unsafe {
            let small = layout(64 << 10);
            // 6 MiB in small blocks after the 4 MiB reserve: full.
            let blocks: Vec<*mut u8> = (0..96).map(|_| a.alloc(small)).collect();
            assert!(blocks.iter().all(|p| !p.is_null()));
            let extra = a.alloc(small);
            assert!(!extra.is_null() && a.is_released());
            // 3 MiB freed: less than the reserve, still released.
            for &p in &blocks[..48] {
                a.dealloc(p, small);
            }
            assert!(a.is_released());
            // 4 MiB freed in all: the reserve is taken back.
            for &p in &blocks[48..64] {
                a.dealloc(p, small);
            }
            assert!(!a.is_released(), "small frees did not take the reserve back");
            for &p in &blocks[64..] {
                a.dealloc(p, small);
            }
            a.dealloc(extra, small);
        }
    }

    #[test]
    fn a_large_allocation_that_does_not_fit_is_refused_and_keeps_the_reserve() {
        let a = limited(10 * MIB);
        unsafe {
            assert!(a.alloc(layout(7 * MIB)).is_null());
            assert!(!a.is_released(), "a large refusal spent the reserve");
            let p = a.alloc(layout(5 * MIB));
            assert!(!p.is_null());
            a.dealloc(p, layout(5 * MIB));
        }
    }

    #[test]
    fn a_reserve_that_cannot_be_taken_leaves_large_allocations_refused() {
        let a = limited(2 * MIB);
        unsafe {
            let small = a.alloc(layout(64));
            assert!(!small.is_null());
            assert!(a.is_released());
            assert!(a.alloc(layout(SMALL + 1)).is_null());
            a.dealloc(small, layout(64));
        }
    }
}
