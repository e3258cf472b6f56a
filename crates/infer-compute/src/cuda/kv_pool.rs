//! The KV pool of a [`CudaModel`](super::CudaModel): per layer, K and V in
//! device memory, one allocation each, `[n_slots][n_ctx]` rows of one
//! position's `kv_dim = n_head_kv · head_dim` values in the pool's cache
//! type ([`CacheLayout`]; the row formats are `kernels/kv_cache.cuh`'s).

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::device::Device;
use super::kernels::{names, AttnArgs, DevPtr, QkvArgs, TqCopyArgs};
use super::ops;
use crate::backend::{new_states, KvPool, KvState, ModelId};
use crate::error::{Error, Result};
use crate::kv_type::{KvCacheType, KvTypes};
use crate::turboquant::{ChannelScale, TqLayout};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// How one layer's K or V cache stores a position: its type, the bytes of
/// a row (one position's `kv_dim` values: f16 `2 · kv_dim`; q8_0 `kv_dim`
/// codes then `kv_dim / 32` f16 scales, q4_0 `kv_dim / 2` bytes of codes
/// then the scales, both padded to 16 bytes so that rows stay aligned for
/// 16-byte loads; tq3 and tq4 the bytes of one position's codes), and the
/// block of the Hadamard rotation its rows are stored in
/// ([`KvCacheType::hadamard_block`]; TurboQuant's whole head, after its
/// factors; 0 for none). A TurboQuant cache is one buffer per layer laid
/// out as its [`TqLayout`] says (header, codes, exact rows, centres, ring),
/// the same as the wgpu backend's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheLayout {
    pub ty: KvCacheType,
    pub row: usize,
    pub rot: usize,
    pub tq: Option<TqLayout>,
}

/// Largest head dimension of a TurboQuant cache here: `attn_split_tq`
/// reads a position's values with `head_dim / 8` lanes of one warp.
const TQ_MAX_HEAD_DIM: usize = 256;

impl CacheLayout {
    /// The layout of a layer's keys (`keys`) or values of `ty` in a pool of
    /// `n_slots` slots of `n_ctx` positions.
    ///
    /// # Errors
    /// [`Error::UnsupportedKvCache`] for f32 (the CUDA kernels do not store
    /// it), a `head_dim` the type's blocks do not divide, and TurboQuant
    /// heads outside 32 ..= 256 values; [`Error::Overflow`].
    pub fn new(
        ty: KvCacheType,
        n_kv: usize,
        head_dim: usize,
        keys: bool,
        n_slots: usize,
        n_ctx: usize,
    ) -> Result<Self> {
        ty.check_head_dim(head_dim)?;
        let kv_dim = n_kv * head_dim;
        let unsupported = |reason: String| Err(Error::UnsupportedKvCache { ty, reason });
        let (row, tq) = match ty {
            KvCacheType::F16 => (2 * kv_dim, None),
            KvCacheType::Q8_0 => ((kv_dim + kv_dim / 16).next_multiple_of(16), None),
            KvCacheType::Q4_0 => ((kv_dim / 2 + kv_dim / 16).next_multiple_of(16), None),
            KvCacheType::Tq3 | KvCacheType::Tq4 => {
                if !(32..=TQ_MAX_HEAD_DIM).contains(&head_dim) {
                    return unsupported(format!(
                        "the CUDA backend's TurboQuant caches take heads of 32 to {TQ_MAX_HEAD_DIM} values, not {head_dim}"
                    ));
                }
                let bits = ty.turboquant_bits().unwrap_or(4);
                let t = TqLayout::new(bits, n_kv, head_dim, n_slots, n_ctx)?;
                (4 * t.row_words, Some(t))
            }
            KvCacheType::F32 => {
                return unsupported("the CUDA backend stores f16, q8_0, q4_0, tq3 and tq4 caches".into())
            }
        };
        let rot = if tq.is_some() { head_dim } else { ty.hadamard_block(head_dim, keys).unwrap_or(0) };
        Ok(CacheLayout { ty, row, rot, tq })
    }

