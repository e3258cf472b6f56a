//! The CPU's storage of one layer's keys or values in a
//! [`KvCacheType`]: [`KvBuf`] owns it, [`KvData`] borrows it for attention.
//!
//! Layout (every type): `[n_slots][n_ctx][n_head_kv][head_dim]` values,
//! position-major; one position is one row of `kv_dim = n_head_kv ·
//! head_dim` values, stored as `kv_dim` f32 or f16, or as `kv_dim / 32`
//! ggml blocks (`BlockQ8_0`, `BlockQ4_0`: 34 and 18 bytes), the blocks of
//! head `g` being `g · head_dim / 32 ..` of the row. Writing a row converts
//! it as ggml's `ggml_cpy` / `set_rows` does (`f32_to_f16`,
//! `quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`, bit-exact), except
//! that f16 values past ±65 504 saturate instead of becoming ±inf; reading
//! converts one head's row back to f32 exactly (`dequantize_row_*`), a row
//! at a time, so attention never holds a dequantized copy of the cache.
//!
//! The TurboQuant types store each head's row as one code of
//! [`TurboQuant::code_bytes`] bytes (head `g` of position `p` at byte
//! `(p · n_head_kv + g) · code_bytes`). A row is written and read in the
//! coder's rotated basis: the model rotates it beforehand, as it rotates
//! the rows of a q8_0 or q4_0 cache ([`super::kv_rotation`]). A cache made
//! by [`KvBuf::zeroed_slots`] also keeps, per slot, its first
//! `n_exact = min(TQ_EXACT_POSITIONS, n_ctx)` rows in f16 (`[n_slots]
//! [n_exact][kv_dim]`; their codes are not written) and a centre
//! (`[n_slots][kv_dim]` f32): the mean of the exact rows `TQ_CENTRE_FROM ..
//! n_exact`, computed (summed in position order, then scaled) when row
//! `n_exact − 1` is written. Every later row is coded less the centre
//! ([`TurboQuant::encode_rotated_norm_kept`]) and read as the decoded code
//! ([`tq::decode_rotated`]) plus the centre; exact rows are read widened.
//! The first positions are the attention sinks, whose keys and values are
//! unlike the others' and draw much of the attention, and the mean of the
//! early keys is a far better centre than the sink's key (the keys of a
//! head share a large mean, which a code of the centred row need not
//! spend its bits on). A row's bits depend only on itself and on the
//! slot's exact rows, so a prompt prefilled in any chunks, and the same
//! tokens decoded one by one, store the same bits; truncating a slot below
//! `n_exact` and writing again sets the centre again from the new rows.
//! Each slot also keeps its last `window = min(TQ_WINDOW, n_ctx)` rows in
//! f16, a ring (`[n_slots][window][kv_dim]`, position `p` at `p % window`,
//! each entry tagged with the position it holds): attention reads a row
//! within the window of its query from there ([`KvData::recent_row_to_f32`],
//! `cpu::tq_window`), older rows from their codes. The ring takes a
//! span's rows after the span's attention ([`KvBuf::keep_recent`]). A row
//! whose entry another position took before a truncation, or that a copy
//! of positions did not bring along, is read from its code: a slot
//! truncated to `n` then reads rows `n − window ..` that it had already
//! passed as a cache without the window would, until they leave the window.
//! A cache made by [`KvBuf::zeroed`] has no slots: every row is coded as
//! it is.

use std::sync::Arc;

use half::f16;

use crate::cpu::tq;
use crate::error::Result;
use crate::kv_type::{KvCacheType, TQ_CENTRE_FROM, TQ_EXACT_POSITIONS, TQ_REFINE_PASSES, TQ_WINDOW};
use crate::quant::float::f32_to_f16;
use crate::quant::{BlockFormat, BlockQ4_0, BlockQ8_0, QK};
use crate::turboquant::TurboQuant;

