//! The parts every architecture's blocks share, read the way llama.cpp's
//! loader reads them (`create_tensor_qkv`, `build_qkv`, `build_ffn` in
//! `src/llama-model.cpp` / `src/llama-graph.cpp`):
//!
//! - attention projections either separate (`attn_q`, `attn_k`, `attn_v`)
//!   or fused (`attn_qkv`: the q rows, then k, then v), each with optional
//!   biases (separate, or one fused `attn_qkv.bias`); a fused tensor is
//!   split by row ranges that share the file's bytes;
//! - the FFN either gated (`ffn_gate`, `ffn_up`) or, for Phi-3, one
//!   `ffn_up` of 2·n_ff rows holding gate‖up (ggml's `swiglu` takes the
//!   activation of the first half times the second half);
//! - projections the pipeline has no term for (`attn_output.bias`, FFN
//!   biases) make the file an error instead of being ignored.

use infer_compute::pipeline::{Activation, FfnType, LayerSpec, Norm, RopeSpec};
use infer_compute::QuantWeight;

use super::hparams::HParams;
use super::tensors::{matrix, opt_rms_norm, opt_shaped, refuse, rms_norm, shaped};
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// The q, k, v projections of one layer and their biases.
pub(crate) struct Qkv {
    pub wq: QuantWeight,
    pub wk: QuantWeight,
    pub wv: QuantWeight,
    pub bq: Option<QuantWeight>,
    pub bk: Option<QuantWeight>,
    pub bv: Option<QuantWeight>,
}

/// The attention projections of layer `i`, separate or fused.
///
/// # Errors
/// Missing tensors, shapes that disagree with `hp` (naming its keys).
pub(crate) fn qkv(g: &GgufFile, i: usize, hp: &HParams) -> Result<Qkv> {
    let (e, q, kv) = (hp.n_embd, hp.q_width(), hp.kv_width());
    let because = format!(
        "{}, {} × {} and {} × key_length",
        hp.key("embedding_length"),
        hp.key("attention.head_count"),
        hp.key("attention.key_length"),
        hp.key("attention.head_count_kv")
    );
    let n = |s: &str| format!("blk.{i}.{s}");
    let fused_name = n("attn_qkv.weight");
    if let Some(t) = g.tensor(&fused_name) {
        let total = q + 2 * kv;
        shaped(g, &fused_name, &[e, total], &because)?;
        let split = |w_or_b: &crate::gguf::TensorInfo| -> Result<[QuantWeight; 3]> {
            Ok([g.tensor_rows(w_or_b, 0, q)?, g.tensor_rows(w_or_b, q, kv)?, g.tensor_rows(w_or_b, q + kv, kv)?])
        };
        let [wq, wk, wv] = split(t)?;
        let bias_name = n("attn_qkv.bias");
        let (bq, bk, bv) = if g.tensor(&bias_name).is_some() {
            shaped(g, &bias_name, &[total], &because)?;
            // A 1-D bias is one row; split its values instead of its rows.
            let b = g.weight(&bias_name)?;
            let [bq, bk, bv] = split_vector(&b, [q, kv, kv], &bias_name)?;
            (Some(bq), Some(bk), Some(bv))
        } else {
            separate_biases(g, i, q, kv, &because)?
        };
        return Ok(Qkv { wq, wk, wv, bq, bk, bv });
    }
    let (bq, bk, bv) = separate_biases(g, i, q, kv, &because)?;
    Ok(Qkv {
        wq: matrix(g, &n("attn_q.weight"), q, e, &because)?,
        wk: matrix(g, &n("attn_k.weight"), kv, e, &because)?,
        wv: matrix(g, &n("attn_v.weight"), kv, e, &because)?,
        bq,
        bk,
        bv,
    })
}

type Biases = (Option<QuantWeight>, Option<QuantWeight>, Option<QuantWeight>);

fn separate_biases(g: &GgufFile, i: usize, q: usize, kv: usize, because: &str) -> Result<Biases> {
    let n = |s: &str| format!("blk.{i}.{s}.bias");
    Ok((
        opt_shaped(g, &n("attn_q"), &[q], because)?,
        opt_shaped(g, &n("attn_k"), &[kv], because)?,
        opt_shaped(g, &n("attn_v"), &[kv], because)?,
    ))
}

/// Splits a 1-row F32 vector into consecutive parts of the given lengths.
fn split_vector(b: &QuantWeight, lens: [usize; 3], name: &str) -> Result<[QuantWeight; 3]> {
    if b.ty != infer_compute::GgmlType::F32 {
        return Err(Error::UnsupportedFeature { arch: "any".into(), feature: format!("{} bias `{name}`", b.ty) });
    }
    let bytes = b.data.as_bytes();
    let mut out = Vec::with_capacity(3);
    let mut at = 0;
    for len in lens {
        let part = bytes[at * 4..(at + len) * 4].to_vec();
        out.push(QuantWeight::new(b.ty, 1, len, part.into())?);
        at += len;
    }
    let [a, b, c]: [QuantWeight; 3] = out.try_into().map_err(|_| Error::Gguf(format!("`{name}`: bad split")))?;
    Ok([a, b, c])
}

