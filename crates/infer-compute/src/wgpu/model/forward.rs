//! One pass of a forward step: the scratch it runs in ([`Scratch`]), the
//! per-token inputs written before it (ids, positions, slots, wanted rows),
//! its dispatches recorded in order into one command buffer (the table is
//! in the parent module's documentation) and the wanted logits read back.

use super::{DevLayer, DevNorm, Weights, WgpuModel, PASS_TOKENS};
use crate::backend::{Batch, StepProfile};
use crate::error::{Error, Result};
use crate::wgpu::context::Gpu;
use crate::wgpu::kv_pool::{KvLayout, WgpuKvPool};
use crate::wgpu::kv_tq::span_starts;
use crate::wgpu::model::FfnIn;
use crate::wgpu::shaders::{Kernel, Variant};
use crate::wgpu::step::{Step, P};
use crate::wgpu::weights::{
    binding_limit, fused_glu, record_glu, record_matvec, record_matvec_rows, DevWeight, ProductIo,
};
use crate::KvTypes;

/// Buffers of passes of up to `cap` tokens over pools of up to `n_ctx`
/// positions, allocated once per capacity.
pub(in crate::wgpu) struct Scratch {
    cap: usize,
    n_ctx: usize,
    x: wgpu::Buffer,
    h: wgpu::Buffer,
    o: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    attn: wgpu::Buffer,
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    scores: wgpu::Buffer,
    out_h: wgpu::Buffer,
    logits: wgpu::Buffer,
    ids: wgpu::Buffer,
    pos: wgpu::Buffer,
    slot: wgpu::Buffer,
    /// Per token, the pass index of its span's first token (a TurboQuant
    /// cache's reads and ring: `kv/tq.wgsl`).
    span: wgpu::Buffer,
    out_idx: wgpu::Buffer,
}

/// Passes of at most this many tokens encode the next pass of their shape
/// ahead ([`Ahead`]): decode steps, whose next step is usually the same.
const AHEAD_TOKENS: usize = 8;

/// A pass encoded ahead: the next decode step's command buffer (every
/// dispatch, its bind groups), recorded and encoded on the host while the
/// GPU runs the step before it, so that a steady decode does that host
/// work (about as long as 20% of a llama 1B step on the H200) off the
/// critical path. A pass reads its token ids, positions, slots and wanted
/// rows from buffers written just before its submit, so a step of the same
/// shape ([`AheadKey`]) runs the same commands.
pub(in crate::wgpu) struct Ahead {
    key: AheadKey,
    enc: wgpu::CommandEncoder,
}

/// What the commands of a pass depend on besides the weights and the
/// scratch (whose replacement drops [`Ahead`]): the pool (its first
/// layer's K buffer names it) and its positions per slot, the pass's
/// tokens and wanted rows.
#[derive(PartialEq)]
struct AheadKey {
    pool: Option<wgpu::Buffer>,
    n_ctx: usize,
    n: usize,
    n_out: usize,
}

fn u(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Overflow("a kernel parameter past 32 bits"))
}

impl WgpuModel {
    /// Tokens per pass over a pool of `n_ctx` positions: [`PASS_TOKENS`]
    /// (or the device's `pass_tokens` option, at least 1), fewer where a
    /// scratch buffer would pass one binding.
    fn pass_cap(&self, n_ctx: usize) -> Result<usize> {
        let w = &*self.w;
        let limit = binding_limit(&self.gpu) as usize;
        let per_token =
            [w.max_heads * n_ctx, w.max_ff, w.max_q, w.n_vocab, w.n_embd].into_iter().max().unwrap_or(1) * 4;
        let most = self.gpu.pass_tokens.map_or(PASS_TOKENS, |n| n.clamp(1, PASS_TOKENS));
        let cap = (limit / per_token.max(1)).min(most);
        if cap == 0 {
            return Err(Error::UnsupportedModel(format!(
                "one token's attention scores over {n_ctx} positions exceed the adapter's max_storage_buffer_binding_size of {} bytes",
                self.gpu.caps.max_storage_binding
            )));
        }
        Ok(cap)
    }

