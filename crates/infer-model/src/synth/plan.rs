//! The tensors of a synthetic model, in file order, with their types:
//! the tensors each architecture's loader reads (`crate::model`).

use infer_compute::GgmlType;

use super::{tensor_type, SynthArch, SynthQuant, SynthShape, SynthSummary, TensorRole};
use crate::Result;

/// One tensor of a synthetic file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    /// GGUF name (`"blk.3.attn_v.weight"`).
    pub name: String,
    /// What the tensor is.
    pub role: TensorRole,
    /// Layer index for `blk.*` tensors.
    pub layer: Option<usize>,
    /// Extents in ggml order (`dims[0]` values per row).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// When set, the values are rounded through this type (quantized and
    /// dequantized) and stored as `ty` = F32: the same weights as a file
    /// whose tensor has this type.
    pub rounded_through: Option<GgmlType>,
}

impl TensorPlan {
    /// Values per row.
    pub fn cols(&self) -> usize {
        self.dims[0] as usize
    }

    /// Number of rows (1 for 1-D tensors).
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }

    /// Number of values.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of the tensor's data.
    ///
    /// # Errors
    /// Rows that are not whole blocks (never for planned tensors).
    pub fn n_bytes(&self) -> Result<usize> {
        Ok(self.ty.row_bytes(self.cols())? * self.rows())
    }
}

/// Every tensor of a synthetic model, in file order: `token_embd`, then each
/// layer's tensors in the order they run, then `output_norm` and `output`
/// (absent when tied), with their types from [`tensor_type`]. The layer's
/// tensors follow the architecture: fused `attn_qkv` and gate‖up `ffn_up`
/// (Phi-3), q/k/v biases (Qwen 2), q/k norms (Gemma 3, Qwen 3), sandwich
/// norms (Gemma 2 and 3).
///
/// # Errors
/// An invalid shape ([`SynthShape::validate`]).
pub fn plan_tensors(shape: &SynthShape, quant: SynthQuant) -> Result<Vec<TensorPlan>> {
    shape.validate()?;
    let s = shape;
    let (e, q, kv) = (s.n_embd as u64, (s.n_head * s.head_dim) as u64, (s.n_head_kv * s.head_dim) as u64);
    let ff = s.n_ff as u64;
    let gemma = matches!(s.arch, SynthArch::Gemma3 | SynthArch::Gemma2);
    let qk_norm = matches!(s.arch, SynthArch::Gemma3 | SynthArch::Qwen3);
    let phi3 = s.arch == SynthArch::Phi3;
    let mut out = Vec::new();
    let mut push = |name: String, role: TensorRole, layer: Option<usize>, dims: Vec<u64>| {
        let ty = tensor_type(quant, role, layer.unwrap_or(0), s.n_layer, dims[0] as usize, s.tied_embeddings);
        out.push(TensorPlan { name, role, layer, dims, ty, rounded_through: None });
    };
    push("token_embd.weight".into(), TensorRole::TokenEmbd, None, vec![e, s.n_vocab as u64]);
    for i in 0..s.n_layer {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        let b = |t: &str| format!("blk.{i}.{t}.bias");
        let l = Some(i);
        push(n("attn_norm"), TensorRole::AttnNorm, l, vec![e]);
        if phi3 {
            push(n("attn_qkv"), TensorRole::AttnQkv, l, vec![e, q + 2 * kv]);
        } else {
            push(n("attn_q"), TensorRole::AttnQ, l, vec![e, q]);
            push(n("attn_k"), TensorRole::AttnK, l, vec![e, kv]);
            push(n("attn_v"), TensorRole::AttnV, l, vec![e, kv]);
        }
        if s.arch == SynthArch::Qwen2 {
            push(b("attn_q"), TensorRole::AttnQBias, l, vec![q]);
            push(b("attn_k"), TensorRole::AttnKBias, l, vec![kv]);
            push(b("attn_v"), TensorRole::AttnVBias, l, vec![kv]);
        }
        if qk_norm {
            push(n("attn_q_norm"), TensorRole::AttnQNorm, l, vec![s.head_dim as u64]);
            push(n("attn_k_norm"), TensorRole::AttnKNorm, l, vec![s.head_dim as u64]);
        }
        push(n("attn_output"), TensorRole::AttnOutput, l, vec![q, e]);
        if gemma {
            push(n("post_attention_norm"), TensorRole::PostAttnNorm, l, vec![e]);
        }
        push(n("ffn_norm"), TensorRole::FfnNorm, l, vec![e]);
        if phi3 {
            push(n("ffn_up"), TensorRole::FfnUp, l, vec![e, 2 * ff]);
        } else {
            push(n("ffn_gate"), TensorRole::FfnGate, l, vec![e, ff]);
            push(n("ffn_up"), TensorRole::FfnUp, l, vec![e, ff]);
        }
        push(n("ffn_down"), TensorRole::FfnDown, l, vec![ff, e]);
        if gemma {
            push(n("post_ffw_norm"), TensorRole::PostFfnNorm, l, vec![e]);
        }
    }
    push("output_norm.weight".into(), TensorRole::OutputNorm, None, vec![e]);
    if !s.tied_embeddings {
        push("output.weight".into(), TensorRole::Output, None, vec![e, s.n_vocab as u64]);
    }
    Ok(out)
}

/// The plan of the same weights stored as F32: every quantized tensor of
/// `plan` becomes F32 rounded through its type.
pub fn dequantized_plan(plan: Vec<TensorPlan>) -> Vec<TensorPlan> {
    plan.into_iter()
        .map(
            |t| {
                if t.ty == GgmlType::F32 {
                    t
                } else {
                    TensorPlan { rounded_through: Some(t.ty), ty: GgmlType::F32, ..t }
                }
            },
        )
        .collect()
}

/// Tensor count, parameters, data bytes and the per-type breakdown of a
/// plan (what [`write_synthetic`](super::write_synthetic) will write, except the file size).
///
/// # Errors
/// As [`TensorPlan::n_bytes`].
pub fn summarize(plan: &[TensorPlan]) -> Result<SynthSummary> {
    let mut types: Vec<(GgmlType, usize, u64)> = Vec::new();
    let (mut n_params, mut tensor_bytes) = (0u64, 0u64);
    for t in plan {
        let b = t.n_bytes()? as u64;
        n_params += t.n_elements();
        tensor_bytes += b;
        match types.iter_mut().find(|(ty, _, _)| *ty == t.ty) {
            Some(e) => {
                e.1 += 1;
                e.2 += b;
            }
            None => types.push((t.ty, 1, b)),
        }
    }
    types.sort_by_key(|(ty, _, _)| ty.id());
    Ok(SynthSummary { n_tensors: plan.len(), n_params, tensor_bytes, file_bytes: 0, types })
}
