//! The buffer of one layer's TurboQuant (tq3, tq4) K or V cache on a GPU
//! ([`TqLayout`]), in 32-bit words, the same for every GPU backend: wgpu's
//! `shaders/kv/tq.wgsl` reads it and `kv/tq_store.wgsl` and `tq_cache.wgsl`
//! write it, CUDA's `kernels/tq_cache.cuh`, `tq_cache.cu` and
//! `tq_decode.cu`; the CPU's scheme (`cpu::kv_cache`, the bounds in
//! [`crate::kv_type`]) in these areas:
//!
//! | words | what |
//! | --- | --- |
//! | `0 .. 16` | the header's fields ([`Field`]) |
//! | `16 .. 32` | the `2^bits` Lloyd–Max centroids of the coder of `(hd, bits)`, f32 |
//! | `32 .. 48` | the `2^bits − 1` boundaries between them, f32 |
//! | `48 .. 48 + hd` | per channel, the rotation's random sign times the channel scale of the keys or values ([`ChannelScale`]; 1 without one) |
//! | `48 + hd .. 48 + 2hd` | the sign over the channel scale: of the queries that meet the keys, or of attention's output over the values once rotated back |
//! | codes | `[n_slots][n_ctx][n_kv]` codes of `1 + ⌈hd · bits / 32⌉` words: the f16 scale `‖y‖ / ‖c[idx]‖` (low half), then the indices as one little-endian bit stream (index `i` at bits `i · bits ..`); positions below `n_exact` are not coded |
//! | exact | `[n_slots][n_exact][kv_dim / 2]`: each slot's first `n_exact = min(TQ_EXACT_POSITIONS, n_ctx)` rows, f16, two per word (the even value low) |
//! | centre | `[n_slots][kv_dim]` f32: the mean of the slot's exact rows `TQ_CENTRE_FROM .. n_exact`, set when row `n_exact − 1` is written (none when `n_exact ≤ TQ_CENTRE_FROM`) |
//! | ring | `[n_slots][window][kv_dim / 2]` f16: the slot's last `window = min(TQ_WINDOW, n_ctx)` rows, position `p` at entry `p % window` |
//! | tags | `[n_slots][window]`: the position each ring entry holds, plus one (0: none) |
//!
//! Every value is in the cache's rotated basis: a head times the factors of
//! words `48 ..` (random signs of seed [`DEFAULT_SEED`],
//! the keys' [`ChannelScale`]), then `H/√hd`. A code is
//! the CPU's `encode_rotated_norm_kept` of the row less its slot's centre,
//! computed in f32 where the CPU sums in f64 (an index may differ where a
//! value lies on a boundary); exact rows, the centre, and the ring's rows
//! are the CPU's bit for bit.

use super::{rotation, ChannelScale, TurboQuant, DEFAULT_SEED};
use crate::error::{Error, Result};
use crate::kv_type::{TQ_CENTRE_FROM, TQ_EXACT_POSITIONS, TQ_REFINE_PASSES, TQ_WINDOW};

/// Words before the per-channel factors: the fields, centroids and
/// boundaries.
const TABLES: usize = 48;

/// The header's fields, by word index (`KV_F_*` in wgpu's `kv/tq.wgsl`,
/// `TQ_F_*` in CUDA's `tq_cache.cuh`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Field {
    NCtx = 0,
    NKv = 1,
    Hd = 2,
    NExact = 3,
    Window = 4,
    /// Words of one head's code.
    HeadWords = 5,
    /// Words of one position's codes.
    RowWords = 6,
    Codes = 7,
    Exact = 8,
    Centre = 9,
    Ring = 10,
    Tags = 11,
    /// `1 / (n_exact − TQ_CENTRE_FROM)` as f32 bits.
    CentreInv = 12,
    HasCentre = 13,
    CentreFrom = 14,
    /// [`TQ_REFINE_PASSES`].
    Passes = 15,
}

/// Where one layer's TurboQuant cache keeps what (see the module docs):
/// word offsets of the areas and the sizes they follow from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TqLayout {
    pub bits: u32,
    pub n_kv: usize,
    pub hd: usize,
    pub n_ctx: usize,
    pub n_exact: usize,
    pub window: usize,
    pub head_words: usize,
    pub row_words: usize,
    pub codes: usize,
    pub exact: usize,
    pub centre: usize,
    pub has_centre: bool,
    pub ring: usize,
    pub tags: usize,
    /// Words of the whole buffer.
    pub words: usize,
}

/// Words of one head's code of `hd` indices of `bits`: the scale's word
/// and the bit stream's.
pub(crate) fn head_words(hd: usize, bits: u32) -> usize {
    1 + (hd * bits as usize).div_ceil(32)
}