/// The feed-forward weights of one layer: `(gate, up, down)`.
pub(crate) type Ffn = (Option<QuantWeight>, QuantWeight, QuantWeight);

/// A gated FFN of layer `i` (`ffn_gate`, `ffn_up`, `ffn_down`); n_ff is the
/// rows of `ffn_up`, checked against `feed_forward_length` when present.
///
/// # Errors
/// Missing tensors; shapes that disagree with each other or with `hp`.
pub(crate) fn gated_ffn(g: &GgufFile, i: usize, hp: &HParams) -> Result<Ffn> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let n_ff = ffn_width(g, &n("ffn_up"), hp, 1)?;
    let because = format!("{} and {}", hp.key("embedding_length"), hp.key("feed_forward_length"));
    Ok((
        Some(matrix(g, &n("ffn_gate"), n_ff, hp.n_embd, &because)?),
        matrix(g, &n("ffn_up"), n_ff, hp.n_embd, &because)?,
        matrix(g, &n("ffn_down"), hp.n_embd, n_ff, &because)?,
    ))
}

/// Phi-3's FFN: `ffn_up` holds 2·n_ff rows, the gate's then the up
/// projection's, split here into two weights sharing the file's bytes.
///
/// # Errors
/// As [`gated_ffn`].
pub(crate) fn fused_gate_up_ffn(g: &GgufFile, i: usize, hp: &HParams) -> Result<Ffn> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let up_name = n("ffn_up");
    let n_ff = ffn_width(g, &up_name, hp, 2)?;
    let because = format!("{} and 2 × {}", hp.key("embedding_length"), hp.key("feed_forward_length"));
    matrix(g, &up_name, 2 * n_ff, hp.n_embd, &because)?;
    let t = g.tensor(&up_name).ok_or_else(|| Error::MissingTensor(up_name.clone()))?;
    let gate = g.tensor_rows(t, 0, n_ff)?;
    let up = g.tensor_rows(t, n_ff, n_ff)?;
    Ok((Some(gate), up, matrix(g, &n("ffn_down"), hp.n_embd, n_ff, &because)?))
}

/// n_ff from the rows of `up_name` (divided by `parts`), checked against
/// `feed_forward_length` when the file has it.
fn ffn_width(g: &GgufFile, up_name: &str, hp: &HParams, parts: usize) -> Result<usize> {
    let t = g.tensor(up_name).ok_or_else(|| Error::MissingTensor(up_name.to_string()))?;
    let rows = usize::try_from(t.rows()).unwrap_or(usize::MAX);
    let n_ff = rows / parts;
    match hp.n_ff {
        Some(v) if v != n_ff || !rows.is_multiple_of(parts) => Err(Error::CountMismatch {
            key: hp.key("feed_forward_length"),
            value: v as u64,
            detail: format!("`{up_name}` has {rows} rows ({parts} × n_ff expected)"),
        }),
        _ if n_ff == 0 || n_ff > super::hparams::MAX_WIDTH => Err(Error::TensorShape {
            tensor: up_name.to_string(),
            found: t.dims.clone(),
            expected: vec![hp.n_embd as u64, (parts * n_ff.max(1)) as u64],
            because: "a feed-forward width of 1 to 2^20".into(),
        }),
        _ => Ok(n_ff),
    }
}

/// Tensors of layer `i` that no supported architecture uses; refused rather
/// than ignored.
///
/// # Errors
/// [`Error::UnsupportedFeature`].
pub(crate) fn refuse_unused(g: &GgufFile, i: usize, arch: &str) -> Result<()> {
    for s in ["attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "ffn_gate_inp.weight"] {
        refuse(g, arch, &format!("blk.{i}.{s}"))?;
    }
    Ok(())
}

/// How an architecture's block differs from the common pre-norm block.
pub(crate) struct BlockOptions {
    pub rope: RopeSpec,
    pub sliding_window: Option<usize>,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    /// Per-head q/k RMSNorm: `Some(true)` required, `Some(false)` optional,
    /// `None` not read.
    pub qk_norm: Option<bool>,
    /// Whether `post_attention_norm` and `post_ffw_norm` are required
    /// (Gemma's sandwich norms; read as optional otherwise only for Gemma 3).
    pub sandwich: Option<bool>,
    pub activation: Activation,
    /// Phi-3's fused gate‖up `ffn_up`.
    pub fused_gate_up: bool,
}

