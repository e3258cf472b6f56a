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
//! | tq3, tq4 | per head, a word holding its f16 scale `‖y‖ / ‖c[idx]‖` (low half), then its `head_dim` indices of 3 or 4 bits as one little-endian bit stream, `⌈3 · head_dim / 32⌉` or `head_dim / 8` words |
//!
//! A position's row sits at word `(slot · n_ctx + pos) · row_words` (for
//! tq3 and tq4, of the codes' area).
//! The codes and scales are bit for bit those of ggml's
//! `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref` (the CPU's blocks;
//! CUDA's row order, codes then scales), except that each head's scales
//! start a word of their own (two bytes of padding per head where
//! `head_dim / 32` is odd), since a word is the smallest store of WGSL and
//! two heads are written by two workgroups. Rows of q8_0 and q4_0 are
//! stored rotated by `H/√n` on blocks of `n =`
//! [`KvCacheType::hadamard_block`] values, as on the CPU and CUDA
//! (`shaders/kv/rotation.wgsl`).
//!
//! A tq3 or tq4 layer's buffer holds, in this order (word offsets in its
//! header; [`TqLayout`]):
//!
//! | area | words | what |
//! | --- | --- | --- |
//! | header | `48 + 2 · head_dim` | the areas' offsets and sizes, the codebook's centroids and boundaries, the rotation's random signs times the keys' channel scale (and over it, for the queries) |
//! | codes | `[n_slots][n_ctx]` rows as above | each position's code per head; not written below `TQ_EXACT_POSITIONS` |
//! | exact | `[n_slots][n_exact][kv_dim / 2]` | each slot's first `n_exact = min(TQ_EXACT_POSITIONS, n_ctx)` rows in f16 |
//! | centre | `[n_slots][kv_dim]` f32 | the mean of the exact rows from `TQ_CENTRE_FROM` on, set when row `n_exact − 1` is written: later rows are coded less it |
//! | ring | `[n_slots][window][kv_dim / 2]` | the last `window = min(TQ_WINDOW, n_ctx)` rows in f16, position `p` at entry `p % window`, which a query reads within that window of it |
//! | tags | `[n_slots][window]` | the position each ring entry holds, plus one (0: none) |
//!
//! Rows are stored in the TurboQuant coder's basis (random signs, then
//! `H/√head_dim`), as on the CPU.

use std::any::Any;
use std::sync::Arc;

use super::context::Gpu;
use super::shaders::{Kernel, Variant};
use super::step::{Step, P};
use super::weights::binding_limit;
use crate::backend::{new_states, KvPool, KvState, ModelId};
use crate::error::{Error, Result};
use crate::turboquant::ChannelScale;
use crate::turboquant::{self, TqLayout};
use crate::{KvCacheType, KvTypes};

/// How one layer's K or V cache stores a position (see the module docs):
/// its type, the 32-bit words of a row, and the block of the Hadamard
/// rotation its rows are stored in (0 for none; TurboQuant's whole head,
/// after its signs) with that rotation's scale `1/√rot` (computed as the
/// CPU computes it, in f32); for tq3 and tq4 in a pool, the buffer's other
/// areas.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct KvLayout {
    pub ty: KvCacheType,
    pub row_words: usize,
    pub rot: usize,
    pub rot_scale: f32,
    pub tq: Option<TqLayout>,
}

impl KvLayout {
    /// The layout of a layer's keys (`keys`) or values of `ty`, for
    /// `n_kv` heads of `head_dim` values (even, as the model checks).
    ///
    /// # Errors
    /// [`Error::UnsupportedKvCache`] for a `head_dim` that is not a whole
    /// number of the type's blocks (TurboQuant: not a power of two of at
    /// least 16).
    pub fn new(ty: KvCacheType, n_kv: usize, head_dim: usize, keys: bool) -> Result<Self> {
        ty.check_head_dim(head_dim)?;
        let kv_dim = n_kv * head_dim;
        let scales = n_kv * head_dim.div_ceil(64);
        let (row_words, rot) = match ty {
            KvCacheType::F32 => (kv_dim, 0),
            KvCacheType::F16 => (kv_dim / 2, 0),
            KvCacheType::Q8_0 => (kv_dim / 4 + scales, 0),
            KvCacheType::Q4_0 => (kv_dim / 8 + scales, 0),
            KvCacheType::Tq3 | KvCacheType::Tq4 => {
                (n_kv * turboquant::head_words(head_dim, ty.turboquant_bits().unwrap_or(4)), head_dim)
            }
        };
        let rot = ty.hadamard_block(head_dim, keys).unwrap_or(rot);
        let rot_scale = if rot > 0 { 1.0 / (rot as f32).sqrt() } else { 0.0 };
        Ok(KvLayout { ty, row_words, rot, rot_scale, tq: None })
    }

    /// This layout in a pool of `n_slots` slots of `n_ctx` positions of
    /// `n_kv` heads of `head_dim` values: for tq3 and tq4, with its
    /// buffer's areas.
    ///
    /// # Errors
    /// [`Error::Overflow`].
    fn in_pool(mut self, n_kv: usize, head_dim: usize, n_slots: usize, n_ctx: usize) -> Result<Self> {
        if let Some(bits) = self.ty.turboquant_bits() {
            self.tq = Some(TqLayout::new(bits, n_kv, head_dim, n_slots, n_ctx)?);
        }
        Ok(self)
    }

    /// Bytes of a row.
    pub fn row_bytes(&self) -> usize {
        4 * self.row_words
    }

