//! The kernels of one forward pass, enqueued in order on the model's
//! stream (the per-layer table is in the parent module's documentation).

use cudarc::driver::CudaSlice;

use super::{CudaKvPool, CudaModel, DevNorm, DevWeight, Mark, Pass};
use crate::cuda::kernels::{AttnArgs, DevPtr, MvMode, NormArgs, QkvArgs};
use crate::cuda::ops::{self, GemmPrecision, Matvec};
use crate::error::{Error, Result};

impl CudaModel {
    /// Enqueues the forward pass of `pass` (its integers already in the
    /// device parameter buffer) against `pool` on the stream, calling
    /// `mark` after each group of launches with its name and the weights it
    /// read (`profile_step` synchronizes and times there; otherwise a
    /// no-op).
    pub(super) fn enqueue(&self, pool: &CudaKvPool, pass: &Pass, mark: &mut Mark<'_>) -> Result<()> {
        let d = &*self.dev;
        let w = &*self.w;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let n = pass.n;
        let e = w.n_embd;
        let p = |s: &CudaSlice<f32>| d.ptr(s);
        let (x, x_alt, h, o) = (p(&b.x), p(&b.x_alt), p(&b.h), p(&b.o));
        let (aq, ad) = (d.ptr(&b.aq), d.ptr(&b.ad));
        let at = pass.params();
        let param = |i: usize| d.ptr(&b.params) + 4 * i as u64;
        let tokens = param(at.tokens());
        let with_q8 = |n_vals: usize| n_vals.is_multiple_of(32);
        let norm_args = |x: DevPtr, add: DevPtr, add_norm: Option<&DevNorm>, norm: &DevNorm| NormArgs {
            x,
            add,
            add_w: add_norm.map_or(0, |n| d.ptr(&n.w)),
            w: d.ptr(&norm.w),
            b: norm.b.as_ref().map_or(0, |b| d.ptr(b)),
            out: h,
            q: if with_q8(e) { aq } else { 0 },
            ds: if with_q8(e) { ad } else { 0 },
            n: e as i32,
            kind: norm.kind_id(),
            eps: norm.eps,
            add_eps: add_norm.map_or(0.0, |n| n.eps),
        };
        let mv = |w: &DevWeight, xf: DevPtr, xq: DevPtr, xd: DevPtr, y: DevPtr| Matvec {
            ty: w.ty,
            w: [d.ptr(&w.buf), 0, 0],
            y: [y, 0, 0],
            rows: [w.rows, 0, 0],
            cols: w.cols,
            x: xf,
            aq: xq,
            ad: xd,
            n_tok: n,
            mode: MvMode::Store,
            cap: 0.0,
            repacked_stride: w.repacked_stride,
        };

        // Tensor-core products: from `gemm_min_tokens`, dequantize one
        // matrix, then one cuBLAS GEMM; for `ops::mmq_tokens`, the `mmq_*`
        // kernels straight from the quantized blocks. Both take bf16 (or
        // with TF32 GEMMs f32) activations.
        let gemm = b.gemm.as_ref().filter(|_| n >= d.opts.gemm_min_tokens).map(|g| (g.prec, d.ptr(&g.w), d.ptr(&g.x)));
        let mmq = b
            .mmq
            .as_ref()
            .filter(|_| w.mmq_layers && ops::mmq_tokens(d, n))
            .map(|m| (d.ptr(&m.x), (d.ptr(&m.part), m.part.len())));
        let tensor = gemm.is_some() || mmq.is_some();
        let missing = || Error::Device("prefill GEMM scratch missing".into());
        // The operand of an f32 input of `cols` values per token (converted
        // once and shared by the products that read it).
        let operand = |xf: DevPtr, cols: usize| -> Result<DevPtr> {
            if let Some((xb, _)) = mmq {
                return ops::to_bf16(d, xf, xb, n * cols).map(|_| xb);
            }
            let (prec, _, xb) = gemm.ok_or_else(missing)?;
            match prec {
                GemmPrecision::Bf16 => ops::to_bf16(d, xf, xb, n * cols).map(|_| xb),
                GemmPrecision::Tf32 => Ok(xf),
            }
        };
        let mm = |w: &DevWeight, x: DevPtr, y: DevPtr| -> Result<()> {
            let repacked = w.repacked_stride != 0;
            let stride = if repacked { w.repacked_stride } else { w.ty.row_bytes(w.cols)? };
            if let Some((_, part)) = mmq {
                return ops::mmq(d, (w.ty, repacked), d.ptr(&w.buf), stride, (w.rows, w.cols), x, n, (y, w.rows), part);
            }
            let (prec, wf, _) = gemm.ok_or_else(missing)?;
            ops::dequant_matrix(d, d.ptr(&w.buf), w.ty, stride, w.rows, w.cols, repacked, prec, wf)?;
            ops::gemm(d, prec, wf, x, y, w.rows, w.cols, n, w.rows)
        };

        // One token: the residual add + norm before q/k/v waits in
        // `pending` for the q/k/v product, which runs it in its own blocks
        // when it can (`mvn_*`; the residual then moves between `x` and
        // `x_alt`, `cur` says where it is); otherwise, and for several
        // tokens, it runs as `residual_norm` first, in place. The norm
        // before gate/up always runs as `residual_norm`: fused into that
        // product too, a decode step was 1-4% slower on all four benchmark
        // models (H200, BENCHMARKS.md).
        let mut cur = x;
        let mut pending: Option<NormArgs> = None;
        let norm = |na: NormArgs, pending: &mut Option<NormArgs>| -> Result<()> {
            if n == 1 {
                *pending = Some(na);
                Ok(())
            } else {
                ops::residual_norm(d, &na, n)
            }
        };
        // `then`: a second product (another weight type, the same input)
        // that one launch runs after `call` when a fused kernel has the
        // pair; else it runs as a launch of its own.
        let product = |call: &Matvec,
                       mut then: Option<&Matvec>,
                       pending: &mut Option<NormArgs>,
                       cur: &mut DevPtr|
         -> Result<()> {
            match pending.take() {
                Some(na) if ops::can_fuse_norm(d, call) => {
                    let other = if *cur == x { x_alt } else { x };
                    let x_out = if na.add != 0 { other } else { 0 };
                    match then.take_if(|b| ops::mixed_norm_kernel(d, call, b).is_some()) {
                        Some(b) => ops::matvec_norm2(d, call, b, &na, x_out)?,
                        None => ops::matvec_norm(d, call, &na, x_out)?,
                    }
                    if na.add != 0 {
                        *cur = other;
                    }
                }
                Some(na) => {
                    ops::residual_norm(d, &na, n)?;
                    ops::matvec(d, call)?;
                }
                None => ops::matvec(d, call)?,
            }
            // The second product, when no fused kernel ran it.
            then.map_or(Ok(()), |b| ops::matvec(d, b))
        };
        ops::embed_rows(d, d.ptr(&w.token_embd.buf), w.token_embd.ty, e, tokens, n, w.embd_scale, x)?;
        if let Some(l0) = w.layers.first() {
            norm(norm_args(cur, 0, None, &l0.attn_norm), &mut pending)?;
        }
        mark("token_embd, attn_norm", &[])?;
        for (li, l) in w.layers.iter().enumerate() {
            // q, k, v: one launch per run of equal types; two runs (e.g.
            // a Q6_K v beside Q4_K q and k) in one launch when the fused
            // norm has a kernel for the pair.
            let targets = [(&l.wq, p(&b.q)), (&l.wk, p(&b.k)), (&l.wv, p(&b.v))];
            let mut i = 0;
            if tensor {
                let xo = operand(h, e)?;
                for (w, y) in targets {
                    mm(w, xo, y)?;
                }
                i = 3;
            }
            let mut runs: [Option<Matvec>; 3] = [None; 3];
            let mut n_runs = 0;
            while i < 3 {
                let mut call = mv(targets[i].0, h, aq, ad, targets[i].1);
                let mut j = i + 1;
                while j < 3
                    && targets[j].0.ty == targets[i].0.ty
                    && targets[j].0.repacked_stride == targets[i].0.repacked_stride
                {
                    call.w[j - i] = d.ptr(&targets[j].0.buf);
                    // Same type and layout: the stride is shared.
                    call.y[j - i] = targets[j].1;
                    call.rows[j - i] = targets[j].0.rows;
                    j += 1;
                }
                runs[n_runs] = Some(call);
                n_runs += 1;
                i = j;
            }
            match runs {
                [Some(a), Some(b), None] => product(&a, Some(&b), &mut pending, &mut cur)?,
                _ => {
                    for call in runs.iter().flatten() {
                        product(call, None, &mut pending, &mut cur)?;
                    }
                }
            }
            mark("matvec attn_qkv", &[&l.wq, &l.wk, &l.wv])?;
            let opt = |s: &Option<CudaSlice<f32>>| s.as_ref().map_or(0, |s| d.ptr(s));
            let (q_dim, kv_dim) = (l.n_head * l.hd, l.n_kv * l.hd);
            let wo_q8 = ops::wants_q8(l.wo.ty)?;
            // Attention per span, against the span's slot: the rows of
            // q/k/v/attn (and of attn's q8 copy) from the span's start; the
            // caches of `slot` (slot 0's for the batched kernel, which adds
            // each token's slot itself).
            let args = |si: usize, slot: usize| {
                let s = &pass.spans[si];
                let (kc, vc) = pool.slot_ptrs(li, slot);
                let row = |base: DevPtr, bytes: usize| base + (s.start * bytes) as u64;
                let qkv = QkvArgs {
                    q: row(p(&b.q), q_dim * 4),
                    k: row(p(&b.k), kv_dim * 4),
                    v: row(p(&b.v), kv_dim * 4),
                    bq: opt(&l.bq),
                    bk: opt(&l.bk),
                    bv: opt(&l.bv),
                    qn_w: l.q_norm.as_ref().map_or(0, |nn| d.ptr(&nn.w)),
                    kn_w: l.k_norm.as_ref().map_or(0, |nn| d.ptr(&nn.w)),
                    kc,
                    vc,
                    pos0: param(at.pos(si)),
                    n_head: l.n_head as i32,
                    n_kv: l.n_kv as i32,
                    hd: l.hd as i32,
                    n_rot: l.n_rot as i32,
                    neox: l.rope_neox as i32,
                    n_tok: s.len as i32,
                    theta_scale: l.theta_scale,
                    freq_scale: l.freq_scale,
                    qn_eps: l.q_norm.as_ref().map_or(0.0, |nn| nn.eps),
                    kn_eps: l.k_norm.as_ref().map_or(0.0, |nn| nn.eps),
                };
                let attn = AttnArgs {
                    q: qkv.q,
                    kc,
                    vc,
                    part_o: p(&b.part_o),
                    part_ml: p(&b.part_ml),
                    out: row(p(&b.attn), q_dim * 4),
                    oq: if wo_q8 { row(aq, q_dim) } else { 0 },
                    ods: if wo_q8 { row(ad, q_dim / 32 * 8) } else { 0 },
                    pos0: qkv.pos0,
                    n_head: l.n_head as i32,
                    n_kv: l.n_kv as i32,
                    hd: l.hd as i32,
                    n_split: b.n_split as i32,
                    window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
                    n_tok: s.len as i32,
                    scale: l.scale,
                    softcap: l.softcap.unwrap_or(0.0),
                };
                (qkv, attn)
            };
            // Whether this layer's shape has the batched decode kernel.
            let batchable = pass.spans.first().is_some_and(|_| ops::has_decode_batch(d, &args(0, 0).1));
            let mut si = 0;
            while si < pass.spans.len() {
                // A run of one-token spans (decode steps of different
                // sequences) in launches of up to DECODE_BATCH_MAX tokens.
                let run = pass.spans[si..].iter().take_while(|s| s.len == 1).count().min(ops::DECODE_BATCH_MAX);
                if run >= 2 && batchable {
                    let (qkv, attn) = args(si, 0);
                    let slots = param(at.slot(si));
                    let stride = pool.slot_stride(li);
                    ops::qkv_attention_batch(d, &qkv, &attn, d.ptr(&b.attn_count), slots, stride, run)?;
                    si += run;
                    continue;
                }
                let (qkv, attn) = args(si, pass.spans[si].slot);
                ops::qkv_attention(d, &qkv, &attn, d.ptr(&b.attn_count))?;
                si += 1;
            }
            mark("qkv bias, q/k norm, rope, kv append, attention", &[])?;
            if tensor {
                mm(&l.wo, operand(p(&b.attn), l.wo.cols)?, o)?;
            } else {
                ops::matvec(d, &mv(&l.wo, p(&b.attn), aq, ad, o))?;
            }
            mark("matvec attn_output", &[&l.wo])?;
            ops::residual_norm(d, &norm_args(cur, o, l.post_attn_norm.as_ref(), &l.ffn_norm), n)?;
            mark("residual add, ffn_norm", &[])?;

            let n_ff = l.up.rows;
            let act = p(&b.act);
            let mut act_q8 = false;
            match &l.gate {
                Some(g) if l.gated && tensor => {
                    let xo = operand(h, e)?;
                    mm(g, xo, p(&b.gate))?;
                    mm(&l.up, xo, p(&b.up))?;
                    ops::glu(d, p(&b.gate), p(&b.up), act, n * n_ff, l.gelu)?;
                }
                _ if tensor => {
                    mm(&l.up, operand(h, e)?, act)?;
                    ops::act_inplace(d, act, n * n_ff, l.gelu)?;
                }
                Some(g) if l.gated && g.ty == l.up.ty && g.repacked_stride == l.up.repacked_stride => {
                    let mut call = mv(g, h, aq, ad, act);
                    call.w[1] = d.ptr(&l.up.buf);
                    call.mode = if l.gelu { MvMode::GluGelu } else { MvMode::GluSilu };
                    // One token: the q8 copy of the output for ffn_down is
                    // written by the product itself when it can.
                    if n == 1 && ops::wants_q8(l.down.ty)? && ops::can_glu_q8(d, &call) {
                        ops::matvec_glu_q8(d, &call, d.ptr(&b.glu_q), d.ptr(&b.glu_ds), d.ptr(&b.glu_count))?;
                        act_q8 = true;
                    } else {
                        ops::matvec(d, &call)?;
                    }
                }
                Some(g) if l.gated => {
                    ops::matvec(d, &mv(g, h, aq, ad, p(&b.gate)))?;
                    ops::matvec(d, &mv(&l.up, h, aq, ad, p(&b.up)))?;
                    ops::glu(d, p(&b.gate), p(&b.up), act, n * n_ff, l.gelu)?;
                }
                _ => {
                    ops::matvec(d, &mv(&l.up, h, aq, ad, act))?;
                    ops::act_inplace(d, act, n * n_ff, l.gelu)?;
                }
            }
            match &l.gate {
                Some(g) => mark("matvec ffn_gate_up, activation", &[g, &l.up])?,
                None => mark("matvec ffn_up, activation", &[&l.up])?,
            }
            if tensor {
                mm(&l.down, operand(act, n_ff)?, o)?;
            } else {
                if ops::wants_q8(l.down.ty)? && !act_q8 {
                    ops::quantize_q8(d, act, aq, ad, n * n_ff / 32)?;
                }
                let (dq, dd) = if act_q8 { (d.ptr(&b.glu_q), d.ptr(&b.glu_ds)) } else { (aq, ad) };
                ops::matvec(d, &mv(&l.down, act, dq, dd, o))?;
            }
            mark("matvec ffn_down", &[&l.down])?;
            let next = w.layers.get(li + 1).map_or(&w.output_norm, |nl| &nl.attn_norm);
            norm(norm_args(cur, o, l.post_ffn_norm.as_ref(), next), &mut pending)?;
            mark("residual add, next norm", &[])?;
        }
        // The output norm runs on its own: the vocabulary product keeps the
        // plain kernel.
        if let Some(na) = pending.take() {
            ops::residual_norm(d, &na, n)?;
        }
        // Vocabulary projection of the wanted rows: of the last token in
        // place, of others gathered into consecutive rows first.
        let n_out = pass.outputs.len();
        if n_out == 0 {
            return mark("matvec output", &[]);
        }
        let q8 = with_q8(e);
        let (xf, xq, xd) = if pass.outputs == [n - 1] {
            let last = n - 1;
            (h + (last * e * 4) as u64, aq + (last * e) as u64, ad + (last * (e / 32) * 8) as u64)
        } else {
            let idx = param(at.outputs());
            let (oh, oq, od) = (p(&b.out_h), d.ptr(&b.out_q), p(&b.out_d));
            ops::gather_rows(d, h, oh, idx, n_out, e * 4)?;
            if q8 {
                ops::gather_rows(d, aq, oq, idx, n_out, e)?;
                ops::gather_rows(d, ad, od, idx, n_out, e / 32 * 8)?;
            }
            (oh, oq, od)
        };
        let out_layout = (w.output.ty, w.output.repacked_stride != 0);
        if let Some(m) = b
            .mmq
            .as_ref()
            .filter(|_| ops::mmq_tokens(d, n_out) && ops::mmq_kernel(out_layout.0, out_layout.1).is_some())
        {
            let stride = if out_layout.1 { w.output.repacked_stride } else { w.output.ty.row_bytes(e)? };
            let (xb, logits) = (d.ptr(&m.x), p(&b.logits));
            ops::to_bf16(d, xf, xb, n_out * e)?;
            let part = (d.ptr(&m.part), m.part.len());
            ops::mmq(
                d,
                out_layout,
                d.ptr(&w.output.buf),
                stride,
                (w.n_vocab, e),
                xb,
                n_out,
                (logits, w.n_vocab),
                part,
            )?;
            if let Some(c) = w.final_softcap {
                ops::softcap_inplace(d, logits, n_out * w.n_vocab, c)?;
            }
            return mark("matvec output", &[&w.output]);
        }
        if let Some(g) =
            gemm.filter(|_| n_out >= d.opts.gemm_min_tokens && ops::has_dequant(out_layout.0, out_layout.1))
        {
            self.output_gemm(g, xf, n_out)?;
            return mark("matvec output", &[&w.output]);
        }
        // Without a q8 copy (rows not of whole chunks) only float weights
        // can run, and they read the f32 rows.
        let mut call = mv(&w.output, xf, xq, xd, p(&b.logits));
        call.n_tok = n_out;
        if let Some(c) = w.final_softcap {
            call.mode = MvMode::Softcap;
            call.cap = c;
        }
        ops::matvec(d, &call)?;
        mark("matvec output", &[&w.output])
    }

