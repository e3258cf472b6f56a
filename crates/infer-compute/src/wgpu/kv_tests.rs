//! The KV cache as the device writes it, against the CPU bit for bit: the
//! `rope` kernel (no RoPE, bias or norms, so that its heads are its
//! inputs) stores q8_0, q4_0 and f32 rows, and the codes and scales it
//! writes are those of the CPU's rotation (`cpu::kv_rotation`) and ggml's
//! reference quantizers (`quant::quantize_row`) for the same f32 values;
//! the queries come back rotated as the CPU rotates them. Blocks of
//! awkward values (rounding ties, q4_0's truncation boundaries, equal
//! magnitudes of two signs, scales past f16's range, infinities, zeros)
//! are stored unrotated (head_dim 96); a block holding a NaN must get a
//! NaN scale. TurboQuant caches (tq3, tq4) against the CPU's scheme: exact
//! rows, centres and recent rows bit for bit, codes up to rare index
//! differences (`turboquant_cache_rows_are_the_cpus`). Needs an adapter:
//! without one the test says so and passes, unless `INFER_REQUIRE_WGPU=1`.

use std::sync::Arc;

use half::f16;

use super::context::{Gpu, Options};
use super::kv_pool::{KvLayout, WgpuKvPool};
use super::kv_tq::span_starts;
use super::shaders::{Kernel, Variant};
use super::step::{Step, P};
use crate::backend::{KvPool, ModelId};
use crate::cpu::kv_cache::{round_f16, KvBuf};
use crate::cpu::kv_rotation::KvRotation;
use crate::kv_type::{TQ_CENTRE_FROM, TQ_EXACT_POSITIONS, TQ_REFINE_PASSES};
use crate::turboquant::TqLayout;
use crate::turboquant::TurboQuant;
use crate::{quant, KvCacheType, KvTypes};

fn gpu() -> Option<Gpu> {
    match Gpu::open(Options::default()) {
        Ok(g) => Some(g),
        Err(e) if std::env::var("INFER_REQUIRE_WGPU").as_deref() == Ok("1") => panic!("INFER_REQUIRE_WGPU=1: {e}"),
        Err(e) => {
            eprintln!("no wgpu adapter, KV store test skipped: {e}");
            None
        }
    }
}

/// A small deterministic generator (SplitMix64) of values of about `scale`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn value(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// Block `kind` of 32 values (kinds past the special ones: random).
fn block(kind: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..32).map(|_| rng.value(1.0)).collect();
    match kind {
        // q8_0 ties: with amax 127, d = 1 and codes round k + 0.5 away from zero.
        0 => x.iter_mut().enumerate().for_each(|(i, v)| *v = if i == 0 { 127.0 } else { i as f32 - 16.5 }),
        // q4_0 boundaries: max −8 first (then +8), d = 1, values at and
        // around k − 8.5, where x + 8.5 rounds to an integer or not.
        1 => {
            for (i, v) in x.iter_mut().enumerate() {
                let eps = [0.0, -(2f32.powi(-22)), 2f32.powi(-22), -(2f32.powi(-21)), -(2f32.powi(-20))][i % 5];
                *v = ((i % 16) as f32 - 8.5 + eps).clamp(-7.99, 7.99);
            }
            x[0] = -8.0;
            x[9] = 8.0;
            x[20] = 0.2;
        }
        2 => x.fill(0.0),
        // Equal magnitudes of two signs: the first is q4_0's max.
        3 => {
            x[4] = 3.0;
            x[11] = -3.0;
        }
        // Scales past f16's range: an infinite stored scale, finite codes.
        4 => x.iter_mut().for_each(|v| *v *= 1.0e7),
        5 => x[7] = f32::INFINITY,
        6 => x.iter_mut().for_each(|v| *v *= 1.0e-3),
        7 => x.iter_mut().for_each(|v| *v *= 300.0),
        _ => {}
    }
    x
}

/// One row of `kv_dim` values: random blocks, or the special ones in turn
/// from `first`.
fn row(kv_dim: usize, special: Option<usize>, rng: &mut Rng) -> Vec<f32> {
    (0..kv_dim / 32).flat_map(|b| block(special.map_or(usize::MAX, |f| f + b), rng)).collect()
}

