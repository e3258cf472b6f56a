//! TurboQuant (Zandieh, Daliri, Hadian & Mirrokni, "TurboQuant: Online
//! Vector Quantization with Near-optimal Distortion Rate", arXiv
//! 2504.19874): vectors of `d` values coded in `b` bits per value plus
//! their norm, with no calibration data.
//!
//! Encoding `x` ([`TurboQuant::encode`], the paper's `TurboQuant_mse`):
//! 1. `n = ‖x‖₂`, kept as f16;
//! 2. `y = Π (x / n)`, the random rotation of [`rotation`] (random signs,
//!    then a Walsh–Hadamard transform): every coordinate of `y` then
//!    follows the density `f_d` of a coordinate of a random unit vector;
//! 3. each `y_i` is coded independently as the index of its nearest
//!    centroid of the `2^b`-level Lloyd–Max quantizer of `f_d`
//!    ([`codebook`]).
//!
//! Decoding ([`TurboQuant::decode`]) is `x̂ = n · Π⁻¹ c[idx]`. The inner
//! product with a query ([`TurboQuant::dot`]) needs no decoding: `⟨q, x̂⟩ =
//! n · ⟨Π q, c[idx]⟩`, so a query is rotated once ([`TurboQuant::rotate`])
//! and each code costs `d` table look-ups and multiply-adds
//! ([`TurboQuant::dot_rotated`]).
//!
//! The paper's second variant (`TurboQuant_prod`) spends one of the `b`
//! bits on a 1-bit QJL sketch of the residual to make inner products
//! unbiased; its tests here measure it against the `b`-bit MSE code at the
//! same bits (`tests::mse_code_beats_qjl_residual_at_equal_bits`): the
//! variance the sketch adds outweighs the bias it removes at 3 and 4 bits,
//! so the MSE code is the one kept.
//!
//! Layout of one code ([`TurboQuant::code_bytes`] bytes): the norm `n` as
//! an IEEE f16 (2 bytes, little-endian), then the `d` indices as one
//! little-endian bit stream, `b` bits each, index `i` in bits `i·b ..
//! (i+1)·b` (least significant first), padded with zero bits to a whole
//! byte: `2 + ⌈d·b/8⌉` bytes, `b + 16/d` bits per value (tq4 with `d =
//! 128`: 66 bytes, 4.125 bits per value). `d` must be a power of two
//! (the Walsh–Hadamard transform); the rotation is fixed by a 64-bit seed
//! ([`DEFAULT_SEED`] unless another is given). A norm past f16's range
//! is stored as 65 504 (the largest f16), never as infinity.
//!
//! [`TurboQuant::encode_rotated_norm_kept`] writes the same layout for
//! attention: the indices refined towards the vector's direction and, in
//! the norm field, the scale that gives the decoded vector the input's
//! norm (the MSE code's decoded vector is shorter than its input, which
//! softens the attention over keys so coded); decoding is unchanged.
//!
//! This module is the format and its scalar reference; the CPU's SIMD
//! kernels are `cpu::tq`, and the KV cache types `tq3`/`tq4`
//! ([`crate::KvCacheType`]) store one code per head, written by
//! [`TurboQuant::encode_rotated_norm_kept`].

mod channel_scale;
pub mod codebook;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod device_layout;
pub mod rotation;

pub use channel_scale::ChannelScale;
#[cfg(feature = "wgpu")]
pub(crate) use device_layout::head_words;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) use device_layout::TqLayout;

use std::sync::{Arc, Mutex};

use half::f16;

use crate::error::{shape_err, Result};

/// The rotation seed of [`TurboQuant::new`]: the ASCII bytes of
/// `"turboqnt"`, read as a little-endian u64.
pub const DEFAULT_SEED: u64 = u64::from_le_bytes(*b"turboqnt");

/// A TurboQuant coder for vectors of `dim` values at `bits` bits per value
/// (see the module docs).
#[derive(Clone, Debug)]
pub struct TurboQuant {
    dim: usize,
    bits: u32,
    signs: Vec<f32>,
    centroids: Vec<f32>,
    bounds: Vec<f32>,
}

impl TurboQuant {
    /// A coder of `dim`-value vectors at `bits` bits per value, rotation
    /// seeded with [`DEFAULT_SEED`].
    ///
    /// # Errors
    /// As [`TurboQuant::with_seed`].
    pub fn new(dim: usize, bits: u32) -> Result<Self> {
        Self::with_seed(dim, bits, DEFAULT_SEED)
    }

