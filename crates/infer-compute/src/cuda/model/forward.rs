//! The kernels of one forward pass, enqueued in order on the model's
//! stream (the per-layer table is in the parent module's documentation).
//!
//! [`CudaModel::enqueue`] is the pass as a list of stages; [`Forward`]
//! holds what every stage launches with (the buffers' device addresses, the
//! products' path chosen once for the pass's token count) and the one piece
//! of state that moves between stages: where the residual stream is, and
//! the residual add + norm that waits for the next product to run it.

use cudarc::driver::CudaSlice;

use super::{CudaKvPool, CudaModel, DevLayer, DevNorm, DevWeight, Mark, Pass, Weights};
use crate::cuda::buffers::{Buffers, Params};
use crate::cuda::device::Device;
use crate::cuda::kernels::{AttnArgs, DevPtr, MvMode, NormArgs, QkvArgs};
use crate::cuda::kv_pool::CacheLayout;
use crate::cuda::ops::{self, GemmPrecision, Matvec};
use crate::error::{Error, Result};

impl CudaModel {
    /// Enqueues the forward pass of `pass` (its integers already in the
    /// device parameter buffer) against `pool` on the stream, calling
    /// `mark` after each group of launches with its name and the weights it
    /// read (`profile_step` synchronizes and times there; otherwise a
    /// no-op).
    pub(super) fn enqueue(&self, pool: &CudaKvPool, pass: &Pass, mark: &mut Mark<'_>) -> Result<()> {
        let mut f = Forward::new(self, pool, pass)?;
        f.embed()?;
        mark("token_embd, attn_norm", &[])?;
        for (li, l) in self.w.layers.iter().enumerate() {
            f.qkv(l)?;
            mark("matvec attn_qkv", &[&l.wq, &l.wk, &l.wv])?;
            f.attention(li, l)?;
            mark("qkv bias, q/k norm, rope, kv append, attention", &[])?;
            f.attn_output(l)?;
            mark("matvec attn_output", &[&l.wo])?;
            f.ffn_norm(l)?;
            mark("residual add, ffn_norm", &[])?;
            let act_q8 = f.ffn_up(l)?;
            match &l.gate {
                Some(g) => mark("matvec ffn_gate_up, activation", &[g, &l.up])?,
                None => mark("matvec ffn_up, activation", &[&l.up])?,
            }
            f.ffn_down(l, act_q8)?;
            mark("matvec ffn_down", &[&l.down])?;
            f.next_norm(li, l)?;
            mark("residual add, next norm", &[])?;
        }
        let read: &[&DevWeight] = if f.output()? { &[&self.w.output] } else { &[] };
        mark("matvec output", read)
    }
}

/// Whether layer `l`'s one-token decode attention in `pass` runs the flat
/// kernel ([`ops::decode_flat`] for the pass's deepest position and its
/// one-token spans, at most `DECODE_BATCH_MAX` at once): one choice per
/// layer and pass, part of a captured step's key.
pub(super) fn attn_flat(d: &Device, l: &DevLayer, n_split: usize, pass: &Pass) -> bool {
    let n_tok = pass.spans.iter().filter(|s| s.len == 1).count().clamp(1, ops::DECODE_BATCH_MAX);
    let attn = AttnArgs {
        n_head: l.n_head as i32,
        n_kv: l.n_kv as i32,
        hd: l.hd as i32,
        n_split: n_split as i32,
        window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
        ..Default::default()
    };
    ops::decode_flat(d, &attn, n_tok, pass.max_pos)
}

/// A cuBLAS GEMM path: its precision, the dequantized-matrix scratch and
/// the converted-activation scratch.
type Gemm = (GemmPrecision, DevPtr, DevPtr);

/// The `mmq_*` path: the bf16 activation scratch and the partial sums
/// (address, values).
type Mmq = (DevPtr, (DevPtr, usize));