/// The device's value of block `b` of head `g` of a row (`words`) of type
/// `ty`: its codes' bytes and its scale's f16 bits.
fn device_block(ty: KvCacheType, words: &[u32], kv_dim: usize, hd: usize, g: usize, b: usize) -> (Vec<u8>, u16) {
    let bytes: &[u8] = bytemuck::cast_slice(words);
    let global = g * hd / 32 + b;
    let (codes, per) = match ty {
        KvCacheType::Q8_0 => (kv_dim, 32),
        _ => (kv_dim / 2, 16),
    };
    let s = codes + 4 * g * hd.div_ceil(64) + 2 * b;
    (bytes[global * per..(global + 1) * per].to_vec(), u16::from_le_bytes([bytes[s], bytes[s + 1]]))
}

/// Checks the stored row `words` of type `ty` against the CPU's storage of
/// `x` (already rotated).
fn check_row(what: &str, ty: KvCacheType, words: &[u32], x: &[f32], n_kv: usize, hd: usize) {
    let kv_dim = n_kv * hd;
    if ty == KvCacheType::F32 {
        let got: Vec<u32> = words[..kv_dim].to_vec();
        let want: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{what}: f32 row");
        return;
    }
    let g_ty = ty.ggml_type().unwrap();
    let mut cpu = vec![0u8; g_ty.row_bytes(kv_dim).unwrap()];
    quant::quantize_row(g_ty, x, &mut cpu).unwrap();
    let per = g_ty.type_size();
    for g in 0..n_kv {
        for b in 0..hd / 32 {
            let (codes, scale) = device_block(ty, words, kv_dim, hd, g, b);
            let at = g * hd / 32 + b;
            let xb = &x[at * 32..(at + 1) * 32];
            if xb.iter().any(|v| v.is_nan()) {
                assert_eq!(scale, 0x7e00, "{what}: head {g} block {b} holds a NaN");
                continue;
            }
            let want = &cpu[at * per..(at + 1) * per];
            assert_eq!(scale, u16::from_le_bytes([want[0], want[1]]), "{what}: head {g} block {b} scale, {xb:?}");
            assert_eq!(codes, want[2..], "{what}: head {g} block {b} codes, {xb:?}");
        }
    }
}

