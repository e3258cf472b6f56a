//! `--ignore-eos`: llama.cpp's logit bias of minus infinity on every
//! end-of-generation token, so that generation goes on to `-n` or a full
//! context.
//!
//! A [`DeviceModel`] that forwards to the prepared model and masks those
//! logits in a copy of every row; the generation loop then never samples
//! them.

use infer_compute::{Batch, DeviceModel, KvPool, KvTypes, Result, StepProfile};

/// A model whose end-of-generation logits are minus infinity.
pub struct IgnoreEos {
    inner: Box<dyn DeviceModel>,
    eog: Vec<u32>,
    logits: Vec<f32>,
}

impl IgnoreEos {
    /// Wraps `inner`, masking the tokens `eog`.
    pub fn new(inner: Box<dyn DeviceModel>, eog: &[u32]) -> IgnoreEos {
        IgnoreEos { inner, eog: eog.to_vec(), logits: Vec::new() }
    }
}

impl DeviceModel for IgnoreEos {
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }

    fn default_kv_types(&self) -> KvTypes {
        self.inner.default_kv_types()
    }

    fn new_kv_pool_typed(&self, n_slots: usize, n_ctx: usize, types: KvTypes) -> Result<Box<dyn KvPool>> {
        self.inner.new_kv_pool_typed(n_slots, n_ctx, types)
    }

    /// Every row of the step, masked.
    fn forward(&mut self, pool: &mut dyn KvPool, batch: &Batch) -> Result<&[f32]> {
        let n_vocab = self.inner.n_vocab().max(1);
        let l = self.inner.forward(pool, batch)?;
        self.logits.clear();
        self.logits.extend_from_slice(l);
        for row in self.logits.chunks_exact_mut(n_vocab) {
            for &t in &self.eog {
                if let Some(z) = row.get_mut(t as usize) {
                    *z = f32::NEG_INFINITY;
                }
            }
        }
        Ok(&self.logits)
    }

    fn new_context(&self) -> Result<Box<dyn DeviceModel>> {
        Ok(Box::new(IgnoreEos { inner: self.inner.new_context()?, eog: self.eog.clone(), logits: Vec::new() }))
    }

    fn profile_step(&mut self, kv: &mut dyn KvPool, token: u32, pos: usize) -> Result<StepProfile> {
        self.inner.profile_step(kv, token, pos)
    }
}