    /// Scratch for passes over a pool of `n_ctx` positions (kept when the
    /// current one is large enough).
    fn ensure_scratch(&mut self, n_ctx: usize) -> Result<usize> {
        if let Some(s) = &self.scratch {
            if s.n_ctx >= n_ctx {
                return Ok(s.cap);
            }
        }
        let cap = self.pass_cap(n_ctx)?;
        self.scratch = None;
        self.ahead = None;
        let g = &*self.gpu;
        let w = &*self.w;
        let f = |what: &str, n: usize| g.storage(what, (cap * n * 4) as u64);
        self.scratch = Some(Scratch {
            cap,
            n_ctx,
            x: f("x", w.n_embd)?,
            h: f("h", w.n_embd)?,
            o: f("o", w.n_embd)?,
            q: f("q", w.max_q)?,
            k: f("k", w.max_kv)?,
            v: f("v", w.max_kv)?,
            attn: f("attn", w.max_q)?,
            gate: f("gate", w.max_ff)?,
            up: f("up", w.max_ff)?,
            scores: f("scores", w.max_heads * n_ctx)?,
            out_h: f("out_h", w.n_embd)?,
            logits: f("logits", w.n_vocab)?,
            ids: f("ids", 1)?,
            pos: f("pos", 1)?,
            slot: f("slot", 1)?,
            span: f("span", 1)?,
            out_idx: f("out_idx", 1)?,
        });
        Ok(cap)
    }

    /// The passes of a checked step; the wanted rows' logits land in
    /// `self.logits`. Returns their count.
    pub(super) fn run_passes(
        &mut self,
        pool: &WgpuKvPool,
        batch: &Batch,
        mut prof: Option<&mut StepProfile>,
    ) -> Result<usize> {
        let nv = self.w.n_vocab;
        let n_out = batch.n_outputs();
        let total = n_out.checked_mul(nv).ok_or(Error::Overflow("logits size"))?;
        if self.logits.len() < total {
            self.logits
                .try_reserve_exact(total - self.logits.len())
                .map_err(|_| Error::OutOfMemory { what: "the step's logits".into(), bytes: total as u64 * 4 })?;
            self.logits.resize(total, 0.0);
        }
        let cap = self.ensure_scratch(pool.n_ctx)?;
        let wanted = batch.wants_logits();
        let mut row = 0;
        for start in (0..batch.len()).step_by(cap) {
            let end = (start + cap).min(batch.len());
            let outputs: Vec<u32> = (start..end).filter(|&i| wanted[i]).map(|i| (i - start) as u32).collect();
            self.write_inputs(batch, start..end, &outputs)?;
            let gpu = self.gpu.clone();
            let s = self.scratch.as_ref().ok_or_else(|| Error::Device("scratch missing".into()))?;
            let (n, n_out) = (end - start, outputs.len());
            let key = AheadKey { pool: pool.k.first().cloned(), n_ctx: pool.n_ctx, n, n_out };
            let ahead = self.ahead.take().filter(|a| a.key == key && prof.is_none());
            let enc = match (ahead, prof.as_deref_mut()) {
                (Some(a), _) => a.enc,
                (None, Some(p)) => profile_step(&gpu, record(&self.w, s, &gpu, pool, n, n_out)?, p)?,
                (None, None) => record(&self.w, s, &gpu, pool, n, n_out)?.encode_cached(&mut self.binds)?,
            };
            let encode_next = prof.is_none() && batch.len() <= cap && n <= AHEAD_TOKENS;
            let (w, binds, next) = (&self.w, &mut self.binds, &mut self.ahead);
            let dst = &mut self.logits[row * nv..(row + n_out) * nv];
            gpu.scoped("forward pass", || {
                gpu.read_back_during(enc, &s.logits, 0, dst, || {
                    // A guess: its failure (the next step would meet the
                    // same error) must not fail this step.
                    if encode_next {
                        let enc = record(w, s, &gpu, pool, n, n_out).and_then(|st| st.encode_cached(binds));
                        *next = enc.ok().map(|enc| Ahead { key, enc });
                    }
                    Ok(())
                })
            })?;
            row += n_out;
        }
        Ok(n_out)
    }