    /// The coder of `(dim, bits)` with [`DEFAULT_SEED`], built once per
    /// process and shared (building one runs Lloyd's iteration: tens of
    /// milliseconds).
    ///
    /// # Errors
    /// As [`TurboQuant::with_seed`].
    pub fn shared(dim: usize, bits: u32) -> Result<Arc<TurboQuant>> {
        static CODERS: Mutex<Vec<Arc<TurboQuant>>> = Mutex::new(Vec::new());
        let mut coders = CODERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = coders.iter().find(|c| c.dim == dim && c.bits == bits) {
            return Ok(c.clone());
        }
        let c = Arc::new(TurboQuant::new(dim, bits)?);
        coders.push(c.clone());
        Ok(c)
    }

    /// A coder whose rotation's signs come from `seed`.
    ///
    /// # Errors
    /// [`Error::Shape`](crate::Error::Shape) unless `dim` is a power of two of at least 2 and
    /// `bits` is 1 to 8.
    pub fn with_seed(dim: usize, bits: u32, seed: u64) -> Result<Self> {
        if dim < 2 || !dim.is_power_of_two() {
            return Err(shape_err("TurboQuant", format!("dimension {dim} is not a power of two of at least 2")));
        }
        if !(1..=8).contains(&bits) {
            return Err(shape_err("TurboQuant", format!("{bits} bits per value (1 to 8 are supported)")));
        }
        let (centroids, bounds) = codebook::lloyd_max(dim, bits);
        Ok(TurboQuant { dim, bits, signs: rotation::signs(dim, seed), centroids, bounds })
    }

    /// Values per vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Index bits per value.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The Lloyd–Max centroids, ascending (`2^bits` values, for unit vectors).
    pub fn centroids(&self) -> &[f32] {
        &self.centroids
    }

    /// The `2^bits − 1` boundaries between neighbouring centroids,
    /// ascending: a value's nearest centroid is the number of boundaries
    /// below it.
    pub fn bounds(&self) -> &[f32] {
        &self.bounds
    }

    /// Bytes of one code: `2 + ⌈dim · bits / 8⌉`.
    pub fn code_bytes(&self) -> usize {
        2 + (self.dim * self.bits as usize).div_ceil(8)
    }

    /// Storage bits per value, the norm included: `8 · code_bytes / dim`.
    pub fn bits_per_value(&self) -> f64 {
        (8 * self.code_bytes()) as f64 / self.dim as f64
    }

    fn check(&self, what: &'static str, x: usize, code: usize) -> Result<()> {
        if x != self.dim || code != self.code_bytes() {
            return Err(shape_err(
                what,
                format!("{x} values and {code} code bytes; this coder takes {} and {}", self.dim, self.code_bytes()),
            ));
        }
        Ok(())
    }

    /// `out = Π x`, the rotation applied to queries before
    /// [`TurboQuant::dot_rotated`].
    ///
    /// # Errors
    /// [`Error::Shape`](crate::Error::Shape) unless both have `dim` values.
    pub fn rotate(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        if x.len() != self.dim || out.len() != self.dim {
            return Err(shape_err(
                "TurboQuant::rotate",
                format!("{} and {} values, want {}", x.len(), out.len(), self.dim),
            ));
        }
        rotation::rotate(&self.signs, x, out);
        Ok(())
    }

    /// Codes `x` into `code` (see the module docs for the layout). A zero
    /// vector codes as norm 0; a non-finite value gives a NaN norm.
    ///
    /// # Errors
    /// [`Error::Shape`](crate::Error::Shape) for `x` not of `dim` values or `code` not of
    /// [`TurboQuant::code_bytes`] bytes.
    pub fn encode(&self, x: &[f32], code: &mut [u8]) -> Result<()> {
        self.check("TurboQuant::encode", x.len(), code.len())?;
        self.encode_with(x, code, &mut vec![0.0f32; self.dim]);
        Ok(())
    }

    /// [`TurboQuant::encode`] with the rotated vector built in `y` (`dim`
    /// values) instead of an allocation.
    ///
    /// Contract: lengths as [`TurboQuant::encode`] checks them (asserted).
    pub fn encode_with(&self, x: &[f32], code: &mut [u8], y: &mut [f32]) {
        assert!(x.len() == self.dim && y.len() == self.dim);
        rotation::rotate(&self.signs, x, y);
        self.encode_rotated(y, code);
    }