/// One layer's K or V cache, typed (see the module docs for the layout).
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
    /// TurboQuant codes, one per head row, of the coder's `dim = head_dim`.
    Tq(TqCache),
}

/// A TurboQuant cache (see the module docs): the codes, and per slot its
/// first [`TQ_EXACT_POSITIONS`] rows in f16 and the centre added to every
/// decoded code.
pub struct TqCache {
    t: Arc<TurboQuant>,
    /// One code per head row: `[n_slots][n_ctx][n_head_kv]` codes.
    codes: Vec<u8>,
    /// `[n_slots][n_exact][kv_dim]` f16, rotated basis.
    exact: Vec<f16>,
    /// `[n_slots][kv_dim]`, rotated basis: the mean of each slot's exact
    /// rows `TQ_CENTRE_FROM .. n_exact`, set when row `n_exact − 1` is
    /// written (empty when no row is coded less a centre).
    centre: Vec<f32>,
    /// Positions kept exact per slot (`TQ_EXACT_POSITIONS`, at most
    /// `n_ctx`; 0 for a cache made without slots).
    n_exact: usize,
    /// Positions per slot (0: no slots, every row coded as it is).
    slot_rows: usize,
    kv_dim: usize,
    /// The recent rows in f16, a ring per slot: `[n_slots][window][kv_dim]`,
    /// position `p` at `p % window` once [`KvBuf::keep_recent`] wrote it.
    ring: Vec<f16>,
    /// `[n_slots][window]`: the position whose row each ring entry holds
    /// (`usize::MAX`: none).
    ring_pos: Vec<usize>,
    /// Positions within which of a query attention reads a row from the
    /// ring ([`TQ_WINDOW`], at most `n_ctx`; 0 for a cache without slots).
    window: usize,
}

/// A borrowed [`TqCache`]: heads `first .. first + n` of it (head `h` of
/// position `p` of slot `s` is head `(s · n_ctx + p) · n_head_kv + h`).
#[derive(Clone, Copy)]
pub struct TqData<'a> {
    t: &'a TurboQuant,
    codes: &'a [u8],
    exact: &'a [f16],
    centre: &'a [f32],
    ring: &'a [f16],
    ring_pos: &'a [usize],
    window: usize,
    /// Heads per slot (0: no slots, nothing exact nor centred).
    slot_heads: usize,
    /// Heads of a slot's exact rows.
    exact_heads: usize,
    n_head_kv: usize,
    first: usize,
    n: usize,
}

/// A borrowed [`KvBuf`] (all of it, or one slot's positions).
#[derive(Clone, Copy)]
pub enum KvData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
    Tq(TqData<'a>),
}