    /// Writes the pass's token ids, positions, slots and wanted rows.
    fn write_inputs(&self, batch: &Batch, range: std::ops::Range<usize>, outputs: &[u32]) -> Result<()> {
        let s = self.scratch.as_ref().ok_or_else(|| Error::Device("scratch missing".into()))?;
        let q = &self.gpu.queue;
        let pos: Vec<u32> = batch.positions()[range.clone()].iter().map(|&p| u(p)).collect::<Result<_>>()?;
        let slot: Vec<u32> = batch.slots()[range.clone()].iter().map(|&p| u(p)).collect::<Result<_>>()?;
        q.write_buffer(&s.ids, 0, bytemuck::cast_slice(&batch.tokens()[range]));
        q.write_buffer(&s.pos, 0, bytemuck::cast_slice(&pos));
        q.write_buffer(&s.slot, 0, bytemuck::cast_slice(&slot));
        q.write_buffer(&s.span, 0, bytemuck::cast_slice(&span_starts(&pos, &slot)));
        if !outputs.is_empty() {
            q.write_buffer(&s.out_idx, 0, bytemuck::cast_slice(outputs));
        }
        Ok(())
    }
}

/// Records the pass of `n` tokens with `n_out` wanted rows of model `w`
/// in scratch `s`.
fn record<'g>(w: &Weights, s: &Scratch, gpu: &'g Gpu, pool: &WgpuKvPool, n: usize, n_out: usize) -> Result<Step<'g>> {
    let mut st = Step::new(gpu);
    let (e, nt) = (w.n_embd, u(n)?);
    record_embed(&mut st, w, s, nt)?;
    let first = w.layers.first().map_or(&w.output_norm, |l| &l.attn_norm);
    record_norm(&mut st, s, e, nt, None, None, first)?;
    for (li, l) in w.layers.iter().enumerate() {
        record_attention(&mut st, l, li, s, pool, n)?;
        record_norm(&mut st, s, e, nt, Some(&s.o), l.post_attn_norm.as_ref(), &l.ffn_norm)?;
        record_ffn(&mut st, l, s, e, n)?;
        let next = w.layers.get(li + 1).map_or(&w.output_norm, |nl| &nl.attn_norm);
        record_norm(&mut st, s, e, nt, Some(&s.o), l.post_ffn_norm.as_ref(), next)?;
    }
    if n_out > 0 {
        let [gx, gy] = st.grid((n_out * e).div_ceil(64));
        let params = [P::U(u(n_out * e)?), P::U(0), P::U(u(e)?)];
        st.dispatch(
            Kernel::Gather,
            Variant::Plain,
            &[(0, &s.h), (1, &s.out_h), (2, &s.out_idx)],
            3,
            &params,
            [gx, gy, 1],
        )?;
        record_mv(&mut st, &w.output, &s.out_h, &s.logits, n_out, w.final_softcap)?;
    }
    Ok(st)
}

/// Records `y = m · x` over `n_tok` rows (a logit softcap `cap` when not 0).
fn record_mv(
    st: &mut Step<'_>,
    m: &DevWeight,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n_tok: usize,
    cap: f32,
) -> Result<()> {
    let io = ProductIo { x, x_off: 0, x_stride: m.cols, n_tok, y, y_off: 0, y_stride: m.rows, cap };
    record_matvec(st, m, io)
}