/// Layer `i` of a pre-norm transformer with the options of its
/// architecture.
///
/// # Errors
/// Missing tensors, shapes that disagree with `hp`, unsupported tensors.
pub(crate) fn block(g: &GgufFile, i: usize, hp: &HParams, o: &BlockOptions) -> Result<LayerSpec> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let e = hp.n_embd;
    let emb = hp.key("embedding_length");
    let hd = hp.key("attention.key_length");
    refuse_unused(g, i, hp.arch)?;
    let a = qkv(g, i, hp)?;
    let wo = matrix(
        g,
        &n("attn_output"),
        e,
        hp.q_width(),
        &format!("{emb} and {} × key_length", hp.key("attention.head_count")),
    )?;
    let qk = |s: &str| -> Result<Option<Norm>> {
        match o.qk_norm {
            None => Ok(None),
            Some(true) => rms_norm(g, &n(s), hp.head_dim, hp.eps, &hd).map(Some),
            Some(false) => opt_rms_norm(g, &n(s), hp.head_dim, hp.eps, &hd),
        }
    };
    let post = |s: &str| -> Result<Option<Norm>> {
        match o.sandwich {
            None => Ok(None),
            Some(true) => rms_norm(g, &n(s), e, hp.eps, &emb).map(Some),
            Some(false) => opt_rms_norm(g, &n(s), e, hp.eps, &emb),
        }
    };
    let (ffn_gate, ffn_up, ffn_down) =
        if o.fused_gate_up { fused_gate_up_ffn(g, i, hp)? } else { gated_ffn(g, i, hp)? };
    Ok(LayerSpec {
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        rope: o.rope,
        sliding_window: o.sliding_window,
        attn_softcap: o.attn_softcap,
        attn_scale: o.attn_scale,
        attn_norm: rms_norm(g, &n("attn_norm"), e, hp.eps, &emb)?,
        wq: a.wq,
        wk: a.wk,
        wv: a.wv,
        wo,
        bq: a.bq,
        bk: a.bk,
        bv: a.bv,
        q_norm: qk("attn_q_norm")?,
        k_norm: qk("attn_k_norm")?,
        post_attn_norm: post("post_attention_norm")?,
        ffn_norm: rms_norm(g, &n("ffn_norm"), e, hp.eps, &emb)?,
        ffn: FfnType::Gated,
        activation: o.activation,
        ffn_gate,
        ffn_up,
        ffn_down,
        post_ffn_norm: post("post_ffw_norm")?,
    })
}

/// The embeddings, the final norm and the output projection (the
/// embeddings when `output.weight` is absent), checked against `hp`.
///
/// # Errors
/// Missing tensors; shapes; an `output.bias` (not supported).
pub(crate) fn embeddings_and_output(g: &GgufFile, hp: &HParams) -> Result<(QuantWeight, Norm, QuantWeight)> {
    let emb = hp.key("embedding_length");
    let t = g.tensor("token_embd.weight").ok_or_else(|| Error::MissingTensor("token_embd.weight".into()))?;
    let n_vocab = usize::try_from(t.rows()).unwrap_or(usize::MAX);
    let token_embd = matrix(g, "token_embd.weight", n_vocab, hp.n_embd, &emb)?;
    let output = match opt_shaped(g, "output.weight", &[hp.n_embd, n_vocab], &format!("{emb} and the vocabulary"))? {
        Some(w) => w,
        None => token_embd.clone(),
    };
    refuse(g, hp.arch, "output.bias")?;
    let output_norm = rms_norm(g, "output_norm.weight", hp.n_embd, hp.eps, &emb)?;
    Ok((token_embd, output_norm, output))
}

/// The whole model: embeddings, `hp.n_layer` blocks with the options
/// `options(i)` gives layer `i`, final norm and output.
///
/// # Errors
/// As [`block`] and [`embeddings_and_output`].
pub(crate) fn assemble(
    g: &GgufFile,
    hp: &HParams,
    embd_scale: f32,
    final_logit_softcap: Option<f32>,
    options: impl Fn(usize) -> BlockOptions,
) -> Result<infer_compute::pipeline::ModelSpec> {
    let (token_embd, output_norm, output) = embeddings_and_output(g, hp)?;
    let layers = (0..hp.n_layer).map(|i| block(g, i, hp, &options(i))).collect::<Result<Vec<_>>>()?;
    Ok(infer_compute::pipeline::ModelSpec {
        arch: hp.arch.into(),
        n_embd: hp.n_embd,
        n_vocab: token_embd.rows,
        n_ctx_train: hp.n_ctx_train,
        embd_scale,
        token_embd,
        layers,
        output_norm,
        output,
        final_logit_softcap,
    })
}

/// The block of the Llama-like architectures: pre-norm, SwiGLU, one RoPE
/// for every layer, scale 1/sqrt(head_dim), no window, no soft-cap.
pub(crate) fn plain_block(hp: &HParams, kind: infer_compute::pipeline::RopeType) -> BlockOptions {
    BlockOptions {
        rope: RopeSpec { kind, base: hp.rope_base, n_rot: hp.n_rot, freq_scale: hp.rope_freq_scale },
        sliding_window: None,
        attn_scale: 1.0 / (hp.head_dim as f32).sqrt(),
        attn_softcap: None,
        qk_norm: None,
        sandwich: None,
        activation: Activation::Silu,
        fused_gate_up: false,
    }
}
