//! The KV pool of a [`CudaModel`](super::CudaModel): per layer, K and V in
//! device memory, one allocation each, `[n_slots][n_ctx]` rows of one
//! position's `kv_dim = n_head_kv · head_dim` values in the pool's cache
//! type ([`CacheLayout`]; the row formats are `kernels/kv_cache.cuh`'s).

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::device::Device;
use super::kernels::{AttnArgs, DevPtr, QkvArgs};
use super::ops;
use crate::backend::{new_states, KvPool, KvState, ModelId};
use crate::error::{Error, Result};
use crate::kv_type::{KvCacheType, KvTypes};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// How one layer's K or V cache stores a position: its type, the bytes of
/// a row (one position's `kv_dim` values: f16 `2 · kv_dim`; q8_0 `kv_dim`
/// codes then `kv_dim / 32` f16 scales, q4_0 `kv_dim / 2` bytes of codes
/// then the scales, both padded to 16 bytes so that rows stay aligned for
/// 16-byte loads), and the block of the Hadamard rotation its rows are
/// stored in ([`KvCacheType::hadamard_block`], 0 for none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheLayout {
    pub ty: KvCacheType,
    pub row: usize,
    pub rot: usize,
}

impl CacheLayout {
    /// The layout of a layer's keys (`keys`) or values of `ty`.
    ///
    /// # Errors
    /// [`Error::UnsupportedKvCache`] for a type the CUDA kernels do not
    /// store (f32 and the TurboQuant types) or whose blocks do not divide
    /// `head_dim`.
    pub fn new(ty: KvCacheType, n_kv: usize, head_dim: usize, keys: bool) -> Result<Self> {
        ty.check_head_dim(head_dim)?;
        let kv_dim = n_kv * head_dim;
        let row = match ty {
            KvCacheType::F16 => 2 * kv_dim,
            KvCacheType::Q8_0 => (kv_dim + kv_dim / 16).next_multiple_of(16),
            KvCacheType::Q4_0 => (kv_dim / 2 + kv_dim / 16).next_multiple_of(16),
            _ => {
                return Err(Error::UnsupportedKvCache {
                    ty,
                    reason: "the CUDA backend stores f16, q8_0 and q4_0 caches".into(),
                })
            }
        };
        Ok(CacheLayout { ty, row, rot: ty.hadamard_block(head_dim, keys).unwrap_or(0) })
    }

    /// The type's code in the kernels (`KV_F16`, `KV_Q8_0`, `KV_Q4_0`).
    pub fn code(&self) -> i32 {
        match self.ty {
            KvCacheType::Q8_0 => 1,
            KvCacheType::Q4_0 => 2,
            _ => 0,
        }
    }

    /// `args` with the K cache of layout `k` and the V cache of layout `v`
    /// described (types, row bytes, rotations).
    pub fn qkv_args(k: Self, v: Self, args: QkvArgs) -> QkvArgs {
        let (k_row, v_row) = (k.row as i32, v.row as i32);
        let (k_rot, v_rot) = (k.rot as i32, v.rot as i32);
        QkvArgs { kt: k.code(), vt: v.code(), k_row, v_row, k_rot, v_rot, ..args }
    }

    /// `args` with the caches of layouts `k` and `v` described (types, row
    /// bytes, V's rotation).
    pub fn attn_args(k: Self, v: Self, args: AttnArgs) -> AttnArgs {
        let (k_row, v_row) = (k.row as i32, v.row as i32);
        AttnArgs { kt: k.code(), vt: v.code(), k_row, v_row, v_rot: v.rot as i32, ..args }
    }
}

/// The KV pool of a [`CudaModel`](super::CudaModel) (see the module docs).
/// The attention split count is fixed by `n_ctx` when the pool is created.
pub struct CudaKvPool {
    /// Identity of this pool (a captured graph is bound to its buffers).
    pub(super) id: usize,
    dev: Arc<Device>,
    states: Vec<KvState>,
    n_ctx: usize,
    pub(super) n_split: usize,
    types: KvTypes,
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
    /// The K and V layouts of each layer.
    layouts: Vec<(CacheLayout, CacheLayout)>,
}