impl TqLayout {
    /// The layout of `n_slots` slots of `n_ctx` positions of `n_kv` heads
    /// of `hd` values (a power of two, as checked by the caller) coded in
    /// `bits`.
    ///
    /// # Errors
    /// [`Error::Overflow`] past `usize`.
    pub fn new(bits: u32, n_kv: usize, hd: usize, n_slots: usize, n_ctx: usize) -> Result<Self> {
        let over = || Error::Overflow("a TurboQuant KV cache layer");
        let mul = |a: usize, b: usize| a.checked_mul(b).ok_or_else(over);
        let kv_dim = mul(n_kv, hd)?;
        let (n_exact, window) = (TQ_EXACT_POSITIONS.min(n_ctx), TQ_WINDOW.min(n_ctx));
        let has_centre = n_exact > TQ_CENTRE_FROM;
        let head_words = head_words(hd, bits);
        let row_words = mul(n_kv, head_words)?;
        let codes = TABLES + 2 * hd;
        let mut at = codes;
        let mut area = |words: usize| -> Result<usize> {
            let start = at;
            at = at.checked_add(words).ok_or_else(over)?;
            Ok(start)
        };
        let codes = area(mul(mul(n_slots, n_ctx)?, row_words)?)?;
        let exact = area(mul(mul(n_slots, n_exact)?, kv_dim / 2)?)?;
        let centre = area(if has_centre { mul(n_slots, kv_dim)? } else { 0 })?;
        let ring = area(mul(mul(n_slots, window)?, kv_dim / 2)?)?;
        let tags = area(mul(n_slots, window)?)?;
        Ok(TqLayout {
            bits,
            n_kv,
            hd,
            n_ctx,
            n_exact,
            window,
            head_words,
            row_words,
            codes,
            exact,
            centre,
            has_centre,
            ring,
            tags,
            words: at,
        })
    }

    /// The header and tables (words `0 .. 48 + 2hd`) of a cache of keys or
    /// values scaled per channel by `scale`.
    ///
    /// # Errors
    /// [`Error::Overflow`] for an offset past 32 bits; the coder's errors.
    pub fn header(&self, scale: Option<&ChannelScale>) -> Result<Vec<u32>> {
        let tq = TurboQuant::shared(self.hd, self.bits)?;
        let u = |v: usize| u32::try_from(v).map_err(|_| Error::Overflow("a TurboQuant KV cache offset past 32 bits"));
        // Checked first: every offset below is smaller.
        u(self.words)?;
        let mut h = vec![0u32; TABLES + 2 * self.hd];
        let inv = 1.0 / (self.n_exact.saturating_sub(TQ_CENTRE_FROM)).max(1) as f32;
        let fields = [
            (Field::NCtx, self.n_ctx),
            (Field::NKv, self.n_kv),
            (Field::Hd, self.hd),
            (Field::NExact, self.n_exact),
            (Field::Window, self.window),
            (Field::HeadWords, self.head_words),
            (Field::RowWords, self.row_words),
            (Field::Codes, self.codes),
            (Field::Exact, self.exact),
            (Field::Centre, self.centre),
            (Field::Ring, self.ring),
            (Field::Tags, self.tags),
            (Field::HasCentre, self.has_centre as usize),
            (Field::CentreFrom, TQ_CENTRE_FROM),
            (Field::Passes, TQ_REFINE_PASSES),
        ];
        for (f, v) in fields {
            h[f as usize] = u(v)?;
        }
        h[Field::CentreInv as usize] = inv.to_bits();
        for (w, &c) in h[16..32].iter_mut().zip(tq.centroids()) {
            *w = c.to_bits();
        }
        for (w, &b) in h[32..48].iter_mut().zip(tq.bounds()) {
            *w = b.to_bits();
        }
        // sign · s (an exact product: the sign is ±1), as the CPU's
        // `rows *= s` then `rows *= sign`.
        let signs = rotation::signs(self.hd, DEFAULT_SEED);
        let (ks, qs) = match scale {
            Some(s) if s.key().len() == self.hd => (s.key(), s.query()),
            _ => (&[][..], &[][..]),
        };
        for (i, &sg) in signs.iter().enumerate() {
            h[TABLES + i] = (ks.get(i).copied().unwrap_or(1.0) * sg).to_bits();
            h[TABLES + self.hd + i] = (qs.get(i).copied().unwrap_or(1.0) * sg).to_bits();
        }
        Ok(h)
    }

    /// Word regions `(from, to, words)` that copying the first `n`
    /// positions of slot `from` onto slot `to` copies (codes, exact rows,
    /// the centre); the ring is copied by a kernel (`ring_copy` in wgpu's
    /// `tq_cache.wgsl`, `tq_ring_copy` in CUDA's `tq_cache.cu`), which keeps
    /// only the entries of positions below `n`.
    pub fn copy_regions(&self, from: usize, to: usize, n: usize) -> Vec<(usize, usize, usize)> {
        let half = self.n_kv * self.hd / 2;
        let mut v = vec![(
            self.codes + from * self.n_ctx * self.row_words,
            self.codes + to * self.n_ctx * self.row_words,
            n * self.row_words,
        )];
        let e = self.n_exact * half;
        v.push((self.exact + from * e, self.exact + to * e, n.min(self.n_exact) * half));
        if self.has_centre {
            v.push((self.centre + from * 2 * half, self.centre + to * 2 * half, 2 * half));
        }
        v
    }
}