/// Runs `rope` over `n_tok` tokens of one q head and `n_kv` k and v heads
/// of `hd` values into a pool of `types`, and checks every stored row and
/// the rotated queries against the CPU.
fn check(gpu: &Gpu, types: KvTypes, n_kv: usize, hd: usize, special: bool, seed: u64) {
    let what = format!("{types}, {n_kv} heads of {hd}");
    let (n_slots, n_ctx) = (2usize, 4usize);
    // (slot, position) of each token.
    let toks = [(0usize, 0usize), (1, 3), (0, 2)];
    let kv_dim = n_kv * hd;
    let mut rng = Rng(seed);
    let q: Vec<f32> = toks.iter().flat_map(|_| row(hd, None, &mut rng)).collect();
    let k: Vec<f32> = toks.iter().enumerate().flat_map(|(t, _)| row(kv_dim, special.then_some(t), &mut rng)).collect();
    let mut v: Vec<f32> =
        toks.iter().enumerate().flat_map(|(t, _)| row(kv_dim, special.then_some(t + 3), &mut rng)).collect();
    if special {
        v[kv_dim + 40] = f32::NAN;
    }
    let (kl, vl) = (KvLayout::new(types.k, n_kv, hd, true).unwrap(), KvLayout::new(types.v, n_kv, hd, false).unwrap());
    let cache = |l: &KvLayout| gpu.storage("cache", (n_slots * n_ctx * l.row_bytes()) as u64).unwrap();
    let (kc, vc) = (cache(&kl), cache(&vl));
    let (qb, kb, vb) =
        (gpu.upload_f32("q", &q).unwrap(), gpu.upload_f32("k", &k).unwrap(), gpu.upload_f32("v", &v).unwrap());
    let pos: Vec<u32> = toks.iter().map(|&(_, p)| p as u32).collect();
    let slot: Vec<u32> = toks.iter().map(|&(s, _)| s as u32).collect();
    let (pb, sb) = (
        gpu.upload("pos", bytemuck::cast_slice(&pos)).unwrap(),
        gpu.upload("slot", bytemuck::cast_slice(&slot)).unwrap(),
    );
    let params = rope_params(n_kv, hd, n_ctx, &kl, &vl);
    let d = &gpu.dummy;
    let bufs = [(0, &qb), (1, &kb), (2, &vb), (3, d), (4, d), (5, d), (6, &kc), (7, &vc), (8, &pb), (9, &sb)];
    let mut st = Step::new(gpu);
    st.dispatch(Kernel::Rope, Variant::Kv(types), &bufs, 10, &params, [1 + 2 * n_kv as u32, toks.len() as u32, 1])
        .unwrap();
    let back = |enc, buf: &wgpu::Buffer, n: usize| {
        let mut out = vec![0u32; n];
        gpu.read_back(enc, buf, 0, &mut out).unwrap();
        out
    };
    let empty = || gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    let kw = back(st.encode().unwrap(), &kc, n_slots * n_ctx * kl.row_words);
    let vw = back(empty(), &vc, n_slots * n_ctx * vl.row_words);
    let qw = back(empty(), &qb, q.len());

    let (kr, vr) = (KvRotation::for_keys(types.k, hd, None), KvRotation::for_values(types.v, hd, None));
    assert_eq!(kr.is_some(), kl.rot > 0);
    assert_eq!(vr.is_some(), vl.rot > 0);
    let mut q_rot = q.clone();
    if let Some(r) = &kr {
        r.rotate(&mut q_rot);
    }
    assert_eq!(qw, q_rot.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{what}: rotated queries");
    for (t, &(s, p)) in toks.iter().enumerate() {
        let at = s * n_ctx + p;
        for (name, x, rot, l, words) in [("K", &k, &kr, &kl, &kw), ("V", &v, &vr, &vl, &vw)] {
            let mut x = x[t * kv_dim..(t + 1) * kv_dim].to_vec();
            if let Some(r) = rot {
                r.rotate(&mut x);
            }
            let row = &words[at * l.row_words..(at + 1) * l.row_words];
            check_row(&format!("{what}: {name} of token {t}"), l.ty, row, &x, n_kv, hd);
        }
    }
    // Rows no token wrote stay zero.
    let written: Vec<usize> = toks.iter().map(|&(s, p)| s * n_ctx + p).collect();
    for (words, l) in [(&kw, &kl), (&vw, &vl)] {
        for r in (0..n_slots * n_ctx).filter(|r| !written.contains(r)) {
            assert!(words[r * l.row_words..(r + 1) * l.row_words].iter().all(|&w| w == 0), "{what}: row {r} written");
        }
    }
}

#[test]
fn quantized_cache_rows_are_the_cpus_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let gpu = Arc::new(gpu);
    use KvCacheType as T;
    for (i, types) in [
        KvTypes { k: T::Q8_0, v: T::Q4_0 },
        KvTypes { k: T::Q4_0, v: T::Q8_0 },
        KvTypes { k: T::F32, v: T::Q8_0 },
        KvTypes { k: T::Q4_0, v: T::F32 },
    ]
    .into_iter()
    .enumerate()
    {
        // Unrotated with the special blocks (and an odd number of blocks
        // per head), then rotated by blocks of 64, 128 and 256.
        check(&gpu, types, 2, 96, true, 10 + i as u64);
        check(&gpu, types, 1, 32, true, 20 + i as u64);
        check(&gpu, types, 3, 64, false, 30 + i as u64);
        check(&gpu, types, 2, 128, false, 40 + i as u64);
        check(&gpu, types, 1, 256, false, 50 + i as u64);
    }
}

/// The parameters of a `rope` dispatch that only appends K/V rows (one
/// query head, no RoPE, bias or norms) to caches of `n_ctx` positions of
/// layouts `kl`, `vl`.
fn rope_params(n_kv: usize, hd: usize, n_ctx: usize, kl: &KvLayout, vl: &KvLayout) -> [P; 17] {
    [
        P::U(1),
        P::U(n_kv as u32),
        P::U(hd as u32),
        P::U(0),
        P::U(0),
        P::U(n_ctx as u32),
        P::U(0),
        P::F(1.0),
        P::F(1.0),
        P::F(0.0),
        P::F(0.0),
        P::U(kl.row_words as u32),
        P::U(vl.row_words as u32),
        P::U(kl.rot as u32),
        P::U(vl.rot as u32),
        P::F(kl.rot_scale),
        P::F(vl.rot_scale),
    ]
}