/// One forward pass being enqueued (see the module documentation).
struct Forward<'a> {
    d: &'a Device,
    w: &'a Weights,
    b: &'a Buffers,
    pool: &'a CudaKvPool,
    pass: &'a Pass,
    /// Tokens of the pass and `n_embd`.
    n: usize,
    e: usize,
    /// The residual stream and its alternate, the normed rows, a product's
    /// output, and the q8 copy (values, scales) of the rows a product reads.
    x: DevPtr,
    x_alt: DevPtr,
    h: DevPtr,
    o: DevPtr,
    aq: DevPtr,
    ad: DevPtr,
    /// Where the pass's integers lie in the parameter buffer.
    at: Params,
    /// Tensor-core products: from `gemm_min_tokens`, dequantize one matrix,
    /// then one cuBLAS GEMM; for `ops::mmq_tokens`, the `mmq_*` kernels
    /// straight from the quantized blocks (preferred). Neither: mat-vecs.
    gemm: Option<Gemm>,
    mmq: Option<Mmq>,
    /// Which of `x` and `x_alt` holds the residual stream now.
    cur: DevPtr,
    /// One token: the residual add + norm before q/k/v waits here for the
    /// q/k/v product, which runs it in its own blocks when it can (`mvn_*`;
    /// the residual then moves between `x` and `x_alt`); otherwise, and for
    /// several tokens, it runs as `residual_norm` first, in place. The norm
    /// before gate/up always runs as `residual_norm`: fused into that
    /// product too, a decode step was 1-4% slower on all four benchmark
    /// models (H200, BENCHMARKS.md).
    pending: Option<NormArgs>,
}

impl<'a> Forward<'a> {
    fn new(m: &'a CudaModel, pool: &'a CudaKvPool, pass: &'a Pass) -> Result<Self> {
        let d = &*m.dev;
        let w = &*m.w;
        let b = m.bufs.as_ref().ok_or_else(|| Error::Device("buffers missing".into()))?;
        let n = pass.n;
        let gemm = b.gemm.as_ref().filter(|_| n >= d.opts.gemm_min_tokens).map(|g| (g.prec, d.ptr(&g.w), d.ptr(&g.x)));
        let mmq = b
            .mmq
            .as_ref()
            .filter(|_| w.mmq_layers && ops::mmq_tokens(d, n))
            .map(|m| (d.ptr(&m.x), (d.ptr(&m.part), m.part.len())));
        let x = d.ptr(&b.x);
        Ok(Forward {
            d,
            w,
            b,
            pool,
            pass,
            n,
            e: w.n_embd,
            x,
            x_alt: d.ptr(&b.x_alt),
            h: d.ptr(&b.h),
            o: d.ptr(&b.o),
            aq: d.ptr(&b.aq),
            ad: d.ptr(&b.ad),
            at: pass.params(),
            gemm,
            mmq,
            cur: x,
            pending: None,
        })
    }

    fn p(&self, s: &CudaSlice<f32>) -> DevPtr {
        self.d.ptr(s)
    }

    /// Device address of value `i` of the parameter buffer.
    fn param(&self, i: usize) -> DevPtr {
        self.d.ptr(&self.b.params) + 4 * i as u64
    }

    fn tensor(&self) -> bool {
        self.gemm.is_some() || self.mmq.is_some()
    }

    /// Rows of `n_vals` values have a q8 copy (whole 32-value chunks).
    fn with_q8(n_vals: usize) -> bool {
        n_vals.is_multiple_of(32)
    }

    /// `norm` of `x` (plus `add`, itself normed by `add_norm` first) into
    /// the normed rows and their q8 copy.
    fn norm_args(&self, x: DevPtr, add: DevPtr, add_norm: Option<&DevNorm>, norm: &DevNorm) -> NormArgs {
        let (d, e) = (self.d, self.e);
        let q8 = Self::with_q8(e);
        NormArgs {
            x,
            add,
            add_w: add_norm.map_or(0, |n| d.ptr(&n.w)),
            w: d.ptr(&norm.w),
            b: norm.b.as_ref().map_or(0, |b| d.ptr(b)),
            out: self.h,
            q: if q8 { self.aq } else { 0 },
            ds: if q8 { self.ad } else { 0 },
            n: e as i32,
            kind: norm.kind_id(),
            eps: norm.eps,
            add_eps: add_norm.map_or(0.0, |n| n.eps),
        }
    }

    /// The mat-vec product `y = w · x` of the pass's tokens (`xf` f32 rows,
    /// `xq`/`xd` their q8 copy).
    fn mv(&self, w: &DevWeight, xf: DevPtr, xq: DevPtr, xd: DevPtr, y: DevPtr) -> Matvec {
        Matvec {
            ty: w.ty,
            w: [self.d.ptr(&w.buf), 0, 0],
            y: [y, 0, 0],
            rows: [w.rows, 0, 0],
            cols: w.cols,
            x: xf,
            aq: xq,
            ad: xd,
            n_tok: self.n,
            mode: MvMode::Store,
            cap: 0.0,
            repacked_stride: w.repacked_stride,
        }
    }