impl KvBuf {
    /// A zeroed cache of `n_values` values of `ty` in heads of `head_dim`
    /// values (`n_values` a multiple of `head_dim`, `ty` checked to store
    /// such heads: [`KvCacheType::check_head_dim`]).
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] naming `what`;
    /// [`crate::Error::Overflow`].
    pub fn zeroed(ty: KvCacheType, n_values: usize, head_dim: usize, what: &str) -> Result<Self> {
        use crate::memory::zeroed;
        Ok(match ty {
            KvCacheType::F32 => KvBuf::F32(zeroed(n_values, what)?),
            KvCacheType::F16 => KvBuf::F16(zeroed(n_values, what)?),
            KvCacheType::Q8_0 => KvBuf::Q8_0(zeroed(n_values / QK, what)?),
            KvCacheType::Q4_0 => KvBuf::Q4_0(zeroed(n_values / QK, what)?),
            KvCacheType::Tq3 | KvCacheType::Tq4 => {
                let tq = TurboQuant::shared(head_dim, ty.turboquant_bits().unwrap_or(4))?;
                let bytes = (n_values / head_dim)
                    .checked_mul(tq.code_bytes())
                    .ok_or(crate::Error::Overflow("the bytes of a TurboQuant KV cache"))?;
                KvBuf::Tq(TqCache {
                    t: tq,
                    codes: zeroed(bytes, what)?,
                    exact: Vec::new(),
                    centre: Vec::new(),
                    n_exact: 0,
                    slot_rows: 0,
                    kv_dim: 0,
                    ring: Vec::new(),
                    ring_pos: Vec::new(),
                    window: 0,
                })
            }
        })
    }

    /// A zeroed cache of `n_slots` slots of `n_ctx` positions of
    /// `n_head_kv` heads of `head_dim` values (`ty` checked to store such
    /// heads). A TurboQuant one keeps each slot's first
    /// [`TQ_EXACT_POSITIONS`] rows in f16 and codes the others less their
    /// slot's centre (the module docs); [`KvBuf::zeroed`]'s codes every
    /// row as it is.
    ///
    /// # Errors
    /// As [`KvBuf::zeroed`].
    pub fn zeroed_slots(
        ty: KvCacheType,
        n_slots: usize,
        n_ctx: usize,
        (n_head_kv, head_dim): (usize, usize),
        what: &str,
    ) -> Result<Self> {
        let kv_dim = n_head_kv * head_dim;
        let n_values = n_slots
            .checked_mul(n_ctx)
            .and_then(|n| n.checked_mul(kv_dim))
            .ok_or(crate::Error::Overflow("the values of a KV cache layer"))?;
        let mut b = Self::zeroed(ty, n_values, head_dim, what)?;
        if let KvBuf::Tq(c) = &mut b {
            let n_exact = TQ_EXACT_POSITIONS.min(n_ctx);
            c.n_exact = n_exact;
            c.slot_rows = n_ctx;
            c.kv_dim = kv_dim;
            c.exact = crate::memory::zeroed(n_slots * n_exact * kv_dim, what)?;
            if TQ_CENTRE_FROM < n_exact {
                c.centre = crate::memory::zeroed(n_slots * kv_dim, what)?;
            }
            c.window = TQ_WINDOW.min(n_ctx);
            c.ring = crate::memory::zeroed(n_slots * c.window * kv_dim, what)?;
            c.ring_pos = crate::memory::zeroed(n_slots * c.window, what)?;
            c.ring_pos.fill(usize::MAX);
        }
        Ok(b)
    }

    /// The element type.
    pub fn ty(&self) -> KvCacheType {
        self.view().ty()
    }

    /// The coder of a TurboQuant cache.
    pub fn turboquant(&self) -> Option<&Arc<TurboQuant>> {
        match self {
            KvBuf::Tq(c) => Some(&c.t),
            _ => None,
        }
    }

    /// All of it, borrowed.
    pub fn view(&self) -> KvData<'_> {
        match self {
            KvBuf::F32(v) => KvData::F32(v),
            KvBuf::F16(v) => KvData::F16(v),
            KvBuf::Q8_0(v) => KvData::Q8_0(v),
            KvBuf::Q4_0(v) => KvData::Q4_0(v),
            KvBuf::Tq(c) => {
                let hd = c.t.dim();
                let slot_heads = c.slot_rows * c.kv_dim / hd;
                KvData::Tq(TqData {
                    t: &c.t,
                    codes: &c.codes,
                    exact: &c.exact,
                    centre: &c.centre,
                    ring: &c.ring,
                    ring_pos: &c.ring_pos,
                    window: c.window,
                    slot_heads,
                    exact_heads: c.n_exact * c.kv_dim / hd,
                    n_head_kv: c.kv_dim / hd,
                    first: 0,
                    n: c.codes.len() / c.t.code_bytes(),
                })
            }
        }
    }

    /// Writes `x` (one position's row, `kv_dim` values; for a TurboQuant
    /// cache in its coder's rotated basis) at value offset
    /// `at` (a multiple of `kv_dim`, hence of the block size), converted to
    /// the element type as ggml does.
    ///
    /// Contract (debug-asserted): the row lies inside the cache.
    pub fn write_row(&mut self, at: usize, x: &[f32]) {
        debug_assert!(at.is_multiple_of(QK) || matches!(self, KvBuf::F32(_) | KvBuf::F16(_)));
        match self {
            KvBuf::F32(c) => c[at..at + x.len()].copy_from_slice(x),
            KvBuf::F16(c) => c[at..at + x.len()].iter_mut().zip(x).for_each(|(o, &v)| *o = f16_sat(v)),
            KvBuf::Q8_0(c) => BlockQ8_0::quantize_row_ref(x, &mut c[at / QK..(at + x.len()) / QK]),
            KvBuf::Q4_0(c) => BlockQ4_0::quantize_row_ref(x, &mut c[at / QK..(at + x.len()) / QK]),
            KvBuf::Tq(c) => c.write_row(at, x),
        }
    }

    /// Copies values `src..src + n` onto `dst..dst + n` (offsets and `n`
    /// multiples of the block size), as `copy_within`.
    pub fn copy_within(&mut self, src: usize, n: usize, dst: usize) {
        match self {
            KvBuf::F32(c) => c.copy_within(src..src + n, dst),
            KvBuf::F16(c) => c.copy_within(src..src + n, dst),
            KvBuf::Q8_0(c) => c.copy_within(src / QK..(src + n) / QK, dst / QK),
            KvBuf::Q4_0(c) => c.copy_within(src / QK..(src + n) / QK, dst / QK),
            KvBuf::Tq(c) => {
                let (hd, cb) = (c.t.dim(), c.t.code_bytes());
                c.codes.copy_within(src / hd * cb..(src + n) / hd * cb, dst / hd * cb);
                if c.slot_rows > 0 {
                    let slot_len = c.slot_rows * c.kv_dim;
                    let (from, to) = (src / slot_len, dst / slot_len);
                    let rows = (n / c.kv_dim).min(c.n_exact);
                    let e = c.n_exact * c.kv_dim;
                    c.exact.copy_within(from * e..from * e + rows * c.kv_dim, to * e);
                    if !c.centre.is_empty() {
                        c.centre.copy_within(from * c.kv_dim..(from + 1) * c.kv_dim, to * c.kv_dim);
                    }
                    // Ring entries of copied positions; the others emptied.
                    let (w, kvd) = (c.window, c.kv_dim);
                    for i in 0..w {
                        let p = c.ring_pos[from * w + i];
                        let keep = p < n / kvd;
                        c.ring_pos[to * w + i] = if keep { p } else { usize::MAX };
                        if keep {
                            c.ring.copy_within((from * w + i) * kvd..(from * w + i + 1) * kvd, (to * w + i) * kvd);
                        }
                    }
                }
            }
        }
    }

    /// Positions within which of a query attention reads a row exact, from
    /// the recent rows ([`KvBuf::keep_recent`]): [`TQ_WINDOW`] (at most
    /// `n_ctx`) for a TurboQuant cache with slots, else 0 (every row read
    /// as stored).
    pub fn window(&self) -> usize {
        match self {
            KvBuf::Tq(c) => c.window,
            _ => 0,
        }
    }

    /// Keeps `x` (position `pos` of `slot`'s row, as given to
    /// [`KvBuf::write_row`]) among the slot's recent rows in f16, replacing
    /// position `pos - window`'s. No-op without a window.
    ///
    /// Attention reads the ring as it was before a chunk's rows are kept:
    /// the caller keeps a span's rows after the span's attention
    /// (`cpu::tq_window`).
    pub fn keep_recent(&mut self, slot: usize, pos: usize, x: &[f32]) {
        let KvBuf::Tq(c) = self else { return };
        if c.window == 0 {
            return;
        }
        let (w, kvd) = (c.window, c.kv_dim);
        let i = slot * w + pos % w;
        c.ring_pos[i] = pos;
        c.ring[i * kvd..][..kvd].iter_mut().zip(x).for_each(|(o, &v)| *o = f16_sat(v));
    }
}