/// Records the embedding lookup of the pass's `nt` tokens into `s.x`, one
/// dispatch per row block of the matrix.
fn record_embed(st: &mut Step<'_>, w: &Weights, s: &Scratch, nt: u32) -> Result<()> {
    let e = w.n_embd;
    for part in &w.token_embd.parts {
        let params = [
            P::U(u(e)?),
            P::U(u(w.token_embd.row_bytes)?),
            P::F(w.embd_scale),
            P::U(u(part.row0)?),
            P::U(u(part.rows)?),
        ];
        st.dispatch(
            Kernel::Embed,
            Variant::Weight(w.token_embd.ty),
            &[(0, &part.buf), (1, &s.ids), (2, &s.x)],
            3,
            &params,
            [nt, 1, 1],
        )?;
    }
    Ok(())
}

/// Records layer `li`'s attention over `n` tokens from `s.h`: the q, k and
/// v products, RoPE with the KV append, the TurboQuant coding where a
/// cache is one, the attention and the output product into `s.o`.
fn record_attention(
    st: &mut Step<'_>,
    l: &DevLayer,
    li: usize,
    s: &Scratch,
    pool: &WgpuKvPool,
    n: usize,
) -> Result<()> {
    let nt = u(n)?;
    let gpu: &Gpu = st.gpu;
    record_mv(st, &l.wq, &s.h, &s.q, n, 0.0)?;
    record_mv(st, &l.wk, &s.h, &s.k, n, 0.0)?;
    record_mv(st, &l.wv, &s.h, &s.v, n, 0.0)?;
    // The layer's K and V layouts, and the kernels composed for them.
    let (kl, vl) = pool.layouts[li];
    let kv = Variant::Kv(KvTypes { k: kl.ty, v: vl.ty });
    let flags = l.bias.is_some() as u32 | (l.q_norm.is_some() as u32) << 1 | (l.k_norm.is_some() as u32) << 2;
    let dummy = &gpu.dummy;
    let rope = [
        P::U(u(l.n_head)?),
        P::U(u(l.n_kv)?),
        P::U(u(l.hd)?),
        P::U(u(l.n_rot)?),
        P::U(l.neox as u32),
        P::U(u(pool.n_ctx)?),
        P::U(flags),
        P::F(l.theta_scale),
        P::F(l.freq_scale),
        P::F(l.q_norm.as_ref().map_or(0.0, |n| n.eps)),
        P::F(l.k_norm.as_ref().map_or(0.0, |n| n.eps)),
        P::U(u(kl.row_words)?),
        P::U(u(vl.row_words)?),
        P::U(u(kl.rot)?),
        P::U(u(vl.rot)?),
        P::F(kl.rot_scale),
        P::F(vl.rot_scale),
    ];
    let bufs = [
        (0, &s.q),
        (1, &s.k),
        (2, &s.v),
        (3, l.bias.as_ref().unwrap_or(dummy)),
        (4, l.q_norm.as_ref().map_or(dummy, |n| &n.w)),
        (5, l.k_norm.as_ref().map_or(dummy, |n| &n.w)),
        (6, &pool.k[li]),
        (7, &pool.v[li]),
        (8, &s.pos),
        (9, &s.slot),
    ];
    st.dispatch(Kernel::Rope, kv, &bufs, 10, &rope, [u(l.n_head + 2 * l.n_kv)?, nt, 1])?;
    let caches = [(kl, &pool.k[li], &s.k), (vl, &pool.v[li], &s.v)];
    record_tq(st, s, &caches, nt, l.n_kv, false)?;
    let attn = [
        P::U(u(l.n_head)?),
        P::U(u(l.n_kv)?),
        P::U(u(l.hd)?),
        P::U(u(pool.n_ctx)?),
        P::U(l.window),
        P::F(l.scale),
        P::F(l.softcap),
        P::U(u(kl.row_words)?),
        P::U(u(vl.row_words)?),
        P::U(u(vl.rot)?),
        P::F(vl.rot_scale),
    ];
    let mut bufs =
        vec![(0, &s.q), (1, &pool.k[li]), (2, &pool.v[li]), (3, &s.scores), (4, &s.attn), (5, &s.pos), (6, &s.slot)];
    // The pass's rows, bound where a TurboQuant cache reads them.
    if kl.tq.is_some() {
        bufs.push((8, &s.k));
    }
    if vl.tq.is_some() {
        bufs.push((9, &s.v));
    }
    if kl.tq.is_some() || vl.tq.is_some() {
        bufs.push((10, &s.span));
    }
    st.dispatch(Kernel::Attention, kv, &bufs, 7, &attn, [u(l.n_head)?, nt, 1])?;
    record_tq(st, s, &caches, nt, l.n_kv, true)?;
    record_mv(st, &l.wo, &s.attn, &s.o, n, 0.0)?;
    Ok(())
}