    /// The tensor-core operand of an f32 input of `cols` values per token
    /// (converted once and shared by the products that read it).
    fn operand(&self, xf: DevPtr, cols: usize) -> Result<DevPtr> {
        let (d, n) = (self.d, self.n);
        if let Some((xb, _)) = self.mmq {
            return ops::to_bf16(d, xf, xb, n * cols).map(|_| xb);
        }
        let (prec, _, xb) = self.gemm.ok_or_else(missing_scratch)?;
        match prec {
            GemmPrecision::Bf16 => ops::to_bf16(d, xf, xb, n * cols).map(|_| xb),
            GemmPrecision::Tf32 => Ok(xf),
        }
    }

    /// The tensor-core product `y = w · x` (`x` from [`Forward::operand`]).
    fn mm(&self, w: &DevWeight, x: DevPtr, y: DevPtr) -> Result<()> {
        let (d, n) = (self.d, self.n);
        let repacked = w.repacked_stride != 0;
        let stride = if repacked { w.repacked_stride } else { w.ty.row_bytes(w.cols)? };
        if let Some((_, part)) = self.mmq {
            return ops::mmq(d, (w.ty, repacked), d.ptr(&w.buf), stride, (w.rows, w.cols), x, n, (y, w.rows), part);
        }
        let (prec, wf, _) = self.gemm.ok_or_else(missing_scratch)?;
        ops::dequant_matrix(d, d.ptr(&w.buf), w.ty, stride, w.rows, w.cols, repacked, prec, wf)?;
        ops::gemm(d, prec, wf, x, y, w.rows, w.cols, n, w.rows)
    }

    /// A residual add + norm before q/k/v: waits for the product (one
    /// token, see `pending`) or runs now.
    fn norm(&mut self, na: NormArgs) -> Result<()> {
        if self.n == 1 {
            self.pending = Some(na);
            Ok(())
        } else {
            ops::residual_norm(self.d, &na, self.n)
        }
    }

    /// The mat-vec `call`, running the pending norm in its blocks when it
    /// can; `then`: a second product (another weight type, the same input)
    /// that one launch runs after `call` when a fused kernel has the pair,
    /// else a launch of its own.
    fn product(&mut self, call: &Matvec, mut then: Option<&Matvec>) -> Result<()> {
        let d = self.d;
        match self.pending.take() {
            Some(na) if ops::can_fuse_norm(d, call) => {
                let other = if self.cur == self.x { self.x_alt } else { self.x };
                let x_out = if na.add != 0 { other } else { 0 };
                match then.take_if(|b| ops::mixed_norm_kernel(d, call, b).is_some()) {
                    Some(b) => ops::matvec_norm2(d, call, b, &na, x_out)?,
                    None => ops::matvec_norm(d, call, &na, x_out)?,
                }
                if na.add != 0 {
                    self.cur = other;
                }
            }
            Some(na) => {
                ops::residual_norm(d, &na, self.n)?;
                ops::matvec(d, call)?;
            }
            None => ops::matvec(d, call)?,
        }
        then.map_or(Ok(()), |b| ops::matvec(d, b))
    }

    /// The token embeddings, and the first layer's attention norm.
    fn embed(&mut self) -> Result<()> {
        let (d, w) = (self.d, self.w);
        let tokens = self.param(self.at.tokens());
        ops::embed_rows(d, d.ptr(&w.token_embd.buf), w.token_embd.ty, self.e, tokens, self.n, w.embd_scale, self.x)?;
        if let Some(l0) = w.layers.first() {
            self.norm(self.norm_args(self.cur, 0, None, &l0.attn_norm))?;
        }
        Ok(())
    }