/// `x` as an f16 row of a cache stores it: saturated at ±65 504, where
/// ggml stores ±inf (whose attention scores become inf − inf = NaN); NaN
/// stays NaN.
fn f16_sat(x: f32) -> f16 {
    f32_to_f16(x.clamp(-65504.0, 65504.0))
}

/// `x` as a row of f16 cache stores and reads it (saturated at ±65 504,
/// NaN kept): the value attention reads of a recent row.
pub fn round_f16(x: f32) -> f32 {
    f16_sat(x).to_f32()
}

impl TqCache {
    /// [`KvBuf::write_row`]: row `at / kv_dim` (position `pos` of its slot)
    /// exact in f16 when `pos < n_exact`, the slot's centre then set from
    /// the exact rows once `pos` is the last of them; else each head coded
    /// less the slot's centre ([`TurboQuant::encode_rotated_norm_kept`],
    /// [`TQ_REFINE_PASSES`]). A row's stored bits depend only on it and
    /// on its slot's rows `TQ_CENTRE_FROM .. n_exact`, whatever the order
    /// and grouping of the writes before it.
    fn write_row(&mut self, at: usize, x: &[f32]) {
        let (t, hd, cb) = (&self.t, self.t.dim(), self.t.code_bytes());
        let mut y = vec![0.0f32; hd];
        if self.slot_rows == 0 {
            for (h, xh) in x.chunks_exact(hd).enumerate() {
                t.encode_rotated_norm_kept(xh, &mut self.codes[(at / hd + h) * cb..][..cb], TQ_REFINE_PASSES);
            }
            return;
        }
        let kvd = self.kv_dim;
        let row = at / kvd;
        let (slot, pos) = (row / self.slot_rows, row % self.slot_rows);
        if pos < self.n_exact {
            let e = &mut self.exact[slot * self.n_exact * kvd..][..self.n_exact * kvd];
            e[pos * kvd..][..kvd].iter_mut().zip(x).for_each(|(o, &v)| *o = f16_sat(v));
            if pos + 1 == self.n_exact && !self.centre.is_empty() {
                let c = &mut self.centre[slot * kvd..][..kvd];
                c.fill(0.0);
                for r in e[TQ_CENTRE_FROM * kvd..].chunks_exact(kvd) {
                    c.iter_mut().zip(r).for_each(|(c, &v)| *c += v.to_f32());
                }
                let inv = 1.0 / (self.n_exact - TQ_CENTRE_FROM) as f32;
                c.iter_mut().for_each(|c| *c *= inv);
            }
            return;
        }
        for (h, xh) in x.chunks_exact(hd).enumerate() {
            let code = &mut self.codes[(at / hd + h) * cb..][..cb];
            if self.centre.is_empty() {
                y.copy_from_slice(xh);
            } else {
                let c = &self.centre[slot * kvd + h * hd..][..hd];
                y.iter_mut().zip(xh).zip(c).for_each(|((y, &x), &c)| *y = x - c);
            }
            t.encode_rotated_norm_kept(&y, code, TQ_REFINE_PASSES);
        }
    }
}

