//! A small fixed team of worker threads for the many short parallel loops
//! of one decode step.
//!
//! A decode step of a small model runs over a hundred products of a few
//! hundred KiB each, tens of µs apiece. Rayon's fork/join wakes sleeping
//! workers through the OS and splits work by stealing, which costs a
//! noticeable share of such short calls. Here the caller and
//! `threads - 1` workers share each loop: the caller publishes the loop,
//! everyone claims task indices from one atomic counter (so a core slowed
//! by other work simply claims fewer), and the caller returns when all
//! claimed tasks are done. Between loops the workers stay awake for
//! [`SPIN`] (a few µs of spinning, then yielding the core between checks,
//! so that a shared machine's other work is not starved) before they park,
//! so the loops of one step find them awake. `Par` lets a function run its
//! loop either here or on rayon's current pool.
//!
//! Protocol (one `AtomicU64` `state`): bits 32.. count the loops, bit 31
//! closes the current loop to late workers, bits 16..31 count the workers
//! that entered it and bits 0..16 those that left. A worker enters with a
//! compare-and-swap on an open loop, and only then reads the loop's
//! closure; the caller closes the loop once every task index is claimed
//! and waits until every entered worker has left. So a worker that wakes
//! late never holds up the caller, and the closure outlives every use.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long an idle worker stays awake (spinning, then yielding) before it
/// parks: longer than the gaps between the products of one step, short
/// enough not to hold a core between requests.
pub const SPIN: Duration = Duration::from_micros(200);

/// Spin-loop iterations (a few µs) before a waiting thread starts to
/// yield its core between checks.
const PURE_SPINS: u32 = 4096;
const CLOSED: u64 = 1 << 31;
const ENTER_ONE: u64 = 1 << 16;
const LEFT_MASK: u64 = 0xffff;

fn entered(s: u64) -> u64 {
    (s >> 16) & 0x7fff
}

/// The loop being run: a task body and the number of tasks.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Shared {
    state: AtomicU64,
    /// The next unclaimed task index of the current loop.
    next: AtomicUsize,
    /// Written by the caller only while no worker is inside a loop (module
    /// docs); read by a worker only after it entered the loop.
    job: UnsafeCell<Job>,
    /// A panic of a task run by a worker, handed to the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    sleeping: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    quit: AtomicBool,
}

// SAFETY: `job` is accessed under the protocol of the module docs (written
// only while no worker is inside a loop, read only by entered workers); the
// closure it points to is `Sync`. Everything else is atomics or locks.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The caller and `threads - 1` workers, running one loop at a time.
pub struct Team {
    shared: Arc<Shared>,
    threads: usize,
    /// One loop at a time (models may be used from several threads).
    busy: Mutex<()>,
    handles: Vec<JoinHandle<()>>,
}

impl Team {
    /// Starts `threads - 1` workers (none for `threads <= 1`; at most
    /// 16 383, the width of the protocol's worker counts).
    ///
    /// # Errors
    /// [`Error::Device`] when a thread cannot be started.
    pub fn new(threads: usize) -> Result<Self> {
        let threads = threads.clamp(1, 1 << 14);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            next: AtomicUsize::new(0),
            job: UnsafeCell::new(Job { f: &nop as &(dyn Fn(usize) + Sync), n: 0 }),
            panic: Mutex::new(None),
            sleeping: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            quit: AtomicBool::new(false),
        });
        let mut team = Team { shared, threads, busy: Mutex::new(()), handles: Vec::new() };
        for i in 1..threads {
            let s = team.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("infer-team-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| Error::Device(format!("cannot start {threads} CPU threads: {e}")))?;
            team.handles.push(h);
        }
        Ok(team)
    }

    /// Threads taking part in a loop, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i` in `0..n`, spread over the team; returns
    /// when all have run. A panic of any `f(i)` is resumed here, after every
    /// started task has finished. A call from inside a task of a team (a
    /// nested loop) runs its tasks on the calling thread.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.threads == 1 || n == 1 || IN_TASK.with(Cell::get) {
            (0..n).for_each(f);
            return;
        }
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // A panic left by a loop whose caller unwound first is that loop's,
        // not this one's.
        s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        // SAFETY: the previous loop is closed and all its workers have left
        // (`Close` below waited for them), so no worker reads `job` now.
        // The lifetime of `f` is erased; `Close` keeps this call from
        // returning, even by unwinding, while a worker may still use it.
        unsafe {
            let f: *const (dyn Fn(usize) + Sync + '_) = f;
            let f =
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync + 'static)>(f);
            *s.job.get() = Job { f, n };
        }
        s.next.store(0, Relaxed);
        let loops = s.state.load(Relaxed) >> 32;
        s.state.store((loops + 1) << 32, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let close = Close(s);
        claim(s, f, n);
        drop(close);
        if let Some(p) = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(p);
        }
    }
}