/// Records layer `l`'s feed-forward over `n` tokens from `s.h` into `s.o`
/// (`e`: n_embd).
fn record_ffn(st: &mut Step<'_>, l: &DevLayer, s: &Scratch, e: usize, n: usize) -> Result<()> {
    let n_ff = l.down.cols;
    let ew = |st: &mut Step<'_>, k: Kernel, bufs: &[(u32, &wgpu::Buffer)]| {
        let [gx, gy] = st.grid((n * n_ff).div_ceil(64));
        st.dispatch(k, Variant::Plain, bufs, 3, &[P::U(u(n * n_ff)?), P::U(l.gelu as u32), P::U(0)], [gx, gy, 1])
    };
    let io = |y| ProductIo { x: &s.h, x_off: 0, x_stride: e, n_tok: n, y, y_off: 0, y_stride: n_ff, cap: 0.0 };
    match &l.ffn_in {
        FfnIn::Stacked { w: gu, n_ff } if fused_glu(gu, n) => record_glu(st, gu, *n_ff, l.gelu, io(&s.up))?,
        FfnIn::Stacked { w: gu, n_ff } => {
            record_matvec_rows(st, gu, 0..*n_ff, io(&s.gate))?;
            record_matvec_rows(st, gu, *n_ff..2 * n_ff, io(&s.up))?;
            ew(st, Kernel::Glu, &[(0, &s.gate), (1, &s.up)])?;
        }
        FfnIn::Apart { gate: Some(g), up } => {
            record_mv(st, up, &s.h, &s.up, n, 0.0)?;
            record_mv(st, g, &s.h, &s.gate, n, 0.0)?;
            ew(st, Kernel::Glu, &[(0, &s.gate), (1, &s.up)])?;
        }
        FfnIn::Apart { gate: None, up } => {
            record_mv(st, up, &s.h, &s.up, n, 0.0)?;
            ew(st, Kernel::Act, &[(1, &s.up)])?;
        }
    }
    record_mv(st, &l.down, &s.up, &s.o, n, 0.0)?;
    Ok(())
}

/// Records the kernels of a layer's TurboQuant caches (`tq_cache.wgsl`)
/// over a pass of `nt` tokens of `n_kv` heads: before attention (`keep`
/// false) each one's centres, then its codes; after attention, its ring.
/// `caches`: each cache's layout, buffer and the pass's rows of it (`s.k`,
/// `s.v`, in the cache's basis since `rope`); the others are skipped.
fn record_tq(
    st: &mut Step<'_>,
    s: &Scratch,
    caches: &[(KvLayout, &wgpu::Buffer, &wgpu::Buffer)],
    nt: u32,
    n_kv: usize,
    keep: bool,
) -> Result<()> {
    let tok = [(2, &s.pos), (3, &s.slot), (4, &s.span)];
    for &(l, cache, rows) in caches.iter().filter(|(l, ..)| l.tq.is_some()) {
        let (v, p, grid) = (Variant::Tq(l.ty), [P::U(nt)], [u(n_kv)?, nt, 1]);
        if keep {
            st.dispatch(Kernel::TqKeep, v, &[(0, cache), (1, rows), tok[0], tok[1], tok[2]], 5, &p, grid)?;
        } else {
            st.dispatch(Kernel::TqCentre, v, &[(0, cache), tok[0], tok[1]], 5, &p, [nt, 1, 1])?;
            st.dispatch(Kernel::TqEncode, v, &[(0, cache), (1, rows), tok[0], tok[1]], 5, &p, grid)?;
        }
    }
    Ok(())
}