impl<'a> TqData<'a> {
    /// Head `h` of this view, values `e .. e + out.len()`, into `out`.
    fn head_to_f32(&self, h: usize, e: usize, out: &mut [f32]) {
        let (t, hd, cb) = (self.t, self.t.dim(), self.t.code_bytes());
        let abs = self.first + h;
        // No slots (`slot_heads` 0): every head is a code, not centred.
        let (slot, w) = match abs.checked_div(self.slot_heads) {
            Some(slot) => (slot, abs % self.slot_heads),
            None => (0, usize::MAX),
        };
        if w < self.exact_heads {
            use half::slice::HalfFloatSliceExt;
            self.exact[(slot * self.exact_heads + w) * hd + e..][..out.len()].convert_to_f32_slice(out);
            return;
        }
        let code = &self.codes[abs * cb..][..cb];
        if out.len() == hd {
            tq::decode_rotated(t, code, out);
        } else {
            let mut whole = vec![0.0f32; hd];
            tq::decode_rotated(t, code, &mut whole);
            out.copy_from_slice(&whole[e..e + out.len()]);
        }
        if !self.centre.is_empty() {
            let c = &self.centre[(slot * self.n_head_kv + w % self.n_head_kv) * hd + e..][..out.len()];
            out.iter_mut().zip(c).for_each(|(o, &c)| *o += c);
        }
    }
}

