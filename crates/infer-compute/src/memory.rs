//! Fallible allocation of large buffers.
//!
//! Weights dequantized to f32, repacked weights, KV caches and scratch
//! buffers are sized by the model; a model that does not fit must end in
//! [`Error::OutOfMemory`] saying how much was needed, not in the
//! allocator's abort. These helpers ask the allocator with
//! `try_reserve`/`alloc_zeroed` and turn a refusal into that error.

use crate::error::{Error, Result};

/// An [`Error::OutOfMemory`] for `n` elements of `T`.
fn oom<T>(what: &str, n: usize) -> Error {
    Error::OutOfMemory { what: what.to_owned(), bytes: (n as u128 * std::mem::size_of::<T>() as u128) as u64 }
}

/// `len` zeroed elements. Zeroed pages come from the allocator lazily, as
/// with `vec![0; len]`, so untouched parts of a large buffer cost no memory.
///
/// # Errors
/// [`Error::OutOfMemory`] naming `what` and the bytes needed when the
/// allocator refuses or the size overflows.
pub(crate) fn zeroed<T: bytemuck::Zeroable>(len: usize, what: &str) -> Result<Vec<T>> {
    if len == 0 || std::mem::size_of::<T>() == 0 {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| oom::<T>(what, len))?;
        v.resize_with(len, T::zeroed);
        return Ok(v);
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| oom::<T>(what, len))?;
    // SAFETY: the layout has a non-zero size (checked above).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return Err(oom::<T>(what, len));
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of
    // `len` elements of `T` (so capacity `len`), and all-zero bytes are a
    // valid `T` (`Zeroable`).
    Ok(unsafe { Vec::from_raw_parts(p, len, len) })
}

/// The host's physical memory in bytes (`sysconf(_SC_PHYS_PAGES)` times
/// the page size), or `None` where the OS does not say.
pub(crate) fn physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions; it returns -1 for a name
        // it does not know.
        let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        if pages > 0 && size > 0 {
            return Some((pages as u64).saturating_mul(size as u64));
        }
    }
    None
}

/// Resizes `v` to `n` elements (new ones are `fill`), reserving fallibly.
/// Filling writes every new element, so a growth past the host's physical
/// memory is refused before it starts: where the OS overcommits, the
/// reservation would succeed and the writes would swap or be killed.
///
/// # Errors
/// [`Error::OutOfMemory`] naming `what` when the memory cannot be reserved
/// or exceeds the physical memory; `v` is then unchanged.
pub(crate) fn resize<T: Clone>(v: &mut Vec<T>, n: usize, fill: T, what: &str) -> Result<()> {
    if n > v.len() {
        let grow = (n - v.len()) as u128 * std::mem::size_of::<T>() as u128;
        // Below 1 GiB no host is that small: no system call on the hot path.
        if grow > 1 << 30 && physical_memory().is_some_and(|ram| grow > ram as u128) {
            return Err(oom::<T>(what, n));
        }
        v.try_reserve(n - v.len()).map_err(|_| oom::<T>(what, n))?;
    }
    v.resize(n, fill);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors() {
        match zeroed::<f32>(usize::MAX / 2, "a test buffer") {
            Err(Error::OutOfMemory { what, bytes }) => {
                assert_eq!(what, "a test buffer");
                assert!(bytes > 1 << 60);
            }
            other => panic!("{:?}", other.map(|v| v.len())),
        }
        assert!(zeroed::<u64>(1 << 61, "x").is_err());
        let mut v = vec![1u8; 3];
        assert!(resize(&mut v, usize::MAX, 0, "x").is_err());
        assert_eq!(v, [1, 1, 1]);
        resize(&mut v, 5, 2, "x").unwrap();
        assert_eq!(v, [1, 1, 1, 2, 2]);
        // Past the physical memory: refused before any write, even where
        // the OS would reserve it (overcommit).
        if let Some(ram) = physical_memory() {
            assert!(matches!(resize(&mut v, ram as usize + 6, 0, "x"), Err(Error::OutOfMemory { .. })));
            assert_eq!(v.len(), 5);
        }
        assert_eq!(zeroed::<f32>(4, "x").unwrap(), [0.0; 4]);
        assert!(zeroed::<f32>(0, "x").unwrap().is_empty());
    }
}