/// Writes layer 0 of `pool` as one pass of the forward step does: `rope`
/// (no RoPE, bias or norms) over the tokens `toks` ((slot, position) each;
/// `k`, `v` their rows), then each TurboQuant cache's `tq_centre`,
/// `tq_encode` and `tq_keep` (`model/forward.rs`, attention aside).
fn write_pass(gpu: &Gpu, pool: &WgpuKvPool, toks: &[(usize, usize)], k: &[f32], v: &[f32]) {
    let (kl, vl) = pool.layouts[0];
    let (n_kv, hd) = match (kl.tq, vl.tq) {
        (Some(t), _) | (None, Some(t)) => (t.n_kv, t.hd),
        _ => unreachable!("a TurboQuant cache"),
    };
    let n_tok = toks.len() as u32;
    let q = vec![0.5f32; toks.len() * hd];
    let (qb, kb, vb) =
        (gpu.upload_f32("q", &q).unwrap(), gpu.upload_f32("k", k).unwrap(), gpu.upload_f32("v", v).unwrap());
    let pos: Vec<u32> = toks.iter().map(|&(_, p)| p as u32).collect();
    let slot: Vec<u32> = toks.iter().map(|&(s, _)| s as u32).collect();
    let span = span_starts(&pos, &slot);
    let up = |what, x: &[u32]| gpu.upload(what, bytemuck::cast_slice(x)).unwrap();
    let (pb, sb, spb) = (up("pos", &pos), up("slot", &slot), up("span", &span));
    let params = rope_params(n_kv, hd, pool.n_ctx, &kl, &vl);
    let d = &gpu.dummy;
    let (kc, vc) = (&pool.k[0], &pool.v[0]);
    let bufs = [(0, &qb), (1, &kb), (2, &vb), (3, d), (4, d), (5, d), (6, kc), (7, vc), (8, &pb), (9, &sb)];
    let mut st = Step::new(gpu);
    let kv = Variant::Kv(KvTypes { k: kl.ty, v: vl.ty });
    st.dispatch(Kernel::Rope, kv, &bufs, 10, &params, [1 + 2 * n_kv as u32, n_tok, 1]).unwrap();
    for (l, cache, rows) in [(kl, kc, &kb), (vl, vc, &vb)] {
        if l.tq.is_none() {
            continue;
        }
        let v = Variant::Tq(l.ty);
        let p = [P::U(n_tok)];
        st.dispatch(Kernel::TqCentre, v, &[(0, cache), (2, &pb), (3, &sb)], 5, &p, [n_tok, 1, 1]).unwrap();
        let bufs = [(0, cache), (1, rows), (2, &pb), (3, &sb)];
        st.dispatch(Kernel::TqEncode, v, &bufs, 5, &p, [n_kv as u32, n_tok, 1]).unwrap();
        let bufs = [(0, cache), (1, rows), (2, &pb), (3, &sb), (4, &spb)];
        st.dispatch(Kernel::TqKeep, v, &bufs, 5, &p, [n_kv as u32, n_tok, 1]).unwrap();
    }
    gpu.queue.submit([st.encode().unwrap().finish()]);
    gpu.device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
}

/// The words of a buffer of `words` words.
fn read_words(gpu: &Gpu, buf: &wgpu::Buffer, words: usize) -> Vec<u32> {
    let mut out = vec![0u32; words];
    let enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    gpu.read_back(enc, buf, 0, &mut out).unwrap();
    out
}

/// The CPU's side of one TurboQuant cache: the cache itself, and what the
/// test derives of its scheme to check the device's words: each slot's
/// centre (as `cpu::kv_cache` sets it), each coded head's code (scale
/// bits, indices), each position's last row written.
struct CpuTq {
    buf: KvBuf,
    rot: KvRotation,
    tq: Arc<TurboQuant>,
    centre: Vec<Vec<f32>>,
    codes: std::collections::HashMap<(usize, usize, usize), (u16, Vec<u32>)>,
    rows: std::collections::HashMap<(usize, usize), Vec<f32>>,
}