impl<'a> KvData<'a> {
    /// The element type.
    pub fn ty(&self) -> KvCacheType {
        match self {
            KvData::F32(_) => KvCacheType::F32,
            KvData::F16(_) => KvCacheType::F16,
            KvData::Q8_0(_) => KvCacheType::Q8_0,
            KvData::Q4_0(_) => KvCacheType::Q4_0,
            KvData::Tq(d) if d.t.bits() == 3 => KvCacheType::Tq3,
            KvData::Tq(..) => KvCacheType::Tq4,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            KvData::F32(c) => c.len(),
            KvData::F16(c) => c.len(),
            KvData::Q8_0(c) => c.len() * QK,
            KvData::Q4_0(c) => c.len() * QK,
            KvData::Tq(d) => d.n * d.t.dim(),
        }
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `start..start + n` (both multiples of the block size, or of
    /// `head_dim` for the TurboQuant types).
    pub fn sub(&self, start: usize, n: usize) -> KvData<'a> {
        match *self {
            KvData::F32(c) => KvData::F32(&c[start..start + n]),
            KvData::F16(c) => KvData::F16(&c[start..start + n]),
            KvData::Q8_0(c) => KvData::Q8_0(&c[start / QK..(start + n) / QK]),
            KvData::Q4_0(c) => KvData::Q4_0(&c[start / QK..(start + n) / QK]),
            KvData::Tq(d) => {
                let hd = d.t.dim();
                KvData::Tq(TqData { first: d.first + start / hd, n: n / hd, ..d })
            }
        }
    }

    /// The f32 values `at..at + out.len()` when the cache is f32, without
    /// a copy.
    #[inline(always)]
    pub fn as_f32(&self, at: usize, n: usize) -> Option<&'a [f32]> {
        match *self {
            KvData::F32(c) => Some(&c[at..at + n]),
            _ => None,
        }
    }

    /// Converts values `at..at + out.len()` (`at` and the length multiples
    /// of the block size) to f32 into `out`, exactly: f16 widened, blocks
    /// dequantized as ggml's `dequantize_row_q8_0` / `dequantize_row_q4_0`;
    /// TurboQuant codes decoded in the rotated basis
    /// ([`tq::decode_rotated`]; any range of values, a head's code decoded
    /// whole where the range covers it).
    #[inline(always)]
    pub fn to_f32(&self, at: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = out.len();
        match *self {
            KvData::F32(c) => out.copy_from_slice(&c[at..at + n]),
            KvData::F16(c) => c[at..at + n].convert_to_f32_slice(out),
            KvData::Q8_0(c) => BlockQ8_0::dequantize_row(&c[at / QK..(at + n) / QK], out),
            KvData::Q4_0(c) => BlockQ4_0::dequantize_row(&c[at / QK..(at + n) / QK], out),
            KvData::Tq(d) => tq_to_f32(&d, at, out),
        }
    }

    /// Row `pos` of `slot` (`n_ctx` positions per slot) as attention reads
    /// it for a query within the window of it: from the ring where it holds
    /// that position ([`KvBuf::keep_recent`]), else as stored
    /// ([`KvData::to_f32`]: a row that left the ring before a truncation or
    /// a copy of positions is read from its code). Views of a whole cache
    /// only.
    pub fn recent_row_to_f32(&self, slot: usize, n_ctx: usize, pos: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        let kvd = out.len();
        if let KvData::Tq(d) = self {
            if d.window > 0 {
                let i = slot * d.window + pos % d.window;
                if d.ring_pos[i] == pos {
                    d.ring[i * kvd..][..kvd].convert_to_f32_slice(out);
                    return;
                }
            }
        }
        self.to_f32((slot * n_ctx + pos) * kvd, out);
    }
}

