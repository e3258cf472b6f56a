//! `--ignore-eos`: llama.cpp's logit bias of minus infinity on every
//! end-of-generation token, so that generation goes on to `-n` or a full
//! context.
//!
//! A [`DeviceModel`] that forwards to the prepared model and masks those
//! logits in a copy; the generation loop then never samples them.

use infer_compute::{DeviceModel, KvCache, Result, StepProfile};

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

    fn masked(logits: &mut Vec<f32>, from: &[f32], eog: &[u32]) {
        logits.clear();
        logits.extend_from_slice(from);
        for &t in eog {
            if let Some(z) = logits.get_mut(t as usize) {
                *z = f32::NEG_INFINITY;
            }
        }
    }
}

impl DeviceModel for IgnoreEos {
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }

    fn new_kv_cache(&self, n_ctx: usize) -> Result<Box<dyn KvCache>> {
        self.inner.new_kv_cache(n_ctx)
    }

    fn decode_token(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<&[f32]> {
        let l = self.inner.decode_token(kv, token, pos)?;
        Self::masked(&mut self.logits, l, &self.eog);
        Ok(&self.logits)
    }

    fn prefill(&mut self, kv: &mut dyn KvCache, tokens: &[u32], pos: usize) -> Result<&[f32]> {
        let l = self.inner.prefill(kv, tokens, pos)?;
        Self::masked(&mut self.logits, l, &self.eog);
        Ok(&self.logits)
    }

    fn profile_step(&mut self, kv: &mut dyn KvCache, token: u32, pos: usize) -> Result<StepProfile> {
        self.inner.profile_step(kv, token, pos)
    }
}
