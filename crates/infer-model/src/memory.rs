//! Fallible allocation of buffers whose size a model file gives (its
//! vocabulary, merges, metadata arrays): a file that does not fit in the
//! memory available ends in [`infer_compute::Error::OutOfMemory`] naming
//! what did not fit and its size, not in the allocator's abort.

use crate::{Error, Result};

/// An [`infer_compute::Error::OutOfMemory`] (as [`Error::Compute`]).
pub(crate) fn out_of_memory(what: impl Into<String>, bytes: u64) -> Error {
    Error::Compute(infer_compute::Error::OutOfMemory { what: what.into(), bytes })
}

/// Bytes of `n` elements of `T` (saturating).
fn bytes_of<T>(n: usize) -> u64 {
    (n as u128 * std::mem::size_of::<T>() as u128).min(u64::MAX as u128) as u64
}

/// An empty vector with room for exactly `n` elements.
///
/// # Errors
/// Out of memory naming `what` when the allocator refuses.
pub(crate) fn vec_with_capacity<T>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| out_of_memory(what(), bytes_of::<T>(n)))?;
    Ok(v)
}

/// `n` copies of `value`.
///
/// # Errors
/// As [`vec_with_capacity`].
pub(crate) fn vec_filled<T: Clone>(n: usize, value: T, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = vec_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// Room for `additional` more elements in `v` (amortized growth).
///
/// # Errors
/// Out of memory naming `what` when the allocator refuses; `v` is then
/// unchanged.
pub(crate) fn reserve<T>(v: &mut Vec<T>, additional: usize, what: impl FnOnce() -> String) -> Result<()> {
    v.try_reserve(additional).map_err(|_| out_of_memory(what(), bytes_of::<T>(v.len().saturating_add(additional))))
}

/// An empty string with room for exactly `n` bytes.
///
/// # Errors
/// As [`vec_with_capacity`].
pub(crate) fn string_with_capacity(n: usize, what: impl FnOnce() -> String) -> Result<String> {
    let mut s = String::new();
    s.try_reserve_exact(n).map_err(|_| out_of_memory(what(), n as u64))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors_naming_what_and_bytes() {
        let oom = |r: Result<()>| match r {
            Err(Error::Compute(infer_compute::Error::OutOfMemory { what, bytes })) => (what, bytes),
            other => panic!("{other:?}"),
        };
        let (what, bytes) = oom(vec_with_capacity::<u64>(usize::MAX / 16, || "a table".into()).map(drop));
        assert_eq!(what, "a table");
        assert_eq!(bytes, (usize::MAX / 16) as u64 * 8);
        assert!(vec_filled(usize::MAX / 2, 0u32, String::new).is_err());
        assert!(string_with_capacity(usize::MAX, String::new).is_err());
        let mut v = vec![1u8, 2];
        let (_, bytes) = oom(reserve(&mut v, usize::MAX, || "more".into()));
        assert_eq!(bytes, u64::MAX);
        assert_eq!(v, [1, 2]);
        assert_eq!(vec_filled(3, 7u16, String::new).unwrap(), [7, 7, 7]);
        assert_eq!(string_with_capacity(5, String::new).unwrap().capacity(), 5);
    }
}
