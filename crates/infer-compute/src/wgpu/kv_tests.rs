//! The KV cache as the device writes it, against the CPU bit for bit: the
//! `rope` kernel (no RoPE, bias or norms, so that its heads are its
//! inputs) stores q8_0, q4_0 and f32 rows, and the codes and scales it
//! writes are those of the CPU's rotation (`cpu::kv_rotation`) and ggml's
//! reference quantizers (`quant::quantize_row`) for the same f32 values;
//! the queries come back rotated as the CPU rotates them. Blocks of
//! awkward values (rounding ties, q4_0's truncation boundaries, equal
//! magnitudes of two signs, scales past f16's range, infinities, zeros)
//! are stored unrotated (head_dim 96); a block holding a NaN must get a
//! NaN scale. Needs an adapter: without one the test says so and passes,
//! unless `INFER_REQUIRE_WGPU=1`.

use std::sync::Arc;

use super::context::{Gpu, Options};
use super::kv_pool::KvLayout;
use super::shaders::{Kernel, Variant};
use super::step::{Step, P};
use crate::cpu::kv_rotation::KvRotation;
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
    let params = [
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
    ];
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