impl CpuTq {
    fn new(ty: KvCacheType, keys: bool, n_slots: usize, n_ctx: usize, n_kv: usize, hd: usize) -> Self {
        let buf = KvBuf::zeroed_slots(ty, n_slots, n_ctx, (n_kv, hd), "test").unwrap();
        let tq = buf.turboquant().unwrap().clone();
        let rot =
            if keys { KvRotation::for_keys(ty, hd, Some(&tq)) } else { KvRotation::for_values(ty, hd, Some(&tq)) };
        CpuTq {
            buf,
            rot: rot.unwrap(),
            tq,
            centre: vec![vec![0.0; n_kv * hd]; n_slots],
            codes: Default::default(),
            rows: Default::default(),
        }
    }

    /// Writes `x` (unrotated) at `pos` of `slot`.
    fn write(&mut self, slot: usize, pos: usize, n_ctx: usize, x: &[f32]) {
        let (kvd, hd) = (x.len(), self.tq.dim());
        let mut r = x.to_vec();
        self.rot.rotate_stored(&mut r);
        self.buf.write_row((slot * n_ctx + pos) * kvd, &r);
        self.rows.insert((slot, pos), r.clone());
        if pos + 1 == TQ_EXACT_POSITIONS {
            // The CPU's centre: the exact rows (f16) summed in order, scaled.
            let c = &mut self.centre[slot];
            c.fill(0.0);
            for p in TQ_CENTRE_FROM..TQ_EXACT_POSITIONS {
                let row = &self.rows[&(slot, p)];
                c.iter_mut().zip(row).for_each(|(c, &v)| *c += round_f16(v));
            }
            let inv = 1.0 / (TQ_EXACT_POSITIONS - TQ_CENTRE_FROM) as f32;
            c.iter_mut().for_each(|c| *c *= inv);
        }
        if pos >= TQ_EXACT_POSITIONS {
            for g in 0..kvd / hd {
                let y: Vec<f32> = (0..hd).map(|i| r[g * hd + i] - self.centre[slot][g * hd + i]).collect();
                let mut code = vec![0u8; self.tq.code_bytes()];
                self.tq.encode_rotated_norm_kept(&y, &mut code, TQ_REFINE_PASSES);
                let b = self.tq.bits() as usize;
                let bit = |j: usize| (u32::from(code[2 + j / 8]) >> (j % 8)) & 1;
                let idx = (0..hd).map(|i| (0..b).fold(0, |v, k| v | bit(i * b + k) << k)).collect();
                self.codes.insert((slot, pos, g), (u16::from_le_bytes([code[0], code[1]]), idx));
            }
        }
    }
}

/// Index differences and scale differences of the device's codes against
/// the CPU's, summed over the checks of one run.
#[derive(Default, Debug)]
struct CodeStats {
    indices: usize,
    differing: usize,
    worst_head: usize,
    worst_scale: f32,
}

