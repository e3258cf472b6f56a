//! infer-compute's patch: bounds on the walks over a value.
//!
//! Printing, comparing, hashing and serializing a value recurse once per
//! level of nesting, and a template can nest a value as deep as its fuel
//! allows (`{% set ns.l = [ns.l] %}` in a loop), which overflowed the stack
//! of an ordinary thread.  A value that shares itself (`[d, d]` doubled 64
//! times) is small in memory but 2^64 items long to walk.  So these walks
//! count their depth on the thread and stop past [`MAX_DEPTH`] levels, and
//! charge each item they visit to the fuel of the render running on the
//! thread, stopping once it is used up.  A walk that cannot return an error
//! (`fmt::Display`, `PartialEq`, `Ord`, `Hash`) stops early with a partial
//! result and leaves the render's fuel exhausted, so that the render fails at
//! its next check and the partial result is never seen.
//!
//! Dropping a value recurses too; [`drop_object`] frees objects nested
//! deeper than [`DROP_DEPTH`] from a list instead.

use std::cell::{Cell, RefCell};
use std::cmp::Ordering;

use crate::value::Value;
use crate::vm::fuel::{FuelTracker, ITEM_COST};

/// The deepest a walk goes into a value.  At a few hundred bytes of stack a
/// level this takes well under a megabyte.
pub const MAX_DEPTH: usize = 500;

/// The deepest an object is freed recursively; deeper ones are queued.
const DROP_DEPTH: usize = 64;

thread_local! {
    static ACTIVE: Cell<*const FuelTracker> = const { Cell::new(std::ptr::null()) };
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static DROPPING: Cell<usize> = const { Cell::new(0) };
    #[allow(clippy::type_complexity)]
    static DEFERRED: RefCell<Vec<(*const (), fn(*const ()))>> = const { RefCell::new(Vec::new()) };
}

/// Makes a render's fuel the one charged by walks on this thread until it
/// is dropped (restoring the one before: macros evaluate nested).
pub(crate) struct ActiveFuel(*const FuelTracker);

impl ActiveFuel {
    pub(crate) fn set(tracker: Option<&FuelTracker>) -> ActiveFuel {
        let ptr = tracker.map_or(std::ptr::null(), |t| t as *const FuelTracker);
        ActiveFuel(ACTIVE.with(|a| a.replace(ptr)))
    }
}

impl Drop for ActiveFuel {
    fn drop(&mut self) {
        let _ = ACTIVE.try_with(|a| a.set(self.0));
    }
}

fn with_active<R>(f: impl FnOnce(&FuelTracker) -> R) -> Option<R> {
    let ptr = ACTIVE.try_with(|a| a.get()).ok()?;
    // SAFETY: the pointer is set by `ActiveFuel` from a tracker that
    // outlives it (the render's state) and is cleared when it is dropped;
    // the tracker is only used on this thread.
    unsafe { ptr.as_ref() }.map(f)
}

/// Charges `units` for visiting part of a value.  `false` once the render's
/// fuel is used up: the walk should stop.  Always `true` outside a render.
#[inline]
pub(crate) fn charge(units: u64) -> bool {
    with_active(|t| t.consume(units).is_ok()).unwrap_or(true)
}

/// The charge for visiting an item of a container.
pub(crate) const ITEM_UNITS: u64 = ITEM_COST;

/// The charge for writing out `value` as an item of a container: an item,
/// and two units a byte of a string (escapes).
pub(crate) fn item_units(value: &Value) -> u64 {
    ITEM_UNITS.saturating_add(value.as_str().map_or(0, |s| s.len() as u64).saturating_mul(2))
}

/// Charges a comparison of two strings, a unit per byte of the shorter:
/// `false` once the render's fuel is used up.
#[inline]
pub(crate) fn charge_bytes(a: &str, b: &str) -> bool {
    charge(a.len().min(b.len()) as u64)
}

/// `a.cmp(b)` of two iterators, charging an item per pair (equal once the
/// fuel is used up).
pub(crate) fn cmp_charged<T: Ord>(a: impl Iterator<Item = T>, b: impl Iterator<Item = T>) -> Ordering {
    let mut b = b.fuse();
    for x in a {
        if !charge(ITEM_UNITS) {
            return Ordering::Equal;
        }
        match b.next() {
            None => return Ordering::Greater,
            Some(y) => match x.cmp(&y) {
                Ordering::Equal => {}
                other => return other,
            },
        }
    }
    if b.next().is_some() {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

/// The error of a walk that stopped: the render's (nested too deep, or out
/// of fuel).
pub(crate) fn stopped_error() -> crate::error::Error {
    // Outside a render only the depth stops a walk.
    with_active(FuelTracker::exhausted_error).unwrap_or_else(|| {
        crate::error::Error::new(
            crate::error::ErrorKind::InvalidOperation,
            format!("a value is nested more than {MAX_DEPTH} levels deep"),
        )
    })
}


/// One level of a walk into a value, left when dropped.
pub(crate) struct Level(());

impl Level {
    /// Enters one level deeper; `None` past [`MAX_DEPTH`], which fails the
    /// render running on this thread.
    #[inline]
    pub(crate) fn enter() -> Option<Level> {
        let depth = DEPTH.try_with(|d| {
            let n = d.get();
            if n < MAX_DEPTH {
                d.set(n + 1);
            }
            n
        });
        match depth {
            Ok(n) if n < MAX_DEPTH => Some(Level(())),
            _ => {
                with_active(FuelTracker::fail_too_deep);
                None
            }
        }
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Frees an object through `decref`, queueing it instead when objects are
/// already being freed [`DROP_DEPTH`] levels deep: the outermost drop frees
/// the queue, so that freeing a value nested a million levels deep does not
/// recurse a million times.
pub(crate) fn drop_object(ptr: *const (), decref: fn(*const ())) {
    let outer = DROPPING.try_with(|d| {
        let n = d.get();
        if n >= DROP_DEPTH {
            let queued = DEFERRED.try_with(|q| {
                let mut q = q.borrow_mut();
                q.try_reserve(1).is_ok() && {
                    q.push((ptr, decref));
                    true
                }
            });
            if queued == Ok(true) {
                return None;
            }
        }
        d.set(n + 1);
        Some(n)
    });
    match outer {
        Ok(None) => {}
        Ok(Some(n)) => {
            decref(ptr);
            if n == 0 {
                while let Some((p, f)) = DEFERRED.try_with(|q| q.borrow_mut().pop()).ok().flatten() {
                    f(p);
                }
            }
            let _ = DROPPING.try_with(|d| d.set(n));
        }
        // The thread's locals are gone (a value freed as the thread ends).
        Err(_) => decref(ptr),
    }
}