    /// Codes a vector given already rotated (`y = Π x`, as
    /// [`TurboQuant::rotate`] makes it): the code of `x`, with the norm
    /// taken of `y` (equal to `‖x‖` but for rounding).
    ///
    /// Contract: `y` has `dim` values and `code` [`TurboQuant::code_bytes`]
    /// bytes (asserted).
    pub fn encode_rotated(&self, y: &[f32], code: &mut [u8]) {
        assert!(y.len() == self.dim && code.len() == self.code_bytes());
        let norm = y.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32;
        let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        let stored = if norm > 65504.0 { 65504.0 } else { norm };
        code[..2].copy_from_slice(&f16::from_f32(stored).to_le_bytes());
        let bits = &mut code[2..];
        bits.fill(0);
        // Index = the number of boundaries below the value (branch-free,
        // vectorized across 8 values); 8 indices of `b ≤ 4` bits make one
        // word of `b` bytes.
        let b = self.bits as usize;
        let mut groups = y.chunks_exact(8);
        for (g, vals) in (&mut groups).enumerate() {
            let mut idx = [0u32; 8];
            for &bound in &self.bounds {
                for (i, &v) in idx.iter_mut().zip(vals) {
                    *i += (bound < v * inv) as u32;
                }
            }
            if b <= 4 {
                let w = idx.iter().enumerate().fold(0u32, |w, (j, &i)| w | i << (b * j));
                bits[g * b..g * b + b].copy_from_slice(&w.to_le_bytes()[..b]);
            } else {
                idx.iter().enumerate().for_each(|(j, &i)| put(bits, 8 * g + j, self.bits, i));
            }
        }
        let done = y.len() - groups.remainder().len();
        for (i, &v) in groups.remainder().iter().enumerate() {
            let idx = self.bounds.iter().filter(|&&bound| bound < v * inv).count() as u32;
            put(bits, done + i, self.bits, idx);
        }
    }

    /// Codes a vector given already rotated, for attention: the norm kept
    /// (the decoded vector `n · c[idx]` has `y`'s norm) and the direction
    /// coded as well as `passes` sweeps can. The indices start as
    /// [`TurboQuant::encode_rotated`]'s (the nearest centroids); each sweep
    /// then moves every index in turn, in index order, to a neighbouring
    /// centroid where that raises the cosine between `y` and `c[idx]`; the
    /// norm field holds `‖y‖ / ‖c[idx]‖`. Same layout and decoding as the
    /// MSE code; the decoded vector is not shrunk towards zero as the MSE
    /// code's is (by `1 − D_mse` in squared norm, on average), which keeps
    /// attention logits at their spread, and its direction is closer.
    ///
    /// Contract: as [`TurboQuant::encode_rotated`] (asserted).
    pub fn encode_rotated_norm_kept(&self, y: &[f32], code: &mut [u8], passes: usize) {
        assert!(y.len() == self.dim && code.len() == self.code_bytes());
        // The nearest centroids exactly as `encode_rotated` finds them.
        let norm = y.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32;
        let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        let mut stack = [0u8; 256];
        let mut heap = Vec::new();
        let idx: &mut [u8] = if self.dim <= stack.len() {
            &mut stack[..self.dim]
        } else {
            heap.resize(self.dim, 0);
            &mut heap
        };
        for (i, &v) in idx.iter_mut().zip(y) {
            *i = self.bounds.iter().filter(|&&b| b < v * inv).count() as u8;
        }
        let c = &self.centroids;
        let last = c.len() - 1;
        // ⟨y, c[idx]⟩ and ‖c[idx]‖², in f64, updated per move.
        let mut dot: f64 = idx.iter().zip(y).map(|(&i, &v)| v as f64 * c[i as usize] as f64).sum();
        let mut nn: f64 = idx.iter().map(|&i| (c[i as usize] as f64).powi(2)).sum();
        for _ in 0..passes {
            let mut moved = false;
            for (i, &v) in idx.iter_mut().zip(y) {
                let a = *i as usize;
                for b in [a.wrapping_sub(1), a + 1] {
                    if b > last {
                        continue;
                    }
                    let (ca, cb) = (c[a] as f64, c[b] as f64);
                    let (d2, n2) = (dot + v as f64 * (cb - ca), nn + cb * cb - ca * ca);
                    // cos² up, with the dot product positive.
                    if d2 > 0.0 && d2 * d2 * nn > dot * dot * n2 {
                        (*i, dot, nn, moved) = (b as u8, d2, n2, true);
                        break;
                    }
                }
            }
            if !moved {
                break;
            }
        }
        let scale = if nn > 0.0 && norm > 0.0 { (norm as f64 / nn.sqrt()) as f32 } else { norm };
        let stored = if scale > 65504.0 { 65504.0 } else { scale };
        code[..2].copy_from_slice(&f16::from_f32(stored).to_le_bytes());
        let bits = &mut code[2..];
        bits.fill(0);
        for (i, &v) in idx.iter().enumerate() {
            put(bits, i, self.bits, v as u32);
        }
    }