    /// Bytes of the layer's buffer in a pool of `n_slots` slots of `n_ctx`
    /// positions.
    ///
    /// # Errors
    /// [`Error::Overflow`].
    fn buffer_bytes(&self, n_slots: usize, n_ctx: usize) -> Result<u64> {
        let words = match &self.tq {
            Some(t) => Some(t.words),
            None => n_slots.checked_mul(n_ctx).and_then(|p| p.checked_mul(self.row_words)),
        };
        words.and_then(|w| w.checked_mul(4)).map(|b| b as u64).ok_or(Error::Overflow("KV cache size"))
    }

    /// Word regions `(from, to, words)` of the buffer that copying the
    /// first `n` positions of slot `from` onto slot `to` copies (a
    /// TurboQuant cache's ring aside: `ring_copy`).
    fn copy_regions(&self, n_ctx: usize, from: usize, to: usize, n: usize) -> Vec<(usize, usize, usize)> {
        match &self.tq {
            Some(t) => t.copy_regions(from, to, n),
            None => vec![(from * n_ctx * self.row_words, to * n_ctx * self.row_words, n * self.row_words)],
        }
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
    /// `model`, whose layers have `(n_head_kv, head_dim)` of `heads` and
    /// per layer the key and value scales of `scales` (for TurboQuant
    /// caches), stored as `types` say.
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
        scales: &[[Option<ChannelScale>; 2]],
        n_slots: usize,
        n_ctx: usize,
        types: KvTypes,
    ) -> Result<Self> {
        let layouts = heads
            .iter()
            .map(|&(n_kv, hd)| {
                let k = KvLayout::new(types.k, n_kv, hd, true)?.in_pool(n_kv, hd, n_slots, n_ctx)?;
                Ok((k, KvLayout::new(types.v, n_kv, hd, false)?.in_pool(n_kv, hd, n_slots, n_ctx)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let max_row = layouts.iter().map(|(k, v)| k.row_words.max(v.row_words)).max().unwrap_or(0);
        let states = new_states(model, n_slots, n_ctx, max_row)?;
        let size = |l: &KvLayout| l.buffer_bytes(n_slots, n_ctx);
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
        for (li, (kl, vl)) in layouts.iter().enumerate() {
            k.push(gpu.storage("K cache", size(kl)?)?);
            v.push(gpu.storage("V cache", size(vl)?)?);
            let [ks, vs] = scales.get(li).map_or([None, None], |[k, v]| [k.as_ref(), v.as_ref()]);
            for (l, buf, scale) in [(kl, &k[li], ks), (vl, &v[li], vs)] {
                if let Some(t) = &l.tq {
                    gpu.queue.write_buffer(buf, 0, bytemuck::cast_slice(&t.header(scale)?));
                }
            }
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
    /// within one), all layers in one submit; a TurboQuant cache's exact
    /// rows and centre too, and its ring's entries of the positions copied
    /// (`tq_cache.wgsl`'s `ring_copy`, as the CPU's `copy_within`).
    fn copy_positions(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        let g = &*self.gpu;
        let caches =
            || self.layouts.iter().enumerate().flat_map(|(li, (kl, vl))| [(&self.k[li], kl), (&self.v[li], vl)]);
        let regions = |l: &KvLayout| l.copy_regions(self.n_ctx, from, to, n);
        let max = caches().flat_map(|(_, l)| regions(l)).map(|r| r.2).max().unwrap_or(0);
        if n == 0 || max == 0 {
            return Ok(());
        }
        let tmp = g.storage("KV copy", 4 * max as u64)?;
        g.scoped("copying KV positions", || {
            let mut st = Step::new(g);
            for (buf, l) in caches() {
                let Some(t) = l.tq.filter(|_| from != to) else { continue };
                let params = [P::U(0), P::U(from as u32), P::U(to as u32), P::U(n.min(u32::MAX as usize) as u32)];
                st.dispatch(Kernel::TqRingCopy, Variant::Tq(l.ty), &[(0, buf)], 5, &params, [t.window as u32, 1, 1])?;
            }
            let mut enc = if st.is_empty() {
                g.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kv copy") })
            } else {
                st.encode()?
            };
            for (buf, l) in caches() {
                for (src, dst, words) in regions(l) {
                    let bytes = 4 * words as u64;
                    enc.copy_buffer_to_buffer(buf, 4 * src as u64, &tmp, 0, bytes);
                    enc.copy_buffer_to_buffer(&tmp, 0, buf, 4 * dst as u64, bytes);
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
        // TurboQuant: a word of scale, then the bit stream, per head; the
        // whole head rotated.
        for (ty, hd, words) in [(KvCacheType::Tq3, 64, 7), (KvCacheType::Tq4, 64, 9), (KvCacheType::Tq3, 16, 3)] {
            let l = KvLayout::new(ty, 8, hd, true).unwrap();
            assert_eq!((l.row_words, l.rot), (8 * words, hd), "{ty} {hd}");
            assert!(ty.row_bytes(8, hd).unwrap() <= l.row_bytes());
            assert!(matches!(KvLayout::new(ty, 2, 48, true), Err(Error::UnsupportedKvCache { ty: t, .. }) if t == ty));
        }
        assert!(matches!(
            KvLayout::new(KvCacheType::Q8_0, 2, 48, false),
            Err(Error::UnsupportedKvCache { ty: KvCacheType::Q8_0, .. })
        ));
    }
}