/// Checks the device's words of one TurboQuant cache (`w`, layout `t`)
/// against the CPU's for slot `slot`'s positions `0..n`.
fn check_tq(what: &str, w: &[u32], t: &TqLayout, cpu: &CpuTq, slot: usize, n: usize, stats: &mut CodeStats) {
    let (hd, kvd) = (t.hd, t.n_kv * t.hd);
    let half = |x: u32, i: usize| f16::from_bits((x >> (16 * (i % 2))) as u16).to_f32();
    let view = cpu.buf.view();
    let mut want = vec![0.0f32; kvd];
    if t.has_centre && n >= t.n_exact {
        let got: Vec<u32> = w[t.centre + slot * kvd..][..kvd].to_vec();
        let c: Vec<u32> = cpu.centre[slot].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, c, "{what}: slot {slot}'s centre");
    }
    for p in 0..n {
        view.to_f32((slot * t.n_ctx + p) * kvd, &mut want);
        let code_at = t.codes + (slot * t.n_ctx + p) * t.row_words;
        if p < t.n_exact {
            let got: Vec<f32> =
                (0..kvd).map(|i| half(w[t.exact + (slot * t.n_exact + p) * kvd / 2 + i / 2], i)).collect();
            assert_eq!(got, want, "{what}: exact row {p} of slot {slot}");
            assert!(w[code_at..code_at + t.row_words].iter().all(|&x| x == 0), "{what}: exact row {p} coded");
            continue;
        }
        for g in 0..t.n_kv {
            let c = &w[code_at + g * t.head_words..][..t.head_words];
            let bits = t.bits as usize;
            let idx: Vec<u32> = (0..hd)
                .map(|i| (0..bits).fold(0, |v, k| v | ((c[1 + (i * bits + k) / 32] >> ((i * bits + k) % 32)) & 1) << k))
                .collect();
            let (scale, want_idx) = &cpu.codes[&(slot, p, g)];
            let differing = idx.iter().zip(want_idx).filter(|(a, b)| a != b).count();
            assert!(
                idx.iter().zip(want_idx).all(|(&a, &b)| a.abs_diff(b) <= 1),
                "{what}: pos {p} head {g}: an index off by more than one level"
            );
            let (gs, ws) = (f16::from_bits(c[0] as u16).to_f32(), f16::from_bits(*scale).to_f32());
            stats.indices += hd;
            stats.differing += differing;
            stats.worst_head = stats.worst_head.max(differing);
            stats.worst_scale = stats.worst_scale.max((gs - ws).abs() / ws.abs().max(f32::MIN_POSITIVE));
            if differing == 0 {
                // The same indices: the same norm and ‖c[idx]‖ but for
                // f32 against f64 sums, at most one f16 step apart.
                assert!((gs - ws).abs() <= ws.abs() / 1024.0, "{what}: pos {p} head {g}: scale {gs} vs {ws}");
                // Decoded (scale · centroid + centre) as the CPU reads it.
                let cent = cpu.tq.centroids();
                for i in 0..hd {
                    let got = gs * cent[idx[i] as usize] + f32::from_bits(w[t.centre + slot * kvd + g * hd + i]);
                    let e = want[g * hd + i];
                    assert!(
                        (got - e).abs() <= 1e-6 * (1.0 + e.abs()) + (gs - ws).abs() * cent[idx[i] as usize].abs(),
                        "{what}: pos {p} head {g} value {i}: {got} vs {e}"
                    );
                }
            }
        }
    }
}

/// Checks the ring of slot `slot` (`window` entries) against the last rows
/// written at each position.
fn check_ring(what: &str, w: &[u32], t: &TqLayout, cpu: &CpuTq, slot: usize, last: &[usize]) {
    let kvd = t.n_kv * t.hd;
    for e in 0..t.window {
        let tag = w[t.tags + slot * t.window + e];
        let want = last.iter().rev().find(|&&p| p % t.window == e);
        assert_eq!(tag, want.map_or(0, |&p| p as u32 + 1), "{what}: ring entry {e} of slot {slot}");
        if let Some(&p) = want {
            let row = &cpu.rows[&(slot, p)];
            for i in 0..kvd {
                let got =
                    f16::from_bits((w[t.ring + (slot * t.window + e) * kvd / 2 + i / 2] >> (16 * (i % 2))) as u16);
                assert_eq!(got.to_f32().to_bits(), round_f16(row[i]).to_bits(), "{what}: ring entry {e} value {i}");
            }
        }
    }
}