    /// q, k, v: one launch per run of equal types; two runs (e.g. a Q6_K v
    /// beside Q4_K q and k) in one launch when the fused norm has a kernel
    /// for the pair.
    fn qkv(&mut self, l: &DevLayer) -> Result<()> {
        let b = self.b;
        let targets = [(&l.wq, self.p(&b.q)), (&l.wk, self.p(&b.k)), (&l.wv, self.p(&b.v))];
        if self.tensor() {
            let xo = self.operand(self.h, self.e)?;
            return targets.into_iter().try_for_each(|(w, y)| self.mm(w, xo, y));
        }
        let mut runs: [Option<Matvec>; 3] = [None; 3];
        let (mut i, mut n_runs) = (0, 0);
        while i < 3 {
            let mut call = self.mv(targets[i].0, self.h, self.aq, self.ad, targets[i].1);
            let mut j = i + 1;
            while j < 3
                && targets[j].0.ty == targets[i].0.ty
                && targets[j].0.repacked_stride == targets[i].0.repacked_stride
            {
                call.w[j - i] = self.d.ptr(&targets[j].0.buf);
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
            [Some(a), Some(b), None] => self.product(&a, Some(&b)),
            _ => runs.iter().flatten().try_for_each(|call| self.product(call, None)),
        }
    }

    /// The q/k/v and attention arguments of span `si` of layer `li` against
    /// the caches of `slot` (slot 0's for the batched kernel, which adds
    /// each token's slot itself): the rows of q/k/v/attn (and of attn's q8
    /// copy) from the span's start.
    fn attn_args(&self, li: usize, l: &DevLayer, si: usize, slot: usize) -> Result<(QkvArgs, AttnArgs)> {
        let (d, b) = (self.d, self.b);
        let s = &self.pass.spans[si];
        let (kc, vc) = self.pool.slot_ptrs(li, slot);
        let (kl, vl) = self.pool.layouts(li);
        let (q_dim, kv_dim) = (l.n_head * l.hd, l.n_kv * l.hd);
        let wo_q8 = ops::wants_q8(l.wo.ty)?;
        let row = |base: DevPtr, bytes: usize| base + (s.start * bytes) as u64;
        let opt = |s: &Option<CudaSlice<f32>>| s.as_ref().map_or(0, |s| d.ptr(s));
        let qkv = QkvArgs {
            q: row(self.p(&b.q), q_dim * 4),
            k: row(self.p(&b.k), kv_dim * 4),
            v: row(self.p(&b.v), kv_dim * 4),
            bq: opt(&l.bq),
            bk: opt(&l.bk),
            bv: opt(&l.bv),
            qn_w: l.q_norm.as_ref().map_or(0, |nn| d.ptr(&nn.w)),
            kn_w: l.k_norm.as_ref().map_or(0, |nn| d.ptr(&nn.w)),
            kc,
            vc,
            pos0: self.param(self.at.pos(si)),
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
            ..Default::default()
        };
        let qkv = CacheLayout::qkv_args(kl, vl, qkv);
        let attn = AttnArgs {
            q: qkv.q,
            kc,
            vc,
            part_o: self.p(&b.part_o),
            part_ml: self.p(&b.part_ml),
            out: row(self.p(&b.attn), q_dim * 4),
            oq: if wo_q8 { row(self.aq, q_dim) } else { 0 },
            ods: if wo_q8 { row(self.ad, q_dim / 32 * 8) } else { 0 },
            pos0: qkv.pos0,
            n_head: l.n_head as i32,
            n_kv: l.n_kv as i32,
            hd: l.hd as i32,
            n_split: b.n_split as i32,
            window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
            n_tok: s.len as i32,
            scale: l.scale,
            softcap: l.softcap.unwrap_or(0.0),
            ..Default::default()
        };
        let attn = CacheLayout::attn_args(kl, vl, attn);
        Ok((qkv, attn))
    }

    /// The q/k/v post-processing, KV append and attention of layer `li`,
    /// per span against the span's slot, except that a run of one-token
    /// spans (decode steps of different sequences) is one launch of up to
    /// `DECODE_BATCH_MAX` tokens where the shape has the batched kernel. A
    /// layer with a TurboQuant cache runs every span apart
    /// ([`ops::qkv_attention_tq`]).
    fn attention(&self, li: usize, l: &DevLayer) -> Result<()> {
        let (d, spans) = (self.d, &self.pass.spans);
        let count = d.ptr(&self.b.attn_count);
        let first = match spans.first() {
            Some(_) => Some(self.attn_args(li, l, 0, 0)?.1),
            None => None,
        };
        if first.is_some_and(|a| ops::has_tq(&a)) {
            for (si, s) in spans.iter().enumerate() {
                let (qkv, attn) = self.attn_args(li, l, si, s.slot)?;
                ops::qkv_attention_tq(d, &qkv, &attn, s.slot, count)?;
            }
            return Ok(());
        }
        let batchable = first.is_some_and(|a| ops::has_decode_batch(d, &a));
        let flat = attn_flat(d, l, self.pool.n_split, self.pass);
        let mut si = 0;
        while si < spans.len() {
            let run = spans[si..].iter().take_while(|s| s.len == 1).count().min(ops::DECODE_BATCH_MAX);
            if run >= 2 && batchable {
                let (qkv, attn) = self.attn_args(li, l, si, 0)?;
                let slots = self.param(self.at.slot(si));
                ops::qkv_attention_batch(d, &qkv, &attn, count, slots, self.pool.slot_strides(li), run, flat)?;
                si += run;
                continue;
            }
            let (qkv, attn) = self.attn_args(li, l, si, spans[si].slot)?;
            ops::qkv_attention(d, &qkv, &attn, count, flat)?;
            si += 1;
        }
        Ok(())
    }

    /// The attention output projection into `o`.
    fn attn_output(&self, l: &DevLayer) -> Result<()> {
        let attn = self.p(&self.b.attn);
        if self.tensor() {
            self.mm(&l.wo, self.operand(attn, l.wo.cols)?, self.o)
        } else {
            ops::matvec(self.d, &self.mv(&l.wo, attn, self.aq, self.ad, self.o))
        }
    }

    /// The residual add of the attention output and the FFN norm.
    fn ffn_norm(&self, l: &DevLayer) -> Result<()> {
        let na = self.norm_args(self.cur, self.o, l.post_attn_norm.as_ref(), &l.ffn_norm);
        ops::residual_norm(self.d, &na, self.n)
    }

    /// Gate/up (or up) and the activation into `act`; whether the gate/up
    /// product also wrote the q8 copy for ffn_down (one token).
    fn ffn_up(&self, l: &DevLayer) -> Result<bool> {
        let (d, b, n, h) = (self.d, self.b, self.n, self.h);
        let (aq, ad) = (self.aq, self.ad);
        let n_ff = l.up.rows;
        let act = self.p(&b.act);
        match &l.gate {
            Some(g) if l.gated && self.tensor() => {
                let xo = self.operand(h, self.e)?;
                self.mm(g, xo, self.p(&b.gate))?;
                self.mm(&l.up, xo, self.p(&b.up))?;
                ops::glu(d, self.p(&b.gate), self.p(&b.up), act, n * n_ff, l.gelu)?;
            }
            _ if self.tensor() => {
                self.mm(&l.up, self.operand(h, self.e)?, act)?;
                ops::act_inplace(d, act, n * n_ff, l.gelu)?;
            }
            Some(g) if l.gated && g.ty == l.up.ty && g.repacked_stride == l.up.repacked_stride => {
                let mut call = self.mv(g, h, aq, ad, act);
                call.w[1] = d.ptr(&l.up.buf);
                call.mode = if l.gelu { MvMode::GluGelu } else { MvMode::GluSilu };
                // One token: the q8 copy of the output for ffn_down is
                // written by the product itself when it can.
                if n == 1 && ops::wants_q8(l.down.ty)? && ops::can_glu_q8(d, &call) {
                    ops::matvec_glu_q8(d, &call, d.ptr(&b.glu_q), d.ptr(&b.glu_ds), d.ptr(&b.glu_count))?;
                    return Ok(true);
                }
                ops::matvec(d, &call)?;
            }
            Some(g) if l.gated => {
                ops::matvec(d, &self.mv(g, h, aq, ad, self.p(&b.gate)))?;
                ops::matvec(d, &self.mv(&l.up, h, aq, ad, self.p(&b.up)))?;
                ops::glu(d, self.p(&b.gate), self.p(&b.up), act, n * n_ff, l.gelu)?;
            }
            _ => {
                ops::matvec(d, &self.mv(&l.up, h, aq, ad, act))?;
                ops::act_inplace(d, act, n * n_ff, l.gelu)?;
            }
        }
        Ok(false)
    }

    /// ffn_down into `o` (`act_q8`: the q8 copy of `act` is in the GLU
    /// buffers already).
    fn ffn_down(&self, l: &DevLayer, act_q8: bool) -> Result<()> {
        let (d, b) = (self.d, self.b);
        let act = self.p(&b.act);
        if self.tensor() {
            return self.mm(&l.down, self.operand(act, l.up.rows)?, self.o);
        }
        if ops::wants_q8(l.down.ty)? && !act_q8 {
            ops::quantize_q8(d, act, self.aq, self.ad, self.n * l.up.rows / 32)?;
        }
        let (dq, dd) = if act_q8 { (d.ptr(&b.glu_q), d.ptr(&b.glu_ds)) } else { (self.aq, self.ad) };
        ops::matvec(d, &self.mv(&l.down, act, dq, dd, self.o))
    }

    /// The residual add of the FFN output and the next layer's attention
    /// norm (the output norm after the last layer).
    fn next_norm(&mut self, li: usize, l: &DevLayer) -> Result<()> {
        let next = self.w.layers.get(li + 1).map_or(&self.w.output_norm, |nl| &nl.attn_norm);
        self.norm(self.norm_args(self.cur, self.o, l.post_ffn_norm.as_ref(), next))
    }

    /// The output norm, if still pending, and the vocabulary projection of
    /// the wanted rows: of the last token in place, of others gathered
    /// into consecutive rows first. Whether there were rows to project.
    fn output(&mut self) -> Result<bool> {
        let (d, w, b, n, e) = (self.d, self.w, self.b, self.n, self.e);
        // The output norm runs on its own: the vocabulary product keeps the
        // plain kernel.
        if let Some(na) = self.pending.take() {
            ops::residual_norm(d, &na, n)?;
        }
        let outputs = &self.pass.outputs;
        let n_out = outputs.len();
        if n_out == 0 {
            return Ok(false);
        }
        let (h, aq, ad) = (self.h, self.aq, self.ad);
        let (xf, xq, xd) = if outputs[..] == [n - 1] {
            let last = n - 1;
            (h + (last * e * 4) as u64, aq + (last * e) as u64, ad + (last * (e / 32) * 8) as u64)
        } else {
            let idx = self.param(self.at.outputs());
            let (oh, oq, od) = (self.p(&b.out_h), d.ptr(&b.out_q), self.p(&b.out_d));
            ops::gather_rows(d, h, oh, idx, n_out, e * 4)?;
            if Self::with_q8(e) {
                ops::gather_rows(d, aq, oq, idx, n_out, e)?;
                ops::gather_rows(d, ad, od, idx, n_out, e / 32 * 8)?;
            }
            (oh, oq, od)
        };
        let out = &w.output;
        let layout = (out.ty, out.repacked_stride != 0);
        let logits = self.p(&b.logits);
        if let Some(m) =
            b.mmq.as_ref().filter(|_| ops::mmq_tokens(d, n_out) && ops::mmq_kernel(layout.0, layout.1).is_some())
        {
            let stride = if layout.1 { out.repacked_stride } else { out.ty.row_bytes(e)? };
            let xb = d.ptr(&m.x);
            ops::to_bf16(d, xf, xb, n_out * e)?;
            let part = (d.ptr(&m.part), m.part.len());
            ops::mmq(d, layout, d.ptr(&out.buf), stride, (w.n_vocab, e), xb, n_out, (logits, w.n_vocab), part)?;
            if let Some(c) = w.final_softcap {
                ops::softcap_inplace(d, logits, n_out * w.n_vocab, c)?;
            }
            return Ok(true);
        }
        if let Some(g) = self.gemm.filter(|_| n_out >= d.opts.gemm_min_tokens && ops::has_dequant(layout.0, layout.1)) {
            self.output_gemm(g, xf, n_out)?;
            return Ok(true);
        }
        // Without a q8 copy (rows not of whole chunks) only float weights
        // can run, and they read the f32 rows.
        let mut call = self.mv(out, xf, xq, xd, logits);
        call.n_tok = n_out;
        if let Some(c) = w.final_softcap {
            call.mode = MvMode::Softcap;
            call.cap = c;
        }
        ops::matvec(d, &call)?;
        Ok(true)
    }

    /// The vocabulary product of `n_out` gathered rows `xf` (f32) as
    /// tensor-core GEMMs: the output matrix dequantized a block of rows at
    /// a time into the GEMM scratch (sized for the largest layer matrix),
    /// each block's logits a column block of the `n_out × n_vocab` result;
    /// then the soft-cap, if any. Several dozen rows amortize the
    /// dequantization, where the mat-vec kernels would read the matrix once
    /// per 8 rows.
    fn output_gemm(&self, (prec, wf, xb): Gemm, xf: DevPtr, n_out: usize) -> Result<()> {
        let (d, w) = (self.d, self.w);
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
        let logits = self.p(&self.b.logits);
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

fn missing_scratch() -> Error {
    Error::Device("prefill GEMM scratch missing".into())
}