/// Records `x += add_norm(add)` (when `add`), then `h = norm(x)`, over
/// rows of `n_embd` values.
#[allow(clippy::too_many_arguments)]
fn record_norm(
    st: &mut Step<'_>,
    s: &Scratch,
    n_embd: usize,
    nt: u32,
    add: Option<&wgpu::Buffer>,
    add_norm: Option<&DevNorm>,
    norm: &DevNorm,
) -> Result<()> {
    let gpu: &Gpu = st.gpu;
    let dummy = &gpu.dummy;
    let params = [
        P::U(u(n_embd)?),
        P::U(add.is_some() as u32),
        P::U(add_norm.is_some() as u32),
        P::U(norm.layer_norm as u32),
        P::U(norm.b.is_some() as u32),
        P::F(norm.eps),
        P::F(add_norm.map_or(0.0, |n| n.eps)),
    ];
    let bufs = [
        (0, &s.x),
        (1, add.unwrap_or(dummy)),
        (2, add_norm.map_or(dummy, |n| &n.w)),
        (3, &norm.w),
        (4, norm.b.as_ref().unwrap_or(dummy)),
        (5, &s.h),
    ];
    st.dispatch(Kernel::ResidualNorm, Variant::Plain, &bufs, 6, &params, [nt, 1, 1])
}

/// Times each dispatch of `step` and adds it to `prof` under its tag: on
/// the device's clock (timestamp queries around each dispatch, all in one
/// submit) where the adapter has them, else by the wall time of submitting
/// each alone and waiting for it. Returns an empty encoder for the read-back.
fn profile_step(gpu: &Gpu, step: Step<'_>, prof: &mut StepProfile) -> Result<wgpu::CommandEncoder> {
    let queries = 2 * step.len();
    if gpu.caps.timestamps && !step.is_empty() && queries <= wgpu::QUERY_SET_MAX_QUERIES as usize {
        return profile_timed(gpu, step, prof, queries as u32);
    }
    for (tag, cb) in step.encode_each()? {
        let t0 = std::time::Instant::now();
        gpu.queue.submit([cb]);
        gpu.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for {}: {e}", tag.op)))?;
        prof.record(&tag.op, &tag.ty, &tag.shape, t0.elapsed(), tag.bytes);
    }
    Ok(gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("read-back") }))
}

/// [`profile_step`] by timestamp queries (`n` of them, two per dispatch).
fn profile_timed(gpu: &Gpu, step: Step<'_>, prof: &mut StepProfile, n: u32) -> Result<wgpu::CommandEncoder> {
    let (queries, resolved) = gpu.scoped("profile timestamp queries", || {
        let q = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: n,
        });
        let b = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile timestamps"),
            size: 8 * u64::from(n),
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok((q, b))
    })?;
    let (tags, mut enc) = step.encode_timed(&queries)?;
    enc.resolve_query_set(&queries, 0..n, &resolved, 0);
    let mut ticks = vec![0u64; n as usize];
    gpu.read_back(enc, &resolved, 0, &mut ticks)?;
    // Nanoseconds per tick.
    let period = f64::from(gpu.queue.get_timestamp_period());
    for (tag, t) in tags.iter().zip(ticks.chunks_exact(2)) {
        let ns = (t[1].saturating_sub(t[0]) as f64 * period).round() as u64;
        prof.record(&tag.op, &tag.ty, &tag.shape, std::time::Duration::from_nanos(ns), tag.bytes);
    }
    Ok(gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("read-back") }))
}