/// A TurboQuant cache as the device writes it against the CPU's scheme,
/// for tq3 and tq4 keys and values, heads of 64 and 256, and K and V of
/// different types: positions 0..40 of slot 1 (and 0..5 of slot 0) in one
/// pass and one at a time, then slot 1 truncated to 10 and positions
/// 10..20 written anew (the centre set again when 15 is); then slot 1's
/// first 30 positions copied onto slot 0.
///
/// Exact rows, centres and the ring are the CPU's bit for bit, and the
/// two ways of writing store the same words. The codes are computed in
/// f32 where the CPU sums in f64 (the norm, and the cosine of each
/// refining move), so an index may differ where the two sums decide a
/// near-tie differently: each index within one level of the CPU's, and
/// over the run at most 1% of the indices differing (measured: a handful in
/// tens of thousands); a head with the CPU's indices has its scale within
/// one f16 step and decodes to the CPU's values within f32 rounding.
#[test]
fn turboquant_cache_rows_are_the_cpus() {
    let Some(gpu) = gpu() else { return };
    let gpu = Arc::new(gpu);
    use KvCacheType as T;
    let (n_slots, n_ctx) = (2usize, 48usize);
    let mut stats = CodeStats::default();
    for (i, (types, n_kv, hd)) in [
        (KvTypes { k: T::Tq3, v: T::Tq4 }, 2usize, 64usize),
        (KvTypes { k: T::Tq4, v: T::Tq3 }, 1, 256),
        (KvTypes { k: T::F16, v: T::Tq4 }, 2, 64),
    ]
    .into_iter()
    .enumerate()
    {
        let kvd = n_kv * hd;
        let mut rng = Rng(100 + i as u64);
        // Rows with a shared mean, as keys have.
        let mut row = || -> Vec<f32> { (0..kvd).map(|_| rng.value(1.0) + 0.7).collect() };
        let first: Vec<(usize, usize)> = (0..5).map(|p| (0, p)).chain((0..40).map(|p| (1, p))).collect();
        let again: Vec<(usize, usize)> = (10..20).map(|p| (1, p)).collect();
        let (k1, v1): (Vec<Vec<f32>>, Vec<Vec<f32>>) = first.iter().map(|_| (row(), row())).unzip();
        let (k2, v2): (Vec<Vec<f32>>, Vec<Vec<f32>>) = again.iter().map(|_| (row(), row())).unzip();
        let mut words = Vec::new();
        for one_pass in [true, false] {
            let what = format!("{types}, {n_kv}x{hd}, {}", if one_pass { "one pass" } else { "one by one" });
            let pool =
                WgpuKvPool::new(&gpu, ModelId::next(), &[(n_kv, hd)], &[[None, None]], n_slots, n_ctx, types).unwrap();
            for (toks, k, v) in [(&first, &k1, &v1), (&again, &k2, &v2)] {
                if one_pass {
                    write_pass(&gpu, &pool, toks, &k.concat(), &v.concat());
                } else {
                    for (j, tok) in toks.iter().enumerate() {
                        write_pass(&gpu, &pool, &[*tok], &k[j], &v[j]);
                    }
                }
            }
            let (kl, vl) = pool.layouts[0];
            let mut cpu = [(kl, true, &k1, &k2), (vl, false, &v1, &v2)].map(|(l, keys, a, b)| {
                l.tq.map(|_| {
                    let mut c = CpuTq::new(l.ty, keys, n_slots, n_ctx, n_kv, hd);
                    for (toks, rows) in [(&first, a), (&again, b)] {
                        toks.iter().zip(rows.iter()).for_each(|(&(s, p), r)| c.write(s, p, n_ctx, r));
                    }
                    c
                })
            });
            let last: Vec<usize> = (0..40).collect();
            let mut these = Vec::new();
            for (j, (l, buf)) in [(kl, &pool.k[0]), (vl, &pool.v[0])].into_iter().enumerate() {
                let (Some(t), Some(c)) = (l.tq, &cpu[j]) else { continue };
                let w = read_words(&gpu, buf, t.words);
                let what = format!("{what}: {}", ["K", "V"][j]);
                check_tq(&what, &w, &t, c, 1, 40, &mut stats);
                check_tq(&what, &w, &t, c, 0, 5, &mut stats);
                check_ring(&what, &w, &t, c, 1, &last);
                check_ring(&what, &w, &t, c, 0, &[0, 1, 2, 3, 4]);
                these.push(w);
            }
            words.push(these);
            if one_pass {
                continue;
            }
            // Slot 1's first 30 positions onto slot 0: codes, exact rows,
            // centre, and the ring's entries of positions below 30.
            let mut pool = pool;
            pool.copy_positions(1, 0, 30).unwrap();
            for (j, (l, buf)) in [(kl, &pool.k[0]), (vl, &pool.v[0])].into_iter().enumerate() {
                let (Some(t), Some(c)) = (l.tq, &mut cpu[j]) else { continue };
                let w = read_words(&gpu, buf, t.words);
                c.buf.copy_within(n_ctx * kvd, 30 * kvd, 0);
                c.centre[0] = c.centre[1].clone();
                for p in 0..30 {
                    let r = c.rows[&(1, p)].clone();
                    c.rows.insert((0, p), r);
                    for g in 0..n_kv {
                        if let Some(code) = c.codes.get(&(1, p, g)).cloned() {
                            c.codes.insert((0, p, g), code);
                        }
                    }
                }
                let what = format!("{what}: {} copied", ["K", "V"][j]);
                check_tq(&what, &w, &t, c, 0, 30, &mut stats);
                check_ring(&what, &w, &t, c, 0, &last[..30]);
            }
        }
        assert!(words[0] == words[1], "{types}: one pass and one by one stored different words");
    }
    eprintln!("TurboQuant codes against the CPU's: {stats:?}");
    assert!(stats.differing * 100 <= stats.indices, "{stats:?}");
}