    /// The vocabulary product of `n_out` gathered rows `xf` (f32) as
    /// tensor-core GEMMs: the output matrix dequantized a block of rows at
    /// a time into the GEMM scratch (sized for the largest layer matrix),
    /// each block's logits a column block of the `n_out × n_vocab` result;
    /// then the soft-cap, if any. Several dozen rows amortize the
    /// dequantization, where the mat-vec kernels would read the matrix once
    /// per 8 rows.
    fn output_gemm(&self, (prec, wf, xb): (GemmPrecision, DevPtr, DevPtr), xf: DevPtr, n_out: usize) -> Result<()> {
        let d = &*self.dev;
        let w = &*self.w;
        let b = self.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let (out, e, nv) = (&w.output, w.n_embd, w.n_vocab);
        let x = match prec {
            GemmPrecision::Bf16 => {
                ops::to_bf16(d, xf, xb, n_out * e)?;
                xb
            }
            GemmPrecision::Tf32 => xf,
        };
        let repacked = out.repacked_stride != 0;
        let stride = if repacked { out.repacked_stride } else { out.ty.row_bytes(out.cols)? };
        let block = (w.max.mat / e.max(1)).clamp(1, nv.max(1));
        let logits = d.ptr(&b.logits);
        for r0 in (0..nv).step_by(block) {
            let rows = block.min(nv - r0);
            let src = d.ptr(&out.buf) + (r0 * stride) as u64;
            ops::dequant_matrix(d, src, out.ty, stride, rows, e, repacked, prec, wf)?;
            ops::gemm(d, prec, wf, x, logits + (r0 * 4) as u64, rows, e, n_out, nv)?;
        }
        match w.final_softcap {
            Some(c) => ops::softcap_inplace(d, logits, n_out * nv, c),
            None => Ok(()),
        }
    }
}