/// [`KvData::to_f32`] of TurboQuant codes `c`.
fn tq_to_f32(d: &TqData<'_>, at: usize, out: &mut [f32]) {
    let hd = d.t.dim();
    let mut i = 0;
    while i < out.len() {
        let (head, e) = ((at + i) / hd, (at + i) % hd);
        let n = (hd - e).min(out.len() - i);
        d.head_to_f32(head, e, &mut out[i..i + n]);
        i += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    #[test]
    fn rows_round_trip_as_ggml_converts_them() {
        let kv_dim = 64;
        let x: Vec<f32> = (0..kv_dim).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        for ty in KvCacheType::ALL {
            let mut buf = KvBuf::zeroed(ty, 3 * kv_dim, 32, "test").unwrap();
            buf.write_row(kv_dim, &x);
            // What ggml stores: the reference quantizer, then its dequantizer.
            let mut want = vec![0.0f32; kv_dim];
            if ty == KvCacheType::F32 {
                want.copy_from_slice(&x);
            } else if let Some(b) = ty.turboquant_bits() {
                // The reference coder's code of each head (taken as rotated;
                // a cache without slots codes every row as it is).
                let t = TurboQuant::new(32, b).unwrap();
                for (xh, wh) in x.chunks_exact(32).zip(want.chunks_exact_mut(32)) {
                    let mut code = vec![0u8; t.code_bytes()];
                    t.encode_rotated_norm_kept(xh, &mut code, TQ_REFINE_PASSES);
                    t.decode_rotated(&code, wh).unwrap();
                }
            } else {
                let g = ty.ggml_type().unwrap();
                // Blocks need 2-byte alignment: quantize into u16 storage.
                let mut words = vec![0u16; g.row_bytes(kv_dim).unwrap() / 2];
                quant::quantize_row(g, &x, bytemuck::cast_slice_mut(&mut words)).unwrap();
                quant::dequantize_row(g, bytemuck::cast_slice(&words), &mut want).unwrap();
            }
            let mut got = vec![f32::NAN; kv_dim];
            buf.view().to_f32(kv_dim, &mut got);
            assert_eq!(got, want, "{ty}");
            // Positions 0 and 2 untouched (zero).
            let mut other = vec![f32::NAN; kv_dim];
            buf.view().to_f32(0, &mut other);
            assert!(other.iter().all(|&v| v == 0.0), "{ty}");
            // Head 1 of 2 (head_dim 32) alone.
            let mut head = vec![f32::NAN; 32];
            buf.view().sub(kv_dim, kv_dim).to_f32(32, &mut head);
            assert_eq!(head, want[32..], "{ty}");
            // A range across the two heads.
            let mut mid = vec![f32::NAN; 20];
            buf.view().to_f32(kv_dim + 22, &mut mid);
            if ty.ggml_type().is_none_or(|g| g.block_size() == 1) {
                assert_eq!(mid, want[22..42], "{ty}");
            }
            buf.copy_within(kv_dim, kv_dim, 2 * kv_dim);
            buf.view().to_f32(2 * kv_dim, &mut got);
            assert_eq!(got, want, "{ty} copied");
            assert_eq!(buf.view().len(), 3 * kv_dim);
            assert_eq!(buf.ty(), ty);
        }
    }

    /// A TurboQuant cache with slots: the first rows of each slot read back
    /// as f16 (its code bytes left untouched), later rows as the code of the
    /// row less the mean of rows `TQ_CENTRE_FROM..n_exact`, plus that mean;
    /// slots apart; a slot copied with its exact rows and centre; a slot
    /// shorter than `TQ_EXACT_POSITIONS` all exact.
    #[test]
    fn turboquant_slots_keep_their_first_rows_and_centre_the_rest() {
        let (hd, nh, n_ctx) = (32usize, 2usize, TQ_EXACT_POSITIONS + 4);
        let kvd = hd * nh;
        let row = |s: usize, p: usize| -> Vec<f32> {
            (0..kvd).map(|i| 3.0 + ((i * 7 + p * 13 + s * 5) % 17) as f32 * 0.37 - (i % 3) as f32).collect()
        };
        let mut buf = KvBuf::zeroed_slots(KvCacheType::Tq4, 3, n_ctx, (nh, hd), "test").unwrap();
        for s in 0..2 {
            for p in 0..n_ctx {
                buf.write_row((s * n_ctx + p) * kvd, &row(s, p));
            }
        }
        let t = TurboQuant::new(hd, 4).unwrap();
        let n_exact = TQ_EXACT_POSITIONS;
        for s in 0..2 {
            let mut centre = vec![0.0f32; kvd];
            for p in TQ_CENTRE_FROM..n_exact {
                let r: Vec<f32> = row(s, p).iter().map(|&v| f16::from_f32(v).to_f32()).collect();
                centre.iter_mut().zip(&r).for_each(|(c, &v)| *c += v);
            }
            centre.iter_mut().for_each(|c| *c *= 1.0 / (n_exact - TQ_CENTRE_FROM) as f32);
            let slot = buf.view().sub(s * n_ctx * kvd, n_ctx * kvd);
            for p in 0..n_ctx {
                let mut got = vec![f32::NAN; kvd];
                slot.to_f32(p * kvd, &mut got);
                let x = row(s, p);
                let want: Vec<f32> = if p < n_exact {
                    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
                } else {
                    let mut w = vec![0.0f32; kvd];
                    for h in 0..nh {
                        let y: Vec<f32> = (0..hd).map(|i| x[h * hd + i] - centre[h * hd + i]).collect();
                        let mut code = vec![0u8; t.code_bytes()];
                        t.encode_rotated_norm_kept(&y, &mut code, TQ_REFINE_PASSES);
                        t.decode_rotated(&code, &mut w[h * hd..(h + 1) * hd]).unwrap();
                    }
                    w.iter().zip(&centre).map(|(&d, &c)| d + c).collect()
                };
                assert_eq!(got, want, "slot {s}, position {p}");
                // A part of a head, across two heads.
                let mut mid = vec![f32::NAN; 20];
                slot.to_f32(p * kvd + hd - 7, &mut mid);
                assert_eq!(mid, want[hd - 7..hd + 13], "slot {s}, position {p}, a range");
            }
        }
        if let KvBuf::Tq(c) = &buf {
            let cb = c.t.code_bytes();
            assert!(c.codes[..n_exact * nh * cb].iter().all(|&b| b == 0), "exact rows were coded");
        }
        // Slot 0 copied onto slot 2 reads the same.
        buf.copy_within(0, n_ctx * kvd, 2 * n_ctx * kvd);
        let (mut a, mut b) = (vec![0.0f32; n_ctx * kvd], vec![0.0f32; n_ctx * kvd]);
        buf.view().to_f32(0, &mut a);
        buf.view().to_f32(2 * n_ctx * kvd, &mut b);
        assert_eq!(a, b);
        // Fewer positions than TQ_EXACT_POSITIONS: all exact, no centre.
        let mut short = KvBuf::zeroed_slots(KvCacheType::Tq3, 2, 5, (nh, hd), "test").unwrap();
        short.write_row(4 * kvd, &row(0, 4));
        let mut got = vec![0.0f32; kvd];
        short.view().to_f32(4 * kvd, &mut got);
        assert_eq!(got, row(0, 4).iter().map(|&v| f16::from_f32(v).to_f32()).collect::<Vec<_>>());
    }
}