fn nop(_: usize) {}

thread_local! {
    /// Whether this thread is running tasks of a team's loop.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`IN_TASK`] when dropped (also while unwinding).
struct InTask;

impl Drop for InTask {
    fn drop(&mut self) {
        IN_TASK.with(|c| c.set(false));
    }
}

/// Runs task indices of the current loop until none is left.
fn claim(s: &Shared, f: &(dyn Fn(usize) + Sync), n: usize) {
    IN_TASK.with(|c| c.set(true));
    let _in_task = InTask;
    loop {
        let i = s.next.fetch_add(1, Relaxed);
        if i >= n {
            return;
        }
        f(i);
    }
}

/// Closes the current loop and waits until every worker that entered it has
/// left; on drop, so that it also runs while the caller's own task unwinds.
struct Close<'a>(&'a Shared);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let s = self.0;
        // No task index is handed out after this: late workers find it used up.
        s.next.store(usize::MAX / 2, Relaxed);
        let mut st = s.state.fetch_or(CLOSED, AcqRel) | CLOSED;
        let mut spins = 0u32;
        while entered(st) != st & LEFT_MASK {
            spins += 1;
            if spins < PURE_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            st = s.state.load(Acquire);
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.quit.load(Acquire) {
                return;
            }
            let st = s.state.load(Acquire);
            if st >> 32 != seen && st & CLOSED == 0 {
                if s.state.compare_exchange(st, st + ENTER_ONE, AcqRel, Acquire).is_ok() {
                    seen = st >> 32;
                    break;
                }
                continue;
            }
            if st >> 32 != seen {
                // A loop this worker missed is over; wait for the next.
                seen = st >> 32;
                idle_since = Instant::now();
            }
            spins += 1;
            if spins < PURE_SPINS {
                std::hint::spin_loop();
                continue;
            }
            if idle_since.elapsed() < SPIN {
                // Busy, but giving the core to other runnable threads (the
                // caller's, or other work on a shared machine) first.
                std::thread::yield_now();
                continue;
            }
            let g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.sleeping.fetch_add(1, SeqCst);
            let st = s.state.load(SeqCst);
            if (st >> 32 == seen || st & CLOSED != 0) && !s.quit.load(SeqCst) {
                drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
            s.sleeping.fetch_sub(1, SeqCst);
            (idle_since, spins) = (Instant::now(), 0);
        }
        // SAFETY: this worker entered the loop, so the caller has written
        // `job` for it and keeps `job.f` alive until this worker leaves.
        let job = unsafe { *s.job.get() };
        let f = unsafe { &*job.f };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| claim(s, f, job.n))) {
            *s.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
        s.state.fetch_add(1, Release);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.quit.store(true, SeqCst);
        {
            let _g = s.park.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Where a parallel loop runs: on rayon's current pool, or on a [`Team`].
#[derive(Clone, Copy)]
pub enum Par<'a> {
    Rayon,
    Team(&'a Team),
}

impl Par<'_> {
    /// Threads a loop is spread over.
    pub fn threads(&self) -> usize {
        match self {
            Par::Rayon => rayon::current_num_threads(),
            Par::Team(t) => t.threads(),
        }
    }

    /// Runs `f(i)` exactly once for every `i` in `0..n`, in parallel;
    /// returns when all have run.
    pub fn for_each(&self, n: usize, f: impl Fn(usize) + Sync + Send) {
        match self {
            Par::Rayon => {
                use rayon::prelude::*;
                (0..n).into_par_iter().for_each(f)
            }
            Par::Team(t) => t.run(n, &f),
        }
    }

    /// Runs `f(i, a_i, b_i)` for the `i`-th `ca`-long piece of `a` and the
    /// `i`-th `cb`-long piece of `b`, for every piece of `a` (the last
    /// pieces may be shorter; `b` may run out, giving empty pieces).
    pub fn for_each_chunk_pair_mut<A: Send, B: Send>(
        &self,
        a: &mut [A],
        ca: usize,
        b: &mut [B],
        cb: usize,
        f: impl Fn(usize, &mut [A], &mut [B]) + Sync + Send,
    ) {
        let (ca, la, lb) = (ca.max(1), a.len(), b.len());
        let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
        self.for_each(la.div_ceil(ca), |i| {
            let (a0, b0) = ((i * ca).min(la), (i * cb).min(lb));
            let (na, nb) = (ca.min(la - a0), cb.min(lb - b0));
            // SAFETY: `for_each` runs each `i` once, so the pieces handed out
            // are disjoint; they lie inside `a` and `b`, which this call
            // borrows mutably until every piece is done.
            let (ai, bi) = unsafe {
                (
                    std::slice::from_raw_parts_mut(pa.get().add(a0), na),
                    std::slice::from_raw_parts_mut(pb.get().add(b0), nb),
                )
            };
            f(i, ai, bi)
        });
    }

    /// Runs `f(i, a_i)` for the `i`-th `ca`-long piece of `a` (the last
    /// may be shorter).
    pub fn for_each_chunk_mut<A: Send>(&self, a: &mut [A], ca: usize, f: impl Fn(usize, &mut [A]) + Sync + Send) {
        self.for_each_chunk_pair_mut(a, ca, &mut [] as &mut [u8], 0, |i, ai, _| f(i, ai));
    }
}

/// A pointer to the elements of a slice that the tasks of one loop share,
/// each writing its own disjoint piece.
struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    /// The pointer (through a method, so that closures capture the whole
    /// `SendPtr`, not its field).
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the pieces handed out from it are disjoint (see the users) and the
// elements are `Send`.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_loop_runs_on_the_calling_thread() {
        let t = Team::new(3).unwrap();
        let count = AtomicUsize::new(0);
        t.run(4, &|_| {
            t.run(5, &|_| {
                count.fetch_add(1, Relaxed);
            })
        });
        assert_eq!(count.load(Relaxed), 20);
    }

    #[test]
    fn a_panic_is_reported_by_its_own_loop_only() {
        let t = Team::new(2).unwrap();
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| t.run(2, &|_| panic!("task"))));
            assert!(r.is_err());
            let ok = catch_unwind(AssertUnwindSafe(|| t.run(4, &|_| {})));
            assert!(ok.is_ok(), "a later loop reported an earlier loop's panic");
        }
    }

    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 3, 5] {
            let team = Team::new(threads).unwrap();
            for n in [0, 1, 2, 7, 100, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                team.run(n, &|i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "{threads} threads, {n} tasks");
            }
        }
    }

    #[test]
    fn loops_after_the_workers_parked_still_run() {
        let team = Team::new(3).unwrap();
        for round in 0..3 {
            std::thread::sleep(SPIN * 3);
            let sum = AtomicUsize::new(0);
            team.run(64, &|i| {
                sum.fetch_add(i, Relaxed);
            });
            assert_eq!(sum.load(Relaxed), 64 * 63 / 2, "round {round}");
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_team_goes_on() {
        let team = Team::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(16, &|i| {
                if i == 9 {
                    panic!("task 9");
                }
            })
        }));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        team.run(10, &|i| {
            sum.fetch_add(i, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 45);
    }

    #[test]
    fn loops_from_several_threads_take_turns() {
        let team = Arc::new(Team::new(2).unwrap());
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let team = team.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        team.run(9, &|i| {
                            sum.fetch_add(i, Relaxed);
                        });
                        assert_eq!(sum.load(Relaxed), 36);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
