//! Random values of a tensor: seeded, approximately normal, quantized with
//! ggml's reference quantizers; independent of the number of threads.

use std::sync::Mutex;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::TensorPlan;
use crate::{Error, Result};

/// SplitMix64: a well-mixed 64-bit function of its input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one tensor: the file's seed mixed with the tensor's name.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a of the name.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    mix(seed ^ mix(h))
}

/// Values per generation chunk (rows are grouped up to about this many);
/// part of the file format of a seed, so it must not change.
const CHUNK_VALUES: usize = 1 << 16;

/// An approximately normal value with mean 0 and variance 1: the sum of
/// four uniform 16-bit numbers, centred and scaled (Irwin–Hall, n = 4),
/// from one 64-bit draw.
fn approx_normal(r: u64) -> f32 {
    let s = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    // Mean 4·32767.5, variance 4·(65536² − 1)/12.
    const MEAN: f64 = 131_070.0;
    const INV_STD: f64 = 2.642_943_055e-5; // 1 / sqrt(4 * (65536^2 - 1) / 12)
    ((s as f64 - MEAN) * INV_STD) as f32
}

/// A byte buffer aligned to 16 bytes, so that any block type can be viewed
/// in it.
#[derive(Default)]
struct Aligned {
    words: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn bytes_mut(&mut self, n: usize) -> &mut [u8] {
        self.words.resize(n.div_ceil(16), 0);
        self.len = n;
        &mut bytemuck::cast_slice_mut(&mut self.words)[..n]
    }
}

/// Fills `out` (exactly the tensor's bytes) with the tensor's random
/// values: norm weights `1 + u`, `u` uniform in ±0.1; biases
/// approximately normal with standard deviation 0.5; matrices rows of
/// approximately normal values with standard deviation `1/sqrt(cols)`,
/// quantized to the tensor's type with ggml's reference quantizer (first
/// rounded through `plan.rounded_through` when set). The
/// rows are generated in fixed chunks, each from its own generator, on
/// `threads` threads; the bytes depend on `seed` and the tensor's name and
/// shape only. `progress` is called with the number of bytes of each chunk
/// as it completes.
///
/// # Errors
/// `out` of the wrong length; quantizer errors.
pub fn fill_tensor(
    plan: &TensorPlan,
    seed: u64,
    threads: usize,
    out: &mut [u8],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let need = plan.n_bytes()?;
    if out.len() != need {
        return Err(Error::Gguf(format!("tensor `{}`: buffer of {} bytes, needs {need}", plan.name, out.len())));
    }
    let (rows, cols) = (plan.rows(), plan.cols());
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let row_bytes = plan.ty.row_bytes(cols)?;
    let rows_per_chunk = (CHUNK_VALUES / cols).max(1);
    let chunk_bytes = rows_per_chunk * row_bytes;
    let tseed = tensor_seed(seed, &plan.name);
    let norm = plan.role.is_norm();
    // Biases: of the order of the projections' outputs, so that they matter.
    let std = if plan.role.is_bias() { 0.5 } else { 1.0 / (cols as f32).sqrt() };
    let work = Mutex::new(out.chunks_mut(chunk_bytes).enumerate());
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let n_threads = threads.clamp(1, rows.div_ceil(rows_per_chunk));
    let worker = || {
        let mut vals: Vec<f32> = Vec::new();
        let mut q = Aligned::default();
        let mut rq = Aligned::default();
        let mut row = vec![0f32; cols];
        loop {
            let next = match work.lock() {
                Ok(mut it) => it.next(),
                Err(_) => None,
            };
            let Some((ci, dst)) = next else { break };
            let n_rows = dst.len() / row_bytes;
            let mut rng = ChaCha8Rng::seed_from_u64(mix(tseed ^ mix(ci as u64)));
            vals.clear();
            vals.extend((0..n_rows * cols).map(|_| {
                let r = rng.next_u64();
                if norm {
                    // Uniform in [0.9, 1.1).
                    1.0 + ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
                } else {
                    approx_normal(r) * std
                }
            }));
            let buf = q.bytes_mut(dst.len());
            let res = vals.chunks_exact(cols).zip(buf.chunks_exact_mut(row_bytes)).try_for_each(|(x, y)| {
                match plan.rounded_through {
                    // Quantize to the rounding type, dequantize, store as `plan.ty` (F32).
                    Some(rt) => {
                        let qb = rq.bytes_mut(rt.row_bytes(cols)?);
                        infer_compute::quant::quantize_row(rt, x, qb)?;
                        infer_compute::quant::dequantize_row(rt, qb, &mut row)?;
                        infer_compute::quant::quantize_row(plan.ty, &row, y)
                    }
                    None => infer_compute::quant::quantize_row(plan.ty, x, y),
                }
            });
            if let Err(e) = res {
                if let Ok(mut f) = failed.lock() {
                    f.get_or_insert(e.into());
                }
                break;
            }
            dst.copy_from_slice(buf);
            progress(dst.len() as u64);
        }
    };
    if n_threads == 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 0..n_threads {
                s.spawn(worker);
            }
        });
    }
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        Ok(None) => Ok(()),
        Err(_) => Err(Error::Gguf(format!("tensor `{}`: a generator thread failed", plan.name))),
    }
}