/// Attention over TurboQuant caches past the window, on the device against
/// the CPU with the same cache types: 200 positions (a query at 199 reads
/// rows 16..71 from their codes, 72..199 exact), prompts cut into chunks
/// whose queries read the rows of their own pass, of the ring and of the
/// codes, then decode steps, in a pool of two slots (slot 1 used); the
/// Llama-like model (biases, no norms) and the Gemma 3 one (q/k norms: the
/// keys' channel scale; sliding layers). Each step's logits within
/// [`check_logits`] of the CPU's: the codes differ only in rare indices
/// (`turboquant_cache_rows_are_the_cpus`), the exact rows not at all. The
/// f16 cache runs alike, so that the printed differences show what
/// TurboQuant adds to the device's difference from the CPU.
#[test]
fn turboquant_attention_is_the_cpus() {
    use crate::backend::{Batch, ComputeBackend, Out};
    use crate::conformance::check_logits;
    use crate::conformance::model::{random_model, tokens, with_uneven_values, Arch};
    use crate::cpu::{CpuBackend, Kernels, Precision};
    if gpu().is_none() {
        return;
    }
    let wb = super::WgpuBackend::with_options(Options::default()).unwrap();
    let cb = CpuBackend::with_options(2, Kernels::detect(), Precision::Quantized).unwrap();
    use KvCacheType as T;
    // f16 first: the device's difference from the CPU without TurboQuant,
    // for the printed comparison.
    // The last: value channels of uneven size, so that the values' scale
    // is far from 1.
    for (arch, types, uneven) in [
        (Arch::LlamaBias, KvTypes::default(), false),
        (Arch::LlamaBias, KvTypes::both(T::Tq4), false),
        (Arch::Gemma3, KvTypes::default(), false),
        (Arch::Gemma3, KvTypes { k: T::Tq3, v: T::Tq4 }, false),
        (Arch::LlamaBias, KvTypes { k: T::F16, v: T::Tq3 }, false),
        (Arch::Gemma3, KvTypes::both(T::Tq3), true),
    ] {
        let spec = random_model(41, arch);
        let spec = if uneven { with_uneven_values(spec) } else { spec };
        let (mut wm, mut cm) = (wb.prepare(&spec).unwrap(), cb.prepare(&spec).unwrap());
        let n_ctx = 210;
        let (mut wp, mut cp) =
            (wm.new_kv_pool_typed(2, n_ctx, types).unwrap(), cm.new_kv_pool_typed(2, n_ctx, types).unwrap());
        let toks = tokens(7, 200, spec.n_vocab);
        let (mut pos, mut worst, mut max_diff) = (0, 1.0f64, 0.0f32);
        for n in [150usize, 1, 30, 1, 1, 17] {
            let batch = Batch::seq(1, pos, &toks[pos..pos + n], Out::Last);
            let got = wm.forward(wp.as_mut(), &batch).unwrap().to_vec();
            let want = cm.forward(cp.as_mut(), &batch).unwrap();
            let what = format!("{arch:?} {types}: positions {pos}..{}", pos + n);
            check_logits(&what, &got, want).unwrap();
            worst = worst.min(crate::conformance::cosine(&got, want));
            max_diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(max_diff, f32::max);
            pos += n;
        }
        eprintln!("{arch:?} {types} (uneven values: {uneven}), device against CPU: worst logit cosine {worst:.6}, max |Δlogit| {max_diff}");
    }
}