impl CudaKvPool {
    /// An empty pool of `n_slots` sequences of `n_ctx` positions, per
    /// layer `(n_head_kv, head_dim)` of `heads`, stored as `types` say.
    ///
    /// # Errors
    /// `n_slots` or `n_ctx` of 0, [`Error::UnsupportedKvCache`], sizes past
    /// the kernels' 32-bit positions or row offsets, device allocation
    /// failures.
    pub(super) fn new(
        dev: &Arc<Device>,
        model: ModelId,
        heads: &[(usize, usize)],
        n_slots: usize,
        n_ctx: usize,
        types: KvTypes,
    ) -> Result<Self> {
        let layouts = heads
            .iter()
            .map(|&(n_kv, hd)| {
                Ok((CacheLayout::new(types.k, n_kv, hd, true)?, CacheLayout::new(types.v, n_kv, hd, false)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let max_row = layouts.iter().map(|(k, v)| k.row.max(v.row)).max().unwrap_or(0);
        let states = new_states(model, n_slots, n_ctx, max_row)?;
        if n_ctx > i32::MAX as usize / 2 || max_row > i32::MAX as usize {
            return Err(Error::UnsupportedModel(format!("a KV cache of {n_ctx} positions exceeds the kernels' range")));
        }
        let size = |row: usize| {
            n_slots.checked_mul(n_ctx).and_then(|p| p.checked_mul(row)).ok_or(Error::Overflow("KV pool size"))
        };
        let (mut k, mut v) = (Vec::with_capacity(layouts.len()), Vec::with_capacity(layouts.len()));
        for (kl, vl) in &layouts {
            k.push(dev.zeros::<u8>(size(kl.row)?)?);
            v.push(dev.zeros::<u8>(size(vl.row)?)?);
        }
        dev.sync()?;
        Ok(CudaKvPool {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dev: dev.clone(),
            states,
            n_ctx,
            n_split: ops::attn_splits(n_ctx),
            types,
            k,
            v,
            layouts,
        })
    }

    /// The K and V layouts of layer `li`.
    pub(super) fn layouts(&self, li: usize) -> (CacheLayout, CacheLayout) {
        self.layouts[li]
    }

    /// Bytes of one slot of layer `li`'s K and V caches.
    pub(super) fn slot_strides(&self, li: usize) -> (usize, usize) {
        let (k, v) = self.layouts[li];
        (self.n_ctx * k.row, self.n_ctx * v.row)
    }

    /// Device addresses of slot `slot`'s K and V caches in layer `li`.
    pub(super) fn slot_ptrs(&self, li: usize, slot: usize) -> (DevPtr, DevPtr) {
        let (ks, vs) = self.slot_strides(li);
        (self.dev.ptr(&self.k[li]) + (slot * ks) as u64, self.dev.ptr(&self.v[li]) + (slot * vs) as u64)
    }
}

impl KvPool for CudaKvPool {
    fn states(&self) -> &[KvState] {
        &self.states
    }
    fn states_mut(&mut self) -> &mut [KvState] {
        &mut self.states
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn types(&self) -> KvTypes {
        self.types
    }
    /// The bytes of a position in every layer, row padding included.
    fn bytes_per_token(&self) -> u64 {
        self.layouts.iter().map(|(k, v)| (k.row + v.row) as u64).sum()
    }
    fn copy_positions(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        for li in 0..self.k.len() {
            let ((kf, vf), (kt, vt)) = (self.slot_ptrs(li, from), self.slot_ptrs(li, to));
            let (kl, vl) = self.layouts[li];
            // SAFETY: slots `from != to` are disjoint regions of the
            // layer's allocation, and `n` is at most `n_ctx` (checked by
            // `copy_prefix`).
            unsafe {
                self.dev.enqueue_copy(kt, kf, n * kl.row)?;
                self.dev.enqueue_copy(vt, vf, n * vl.row)?;
            }
        }
        self.dev.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_aligned_and_hold_every_code_and_scale() {
        // (n_kv, head_dim): SmolLM2, llama 1B, Gemma 3 4B, Phi-3, a tiny one.
        for (n_kv, hd) in [(3, 64), (8, 64), (4, 256), (32, 96), (1, 32)] {
            let kv_dim = n_kv * hd;
            for (ty, min) in [
                (KvCacheType::F16, 2 * kv_dim),
                (KvCacheType::Q8_0, kv_dim + kv_dim / 16),
                (KvCacheType::Q4_0, kv_dim / 2 + kv_dim / 16),
            ] {
                let l = CacheLayout::new(ty, n_kv, hd, true).unwrap();
                assert!(l.row >= min && l.row < min + 16 && l.row.is_multiple_of(16), "{ty} {n_kv}x{hd}: {}", l.row);
            }
        }
        let keys = CacheLayout::new(KvCacheType::Q4_0, 4, 256, true).unwrap();
        let values = CacheLayout::new(KvCacheType::Q4_0, 4, 256, false).unwrap();
        assert_eq!((keys.rot, values.rot), (256, 64));
        assert_eq!(CacheLayout::new(KvCacheType::Q8_0, 32, 96, true).unwrap().rot, 0);
        assert_eq!(CacheLayout::new(KvCacheType::F16, 8, 64, true).unwrap().rot, 0);
        for ty in [KvCacheType::F32, KvCacheType::Tq3, KvCacheType::Tq4] {
            assert!(matches!(CacheLayout::new(ty, 8, 64, true), Err(Error::UnsupportedKvCache { .. })));
        }
        assert!(matches!(CacheLayout::new(KvCacheType::Q8_0, 2, 48, false), Err(Error::UnsupportedKvCache { .. })));
    }
}
