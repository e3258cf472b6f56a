//! The KV pool of a [`WgpuModel`](super::WgpuModel): per layer, K and V in
//! one storage buffer each, `[n_slots][n_ctx]` rows of one position's
//! `kv_dim = n_head_kv · head_dim` values in the pool's K and V types,
//! chosen separately ([`KvLayout`] sizes a row; the row formats are those
//! of `shaders/kv/<type>.wgsl`):
//!
//! | type | row (32-bit words) |
//! | --- | --- |
//! | f32 | `kv_dim` values |
//! | f16 | `kv_dim / 2` words of two values (the even one in the low half) |
//! | q8_0 | `kv_dim / 4` words of four int8 codes, then per head `⌈head_dim / 64⌉` words of two f16 scales |
//! | q4_0 | `kv_dim / 8` words (16 bytes per block of 32 values in ggml's nibble order), then the scales as q8_0's |
//!
//! A position's row sits at word `(slot · n_ctx + pos) · row_words`.
//! The codes and scales are bit for bit those of ggml's
//! `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref` (the CPU's blocks;
//! CUDA's row order, codes then scales), except that each head's scales
//! start a word of their own (two bytes of padding per head where
//! `head_dim / 32` is odd), since a word is the smallest store of WGSL and
//! two heads are written by two workgroups. Rows of q8_0 and q4_0 are
//! stored rotated by `H/√n` on blocks of `n =`
//! [`KvCacheType::hadamard_block`] values, as on the CPU and CUDA
//! (`shaders/kv/rotation.wgsl`). tq3 and tq4 have no kernels here:
//! [`Error::UnsupportedKvCache`].

use std::any::Any;
use std::sync::Arc;

use super::context::Gpu;
use super::weights::binding_limit;
use crate::backend::{new_states, KvPool, KvState, ModelId};
use crate::error::{Error, Result};
use crate::{KvCacheType, KvTypes};

/// How one layer's K or V cache stores a position (see the module docs):
/// its type, the 32-bit words of a row, and the block of the Hadamard
/// rotation its rows are stored in (0 for none) with that rotation's scale
/// `1/√rot` (computed as the CPU computes it, in f32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct KvLayout {
    pub ty: KvCacheType,
    pub row_words: usize,
    pub rot: usize,
    pub rot_scale: f32,
}

impl KvLayout {
    /// The layout of a layer's keys (`keys`) or values of `ty`, for
    /// `n_kv` heads of `head_dim` values (even, as the model checks).
    ///
    /// # Errors
    /// [`Error::UnsupportedKvCache`] for tq3 and tq4, or for a `head_dim`
    /// that is not a whole number of the type's blocks.
    pub fn new(ty: KvCacheType, n_kv: usize, head_dim: usize, keys: bool) -> Result<Self> {
        if ty.turboquant_bits().is_some() {
            return Err(Error::UnsupportedKvCache {
                ty,
                reason: "the wgpu backend stores f32, f16, q8_0 and q4_0 caches (TurboQuant's tq3 and tq4 have no \
                         wgpu kernels)"
                    .into(),
            });
        }
        ty.check_head_dim(head_dim)?;
        let kv_dim = n_kv * head_dim;
        let scales = n_kv * head_dim.div_ceil(64);
        let row_words = match ty {
            KvCacheType::F32 => kv_dim,
            KvCacheType::F16 => kv_dim / 2,
            KvCacheType::Q8_0 => kv_dim / 4 + scales,
            _ => kv_dim / 8 + scales,
        };
        let rot = ty.hadamard_block(head_dim, keys).unwrap_or(0);
        let rot_scale = if rot > 0 { 1.0 / (rot as f32).sqrt() } else { 0.0 };
        Ok(KvLayout { ty, row_words, rot, rot_scale })
    }

    /// Bytes of a row.
    pub fn row_bytes(&self) -> usize {
        4 * self.row_words
    }
}

/// The KV pool of a [`WgpuModel`](super::WgpuModel) (see the module docs).
pub struct WgpuKvPool {
    gpu: Arc<Gpu>,
    pub(super) states: Vec<KvState>,
    pub(super) n_ctx: usize,
    types: KvTypes,
    pub(super) k: Vec<wgpu::Buffer>,
    pub(super) v: Vec<wgpu::Buffer>,
    /// The K and V layouts of each layer.
    pub(super) layouts: Vec<(KvLayout, KvLayout)>,
}