    /// Decodes `code` into `out`: `n · Π⁻¹ c[idx]`.
    ///
    /// # Errors
    /// As [`TurboQuant::encode`].
    pub fn decode(&self, code: &[u8], out: &mut [f32]) -> Result<()> {
        self.check("TurboQuant::decode", out.len(), code.len())?;
        decode_rotated_ref(&self.centroids, self.bits, code, out);
        rotation::unrotate(&self.signs, out);
        Ok(())
    }

    /// `y = Π x̂`, the decoded vector left in the rotated basis: `y_i = n ·
    /// c[idx_i]` (what attention over a rotated query reads; `Π⁻¹ y`,
    /// [`TurboQuant::unrotate`], is [`TurboQuant::decode`]).
    ///
    /// # Errors
    /// As [`TurboQuant::encode`].
    pub fn decode_rotated(&self, code: &[u8], out: &mut [f32]) -> Result<()> {
        self.check("TurboQuant::decode_rotated", out.len(), code.len())?;
        decode_rotated_ref(&self.centroids, self.bits, code, out);
        Ok(())
    }

    /// `y ← Π y`, in place (the rotation of [`TurboQuant::rotate`]).
    ///
    /// Contract: `y` has `dim` values (asserted).
    pub fn rotate_in_place(&self, y: &mut [f32]) {
        assert_eq!(y.len(), self.dim);
        rotation::rotate_in_place(&self.signs, y);
    }

    /// `y ← Π⁻¹ y`, in place: a sum of vectors decoded by
    /// [`TurboQuant::decode_rotated`] back in the original basis.
    ///
    /// Contract: `y` has `dim` values (asserted).
    pub fn unrotate(&self, y: &mut [f32]) {
        assert_eq!(y.len(), self.dim);
        rotation::unrotate(&self.signs, y);
    }

    /// `⟨q, x̂⟩` of the decoded `code` with a query given rotated
    /// (`q_rot = Π q`, [`TurboQuant::rotate`]): `n · Σ q_rot[i] ·
    /// c[idx_i]`, without decoding.
    ///
    /// # Errors
    /// As [`TurboQuant::encode`].
    pub fn dot_rotated(&self, code: &[u8], q_rot: &[f32]) -> Result<f32> {
        self.check("TurboQuant::dot_rotated", q_rot.len(), code.len())?;
        Ok(dot_rotated_ref(&self.centroids, self.bits, code, q_rot))
    }

    /// `⟨q, x̂⟩`: rotates `q`, then [`TurboQuant::dot_rotated`].
    ///
    /// # Errors
    /// As [`TurboQuant::encode`].
    pub fn dot(&self, code: &[u8], q: &[f32]) -> Result<f32> {
        let mut q_rot = vec![0.0f32; self.dim];
        self.rotate(q, &mut q_rot)?;
        self.dot_rotated(code, &q_rot)
    }
}

/// The scalar reference of [`TurboQuant::dot_rotated`] (lengths checked by
/// the caller): the products summed in index order in f32, times the norm.
pub fn dot_rotated_ref(centroids: &[f32], bits: u32, code: &[u8], q_rot: &[f32]) -> f32 {
    let norm = f16::from_le_bytes([code[0], code[1]]).to_f32();
    let idx = &code[2..];
    let mut s = 0.0f32;
    for (i, &q) in q_rot.iter().enumerate() {
        s += q * centroids[get(idx, i, bits) as usize];
    }
    norm * s
}

/// The scalar reference of [`TurboQuant::decode_rotated`] (lengths
/// checked by the caller): `out[i] = n · centroids[idx_i]`.
pub fn decode_rotated_ref(centroids: &[f32], bits: u32, code: &[u8], out: &mut [f32]) {
    let norm = f16::from_le_bytes([code[0], code[1]]).to_f32();
    for (i, o) in out.iter_mut().enumerate() {
        *o = norm * centroids[get(&code[2..], i, bits) as usize];
    }
}

/// Writes index `v` (`bits` bits) as value `i` of the bit stream `buf`
/// (zeroed beforehand).
fn put(buf: &mut [u8], i: usize, bits: u32, v: u32) {
    let at = i * bits as usize;
    for k in 0..bits as usize {
        if v >> k & 1 == 1 {
            buf[(at + k) / 8] |= 1 << ((at + k) % 8);
        }
    }
}

/// Reads value `i` (`bits` bits) of the bit stream `buf`.
fn get(buf: &[u8], i: usize, bits: u32) -> u32 {
    let at = i * bits as usize;
    let mut v = 0u32;
    for k in 0..bits as usize {
        v |= ((buf[(at + k) / 8] >> ((at + k) % 8) & 1) as u32) << k;
    }
    v
}

#[cfg(test)]
mod tests;