    /// The type's code in the kernels (`KV_F16`, `KV_Q8_0`, `KV_Q4_0`,
    /// `KV_TQ3`, `KV_TQ4`).
    pub fn code(&self) -> i32 {
        match self.ty {
            KvCacheType::Q8_0 => 1,
            KvCacheType::Q4_0 => 2,
            KvCacheType::Tq3 => 3,
            KvCacheType::Tq4 => 4,
            _ => 0,
        }
    }

    /// Bytes of the layer's buffer in a pool of `n_slots` slots of `n_ctx`
    /// positions.
    fn buffer_bytes(&self, n_slots: usize, n_ctx: usize) -> Result<usize> {
        let bytes = match &self.tq {
            Some(t) => t.words.checked_mul(4),
            None => n_slots.checked_mul(n_ctx).and_then(|p| p.checked_mul(self.row)),
        };
        bytes.ok_or(Error::Overflow("KV pool size"))
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
    /// layer `(n_head_kv, head_dim, [key scale, value scale])` of `heads`
    /// (the TurboQuant keys' and values' [`ChannelScale`]s, where the layer
    /// has them), stored as `types` say.
    ///
    /// # Errors
    /// `n_slots` or `n_ctx` of 0, [`Error::UnsupportedKvCache`], sizes past
    /// the kernels' 32-bit positions or row offsets, device allocation
    /// failures.
    pub(super) fn new(
        dev: &Arc<Device>,
        model: ModelId,
        heads: &[(usize, usize, [Option<&ChannelScale>; 2])],
        n_slots: usize,
        n_ctx: usize,
        types: KvTypes,
    ) -> Result<Self> {
        let layouts = heads
            .iter()
            .map(|&(n_kv, hd, _)| {
                Ok((
                    CacheLayout::new(types.k, n_kv, hd, true, n_slots, n_ctx)?,
                    CacheLayout::new(types.v, n_kv, hd, false, n_slots, n_ctx)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let max_row = layouts.iter().map(|(k, v)| k.row.max(v.row)).max().unwrap_or(0);
        let states = new_states(model, n_slots, n_ctx, max_row)?;
        if n_ctx > i32::MAX as usize / 2 || max_row > i32::MAX as usize {
            return Err(Error::UnsupportedModel(format!("a KV cache of {n_ctx} positions exceeds the kernels' range")));
        }
        let (mut k, mut v) = (Vec::with_capacity(layouts.len()), Vec::with_capacity(layouts.len()));
        for ((kl, vl), &(_, _, [ks, vs])) in layouts.iter().zip(heads) {
            for (l, out, scale) in [(kl, &mut k, ks), (vl, &mut v, vs)] {
                // The header first: it checks the offsets fit the kernels'
                // 32-bit words before anything is allocated.
                let header = l.tq.map(|t| t.header(scale)).transpose()?;
                let buf = dev.zeros::<u8>(l.buffer_bytes(n_slots, n_ctx)?)?;
                if let Some(header) = header {
                    let header = dev.upload(&header)?;
                    // SAFETY: the header's words are the first words of the
                    // layout, inside `buf`; two separate allocations.
                    unsafe { dev.enqueue_copy(dev.ptr(&buf), dev.ptr(&header), 4 * (header.len()))? };
                    dev.sync()?;
                }
                out.push(buf);
            }
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

    /// Whether a layer's K or V cache is TurboQuant: its spans of any
    /// length attend with the split-K kernels (`qkv_attention_tq`), so the
    /// partial sums need room for a whole pass.
    pub(super) fn has_tq(&self) -> bool {
        self.layouts.iter().any(|(k, v)| k.tq.is_some() || v.tq.is_some())
    }

    /// The K and V layouts of layer `li`.
    pub(super) fn layouts(&self, li: usize) -> (CacheLayout, CacheLayout) {
        self.layouts[li]
    }

    /// Bytes of one slot of layer `li`'s K and V caches (0 for a
    /// TurboQuant cache, whose slots are not one region each).
    pub(super) fn slot_strides(&self, li: usize) -> (usize, usize) {
        let (k, v) = self.layouts[li];
        let stride = |l: CacheLayout| if l.tq.is_some() { 0 } else { self.n_ctx * l.row };
        (stride(k), stride(v))
    }

    /// Device addresses of slot `slot`'s K and V caches in layer `li` (of
    /// a TurboQuant cache, its buffer's: the kernels take the slot apart).
    pub(super) fn slot_ptrs(&self, li: usize, slot: usize) -> (DevPtr, DevPtr) {
        let (ks, vs) = self.slot_strides(li);
        (self.dev.ptr(&self.k[li]) + (slot * ks) as u64, self.dev.ptr(&self.v[li]) + (slot * vs) as u64)
    }

    /// Enqueues the copy of the first `n` positions of slot `from` onto
    /// slot `to` (`from != to`) in one layer's cache `buf` of layout `l`.
    fn copy_cache(&self, buf: &CudaSlice<u8>, l: CacheLayout, from: usize, to: usize, n: usize) -> Result<()> {
        let base = self.dev.ptr(buf);
        let Some(t) = l.tq else {
            let stride = (self.n_ctx * l.row) as u64;
            // SAFETY: slots `from != to` are disjoint regions of the
            // layer's allocation, and `n` is at most `n_ctx` (checked by
            // `copy_prefix`).
            return unsafe { self.dev.enqueue_copy(base + to as u64 * stride, base + from as u64 * stride, n * l.row) };
        };
        for (src, dst, words) in t.copy_regions(from, to, n) {
            // SAFETY: the regions of two different slots in one area of the
            // layout, inside `buf` (`TqLayout::copy_regions`).
            unsafe { self.dev.enqueue_copy(base + 4 * dst as u64, base + 4 * src as u64, 4 * words)? };
        }
        let i32_of = |v: usize| i32::try_from(v).map_err(|_| Error::Overflow("a TurboQuant ring copy"));
        let args = TqCopyArgs { c: base, src: i32_of(from)?, dst: i32_of(to)?, n: i32_of(n)?, pad_: 0 };
        let window = u32::try_from(t.window).map_err(|_| Error::Overflow("a TurboQuant ring"))?;
        self.dev.launch(names::TQ_RING_COPY, (window, 1, 1), 128, 0, &args)
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
            let (kl, vl) = self.layouts[li];
            self.copy_cache(&self.k[li], kl, from, to, n)?;
            self.copy_cache(&self.v[li], vl, from, to, n)?;
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
                let l = CacheLayout::new(ty, n_kv, hd, true, 2, 64).unwrap();
                assert!(l.row >= min && l.row < min + 16 && l.row.is_multiple_of(16), "{ty} {n_kv}x{hd}: {}", l.row);
            }
        }
        let new = |ty, n_kv, hd, keys| CacheLayout::new(ty, n_kv, hd, keys, 2, 64);
        let keys = new(KvCacheType::Q4_0, 4, 256, true).unwrap();
        let values = new(KvCacheType::Q4_0, 4, 256, false).unwrap();
        assert_eq!((keys.rot, values.rot), (256, 64));
        assert_eq!(new(KvCacheType::Q8_0, 32, 96, true).unwrap().rot, 0);
        assert_eq!(new(KvCacheType::F16, 8, 64, true).unwrap().rot, 0);
        // TurboQuant: a row is one position's codes (8 heads of 4 words:
        // the scale's and 64 · 3 bits), rotated over the whole head.
        let tq = new(KvCacheType::Tq3, 8, 64, true).unwrap();
        assert_eq!((tq.row, tq.rot, tq.tq.map(|t| t.row_words)), (8 * 4 * 7, 64, Some(8 * 7)));
        assert_eq!(new(KvCacheType::Tq4, 8, 64, false).unwrap().row, 8 * 4 * 9);
        for (ty, hd) in
            [(KvCacheType::F32, 64), (KvCacheType::Tq3, 16), (KvCacheType::Tq4, 512), (KvCacheType::Tq4, 96)]
        {
            assert!(matches!(new(ty, 8, hd, true), Err(Error::UnsupportedKvCache { .. })), "{ty} {hd}");
        }
        assert!(matches!(new(KvCacheType::Q8_0, 2, 48, false), Err(Error::UnsupportedKvCache { .. })));
    }
}