impl WgpuKvPool {
    /// An empty pool of `n_slots` sequences of `n_ctx` positions for model
    /// `model`, whose layers have `(n_head_kv, head_dim)` of `heads`,
    /// stored as `types` say.
    ///
    /// # Errors
    /// `n_slots` or `n_ctx` of 0; [`Error::UnsupportedKvCache`] (as
    /// [`KvLayout::new`]); [`Error::Overflow`]; [`Error::UnsupportedModel`]
    /// naming `max_storage_buffer_binding_size` when one layer's K or V
    /// does not fit one binding; out of memory.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        model: ModelId,
        heads: &[(usize, usize)],
        n_slots: usize,
        n_ctx: usize,
        types: KvTypes,
    ) -> Result<Self> {
        let layouts = heads
            .iter()
            .map(|&(n_kv, hd)| Ok((KvLayout::new(types.k, n_kv, hd, true)?, KvLayout::new(types.v, n_kv, hd, false)?)))
            .collect::<Result<Vec<_>>>()?;
        let max_row = layouts.iter().map(|(k, v)| k.row_words.max(v.row_words)).max().unwrap_or(0);
        let states = new_states(model, n_slots, n_ctx, max_row)?;
        let size = |l: &KvLayout| {
            n_slots
                .checked_mul(n_ctx)
                .and_then(|p| p.checked_mul(l.row_bytes()))
                .ok_or(Error::Overflow("KV cache size"))
                .map(|b| b as u64)
        };
        let limit = binding_limit(gpu);
        for l in layouts.iter().flat_map(|(k, v)| [k, v]) {
            let bytes = size(l)?;
            if bytes > limit {
                return Err(Error::UnsupportedModel(format!(
                    "a KV cache layer of {n_slots} x {n_ctx} positions ({bytes} bytes) exceeds the adapter's \
                     max_storage_buffer_binding_size of {} bytes",
                    gpu.caps.max_storage_binding
                )));
            }
        }
        let (mut k, mut v) = (Vec::with_capacity(layouts.len()), Vec::with_capacity(layouts.len()));
        for (kl, vl) in &layouts {
            k.push(gpu.storage("K cache", size(kl)?)?);
            v.push(gpu.storage("V cache", size(vl)?)?);
        }
        Ok(WgpuKvPool { gpu: gpu.clone(), states, n_ctx, types, k, v, layouts })
    }
}

impl KvPool for WgpuKvPool {
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
    /// The bytes of a position in every layer, the scales' padding
    /// included.
    fn bytes_per_token(&self) -> u64 {
        self.layouts.iter().map(|(k, v)| (k.row_bytes() + v.row_bytes()) as u64).sum()
    }
    /// Through a temporary buffer (wgpu copies between two buffers, never
    /// within one), all layers in one submit.
    fn copy_positions(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        let g = &*self.gpu;
        let max = self.layouts.iter().map(|(k, v)| k.row_bytes().max(v.row_bytes())).max().unwrap_or(0);
        if n == 0 || max == 0 {
            return Ok(());
        }
        let tmp = g.storage("KV copy", n as u64 * max as u64)?;
        g.scoped("copying KV positions", || {
            let mut enc = g.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv copy") });
            for (li, (kl, vl)) in self.layouts.iter().enumerate() {
                for (buf, l) in [(&self.k[li], kl), (&self.v[li], vl)] {
                    // Rows are whole words, as copies need.
                    let d = l.row_bytes() as u64;
                    let bytes = n as u64 * d;
                    let (src, dst) = (from as u64 * self.n_ctx as u64 * d, to as u64 * self.n_ctx as u64 * d);
                    enc.copy_buffer_to_buffer(buf, src, &tmp, 0, bytes);
                    enc.copy_buffer_to_buffer(&tmp, 0, buf, dst, bytes);
                }
            }
            g.queue.submit([enc.finish()]);
            g.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Device(format!("waiting for the KV copy: {e}")))?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_hold_every_code_and_scale_and_rotations_are_the_cpus() {
        // (n_kv, head_dim): SmolLM2, Gemma 3 4B, Phi-3, a tiny one.
        for (n_kv, hd) in [(3usize, 64usize), (4, 256), (32, 96), (1, 32)] {
            let kv_dim = n_kv * hd;
            let pad = n_kv * hd.div_ceil(64) * 4 - n_kv * hd / 16;
            for (ty, bytes) in [
                (KvCacheType::F32, 4 * kv_dim),
                (KvCacheType::F16, 2 * kv_dim),
                (KvCacheType::Q8_0, kv_dim + kv_dim / 16 + pad),
                (KvCacheType::Q4_0, kv_dim / 2 + kv_dim / 16 + pad),
            ] {
                let l = KvLayout::new(ty, n_kv, hd, true).unwrap();
                assert_eq!(l.row_bytes(), bytes, "{ty} {n_kv}x{hd}");
                assert!(
                    ty.row_bytes(n_kv, hd).unwrap() <= bytes && bytes <= ty.row_bytes(n_kv, hd).unwrap() + 2 * n_kv
                );
            }
        }
        let keys = KvLayout::new(KvCacheType::Q4_0, 4, 256, true).unwrap();
        let values = KvLayout::new(KvCacheType::Q4_0, 4, 256, false).unwrap();
        assert_eq!((keys.rot, values.rot), (256, 64));
        assert_eq!(keys.rot_scale, 1.0 / 16.0);
        assert_eq!(KvLayout::new(KvCacheType::Q8_0, 2, 128, true).unwrap().rot_scale, 1.0 / 128f32.sqrt());
        assert_eq!(KvLayout::new(KvCacheType::Q8_0, 32, 96, true).unwrap().rot, 0);
        assert_eq!(KvLayout::new(KvCacheType::F16, 8, 64, true).unwrap().rot, 0);
        for ty in [KvCacheType::Tq3, KvCacheType::Tq4] {
            assert!(matches!(KvLayout::new(ty, 8, 64, true), Err(Error::UnsupportedKvCache { ty: t, .. }) if t == ty));
        }
        assert!(matches!(
            KvLayout::new(KvCacheType::Q8_0, 2, 48, false),
            Err(Error::UnsupportedKvCache { ty: KvCacheType::Q8_0, .. })
        ));
    }
}
